"""The log screen's view over its buffer (sparkconsole/ui/widgets/log_view.py): new lines cost
their own render only, a view scrolled up stays put, node text is shown as it is (no markup, no
escapes), and the filter, the search highlight and the horizontal scroll draw from the buffer."""

from __future__ import annotations

import asyncio

from textual.app import App, ComposeResult

from sparkconsole.logs.follow import LogBuffer, LogLine
from sparkconsole.ui.screens.logs import LogHighlighter, LogScreen
from sparkconsole.ui.widgets.log_view import LogBufferView
from tests.ui_support import Host


class ViewApp(App[None]):
    def __init__(self, buffer: LogBuffer) -> None:
        super().__init__()
        self.buffer = buffer
        self.highlighter = LogHighlighter()

    def compose(self) -> ComposeResult:
        yield LogBufferView(self.buffer, self.highlighter, id="log")

    @property
    def view(self) -> LogBufferView:
        return self.query_one(LogBufferView)

    def append(self, texts) -> None:
        self.view.write_lines([self.buffer.append(t) for t in texts])


def shown(view: LogBufferView) -> list[str]:
    return [view.render_line(y).text.rstrip() for y in range(view.scrollable_content_region.height)]


async def test_one_more_line_after_ten_thousand_renders_that_line_only() -> None:
    for max_lines in (20_000, 5_000):  # all kept, and lines pushed out at the top every time
        app = ViewApp(LogBuffer(max_lines))
        async with app.run_test(size=(80, 20)) as pilot:
            view = app.view
            app.append(f"line {i}" for i in range(10_000))
            await pilot.pause()
            assert view.scroll_y == view.max_scroll_y > 0
            assert view.renders <= view.size.height  # the lines in view, not the 10,000
            before = view.renders
            app.append(["line 10000"])
            await pilot.pause()
            assert view.renders == before + 1, max_lines
            assert view.scroll_y == view.max_scroll_y
            assert shown(view)[-1] == "line 10000"
            assert view.line_count == min(max_lines, 10_001) and view.lines[-1] == "line 10000"


async def test_a_view_scrolled_up_stays_put_and_renders_nothing_new() -> None:
    app = ViewApp(LogBuffer(5_000))
    async with app.run_test(size=(80, 20)) as pilot:
        view = app.view
        app.append(f"line {i}" for i in range(1_000))
        await pilot.pause()
        view.scroll_to(y=400, animate=False, immediate=True)
        await pilot.pause()
        before, top = view.renders, shown(view)
        assert top[0] == "line 400"
        app.append(f"new {i}" for i in range(300))
        await pilot.pause()
        assert view.scroll_y == 400 and shown(view) == top
        assert view.renders == before  # the new lines are out of view: not rendered
        assert view.max_scroll_y > 400 and view.lines[-1] == "new 299"


async def test_paused_screen_keeps_its_place_and_counts_new_lines() -> None:
    app = Host(lambda: LogScreen("spark-01", "vllm", _never, tracker=None))
    async with app.run_test(size=(100, 30)) as pilot:
        screen: LogScreen = app.screen  # type: ignore[assignment]
        screen.handle_events([LogLine(f"line {i}") for i in range(200)])
        await pilot.pause()
        view = screen.log_view
        await pilot.press("pageup")
        await pilot.pause()
        top, before = view.scroll_y, view.renders
        assert not screen.following
        screen.handle_events([LogLine(f"new {i}") for i in range(50)])
        await pilot.pause()
        assert view.scroll_y == top and view.renders == before
        assert screen.badge_text.startswith("▼ 50 new lines")
        await pilot.press("end")
        await pilot.pause()
        assert view.scroll_y == view.max_scroll_y and shown(view)[-1] == "new 49"


async def test_node_text_is_shown_literally() -> None:
    app = Host(lambda: LogScreen("spark-01", "vllm", _never, tracker=None))
    async with app.run_test(size=(100, 30)) as pilot:
        screen: LogScreen = app.screen  # type: ignore[assignment]
        screen.handle_events([
            LogLine("\x1b[31mred\x1b[0m [bold]x[/] [link=http://evil]y[/link] \x1b[2Jdone\x07"),
            LogLine("tab\there :warning: [/]"),
        ])
        await pilot.pause()
        view = screen.log_view
        rows = [line for line in shown(view) if line.strip()]
        assert rows == ["red [bold]x[/] [link=http://evil]y[/link] done", "tab here :warning: [/]"]
        strip = view.render_line(0)
        assert not any(seg.style and (seg.style.bold or seg.style.link) for seg in strip)
        assert "\x1b" not in "".join(seg.text for seg in strip)


async def test_filter_search_highlight_and_sideways_scroll_draw_from_the_buffer() -> None:
    app = Host(lambda: LogScreen("spark-01", "vllm", _never, tracker=None))
    async with app.run_test(size=(100, 30)) as pilot:
        screen: LogScreen = app.screen  # type: ignore[assignment]
        wide = "W" * 150 + " end"
        screen.handle_events([LogLine(f"info {i}") for i in range(100)]
                             + [LogLine("ERROR boom"), LogLine(wide), LogLine("info last")])
        await pilot.pause()
        view = screen.log_view
        assert view.virtual_size.width == len(wide)  # the widest line: a horizontal scroll
        assert not any(line.endswith(" end") for line in shown(view))
        view.scroll_to(x=view.max_scroll_x, animate=False, immediate=True)
        await pilot.pause()
        assert view.scroll_x > 0 and any(line.endswith("WWW end") for line in shown(view))
        # the search highlights from the buffer's text (reverse), the filter shows matches only
        view.scroll_to(x=0, animate=False, immediate=True)
        screen.set_pattern("boom")
        await pilot.pause()
        row = view.row_of(100)
        assert row is not None
        strip = view.render_line(row - int(view.scroll_y))
        assert any(seg.text == "boom" and seg.style and seg.style.reverse for seg in strip)
        screen.action_toggle_filter()
        await pilot.pause()
        assert list(view.lines) == ["ERROR boom"] and view.rows == [screen.buffer.dropped + 100]
        assert view.row_of(0) is None and view.index_at(0) == 100
        screen.handle_events([LogLine("more boom"), LogLine("not this")])
        await pilot.pause()
        assert list(view.lines) == ["ERROR boom", "more boom"] and "(2)" in screen.status_text
        screen.action_toggle_filter()
        await pilot.pause()
        assert view.rows is None and view.line_count == len(screen.buffer) == 105


async def _never():
    """A follower that never sends anything (the tests feed the screen with handle_events)."""
    await asyncio.Event().wait()
    yield LogLine("")  # never reached: it makes this an async generator
