"""The probe's long-lived GPU readers (issue 25), through a real shell and through the twin.

Under ``/bin/sh`` the probe runs exactly as on a node; ``nvidia-smi`` is a stand-in that prints what
a real H200 printed, looping the way the real one loops (tests/fixtures/loop-nvidia-smi). Processes
are counted with ``strace -f`` (forks that are not threads), so the count is the probe's own whatever
else the machine is doing. Through the twin, the simulated node's process table counts them.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkconsole.probe import parsers as P
from sparkconsole.probe.assemble import assemble_sample
from sparkconsole.probe.poller import NodePoller
from sparkconsole.probe.script import (
    GPU_MOVING_FIELDS,
    MARK,
    SectionOutput,
    parse_readers,
    probe_script,
    split_tick,
)
from tests.conftest import FIXTURES

STUB = FIXTURES / "loop-nvidia-smi"
GPU_TICK = "uptime meminfo gpu gpu-apps readers"


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PATH=f"{STUB}:{os.environ['PATH']}", STUB_FIXTURES=str(FIXTURES / "h200-local-probe"),
               STUB_PYTHON=sys.executable)
    env.update(extra)
    return env


class Probe:
    """The probe script under a real ``sh`` (optionally under ``strace -f``), one request at a time."""

    def __init__(self, interval_ms: int = 300, trace: Path | None = None, **env: str) -> None:
        argv = ["sh", "-c", probe_script(interval_ms=interval_ms)]
        if trace is not None:
            argv = ["strace", "-f", "-ttt", "-qq", "-e", "trace=clone,clone3,fork,vfork", "-o", str(trace), *argv]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=_env(**env))

    def ask(self, request: str) -> dict[str, SectionOutput]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(request + "\n")
        self.proc.stdin.flush()
        lines = []
        for line in self.proc.stdout:
            if line.startswith(f"{MARK} end"):
                break
            lines.append(line.rstrip("\n"))
        return split_tick([ln for ln in lines if not ln.startswith(f"{MARK} begin")])

    def until(self, request: str, ok, timeout: float = 20.0) -> dict[str, SectionOutput]:
        """Ask until ``ok(sections)`` (a condition, not a fixed wait)."""
        deadline = time.monotonic() + timeout
        while True:
            secs = self.ask(request)
            if ok(secs) or time.monotonic() > deadline:
                return secs
            time.sleep(0.05)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(20)


def forks(trace: Path, since: float = 0.0) -> int:
    """Processes started (fork, vfork, clone without CLONE_THREAD) in an ``strace -f -ttt`` log, after
    ``since`` (epoch seconds)."""
    n = 0
    for line in trace.read_text().splitlines():
        m = re.match(r"\s*[0-9]+\s+([0-9.]+)\s", line)
        if m and float(m.group(1)) < since:
            continue
        if re.search(r"\b(clone3?|v?fork)\(", line) and "CLONE_THREAD" not in line and "resumed>" not in line:
            n += 1
    return n


def _reader_running(secs: dict[str, SectionOutput]) -> bool:
    r = parse_readers(secs["readers"].text)
    return all(x.state == "running" and x.age_ms is not None for x in r.values())


def test_gpu_sections_come_from_the_readers_and_start_nothing(tmp_path):
    """After the readers' start, a tick of memory, uptime and both GPU sections starts no process,
    and what it prints is what the one-shot nvidia-smi prints (same parsers, same values)."""
    trace = tmp_path / "trace"
    probe = Probe(trace=trace)
    try:
        first = probe.ask(GPU_TICK)  # the readers start; this tick is answered by one-shot commands
        probe.until(GPU_TICK, _reader_running)
        steady = time.time()
        for _ in range(15):
            secs = probe.ask(GPU_TICK)
            time.sleep(0.05)
        ended = time.time()
    finally:
        probe.close()
    assert forks(trace) >= 2  # the count sees the probe's own starts (the readers, the first tick)
    assert forks(trace, since=steady) - forks(trace, since=ended) == 0
    # the reader reads what moves; the sample puts it on the static fields of the same GPU
    moving = P.parse_nvidia_smi_csv(secs["gpu"].text).rows
    assert set(moving[0]) == set(GPU_MOVING_FIELDS.replace("clocks.sm", "clocks.current.sm").split(","))
    before = assemble_sample("spark-1", 1.0, first)
    after = assemble_sample("spark-1", 2.0, secs, previous=before)
    assert after.gpus == before.gpus  # the stand-in's values do not move: every field equal
    assert after.gpus[0].name == "NVIDIA H200" and after.gpus[0].memory_used_mib == 32115
    assert P.parse_nvidia_smi_csv(secs["gpu-apps"].text).rows == P.parse_nvidia_smi_csv(first["gpu-apps"].text).rows
    assert {n: r.state for n, r in parse_readers(secs["readers"].text).items()} == {"gpu": "running",
                                                                                   "apps": "running"}


def test_samples_stay_fresh_within_one_interval():
    probe = Probe(interval_ms=300)
    try:
        probe.until(GPU_TICK, _reader_running)
        ages = []
        for _ in range(8):
            ages += [r.age_ms for r in parse_readers(probe.ask(GPU_TICK)["readers"].text).values()]
            time.sleep(0.1)
    finally:
        probe.close()
    # the stand-in prints every 300 ms; a block is at most one interval old, plus the time the
    # stand-in took to print it on a busy machine
    assert ages and max(a for a in ages if a is not None) <= 300 + 250, ages


def _stub_gone() -> bool:
    return not subprocess.run(["pgrep", "-f", f"{sys.executable} - --query"], capture_output=True, text=True).stdout.strip()


def assert_readers_gone(timeout: float = 10.0) -> None:
    """No stand-in nvidia-smi left running: the probe's exit stopped its readers (waits for it)."""
    deadline = time.monotonic() + timeout
    while not _stub_gone() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _stub_gone(), "a reader outlived the probe"


