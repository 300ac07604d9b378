"""SVG snapshots of the main screens on the demo cluster (pytest-textual-snapshot).

Every snapshot is reproducible: the sim runs on a manual clock, the console on a frozen wall
clock, the tests drive every poll, and the one measured duration on screen (probe time) is
pinned. Update on purpose with ``./scripts/test tests/test_ui_snapshots.py --snapshot-update``
and read the SVGs before committing them.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from sparkconsole.probe import poller
from tests.ui_support import demo_app, poll_ticks, run_actions, started, wait_ready

SIZE = (160, 48)


@pytest.fixture(autouse=True)
def _deterministic(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(poller, "_with_probe_ms", lambda sample, ms: replace(sample, probe_ms=12.0))
    monkeypatch.setenv("TZ", "UTC")  # event times are local times
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_all_up(snap_compare, tmp_path):
    app = demo_app(tmp_path)

    async def run_before(pilot):
        await started(pilot, app, ticks=12)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_node_stale(snap_compare, tmp_path):
    app = demo_app(tmp_path, scenario="node-lost")

    async def run_before(pilot):
        await wait_ready(pilot, app)
        for p in app.poller.pollers.values():
            p.tick_timeout = 0.5
        await poll_ticks(pilot, app, ticks=8)
        app.demo.sim_clock.advance(30)  # the worker stops answering
        await poll_ticks(pilot, app, ticks=1)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_node_down(snap_compare, tmp_path):
    app = demo_app(tmp_path, scenario="node-lost")

    async def run_before(pilot):
        await wait_ready(pilot, app)
        for p in app.poller.pollers.values():
            p.tick_timeout = 0.5
        await poll_ticks(pilot, app, ticks=8)
        app.demo.sim_clock.advance(30)
        await poll_ticks(pilot, app, ticks=3)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_link_down(snap_compare, tmp_path):
    app = demo_app(tmp_path, scenario="link-down")

    async def run_before(pilot):
        await started(pilot, app, ticks=8)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_node_detail(snap_compare, tmp_path):
    app = demo_app(tmp_path)

    async def run_before(pilot):
        await started(pilot, app, ticks=8)
        await pilot.press("1")
        await app.workers.wait_for_complete()  # the configured units are read on open
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_help(snap_compare, tmp_path):
    app = demo_app(tmp_path)

    async def run_before(pilot):
        await started(pilot, app, ticks=4)
        await pilot.press("question_mark")
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_weights_40_percent_loaded(snap_compare, tmp_path):
    """GLM restarted from the keyboard; its log followed until 40% of the shards are in."""
    app = demo_app(tmp_path)

    async def run_before(pilot):
        await started(pilot, app, ticks=4)
        await pilot.press("1")
        await pilot.pause()
        table = app.screen.query_one("#containers-table")
        for row in range(table.row_count):
            if table.get_row_at(row)[0] == "vllm-glm":
                table.move_cursor(row=row)
        await pilot.press("R")
        await pilot.pause()
        await pilot.press("y")
        await run_actions(pilot, app)
        app.clear_notifications()
        await pilot.press("l")
        await pilot.pause(0.3)
        screen = app.screen
        for _ in range(600):
            report = screen.tracker.report
            if report.shards_total and report.shards_done is not None and report.shards_done / report.shards_total >= 0.4:
                break
            app.demo.sim_clock.advance(0.25)
            await pilot.pause(0.01)
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
