"""Pilot tests of the planner panel (PlannerScreen) and one snapshot of it for the 122B.

The specs are the bundled ones (HF_HUB_OFFLINE=1): nothing here reaches the network.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from textual.screen import Screen
from textual.widgets import DataTable, Input, Select, Static

from sparkconsole.config import ClusterConfig, NodeConfig
from sparkconsole.planner.budget import DEFAULT_NODE_MEMORY_GIB
from sparkconsole.probe.samples import NodeSample, UnifiedMemory
from sparkconsole.probe.state import NodeState, NodeStatus
from sparkconsole.ui.screens.planner import DEFAULT_MODEL, PlannerScreen
from tests.ui_support import Host, steady_cursors

Q122 = "Qwen/Qwen3.5-122B-A10B-FP8"
GIB = 1 << 30


@pytest.fixture(autouse=True)
def _offline(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")




class ClusterHost(Host):
    """A host that looks like the console: ``config.nodes`` and ``states()`` with live samples."""

    def __init__(self, make: Callable[[], Screen], states: list[NodeState]) -> None:
        super().__init__(make)
        self.config = ClusterConfig(nodes=tuple(NodeConfig(name=s.name, host=s.name) for s in states))
        self._states = states

    def states(self) -> list[NodeState]:
        return self._states


def live_state(name: str, total_gib: float, available_gib: float) -> NodeState:
    mem = UnifiedMemory(total_bytes=int(total_gib * GIB), available_bytes=int(available_gib * GIB),
                        page_cache_bytes=int(10 * GIB), unified=True)
    return NodeState(name, status=NodeStatus.UP, reason="up", sample=NodeSample(name, 0.0, memory=mem))


async def until(pilot, cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await pilot.pause(0.02)


def done(screen: PlannerScreen) -> Callable[[], bool]:
    return lambda: screen.result is not None and not screen.computing


def table_rows(screen: PlannerScreen) -> dict[str, list[str]]:
    t = screen.query_one("#planner-table", DataTable)
    rows = {}
    for i in range(t.row_count):
        cells = [str(c) for c in t.get_row_at(i)]
        rows[cells[0]] = cells[1:]
    return rows


def status(screen: PlannerScreen) -> str:
    return str(screen.query_one("#planner-status", Static).render())


async def test_122b_tp1_does_not_fit_tp2_fits() -> None:
    app = Host(lambda: PlannerScreen())
    async with app.run_test(size=(140, 40)) as pilot:
        screen: PlannerScreen = app.screen  # type: ignore[assignment]
        assert screen.query_one("#planner-model", Input).value == DEFAULT_MODEL == Q122
        assert screen.query_one("#planner-tp", Input).value == "2"  # no cluster: N = 2
        await until(pilot, done(screen))
        rows = table_rows(screen)
        t = screen.query_one("#planner-table", DataTable)
        assert [str(c.label) for c in t.columns.values()] == ["", "TP=1 (1 node)", "TP=2 (2 nodes)"]
        assert rows["fits"] == ["✖ does not fit", "✔ fits"]
        assert rows["weights / node"][1] == "58.20 GiB"  # 58.07 + the multimodal rotary cos/sin cache (0.125 GiB)
        assert rows["weights / node"][0].startswith("116.")
        assert rows["KV bytes / token"] == ["24,576 B", "12,288 B"]
        assert rows["block size"] == ["2,096 tokens", "2,096 tokens"]
        assert set(rows) >= {"KV budget / node", "state / request", "num blocks", "max concurrency", "KV tokens"}
        # the green tick / red cross are styled, not just glyphs
        fits = t.get_row("fits")
        assert "green" in str(fits[2].style) and "red" in str(fits[1].style)
        assert screen.result is not None and screen.result.error is None
        assert screen.result.memory_gib == DEFAULT_NODE_MEMORY_GIB
        memory = str(screen.query_one("#planner-memory", Static).render())
        assert "121.69 GiB (default" in memory
        reasons = screen.reasons_plain
        assert "TP=1" in reasons and "does not fit on one Spark" in reasons
        assert "cheapest way out: more nodes: --tp 2 --nodes 2 fits" in reasons
        assert "fits on 2 Sparks" in reasons
        assert "drop_caches" in reasons  # shared GB10 note, listed once
        assert reasons.count("drop_caches") == 1


async def test_hostile_model_id_is_one_error_line(tmp_path) -> None:
    odd = tmp_path / "odd" / "config.json"
    odd.parent.mkdir()
    odd.write_text('{"architectures": 5,\n "num_hidden_layers": "x"}')
    app = Host(lambda: PlannerScreen())
    async with app.run_test(size=(140, 40)) as pilot:
        screen: PlannerScreen = app.screen  # type: ignore[assignment]
        await until(pilot, done(screen))
        model = screen.query_one("#planner-model", Input)
        for hostile in ("$(rm -rf ~); evil", "../../../etc/passwd.json", "a\x00b", str(odd), str(tmp_path),
                        "nobody/no-such-model-xyz"):
            model.value = hostile
            model.focus()
            await pilot.press("enter")
            await until(pilot, lambda: screen.result is not None and screen.result.error is not None
                        and not screen.computing)
            line = status(screen)
            assert line.startswith("✖ ") and "\n" not in line, line
            assert screen.query_one("#planner-table", DataTable).row_count == 0
            assert app.is_running and app.screen is screen
        assert "offline" in screen.error_text  # the unknown model, offline
        # and back to a good one
        model.value = Q122
        await pilot.press("enter")
        await until(pilot, lambda: screen.result is not None and screen.result.error is None and not screen.computing)
        assert table_rows(screen)["fits"] == ["✖ does not fit", "✔ fits"]


async def test_bad_form_values_are_one_line_and_nothing_runs() -> None:
    app = Host(lambda: PlannerScreen())
    async with app.run_test(size=(140, 40)) as pilot:
        screen: PlannerScreen = app.screen  # type: ignore[assignment]
        await until(pilot, done(screen))
        gmu = screen.query_one("#planner-gmu", Input)
        gmu.value = "1.5"
        gmu.focus()
        await pilot.press("enter")
        await pilot.pause(0.05)
        assert status(screen).startswith("✖ gmu must be in (0, 1]")
        gmu.value = "0.95"  # above 0.90 without --force: vLLM's GB10 refusal, one line too
        await pilot.press("enter")
        await until(pilot, done(screen))
        assert status(screen).startswith("✖ --gpu-memory-utilization 0.95 is above 0.9")
        gmu.value = "0.85"
        tp = screen.query_one("#planner-tp", Input)
        tp.value = "3"  # 32 attention heads are not divisible by 3: TP=3 is an error row, TP=1 still shown
        tp.focus()
        await pilot.press("enter")
        await until(pilot, done(screen))
        rows = table_rows(screen)
        assert rows["fits"] == ["✖ does not fit", "✖ error"]
        assert rows["weights / node"][1] == "—"
        assert "divisible" in screen.reasons_plain


async def test_enter_and_ctrl_r_recompute_with_the_form() -> None:
    app = Host(lambda: PlannerScreen())
    async with app.run_test(size=(140, 40)) as pilot:
        screen: PlannerScreen = app.screen  # type: ignore[assignment]
        await until(pilot, done(screen))
        mml = screen.query_one("#planner-mml", Input)
        mml.value = "32768"
        mml.focus()
        await pilot.press("enter")
        await until(pilot, lambda: done(screen)() and "32,768" in table_rows(screen)["max concurrency"][1])
        first = table_rows(screen)["max concurrency"][1]
        screen.query_one("#planner-kv", Select).value = "fp8"  # a select change recomputes on its own
        await until(pilot, lambda: done(screen)() and table_rows(screen)["KV bytes / token"][1] == "6,144 B")
        screen.query_one("#planner-tp", Input).value = "4"
        gen = screen.generation
        await pilot.press("ctrl+r")
        await until(pilot, lambda: screen.generation > gen and done(screen)())
        rows = table_rows(screen)
        assert rows["weights / node"][1].startswith("29.")
        assert rows["max concurrency"][1] != first


async def test_live_samples_set_node_memory_and_n() -> None:
    """With the console's samples: N = the cluster's node count, memory = the smallest MemTotal."""
    states = [live_state("spark-a", 119.70, 110.0), live_state("spark-b", 118.5, 40.0),
              live_state("spark-c", 119.70, 110.0)]
    app = ClusterHost(lambda: PlannerScreen(), states)
    async with app.run_test(size=(140, 40)) as pilot:
        screen: PlannerScreen = app.screen  # type: ignore[assignment]
        assert screen.query_one("#planner-tp", Input).value == "3"
        await until(pilot, done(screen))
        assert screen.result is not None and screen.result.memory_gib == pytest.approx(118.5, abs=1e-6)
        memory = str(screen.query_one("#planner-memory", Static).render())
        assert "live: 118.50 GiB" in memory and "spark-b" in memory
        t = screen.query_one("#planner-table", DataTable)
        assert [str(c.label) for c in t.columns.values()][1:] == ["TP=1 (1 node)", "TP=3 (3 nodes)"]
        reasons = screen.reasons_plain
        assert "node memory 118.50 GiB from the live nodes" in reasons
        assert "node spark-b: MemAvailable 40.00 GiB is below gpu_memory_utilization 0.85" in reasons
        assert "spark-a: MemAvailable" not in reasons


async def test_states_without_samples_use_the_default() -> None:
    app = ClusterHost(lambda: PlannerScreen(), [NodeState("spark-a"), NodeState("spark-b")])
    async with app.run_test(size=(140, 40)) as pilot:
        screen: PlannerScreen = app.screen  # type: ignore[assignment]
        await until(pilot, done(screen))
        assert screen.result is not None and screen.result.memory_gib == DEFAULT_NODE_MEMORY_GIB
        assert "default" in str(screen.query_one("#planner-memory", Static).render())


async def test_given_node_memory_and_model() -> None:
    app = Host(lambda: PlannerScreen("Qwen/Qwen3-8B", node_memory_gib=60.0, tp=2))
    async with app.run_test(size=(140, 40)) as pilot:
        screen: PlannerScreen = app.screen  # type: ignore[assignment]
        assert screen.query_one("#planner-model", Input).value == "Qwen/Qwen3-8B"
        await until(pilot, done(screen))
        assert screen.result is not None and screen.result.error is None
        assert "60.00 GiB (given)" in str(screen.query_one("#planner-memory", Static).render())
        assert table_rows(screen)["fits"] == ["✔ fits", "✔ fits"]


async def test_escape_pops_the_screen() -> None:
    app = Host(lambda: PlannerScreen())
    async with app.run_test(size=(140, 40)) as pilot:
        screen = app.screen
        assert isinstance(screen, PlannerScreen)
        await until(pilot, done(screen))
        await pilot.press("escape")
        await pilot.pause(0.05)
        assert not isinstance(app.screen, PlannerScreen)
        assert app.results == [None]


async def test_escape_while_computing_pops_too() -> None:
    app = Host(lambda: PlannerScreen())
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.press("escape")
        await pilot.pause(0.2)
        assert not isinstance(app.screen, PlannerScreen)
        assert app.results == [None]


def test_bindings_have_ids_and_tooltips_and_help() -> None:
    ids = {b.id for b in PlannerScreen.BINDINGS}
    assert ids == {"planner.back", "planner.recompute"}
    for b in PlannerScreen.BINDINGS:
        assert b.id and b.tooltip, b
    keys = {b.key: b.id for b in PlannerScreen.BINDINGS}
    assert keys == {"escape": "planner.back", "ctrl+r": "planner.recompute"}
    assert isinstance(PlannerScreen.HELP, str) and "TP=1" in PlannerScreen.HELP


def test_planner_snapshot(snap_compare) -> None:
    async def settle(pilot) -> None:
        screen = pilot.app.screen
        await until(pilot, done(screen))
        steady_cursors(pilot.app)  # a blinking cursor is drawn or not by the wall clock: one run in three
        await pilot.pause(0.1)

    assert snap_compare(Host(lambda: PlannerScreen(Q122)), terminal_size=(140, 40), run_before=settle)
