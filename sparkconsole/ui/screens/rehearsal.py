"""The rehearsal's report in the console: what ``sparkconsole deploy --rehearse`` prints, in a
scrollable modal over the wizard (``R``). Every line is node text cleaned for the terminal and shown
as plain :class:`~rich.text.Text`, never markup: a container named ``[bold]x`` shows as written."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from sparkconsole.logs.follow import display_text
from sparkconsole.ui.keymap import REHEARSAL_BINDINGS


class RehearsalScreen(ModalScreen[None]):
    """The report, and where the twin file and the report were written."""

    HELP = "The rehearsal on a twin of your cluster: nothing was changed on the nodes."
    BINDINGS = REHEARSAL_BINDINGS

    def __init__(self, lines: list[str], twin_path: str, report_path: str) -> None:
        super().__init__()
        self.lines = lines
        self.twin_path = twin_path
        self.report_path = report_path

    def compose(self) -> ComposeResult:
        with Vertical(id="rehearsal-box"):
            yield Static(Text("Rehearsal on a twin of the cluster — nothing was changed on the nodes"),
                         id="rehearsal-title")
            with VerticalScroll(id="rehearsal-body"):
                yield Static(Text("\n".join(display_text(x) for x in self.lines)), id="rehearsal-text")
            yield Static(Text(f"twin: {display_text(self.twin_path)}\nreport: {display_text(self.report_path)}  "
                              "(sparkconsole deploy --answers-from REPORT takes its answers)"),
                         id="rehearsal-files")

    def action_close(self) -> None:
        self.dismiss(None)

    def action_scroll_up(self) -> None:
        self.query_one("#rehearsal-body", VerticalScroll).scroll_up()

    def action_scroll_down(self) -> None:
        self.query_one("#rehearsal-body", VerticalScroll).scroll_down()
