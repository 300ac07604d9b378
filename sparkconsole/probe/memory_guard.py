"""The unified-memory guard's policy: when a DGX Spark is close enough to exhaustion to warn, and
when it must stop what the console started before the host locks up.

A GB10's CPU and GPU share one pool of memory. When it runs out the host does not always OOM-kill
cleanly: the driver's allocations fail (``NV_ERR_NO_MEMORY``) while ``free`` still looks fine, the
kernel stalls reclaiming page cache, and the whole node can freeze with nothing in the log. The
signals that come *before* that are ``MemAvailable`` falling and the kernel's pressure stall
information (``/proc/pressure/memory``): ``full`` is the share of time in which every runnable task
was stalled waiting for memory, the node doing nothing useful.

Everything here is a pure function of numbers and text, so the same policy runs in the console's
view, in the node-side watcher's parameters (:func:`sparkconsole.remote.memory_guard_watch`, which
takes its floors and thresholds from :class:`GuardConfig`) and in tests from data:

* :func:`floors`: the warning floor (the larger of 4 GiB and 3 % of the total) and the hard floor
  (the larger of 2 GiB and 1.5 %), each replaceable per cluster;
* :func:`parse_pressure`: the ``some``/``full`` lines of ``/proc/pressure/memory``;
* :func:`step`: one tick of the policy, with hysteresis (``full`` above its threshold must last
  ``stall_ticks`` ticks before the guard acts; one noisy sample does not stop an engine);
* :func:`stop_order`: what the guard may stop, in order;
* :func:`why_words`: after an action, an OOM kill or an Xid, what held the memory, in words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Literal

GIB = 1 << 30
KIB = 1024

WARN_FLOOR_MIN = 4 * GIB
WARN_FLOOR_SHARE = 0.03
HARD_FLOOR_MIN = 2 * GIB
HARD_FLOOR_SHARE = 0.015
FULL_ACT_PCT = 10.0  # ``full avg10`` above this: a tenth of the last ten seconds, the node stalled
SOME_WARN_PCT = 20.0  # ``some avg10`` above this: tasks often wait for memory
STALL_TICKS = 3
SWAP_WARN_SHARE = 0.5  # more than half the swap in use: the kernel is already paging out

Level = Literal["ok", "warn", "act"]


@dataclass(frozen=True)
class GuardConfig:
    """The guard's thresholds; None floors mean "from the node's total" (:func:`floors`).

    A cluster's inventory may set its own floors (``warn_floor_bytes``/``hard_floor_bytes``) where
    the defaults do not fit its work: a node that also runs a desktop wants more headroom."""

    warn_floor_bytes: int | None = None
    hard_floor_bytes: int | None = None
    full_act_pct: float = FULL_ACT_PCT
    some_warn_pct: float = SOME_WARN_PCT
    stall_ticks: int = STALL_TICKS

    def __post_init__(self) -> None:
        for name in ("warn_floor_bytes", "hard_floor_bytes"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise ValueError(f"{name} must not be negative")
        if not 0 < self.full_act_pct <= 100 or not 0 < self.some_warn_pct <= 100:
            raise ValueError("pressure thresholds are percentages in (0, 100]")
        if self.stall_ticks < 1:
            raise ValueError("stall_ticks must be at least 1")


def floors(total_bytes: int, config: GuardConfig = GuardConfig()) -> tuple[int, int]:
    """The (warn, hard) floors of ``MemAvailable`` for a node of ``total_bytes``. The hard floor
    never exceeds the warning floor (a cluster that set only the hard one above the default warning
    floor warns at its hard floor)."""
    warn = config.warn_floor_bytes if config.warn_floor_bytes is not None else max(
        WARN_FLOOR_MIN, round(total_bytes * WARN_FLOOR_SHARE))
    hard = config.hard_floor_bytes if config.hard_floor_bytes is not None else max(
        HARD_FLOOR_MIN, round(total_bytes * HARD_FLOOR_SHARE))
    return max(warn, hard), hard


@dataclass(frozen=True)
class Pressure:
    """``/proc/pressure/memory``: the share (%) of recent time tasks stalled on memory."""

    some_avg10: float
    some_avg60: float
    some_avg300: float
    some_total_us: int
    full_avg10: float | None  # None on kernels that print only ``some`` (PSI before 5.x for cpu)
    full_avg60: float | None
    full_avg300: float | None
    full_total_us: int | None


_PSI_LINE = re.compile(
    r"^(some|full) avg10=([0-9]+(?:\.[0-9]+)?) avg60=([0-9]+(?:\.[0-9]+)?) avg300=([0-9]+(?:\.[0-9]+)?) total=([0-9]+)\s*$")


def parse_pressure(text: str) -> Pressure | None:
    """The two lines of ``/proc/pressure/memory``, or None when there is no ``some`` line (no PSI:
    a kernel without ``CONFIG_PSI`` or booted with ``psi=0``, where the file is missing or refuses
    reads). Never raises."""
    rows: dict[str, tuple[float, float, float, int]] = {}
    for line in str(text).splitlines()[:8]:
        m = _PSI_LINE.match(line.strip())
        if m and m.group(1) not in rows:
            rows[m.group(1)] = (float(m.group(2)), float(m.group(3)), float(m.group(4)), int(m.group(5)))
    if "some" not in rows:
        return None
    s = rows["some"]
    f = rows.get("full")
    return Pressure(s[0], s[1], s[2], s[3], *(f if f else (None, None, None, None)))


@dataclass(frozen=True)
class Reading:
    """One tick's memory figures of a node (bytes; pressure may be missing)."""

    total_bytes: int
    available_bytes: int
    swap_total_bytes: int = 0
    swap_free_bytes: int = 0
    pressure: Pressure | None = None


