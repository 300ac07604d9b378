"""Engines found on their own (issue 24, item 1): which vLLM and SGLang servers a node runs, read
from their command lines, so the console can scrape each one's ``/metrics`` on the node itself
(``curl 127.0.0.1:PORT`` through the node's SSH connection: the laptop may not reach the port, and
SGLang binds to 127.0.0.1 unless told otherwise).

Pure: rows in, :class:`Engine` out. A row is ``(where, image, argv)``: a running container (its
name, its image, ``Path`` + ``Args`` from ``docker inspect``) or a host process (its pid, no image,
its ``ps`` command line). What is not recognised gives no engine; nothing here raises on odd input,
because a node's process table is not ours to trust.

The API key's value is never kept: only whether the command line carries ``--api-key`` (a key in
``VLLM_API_KEY`` is invisible here, which is what the console's own deployments do).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sparkconsole.probe.script import split_tick
from sparkconsole.remote import SECTION_MARK

Row = tuple[str, "str | None", Sequence[str]]

# the defaults each server listens on when its command line says nothing: vLLM's ``--port`` 8000
# and no ``--host`` (every address); SGLang's ServerArgs ``port=30000``, ``host="127.0.0.1"``
POOLING_TASKS = frozenset({"embed", "embedding", "score", "reward", "classify", "pooling"})
DEFAULTS = {"vllm": (8000, "0.0.0.0"), "sglang": (30000, "127.0.0.1")}

VLLM_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server")
SGLANG_MODULES = ("sglang.launch_server",)
# wrappers that run the rest of their arguments as the command (NVIDIA's NGC entrypoint ends in
# ``exec "$@"``)
_PASS_THROUGH = {"nohup", "setsid", "exec", "nvidia_entrypoint.sh", "tini", "dumb-init", "--"}
_SHELLS = {"sh", "bash", "dash", "/bin/sh", "/bin/bash"}
_PY_OPTS_WITH_VALUE = {"-W", "-X"}


@dataclass(frozen=True)
class Engine:
    """One inference server on a node, as its command line describes it.

    ``where`` is the container's name, or the host process's pid (as text) when ``image`` is None.
    ``model`` is the name the server reports (``model_name`` in its metrics, ``id`` in ``/v1/models``):
    the first ``--served-model-name`` if given, else the model argument. ``api_key_on_cmdline`` says
    only whether ``--api-key`` is on the command line (the value is never read): when False the
    engine may still take one from ``VLLM_API_KEY``."""

    node: str
    kind: str  # "vllm" | "sglang"
    where: str
    image: str | None
    model: str | None
    port: int
    host: str
    api_key_on_cmdline: bool = False
    #: the model the server loaded (``--tokenizer``, ``--model-path``, ``--model`` or the positional):
    #: what ``vllm bench serve`` needs as its tokenizer, since the served name is often no Hub id
    model_path: str | None = None
    #: a pooling engine (embeddings, a reranker: ``--runner pooling``, ``--task embed``…): no chat
    pooling: bool = False

    @property
    def on_host(self) -> bool:
        return self.image is None


def engines_from_cmdlines(rows: Iterable[Row], node: str = "") -> list[Engine]:
    """The engines among ``rows``, containers first, in their order. A host process that is a
    container's engine seen in the host's process table (same kind, model and port), or a forked
    child that kept its parent's command line, is not counted twice."""
    found: list[Engine] = []
    seen: set[tuple] = set()
    rows = list(rows)
    for where, image, argv in sorted(rows, key=lambda r: r[1] is None):  # containers first (stable)
        try:
            eng = _engine(node, str(where), image, [str(a) for a in argv])
        except Exception:  # the last line of defence: an odd command line is no engine, never a traceback
            eng = None
        if eng is None:
            continue
        key = (eng.kind, eng.model, eng.port)
        if key in seen:
            continue
        seen.add(key)
        found.append(eng)
    return found


def _engine(node: str, where: str, image: str | None, argv: list[str]) -> Engine | None:
    cmd = _unwrap(argv)
    if cmd is None:
        return None
    kind, args, positional = cmd
    opts = _options(args)
    served = opts.get("served-model-name")
    model = served or opts.get("model-path" if kind == "sglang" else "model") or opts.get("model") or positional
    port_d, host_d = DEFAULTS[kind]
    port_s = opts.get("port")
    try:
        port = int(port_s) if port_s is not None else port_d
    except ValueError:
        return None
    if not 0 < port < 65536:
        return None
    path = opts.get("tokenizer") or opts.get("model-path") or opts.get("model") or positional or _positional(args)
    pooling = (opts.get("runner") == "pooling" or opts.get("task") in POOLING_TASKS
               or opts.get("convert") in ("embed", "classify"))
    return Engine(node=node, kind=kind, where=where, image=image, model=model or None, port=port,
                  host=opts.get("host") or host_d, api_key_on_cmdline="api-key" in opts, model_path=path or None,
                  pooling=pooling)


