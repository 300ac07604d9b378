"""vLLM server-log phase parser: what a ``vllm serve`` is doing, read from its log.

Pure Python (no Textual). The console feeds it whole lines from ``docker logs -f`` as they arrive
(:class:`VllmLogTracker`); ``sparkconsole parse vllm-log`` calls :func:`parse_vllm_log` and prints
:meth:`VllmLogReport.contract_dict`. Both go through the same code, so feeding a log line by line
gives the same report as parsing it whole.

What one physical line may hold, and what is undone before matching (see
``research/vllm-log-phases.md`` §0):

- ``\\r``-separated tqdm updates (each one is taken as its own record, same line number);
- ANSI colour codes, also their residue without the ESC byte (``[1;36m`` in GitHub pastes);
- outer prefixes, stacked and in any order: docker-compose ``name  | ``, ``docker logs -t`` / CI
  timestamps, process tags ``(APIServer pid=N)``, ``(EngineCore_DP0 pid=N)``,
  ``(RayWorkerWrapper pid=N, ip=A.B.C.D)`` (the ip is kept: ``remote_ips``, ``failure_node_ip``),
  ``(VllmWorker rank=N pid=M)``, ``(pid=N, ip=…)``, Ray's ``(raylet)``; Ray's
  `` [repeated Nx across cluster]`` suffix;
- a progress bar and a log line sharing one physical line (``…42.01it/s](Worker_TP1 pid=1) INFO…``);
- a prefix-only line (tqdm's bare newline) whose progress bar follows on the next, unprefixed line;
- terminal hard-wrap: a bare line right after a long one is also matched joined to it.

State rules (the ``vllm-log`` parse contract): ``starting`` until weight loading begins
("Starting to load model", a shard bar, the >= 0.16 banner's ``model`` row that vLLM prints as it
builds the engine for that model — the real two-Spark log 20 ends there and counts as loading —
or anything that comes after it such as a Ray placement group wait, "Model loading took", the KV-cache lines, CUDA-graph capture), ``loading`` until
"Application startup complete" (``ready``); ``failed`` once a fatal error or a Python traceback
from the server, engine or workers appears (also logged frame by frame at ERROR level);
``unknown`` when no vLLM line was recognised. The first root cause wins: a later "Engine core
initialization failed" (a symptom) does not replace an earlier OOM. Generic markers (a traceback,
"EngineCore failed to start") make the state ``failed`` with kind ``other`` until a specific cause
(which in V1 is printed after them) is read.

After ``ready``, a traceback alone (a bad request logged by the API server) does not turn the
server ``failed``; a fatal signature (OOM, NCCL, Ray, "EngineCore encountered a fatal error",
``EngineDeadError``) does. A new launch (a version line after loading had begun) starts a fresh
report and counts ``restarts`` — ``docker logs -f`` of a restarting container shows several runs.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from sparkconsole.logs.envelope import BARE_EXCEPTION as _BARE_EXCEPTION
from sparkconsole.logs.envelope import CUDA_OOM, CUDA_OOM_WORDS, MAX_LINE, NCCL_FAILURE, NCCL_WORDS
from sparkconsole.logs.envelope import FRAME as _FRAME
from sparkconsole.logs.envelope import TRACEBACK as _TRACEBACK
from sparkconsole.logs.envelope import holds as _holds
from sparkconsole.logs.envelope import prefix_end as _prefix_end
from sparkconsole.logs.envelope import strip_ansi as _strip_ansi
from sparkconsole.logs.report import (
    CONTRACT_KEYS,
    PHASE_API_SERVER,
    PHASE_COMPILING,
    PHASE_CUDA_GRAPHS,
    PHASE_FAILED,
    PHASE_KV_CACHE,
    PHASE_LOADING,
    PHASE_PROFILING,
    PHASE_RAY_WAIT,
    PHASE_READY,
    PHASE_STARTING,
    STATES,
    LogReport,
    worst_report,
)
from sparkconsole.logs.tracker import LineTracker

#: the report a vLLM log gives: every engine's (:class:`~sparkconsole.logs.report.LogReport`), by the
#: name the ``parse vllm-log`` contract and its tests know
VllmLogReport = LogReport

FAILURE_KINDS: tuple[str, ...] = ("oom", "unsupported_architecture", "nccl", "ray", "other")

_MAX_LINE = MAX_LINE  # longer physical lines are cut before matching (never raise, stay linear)
_WRAP_MIN = 70  # a bare line after a physical line at least this long may be its hard-wrapped tail
# A hard-wrapped record is matched joined to the lines before it. Any long plain-text log (an
# nginx access log: every line long, none with a level) would otherwise grow one joined text
# without end and run every rule over it again for each line: quadratic. A joined record holds at
# most this many physical lines and this many characters; past either the next line starts anew,
# so each line costs the rules at most a bounded text (a real wrap is two to four lines).
_MAX_JOIN_LINES = 4
_MAX_JOIN_CHARS = 8192

# --------------------------------------------------------------------------------------------
# Envelope: vLLM's suffixes and its record itself (ANSI and the outer prefixes: logs/envelope.py)

_REPEATED = re.compile(r"\s*\[repeated \d+x across cluster\].*$")
_RECORD = re.compile(
    r"(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+"
    r"(?:(?:\d{4}-)?\d{2}-\d{2}\s+\d{2}:\d{2}:\d{2}(?:[.,]\d+)?\s+)?"
    r"\[?(?P<file>[\w./-]{1,200}\.py):(?P<lineno>\d+)\]\s?(?P<msg>.*)",
    re.S,
)
_UVICORN = re.compile(r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL):\s+(?P<msg>.*)", re.S)
_GLOG = re.compile(
    r"\[?(?P<level>[EWIF])\d{4}\s+\d{2}:\d{2}:\d{2}(?:\.\d+)?\s+(?:\d+\s+)?[\w/.+-]{1,200}:\d+\]\s?(?P<msg>.*)",
    re.S,
)
_GLOG_LEVELS = {"E": "ERROR", "W": "WARNING", "I": "INFO", "F": "CRITICAL"}
# a log record glued to the end of a progress bar: "...it/s]INFO 04-20 17:00:47 [x.py:1] ..."
_GLUED_RECORD = re.compile(r"(?<=\])(?=(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\d{2}-\d{2}\s)")
# a named process tag in the middle of a line starts a new record
_MID_PROC = re.compile(
    r"\((?:[A-Za-z_]\w*(?:[ _](?:rank=\d+|TP\d+|DP\d+|PP\d+|EP\d+))*\s+)pid=\d+(?:,\s*ip=[0-9a-fA-F.:]+)?\)"
)

# --------------------------------------------------------------------------------------------
# Phase and value lines (research §1)

_API_VERSION = re.compile(r"vLLM API server version\s+(?P<v>\S+)")
_SERVER_VERSION = re.compile(r"vLLM server version\s+(?P<v>[^\s,]+),\s*serving model\s+(?P<m>\S+)")
_BANNER_VERSION = re.compile(r"(?:^|\s)version\s+(?P<v>\d+\.\d+\S*)\s*$")
_BANNER_MODEL = re.compile(r"(?:^|\s)model\s+(?P<m>[^\s'\"]+)\s*$")
_BANNER_ART = re.compile(r"[█▀▄]")
_ENGINE_VERSION = re.compile(r"Initializing an? (?:V[01] )?LLM engine \(v(?P<v>[^)\s]+)\)")
_CONFIG_MODEL = re.compile(r"with config: model='(?P<m>[^']+)'")
_ARGS_MODEL = re.compile(
    r"(?:non-default args: \{.*?'model': '(?P<m1>[^']+)'|args: Namespace\(.*?\bmodel='(?P<m2>[^']+)')"
)
_ARGS_MODEL_TAG = re.compile(r"non-default args: \{.*?'model_tag': '(?P<m>[^']+)'")
_START_LOAD = re.compile(r"Starting to load model (?P<m>.+?)(?:\.\.\.)?\s*$")
_ARCH = re.compile(r"Resolved architecture: (?P<a>\w+)")
_MAX_LEN = re.compile(r"Using max model len (?P<n>\d+)")
_SHARD_BAR = re.compile(
    r"(?P<desc>(?:Multi-thread l|L)oading [^:|\n]{0,80}?"
    r"(?:checkpoint shards(?: \(eager\))?|loader|Streamer|shards)):\s+(?P<pct>\d+)%\s+Completed\s*\|\s*"
    r"(?P<n>\d+)/(?P<total>\d+)\s+\[(?P<elapsed>[\d:]+)<(?P<remaining>[\d:?]+),\s*(?P<rate>[^\]]{0,40})\]"
)
_GRAPH_BAR = re.compile(
    r"Capturing CUDA graphs?(?: shapes)?(?: \((?P<mode>[^,()]{1,60}),\s*(?P<rt>[A-Z_]+)\))?:\s*"
    r"(?P<pct>\d+)%\s*\|[^|]{0,400}\|\s*(?P<n>\d+)/(?P<total>\d+)"
)
_GRAPH_START = re.compile(r"Capturing (?:the model for CUDA graphs|cudagraphs for decoding)")
_GRAPH_DONE = re.compile(r"Graph capturing finished in (?P<sec>\d+(?:\.\d+)?) secs?")
_WEIGHTS_TOOK = re.compile(r"Loading weights took (?P<sec>[\d.]+) seconds")
_MODEL_LOADING = re.compile(
    r"(?:Model loading took|Loading model weights took) (?P<gib>\d+(?:\.\d+)?) ?(?P<unit>GiB|GB)"
    r"(?:\s+memory)?(?:\s+and (?P<sec>\d+(?:\.\d+)?) seconds)?"
)
_COMPILE = re.compile(
    r"for vLLM's torch\.compile|Dynamo bytecode transform time|Compiling a graph for|"
    r"Start compiling|Directly load the compiled graph|torch\.compile is turned on"
)
_COMPILE_DONE = re.compile(r"torch\.compile (?:takes|took) (?P<sec>[\d.]+) s in total")
_PROFILING = re.compile(
    r"Memory profiling takes|Profiling CUDA graph memory|Estimated CUDA graph memory|"
    r"Memory profiling results:"
)
_KV_GIB = re.compile(r"Available KV cache memory: (?P<gib>[\d.]+) ?GiB")
_KV_GIB_V06 = re.compile(r"\bkv_cache_size=(?P<gib>[\d.]+)GiB")
_KV_GIB_V0 = re.compile(r"the rest of the memory reserved for KV Cache is (?P<gib>[\d.]+) ?GiB")
_KV_TOKENS = re.compile(r"KV cache size: (?P<tok>\d[\d,]*) tokens")
_CONCURRENCY = re.compile(
    r"Maximum concurrency for (?P<len>\d[\d,]*) tokens per request: (?P<x>\d+(?:\.\d+)?)x"
)
_GPU_BLOCKS = re.compile(r"# (?:GPU|cuda|CUDA|gpu) blocks: (?P<n>\d+)")
_INIT_ENGINE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took (?P<sec>[\d.]+) s")
_LISTEN = re.compile(
    r"Starting vLLM (?:API )?server(?: \d+)? on (?P<url>(?P<scheme>https?)://(?P<host>\[[^\]\s]+\]|[^:\s/]+):(?P<port>\d{1,5}))"
)
_READY = re.compile(r"Application startup complete")
_RAY_WAIT = re.compile(r"Waiting for creating a placement group")
_RAY_CONNECT = re.compile(
    r"Connecting to existing Ray cluster|Connected to Ray cluster|Started a local Ray instance|"
    r"placement group|use_ray_spmd_worker"
)
_ESTIMATED_LEN = re.compile(r"estimated maximum model length is (?P<n>\d+)")
_KV_NEEDED = re.compile(
    r"max seq len \((?P<len>\d+)\),?\s*\(?(?P<need>[\d.]+) GiB KV cache is needed,\s*which is larger than "
    r"the available KV cache memory \((?P<avail>[\d.]+) GiB\)"
)
_V0_KV_SMALL = re.compile(
    r"max seq len \((?P<len>\d+)\) is larger than the maximum number of tokens that can be stored in KV cache "
    r"\((?P<n>\d+)\)"
)
_ARCH_LIST = re.compile(r"Model architectures (?P<l>\[[^\]]*\]) (?:are not supported|failed to be inspected)")
_ARCH_INSPECT = re.compile(r"Error in inspecting model architecture '(?P<a>[^']+)'")
_MODEL_TYPE = re.compile(r"has model type `(?P<t>[^`]+)` but Transformers does not recognize")
_QUOTED = re.compile(r"'([^']+)'|\"([^\"]+)\"")

_SOURCE_LINE = re.compile(r"^(?:raise\b|File \"|[\^~]+$|except\b|if\b|return\b|self\.|assert\b)")

# Failure signatures (research §2). Order matters within a line: the first that matches names it.
# Each comes with words, in lower case, one of which every line it matches holds: ``in`` on the
# lowered line rules most lines out for a fraction of what a search costs (the case-blind
# alternations cost more than all the other patterns together on a long line).
_KIND_SIGNATURES: tuple[tuple[str, re.Pattern[str], tuple[str, ...]], ...] = (
    (
        "oom",
        # CUDA's own messages (logs/envelope.py), then vLLM's wordings of a KV cache or a budget too small
        re.compile(
            CUDA_OOM + r"|"
            r"KV cache is needed, which is larger than the available KV cache memory|"
            r"To serve at least one request with the models?'s max seq len|"
            r"No available memory for the cache blocks|"
            r"is larger than the maximum number of tokens that can be stored in KV cache|"
            r"on startup is less than (?:desired GPU memory utilization|the engine's budget)",
            re.I,
        ),
        (*CUDA_OOM_WORDS, "max seq len", "stored in kv cache", "on startup is less than"),
    ),
    (
        "unsupported_architecture",
        re.compile(
            r"Model architectures .{0,400}?(?:are not supported|failed to be inspected)|"
            r"Error in inspecting model architecture|"
            r"Transformers does not recognize this architecture"
        ),
        ("model architecture", "transformers does not recognize"),
    ),
    (
        "nccl",
        NCCL_FAILURE,  # the ranks' link (logs/envelope.py): the same words whatever engine met it
        NCCL_WORDS,
    ),
    (
        "ray",
        re.compile(
            r"Cannot provide a placement group|Current node has no GPU available|"
            r"The actor died unexpectedly|RayActorError|ActorDiedError|ActorUnavailableError"
        ),
        ("placement group", "no gpu available", "actor"),
    ),
    (
        "other",
        re.compile(
            r"SafetensorError|nvidia-container-cli: initialization error|Failed to initialize NVML|"
            r"CUDA error: operation not permitted|no kernel image is available|RuntimeError: Error Internal|"
            r"current platform None does not support|No CUDA GPUs are available|"
            r"CUDA driver version is insufficient|Could not load any common_ops library"
        ),
        (
            "safetensorerror",
            "nvidia-container-cli",
            "nvml",
            "operation not permitted",
            "no kernel image",
            "platform none",
            "no cuda gpus",
            "cuda driver version",
            "common_ops",
        ),
    ),
)
# Symptoms: they mean "failed", but the root cause is elsewhere (usually printed just after).
_GENERIC_FATAL_WORDS = ("ngine", "orker", "Error executing")  # one is in every line it matches
_GENERIC_FATAL = re.compile(
    r"EngineCore failed to start|Engine core initialization failed|EngineCore encountered a fatal error|"
    r"EngineDeadError|Error executing method|WorkerProc failed to start|Engine process failed to start|"
    r"Worker failed with error"
)
# Of the symptoms, those that also end a server that was already ready.
_FATAL_AFTER_READY = re.compile(
    r"EngineCore encountered a fatal error|EngineDeadError|Engine core .{0,40}died"
)
# Python's warnings module: "path.py:N: UserWarning: ..." then the source line "  warnings.warn("
_PY_WARNING = re.compile(r"^(?:\S*\.py:\d+:\s+)?(?:[\w.]+\.)?\w*Warning:|^warnings\.warn\(|^warn\(")
_PY_WARNING_WORDS = ("arn",)  # "Warning:", "warn("

_NOT_FAILURE_LEVELS = frozenset({"DEBUG", "INFO", "WARNING", "WARN"})


# --------------------------------------------------------------------------------------------
# Helpers


def _num(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.replace(",", ""))
    except ValueError:
        return None


def _clock_seconds(text: str | None) -> int | None:
    """tqdm's ``MM:SS`` / ``H:MM:SS`` -> seconds; ``?`` -> None."""
    if not text or "?" in text:
        return None
    total = 0
    for part in text.split(":"):
        if not part.isdigit():
            return None
        total = total * 60 + int(part)
    return total