@dataclass(frozen=True)
class GuardState:
    """What the policy carries from tick to tick: how many ticks in a row ``full`` was high."""

    stall_ticks: int = 0
    level: Level = "ok"


@dataclass(frozen=True)
class Decision:
    level: Level
    cause: str  # "" when ok; "available below the hard floor" / "memory pressure stalled the node" / …
    warn_floor_bytes: int
    hard_floor_bytes: int
    reasons: tuple[str, ...] = field(default_factory=tuple)


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def step(state: GuardState, reading: Reading, config: GuardConfig = GuardConfig()) -> tuple[GuardState, Decision]:
    """One tick of the guard: the new state and what to do.

    Acts (stop what the console started) when ``MemAvailable`` is below the hard floor (at once:
    on a Spark the last gigabytes go in seconds during a long prefill) or when ``full avg10`` has
    been above ``full_act_pct`` for ``stall_ticks`` ticks in a row. Warns below the warning floor,
    when ``some avg10`` is above ``some_warn_pct``, when ``full`` is high but not yet for long
    enough, or when more than half of the swap is in use."""
    warn_floor, hard_floor = floors(reading.total_bytes, config)
    avail = reading.available_bytes
    p = reading.pressure
    full = p.full_avg10 if p is not None else None
    stalled = state.stall_ticks + 1 if full is not None and full > config.full_act_pct else 0
    reasons: list[str] = []
    cause = ""
    level: Level = "ok"
    if avail < hard_floor:
        level, cause = "act", "available memory below the hard floor"
        reasons.append(f"MemAvailable {_gib(avail)} is below the hard floor {_gib(hard_floor)}")
    if stalled >= config.stall_ticks:
        if level != "act":
            level, cause = "act", "memory pressure stalled the node"
        reasons.append(f"full pressure {full:.1f}% (avg10) for {stalled} ticks, above {config.full_act_pct:g}%")
    if level == "ok":
        if avail < warn_floor:
            level, cause = "warn", "available memory below the warning floor"
            reasons.append(f"MemAvailable {_gib(avail)} is below the warning floor {_gib(warn_floor)}")
        if stalled:
            level, cause = "warn", cause or "memory pressure rising"
            reasons.append(f"full pressure {full:.1f}% (avg10), {stalled} of {config.stall_ticks} ticks")
        if p is not None and p.some_avg10 > config.some_warn_pct:
            level, cause = "warn", cause or "tasks waiting for memory"
            reasons.append(f"some pressure {p.some_avg10:.1f}% (avg10), above {config.some_warn_pct:g}%")
        swap_used = reading.swap_total_bytes - reading.swap_free_bytes
        if reading.swap_total_bytes > 0 and swap_used > reading.swap_total_bytes * SWAP_WARN_SHARE:
            level, cause = "warn", cause or "swap filling"
            reasons.append(f"swap {_gib(swap_used)} of {_gib(reading.swap_total_bytes)} in use")
    return replace(state, stall_ticks=stalled, level=level), Decision(level, cause, warn_floor, hard_floor, tuple(reasons))


