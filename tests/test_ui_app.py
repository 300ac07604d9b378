"""The dashboard driven with Pilot on the demo cluster: every key, through the real SSH transport.

The demo runs in the app's own event loop behind real asyncssh servers; the console reaches it
with the same SSH transport, probe and parsers it uses for real Sparks.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from textual.widgets import DataTable, Input

from sparkconsole.journal import read_journal
from sparkconsole.probe.state import NodeStatus
from sparkconsole.services import Debouncer
from sparkconsole.ui.screens.confirm import ConfirmScreen
from sparkconsole.ui.screens.help import HelpScreen
from sparkconsole.ui.screens.logs import LogScreen
from sparkconsole.ui.screens.node_detail import NodeDetailScreen
from sparkconsole.ui.screens.overview import OverviewScreen
from sparkconsole.ui.widgets.node_card import NodeCard
from tests.ui_support import (
    demo_app,
    expect_silence,
    poll_ticks,
    run_actions,
    settle_log,
    started,
    wait_ready,
)

SIZE = (160, 48)


@pytest.fixture(autouse=True)
def _state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))


async def until(pilot, condition, timeout: float = 20.0) -> None:
    """Wait on a condition (never a fixed sleep)."""
    import asyncio

    end = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < end, "condition not met in time"
        await pilot.pause(0.02)


def card_text(app, index: int) -> str:
    return app.screen.query_one(f"#card-{index}", NodeCard).plain_text()


async def test_overview_shows_both_sparks_with_real_numbers(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app)
        assert isinstance(app.screen, OverviewScreen)
        states = app.states()
        assert [s.name for s in states] == ["spark-1a32", "spark-5be3"]
        assert all(s.status is NodeStatus.UP for s in states)
        head = states[0].sample
        assert head.gpus[0].name == "NVIDIA GB10" and head.memory.unified
        assert head.gpus[0].memory_total_mib is None and "gpu.memory" in head.unknown
        text = card_text(app, 1)
        assert "NVIDIA GB10" in text and "Unified memory" in text and "GiB" in text
        # the head's fast-link address as the sim gives it (NVIDIA's earlier netplan: link-local)
        fast = next(lk for lk in head.links if lk.netdev == "enp1s0f1np1").ipv4[0].split("/")[0]
        assert "2/4 twins up" in text and fast.startswith("169.254.") and fast in text
        for name in ("vllm-glm", "embeddings", "reranker"):
            assert name in text
        assert "spark-5be3" in card_text(app, 2)
        # history lives in the data layer: one point per tick
        assert len(states[0].history.values("gpu_util")) == 6


async def test_q_quits_with_exit_code_0(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app, ticks=1)
        await pilot.press("q")
    assert app.return_code == 0


async def test_help_is_contextual_and_closes(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app, ticks=1)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        table = app.screen.table_text()
        assert "overview.open" in table and "app.quit" in table
        assert "detail.stop" not in table  # the detail's keys belong to the detail
        await pilot.press("escape")
        assert isinstance(app.screen, OverviewScreen)
        await pilot.press("1")
        await pilot.press("f1")
        assert "detail.stop" in app.screen.table_text()
        await pilot.press("escape")
        assert isinstance(app.screen, NodeDetailScreen)


async def test_number_keys_enter_click_and_escape(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app, ticks=1)
        await pilot.press("2")
        assert isinstance(app.screen, NodeDetailScreen) and app.screen.node == "spark-5be3"
        await pilot.press("escape")
        assert isinstance(app.screen, OverviewScreen)
        await pilot.press("right")
        assert app.focused.id == "card-2"
        await pilot.press("left")
        assert app.focused.id == "card-1"
        await pilot.press("enter")
        assert isinstance(app.screen, NodeDetailScreen) and app.screen.node == "spark-1a32"
        await pilot.press("escape")
        await pilot.click("#card-2")
        assert isinstance(app.screen, NodeDetailScreen) and app.screen.node == "spark-5be3"
        await pilot.press("9")  # no ninth node: nothing happens
        assert app.screen.node == "spark-5be3"


async def test_refresh_interval_pause_and_refresh_now(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app, ticks=1)
        assert app.interval == 2.0
        await pilot.press("plus")
        assert app.interval == 1.0
        await pilot.press("minus", "minus")
        assert app.interval == 3.0
        assert all(p.interval == 3.0 for p in app.poller.pollers.values())
        await pilot.press("p")
        assert app.paused and "paused" in str(app.status_strip())
        await pilot.press("p")
        assert not app.paused
        before = len(app.states()[0].history.values("gpu_util"))
        await pilot.press("r")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert len(app.states()[0].history.values("gpu_util")) == before + 1


async def test_command_palette_jumps_to_a_node(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app, ticks=1)
        await pilot.press("ctrl+p")
        await pilot.press(*"go to node spark-5be3")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, NodeDetailScreen) and app.screen.node == "spark-5be3"


async def test_detail_filter_shows_only_matching_services(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app, ticks=1)
        await pilot.press("1")
        await pilot.pause()
        await pilot.press("slash")
        await pilot.pause()
        assert isinstance(app.focused, Input)
        await pilot.press(*"rerank")
        await pilot.pause()
        table = app.screen.query_one("#containers-table", DataTable)
        assert table.row_count == 1
        assert str(table.get_row_at(0)[0]) == "reranker"  # a Text cell: node text is never markup
        await pilot.press("escape")  # closes the filter box, stays on the detail
        assert isinstance(app.screen, NodeDetailScreen)


async def _select(app, pilot, name: str) -> None:
    table = app.screen.query_one("#containers-table", DataTable)
    table.focus()
    for row in range(table.row_count):
        if str(table.get_row_at(row)[0]) == name:  # a Text cell
            table.move_cursor(row=row)
            await pilot.pause()
            return
    raise AssertionError(f"{name} not in the services table")


async def _stop_confirmed(pilot, app, name: str) -> None:
    """Open the head's detail, select ``name``, press `s` and confirm with `y`; the action runs."""
    await pilot.press("1")
    await _select(app, pilot, name)
    await pilot.press("s")
    await pilot.pause()
    await pilot.press("y")
    await run_actions(pilot, app)


