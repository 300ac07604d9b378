"""The kernel's own record of a memory death: OOM-killer lines, NVRM Xid lines, driver allocation failures.

When an engine dies on a DGX Spark the console should say *why* in words, and the kernel is the
witness that saw it: the OOM killer names the process it killed and how much memory it held, the
NVIDIA driver names the Xid it raised and (usually) the process on the channel, and on GB10 the
driver's ``NV_ERR_NO_MEMORY`` is often the last thing written before a host wedges.

The formats parsed here are the ones machines print, tested against real captures
(``tests/fixtures/kernel``, each with its source): ``dmesg`` in its plain, ``--ctime`` and
``--time-format iso`` forms, ``journalctl -k`` and syslog lines (``host kernel: [uptime] …``), and the
raw kmsg text. Whatever prefix a line carries (a timestamp, ``kernel:``) is kept as ``stamp`` and
not interpreted: the console compares records by order, not by clock.

Pure functions, never raising: the text comes from the node (bounded before it gets here by
:func:`bounded`), and a line that does not match is skipped. Process names and Xid texts are kept
as the node wrote them (cut to :data:`NAME_MAX`/:data:`TEXT_MAX`); the screen shows them through
``display_text``, never as markup.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KIB = 1024
NAME_MAX = 64  # the kernel's comm is 16 bytes; the NVRM name is the comm too: far above either
TEXT_MAX = 300  # an Xid's words after the pid and name
KLOG_MAX_BYTES = 1024 * 1024
KLOG_MAX_LINES = 5000

# What the remote reader (``remote.kernel_log_read``) prints first: which source it could read.
SOURCE_MARK = "::sparkklog::"

# ``Out of memory: Killed process 1440763 (perl) total-vm:87033376kB, anon-rss:60356340kB, …``; also
# ``Memory cgroup out of memory: Killed process …`` and the bare ``Killed process …`` of older kernels.
# The name sits between the first ``(`` after the pid and the ``)`` before `` total-vm``: a name may
# itself hold parentheses (``((resolved))``).
_OOM_KILL = re.compile(
    r"(?:(?P<scope>Memory cgroup out of memory|Out of memory)(?: \([^)]*\))?: )?"
    r"Killed process (?P<pid>\d+) \((?P<name>.*)\) total-vm:(?P<vm>\d+)kB, anon-rss:(?P<anon>\d+)kB"
    r"(?:, file-rss:(?P<file>\d+)kB)?(?:, shmem-rss:(?P<shmem>\d+)kB)?"
)
# ``oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,
# task_memcg=/user.slice/…,task=perl,pid=1440763,uid=21417``
_OOM_CONSTRAINT = re.compile(r"oom-kill:constraint=(?P<constraint>[A-Z_]+),(?P<rest>.*)$")
_XID = re.compile(r"NVRM: Xid \(PCI:(?P<pci>[0-9A-Fa-f:.]+)\): (?P<code>\d+)(?:, (?P<rest>.*))?$")
_XID_PID = re.compile(r"^pid=(?:'?<unknown>'?|(?P<pid>\d+))(?:, |$)")
_XID_NAME = re.compile(r"^name=(?P<name>[^,]*)(?:, |$)")
_NO_MEMORY = re.compile(r"NVRM: .*\bNV_ERR_NO_MEMORY\b")
_STAMP_TAIL = re.compile(r"\s*(?:kernel:\s*)?(?:\[\s*[0-9.]+\]\s*)?$")

# What an Xid code means, in the words of NVIDIA's Xid catalog, for the codes a memory death or a
# wedged GPU raises (the others are shown by number).
XID_WORDS: dict[int, str] = {
    8: "GPU stopped processing (timeout)",
    13: "graphics engine exception",
    31: "GPU memory page fault (MMU fault)",
    32: "invalid or corrupted push buffer stream",
    43: "GPU stopped processing a channel",
    45: "preemptive cleanup after a previous error",
    48: "double-bit ECC error",
    61: "internal microcontroller breakpoint",
    62: "internal microcontroller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failed",
    69: "graphics engine class error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
    154: "GPU recovery action required",
}


@dataclass(frozen=True)
class OomKill:
    """One process the kernel's OOM killer killed."""

    pid: int
    process: str
    total_vm_bytes: int
    anon_rss_bytes: int  # the process's own memory: what the kill gave back
    file_rss_bytes: int | None
    shmem_rss_bytes: int | None
    scope: str  # "host" (the whole node ran out) or "cgroup" (a container's limit)
    stamp: str  # the line's prefix as printed (timestamp, host, ``kernel:``), not interpreted
    constraint: str | None = None  # CONSTRAINT_NONE / CONSTRAINT_MEMCG … from the ``oom-kill:`` line
    task_memcg: str | None = None  # the cgroup it ran in (a container's scope names the container)

    def words(self) -> str:
        where = "a container's memory limit" if self.scope == "cgroup" else "the node's memory"
        return (f"the kernel's OOM killer killed {self.process} (pid {self.pid}) holding "
                f"{_gib(self.anon_rss_bytes)} of its own memory: {where} ran out")


