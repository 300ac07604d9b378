"""Serve commands: filling placeholders the way each format does, and reading the command back.

Three ways to fill a template exist in the field, and each is copied from its source:

- sparkrun: ``{key}`` from overrides, then ``defaults``, then runtime defaults; ``{model}`` always;
  substitution repeats until the text stops changing; an unknown placeholder stays as written
  (spark-arena/sparkrun src/sparkrun/core/recipe.py ``render_command``, RECIPES.md "Config Chain").
- eugr v1 and Spark Pulse: Python ``str.format``, so ``{{ }}`` is a literal brace (JSON in
  ``--speculative-config``) and a missing key is an error (eugr run-recipe.py
  ``generate_launch_script``; spark-pulse spark_pulse/engines/vllm.py ``format_command``).

Then the text is folded into one line and split like a shell would (``shlex``), and the flags the
console sets itself (tp, pp, gpu-memory-utilization, max-model-len, port, host, the distributed
executor backend) are read out, leaving the rest as ``serve_args`` in order.
"""

from __future__ import annotations

import re
import shlex
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sparkconsole.recipes.bounded import plain
from sparkconsole.serving import engines as engine_kinds

MAX_COMMAND = 64 * 1024
MAX_ROUNDS = 16

# sparkrun's placeholder: vpd's arg_substitute fills {name}; anything it does not know stays.
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")

# A command that starts like one of these says which engine it is (sparkrun
# src/sparkrun/core/recipe.py _CMD_*_RE, used when a recipe names no runtime).
ENGINE_HINTS = (
    ("vllm", re.compile(r"^(?:vllm\s+serve\b|python3?\s+-m\s+vllm\.entrypoints)")),
    ("sglang", re.compile(r"^(?:sglang\s+serve|python3?\s+-m\s+sglang\.launch_server)\b")),
    ("llama-cpp", re.compile(r"^llama-server\b")),
    ("trtllm", re.compile(r"^(?:trtllm-serve|mpirun\b.*trtllm)")),
    ("atlas", re.compile(r"^atlas\s+serve\b")),
)

# sparkrun's RAY hint (recipe.py _RAY_BACKEND_RE), also with '='.
RAY_FLAG = re.compile(r"--distributed-executor-backend(?:=|\s+)ray\b")

# The flags the console reads out of a command. Each engine spells them its own way: vLLM
# (-tp, --tensor-parallel-size), SGLang (--tp, --tp-size, --mem-fraction-static,
# --context-length), llama.cpp (--ctx-size); the lists are sparkrun's flag maps
# (runtimes/_vllm_common.py VLLM_FLAG_MAP, runtimes/sglang.py _SGLANG_FLAG_MAP) and Spark Pulse's
# param_flags (spark_pulse/engines/defaults/{vllm,sglang,llama-cpp}.yaml).
_READ_FLAGS: dict[str, str] = {
    "--tensor-parallel-size": "tp", "-tp": "tp", "--tp": "tp", "--tp-size": "tp", "--tensor-parallel": "tp",
    "--pipeline-parallel-size": "pp", "-pp": "pp", "--pp": "pp", "--pp-size": "pp",
    "--gpu-memory-utilization": "gmu", "--mem-fraction-static": "gmu",
    "--max-model-len": "max_model_len", "--context-length": "max_model_len", "--ctx-size": "max_model_len",
    "--port": "port", "--host": "host",
    "--distributed-executor-backend": "backend",
    "--model": "model", "--model-path": "model",
}


class RenderError(Exception):
    """A template that cannot be filled: the reader turns it into a one-line RecipeError."""


def fill_sparkrun(template: str, chain: list[Mapping[str, Any]]) -> str:
    """sparkrun's rule: first source that has the key wins; repeat until stable; unknown stays.

    Bounded: at most :data:`MAX_ROUNDS` rounds, and the text may never grow past
    :data:`MAX_COMMAND` (defaults that refer to each other could otherwise double it each round).
    """
    def one(m: re.Match[str]) -> str:
        for source in chain:
            if m.group(1) in source and source[m.group(1)] is not None:
                return str(source[m.group(1)])
        return m.group(0)

    text = template
    for _ in range(MAX_ROUNDS):
        new = _PLACEHOLDER.sub(one, text)
        if len(new) > MAX_COMMAND:
            raise RenderError(f"grows past {MAX_COMMAND} characters when its placeholders are filled")
        if new == text:
            return new
        text = new
    raise RenderError(f"still changes after {MAX_ROUNDS} rounds of filling placeholders (a loop?)")