async def test_stop_and_start_with_confirmation_journaled(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app, ticks=1)
        await pilot.press("1")
        await _select(app, pilot, "reranker")
        await pilot.press("s")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")  # no: nothing runs
        await pilot.pause()
        assert isinstance(app.screen, NodeDetailScreen)
        assert read_journal(tmp_path / "journal.jsonl") == []
        app.debouncer.reset()
        await pilot.press("s")
        await pilot.pause()
        await pilot.press("y")
        await run_actions(pilot, app)
        await poll_ticks(pilot, app, ticks=1)
        head = app.node_state("spark-1a32").sample
        assert next(c for c in head.containers if c.name == "reranker").state == "exited"
        app.debouncer.reset()
        await _select(app, pilot, "reranker")
        await pilot.press("S")
        await pilot.pause()
        await pilot.press("y")
        await run_actions(pilot, app)
        await poll_ticks(pilot, app, ticks=3)  # a container takes a moment to come up
        head = app.node_state("spark-1a32").sample
        assert next(c for c in head.containers if c.name == "reranker").state == "running"
        entries = read_journal(tmp_path / "journal.jsonl")
        assert [(e.node, e.command, e.exit_code) for e in entries] == [
            ("spark-1a32", "docker stop reranker", 0),
            ("spark-1a32", "docker start reranker", 0),
        ]


async def test_destructive_keys_are_debounced(tmp_path):
    app = demo_app(tmp_path)
    app.debouncer = Debouncer(clock=lambda: 100.0)  # time stands still: every press is "too soon"
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app, ticks=1)
        await pilot.press("1")
        await _select(app, pilot, "reranker")
        await pilot.press("s")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        await pilot.pause()
        await pilot.press("s")  # within the debounce window: ignored
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen)