def test_a_dead_reader_is_restarted_and_counted():
    """Killed, a reader is restarted and counted; and a probe that ends right after the restart
    still stops the new one (its pid is the shell's own ``$!``, not a file written later)."""
    probe = Probe()
    try:
        secs = probe.until(GPU_TICK, _reader_running)
        pid = int(re.search(r"gpu state=running .* pid=([0-9]+)", secs["readers"].text).group(1))
        os.kill(pid, 9)
        secs = probe.until(GPU_TICK, lambda s: parse_readers(s["readers"].text)["gpu"].restarts == 1
                           and _reader_running(s))
        assert parse_readers(secs["readers"].text)["gpu"].restarts == 1
        assert P.gpus_from_query(P.parse_nvidia_smi_csv(secs["gpu"].text))[0].memory_used_mib == 32115
    finally:
        probe.close()
    assert_readers_gone()


def test_a_wedged_reader_is_ended_and_restarted_while_one_shot_reads_answer():
    probe = Probe(interval_ms=200, STUB_WEDGE="1")
    try:
        secs = probe.until(GPU_TICK, lambda s: parse_readers(s["readers"].text)["gpu"].restarts >= 1, timeout=30)
        assert parse_readers(secs["readers"].text)["gpu"].restarts >= 1
        # meanwhile every tick had its figures: from the one-shot query once the block was stale
        assert P.gpus_from_query(P.parse_nvidia_smi_csv(secs["gpu"].text))[0].memory_used_mib == 32115
    finally:
        probe.close()
    assert_readers_gone()


def test_a_node_without_loop_mode_keeps_the_one_shot_sections():
    probe = Probe(STUB_NO_LOOP="1")
    try:
        secs = probe.until(GPU_TICK, lambda s: parse_readers(s["readers"].text)["gpu"].state == "oneshot")
        r = parse_readers(secs["readers"].text)
        assert r["gpu"].state == r["apps"].state == "oneshot"
        assert "Invalid combination" in r["gpu"].why
        assert secs["gpu"].rc == 0 and P.gpus_from_query(P.parse_nvidia_smi_csv(secs["gpu"].text))[0].name
    finally:
        probe.close()


def test_the_probe_leaves_nothing_behind(tmp_path):
    probe = Probe(TMPDIR=str(tmp_path), XDG_RUNTIME_DIR=str(tmp_path))
    probe.until(GPU_TICK, _reader_running)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("sparkprobe.")]
    probe.close()

    def gone() -> bool:
        out = subprocess.run(["pgrep", "-f", str(STUB)], capture_output=True, text=True).stdout
        return not out.strip() and not any(tmp_path.iterdir())

    deadline = time.monotonic() + 10
    while not gone() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(), "a reader or its directory outlived the probe"


def _probe_dirs(where: Path) -> list[str]:
    return [p.name for p in where.iterdir() if p.name.startswith("sparkprobe.")]