def _seconds_per_it(rate: str | None) -> float | None:
    if not rate:
        return None
    m = re.match(r"\s*(\d+(?:\.\d+)?)\s*(s/it|it/s)", rate)
    if not m:
        return None
    value = float(m.group(1))
    if m.group(2) == "s/it":
        return value
    return 1.0 / value if value > 0 else None


@dataclass
class _Prefixes:
    rest: str
    has_process: bool
    ip: str | None


def _strip_prefixes(text: str) -> _Prefixes:
    """Remove every outer prefix, outermost first, however they are stacked."""
    pos, has_process, ip = _prefix_end(text)
    return _Prefixes(text[pos:], has_process, ip)


def _split_segments(physical: str) -> list[str]:
    """One physical line -> the records it holds (``\\r`` updates, glued bar + log line)."""
    out: list[str] = []
    for part in physical.split("\r"):
        if not part.strip():
            continue
        part = _strip_ansi(part)
        pieces = [part]
        if "]" in part and ("INFO" in part or "WARN" in part or "ERROR" in part or "DEBUG" in part):
            pieces = _GLUED_RECORD.split(part)
        for piece in pieces:
            cuts = [0]
            chain_end = _prefix_end(piece)[0]  # the leading (stacked) prefixes stay together
            for m in _MID_PROC.finditer(piece, chain_end):
                if m.start() < chain_end:
                    continue
                if not piece[chain_end : m.start()].strip():
                    chain_end = _prefix_end(piece[m.start() :])[0] + m.start()
                    continue
                cuts.append(m.start())
                chain_end = m.end()
            cuts.append(len(piece))
            for a, b in itertools.pairwise(cuts):
                if piece[a:b].strip():
                    out.append(piece[a:b])
    return out