async def test_read_only_refuses_with_a_reason(tmp_path):
    app = demo_app(tmp_path, read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app, ticks=1)
        assert "READ-ONLY" in str(app.status_strip())
        await pilot.press("1")
        await _select(app, pilot, "vllm-glm")
        await pilot.press("s")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen)
        assert any("read-only" in (n.title or "") for n in app._notifications)
        assert read_journal(tmp_path / "journal.jsonl") == []
        head = app.node_state("spark-1a32").sample
        assert next(c for c in head.containers if c.name == "vllm-glm").state == "running"


async def test_restart_then_follow_the_log_with_a_live_weight_loading_bar(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app, ticks=1)
        await pilot.press("1")
        await _select(app, pilot, "vllm-glm")
        await pilot.press("R")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        await run_actions(pilot, app)
        await pilot.press("l")
        await pilot.pause(0.3)
        screen = app.screen
        assert isinstance(screen, LogScreen)
        seen_progress: list[int] = []
        for _ in range(400):  # about 200 s of sim time, in half-second steps
            app.demo.sim_clock.advance(0.5)
            await settle_log(pilot, screen)  # what this half second printed has arrived
            report = screen.tracker.report
            if report.shards_done is not None and (not seen_progress or seen_progress[-1] != report.shards_done):
                seen_progress.append(report.shards_done)
            if report.state == "ready":
                break
        report = screen.tracker.report
        assert report.state == "ready", report.to_dict()
        assert len(seen_progress) > 2 and seen_progress == sorted(seen_progress)  # the bar moved
        assert report.shards_done == report.shards_total
        assert report.kv_cache_gib is not None and report.port == 8000
        text = "\n".join(line.text for line in screen.buffer.lines)
        assert "Loading safetensors checkpoint shards" in text
        await pilot.press("escape")
        assert isinstance(app.screen, NodeDetailScreen)


async def test_a_lost_node_goes_stale_then_down_and_never_blocks_the_other(tmp_path):
    app = demo_app(tmp_path, scenario="node-lost")
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot, app)
        await poll_ticks(pilot, app, ticks=2)
        assert all(s.status is NodeStatus.UP for s in app.states())
        expect_silence(app, "spark-5be3", wait=1.0)
        app.demo.sim_clock.advance(30)  # past the worker's lost_at
        await poll_ticks(pilot, app, ticks=1)
        head, worker = app.states()
        assert head.status is NodeStatus.UP
        assert worker.status is NodeStatus.STALE and "no answer" in worker.reason
        await poll_ticks(pilot, app, ticks=2, nodes=["spark-5be3"])
        assert worker.status is NodeStatus.DOWN
        assert worker.sample is not None  # the last good sample stays
        assert "node down" in card_text(app, 2)


async def test_stale_by_age_on_the_frozen_clock(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app, ticks=1)
        app.clock.advance(20)
        app._tick_ages()
        await pilot.pause()
        assert app.states()[0].status is NodeStatus.STALE
        assert "22 s ago" in card_text(app, 1)  # polled, then 2 s of ticking, then 20 s more


async def test_theme_is_remembered_between_runs(tmp_path, monkeypatch):
    from sparkconsole.ui.app import SparkConsoleApp

    state = tmp_path / "themes"
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(state))
    app = demo_app(tmp_path)
    app.remember_theme = True
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot, app)
        app.theme = "nord"
        await pilot.pause()
    assert json.loads((state / "ui.json").read_text()) == {"theme": "nord"}
    again = SparkConsoleApp(app.config, autopoll=False)
    async with again.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert again.theme == "nord"


async def test_keymap_from_config_rebinds_by_id(tmp_path):
    from dataclasses import replace

    from sparkconsole.ui.app import SparkConsoleApp

    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot, app)
        config = replace(app.config, keymap={"app.quit": "ctrl+q"})
    rebound = SparkConsoleApp(config, autopoll=False, remember_theme=False)
    async with rebound.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("q")  # no longer quits
        assert rebound.is_running
        await pilot.press("ctrl+q")
    assert rebound.return_code == 0


