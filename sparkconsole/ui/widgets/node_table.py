"""The dense view: one row per node, as nvitop and k9s show many of a thing.

A line-API view over its own rows (Toolong's shape): every node's row is rendered to one strip
and kept; a node's new sample re-renders that row only and repaints that line only, unless the
sort order moved. Sorting (``s`` cycles the column, ``S`` reverses) and filtering (by name,
status, alert or container) change only which rows show and in what order.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.events import Click
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from sparkconsole.probe.alerts import Alert
from sparkconsole.probe.state import NodeState, NodeStatus
from sparkconsole.ui.keymap import NODE_TABLE_BINDINGS
from sparkconsole.ui.render import DASH, fmt, gib, memory_bar, node_str, sparkline
from sparkconsole.ui.widgets.serving import serving_cell, serving_cell_text

STATUS_STYLE = {"connecting": "yellow", "up": "green", "stale": "dark_orange", "down": "red"}
STATUS_RANK = {"down": 0, "stale": 1, "connecting": 2, "up": 3}
SORTS = ("node", "status", "gpu", "memory", "temp", "power", "alerts")
SPARK_CELLS = 8
FIXED = {"index": 3, "status": 13, "gpu": 5 + 1 + SPARK_CELLS, "temp": 6, "power": 6, "mem": 12, "link": 15,
         "containers": 8, "serving": 21}


@dataclass(frozen=True)
class NodeRow:
    """What one row shows, read from the node's state: equal rows render the same strip."""

    index: int
    name: str
    status: str
    age: int | None
    gpu_pct: float | None
    gpu_trend: tuple[float | None, ...]
    temp_c: float | None
    power_w: float | None
    mem_used: int | None
    mem_total: int | None
    mem: object  # the sample's UnifiedMemory (frozen dataclass: compared by value)
    link: str
    link_ok: bool | None
    running: int | None
    containers: int | None
    alerts: tuple[tuple[str, str], ...]
    search: str  # lower-case text the filter matches: name, status, containers, alerts, engines' models
    serving: tuple = ()  # the busiest engine: model, tok/s, silent, reason, engines (widgets/serving.py)

    def sort_value(self, column: str) -> tuple:
        """Bigger-is-worse first for live columns (descending sorts show the busiest on top)."""
        def num(v: float | int | None) -> float:
            return float("-inf") if v is None else float(v)
        return {
            "node": (self.index,),
            "status": (STATUS_RANK.get(self.status, 9), self.index),
            "gpu": (-num(self.gpu_pct), self.index),
            "memory": (-num(self.mem_used), self.index),
            "temp": (-num(self.temp_c), self.index),
            "power": (-num(self.power_w), self.index),
            "alerts": (-len(self.alerts), STATUS_RANK.get(self.status, 9), self.index),
        }[column]


def node_row(index: int, state: NodeState, alerts: list[Alert], now: float) -> NodeRow:
    """The row for one node, from what the poller holds (unknown values stay unknown)."""
    sample = state.sample
    gpu = sample.gpus[0] if sample and sample.gpus else None
    mem = sample.memory if sample else None
    links = sample.links if sample else []
    up = [link for link in links if link.state == "up"]
    if not sample or not links:
        link, link_ok = DASH, None
    else:
        rate = up[0].rate_gbps if up else None
        link = f"{len(up)}/{len(links)} up" + (f" {rate:.0f}G" if rate else "")
        link_ok = bool(up)
    containers = sample.containers if sample else []
    age = state.age(now)
    alert_pairs = tuple((a.severity, a.text) for a in alerts)
    serving = serving_cell(state)
    search = " ".join([state.name, state.status.value, *(c.name or "" for c in containers),
                       *(text for _, text in alert_pairs),
                       *(w.engine.model or "" for w in state.engines.values())]).lower()
    return NodeRow(
        index=index, name=state.name, status=state.status.value,
        age=None if age is None or state.status is NodeStatus.UP else int(age),
        gpu_pct=gpu.utilization_pct if gpu else None,
        gpu_trend=tuple(state.history.values("gpu_util", last=SPARK_CELLS)),
        temp_c=gpu.temperature_c if gpu else None, power_w=gpu.power_w if gpu else None,
        mem_used=mem.used_bytes if mem else None, mem_total=mem.total_bytes if mem else None, mem=mem,
        link=link, link_ok=link_ok,
        running=None if not sample else sum(1 for c in containers if c.state == "running"),
        containers=None if not sample else len(containers),
        alerts=alert_pairs, search=search, serving=serving,
    )


