"""Pilot tests of the confirmation modal and the log screen (fed by a fake follower built from
real vLLM log lines), and one snapshot of the modal."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from textual.widgets import Button, Log, ProgressBar, Static

from sparkconsole.logs.follow import LogLine, Reattached, StreamDropped
from sparkconsole.remote import docker_action, systemctl_action
from sparkconsole.ui.screens.confirm import ConfirmScreen
from sparkconsole.ui.screens.logs import LogScreen, report_lines
from tests.conftest import REAL, strip_fixture_header
from tests.ui_support import Host

VLLM_02 = REAL / "vllm-logs" / "02-dgx-spark-nemotron-hybrid-nv2601-ready.log"
VLLM_OOM = REAL / "vllm-logs" / "13-v1-cuda-oom-creating-weights.log"


def real_lines(path) -> list[str]:
    return strip_fixture_header(path.read_text()).splitlines()




class FakeFollower:
    """What a LogFollower yields, fed by the test."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()
        self.closed = False

    def __aiter__(self):
        return self

    async def __anext__(self):
        event = await self.queue.get()
        if event is None:
            raise StopAsyncIteration
        return event

    async def aclose(self) -> None:
        self.closed = True

    def lines(self, texts) -> None:
        for t in texts:
            self.queue.put_nowait(LogLine(t, received_at=time.monotonic()))

    def event(self, ev) -> None:
        self.queue.put_nowait(ev)