async def test_m_opens_the_memory_planner_with_live_node_memory(tmp_path):
    from sparkconsole.ui.screens.planner import PlannerScreen

    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app, ticks=1)
        await pilot.press("m")
        await pilot.pause()
        assert isinstance(app.screen, PlannerScreen)
        await app.workers.wait_for_complete()
        await pilot.pause()
        result = app.screen.result
        assert result is not None and result.error is None
        assert "live" in result.memory_source or "node" in result.memory_source
        assert abs(result.memory_gib - 119.7) < 0.1  # the sim's MemTotal, not the 121.69 default
        await pilot.press("escape")
        assert isinstance(app.screen, OverviewScreen)


async def test_a_systemd_unit_is_started_from_the_detail(tmp_path):
    # `sudo -n systemctl` needs a sudo rule: a stock node (the story) answers "a password is required";
    # the permissive twin's sudo asks nothing (docs/dgx-os.md)
    app = demo_app(tmp_path, "permissive")
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app, ticks=1)
        assert "ollama" in app.config.services
        await pilot.press("1")
        await app.workers.wait_for_complete()
        await pilot.pause()
        await _select(app, pilot, "ollama")
        table = app.screen.query_one("#containers-table", DataTable)
        row = [str(c) for c in table.get_row_at(table.cursor_row)]
        assert row[1] == "unit" and row[3] == "inactive"
        await pilot.press("S")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        await run_actions(pilot, app)
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert next(u for u in app.screen.units if u.name == "ollama").state == "active"
        (entry,) = read_journal(tmp_path / "journal.jsonl")
        assert entry.command == "sudo -n systemctl start ollama" and entry.exit_code == 0


async def test_palette_merges_one_containers_logs_from_both_nodes(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app, ticks=1)
        await pilot.press("ctrl+p")
        await pilot.press(*"merged log of embeddings")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await pilot.pause(0.3)
        screen = app.screen
        assert isinstance(screen, LogScreen)
        for _ in range(100):
            app.demo.sim_clock.advance(1.0)
            await pilot.pause(0.02)
            if {line.source for line in screen.buffer.lines} >= {"spark-1a32", "spark-5be3"}:
                break
        sources = {line.source for line in screen.buffer.lines}
        assert sources >= {"spark-1a32", "spark-5be3"}
        # each line says which node printed it (the time order itself is tested in test_log_follow)
        shown = [line.display for line in screen.buffer.lines]
        assert any(d.startswith("[spark-1a32]") for d in shown) and any(d.startswith("[spark-5be3]") for d in shown)


async def test_D_removes_an_exited_container_only(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app, ticks=1)
        await pilot.press("1")
        await _select(app, pilot, "reranker")
        await pilot.press("D")  # running: remove is refused before any dialog
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen)
        app.debouncer.reset()
        await pilot.press("s")
        await pilot.pause()
        await pilot.press("y")
        await run_actions(pilot, app)
        await poll_ticks(pilot, app, ticks=1)
        app.debouncer.reset()
        await _select(app, pilot, "reranker")
        await pilot.press("D")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        await run_actions(pilot, app)
        await poll_ticks(pilot, app, ticks=1)
        head = app.node_state("spark-1a32").sample
        assert "reranker" not in {c.name for c in head.containers}
        commands = [e.command for e in read_journal(tmp_path / "journal.jsonl")]
        assert commands == ["docker stop reranker", "docker rm reranker"]


async def test_a_demo_that_cannot_start_is_one_line_not_a_traceback(tmp_path):
    app = demo_app(tmp_path, scenario="no-such-scenario")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(0.2)
    assert app.return_code == 2
    assert app.startup_error.startswith("the demo cluster did not start:")
    assert "\n" not in app.startup_error


async def test_a_units_log_follows_journalctl(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app, ticks=1)
        await pilot.press("1")
        await app.workers.wait_for_complete()
        await pilot.pause()
        await _select(app, pilot, "nvidia-dgx-dashboard")
        await pilot.press("l")
        await pilot.pause(0.3)
        screen = app.screen
        assert isinstance(screen, LogScreen)
        for _ in range(50):
            if len(screen.buffer):
                break
            app.demo.sim_clock.advance(1.0)
            await pilot.pause(0.05)
        assert len(screen.buffer) > 0
        assert screen.tracker is None  # not an engine's log: shown plainly, no tracker and no panel


