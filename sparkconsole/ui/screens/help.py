"""Contextual help: the keys that work on the screen underneath, built from its bindings."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Static

from sparkconsole.ui.keymap import HELP_BINDINGS


def _keys(binding: Binding) -> str:
    if binding.key_display:
        return binding.key_display
    return ", ".join(k.replace("question_mark", "?").replace("slash", "/") for k in binding.key.split(","))


def help_table(screen: Screen) -> Table:
    """Bindings of ``screen`` first, then the app's, each with its tooltip."""
    table = Table(show_header=True, header_style="bold", expand=True, box=None, padding=(0, 2))
    table.add_column("key", style="bold cyan", no_wrap=True)
    table.add_column("does")
    table.add_column("id", style="dim", no_wrap=True)
    seen: set[str] = set()
    groups = [(type(screen).__name__.replace("Screen", ""), screen._bindings), ("everywhere", screen.app._bindings)]
    for title, bindings in groups:
        rows = []
        for _key, items in bindings.key_to_bindings.items():
            for b in items:
                if b.id in seen or b.id is None:
                    continue
                seen.add(b.id)
                rows.append(b)
        if not rows:
            continue
        table.add_row(Text(title, style="bold underline"), "", "")
        for b in sorted(rows, key=lambda b: b.id or ""):
            table.add_row(_keys(b), b.tooltip or b.description, b.id or "")
    return table


class HelpScreen(ModalScreen[None]):
    """Shows the keys for the screen that was active when ``?`` was pressed."""

    BINDINGS = HELP_BINDINGS

    def __init__(self, under: Screen) -> None:
        super().__init__()
        self.under = under

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            intro = getattr(self.under, "HELP", "")
            yield Static(Text(intro, style="italic"), id="help-intro")
            yield Static(help_table(self.under), id="help-table")
            yield Static(Text("Rebind any key in the config's [keymap] table by its id.  Esc closes.", style="dim"))

    def on_mount(self) -> None:
        self.query_one("#help-box").border_title = "Help"

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)
