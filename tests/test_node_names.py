"""A node's name is a node word like any other: shown cleaned, never terminal control, never markup.

A twin node or this machine's hostname (``--local``) named ``ev<OSC 0>il`` set the operator's
terminal title; ``spark[/bold]x`` ended the console with MarkupError (a card's border title is
Textual markup). The names are refused or cleaned where they enter (the inventory, the twin file,
``--local``), and every place that shows one cleans it again: here a cluster built in code, past
those checks, is drawn on each screen that names its nodes, and what the terminal receives is read.
"""

from __future__ import annotations

import socket

from sparkconsole import schema
from sparkconsole.cli import main
from sparkconsole.commands.snapshot import _line
from sparkconsole.probe.state import NodeState, NodeStatus
from tests.test_node_text import escapes, node_sample, screen_text

OSC_NAME = "ev\x1b]0;PWNED\x07il"  # an OSC 0: sets the terminal's title to PWNED
MARKUP_NAME = "spark[/bold]x"  # a closing tag with nothing open: MarkupError in Textual


def hostile_app(tmp_path):
    """The console on two nodes with hostile names (no node is polled: the test sets their states)."""
    from sparkconsole.config import ClusterConfig, NodeConfig
    from sparkconsole.journal import Journal
    from sparkconsole.ui.app import SparkConsoleApp

    config = ClusterConfig(nodes=(NodeConfig(OSC_NAME, "127.0.0.1", role="head"), NodeConfig(MARKUP_NAME, "127.0.0.1")))
    return SparkConsoleApp(config, autopoll=False, remember_theme=False, journal=Journal(tmp_path / "journal.jsonl"))


def set_states(app) -> None:
    """The first node up with a plain sample, the second down: both cards, rows and panels drawn."""
    a = app.poller.pollers[OSC_NAME].state
    a.sample, a.status, a.last_ok_at = node_sample(OSC_NAME, [f"word{i}" for i in range(24)]), NodeStatus.UP, app.clock()
    b = app.poller.pollers[MARKUP_NAME].state
    b.status, b.reason = NodeStatus.DOWN, "connection refused"
    for name in (OSC_NAME, MARKUP_NAME):
        app._note_changes(name)


def names_shown(shown: str) -> None:
    assert not escapes(shown), escapes(shown)
    assert "PWNED" not in shown  # the OSC goes whole, its text with it
    assert "evil" in shown and MARKUP_NAME in shown  # the markup-looking name as it is written


async def test_the_overview_cards_and_table_show_hostile_names_as_text(tmp_path):
    app = hostile_app(tmp_path)
    async with app.run_test(size=(180, 60)) as pilot:
        await pilot.pause()
        set_states(app)
        app.screen.refresh_all()
        await pilot.pause()
        await pilot.pause()
        names_shown(screen_text(app))
        app.screen.action_toggle_view()  # one row per node
        await pilot.pause()
        await pilot.pause()
        names_shown(screen_text(app))


async def test_the_node_detail_and_the_wizard_panels_show_hostile_names_as_text(tmp_path):
    from sparkconsole.ui.screens.node_detail import NodeDetailScreen
    from sparkconsole.ui.screens.wizard import WizardScreen

    app = hostile_app(tmp_path)
    async with app.run_test(size=(180, 60)) as pilot:
        await pilot.pause()
        set_states(app)
        await app.push_screen(NodeDetailScreen(OSC_NAME))
        await pilot.pause()
        await pilot.pause()
        shown = screen_text(app)
        assert not escapes(shown) and "PWNED" not in shown and "evil" in shown
        app.pop_screen()
        await pilot.pause()
        await app.push_screen(WizardScreen())
        await pilot.pause()
        await pilot.pause()
        names_shown(screen_text(app))


def test_snapshot_local_prints_no_escape_from_the_hostname(monkeypatch, capsys):
    monkeypatch.setattr(socket, "gethostname", lambda: OSC_NAME)
    main(["snapshot", "--local"])
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("evil ")
    assert not escapes(out) and "PWNED" not in out


def test_a_snapshot_line_cleans_the_name_it_is_given():
    """Past the checks at the door (a name from code, not a file), the line still cleans it."""
    line = _line(NodeState(OSC_NAME, NodeStatus.DOWN, reason="no route"))
    assert line.startswith("evil ") and not escapes(line) and "no route" in line


def test_a_hostname_becomes_a_node_name_the_console_can_show():
    assert schema.clean_node_name("spark-1a32") == "spark-1a32"
    assert schema.clean_node_name(OSC_NAME) == "evil"
    assert schema.clean_node_name(MARKUP_NAME) == "spark--bold-x"
    assert schema.clean_node_name("\x1b[2J") == "localhost"
    long = schema.clean_node_name("a" * 300)
    assert len(long) == schema.NODE_NAME_MAX and schema.NODE_NAME.fullmatch(long)