async def test_a_stuck_poll_is_cancelled_and_said(tmp_path):
    """A poll that outlives its own time budget (a wedged channel, say) never stalls the node."""
    import asyncio
    import time

    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app, ticks=1)
        poller = app.poller.pollers["spark-5be3"]

        async def hang():
            await asyncio.Event().wait()

        poller.poll_once = hang
        app.poll_node("spark-5be3")
        await pilot.pause()
        assert app._poll_started["spark-5be3"]
        app._poll_started["spark-5be3"] = time.monotonic() - poller.tick_timeout - 11
        app._tick_ages()
        for _ in range(20):
            await pilot.pause(0.05)
        state = app.node_state("spark-5be3")
        assert state.status is NodeStatus.STALE and "probe stuck" in state.reason
        assert not any(w.group == "poll:spark-5be3" and not w.is_finished for w in app.workers)
        assert any("probe stuck" in text for _, _, text in app.events)


async def test_r_polls_while_paused_and_so_does_the_refresh_after_a_service_action(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app, ticks=1)
        await pilot.press("p")
        assert app.paused
        before = len(app.states()[0].history.values("gpu_util"))
        await pilot.press("r")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert len(app.states()[0].history.values("gpu_util")) == before + 1
        assert app.paused  # `r` polls once; it does not resume
        # a service action's own refresh shows its effect while paused, no poll needed from us
        await _stop_confirmed(pilot, app, "reranker")
        await app.workers.wait_for_complete()
        await pilot.pause()
        head = app.node_state("spark-1a32").sample
        assert next(c for c in head.containers if c.name == "reranker").state == "exited"


async def test_a_service_action_whose_journal_cannot_be_written_is_said(tmp_path):
    app = demo_app(tmp_path)
    (tmp_path / "journal.jsonl").mkdir()  # the journal's path is a folder: writing it fails
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app, ticks=1)
        await _stop_confirmed(pilot, app, "reranker")
        await pilot.pause()
        errors = [n for n in app._notifications if n.severity == "error"]
        assert errors and "service action failed" in errors[-1].message
        assert "journal.jsonl" in errors[-1].message
        assert any(sev == "critical" and "service action failed" in text for _, sev, text in app.events)


async def test_a_screen_workers_failure_reaches_the_same_handler(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app, ticks=1)
        await pilot.press("1")
        await pilot.pause()

        async def broken(_services):
            raise RuntimeError("systemctl exploded")

        app.controller("spark-1a32").unit_states = broken
        app.config = replace(app.config, services=("ollama.service",))
        app.screen.load_units()
        await until(pilot, lambda: any("systemctl" in n.message for n in app._notifications))
        assert any("systemctl exploded" in n.message and n.severity == "error" for n in app._notifications)
        assert any("systemctl exploded" in text for _, _, text in app.events)


@pytest.mark.parametrize("argv", [["--demo", "--read-only"], ["demo", "--read-only"], ["tui", "--demo", "--read-only"]])
def test_demo_read_only_reaches_the_console(argv, monkeypatch):
    import sparkconsole.ui.app as ui_app
    from sparkconsole.cli import main

    seen = []
    monkeypatch.setattr(ui_app, "run_console", lambda config=None, *, demo=None, **kw: seen.append(demo) or 0)
    assert main(argv) == 0
    assert len(seen) == 1 and seen[0].read_only