def _cell(text: str | Text, width: int, justify: str = "left") -> Text:
    """A column: cut to ``width`` with an ellipsis, padded on the side ``justify`` leaves."""
    cell = text.copy() if isinstance(text, Text) else Text(text)
    cell.truncate(width, overflow="ellipsis")
    if justify == "right":
        cell.pad_left(width - cell.cell_len)
    else:
        cell.pad_right(width - cell.cell_len)
    return cell


def row_text(row: NodeRow, name_width: int, bar_width: int, rest: int) -> Text:
    """One row as text, column by column (the widths come from the table)."""
    text = Text(no_wrap=True)
    style = STATUS_STYLE.get(row.status, "")
    text.append_text(_cell(Text(f"{row.index}", style="dim"), FIXED["index"], "right"))
    text.append(" ")
    glyph = NodeStatus(row.status).glyph
    # the name as every node word is shown (a hostname may carry an escape sequence), never markup
    text.append_text(_cell(Text.assemble((f"{glyph} ", style), (node_str(row.name), "bold")), name_width + 2))
    text.append(" ")
    age = "" if row.age is None or row.status == "up" else f" {row.age}s"
    status = Text(row.status + age, style=style)
    if row.alerts:  # the count stays in view when a narrow terminal cuts the alerts column off
        worst = "bold red" if any(sev == "critical" for sev, _ in row.alerts) else "dark_orange"
        status.append(f" ⚠{len(row.alerts)}", style=worst)
    text.append_text(_cell(status, FIXED["status"]))
    gpu = Text(fmt(row.gpu_pct, "%").rjust(5))
    gpu.append(" ")
    gpu.append_text(sparkline(row.gpu_trend, SPARK_CELLS, 0.0, 100.0, "green"))
    text.append_text(_cell(gpu, FIXED["gpu"]))
    text.append(" ")
    text.append_text(_cell(fmt(row.temp_c, "°C"), FIXED["temp"], "right"))
    text.append_text(_cell(fmt(row.power_w, "W"), FIXED["power"], "right"))
    text.append("  ")
    if row.mem is not None and row.mem_total:
        text.append_text(memory_bar(row.mem, bar_width))  # type: ignore[arg-type]
    else:
        text.append(DASH.ljust(bar_width), style="dim")
    text.append(" ")
    text.append_text(_cell(f"{gib(row.mem_used, 0)}/{gib(row.mem_total, 0)} GiB", FIXED["mem"], "right"))
    text.append("  ")
    # before the link: on a narrow terminal what an engine does matters more than the link's rate
    text.append_text(_cell(serving_cell_text(row.serving, FIXED["serving"]), FIXED["serving"]))
    text.append("  ")
    link_style = "dim" if row.link_ok is None else ("green" if row.link_ok else "red")
    text.append_text(_cell(Text(row.link, style=link_style), FIXED["link"]))
    boxes = DASH if row.containers is None else f"{row.running}/{row.containers}"
    text.append_text(_cell(boxes, FIXED["containers"], "right"))
    text.append("  ")
    if row.alerts:
        severity, first = row.alerts[0]
        more = f" (+{len(row.alerts) - 1})" if len(row.alerts) > 1 else ""
        text.append_text(_cell(Text(f"⚠ {node_str(first)}{more}", style="bold red" if severity == "critical"
                                    else "dark_orange"), max(rest, 1)))
    return text


