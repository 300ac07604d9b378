"""Node text is data (issue 23, items 1 and 2): what a node says (engine log lines, stderr, notes,
process, container and image names, reasons, errors) reaches the screen and the CLI as plain text,
never Textual markup (a traceback's "in [/root/.cache/…]" raised MarkupError and ended the app; a
"[rank0]:" prefix vanished) and never terminal control (an OSC 52 sets the operator's clipboard,
CSI 2J clears the screen). One test per path, each of which failed before, then a fuzz of them all;
docs/security.md ("Node text is data") lists the paths."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.text import Text
from textual.app import App, ComposeResult
from textual.widgets import Static

from sparkconsole.logs.follow import display_text
from sparkconsole.logs.vllm import VllmLogReport
from sparkconsole.ui.screens.logs import VllmPanel

HOSTILE = ("(Worker pid=7) [rank0]: RuntimeError: x in [/root/.cache/vllm/torch_compile_cache/ab12]\x1b]52;c;"
           "ZWNobyBoaQ==\x07\x1b[2J\x1b]0;owned\x1b\\\x9b31m[bold red]not markup[/]")


def test_escape_sequences_leave_nothing_a_terminal_would_act_on():
    shown = display_text(HOSTILE)
    assert not any(ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F for ch in shown)
    assert "]52;" not in shown and "owned" not in shown  # the OSC strings go whole, not just their ESC
    assert "[rank0]: RuntimeError: x in [/root/.cache/vllm/torch_compile_cache/ab12]" in shown
    assert shown.endswith("[bold red]not markup[/]")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x2FF)))
def test_no_escape_byte_survives_any_text(text):
    shown = display_text(text)
    assert not any(ord(ch) < 0x20 and ch != "\t" for ch in shown)
    assert not any(0x7F <= ord(ch) <= 0x9F for ch in shown)


class _PanelApp(App):
    def compose(self) -> ComposeResult:
        yield VllmPanel()


async def test_the_vllm_panel_shows_a_markup_looking_failure_as_it_was_printed():
    app = _PanelApp()
    async with app.run_test() as pilot:
        panel = app.query_one(VllmPanel)
        panel.show(VllmLogReport(state="failed", model="Q/[b]M[/b]", failure_kind="other", failure_line=HOSTILE))
        await pilot.pause()
        failure = app.query_one("#vllm-failure", Static).render()
        plain = failure.plain if isinstance(failure, Text) else str(failure)
        assert "[rank0]: RuntimeError: x in [/root/.cache/vllm/torch_compile_cache/ab12]" in plain
        assert "[bold red]not markup[/]" in plain and "\x1b" not in plain and "\x9b" not in plain
        head = app.query_one("#vllm-head", Static).render()
        assert "Q/[b]M[/b]" in (head.plain if isinstance(head, Text) else str(head))


# ---- every path where node text reaches the screen or the CLI (issue 23, items 1 and 2, done) ------
#
# What the terminal gets is checked, not what a function returns: the screen is rendered as Textual
# sends it (the compositor's full update, less its cursor moves) and searched for any C0 control
# but the line breaks, DEL and any C1 control. Markup-looking text must come out as it was written.

OSC52 = "\x1b]52;c;ZWNobyBoaQ==\x07"
LITERAL = "in [/root/.cache/x] [bold]b[/] [link=x]l[/link] [rank0]:"  # markup to Textual and Rich


def escapes(text: str, *, newlines: bool = True) -> list[str]:
    """The characters of ``text`` a terminal would act on (line breaks allowed where said)."""
    return [ch for ch in text if (ord(ch) < 0x20 and not (newlines and ch == "\n")) or 0x7F <= ord(ch) <= 0x9F]


def screen_text(app: App) -> str:
    """The screen as the terminal receives it, without the control segments (cursor moves)."""
    import io

    from rich.console import Console

    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True,
                      color_system="truecolor", record=True, legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text(styles=False)


def rendered(renderable, width: int = 400) -> str:
    """A Rich renderable as a terminal would get it (wide: nothing wraps in the way of a search)."""
    import io

    from rich.console import Console

    console = Console(width=width, file=io.StringIO(), force_terminal=True, color_system="truecolor",
                      record=True, legacy_windows=False)
    console.print(renderable)
    return console.export_text(styles=False)


def flat(text: str) -> str:
    """Rendered text with its padding and line ends squeezed (wrapped cells, table gaps)."""
    return " ".join(text.split())


def console_app(tmp_path):
    from sparkconsole.config import ClusterConfig, NodeConfig
    from sparkconsole.journal import Journal
    from sparkconsole.ui.app import SparkConsoleApp

    config = ClusterConfig(nodes=(NodeConfig("spark-a", "127.0.0.1", role="head"), NodeConfig("spark-b", "127.0.0.1")))
    return SparkConsoleApp(config, autopoll=False, remember_theme=False, journal=Journal(tmp_path / "journal.jsonl"))


def node_sample(node: str, words: list[str]):
    """A sample whose every text field is one of ``words`` (in turn): what a hostile or broken node
    could answer to the probe."""
    from itertools import cycle

    from sparkconsole.probe.samples import (
        GIB,
        Container,
        FastLink,
        GpuProcess,
        GpuSample,
        HostInfo,
        NodeSample,
        UnifiedMemory,
        freeze_unknown,
    )

    w = cycle(words)
    return NodeSample(
        node=node, taken_at=1.0,
        host=HostInfo(hostname=next(w), kernel=next(w), arch=next(w), docker_version=next(w)),
        memory=UnifiedMemory(total_bytes=128 * GIB, available_bytes=60 * GIB, gpu_process_bytes=40 * GIB, unified=True),
        driver_version=next(w), cuda_version=next(w),
        gpus=(GpuSample(index=0, name=next(w), utilization_pct=50.0),),
        gpu_processes=(GpuProcess(0, 7, "C", next(w), 1000.0), GpuProcess(0, 8, "C", next(w), 2000.0)),
        links=(FastLink(next(w), 1, next(w), "up", 200.0, ipv4=(next(w),)),),
        containers=(Container("c1", next(w), next(w), "running", next(w), mem_used_bytes=GIB),
                    Container("c2", next(w), next(w), "restarting", next(w))),  # restarting: an alert names it
        unknown=freeze_unknown({"ray": next(w)}),
    )


def set_nodes(app, words: list[str]) -> None:
    """spark-a up with a hostile sample, spark-b down with a hostile reason; the app notes both."""
    from sparkconsole.probe.state import NodeStatus

    a = app.poller.pollers["spark-a"].state
    a.sample, a.status, a.last_ok_at = node_sample("spark-a", words), NodeStatus.UP, app.clock()
    b = app.poller.pollers["spark-b"].state
    b.status, b.reason = NodeStatus.DOWN, words[-1]
    for name in ("spark-a", "spark-b"):
        app._note_changes(name)


# ---- one path at a time: each failed before the fix ---------------------------------------------


async def test_the_gpu_process_table_shows_a_process_name_as_text(tmp_path):
    """A process named like a traceback's path ended the app (MarkupError in the DataTable); one
    holding an OSC 52 reached the terminal."""
    from sparkconsole.ui.screens.node_detail import NodeDetailScreen

    app = console_app(tmp_path)
    async with app.run_test(size=(160, 120)) as pilot:
        await pilot.pause()
        set_nodes(app, [f"python3 {LITERAL}{OSC52}"])
        await app.push_screen(NodeDetailScreen("spark-a"))
        await pilot.pause()
        shown = screen_text(app)
        assert not escapes(shown)
        assert f"python3 {LITERAL}" in shown and "]52;" not in shown


async def test_the_wizard_output_pane_and_step_details_show_node_text_as_text(tmp_path):
    """Engine log lines (the output pane), a failed command's stderr, notes, a failed step's note
    and a decision's measurements: each with an OSC 52 and a title OSC that reached the terminal."""
    from sparkconsole.deploy.events import CommandEvent, DecisionEvent, NoteEvent, OutputEvent, StepEvent
    from sparkconsole.ui.screens.wizard import WizardScreen

    hostile = f"{LITERAL}{OSC52}\x1b]0;owned\x07\x9b2J"
    app = console_app(tmp_path)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        await app.push_screen(WizardScreen())
        await pilot.pause()
        screen = app.screen
        screen.feed([
            StepEvent("free-memory", "running"),
            OutputEvent("serve", "spark-a", f"(Worker pid=7) {hostile}"),
            CommandEvent("free-memory", "spark-a", f"docker stop {hostile}", rc=1, mutating=True,
                         output=f"Error: {hostile}\n\x1b[2Jsecond line"),
            NoteEvent("free-memory", f"note: {hostile}", "warning", "spark-a"),
            DecisionEvent("free-memory.stop", f"Stop {hostile}?", "yes", "yes", f"why {hostile}",
                          measured=[f"measured {hostile}"], by="auto"),
            StepEvent("free-memory", "failed", f"failed: {hostile}"),
        ])
        await pilot.pause()
        await pilot.pause()
        shown = screen_text(app)
        assert not escapes(shown)
        assert "owned" not in shown and "]52;" not in shown
        assert "(Worker pid=7) in [/root/.cache/x] [bold]b[/] [link=x]l[/link]" in shown  # the output pane
        assert f"Error: {LITERAL}" in shown and "second line" in shown  # the failed command's stderr
        assert f"note: {LITERAL}" in flat(shown) and f"failed: {LITERAL}" in flat(shown)


