"""The confirmation dialog every change goes through: node, service and the exact command.

``ConfirmScreen`` is a ``ModalScreen[bool]``: ``y`` (or the Yes button) dismisses with ``True``;
``n``, ``Esc`` (or the No button) with ``False``. "No" has the focus when it opens, so a stray
Enter never confirms. Push it with a callback, or ``await push_screen_wait`` from a worker::

    cmd = controller.plan("stop", service)
    if reason := controller.refusal(cmd):
        self.notify(reason, severity="warning")       # read-only: no dialog at all
    else:
        self.app.push_screen(ConfirmScreen("spark-01", "vllm", cmd, action="stop"), callback)
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from sparkconsole.logs.follow import display_lines, display_text
from sparkconsole.remote import RemoteCommand


def _action_of(command: RemoteCommand | str) -> str:
    """``stop`` for ``docker stop x`` / ``systemctl stop x`` summaries; else empty."""
    words = command.summary.split() if isinstance(command, RemoteCommand) else []
    if len(words) >= 2 and words[0] in {"docker", "systemctl"}:
        return "remove" if words[1] == "rm" else words[1]
    return ""


class YesNoScreen(ModalScreen[bool]):
    """A modal question with a ``#yes`` and a ``#no`` button: ``n`` has the focus (a stray Enter
    answers no), the arrows and Tab move between the two, ``y``/``n`` (the subclass's bindings, as
    ``answer(True)``/``answer(False)``) answer."""

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "yes")

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)

    def action_toggle_focus(self) -> None:
        target = "#yes" if self.focused is not None and self.focused.id == "no" else "#no"
        self.query_one(target, Button).focus()


class ConfirmScreen(YesNoScreen):
    """Asks "really?" for one command on one node."""

    HELP = "Confirm or cancel the command shown. Nothing is sent until you press y."

    DEFAULT_CSS = """
    ConfirmScreen {
        align: center middle;
        background: $background 60%;
    }
    ConfirmScreen > #confirm-box {
        width: 76;
        max-width: 95%;
        height: auto;
        border: thick $warning;
        background: $surface;
        padding: 1 2;
    }
    ConfirmScreen #confirm-title {
        text-style: bold;
        margin-bottom: 1;
    }
    ConfirmScreen #confirm-command {
        background: $boost;
        padding: 0 1;
        margin: 1 0;
    }
    ConfirmScreen #confirm-note {
        color: $text-muted;
    }
    ConfirmScreen #confirm-buttons {
        height: auto;
        align-horizontal: right;
        margin-top: 1;
    }
    ConfirmScreen Button {
        margin-left: 2;
    }
    """

    BINDINGS = [
        Binding("y", "answer(True)", "Yes", id="confirm.yes", tooltip="Run the command shown."),
        Binding("n", "answer(False)", "No", id="confirm.no", tooltip="Cancel: nothing is sent."),
        Binding("escape", "answer(False)", "Cancel", id="confirm.cancel", tooltip="Cancel: nothing is sent."),
        Binding("left,right,tab,shift+tab", "toggle_focus", show=False, id="confirm.toggle",
                tooltip="Move between Yes and No."),
    ]

    def __init__(
        self,
        node: str,
        service: str,
        command: RemoteCommand | str,
        *,
        action: str = "",
        note: str | None = None,
        name: str | None = None,
        id: str | None = None,
    ) -> None:
        super().__init__(name=name, id=id)
        # what the dialog shows, cleaned: a service's name comes from the node (docker ps, systemctl)
        # and the command quotes it; ``command`` itself is what runs and stays as it is
        self.node = display_text(node)
        self.service = display_text(service)
        self.command = command
        self.command_text = display_lines(command.shell() if isinstance(command, RemoteCommand) else str(command))
        self.action = action or _action_of(command)
        self.note = note

    def compose(self) -> ComposeResult:
        verb = self.action.capitalize() or "Run"
        title = Text.assemble(
            (f"{verb} ", "bold"), (self.service, "bold yellow"),
            (" on ", "bold"), (self.node, "bold cyan"), ("?", "bold"),
        )
        with Vertical(id="confirm-box"):
            yield Static(title, id="confirm-title")
            lead = "These commands will run on the node, in this order:" if "\n" in self.command_text.strip() \
                else "This command will run on the node:"
            yield Static(Text(lead, style="dim"))
            yield Static(Text(self.command_text, style="bold"), id="confirm-command")
            yield Static(
                Text(self.note or "It is written to the local journal with its exit code."), id="confirm-note"
            )
            with Horizontal(id="confirm-buttons"):
                yield Button(f"Yes, {self.action or 'run'} (y)", variant="warning", id="yes")
                yield Button("No (n)", variant="primary", id="no")