async def test_a_read_only_demo_cluster_is_read_only_too(tmp_path):
    app = demo_app(tmp_path, read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_ready(pilot, app)
        assert app.config.read_only and app.demo_cluster.config.read_only


async def test_the_node_detail_keeps_cursor_and_scroll_across_ticks(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=(160, 30)) as pilot:
        await started(pilot, app, ticks=1)
        await pilot.press("1")
        await pilot.pause()
        links = app.screen.query_one("#links-table", DataTable)
        services = app.screen.query_one("#containers-table", DataTable)
        assert links.row_count >= 2 and services.row_count >= 2
        links.move_cursor(row=1)
        services.move_cursor(row=2)
        detail = app.screen.query_one("#detail")
        detail.scroll_end(animate=False, immediate=True)
        await pilot.pause()
        scroll = detail.scroll_y
        assert scroll > 0
        cleared = []
        for table in (links, services):
            real_clear = table.clear
            table.clear = lambda *a, _real=real_clear, _t=table, **k: cleared.append(_t.id) or _real(*a, **k)
        await poll_ticks(pilot, app, ticks=3)
        assert cleared == []  # the same rows: cells are updated in place, the tables never emptied
        assert links.cursor_row == 1 and services.cursor_row == 2
        assert detail.scroll_y == scroll


PARTIAL_BLOCKS = set("▁▂▃▄▅▆▇▉▊▋▌▍▎▏")


def _scrollbar_text(widget) -> str:
    from textual.geometry import Region

    bar = widget.vertical_scrollbar
    lines = bar.render_lines(Region(0, 0, bar.size.width, bar.size.height))
    return "".join(strip.text for strip in lines)


async def test_the_cards_and_log_scrollbars_have_no_partial_block_ends(tmp_path):
    from sparkconsole.logs.follow import LogLine
    from sparkconsole.services import Service

    app = demo_app(tmp_path, nodes=4)
    async with app.run_test(size=(160, 40)) as pilot:
        await started(pilot, app, ticks=2)
        assert app.screen.view == "table"  # four cards do not fit in 40 lines: the table by itself
        await pilot.press("v")
        await pilot.pause()
        scroll = app.screen.query_one("#cards-scroll")
        await until(pilot, lambda: scroll.max_scroll_y > 0 and scroll.vertical_scrollbar.size.height > 0)
        for y in range(0, int(scroll.max_scroll_y) + 1, 3):  # every thumb position, ends included
            scroll.scroll_to(y=y, animate=False, immediate=True)
            await pilot.pause()
            text = _scrollbar_text(scroll)
            assert not PARTIAL_BLOCKS & set(text), text
            assert "┃" in text and "│" in text  # a thumb on a track: it reads as a scrollbar
        app.open_logs("spark-1a32", Service(name="vllm-glm", kind="container", state="running"))
        await until(pilot, lambda: isinstance(app.screen, LogScreen) and app.screen.is_mounted
                    and bool(app.screen.query("#log-status")))
        log = app.screen.log_view
        for i in range(300):
            app.screen.handle_event(LogLine(f"line {i}"))
        await until(pilot, lambda: log.max_scroll_y > 0 and log.vertical_scrollbar.size.height > 0)
        await pilot.pause()
        text = _scrollbar_text(log)
        assert not PARTIAL_BLOCKS & set(text) and "┃" in text


async def _new_sample(pilot, app, name: str) -> None:
    """One node's poll ends with a new sample (sim time moves; the wall clock and the ages do not)."""
    app.demo.sim_clock.advance(2.0)
    await app.poller.pollers[name].poll_once()
    app._show_node(name)  # what the end of a node's poll worker does: a NodeUpdated message
    await pilot.pause(0.2)  # past the overview's coalescing window


async def test_one_nodes_new_sample_renders_its_card_only(tmp_path):
    """Issue 12's update path: a poll ending on one node renders that node's card once; the other
    cards are not rendered, and a card whose node did not change is not rendered again (call counts)."""
    from sparkconsole.ui.widgets.node_card import NodeCard

    app = demo_app(tmp_path, nodes=4)
    async with app.run_test(size=(200, 70)) as pilot:  # four cards fit: the card view
        await started(pilot, app, ticks=1)
        assert app.screen.view == "cards"
        cards = {c.node: c for c in app.screen.query(NodeCard)}
        assert len(cards) == 4
        before = {n: (c.draws, c.renders) for n, c in cards.items()}
        first = next(iter(cards))
        await _new_sample(pilot, app, first)
        after = {n: (c.draws, c.renders) for n, c in cards.items()}
        assert after[first] == (before[first][0] + 1, before[first][1] + 1)
        assert all(after[n] == before[n] for n in cards if n != first)
        app._show_node(first)  # nothing new: nothing drawn, nothing rendered
        await pilot.pause(0.2)
        assert (cards[first].draws, cards[first].renders) == after[first]


async def test_one_nodes_new_sample_renders_one_table_row(tmp_path):
    """The dense view: a node's sample renders its row and no other."""
    from sparkconsole.ui.widgets.node_table import NodeTable

    app = demo_app(tmp_path, nodes=8)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app, ticks=1)
        assert app.screen.view == "table"  # eight cards do not fit in 48 lines
        table = app.screen.query_one(NodeTable)
        await pilot.pause(0.2)
        assert len(table.plain_lines()) == 1 + 8
        before = table.renders
        await _new_sample(pilot, app, app.config.nodes[2].name)
        assert table.renders == before + 1