async def test_a_toast_and_the_events_strip_show_node_text_as_text(tmp_path):
    """A service action's result (the node's stderr) was a toast parsed as markup (MarkupError
    ended the app) and a line in the events strip with its escapes."""
    app = console_app(tmp_path)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        app.notify(f"stop vllm: {LITERAL}{OSC52}", title="spark-a", severity="error")
        app.add_event("critical", f"stop vllm: {LITERAL}{OSC52}")
        app.screen.refresh_all()
        await pilot.pause()
        await pilot.pause()
        shown = screen_text(app)
        assert not escapes(shown)
        assert f"stop vllm: {LITERAL}" in flat(shown) and "]52;" not in shown


async def test_the_overview_cards_table_and_alerts_show_node_text_as_text(tmp_path):
    """Container names and images in a card's Rich table were markup (MarkupError); a reason and
    an alert naming a container brought their escapes along; the command palette's entries name
    the containers, as markup too."""
    app = console_app(tmp_path)
    async with app.run_test(size=(180, 60)) as pilot:
        await pilot.pause()
        set_nodes(app, [f"{LITERAL}{OSC52}"])
        app.screen.refresh_all()
        await pilot.pause()
        await pilot.pause()
        cards = screen_text(app)
        assert not escapes(cards)
        assert LITERAL in cards and "]52;" not in cards
        assert f"container {LITERAL} is restarting" in flat(cards)  # the alert and its event
        app.screen.action_toggle_view()  # the table: one row per node
        await pilot.pause()
        assert not escapes(screen_text(app))
        app.action_command_palette()  # its entries name the containers, and it reads them as markup
        await pilot.pause()
        await pilot.press(*"tail")
        await pilot.pause(0.3)
        palette = screen_text(app)
        assert not escapes(palette) and f"Tail log of {LITERAL}" in palette


