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

_KEY_NAMES = {"question_mark": "?", "slash": "/", "plus": "+", "minus": "-", "equals_sign": "=",
              "escape": "esc", "enter": "⏎"}


def _key_name(key: str) -> str:
    return _KEY_NAMES.get(key, key)


def _rows(bindings) -> list[tuple[str, str, str]]:
    """(keys, what it does, id) per binding id, keys merged, in definition order."""
    by_id: dict[str, tuple[list[str], Binding]] = {}
    for key, items in bindings.key_to_bindings.items():
        for b in items:
            if b.id is None:
                continue
            keys, _ = by_id.setdefault(b.id, ([], b))
            if key not in keys:
                keys.append(key)
    rows: list[tuple[str, str, str]] = []
    nodes: list[str] = []
    for bid, (keys, b) in by_id.items():
        if bid.startswith("app.node"):
            nodes.extend(keys)
            continue
        shown = b.key_display if b.key_display and len(keys) == 1 else ", ".join(_key_name(k) for k in keys)
        rows.append((shown, b.tooltip or b.description, bid))
    if nodes:
        rows.append((f"{min(nodes)}…{max(nodes)}", "Open the detail of node N.", "app.node1…9"))
    return rows


def help_table(screen: Screen) -> Table:
    """Bindings of the focused widget (the node table's cursor keys), of ``screen``, then the app's,
    each with its tooltip."""
    table = Table(show_header=True, header_style="bold", expand=True, box=None, padding=(0, 2))
    table.add_column("key", style="bold cyan", no_wrap=True)
    table.add_column("does")
    table.add_column("id", style="dim", no_wrap=True)
    title = type(screen).__name__.replace("Screen", "") or "screen"
    sections = [(title, screen._bindings), ("everywhere", screen.app._bindings)]
    focused = screen.focused
    if focused is not None:
        label = "".join(f" {c.lower()}" if c.isupper() and i else c for i, c in enumerate(type(focused).__name__))
        sections.insert(0, (label.capitalize(), focused._bindings))
    for heading, bindings in sections:
        rows = _rows(bindings)
        if not rows:
            continue
        table.add_row(Text(heading, style="bold underline"), "", "")
        for row in rows:
            table.add_row(*row)
        table.add_row("", "", "")
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

    def table_text(self) -> str:
        """The help table as plain text (tests)."""
        from sparkconsole.ui.widgets.node_card import renderable_text

        return renderable_text(help_table(self.under), 140)

    def action_dismiss(self) -> None:  # type: ignore[override]
        self.dismiss(None)
