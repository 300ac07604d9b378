"""One node at a glance: status, GPU with history, unified memory, ConnectX-7, containers, the engines
it serves, alerts."""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.message import Message

from sparkconsole.probe.alerts import Alert
from sparkconsole.probe.samples import NodeSample
from sparkconsole.probe.state import NodeState, NodeStatus
from sparkconsole.ui.render import DASH, fmt, gib, memory_bar, memory_legend, node_str, node_text, sparkline
from sparkconsole.ui.widgets.lines import RenderedLines
from sparkconsole.ui.widgets.serving import serving_block, serving_key, serving_title

STATUS_STYLE = {
    NodeStatus.CONNECTING: "yellow",
    NodeStatus.UP: "green",
    NodeStatus.STALE: "dark_orange",
    NodeStatus.DOWN: "red",
}
CARD_WIDTH = 76  # the content width a card is drawn at when no width is given (tests, detail)
MIN_CARD_WIDTH = 60  # narrower than this, the sparklines and the memory bar lose their meaning
TOP_CONTAINERS = 4


def spark_width(width: int) -> int:
    """Sparklines take what the label (6) and value (10) columns and their gaps leave."""
    return max(10, width - 18)


def age_text(state: NodeState, now: float) -> str:
    age = state.age(now)
    if age is None:
        return "no sample yet"
    if age < 1.5:
        return "just now"
    if age < 120:
        return f"{age:.0f} s ago"
    return f"{age / 60:.0f} min ago"


def node_title(index: int, node: str) -> Text:
    """``[1] spark-1a32`` for a border title, as Text: a ``str`` border title is Textual markup (a node
    named ``spark[/bold]x`` ended the console with MarkupError), and the name goes through
    :func:`node_str` as every node word does (a hostname with an OSC set the terminal's title)."""
    return Text.assemble(f"[{index}] ", node_text(node))


def status_line(state: NodeState, role: str, now: float) -> Text:
    style = STATUS_STYLE[state.status]
    text = Text()
    text.append(f"{state.status.glyph} ", style=style)
    text.append(node_str(state.name), style="bold")
    text.append(f" · {role} · ")
    text.append(state.status.value, style=style)
    text.append(f" · {age_text(state, now)}", style="dim")
    if state.status is not NodeStatus.UP:
        text.append(f"\n  {node_str(state.reason)}", style=style)
    return text


def gpu_block(state: NodeState, sample: NodeSample, width: int = CARD_WIDTH) -> Table:
    gpu = sample.gpus[0] if sample.gpus else None
    hist = state.history
    cells = spark_width(width)
    table = Table.grid(padding=(0, 1))
    table.add_column(width=6)
    table.add_column(width=10, justify="right")
    table.add_column(width=cells)
    rows = [
        ("util", fmt(gpu.utilization_pct if gpu else None, " %"), "gpu_util", 0.0, 100.0, "green"),
        ("temp", fmt(gpu.temperature_c if gpu else None, " °C"), "gpu_temp", 20.0, 95.0, "yellow"),
        ("power", fmt(gpu.power_w if gpu else None, " W"), "gpu_power", 0.0, None, "magenta"),
        ("clock", fmt(gpu.clock_sm_mhz if gpu else None, " MHz"), "gpu_clock", 0.0, None, "cyan"),
    ]
    for label, value, metric, lo, hi, colour in rows:
        table.add_row(Text(label, style="dim"), value, sparkline(hist.values(metric, last=cells), cells, lo, hi, colour))
    return table


def links_line(sample: NodeSample) -> Text:
    text = Text("ConnectX-7  ", style="bold")
    if not sample.links:
        reason = sample.unknown.get("links", "no ConnectX-7 seen")
        text.append(f"{DASH} ({node_str(reason)})", style="dim")
        return text
    up = [link for link in sample.links if link.state == "up"]
    style = "green" if up else "red"
    text.append(f"{len(up)}/{len(sample.links)} twins up", style=style)
    lead = up[0] if up else None
    if lead is not None:
        rate = fmt(lead.rate_gbps, " Gb/s")
        ip = node_str(lead.ipv4[0]) if lead.ipv4 else DASH
        mtu = fmt(lead.mtu)
        text.append(f" · {rate} · {ip} · MTU {mtu}")
    return text