def header_text(name_width: int, bar_width: int, sort: str, reverse: bool) -> Text:
    arrow = "▲" if reverse else "▼"

    def h(label: str, key: str | None, width: int, justify: str = "left") -> Text:
        mark = f"{label}{arrow}" if key == sort else label
        return _cell(Text(mark, style="bold underline" if key == sort else "bold"), width, justify)

    text = Text(no_wrap=True)
    text.append_text(h("#", None, FIXED["index"], "right"))
    text.append(" ")
    text.append_text(h("node", "node", name_width + 2))
    text.append(" ")
    text.append_text(h("status", "status", FIXED["status"]))
    text.append_text(h("GPU", "gpu", FIXED["gpu"]))
    text.append(" ")
    text.append_text(h("temp", "temp", FIXED["temp"], "right"))
    text.append_text(h("power", "power", FIXED["power"], "right"))
    text.append("  ")
    text.append_text(h("unified memory", "memory", bar_width + 1 + FIXED["mem"]))
    text.append("  ")
    text.append_text(h("serving", None, FIXED["serving"]))
    text.append("  ")
    text.append_text(h("ConnectX-7", None, FIXED["link"]))
    text.append_text(h("running", None, FIXED["containers"], "right"))
    text.append("  ")
    text.append_text(h("alerts", "alerts", 6))
    return text


