"""The live log screen: a followed log drawn from its bounded buffer, with the engine's panel on top.

Push it with a callable that returns the follower (so the stream starts when the screen mounts) and
the engine's tracker factory (``engine.log_tracker``: its log read into phases; None: plain text)::

    transport = ...                                  # the node's Transport
    app.push_screen(LogScreen(
        "spark-01", "vllm",
        lambda: LogFollower(transport, docker_follow("vllm"), tail=200),
        tracker=engines.VLLM.log_tracker,
    ))

Tail rules (Toolong): scrolling up pauses following and a badge counts the lines that came
meanwhile; ``End`` resumes. ``/`` searches (``n``/``N`` next/previous match), ``f`` shows only
matching lines, ``e`` jumps to the next error, ``m`` drops a marker line. When the stream drops a
banner says so and when it is back, that too. The follower runs in a worker (``exit_on_error=False``)
that is cancelled when the screen closes, which closes the remote ``docker logs``.

The view (:class:`~sparkconsole.ui.widgets.log_view.LogBufferView`) draws the screen's
:class:`LogBuffer` itself, through the line API: no copy of the lines, no second index.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import re
import time
from collections import deque
from collections.abc import AsyncIterable, Awaitable, Callable, Sequence
from typing import Any

from rich.highlighter import Highlighter
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Input, ProgressBar, Static
from textual.worker import Worker

from sparkconsole.logs.follow import (
    ERROR_PATTERN,
    GAP_PREFIX,
    BufferLine,
    FollowEvent,
    LinesDropped,
    LogBuffer,
    LogLine,
    Reattached,
    StreamDropped,
    cap_line,
    compile_pattern,
    display_lines,
    display_text,
)
from sparkconsole.logs.report import LogReport, LogTracker
from sparkconsole.remote import LOG_HEAD_LINES
from sparkconsole.serving import engines
from sparkconsole.ui.keymap import LOGS_ENGINES_BINDING
from sparkconsole.ui.messages import OpenEngines
from sparkconsole.ui.render import thin_scrollbars
from sparkconsole.ui.screens.calibration import CalibrationScreen
from sparkconsole.ui.screens.live import forward_worker_failure
from sparkconsole.ui.screens.planner import app_live_memory
from sparkconsole.ui.widgets.log_view import LogBufferView

FollowerFactory = Callable[[], AsyncIterable[FollowEvent]]
TrackerFactory = Callable[[], LogTracker | None]
"""A new reader of the engine's log (``EngineKind.log_tracker``); what it gives None for is shown plain."""
StartReader = Callable[[], Awaitable[str]]
"""Reads the start of the followed log from the node (its first lines), for the calibration."""
BATCH_S = 0.05  # lines read within this are drawn together
# what drawing one batch may take of the event loop: a batch holds as many lines as that time takes
# (measured as it goes); the older lines of a faster log are dropped and counted before they cost
# anything (benchmarks/soak.py: a 5,000-line/s log kept keys waiting up to a second without it)
BATCH_BUDGET_S = 0.010
BATCH_MIN_LINES = 50
YIELD_EVERY = 64  # lines read before the reader lets the keys through
PARSE_CHUNK = 200  # lines of the log's start given to the engine's reader before the keys get a turn
MARKER_PREFIX = "──── mark "


def log_engine(image: str | None, running: engines.EngineKind | None = None) -> engines.EngineKind | None:
    """The engine whose log a container's is (vLLM, SGLang, llama.cpp): the one the probe found
    running in it, else the one its image names (``…/sglang:…``), else None. Only an engine's log
    goes through that engine's reader and gets its panel; any other (a web server, a database) is
    shown as it is: reading it would cost every line a pass over the rules and find nothing."""
    return running or engines.for_image(image)


class LogHighlighter(Highlighter):
    """Errors in red, marker lines in yellow, the current search pattern reversed."""

    def __init__(self) -> None:
        self.pattern: re.Pattern[str] | None = None

    def highlight(self, text: Text) -> None:
        plain = text.plain
        if plain.startswith(MARKER_PREFIX):
            text.stylize("bold yellow")
            return
        if plain.startswith(GAP_PREFIX):
            text.stylize("bold dark_orange")
            return
        text.highlight_regex(ERROR_PATTERN, "bold red")
        if self.pattern is not None:
            text.highlight_regex(self.pattern, "reverse")