async def test_a_card_out_of_view_is_rendered_when_it_scrolls_in(tmp_path):
    """Cards below the fold cost nothing until they are seen; then they show their latest sample."""
    from sparkconsole.ui.widgets.node_card import NodeCard

    app = demo_app(tmp_path, nodes=6)
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot, app, ticks=1)
        await pilot.press("v")  # the cards, though they do not all fit
        await pilot.pause(0.2)
        last = app.screen.query(NodeCard).last()
        assert not last.in_view()
        before = last.renders
        await _new_sample(pilot, app, last.node)
        assert last.draws and last.renders == before  # taken, not rendered
        app.screen.query_one("#cards-scroll").scroll_end(animate=False, immediate=True)
        await until(pilot, lambda: last.in_view() and last.renders == before + 1)
        assert "up" in last.plain_text()


async def test_the_strip_condenses_and_never_wraps_at_64_nodes(tmp_path):
    """64 nodes: the strip is one line of counts and the names of nodes not up; the table has a row each."""
    from sparkconsole.probe.state import NodeStatus
    from sparkconsole.ui.widgets.node_table import NodeTable

    app = demo_app(tmp_path, nodes=64)
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot, app, ticks=1)
        states = app.states()
        # the strip is drawn from these states: on a busy 2-core machine a few of 64 SSH nodes can be
        # stale for a tick, so every node is set up and one down here, the strip then read at once
        for s in states:
            s.status = NodeStatus.UP
        states[6].status, states[6].reason = NodeStatus.DOWN, "no route to host"
        strip = app.status_strip(118)
        assert strip.cell_len <= 118 and "\n" not in strip.plain
        assert "63 up" in strip.plain and "1 down" in strip.plain and states[6].name in strip.plain
        table = app.screen.query_one(NodeTable)
        await pilot.pause(0.2)
        assert len(table.order) == 64
        await pilot.press("slash")
        await pilot.press(*states[6].name)
        await pilot.press("enter")
        await pilot.pause(0.2)
        assert table.order == [states[6].name]
        await pilot.press("enter")
        await until(pilot, lambda: type(app.screen).__name__ == "NodeDetailScreen")
        assert app.screen.node == states[6].name


async def test_the_table_sorts_by_the_chosen_column_and_reverses(tmp_path):
    """s cycles the sort column (node → status → gpu …), S reverses; the order follows the values."""
    from sparkconsole.ui.widgets.node_table import NodeTable

    app = demo_app(tmp_path, nodes=8)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app, ticks=3)
        table = app.screen.query_one(NodeTable)
        await pilot.press("s", "s", "s")  # memory
        await pilot.pause(0.2)
        assert table.sort == "memory"
        used = [table.rows[n].mem_used for n in table.order]
        assert used == sorted(used, reverse=True) and used[0] > used[-1]  # the head holds GLM
        await pilot.press("S")
        await pilot.pause(0.2)
        assert [table.rows[n].mem_used for n in table.order] == sorted(used)
        assert "unified memory▲" in table.plain_lines()[0]