@dataclass(frozen=True)
class Xid:
    """One NVRM Xid line: the driver's error code, the GPU, and the process when it named one."""

    code: int
    pci: str
    pid: int | None
    process: str | None
    text: str
    stamp: str

    @property
    def meaning(self) -> str:
        return XID_WORDS.get(self.code, "see NVIDIA's Xid catalog")

    def words(self) -> str:
        who = f" in {self.process} (pid {self.pid})" if self.process and self.pid else (
            f" (pid {self.pid})" if self.pid else "")
        return f"the NVIDIA driver raised Xid {self.code} ({self.meaning}){who} on GPU {self.pci}"


@dataclass(frozen=True)
class KernelRecord:
    """What a read of the kernel's log found, and where it could read it from."""

    source: str  # "journalctl -k", "dmesg", or "" when neither was readable
    why_unreadable: str = ""  # in words, when source is ""
    oom_kills: tuple[OomKill, ...] = ()
    xids: tuple[Xid, ...] = ()
    no_memory: tuple[str, ...] = ()  # NVRM NV_ERR_NO_MEMORY lines (the GB10 wedge's last word)
    cut: bool = False  # the text was longer than the bound and only its end was read

    @property
    def readable(self) -> bool:
        return bool(self.source)


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def bounded(text: str, max_bytes: int = KLOG_MAX_BYTES, max_lines: int = KLOG_MAX_LINES) -> tuple[str, bool]:
    """The newest part of ``text`` within ``max_bytes`` and ``max_lines`` (a kernel log is read from
    its end: the newest death matters), and whether anything was cut."""
    cut = False
    raw = text.encode("utf-8", "surrogateescape")
    if len(raw) > max_bytes:
        raw = raw[-max_bytes:]
        text = raw.decode("utf-8", "replace")
        text = text.split("\n", 1)[1] if "\n" in text else ""  # the first line is a torn one
        cut = True
    lines = text.splitlines()
    if len(lines) > max_lines:
        lines = lines[-max_lines:]
        cut = True
    return "\n".join(lines), cut


def _stamp(prefix: str) -> str:
    return _STAMP_TAIL.sub("", prefix).strip()[:80]


def _kb(value: str | None) -> int | None:
    return None if value is None else int(value) * KIB