class NodeTable(ScrollView, can_focus=True):
    """Every node, one row each; the cursor row opens the node's detail."""

    BINDINGS = NODE_TABLE_BINDINGS

    COMPONENT_CLASSES = {"node-table--cursor", "node-table--cursor-blurred"}
    DEFAULT_CSS = """
    NodeTable {
        height: 1fr;
    }
    NodeTable > .node-table--cursor {
        background: $accent 40%;
    }
    NodeTable > .node-table--cursor-blurred {
        background: $panel;
    }
    """

    class Selected(Message):
        """The operator chose a node (Enter or a click)."""

        def __init__(self, node: str) -> None:
            super().__init__()
            self.node = node

    def __init__(self, names: list[str], *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.names = list(names)
        self.rows: dict[str, NodeRow] = {}
        self._strips: dict[str, tuple[int, Strip]] = {}  # name -> (layout width, rendered row)
        self.order: list[str] = list(names)
        self.sort = "node"
        self.reverse = False
        self.filter = ""
        self.cursor = 0
        self.renders = 0  # rows rendered (a row whose node did not change is not rendered again)
        self._name_width = min(max((len(node_str(n)) for n in names), default=4), 24)

    # ---- data in --------------------------------------------------------------------------

    def update_row(self, row: NodeRow) -> None:
        """A node's row, maybe new: repaint its line, or the table when the order moved."""
        if self.rows.get(row.name) == row:
            return
        old = self.rows.get(row.name)
        self.rows[row.name] = row
        self._strips.pop(row.name, None)
        moved = old is None or old.sort_value(self.sort) != row.sort_value(self.sort) or (
            bool(self.filter) and (self.filter in old.search) != (self.filter in row.search))
        if moved and self._reorder():
            return
        self._refresh_row(row.name)

    def set_sort(self, column: str, reverse: bool) -> None:
        self.sort, self.reverse = column, reverse
        self._reorder(force=True)

    def set_filter(self, text: str) -> None:
        self.filter = text.strip().lower()
        self._reorder(force=True)

    @property
    def highlighted(self) -> str | None:
        return self.order[self.cursor] if 0 <= self.cursor < len(self.order) else None

    # ---- order and geometry -------------------------------------------------------------------

    def _reorder(self, force: bool = False) -> bool:
        """Sort and filter; repaint everything when the visible order changed (True then)."""
        keep = self.highlighted
        names = [n for n in self.names if not self.filter or self.filter in self._search(n)]
        names.sort(key=lambda n: self.rows[n].sort_value(self.sort) if n in self.rows else (9e18,),
                   reverse=self.reverse)
        if names == self.order and not force:
            return False
        self.order = names
        if keep in names:
            self.cursor = names.index(keep)
        self.cursor = max(0, min(self.cursor, len(names) - 1))
        self.virtual_size = Size(self.size.width, len(names) + 1)
        self.refresh()
        return True

    def _search(self, name: str) -> str:
        row = self.rows.get(name)
        return row.search if row else name.lower()

    def _widths(self, width: int) -> tuple[int, int]:
        fixed = sum(FIXED.values()) + self._name_width + 2 + 14
        bar = max(10, min(40, width - fixed - 24))
        rest = max(1, width - fixed - bar - 1)
        return bar, rest

    def _refresh_row(self, name: str) -> None:
        if name not in self.order:
            return
        y = self.order.index(name) + 1 - int(self.scroll_offset.y)
        if 1 <= y < self.size.height:
            self.refresh(Region(0, y, self.size.width, 1))

    def on_resize(self) -> None:
        self.virtual_size = Size(self.size.width, len(self.order) + 1)
        self._strips.clear()

    # ---- drawing ---------------------------------------------------------------------------

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        base = self.rich_style
        bar, rest = self._widths(width)
        if y == 0:
            return self._strip(header_text(self._name_width, bar, self.sort, self.reverse), width, base)
        i = y - 1 + int(self.scroll_offset.y)
        if i >= len(self.order):
            return Strip.blank(width, base)
        name = self.order[i]
        cached = self._strips.get(name)
        if cached is None or cached[0] != width:
            row = self.rows.get(name)
            text = row_text(row, self._name_width, bar, rest) if row else Text(f"    ◌ {node_str(name)}  waiting…",
                                                                              style="dim")
            cached = (width, self._strip(text, width, base))
            self._strips[name] = cached
            self.renders += 1
        strip = cached[1]
        if i == self.cursor:
            cursor = self.get_component_rich_style(
                "node-table--cursor" if self.has_focus else "node-table--cursor-blurred")
            strip = Strip(list(Segment.apply_style(iter(strip), post_style=Style(bgcolor=cursor.bgcolor))),
                          strip.cell_length)
        return strip

    def _strip(self, text: Text, width: int, base: Style) -> Strip:
        segments = list(text.render(self.app.console))
        return Strip(Segment.apply_style(segments, base), text.cell_len).adjust_cell_length(width, base)

    def on_focus(self) -> None:
        self._refresh_cursor()

    def on_blur(self) -> None:
        self._refresh_cursor()

    def _refresh_cursor(self) -> None:
        name = self.highlighted
        if name is not None:
            self._refresh_row(name)

    # ---- keys and mouse ----------------------------------------------------------------------

    def _move_to(self, index: int) -> None:
        if not self.order:
            return
        old = self.highlighted
        self.cursor = max(0, min(index, len(self.order) - 1))
        top = int(self.scroll_offset.y)
        visible = max(1, self.size.height - 1)
        if self.cursor < top:
            self.scroll_to(y=self.cursor, animate=False)
        elif self.cursor >= top + visible:
            self.scroll_to(y=self.cursor - visible + 1, animate=False)
        for name in (old, self.highlighted):
            if name is not None:
                self._refresh_row(name)

    def action_cursor(self, step: int) -> None:
        self._move_to(self.cursor + step)

    def action_page(self, step: int) -> None:
        self._move_to(self.cursor + step * max(1, self.size.height - 2))

    def action_edge(self, end: int) -> None:
        self._move_to(len(self.order) - 1 if end else 0)

    def action_open(self) -> None:
        if self.highlighted is not None:
            self.post_message(self.Selected(self.highlighted))

    def on_click(self, event: Click) -> None:
        i = event.y - 1 + int(self.scroll_offset.y)
        if event.y >= 1 and 0 <= i < len(self.order):
            self._move_to(i)
            if event.chain >= 2:
                self.action_open()

    def plain_lines(self) -> list[str]:
        """Header and rows as plain text at the table's width (tests)."""
        width = self.size.width or 160
        bar, rest = self._widths(width)
        out = [header_text(self._name_width, bar, self.sort, self.reverse).plain.rstrip()]
        for name in self.order:
            row = self.rows.get(name)
            out.append(row_text(row, self._name_width, bar, rest).plain.rstrip() if row else node_str(name))
        return out

