"""What the log view keeps is bounded, and reading a log costs time in proportion to its length.

A plain-text log (every line long, none with a log level) parses in linear work; the start of a
container's log is read with a byte bound as well as a line bound, through a real shell; a
follower under a producer faster than its reader holds a bounded queue and says how many lines it
dropped; a log file replaced by a longer one is read from the new file's start; only an engine's
log goes through the vLLM reader.
"""

from __future__ import annotations

import asyncio
import os
import random
import stat
import time
from pathlib import Path

import pytest

from sparkconsole.deploy.steps.serve import FileLogFollow
from sparkconsole.logs import vllm
from sparkconsole.logs.follow import (
    MAX_LINE_CHARS,
    LinesDropped,
    LogFollower,
    LogLine,
    StreamDropped,
    cap_line,
    docker_follow,
    merge_by_time,
)
from sparkconsole.logs.vllm import VllmLogTracker, parse_vllm_log
from sparkconsole.remote import LOG_HEAD_BYTES, docker_log_head
from sparkconsole.services import Service
from sparkconsole.transport.local import LocalTransport
from sparkconsole.ui.screens.logs import LogScreen, VllmPanel
from tests.conftest import REAL
from tests.ui_support import Host, demo_app, started


def access_log(n: int, seed: int = 7) -> list[str]:
    """``n`` lines of a web server's access log: long, no log level, no two alike."""
    rng = random.Random(seed)
    return [
        f'10.0.{i % 250}.{rng.randrange(1, 255)} - - [12/Mar/2026:10:{i // 60 % 60:02d}:{i % 60:02d} +0000] '
        f'"GET /api/v1/items/{rng.randrange(10**6)}?page={i} HTTP/1.1" {rng.choice((200, 304, 404))} '
        f'{rng.randrange(100, 50_000)} "-" "Mozilla/5.0 (X11; Linux x86_64; rv:{rng.randrange(90, 140)}.0)"'
        for i in range(n)
    ]


# ---- the vLLM reader is linear ------------------------------------------------------------


def test_a_plain_text_log_of_100k_lines_costs_the_rules_linear_work(monkeypatch) -> None:
    """Every text the rules run on is counted: its total stays within a fixed multiple of the
    input (a hard-wrapped record joins at most ``_MAX_JOIN_LINES`` lines), and no single text is
    longer than the join bound. Unbounded joining re-reads a growing text for every line: the
    count passes the bound within the first few thousand lines, and the test stops there."""
    lines = access_log(100_000)
    size = sum(len(line) for line in lines)
    bound = (1 + vllm._MAX_JOIN_LINES) * size
    seen = {"chars": 0, "longest": 0, "calls": 0}
    handle = VllmLogTracker._handle

    def counting(self, msg, **kw):
        seen["chars"] += len(msg)
        seen["calls"] += 1
        seen["longest"] = max(seen["longest"], len(msg))
        if seen["chars"] > bound:
            raise AssertionError(f"rules ran on {seen['chars']} characters of a {size}-character log")
        return handle(self, msg, **kw)

    monkeypatch.setattr(VllmLogTracker, "_handle", counting)
    report = parse_vllm_log("\n".join(lines) + "\n")
    assert report.state == "unknown" and report.lines == len(lines)
    assert seen["chars"] <= bound
    assert seen["longest"] <= vllm._MAX_JOIN_CHARS
    assert seen["calls"] <= 2 * len(lines)  # each line once, and at most once more joined


def test_the_screens_read_the_same_reports_as_the_rules_alone(monkeypatch) -> None:
    """The cheap word screens in front of the rules only skip work: with every screen off (each
    goes through ``_holds``), every real vLLM log gives the same report."""
    logs = sorted((REAL / "vllm-logs").glob("*.log"))
    assert len(logs) >= 5
    texts = [p.read_text(errors="replace") for p in logs]
    screened = [parse_vllm_log(t).to_dict() for t in texts]
    monkeypatch.setattr(vllm, "_holds", lambda text, words: True)
    unscreened = [parse_vllm_log(t).to_dict() for t in texts]
    for path, a, b in zip(logs, screened, unscreened, strict=True):
        assert a == b, path.name
    assert {r["state"] for r in screened} >= {"ready", "failed"}