async def test_the_log_screens_banner_shows_a_drop_reason_as_text():
    """A dropped stream's reason (the transport's words, often the node's) was markup."""
    from sparkconsole.logs.follow import StreamDropped
    from sparkconsole.ui.screens.logs import LogScreen
    from tests.test_logs_ui import FakeFollower, until
    from tests.ui_support import Host

    fake = FakeFollower()
    app = Host(lambda: LogScreen("spark-a", f"vllm{OSC52}", lambda: fake))
    async with app.run_test(size=(120, 30)) as pilot:
        screen = app.screen
        fake.event(StreamDropped(reason=f"spark-a: {LITERAL}{OSC52}", retry_in=2))
        await until(pilot, lambda: screen.drops == 1)
        await pilot.pause()
        shown = screen_text(app)
        assert not escapes(shown)
        assert f"spark-a: {LITERAL}" in screen.banner_text and "]52;" not in shown


async def test_the_decision_and_confirmation_dialogs_show_node_text_as_text():
    """A decision quotes the nodes (containers an option stops, what was measured); the
    confirmation names a node's service. Both brought escapes to the terminal."""
    from sparkconsole.deploy.decisions import Decision, Option
    from sparkconsole.ui.screens.confirm import ConfirmScreen
    from sparkconsole.ui.screens.decision import DecisionScreen
    from tests.ui_support import Host

    hostile = f"{LITERAL}{OSC52}"
    decision = Decision("free-memory.stop", "free-memory", f"Stop {hostile}?", (f"uses 40 GiB: {hostile}",),
                        (Option(f"stop-{hostile}", f"stop {hostile}", why=f"why {hostile}"), Option("keep", "keep")),
                        f"stop-{hostile}", f"it holds {hostile}")
    app = Host(lambda: DecisionScreen(decision))
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.pause()
        shown = screen_text(app)
        assert not escapes(shown) and f"uses 40 GiB: {LITERAL}" in flat(shown)
        await pilot.press("enter")
        await pilot.pause()
    assert app.results == [f"stop-{hostile}"]  # the answer is the option's exact value
    app = Host(lambda: ConfirmScreen("spark-a", hostile, f"docker stop {hostile}", action="stop"))
    async with app.run_test(size=(140, 40)) as pilot:
        await pilot.pause()
        shown = screen_text(app)
        assert not escapes(shown) and "]52;" not in shown