def _names_in_list(text: str) -> tuple[str, ...]:
    return tuple(a or b for a, b in _QUOTED.findall(text))


# --------------------------------------------------------------------------------------------
# Line rules: the shape of one row of ``LINE_RULES`` (the table itself follows the tracker,
# whose methods its special cases are)


def _text_or_none(text: str) -> str | None:
    """tqdm's rate field as shown (``1.23s/it``), ``None`` when the bar has none yet."""
    return text.strip() or None


def _rate_seconds(text: str) -> float | None:
    """tqdm's rate field as seconds per shard, whichever way round tqdm printed it."""
    return _seconds_per_it(text.strip())


@dataclass(frozen=True, slots=True)
class _Line:
    """The record a rule looks at: its text (stripped), its log level, whether it was re-joined
    from a hard-wrapped pair (a launch line read twice that way must not count as a restart)."""

    text: str
    level: str | None
    rejoined: bool


@dataclass(frozen=True, slots=True)
class Capture:
    """One report field read from one group of a rule's match.

    ``group`` may name several groups (alternatives of one pattern): the first that took part.
    ``rank`` makes the field a best-source value (the model, the version): a source of lower
    rank never replaces one of higher rank, and an empty value is ignored. ``keep_first`` leaves
    a value already read (a failure message repeating a number vLLM logged before), and
    ``optional`` leaves the field alone when the group did not take part."""

    field: str
    group: str | tuple[str, ...]
    convert: Callable[[str], Any] | None = None
    rank: int | None = None
    keep_first: bool = False
    optional: bool = False

    def read(self, m: re.Match[str]) -> str | None:
        """The group's text, or the first alternative group that took part."""
        if isinstance(self.group, str):
            return m.group(self.group)
        for name in self.group:
            text = m.group(name)
            if text is not None:
                return text
        return None