def test_a_hard_wrap_still_joins_within_the_bound() -> None:
    """The bound keeps what the join is for: a long record wrapped over a few lines."""
    head = "INFO 03-06 08:41:00 [api_server.py:1428] Starting vLLM API server 0 on http://0.0.0.0:80"
    report = parse_vllm_log(head + "\n00\n")
    assert report.port == 8000
    # beyond the line bound a bare line starts anew instead of growing one text without end
    tracker = VllmLogTracker()
    for line in access_log(3 * vllm._MAX_JOIN_LINES):
        tracker.feed(line)
        assert tracker._join_lines <= vllm._MAX_JOIN_LINES


# ---- the start of a container's log is bounded in bytes -----------------------------------


@pytest.fixture
def endless_docker(tmp_path: Path, monkeypatch) -> Path:
    """A ``docker`` on PATH whose ``logs`` prints a few lines, then one line that never ends (its
    ``inspect`` answers the container's start time, as docker's does)."""
    script = tmp_path / "bin" / "docker"
    script.parent.mkdir()
    script.write_text('#!/bin/sh\nif [ "$1" = inspect ]; then echo 2026-12-07T10:00:00.000000000Z; exit 0; fi\n'
                      'printf "first line\\nsecond line\\n"\nyes x | tr -d "\\n"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    return script


async def test_a_log_whose_line_never_ends_is_read_to_the_byte_bound(endless_docker: Path) -> None:
    """``docker logs | head -n`` alone waits for a newline that never comes and keeps what it
    reads; the read ends at its byte bound by itself, the lines before the endless one kept."""
    t = LocalTransport("local")
    res = await t.run(docker_log_head("vllm-x", max_bytes=65_536), timeout=60)
    assert not res.truncated and res.exit_status == 0, res
    assert len(res.stdout.encode()) <= 65_536
    assert res.stdout.startswith("first line\nsecond line\nxxx")
    res = await t.run(docker_log_head("vllm-x"), timeout=60)  # the default bound, below run's own
    assert not res.truncated and res.exit_status == 0
    assert len(res.stdout.encode()) <= LOG_HEAD_BYTES


async def test_the_screen_keeps_the_start_of_the_log_cut_to_line_bounds() -> None:
    """Whatever the reader returns, each line of the start is cut before it is kept or read."""
    text = "first line\n" + "y" * (5 * MAX_LINE_CHARS) + "\nlast line\n"

    async def reader() -> str:
        return text

    screen = LogScreen("spark-01", "vllm-x", lambda: _Quiet(), start_reader=reader)
    app = Host(lambda: screen)
    async with app.run_test(size=(100, 30)) as pilot:
        await _until(pilot, lambda: screen._start_text is not None and screen._held is None)
        kept = screen._start_text.split("\n")
        assert kept[0] == "first line" and kept[-1] == "last line"
        assert max(len(line) for line in kept) == MAX_LINE_CHARS
        assert screen.tracker is not None and screen.tracker._line_no == 3


def test_a_long_progress_line_keeps_its_start_and_newest_update() -> None:
    bar = "2026-03-18T06:54:54.1Z " + "\r".join(f"Loading: {p}%|" + "#" * 200 for p in range(0, 101))
    cut = cap_line(bar, 4096)
    assert len(cut) <= 4096
    assert cut.startswith("2026-03-18T06:54:54.1Z Loading: 0%") and cut.endswith("Loading: 100%|" + "#" * 200)
    assert cap_line("z" * 10_000, 4096) == "z" * 4096


# ---- a follower under a fast producer -----------------------------------------------------


class FloodTransport:
    """``stream`` yields ``total`` lines as fast as it can (a turn of the loop per ``burst``), then
    ends; it notes the follower's queue each turn."""

    node = "flood"

    def __init__(self, total: int, burst: int = 2_000) -> None:
        self.total = total
        self.burst = burst
        self.follower: LogFollower | None = None
        self.queued: list[int] = []

    async def stream(self, cmd):
        for i in range(self.total):
            if i % self.burst == 0:
                if self.follower is not None:
                    self.queued.append(self.follower.queued)
                await asyncio.sleep(0)
            yield f"line {i}"


async def test_a_follower_under_a_fast_producer_holds_a_bounded_queue_and_counts_drops() -> None:
    total, cap = 200_000, 1_000
    t = FloodTransport(total)
    f = LogFollower(t, docker_follow("web"), max_queued=cap, max_drops=1)
    t.follower = f
    texts: list[str] = []
    dropped = 0
    async for event in f:
        if isinstance(event, LogLine):
            texts.append(event.text)
        elif isinstance(event, LinesDropped):
            dropped += event.count
        else:
            assert isinstance(event, StreamDropped)
        await asyncio.sleep(0)  # a reader slower than the stream: one event a turn
    assert dropped > 0 and dropped == f.lines_dropped
    assert len(texts) + dropped == total  # every line is given or counted
    numbers = [int(t.split()[1]) for t in texts]
    assert numbers == sorted(numbers) and numbers[-1] == total - 1  # in order, the newest kept
    assert max(t.queued) <= cap + 1  # the lines, and at most the stream's end


async def test_a_follower_cuts_a_line_that_never_ends() -> None:
    class OneLongLine:
        node = "x"

        async def stream(self, cmd):
            yield "2026-03-18T06:54:54.000000001Z " + "z" * (10 * MAX_LINE_CHARS)

    f = LogFollower(OneLongLine(), docker_follow("web"), max_drops=1)
    lines = [e async for e in f if isinstance(e, LogLine)]
    assert len(lines) == 1 and lines[0].timestamp == "2026-03-18T06:54:54.000000001Z"
    assert len(lines[0].text) < MAX_LINE_CHARS


async def test_the_merged_view_of_fast_followers_stays_bounded_and_counts_drops() -> None:
    async def fast(source: str, n: int):
        for i in range(n):
            if i % 2_000 == 0:
                await asyncio.sleep(0)
            yield LogLine(f"{source} {i}", source=source)

    total = 2 * 60_000
    got = dropped = 0
    async for event in merge_by_time([fast("a", total // 2), fast("b", total // 2)], window=0.0, max_queued=500):
        if isinstance(event, LogLine):
            got += 1
        elif isinstance(event, LinesDropped):
            dropped += event.count
        await asyncio.sleep(0)
    assert dropped > 0 and got + dropped == total


# ---- the log view says what it dropped ----------------------------------------------------


class _Quiet:
    """A follower that yields what the test puts in, then waits."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()

    def __aiter__(self):
        return self

    async def __anext__(self):
        return await self.queue.get()


async def _until(pilot, cond, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not met in time"
        await pilot.pause(0.02)


async def test_the_view_shows_where_lines_were_dropped_and_how_many() -> None:
    fake = _Quiet()
    screen = LogScreen("spark-01", "web", lambda: fake, tracker=None)
    app = Host(lambda: screen)
    async with app.run_test(size=(120, 30)) as pilot:
        for event in (LogLine("before"), LinesDropped(12_345), LogLine("after")):
            fake.queue.put_nowait(event)
        await _until(pilot, lambda: len(screen.buffer) == 3)
        texts = [ln.text for ln in screen.buffer.lines]
        assert texts[0] == "before" and texts[2] == "after"
        assert "12,345 lines dropped (log faster than the view)" in texts[1]
        assert screen.buffer.lines[1].kind == "gap"
        assert "12,345 dropped" in screen.status_text
        screen.set_pattern("after")
        screen.action_toggle_filter()
        await pilot.pause()
        assert [screen.log_view.line_at(r).kind for r in range(screen.log_view.line_count)] == ["gap", "line"]


async def test_a_flood_past_the_view_is_dropped_before_drawing_and_counted() -> None:
    """The screen's own batch is bounded too: lines read faster than the view draws them."""
    fake = _Quiet()
    screen = LogScreen("spark-01", "web", lambda: fake, tracker=None, max_lines=200)
    app = Host(lambda: screen)
    async with app.run_test(size=(120, 30)) as pilot:
        for i in range(5_000):
            screen._queue(LogLine(f"line {i}"))
        assert screen._pending_lines == 199  # and the line that says how many were dropped
        screen._flush_pending()
        await pilot.pause()
        assert screen.lines_dropped == 4_801 and len(screen.buffer) == 200
        assert screen.buffer.lines[0].kind == "gap" and screen.buffer.lines[-1].text == "line 4999"


async def test_the_start_of_a_long_log_is_read_while_the_keys_answer() -> None:
    """The start's lines go through the reader in chunks: the panel is updated (the loop runs)
    between them, not once at the end."""
    lines = access_log(4_000)

    async def reader() -> str:
        return "\n".join(lines) + "\n"

    seen: list[int] = []
    screen = LogScreen("spark-01", "vllm-x", lambda: _Quiet(), start_reader=reader)
    update = screen._update_panel

    def noting() -> None:
        assert screen.tracker is not None
        seen.append(screen.tracker._line_no)
        update()

    screen._update_panel = noting  # type: ignore[method-assign]
    app = Host(lambda: screen)
    async with app.run_test(size=(100, 30)) as pilot:
        await _until(pilot, lambda: bool(seen) and seen[-1] == len(lines) and screen._held is None, timeout=120)
    assert any(0 < n < len(lines) for n in seen), seen


# ---- a replaced log file ------------------------------------------------------------------


async def _read(t: LocalTransport, follow: FileLogFollow) -> list[str]:
    res = await t.run(follow.command())
    assert res.ok, res.stderr
    return follow.feed(res.stdout)


async def test_a_log_file_replaced_by_a_longer_one_is_read_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    log.write_text("old 1\nold 2\nold 3\n")
    t = LocalTransport("local")
    follow = FileLogFollow(str(log))
    got = await _read(t, follow)
    assert got == ["old 1", "old 2", "old 3"]
    fresh = tmp_path / "serve.log.new"
    fresh.write_text("".join(f"new line {i}\n" for i in range(1, 11)))  # longer than the old file
    fresh.replace(log)  # made anew under the same name: another inode
    for _ in range(3):
        got += await _read(t, follow)
    assert got == ["old 1", "old 2", "old 3"] + [f"new line {i}" for i in range(1, 11)]
    with log.open("a") as fh:
        fh.write("new line 11\n")
    assert await _read(t, follow) == ["new line 11"]  # the same file grown: from where it was


# ---- only an engine's log goes through the vLLM reader ------------------------------------


async def test_only_an_engines_log_is_read_by_the_vllm_reader(tmp_path) -> None:
    app = demo_app(tmp_path)
    async with app.run_test(size=(160, 40)) as pilot:
        await started(pilot, app, ticks=1)
        node = next(iter(app.poller.pollers))
        app.open_logs(node, Service(name="web", kind="container", state="running", image="nginx:1.27"))
        await _until(pilot, lambda: isinstance(app.screen, LogScreen) and app.screen.is_mounted)
        web: LogScreen = app.screen  # type: ignore[assignment]
        assert web.tracker is None and web.start_reader is None and not web.query(VllmPanel)
        web.handle_event(LogLine("INFO 03-06 08:41:00 [api_server.py:1] vLLM API server version 0.14.1"))
        assert web.buffer.lines[-1].text.endswith("version 0.14.1")  # shown as it is
        app.pop_screen()
        await pilot.pause()
        engine = next((w.engine for n in app.poller.pollers for w in app.node_state(n).engines.values()), None)
        assert engine is not None and not engine.on_host
        app.open_logs(engine.node, Service(name=engine.where, kind="container", state="running"))
        await _until(pilot, lambda: isinstance(app.screen, LogScreen) and app.screen is not web
                     and app.screen.is_mounted)
        assert app.screen.tracker is not None and app.screen.start_reader is not None
        app.pop_screen()
        app.open_logs(node, Service(name="sglang-x", kind="container", state="running",
                                    image="lmsysorg/sglang:v0.5.4"))
        await _until(pilot, lambda: isinstance(app.screen, LogScreen) and app.screen.log_title == "sglang-x"
                     and app.screen.is_mounted)
        assert app.screen.tracker is not None  # its image names an engine