@dataclass(frozen=True)
class Candidate:
    """Something running on the node that the guard might stop."""

    name: str  # the container (or job) name
    kind: Literal["engine", "bench", "service"]
    started_by_console: bool
    started_at: float  # when it started (any clock the candidates share)
    expendable: bool = False  # an inventory mark: a service the console did not start but may stop


def stop_order(candidates: list[Candidate] | tuple[Candidate, ...]) -> tuple[Candidate, ...]:
    """What the guard may stop, first to last: the engines the console started, newest first; then
    the benchmark jobs it started, newest first; then services marked expendable, newest first.
    Anything else (a service the console did not start and nobody marked) is never stopped."""
    def rank(c: Candidate) -> int | None:
        if c.started_by_console and c.kind == "engine":
            return 0
        if c.started_by_console and c.kind == "bench":
            return 1
        if c.expendable:
            return 2
        return None
    ranked = [(r, c) for c in candidates if (r := rank(c)) is not None]
    ranked.sort(key=lambda rc: (rc[0], -rc[1].started_at))
    return tuple(c for _, c in ranked)


@dataclass(frozen=True)
class Holders:
    """What held the memory when the guard acted or the kernel killed: what the console knows."""

    weights_bytes: int | None = None  # from the planner or the engine's log
    kv_cache_bytes: int | None = None
    cuda_graphs_bytes: int | None = None
    gpu_processes: tuple[tuple[int, str, int | None], ...] = ()  # (pid, name, bytes) not ours
    page_cache_bytes: int | None = None  # meminfo Cached
    prompt_tokens: int | None = None  # the running request's prompt length (/metrics)
    max_model_len: int | None = None


def why_words(holders: Holders, *, cause: str = "") -> tuple[str, ...]:
    """Plain lines saying what held the memory, biggest first where sizes are known. Names of other
    processes are the node's text: the screen shows them through ``display_text``."""
    sized: list[tuple[int, str]] = []
    if holders.weights_bytes:
        sized.append((holders.weights_bytes, f"model weights {_gib(holders.weights_bytes)}"))
    if holders.kv_cache_bytes:
        sized.append((holders.kv_cache_bytes, f"KV cache {_gib(holders.kv_cache_bytes)}"))
    if holders.cuda_graphs_bytes:
        sized.append((holders.cuda_graphs_bytes, f"CUDA graphs {_gib(holders.cuda_graphs_bytes)}"))
    for pid, name, size in holders.gpu_processes[:8]:
        label = f"another GPU process {name[:40]} (pid {pid})"
        sized.append((size or 0, f"{label} {_gib(size)}" if size else label))
    if holders.page_cache_bytes:
        sized.append((holders.page_cache_bytes, f"page cache {_gib(holders.page_cache_bytes)}"))
    sized.sort(key=lambda s: -s[0])
    lines = [cause] if cause else []
    if sized:
        lines.append("held: " + ", ".join(s for _, s in sized))
    if holders.prompt_tokens:
        of = f" of {holders.max_model_len}" if holders.max_model_len else ""
        lines.append(f"a request with a {holders.prompt_tokens}-token prompt{of} was being prefilled")
    if not sized and not holders.prompt_tokens:
        lines.append("what held the memory is not known (no plan, no metrics, no GPU process list)")
    return tuple(lines)


def worst_prefill_bytes(tokens: int, bytes_per_token: float) -> int:
    """The transient memory a prefill of ``tokens`` tokens needs on top of what is allocated
    (activations, ``bytes_per_token`` from the planner's model figures): what a full-length prompt
    adds at once."""
    return max(0, round(tokens * bytes_per_token))


