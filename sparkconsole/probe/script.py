"""The batched probe: one long-lived shell per node, one sample per request.

The console opens one exec channel per node running :func:`probe_script` and keeps it. Each tick
it writes one line naming the sections it wants (``"meminfo gpu gpu-apps links ip"``) and reads
until the ``end`` marker. Nothing is re-authenticated, and sections are asked for at their own
cadence (``docker stats``, ``df``, versions less often than memory and the GPU).

Watching must cost the node almost nothing (issue 25; measured on a real H200: the old probe spent
57 ms of CPU per tick, nearly all of it the two ``nvidia-smi`` processes it started every tick).
So the probe starts as few processes as it can:

* ``/proc`` and ``/sys`` files are read by the shell itself (``read``/``printf``: no ``cat``, no
  ``grep``), so memory, uptime, load and the RDMA ports cost no process at all;
* the GPU is read by **long-lived readers**: one ``nvidia-smi --query-gpu=… -lms N`` and one
  ``--query-compute-apps`` in loop mode, started beside the shell on the first tick that asks for
  them, each keeping its newest block (the rows printed within 100 ms of each other, stamped with
  ``/proc/uptime``) in a private directory (``$XDG_RUNTIME_DIR`` or ``/dev/shm``, removed when the
  probe ends). A tick prints the newest block when it is fresh and starts nothing. A reader that
  dies is restarted (the ``readers`` section counts it, the console says it once); one that never
  printed a line (no loop mode on this node, no directory to write) leaves that section to the
  one-shot command of before, and so does a tick that finds no fresh block;
* a tool the node does not have costs no process (``command -v`` is a builtin), and only a tool
  that can hang (``nvidia-smi``, ``docker``, ``ray``, ``df``) is wrapped in ``timeout``.

Framing, one marker per line, all starting with :data:`MARK`::

    ::sparkprobe:: begin <seq>
    ::sparkprobe:: section <name>
    ...the command's stdout and stderr...
    ::sparkprobe:: rc <name> <exit code>
    ::sparkprobe:: end <seq>

The simulated Spark (:mod:`sparkconsole.sim`) answers the same protocol: each section's shell text
(:func:`section_shell`, the same arm the script runs) goes through its shell, and the readers are
its own ``nvidia-smi`` in loop mode (:mod:`sparkconsole.sim.server`), so both are read by the same
parsers and start the same processes.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from sparkconsole import remote

MARK = "::sparkprobe::"
HEADER = "# sparkconsole probe v2"
PER_SECTION_TIMEOUT_S = 8
# What one section may send, cut on the node (``cap``: ``head -c``) before it crosses: a node's answer
# is data, and an endless ``docker ps`` must cost the console a bounded read, not its memory. Far above
# any real answer (a node with a thousand containers lists them in under 1 MiB); the lists that grow with
# containers and interfaces get more. A section cut there is not read: the console says so.
SECTION_MAX_BYTES = 1024 * 1024
LIST_MAX_BYTES = 4 * 1024 * 1024
# And what the console keeps of one tick's answer, whatever the node sends (a probe that is not ours,
# a line flood): past either bound the answer is read to its end and dropped, and the tick fails.
TICK_MAX_BYTES = 48 * 1024 * 1024
TICK_MAX_LINES = 250_000
READERS_SECTION = "readers"  # the readers' state: one line each (:func:`parse_readers`)


@dataclass(frozen=True)
class ProbeSection:
    """One section of the probe: a constant command and how often it is worth asking for.

    ``argv`` is the command, quoted when the script is built; ``globs`` lists argument indexes that
    are shell glob patterns (constants of this module) and are left unquoted so the node's shell
    expands them. ``every`` is the cadence in ticks (1 = every tick). ``how`` says how the probe
    runs it: ``func`` (a function of :data:`PRELUDE`, shell builtins only), ``read`` (``cat``/``grep -H .`` of ``/proc`` and ``/sys`` files, done by the shell's
    own ``read``: no process), ``guard`` (a tool that can hang, under ``timeout``) or ``plain`` (a
    tool that cannot: ``ip``, ``uname``); ``reader`` names the long-lived reader that answers it
    when it has a fresh block. A ``guard`` or ``plain`` command's output is cut at ``max_bytes`` on
    the node (``cap``), its exit code kept; a cut section says so (``MARK cut N``) and is not read.
    """

    name: str
    argv: tuple[str, ...]
    every: int = 1
    globs: tuple[int, ...] = ()
    optional: bool = False  # a missing tool is normal here (no ray on a plain node)
    how: str = "guard"
    reader: str = ""
    max_bytes: int = SECTION_MAX_BYTES  # what a ``guard``/``plain`` command may print (``cap``)

    def shell(self) -> str:
        """The plain command (what the deployment's recon runs once, and what a reader-backed
        section falls back to)."""
        parts = []
        for i, arg in enumerate(self.argv):
            parts.append(arg if i in self.globs else shlex.quote(arg))
        return " ".join(parts)

    def arm(self) -> str:
        """What the probe script runs for this section (helpers from :data:`PRELUDE`)."""
        if self.how == "func":
            return self.argv[0]
        if self.how == "read":
            files = self.shell().split(" ", 1)[1]
            return ("hdot " if self.argv[:2] == ("grep", "-H") else "rd ") + files.removeprefix("-H . ")
        run = f"cap {self.max_bytes} " + ("$T " if self.how == "guard" else "") + self.shell()
        if self.reader:
            return f"show {self.reader} || {run}"
        return run


@dataclass(frozen=True)
class Reader:
    """A long-lived reader on the node: ``argv`` (in loop mode, interval appended) prints a header
    line once and then a block of rows per interval."""

    name: str
    argv: tuple[str, ...]
    quiet_when_empty: bool = False  # prints nothing in an interval with no rows (compute-apps)

    def shell(self, interval_ms: int) -> str:
        return " ".join(shlex.quote(a) for a in (*self.argv, "-lms", str(interval_ms)))


GPU_QUERY_FIELDS = (
    "index,name,uuid,pci.bus_id,driver_version,utilization.gpu,memory.total,memory.used,"
    "temperature.gpu,power.draw,power.limit,clocks.sm,clocks.max.sm,pstate"
)
GPU_APPS_QUERY = "--query-compute-apps=pid,process_name,used_gpu_memory"
# The reader asks only what moves. Measured on a real H200 (driver 580.159.04), one sample a second:
# all of GPU_QUERY_FIELDS cost 3.3 ms of CPU per sample, these seven 0.33 ms (name, uuid, bus id,
# driver, memory.total, power.limit and clocks.max.sm are the dear ones); the rest comes from
# ``gpu-static`` (and the first tick's one-shot ``gpu``), merged by index (probe.assemble)
GPU_MOVING_FIELDS = "index,utilization.gpu,memory.used,temperature.gpu,power.draw,clocks.sm,pstate"
GPU_STATIC_FIELDS = "index,name,uuid,pci.bus_id,driver_version,memory.total,power.limit,clocks.max.sm"

READERS: tuple[Reader, ...] = (
    Reader("gpu", ("nvidia-smi", f"--query-gpu={GPU_MOVING_FIELDS}", "--format=csv")),
    # rows of one interval come together; an interval with no GPU process prints nothing (seen on a
    # real H200, driver 580.159.04), so an old block of an alive reader means "no process now"
    Reader("apps", ("nvidia-smi", GPU_APPS_QUERY, "--format=csv"), quiet_when_empty=True),
)
READER_BY_NAME = {r.name: r for r in READERS}

SECTIONS: tuple[ProbeSection, ...] = (
    ProbeSection("hostname", ("cat", "/proc/sys/kernel/hostname"), every=30, how="read"),
    ProbeSection("uname", ("uname", "-srm"), every=30, how="plain"),
    ProbeSection("nproc", ("nproc",), every=30, how="plain"),
    ProbeSection("uptime", ("cat", "/proc/uptime", "/proc/loadavg"), how="read"),
    ProbeSection("meminfo", ("cat", "/proc/meminfo"), how="read"),
    # the kernel's memory pressure (PSI): read by the shell like meminfo, no process; the memory
    # guard's stall signal (probe.memory_guard). Optional: a kernel without PSI has no such file
    ProbeSection("psi", ("cat", "/proc/pressure/memory"), how="read", optional=True),
    ProbeSection("gpu", ("nvidia-smi", f"--query-gpu={GPU_QUERY_FIELDS}", "--format=csv"), reader="gpu"),
    ProbeSection("gpu-apps", ("nvidia-smi", GPU_APPS_QUERY, "--format=csv"), reader="apps"),
    ProbeSection("gpu-static", ("nvidia-smi", f"--query-gpu={GPU_STATIC_FIELDS}", "--format=csv"), every=300),
    # the table: CUDA version, the GB10 "Not Supported" lines; 100 ms of CPU each on an H200, so rarely
    ProbeSection("nvidia-smi", ("nvidia-smi",), every=300),
    # ibdev2netdev is a script that starts a dozen processes; the port state and rate come from
    # ib-ports (files) every 5 ticks, the device-to-interface map it prints does not change
    ProbeSection("ibdev2netdev", ("ibdev2netdev",), every=60, optional=True, how="plain"),
    ProbeSection(
        "ib-ports",
        ("grep", "-H", ".", "/sys/class/infiniband/*/ports/*/state", "/sys/class/infiniband/*/ports/*/rate"),
        every=5,
        globs=(3, 4),
        optional=True,
        how="read",
    ),
    ProbeSection("ip-addr", ("ip", "-j", "addr"), every=10, how="plain", max_bytes=LIST_MAX_BYTES),
    ProbeSection("docker-ps", ("docker", "ps", "-a", "--format", "{{json .}}"), every=2, max_bytes=LIST_MAX_BYTES),
    ProbeSection("docker-stats", ("docker", "stats", "--no-stream", "--format", "{{json .}}"), every=5, max_bytes=LIST_MAX_BYTES),
    # what docker stats reads, read by the shell: each running container's cgroup (v2) files; the
    # poller asks docker-stats only where this finds none, and docker-ps when the set of running
    # containers it lists changed (and every DOCKER_PS_SLOW ticks), not every other tick
    ProbeSection("cgroups", ("cg",), every=2, how="func"),
    ProbeSection("docker-version", ("docker", "version", "--format", "{{.Server.Version}}"), every=30),
    ProbeSection("ray-status", ("ray", "status"), every=10, optional=True),
    ProbeSection("df", ("df", "-B1", "-P", "/"), every=30),
)
# The serving poll's (issue 24), asked by the poller on its own cadence, not part of the node's
# sample: which vLLM/SGLang servers run here (whenever the running containers change, and every
# ``every`` ticks for an engine started on the host: the listing starts a docker process per
# container, so not every 30 ticks as it was); their pages are read together by one ``metrics-P1,P2`` section (:data:`METRICS_PREFIX`)
ENGINES = ProbeSection("engines", ("sh", "-c", remote.engine_cmdlines().text), every=120, optional=True,
                       max_bytes=LIST_MAX_BYTES)
SERVING_SECTIONS = frozenset({ENGINES.name})
METRICS_PREFIX = "metrics-"

SECTION_BY_NAME: dict[str, ProbeSection] = {s.name: s for s in (*SECTIONS, ENGINES)}

DEFAULT_INTERVAL_MS = 2000
READER_MIN_MS, READER_MAX_MS = 200, 60_000
STRAY_CS = 10  # rows printed within 100 ms of each other are one block
MAX_RESTARTS = 5  # a reader that died this often is given up for the session (one-shot from then on)

# Shell helpers the sections' arms use (POSIX sh; dash reads files one byte per read(2), which for
# /proc/meminfo is still cheaper than starting cat). ``x``: a missing tool is "not found" without a
# process. ``rd``: cat. ``hdot``: grep -H . (GNU grep's words and exit codes). ``now``: /proc/uptime
# in centiseconds into $up. ``cg``: per running container (the first 12 characters of its id, as
# ``docker ps`` shows them), CPU since the last call in hundredths of a percent of one core (docker
# stats' CPUPerc), the memory in use less the inactive page cache (docker stats' used figure:
# memory.current less inactive_file on cgroup v2, memory.usage_in_bytes less total_inactive_file on
# v1), the limit (``max``: none; v1's "no limit" is a 19-digit number). ``cap N CMD``: ``x`` with the
# output bounded: a missing tool is "not found" without a process; else CMD's stdout and stderr cut at N
# bytes (``head -c``) and held in the shell (so its exit code is kept: no ``pipefail`` in POSIX sh),
# printed with a ``MARK cut N`` line and exit 141 (SIGPIPE's) when it was cut. The main loop's own names
# (``s``, ``want``, ``seq``) are used by no helper.
PRELUDE = r"""T=''
command -v timeout >/dev/null 2>&1 && T='timeout -k 1 {timeout}'
x() { if [ "$1" = timeout ]; then w=$5; else w=$1; fi
  command -v "$w" >/dev/null 2>&1 || { echo "sh: 1: $w: not found"; return 127; }; "$@"; }
