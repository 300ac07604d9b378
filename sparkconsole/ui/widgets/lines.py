"""A widget that shows a Rich renderable through Textual's line API, rendered once per change.

``Static.update`` re-measures the widget on every update (a full Rich render to learn the
height) and renders it again to paint it; a card updated every second on 32 nodes spent most
of the console's CPU there. Here the renderable is rendered to strips once, at the widget's
width; the strips answer both the height and the paint; a new renderable asks for a layout only
when its line count changed; and a widget that is not on screen is not rendered until it is
(Toolong's view over its own buffer works the same way).
"""

from __future__ import annotations

from typing import Any

from rich.console import RenderableType
from rich.segment import Segment
from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget


class RenderedLines(Widget):
    """Holds one renderable and the strips it rendered to; ``renders`` counts the renders."""

    DEFAULT_CSS = """
    RenderedLines {
        height: auto;
    }
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._renderable: RenderableType = ""
        self._strips: list[Strip] = []
        self._rendered_width = -1
        self._stale = True
        self.renders = 0

    @property
    def renderable(self) -> RenderableType:
        return self._renderable

    def show_renderable(self, renderable: RenderableType) -> None:
        """Show ``renderable``: rendered now when the widget is on screen (a layout only if its
        height changed), else when it next comes into view."""
        self._renderable = renderable
        self._stale = True
        width = self.content_size.width
        if width <= 0:
            self.refresh(layout=True)  # not laid out yet: the layout renders it
            return
        if not self.in_view():
            return  # drawn by render_line when it scrolls into view
        before = len(self._strips)
        self._render(width)
        self.refresh(layout=len(self._strips) != before)

    def in_view(self) -> bool:
        """Whether any of the widget was on screen in the last update (Textual's compositor keeps
        that map; ``is_on_screen`` also counts widgets scrolled out of the viewport)."""
        try:
            return self in self.screen._compositor.visible_widgets
        except Exception:  # no screen yet, or the compositor changed shape: draw to be safe
            return True

    def _render(self, width: int) -> None:
        console = self.app.console
        options = console.options.update(width=width, height=None, highlight=False)
        lines = console.render_lines(self._renderable, options, pad=True, new_lines=False)
        self._strips = [Strip(Segment.simplify(line), width) for line in lines]
        self._rendered_width = width
        self._stale = False
        self.renders += 1

    def _strips_for(self, width: int) -> list[Strip]:
        if self._stale or width != self._rendered_width:
            before = len(self._strips)
            self._render(width)
            if len(self._strips) != before and self.is_mounted:
                self.call_later(self.refresh, layout=True)
        return self._strips

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._strips_for(width)) if width > 0 else 0

    def render_line(self, y: int) -> Strip:
        width = self.content_size.width
        strips = self._strips_for(width) if width > 0 else []
        if 0 <= y < len(strips):
            return strips[y].apply_style(self.rich_style)
        return Strip.blank(width, self.rich_style)