def prefill_advice(*, total_bytes: int, committed_bytes: int, max_model_len: int, max_batched_tokens: int | None,
                   bytes_per_token: float, config: GuardConfig = GuardConfig()) -> tuple[int, tuple[str, ...]]:
    """Before the launch: the longest prefill chunk the node can take without crossing the warning
    floor, and advice when the launch's own (``max_batched_tokens``, or the whole ``max_model_len``
    when chunked prefill is off) would cross it."""
    warn_floor, _ = floors(total_bytes, config)
    room = total_bytes - committed_bytes - warn_floor
    fits = int(room // bytes_per_token) if bytes_per_token > 0 and room > 0 else 0
    chunk = max_batched_tokens or max_model_len
    if chunk <= fits:
        return fits, ()
    return fits, (
        f"a {chunk}-token prefill needs {_gib(worst_prefill_bytes(chunk, bytes_per_token))} and would leave less than "
        f"the {_gib(warn_floor)} floor",
        f"use --max-num-batched-tokens {max(1, fits)} (chunked prefill)" if fits else
        "no prefill fits above the floor: lower the KV cache or choose a smaller model",
    ) + ((f"or a shorter --max-model-len (at most {fits})",) if fits and not max_batched_tokens else ())


# ---- the node-side watcher's files, as the console reads them (remote.memory_guard_status) ----------

_KV = re.compile(r"([a-z_0-9]+)=(\S*)")
_CAUSE_WORDS = {"floor": "available memory below the hard floor", "pressure": "memory pressure stalled the node"}


def _kv(line: str) -> dict[str, str]:
    return {k: v[:200] for k, v in _KV.findall(line[:4096])}


def _num(fields: dict[str, str], key: str) -> int | None:
    v = fields.get(key, "")
    return int(v) if v.lstrip("-").isdigit() and len(v) < 20 else None


@dataclass(frozen=True)
class GuardEvent:
    """What the watcher did, from its reason line: the node, the cause, the floor, the pressure."""

    node: str
    cause: str  # in words (:data:`_CAUSE_WORDS`)
    available_bytes: int | None
    hard_floor_bytes: int | None
    full_avg10: float | None
    some_avg10: float | None
    swap_used_bytes: int | None
    stopped: tuple[str, ...]

    def words(self) -> str:
        what = ", ".join(self.stopped) or "nothing (no target was left)"
        parts = [f"{self.node}: the memory guard stopped {what}: {self.cause}"]
        if self.available_bytes is not None and self.hard_floor_bytes is not None:
            parts.append(f"MemAvailable {_gib(self.available_bytes)}, hard floor {_gib(self.hard_floor_bytes)}")
        if self.full_avg10 is not None:
            parts.append(f"pressure full {self.full_avg10:.1f}% some {self.some_avg10 or 0:.1f}% (avg10)")
        return "; ".join(parts)


@dataclass(frozen=True)
class GuardStatus:
    """The watcher as ``remote.memory_guard_status`` reads it."""

    armed: bool
    running: bool
    level: str  # ok / warn / acted / done / disarmed / ended, or "" before its first tick
    available_bytes: int | None = None
    full_avg10: float | None = None
    stall: str = ""  # "N/M"
    event: GuardEvent | None = None


def _pct(v: int | None) -> float | None:
    return None if v is None or v < 0 else v / 100


def _kib(v: int | None) -> int | None:
    return None if v is None or v < 0 else v * KIB


def parse_guard_status(text: str) -> GuardStatus | None:
    """``guard armed|disarmed running|stopped``, ``state LINE``, ``reason LINE``; None when the
    first line is not there (not the watcher's answer). Never raises."""
    lines = str(text).splitlines()[:8]
    head = lines[0].split() if lines else []
    if len(head) != 3 or head[0] != "guard":
        return None
    state = next((ln[6:] for ln in lines if ln.startswith("state ")), "")
    reason = next((ln[7:] for ln in lines if ln.startswith("reason ")), "")
    sf = _kv(state)
    level = state.split(" ", 1)[0] if state.strip() else ""
    event = None
    rf = _kv(reason)
    if reason.startswith("acted ") and rf.get("cause") in _CAUSE_WORDS:
        stopped = tuple(s for s in rf.get("stopped", "").split(",") if s)[:16]
        event = GuardEvent(node=rf.get("node", "?")[:128], cause=_CAUSE_WORDS[rf["cause"]],
                           available_bytes=_kib(_num(rf, "avail_kib")), hard_floor_bytes=_kib(_num(rf, "hard_kib")),
                           full_avg10=_pct(_num(rf, "full_x100")), some_avg10=_pct(_num(rf, "some_x100")),
                           swap_used_bytes=_kib(_num(rf, "swap_used_kib")), stopped=stopped)
    return GuardStatus(armed=head[1] == "armed", running=head[2] == "running", level=level[:16],
                       available_bytes=_kib(_num(sf, "avail_kib")), full_avg10=_pct(_num(sf, "full_x100")),
                       stall=sf.get("stall", "")[:16], event=event)