def containers_line(sample: NodeSample) -> Text:
    text = Text("Containers  ", style="bold")
    if "docker-ps" in sample.unknown and not sample.containers:
        text.append(f"{DASH} ({node_str(sample.unknown['docker-ps'])})", style="dim")
        return text
    running = [c for c in sample.containers if c.state == "running"]
    text.append(f"{len(running)} running / {len(sample.containers)}")
    sized = [c for c in sample.containers if c.mem_used_bytes is not None]
    if sized:
        big = max(sized, key=lambda c: c.mem_used_bytes or 0)
        text.append(f" · biggest {node_str(big.name)} {gib(big.mem_used_bytes)} GiB", style="dim")
    return text


def containers_table(sample: NodeSample) -> Table:
    """The few containers that matter most: running first, then by memory."""
    table = Table.grid(padding=(0, 1))
    table.add_column(width=1)
    table.add_column(ratio=2, no_wrap=True, overflow="ellipsis")
    table.add_column(ratio=3, no_wrap=True, overflow="ellipsis", style="dim")
    table.add_column(no_wrap=True)
    table.add_column(justify="right", no_wrap=True)
    ordered = sorted(sample.containers, key=lambda c: (c.state != "running", -(c.mem_used_bytes or 0)))
    for c in ordered[:TOP_CONTAINERS]:
        colour = {"running": "green", "restarting": "dark_orange", "exited": "dim"}.get(c.state or "", "yellow")
        mem = DASH if c.mem_used_bytes is None else f"{gib(c.mem_used_bytes)} GiB"
        # Text cells: a plain str in a Rich Table is parsed as markup, and these are the node's words
        table.add_row(Text("●", style=colour), node_text(c.name or DASH), node_text(c.image or DASH),
                      node_text(c.status or DASH), mem)
    if len(ordered) > TOP_CONTAINERS:
        table.add_row("", Text(f"… {len(ordered) - TOP_CONTAINERS} more (Enter for all)", style="dim"), "", "", "")
    return table


def gpu_processes_line(sample: NodeSample) -> Text:
    text = Text("GPU processes  ", style="bold")
    if "gpu_processes" in sample.unknown and not sample.gpu_processes:
        text.append(f"{DASH} ({node_str(sample.unknown['gpu_processes'])})", style="dim")
        return text
    if not sample.gpu_processes:
        text.append("none", style="dim")
        return text
    groups: dict[str, list[float | None]] = {}
    for p in sorted(sample.gpu_processes, key=lambda p: -(p.memory_mib or 0)):
        groups.setdefault(node_str(p.name) or f"pid {p.pid}", []).append(p.memory_mib)
    parts = []
    for name, sizes in groups.items():
        gibs = " + ".join(fmt(m / 1024 if m is not None else None, "", 1) for m in sizes)
        parts.append(f"{name} ×{len(sizes)} ({gibs} GiB)" if len(sizes) > 1 else f"{name} {gibs} GiB")
    text.append(" · ".join(parts))
    return text


def renderable_text(renderable, width: int = 76) -> str:
    import io

    from rich.console import Console

    console = Console(width=width, file=io.StringIO(), color_system=None, legacy_windows=False)
    console.print(renderable)
    return console.file.getvalue()


