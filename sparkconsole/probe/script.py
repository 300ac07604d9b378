"""The batched probe: one long-lived shell per node, one sample per request.

The console opens one exec channel per node running :func:`probe_script` and keeps it. Each tick
it writes one line naming the sections it wants (``"meminfo gpu gpu-apps links ip"``) and reads
until the ``end`` marker. The node never runs more than one process tree per tick, nothing is
re-authenticated, and cheap sections can be asked for every tick while slow ones (``docker
stats`` takes a second or two, ``df``, versions) are asked for less often.

Framing, one marker per line, all starting with :data:`MARK`::

    ::sparkprobe:: begin <seq>
    ::sparkprobe:: section <name>
    ...the command's stdout and stderr...
    ::sparkprobe:: rc <name> <exit code>
    ::sparkprobe:: end <seq>

The simulated Spark (:mod:`sparkconsole.sim`) answers the same protocol by running each
section's ``argv`` through its command emulator, so both are read by the same parsers.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from sparkconsole import remote

MARK = "::sparkprobe::"
HEADER = "# sparkconsole probe v1"
PER_SECTION_TIMEOUT_S = 8


@dataclass(frozen=True)
class ProbeSection:
    """One section of the probe: a constant command and how often it is worth asking for.

    ``argv`` is quoted when the script is built; ``globs`` lists argument indexes that are shell
    glob patterns (constants of this module) and are left unquoted so the node's shell expands
    them. ``every`` is the cadence in ticks (1 = every tick).
    """

    name: str
    argv: tuple[str, ...]
    every: int = 1
    globs: tuple[int, ...] = ()
    optional: bool = False  # a missing tool is normal here (no ray on a plain node)

    def shell(self) -> str:
        parts = []
        for i, arg in enumerate(self.argv):
            parts.append(arg if i in self.globs else shlex.quote(arg))
        return " ".join(parts)


GPU_QUERY_FIELDS = (
    "index,name,uuid,pci.bus_id,driver_version,utilization.gpu,memory.total,memory.used,"
    "temperature.gpu,power.draw,power.limit,clocks.sm,clocks.max.sm,pstate"
)

SECTIONS: tuple[ProbeSection, ...] = (
    ProbeSection("hostname", ("hostname",), every=30),
    ProbeSection("uname", ("uname", "-srm"), every=30),
    ProbeSection("nproc", ("nproc",), every=30),
    ProbeSection("uptime", ("cat", "/proc/uptime", "/proc/loadavg")),
    ProbeSection("meminfo", ("cat", "/proc/meminfo")),
    ProbeSection("gpu", ("nvidia-smi", f"--query-gpu={GPU_QUERY_FIELDS}", "--format=csv")),
    ProbeSection(
        "gpu-apps",
        ("nvidia-smi", "--query-compute-apps=pid,process_name,used_gpu_memory", "--format=csv"),
    ),
    ProbeSection("nvidia-smi", ("nvidia-smi",), every=30),
    ProbeSection("ibdev2netdev", ("ibdev2netdev",), every=5, optional=True),
    ProbeSection(
        "ib-ports",
        ("grep", "-H", ".", "/sys/class/infiniband/*/ports/*/state", "/sys/class/infiniband/*/ports/*/rate"),
        every=5,
        globs=(3, 4),
        optional=True,
    ),
    ProbeSection("ip-addr", ("ip", "-j", "addr"), every=5),
    ProbeSection("docker-ps", ("docker", "ps", "-a", "--format", "{{json .}}"), every=2),
    ProbeSection("docker-stats", ("docker", "stats", "--no-stream", "--format", "{{json .}}"), every=5),
    ProbeSection("docker-version", ("docker", "version", "--format", "{{.Server.Version}}"), every=30),
    ProbeSection("ray-status", ("ray", "status"), every=5, optional=True),
    ProbeSection("df", ("df", "-B1", "-P", "/"), every=30),
)
# The serving poll's (issue 24), asked by the poller on its own cadence, not part of the node's
# sample: which vLLM/SGLang servers run here (every ``every`` ticks and whenever the running
# containers change); each one's page is its own ``metrics-PORT`` section (:data:`METRICS_PREFIX`)
ENGINES = ProbeSection("engines", ("sh", "-c", remote.engine_cmdlines().text), every=30, optional=True)
SERVING_SECTIONS = frozenset({ENGINES.name})
METRICS_PREFIX = "metrics-"

SECTION_BY_NAME: dict[str, ProbeSection] = {s.name: s for s in (*SECTIONS, ENGINES)}


def metrics_section(port: int) -> str:
    """The section name that reads the engine page on ``port`` (``metrics-8000``)."""
    return METRICS_PREFIX + str(remote.validate_port(port))


def section_shell(name: str) -> str | None:
    """The shell text of section ``name`` (``metrics-PORT`` included), or None for an unknown name:
    what the probe script runs for it, for a twin that answers the protocol itself."""
    sec = SECTION_BY_NAME.get(name)
    if sec is not None:
        return sec.shell()
    m = re.fullmatch(METRICS_PREFIX + r"([0-9]{1,5})", name)
    if m and 0 < int(m.group(1)) < 65536:
        return remote.metrics_probe(int(m.group(1))).shell()
    return None


def sections_for_tick(tick: int) -> tuple[str, ...]:
    """Names of the sections worth asking for on tick number ``tick`` (0 = first: all)."""
    return tuple(s.name for s in SECTIONS if tick % s.every == 0)


def probe_script(sections: tuple[ProbeSection, ...] = (*SECTIONS, ENGINES)) -> str:
    """The shell program the node runs for the whole session (POSIX sh).

    Each section is wrapped in ``timeout`` when the node has it, so one hung tool (a wedged
    ``nvidia-smi``) costs a section, not the probe.
    """
    cases = []
    for s in sections:
        cases.append(f"    {s.name}) $T {s.shell()} 2>&1 ;;")
    # ``metrics-PORT``: the port comes from the request line, so it is checked to be digits here
    # before it reaches the command (the console only ever asks for ports it validated)
    page = remote.metrics_probe(8000)
    script, pattern = page.argv[2], page.argv[5]
    cases.append(f"    {METRICS_PREFIX}*) p=${{s#{METRICS_PREFIX}}}; case \"$p\" in ''|*[!0-9]*) "
                 f"echo \"not a port: $p\"; false ;; *) $T sh -c {shlex.quote(script)} sh \"$p\" "
                 f"{shlex.quote(pattern)} 2>&1 ;; esac ;;")
    body = "\n".join(cases)
    return f"""{HEADER}