@dataclass(frozen=True, slots=True)
class LineRule:
    """One kind of vLLM line and what it says about the run, as data rather than code.

    vLLM's progress lines differ from version to version; keeping each kind as one row (the
    pattern, the phase it implies, the fields it fills) means supporting a new line format is one
    new row. Rows apply in table order, which matters where one line matches several (the phase
    timeline only moves forward). Only what plain data cannot say is a ``handler``, a tracker
    method that runs first (a launch line may start a new run, which the row's effects belong to).

    ``group`` names an either-or set of rows: on one line only the first of them that matches
    applies, as alternatives of one statement would. ``when`` is a check on the line that must
    also hold (a cheap guard, or a condition a pattern cannot express). ``seen`` marks the log as
    a vLLM log; ``loading`` means the line proves weight loading has begun (state ``loading``).
    ``writes`` lists the fields the handler fills, so the table names every field a line feeds.
    ``needs`` are words one of which every line the pattern matches holds: a screen that rules a
    line out with ``in`` before any search (most lines of a log are no rule's), which keeps the
    cost of a line low enough to follow a busy engine and to read a long log whole."""

    pattern: re.Pattern[str]
    phase: str | None = None
    sets: tuple[Capture, ...] = ()
    seen: bool = True
    loading: bool = False
    at_start: bool = False  # the pattern must match at the start of the line, not anywhere
    group: str | None = None
    when: Callable[[_Line], bool] | None = None
    handler: Callable[[VllmLogTracker, re.Match[str], _Line], None] | None = None
    writes: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()

    @property
    def fields(self) -> tuple[str, ...]:
        """Every report field this kind of line may fill."""
        return tuple(c.field for c in self.sets) + self.writes


def _has_banner_art(line: _Line) -> bool:
    """The >= 0.16 banner's ``version``/``model`` rows are only read beside its block art: bare,
    such words end many other lines."""
    return bool(_BANNER_ART.search(line.text))


def _names_args(line: _Line) -> bool:
    """A cheap guard: both argument dumps hold the word, and scanning them costs on long lines."""
    return "args" in line.text


def _is_ready_record(line: _Line) -> bool:
    """Whether the line can be the server's own ready message: a log record (uvicorn's ``INFO:``)
    or a bare line that starts with it; the words further into a bare line are not."""
    return line.level is not None or line.text.startswith("Application startup complete")


# --------------------------------------------------------------------------------------------
# Tracker


