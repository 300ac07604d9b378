"""Following a log over a transport, re-attaching when the stream drops, and a bounded buffer.

:class:`LogFollower` runs ``docker logs -f -t --tail N NAME`` (or ``journalctl -f``) through
``transport.stream`` and yields events:

- :class:`LogLine` for each line (docker's ``-t`` timestamp split off into ``timestamp`` and kept
  for merging and de-duplication, the text without it for display);
- :class:`StreamDropped` when the stream ends or fails (the container stopped or restarted, the
  remote ``docker logs`` was killed, the SSH connection broke), with the reason and the wait;
- :class:`Reattached` once a new stream is up again (its first line came, or it stayed open for
  ``settle_s``);
- :class:`LinesDropped` where lines were dropped unread: a log printed faster than its reader takes
  it fills the follower's queue (``max_queued`` lines), and past that its oldest lines go, counted.

Every line is cut to :data:`MAX_LINE_CHARS` as it is read (a line that never ends costs that much,
not the console's memory), so what a follower holds is bounded in lines and in characters.

Re-attaching waits by ``backoff`` (reset once a stream is up again) and asks only for what was not
seen: ``--since <last timestamp> --tail all``; lines at or before the last timestamp that were
already delivered are dropped, so nothing is shown twice and nothing printed meanwhile is lost.
Without timestamps (journalctl) it re-attaches with ``--tail 0`` (nothing repeated).

:func:`merge_by_time` merges several followers (the head's and the workers' logs of one
deployment) by docker timestamp, each line keeping its ``source`` label. :class:`LogBuffer` is the
pure, bounded line store behind the log screen: search, filter, next error, markers.
No Textual here.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import heapq
import re
import time
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, Literal, TypeVar

from sparkconsole.errors import TransportError
from sparkconsole.remote import docker_logs, journalctl_follow, validate_container, validate_unit
from sparkconsole.transport.base import CommandLike, Transport

_Q = TypeVar("_Q")

# ---- events -------------------------------------------------------------------------------


@dataclass(frozen=True)
class LogLine:
    """One line. ``text`` is for display (docker's timestamp removed); ``timestamp`` keeps it."""

    text: str
    source: str = ""
    received_at: float = 0.0
    timestamp: str | None = None  # RFC 3339 with nanoseconds, as ``docker logs -t`` printed it

    @property
    def sort_key(self) -> int | None:
        return timestamp_key(self.timestamp) if self.timestamp else None


@dataclass(frozen=True)
class StreamDropped:
    """The stream ended or failed; the follower re-attaches in ``retry_in`` seconds."""

    reason: str
    retry_in: float
    source: str = ""
    attempt: int = 1  # consecutive drops without a stream that came up in between


@dataclass(frozen=True)
class Reattached:
    """A new stream is up after a drop."""

    source: str = ""
    since: str | None = None  # the ``--since`` it re-attached with, if any


@dataclass(frozen=True)
class LinesDropped:
    """``count`` lines were dropped here, unread: the log came faster than its reader took it."""

    count: int
    source: str = ""


FollowEvent = LogLine | StreamDropped | Reattached | LinesDropped

# ---- bounds -------------------------------------------------------------------------------

MAX_LINE_CHARS = 16_384
"""The longest line kept; a longer one is cut (:func:`cap_line`)."""
MAX_QUEUED = 5_000
"""Lines a follower holds for its reader; past that the oldest are dropped and counted."""


def cap_line(text: str, limit: int = MAX_LINE_CHARS) -> str:
    """``text`` cut to at most ``limit`` characters (a line that never ends must not fill memory).
    A line of progress updates (tqdm's ``\\r``) keeps its start and its newest update, which is
    what a terminal shows and what the vLLM panel reads; any other line keeps its start."""
    if len(text) <= limit:
        return text
    last = text.rfind("\r")
    if last > 0 and len(text) - last <= limit // 2:
        return text[: limit - (len(text) - last)] + text[last:]
    return text[:limit]


class DroppingQueue(Generic[_Q]):
    """A first-in first-out queue between a producer that must never wait (a stream being read)
    and a reader that may be slower: it holds at most ``maxlen`` droppable items, and a new one
    beyond that drops the oldest. ``weight`` says how many lines an item stands for (0: it is
    never dropped, such as the end of a stream). :meth:`get` gives each item with the lines
    dropped just before it, so the reader can say where the gap is and how wide."""

    def __init__(self, maxlen: int, weight: Callable[[_Q], int]) -> None:
        if maxlen < 1:
            raise ValueError("maxlen must be at least 1")
        self.maxlen = maxlen
        self.weight = weight
        self.dropped = 0  # lines dropped so far
        self._items: deque[list[Any]] = deque()  # [lines dropped just before, item]
        self._droppable = 0
        self._carry = 0  # dropped after the last item held: counted before the next one
        self._ready = asyncio.Event()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, item: _Q) -> None:
        self._items.append([self._carry, item])
        self._carry = 0
        if self.weight(item):
            self._droppable += 1
            while self._droppable > self.maxlen:
                self._drop_oldest()
        self._ready.set()

    def _drop_oldest(self) -> None:
        for i, entry in enumerate(self._items):
            lines = self.weight(entry[1])
            if not lines:
                continue
            del self._items[i]
            self._droppable -= 1
            self.dropped += lines
            if i < len(self._items):
                self._items[i][0] += entry[0] + lines
            else:
                self._carry += entry[0] + lines
            return

    async def get(self) -> tuple[int, _Q]:
        """``(lines dropped just before it, the next item)``, waiting for one."""
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        gap, item = self._items.popleft()
        if self.weight(item):
            self._droppable -= 1
        return gap, item