def parse_oom_kills(text: str) -> tuple[OomKill, ...]:
    """Every ``Killed process`` line, joined with the ``oom-kill:constraint=`` line of the same pid
    (printed just before it on kernels since 5.0) for the constraint and the cgroup."""
    constraints: dict[int, tuple[str, str | None]] = {}
    kills: list[OomKill] = []
    for line in str(text).splitlines():
        m = _OOM_CONSTRAINT.search(line)
        if m:
            fields = dict(f.split("=", 1) for f in m.group("rest").split(",") if "=" in f)
            pid = fields.get("pid", "")
            if pid.isdigit():
                constraints[int(pid)] = (m.group("constraint"), fields.get("task_memcg"))
            continue
        m = _OOM_KILL.search(line)
        if not m:
            continue
        pid = int(m.group("pid"))
        constraint, memcg = constraints.get(pid, (None, None))
        cgroup = m.group("scope") == "Memory cgroup out of memory" or constraint == "CONSTRAINT_MEMCG"
        kills.append(OomKill(
            pid=pid,
            process=m.group("name")[:NAME_MAX],
            total_vm_bytes=int(m.group("vm")) * KIB,
            anon_rss_bytes=int(m.group("anon")) * KIB,
            file_rss_bytes=_kb(m.group("file")),
            shmem_rss_bytes=_kb(m.group("shmem")),
            scope="cgroup" if cgroup else "host",
            stamp=_stamp(line[:m.start()]),
            constraint=constraint,
            task_memcg=memcg[:200] if memcg else None,
        ))
    return tuple(kills)


def parse_xids(text: str) -> tuple[Xid, ...]:
    """Every ``NVRM: Xid (PCI:…): CODE, …`` line. The pid and name come first when the driver knew
    them (``pid=1234, name=python3,``); ``pid='<unknown>'`` and a missing pid are None."""
    out: list[Xid] = []
    for line in str(text).splitlines():
        m = _XID.search(line)
        if not m:
            continue
        rest = m.group("rest") or ""
        pid: int | None = None
        name: str | None = None
        pm = _XID_PID.match(rest)
        if pm:
            pid = int(pm.group("pid")) if pm.group("pid") else None
            rest = rest[pm.end():]
            nm = _XID_NAME.match(rest)
            if nm:
                raw = nm.group("name").strip()
                name = None if raw in ("", "<unknown>") else raw[:NAME_MAX]
                rest = rest[nm.end():]
        out.append(Xid(code=int(m.group("code")), pci=m.group("pci")[:20], pid=pid, process=name,
                       text=rest.strip()[:TEXT_MAX], stamp=_stamp(line[:m.start()])))
    return tuple(out)


def parse_no_memory(text: str) -> tuple[str, ...]:
    """The driver's ``NV_ERR_NO_MEMORY`` allocation failures, from ``NVRM:`` on (cut to TEXT_MAX)."""
    out = []
    for line in str(text).splitlines():
        m = _NO_MEMORY.search(line)
        if m:
            out.append(line[m.start():][:TEXT_MAX])
    return tuple(out)


def parse_kernel_log(text: str, max_bytes: int = KLOG_MAX_BYTES, max_lines: int = KLOG_MAX_LINES) -> KernelRecord:
    """A kernel log read by ``remote.kernel_log_read``: its first line says the source
    (``::sparkklog:: source journalctl`` / ``dmesg`` / ``none WHY``), the rest is the log. Text with
    no source line is read as a log of unknown source ("kernel log")."""
    body, cut = bounded(str(text), max_bytes, max_lines)
    source = "kernel log"
    why = ""
    lines = body.split("\n")
    kept: list[str] = []
    for line in lines:
        if line.startswith(SOURCE_MARK):
            words = line[len(SOURCE_MARK):].split(None, 2)
            if words[:2] == ["source", "journalctl"]:
                source = "journalctl -k"
            elif words[:2] == ["source", "dmesg"]:
                source = "dmesg"
            elif words[:2] == ["source", "none"]:
                source, why = "", (words[2] if len(words) > 2 else "neither journalctl -k nor dmesg is readable")[:TEXT_MAX]
            continue
        kept.append(line)
    log = "\n".join(kept)
    return KernelRecord(source=source, why_unreadable=why, oom_kills=parse_oom_kills(log),
                        xids=parse_xids(log), no_memory=parse_no_memory(log), cut=cut)
