"""What one refresh of a node costs, five ways, side by side against a REAL OpenSSH sshd.

Starts a throwaway OpenSSH ``sshd`` on loopback (:class:`tests.lab.sshd.LabSshd`: its own host
key, user key, known_hosts and ssh_config; host keys are always verified, BatchMode, never
``StrictHostKeyChecking=no``), then measures one refresh of the SAME four metrics:

    /proc/meminfo                      ``cat /proc/meminfo``
    load (stands in for nvidia-smi)    ``cat /proc/uptime /proc/loadavg``
    interfaces                         ``ip -j addr``
    disk                               ``df -B1 -P /``

There is no GPU on this machine, so ``cat /proc/uptime /proc/loadavg`` (the probe's own "uptime"
section) stands in for the nvidia-smi call. The commands are exactly the probe's sections, so
every variant asks the node for the same work:

  (a) peers' way: a fresh ``ssh`` process per metric, 4 in a row (launch-cluster.sh, sparkrun steps)
  (b) one fresh ``ssh HOST bash -s`` with all 4 on stdin (sparkrun's per-step pattern)
  (c) OpenSSH ControlMaster (ControlPath in a tmp dir), one ``ssh`` per refresh with all 4
  (d) a new exec channel per refresh on a kept asyncssh connection (``SshTransport.run``)
  (e) sparkconsole: one long-lived probe process on the kept connection, one request line per
      tick. (e) = ``NodePoller.poll_once`` with the full split, parse and assemble (the reference);
      (e-raw) = the same tick round-trip read to the ``end`` marker, no parsing.

Per variant: wall ms per refresh (median, p90 over ``--rounds``), client CPU ms per refresh
(our process via ``time.process_time`` + OpenSSH children via ``getrusage(RUSAGE_CHILDREN)``
+ the ControlMaster process via psutil), node CPU ms per refresh (the sshd process tree, via
psutil: what the refresh costs the node). The variants are interleaved round by round (the order
rotates) in one process against one sshd, so drifting load from anything else on the machine hits
them alike; connection set-up for (c)/(d)/(e) is timed once and reported separately (it is paid
once per session, not per refresh).

Run from the repository root::

    .venv/bin/python benchmarks/probe_cost.py [--rounds 30] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as _dt
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python benchmarks/probe_cost.py` from anywhere
    sys.path.insert(0, str(ROOT))

import asyncssh  # noqa: E402
import psutil  # noqa: E402

from sparkconsole.probe import poller as poller_mod  # noqa: E402
from sparkconsole.probe.poller import NodePoller  # noqa: E402
from sparkconsole.probe.script import MARK, SECTION_BY_NAME, probe_command  # noqa: E402
from sparkconsole.probe.state import NodeStatus  # noqa: E402
from sparkconsole.transport.ssh import SshTransport  # noqa: E402
from tests.lab.sshd import LabSshd  # noqa: E402

SSH = shutil.which("ssh") or "/usr/bin/ssh"

#: The four probe sections every variant asks for (name -> the probe's own command line).
SECTIONS = ("meminfo", "uptime", "ip-addr", "df")
METRIC_COMMANDS = tuple(SECTION_BY_NAME[name].shell() for name in SECTIONS)
SEP = "::bench-section::"
BATCH_SCRIPT = "; ".join(f"echo {SEP}; {cmd}" for cmd in METRIC_COMMANDS) + "\n"

GPU_NOTE = (
    "no GPU on this machine: `cat /proc/uptime /proc/loadavg` (the probe's uptime section) "
    "stands in for the nvidia-smi call"
)


# ------------------------------------------------------------------------------ measurement


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _tree_cpu(pid: int | None) -> float:
    """CPU seconds of a process tree, reaped children included (tick-quantized /proc figures)."""
    if pid is None:
        return 0.0
    total = 0.0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return total


@dataclass
class Result:
    key: str
    label: str
    rounds: int
    wall_ms: list[float] = field(default_factory=list)
    own_cpu_s: float = 0.0
    children_cpu_s: float = 0.0
    extra_client_cpu_s: float = 0.0  # the ControlMaster process
    node_cpu_s: float = 0.0

    @property
    def median_ms(self) -> float:
        return statistics.median(self.wall_ms)

    @property
    def p90_ms(self) -> float:
        xs = sorted(self.wall_ms)
        return xs[min(len(xs) - 1, max(0, -(-9 * len(xs) // 10) - 1))]  # nearest rank

    @property
    def client_cpu_ms(self) -> float:
        return (self.own_cpu_s + self.children_cpu_s + self.extra_client_cpu_s) * 1000.0 / self.rounds

    @property
    def node_cpu_ms(self) -> float:
        return self.node_cpu_s * 1000.0 / self.rounds


@dataclass
class Variant:
    key: str
    label: str
    once: Callable[[], Awaitable[None]]
    extra_pid: int | None = None  # a client-side helper process (the ControlMaster)


SETTLE_S = 0.05  # after each refresh, before reading node CPU: sshd finishes closing the session


async def measure_interleaved(
    variants: list[Variant], rounds: int, node_pid: int | None, *, warmup: int = 2,
    log: Callable[[str], None] = lambda _m: None,
) -> list[Result]:
    """``warmup`` untimed refreshes per variant, then ``rounds`` rounds of one refresh each.

    Rounds interleave the variants (the order rotates every round), so load from anything else
    on the machine drifts over all of them alike. Wall time and client CPU cover the refresh
    call only; node CPU covers the call plus :data:`SETTLE_S` of quiet after it.
    """
    for _ in range(warmup):
        for v in variants:
            await v.once()
    results = {v.key: Result(v.key, v.label, rounds) for v in variants}
    for r in range(rounds):
        if r % 10 == 0:
            log(f"  round {r + 1}/{rounds}")
        k = r % len(variants)
        for v in variants[k:] + variants[:k]:
            res = results[v.key]
            await asyncio.sleep(SETTLE_S)
            node0, extra0 = _tree_cpu(node_pid), _tree_cpu(v.extra_pid)
            own0, ch0 = time.process_time(), _children_cpu()
            t0 = time.perf_counter()
            await v.once()
            res.wall_ms.append((time.perf_counter() - t0) * 1000.0)
            res.own_cpu_s += time.process_time() - own0
            res.children_cpu_s += _children_cpu() - ch0
            await asyncio.sleep(SETTLE_S)
            if v.extra_pid:
                res.extra_client_cpu_s += _tree_cpu(v.extra_pid) - extra0
            res.node_cpu_s += _tree_cpu(node_pid) - node0
    return [results[v.key] for v in variants]


# ------------------------------------------------------------------------------ the variants


def _check_batch(out: str) -> None:
    parts = out.split(SEP + "\n")[1:]
    if len(parts) != 4 or "MemTotal:" not in parts[0] or '"ifname"' not in parts[2] or "1-blocks" not in parts[3]:
        raise RuntimeError(f"unexpected batch output: {out[:300]!r}")


def _ssh_base(lab: LabSshd) -> list[str]:
    return [
        SSH, "-F", str(lab.ssh_config),
        "-o", "BatchMode=yes",
        "-o", "StrictHostKeyChecking=yes",  # the lab's known_hosts holds the real host key
        "-o", "ConnectTimeout=10",
    ]


def _run(argv: list[str], stdin: str | None = None) -> str:
    proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:8])}... exited {proc.returncode}: {proc.stderr.strip()[:300]}")
    return proc.stdout


def variant_a(lab: LabSshd) -> Callable[[], Awaitable[None]]:
    base = [*_ssh_base(lab), lab.alias]

    async def once() -> None:
        outs = [_run([*base, cmd]) for cmd in METRIC_COMMANDS]
        if "MemTotal:" not in outs[0] or "1-blocks" not in outs[3]:
            raise RuntimeError("unexpected output from the per-metric ssh")

    return once


def variant_b(lab: LabSshd) -> Callable[[], Awaitable[None]]:
    argv = [*_ssh_base(lab), lab.alias, "bash", "-s"]

    async def once() -> None:
        _check_batch(_run(argv, stdin=BATCH_SCRIPT))

    return once


def variant_c(lab: LabSshd, control_path: str) -> Callable[[], Awaitable[None]]:
    argv = [*_ssh_base(lab), "-o", "ControlMaster=no", "-o", f"ControlPath={control_path}",
            lab.alias, BATCH_SCRIPT]

    async def once() -> None:
        _check_batch(_run(argv))

    return once


def start_master(lab: LabSshd, control_path: str) -> subprocess.Popen[bytes]:
    """An OpenSSH ControlMaster in the foreground (``-N``, our child, so we own its pid)."""
    master = subprocess.Popen(
        [*_ssh_base(lab), "-M", "-N", "-o", f"ControlPath={control_path}", "-o", "ControlPersist=no",
         lab.alias],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    check = [*_ssh_base(lab), "-o", f"ControlPath={control_path}", "-O", "check", lab.alias]
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if master.poll() is not None:
            err = master.stderr.read().decode(errors="replace") if master.stderr else ""
            raise RuntimeError(f"ControlMaster exited {master.returncode}: {err[:300]}")
        if subprocess.run(check, capture_output=True).returncode == 0:
            return master
        time.sleep(0.05)
    master.kill()
    master.wait()
    raise RuntimeError("ControlMaster did not come up within 15 s")


def stop_master(lab: LabSshd, master: subprocess.Popen[bytes], control_path: str) -> None:
    with contextlib.suppress(Exception):
        subprocess.run([*_ssh_base(lab), "-o", f"ControlPath={control_path}", "-O", "exit", lab.alias],
                       capture_output=True, timeout=5)
    if master.poll() is None:
        master.kill()
    with contextlib.suppress(Exception):
        master.wait(timeout=5)


def variant_d(transport: SshTransport) -> Callable[[], Awaitable[None]]:
    async def once() -> None:
        result = await transport.run(BATCH_SCRIPT, timeout=30)
        if result.exit_status != 0:
            raise RuntimeError(f"exec channel exited {result.exit_status}: {result.stderr[:300]}")
        _check_batch(result.stdout)

    return once


def variant_e_full(poller: NodePoller) -> Callable[[], Awaitable[None]]:
    async def once() -> None:
        state = await poller.poll_once()
        sample = state.sample
        if state.status is not NodeStatus.UP or sample is None or sample.meminfo is None or sample.disk is None:
            raise RuntimeError(f"poll_once failed: {state.status} {state.reason}")

    return once


class RawTick:
    """The probe's tick round-trip on its own process: write the request, read to ``end``."""

    def __init__(self, transport: SshTransport) -> None:
        self.transport = transport
        self.process = None
        self.request = " ".join(SECTIONS)

    async def start(self) -> None:
        self.process = await self.transport.open_process(probe_command())

    async def once(self) -> None:
        proc = self.process
        assert proc is not None
        await proc.write_line(self.request)
        n = 0
        while True:
            line = await proc.read_line()
            if line is None:
                raise RuntimeError("the probe process ended")
            n += 1
            if line.startswith(MARK + " end"):
                break
        if n < 10:
            raise RuntimeError(f"a raw tick of {n} lines is too short")

    async def close(self) -> None:
        if self.process is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.process.close(), 5)