async def test_the_calibration_view_shows_the_logs_model_name_as_text():
    """The model name read from the node's vLLM log went into a Label and a Static as markup."""
    from textual.widgets import Static

    from sparkconsole.ui.screens.calibration import CalibrationScreen
    from tests.test_logs_ui import until
    from tests.ui_support import Host

    log = f"INFO 01-01 00:00:00 [core.py:1] Initializing a V1 LLM engine (v0.17.0) with config: model='Q/{LITERAL}\x9b2J', x\n"
    app = Host(lambda: CalibrationScreen("spark-a", log))
    async with app.run_test(size=(130, 40)) as pilot:
        await until(pilot, lambda: app.screen.error is not None or app.screen.calibration is not None)
        await pilot.pause()
        shown = screen_text(app)
        assert not escapes(shown)
        assert f"Q/{LITERAL}" in str(app.screen.query_one("#cal-title", Static).render())


def test_the_cli_printer_prints_no_escape_from_a_failed_commands_stderr():
    """`sparkconsole deploy` printed a failed command's stderr even without -v: an OSC 52 set the
    operator's clipboard and CSI 2J cleared the screen."""
    import io

    from sparkconsole.commands.deploy import Printer
    from sparkconsole.deploy.events import CommandEvent, NoteEvent, StepEvent

    out = io.StringIO()
    printer = Printer(as_json=False, verbose=False, out=out)
    printer(CommandEvent("free-memory", "spark-a", "docker stop vllm", rc=1, mutating=True,
                         output=f"Error response from daemon: {LITERAL}{OSC52}\n\x1b[2Jgone\r\nlast"))
    printer(NoteEvent("recon", f"port 8000 is taken by {LITERAL}\x1b]0;owned\x1b\\", "warning", "spark-a"))
    printer(StepEvent("free-memory", "failed", f"stopped: {LITERAL}\x9b2J"))
    text = out.getvalue()
    assert not escapes(text)
    assert "]52;" not in text and "owned" not in text
    assert f"      Error response from daemon: {LITERAL}\n      gone\n      last\n" in text
    assert f"port 8000 is taken by {LITERAL}\n" in text and f"failed: stopped: {LITERAL}\n" in text