export LC_ALL=C
T=''
command -v timeout >/dev/null 2>&1 && T='timeout -k 1 {PER_SECTION_TIMEOUT_S}'
seq=0
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


def probe_command() -> str:
    """The exec-channel command line that starts the probe on a node."""
    return "exec sh -c " + shlex.quote(probe_script())


@dataclass(frozen=True)
class SectionOutput:
    name: str
    text: str
    rc: int | None  # None when the section never finished (channel dropped mid-way)


def split_tick(lines: list[str], mark: str = MARK) -> dict[str, SectionOutput]:
    """Split the lines of one tick (between ``begin`` and ``end``) into sections (``mark``: the
    deployment's recon uses the same framing with its own marker)."""
    out: dict[str, SectionOutput] = {}
    current: str | None = None
    buf: list[str] = []
    for line in lines:
        if line.startswith(mark):
            words = line[len(mark):].split()
            if len(words) >= 2 and words[0] == "section":
                current, buf = words[1], []
            elif len(words) >= 3 and words[0] == "rc" and current == words[1]:
                try:
                    rc: int | None = int(words[2])
                except ValueError:
                    rc = None
                out[current] = SectionOutput(current, "\n".join(buf), rc)
                current, buf = None, []
            continue
        if current is not None:
            buf.append(line)
    if current is not None:
        out[current] = SectionOutput(current, "\n".join(buf), None)
    return out
