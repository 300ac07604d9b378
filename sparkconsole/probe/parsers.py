"""Pure parsers: the text one probe section printed -> a typed, frozen sample.

Every parser here is a pure function of its text and follows the same rules, because the text
comes from machines we do not control (other driver versions, a tool that is missing, a shell
prompt pasted in front of the output, a document that decorated it):

* It never raises. What it cannot read is ``None`` (never ``0``: the dashboard must not show a
  made-up value) or an empty tuple.
* ``[N/A]``, ``N/A``, ``Not Supported`` are ``None``.
* Lines that are not part of the output (an echoed prompt such as ``nvidia@spark:~$ ibdev2netdev``,
  the ``sh: 1: nvidia-smi: not found`` that ``2>&1`` put in the section) are skipped.
* Why a value is missing is kept: each parser takes an optional ``reasons`` dict and adds
  ``key -> plain-words reason`` to it (the assembler files them under the sample's ``unknown``).
  An out-parameter keeps the return types the plain samples of :mod:`sparkconsole.probe.samples`.

As a last line of defence each public parser is wrapped so that a bug on some unforeseen input
returns the empty sample with a reason instead of an exception; tests switch that net off
(:data:`STRICT`) so such bugs still show up there.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, ParamSpec, TypeVar

from sparkconsole.probe.memory_guard import Pressure, parse_pressure
from sparkconsole.probe.samples import (
    MIB,
    Container,
    CsvTable,
    DiskUsage,
    GpuProcess,
    GpuSample,
    IbLink,
    IbPort,
    MemInfo,
    NetInterface,
    NvidiaSmiTable,
    RayStatus,
)

#: When true, a parser bug raises instead of being turned into an empty sample (tests set it).
STRICT = False

Reasons = dict[str, str] | None

P = ParamSpec("P")
R = TypeVar("R")

_NA = {"", "n/a", "[n/a]", "not supported", "[not supported]", "na", "-", "--", "[unknown error]",
       "unknown error", "[insufficient permissions]", "[gpu is lost]", "[requires pro. version]"}

# A line that a shell or a tool printed instead of the output we asked for. Kept narrow: it must
# not swallow real data lines.
_TOOL_ERROR = re.compile(
    r"(?:: not found\b|command not found|No such file or directory|Permission denied"
    r"|Cannot connect to the Docker daemon|permission denied while trying to connect"
    r"|Failed to initialize NVML|NVIDIA-SMI has failed|couldn't communicate with the NVIDIA driver"
    r"|No devices were found|Could not find any running Ray instance|^Traceback \(most recent call last\)"
    r"|^Error(?: response from daemon)?:|^error:)",
    re.IGNORECASE,
)
_TIMEOUT_NOEXEC = re.compile(r"timeout: failed to run command [‘'`]?(.+?)[’'`]?: No such file or directory")
_EXC_LINE = re.compile(r"^[\w.]+(?:Error|Exception|Exit|Interrupt)\b:?")
# A shell prompt echoed in front of the output: ``nvidia@dxg-spark-1:~$ ibdev2netdev``.
_PROMPT = re.compile(r"^\s*(?:[\w.-]+@[\w.-]+(?::\S*)?\s*[$#%>]\s|[$#]\s)")
_SHELL_PREFIX = re.compile(r"^(?:[\w./-]*sh|bash|dash|zsh|[\w./-]+\.sh):\s*(?:line\s+)?\d+:\s*")


def _safe(default: Callable[[], Any]) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Wrap a parser so an unforeseen bug yields ``default()`` and a reason, not a traceback."""

    def deco(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # the net: parsers must never raise on input
                if STRICT:
                    raise
                reasons = kwargs.get("reasons")
                if isinstance(reasons, dict):
                    reasons["parser"] = f"{fn.__name__} could not read this text ({type(exc).__name__})"
                return default()

        return wrapper

    return deco


# ---------------------------------------------------------------------------------------------
# small helpers


def tool_error(text: str) -> str | None:
    """The first line of ``text`` that says the tool failed (missing, no driver, no daemon).

    The shell's ``sh: 1:`` prefix is dropped so the reason reads ``nvidia-smi: not found``.
    """
    if not isinstance(text, str):
        return None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for i, s in enumerate(lines):
        if not _TOOL_ERROR.search(s):
            continue
        if s.startswith("Traceback"):  # a Python tool crashed: its last "XError: why" line says why
            for last in reversed(lines[i + 1 :]):
                if _EXC_LINE.match(last):
                    return last[:200]
        tm = _TIMEOUT_NOEXEC.search(s)
        if tm:  # the probe wraps each tool in coreutils timeout, which words "not found" so
            return f"{tm.group(1)}: not found"
        return _SHELL_PREFIX.sub("", s)[:200]
    return None


def first_line(text: str) -> str:
    """The first non-empty line, without a shell's ``sh: 1:`` prefix (for reasons)."""
    for line in (text or "").splitlines():
        if line.strip():
            return _SHELL_PREFIX.sub("", line.strip())[:200]
    return ""


def _note(reasons: Reasons, key: str, why: str) -> None:
    if reasons is not None and key not in reasons:
        reasons[key] = why


def is_na(value: str | None) -> bool:
    """True for the spellings nvidia-smi and friends use for "no value"."""
    return value is None or value.strip().lower() in _NA


_NUM_UNIT = re.compile(
    r"^([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*"
    r"(%|[KMGTP]i?B|[kKMGT]B|B|W|mW|[MGk]Hz|Hz|C|°C|s|ms|us|µs|ns|V|mV|RPM)?$"
)


def number(value: Any) -> int | float | None:
    """``"3.74 W"`` -> 3.74, ``"109832 MiB"`` -> 109832, ``"[N/A]"`` -> None, ``"P8"`` -> None.

    Integers stay ``int`` so JSON prints ``41`` not ``41.0``; the unit is dropped (the caller knows
    it from the field).
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if not isinstance(value, str) or is_na(value):
        return None
    m = _NUM_UNIT.match(value.strip())
    if not m:
        return None
    raw = m.group(1)
    try:
        if re.fullmatch(r"[-+]?\d+", raw):
            return int(raw)
        f = float(raw)
    except (ValueError, OverflowError):
        return None
    if f != f or f in (float("inf"), float("-inf")):
        return None
    return f


def _int(value: Any) -> int | None:
    n = number(value)
    if n is None:
        return None
    try:
        return int(n)
    except (ValueError, OverflowError):
        return None


def _float(value: Any) -> float | None:
    n = number(value)
    return None if n is None else n  # int is a fine float (JSON keeps 41, not 41.0)


def _text(value: Any) -> str | None:
    if value is None:
        return None
    s = str(value).strip()
    return None if is_na(s) else s


_SIZE_UNITS = {
    "b": 1,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4, "pib": 1024**5,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4, "pb": 1000**5,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*([KMGTP]?i?B|[kK]B)\s*$", re.IGNORECASE)


def size_bytes(value: str | None) -> int | None:
    """``"1.5GiB"`` -> 1610612736; ``"12kB"`` -> 12000 (docker uses both); odd text -> None."""
    if not isinstance(value, str) or is_na(value):
        return None
    m = _SIZE.match(value)
    if not m:
        return None
    unit = _SIZE_UNITS.get(m.group(2).lower())
    if unit is None:
        return None
    try:
        return round(float(m.group(1)) * unit)
    except (ValueError, OverflowError):
        return None


# ---------------------------------------------------------------------------------------------
# /proc/meminfo

_MEMINFO_KEYS = {
    "MemTotal": "mem_total_bytes",
    "MemAvailable": "mem_available_bytes",
    "MemFree": "mem_free_bytes",
    "Cached": "cached_bytes",
    "Buffers": "buffers_bytes",
    "SwapTotal": "swap_total_bytes",
    "SwapFree": "swap_free_bytes",
}
_MEMINFO_LINE = re.compile(r"^\s*([A-Za-z_()0-9]+):\s+(\d+)(?:\s*(kB|KB|KiB|B))?\s*$")


@_safe(MemInfo)
def parse_meminfo(text: str, reasons: Reasons = None) -> MemInfo:
    """``/proc/meminfo``: the kernel writes ``kB`` and means KiB, so values are ×1024."""
    values: dict[str, int] = {}
    for line in str(text).splitlines():
        m = _MEMINFO_LINE.match(line)
        if not m or m.group(1) not in _MEMINFO_KEYS:
            continue
        field = _MEMINFO_KEYS[m.group(1)]
        if field in values:  # a second copy (two files pasted together): keep the first
            continue
        n = int(m.group(2))
        values[field] = n if m.group(3) == "B" else n * 1024
    if not values:
        _note(reasons, "meminfo", tool_error(text) or "no /proc/meminfo lines in the output")
    elif "mem_total_bytes" not in values:
        _note(reasons, "meminfo.total", "no MemTotal line")
    return MemInfo(**values)


# ---------------------------------------------------------------------------------------------
# /proc/pressure/memory (PSI)


def parse_psi(text: str, reasons: Reasons = None) -> Pressure | None:
    """The ``psi`` section: ``/proc/pressure/memory`` (the memory guard's policy reads it,
    :func:`sparkconsole.probe.memory_guard.parse_pressure`); None with a reason where the kernel
    has no PSI (no file, ``psi=0``)."""
    pressure = parse_pressure(text)  # never raises: it reads at most 8 lines by one anchored pattern
    if pressure is None:
        _note(reasons, "psi", tool_error(text) or "no /proc/pressure/memory lines (a kernel without PSI)")
    return pressure


# ---------------------------------------------------------------------------------------------
# nvidia-smi, the default table

_DRIVER = re.compile(r"Driver Version:\s*([^\s|]+)")
_CUDA = re.compile(r"CUDA Version:\s*([^\s|]+)")
_GPU_ROW1 = re.compile(r"^\s*(\d+)\s+(.+?)(?:\s+(On|Off))?\s*$")
_GPU_ROW2_TEMP = re.compile(r"(?<![\w.])(\d+)\s*C\b")
_GPU_ROW2_PSTATE = re.compile(r"\b(P\d{1,2})\b")
_GPU_ROW2_POWER = re.compile(r"(\S+)\s*/\s*(\S+)\s*$")
_MEM_CELL = re.compile(r"(\d+)\s*MiB\s*/\s*(\d+)\s*MiB")
_UTIL = re.compile(r"^\s*(\d+)\s*%")
_PROC_ROW = re.compile(
    r"^\s*(\d+|N/A)\s+(?:(\S+)\s+(\S+)\s+)?(\d+)\s+(C\+G|M\+C|C|G|M)\s+(.*?)\s*(\d+\s*MiB|N/A|Not Supported)?\s*$"
)


def _cells(line: str) -> list[str] | None:
    """The cells of a ``| a | b | c |`` table line, or None for rules and non-table lines."""
    s = line.rstrip()
    if not s.startswith("|") or not s.endswith("|") or len(s) < 2:
        return None
    return [c.strip() for c in s[1:-1].split("|")]


def _watts(value: str) -> float | None:
    v = value.strip()
    if v.upper().endswith("W"):
        v = v[:-1]
    return _float(v)


@_safe(NvidiaSmiTable)
def parse_nvidia_smi_table(text: str, reasons: Reasons = None) -> NvidiaSmiTable:
    """The default ``nvidia-smi`` table: versions, one block per GPU, the process rows.

    Works cell by cell (``|``-separated) rather than by column offsets, so a table from another
    driver (older ones have no GI/CI columns) or with several GPUs reads the same way. On a GB10
    the memory cell is the literal ``Not Supported``: memory stays ``None`` and says why.
    """
    text = str(text)
    driver = cuda = None
    m = _DRIVER.search(text)
    if m:
        driver = _text(m.group(1))
    m = _CUDA.search(text)
    if m:
        cuda = _text(m.group(1))

    gpus: list[dict[str, Any]] = []
    processes: list[GpuProcess] = []
    in_procs = in_mig = False
    current: dict[str, Any] | None = None
    for line in text.splitlines():
        if "Processes:" in line:
            in_procs, in_mig, current = True, False, None
            continue
        if "MIG devices:" in line:  # its rows look like GPU rows: skip the whole block
            in_mig, current = True, None
            continue
        if in_mig:
            continue
        cells = _cells(line)
        if cells is None:
            continue
        if in_procs:
            if len(cells) != 1:
                continue
            pm = _PROC_ROW.match(cells[0])
            if pm:
                mem = pm.group(7)
                processes.append(GpuProcess(
                    gpu=_int(pm.group(1)),
                    pid=_int(pm.group(4)),
                    type=pm.group(5),
                    name=_text(pm.group(6)),
                    memory_mib=_float(mem.replace(" ", "")) if mem else None,
                ))
            continue
        if len(cells) < 3:
            continue
        r1 = _GPU_ROW1.match(cells[0])
        if r1 and not _GPU_ROW2_TEMP.search(cells[0]):
            current = {"index": int(r1.group(1)), "name": _text(r1.group(2)), "driver_version": driver}
            bus = cells[1].split()
            if bus and re.fullmatch(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]", bus[0]):
                current["bus_id"] = bus[0]
            gpus.append(current)
            continue
        if current is None or "pstate" in current or "temperature_c" in current:
            continue
        left = cells[0]
        if not (_GPU_ROW2_PSTATE.search(left) or "/" in left):
            continue
        tm = _GPU_ROW2_TEMP.search(left)
        current["temperature_c"] = _float(tm.group(1)) if tm else None
        ps = _GPU_ROW2_PSTATE.search(left)
        current["pstate"] = ps.group(1) if ps else None
        pw = _GPU_ROW2_POWER.search(left)
        if pw:
            current["power_w"] = _watts(pw.group(1))
            current["power_limit_w"] = _watts(pw.group(2))
        mm = _MEM_CELL.search(cells[1])
        if mm:
            current["memory_used_mib"] = _float(mm.group(1))
            current["memory_total_mib"] = _float(mm.group(2))
        elif "not supported" in cells[1].lower():
            _note(reasons, f"gpu{current['index']}.memory",
                  "unified memory: nvidia-smi reports Not Supported")
        else:
            _note(reasons, f"gpu{current['index']}.memory", "no memory figure in the table")
        um = _UTIL.match(cells[2])
        current["utilization_pct"] = _float(um.group(1)) if um else None
        for key in ("power_w", "power_limit_w"):
            if current.get(key) is None:
                _note(reasons, f"gpu{current['index']}.{key}", "nvidia-smi reports N/A")

    if not gpus:
        _note(reasons, "nvidia-smi", tool_error(text) or "no GPU rows in the nvidia-smi table")
    return NvidiaSmiTable(
        driver_version=driver,
        cuda_version=cuda,
        gpus=tuple(GpuSample(**g) for g in gpus),
        processes=tuple(processes),
    )


# ---------------------------------------------------------------------------------------------
# nvidia-smi --query-... --format=csv

_HEADER_TOKEN = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_.]*(?:\s*\[[^\]]*\])?|\.\.\.|…)$")
_UNIT_SUFFIX = re.compile(r"\s*\[[^\]]*\]\s*$")
# Fields whose values are names or versions, never numbers ("550.50" must stay "550.50").
_TEXT_FIELDS = {
    "name", "gpu_name", "uuid", "gpu_uuid", "serial", "pci.bus_id", "gpu_bus_id", "driver_version",
    "vbios_version", "process_name", "pstate", "compute_mode", "persistence_mode", "display_mode",
    "display_active", "inforom.img", "mig.mode.current", "mig.mode.pending", "gom.current",
    "compute_cap",
}


def _is_header(tokens: list[str]) -> bool:
    return bool(tokens) and all(_HEADER_TOKEN.match(t) for t in tokens) and any(
        t not in ("...", "…") for t in tokens
    )


def _csv_value(field: str, raw: str) -> Any:
    if is_na(raw):
        return None
    if field in _TEXT_FIELDS:
        return raw
    n = number(raw)
    return raw if n is None else n


@_safe(CsvTable)
def parse_nvidia_smi_csv(text: str, fields: list[str] | None = None, reasons: Reasons = None) -> CsvTable:
    """Any ``nvidia-smi --query-… --format=csv`` output.

    Keys are the header names without the unit suffix (``memory.used [MiB]`` -> ``memory.used``);
    values are numbers where they are numbers (``3.74 W`` -> 3.74), ``None`` for ``[N/A]``.
    ``noheader`` output is read only when ``fields`` names the columns (else it is refused: the
    columns of a headerless table cannot be guessed). A header whose author elided columns with
    ``...`` still reads: values past the named ones get keys ``col<N>`` (N counts from 0).
    """
    text = str(text)
    names: list[str | None] | None = None
    if fields:
        names = [_UNIT_SUFFIX.sub("", str(f)).strip() for f in fields]
    rows: list[dict[str, Any]] = []
    saw_header = False
    for line in text.splitlines():
        if not line.strip() or _TOOL_ERROR.search(line) or _PROMPT.match(line):
            continue
        tokens = [t.strip() for t in line.split(",")]
        if not saw_header and _is_header(tokens):
            header = [None if t in ("...", "…") else _UNIT_SUFFIX.sub("", t) for t in tokens]
            if names is None:
                saw_header, names = True, header
                continue
            if [h for h in header if h] == [n for n in names if n][: len([h for h in header if h])]:
                saw_header = True  # the header in front of data whose fields we were told: skip it
                continue
        if names is None:
            continue
        named = [n for n in names if n]
        if len(named) > 1 and len(tokens) < 2:
            continue
        row: dict[str, Any] = {}
        for i, raw in enumerate(tokens):
            key = names[i] if i < len(names) and names[i] else f"col{i}"
            row[key] = _csv_value(key, raw)
        for n in named:
            row.setdefault(n, None)
        rows.append(row)
    if names is None:
        _note(reasons, "csv", tool_error(text) or "no CSV header (noheader output needs the field list)")
    elif not rows:
        _note(reasons, "csv", tool_error(text) or "no rows")
    if names is not None and any(n is None for n in names):
        _note(reasons, "csv.header", "header elided with '...': extra values keyed col<N>")
    return CsvTable(rows=tuple(rows))


def _pick(row: Mapping[str, Any], *keys: str) -> Any:
    for k in keys:
        if k in row and row[k] is not None:
            return row[k]
    return None


def _text_field(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return None
    return _text(str(value))


@_safe(tuple)
def gpus_from_query(table: CsvTable, reasons: Reasons = None) -> tuple[GpuSample, ...]:
    """GPUs from the ``--query-gpu`` CSV of :data:`~sparkconsole.probe.script.GPU_QUERY_FIELDS`.

    nvidia-smi writes some headers differently from the names asked for (``clocks.sm`` comes
    back as ``clocks.current.sm``), so both spellings are read.
    """
    out: list[GpuSample] = []
    for row in getattr(table, "rows", ()) or ():
        if not isinstance(row, Mapping):
            continue
        g = GpuSample(
            index=_int(_pick(row, "index")),
            name=_text_field(_pick(row, "name", "gpu_name")),
            uuid=_text_field(_pick(row, "uuid", "gpu_uuid")),
            bus_id=_text_field(_pick(row, "pci.bus_id", "gpu_bus_id")),
            driver_version=_text_field(_pick(row, "driver_version")),
            temperature_c=_float(_pick(row, "temperature.gpu")),
            power_w=_float(_pick(row, "power.draw", "power.draw.instant", "power.draw.average")),
            power_limit_w=_float(_pick(row, "power.limit", "enforced.power.limit")),
            utilization_pct=_float(_pick(row, "utilization.gpu")),
            memory_used_mib=_float(_pick(row, "memory.used")),
            memory_total_mib=_float(_pick(row, "memory.total")),
            clock_sm_mhz=_float(_pick(row, "clocks.sm", "clocks.current.sm")),
            clock_max_sm_mhz=_float(_pick(row, "clocks.max.sm", "clocks.max.sm_clock")),
            pstate=_text_field(_pick(row, "pstate")),
        )
        if g == GpuSample():
            continue
        key = f"gpu{g.index if g.index is not None else len(out)}"
        if g.memory_total_mib is None:
            why = "unified memory: nvidia-smi reports Not Supported" if g.name and "GB10" in g.name \
                else "nvidia-smi reports no memory figure"
            _note(reasons, f"{key}.memory", why)
        out.append(g)
    return tuple(out)


@_safe(tuple)
def processes_from_query(
    table: CsvTable, gpus: tuple[GpuSample, ...] = (), reasons: Reasons = None
) -> tuple[GpuProcess, ...]:
    """Processes from ``--query-compute-apps=pid,process_name,used_gpu_memory``.

    On a GB10 this is the only memory figure nvidia-smi gives. The CSV names no GPU index; when
    it carries ``gpu_bus_id`` and ``gpus`` are known, the index is looked up, and on a one-GPU
    node it is that GPU.
    """
    by_bus = {g.bus_id.lower(): g.index for g in gpus if g.bus_id}
    out: list[GpuProcess] = []
    for row in getattr(table, "rows", ()) or ():
        if not isinstance(row, Mapping):
            continue
        pid = _int(_pick(row, "pid"))
        name = _text_field(_pick(row, "process_name", "name"))
        mem = _float(_pick(row, "used_gpu_memory", "used_memory"))
        if pid is None and name is None and mem is None:
            continue
        gpu = None
        bus = _text_field(_pick(row, "gpu_bus_id", "pci.bus_id"))
        if bus and bus.lower() in by_bus:
            gpu = by_bus[bus.lower()]
        elif len(gpus) == 1:
            gpu = gpus[0].index
        if mem is None:
            _note(reasons, f"pid{pid}.memory", "nvidia-smi reports no memory for this process")
        out.append(GpuProcess(gpu=gpu, pid=pid, type="C", name=name, memory_mib=mem))
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# RDMA: ibdev2netdev and /sys/class/infiniband

_IBDEV = re.compile(r"^\s*([\w.-]+)\s+port\s+(\d+)\s+==>\s+(\S+)\s+\((\w+)\)\s*$")


def _link_state(word: str) -> Literal["up", "down"] | None:
    w = word.strip().lower()
    if w == "up":
        return "up"
    if w == "down":
        return "down"
    return None


@_safe(tuple)
def parse_ibdev2netdev(text: str, reasons: Reasons = None) -> tuple[IbLink, ...]:
    """``ibdev2netdev``: ``rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)``.

    Its line order is not stable between runs, so links come back sorted by RDMA device and
    port; anything that is not such a line (a prompt, an error) is skipped.
    """
    seen: dict[tuple[str, int], IbLink] = {}
    for line in str(text).splitlines():
        m = _IBDEV.match(line)
        if not m:
            continue
        port = int(m.group(2))
        netdev = None if m.group(3) in ("***", "N/A") else m.group(3)
        seen.setdefault((m.group(1), port), IbLink(m.group(1), port, netdev, _link_state(m.group(4))))
    if not seen:
        _note(reasons, "ibdev2netdev", tool_error(text) or "no 'dev port N ==> netdev (State)' lines")
    return tuple(seen[k] for k in sorted(seen, key=lambda k: (k[0].lower(), k[1], k[0])))


_IB_SYSFS = re.compile(r"^/sys/class/infiniband/([^/\s*?]+)/ports/(\d+)/(state|rate):(.*)$")
_IB_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec", re.IGNORECASE)


@_safe(tuple)
def parse_ib_ports(text: str, reasons: Reasons = None) -> tuple[IbPort, ...]:
    """``grep -H . /sys/class/infiniband/*/ports/*/state …/rate``.

    sysfs writes ``state`` as ``4: ACTIVE`` and ``rate`` as ``200 Gb/sec (4X HDR)``. When the
    globs match nothing (no RDMA stack) grep prints an error, which yields no ports.
    """
    ports: dict[tuple[str, int], dict[str, Any]] = {}
    for line in str(text).splitlines():
        m = _IB_SYSFS.match(line.strip())
        if not m:
            continue
        key = (m.group(1), int(m.group(2)))
        entry = ports.setdefault(key, {})
        value = m.group(4).strip()
        if m.group(3) == "state":
            word = value.split(":", 1)[1] if ":" in value else value
            entry["state"] = _text(word.strip().upper())
        else:
            rm = _IB_RATE.match(value)
            entry["rate_gbps"] = float(rm.group(1)) if rm else None
    if not ports:
        _note(reasons, "ib-ports", tool_error(text) or "no /sys/class/infiniband port files")
    return tuple(
        IbPort(rdma_device=k[0], port=k[1], state=v.get("state"), rate_gbps=v.get("rate_gbps"))
        for k, v in sorted(ports.items(), key=lambda kv: (kv[0][0].lower(), kv[0][1], kv[0][0]))
    )


# ---------------------------------------------------------------------------------------------
# ip


def _carrier(flags: list[str] | tuple[str, ...]) -> bool | None:
    if "NO-CARRIER" in flags:
        return False
    if "LOWER_UP" in flags:
        return True
    return None  # an interface set down reports neither: carrier unknown


@_safe(tuple)
def parse_ip_addr_json(text: str, reasons: Reasons = None) -> tuple[NetInterface, ...]:
    """``ip -j addr``: interfaces with MTU, operstate, carrier (NO-CARRIER -> False) and IPv4."""
    text = str(text)
    start, end = text.find("["), text.rfind("]")
    data: Any = None
    if 0 <= start < end:
        try:
            data = json.loads(text[start : end + 1])
        except (ValueError, RecursionError):
            data = None
    if not isinstance(data, list):
        _note(reasons, "ip-addr", tool_error(text) or "no JSON list from 'ip -j addr'")
        return ()
    out: list[NetInterface] = []
    for item in data:
        if not isinstance(item, dict):
            continue
        name = item.get("ifname")
        if not isinstance(name, str) or not name:
            continue
        flags = item.get("flags")
        flags = [f for f in flags if isinstance(f, str)] if isinstance(flags, list) else None
        ipv4 = []
        infos = item.get("addr_info")
        for info in infos if isinstance(infos, list) else ():
            if not isinstance(info, dict) or info.get("family") != "inet":
                continue
            local = info.get("local")
            if not isinstance(local, str):
                continue
            plen = info.get("prefixlen")
            ipv4.append(f"{local}/{plen}" if isinstance(plen, int) and not isinstance(plen, bool) else local)
        mac = item.get("address")
        out.append(NetInterface(
            name=name,
            ifindex=_int(item.get("ifindex")),
            mtu=_int(item.get("mtu")),
            operstate=_text(item.get("operstate")) if isinstance(item.get("operstate"), str) else None,
            carrier=_carrier(flags) if flags is not None else None,
            mac=mac if isinstance(mac, str) and item.get("link_type") != "none" else None,
            ipv4=tuple(ipv4),
        ))
    return tuple(out)


_IP_HEAD = re.compile(r"^\s*(\d+):\s+([^\s:@]+)(?:@[^\s:]+)?:\s+<([^>]*)>(.*)$")
_IP_MTU = re.compile(r"\bmtu\s+(\d+)")
_IP_STATE = re.compile(r"\bstate\s+(\S+)")
_IP_MAC = re.compile(r"^\s*link/\S+\s+([0-9a-fA-F]{2}(?::[0-9a-fA-F]{2}){5})\b")
_IP_INET = re.compile(r"^\s*inet\s+([*_`]*)\s*(\d{1,3}(?:\.\d{1,3}){3})\s*([*_`]*)\s*(?:/(\d{1,2}))?")


@_safe(tuple)
def parse_ip_addr_text(text: str, reasons: Reasons = None) -> tuple[NetInterface, ...]:
    """``ip addr show`` / ``ip link show`` / ``ip -s link show`` as text.

    Tolerant: lines may be indented (a document quoting it) and the address may be decorated
    (Markdown ``**192.168.100.10**/24``); a decorated address is still read, and a reason under
    ``<ifname>.ipv4`` says it was, so nobody trusts it blindly.
    """
    out: list[NetInterface] = []
    cur: dict[str, Any] | None = None

    def close() -> None:
        if cur is not None:
            out.append(NetInterface(**{**cur, "ipv4": tuple(cur["ipv4"])}))

    for line in str(text).splitlines():
        h = _IP_HEAD.match(line)
        if h:
            close()
            flags = [f for f in h.group(3).split(",") if f]
            rest = h.group(4)
            mtu = _IP_MTU.search(rest)
            st = _IP_STATE.search(rest)
            cur = {
                "name": h.group(2),
                "ifindex": int(h.group(1)),
                "mtu": int(mtu.group(1)) if mtu else None,
                "operstate": st.group(1) if st else None,
                "carrier": _carrier(flags),
                "mac": None,
                "ipv4": [],
            }
            continue
        if cur is None:
            continue
        mm = _IP_MAC.match(line)
        if mm and cur["mac"] is None:
            cur["mac"] = mm.group(1).lower()
            continue
        im = _IP_INET.match(line)
        if im:
            addr = im.group(2) + (f"/{im.group(4)}" if im.group(4) else "")
            cur["ipv4"].append(addr)
            if im.group(1) or im.group(3):
                _note(reasons, f"{cur['name']}.ipv4",
                      f"address was decorated ({im.group(1) or im.group(3)!r} around it, e.g. Markdown); "
                      f"read as {addr}")
    close()
    if not out:
        _note(reasons, "ip-addr", tool_error(text) or "no 'N: name: <FLAGS>' interface lines")
    return tuple(out)


@_safe(tuple)
def parse_ip_addr(text: str, reasons: Reasons = None) -> tuple[NetInterface, ...]:
    """``ip -j addr`` when the text holds JSON, else the text forms (for ``parse ip-addr``)."""
    t = str(text)
    if '"ifname"' in t:
        return parse_ip_addr_json(t, reasons=reasons)
    return parse_ip_addr_text(t, reasons=reasons)


# ---------------------------------------------------------------------------------------------
# docker


def state_from_status(status: str | None) -> str | None:
    """Old docker has no ``State``: ``Up 4 minutes (Paused)`` -> paused, ``Exited (0) …`` -> exited."""
    if not status:
        return None
    s = status.strip().lower()
    if s.startswith("up"):
        return "paused" if "(paused)" in s else "running"
    for prefix, state in (("exited", "exited"), ("restarting", "restarting"), ("created", "created"),
                          ("dead", "dead"), ("removal in progress", "removing"), ("paused", "paused")):
        if s.startswith(prefix):
            return state
    return None


_DOCKER_COLUMNS = {
    "CONTAINER ID": "id", "ID": "id", "NAMES": "name", "NAME": "name", "IMAGE": "image",
    "STATUS": "status", "STATE": "state", "PORTS": "ports", "CREATED": "running_for",
    "RUNNING FOR": "running_for", "LABELS": "labels",
}
_HEADER_COL = re.compile(r"\S+(?: \S+)*")


def _docker_str(item: Mapping[str, Any], key: str) -> str | None:
    v = item.get(key)
    if v is None or isinstance(v, dict | list):
        return None
    s = str(v).strip()
    return s or None


def _docker_table(lines: list[str]) -> list[Container]:
    head = None
    cols: list[tuple[int, str]] = []
    for i, line in enumerate(lines):
        cols = [(m.start(), m.group(0)) for m in _HEADER_COL.finditer(line)]
        if any(t in ("NAMES", "CONTAINER ID") for _, t in cols):
            head = i
            break
    if head is None:
        return []
    keys = [_DOCKER_COLUMNS.get(t) for _, t in cols]
    out = []
    for line in lines[head + 1 :]:
        if not line.strip() or _TOOL_ERROR.search(line):
            continue
        starts = [s for s, _ in cols]
        # Column offsets from the header when every column starts after a space (docker's
        # tabwriter output); else the document lost the alignment: split on 2+ spaces.
        aligned = all(s == 0 or s > len(line) or line[s - 1] == " " for s in starts)
        if aligned:
            bounds = [*starts[1:], None]
            values = [line[s:e].strip() if s < len(line) else "" for s, e in zip(starts, bounds, strict=True)]
        else:
            values = re.split(r"\s{2,}", line.strip())
        fields: dict[str, str | None] = {}
        for k, v in zip(keys, values, strict=False):
            if k:
                fields[k] = v or None
        if not any(fields.values()):
            continue
        status = fields.get("status")
        out.append(Container(
            id=fields.get("id"), name=fields.get("name"), image=fields.get("image"),
            state=(fields.get("state") or "").lower() or state_from_status(status), status=status,
            ports=fields.get("ports"), running_for=fields.get("running_for"), labels=fields.get("labels"),
        ))
    return out


@_safe(tuple)
def parse_docker_ps(text: str, reasons: Reasons = None) -> tuple[Container, ...]:
    """``docker ps -a --format '{{json .}}'`` (one object a line); a ``table`` format as fallback.

    Docker before 20.10 has no ``State`` key: it is derived from ``Status`` (``Up…`` running,
    ``Exited…`` exited, ``Restarting…`` restarting).
    """
    lines = str(text).splitlines()
    out: list[Container] = []
    for line in lines:
        s = line.strip()
        if not s.startswith("{"):
            continue
        try:
            item = json.loads(s)
        except (ValueError, RecursionError):
            continue
        if not isinstance(item, dict):
            continue
        status = _docker_str(item, "Status")
        state = _docker_str(item, "State")
        names = _docker_str(item, "Names")
        out.append(Container(
            id=_docker_str(item, "ID"),
            name=names.split(",")[0] if names else None,
            image=_docker_str(item, "Image"),
            state=state.lower() if state else state_from_status(status),
            status=status,
            ports=_docker_str(item, "Ports"),
            running_for=_docker_str(item, "RunningFor"),
            labels=_docker_str(item, "Labels"),
        ))
    if not out:
        out = _docker_table(lines)
    if not out:
        err = tool_error(text)
        if err:
            _note(reasons, "docker", err)
    return tuple(out)


_MEM_USAGE = re.compile(r"^\s*(\S+)\s*/\s*(\S+)\s*$")


@_safe(dict)
def parse_docker_stats(
    text: str, reasons: Reasons = None
) -> dict[str, tuple[float | None, int | None, int | None]]:
    """``docker stats --no-stream --format '{{json .}}'`` -> name: (cpu %, mem used, mem limit).

    ``MemUsage`` is ``1.5GiB / 119.7GiB`` (binary units; decimal ``kB/MB`` read too); a stopped
    container shows ``--``, which is ``None``.
    """
    out: dict[str, tuple[float | None, int | None, int | None]] = {}
    for line in str(text).splitlines():
        s = line.strip()
        if not s.startswith("{"):
            continue
        try:
            item = json.loads(s)
        except (ValueError, RecursionError):
            continue
        if not isinstance(item, dict):
            continue
        name = _docker_str(item, "Name") or _docker_str(item, "Container") or _docker_str(item, "ID")
        if not name:
            continue
        cpu = _docker_str(item, "CPUPerc")
        cpu_pct = _float(cpu) if cpu and cpu.endswith("%") else None
        used = limit = None
        mu = _MEM_USAGE.match(_docker_str(item, "MemUsage") or "")
        if mu:
            used, limit = size_bytes(mu.group(1)), size_bytes(mu.group(2))
        out[name] = (cpu_pct, used, limit)
    if not out:
        err = tool_error(text)
        if err:
            _note(reasons, "docker-stats", err)
    return out


_CGROUP_LINE = re.compile(r"^container ([0-9a-f]{12}) cpu_x100=(-|[0-9]+) used=(-?[0-9]+) max=(max|[0-9]+)$")


def parse_cgroups(
    text: str, reasons: Reasons = None
) -> dict[str, tuple[float | None, int | None, int | None]]:
    """The probe's ``cgroups`` section -> container id (12 characters): (cpu %, mem used, mem limit),
    the figures ``docker stats`` gives, read from the cgroup files it reads. CPU is ``None`` on a
    container's first reading (a rate needs two); a limit of ``max`` is ``None`` (the host's)."""
    out: dict[str, tuple[float | None, int | None, int | None]] = {}
    for line in str(text).splitlines():
        m = _CGROUP_LINE.match(line.strip())
        if not m:
            continue
        cpu = None if m.group(2) == "-" else int(m.group(2)) / 100
        used = max(0, int(m.group(3)))
        out[m.group(1)] = (cpu, used, None if m.group(4) == "max" else int(m.group(4)))
    if not out:
        _note(reasons, "cgroups", tool_error(text) or str(text).strip()[:200] or "no container cgroups")
    return out


# ---------------------------------------------------------------------------------------------
# ray status

_RAY_SECTION = re.compile(r"^(Active|Idle|Healthy|Pending|Recent failures|Usage|Total Usage|Demands|"
                          r"Pending Demands|From request_resources|Node status|Resources|Total Constraints|"
                          r"Total Demands|Node):?\s*$")
_RAY_COUNT = re.compile(r"^\s*(\d+)\s+\S+")
_RAY_LAUNCHING = re.compile(r",\s*(\d+)\s+launching\b")
_RAY_RES = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)\s+(CPU|GPU)\b")


_RAY_NONE_RUNNING = re.compile(r"Could not find any running Ray instance", re.IGNORECASE)
_RAY_NOT_INSTALLED = re.compile(r"^(?:timeout: failed to run command [‘'`]?ray[’'`]?: No such file or directory"
                                r"|(?:[\w./-]*sh: (?:line )?\d+: )?ray: (?:command )?not found)\s*$",
                                re.IGNORECASE | re.MULTILINE)


def ray_absent(text: str, rc: int | None) -> str | None:
    """Why there is no Ray on this node, when that is all ``ray status`` said: the ``ray`` command
    is not installed (exit 127, ``ray: not found``) or no Ray instance runs here (Ray's
    ``ConnectionError: Could not find any running Ray instance ... RAY_ADDRESS``). That is the
    normal state of a node outside a Ray cluster, not a failure to read it; None otherwise."""
    if not isinstance(text, str) or rc == 0:
        return None
    if _RAY_NONE_RUNNING.search(text):
        return "no Ray instance running"
    if rc == 127 or _RAY_NOT_INSTALLED.search(text):
        return "ray is not installed"
    return None


@_safe(RayStatus)
def parse_ray_status(text: str, reasons: Reasons = None) -> RayStatus:
    """``ray status`` (Ray 2.x autoscaler summary).

    ``Active:`` (and ``Idle:`` in newer Ray, ``Healthy:`` in older) list ``<count> <node>`` lines;
    ``Pending:`` lists one line per pending node or ``<type>, N launching``. The first ``Usage:``
    block is the cluster total (``ray status -v`` adds per-node blocks after it). Ray leaves out
    a resource the cluster does not have, so a Usage block without a GPU line means 0 GPUs.
    """
    section = None
    active = pending = None
    res: dict[str, tuple[float, float]] = {}
    usage_seen = usage_done = False
    for raw in str(text).splitlines():
        line = raw.rstrip()
        stripped = line.strip()
        sm = _RAY_SECTION.match(stripped)
        if sm and not line.startswith(" "):
            name = sm.group(1)
            if section in ("Usage", "Total Usage") and name not in ("Usage", "Total Usage"):
                usage_done = usage_done or usage_seen
            section = name
            if name in ("Active", "Idle", "Healthy") and active is None:
                active = 0
            if name == "Pending" and pending is None:
                pending = 0
            if name in ("Usage", "Total Usage") and not usage_done:
                usage_seen = True
            continue
        if not stripped or stripped.startswith("("):
            continue
        if section in ("Active", "Idle", "Healthy"):
            cm = _RAY_COUNT.match(line)
            if cm and active is not None:
                active += int(cm.group(1))
        elif section == "Pending":
            lm = _RAY_LAUNCHING.search(stripped)
            if pending is not None:
                pending += int(lm.group(1)) if lm else 1
        elif section in ("Usage", "Total Usage") and not usage_done:
            rm = _RAY_RES.match(line)
            if rm and rm.group(3) not in res:
                res[rm.group(3)] = (float(rm.group(1)), float(rm.group(2)))
    if not usage_seen and active is None:
        _note(reasons, "ray", tool_error(text) or first_line(text) or "no 'ray status' output")

    def pick(kind: str, i: int) -> float | None:
        if kind in res:
            return res[kind][i]
        return 0.0 if usage_seen else None

    return RayStatus(
        active_nodes=active,
        pending_nodes=pending,
        cpus_total=pick("CPU", 1),
        cpus_used=pick("CPU", 0),
        gpus_total=pick("GPU", 1),
        gpus_used=pick("GPU", 0),
    )


# ---------------------------------------------------------------------------------------------
# df, uptime, host facts

_DF_ROW = re.compile(r"^(\S+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+%|-)\s+(/.*)$")


@_safe(DiskUsage)
def parse_df(text: str, reasons: Reasons = None) -> DiskUsage:
    """``df -B1 -P /``: the POSIX format keeps one filesystem on one line."""
    for line in str(text).splitlines():
        m = _DF_ROW.match(line.strip())
        if m:
            return DiskUsage(mount=m.group(6).strip(), total_bytes=int(m.group(2)),
                             used_bytes=int(m.group(3)), available_bytes=int(m.group(4)))
    _note(reasons, "disk", tool_error(text) or "no 'df -P' data line")
    return DiskUsage()


@dataclass(frozen=True)
class Uptime:
    """``cat /proc/uptime /proc/loadavg``."""

    uptime_s: float | None = None
    load1: float | None = None
    load5: float | None = None
    load15: float | None = None


_UPTIME = re.compile(r"^\s*(\d+(?:\.\d+)?)\s+(\d+(?:\.\d+)?)\s*$")
_LOADAVG = re.compile(r"^\s*(\d+(?:\.\d+)?)\s+(\d+(?:\.\d+)?)\s+(\d+(?:\.\d+)?)\s+\d+/\d+(?:\s+\d+)?\s*$")


@_safe(Uptime)
def parse_uptime(text: str, reasons: Reasons = None) -> Uptime:
    """First line ``<seconds up> <idle seconds>``, second ``<load1> <load5> <load15> r/t pid``."""
    up = None
    loads: tuple[float, float, float] | None = None
    for line in str(text).splitlines():
        lm = _LOADAVG.match(line)
        if lm and loads is None:
            loads = (float(lm.group(1)), float(lm.group(2)), float(lm.group(3)))
            continue
        um = _UPTIME.match(line)
        if um and up is None:
            up = float(um.group(1))
    if up is None and loads is None:
        _note(reasons, "uptime", tool_error(text) or "no /proc/uptime or /proc/loadavg lines")
    return Uptime(uptime_s=up, load1=loads[0] if loads else None, load5=loads[1] if loads else None,
                  load15=loads[2] if loads else None)


_HOSTNAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,252}$")


@_safe(lambda: None)
def parse_hostname(text: str, reasons: Reasons = None) -> str | None:
    """``hostname``: the one line that looks like a host name."""
    for line in str(text).splitlines():
        s = line.strip()
        if _HOSTNAME.match(s):
            return s
    _note(reasons, "host.hostname", tool_error(text) or "no host name")
    return None


@_safe(lambda: (None, None))
def parse_uname(text: str, reasons: Reasons = None) -> tuple[str | None, str | None]:
    """``uname -srm`` (``Linux 6.11.0-1016-nvidia aarch64``) -> (kernel release, machine)."""
    for line in str(text).splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] in ("Linux", "Darwin", "FreeBSD") and not _TOOL_ERROR.search(line):
            return parts[1], parts[2]
    _note(reasons, "host.kernel", tool_error(text) or "no 'uname -srm' line")
    return None, None


@_safe(lambda: None)
def parse_nproc(text: str, reasons: Reasons = None) -> int | None:
    """``nproc``: one integer."""
    for line in str(text).splitlines():
        s = line.strip()
        if re.fullmatch(r"[0-9]{1,6}", s):
            return int(s)
    _note(reasons, "host.cpu_count", tool_error(text) or "no number from nproc")
    return None


_VERSION = re.compile(r"^v?(\d+\.\d+(?:\.\d+)?[\w.+~-]*)$")


@_safe(lambda: None)
def parse_docker_version(text: str, reasons: Reasons = None) -> str | None:
    """``docker version --format '{{.Server.Version}}'``: ``29.2.1``."""
    for line in str(text).splitlines():
        m = _VERSION.match(line.strip())
        if m:
            return m.group(1)
    _note(reasons, "host.docker_version", tool_error(text) or first_line(text) or "no version printed")
    return None


MIB_BYTES = MIB  # re-exported for the assembler's MiB -> bytes