class VllmLogTracker(LineTracker):
    """Incremental vLLM log reader: ``feed`` lines as they come, read ``report`` any time (the
    feeding, a merged log's nodes and the cached report: :class:`~sparkconsole.logs.tracker.LineTracker`)."""

    label = "vLLM"

    def __init__(self) -> None:
        super().__init__()
        self._restarts = 0
        self._prev_msg: str | None = None  # last bare/record message, for hard-wrap joins
        self._join_lines = 0  # physical lines in ``_prev_msg`` (bounded: ``_MAX_JOIN_LINES``)
        self._prev_physical_len = 0
        self._prev_was_bar = False
        self._prev_level: str | None = None
        self._pending_ip: str | None = None  # ip of a prefix-only line, for the bar after it
        self._reset_run()

    # -- run state -------------------------------------------------------------------------
    def _reset_run(self) -> None:
        self._seen = False
        self._level = 0  # 0 starting, 1 loading, 2 ready
        self._failed = False
        self._kind: str | None = None
        self._kind_locked = False  # a specific root cause was read
        self._failure_line: str | None = None
        self._failure_line_no: int | None = None
        self._failure_ip: str | None = None
        self._phase: str | None = None
        self._events: list[tuple[str, int]] = []
        self._v: dict[str, Any] = {}
        self._ranks: dict[str, int] = {}  # field -> rank of the source its value came from
        self._remote_ips: list[str] = []
        self._unsupported: list[str] = []
        self._tb_open = False  # inside a Python traceback (its frames and exception lines)
        self._tb_first: str | None = None  # the last traceback seen: its first line
        self._tb_last: str | None = None  # ... and its last unindented line (the exception)
        self._signature_other = False  # the "other" failure was a known signature, not a bare traceback

    # -- per line --------------------------------------------------------------------------
    def _feed_physical(self, physical: str) -> None:
        self._line_no += 1
        self._cached = None
        if len(physical) > _MAX_LINE:
            physical = physical[:_MAX_LINE]
        if physical.endswith("\r"):  # CRLF, or tqdm's last update
            physical = physical.rstrip("\r")
        segments = _split_segments(physical)
        single = len(segments) == 1 and "\r" not in physical
        for seg in segments:
            self._feed_record(seg, allow_join=single)
        self._prev_physical_len = len(physical)

    def _feed_record(self, raw: str, *, allow_join: bool) -> None:
        pre = _strip_prefixes(raw)
        rest = _REPEATED.sub("", pre.rest) if _holds(pre.rest, ("[repeated ",)) else pre.rest
        ip = pre.ip
        if pre.has_process:
            self._seen = True
        if not rest.strip():
            # a prefix-only line: tqdm's bare newline; the next unprefixed line is this process's
            self._pending_ip = ip if pre.has_process else None
            return
        if not pre.has_process and self._pending_ip:
            ip = self._pending_ip
        self._pending_ip = None
        if ip and ip not in self._remote_ips:
            self._remote_ips.append(ip)

        level: str | None = None
        msg = rest
        m = _RECORD.match(rest)
        if m:
            level, msg = m.group("level"), m.group("msg")
            self._seen = True
        else:
            m = _GLOG.match(rest) or _UVICORN.match(rest)
            if m:
                level = m.group("level")
                level = _GLOG_LEVELS.get(level, level)
                msg = m.group("msg")

        is_bar = bool(
            (_holds(msg, ("Completed",)) and _SHARD_BAR.search(msg))
            or (_holds(msg, ("Capturing CUDA graph",)) and _GRAPH_BAR.search(msg))
        )
        self._handle(msg, level=level, ip=ip, has_process=pre.has_process)

        # hard wrap: a bare line right after a long one may be its tail
        joined = False
        if (
            allow_join
            and not pre.has_process
            and level is None
            and not is_bar
            and not self._prev_was_bar
            and self._prev_msg is not None
            and self._prev_physical_len >= _WRAP_MIN
            and not msg.startswith((" ", "\t"))
            and self._join_lines < _MAX_JOIN_LINES
            and len(self._prev_msg) + len(msg) <= _MAX_JOIN_CHARS
        ):
            whole = self._prev_msg + msg
            self._handle(whole, level=self._prev_level, ip=ip, has_process=False, rejoined=True)
            self._prev_msg = whole
            self._join_lines += 1
            joined = True
        if not joined:
            self._prev_msg = msg
            self._prev_level = level
            self._join_lines = 1
        self._prev_was_bar = is_bar

    # -- matching --------------------------------------------------------------------------
    def _handle(
        self, msg: str, *, level: str | None, ip: str | None, has_process: bool, rejoined: bool = False
    ) -> None:
        """Apply every rule of ``LINE_RULES`` that matches the record, in table order, then
        look for a failure (which reads whatever the line is)."""
        text = msg.strip()
        if not text:
            return
        line = _Line(text, level, rejoined)
        taken: list[str] = []  # either-or groups already decided on this line
        # one pass over every rule's words rules out most lines of a log (no rule's) at once
        rules = LINE_RULES if _holds(text, _RULE_WORDS) else _UNSCREENED_RULES
        for rule in rules:
            if rule.group is not None and rule.group in taken:
                continue
            if rule.needs and not _holds(text, rule.needs):
                continue
            if rule.when is not None and not rule.when(line):
                continue
            m = rule.pattern.match(text) if rule.at_start else rule.pattern.search(text)
            if m is None:
                continue
            if rule.group is not None:
                taken.append(rule.group)
            self._apply(rule, m, line)
        self._check_failure(text, msg, level=level, ip=ip)

    def _apply(self, rule: LineRule, m: re.Match[str], line: _Line) -> None:
        """One matching rule's effects: its handler first, then its flags, phase and fields."""
        if rule.handler is not None:
            rule.handler(self, m, line)
        if rule.seen:
            self._seen = True
        if rule.loading:
            self._to_loading()
        if rule.phase is not None:
            self._enter_phase(rule.phase)
        v = self._v
        for capture in rule.sets:
            value: Any = capture.read(m)
            if value is None and capture.optional:
                continue
            if capture.convert is not None:
                value = capture.convert(value)
            if capture.rank is not None:
                self._set_ranked(capture.field, value, capture.rank)
            elif capture.keep_first:
                v.setdefault(capture.field, value)
            else:
                v[capture.field] = value

    # -- rule handlers: what a row of LINE_RULES cannot say as data -------------------------
    def _on_launch(self, m: re.Match[str], line: _Line) -> None:
        """A version line starts a launch: after loading had begun (or failed) it is a new run
        of a restarting container, which gets a fresh report (a re-joined copy of the line is
        the same launch, read again)."""
        if not line.rejoined and (self._level >= 1 or self._failed):
            self._restarts += 1
            self._reset_run()

    def _on_server_launch(self, m: re.Match[str], line: _Line) -> None:
        """``vLLM server version X, serving model Y``: the model, then the launch. The model is
        noted before a restart would reset the run, so after a restart this line's model is
        dropped while its version (a capture, read after the reset) is kept; kept as it was."""
        self._set_ranked("model", m.group("m"), 3)
        self._on_launch(m, line)

    def _on_engine_version(self, m: re.Match[str], line: _Line) -> None:
        """The engine line may also print its config, whose ``model='…'`` names the model (the
        weakest source of the name, rank 1)."""
        cm = _CONFIG_MODEL.search(line.text)
        if cm:
            self._set_ranked("model", cm.group("m"), 1)

    def _on_shard_bar(self, m: re.Match[str], line: _Line) -> None:
        """Shards done never go back within one bar (a rank's stale update must not undo
        progress); a bar with another total is another loader's and starts the count again."""
        v = self._v
        n, total = int(m.group("n")), int(m.group("total"))
        if v.get("shards_total") != total:
            v["shards_total"] = total
            v["shards_done"] = n
        else:
            v["shards_done"] = max(v.get("shards_done") or 0, n)

    def _on_compile_done(self, m: re.Match[str], line: _Line) -> None:
        """Compiling ends when torch.compile reports its total; vLLM profiles memory next."""
        if self._phase == PHASE_COMPILING:
            self._enter_phase(PHASE_PROFILING)

    def _on_graph_bar(self, m: re.Match[str], line: _Line) -> None:
        """Some bars name the capture and runtime modes (``mixed prefill-decode, PIECEWISE``),
        shown together; a bar without them clears the last one's."""
        mode = m.group("mode")
        self._v["cuda_graph_mode"] = f"{mode.strip()}, {m.group('rt')}" if mode else None

    def _on_ready(self, m: re.Match[str], line: _Line) -> None:
        """The server answers: ``ready``, unless the run already failed."""
        if not self._failed:
            self._level = 2
            self._enter_phase(PHASE_READY)

    def _track_traceback(self, text: str, msg: str, level: str | None) -> None:
        """Follow a Python traceback (plain, or logged line by line at ERROR as the engine core
        does): its first line, and its last unindented one, the exception."""
        if level in _NOT_FAILURE_LEVELS:
            self._tb_open = False
            return
        if _TRACEBACK.match(text) or (level is not None and _FRAME.match(text)):
            if not self._tb_open:
                self._tb_open = True
                self._tb_first = text
                self._tb_last = None
            return
        if not self._tb_open or msg[:1].isspace() or _FRAME.match(text) or text.startswith("raise "):
            return
        if text.startswith(("The above exception was", "During handling of the above exception")):
            return
        self._tb_last = text

    def _check_failure(self, text: str, msg: str, *, level: str | None, ip: str | None) -> None:
        self._track_traceback(text, msg, level)
        if level in _NOT_FAILURE_LEVELS:
            return
        if _holds(text, _PY_WARNING_WORDS) and _PY_WARNING.search(text) and not _TRACEBACK.match(text):
            return
        if level == "ERROR" and self._level < 2 and _FRAME.match(text):
            # a frame logged at ERROR (an engine core's traceback, its header cut off)
            self._fail("other", text, ip, specific=False)
            return
        if msg[:1] in (" ", "\t") and _SOURCE_LINE.match(text):
            return  # a traceback's source line (`raise ValueError(f"...")`), not the error itself
        if text.startswith(('File "', "raise ")):
            return
        ready = self._level >= 2

        lowered = text.lower()
        for kind, pattern, words in _KIND_SIGNATURES:
            if _holds(lowered, words) and pattern.search(text):
                self._seen = True
                if kind == "unsupported_architecture":
                    self._note_architectures(text)
                if kind == "other" and not (self._kind_locked and self._kind == "other"):
                    self._signature_other = True
                self._fail(kind, text, ip, specific=True)
                return
        if _holds(text, _GENERIC_FATAL_WORDS) and _GENERIC_FATAL.search(text):
            self._seen = True
            if not ready or _FATAL_AFTER_READY.search(text):
                self._fail("other", text, ip, specific=False)
            return
        if _TRACEBACK.match(text):
            if not ready:
                self._fail("other", text, ip, specific=False)
            return
        if not ready and _BARE_EXCEPTION.match(text) and not msg[:1].isspace():
            # the exception line that ends a traceback (or a bare one users paste): a root cause
            self._fail("other", text, ip, specific=True)

    def _note_architectures(self, text: str) -> None:
        m = _ARCH_LIST.search(text)
        names: tuple[str, ...] = ()
        if m:
            names = _names_in_list(m.group("l"))
        else:
            m2 = _ARCH_INSPECT.search(text)
            if m2:
                names = (m2.group("a"),)
        for name in names:
            if name not in self._unsupported:
                self._unsupported.append(name)
        m3 = _MODEL_TYPE.search(text)
        if m3:
            self._v.setdefault("unsupported_model_type", m3.group("t"))

    def _fail(self, kind: str, text: str, ip: str | None, *, specific: bool) -> None:
        # A classified cause (oom, architecture, nccl, ray) replaces an exception that said
        # nothing we could classify: vLLM 0.14 raises the registry's "architectures ... are not
        # supported" inside a pydantic ValidationError, whose first line is only the wrapper.
        if self._kind_locked and not (self._kind == "other" and kind != "other"):
            return
        first = not self._failed
        self._failed = True
        if specific or first:
            self._kind = kind
            self._failure_line = text
            self._failure_line_no = self._line_no
            self._failure_ip = ip
        elif ip and not self._failure_ip:
            self._failure_ip = ip
        if specific:
            self._kind_locked = True
        self._enter_phase(PHASE_FAILED)

    # -- state -----------------------------------------------------------------------------
    def _to_loading(self) -> None:
        self._seen = True
        if self._level < 1:
            self._level = 1

    def _set_ranked(self, field: str, value: Any, rank: int) -> None:
        """A value several lines state, some more reliably than others (the model, the version):
        a source never overrides one of higher rank; an empty value is not a value."""
        if not value:
            return
        if rank >= self._ranks.get(field, 0):
            self._v[field] = value
            self._ranks[field] = rank

    # -- report ----------------------------------------------------------------------------
    def _build(self) -> VllmLogReport:
        v = self._v
        state, phase = self._state_and_phase()
        proof: tuple[str, ...] = ()
        failure_line = self._failure_line if self._failed else None
        if self._failed and self._kind == "other" and not self._signature_other and self._tb_first:
            # no recognised cause: the traceback is the evidence, from its first line to its last
            proof = (self._tb_first,) if not self._tb_last else (self._tb_first, self._tb_last)
            failure_line = " … ".join(proof)
        # the values read from lines (``LINE_RULES``, failure details) are report fields by name
        values = dict(v)
        if values.get("load_seconds") is None:
            values["load_seconds"] = v.get("weights_seconds")
        report = VllmLogReport(
            state=state,  # type: ignore[arg-type]
            failure_kind=self._kind if self._failed else None,  # type: ignore[arg-type]
            phase=phase,
            compiling=phase == PHASE_COMPILING,
            unsupported_architectures=tuple(self._unsupported),
            remote_ips=tuple(self._remote_ips),
            failure_line=failure_line,
            failure_proof=proof,
            failure_line_no=self._failure_line_no if self._failed else None,
            failure_node_ip=self._failure_ip if self._failed else None,
            phase_events=tuple(self._events),
            restarts=self._restarts,
            lines=self._line_no,
            **values,
        )
        advice = advise(report) if self._failed else None
        if advice is None:
            return report
        return replace(report, advice=advice)


