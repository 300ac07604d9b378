"""What every engine's log line carries around its message, and the failures every CUDA server dies of.

The engines' trackers (:mod:`sparkconsole.logs.vllm`, :mod:`sparkconsole.logs.sglang`,
:mod:`sparkconsole.logs.llama_cpp`) read different messages, but the lines reach the console wrapped
the same way: ``docker logs -t`` or CI timestamps, docker-compose's ``name  | `` column, ANSI colours
(or their residue without the ESC byte, as GitHub pastes show them), Ray's and vLLM's process tags.
Undoing that wrapping lives here once, so that a fix to it (a new wrapper, a cost bound) reaches
every engine, and no engine module holds its own copy of the patterns.

Bounds: a physical line longer than :data:`MAX_LINE` is cut before any pattern sees it, and every
pattern here is anchored or bounded, so reading a line costs time linear in its (cut) length.
"""

from __future__ import annotations

import functools
import re

MAX_LINE = 65536  # longer physical lines are cut before matching (never raise, stay linear)

# --------------------------------------------------------------------------------------------
# ANSI colour codes

_ANSI = re.compile(
    r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[()][A-Z0-9]|\x1b[=>78]"
)
_ANSI_RESIDUE = re.compile(r"\[\d{1,3}(?:;\d{1,3})*m|\[0?m")


def strip_ansi(text: str) -> str:
    """``text`` without ANSI escape sequences, nor their residue once the ESC byte was lost."""
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    if "[" in text and "m" in text:
        text = _ANSI_RESIDUE.sub("", text)
    return text


# --------------------------------------------------------------------------------------------
# Outer prefixes: added by docker, compose, CI, Ray and the engines' process wrappers

# possessive (``*+``): a name never ends in a space, so giving characters back could never match, and
# on a long bare word (a line of 64 KiB with no space) the backtracking cost a step per character
_COMPOSE = re.compile(r"[A-Za-z0-9][\w.-]*+\s+\|(?:\s|$)")
_TIMESTAMP = re.compile(
    r"\[?\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?\]?(?:\s+|$)"
)
_QUOTE = re.compile(r"(?:▎|>)(?:\s|$)")
_PROC = re.compile(
    r"\((?P<name>[A-Za-z_]\w*(?:[ _](?:rank=\d+|TP\d+|DP\d+|PP\d+|EP\d+))*)?\s*"
    r"pid=(?P<pid>\d+)(?:,\s*ip=(?P<ip>[0-9a-fA-F.:]+))?\)[ \t]?"
)
_RAYSYS = re.compile(
    r"\((?:raylet|gcs_server|dashboard\w*|autoscaler[^)]{0,40}|monitor|log_monitor)"
    r"(?:,\s*ip=(?P<ip>[0-9a-fA-F.:]+))?\)[ \t]?"
)
_TORCH_RANK = re.compile(r"\[rank\d+\]:")


@functools.lru_cache(maxsize=4)
def prefix_end(text: str, header: re.Pattern[str] | None = None) -> tuple[int, bool, str | None]:
    """Where the outer prefixes of ``text`` end (stacked, any order), whether one was a process tag,
    and the ip a tag named.

    ``header`` is an engine's own record header (SGLang's ``[2026-05-15 08:39:36 TP0]``), tried
    first at each position: it is the innermost prefix, so the message starts where it ends, and it
    counts as a process tag. Without it a bracketed date would be read as a timestamp up to the rank
    tag and leave ``TP0]`` in front of the message.

    Kept for the last few texts: a record is split from its line and then stripped, both asking."""
    has_process = False
    ip: str | None = None
    pos = 0
    n = len(text)
    while True:
        if has_process:
            while pos < n and text[pos] in " \t":
                pos += 1
        if header is not None:
            m = header.match(text, pos)
            if m:
                return m.end(), True, ip
        for pattern in (_COMPOSE, _TIMESTAMP, _QUOTE):
            m = pattern.match(text, pos)
            if m:
                pos = m.end()
                break
        else:
            m = _PROC.match(text, pos) or _RAYSYS.match(text, pos)
            if m:
                has_process = True
                ip = m.group("ip") or ip
                pos = m.end()
                continue
            m = _TORCH_RANK.match(text, pos)
            if m:
                pos = m.end()
                continue
            return pos, has_process, ip


def holds(text: str, words: tuple[str, ...]) -> bool:
    """Whether ``text`` holds one of ``words`` (no words: no screen, always true). The trackers'
    word screens go through here, so that a test can turn them all off and compare."""
    for word in words:  # a loop: any() over a generator costs twice this, for every rule of every line
        if word in text:
            return True
    return not words


# --------------------------------------------------------------------------------------------
# Python tracebacks (every Python engine's failure ends in one)

TRACEBACK = re.compile(r"^Traceback \(most recent call last\):")
BARE_EXCEPTION = re.compile(r"^(?:[A-Za-z_]\w*\.){0,6}[A-Z]\w*(?:Error|Exception)(?::\s|:?$)")
FRAME = re.compile(r'^File "[^"]+", line \d+')

# --------------------------------------------------------------------------------------------
# Failures that are the GPU's or the network's, whatever engine met them. Each comes with words,
# in lower case, one of which every line it matches holds: ``in`` on the lowered line rules most
# lines out for a fraction of what a search costs.

#: CUDA's and PyTorch's out-of-memory messages (``torch.OutOfMemoryError: CUDA out of memory. Tried
#: to allocate …``; ``CUDA error: out of memory``; ggml's ``cudaMalloc failed: out of memory``, CUDA's
#: own string for cudaErrorMemoryAllocation; the NVIDIA driver's ``NV_ERR_NO_MEMORY``). A pattern
#: source: an engine adds its own wordings of the same failure after it, case-blind.
CUDA_OOM = (
    r"CUDA out of memory|OutOfMemoryError|CUDA (?:driver )?error: out of memory|NV_ERR_NO_MEMORY|"
    r"\bout of memory\b"
)
CUDA_OOM_WORDS: tuple[str, ...] = ("memory",)

#: NCCL and torch.distributed failing between ranks: the watchdog's timeout, NCCL's error codes,
#: the rendezvous store's errors, a WARN that a connection failed or timed out.
NCCL_FAILURE = re.compile(
    r"Watchdog caught collective operation timeout|NCCL watchdog thread terminated|\bNCCL error\b|"
    r"nccl(?:System|Internal|Remote|UnhandledCuda|InvalidUsage|InvalidArgument)Error|"
    r"DistStoreError|DistNetworkError|NCCL WARN.*(?:[Cc]onnect|[Tt]imeout|timed out)|"
    r"connectFullMesh failed",
    re.I,
)
NCCL_WORDS: tuple[str, ...] = ("nccl", "watchdog", "diststoreerror", "distnetworkerror", "connectfullmesh")

__all__ = [
    "BARE_EXCEPTION",
    "CUDA_OOM",
    "CUDA_OOM_WORDS",
    "FRAME",
    "MAX_LINE",
    "NCCL_FAILURE",
    "NCCL_WORDS",
    "TRACEBACK",
    "holds",
    "prefix_end",
    "strip_ansi",
]