def fill_format(template: str, params: Mapping[str, Any]) -> str:
    """``str.format`` as eugr's run-recipe.py and Spark Pulse use it, but only with plain names:
    a field like ``{port.__class__}`` or a width like ``{port:>99999999}`` is refused before
    formatting (the first reads attributes, the second builds a huge string)."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise RenderError(f"is not a valid format string ({exc}); write a literal brace as {{{{ or }}}}") from None
    for _lit, name, spec, conv in parsed:
        if name is None:
            continue
        if name == "" or name.isdigit():
            raise RenderError("uses a positional placeholder {}; name it, such as {port}")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise RenderError(f"uses placeholder {{{plain(name, 40)}}}, which is not a plain name")
        if conv or (spec and (len(spec) > 12 or any(int(d) > 256 for d in re.findall(r"\d+", spec)))):
            raise RenderError(f"formats {{{name}}} with a conversion or width the console does not accept")
        if name not in params:
            known = ", ".join(sorted(params)) or "none"
            raise RenderError(f"uses {{{name}}}, which no default or parameter sets (set: {plain(known, 120)})")
    try:
        out = template.format(**params)
    except (ValueError, KeyError, IndexError, AttributeError) as exc:
        raise RenderError(f"cannot be formatted: {plain(exc)}") from None
    if len(out) > MAX_COMMAND:
        raise RenderError(f"grows past {MAX_COMMAND} characters when its placeholders are filled")
    return out


def fold(command: str) -> str:
    """One line: backslash continuations joined, sparkrun's ``\\ <newline>`` slip mended."""
    parts = []
    for raw in command.replace("\r\n", "\n").split("\n"):
        line = raw.strip()
        while line.endswith("\\"):
            line = line[:-1].rstrip()
        if line:
            parts.append(line)
    return " ".join(parts)


def engine_hint(command: str) -> str | None:
    text = fold(command)
    for engine, pattern in ENGINE_HINTS:
        if pattern.match(text):
            return engine
    return None


@dataclass(frozen=True)
class ReadCommand:
    """What :func:`read_command` found in a serve command."""

    argv: tuple[str, ...]
    model: str | None
    tp: int | None
    pp: int | None
    gmu: float | None
    max_model_len: int | None
    port: int | None
    host: str | None
    backend: str | None
    serve_args: tuple[str, ...]


def _number(flag: str, raw: str, kind: type) -> Any:
    if _PLACEHOLDER.search(raw):
        raise RenderError(f"leaves {flag} {plain(raw, 40)} unfilled: no default sets that placeholder")
    try:
        v = kind(raw)
    except ValueError:
        raise RenderError(f"gives {flag} the value '{plain(raw, 40)}', which is not {'an integer' if kind is int else 'a number'}") from None
    if (kind is int and not 1 <= v <= 10_000_000) or (kind is float and not 0 < v <= 1):
        raise RenderError(f"gives {flag} the value {raw}, which is out of range")
    return v


def _port(raw: str) -> int:
    v = _number("--port", raw, int)
    if v > 65535:
        raise RenderError(f"gives --port the value {v}, which is not a TCP port")
    return v


def read_command(text: str, engine: str) -> ReadCommand:
    """Split a filled, folded command and read the console's own flags out of it.

    Both ``--flag N`` and ``--flag=N`` are read; the last one wins, as vLLM's argparse does (eugr
    run-recipe.py: "vLLM uses last value"). The program and its positional model (``vllm serve
    MODEL``) are everything before the first flag.
    """
    try:
        argv = shlex.split(text, comments=False, posix=True)
    except ValueError as exc:
        raise RenderError(f"cannot be split like a shell line ({exc})") from None
    if not argv:
        raise RenderError("is empty")
    flags = dict(_READ_FLAGS)
    kind = engine_kinds.known(engine)
    if kind is not None:
        flags.update(kind.recipe_flags)  # the engine's own short flags (llama.cpp's -c, -m, -hf)
    start = 3 if len(argv) >= 3 and argv[0].startswith("python") and argv[1] == "-m" else 0
    first = next((i for i in range(start, len(argv)) if argv[i].startswith("-")), len(argv))
    found: dict[str, str] = {}
    # `vllm serve MODEL`, `sglang serve MODEL`, `trtllm-serve MODEL`: the last word before the first
    # flag is the model when there is one past the program's own words
    program_words = 2 if argv[0] in ("vllm", "sglang") else 1
    if first - start > program_words:
        found["model"] = argv[first - 1]
    rest: list[str] = []
    i = first
    while i < len(argv):
        arg = argv[i]
        name, eq, val = arg.partition("=")
        key = flags.get(name) if name.startswith("-") else None
        if key is None:
            rest.append(arg)
            i += 1
            continue
        if eq:
            i += 1
        else:
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise RenderError(f"gives {name} no value")
            val = argv[i + 1]
            i += 2
        found[key] = val
    return ReadCommand(
        argv=tuple(argv),
        model=found.get("model"),
        tp=_number("the tensor-parallel size", found["tp"], int) if "tp" in found else None,
        pp=_number("the pipeline-parallel size", found["pp"], int) if "pp" in found else None,
        gmu=_number("the GPU memory fraction", found["gmu"], float) if "gmu" in found else None,
        max_model_len=_number("the context length", found["max_model_len"], int) if "max_model_len" in found else None,
        port=_port(found["port"]) if "port" in found else None,
        host=found.get("host"),
        backend=found.get("backend"),
        serve_args=tuple(rest),
    )