def test_the_cli_printers_json_escapes_c1_controls_and_keeps_the_exact_text():
    """--json keeps a node's exact words (a script reads them back) but writes no raw control:
    json.dumps escapes ESC itself; with ensure_ascii=False it left U+009B (CSI) and DEL raw."""
    import io
    import json

    from sparkconsole.commands.deploy import Printer
    from sparkconsole.deploy.events import NoteEvent

    out = io.StringIO()
    words = f"{LITERAL}{OSC52}\x9b2J\x7f\udcff — é"
    Printer(as_json=True, verbose=False, out=out)(NoteEvent("recon", words, "warning", "spark-a"))
    line = out.getvalue()
    assert line.endswith("}\n") and not escapes(line[:-1], newlines=False)
    assert "\\u009b" in line and "— é" in line  # readable non-ASCII stays as it was
    assert json.loads(line)["text"] == words
    line.encode("utf-8")  # no lone surrogate: a UTF-8 stdout can write it


def test_snapshot_and_parse_print_no_escape(capsys, tmp_path):
    """`sparkconsole snapshot` printed a node's reason and GPU name raw; `parse` printed what it read
    with ensure_ascii=False (raw C1 controls)."""
    import argparse

    from sparkconsole.commands import parse, snapshot
    from sparkconsole.probe.state import NodeState, NodeStatus

    line = snapshot._line(NodeState("spark-b", NodeStatus.DOWN, reason=f"ssh: {LITERAL}{OSC52}"))
    assert not escapes(line) and line.endswith(f"ssh: {LITERAL}")
    line = snapshot._line(NodeState("spark-a", NodeStatus.UP, sample=node_sample("spark-a", [f"GB10{OSC52}"])))
    assert not escapes(line) and " GB10 " in line
    saved = tmp_path / "ps.txt"
    saved.write_text('{"ID":"c1","Names":"vllm\\u009b2J\u009b","Image":"img","State":"running","Status":"Up"}\n')
    parse.run(argparse.Namespace(kind="docker-ps", file=str(saved)))
    printed = capsys.readouterr().out
    assert not escapes(printed) and "\\u009b" in printed


# ---- the fuzz: random bytes, escape sequences and markup through every path ------------------------

