"""The deployment wizard's face: the steps, the step at work, and every node's memory, live.

The wizard itself is headless (:mod:`sparkconsole.deploy`): a :class:`~sparkconsole.deploy.runner.Runner`
walks the :class:`~sparkconsole.deploy.flow.Flow` through :func:`~sparkconsole.deploy.session.run_flow`
and says what happens as typed events. This screen is one reader of that stream (the CLI's printer is
another), so the two never disagree about what ran:

* the runner's ``emit`` posts each event to the screen as a :class:`WizardEvent` message; the screen
  folds it into a :class:`WizardRun` (plain data) and redraws from it. Nothing in the runner touches
  a widget, and a test can feed the same events to get the same screen;
* its ``answer`` callback shows a :class:`~sparkconsole.ui.screens.decision.DecisionScreen` (Esc there
  stops the run at the decision), its ``confirm`` callback the generic
  :class:`~sparkconsole.ui.screens.confirm.ConfirmScreen` with the step's changing commands (what
  each does first, the exact commands on ``c``), both skipped under auto (``a``) except a teardown's,
  which is the one question ``t`` asks. A question waits until the wizard is on screen: the operator who went
  back to the overview is told, and answers when they come back with ``w``;
* the screen does not wire the run: it posts a :class:`~sparkconsole.ui.messages.DeploymentRequested`
  to the app (the deployment, its options, these callbacks), and the app opens it through
  :func:`~sparkconsole.deploy.opening.open_deployment`, the opener ``sparkconsole deploy`` and the
  tests use (the cluster's lock, the transports, the runner, the flow). The run is a worker of the
  *app* (group ``wizard``, exclusive), so it goes on when the operator leaves the screen, and its
  failures end in the app's one worker handler. The app keeps this screen installed, so ``w`` shows
  the same run again. A second wizard on the same cluster (another console, a ``sparkconsole
  deploy``) is refused at Enter with the holder's name, and the screen says so.

Beside the steps, one :class:`~sparkconsole.ui.widgets.node_panel.NodePanel` per node is fed the
poller's samples (the overview's), so memory is seen falling as services stop and rising as
weights load. Read-only consoles plan and show every step (the runner is read-only and plan-only:
nothing that changes a node is sent). On the demo cluster a deployment runs the sim's clock at the
demo's ``deploy_speed`` (x40, as ``sparkconsole deploy --demo``), and the header says so.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Button, Footer, Header, Label, Log, ProgressBar, Static

from sparkconsole.deploy.decisions import Decision, DecisionStop
from sparkconsole.deploy.events import (
    CommandEvent,
    DecisionEvent,
    Event,
    NoteEvent,
    OutputEvent,
    ProgressEvent,
    ResultEvent,
    StepEvent,
)
from sparkconsole.deploy.flow import Options
from sparkconsole.deploy.state import DeploymentState
from sparkconsole.deploy.steps import STEP_IDS, STEPS
from sparkconsole.logs.follow import display_fields, display_lines, display_text
from sparkconsole.remote import RemoteCommand
from sparkconsole.ui.keymap import WIZARD_BINDINGS
from sparkconsole.ui.messages import DeploymentRequested, OpenLogs, RehearsalRequested
from sparkconsole.ui.screens.confirm import ConfirmScreen
from sparkconsole.ui.screens.live import LiveScreen
from sparkconsole.ui.widgets.node_panel import NodePanel

STEP_TITLES: dict[str, str] = {s.id: s.title for s in STEPS} | {
    "teardown": "Remove what this deployment started"}
LIST_STEPS = (*STEP_IDS, "teardown")
MARKS: dict[str, tuple[str, str]] = {
    "pending": ("○", "dim"),
    "running": ("▶", "bold cyan"),
    "done": ("✓", "green"),
    "skipped": ("↷", "green"),
    "failed": ("✗", "bold red"),
    "waiting": ("?", "bold yellow"),
}
OUTPUT_LINES = 400  # the engine log kept on screen (the node keeps all of it)
COMMANDS_KEPT = 60  # per step: a long step (polls) shows its latest commands


# ---- messages: the runner's events, carried to the screen ------------------------------------


class WizardEvent(Message):
    """One deploy event for the screen (posted by the runner's ``emit``)."""

    def __init__(self, event: Event) -> None:
        super().__init__()
        self.event = event

    def can_replace(self, message: Message) -> bool:
        """A newer progress of the same bar replaces one not yet drawn (downloads report often)."""
        mine, other = self.event, getattr(message, "event", None)
        return (isinstance(mine, ProgressEvent) and isinstance(other, ProgressEvent)
                and (mine.step, mine.node, mine.label) == (other.step, other.node, other.label))


class WizardPlanned(Message):
    """A step's changes, per node, before they run (the flow's ``on_plan``: what the step's ``send``
    does, found by rehearsing it): (node, exact command, mutating, what it does in words)."""

    def __init__(self, step: str, commands: list[tuple[str, str, bool, str]]) -> None:
        super().__init__()
        self.step = step
        self.commands = commands


class WizardRunState(Message):
    """The run started (``running``) or ended (not ``running``; ``error`` when it crashed)."""

    def __init__(self, running: bool, error: str = "") -> None:
        super().__init__()
        self.running = running
        self.error = error


# ---- what the screen shows, as data ---------------------------------------------------------


@dataclass
class CommandLine:
    node: str
    command: str
    summary: str
    mutating: bool
    rc: int | None = None
    duration_s: float | None = None
    output: str = ""


@dataclass
class StepView:
    state: str = "pending"
    note: str = ""
    planned: list[tuple[str, str, bool, str]] = field(default_factory=list)
    commands: deque[CommandLine] = field(default_factory=lambda: deque(maxlen=COMMANDS_KEPT))
    notes: list[NoteEvent] = field(default_factory=list)
    decisions: list[DecisionEvent] = field(default_factory=list)


@dataclass
class WizardRun:
    """Everything the events said so far: the screen draws only from this.

    Node text is data: the events carry the nodes' own words (engine log lines, a failed
    command's stderr, recon's notes, an error) and :meth:`apply`, the one way events come in,
    keeps them cleaned (:func:`~sparkconsole.logs.follow.display_fields`: no escape sequence,
    no control character); every widget here then shows them as plain Text or in a ``Log``,
    never as markup."""

    steps: dict[str, StepView] = field(default_factory=lambda: {s: StepView() for s in LIST_STEPS})
    progress: dict[tuple[str, str], ProgressEvent] = field(default_factory=dict)  # (node, label)
    output: deque[tuple[str, str]] = field(default_factory=lambda: deque(maxlen=OUTPUT_LINES))
    current: str | None = None
    result: ResultEvent | None = None

    def view(self, step: str) -> StepView:
        return self.steps.setdefault(step, StepView())

    def apply(self, e: Event) -> Event:
        """Fold one event in; returns it as kept (cleaned), for the caller to draw from."""
        e = display_fields(e)
        if isinstance(e, StepEvent):
            v = self.view(e.step)
            if e.state == "skipped" and v.state == "done":
                # a later pass of the flow (caches → plan again) found its work done: it still ran
                v.note = v.note or e.note
            else:
                v.state, v.note = e.state, e.note
            if e.state in ("running", "waiting", "failed") or self.current is None:
                self.current = e.step
        elif isinstance(e, CommandEvent):
            v = self.view(e.step)
            line = next((c for c in reversed(v.commands) if c.rc is None and c.node == e.node
                         and c.command == e.command), None) if e.rc is not None else None
            if line is None:
                line = CommandLine(e.node, e.command, e.summary, e.mutating)
                v.commands.append(line)
            line.rc, line.duration_s, line.output = e.rc, e.duration_s, e.output
        elif isinstance(e, NoteEvent):
            self.view(e.step).notes.append(e)
        elif isinstance(e, DecisionEvent):
            step = e.id.split(".", 1)[0]
            v = self.view(step if step in self.steps else self.current or step)
            if e.answer is None:
                v.state = "waiting"  # asked: the answer comes in a second event with the same id
                return e
            v.decisions = [d for d in v.decisions if d.id != e.id] + [e]
        elif isinstance(e, ProgressEvent):
            self.progress[(e.node, e.label)] = e
        elif isinstance(e, OutputEvent):
            self.output.append((e.node, e.text))
        elif isinstance(e, ResultEvent):
            self.result = e
        return e

    def plan(self, step: str, commands: list[tuple[str, str, bool, str]]) -> None:
        """A step's planned commands, cleaned for the screen like the events (a command can hold
        a node's words: a container's or a unit's name)."""
        self.view(step).planned = [(display_text(node), display_lines(cmd), mutating, display_lines(summary))
                                   for node, cmd, mutating, summary in commands]


def _first_line(text: str, limit: int = 160) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    more = "…" if len(line) > limit or "\n" in text.strip() else ""
    return line[:limit] + more


def step_list_text(run: WizardRun, shown: str | None) -> Text:
    """The steps, one line each: mark, id, state; the step shown in the middle in reverse."""
    text = Text(no_wrap=True, overflow="ellipsis")
    for i, step in enumerate(LIST_STEPS):
        v = run.view(step)
        mark, style = MARKS.get(v.state, ("·", "dim"))
        if step == "teardown":
            text.append("\n")
        line = Text()
        line.append(f" {mark} ", style=style)
        line.append(f"{step:<11}", style="bold" if v.state == "running" else "")
        line.append(f" {v.state if v.state != 'pending' else ''}", style=style)
        if step == shown:
            line.stylize("reverse")
        text.append(line)
        if i < len(LIST_STEPS) - 1:
            text.append("\n")
    return text


def _marked(mark: Text, text: Text, indent: int = 2) -> Table:
    """``mark`` then ``text``, the text wrapping under itself."""
    grid = Table.grid(expand=True, padding=0)
    grid.add_column(width=indent + mark.cell_len, no_wrap=True)
    grid.add_column(ratio=1)
    grid.add_row(Text(" " * indent) + mark, text)
    return grid


def _line() -> Text:
    return Text(no_wrap=True, overflow="ellipsis")


def step_body_text(run: WizardRun, step: str) -> Group:
    """The step in the middle: its note, decisions, planned commands, commands run, notes.

    Commands are one line each (cut with an ellipsis: the full text is in the journal and in the
    confirmation dialog); notes wrap, since they are what the operator reads."""
    v = run.view(step)
    parts: list[Text | Table] = []
    if v.note:
        style = "bold red" if v.state == "failed" else "yellow" if v.state == "waiting" else "dim"
        parts += [Text(v.note, style=style), Text("")]
    for d in v.decisions:
        line = Text("? ", style="bold yellow")
        line.append(f"{d.title}: ", style="bold")
        line.append(f"{d.answer}", style="bold cyan")
        line.append(f" ({d.by}" + ("" if d.answer == d.recommended else f"; recommended {d.recommended}") + ")",
                    style="dim")
        parts.append(line)
    if v.decisions:
        parts.append(Text(""))
    if v.planned:
        parts.append(Text("Planned", style="bold underline"))
        for node, cmd, mutating, summary in v.planned:
            line = _line()
            line.append(f"  {node} ", style="cyan")
            if summary:  # what it does in words, then the exact command that will be sent
                line.append(summary, style="bold" if mutating else "dim")
                parts.append(line)
                line = _line()
                line.append("      ")
            line.append("$ " if mutating else "· ", style="bold" if mutating else "dim")
            line.append(_first_line(cmd, 400), style="dim" if summary or not mutating else "")
            parts.append(line)
        parts.append(Text(""))
    if v.commands:
        parts.append(Text("Commands", style="bold underline"))
        for c in v.commands:
            line = _line()
            if c.rc is None:
                line.append("  …     ", style="bold cyan")
            elif c.rc == 0:
                line.append("  ✓     ", style="green")
            elif c.mutating:
                line.append(f"  ✗ {c.rc:>3} ", style="bold red")
            else:  # a read that answers "no" (a file not there yet) is information, not an error
                line.append(f"  · {c.rc:>3} ", style="dim")
            if c.duration_s:
                line.append(f"{c.duration_s:6.1f} s ", style="dim")
            else:
                line.append(" " * 9)
            line.append(f"{c.node} ", style="cyan")
            line.append(_first_line(c.summary or c.command, 400), style="bold" if c.mutating else "")
            parts.append(line)
            if c.mutating and c.rc not in (None, 0) and c.output:
                for out in c.output.splitlines()[-3:]:
                    err = _line()
                    err.append(f"      {out}", style="red")
                    parts.append(err)
        parts.append(Text(""))
    if v.notes:
        parts.append(Text("Notes", style="bold underline"))
        for n in v.notes:  # a long note wraps under its own first word, its mark stays alone
            style = {"warning": "dark_orange", "error": "bold red"}.get(n.level, "")
            line = Text()
            if n.node:
                line.append(f"{n.node}: ", style="cyan")
            line.append(n.text, style=style)
            parts.append(_marked(Text("! " if n.level != "info" else "· ", style=style or "dim"), line))
    if not parts:
        parts.append(Text("Nothing yet." if v.state == "pending" else "…", style="dim"))
    return Group(*parts)


def commands_table(commands: Sequence[tuple[str, str]]) -> Table:
    """``node $ command`` rows; a long command wraps under itself, not under the node's name."""
    grid = Table.grid(padding=(0, 1), expand=True)
    grid.add_column(no_wrap=True)
    grid.add_column(ratio=1, overflow="fold")
    for node, command in commands:
        grid.add_row(Text(f"{node} $", style="cyan"), Text(command, style="bold"))
    return grid


def summaries_table(commands: Sequence[tuple[str, str, str]]) -> Table:
    """``node  what it does`` rows, one per command (its summary; the command's first line where it
    has none), the same summary on the same node said once."""
    grid = Table.grid(padding=(0, 1), expand=True)
    grid.add_column(no_wrap=True)
    grid.add_column(ratio=1)
    seen: set[tuple[str, str]] = set()
    for node, command, summary in commands:
        said = summary or _first_line(command, 100)
        if (node, said) in seen:
            continue
        seen.add((node, said))
        grid.add_row(Text(node, style="cyan"), Text(said, style="bold"))
    return grid


class StepConfirmScreen(ConfirmScreen):
    """The generic confirmation, for a step's changing commands: wider, what each command does in one
    line first and the exact commands on ``c`` (a step's scripts are long, quoted shell nobody reads
    to say yes), scrolled when there are many, and the node panels still moving underneath."""

    BINDINGS = [*ConfirmScreen.BINDINGS,
                Binding("c", "toggle_commands", "Exact commands", id="confirm.commands",
                        tooltip="Show the exact commands that will be sent, or back to what each does.")]

    def __init__(self, step: str, commands: Sequence[tuple[str, str] | tuple[str, str, str]], *,
                 note: str, title: str | None = None) -> None:
        # shown, not run (the runner sends its own RemoteCommands): cleaned, a node's words in them
        full = [(display_text(c[0]), display_lines(c[1]), display_lines(c[2]) if len(c) > 2 else "")
                for c in commands]
        nodes = ", ".join(dict.fromkeys(n for n, _, _ in full))
        count = f"{len(full)} command{'s' if len(full) != 1 else ''}"
        super().__init__(nodes, title or f"the {step} step's {count}", "\n".join(f"{n} $ {c}" for n, c, _ in full),
                         action="run", note=note)
        self.step = step
        self.full = full
        self.commands = [(n, c) for n, c, _ in full]
        self.exact = False  # c: the exact commands instead of what they do

    def _lead(self) -> Text:
        many = len(self.full) != 1
        nodes = len({n for n, _, _ in self.full})
        where = "on the node" if nodes == 1 else f"on {nodes} nodes"
        if self.exact:
            what = (f"These commands will run {where}, in this order:" if many
                    else f"This command will run {where}:")
            return Text(what + "  (c: what each does)", style="dim")
        what = f"This step will, {where}:" if many else f"This will, {where}:"
        return Text(what + "  (c: the exact commands)", style="dim")

    def body(self) -> Table:
        return commands_table(self.commands) if self.exact else summaries_table(self.full)

    def compose(self) -> ComposeResult:
        title = Text.assemble(("Run ", "bold"), (self.service, "bold yellow"), (" on ", "bold"),
                              (self.node, "bold cyan"), ("?", "bold"))
        with Vertical(id="confirm-box"):
            yield Static(title, id="confirm-title")
            yield Static(self._lead(), id="confirm-lead")
            with VerticalScroll(id="step-confirm-scroll", can_focus=False):
                yield Static(self.body(), id="confirm-command")
            yield Static(Text(self.note or ""), id="confirm-note")
            with Horizontal(id="confirm-buttons"):
                yield Button("Yes, run (y)", variant="warning", id="yes")
                yield Button("No (n)", variant="primary", id="no")

    def action_toggle_commands(self) -> None:
        self.exact = not self.exact
        self.query_one("#confirm-lead", Static).update(self._lead())
        self.query_one("#confirm-command", Static).update(self.body())


def _progress_id(node: str, label: str) -> str:
    """The widget id of one (node, label) bar. Textual takes only ASCII letters, digits, ``-`` and
    ``_`` (``str.isalnum`` let an "é" through: BadIdentifier ended the app), and no two bars may
    share one (the readable part alone makes "a-b"/"c" and "a"/"b-c" the same): a digest of the
    key tells them apart."""
    safe = "".join(ch if ch.isascii() and ch.isalnum() else "-" for ch in f"{node}-{label}")
    digest = hashlib.blake2s(f"{node}\0{label}".encode("utf-8", "surrogatepass"), digest_size=4).hexdigest()
    return f"progress-{safe}-{digest}"


# ---- the screen ---------------------------------------------------------------------------------


class WizardScreen(LiveScreen):
    """Deploy a model across the nodes, step by step, with the nodes' memory beside it."""

    BINDINGS = WIZARD_BINDINGS
    AUTO_FOCUS = None
    HELP = ("The deployment wizard: Enter starts (or resumes) the run; each decision opens a dialog with "
            "the recommendation first, and each step's changing commands are shown before they run. a: "
            "auto (take the recommendations, ask nothing). Esc goes back while the run goes on; w shows it again.")

    def __init__(self, options: Options | None = None, *, until: str | None = None, auto: bool = False,
                 state: DeploymentState | None = None, name: str | None = None, id: str | None = None) -> None:
        super().__init__(name=name, id=id)
        self.options = options or Options()
        self.until = until
        self.auto = auto
        self.state = state  # the deployment shown (and resumed by Enter)
        self.run = WizardRun()
        self.running = False
        self.error = ""  # why the last run could not start or crashed ("" when it did not)
        self.shown: str | None = None  # the step in the middle; None: follow the run
        self._visible = asyncio.Event()
        self._waiting_told = False
        self._panels: dict[str, NodePanel] = {}
        self._bars: dict[tuple[str, str], tuple[ProgressBar, Label]] = {}
        self._bar_steps: dict[tuple[str, str], str] = {}  # the step each bar belongs to

    # ---- layout ------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="wizard-status")
        yield Static(id="wizard-result")
        with Horizontal(id="wizard-body"):
            yield Static(id="wizard-steps")
            with Vertical(id="wizard-main"):
                yield Static(id="wizard-step-title")
                with VerticalScroll(id="wizard-step-scroll", can_focus=False):
                    yield Static(id="wizard-step-body")
                yield Vertical(id="wizard-progress")
                yield Log(max_lines=OUTPUT_LINES, id="wizard-output", auto_scroll=True)
            with VerticalScroll(id="wizard-nodes", can_focus=False):
                for i, node in enumerate(self.sc.config.nodes, start=1):
                    yield NodePanel(node.name, node.role, i)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#wizard-steps").border_title = "Steps"
        log = self.query_one("#wizard-output", Log)
        log.border_title = "Engine output"
        log.can_focus = False
        log.display = False
        self._panels = {p.node: p for p in self.query(NodePanel)}
        self._layout(self.size.width)
        self._draw_run()
        self.mark_ready()

    def on_resize(self, event: Any) -> None:
        self._layout(event.size.width)

    def _layout(self, width: int) -> None:
        """Node panels to the right when there is room, else in a row below the steps."""
        self.set_class(width < 130, "-narrow")

    def on_screen_resume(self) -> None:
        self._visible.set()
        self._waiting_told = False
        self.refresh_all()

    def on_screen_suspend(self) -> None:
        self._visible.clear()

    # ---- drawing -----------------------------------------------------------------------------

    def draw(self) -> None:
        """The node panels, from the poller's states (called on every poll and every second)."""
        app = self.sc
        for name, panel in self._panels.items():
            panel.show(app.node_state(name))

    def draw_node(self, name: str) -> None:
        """One node's poll ended: its panel only."""
        panel = self._panels.get(name)
        if panel is not None:
            panel.show(self.sc.node_state(name))

    @property
    def read_only(self) -> bool:
        return bool(self.sc.config.read_only)

    def status_text(self) -> Text:
        app = self.sc
        text = Text()
        if self.state is not None:
            text.append("deployment ", style="dim")
            text.append(self.state.id, style="bold")
            text.append(" · ")
        text.append(self.options.model, style="bold")
        nodes = [display_text(n.name) for n in app.config.nodes]  # node words: cleaned
        text.append(f" on {', '.join(nodes)}", style="dim")
        text.append("  ")
        if self.auto:
            text.append(" AUTO ", style="bold black on yellow")
            text.append(" takes every recommendation (a: ask)", style="dim")
        else:
            text.append("asks first (a: auto)", style="dim")
        if self.read_only:
            text.append("  READ-ONLY: plans and shows every step, sends nothing that changes a node",
                        style="bold red")
        speed = self.deploy_speed()
        if speed is not None:  # one piece: the words never split over two lines
            text.append("  " + f"demo x{speed:g}".replace(" ", "\u00a0"), style="bold")
        if self.until:
            text.append(f"  stops after {self.until}", style="dim")
        return text

    def deploy_speed(self) -> float | None:
        """How much faster than the wall the demo's sim runs a deployment; None off the demo."""
        demo = self.sc.demo
        return None if demo is None else max(demo.speed, demo.deploy_speed)

    def result_text(self) -> Text:
        r = self.run.result
        if self.running:
            step = self.run.current or "recon"
            return Text(f"▶ running: {step} — {STEP_TITLES.get(step, step)}", style="bold cyan")
        if r is None and self.error:
            return Text(f"✗ {self.error}", style="bold red")
        if r is None:
            if self.state is not None and self.state.steps:
                return Text("stopped · Enter resumes (finished steps are not run again)", style="yellow")
            return Text("ready · Enter starts the deployment", style="bold")
        if r.ok and r.endpoint:
            text = Text(f"✓ served and verified: {r.endpoint}", style="bold green")
            if r.tokens_per_s:
                text.append(f" · {r.tokens_per_s} tok/s", style="green")
            return text
        if r.ok:
            return Text(f"✓ {r.message}", style="bold green")
        at = self.run.current
        if at is not None and self.run.view(at).state == "waiting":
            return Text(f"? stopped at a decision in {at} · Enter asks it again", style="bold yellow")
        return Text(f"✗ stopped: {r.message} · Enter resumes", style="bold red")

    def _draw_run(self) -> None:
        run = self.run
        step = self.shown or run.current or LIST_STEPS[0]
        self.query_one("#wizard-status", Static).update(self.status_text())
        self.query_one("#wizard-result", Static).update(self.result_text())
        self.query_one("#wizard-steps", Static).update(step_list_text(run, step))
        title = Text(f"{step}", style="bold")
        title.append(f"  {STEP_TITLES.get(step, '')}")
        state = run.view(step).state
        mark, style = MARKS.get(state, ("·", "dim"))
        title.append(f"   {mark} {state}", style=style)
        if self.shown is not None and self.shown != run.current:
            title.append("   (↑/↓ browse; the run is at " + (run.current or "—") + ")", style="dim")
        self.query_one("#wizard-step-title", Static).update(title)
        self.query_one("#wizard-step-body", Static).update(step_body_text(run, step))

    def _draw_progress(self, e: ProgressEvent) -> None:
        """One bar per (node, label), made on its first event and moved on by the next ones."""
        key = (e.node, e.label)
        if key not in self._bars:
            label = Text(f"{e.label:<9}", style="bold")
            label.append(e.node, style="cyan")
            bar = ProgressBar(total=100, show_eta=False, classes="progress-bar")
            detail = Label("", classes="progress-detail")
            self._bars[key] = (bar, detail)
            self.query_one("#wizard-progress", Vertical).mount(
                Horizontal(Label(label, classes="progress-label"), bar, detail, id=_progress_id(*key),
                           classes="progress-row"))
        bar, detail = self._bars[key]
        self._bar_steps[key] = e.step
        if e.fraction is None:
            bar.update(total=None)
        else:
            bar.update(total=100, progress=round(max(0.0, min(1.0, e.fraction)) * 100, 1))
        detail.update(Text(display_lines(e.detail, " ")))  # a node's progress line, on one line: plain, never markup

    def _finish_bars(self, step: str) -> None:
        """A finished step's bars read 100 % (its last report may have come before the end: the
        download's last tqdm line, the image load that reports no fraction)."""
        for key, owner in self._bar_steps.items():
            last = self.run.progress.get(key)
            if owner != step or last is None or last.fraction == 1.0:
                continue
            bar, detail = self._bars[key]
            bar.update(total=100, progress=100)
            detail.update(Text("✓ done", style="green"))

    # ---- events from the runner --------------------------------------------------------------

    def on_wizard_event(self, message: WizardEvent) -> None:
        e = self.run.apply(message.event)  # cleaned: what follows draws node text from this only
        if isinstance(e, StepEvent) and e.state == "running":
            self.shown = None  # follow the run to its new step
        if isinstance(e, StepEvent) and e.state in ("done", "skipped"):
            self._finish_bars(e.step)
        if isinstance(e, ProgressEvent):
            self._draw_progress(e)
            return
        if isinstance(e, OutputEvent):
            log = self.query_one("#wizard-output", Log)
            log.display = True
            log.write_line(f"{e.node}  {e.text}")  # a Log: plain text, never markup; e is cleaned
            return
        if isinstance(e, ResultEvent):
            self.sc.add_event("info" if e.ok else "warning",
                               f"wizard: {'served' if e.ok and e.endpoint else 'ok' if e.ok else 'stopped'}: "
                               f"{e.message}")
        self._draw_run()

    def on_wizard_planned(self, message: WizardPlanned) -> None:
        self.run.plan(message.step, message.commands)
        self._draw_run()

    def on_wizard_run_state(self, message: WizardRunState) -> None:
        self.running = message.running
        self.error = display_lines(message.error)  # an exception's text: it may quote a node
        if message.error and self.run.current:
            v = self.run.view(self.run.current)
            if v.state in ("running", "waiting"):
                v.state, v.note = "failed", self.error
        self._draw_run()

    def feed(self, events: Sequence[Event]) -> None:
        """Post recorded events as the runner would (tests and demos: the events are the contract)."""
        for e in events:
            self.post_message(WizardEvent(e))

    # ---- running -----------------------------------------------------------------------------

    def _new_state(self) -> DeploymentState:
        config = self.sc.config
        if not self.read_only and not self.sc.private_cluster:
            earlier = self._earlier(config.name)
            if earlier is not None:
                return earlier
        return DeploymentState.new(self.options.model, self.options.to_json(), config.name)

    def _earlier(self, cluster: str) -> DeploymentState | None:
        """The deployment Enter resumes: the same rule as ``sparkconsole deploy``'s note
        (:func:`~sparkconsole.deploy.opening.find_earlier`: this cluster, this model, not torn down).
        A served one is resumed too: every step finds its work done and nothing changes a node."""
        from sparkconsole.deploy.opening import find_earlier
        from sparkconsole.deploy.state import StateStore

        st = find_earlier(StateStore(), cluster, self.options.model)
        if st is None:
            return None
        self.options = Options.from_json(st.options) if st.options else self.options
        self.app.notify(f"resuming deployment {st.id} ({st.result or 'unfinished'}, started {st.created}): "
                        "finished steps are not run again", title="wizard", timeout=6)
        return st

    def action_start(self) -> None:
        if self.running:
            self.notify("the deployment is running; it stops at its next decision when you press Esc there",
                        timeout=3)
            return
        if self.state is None:
            self.state = self._new_state()
        self.run.result = None
        self._request(teardown=False)

    def action_teardown(self) -> None:
        if self.running:
            self.notify("a run is going on: let it stop first (Esc at its next decision)", severity="warning")
            return
        if self.read_only:
            self.notify("read-only: teardown changes the nodes", title="read-only", severity="warning")
            return
        if self.state is None or not (self.state.started or self.state.stopped):
            self.notify("nothing to tear down: this deployment started nothing", timeout=3)
            return
        # no dialog here: the teardown's own confirmation shows each node's commands, once
        self.run.result = None
        self._request(teardown=True)

    def _request(self, *, teardown: bool) -> None:
        """Ask the app to run this deployment (it opens it as ``sparkconsole deploy`` does). Running
        from now: a second Enter before the app's worker starts must not ask twice."""
        assert self.state is not None
        self.running = True
        self.error = ""
        options = Options.from_json(self.state.options) if self.state.options else self.options
        self.app.post_message(DeploymentRequested(
            self.state, options, teardown=teardown, until=None if teardown else self.until, answer=self._answer,
            confirm=self._confirm, emit=self._emit, on_plan=self._on_plan, on_state=self._on_state))

    def _on_state(self, running: bool, error: str) -> None:
        self.post_message(WizardRunState(running, error))

    def _emit(self, event: Event) -> None:
        self.post_message(WizardEvent(event))

    def _on_plan(self, step: str, title: str, commands: list[tuple[str, RemoteCommand]]) -> None:
        self.post_message(WizardPlanned(step, [(n, c.shell(), c.mutating, c.summary) for n, c in commands]))

    async def _until_visible(self, what: str) -> None:
        """A question waits for the operator to be on the wizard (not under a help or on the overview)."""
        if self._visible.is_set():
            return
        if not self._waiting_told:
            self._waiting_told = True
            self.app.notify(f"the deployment waits for you: {what} (press w)", title="wizard", timeout=8)
        await self._visible.wait()

    async def _ask(self, screen: Any) -> Any:
        """Show ``screen`` and wait for what it is dismissed with. Not Textual's ``push_screen_wait``:
        that one refuses outside a worker, and the runner's ``answer``/``confirm`` are awaited
        wherever the runner runs (the app's worker in the console, a plain task in tests)."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Any] = loop.create_future()

        def done(value: Any) -> None:
            if not answer.done():
                answer.set_result(value)

        self.app.push_screen(screen, done)
        return await answer

    async def _answer(self, d: Decision) -> tuple[str, str]:
        """The runner's answerer: the recommendation under auto, else the operator in a modal."""
        from sparkconsole.ui.screens.decision import DecisionScreen

        if self.auto:
            return d.recommended, "auto"
        self._emit(StepEvent(d.step, "waiting", f"decision {d.id}: {d.title}"))
        await self._until_visible(f"decision {d.id}")
        if self.auto:  # switched on while the question waited
            self._emit(StepEvent(d.step, "running"))
            return d.recommended, "auto"
        value = await self._ask(DecisionScreen(d))
        if value is None:
            raise DecisionStop(d)
        self._emit(StepEvent(d.step, "running"))
        return value, "operator"

    async def _confirm(self, step: str, commands: Sequence[tuple[str, RemoteCommand]]) -> bool:
        """The runner's confirm: the step's changing commands in a confirmation dialog."""
        teardown = step == "teardown"  # t asks here, once, auto or not: it is the one question of t
        if self.auto and not teardown:
            return True
        await self._until_visible(f"confirm the {step} step's commands")
        if self.auto and not teardown:
            return True
        ident = self.state.id if self.state else ""
        shown = [(n, c.shell(), c.summary) for n, c in commands]
        if teardown:
            return bool(await self._ask(StepConfirmScreen(
                step, shown, title=f"the teardown of deployment {ident}",
                note="Only what this deployment started is removed; the services it stopped are offered back "
                     "after. Each command is journaled.")))
        return bool(await self._ask(StepConfirmScreen(
            step, shown, note=f"Each is journaled with deployment {ident} and step {step}. "
                              "a in the wizard stops asking (auto).")))

    # ---- keys --------------------------------------------------------------------------------

    def action_rehearse(self) -> None:
        """``R``: the whole deployment on a twin first (the app reads the nodes read-only)."""
        if self.running:
            self.notify("a run is going on: rehearse before it, or after it ends", severity="warning")
            return
        options = Options.from_json(self.state.options) if self.state and self.state.options else self.options
        self.app.post_message(RehearsalRequested(options))

    def action_toggle_auto(self) -> None:
        self.auto = not self.auto
        self.notify("auto: recommended answers are taken, commands run without asking" if self.auto
                    else "the wizard asks again before each decision and change", timeout=3)
        self._draw_run()

    def action_browse(self, delta: int) -> None:
        at = self.shown or self.run.current or LIST_STEPS[0]
        i = max(0, min(len(LIST_STEPS) - 1, LIST_STEPS.index(at) + delta))
        self.shown = LIST_STEPS[i]
        self._draw_run()

    def action_back(self) -> None:
        if len(self.app.screen_stack) > 1:
            self.app.pop_screen()

    def action_logs(self) -> None:
        from sparkconsole.services import Service

        st = self.state
        started = [s for s in (st.started if st else []) if s.kind == "container"]
        if not started:
            self.notify("no container started by this deployment yet", timeout=3)
            return
        head = self.sc.config.head
        pick = next((s for s in started if head is not None and s.node == head.name), started[0])
        self.post_message(OpenLogs(pick.node, Service(name=pick.name, kind="container")))