# --------------------------------------------------------------------------------------------
# The line rules, in the order they apply (research §1)

_LAUNCH = "launch"  # either-or groups: one line is one of these, never two
_ARGS = "args"
_RAY = "ray"
_KV_MEMORY = "kv memory"
_GRAPHS = "cuda graphs"

LINE_RULES: tuple[LineRule, ...] = (
    # launch / version lines (a new launch after loading began is a restart)
    LineRule(
        _API_VERSION,
        needs=("server version",),
        group=_LAUNCH,
        handler=VllmLogTracker._on_launch,
        phase=PHASE_STARTING,
        sets=(Capture("vllm_version", "v", rank=3),),
    ),
    LineRule(
        _SERVER_VERSION,
        needs=("server version",),
        group=_LAUNCH,
        handler=VllmLogTracker._on_server_launch,
        writes=("model",),
        phase=PHASE_STARTING,
        sets=(Capture("vllm_version", "v", rank=3),),
    ),
    LineRule(
        _BANNER_VERSION,
        needs=("version",),
        when=_has_banner_art,
        group=_LAUNCH,
        handler=VllmLogTracker._on_launch,
        phase=PHASE_STARTING,
        sets=(Capture("vllm_version", "v", rank=3),),
    ),
    LineRule(
        _ENGINE_VERSION,
        needs=("LLM engine (v",),
        handler=VllmLogTracker._on_engine_version,
        writes=("model",),
        sets=(Capture("vllm_version", "v", rank=1),),
    ),
    # The >= 0.16 banner names the model once the engine for it is being built: from here the
    # operator is waiting on that model (expected.json, log 20).
    LineRule(
        _BANNER_MODEL,
        needs=("model",),
        when=_has_banner_art,
        loading=True,
        sets=(Capture("model", "m", rank=3),),
    ),
    LineRule(_ARGS_MODEL, when=_names_args, group=_ARGS, sets=(Capture("model", ("m1", "m2"), rank=2),)),
    LineRule(_ARGS_MODEL_TAG, when=_names_args, group=_ARGS, sets=(Capture("model", "m", rank=2),)),
    LineRule(_ARCH, needs=("Resolved architecture",), sets=(Capture("architecture", "a"),)),
    LineRule(
        _MAX_LEN, needs=("Using max model len",), seen=False, sets=(Capture("max_model_len", "n", int),)
    ),
    # Ray / placement group: counts as loading (the contract)
    LineRule(_RAY_WAIT, needs=("placement group",), group=_RAY, loading=True, phase=PHASE_RAY_WAIT),
    LineRule(_RAY_CONNECT, needs=("Ray ", "placement group", "use_ray_spmd_worker"), group=_RAY),
    # weight loading
    LineRule(
        _START_LOAD,
        needs=("Starting to load model",),
        loading=True,
        phase=PHASE_LOADING,
        sets=(Capture("model", "m", str.strip, rank=1),),
    ),
    LineRule(
        _SHARD_BAR,
        needs=("Completed",),
        loading=True,
        phase=PHASE_LOADING,
        handler=VllmLogTracker._on_shard_bar,
        writes=("shards_done", "shards_total"),
        sets=(
            Capture("shard_desc", "desc"),
            Capture("shard_percent", "pct", int),
            Capture("shard_elapsed_s", "elapsed", _clock_seconds),
            Capture("shard_eta_s", "remaining", _clock_seconds),
            Capture("shard_rate", "rate", _text_or_none),
            Capture("shard_seconds_per_it", "rate", _rate_seconds),
        ),
    ),
    LineRule(
        _WEIGHTS_TOOK,
        needs=("Loading weights took",),
        loading=True,
        sets=(Capture("weights_seconds", "sec", _num),),
    ),
    LineRule(
        _MODEL_LOADING,
        needs=("loading took", "weights took"),
        loading=True,
        sets=(
            Capture("model_load_gib", "gib", _num),
            Capture("load_seconds", "sec", _num, optional=True),
        ),
    ),
    # compile / profile / KV cache / CUDA graphs
    LineRule(_COMPILE, needs=("ompil", "Dynamo"), loading=True, phase=PHASE_COMPILING),
    LineRule(
        _COMPILE_DONE,
        needs=("torch.compile",),
        loading=True,
        handler=VllmLogTracker._on_compile_done,
        sets=(Capture("compile_seconds", "sec", _num),),
    ),
    LineRule(
        _PROFILING, needs=("rofiling", "Estimated CUDA graph memory"), loading=True, phase=PHASE_PROFILING
    ),
    # the KV cache's size: today's line, then 0.6's and V0's wordings of it
    *(
        LineRule(
            pattern,
            needs=(words,),
            group=_KV_MEMORY,
            loading=True,
            phase=PHASE_KV_CACHE,
            sets=(Capture("kv_cache_gib", "gib", _num),),
        )
        for pattern, words in (
            (_KV_GIB, "KV cache memory"),
            (_KV_GIB_V06, "kv_cache_size="),
            (_KV_GIB_V0, "reserved for KV Cache"),
        )
    ),
    LineRule(
        _KV_TOKENS,
        needs=("KV cache size",),
        loading=True,
        phase=PHASE_KV_CACHE,
        sets=(Capture("kv_cache_tokens", "tok", _int),),
    ),
    LineRule(
        _CONCURRENCY,
        needs=("Maximum concurrency",),
        loading=True,
        phase=PHASE_KV_CACHE,
        sets=(Capture("max_concurrency", "x", _num),),
    ),
    LineRule(_GPU_BLOCKS, needs=(" blocks: ",), loading=True, sets=(Capture("gpu_blocks", "n", int),)),
    LineRule(
        _GRAPH_BAR,
        needs=("Capturing CUDA graph",),
        group=_GRAPHS,
        loading=True,
        phase=PHASE_CUDA_GRAPHS,
        handler=VllmLogTracker._on_graph_bar,
        writes=("cuda_graph_mode",),
        sets=(Capture("cuda_graph_done", "n", int), Capture("cuda_graph_total", "total", int)),
    ),
    LineRule(_GRAPH_START, needs=("Capturing ",), group=_GRAPHS, loading=True, phase=PHASE_CUDA_GRAPHS),
    LineRule(
        _GRAPH_DONE,
        needs=("Graph capturing finished",),
        loading=True,
        sets=(Capture("cuda_graph_seconds", "sec", _num),),
    ),
    LineRule(
        _INIT_ENGINE,
        needs=("init engine",),
        loading=True,
        phase=PHASE_API_SERVER,
        sets=(Capture("init_engine_seconds", "sec", _num),),
    ),
    # listening, ready
    LineRule(
        _LISTEN,
        needs=("Starting vLLM",),
        at_start=True,
        loading=True,
        phase=PHASE_API_SERVER,
        sets=(Capture("port", "port", int), Capture("listen_url", "url")),
    ),
    LineRule(
        _READY,
        needs=("Application startup complete",),
        when=_is_ready_record,
        handler=VllmLogTracker._on_ready,
    ),
    # failure details: numbers a failure message states, read whatever the line is (they do not
    # by themselves make the log a vLLM log)
    LineRule(
        _ESTIMATED_LEN,
        needs=("estimated maximum model length",),
        seen=False,
        sets=(Capture("estimated_max_model_len", "n", int),),
    ),
    LineRule(
        _KV_NEEDED,
        needs=("KV cache is needed",),
        seen=False,
        sets=(
            Capture("kv_cache_needed_gib", "need", _num),
            Capture("kv_cache_gib", "avail", _num, keep_first=True),
            Capture("max_model_len", "len", int, keep_first=True),
        ),
    ),
    LineRule(
        _V0_KV_SMALL,
        needs=("stored in KV cache",),
        seen=False,
        sets=(
            Capture("estimated_max_model_len", "n", int),
            Capture("max_model_len", "len", int, keep_first=True),
        ),
    ),
)


