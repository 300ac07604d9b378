"""Simulated time.

Everything in the simulated cluster is a function of :meth:`SimClock.now` (seconds of simulated
time since the cluster was created). Two kinds of clock:

* a running clock (the demo): sim time = ``speed`` × wall time since start;
* a manual clock (tests): time only moves when :meth:`SimClock.advance` is called, so a test can
  jump over a 2-minute weight load instantly and the state it sees is reproducible.

``await clock.sleep(s)`` waits ``s`` seconds of *simulated* time in both modes (a manual clock
wakes sleepers when it is advanced past their deadline). ``epoch()`` maps sim time onto a
wall-clock date, for log timestamps and ``docker ps`` "CreatedAt".
"""

from __future__ import annotations

import asyncio
import time
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass
class Waited:
    """A command's or a job's own time: when it started and the simulated seconds it has asked to
    wait (its sleeps, transfers and starts, each counted once slept). A running clock's sleeps
    overshoot by the event loop's latency times the speed (a 2 ms hiccup at x1000 reads as 2 s), so
    a twin's estimate (deploy/rehearsal.py: work_intervals) and a node's ``date`` inside a command
    (:meth:`SimClock.node_now`) go by this, not by what the fast clock shows."""

    t0: float
    asked: float = 0.0

    @property
    def t1(self) -> float:
        return self.t0 + self.asked


# the :class:`Waited` of the command or job a task runs for (the tasks it starts inherit it)
NOMINAL: ContextVar[Waited | None] = ContextVar("sim_nominal", default=None)

# The demo's sim time 0 (for tests, a fixed date so rendered output is reproducible).
DEFAULT_EPOCH = 1_774_633_200.0  # 2026-03-27 17:40:00 UTC


class SimClock:
    def __init__(self, speed: float = 1.0, manual: bool = False, epoch: float | None = None) -> None:
        if speed <= 0:
            raise ValueError("speed must be > 0")
        self.speed = float(speed)
        self.manual = manual
        self._start_wall = time.monotonic()
        self._manual_now = 0.0
        self._epoch = (DEFAULT_EPOCH if manual else time.time()) if epoch is None else epoch
        self._waiters: list[tuple[float, asyncio.Future[None]]] = []

    @classmethod
    def frozen(cls, epoch: float | None = None) -> SimClock:
        """A manual clock for tests: only :meth:`advance` moves it."""
        return cls(manual=True, epoch=epoch)

    def now(self) -> float:
        """Seconds of simulated time since the clock was created."""
        if self.manual:
            return self._manual_now
        return (time.monotonic() - self._start_wall) * self.speed

    def set_speed(self, speed: float) -> None:
        """Run a running clock at ``speed`` from now on, its time going on from where it is (the
        console's demo runs a deployment faster than its overview). Sleeps already begun keep their
        old pace."""
        if speed <= 0:
            raise ValueError("speed must be > 0")
        if not self.manual:
            now = self.now()
            self._start_wall = time.monotonic() - now / speed
        self.speed = float(speed)

    def node_now(self) -> float:
        """The time as a command on a node sees it: inside a command the console sent (or a job it
        started), its start plus what it has waited for (:data:`NOMINAL`), so the simulator's own
        computing is not in a node's timings (``date`` around a stream: remote.peer_link_rate), as a
        real node's clock does not count the console's; elsewhere :meth:`now`."""
        w = NOMINAL.get()
        return w.t1 if w is not None and not self.manual else self.now()

    def epoch(self, t: float | None = None) -> float:
        """Unix time of sim time ``t`` (default: now)."""
        return self._epoch + (self.now() if t is None else t)

    def advance(self, seconds: float) -> float:
        """Move a manual clock forward; wakes every sleeper whose deadline has passed."""
        if not self.manual:
            raise RuntimeError("advance() needs a manual clock (SimClock.frozen())")
        if seconds < 0:
            raise ValueError("time does not go backwards")
        self._manual_now += seconds
        self._wake()
        return self._manual_now

    def _wake(self) -> None:
        now = self._manual_now
        keep = []
        for deadline, fut in self._waiters:
            if deadline <= now + 1e-9:
                if not fut.done():
                    fut.set_result(None)
            else:
                keep.append((deadline, fut))
        self._waiters = keep

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of simulated time."""
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        if not self.manual:
            await asyncio.sleep(seconds / self.speed)
        else:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append((self._manual_now + seconds, fut))
            await fut
        # counted once slept: a sleep cut short is a watch beside the work (`timeout`'s, while its
        # command runs) or work that was killed, neither time the node spent on the command
        w = NOMINAL.get()
        if w is not None:
            w.asked += seconds