def _gib(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f} GiB"


def _clock(seconds: float | int | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(seconds)
    return f"{seconds // 60}:{seconds % 60:02d}" if seconds < 3600 else f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def report_lines(r: LogReport, label: str = "vLLM") -> dict[str, str]:
    """The panel's texts for a report of ``label``'s log (pure; the tests read these)."""
    head = f"{label} {r.vllm_version or '?'}"
    if r.model:
        head += f" · {r.model}"
    state = r.state.upper()
    if r.phase and r.state not in ("ready", "failed"):
        state += f" ({r.phase})"
    out = {"head": f"{head} · {state}"}
    if r.shards_total:
        bits = [f"weights {r.shards_done or 0}/{r.shards_total} shards"]
        if r.shard_rate:
            bits.append(r.shard_rate)
        if r.shards_done is not None and r.shards_done >= r.shards_total:
            if r.weights_seconds is not None:
                bits.append(f"took {r.weights_seconds:.1f} s")
        elif r.shard_eta_s is not None:
            bits.append(f"ETA {_clock(r.shard_eta_s)}")
        out["shards"] = " · ".join(bits)
    facts = []
    # say only what is known: a size logged later is not a "?" now
    if r.model_load_gib is not None or r.load_seconds is not None:
        load = "weights loaded" if r.model_load_gib is None else f"loaded {_gib(r.model_load_gib)}"
        if r.load_seconds is not None:
            load += f" in {r.load_seconds:.1f} s"
        facts.append(load)
    if r.kv_cache_gib is not None or r.kv_cache_tokens is not None:
        kv = "KV cache" + ("" if r.kv_cache_gib is None else f" {_gib(r.kv_cache_gib)}")
        if r.kv_cache_tokens is not None:
            kv += f"{' ·' if r.kv_cache_gib is not None else ''} {r.kv_cache_tokens:,} tokens"
        if r.max_concurrency is not None:
            kv += f" · max concurrency {r.max_concurrency:.2f}x"
        facts.append(kv)
    if r.cuda_graph_total:
        g = f"CUDA graphs {r.cuda_graph_done or 0}/{r.cuda_graph_total}"
        if r.cuda_graph_mode:
            g += f" ({r.cuda_graph_mode})"
        facts.append(g)
    if facts:
        out["facts"] = " · ".join(facts)
    if r.state == "ready":
        where = f" on port {r.port}" if r.port is not None else ""
        out["ready"] = f"✓ ready: serving{where}"
    if r.state == "failed":
        out["failure"] = f"✗ failed ({r.failure_kind or 'other'}): {(r.failure_line or '').strip()}"
        if r.advice:
            out["advice"] = f"→ {r.advice}"
    return out


class VllmPanel(Vertical):
    """State, a shards progress bar with rate and ETA, load, KV cache, CUDA graphs, failure."""

    DEFAULT_CSS = """
    VllmPanel { height: auto; padding: 0 1; border: round $accent; display: none; }
    VllmPanel.-seen { display: block; }
    VllmPanel.-failed { border: round $error; }
    VllmPanel.-ready { border: round $success; }
    VllmPanel #vllm-head { text-style: bold; }
    VllmPanel #vllm-progress-row { height: 1; }
    VllmPanel #vllm-progress { width: 40; }
    VllmPanel #vllm-shards { width: 1fr; padding-left: 1; }
    VllmPanel #vllm-failure { color: $error; text-style: bold; }
    VllmPanel #vllm-advice { color: $warning; }
    VllmPanel #vllm-ready { color: $success; text-style: bold; }
    VllmPanel .-empty { display: none; }
    """

    def compose(self) -> ComposeResult:
        yield Static(id="vllm-head")
        with Horizontal(id="vllm-progress-row", classes="-empty"):
            yield ProgressBar(total=None, show_eta=False, id="vllm-progress")
            yield Static(id="vllm-shards")
        for part in ("facts", "ready", "failure", "advice"):
            yield Static(id=f"vllm-{part}", classes="-empty")

    def show(self, report: LogReport, label: str = "vLLM") -> None:
        self.set_class(report.state != "unknown", "-seen")
        self.set_class(report.state == "failed", "-failed")
        self.set_class(report.state == "ready", "-ready")
        # the report's texts carry the node's own words (the model id, the failure line: a traceback's
        # "in [/root/.cache/…]" or a "[rank0]:" prefix): plain Text, never markup, never escapes
        texts = {k: Text(display_text(v)) for k, v in report_lines(report, label).items()}
        self.query_one("#vllm-head", Static).update(texts["head"])
        row = self.query_one("#vllm-progress-row")
        row.set_class("shards" not in texts, "-empty")
        if "shards" in texts:
            bar = self.query_one("#vllm-progress", ProgressBar)
            bar.update(total=report.shards_total, progress=report.shards_done or 0)
            self.query_one("#vllm-shards", Static).update(texts["shards"])
        for part in ("facts", "ready", "failure", "advice"):
            w = self.query_one(f"#vllm-{part}", Static)
            w.set_class(part not in texts, "-empty")
            w.update(texts.get(part, Text("")))


class LogScreen(Screen[None]):
    """A followed log of one service on one node."""

    HELP = (
        "A live log. Scroll up to pause following (a badge counts new lines), End to follow again. "
        "/ searches, n/N move between matches, f shows only matching lines, e jumps to the next "
        "error, m drops a marker line. A log faster than the view loses its oldest unread lines: a "
        "line says how many, where. On a vLLM log, c sets the planner beside what this start measured; "
        "E shows the node's engines, this container's first."
    )

    DEFAULT_CSS = """
    LogScreen { layout: vertical; }
    LogScreen #log-title { height: 1; background: $panel; text-style: bold; padding: 0 1; }
    LogScreen #log-banner { height: 1; padding: 0 1; display: none; }
    LogScreen #log-banner.-dropped { display: block; background: $error; color: $text; text-style: bold; }
    LogScreen #log-banner.-back { display: block; background: $success; color: $text; }
    LogScreen #log-status-row { height: 1; background: $panel; }
    LogScreen #log-status { width: 1fr; padding: 0 1; }
    LogScreen #new-lines { width: auto; padding: 0 1; background: $warning; color: $text; display: none; }
    LogScreen #new-lines.-shown { display: block; }
    LogScreen #search { dock: bottom; display: none; }
    LogScreen #search.-shown { display: block; }
    """

    BINDINGS = [
        Binding("end", "follow", "Follow", id="logs.follow", priority=True,
                tooltip="Jump to the newest line and follow the log again."),
        Binding("slash", "search", "Search", key_display="/", id="logs.search",
                tooltip="Search the log (a literal, any case)."),
        Binding("n", "find(False)", "Next", id="logs.next", tooltip="Next match of the search."),
        Binding("N", "find(True)", "Prev", id="logs.prev", tooltip="Previous match of the search."),
        Binding("f", "toggle_filter", "Filter", id="logs.filter",
                tooltip="Show only the lines matching the search (markers stay)."),
        Binding("e", "next_error", "Next error", id="logs.error",
                tooltip="Jump to the next ERROR / Traceback / CUDA out of memory / NCCL WARN line."),
        Binding("m", "marker", "Mark", id="logs.marker", tooltip="Drop a marker line with the time."),
        Binding("c", "calibrate", "Calibrate", id="logs.calibrate",
                tooltip="A vLLM log: the planner beside what this start measured, and a re-plan from it."),
        LOGS_ENGINES_BINDING,
        Binding("escape", "close", "Back", id="logs.close", tooltip="Close the search, or the log screen."),
    ]

    def __init__(
        self,
        node: str,
        title: str,
        follower_factory: FollowerFactory,
        *,
        max_lines: int = 5000,
        tracker: TrackerFactory | None = engines.DEFAULT.log_tracker,
        start_reader: StartReader | None = None,
        name: str | None = None,
        id: str | None = None,
    ) -> None:
        super().__init__(name=name, id=id)
        self.node = node
        self.log_title = title
        self.follower_factory = follower_factory
        self.start_reader = start_reader
        self.max_lines = max_lines
        self.buffer = LogBuffer(max_lines)
        self.tracker: LogTracker | None = tracker() if tracker is not None else None
        self.highlighter = LogHighlighter()
        self.pattern = ""
        self.filter_on = False
        self.new_lines = 0
        # Following is our own state, not "is the view at the end right now": lines written before
        # the first layout, or faster than the view scrolls, must not look like a scroll-up.
        self._following = True
        self.cursor: int | None = None  # absolute index of the last match / error jumped to
        self.stream_state = "connecting"  # connecting / live / dropped
        self.drops = 0
        self._marker_abs: list[int] = []  # absolute buffer index of every marker (markers pass any filter)
        self._search_intent = "search"
        self._panel_scheduled = False
        self._last_report: LogReport | None = None
        self._banner_timer: Any = None
        # read from the stream, not drawn yet: fewer lines than the buffer holds (a longer batch
        # would push its own start out of it), past that the oldest are dropped and counted
        self._pending: deque[FollowEvent] = deque()
        self._pending_lines = 0
        self._pending_timer: Any = None
        self._line_s = BATCH_BUDGET_S / 500  # what drawing one line costs, measured batch by batch
        self._batch_cap = max(1, self.max_lines - 1)
        self._shown_texts: Any = None  # the panel's texts as last shown
        self.lines_dropped = 0  # lines dropped unread (the follower's and this screen's), shown
        # the tail's lines wait here while the log's start goes through the engine's reader, so that
        # the start is read first and whole (None: not reading the start)
        self._held: deque[LogLine] | None = None

    # ---- layout -----------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Static(Text.assemble((self.node, "bold cyan"), " · ", (display_text(self.log_title), "bold")),
                     id="log-title")  # the title names the node's service: its words, cleaned
        if self.tracker is not None:
            yield VllmPanel(id="vllm-panel")
        yield Static(id="log-banner")
        yield LogBufferView(self.buffer, self.highlighter, following=lambda: self._following, id="log")
        with Horizontal(id="log-status-row"):
            yield Static(id="log-status")
            yield Static(id="new-lines")
        yield Input(placeholder="search (Enter: find · Esc: cancel)", id="search")
        yield Footer()

    @property
    def log_view(self) -> LogBufferView:
        return self.query_one("#log", LogBufferView)

    def on_mount(self) -> None:
        self.log_view.focus()
        thin_scrollbars(self.log_view)
        self.watch(self.log_view, "scroll_y", self._on_scroll, init=False)
        self._update_status()
        self.follow_worker = self._follow()
        self._start_text: str | None = None
        if self.start_reader is not None and self.tracker is not None:
            self._read_start()

    @work(exit_on_error=False, group="log-start")
    async def _read_start(self) -> None:
        """The engine's first lines, read once: the panel knows the version, the model, the load
        and the KV cache of an engine whose followed tail began long after it printed them."""
        assert self.start_reader is not None and self.tracker is not None
        try:
            text = await self.start_reader()
        except Exception:  # the tail alone still follows; the calibration says what it lacks
            return
        # bounded whatever the reader gave: the command bounds it on the node, this here
        lines = [cap_line(line) for line in text.splitlines()[:LOG_HEAD_LINES]]
        self._start_text = "\n".join(lines)
        if self.tracker.report.state not in ("unknown", "starting"):
            return
        # a few thousand lines of rules: in chunks, the keys answered between them
        self._held = deque(maxlen=self.max_lines)
        try:
            for i in range(0, len(lines), PARSE_CHUNK):
                for line in lines[i : i + PARSE_CHUNK]:
                    self.tracker.feed(line)
                self._schedule_panel()
                await asyncio.sleep(0)
            while self._held:
                for _ in range(min(PARSE_CHUNK, len(self._held))):
                    event = self._held.popleft()
                    self.tracker.feed(event.text, source=event.source)
                await asyncio.sleep(0)
        finally:
            self._held = None
        self._schedule_panel()

    def on_unmount(self) -> None:
        self.workers.cancel_node(self)

    # ---- the stream -------------------------------------------------------------------------

    @work(exit_on_error=False, group="log-follow", exclusive=True)
    async def _follow(self) -> None:
        """Read the stream into a batch; the batch is drawn at most every :data:`BATCH_S` (one write
        to the view, one status update), and the reader yields to the event loop every
        :data:`YIELD_EVERY` lines, so a log of thousands of lines a second neither starves the
        keys nor costs a redraw per line (Toolong's batched lines)."""
        follower = self.follower_factory()
        count = 0
        try:
            async for event in follower:
                self._queue(event)
                if self._pending_timer is None:
                    self._pending_timer = self.set_timer(BATCH_S, self._flush_pending)
                count += 1
                if count % YIELD_EVERY == 0:
                    await asyncio.sleep(0)
        finally:
            aclose = getattr(follower, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()

    def _queue(self, event: FollowEvent) -> None:
        """``event`` into the batch to draw. A batch holds what the buffer can show, its lines and
        the line that says what was dropped: past that (a log faster than the view) its oldest
        line is dropped and counted where it was."""
        pending = self._pending
        pending.append(event)
        if not isinstance(event, LogLine):
            return
        self._pending_lines += 1
        if self._pending_lines <= self._batch_cap:
            return
        i = next(k for k, e in enumerate(pending) if isinstance(e, LogLine))
        del pending[i]
        self._pending_lines -= 1
        before = pending[i - 1] if i else None
        if isinstance(before, LinesDropped):
            pending[i - 1] = LinesDropped(before.count + 1)
        else:
            pending.insert(i, LinesDropped(1))

    def _flush_pending(self) -> None:
        self._pending_timer = None
        lines = self._pending_lines
        batch, self._pending, self._pending_lines = self._pending, deque(), 0
        # popped (Esc, the overview): its widgets are being removed, a batch drawn now would not find them
        if not batch or not self.is_attached or self not in self.app.screen_stack:
            return
        start = time.perf_counter()
        self.handle_events(batch)
        if lines >= 20:  # the next batch holds what BATCH_BUDGET_S draws, at this batch's cost per line
            self._line_s = 0.7 * self._line_s + 0.3 * (time.perf_counter() - start) / lines
            self._batch_cap = int(max(BATCH_MIN_LINES, min(self.max_lines - 1, BATCH_BUDGET_S / self._line_s)))

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        forward_worker_failure(self, event)

    def handle_event(self, event: FollowEvent) -> None:
        """One follower event into the screen (public so a driver can feed it directly)."""
        self.handle_events([event])

    def handle_events(self, events: Sequence[FollowEvent]) -> None:
        """Follower events in order: runs of lines are written to the view in one go."""
        lines: list[LogLine] = []
        for event in events:
            if isinstance(event, LogLine):
                if self.stream_state != "live":
                    self.stream_state = "live"
                lines.append(event)
                continue
            if lines:
                self._add_lines(lines)
                lines = []
            if isinstance(event, LinesDropped):
                self.lines_dropped += event.count
                self._show([self.buffer.add_gap(event.count, event.source)])
            elif isinstance(event, StreamDropped):
                self.stream_state = "dropped"
                self.drops += 1
                self._banner(f"⚠ stream lost — re-attaching in {event.retry_in:g}s "
                             f"({display_lines(event.reason, ' ')})", "-dropped")  # the reason may quote the node
            elif isinstance(event, Reattached):
                self.stream_state = "live"
                self._banner("✓ re-attached — following again", "-back", hide_after=3.0)
        if lines:
            self._add_lines(lines)
        self._update_status()

    def _banner(self, text: str, cls: str, hide_after: float | None = None) -> None:
        banner = self.query_one("#log-banner", Static)
        banner.update(Text(text))  # plain: the text may quote the node, and a str would be markup
        banner.set_class(cls == "-dropped", "-dropped")
        banner.set_class(cls == "-back", "-back")
        if self._banner_timer is not None:
            self._banner_timer.stop()
            self._banner_timer = None
        if hide_after is not None:
            self._banner_timer = self.set_timer(hide_after, self._hide_banner)

    def _hide_banner(self) -> None:
        self.query_one("#log-banner", Static).set_classes("")

    @property
    def banner_text(self) -> str:
        banner = self.query_one("#log-banner", Static)
        if not (banner.has_class("-dropped") or banner.has_class("-back")):
            return ""
        return str(banner.render())

    def _add_lines(self, events: Sequence[LogLine]) -> None:
        added: list[BufferLine] = []
        held = self._held
        for event in events:
            if held is not None:
                held.append(event)  # after the log's start, which is being read
            elif self.tracker is not None:
                self.tracker.feed(event.text, source=event.source)
            added.append(self.buffer.append(event.text, source=event.source, timestamp=event.timestamp))
        if self.tracker is not None:
            self._schedule_panel()
        self._show(added)

    def _show(self, lines: Sequence[BufferLine]) -> None:
        """Lines just added to the buffer (the last ``len(lines)`` of it) into the view, which
        draws them from the buffer (those its filter keeps)."""
        first = self.buffer.dropped + len(self.buffer) - len(lines)
        for offset, line in enumerate(lines):
            if line.kind != "line":
                self._marker_abs.append(first + offset)
        view = self.log_view
        at_end = self._following
        before = view.rows_added
        view.write_lines(lines[-self.max_lines:], scroll_end=at_end)
        shown = view.rows_added - before
        if shown and not at_end:
            self.new_lines += shown
            self._update_badge()

    def _schedule_panel(self) -> None:
        if not self._panel_scheduled:
            self._panel_scheduled = True
            self.call_later(self._update_panel)

    def _update_panel(self) -> None:
        self._panel_scheduled = False
        if self.tracker is None or self not in self.app.screen_stack:  # popped: its widgets are going
            return
        report = self.tracker.report
        if report == self._last_report:
            return
        self._last_report = report
        # the report changes with every line (its counts), what the panel shows seldom: each update of
        # the panel's texts lays the whole screen out again
        texts = (report_lines(report, self.tracker.label), report.state, report.shards_total, report.shards_done)
        if texts == self._shown_texts:
            return
        self._shown_texts = texts
        self.query_one(VllmPanel).show(report, self.tracker.label)

    # ---- following ----------------------------------------------------------------------------

    @property
    def following(self) -> bool:
        return self._following

    def _on_scroll(self, old: float, new: float) -> None:
        at_end = self.log_view.is_vertical_scroll_end
        if at_end:
            self._following = True
            if self.new_lines:
                self.new_lines = 0
                self._update_badge()
        elif new < old:  # the user scrolled up: stop following (Toolong's rule)
            self._following = False
        self._update_status()

    def _update_badge(self) -> None:
        badge = self.query_one("#new-lines", Static)
        badge.set_class(self.new_lines > 0, "-shown")
        badge.update(f"▼ {self.new_lines} new line{'s' if self.new_lines != 1 else ''} (End)")

    @property
    def badge_text(self) -> str:
        badge = self.query_one("#new-lines", Static)
        return str(badge.render()) if badge.has_class("-shown") else ""

    def _update_status(self) -> None:
        parts = [{"connecting": "connecting…", "live": "live", "dropped": "stream lost"}[self.stream_state]]
        parts.append("following" if self._following else "paused")
        parts.append(f"{len(self.buffer)} lines")
        if self.lines_dropped:
            parts.append(f"{self.lines_dropped:,} dropped (log faster than the view)")
        if self.pattern:
            n = self._filter_count() if self.filter_on else None
            parts.append(f"{'filter' if self.filter_on else 'search'}: {self.pattern!r}" + (f" ({n})" if n is not None else ""))
        # plain Text: the search pattern is typed by the operator, and "[/x]" as markup ended the app
        # one line, as wide as the row whatever it says: no new layout of the screen
        self.query_one("#log-status", Static).update(Text(" · ".join(parts)), layout=False)

    def _filter_count(self) -> int:
        """Matching lines shown by the filter, markers not counted; from the view's rows kept line
        by line, never a re-scan of the buffer."""
        rows = self.log_view.rows
        if rows is None:
            return len(self.buffer) - self._markers_from(self.buffer.dropped)
        if not rows:
            return 0
        return len(rows) - self._markers_from(rows[0])

    def _markers_from(self, absolute: int) -> int:
        cut = bisect.bisect_left(self._marker_abs, self.buffer.dropped)
        if cut:
            del self._marker_abs[:cut]  # pushed out of the buffer
        return len(self._marker_abs) - bisect.bisect_left(self._marker_abs, absolute)

    @property
    def status_text(self) -> str:
        return str(self.query_one("#log-status", Static).render())

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # while typing a search, keys belong to the input
        return not (action == "follow" and isinstance(self.focused, Input))

    def action_follow(self) -> None:
        self._following = True
        self.log_view.scroll_end(animate=False, immediate=True)
        self.new_lines = 0
        self._update_badge()
        self._update_status()

    # ---- positions ----------------------------------------------------------------------------

    def _index_at_top(self) -> int:
        return self.log_view.index_at(int(self.log_view.scroll_y))

    def _origin(self) -> int:
        if self.cursor is not None:
            idx = self.cursor - self.buffer.dropped
            if 0 <= idx < len(self.buffer):
                return idx
        return self._index_at_top() - 1

    def _jump(self, index: int) -> None:
        y = self.log_view.row_of(index)
        if y is None:
            self._set_filter(False)
            y = index
        self.cursor = self.buffer.dropped + index
        self.log_view.scroll_to(y=max(0, y - 2), animate=False, immediate=True)
        self._update_status()

    # ---- search, filter, errors, markers --------------------------------------------------------

    def action_search(self, intent: str = "search") -> None:
        self._search_intent = intent
        box = self.query_one("#search", Input)
        box.value = self.pattern
        box.add_class("-shown")
        box.focus()

    @on(Input.Submitted, "#search")
    def _search_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._close_search()
        self.set_pattern(event.value)
        if self._search_intent == "filter" and self.pattern:
            self._set_filter(True)
        elif self.pattern:
            self.action_find(False)

    def _close_search(self) -> None:
        box = self.query_one("#search", Input)
        box.remove_class("-shown")
        self.log_view.focus()

    def set_pattern(self, pattern: str) -> None:
        self.pattern = pattern.strip()
        self.cursor = None
        self.highlighter.pattern = compile_pattern(self.pattern) if self.pattern else None
        self.log_view.restyle()  # the highlight changed: every line is drawn again
        if self.filter_on:
            self._refill()
        self._update_status()

    def action_find(self, backwards: bool = False) -> None:
        if not self.pattern:
            self.notify("Nothing to find yet: press / to search.", severity="warning", timeout=3)
            return
        found = self.buffer.find_next(self.pattern, self._origin(), backwards=backwards)
        if found is None:
            self.notify(f"No line matches {self.pattern!r}.", severity="warning", timeout=3)
            return
        self._jump(found)

    def action_toggle_filter(self) -> None:
        if not self.pattern and not self.filter_on:
            self.action_search("filter")
            return
        self._set_filter(not self.filter_on)

    def _set_filter(self, on_: bool) -> None:
        if on_ == self.filter_on:
            return
        self.filter_on = on_
        self._refill()
        self._update_status()

    def _refill(self) -> None:
        view = self.log_view
        self.new_lines = 0
        self._update_badge()
        view.set_filter(self.pattern if self.filter_on else None)
        view.scroll_end(animate=False, immediate=True)
        self._following = True

    def action_next_error(self) -> None:
        found = self.buffer.next_error(self._origin())
        if found is None:
            self.notify("No error lines in the log.", timeout=3)
            return
        self._jump(found)

    def action_calibrate(self) -> None:
        if self.tracker is None:
            self.notify("not an engine's log: nothing to calibrate from", severity="warning")
            return
        if self.tracker.label != engines.VLLM.label:  # the planner's arithmetic is vLLM's (planner/budget.py)
            self.notify(f"calibration reads vLLM's memory figures: a {self.tracker.label} log has none",
                        severity="warning")
            return
        self._open_calibration()

    @work(exit_on_error=False, group="log-calibrate", exclusive=True)
    async def _open_calibration(self) -> None:
        """The start's lines (read from the node when a reader was given: the followed tail may
        begin long after vLLM printed its memory figures) and the buffer, into the calibration."""
        head = self._start_text or ""
        if not head and self.start_reader is not None:
            try:
                head = await self.start_reader()
            except Exception as exc:  # the buffer alone still calibrates when it holds the start
                self.notify(f"could not read the start of the log: {exc}", severity="warning")
        text = head + "\n" + "\n".join(ln.text for ln in self.buffer.lines if ln.kind == "line")
        live = app_live_memory(self.app)
        self.app.push_screen(CalibrationScreen(self.node, text, live.gib if live is not None else None))

    def action_engines(self) -> None:
        self.post_message(OpenEngines(self.node, self.log_title))

    def action_marker(self) -> None:
        self._show([self.buffer.add_marker()])
        self._update_status()

    def action_close(self) -> None:
        box = self.query_one("#search", Input)
        if box.has_class("-shown"):
            self._close_search()
            return
        self.dismiss(None)
