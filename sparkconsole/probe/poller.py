"""Polling nodes: one held probe process per node, one tick at a time, never overlapping.

:class:`NodePoller` owns one node's probe process on its transport. ``poll_once()`` writes one
request line (the sections due this tick), reads until the ``end`` marker, assembles a
:class:`~sparkconsole.probe.samples.NodeSample` and updates the node's
:class:`~sparkconsole.probe.state.NodeState`. A failure never raises out of ``poll_once``: it
turns into a status (stale, then down) with the reason in plain words, and the broken process
is dropped so the next tick starts a fresh one on the (re-)connected transport.

The next poll is armed only when the last one has finished (Dolphie's rule), so a slow node
never builds a backlog; each node is polled independently, so one slow or dead node never
delays another. The Textual UI arms its own timers around ``poll_once``; scripts use
:meth:`ClusterPoller.run` or :func:`snapshot_cluster`.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence

from sparkconsole.config import ClusterConfig, NodeConfig
from sparkconsole.errors import UserError
from sparkconsole.probe.parsers import parse_cgroups
from sparkconsole.probe.samples import NodeSample
from sparkconsole.probe.script import (
    ENGINES,
    MARK,
    METRICS_PREFIX,
    READERS_SECTION,
    SERVING_SECTIONS,
    TICK_MAX_BYTES,
    TICK_MAX_LINES,
    SectionOutput,
    metrics_section,
    parse_readers,
    probe_command,
    sections_for_tick,
    split_pages,
    split_tick,
)
from sparkconsole.probe.state import NodeState, NodeStatus
from sparkconsole.serving.discover import discover
from sparkconsole.serving.metrics import INLINE_PAGE_LINES, page_refusal, parse_metrics
from sparkconsole.serving.watch import EngineWatch, version_from_image
from sparkconsole.transport.base import LongProcess, Transport

STALE_AFTER_FAILURES = 1
DOWN_AFTER_FAILURES = 3
# The serving poll reads each engine's page every this many ticks (6 s at the default 2 s): slower
# than the hardware, one request per engine then, inside the tick's one batched probe request
SERVING_EVERY = 3
# Where containers' cgroups are read, ``docker ps`` runs when they changed and at least this often
DOCKER_PS_SLOW = 30
SERVING_MIN_S = 5.0  # and never more often than this: a console polling every second reads pages every 5


def _reason(exc: BaseException) -> str:
    if isinstance(exc, UserError):
        return exc.message
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return "no answer in time (probe timed out)"
    text = str(exc).strip().splitlines()
    return f"{exc.__class__.__name__}: {text[0]}" if text else exc.__class__.__name__


class _Missed(Exception):
    """A tick that got no answer within its budget (the work it waits on goes on)."""


class _Oversized(Exception):
    """An answer larger than the console keeps: read to its end and dropped (the probe stays in step)."""


class NodePoller:
    """Polls one node over one transport; the process is opened lazily and re-opened on error.

    A tick never cancels what it waits on. Opening the probe (connecting included) and each
    request's answer are tasks that outlive a tick that gives up on them: a slow answer is taken
    by the next tick, and a connection attempt always runs its full SSH connect timeout (so it
    ends with the SSH-level reason and counts towards the transport's backoff) however short the
    tick's budget. A tick waits ``answer_timeout`` at most: a node that does not answer is stale
    at the first missed tick; it is down as soon as the transport says the connection is gone
    (keepalive, connect timeout, refused: the reason names host and port), or after
    ``DOWN_AFTER_FAILURES`` missed ticks in a row. Every failed tick records a gap in the
    history, so sparklines show the outage.
    """

    def __init__(
        self,
        node: NodeConfig,
        transport: Transport,
        *,
        interval: float = 2.0,
        tick_timeout: float = 15.0,
        clock: Callable[[], float] = time.time,
        state: NodeState | None = None,
        serving: bool = True,
    ) -> None:
        self.node = node
        self.serving = serving  # the serving poll: find engines, read their /metrics
        self._engines_for: frozenset[str] | None = None  # the running containers at the last discovery
        self._pages_due = False
        self._cgroups_ok = False  # the node answered ``cgroups``: containers' figures come from their files
        self._ps_due = False  # the running containers changed since the last ``docker ps``
        self._ps_ticks = 0  # ticks after the next that still list them (after a service action)
        self.transport = transport
        self.interval = interval
        self.tick_timeout = tick_timeout
        self.clock = clock
        self.state = state or NodeState(node.name)
        self._process: LongProcess | None = None
        self._opening: asyncio.Task[LongProcess] | None = None
        self._exchange: asyncio.Task[list[str]] | None = None
        self._asked_at = 0.0
        self._answer_s = 0.0  # how long the last answer took
        self._tick = 0
        self._lock = asyncio.Lock()
        # How long a tick waits for its answer when the caller, not the interval, sets the pace:
        # a driver that steps the polls itself (tests, the screenshot script) sets it so that how
        # busy the laptop is never decides what a tick reads. ``None``: the console's own pace.
        self.patience: float | None = None

    @property
    def answer_timeout(self) -> float:
        """How long one tick waits: about one interval (more for a node whose answers are slow),
        never more than ``tick_timeout``; ``patience`` when set."""
        if self.patience is not None:
            return self.patience
        return min(self.tick_timeout, max(self.interval, 1.0, 3 * self._answer_s))

    async def _read_tick(self, process: LongProcess) -> list[str]:
        """The lines of one answer, ``begin`` to ``end``. What is kept is bounded (:data:`TICK_MAX_BYTES`,
        :data:`TICK_MAX_LINES`; the node already cuts each section far below): past a bound the rest
        of the answer is read and dropped, so the next request starts in step, and the tick fails
        with the reason."""
        lines: list[str] = []
        started = False
        size = 0
        over = False
        while True:
            line = await process.read_line()
            if line is None:
                raise ConnectionError("the probe process ended (connection lost?)")
            if line.startswith(MARK):
                words = line[len(MARK):].split()
                if words[:1] == ["begin"]:
                    started, lines, size, over = True, [], 0, False
                    continue
                if words[:1] == ["end"] and started:
                    if over:
                        raise _Oversized(f"the node's answer passed {TICK_MAX_BYTES} bytes or {TICK_MAX_LINES} "
                                         "lines; not read")
                    return lines
            if started and not over:
                size += len(line) + 1
                if size > TICK_MAX_BYTES or len(lines) >= TICK_MAX_LINES:
                    over, lines = True, []
                    continue
                lines.append(line)

    async def _ask(self, process: LongProcess, wanted: tuple[str, ...]) -> list[str]:
        await process.write_line(" ".join(wanted))
        return await self._read_tick(process)

    async def _tick_lines(self, wanted: tuple[str, ...]) -> list[str]:
        deadline = time.monotonic() + self.answer_timeout
        if self._exchange is None:
            process = self._process
            if process is None or process.is_closing:
                self._process = None
                if self._opening is None:
                    # through the transport's own backoff: never a connect() that skips it
                    self._opening = asyncio.ensure_future(self.transport.open_process(probe_command(self.interval)))
                opening = self._opening
                await asyncio.wait({opening}, timeout=max(0.0, deadline - time.monotonic()))
                if not opening.done():
                    raise _Missed(self._waiting_reason())
                self._opening = None
                process = self._process = opening.result()
            self._asked_at = time.monotonic()
            self._exchange = asyncio.ensure_future(self._ask(process, wanted))
        exchange = self._exchange
        await asyncio.wait({exchange}, timeout=max(0.0, deadline - time.monotonic()))
        if not exchange.done():
            raise _Missed("no answer in time (probe timed out)")
        self._exchange = None
        lines = exchange.result()
        self._answer_s = time.monotonic() - self._asked_at
        return lines

    def _where_suffix(self) -> str:
        where = getattr(self.transport, "_where", None)
        return f" ({where})" if where else ""

    def _waiting_reason(self) -> str:
        last = getattr(self.transport, "last_error", None)
        if last:
            return last
        timeout = getattr(self.transport, "connect_timeout", None)
        parts = [getattr(self.transport, "_where", None), f"SSH connect timeout {timeout:g} s" if timeout else None]
        parts = [p for p in parts if p]
        return "connecting" + (f" to {', '.join(parts)}" if parts else "") + "…"

    def _transport_down(self) -> str | None:
        """The transport's own word that the node is unreachable (SSH level), else ``None``."""
        if self.transport.connected:
            return None
        return getattr(self.transport, "last_error", None)

    async def _drop_process(self) -> None:
        proc, self._process = self._process, None
        for task in (self._exchange, self._opening):
            if task is not None and not task.done():
                task.cancel()
        self._exchange = self._opening = None
        if proc is not None:
            try:
                await asyncio.wait_for(proc.close(), 2.0)
            except Exception:
                pass

    async def poll_once(self) -> NodeState:
        """One tick. Never raises (bar cancellation): failures become the node's status."""
        async with self._lock:
            from sparkconsole.probe.assemble import assemble_sample

            state = self.state
            state.last_attempt_at = self.clock()
            wanted = self._wanted(self._tick if state.sample is not None else 0)
            started = time.monotonic()
            try:
                lines = await self._tick_lines(wanted)
            except asyncio.CancelledError:
                await self._drop_process()
                raise
            except (_Missed, _Oversized) as exc:  # an oversized answer was read whole: the probe stays
                self._fail(str(exc))
                return state
            except Exception as exc:
                self._exchange = self._opening = None
                await self._drop_process()
                self._fail(_reason(exc))
                return state
            sections = split_tick(lines)
            readers = sections.pop(READERS_SECTION, None)
            if readers is not None:
                self._readers_read(readers)
            serving = {n: sections.pop(n) for n in list(sections)
                       if n in SERVING_SECTIONS or n.startswith(METRICS_PREFIX)}
            sample = assemble_sample(self.node.name, self.clock(), sections, previous=state.sample)
            sample = _with_probe_ms(sample, min(self._answer_s, time.monotonic() - started) * 1000.0)
            state.sample = sample
            self._cgroups_read(sections.get("cgroups"))
            state.last_ok_at = sample.taken_at
            state.failures = 0
            state.status = NodeStatus.UP
            state.reason = "up"
            state.history.record(sample)
            if serving:
                await self._serving_read(serving, sample.taken_at)
            self._tick += 1
            return state

    @property
    def serving_every(self) -> int:
        """Ticks between two reads of the engines' pages: :data:`SERVING_EVERY`, more when the
        interval is short (at least :data:`SERVING_MIN_S` apart)."""
        return max(SERVING_EVERY, math.ceil(SERVING_MIN_S / max(self.interval, 0.1) - 1e-9))

    def _running(self) -> frozenset[str] | None:
        sample = self.state.sample
        if sample is None:
            return None
        return frozenset(c.name for c in sample.containers if c.state == "running")

    def _wanted(self, tick: int) -> tuple[str, ...]:
        """The sections of this tick: the hardware's by their cadence; with the serving poll, the
        engines' discovery by its own (and again as soon as the running containers changed) and one
        page per known engine every :data:`SERVING_EVERY` ticks."""
        wanted = self._containers_due(tick, sections_for_tick(tick))
        if "gpu" in wanted or "gpu-apps" in wanted:
            wanted += (READERS_SECTION,)
        if not self.serving:
            return wanted
        running = self._running()
        if tick % ENGINES.every == 0 or (running is not None and running != self._engines_for):
            wanted += (ENGINES.name,)
            self._engines_for = running
        if tick % self.serving_every == 0 or self._pages_due:
            self._pages_due = False
            if self.state.engines:
                wanted += (metrics_section(*sorted(self.state.engines)),)
        return wanted

    def _containers_due(self, tick: int, wanted: tuple[str, ...]) -> tuple[str, ...]:
        """Where the node's containers have cgroup files (``cgroups`` answered), ``docker stats`` is
        not asked (the files are what it reads) and ``docker ps`` only when the running containers
        the files list differ from the ones it last listed, and every :data:`DOCKER_PS_SLOW` ticks
        (names, images and status words change without a start or a stop). Elsewhere, or until the
        first answer, the cadence of :data:`SECTIONS` stands."""
        if tick == 0 or not self._cgroups_ok:
            return wanted
        due = tick % DOCKER_PS_SLOW == 0 or self._ps_due
        out = tuple(n for n in wanted if n != "docker-stats" and (n != "docker-ps" or due))
        if due and "docker-ps" not in out:
            out += ("docker-ps",)
        self._ps_due = self._ps_ticks > 0
        self._ps_ticks = max(0, self._ps_ticks - 1)
        return out

    def containers_changed(self, ticks: int = 1) -> None:
        """The next ``ticks`` ticks list the containers (``docker ps``) whatever the cgroups say:
        after a refresh the operator asked for, the list is read at once; after a service action,
        for a few ticks more (a container started is "created" for a moment)."""
        self._ps_due = True
        self._ps_ticks = max(self._ps_ticks, ticks - 1)

    def _cgroups_read(self, out: SectionOutput | None) -> None:
        """Remember whether the node has container cgroups, and whether ``docker ps`` is due: the
        running containers the files list are not the ones the last ``docker ps`` showed running."""
        if out is None or out.rc is None:
            return
        self._cgroups_ok = out.rc == 0
        sample = self.state.sample
        if not self._cgroups_ok or sample is None:
            return
        listed = frozenset(c.id[:12] for c in sample.containers if c.id and c.state == "running")
        if frozenset(parse_cgroups(out.text)) != listed:
            self._ps_due = True

    async def read_pages(self) -> None:
        """Read every known engine's page now, and only that: the node's sample is left as it is
        (``snapshot`` reads the pages of the engines its one full probe found)."""
        if not self.state.engines:
            return
        async with self._lock:
            try:
                lines = await self._tick_lines((metrics_section(*sorted(self.state.engines)),))
            except asyncio.CancelledError:
                raise
            except Exception:
                return  # the engines keep "not read yet"; the node's status is the hardware tick's
            await self._serving_read(split_tick(lines), self.clock())

    async def _serving_read(self, sections: dict[str, SectionOutput], t: float) -> None:
        """The engines found and their pages read: each page recorded on its engine's watch. A page of
        more than :data:`~sparkconsole.serving.metrics.INLINE_PAGE_LINES` lines (and within the bounds
        a page may have) is parsed in a worker thread, so the screen never waits on the parser."""
        engines = self.state.engines
        found = sections.get("engines")
        if found is not None and found.rc is not None:
            now = {e.port: e for e in discover(found.text, node=self.node.name)}
            for port in [p for p in engines if p not in now]:
                del engines[port]  # stopped: its figures go with it
            for port, eng in now.items():
                watch = engines.get(port)
                if watch is None or watch.engine != eng:
                    engines[port] = EngineWatch(eng, version=version_from_image(eng.image))
            if now and not any(n.startswith(METRICS_PREFIX) for n in sections):
                self._pages_due = True  # read the new engines' pages on the next tick
        for name, out in sections.items():
            if name.startswith(METRICS_PREFIX):
                for port, page in split_pages(out).items():
                    watch = engines.get(port)
                    if watch is None:
                        continue
                    parsed = None
                    if (page.rc == 0 and page.text.count("\n") >= INLINE_PAGE_LINES
                            and page_refusal(page.text) is None and not watch.unchanged(page.text, page.rc)):
                        parsed = await asyncio.to_thread(parse_metrics, page.text)
                    watch.record(t, page.text, page.rc, parsed=parsed)

    def _readers_read(self, out: SectionOutput) -> None:
        """The GPU readers' state (the ``readers`` section): kept on the node's state, and a restart
        or a fall-back to one-shot reads said once, as a note the console shows in its events."""
        state = self.state
        now = parse_readers(out.text)
        for name, r in now.items():
            before = state.readers.get(name)
            why = f": {r.why}" if r.why else ""
            if r.state == "oneshot" and (before is None or before.state != "oneshot"):
                state.notes.append(f"GPU reader {name} gave up after {r.restarts} restarts{why}; reading the "
                                   "GPU with one nvidia-smi per tick" if r.restarts else
                                   f"GPU reader {name} not available{why}; reading the GPU with one nvidia-smi per tick")
            elif before is not None and r.restarts > before.restarts:
                state.notes.append(f"GPU reader {name} died and was restarted{why}")
        state.readers = now

    def _fail(self, reason: str) -> None:
        state = self.state
        state.failures += 1
        state.history.record_gap(self.clock())
        down = self._transport_down()
        if down:
            state.status, state.reason = NodeStatus.DOWN, down
            return
        if state.sample is None and state.failures < DOWN_AFTER_FAILURES:
            state.status = NodeStatus.CONNECTING if state.failures < 2 else NodeStatus.DOWN
        elif state.failures >= DOWN_AFTER_FAILURES:
            state.status = NodeStatus.DOWN
        else:
            state.status = NodeStatus.STALE
        state.reason = reason

    def refresh_staleness(self, now: float | None = None) -> None:
        """Between ticks: an UP node is stale when its last sample is older than three intervals,
        and any node is down as soon as its transport has lost the connection (SSH level)."""
        now = self.clock() if now is None else now
        state = self.state
        down = self._transport_down()
        if down and state.status in (NodeStatus.UP, NodeStatus.STALE):
            state.status, state.reason = NodeStatus.DOWN, down
            return
        age = state.age(now)
        if state.status is NodeStatus.UP and age is not None and age > 3 * max(self.interval, 1.0):
            state.status = NodeStatus.STALE
            state.reason = f"no fresh sample for {age:.0f} s"

    async def close(self) -> None:
        await self._drop_process()
        try:
            await self.transport.close()
        except Exception:
            pass


def _with_probe_ms(sample: NodeSample, ms: float) -> NodeSample:
    from dataclasses import replace

    return replace(sample, probe_ms=ms)


class ClusterPoller:
    """One :class:`NodePoller` per node of a cluster, polled concurrently and independently."""

    def __init__(
        self,
        config: ClusterConfig,
        *,
        interval: float = 2.0,
        transport_factory: Callable[[NodeConfig], Transport] | None = None,
        clock: Callable[[], float] = time.time,
        serving: bool = True,
    ) -> None:
        from sparkconsole.transport import node_transport

        factory = transport_factory or (lambda node: node_transport(config, node))
        self.config = config
        self.interval = interval
        self.pollers = {
            n.name: NodePoller(n, factory(n), interval=interval, clock=clock, serving=serving)
            for n in config.nodes
        }

    @property
    def states(self) -> list[NodeState]:
        return [p.state for p in self.pollers.values()]

    async def poll_all(self) -> list[NodeState]:
        return list(await asyncio.gather(*(p.poll_once() for p in self.pollers.values())))

    async def _run_node(self, poller: NodePoller, on_update: Callable[[NodeState], None] | None) -> None:
        while True:
            started = time.monotonic()
            state = await poller.poll_once()
            if on_update is not None:
                on_update(state)
            # the next poll is armed only now that this one has finished
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    async def run(self, on_update: Callable[[NodeState], None] | None = None) -> None:
        """Poll every node forever; each node re-arms its next poll when the last one ends."""
        await asyncio.gather(*(self._run_node(p, on_update) for p in self.pollers.values()))

    async def close(self) -> None:
        await asyncio.gather(*(p.close() for p in self.pollers.values()), return_exceptions=True)


async def snapshot_cluster(
    config: ClusterConfig,
    *,
    timeout: float = 20.0,
    transport_factory: Callable[[NodeConfig], Transport] | None = None,
) -> list[NodeState]:
    """One full probe of every node (all sections), concurrently; dead nodes come back DOWN."""
    poller = ClusterPoller(config, transport_factory=transport_factory)
    for p in poller.pollers.values():
        p.tick_timeout = timeout
        p.patience = timeout  # one shot: the node has the whole timeout to connect and answer
    try:
        states = await poller.poll_all()
        # the first request found the engines; a second one reads their pages, and only those
        again = [p for p in poller.pollers.values() if p.state.engines and p.state.status is NodeStatus.UP]
        if again:
            await asyncio.gather(*(p.read_pages() for p in again))
        return states
    finally:
        await poller.close()


def engines_to_json(states: Sequence[NodeState]) -> list[dict[str, object]]:
    """``snapshot --json``'s ``engines``: one object per engine found, node by node."""
    return [w.figures().contract_dict() for s in states for _, w in sorted(s.engines.items())]


def states_to_json(states: Sequence[NodeState]) -> dict[str, object]:
    return {
        "engines": engines_to_json(states),
        "nodes": [
            {
                "node": s.name,
                "status": s.status.value,
                "reason": s.reason,
                "sample": s.sample.to_dict() if s.sample is not None else None,
            }
            for s in states
        ]
    }