def _unwrap(argv: list[str], depth: int = 0) -> tuple[str, list[str], str | None] | None:
    """``(kind, the server's own arguments, the positional model or None)`` of a command line, past
    its wrappers (``env K=V``, ``nohup``, NGC's entrypoint, ``sh -c 'exec …'``, the python that runs
    vLLM's console script), else None."""
    if depth > 4:
        return None
    i = 0
    while i < len(argv):
        base = argv[i].rsplit("/", 1)[-1]
        if base in _PASS_THROUGH:
            i += 1
        elif base == "env":
            i += 1
            while i < len(argv) and ("=" in argv[i] or argv[i].startswith("-")):
                i += 1
        else:
            break
    argv = argv[i:]
    if not argv:
        return None
    base = argv[0].rsplit("/", 1)[-1]
    if (argv[0] in _SHELLS or base in _SHELLS) and len(argv) > 2 and argv[1] == "-c":
        try:
            inner = shlex.split(argv[2])
        except ValueError:
            return None
        return _unwrap(inner, depth + 1)
    if (argv[0] in _SHELLS or base in _SHELLS) and len(argv) > 1 and argv[1].rsplit("/", 1)[-1] in ("vllm", "sglang"):
        return _unwrap(argv[1:], depth + 1)  # ps: sh /usr/local/bin/vllm serve … (a shell wrapper named vllm)
    if base.startswith("python"):
        j = 1
        while j < len(argv) and argv[j].startswith("-") and argv[j] != "-m":
            j += 2 if argv[j] in _PY_OPTS_WITH_VALUE else 1
        if j + 1 < len(argv) and argv[j] == "-m":
            mod, rest = argv[j + 1], argv[j + 2:]
            if mod in VLLM_MODULES:
                return "vllm", rest, None
            if mod in SGLANG_MODULES:
                return "sglang", rest, None
            if mod == "vllm.entrypoints.cli.main" and rest[:1] == ["serve"]:
                return "vllm", rest[1:], _positional(rest[1:])
            return None
        if j < len(argv) and argv[j].rsplit("/", 1)[-1] in ("vllm", "sglang"):  # ps: python3 /usr/local/bin/vllm
            return _unwrap(argv[j:], depth + 1)
        return None
    if base == "vllm" and argv[1:2] == ["serve"]:
        return "vllm", argv[2:], _positional(argv[2:])
    if base == "sglang" and argv[1:2] == ["serve"]:
        return "sglang", argv[2:], None
    return None


def _positional(args: list[str]) -> str | None:
    """``vllm serve MODEL …``: the model is the first argument when it is not an option."""
    return args[0] if args and not args[0].startswith("-") else None


def _options(args: list[str]) -> dict[str, str]:
    """``--name value`` / ``--name=value`` (the last one wins, as argparse has it; ``_`` read as ``-``
    as vLLM's parser does), a flag as ``""``; of a multi-valued option, its first value."""
    out: dict[str, str] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--") and len(a) > 2:
            name, eq, val = a[2:].partition("=")
            name = name.replace("_", "-")
            if not eq:
                nxt = args[i + 1] if i + 1 < len(args) else None
                val = nxt if nxt is not None and not nxt.startswith("-") else ""
                if val:
                    i += 1
            out[name] = val
        i += 1
    return out


# ---- the output of remote.engine_cmdlines() -------------------------------------------------------

def rows_from_engine_cmdlines(stdout: str) -> list[Row]:
    """The rows of :func:`sparkconsole.remote.engine_cmdlines`' output: ``(name, image, argv)`` per
    container line (``/NAME IMAGE "PATH" [ARGS]``), ``(name, image, argv)`` per process inside one of
    those containers (``NAME PID ARGS``: an engine ``docker exec``ed in a Ray container, with the
    container's image), and ``(pid, None, argv)`` per process line
    (``PID ARGS``: ``ps`` joins argv with spaces, so an argument with a space in it reads as two; the
    options discovery needs have none). Lines that are neither (an error docker printed) are skipped."""
    secs = split_tick(stdout.splitlines(), mark=SECTION_MARK)
    rows: list[Row] = []
    cts = secs.get("containers")
    for line in (cts.text if cts else "").splitlines():
        row = _container_row(line)
        if row is not None:
            rows.append(row)
    images = {row[0]: row[1] for row in rows}
    inside = secs.get("inside")
    for line in (inside.text if inside else "").splitlines():
        name, pid, args = [*line.strip().split(" ", 2), "", ""][:3]
        if name in images and pid.isdigit() and args.strip():  # a process of a container listed above
            rows.append((name, images[name], args.split()))
    procs = secs.get("processes")
    for line in (procs.text if procs else "").splitlines():
        pid, _, args = line.strip().partition(" ")
        if pid.isdigit() and args.strip():
            rows.append((pid, None, args.split()))
    return rows


def _container_row(line: str) -> Row | None:
    parts = line.split(" ", 2)
    if len(parts) != 3 or not parts[0].startswith("/") or len(parts[0]) < 2:
        return None
    dec = json.JSONDecoder()
    try:
        path, end = dec.raw_decode(parts[2])
        args, _ = dec.raw_decode(parts[2][end:].lstrip())
    except ValueError:
        return None
    if not isinstance(path, str) or not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        return None
    return (parts[0][1:], parts[1], [path, *args])


def discover(stdout: str, node: str = "") -> list[Engine]:
    """The engines of one node from :func:`sparkconsole.remote.engine_cmdlines`' output."""
    return engines_from_cmdlines(rows_from_engine_cmdlines(stdout), node=node)
