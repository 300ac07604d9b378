"""Spark Pulse v2 recipes (kharkevich-engineering-lab/spark-pulse-recipes schemas/recipe-v2.schema.json;
spark-pulse spark_pulse/tools/recipe_schema.py and spark_pulse/engines/vllm.py).

``recipe_version: "2"``, ``name``, ``model``, ``engine`` (the default), ``constraints{solo_only,
cluster_only, min_nodes}``, engine-neutral ``params``, and ``engines.<name>{image, mods, env, args,
command}``. A top-level ``command`` pins one engine (so ``engine`` is then required).

Rendering (engines/vllm.py ``_render_v2``): the serve program and the model, then the params as the
engine's flags in a fixed order (spark_pulse/engines/defaults/<engine>.yaml ``param_flags``: tp is
``--tensor-parallel-size`` for vLLM and ``--tp`` for SGLang), then ``args`` with ``{param}`` filled
by ``str.format``. The Ray flag never survives: Spark Pulse runs vLLM multi-node natively.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sparkconsole.recipes.assemble import Parts
from sparkconsole.recipes.command import RenderError, fill_format, fold
from sparkconsole.recipes.fields import Fields, checked_params

# engines/vllm.py _PARAM_ORDER (model comes first, as the serve program's argument)
PARAM_ORDER = ("host", "port", "tensor_parallel", "pipeline_parallel", "gpu_memory_utilization",
               "max_model_len", "max_num_batched_tokens", "max_num_seqs")

# spark_pulse/engines/defaults/{vllm,sglang,llama-cpp}.yaml: runtime.serve, runtime.model_arg and
# runtime.param_flags. llama.cpp maps no tp, pp or memory fraction ("mapping a parameter onto a flag
# that means something else would be worse than leaving it unmapped").
ENGINES: dict[str, tuple[str, str, dict[str, str]]] = {
    "vllm": ("vllm serve", "", {
        "port": "--port", "host": "--host", "tensor_parallel": "--tensor-parallel-size",
        "pipeline_parallel": "--pipeline-parallel-size", "gpu_memory_utilization": "--gpu-memory-utilization",
        "max_model_len": "--max-model-len", "max_num_batched_tokens": "--max-num-batched-tokens",
        "max_num_seqs": "--max-num-seqs"}),
    "sglang": ("python3 -m sglang.launch_server", "--model-path", {
        "port": "--port", "host": "--host", "tensor_parallel": "--tp", "pipeline_parallel": "--pp-size",
        "gpu_memory_utilization": "--mem-fraction-static", "max_model_len": "--context-length",
        "max_num_seqs": "--max-running-requests"}),
    "llama-cpp": ("llama-server", "-hf", {
        "port": "--port", "host": "--host", "max_model_len": "--ctx-size", "max_num_seqs": "--parallel"}),
}

_CONSTRAINT_KEYS = {"solo_only", "cluster_only", "min_nodes"}


def _args_text(spec: Fields) -> str:
    args = spec.data.get("args")
    if args is None:
        return ""
    if isinstance(args, str):
        return args
    if isinstance(args, list) and all(isinstance(a, str) for a in args):
        return " ".join(args)  # recipe_schema.py EngineSpec.args_string
    raise spec.error("args", "must be a string or a list of strings")


def read_spark_pulse(top: Fields, name: str, overrides: Mapping[str, Any]) -> Parts:
    model = top.text("model", required=True) or ""
    title = top.text("name")
    constraints = top.mapping("constraints")
    for k in constraints.data:
        if k not in _CONSTRAINT_KEYS:  # the schema's additionalProperties: false
            raise constraints.error(k, f"is not a constraint (known: {', '.join(sorted(_CONSTRAINT_KEYS))})")
    solo_only = constraints.flag("solo_only")
    params = checked_params(top.mapping("params"))
    params.update(overrides)
    if solo_only and "tensor_parallel" not in overrides:
        params["tensor_parallel"] = 1  # engines/vllm.py: solo forces tp=1 unless asked otherwise

    engines = top.mapping("engines")
    top_command = top.data.get("command")
    engine = top.text("engine")
    if top_command is not None and engine is None:
        raise top.error("engine", "is required beside a top-level 'command', which pins one engine")
    if engine is None:
        names = sorted(engines.data)
        engine = names[0] if names else "vllm"
    elif engines.data and engine not in engines.data:
        raise top.error("engine", f"names '{engine}', which 'engines' does not describe")
    spec = engines.mapping(engine)

    template = top_command if top_command is not None else spec.data.get("command")
    key = "command" if top_command is not None else spec.key("command")
    try:
        if template is not None:
            if not isinstance(template, str) or not template.strip():
                raise top.error(key, "must be a non-empty string")
            filled = fill_format(fold(template), params)
        else:
            key = spec.key("args")
            if engine not in ENGINES:
                raise top.error("engine", f"'{engine}' has no flag map here; give engines.{engine}.command")
            serve, model_arg, flags = ENGINES[engine]
            words = [serve, model_arg, model] if model_arg else [serve, model]
            for p in PARAM_ORDER:
                if p in flags and params.get(p) is not None:
                    words += [flags[p], str(params[p])]
            args = _args_text(spec)
            if args:
                words.append(fill_format(fold(args), params))
            filled = " ".join(words)
    except RenderError as exc:
        raise top.error(key, str(exc)) from None

    meta = top.mapping("metadata")
    return Parts(
        name=name,
        label=top.label,
        format="spark-pulse-v2",
        model=model,
        engine=engine,
        image=spec.text("image"),
        command=filled,
        command_key=key,
        env=spec.env("env"),
        mods=spec.text_list("mods"),
        min_nodes=constraints.integer("min_nodes"),
        solo_only=solo_only,
        cluster_only=constraints.flag("cluster_only"),
        solo_key="constraints.solo_only",
        ray=False,
        title=title,
        description=top.text("description") or meta.text("description"),
        metadata=meta,
    )
