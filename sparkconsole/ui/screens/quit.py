"""Asks before ``q`` leaves a console whose deployment is running.

A deployment's work on the nodes goes on without the console (its downloads, copies and containers
are detached jobs), but the run itself, its questions and its checks, stop with the console: the
operator is told so and answers ``y`` or ``n`` (``n`` has the focus, as in every confirmation).
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Static

from sparkconsole.ui.screens.confirm import YesNoScreen


class QuitScreen(YesNoScreen):
    """``y`` quits, ``n`` or Esc stays."""

    HELP = "A deployment is running: y quits anyway, n stays."

    DEFAULT_CSS = """
    QuitScreen {
        align: center middle;
        background: $background 60%;
    }
    QuitScreen > #quit-box {
        width: 72;
        max-width: 95%;
        height: auto;
        border: thick $warning;
        background: $surface;
        padding: 1 2;
    }
    QuitScreen #quit-title {
        text-style: bold;
        margin-bottom: 1;
    }
    QuitScreen #quit-buttons {
        height: auto;
        align-horizontal: right;
        margin-top: 1;
    }
    QuitScreen Button {
        margin-left: 2;
    }
    """

    BINDINGS = [
        Binding("y", "answer(True)", "Quit", id="quit.yes", tooltip="Leave the console; the run stops here."),
        Binding("n,escape", "answer(False)", "Stay", id="quit.no", tooltip="Stay: the deployment goes on."),
        Binding("left,right,tab,shift+tab", "toggle_focus", show=False, id="quit.toggle",
                tooltip="Move between Quit and Stay."),
    ]

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what

    def compose(self) -> ComposeResult:
        with Vertical(id="quit-box"):
            yield Static(Text(f"Quit while {self.what} runs?", style="bold"), id="quit-title")
            yield Static(Text(
                "Its detached work goes on on the nodes (downloads, copies, containers), but the run stops "
                "here: nothing more is asked, checked or started. Open the wizard (w) and press Enter to "
                "resume it; finished steps are not run again."))
            with Horizontal(id="quit-buttons"):
                yield Button("Quit (y)", variant="warning", id="yes")
                yield Button("Stay (n)", variant="primary", id="no")
