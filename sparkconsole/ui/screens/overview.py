"""The overview: every node as a card, or one row per node when the cards would not fit; the
cluster's alerts and the latest events below.

What a redraw costs follows what changed: a node's new sample updates that node's card or row
only (several arriving together are drawn in one pass), a card whose node did not change is not
drawn, a card out of view is drawn when it scrolls in, and the strip, the alerts and the events
are updated only when their text changes.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Grid, VerticalScroll
from textual.geometry import Size
from textual.timer import Timer
from textual.widgets import Footer, Header, Input, Static

from sparkconsole.probe.alerts import Alert
from sparkconsole.ui.keymap import OVERVIEW_BINDINGS
from sparkconsole.ui.messages import OpenNode
from sparkconsole.ui.render import node_str, thin_scrollbars
from sparkconsole.ui.screens.live import LiveScreen
from sparkconsole.ui.widgets.node_card import MIN_CARD_WIDTH, NodeCard
from sparkconsole.ui.widgets.node_table import SORTS, NodeTable, node_row

EVENT_STYLE = {"info": "green", "warning": "dark_orange", "critical": "bold red"}
EVENTS_SHOWN = 6
CARD_HEIGHT = 24  # an up node's card with a few containers, borders included
CHROME_HEIGHT = 12  # header, strip, events and footer around the cards
CARD_GUTTER = 4  # a card's border and padding


def events_text(events) -> Text:
    """The last few events, newest last: status changes, new alerts, actions run."""
    text = Text("Events  ", style="bold")
    recent = list(events)[-EVENTS_SHOWN:]
    if not recent:
        text.append("  nothing yet — status changes, alerts and actions show here", style="dim")
    for when, severity, line in recent:
        stamp = time.strftime("%H:%M:%S", time.localtime(when))
        text.append(f"\n{stamp} ", style="dim")
        text.append(node_str(line), style=EVENT_STYLE.get(severity, ""))
    return text


def card_columns(width: int, count: int) -> int:
    """Two columns of cards only when each still gets room for its bars."""
    return 2 if count > 1 and width >= 2 * (MIN_CARD_WIDTH + CARD_GUTTER) + 3 else 1


def cards_fit(size: Size, count: int) -> bool:
    """Whether every node's card fits on the screen without scrolling."""
    rows = max(1, (size.height - CHROME_HEIGHT) // CARD_HEIGHT)
    return card_columns(size.width, count) * rows >= count


class OverviewScreen(LiveScreen):
    """Every node at a glance."""

    BINDINGS = OVERVIEW_BINDINGS
    HELP = ("Every node at a glance: cards, or a table of one row per node (v). Enter or a number opens a "
            "node; in the table s sorts, / filters. ? lists every key.")
    COALESCE_S = 0.05  # node updates arriving within this are drawn in one pass

    def __init__(self) -> None:
        super().__init__()
        self.view = "cards"
        self._view_chosen = False  # the operator pressed v: no automatic switching after that
        self._dirty: set[str] = set()
        self._flush_timer: Timer | None = None
        self._last_text: dict[str, tuple] = {}
        self._cards: dict[str, NodeCard] = {}
        self._index: dict[str, int] = {}

    def compose(self) -> ComposeResult:
        nodes = self.sc.config.nodes
        yield Header()
        yield Static(id="status-strip")
        yield Input(placeholder="filter nodes by name, status, container or alert (Enter keeps it, Esc clears)",
                    id="node-filter")
        with VerticalScroll(id="cards-scroll"), Grid(id="cards"):
            for i, node in enumerate(nodes, start=1):
                yield NodeCard(node.name, node.role, i, self.sc.clock)
        yield NodeTable([n.name for n in nodes], id="node-table")
        yield Static(id="cluster-alerts")
        yield Static(id="events")
        yield Footer()

    def on_mount(self) -> None:
        self._cards = {c.node: c for c in self.query(NodeCard)}
        self._index = {n.name: i for i, n in enumerate(self.sc.config.nodes, start=1)}
        self.query_one("#node-filter", Input).display = False
        thin_scrollbars(self.query_one("#cards-scroll", VerticalScroll))
        thin_scrollbars(self.table)
        self._layout(self.size)
        self.mark_ready()

    @property
    def table(self) -> NodeTable:
        return self.query_one("#node-table", NodeTable)

    def on_resize(self, event) -> None:
        self._layout(event.size)

    def _layout(self, size: Size) -> None:
        count = len(self._cards)
        self.query_one("#cards", Grid).styles.grid_size_columns = card_columns(size.width, count)
        if not self._view_chosen:
            self._set_view("cards" if cards_fit(size, count) else "table")

    def _set_view(self, view: str) -> None:
        changed = view != self.view or not getattr(self, "_view_applied", False)
        self.view = view
        self._view_applied = True
        self.query_one("#cards-scroll", VerticalScroll).display = view == "cards"
        self.table.display = view == "table"
        if not changed:
            return
        if view == "table":
            self.table.focus()
        elif self._cards:
            visible = [c for c in self._cards.values() if c.display]
            if visible:
                visible[0].focus()
        self.refresh_all()

    # ---- drawing -----------------------------------------------------------------------------

    def draw(self) -> None:
        alerts = self.sc.alerts()
        for name in self._cards:
            self._show(name, alerts)
        self._draw_around(alerts)

    def draw_node(self, name: str) -> None:
        """Mark the node; the nodes marked within :attr:`COALESCE_S` are drawn in one pass."""
        self._dirty.add(name)
        if self._flush_timer is None:
            self._flush_timer = self.set_timer(self.COALESCE_S, self._flush)

    def _flush(self) -> None:
        self._flush_timer = None
        names, self._dirty = self._dirty, set()
        if not names or not self._drawable():
            return
        alerts = self.sc.alerts()  # once per pass, not once per node
        for name in names:
            self._show(name, alerts)
        self._draw_around(alerts)

    def _show(self, name: str, alerts: list[Alert]) -> None:
        state = self.sc.node_state(name)
        mine = [a for a in alerts if a.node == name]
        if self.view == "cards":
            self._cards[name].show(state, mine)
        else:
            self.table.update_row(node_row(self._index[name], state, mine, self.sc.clock()))

    def _draw_around(self, alerts: list[Alert]) -> None:
        app = self.sc
        self._update_if_changed("#status-strip", app.status_strip(max(self.size.width - 2, 20)))
        cluster = [a for a in alerts if a.node == "cluster"]
        text = Text()
        for alert in cluster:
            text.append(f"⚠ {node_str(alert.text)}\n", style="dark_orange")
        self._update_if_changed("#cluster-alerts", text)
        self.query_one("#cluster-alerts", Static).display = bool(cluster)
        self._update_if_changed("#events", events_text(app.events))

    def _update_if_changed(self, selector: str, text: Text) -> None:
        key = (text.plain, tuple((str(sp.style), sp.start, sp.end) for sp in text.spans))
        if self._last_text.get(selector) == key:
            return
        before = self._last_text.get(selector)
        self._last_text[selector] = key
        lines_changed = before is None or before[0].count("\n") != key[0].count("\n")
        self.query_one(selector, Static).update(text, layout=lines_changed)

    # ---- keys ----------------------------------------------------------------------------------

    def on_node_card_selected(self, message: NodeCard.Selected) -> None:
        self.post_message(OpenNode(message.node))

    def on_node_table_selected(self, message: NodeTable.Selected) -> None:
        self.post_message(OpenNode(message.node))

    def action_open_focused(self) -> None:
        focused = self.focused
        if isinstance(focused, NodeCard):
            self.post_message(OpenNode(focused.node))
        elif isinstance(focused, NodeTable) and focused.highlighted:
            self.post_message(OpenNode(focused.highlighted))

    def action_focus_next_card(self) -> None:
        self.focus_next(NodeCard)

    def action_focus_previous_card(self) -> None:
        self.focus_previous(NodeCard)

    def action_toggle_view(self) -> None:
        self._view_chosen = True
        self._set_view("table" if self.view == "cards" else "cards")

    def action_sort(self, step: int) -> None:
        """``s``: the next column; ``S``: the same column, reversed. Sorting shows the table."""
        table = self.table
        if self.view != "table":
            self._view_chosen = True
            self._set_view("table")
        if step:
            table.set_sort(SORTS[(SORTS.index(table.sort) + 1) % len(SORTS)], False)
        else:
            table.set_sort(table.sort, not table.reverse)  # the header marks the column and the order

    def action_filter(self) -> None:
        field = self.query_one("#node-filter", Input)
        field.display = True
        field.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "node-filter":
            self._apply_filter(event.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "node-filter":
            event.input.display = bool(event.value.strip())
            self._focus_nodes()

    def _apply_filter(self, value: str) -> None:
        self.table.set_filter(value)
        needle = value.strip().lower()
        alerts = self.sc.alerts()
        now = self.sc.clock()
        for name, card in self._cards.items():
            mine = [a for a in alerts if a.node == name]
            card.display = not needle or needle in node_row(self._index[name], self.sc.node_state(name), mine,
                                                            now).search

    def _focus_nodes(self) -> None:
        if self.view == "table":
            self.table.focus()
        else:
            visible = [c for c in self._cards.values() if c.display]
            if visible:
                visible[0].focus()

    def key_escape(self) -> None:
        field = self.query_one("#node-filter", Input)
        if field.display:
            field.value = ""
            field.display = False
            self._apply_filter("")
            self._focus_nodes()
