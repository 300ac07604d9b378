"""Small Rich renderers the cards and detail views share: sparklines, the memory bar, values,
and node text.

Kept as functions returning :class:`rich.text.Text` so a whole card is one cheap ``Static``
update per sample, and so gaps ("not read") render as gaps and unknown values as "—".

Node text is data (issue 23): what a node said (a process, container or image name, a reason it
could not be read, an error) goes on screen through :func:`node_str` or :func:`node_text` only:
cleaned by :func:`~sparkconsole.logs.follow.display_text` (no escape sequence reaches the
operator's terminal) and as plain Text, never Textual or Rich markup (a plain ``str`` given to a
``DataTable`` cell, a Rich ``Table`` cell, ``Static.update`` or a tooltip is parsed as markup:
``in [/root/.cache/x]`` raises ``MarkupError`` and ends the app).
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.color import Color, blend_rgb
from rich.segment import Segment, Segments
from rich.style import Style
from rich.text import Text
from textual.scrollbar import ScrollBarRender
from textual.widget import Widget

from sparkconsole.logs.follow import display_lines
from sparkconsole.probe.samples import UnifiedMemory

BLOCKS = "▁▂▃▄▅▆▇█"
DASH = "—"
GIB = 2**30

MEMORY_COLOURS = {
    "gpu": "magenta",
    "other": "yellow",
    "cache": "blue",
    "free": "green",
}


def node_str(text: object, *, lines: bool = False) -> str:
    """A node's text as the screen may show it: no escapes, no control characters; on one line
    (its lines joined by spaces) unless ``lines``. ``None`` is ""."""
    if text is None:
        return ""
    return display_lines(str(text), "\n" if lines else " ")


def node_text(text: object, style: str = "", *, lines: bool = False) -> Text:
    """A node's text as plain :class:`~rich.text.Text` (never markup), cleaned by :func:`node_str`."""
    return Text(node_str(text, lines=lines), style=style)


def sparkline(values: Sequence[float | None], width: int, lo: float | None = None, hi: float | None = None,
              style: str = "cyan") -> Text:
    """The last ``width`` values as block characters; ``None`` (not read) is a blank."""
    pts = list(values)[-width:]
    known = [v for v in pts if v is not None]
    text = Text()
    if not known:
        return Text(" " * width)
    low = min(known) if lo is None else lo
    high = max(known) if hi is None else hi
    span = (high - low) or 1.0
    text.append(" " * (width - len(pts)))
    for v in pts:
        if v is None:
            text.append(" ")
            continue
        idx = int((min(max(v, low), high) - low) / span * (len(BLOCKS) - 1) + 0.5)
        text.append(BLOCKS[idx], style=style)
    return text


def fmt(value: float | None, unit: str = "", digits: int = 0) -> str:
    """A value with its unit, or "—" when it was not read (never 0)."""
    if value is None:
        return DASH
    return f"{value:.{digits}f}{unit}"


def gib(value: int | float | None, digits: int = 1) -> str:
    return DASH if value is None else f"{value / GIB:.{digits}f}"


def memory_parts(mem: UnifiedMemory) -> list[tuple[str, int | None]]:
    """The four parts of the unified-memory bar, in bar order."""
    return [
        ("gpu", mem.gpu_process_bytes),
        ("other", mem.other_used_bytes),
        ("cache", mem.page_cache_bytes),
        ("free", mem.available_bytes),
    ]