# ---- timestamps ---------------------------------------------------------------------------

_TS_PREFIX = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d))(?: |$)")
_TS_PARTS = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)$")


def timestamp_key(ts: str) -> int | None:
    """Nanoseconds since the epoch for an RFC 3339 timestamp (``None`` when unreadable)."""
    m = _TS_PARTS.match(ts)
    if not m:
        return None
    base, frac, tz = m.groups()
    try:
        dt = datetime.fromisoformat(base + ("+00:00" if tz == "Z" else tz))
    except ValueError:
        return None
    return int(dt.timestamp()) * 1_000_000_000 + int((frac or "0").ljust(9, "0"))


def split_timestamp(raw: str) -> tuple[str | None, str]:
    """``("2026-...Z", "text")`` for a ``docker logs -t`` line, ``(None, raw)`` otherwise."""
    m = _TS_PREFIX.match(raw)
    if not m:
        return None, raw
    return m.group(1), raw[m.end():]


# ---- commands -----------------------------------------------------------------------------

CommandFactory = Callable[[int | None, str | None], CommandLike]
"""``(tail, since) -> command``: ``tail=None`` means every line; ``since`` a docker timestamp."""


def docker_follow(container: str) -> CommandFactory:
    """The factory for ``docker logs -f -t``: first ``--tail N``, on re-attach ``--since T``."""
    validate_container(container)

    def factory(tail: int | None, since: str | None) -> CommandLike:
        return docker_logs(container, tail=tail, follow=True, timestamps=True, since=since)

    return factory


def journal_follow(unit: str) -> CommandFactory:
    """The factory for ``journalctl -f -u UNIT`` (no timestamps to merge on: re-attach from now)."""
    validate_unit(unit)

    def factory(tail: int | None, since: str | None) -> CommandLike:
        return journalctl_follow(unit, lines=0 if tail is None else tail)

    return factory


# ---- the follower -------------------------------------------------------------------------


