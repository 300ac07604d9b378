"""sparkrun recipes (spark-arena/sparkrun RECIPES.md and src/sparkrun/core/recipe.py).

``model``, ``runtime``, ``container``, ``min_nodes``/``max_nodes`` (``solo_only``/``cluster_only``
deprecated but honoured), ``defaults``, ``env`` (``$VAR`` expanded from the console's
environment, as sparkrun expands it from the control machine's), ``command`` with ``{placeholders}``,
``metadata``, ``mods``. The name is the file's stem; ``recipe_version`` defaults to "2".
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from sparkconsole.recipes.assemble import Parts
from sparkconsole.recipes.command import RenderError, engine_hint, fill_sparkrun
from sparkconsole.recipes.fields import Fields, checked_params

# What a runtime id means to the console (RECIPES.md "Available Runtimes"): the vLLM variants are
# all vLLM; eugr-vllm "inherits vllm-ray", so it is Ray.
_RUNTIME_ENGINE = {
    "vllm": "vllm", "vllm-distributed": "vllm", "vllm-ray": "vllm", "eugr-vllm": "vllm",
    "sglang": "sglang", "llama-cpp": "llama-cpp", "trtllm": "trtllm", "atlas": "atlas",
}

# The console's runtime defaults: the last source of the config chain.
RUNTIME_DEFAULTS: Mapping[str, Any] = {"port": 8000, "host": "0.0.0.0"}

# With no `command`, sparkrun's runtime builds the flags from `defaults` through a per-engine map
# (runtimes/_vllm_common.py VLLM_FLAG_MAP + VLLM_BOOL_FLAGS, runtimes/sglang.py _SGLANG_FLAG_MAP,
# RECIPES.md "Common Defaults Keys" for llama.cpp).
_SERVE = {"vllm": "vllm serve {model}", "sglang": "python3 -m sglang.launch_server --model-path {model}",
          "llama-cpp": "llama-server -hf {model}"}
_FLAG_MAPS: dict[str, dict[str, str]] = {
    "vllm": {
        "port": "--port", "host": "--host", "tensor_parallel": "-tp", "pipeline_parallel": "-pp",
        "gpu_memory_utilization": "--gpu-memory-utilization", "max_model_len": "--max-model-len",
        "max_num_batched_tokens": "--max-num-batched-tokens", "max_num_seqs": "--max-num-seqs",
        "served_model_name": "--served-model-name", "dtype": "--dtype", "quantization": "--quantization",
        "enforce_eager": "--enforce-eager", "enable_prefix_caching": "--enable-prefix-caching",
        "trust_remote_code": "--trust-remote-code", "enable_auto_tool_choice": "--enable-auto-tool-choice",
        "distributed_executor_backend": "--distributed-executor-backend", "data_parallel": "--data-parallel-size",
        "kv_cache_dtype": "--kv-cache-dtype",
    },
    "sglang": {
        "port": "--port", "host": "--host", "tensor_parallel": "--tp-size", "pipeline_parallel": "--pp-size",
        "gpu_memory_utilization": "--mem-fraction-static", "max_model_len": "--context-length",
        "max_num_seqs": "--max-running-requests", "served_model_name": "--served-model-name",
        "dtype": "--dtype", "quantization": "--quantization", "trust_remote_code": "--trust-remote-code",
        "kv_cache_dtype": "--kv-cache-dtype",
    },
    "llama-cpp": {"port": "--port", "host": "--host", "max_model_len": "--ctx-size", "ctx_size": "--ctx-size",
                  "n_gpu_layers": "--n-gpu-layers", "served_model_name": "--alias"},
}
_BOOL_FLAGS = {"enforce_eager", "enable_prefix_caching", "trust_remote_code", "enable_auto_tool_choice",
               "enable_torch_compile", "disable_radix_cache"}

_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


def expand_vars(value: str, environ: Mapping[str, str]) -> str:
    """``$VAR`` and ``${VAR}`` from ``environ``; an unset one stays as written (os.path.expandvars,
    which sparkrun uses)."""
    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        return environ.get(name, m.group(0))
    return _VAR.sub(one, value)


def _generated_command(engine: str, defaults: Mapping[str, Any]) -> str | None:
    flags = _FLAG_MAPS.get(engine)
    if flags is None:
        return None
    parts = [_SERVE[engine]]
    for key, flag in flags.items():
        v = defaults.get(key)
        if v is None:
            continue
        if key in _BOOL_FLAGS:
            if v is True:
                parts.append(flag)
        else:
            parts.append(f"{flag} {{{key}}}")
    return " ".join(parts)


def read_sparkrun(top: Fields, name: str, overrides: Mapping[str, Any],
                  environ: Mapping[str, str] | None = None) -> Parts:
    model = top.text("model", required=True) or ""
    runtime = top.text("runtime")
    command = top.data.get("command")
    if command is not None and (not isinstance(command, str) or not command.strip()):
        raise top.error("command", "must be a non-empty string")
    defaults = checked_params(top.mapping("defaults"))
    if runtime is not None:
        engine = _RUNTIME_ENGINE.get(runtime, runtime)
    else:
        engine = (engine_hint(command) if command else None) or "vllm"
    if command is None:
        command = _generated_command(engine, defaults)
        if command is None:
            raise top.error("command", f"is needed: the console builds no command for runtime '{runtime}'")
    # {model} is always the recipe's model (RECIPES.md "Config Chain")
    chain = [dict(overrides), {**defaults, "model": model}, dict(RUNTIME_DEFAULTS)]
    try:
        filled = fill_sparkrun(command, chain)
    except RenderError as exc:
        raise top.error("command", str(exc)) from None
    ray: bool | None = None
    backend = overrides.get("distributed_executor_backend", defaults.get("distributed_executor_backend"))
    if runtime in ("vllm-ray", "eugr-vllm") or str(backend or "").lower() == "ray":
        ray = True
    env_raw = top.env("env")
    environ = os.environ if environ is None else environ
    meta = top.mapping("metadata")
    return Parts(
        name=name,
        label=top.label,
        format="sparkrun",
        model=model,
        engine=engine,
        image=top.text("container"),
        command=filled,
        command_key="command",
        env={k: expand_vars(v, environ) for k, v in env_raw.items()},
        mods=top.text_list("mods"),
        min_nodes=top.integer("min_nodes"),
        max_nodes=top.integer("max_nodes"),
        solo_only=top.flag("solo_only"),
        cluster_only=top.flag("cluster_only"),
        ray=ray,
        title=top.text("name"),
        description=top.text("description") or meta.text("description"),
        metadata=meta,
    )