def card_renderable(state: NodeState, role: str, now: float, alerts: list[Alert],
                    width: int = CARD_WIDTH) -> Group:
    """The card at ``width`` content cells: the sparklines and the memory bar follow the width."""
    parts: list = [status_line(state, role, now)]
    sample = state.sample
    if sample is None:
        parts.append(Text("\nwaiting for the first sample…", style="dim"))
        return Group(*parts)
    gpu = sample.gpus[0] if sample.gpus else None
    head = Text("GPU  ", style="bold")
    if gpu is None:
        head.append(f"{DASH} ({node_str(sample.unknown.get('gpu', 'not read'))})", style="dim")
    else:
        head.append(node_str(gpu.name) or DASH)
        head.append(f" · driver {node_str(sample.driver_version) or DASH} · CUDA {node_str(sample.cuda_version) or DASH}",
                    style="dim")
    parts += [Text(""), head, gpu_block(state, sample, width), Text("")]
    mem = sample.memory
    mem_head = Text("Unified memory  ", style="bold")
    mem_head.append(f"{gib(mem.used_bytes)} / {gib(mem.total_bytes)} GiB used · {gib(mem.available_bytes)} GiB available")
    parts += [mem_head, memory_bar(mem, width), memory_legend(mem), Text("")]
    parts += [gpu_processes_line(sample), links_line(sample), containers_line(sample)]
    if sample.containers:
        parts.append(containers_table(sample))
    serving = serving_block(state, width=width)
    if serving is not None:
        parts += [serving_title(state), serving]
    if alerts:
        parts.append(Text(""))
        for alert in alerts:
            style = "bold red" if alert.severity == "critical" else "dark_orange"
            parts.append(Text(f"⚠ {alert.text}", style=style))
    return Group(*parts)


def _last_point(state: NodeState) -> float | None:
    """When the history last moved (a sample or a gap): the sparklines change with it."""
    series = state.history.series.get("gpu_util") if state.history else None
    return series[-1][0] if series else None


class NodeCard(RenderedLines, can_focus=True):
    """A node's card on the overview, drawn through the line API at the card's own width.
    Click or Enter opens its detail."""

    class Selected(Message):
        def __init__(self, node: str) -> None:
            super().__init__()
            self.node = node

    def __init__(self, node: str, role: str, index: int, clock: Callable[[], float]) -> None:
        super().__init__(id=f"card-{index}", classes="node-card")
        self.node = node
        self.role = role
        self.index = index
        self.clock = clock
        self.border_title = node_title(index, node)
        self.draws = 0  # how often show() found something new (renders: how often it was rendered)
        self._state: NodeState | None = None
        self._alerts: list[Alert] = []
        self._shown_key: tuple | None = None

    def show(self, state: NodeState, alerts: list[Alert]) -> None:
        """Draw the card, unless nothing it shows changed since the last draw (same sample, status,
        reason, age as shown and alerts): an unchanged card is not rendered or laid out again."""
        now = self.clock()
        key = (id(state.sample), state.sample.taken_at if state.sample else None, state.status, state.reason,
               age_text(state, now), tuple((a.severity, a.text) for a in alerts), _last_point(state),
               serving_key(state))
        if key == self._shown_key:
            return
        self._shown_key = key
        self.draws += 1
        self._state, self._alerts = state, alerts
        self.show_renderable(_CardAt(self, now))
        self.set_class(state.status is NodeStatus.DOWN, "-down")
        self.set_class(state.status is NodeStatus.STALE, "-stale")
        reasons = dict(state.sample.unknown) if state.sample else {}
        if state.status is not NodeStatus.UP:
            reasons = {"status": state.reason, **reasons}
        # Text, not str: a str tooltip is parsed as markup, and the reasons are the node's words
        tip = "\n".join(f"{k}: {node_str(v)}" for k, v in reasons.items())
        self.tooltip = Text(tip) if tip else None
        self.border_subtitle = state.status.value

    def plain_text(self, width: int = CARD_WIDTH) -> str:
        """What the card shows, as plain text (tests and screen readers)."""
        if self._state is None:
            return ""
        return renderable_text(card_renderable(self._state, self.role, self.clock(), self._alerts, width), width)

    def on_click(self) -> None:
        self.post_message(self.Selected(self.node))


class _CardAt:
    """The card's renderable, built at whatever width Rich renders it (the card's content width):
    the bars follow the card instead of wrapping in a narrow one."""

    def __init__(self, card: NodeCard, now: float) -> None:
        self.card = card
        self.now = now

    def __rich_console__(self, console, options):
        card = self.card
        assert card._state is not None
        yield card_renderable(card._state, card.role, self.now, card._alerts, options.max_width)