rd() { for f; do while IFS= read -r l || [ -n "$l" ]; do printf '%s\n' "$l"; done <"$f"; done; }
hdot() { r=1; for f; do if [ -r "$f" ]; then
  while IFS= read -r l || [ -n "$l" ]; do [ -n "$l" ] && { printf '%s:%s\n' "$f" "$l"; [ $r = 2 ] || r=0; }; done <"$f"
  else echo "grep: $f: No such file or directory"; r=2; fi; done; return $r; }
now() { read -r up _ </proc/uptime; up=${up%.*}${up#*.}; up=${up#"${up%%[!0]*}"}; up=${up:-0}; }
show() { return 1; }
cap() { cn=$1; shift; if [ "$1" = timeout ]; then w=$5; else w=$1; fi
  command -v "$w" >/dev/null 2>&1 || { echo "sh: 1: $w: not found"; return 127; }; co=$( { "$@" 2>&1; printf '\n::rc %s' "$?"; } | head -c "$cn" ); cr=${co##*"
"}; case $co in *"
"*) co=${co%"
"*}; co=${co%"
"} ;; *) co='' ;; esac
  case $cr in "::rc "[0-9]*) [ -n "$co" ] && printf '%s\n' "$co"; return "${cr#::rc }" ;; esac
  [ -n "$co" ] && printf '%s\n' "$co"; echo "{mark} cut $cn"; return 141; }
cgv() { id=${1##*/}; id=${id#docker-}; id=${id%.scope}; c=${id%"${id#????????????}"}
  eval "pu=\${cu_$c:-} pt=\${ct_$c:-}"; cpu=-
  [ -n "$pu" ] && [ $((up - pt)) -gt 0 ] && cpu=$(( ($2 - pu) / (up - pt) ))
  eval "cu_$c=\$2 ct_$c=\$up"
  printf 'container %s cpu_x100=%s used=%s max=%s\n' "$c" "$cpu" "$(($3 - $4))" "$5"; }
cg() { r=1; now
  for d in /sys/fs/cgroup/system.slice/docker-*.scope /sys/fs/cgroup/docker/*; do
    [ -r "$d/memory.current" ] || continue; r=0
    read -r mc <"$d/memory.current"; mx=max; [ -r "$d/memory.max" ] && read -r mx <"$d/memory.max"
    ia=0; while read -r k v; do [ "$k" = inactive_file ] && { ia=$v; break; }; done <"$d/memory.stat"
    us=0; while read -r k v; do [ "$k" = usage_usec ] && { us=$v; break; }; done <"$d/cpu.stat"
    cgv "$d" "$us" "$mc" "$ia" "$mx"
  done
  for d in /sys/fs/cgroup/memory/system.slice/docker-*.scope /sys/fs/cgroup/memory/docker/*; do
    [ -r "$d/memory.usage_in_bytes" ] && [ -r "${d%/memory/*}/cpuacct/${d#*/memory/}/cpuacct.usage" ] || continue
    r=0; read -r mc <"$d/memory.usage_in_bytes"; read -r mx <"$d/memory.limit_in_bytes"
    [ ${#mx} -ge 19 ] && mx=max
    ia=0; while read -r k v; do [ "$k" = total_inactive_file ] && { ia=$v; break; }; done <"$d/memory.stat"
    read -r ns <"${d%/memory/*}/cpuacct/${d#*/memory/}/cpuacct.usage"
    cgv "$d" "$((ns / 1000))" "$mc" "$ia" "$mx"
  done
  [ $r = 0 ] || [ -r /sys/fs/cgroup/cgroup.controllers ] || [ -d /sys/fs/cgroup/memory/docker ] && return 0
  echo "no container cgroups here (Docker's systemd or cgroupfs driver, cgroup v1 or v2)"; return 1; }
""".replace("{timeout}", str(PER_SECTION_TIMEOUT_S)).replace("{mark}", MARK)

# The readers (only in the probe script: a twin answers ``show`` itself). ``start``: the reader's
# command, started by this shell itself so its pid is known at once (``stop`` ends it even while it
# prints nothing, even right after a restart, and the probe's exit waits for it: its CPU is the
# probe's), writing into a fifo (one ``mkfifo`` per start) read by a loop that stamps each line and
# rewrites the block file whole (``@ STAMP``, rows, ``.``: a torn read has no ``.`` and is not used).
# Their stdin is /dev/null (async lists in a non-interactive shell) and neither writes to the
# probe's stdout, so the connection never waits on them.
# ``alive``: not gone and not a zombie. ``keep``: start, restart (counted), or give up. ``show``:
# the header and the newest block when it is younger than two intervals (a read that met the reader
# mid-write has no ``.``: the last whole block read stands in); for a reader quiet when empty, the
# header alone once it has been running that long with nothing newer. A reader that prints nothing
# for ten intervals (a wedged nvidia-smi) is ended, so the next tick restarts it (counted); until
# then the one-shot command answers.
# ``mkd``: the private directory, made when the first reader starts (a probe that never starts one,
# on a node without nvidia-smi, makes none). A probe killed outright (SIGKILL: no exit trap) must not
# leave readers or the directory behind: each loop checks at every line that the probe (``$$``, the
# parent's pid in a subshell) is still there, and if not, ``gone`` ends every reader through the pid
# files and removes the directory. The GPU reader prints every interval, so its loop is the watchdog
# for a reader that may print nothing for hours (compute-apps on a node with no GPU process).
READER_FUNCS = r"""D='' DT=''
mkd() { [ -n "$D" ] && return 0; [ -z "$DT" ] || return 1; DT=1
  for b in "${XDG_RUNTIME_DIR:-}" /dev/shm /tmp; do
    [ -n "$b" ] && [ -d "$b" ] && [ -w "$b" ] && D=$(mktemp -d "$b/sparkprobe.XXXXXX" 2>/dev/null) && return 0
  done; return 1; }
gone() { for f in "$D"/*.pid; do [ -r "$f" ] && read -r k <"$f" && kill "$k" 2>/dev/null; done; rm -rf "$D"; }
trap 'stop; wait; [ -n "$D" ] && rm -rf "$D"' EXIT
trap 'exit 129' HUP
trap 'exit 143' TERM
stop() { for n in {names}; do eval "k=\${k_$n:-} p=\${p_$n:-}"; [ -n "$k" ] && kill "$k" 2>/dev/null
  [ -n "$p" ] && kill "$p" 2>/dev/null; done; }
start() { n=$1; eval "r=\${r_$n:-0}"; q="$D/$n.$r"
  now; eval "t0_$n=\$up"
  mkfifo -m 600 "$q" || { eval "m_$n=oneshot"; return 1; }
  "run_$n" >"$q" 2>"$D/$n.err" &
  eval "k_$n=\$!"; echo "$!" >"$D/$n.pid"
  { h=''; b=''; t=0
      while IFS= read -r l; do [ -d "/proc/$$" ] || { gone; exit 0; }; [ -d "$D" ] || exit 0; now
        if [ -z "$h" ]; then h=1; printf '%s\n' "$l" >"$D/$n.h"; continue; fi
        if [ $((up - t)) -gt {stray} ] || [ -z "$b" ]; then b=$l; t=$up; else b="$b
$l"; fi
        printf '@ %s\n%s\n.\n' "$t" "$b" >"$D/$n"
      done; } <"$q" >/dev/null 2>&1 &
  eval "p_$n=\$!"; }
alive() { [ -r "/proc/$1/stat" ] && read -r _ _ z _ <"/proc/$1/stat" && [ "$z" != Z ]; }
keep() { n=$1; eval "p=\${p_$n:-} m=\${m_$n:-} r=\${r_$n:-0}"
  [ "$m" != oneshot ] || return 1
  if [ -z "$p" ]; then command -v nvidia-smi >/dev/null 2>&1 && mkd || { eval "m_$n=oneshot"; return 1; }
  else eval "k=\${k_$n:-}"; alive "$p" && alive "$k" && return 0
    kill "$k" "$p" 2>/dev/null
    if [ ! -s "$D/$n.h" ] || [ $r -ge {max_restarts} ]; then eval "m_$n=oneshot"; return 1; fi
    eval "r_$n=$((r + 1))"; fi
  start "$n"; }
show() { n=$1; keep "$n" || return 1
  f="$D/$n"; h=''; [ -s "$f.h" ] && IFS= read -r h <"$f.h"; [ -n "$h" ] || return 1
  t=''; ok=''; b=''; now
  if [ -r "$f" ]; then while IFS= read -r l; do case $l in
    '@ '*) t=${l#@ } ;; .) ok=1 ;; *) b="$b$l
" ;; esac; done <"$f"; fi
  if [ -n "$ok" ]; then eval "g_$n=\$b gt_$n=\$t"; else eval "b=\${g_$n:-} t=\${gt_$n:-}"; fi
  if [ -n "$t" ] && [ $((up - t)) -le $((2 * {iv})) ]; then printf '%s\n%s' "$h" "$b"; return 0; fi
  eval "q=\${q_$n:-} t0=\${t0_$n:-0} k=\${k_$n:-}"
  [ -z "$q" ] && [ -n "$k" ] && [ $((up - ${t:-$t0})) -gt $((10 * {iv})) ] && kill "$k" 2>/dev/null
  [ -n "$q" ] && [ $((up - t0)) -gt $((2 * {iv})) ] && { printf '%s\n' "$h"; return 0; }
  return 1; }
state() { for n in {names}; do eval "p=\${p_$n:-} m=\${m_$n:-} r=\${r_$n:-0} t0=\${t0_$n:-}"
  t=''; if [ -n "$D" ] && [ -r "$D/$n" ]; then IFS= read -r t <"$D/$n"; t=${t#@ }; fi
  now; a=''; [ -n "$t" ] && a=$(( (up - t) * 10 ))
  if [ "$m" = oneshot ]; then k=oneshot; elif [ -z "$p" ]; then k=idle; elif alive "$p"; then k=running
  else k=dead; fi
  e=''; [ -n "$D" ] && [ -s "$D/$n.err" ] && IFS= read -r e <"$D/$n.err"
  printf '%s state=%s restarts=%s age_ms=%s pid=%s why=%s\n' "$n" "$k" "$r" "$a" "$p" "$e"; done; }
"""


def metrics_section(*ports: int) -> str:
    """The section name that reads the engine pages on ``ports`` with one curl (``metrics-8000`` or
    ``metrics-8000,8001``); :func:`split_pages` splits its answer by port."""
    if not ports:
        raise ValueError("at least one port")
    return METRICS_PREFIX + ",".join(str(remote.validate_port(p)) for p in ports)


def _metrics_arm() -> str:
    """The ``metrics-PORTS`` arm, ``$p`` the ports: :data:`remote.METRICS_PAGE_SCRIPT` run by the
    probe's own shell (curl and grep, no ``sh -c`` and no ``timeout``: curl's ``-m 2`` bounds each
    page)."""
    return remote.METRICS_PAGE_SCRIPT.replace("q=$1", "q=$p").replace('"$2"', shlex.quote(remote.metrics_pattern()))


def split_pages(out: SectionOutput) -> dict[int, SectionOutput]:
    """A ``metrics-PORTS`` section, one answer per port: each page's lines up to its mark
    (``::sparkpage:: URL STATUS``), exit code 0 when it kept a line (grep's, as a page read alone
    had). An answer with no mark at all and no sample line (no curl on the node, a refused port list)
    is every port's.

    The read is cut on the node (``head -c``, :data:`remote.METRICS_PAGE_SCRIPT`): lines after the
    last mark are the page curl was reading then, the next port without a mark, with no exit code
    (its text as long as the bound, which the console refuses as too large); a port after it was not
    read at all this time, and says so (empty, no exit code)."""
    ports = [int(x) for x in out.name[len(METRICS_PREFIX):].split(",") if x.isdigit()]
    pages: dict[int, SectionOutput] = {}
    buf: list[str] = []
    mark = remote.PAGE_MARK + " "
    for line in out.text.splitlines():
        if line.startswith(mark):
            m = re.match(r"\S+ https?://[^:/]+:([0-9]+)/", line)
            if m:
                port = int(m.group(1))
                text = "\n".join(buf)
                pages[port] = SectionOutput(metrics_section(port), text, 0 if buf else 1)
            buf = []
            continue
        buf.append(line)
    if not pages and not any(line and not line.startswith(("curl: ", "sh: ")) for line in buf):
        return {port: SectionOutput(metrics_section(port), out.text, out.rc) for port in ports}
    missing = [p for p in ports if p not in pages]
    if buf and missing:
        pages[missing[0]] = SectionOutput(metrics_section(missing[0]), "\n".join(buf), None)
    for port in missing[1:] if buf else missing:
        if out.rc is not None or buf:
            pages[port] = SectionOutput(metrics_section(port), "", None)
    return pages


def section_arm(name: str) -> str | None:
    """The arm the probe script runs for section ``name`` (``metrics-PORTS`` included), or None for
    an unknown name; it calls the helpers of :data:`PRELUDE`, which a shell that answers many
    sections (the twin's probe) defines once."""
    sec = SECTION_BY_NAME.get(name)
    if sec is not None:
        return sec.arm()
    m = re.fullmatch(METRICS_PREFIX + r"([0-9]{1,5}(?:,[0-9]{1,5})*)", name)
    if m and all(0 < int(x) < 65536 for x in m.group(1).split(",")):
        return f"p={m.group(1)}; " + _metrics_arm()
    return None


def section_shell(name: str) -> str | None:
    """The whole shell text of section ``name`` (:func:`section_arm` with the helpers it uses), or
    None for an unknown name: what one shell runs to answer it alone."""
    arm = section_arm(name)
    return None if arm is None else PRELUDE + arm


def sections_for_tick(tick: int) -> tuple[str, ...]:
    """Names of the sections worth asking for on tick number ``tick`` (0 = first: all)."""
    return tuple(s.name for s in SECTIONS if tick % s.every == 0)


def reader_interval_ms(interval_s: float) -> int:
    """The readers' sampling interval for a console that polls every ``interval_s``: one sample
    per tick, so the newest is never older than one interval."""
    return max(READER_MIN_MS, min(READER_MAX_MS, round(interval_s * 1000)))


def probe_script(sections: tuple[ProbeSection, ...] = (*SECTIONS, ENGINES), *,
                 interval_ms: int = DEFAULT_INTERVAL_MS, readers: bool = True) -> str:
    """The shell program the node runs for the whole session (POSIX sh).

    ``interval_ms``: the readers' sampling interval (:func:`reader_interval_ms`). ``readers=False``
    is the probe of before the readers (every GPU section a one-shot ``nvidia-smi``): what
    ``benchmarks/node_cost.py`` compares against.
    """
    iv_cs = max(1, interval_ms // 10)
    cases = [f"    {s.name}) {s.arm()} 2>&1 ;;" for s in sections]
    # ``metrics-PORT``: the port comes from the request line, so it is checked to be digits here
    # before it reaches the command (the console only ever asks for ports it validated)
    cases.append(f"    {METRICS_PREFIX}*) p=${{s#{METRICS_PREFIX}}}; case \"$p\" in ''|*[!0-9,]*|,*|*,|*,,*) "
                 f"echo \"not a port: $p\"; false ;; *) {_metrics_arm()} 2>&1 ;; esac ;;")
    if readers:
        cases.append(f"    {READERS_SECTION}) state ;;")
        funcs = READER_FUNCS.replace("{stray}", str(STRAY_CS)).replace("{iv}", str(iv_cs)).replace(
            "{max_restarts}", str(MAX_RESTARTS)).replace("{names}", " ".join(r.name for r in READERS))
        funcs += "".join(f"run_{r.name}() {{ exec {r.shell(interval_ms)}; }}\n" for r in READERS)
        funcs += "".join(f"q_{r.name}=1\n" for r in READERS if r.quiet_when_empty)
    else:
        funcs = ""
    body = "\n".join(cases)
    return f"""{HEADER}
export LC_ALL=C
{PRELUDE}{funcs}seq=0
while IFS= read -r want; do
  seq=$((seq+1))
  printf '%s begin %s\\n' '{MARK}' "$seq"
  for s in $want; do
    printf '%s section %s\\n' '{MARK}' "$s"
    case "$s" in
{body}
    *) echo "unknown section: $s"; false ;;
    esac
    printf '%s rc %s %s\\n' '{MARK}' "$s" "$?"
  done
  printf '%s end %s\\n' '{MARK}' "$seq"
done
"""


def probe_command(interval_s: float = DEFAULT_INTERVAL_MS / 1000) -> str:
    """The exec-channel command line that starts the probe on a node."""
    return "exec sh -c " + shlex.quote(probe_script(interval_ms=reader_interval_ms(interval_s)))


@dataclass(frozen=True)
class ReaderState:
    """One reader as the ``readers`` section tells it."""

    name: str
    state: str  # idle (not asked yet), running, dead (restarted at the next ask), oneshot (given up)
    restarts: int = 0
    age_ms: int | None = None  # of its newest block
    why: str = ""  # its first line on stderr, when it said anything there


_READER_LINE = re.compile(r"^([a-z]+) state=([a-z]+) restarts=([0-9]+) age_ms=(-?[0-9]*) pid=[0-9]* why=(.*)$")


def parse_readers(text: str) -> dict[str, ReaderState]:
    """The ``readers`` section: ``NAME state=S restarts=N age_ms=A pid=P why=TEXT`` per reader."""
    out: dict[str, ReaderState] = {}
    for line in str(text).splitlines():
        m = _READER_LINE.match(line.strip())
        if m:
            age = int(m.group(4)) if m.group(4) not in ("", "-") else None
            out[m.group(1)] = ReaderState(m.group(1), m.group(2), int(m.group(3)), age, m.group(5).strip()[:200])
    return out


@dataclass(frozen=True)
class SectionOutput:
    name: str
    text: str
    rc: int | None  # None when the section never finished (channel dropped mid-way)
    #: the bound the node cut this section's output at (``cap``), or None: a cut section's text is
    #: only :func:`cut_text`, never the part that came (a partial list read as the whole one)
    cut: int | None = None


def cut_text(limit: int) -> str:
    """What a section cut on the node reads as: one line, which the parsers read as nothing."""
    return f"output too large: more than {limit} bytes, cut on the node and not read"


def split_tick(lines: list[str], mark: str = MARK) -> dict[str, SectionOutput]:
    """Split the lines of one tick (between ``begin`` and ``end``) into sections (``mark``: the
    deployment's recon uses the same framing with its own marker)."""
    out: dict[str, SectionOutput] = {}
    current: str | None = None
    buf: list[str] = []
    cut: int | None = None
    for line in lines:
        if line.startswith(mark):
            words = line[len(mark):].split()
            if len(words) >= 2 and words[0] == "section":
                current, buf, cut = words[1], [], None
            elif len(words) >= 2 and words[0] == "cut" and current is not None and words[1].isdigit():
                cut = int(words[1])
            elif len(words) >= 3 and words[0] == "rc" and current == words[1]:
                try:
                    rc: int | None = int(words[2])
                except ValueError:
                    rc = None
                text = cut_text(cut) if cut is not None else "\n".join(buf)
                out[current] = SectionOutput(current, text, rc, cut)
                current, buf, cut = None, [], None
            continue
        if current is not None:
            buf.append(line)
    if current is not None:
        out[current] = SectionOutput(current, cut_text(cut) if cut is not None else "\n".join(buf), None, cut)
    return out