def test_a_probe_killed_outright_leaves_no_reader_and_no_directory(tmp_path):
    """SIGKILL runs no exit trap: the GPU reader's loop sees its probe gone within an interval and
    ends every reader, the one quiet for hours too (compute-apps on a GPU with no process), and
    removes the directory."""
    probe = Probe(interval_ms=200, XDG_RUNTIME_DIR=str(tmp_path), STUB_NO_APPS="1")
    try:
        secs = probe.until(GPU_TICK, lambda s: parse_readers(s["readers"].text)["gpu"].age_ms is not None
                           and parse_readers(s["readers"].text)["apps"].state == "running")
        r = parse_readers(secs["readers"].text)
        assert r["apps"].age_ms is None  # the quiet one: no block, its loop never wakes on its own
        assert _probe_dirs(tmp_path) and not _stub_gone()
    finally:
        probe.proc.kill()
        probe.proc.wait(20)
    assert_readers_gone()
    deadline = time.monotonic() + 10
    while _probe_dirs(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _probe_dirs(tmp_path) == []


def test_a_probe_that_starts_no_reader_makes_no_directory(tmp_path):
    """The directory is made with the first reader, so a probe killed before any (or on a node
    without nvidia-smi) leaves nothing behind either."""
    probe = Probe(XDG_RUNTIME_DIR=str(tmp_path), PATH="/nonexistent:/usr/bin:/bin")
    try:
        secs = probe.ask("uptime meminfo gpu gpu-apps readers")
        assert {r.state for r in parse_readers(secs["readers"].text).values()} == {"oneshot"}
        assert secs["meminfo"].rc == 0
    finally:
        probe.proc.kill()
        probe.proc.wait(20)
    assert _probe_dirs(tmp_path) == []


def test_a_missing_tool_costs_no_process(tmp_path):
    trace = tmp_path / "trace"
    probe = Probe(trace=trace, PATH="/nonexistent:/usr/bin:/bin")
    try:
        for _ in range(5):
            secs = probe.ask("ray-status ibdev2netdev")
    finally:
        probe.close()
    assert secs["ray-status"].rc == 127 and "not found" in secs["ray-status"].text
    assert forks(trace) <= 1  # at most the probe's own start, never one per tick (no reader: no mktemp)


def test_restarts_and_give_up_are_said_once():
    poller = NodePoller.__new__(NodePoller)
    from sparkconsole.probe.state import NodeState

    poller.state = NodeState("spark-1")
    line = "gpu state=running restarts={} age_ms=100 pid=7 why=\napps state={} restarts=0 age_ms= pid= why=boom\n"
    poller._readers_read(SectionOutput("readers", line.format(0, "running"), 0))
    poller._readers_read(SectionOutput("readers", line.format(1, "running"), 0))
    poller._readers_read(SectionOutput("readers", line.format(1, "oneshot"), 0))
    poller._readers_read(SectionOutput("readers", line.format(1, "oneshot"), 0))
    notes = poller.state.take_notes()
    assert len(notes) == 2 and "gpu died and was restarted" in notes[0] and "apps not available: boom" in notes[1]
    assert poller.state.take_notes() == []


async def test_the_twin_starts_at_most_one_process_per_tick():
    """Through the simulated node (SSH, its process table): after the readers' start, the GPU and
    memory ticks start nothing, and the console's whole cadence (containers from their cgroups,
    ``docker ps`` when they change) less than one process per tick on average."""
    from sparkconsole.sim.clock import SimClock
    from sparkconsole.sim.server import start_demo_cluster
    from sparkconsole.transport import node_transport

    async with start_demo_cluster(clock=SimClock(speed=20.0)) as demo:
        node = demo.config.nodes[0]
        table = demo.sim.proc_table(node.name)
        poller = NodePoller(node, node_transport(demo.config, node), interval=1.0, serving=False)
        try:
            await poller.poll_once()
            while not all(r.state == "running" and r.age_ms is not None for r in poller.state.readers.values()) \
                    or not poller.state.readers:
                await asyncio.sleep(0.05)
                await poller.poll_once()
            assert poller._cgroups_ok  # the twin has its containers' cgroup files, as DGX OS does
            n0 = table.started
            for _ in range(10):
                await poller._tick_lines(tuple(GPU_TICK.split()))
            assert table.started == n0
            n0 = table.started
            for _ in range(60):
                await poller.poll_once()
            per_tick = (table.started - n0) / 60
            assert per_tick <= 1.0, per_tick
            sample = poller.state.sample
            assert sample is not None and sample.gpus[0].name == "NVIDIA GB10" and sample.gpus[0].utilization_pct is not None
            running = [c for c in sample.containers if c.state == "running"]
            assert running and all(c.mem_used_bytes and c.cpu_pct is not None for c in running)
            assert poller.state.readers["gpu"].restarts == 0
        finally:
            await poller.close()


@pytest.mark.docker
@pytest.mark.sshd
async def test_a_real_node_over_ssh_starts_at_most_one_process_per_tick(sshd, docker_lab, tmp_path):
    """The lab: a real OpenSSH sshd and a real Docker engine with two containers running. The
    probe the poller starts through SSH is followed by ``strace -f`` (attached to it): over the
    console's cadence it starts less than one process per tick (no GPU here: a missing tool costs
    none), and the containers' figures come from their cgroup files, as ``docker stats`` gives them."""
    import psutil

    from sparkconsole.transport.ssh import SshTransport

    busy = docker_lab.run("busy", "while :; do :; done")
    idle = docker_lab.ticker("idle", interval=1.0)
    transport = SshTransport(sshd.node_config("spark-01"), backoff_base=0.1, backoff_max=0.5)
    poller = NodePoller(sshd.node_config("spark-01"), transport, interval=1.0)
    poller.patience = 20.0
    trace = tmp_path / "trace"
    tracer = None
    try:
        began = time.time() - 1.0
        await poller.poll_once()
        # this test's probe: the probe shell (not one of its readers' subshells) started by now
        mine = [p for p in psutil.process_iter(["cmdline", "create_time"])
                if p.info["cmdline"] and "sparkconsole probe v2" in " ".join(p.info["cmdline"])
                and p.info["create_time"] >= began]
        probes = [p for p in mine if p.ppid() not in {q.pid for q in mine}]
        assert len(probes) == 1, probes
        tracer = subprocess.Popen(["strace", "-f", "-ttt", "-qq", "-e", "trace=clone,clone3,fork,vfork", "-o", str(trace),
                                   "-p", str(probes[0].pid)], stderr=subprocess.DEVNULL)
        while not trace.exists() or not poller._cgroups_ok:
            await asyncio.sleep(0.1)
            await poller.poll_once()
        start = time.time()
        for _ in range(40):
            await poller.poll_once()
        ended = time.time()
        tracer.terminate()
        tracer.wait(10)
        per_tick = (forks(trace, since=start) - forks(trace, since=ended)) / 40
        assert per_tick <= 1.0, per_tick
        sample = poller.state.sample
        assert sample is not None
        by_name = {c.name: c for c in sample.containers}
        busy_cpu, idle_cpu = by_name[busy].cpu_pct, by_name[idle].cpu_pct
        assert busy_cpu is not None and idle_cpu is not None
        # a busy loop against a ticker measured in the same run: what a loaded machine gives the
        # loop (27 % with two burners beside it, a whole core when quiet) still dwarfs the ticker
        assert busy_cpu > max(4 * idle_cpu, idle_cpu + 5), (busy_cpu, idle_cpu)
        assert by_name[busy].mem_used_bytes and by_name[busy].mem_limit_bytes
        assert "docker-stats" not in sample.sections  # the cgroup files stand in for it
    finally:
        if tracer is not None and tracer.poll() is None:
            tracer.kill()
        await poller.close()


@pytest.fixture
def docker_lab(tmp_path: Path):
    from tests.lab.docker import docker_lab_fixture

    yield from docker_lab_fixture(tmp_path)


def test_the_console_shows_a_reader_note_once_in_its_events():
    from types import SimpleNamespace

    from sparkconsole.probe.state import NodeState
    from sparkconsole.ui.app import DemoOptions, SparkConsoleApp

    app = SparkConsoleApp(demo=DemoOptions(), clock=lambda: 100.0, remember_theme=False)
    state = NodeState("spark-1")
    app.poller = SimpleNamespace(pollers={"spark-1": SimpleNamespace(state=state)})
    state.notes.append("GPU reader gpu died and was restarted: \x1b[31mred\x1b[0m")  # node words: cleaned
    app._note_changes("spark-1", [])
    app._note_changes("spark-1", [])
    texts = [text for _, sev, text in app.events if sev == "warning"]
    assert len(texts) == 1 and texts[0].startswith("spark-1: GPU reader gpu died and was restarted")
    assert "\x1b" not in texts[0]


def test_the_node_detail_says_how_the_gpu_is_read():
    from sparkconsole.probe.script import ReaderState
    from sparkconsole.probe.state import NodeState
    from sparkconsole.ui.screens.node_detail import gpu_reading

    state = NodeState("spark-1")
    assert gpu_reading(state) == "—"
    state.readers = {"gpu": ReaderState("gpu", "running"), "apps": ReaderState("apps", "running", restarts=2)}
    assert gpu_reading(state) == "streaming (nvidia-smi -lms) · restarted 2×"
    state.readers = {n: ReaderState(n, "oneshot") for n in ("gpu", "apps")}
    assert gpu_reading(state) == "one nvidia-smi per tick"