FRAGMENTS = (
    OSC52, "\x1b]0;owned\x1b\\", "\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\", "\x1b[2J", "\x1b[31;1m", "\x1b[?1049h",
    "\x1bP+q544e\x1b\\", "\x1b_apc\x1b\\", "\x1bc", "\x1b", "\x9b31m", "\x9d0;t\x9c", "\x90dcs\x9c", "\x85", "\x7f",
    "\x00", "\x07", "\x08", "\x0c", "\r", "\n", "\r\n", "\t", "[bold]", "[/]", "[/bold]", "[link=x]", "[@click=app.quit]",
    "in [/root/.cache/x]", "[rank0]:", "[b", "\\[", "]", "$x", "ok", " ", "é", "—", "中",
)


def _decoded(errors: str) -> st.SearchStrategy[str]:
    return st.binary(max_size=24).map(lambda b: b.decode("utf-8", errors))


HOSTILE_TEXT = st.lists(st.one_of(st.sampled_from(FRAGMENTS), _decoded("replace"), _decoded("surrogateescape"),
                                  st.text(max_size=8)), max_size=8).map("".join)


def hostile_events(w: list[str]) -> list:
    """Every kind of deploy event, each text field one of ``w``."""
    from itertools import cycle

    from sparkconsole.deploy.events import (
        CommandEvent,
        DecisionEvent,
        NoteEvent,
        OutputEvent,
        ProgressEvent,
        ResultEvent,
        StepEvent,
    )

    t = cycle(w)
    return [
        StepEvent("free-memory", "running", next(t)),
        CommandEvent("free-memory", next(t), next(t), summary=next(t), mutating=True),
        CommandEvent("free-memory", "spark-a", next(t), rc=1, mutating=True, duration_s=1.5, output=next(t)),
        CommandEvent("recon", "spark-a", next(t), rc=2, mutating=False, output=next(t)),
        ProgressEvent("weights", "spark-a", next(t), 0.5, next(t)),
        OutputEvent("serve", "spark-a", next(t)),
        NoteEvent("recon", next(t), "warning", next(t)),
        DecisionEvent("free-memory.stop", next(t), next(t), next(t), next(t), measured=[next(t), next(t)],
                      options=[{"value": next(t), "label": next(t)}], by="auto"),
        StepEvent("free-memory", "failed", next(t)),
        ResultEvent(False, None, next(t)),
    ]


@settings(max_examples=150, deadline=None)
@given(st.lists(HOSTILE_TEXT, min_size=1, max_size=6))
def test_fuzz_the_cli_prints_no_escape_and_every_word_as_written(words):
    """The deploy printer (plain and --json, -v and not) and snapshot's lines, on a strict UTF-8
    stream as a terminal's stdout is: no crash, no control character out, the node's words as
    display_text shows them, and --json giving back the exact text."""
    import io
    import json

    from sparkconsole.commands import snapshot
    from sparkconsole.commands.deploy import Printer
    from sparkconsole.logs.follow import display_lines
    from sparkconsole.probe.state import NodeState, NodeStatus

    events = hostile_events(words)
    for verbose in (False, True):
        raw = io.BytesIO()
        out = io.TextIOWrapper(raw, encoding="utf-8", errors="strict", newline="\n", write_through=True)
        printer = Printer(as_json=False, verbose=verbose, out=out)
        for e in events:
            printer(e)
        printed = raw.getvalue().decode("utf-8")
        assert not escapes(printed)
        assert display_lines(events[6].text) in printed  # the note: markup-looking text, as written
    out_json = io.StringIO()
    printer = Printer(as_json=True, verbose=False, out=out_json)
    for e in events:
        printer(e)
    lines = out_json.getvalue().splitlines()
    assert len(lines) == len(events)
    for e, line in zip(events, lines, strict=True):
        assert not escapes(line, newlines=False)
        line.encode("utf-8")
        assert json.loads(line) == json.loads(json.dumps(e.to_json()))  # the exact words, escaped
    for state in (NodeState("spark-b", NodeStatus.DOWN, reason=words[0]),
                  NodeState("spark-a", NodeStatus.UP, sample=node_sample("spark-a", words))):
        line = snapshot._line(state)
        assert not escapes(line, newlines=False)
        line.encode("utf-8")


@settings(max_examples=40, deadline=None)
@given(st.lists(HOSTILE_TEXT, min_size=1, max_size=6))
def test_fuzz_the_render_functions_show_node_text_plain(words):
    """What the widgets draw from, called as they call it: the wizard's step list and body (from
    its events through WizardRun), a node's card, its panel beside the wizard, its table row, the
    events strip and the alerts (through the app's own add_event and alerts)."""
    from collections import deque
    from types import SimpleNamespace

    from sparkconsole.probe.state import NodeState, NodeStatus
    from sparkconsole.ui.app import SparkConsoleApp
    from sparkconsole.ui.screens.overview import events_text
    from sparkconsole.ui.screens.wizard import LIST_STEPS, WizardRun, step_body_text, step_list_text
    from sparkconsole.ui.widgets.node_card import card_renderable
    from sparkconsole.ui.widgets.node_panel import panel_renderable
    from sparkconsole.ui.widgets.node_table import node_row, row_text

    run = WizardRun()
    kept = [run.apply(e) for e in hostile_events(words)]
    for step in LIST_STEPS:
        assert not escapes(rendered(step_body_text(run, step)))
    assert not escapes(rendered(step_list_text(run, "free-memory")))
    body = rendered(step_body_text(run, "recon"), width=2000)
    assert all(line.strip() in body for line in kept[6].text.split("\n"))  # the note, as written

    up = NodeState("spark-a", NodeStatus.UP, sample=node_sample("spark-a", words), last_ok_at=1.0)
    down = NodeState("spark-b", NodeStatus.DOWN, reason=words[-1])
    fake = SimpleNamespace(states=lambda: [up, down], clock=lambda: 2.0, events=deque(), _alerts_memo=None)
    alerts = SparkConsoleApp.alerts(fake)  # the app's own: where the UI takes the alerts
    for state in (up, down):
        mine = [a for a in alerts if a.node == state.name]
        assert not escapes(rendered(card_renderable(state, "head", 2.0, mine, width=76), width=80))
        assert not escapes(rendered(panel_renderable(state, "head", 36), width=40))
        assert not escapes(row_text(node_row(1, state, mine, 2.0), 12, 20, 40).plain, newlines=False)
    for a in alerts:
        SparkConsoleApp.add_event(fake, "warning", f"alert {a.node}: {a.text}")
    for w in words:
        SparkConsoleApp.add_event(fake, "critical", w)
    assert not escapes(rendered(events_text(fake.events)))


async def _drive_the_console(words: list[str]) -> None:
    """The console itself: the overview (cards, then the table), a node's detail, the wizard fed
    every event, a decision and a toast, each checked on the screen the terminal would get."""
    import tempfile
    from pathlib import Path

    from sparkconsole.deploy.decisions import Decision, Option
    from sparkconsole.ui.screens.decision import DecisionScreen
    from sparkconsole.ui.screens.node_detail import NodeDetailScreen
    from sparkconsole.ui.screens.wizard import WizardScreen

    def clean(app) -> str:
        shown = screen_text(app)
        assert not escapes(shown), escapes(shown)
        return shown

    with tempfile.TemporaryDirectory() as tmp:
        app = console_app(Path(tmp))
        async with app.run_test(size=(150, 50)) as pilot:
            await pilot.pause()
            set_nodes(app, [LITERAL, *words])
            app.screen.refresh_all()
            await pilot.pause()
            clean(app)
            app.screen.action_toggle_view()
            await pilot.pause()
            clean(app)
            await app.push_screen(NodeDetailScreen("spark-a"))
            await pilot.pause()
            assert LITERAL in clean(app)  # the hostname, as the node gave it
            app.pop_screen()
            await app.push_screen(WizardScreen())
            await pilot.pause()
            app.screen.feed(hostile_events(words))
            await pilot.pause()
            await pilot.pause()
            clean(app)
            decision = Decision("d.x", "recon", words[0], tuple(words), (Option(words[-1], words[0], why=words[-1]),),
                                words[-1], words[0])
            await app.push_screen(DecisionScreen(decision))
            await pilot.pause()
            clean(app)
            app.pop_screen()
            for w in words:
                app.notify(w, title=w)
            await pilot.pause()
            await pilot.pause()
            clean(app)


@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(HOSTILE_TEXT, min_size=2, max_size=5))
def test_fuzz_the_console_on_screen(words):
    """The real widgets under Textual: no crash (a MarkupError ends the app), no escape byte out."""
    import asyncio

    asyncio.run(_drive_the_console(words))


async def test_a_progress_bar_for_any_node_and_label_gets_a_valid_unique_id(tmp_path):
    """A bar's widget id was made with ``str.isalnum``: a non-ASCII letter raised BadIdentifier
    and ended the app (the fuzz found it), and "a-b"/"c" and "a"/"b-c" made the same id."""
    from sparkconsole.deploy.events import ProgressEvent
    from sparkconsole.ui.screens.wizard import WizardScreen

    app = console_app(tmp_path)
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        await app.push_screen(WizardScreen())
        await pilot.pause()
        app.screen.feed([ProgressEvent("weights", "spark-é", "download", 0.5, f"{LITERAL}{OSC52}"),
                         ProgressEvent("weights", "a-b", "c", 0.2), ProgressEvent("weights", "a", "b-c", 0.3)])
        await pilot.pause()
        await pilot.pause()
        assert len(app.screen.query(".progress-row")) == 3
        shown = screen_text(app)
        assert not escapes(shown)
        assert any(LITERAL in str(label.render()) for label in app.screen.query(".progress-detail"))
