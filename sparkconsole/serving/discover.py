"""Engines found on their own: which inference servers (every engine of
:mod:`sparkconsole.serving.engines`) a node runs, read from their command lines, so the console can scrape each one's ``/metrics`` on the node itself
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
from sparkconsole.serving import engines as engine_kinds
from sparkconsole.serving.engines.base import positional as positional_of

Row = tuple[str, "str | None", Sequence[str]]

POOLING_TASKS = frozenset({"embed", "embedding", "score", "reward", "classify", "pooling"})
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
    kind: str  # the engine's name (sparkconsole.serving.engines.ENGINES)
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

    @property
    def engine(self) -> engine_kinds.EngineKind:
        """The engine's object (its label, metrics, defaults)."""
        return engine_kinds.get(self.kind)


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
    model = kind.served_model(opts, positional)
    port_d, host_d = kind.default_port, kind.default_host
    port_s = opts.get("port")
    try:
        port = int(port_s) if port_s is not None else port_d
    except ValueError:
        return None
    if not 0 < port < 65536:
        return None
    path = opts.get("tokenizer") or opts.get("model-path") or opts.get("model") or positional or positional_of(args)
    pooling = (opts.get("runner") == "pooling" or opts.get("task") in POOLING_TASKS
               or opts.get("convert") in ("embed", "classify"))
    return Engine(node=node, kind=kind.name, where=where, image=image, model=model or None, port=port,
                  host=opts.get("host") or host_d, api_key_on_cmdline="api-key" in opts, model_path=path or None,
                  pooling=pooling)


def _unwrap(argv: list[str], depth: int = 0) -> tuple[engine_kinds.EngineKind, list[str], str | None] | None:
    """``(engine, the server's own arguments, the positional model or None)`` of a command line,
    past its wrappers (``env K=V``, ``nohup``, NGC's entrypoint, ``sh -c 'exec …'``, the shell or
    Python that runs an engine's console script), else None."""
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
    shell = argv[0] in _SHELLS or base in _SHELLS
    if shell and len(argv) > 2 and argv[1] == "-c":
        try:
            inner = shlex.split(argv[2])
        except ValueError:
            return None
        return _unwrap(inner, depth + 1)
    scripts = engine_kinds.script_names()
    if shell and len(argv) > 1 and argv[1].rsplit("/", 1)[-1] in scripts:
        return _unwrap(argv[1:], depth + 1)  # ps: sh /usr/local/bin/vllm serve … (a shell wrapper named vllm)
    if base.startswith("python"):
        j = 1
        while j < len(argv) and argv[j].startswith("-") and argv[j] != "-m":
            j += 2 if argv[j] in _PY_OPTS_WITH_VALUE else 1
        if j < len(argv) and argv[j] != "-m" and argv[j].rsplit("/", 1)[-1] in scripts:
            return _unwrap(argv[j:], depth + 1)  # ps: python3 /usr/local/bin/vllm
    return engine_kinds.recognise(argv)


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