class LogFollower:
    """Follow one log, re-attaching with backoff. Iterate it: ``async for event in follower``."""

    def __init__(
        self,
        transport: Transport,
        command_factory: CommandFactory,
        *,
        tail: int = 200,
        backoff: Sequence[float] = (0.5, 1, 2, 4, 8),
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Any] = asyncio.sleep,
        source: str = "",
        settle_s: float = 1.0,
        max_drops: int | None = None,
        max_queued: int = MAX_QUEUED,
    ) -> None:
        self.transport = transport
        self.command_factory = command_factory
        self.tail = tail
        self.backoff = tuple(backoff) or (1.0,)
        self.clock = clock
        self.sleep = sleep
        self.source = source
        self.settle_s = settle_s
        self.max_drops = max_drops  # stop after this many drops in a row (None: never)
        self.max_queued = max_queued  # lines held for a slower reader before the oldest go
        self.lines_dropped = 0  # lines dropped unread so far (reported as LinesDropped)
        self._queue: DroppingQueue[tuple[str, str]] | None = None  # the current stream's
        self.last_timestamp: str | None = None
        self.lines_delivered = 0
        self.drops = 0
        self.commands: list[str] = []  # the shell text of every attach, in order
        self._last_key: int | None = None
        self._at_last: set[str] = set()
        self._closed = False
        self._iter: AsyncIterator[FollowEvent] | None = None

    @property
    def queued(self) -> int:
        """Lines (and a stream's end) read from the stream and not yet given out."""
        return len(self._queue) if self._queue is not None else 0

    def __aiter__(self) -> AsyncIterator[FollowEvent]:
        if self._iter is None:
            self._iter = self.events()
        return self._iter

    async def aclose(self) -> None:
        self._closed = True
        it, self._iter = self._iter, None
        if it is not None:
            with contextlib.suppress(Exception):
                await it.aclose()  # type: ignore[attr-defined]

    def _next_command(self, reattach: bool) -> CommandLike:
        if not reattach or self.lines_delivered == 0:
            return self.command_factory(self.tail, None)
        if self.last_timestamp is not None:
            return self.command_factory(None, self.last_timestamp)
        return self.command_factory(0, None)

    def _accept(self, raw: str, replaying: bool) -> tuple[LogLine | None, bool]:
        """The event for ``raw`` (``None`` when already delivered) and whether replay is over."""
        ts, text = split_timestamp(raw)
        key = timestamp_key(ts) if ts else None
        if key is not None:
            if replaying and self._last_key is not None:
                if key < self._last_key or (key == self._last_key and text in self._at_last):
                    return None, True
                replaying = False
            if key != self._last_key:
                self._last_key = key
                self._at_last = set()
            self._at_last.add(text)
            self.last_timestamp = ts
        self.lines_delivered += 1
        return LogLine(text=text, source=self.source, received_at=self.clock(), timestamp=ts), replaying

    async def events(self) -> AsyncIterator[FollowEvent]:
        consecutive = 0
        reattach = False
        while not self._closed:
            cmd = self._next_command(reattach)
            self.commands.append(cmd if isinstance(cmd, str) else cmd.shell())
            since = self.last_timestamp if reattach and self.lines_delivered else None
            queue: DroppingQueue[tuple[str, str]] = DroppingQueue(self.max_queued, _line_weight)
            self._queue = queue
            pump = asyncio.create_task(self._pump(cmd, queue))
            waiting_up = reattach  # a Reattached is owed once this stream proves to be up
            replaying = reattach and self._last_key is not None
            up_at = self.clock() + self.settle_s
            reason = "stream ended"
            try:
                while True:
                    timeout = max(0.0, up_at - self.clock()) if waiting_up else None
                    try:
                        gap, (kind, value) = await asyncio.wait_for(queue.get(), timeout)
                    except TimeoutError:
                        waiting_up = False
                        consecutive = 0
                        yield Reattached(source=self.source, since=since)
                        continue
                    if waiting_up and kind == "line":
                        waiting_up = False
                        consecutive = 0
                        yield Reattached(source=self.source, since=since)
                    if gap:
                        self.lines_dropped += gap
                        yield LinesDropped(gap, source=self.source)
                    if kind != "line":
                        reason = value
                        break
                    event, replaying = self._accept(value, replaying)
                    if event is not None:
                        consecutive = 0
                        yield event
            finally:
                pump.cancel()
                with contextlib.suppress(BaseException):
                    await pump
            if self._closed:
                return
            consecutive += 1
            self.drops += 1
            delay = self.backoff[min(consecutive - 1, len(self.backoff) - 1)]
            yield StreamDropped(reason=reason, retry_in=delay, source=self.source, attempt=consecutive)
            if self.max_drops is not None and consecutive >= self.max_drops:
                return
            await self.sleep(delay)
            reattach = True

    async def _pump(self, cmd: CommandLike, queue: DroppingQueue[tuple[str, str]]) -> None:
        """The stream's lines into ``queue`` as fast as they come, each cut to its bound; the
        queue, not this, drops lines the reader has not taken in time."""
        stream = self.transport.stream(cmd)
        try:
            async for line in stream:
                queue.put(("line", cap_line(line)))
            queue.put(("end", "stream ended (the log's command exited)"))
        except TransportError as exc:
            queue.put(("end", exc.message))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # an unexpected transport failure must not kill the follower
            queue.put(("end", f"{type(exc).__name__}: {exc}"))
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(BaseException):
                    await aclose()


def _line_weight(item: tuple[str, str]) -> int:
    """A stream's line may be dropped; its end never."""
    return 1 if item[0] == "line" else 0