# Every word the screened rules need: a line that holds none of them is none of theirs, and goes
# only through the rules without a screen.
_RULE_WORDS: tuple[str, ...] = tuple(dict.fromkeys(word for rule in LINE_RULES for word in rule.needs))
_UNSCREENED_RULES: tuple[LineRule, ...] = tuple(rule for rule in LINE_RULES if not rule.needs)


# --------------------------------------------------------------------------------------------
# Advice: the next step, in plain words


def advise(report: VllmLogReport) -> str | None:
    """A plain-words next step for a failed run (``None`` when it did not fail)."""
    kind = report.failure_kind
    line = report.failure_line or ""
    if kind is None:
        return None
    if kind == "oom":
        if report.estimated_max_model_len is not None:
            return (
                "The KV cache is too small for one request of the configured context. vLLM estimates "
                f"the longest context that fits is {report.estimated_max_model_len} tokens: start with "
                f"--max-model-len {report.estimated_max_model_len} (or lower), or raise "
                "--gpu-memory-utilization if the node has memory to spare."
            )
        if "on startup is less than" in line:
            return (
                "Less memory was free at startup than --gpu-memory-utilization asks for. On a DGX Spark "
                "memory is shared with the OS and the page cache: stop other models on the node, drop "
                "the page cache (`sync; echo 3 | sudo tee /proc/sys/vm/drop_caches`), or lower "
                "--gpu-memory-utilization."
            )
        return (
            "Out of memory. Lower --gpu-memory-utilization or --max-model-len, drop the page cache "
            "(`sync; echo 3 | sudo tee /proc/sys/vm/drop_caches`) and stop other models on the node, or spread "
            "the model over more nodes with tensor parallelism (--tensor-parallel-size)."
        )
    if kind == "unsupported_architecture":
        archs = list(report.unsupported_architectures)
        what = ", ".join(archs) or (
            f"model type {report.unsupported_model_type}" if report.unsupported_model_type else "this model"
        )
        text = f"This image's vLLM does not know {what}. Pick an image whose vLLM supports it"
        if any(a.startswith("Qwen3_5") for a in archs) or "qwen3_5" in (report.unsupported_model_type or ""):
            text += " (Qwen3.5 needs vLLM 0.17 or newer; some 0.16 builds)"
        text += "."
        if "failed to be inspected" in line or "Error in inspecting" in line:
            text += (
                " 'Failed to be inspected' is usually an import or environment error in the image, not an "
                "unknown model: read the traceback above it."
            )
        return text
    if kind == "nccl":
        where = f" (node {report.failure_node_ip})" if report.failure_node_ip else ""
        return (
            f"The NCCL link between nodes failed or hung{where}. Check that NCCL_SOCKET_IFNAME and "
            "GLOO_SOCKET_IFNAME name the ConnectX-7 netdev (see `ibdev2netdev`), that the link is Up on "
            "both nodes and they ping each other over it, and that both nodes run the same image."
        )
    if kind == "ray":
        return (
            "Ray could not place the workers. Run `ray status`: every node must be listed with its GPU "
            "visible, and no other model may still hold the placement group (stop it first); the "
            "tensor-parallel size must not exceed the GPUs in the cluster."
        )
    if (
        "NVML" in line
        or "nvidia-container-cli" in line
        or "operation not permitted" in line
        or "platform None" in line
    ):
        return (
            "The container cannot see the GPU (NVML / driver). Check `nvidia-smi` on the host (driver "
            "loaded after a kernel upgrade?) and restart the container."
        )
    if "no kernel image is available" in line:
        return "This build has no kernels for the GB10 (sm_121): use an image built for DGX Spark."
    if "Error Internal" in line:
        # CUTLASS's status string from vLLM's block-FP8 GEMM on sm_121 (vllm#40758, vllm#43367)
        return ("This build's FP8 GEMM kernels fail on this GPU (CUTLASS 'Error Internal'; upstream builds lack "
                "GB10's sm_121 targets): use an image built for DGX Spark, such as NVIDIA's NGC vLLM image.")
    if "SafetensorError" in line:
        return (
            "A weight file is damaged or incomplete: verify the download (sizes, hashes) and copy it again."
        )
    if report.failure_proof:
        return (
            "The server failed with an error the console does not recognise: read the full traceback in "
            f"the log, from '{report.failure_proof[0]}' to '{report.failure_proof[-1]}' — its last line "
            "names the exception, the frames above it show where it was raised."
        )
    return "The server failed to start: the first error above (failure_line) is the root cause."


def parse_vllm_log(text: str) -> VllmLogReport:
    """Read a whole vLLM log (any version 0.6 -> today). Never raises on odd input."""
    tracker = VllmLogTracker()
    tracker.feed_text(text if isinstance(text, str) else str(text))
    return tracker.report


__all__ = [
    "CONTRACT_KEYS",
    "FAILURE_KINDS",
    "STATES",
    "VllmLogReport",
    "VllmLogTracker",
    "advise",
    "parse_vllm_log",
    "worst_report",
]
