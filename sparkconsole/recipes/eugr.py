"""eugr v1 recipes (eugr/spark-vllm-docker recipes/README.md and run-recipe.py).

``recipe_version: "1"``, ``name``, ``model`` (for the download; the command repeats the id),
``container``, ``build_args``, ``mods``, ``cluster_only``/``solo_only``, ``defaults``, ``env``,
``command``. The command is filled with Python ``str.format`` over ``defaults`` and the overrides
(``{{ }}`` is a literal brace, a missing key is an error). A ``solo_only`` recipe runs with
``tensor_parallel`` 1 unless an override says otherwise (run-recipe.py: "In solo mode, default
tensor_parallel to 1"). The launcher runs without Ray by default now: the
``--distributed-executor-backend`` flag is removed unless the caller asks for Ray.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sparkconsole.recipes.assemble import Parts
from sparkconsole.recipes.command import RenderError, engine_hint, fill_format, fold, read_command
from sparkconsole.recipes.fields import Fields, checked_params


def read_eugr(top: Fields, name: str, overrides: Mapping[str, Any], *, ray: bool = False) -> Parts:
    command = top.text("command", required=True) or ""
    title = top.text("name")
    image = top.text("container", required=True)
    model = top.text("model")
    params = checked_params(top.mapping("defaults"))
    params.update(overrides)
    solo_only = top.flag("solo_only")
    if solo_only and "tensor_parallel" not in overrides:
        params["tensor_parallel"] = 1
    try:
        filled = fill_format(command, params)
    except RenderError as exc:
        raise top.error("command", str(exc)) from None
    engine = engine_hint(filled) or "vllm"  # v1 templates are vLLM's (spark-pulse recipe_schema.py V1_ENGINES)
    top.text_list("build_args")  # options of eugr's image build (build-and-copy.sh): checked, not used
    meta = top.mapping("metadata")
    parts = Parts(
        name=name,
        label=top.label,
        format="eugr-v1",
        model=model or "",
        engine=engine,
        image=image,
        command=filled,
        command_key="command",
        env=top.env("env"),
        mods=top.text_list("mods"),
        solo_only=solo_only,
        cluster_only=top.flag("cluster_only"),
        ray=ray,
        title=title,
        description=top.text("description") or meta.text("description"),
        metadata=meta,
    )
    if not parts.model:
        # `model` is optional in v1 (it only drives the download); the command names it then
        try:
            parts.model = read_command(fold(filled), engine).model or ""
        except RenderError as exc:
            raise top.error("command", str(exc)) from None
    if not parts.model:
        raise top.error("model", "is required when the command does not name the model")
    return parts