# ---- merging ------------------------------------------------------------------------------


def merge_lines(*streams: Iterable[LogLine]) -> list[LogLine]:
    """Finished line lists merged by docker timestamp (stable; lines without one keep their
    place after their source's previous line)."""
    keyed: list[list[tuple[int, int, LogLine]]] = []
    seq = 0
    for stream in streams:
        last = 0
        rows = []
        for line in stream:
            key = line.sort_key
            last = key if key is not None else last
            rows.append((last, seq, line))
            seq += 1
        keyed.append(rows)
    return [row[2] for row in heapq.merge(*keyed)]


def _event_weight(item: tuple[int, FollowEvent | None]) -> int:
    """The lines a merged item stands for: a line one, a gap its count; the rest is never dropped."""
    event = item[1]
    if isinstance(event, LogLine):
        return 1
    return event.count if isinstance(event, LinesDropped) else 0


async def merge_by_time(
    streams: Iterable[AsyncIterable[FollowEvent]],
    *,
    window: float = 0.3,
    clock: Callable[[], float] = time.monotonic,
    max_queued: int = MAX_QUEUED,
) -> AsyncIterator[FollowEvent]:
    """Live merge of several followers: lines are held ``window`` seconds and released in
    docker-timestamp order, so head and worker lines interleave by when they were printed.
    Drops and re-attaches pass straight through. Ends when every stream has ended. At most
    ``max_queued`` lines wait for the reader (the oldest are dropped and reported as
    :class:`LinesDropped`) and as many are held for ordering (past that the oldest go out early)."""
    queue: DroppingQueue[tuple[int, FollowEvent | None]] = DroppingQueue(max_queued, _event_weight)
    sources = list(streams)

    async def pump(i: int, stream: AsyncIterable[FollowEvent]) -> None:
        try:
            async for event in stream:
                queue.put((i, event))
        finally:
            queue.put((i, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(sources)]
    held: list[tuple[int, int, float, LogLine]] = []
    # arrival order of the held lines (arrival times grow with seq): the oldest one still held is
    # the first whose seq was not released, so "is any line due" costs no pass over ``held``
    arrivals: deque[tuple[float, int]] = deque()
    released: set[int] = set()
    last_key: dict[int, int] = {}
    seq = 0
    alive = len(tasks)

    def oldest_arrival() -> float | None:
        while arrivals and arrivals[0][1] in released:
            released.discard(arrivals.popleft()[1])
        return arrivals[0][0] if arrivals else None

    def release() -> LogLine:
        _key, done, _at, line = heapq.heappop(held)
        released.add(done)
        return line

    try:
        while alive or held:
            timeout = None
            oldest = oldest_arrival()
            if oldest is not None:
                timeout = max(0.0, oldest + window - clock())
            item: tuple[int, FollowEvent | None] | None = None
            if alive:
                try:
                    gap, item = await asyncio.wait_for(queue.get(), timeout)
                except TimeoutError:
                    item = None
                else:
                    if gap:
                        yield LinesDropped(gap)
            if item is not None:
                i, event = item
                if event is None:
                    alive -= 1
                elif isinstance(event, LogLine):
                    key = event.sort_key
                    key = key if key is not None else last_key.get(i, 0)
                    last_key[i] = key
                    at = clock()
                    heapq.heappush(held, (key, seq, at, event))
                    arrivals.append((at, seq))
                    seq += 1
                else:
                    yield event
            now = clock()
            flush_all = not alive
            while len(held) > max_queued:  # a flood: the earliest go out now, in order
                yield release()
            while held:
                oldest = oldest_arrival()
                if not flush_all and (oldest is None or oldest + window > now):
                    break
                # release in key order everything up to the newest line that is due
                yield release()
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# ---- the buffer ---------------------------------------------------------------------------

ERROR_PATTERN = re.compile(
    r"\bERROR\b|Traceback \(most recent call last\)|CUDA out of memory|OutOfMemoryError"
    r"|NCCL WARN|NCCL error|\b[A-Z][A-Za-z]*(?:Error|Exception)\b:?|\bFATAL\b|\bCRITICAL\b"
    r"|Segmentation fault|core dumped|\bKilled\b"
)


GAP_PREFIX = "──── … "


def gap_text(count: int, source: str = "") -> str:
    """The line that stands where ``count`` lines were dropped unread."""
    whose = f" of {source}" if source else ""
    lines = f"{count:,} line{'' if count == 1 else 's'}{whose}"
    return f"{GAP_PREFIX}{lines} dropped (log faster than the view) ────"


@dataclass(frozen=True)
class BufferLine:
    """A line of the log (``line``), or one the console put there: a ``marker`` the user dropped,
    a ``gap`` where lines were dropped unread. Only log lines are searched; the others pass any
    filter."""

    text: str
    source: str = ""
    kind: Literal["line", "marker", "gap"] = "line"
    timestamp: str | None = None

    @property
    def display(self) -> str:
        return f"[{self.source}] {self.text}" if self.source and self.kind == "line" else self.text


# Escape sequences a node's text may carry: CSI (colours, cursor, clear screen), OSC (window title,
# clipboard: OSC 52), DCS/SOS/PM/APC strings, two-byte escapes (ESC c resets the terminal), and the
# 8-bit C1 controls (U+0080-U+009F: a lone U+009B is CSI to some terminals). All are removed whole:
# dropping only the ESC byte would leave "]52;c;..." on the screen.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
                      r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?|\x1b[ -/]*[0-~]|\x9b[0-?]*[ -/]*[@-~]"
                      r"|\x9d[^\x07\x9c]*[\x07\x9c]?|[\x80-\x9f]")


