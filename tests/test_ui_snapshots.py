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
    link_down,
    node_detail,
    node_down,
    node_stale,
    overview,
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