async def until(pilot, cond, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await pilot.pause(0.02)


# ---- confirmation ---------------------------------------------------------------------------


def _confirm() -> ConfirmScreen:
    return ConfirmScreen("spark-01", "vllm-qwen", docker_action("stop", "vllm-qwen"))


async def test_confirm_y_is_true_and_names_node_service_command() -> None:
    app = Host(_confirm)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = app.screen
        assert isinstance(screen, ConfirmScreen)
        text = " ".join(str(w.render()) for w in screen.query(Static))
        assert "spark-01" in text and "vllm-qwen" in text and "docker stop vllm-qwen" in text
        assert screen.focused is not None and screen.focused.id == "no"  # default focus on No
        await pilot.press("y")
        await pilot.pause()
    assert app.results == [True]


async def test_confirm_n_escape_enter_mean_no() -> None:
    for keys in (["n"], ["escape"], ["enter"]):  # Enter presses the focused "No"
        app = Host(_confirm)
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.press(*keys)
            await pilot.pause()
        assert app.results == [False], keys


async def test_confirm_buttons() -> None:
    app = Host(lambda: ConfirmScreen("spark-02", "ollama", systemctl_action("restart", "ollama")))
    async with app.run_test(size=(100, 30)) as pilot:
        assert "restart" in str(app.screen.query_one("#yes", Button).label).lower()
        await pilot.click("#yes")
        await pilot.pause()
    assert app.results == [True]
    app = Host(_confirm)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("left")  # focus moves to Yes; Enter then confirms
        assert app.screen.focused.id == "yes"
        await pilot.press("enter")
        await pilot.pause()
    assert app.results == [True]


def test_confirm_snapshot(snap_compare) -> None:
    assert snap_compare(Host(_confirm), terminal_size=(100, 30))


# ---- log screen ---------------------------------------------------------------------------


def _log_app(fake: FakeFollower, **kw) -> Host:
    return Host(lambda: LogScreen("spark-01", "vllm-nemotron", lambda: fake, **kw))


async def test_follow_pause_badge_and_end() -> None:
    fake = FakeFollower()
    app = _log_app(fake)
    async with app.run_test(size=(100, 30)) as pilot:
        screen: LogScreen = app.screen  # type: ignore[assignment]
        fake.lines(f"line {i}" for i in range(80))
        await until(pilot, lambda: len(screen.buffer) == 80)
        log = screen.query_one(Log)
        assert screen.following and log.scroll_y == log.max_scroll_y > 0
        assert screen.badge_text == ""
        await pilot.press("pageup")  # scrolling up pauses following
        await pilot.pause()
        assert not screen.following
        top = log.scroll_y
        fake.lines(f"new {i}" for i in range(7))
        await until(pilot, lambda: len(screen.buffer) == 87)
        assert log.scroll_y == top  # the view stays where the user put it
        assert screen.badge_text.startswith("▼ 7 new lines")
        assert "paused" in screen.status_text
        await pilot.press("end")
        await pilot.pause()
        assert screen.following and log.scroll_y == log.max_scroll_y
        assert screen.badge_text == "" and "following" in screen.status_text
        fake.lines(["after end"])
        await until(pilot, lambda: len(screen.buffer) == 88)
        await pilot.pause()
        assert log.scroll_y == log.max_scroll_y and log.lines[-1] == "after end"


async def test_search_next_prev_filter_error_marker() -> None:
    fake = FakeFollower()
    app = _log_app(fake)
    lines = real_lines(VLLM_02) + real_lines(VLLM_OOM)
    async with app.run_test(size=(100, 30)) as pilot:
        screen: LogScreen = app.screen  # type: ignore[assignment]
        fake.lines(lines)
        await until(pilot, lambda: len(screen.buffer) == len(lines))
        log = screen.query_one(Log)
        await pilot.press("home")
        await pilot.press("slash")
        await pilot.press(*"checkpoint shards")
        await pilot.press("enter")
        await pilot.pause()
        first = screen.cursor
        assert first is not None and "0/2" in screen.buffer[first].text
        assert first - 2 <= log.scroll_y <= first  # the match is in view
        await pilot.press("n")
        assert "1/2" in screen.buffer[screen.cursor].text
        await pilot.press("n")
        assert "2/2" in screen.buffer[screen.cursor].text
        await pilot.press("N")
        assert "1/2" in screen.buffer[screen.cursor].text
        # filter: only matching lines
        await pilot.press("f")
        await pilot.pause()
        assert screen.filter_on and 3 <= len(log.lines) <= 5
        assert all("checkpoint shards" in ln for ln in log.lines)
        assert "filter: 'checkpoint shards'" in screen.status_text
        fake.lines(["Loading safetensors checkpoint shards: 100% Completed | 9/9", "unrelated"])
        await until(pilot, lambda: len(screen.buffer) == len(lines) + 2)
        assert log.lines[-1].endswith("9/9")
        await pilot.press("f")
        await pilot.pause()
        assert not screen.filter_on and len(log.lines) == len(lines) + 2
        # e: next error
        await pilot.press("home")
        screen.cursor = None
        await pilot.press("e")
        err = screen.buffer[screen.cursor].text
        assert any(k in err for k in ("ERROR", "Traceback", "CUDA out of memory", "Error"))
        oom_start = len(real_lines(VLLM_02))
        assert screen.cursor >= oom_start - 5  # the healthy log has no error lines before it... mostly
        # m: marker
        await pilot.press("end")
        await pilot.press("m")
        await pilot.pause()
        assert log.lines[-1].startswith("──── mark 1")
        assert screen.buffer[len(screen.buffer) - 1].kind == "marker"


async def test_filter_without_pattern_asks_for_one() -> None:
    fake = FakeFollower()
    app = _log_app(fake)
    async with app.run_test(size=(100, 30)) as pilot:
        screen: LogScreen = app.screen  # type: ignore[assignment]
        fake.lines(["INFO one", "WARNING two", "INFO three"])
        await until(pilot, lambda: len(screen.buffer) == 3)
        await pilot.press("f")
        await pilot.press(*"info", "enter")
        await pilot.pause()
        assert screen.filter_on and list(screen.query_one(Log).lines) == ["INFO one", "INFO three"]
        await pilot.press("escape")  # closes the screen (the search box is already closed)
        await pilot.pause()
    assert app.results == [None]


async def test_banner_on_drop_and_reattach() -> None:
    fake = FakeFollower()
    app = _log_app(fake)
    async with app.run_test(size=(100, 30)) as pilot:
        screen: LogScreen = app.screen  # type: ignore[assignment]
        fake.lines(["a"])
        fake.event(StreamDropped(reason="spark-01: stream lost: connection reset", retry_in=2))
        await until(pilot, lambda: screen.drops == 1)
        assert "stream lost — re-attaching in 2s" in screen.banner_text
        assert "connection reset" in screen.banner_text
        assert "stream lost" in screen.status_text
        fake.event(Reattached())
        await until(pilot, lambda: "re-attached" in screen.banner_text)
        assert "live" in screen.status_text


async def test_vllm_panel_progress_and_ready_from_real_lines() -> None:
    fake = FakeFollower()
    app = _log_app(fake)
    lines = real_lines(VLLM_02)
    one_of_two = next(i for i, ln in enumerate(lines) if "1/2" in ln and "checkpoint shards" in ln)
    async with app.run_test(size=(100, 40)) as pilot:
        screen: LogScreen = app.screen  # type: ignore[assignment]
        panel = screen.query_one("#vllm-panel")
        assert not panel.has_class("-seen")
        fake.lines(lines[: one_of_two + 1])
        await until(pilot, lambda: len(screen.buffer) == one_of_two + 1)
        await pilot.pause()
        bar = screen.query_one("#vllm-progress", ProgressBar)
        assert panel.has_class("-seen")
        assert (bar.total, bar.progress) == (2, 1)
        assert "LOADING" in str(screen.query_one("#vllm-head", Static).render())
        shards = str(screen.query_one("#vllm-shards", Static).render())
        assert "weights 1/2 shards" in shards and "ETA" in shards
        fake.lines(lines[one_of_two + 1:])
        await until(pilot, lambda: len(screen.buffer) == len(lines))
        await pilot.pause()
        assert (bar.total, bar.progress) == (2, 2)
        assert panel.has_class("-ready")
        facts = str(screen.query_one("#vllm-facts", Static).render())
        assert "KV cache 11.15 GiB" in facts and "208,320 tokens" in facts
        assert "ready" in str(screen.query_one("#vllm-ready", Static).render())


async def test_vllm_panel_failure_with_advice() -> None:
    fake = FakeFollower()
    app = _log_app(fake)
    async with app.run_test(size=(100, 40)) as pilot:
        screen: LogScreen = app.screen  # type: ignore[assignment]
        lines = real_lines(VLLM_OOM)
        fake.lines(lines)
        await until(pilot, lambda: len(screen.buffer) == len(lines))
        await pilot.pause()
        panel = screen.query_one("#vllm-panel")
        assert panel.has_class("-failed")
        failure = str(screen.query_one("#vllm-failure", Static).render())
        assert "failed (oom)" in failure
        report = screen.tracker.report
        texts = report_lines(report)
        assert texts.get("advice") and "gpu-memory-utilization" in texts["advice"]


async def test_closing_the_screen_cancels_the_follower() -> None:
    fake = FakeFollower()
    app = _log_app(fake)
    async with app.run_test(size=(100, 30)) as pilot:
        screen: LogScreen = app.screen  # type: ignore[assignment]
        fake.lines(["x"])
        await until(pilot, lambda: len(screen.buffer) == 1)
        worker = screen.follow_worker
        await pilot.press("escape")
        await until(pilot, lambda: fake.closed)
        assert worker.is_cancelled or worker.is_finished
        assert app.results == [None]


async def test_bindings_have_ids_and_tooltips() -> None:
    for cls in (LogScreen, ConfirmScreen):
        for b in cls.BINDINGS:
            assert b.id and b.tooltip, (cls.__name__, b)


# ---- end to end: a real container's vLLM log through SSH into the screen ----------------------


@pytest.mark.docker
@pytest.mark.sshd
async def test_log_screen_follows_a_real_container_through_ssh(sshd, tmp_path) -> None:
    from sparkconsole.logs.follow import LogFollower, docker_follow
    from sparkconsole.transport.ssh import SshTransport
    from tests.lab.docker import docker_lab_fixture

    labs = docker_lab_fixture(tmp_path)
    lab = next(labs)
    transport = SshTransport(sshd.node_config("spark-01"))
    try:
        name = lab.vllm("vllm-ui", interval=0.01)
        app = Host(lambda: LogScreen("spark-01", name, lambda: LogFollower(transport, docker_follow(name))))
        async with app.run_test(size=(100, 30)) as pilot:
            screen: LogScreen = app.screen  # type: ignore[assignment]
            await until(pilot, lambda: screen.tracker.report.state == "ready", timeout=10)
            await pilot.pause(0.05)
            bar = screen.query_one("#vllm-progress", ProgressBar)
            assert (bar.total, bar.progress) == (2, 2)
            assert "Application startup complete" in "\n".join(screen.query_one(Log).lines)
            assert "live" in screen.status_text
    finally:
        await transport.close()
        with contextlib.suppress(StopIteration):
            next(labs)


def test_the_load_and_kv_lines_say_only_what_is_known() -> None:
    from sparkconsole.logs.vllm import VllmLogReport

    facts = report_lines(VllmLogReport(state="starting", load_seconds=10.7))["facts"]
    assert "?" not in facts and facts == "weights loaded in 10.7 s"
    facts = report_lines(VllmLogReport(state="starting", model_load_gib=61.5, load_seconds=10.7))["facts"]
    assert facts == "loaded 61.50 GiB in 10.7 s"
    facts = report_lines(VllmLogReport(state="starting", kv_cache_tokens=120_000))["facts"]
    assert "?" not in facts and facts == "KV cache 120,000 tokens"


async def test_following_keeps_the_last_line_in_view_when_the_vllm_panel_grows() -> None:
    fake = FakeFollower()
    app = _log_app(fake)
    async with app.run_test(size=(100, 30)) as pilot:
        screen: LogScreen = app.screen  # type: ignore[assignment]
        log = screen.query_one("#log", Log)
        fake.lines([f"plain line {i}" for i in range(80)])
        await until(pilot, lambda: len(screen.buffer) == 80)
        await until(pilot, lambda: log.max_scroll_y > 0 and log.scroll_y == log.max_scroll_y)
        height_before = log.size.height
        lines = real_lines(VLLM_02)
        fake.lines(lines)  # the panel appears and grows above the log as the engine starts
        await until(pilot, lambda: len(screen.buffer) == 80 + len(lines))
        panel = screen.query_one("#vllm-panel")
        await until(pilot, lambda: panel.has_class("-seen") and log.size.height < height_before)
        await pilot.pause()
        assert screen.following and "following" in screen.status_text
        assert log.scroll_y == log.max_scroll_y  # the newest line is on screen
        assert log.scroll_y + log.scrollable_content_region.height >= len(screen.buffer)


async def test_a_new_line_under_a_filter_does_not_rescan_the_buffer() -> None:
    fake = FakeFollower()
    app = _log_app(fake, tracker=None)
    async with app.run_test(size=(100, 30)) as pilot:
        screen: LogScreen = app.screen  # type: ignore[assignment]
        fake.lines([f"{'ERROR' if i % 3 == 0 else 'info'} line {i}" for i in range(300)])
        await until(pilot, lambda: len(screen.buffer) == 300)
        screen.set_pattern("error")
        screen.action_toggle_filter()
        await pilot.pause()
        assert "(100)" in screen.status_text
        scans = []
        real_matches = screen.buffer.matches
        screen.buffer.matches = lambda pattern: scans.append(pattern) or real_matches(pattern)  # type: ignore[method-assign]
        screen.action_marker()
        fake.lines(["ERROR one more", "info not shown"])
        await until(pilot, lambda: len(screen.buffer) == 303)
        await pilot.pause()
        assert scans == []
        assert "(101)" in screen.status_text  # the count kept line by line, markers not counted
        assert screen.query_one("#log", Log).line_count == 102


async def test_a_flood_of_lines_is_drawn_in_batches_and_keys_still_answer() -> None:
    """50,000 lines already waiting (a log at thousands of lines a second): the view is written a
    batch at a time, not a line at a time, and a key pressed meanwhile is handled before the flood
    has been read (the reader yields to the event loop). Lines the view could not take in time are
    dropped and counted, never lost without a word: every line is drawn or counted."""
    fake = FakeFollower()
    app = _log_app(fake)
    async with app.run_test(size=(100, 30)) as pilot:
        screen: LogScreen = app.screen  # type: ignore[assignment]
        log = screen.log_view
        writes = []
        original = log.write_lines

        def counting(lines, scroll_end=None):
            writes.append(len(list(lines)) if not isinstance(lines, list) else len(lines))
            return original(lines, scroll_end=scroll_end)

        log.write_lines = counting  # type: ignore[method-assign]
        buffer = screen.buffer

        def accounted() -> int:  # log lines drawn (pushed out since or not) and lines dropped
            return buffer.dropped + len(buffer) - buffer.markers - buffer.gaps + screen.lines_dropped

        marked_at: list[int] = []
        mark = screen.action_marker

        def marking() -> None:
            marked_at.append(accounted())
            mark()

        screen.action_marker = marking  # type: ignore[method-assign]
        flood = 50_000
        fake.lines(f"line {i}" for i in range(flood))
        await pilot.press("m")  # a marker: the key lands among the lines
        await until(pilot, lambda: accounted() == flood, timeout=60)
        assert buffer.markers == 1 and len(marked_at) == 1
        assert marked_at[0] < flood  # handled while lines were still coming
        gaps = [ln for ln in buffer.lines if ln.kind == "gap"]
        assert sum(int(g.text.split()[2].replace(",", "")) for g in gaps) <= screen.lines_dropped
        assert sum(writes) <= screen.max_lines * len(writes) and len(writes) < flood / 100


async def test_calibration_reads_only_a_vllm_log() -> None:
    """`c` opens the planner's calibration from vLLM's memory figures: an SGLang log has none, so it says
    so in one line and opens nothing."""
    from sparkconsole.serving.engines import SGLANG

    fake = FakeFollower()
    app = Host(lambda: LogScreen("spark-01", "sglang-qwen", lambda: fake, tracker=SGLANG.log_tracker))
    async with app.run_test(size=(100, 30)) as pilot:
        screen = app.screen
        assert isinstance(screen, LogScreen) and screen.tracker is not None
        await pilot.press("c")
        await pilot.pause()
        assert app.screen is screen  # no calibration screen
        said = [n.message for n in app._notifications]
        assert any("calibration reads vLLM's memory figures" in m and SGLANG.label in m for m in said), said