def display_text(text: str) -> str:
    """What a terminal would show for a line: the last ``\\r`` segment, tabs expanded, no
    escape sequences or control characters. Every node text on the screen goes through this once,
    where it enters (node text is data, never terminal control)."""
    if "\r" in text:
        parts = [p for p in text.split("\r") if p.strip()]
        text = parts[-1] if parts else ""
    text = _ESCAPES.sub("", text)
    text = text.expandtabs(4)
    # a lone surrogate (bytes decoded with surrogateescape) cannot be written to a UTF-8 terminal:
    # the write would raise and end the app or the CLI, so it shows as U+FFFD, as "replace" does
    return "".join("\ufffd" if "\ud800" <= ch <= "\udfff" else ch for ch in text
                   if (ch >= " " and ch != "\x7f") or ch == "\t")


def display_lines(text: str, sep: str = "\n") -> str:
    """A text of several lines (a command's stderr, a note, an error) as a terminal would show
    it: each line through :func:`display_text` (which, being for one line, would drop the line
    breaks and glue the lines together), joined by ``sep`` (``" "`` where one line is shown)."""
    if "\n" not in text:
        return display_text(text)
    lines = (display_text(line) for line in text.replace("\r\n", "\n").split("\n"))
    return sep.join(lines) if sep == "\n" else sep.join(line for line in lines if line.strip())


# What json.dumps(..., ensure_ascii=False) leaves raw that a terminal may act on: DEL, the C1
# controls (a raw U+009B is CSI to some terminals) and lone surrogates (a UTF-8 stream cannot write
# them: the print raises). json escapes U+0000-U+001F itself.
_JSON_RAW = re.compile("[\x7f-\x9f\ud800-\udfff]")


def json_safe(text: str) -> str:
    """JSON text made with ``ensure_ascii=False`` (non-ASCII names stay readable) with those
    characters written as ``\\u`` escapes too: the same JSON value (they can only stand inside its
    strings), and nothing in it that a terminal would act on."""
    return _JSON_RAW.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


_T = TypeVar("_T")


def display_fields(obj: _T, sep: str = "\n") -> _T:
    """A copy of a frozen dataclass (a deploy event, an alert) with all its text, nested lists,
    tuples and dicts included, through :func:`display_lines` (``sep`` joins the lines: ``" "``
    for what is shown on one line, an alert); the object itself when nothing changed (the common
    case costs no copy). It is for showing: the data kept and sent (the event's JSON, a
    decision's answer) keeps the node's exact words."""
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        return obj
    changes = {}
    for f in dataclasses.fields(obj):
        if not f.init:
            continue
        value = getattr(obj, f.name)
        shown = _displayed(value, sep)
        if shown is not value:
            changes[f.name] = shown
    return dataclasses.replace(obj, **changes) if changes else obj