def memory_bar(mem: UnifiedMemory, width: int) -> Text:
    """A stacked bar: GPU processes / other used / page cache / available, scaled to MemTotal.

    Page cache is part of MemAvailable on Linux; the bar shows it separately and the "free" part
    is what is available beyond the cache, so the four parts add up to the total.
    """
    total = mem.total_bytes
    if not total:
        return Text("unified memory not read".center(width), style="dim")
    avail = mem.available_bytes or 0
    cache = min(mem.page_cache_bytes or 0, avail)
    parts = [
        ("gpu", (mem.gpu_process_bytes or 0) if mem.unified else 0),
        ("other", mem.other_used_bytes or 0),
        ("cache", cache),
        ("free", max(avail - cache, 0)),
    ]
    text = Text()
    used_cells = 0
    for i, (key, size) in enumerate(parts):
        cells = round(size / total * width) if i < len(parts) - 1 else width - used_cells
        cells = max(0, min(cells, width - used_cells))
        used_cells += cells
        char = "█" if key != "free" else "░"
        text.append(char * cells, style=MEMORY_COLOURS[key])
    return text


def memory_legend(mem: UnifiedMemory) -> Text:
    avail = mem.available_bytes
    cache = mem.page_cache_bytes
    free_beyond_cache = None if avail is None else max(avail - min(cache or 0, avail), 0)
    text = Text()
    for key, label, value in (
        ("gpu", "GPU procs" if mem.unified else "GPU (own memory)", mem.gpu_process_bytes),
        ("other", "other", mem.other_used_bytes),
        ("cache", "cache", cache),
        ("free", "free", free_beyond_cache),
    ):
        text.append("■ ", style=MEMORY_COLOURS[key])
        text.append(f"{label} {gib(value)}  ")
    return text


_BACK = Color.parse("#555555")
_BAR = Color.parse("bright_magenta")


class ThinScrollBarRender(ScrollBarRender):
    """A scrollbar that reads as one: a thin track line and a bold thumb line over whole cells.

    Textual's default draws the thumb as a blank reverse block with partial-cell ends (``▁▆▇``),
    which in many terminals and themes read as stray characters at the right edge. Here the thumb
    covers whole cells only, in the bar colour, on a track drawn faintly in the same colour.
    """

    @classmethod
    def render_bar(cls, size: int = 25, virtual_size: float = 50, window_size: float = 20, position: float = 0,
                   thickness: int = 1, vertical: bool = True, back_color: Color = _BACK,
                   bar_color: Color = _BAR) -> Segments:
        track_glyph, thumb_glyph = ("│", "┃") if vertical else ("─", "━")
        width = thickness if vertical else 1
        pad = " " * (width - 1)  # a wider bar is the same thin line, on the right
        back = back_color
        track = Style(color=Color.from_triplet(blend_rgb(back.get_truecolor(), bar_color.get_truecolor(), 0.35)),
                      bgcolor=back)
        grab = {"@mouse.down": "grab"}
        if not (window_size and size and virtual_size and size != virtual_size):
            return cls._lines([Segment(" " * width, Style(bgcolor=back))] * int(size), vertical, thickness)
        thumb = max(1, min(int(size), round(window_size * size / virtual_size)))
        span = virtual_size - window_size
        ratio = 0.0 if span <= 0 else min(1.0, max(0.0, position / span))
        start = round((size - thumb) * ratio)
        upper = Segment(pad + track_glyph, track + Style(meta={"@mouse.down": "scroll_up"}))
        lower = Segment(pad + track_glyph, track + Style(meta={"@mouse.down": "scroll_down"}))
        body = Segment(pad + thumb_glyph, Style(color=bar_color, bgcolor=back, bold=True, meta=grab))
        segments = [upper] * start + [body] * thumb + [lower] * (int(size) - start - thumb)
        return cls._lines(segments, vertical, thickness)

    @staticmethod
    def _lines(segments: list[Segment], vertical: bool, thickness: int) -> Segments:
        if vertical:
            return Segments(segments, new_lines=True)
        return Segments([*segments, Segment.line()] * thickness, new_lines=False)


def thin_scrollbars(widget: Widget) -> None:
    """Give ``widget`` the thin scrollbars (both axes)."""
    widget.vertical_scrollbar.renderer = ThinScrollBarRender
    widget.horizontal_scrollbar.renderer = ThinScrollBarRender