@contextlib.contextmanager
def four_sections_per_tick():
    """Make ``NodePoller`` ask for exactly the four benchmark sections every tick."""
    original = poller_mod.sections_for_tick
    poller_mod.sections_for_tick = lambda tick: SECTIONS  # type: ignore[assignment]
    try:
        yield
    finally:
        poller_mod.sections_for_tick = original  # type: ignore[assignment]


# ------------------------------------------------------------------------------ the run


def machine_line() -> str:
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    ssh_v = subprocess.run([SSH, "-V"], capture_output=True, text=True).stderr.strip().split(",")[0]
    return (f"{os.cpu_count()} cores {cpu}, Linux {platform.release()}, {ssh_v}, "
            f"asyncssh {asyncssh.__version__}, Python {platform.python_version()}")


async def run_all(rounds: int, workdir: Path, log: Callable[[str], None]) -> dict[str, object]:
    lab = LabSshd(workdir / "sshd", alias="bench-node")
    control_path = str(workdir / "cm-%C")
    master: subprocess.Popen[bytes] | None = None
    transport: SshTransport | None = None
    poller: NodePoller | None = None
    raw: RawTick | None = None
    results: list[Result] = []
    setup: dict[str, float] = {}
    lab.start()
    try:
        node_pid = lab._proc.pid if lab._proc is not None else None

        log("setting up: ControlMaster, asyncssh connection, probe process ...")
        t0 = time.perf_counter()
        master = start_master(lab, control_path)
        setup["controlmaster_start_ms"] = (time.perf_counter() - t0) * 1000.0

        transport = SshTransport(lab.node_config("bench-node"), connect_timeout=10)
        t0 = time.perf_counter()
        await transport.connect()
        setup["asyncssh_connect_ms"] = (time.perf_counter() - t0) * 1000.0

        poller = NodePoller(lab.node_config("bench-node"), transport, tick_timeout=30)
        with four_sections_per_tick():
            t0 = time.perf_counter()
            await poller.poll_once()  # opens the probe process: paid once per session
            setup["probe_start_and_first_tick_ms"] = (time.perf_counter() - t0) * 1000.0
            raw = RawTick(transport)
            await raw.start()

            variants = [
                Variant("a", "fresh ssh per metric (4 ssh)", variant_a(lab)),
                Variant("b", "one fresh ssh, all 4 (bash -s)", variant_b(lab)),
                Variant("c", "ControlMaster, 1 ssh/refresh", variant_c(lab, control_path), master.pid),
                Variant("d", "kept conn, new channel/refresh", variant_d(transport)),
                Variant("e", "sparkconsole poll_once (parse+assemble)", variant_e_full(poller)),
                Variant("e-raw", "sparkconsole raw tick (no parse)", raw.once),
            ]
            log(f"measuring {len(variants)} variants x {rounds} rounds, interleaved ...")
            results = await measure_interleaved(variants, rounds, node_pid, log=log)
    finally:
        if raw is not None:
            await raw.close()
        if poller is not None:
            await poller.close()  # closes the transport too
        elif transport is not None:
            await transport.close()
        if master is not None:
            stop_master(lab, master, control_path)
        lab.stop()

    ref = next(r for r in results if r.key == "e")
    variants = []
    for r in results:
        variants.append({
            "key": r.key,
            "label": r.label,
            "wall_ms_median": round(r.median_ms, 3),
            "wall_ms_p90": round(r.p90_ms, 3),
            "client_cpu_ms": round(r.client_cpu_ms, 3),
            "client_cpu_ms_own_process": round(r.own_cpu_s * 1000.0 / r.rounds, 3),
            "client_cpu_ms_ssh_children": round(r.children_cpu_s * 1000.0 / r.rounds, 3),
            "client_cpu_ms_controlmaster": round(r.extra_client_cpu_s * 1000.0 / r.rounds, 3),
            "node_cpu_ms": round(r.node_cpu_ms, 3),
            "wall_ratio_vs_e": round(r.median_ms / ref.median_ms, 2),
            "client_cpu_ratio_vs_e": round(r.client_cpu_ms / ref.client_cpu_ms, 2) if ref.client_cpu_ms else None,
            "node_cpu_ratio_vs_e": round(r.node_cpu_ms / ref.node_cpu_ms, 2) if ref.node_cpu_ms > 0 else None,
        })
    return {
        "benchmark": "probe_cost",
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine_line(),
        "rounds": rounds,
        "metrics": dict(zip(SECTIONS, METRIC_COMMANDS, strict=True)),
        "note": GPU_NOTE,
        "reference": "e",
        "setup_ms": {k: round(v, 1) for k, v in setup.items()},
        "variants": variants,
    }