def _displayed(value: Any, sep: str) -> Any:
    """``value`` cleaned for :func:`display_fields`, or ``value`` itself when nothing in it changed
    (so that an unchanged event is not copied)."""
    if isinstance(value, str):
        shown = display_lines(value, sep)
        return value if shown == value else shown
    if isinstance(value, (list, tuple)):
        items = [_displayed(v, sep) for v in value]
        if all(a is b for a, b in zip(items, value, strict=True)):
            return value
        if isinstance(value, list) or type(value) is tuple:
            return type(value)(items)
        return type(value)(*items)  # a named tuple
    if isinstance(value, dict):
        pairs = {_displayed(k, sep): _displayed(v, sep) for k, v in value.items()}
        same = len(pairs) == len(value) and all(k in value and value[k] is v for k, v in pairs.items())
        return value if same else pairs
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return display_fields(value, sep)
    return value


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """A search pattern: a literal, case-insensitive."""
    return re.compile(re.escape(pattern), re.IGNORECASE)


class LogBuffer:
    """The last ``max_lines`` lines (markers included). Indexes are positions in ``lines``."""

    def __init__(self, max_lines: int = 5000) -> None:
        if max_lines < 1:
            raise ValueError("max_lines must be at least 1")
        self.max_lines = max_lines
        self._lines: deque[BufferLine] = deque(maxlen=max_lines)
        self.dropped = 0  # lines pushed out at the top so far
        self.markers = 0
        self.gaps = 0  # gap lines added (where lines were dropped unread)

    def __len__(self) -> int:
        return len(self._lines)

    def __getitem__(self, index: int) -> BufferLine:
        return self._lines[index]

    @property
    def lines(self) -> list[BufferLine]:
        return list(self._lines)

    def _push(self, line: BufferLine) -> BufferLine:
        if len(self._lines) == self.max_lines:
            self.dropped += 1
        self._lines.append(line)
        return line

    def append(self, text: str, source: str = "", timestamp: str | None = None) -> BufferLine:
        return self._push(BufferLine(display_text(text), source=source, timestamp=timestamp))

    def extend(self, texts: Iterable[str], source: str = "") -> None:
        for text in texts:
            self.append(text, source)

    def add_marker(self, label: str | None = None, when: datetime | None = None) -> BufferLine:
        self.markers += 1
        stamp = (when or datetime.now()).strftime("%H:%M:%S")
        text = f"──── mark {self.markers} · {stamp}{' · ' + label if label else ''} ────"
        return self._push(BufferLine(text, kind="marker"))

    def add_gap(self, count: int, source: str = "") -> BufferLine:
        """A line that says ``count`` lines were dropped here, unread (a log faster than the view)."""
        self.gaps += 1
        return self._push(BufferLine(gap_text(count, display_text(source)), kind="gap"))

    def clear(self) -> None:
        self._lines.clear()

    # -- search ---------------------------------------------------------------------------

    def _scan(
        self, test: Callable[[BufferLine], bool], start: int, backwards: bool, wrap: bool
    ) -> int | None:
        n = len(self._lines)
        if n == 0:
            return None
        order: Iterable[int]
        if backwards:
            first = min(start, n) - 1
            order = list(range(first, -1, -1)) + (list(range(n - 1, first, -1)) if wrap else [])
        else:
            first = max(start, -1) + 1
            order = list(range(first, n)) + (list(range(0, min(first, n))) if wrap else [])
        for i in order:
            if test(self._lines[i]):
                return i
        return None

    def find_next(
        self, pattern: str, start: int = -1, backwards: bool = False, wrap: bool = True
    ) -> int | None:
        """The index of the next line matching ``pattern`` after ``start`` (before it when
        ``backwards``), wrapping around; ``None`` when no line matches."""
        if not pattern:
            return None
        rx = compile_pattern(pattern)
        return self._scan(lambda ln: ln.kind == "line" and bool(rx.search(ln.display)), start, backwards, wrap)

    def matches(self, pattern: str) -> list[int]:
        """Indexes of every matching line (filter mode shows these)."""
        if not pattern:
            return list(range(len(self._lines)))
        rx = compile_pattern(pattern)
        return [i for i, ln in enumerate(self._lines) if ln.kind != "line" or rx.search(ln.display)]

    def filtered(self, pattern: str) -> list[BufferLine]:
        return [self._lines[i] for i in self.matches(pattern)]

    def next_error(self, start: int = -1, backwards: bool = False, wrap: bool = True) -> int | None:
        """The next line that reads like an error (ERROR, Traceback, CUDA OOM, NCCL WARN, ...)."""
        return self._scan(lambda ln: ln.kind == "line" and is_error(ln.text), start, backwards, wrap)


def is_error(text: str) -> bool:
    return bool(ERROR_PATTERN.search(text))
