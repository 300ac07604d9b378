"""A node in a few lines, for beside the wizard: memory split four ways, GPU, link, containers.

The overview's :class:`~sparkconsole.ui.widgets.node_card.NodeCard` shows everything about a
node; while a deployment runs the operator needs only what the deployment moves: unified memory
falling as services stop and rising as weights load, the GPU waking up, the fast link, and how
many containers run. The panel is fed the same :class:`~sparkconsole.probe.state.NodeState` the
overview draws, so the two never disagree. Its memory bar is as wide as the panel is.
"""

from __future__ import annotations

from rich.console import Group
from rich.text import Text
from textual.widgets import Static

from sparkconsole.probe.samples import NodeSample
from sparkconsole.probe.state import NodeState, NodeStatus
from sparkconsole.ui.render import DASH, MEMORY_COLOURS, fmt, gib, memory_bar, node_str, node_text
from sparkconsole.ui.widgets.node_card import STATUS_STYLE, node_title

DEFAULT_WIDTH = 36


def compact_legend(sample: NodeSample) -> Text:
    """The four parts of the bar in GiB, short labels (the panel is narrow)."""
    mem = sample.memory
    avail = mem.available_bytes
    cache = mem.page_cache_bytes
    free = None if avail is None else max(avail - min(cache or 0, avail), 0)
    text = Text()
    for key, label, value in (("gpu", "gpu", mem.gpu_process_bytes), ("other", "other", mem.other_used_bytes),
                              ("cache", "cache", cache), ("free", "free", free)):
        text.append("■", style=MEMORY_COLOURS[key])
        text.append(f"{label} {gib(value)} ")
    return text


def link_text(sample: NodeSample) -> Text:
    text = Text("link ", style="bold")
    if not sample.links:
        text.append(f"{DASH} ({node_str(sample.unknown.get('links', 'none seen'))})", style="dim")
        return text
    up = [lk for lk in sample.links if lk.state == "up"]
    if up:
        text.append(f"▲ up {len(up)}/{len(sample.links)}", style="green")
        text.append(f" · {fmt(up[0].rate_gbps, ' Gb/s')} · MTU {fmt(up[0].mtu)}", style="dim")
    else:
        text.append(f"▼ down 0/{len(sample.links)}", style="bold red")
    return text


def containers_text(sample: NodeSample) -> Text:
    text = Text("containers ", style="bold")
    if "docker-ps" in sample.unknown and not sample.containers:
        text.append(f"{DASH} ({node_str(sample.unknown['docker-ps'])})", style="dim")
        return text
    running = [c for c in sample.containers if c.state == "running"]
    text.append(f"{len(running)} running")
    names = [node_str(c.name) for c in sorted(running, key=lambda c: -(c.mem_used_bytes or 0)) if c.name]
    if names:
        text.append(": " + ", ".join(names), style="dim")
    return text


def panel_renderable(state: NodeState, role: str, width: int) -> Group:
    """What one panel shows at ``width`` columns (the bar fills the width)."""
    style = STATUS_STYLE[state.status]
    head = Text()
    head.append(f"{state.status.glyph} ", style=style)
    head.append(state.status.value, style=style)
    head.append(f" · {role}", style="dim")
    sample = state.sample
    if sample is None:
        return Group(head, Text("waiting for the first sample…", style="dim"))
    gpu = sample.gpus[0] if sample.gpus else None
    head.append("  GPU ", style="bold")
    head.append(fmt(gpu.utilization_pct if gpu else None, " %"))
    if gpu is not None and gpu.temperature_c is not None:
        head.append(f" {gpu.temperature_c:.0f} °C", style="dim")
    mem = sample.memory
    used = Text("memory ", style="bold")
    used.append(f"{gib(mem.used_bytes)} / {gib(mem.total_bytes)} GiB used")
    parts = [head, used, memory_bar(mem, max(8, width)), compact_legend(sample), link_text(sample),
             containers_text(sample)]
    if state.status is not NodeStatus.UP:
        parts.append(node_text(state.reason, style))
    for text in parts:
        if isinstance(text, Text):
            text.overflow = "ellipsis"
    return Group(*parts)


class NodePanel(Static):
    """One node's live panel beside the wizard; :meth:`show` redraws it from a poll's state."""

    def __init__(self, node: str, role: str, index: int) -> None:
        super().__init__(id=f"node-panel-{index}", classes="node-panel")
        self.node = node
        self.role = role
        self.border_title = node_title(index, node)  # Text: never markup, the name cleaned
        self._state: NodeState | None = None

    def show(self, state: NodeState) -> None:
        self._state = state
        self._draw()

    def on_resize(self) -> None:
        self._draw()

    def _draw(self) -> None:
        if self._state is None:
            return
        width = self.content_size.width or DEFAULT_WIDTH
        self.update(panel_renderable(self._state, self.role, width))
        self.set_class(self._state.status is NodeStatus.DOWN, "-down")
        self.set_class(self._state.status is NodeStatus.STALE, "-stale")

    def plain_text(self, width: int = DEFAULT_WIDTH) -> str:
        """What the panel shows, as plain text (tests)."""
        from sparkconsole.ui.widgets.node_card import renderable_text

        if self._state is None:
            return ""
        return renderable_text(panel_renderable(self._state, self.role, width), width)
