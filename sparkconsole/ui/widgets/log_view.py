"""The followed log's lines, drawn straight from the screen's :class:`~sparkconsole.logs.follow.LogBuffer`.

A line-API view (Toolong's shape, as :mod:`sparkconsole.ui.widgets.node_table`): the view holds no
copy of the lines, only which buffer lines it shows (every one, or the rows a filter kept) and the
strips it rendered, keyed by the line's absolute number in the buffer (``dropped + index``), which
never changes: appending lines invalidates nothing, a line pushed out of the buffer ages out of
the cache, and a batch of new lines costs its own lines (a filter test each, a width each, one
render each when it comes into view), never a pass over the buffer.

Node text is data: each line is drawn as plain :class:`rich.text.Text` (never markup) from
``BufferLine.display``, which :func:`~sparkconsole.logs.follow.display_text` already cleaned of
escape sequences and control characters. Lines do not wrap; the view scrolls sideways to the
widest line shown.

It is a :class:`textual.widgets.Log` to the rest of the app (its looks, keys, scrolling and text
selection), but it draws from the buffer: ``write_lines`` takes the :class:`BufferLine` s just
appended to the buffer, and ``lines`` reads the buffer.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Self, overload

from rich.cells import cell_len
from rich.highlighter import Highlighter
from rich.style import Style
from rich.text import Text
from textual.cache import LRUCache
from textual.events import Resize
from textual.geometry import Size
from textual.selection import Selection
from textual.strip import Strip
from textual.widgets import Log

from sparkconsole.logs.follow import BufferLine, LogBuffer, compile_pattern

CACHED_STRIPS = 1024  # rendered lines kept (a screenful is ~50; scrolling back finds the rest)


class ShownLines(Sequence[str]):
    """The text of every row the view shows, read from the buffer when asked (no copy)."""

    def __init__(self, view: LogBufferView) -> None:
        self._view = view

    def __len__(self) -> int:
        return self._view.line_count

    @overload
    def __getitem__(self, row: int) -> str: ...

    @overload
    def __getitem__(self, row: slice) -> list[str]: ...

    def __getitem__(self, row: int | slice) -> str | list[str]:
        if isinstance(row, slice):
            return [self[i] for i in range(*row.indices(len(self)))]
        count = len(self)
        if row < 0:
            row += count
        if not 0 <= row < count:
            raise IndexError(row)
        return self._view.line_at(row).display


class LogBufferView(Log):
    """The rows of a :class:`LogBuffer`: every line, or only those a filter keeps (markers and
    gaps pass any filter). ``renders`` counts the lines rendered (a cached line is not rendered again)."""

    def __init__(
        self,
        buffer: LogBuffer,
        highlighter: Highlighter,
        *,
        following: Callable[[], bool] = lambda: True,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(highlight=True, max_lines=buffer.max_lines, auto_scroll=True,
                         name=name, id=id, classes=classes)
        self.buffer = buffer
        self.highlighter = highlighter
        self.following = following  # the screen's own "follow the tail" state (kept on a resize)
        self.rows: list[int] | None = None
        """Under a filter, the absolute number (``buffer.dropped + index``) of each line shown, in
        order; ``None`` when every line of the buffer shows."""
        self.rows_added = 0  # rows ever added by write_lines (a screen counts new rows by it)
        self.renders = 0
        self._rx: re.Pattern[str] | None = None
        self._seen_dropped = buffer.dropped  # the buffer's ``dropped`` at the last update
        self._strips: LRUCache[int, Strip] = LRUCache(CACHED_STRIPS)  # absolute number -> strip
        self._strips_style: Style | None = None  # the base style the cached strips were drawn in

    # ---- rows ---------------------------------------------------------------------------------

    @property
    def line_count(self) -> int:
        """Rows shown."""
        return len(self.buffer) if self.rows is None else len(self.rows)

    @property
    def lines(self) -> Sequence[str]:
        """The text of each row shown, from the buffer (read only)."""
        return ShownLines(self)

    def absolute_at(self, row: int) -> int:
        """The absolute number of the line shown on ``row``."""
        return self.buffer.dropped + row if self.rows is None else self.rows[row]

    def line_at(self, row: int) -> BufferLine:
        return self.buffer[self.absolute_at(row) - self.buffer.dropped]

    def row_of(self, index: int) -> int | None:
        """The row showing buffer index ``index`` (``None`` when the filter hides it)."""
        if self.rows is None:
            return index
        absolute = self.buffer.dropped + index
        pos = bisect.bisect_left(self.rows, absolute)
        return pos if pos < len(self.rows) and self.rows[pos] == absolute else None

    def index_at(self, row: int) -> int:
        """The buffer index shown on ``row`` (the last row's below the end; -1 when none shows)."""
        count = self.line_count
        if count == 0:
            return -1
        return self.absolute_at(max(0, min(row, count - 1))) - self.buffer.dropped

    # ---- data in ------------------------------------------------------------------------------

    def write_lines(self, lines: Iterable[BufferLine], scroll_end: bool | None = None) -> Self:  # type: ignore[override]
        """``lines`` were just appended to the buffer (they are its last ``len(lines)``): show
        those the filter keeps. Costs the new lines only: nothing cached is dropped; the view
        repaints the new rows, or every row when lines left the top of the buffer (the rows then
        show lines already rendered, the new ones apart). It follows the tail as ``Log`` does: to
        the end when it was at the end and ``scroll_end`` (else ``auto_scroll``) says so."""
        new = lines if isinstance(lines, Sequence) else list(lines)
        buffer = self.buffer
        count = min(len(new), len(buffer))  # a batch longer than the buffer: its tail only
        if count < len(new):
            new = new[len(new) - count:]
        first = buffer.dropped + len(buffer) - count
        at_end = self.is_vertical_scroll_end
        gone = buffer.dropped - self._seen_dropped  # lines pushed out at the top since
        self._seen_dropped = buffer.dropped
        if self.rows is None:
            start = len(buffer) - count
            moved = gone > 0
            shown = list(new)
        else:
            cut = bisect.bisect_left(self.rows, buffer.dropped)
            if cut:
                del self.rows[:cut]
            moved = cut > 0
            start = len(self.rows)
            rx = self._rx
            shown = []
            for offset, line in enumerate(new):
                if line.kind != "line" or rx is None or rx.search(line.display):
                    self.rows.append(first + offset)
                    shown.append(line)
        added = len(shown)
        self.rows_added += added
        if shown:
            process = self._process_line
            self._width = max(self._width, max(cell_len(process(line.display)) for line in shown))
        self.virtual_size = Size(self._width, self.line_count)
        if moved:
            self.refresh()
        elif added:
            self.refresh_lines(start, added)
        auto_scroll = self.auto_scroll if scroll_end is None else scroll_end
        if auto_scroll and at_end and not self.is_vertical_scrollbar_grabbed:
            self.scroll_end(animate=False, immediate=True, x_axis=False)
        return self

    def set_filter(self, pattern: str | None) -> None:
        """Show only the lines matching ``pattern`` (a literal, any case; markers and gaps always), or
        every line when it is empty or ``None``. The width is measured again over what shows."""
        buffer = self.buffer
        self._seen_dropped = buffer.dropped
        if pattern:
            self._rx = compile_pattern(pattern)
            self.rows = [buffer.dropped + i for i in buffer.matches(pattern)]
            shown: Iterable[BufferLine] = (buffer[a - buffer.dropped] for a in self.rows)
        else:
            self._rx = None
            self.rows = None
            shown = buffer.lines
        process = self._process_line
        self._width = max((cell_len(process(line.display)) for line in shown), default=0)
        self.virtual_size = Size(self._width, self.line_count)
        self.refresh()

    def restyle(self) -> None:
        """The highlighter changed (a new search pattern): every line is rendered again."""
        self._strips.clear()
        self.refresh()

    def write(self, data: str, scroll_end: bool | None = None) -> Self:
        raise TypeError("LogBufferView draws from its LogBuffer: append there, then write_lines")

    def write_line(self, line: str, scroll_end: bool | None = None) -> Self:
        raise TypeError("LogBufferView draws from its LogBuffer: append there, then write_lines")

    def clear(self) -> Self:
        raise TypeError("LogBufferView draws from its LogBuffer: filter with set_filter")

    # ---- following ----------------------------------------------------------------------------

    def on_resize(self, event: Resize) -> None:
        # while following, the last line stays in view when the view gets shorter (the vLLM
        # panel above it grows) as well as when lines come
        if self.following():
            self.scroll_end(animate=False, immediate=True, x_axis=False)

    # ---- drawing ------------------------------------------------------------------------------

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips.clear()

    def selection_updated(self, selection: Selection | None) -> None:
        self.refresh()  # a selection is drawn uncached; the cached strips stay good

    def get_selection(self, selection: Selection) -> tuple[str, str] | None:
        return selection.extract("\n".join(self.lines)), "\n"

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        row = scroll_y + y
        width = self.size.width
        style = self.rich_style
        if row >= self.line_count:
            return Strip.blank(width, style)
        strip = self._strip(row, style)
        return strip.crop_extend(scroll_x, scroll_x + width, style).apply_offsets(scroll_x, row)

    def _strip(self, row: int, style: Style) -> Strip:
        """The whole line on ``row`` (uncropped), from the cache unless text is being selected."""
        if style != self._strips_style:  # focus, theme: the base style under every line changed
            self._strips.clear()
            self._strips_style = style
        absolute = self.absolute_at(row)
        selection = self.text_selection
        if selection is None:
            cached = self._strips.get(absolute)
            if cached is not None:
                return cached
        plain = self._process_line(self.buffer[absolute - self.buffer.dropped].display)
        text = Text(plain, no_wrap=True)  # plain text: a "[bold]" in a log line is shown as it is
        text.stylize(style)
        if self.highlight:
            text = self.highlighter(text)
        if selection is not None and (span := selection.get_span(row)) is not None:
            start, end = span
            if end == -1:
                end = len(text)
            text.stylize(self.screen.get_component_rich_style("screen--selection"), start, end)
        strip = Strip(text.render(self.app.console), cell_len(plain))
        self.renders += 1
        if selection is None:
            self._strips[absolute] = strip
        return strip
