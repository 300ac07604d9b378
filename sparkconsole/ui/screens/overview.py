"""The overview: one card per node, side by side, and the cluster's alerts below."""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Grid, VerticalScroll
from textual.widgets import Footer, Header, Static

from sparkconsole.probe.alerts import Alert
from sparkconsole.probe.state import NodeState
from sparkconsole.ui.keymap import OVERVIEW_BINDINGS
from sparkconsole.ui.render import thin_scrollbars
from sparkconsole.ui.screens.live import LiveScreen
from sparkconsole.ui.widgets.node_card import NodeCard

EVENT_STYLE = {"info": "green", "warning": "dark_orange", "critical": "bold red"}
EVENTS_SHOWN = 6


def events_text(events) -> Text:
    """The last few events, newest last: status changes, new alerts, actions run."""
    text = Text("Events  ", style="bold")
    recent = list(events)[-EVENTS_SHOWN:]
    if not recent:
        text.append("  nothing yet — status changes, alerts and actions show here", style="dim")
    for when, severity, line in recent:
        stamp = time.strftime("%H:%M:%S", time.localtime(when))
        text.append(f"\n{stamp} ", style="dim")
        text.append(line, style=EVENT_STYLE.get(severity, ""))
    return text


class OverviewScreen(LiveScreen):
    """Every node at a glance."""

    BINDINGS = OVERVIEW_BINDINGS
    HELP = "Every node at a glance. Enter or a number opens a node; ? lists every key."

    def compose(self) -> ComposeResult:
        app = self.app
        yield Header()
        yield Static(id="status-strip")
        with VerticalScroll(id="cards-scroll"), Grid(id="cards"):
            for i, node in enumerate(app.config.nodes, start=1):  # type: ignore[attr-defined]
                yield NodeCard(node.name, node.role, i, app.clock)  # type: ignore[attr-defined]
        yield Static(id="cluster-alerts")
        yield Static(id="events")
        yield Footer()

    def on_mount(self) -> None:
        cards = list(self.query(NodeCard))
        if cards:
            cards[0].focus()
        self._layout_cards(self.size.width)
        thin_scrollbars(self.query_one("#cards-scroll", VerticalScroll))
        self.mark_ready()

    def on_resize(self, event) -> None:
        self._layout_cards(event.size.width)

    def _layout_cards(self, width: int) -> None:
        """Two cards side by side when there is room (about 70 columns each), else one."""
        count = len(self.query(NodeCard))
        columns = 2 if width >= 140 and count > 1 else 1
        self.query_one("#cards", Grid).styles.grid_size_columns = columns

    def draw(self) -> None:
        alerts: list[Alert] = self.app.alerts()  # type: ignore[attr-defined]
        for card in self.query(NodeCard):
            self._show_card(card, alerts)
        self._draw_around(alerts)

    def refresh_node(self, name: str) -> None:
        """One node's poll ended: redraw its card only (and the strip, the cluster's alerts and the
        events when their text changed), not every card: a cluster of N nodes costs N card draws
        per round of polls, not N x N."""
        if not self._ready or not self.is_attached:
            return
        alerts: list[Alert] = self.app.alerts()  # type: ignore[attr-defined]
        for card in self.query(NodeCard):
            if card.node == name:
                self._show_card(card, alerts)
        self._draw_around(alerts)

    def _show_card(self, card: NodeCard, alerts: list[Alert]) -> None:
        state: NodeState = self.app.node_state(card.node)  # type: ignore[attr-defined]
        card.show(state, [a for a in alerts if a.node == card.node])

    def _draw_around(self, alerts: list[Alert]) -> None:
        app = self.app
        self._update_if_changed("#status-strip", app.status_strip())  # type: ignore[attr-defined]
        cluster = [a for a in alerts if a.node == "cluster"]
        text = Text()
        for alert in cluster:
            text.append(f"⚠ {alert.text}\n", style="dark_orange")
        self._update_if_changed("#cluster-alerts", text)
        self.query_one("#cluster-alerts", Static).display = bool(cluster)
        self._update_if_changed("#events", events_text(app.events))  # type: ignore[attr-defined]

    def _update_if_changed(self, selector: str, text: Text) -> None:
        key = (text.plain, tuple((str(sp.style), sp.start, sp.end) for sp in text.spans))
        if getattr(self, "_last_text", {}).get(selector) == key:
            return
        self.__dict__.setdefault("_last_text", {})[selector] = key
        self.query_one(selector, Static).update(text)

    def on_node_card_selected(self, message: NodeCard.Selected) -> None:
        self.app.open_node_by_name(message.node)  # type: ignore[attr-defined]

    def action_open_focused(self) -> None:
        focused = self.focused
        if isinstance(focused, NodeCard):
            self.app.open_node_by_name(focused.node)  # type: ignore[attr-defined]

    def action_focus_next_card(self) -> None:
        self.focus_next(NodeCard)

    def action_focus_previous_card(self) -> None:
        self.focus_previous(NodeCard)
