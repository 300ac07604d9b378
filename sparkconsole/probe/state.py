"""Per-node watch state, kept in the data layer so it survives screen switches.

The poller (:mod:`sparkconsole.probe.poller`) updates one :class:`NodeState` per node; the UI
reads it. History is a set of bounded deques of ``(time, value)`` points; a value that was not
read is stored as ``None`` so a gap shows as a gap, not as a drop to zero.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from itertools import islice

from sparkconsole.probe.samples import NodeSample
from sparkconsole.probe.script import ReaderState
from sparkconsole.serving.watch import EngineWatch

HISTORY_POINTS = 600  # 10 minutes at 1 s


class NodeStatus(enum.Enum):
    CONNECTING = "connecting"
    UP = "up"
    STALE = "stale"  # connected before, the last ticks failed or are late
    DOWN = "down"  # several failures in a row, or the connection is gone

    @property
    def glyph(self) -> str:
        return {"connecting": "◌", "up": "●", "stale": "◐", "down": "✖"}[self.value]


METRICS = ("gpu_util", "gpu_temp", "gpu_power", "gpu_clock", "mem_used_gib", "mem_available_gib")


@dataclass
class History:
    """Bounded time series per metric."""

    maxlen: int = HISTORY_POINTS
    series: dict[str, deque[tuple[float, float | None]]] = field(default_factory=dict)

    def add(self, t: float, metric: str, value: float | None) -> None:
        dq = self.series.get(metric)
        if dq is None:
            dq = self.series[metric] = deque(maxlen=self.maxlen)
        dq.append((t, value))

    def values(self, metric: str, last: int | None = None) -> list[float | None]:
        """A copy of the values, oldest first; with ``last``, only the newest ``last`` are read
        (a sparkline of 44 cells reads 44 points, not all 600 kept)."""
        dq = self.series.get(metric)
        if not dq:
            return []
        if last is None or last >= len(dq):
            return [v for _, v in dq]
        newest = [v for _, v in islice(reversed(dq), max(last, 0))]
        newest.reverse()
        return newest

    def record_gap(self, t: float) -> None:
        """A tick that got no sample: one ``None`` point per metric, so sparklines show the outage."""
        for metric in METRICS:
            self.add(t, metric, None)

    def record(self, sample: NodeSample) -> None:
        t = sample.taken_at
        gpu = sample.gpus[0] if sample.gpus else None
        self.add(t, "gpu_util", gpu.utilization_pct if gpu else None)
        self.add(t, "gpu_temp", gpu.temperature_c if gpu else None)
        self.add(t, "gpu_power", gpu.power_w if gpu else None)
        self.add(t, "gpu_clock", gpu.clock_sm_mhz if gpu else None)
        mem = sample.memory
        used = mem.used_bytes
        self.add(t, "mem_used_gib", used / 2**30 if used is not None else None)
        self.add(t, "mem_available_gib", mem.available_bytes / 2**30 if mem.available_bytes is not None else None)


@dataclass
class NodeState:
    """What the console knows about one node right now."""

    name: str
    status: NodeStatus = NodeStatus.CONNECTING
    reason: str = "connecting…"
    sample: NodeSample | None = None  # the last good sample (kept when the node goes stale)
    last_ok_at: float | None = None
    last_attempt_at: float | None = None
    failures: int = 0
    history: History = field(default_factory=History)
    #: the engines found on the node by port, each with its pages (the serving poll, issue 24)
    engines: dict[int, EngineWatch] = field(default_factory=dict)
    #: the probe's long-lived GPU readers as the node last told them (issue 25)
    readers: dict[str, ReaderState] = field(default_factory=dict)
    #: things worth one line in the console's events, said once (a reader restarted); the UI takes them
    notes: list[str] = field(default_factory=list)

    def take_notes(self) -> list[str]:
        """The notes not yet shown, and forget them (each is said once)."""
        out, self.notes = self.notes, []
        return out

    def age(self, now: float) -> float | None:
        return None if self.last_ok_at is None else max(0.0, now - self.last_ok_at)
