"""SVG snapshots of the main screens on the demo cluster (pytest-textual-snapshot).

Every snapshot is reproducible: the sim runs on a manual clock, the console on a frozen wall
clock, the tests drive every poll, and the one measured duration on screen (probe time) is
pinned. The scenes are shared with ``scripts/screenshots`` (tests/ui_support.py). Update on
purpose with ``./scripts/test tests/test_ui_snapshots.py --snapshot-update`` and read the SVGs
before committing them.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from sparkconsole.probe import poller
from tests.ui_support import (
    demo_app,
    dense_view,
    help_screen,
    holds,
    link_down,
    node_detail,
    node_down,
    node_stale,
    overview,
    screen_is,
    started,
    weights_loading,
)

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


def _snap(snap_compare, tmp_path, scenario, scene, nodes: int = 2) -> bool:
    app = demo_app(tmp_path, scenario, nodes=nodes)

    async def run_before(pilot):
        await scene(pilot, app)

    return snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_all_up(snap_compare, tmp_path):
    assert _snap(snap_compare, tmp_path, "story", overview)


def test_node_stale(snap_compare, tmp_path):
    assert _snap(snap_compare, tmp_path, "node-lost", node_stale)


def test_node_down(snap_compare, tmp_path):
    assert _snap(snap_compare, tmp_path, "node-lost", node_down)


def test_link_down(snap_compare, tmp_path):
    assert _snap(snap_compare, tmp_path, "link-down", link_down)


def test_node_detail(snap_compare, tmp_path):
    assert _snap(snap_compare, tmp_path, "story", node_detail)


def test_help(snap_compare, tmp_path):
    assert _snap(snap_compare, tmp_path, "story", help_screen)


def test_weights_40_percent_loaded(snap_compare, tmp_path):
    """GLM restarted from the keyboard; its log followed until 40% of the shards are in."""
    assert _snap(snap_compare, tmp_path, "story", weights_loading)


def test_dense_view_of_twelve_nodes(snap_compare, tmp_path):
    """Twelve Sparks do not fit as cards: one row each, sorted by unified memory."""
    assert _snap(snap_compare, tmp_path, "story", dense_view, nodes=12)


# ---- serving (issue 24): the engines' lines on the cards, and the engine view ---------------------


def _engines_read(app, node: str) -> bool:
    engines = app.node_state(node).engines
    return bool(engines) and all(len(w.pages) >= 2 for w in engines.values())


async def serving_overview(pilot, app) -> None:
    """Every engine read at least twice (a rate needs two pages): the cards' serving lines."""
    await started(pilot, app, ticks=12)
    await holds(pilot, lambda: all(_engines_read(app, n.name) for n in app.config.nodes), "every engine read twice")


async def engine_view(pilot, app) -> None:
    """The head's engines from its detail (e), the selected service's engine focused."""
    await serving_overview(pilot, app)
    await pilot.press("1")
    await screen_is(pilot, app, "NodeDetailScreen")
    await pilot.press("e")
    screen = await screen_is(pilot, app, "EngineScreen")
    count = len(app.node_state(screen.node).engines)
    await holds(pilot, lambda: len([p for p in screen.panels() if p.watch is not None]) == count
                and screen.focused is not None, "every engine's panel drawn, one focused")


def test_serving_lines_on_the_cards(snap_compare, tmp_path):
    assert _snap(snap_compare, tmp_path, "story", serving_overview)


def test_engine_view(snap_compare, tmp_path):
    assert _snap(snap_compare, tmp_path, "story", engine_view)


def test_engine_view_at_120_by_40(snap_compare, tmp_path):
    app = demo_app(tmp_path, "story")

    async def run_before(pilot):
        await engine_view(pilot, app)

    assert snap_compare(app, terminal_size=(120, 40), run_before=run_before)


# ---- the node detail at the sizes people use: it opens at its top, the card fits its box ----------


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 60)], ids=["80x24", "120x40", "200x60"])
def test_node_detail_at(snap_compare, tmp_path, size):
    app = demo_app(tmp_path, "story")

    async def run_before(pilot):
        await node_detail(pilot, app)

    assert snap_compare(app, terminal_size=size, run_before=run_before)
