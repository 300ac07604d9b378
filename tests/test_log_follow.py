"""Following logs from a REAL Docker engine through the REAL SSH transport; the log buffer."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psutil
import pytest

from sparkconsole.errors import TransportError
from sparkconsole.logs.follow import (
    LogBuffer,
    LogFollower,
    LogLine,
    Reattached,
    StreamDropped,
    display_text,
    docker_follow,
    journal_follow,
    merge_by_time,
    merge_lines,
    split_timestamp,
    timestamp_key,
)
from sparkconsole.transport.ssh import SshTransport
from tests.conftest import REAL
from tests.lab.docker import DockerLab, docker, docker_lab_fixture, vllm_lines, wait_state


@pytest.fixture
def docker_lab(tmp_path: Path) -> Iterator[DockerLab]:
    yield from docker_lab_fixture(tmp_path)


@pytest.fixture
async def transport(sshd) -> AsyncIterator[SshTransport]:
    t = SshTransport(sshd.node_config("spark-01"), backoff_base=0.1, backoff_max=0.5)
    try:
        yield t
    finally:
        await t.close()


class Collector:
    """Reads a follower in the background; tests wait for conditions on what it collected."""

    def __init__(self, events) -> None:
        self.events: list = []
        self._it = events
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async for ev in self._it:
            self.events.append(ev)

    @property
    def lines(self) -> list[LogLine]:
        return [e for e in self.events if isinstance(e, LogLine)]

    def count(self, kind: type) -> int:
        return sum(isinstance(e, kind) for e in self.events)

    async def wait(self, cond, timeout: float = 8.0, what: str = "") -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if self.task.done():
                self.task.result()
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}: {self.events[-5:]}")
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


def docker_log_pairs(lab: DockerLab, name: str) -> list[tuple[str | None, str]]:
    return [split_timestamp(line) for line in lab.logs(name, timestamps=True)]


@pytest.mark.docker
@pytest.mark.sshd
async def test_lines_arrive_as_the_container_prints_them(transport: SshTransport, docker_lab: DockerLab) -> None:
    name = docker_lab.ticker("live", interval=0.2)
    wait_state(name, "running")
    follower = LogFollower(transport, docker_follow(name), tail=200, source="head")
    c = Collector(follower)
    try:
        await c.wait(lambda: len(c.lines) >= 6, what="6 lines")
    finally:
        await c.stop()
    lines = c.lines[:6]
    assert [ln.text for ln in lines] == [f"tick {i}" for i in range(1, 7)]
    assert all(ln.source == "head" and ln.timestamp and timestamp_key(ln.timestamp) for ln in lines)
    # they came over time, not in one burst at the end
    assert lines[5].received_at - lines[2].received_at > 0.3
    assert follower.commands[0] == f"docker logs --tail 200 -f -t {name}"
    assert c.count(StreamDropped) == 0


async def _follow_across(transport, lab: DockerLab, disrupt, *, name: str | None = None):
    name = name or lab.ticker("across", interval=0.1)
    wait_state(name, "running")
    follower = LogFollower(transport, docker_follow(name), backoff=(0.2, 0.4, 0.8), settle_s=0.3)
    c = Collector(follower)
    try:
        await c.wait(lambda: len(c.lines) >= 8, what="lines before the disruption")
        await disrupt(name)
        await c.wait(lambda: c.count(Reattached) >= 1, timeout=15, what="re-attach")
        n = len(c.lines)
        await c.wait(lambda: len(c.lines) >= n + 5, what="lines after the re-attach")
    finally:
        await c.stop()
    got = [(ln.timestamp, ln.text) for ln in c.lines]
    assert len(set(got)) == len(got), "a line was delivered twice"
    expected = docker_log_pairs(lab, name)
    assert got == expected[: len(got)], "lines lost or out of order"
    drops = [e for e in c.events if isinstance(e, StreamDropped)]
    assert drops and drops[0].retry_in == 0.2
    # the re-attach asked only for what was not seen
    assert any("--since" in cmd and "--tail all" in cmd for cmd in follower.commands[1:])
    return c, follower


@pytest.mark.docker
@pytest.mark.sshd
async def test_follow_across_a_docker_restart(transport: SshTransport, docker_lab: DockerLab) -> None:
    async def restart(name: str) -> None:
        await asyncio.to_thread(docker, "restart", "-t", "1", name)

    c, _ = await _follow_across(transport, docker_lab, restart)
    texts = [ln.text for ln in c.lines]
    # the restarted container starts counting again: both runs are there, once each
    assert texts.count("tick 1") == 2


@pytest.mark.docker
@pytest.mark.sshd
async def test_reattach_after_the_remote_docker_logs_is_killed(
    transport: SshTransport, docker_lab: DockerLab
) -> None:
    async def kill_remote(name: str) -> None:
        victims = [
            p for p in psutil.process_iter(["name", "cmdline"])
            if p.info["cmdline"] and "logs" in p.info["cmdline"] and name in p.info["cmdline"]
            and p.info["name"] == "docker"
        ]
        assert victims, "the remote docker logs process was not found"
        for p in victims:
            p.send_signal(signal.SIGKILL)

    c, _ = await _follow_across(transport, docker_lab, kill_remote)
    assert c.count(StreamDropped) >= 1


@pytest.mark.docker
@pytest.mark.sshd
async def test_reattach_after_sshd_restarts(transport: SshTransport, docker_lab: DockerLab, sshd) -> None:
    async def restart_sshd(name: str) -> None:
        await asyncio.to_thread(sshd.restart)

    c, _ = await _follow_across(transport, docker_lab, restart_sshd)
    drop = next(e for e in c.events if isinstance(e, StreamDropped))
    assert drop.reason


@pytest.mark.docker
@pytest.mark.sshd
async def test_merge_head_and_worker_by_time(transport: SshTransport, docker_lab: DockerLab) -> None:
    head = docker_lab.ticker("head", interval=0.07, prefix="head")
    worker = docker_lab.ticker("worker", interval=0.11, prefix="worker")
    wait_state(head, "running")
    wait_state(worker, "running")
    fh = LogFollower(transport, docker_follow(head), source="head")
    fw = LogFollower(transport, docker_follow(worker), source="worker-1")
    c = Collector(merge_by_time([fh, fw], window=0.4))
    try:
        await c.wait(lambda: {ln.source for ln in c.lines} == {"head", "worker-1"} and len(c.lines) >= 25,
                     what="lines from both")
    finally:
        await c.stop()
    keys = [ln.sort_key for ln in c.lines]
    assert keys == sorted(keys)
    assert all(ln.text.startswith("head") == (ln.source == "head") for ln in c.lines)


@pytest.mark.docker
@pytest.mark.sshd
async def test_vllm_lines_arrive_in_order(transport: SshTransport, docker_lab: DockerLab) -> None:
    src = vllm_lines()
    name = docker_lab.vllm("vllm", interval=0.01)
    c = Collector(LogFollower(transport, docker_follow(name)))
    try:
        await c.wait(lambda: any("Application startup complete" in ln.text for ln in c.lines), what="ready")
    finally:
        await c.stop()
    assert [ln.text for ln in c.lines] == src[: len(c.lines)]


# ---- without a node: the follower's own logic with a scripted transport ------------------


class ScriptedTransport:
    """Each ``stream`` call plays the next script: a list of lines, then an end or an error."""

    node = "fake"

    def __init__(self, scripts: list[tuple[list[str], Exception | None]]) -> None:
        self.scripts = scripts
        self.calls: list[str] = []

    async def stream(self, cmd):
        self.calls.append(str(cmd))
        lines, error = self.scripts.pop(0) if self.scripts else ([], None)
        for line in lines:
            await asyncio.sleep(0)
            yield line
        if error is not None:
            raise error
        if not self.scripts:
            await asyncio.sleep(3600)  # a quiet live stream


async def test_dedupe_and_backoff_with_a_scripted_transport() -> None:
    ts = [f"2026-03-18T06:54:5{i}.00000000{i}Z" for i in range(6)]
    t = ScriptedTransport([
        ([f"{ts[0]} a", f"{ts[1]} b", f"{ts[2]} c"], TransportError("fake: stream lost: reset")),
        ([], None),  # ends at once: a second drop, longer wait
        ([f"{ts[2]} c", f"{ts[3]} d", "no timestamp here", f"{ts[4]} e"], None),
    ])
    slept: list[float] = []

    async def fake_sleep(s: float) -> None:
        slept.append(s)

    f = LogFollower(t, docker_follow("vllm"), tail=50, backoff=(0.5, 1, 2), sleep=fake_sleep, settle_s=5)
    events = []
    async for ev in f:
        events.append(ev)
        if isinstance(ev, LogLine) and ev.text == "e":
            break
    await f.aclose()
    assert [e.text for e in events if isinstance(e, LogLine)] == ["a", "b", "c", "d", "no timestamp here", "e"]
    drops = [e for e in events if isinstance(e, StreamDropped)]
    assert [(d.reason, d.retry_in, d.attempt) for d in drops] == [
        ("fake: stream lost: reset", 0.5, 1),
        ("stream ended (the log's command exited)", 1, 2),
    ]
    assert slept == [0.5, 1]
    assert sum(isinstance(e, Reattached) for e in events) == 1
    assert t.calls[0] == "docker logs --tail 50 -f -t vllm"
    assert t.calls[1] == t.calls[2] == f"docker logs --tail all -f -t --since {ts[2]} vllm"


async def test_no_lines_yet_reattaches_with_the_same_tail_and_journalctl_with_tail_0() -> None:
    async def no_sleep(s: float) -> None:
        return None

    t = ScriptedTransport([([], TransportError("down")), (["x"], TransportError("down")), (["y"], None)])
    f = LogFollower(t, journal_follow("ollama"), tail=20, sleep=no_sleep, settle_s=5)
    got = []
    async for ev in f:
        if isinstance(ev, LogLine):
            got.append(ev.text)
            if ev.text == "y":
                break
    await f.aclose()
    assert got == ["x", "y"]
    assert t.calls == [
        "journalctl -f -n 20 -u ollama --no-pager",
        "journalctl -f -n 20 -u ollama --no-pager",  # nothing seen yet: the same tail
        "journalctl -f -n 0 -u ollama --no-pager",  # no timestamps: only new lines
    ]


async def test_quiet_stream_reports_reattached_after_settling() -> None:
    async def no_sleep(s: float) -> None:
        return None

    t = ScriptedTransport([(["2026-01-01T00:00:00.000000001Z a"], TransportError("x")), ([], None)])
    f = LogFollower(t, docker_follow("c"), sleep=no_sleep, settle_s=0.05)
    kinds = []
    async for ev in f:
        kinds.append(type(ev).__name__)
        if isinstance(ev, Reattached):
            assert ev.since == "2026-01-01T00:00:00.000000001Z"
            break
    await f.aclose()
    assert kinds == ["LogLine", "StreamDropped", "Reattached"]


def test_timestamps_and_merge_lines() -> None:
    assert split_timestamp("2026-03-18T06:54:54.123456789Z hello world") == (
        "2026-03-18T06:54:54.123456789Z", "hello world")
    assert split_timestamp("2026-03-18T06:54:54.1Z") == ("2026-03-18T06:54:54.1Z", "")
    assert split_timestamp("INFO 03-18 06:54:54 x") == (None, "INFO 03-18 06:54:54 x")
    assert timestamp_key("2026-03-18T06:54:54.5Z") == timestamp_key("2026-03-18T07:54:54.500000000+01:00")
    assert timestamp_key("nope") is None
    head = [LogLine("h1", "head", timestamp="2026-01-01T00:00:01.000000000Z"),
            LogLine("h2", "head", timestamp="2026-01-01T00:00:03.000000000Z"),
            LogLine("h2b", "head")]
    work = [LogLine("w1", "worker", timestamp="2026-01-01T00:00:02.000000000Z"),
            LogLine("w2", "worker", timestamp="2026-01-01T00:00:04.000000000Z")]
    assert [ln.text for ln in merge_lines(head, work)] == ["h1", "w1", "h2", "h2b", "w2"]


# ---- the buffer ---------------------------------------------------------------------------


def test_buffer_search_filter_errors_markers_with_real_lines() -> None:
    buf = LogBuffer(max_lines=1000)
    for name in ("02-dgx-spark-nemotron-hybrid-nv2601-ready.log", "13-v1-cuda-oom-creating-weights.log"):
        buf.extend((REAL / "vllm-logs" / name).read_text().splitlines())
    n = len(buf)
    first = buf.find_next("safetensors checkpoint shards")
    assert first is not None and "0/2" in buf[first].text
    second = buf.find_next("safetensors checkpoint shards", first)
    assert second is not None and second > first and "1/2" in buf[second].text
    back = buf.find_next("SAFETENSORS checkpoint", second, backwards=True)
    assert back == first
    # wraps around
    last = buf.matches("safetensors checkpoint shards")[-1]
    assert buf.find_next("safetensors checkpoint shards", last) == first
    assert buf.find_next("no such text anywhere", 0) is None
    # filter mode: only matching lines (markers stay visible)
    buf.add_marker("before OOM")
    only = buf.filtered("KV cache")
    assert only and all("kv cache" in ln.text.lower() or ln.kind == "marker" for ln in only)
    assert only[-1].kind == "marker" and "mark 1" in only[-1].text and "before OOM" in only[-1].text
    # next error: the OOM log's error lines, never the healthy log's INFO lines
    e = buf.next_error(-1)
    assert e is not None
    err = buf[e].text
    assert any(k in err for k in ("ERROR", "Traceback", "CUDA out of memory", "Error"))
    oom = buf.find_next("CUDA out of memory")
    assert oom is not None and buf.next_error(oom - 1) == oom
    assert buf.next_error(len(buf) - 1, wrap=False) is None
    assert len(buf) == n + 1


def test_buffer_is_bounded_and_display_is_clean() -> None:
    buf = LogBuffer(max_lines=5)
    buf.extend(f"line {i}" for i in range(12))
    assert [ln.text for ln in buf.lines] == [f"line {i}" for i in range(7, 12)]
    assert buf.dropped == 7
    assert display_text("\x1b[32mINFO\x1b[0m x") == "INFO x"
    assert display_text("bar 1/2\rbar 2/2\r") == "bar 2/2"
    assert display_text("a\tb") == "a   b"
    with pytest.raises(ValueError):
        LogBuffer(0)