def _times(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x:,.0f}×" if x >= 10 else f"{x:.1f}×" if x >= 1 else f"{x:.2f}×"


def print_table(report: dict[str, object]) -> None:
    variants: list[dict[str, object]] = report["variants"]  # type: ignore[assignment]
    print(f"probe_cost — one refresh of 4 metrics, {report['rounds']} rounds per variant")
    print(f"machine: {report['machine']}")
    print(f"date:    {report['date']}")
    print(f"metrics: {', '.join(report['metrics'].values())}")  # type: ignore[union-attr]
    print(f"note:    {report['note']}")
    print()
    head = (f"{'':6} {'variant':40} {'wall p50':>9} {'wall p90':>9} {'client CPU':>11} {'node CPU':>9}"
            f" {'wall ×e':>8} {'cpu ×e':>7} {'node ×e':>8}")
    print(head)
    print(f"{'':6} {'':40} {'ms':>9} {'ms':>9} {'ms':>11} {'ms':>9}")
    print("-" * len(head))
    for v in variants:
        print(f"({v['key']})".ljust(7) + f"{v['label']:40} {v['wall_ms_median']:9.1f} {v['wall_ms_p90']:9.1f}"
              f" {v['client_cpu_ms']:11.2f} {v['node_cpu_ms']:9.1f} {_times(v['wall_ratio_vs_e']):>8}"  # type: ignore[arg-type]
              f" {_times(v['client_cpu_ratio_vs_e']):>7} {_times(v['node_cpu_ratio_vs_e']):>8}")  # type: ignore[arg-type]
    print()
    for v in variants:
        if v["key"] == "e":
            continue
        w = float(v["wall_ratio_vs_e"])  # type: ignore[arg-type]
        wall = f"{_times(w)} slower" if w >= 1 else f"{_times(1 / w)} faster"
        print(f"  ({v['key']}) is {wall} than sparkconsole (e) per refresh, with "
              f"{_times(v['client_cpu_ratio_vs_e'])} its client CPU and "  # type: ignore[arg-type]
              f"{_times(v['node_cpu_ratio_vs_e'])} its node CPU")  # type: ignore[arg-type]
    setup = report["setup_ms"]
    print()
    print("once per session, not per refresh: " + ", ".join(f"{k} {v:.0f} ms" for k, v in setup.items()))  # type: ignore[union-attr]
    print("client CPU = this process (time.process_time) + ssh children (RUSAGE_CHILDREN) + the ControlMaster;")
    print("node CPU = the sshd process tree (psutil /proc figures, 10 ms ticks, summed over the rounds);")
    print("(e) asks its 4 sections through NodePoller.poll_once (split + parse + assemble); (e-raw) only reads")
    print("the tick to its end marker. (a)-(d) parse nothing, so the ratios to (e) are conservative.")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=30, help="timed refreshes per variant (default 30)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="sparkconsole-bench-") as tmp:
        report = asyncio.run(run_all(args.rounds, Path(tmp), log))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
