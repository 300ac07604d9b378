"""Node memory for the planner from the live nodes of a cluster.

vLLM admits a TP group on its smallest rank, so the planner takes the SMALLEST node's
``MemTotal`` (``/proc/meminfo``, what the probe reports as ``sample.memory.total_bytes``). Each
node's ``MemAvailable`` is checked against ``gpu_memory_utilization x MemTotal``: below it, vLLM
refuses to start ("free memory on device ... is less than desired GPU memory utilization"), and
on a GB10 the usual culprit is the page cache, so the note says how to drop it.

A node that cannot be reached (or whose MemTotal could not be read) never stops a plan: it is
assumed to have the contract default (121.69 GiB) and a reason says so.

- :func:`probe_node_memory` probes a :class:`~sparkconsole.config.ClusterConfig` once (async).
- :func:`memory_from_states` reads :class:`~sparkconsole.probe.state.NodeState` objects the
  console already has (the TUI's poller), without probing anything.
- :meth:`LiveMemory.notes` gives the plan's reasons for a given ``gpu_memory_utilization``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sparkconsole.planner.budget import DEFAULT_NODE_MEMORY_GIB, DROP_CACHES

GIB = float(1 << 30)


@dataclass(frozen=True)
class NodeMemory:
    """What one node's probe said about its memory (``error`` set when nothing usable came back)."""

    node: str
    total_gib: float | None = None
    available_gib: float | None = None
    page_cache_gib: float | None = None
    discrete_gpu: bool = False
    error: str | None = None


@dataclass(frozen=True)
class LiveMemory:
    """Every node's memory; :attr:`gib` is the figure the plan uses (None: nothing read)."""

    nodes: tuple[NodeMemory, ...]
    default_gib: float = DEFAULT_NODE_MEMORY_GIB

    @property
    def read(self) -> list[NodeMemory]:
        return [n for n in self.nodes if n.error is None and n.total_gib is not None]

    @property
    def unreachable(self) -> list[NodeMemory]:
        return [n for n in self.nodes if n.error is not None or n.total_gib is None]

    @property
    def gib(self) -> float | None:
        """The smallest MemTotal in GiB; an unreachable node counts as the default. None when no
        node could be read (the caller keeps its default)."""
        totals = [n.total_gib for n in self.read if n.total_gib is not None]
        if not totals:
            return None
        if self.unreachable:
            totals.append(self.default_gib)
        return min(totals)

    @property
    def effective_gib(self) -> float:
        g = self.gib
        return self.default_gib if g is None else g

    @property
    def source(self) -> str:
        """A short line for a panel: where the node memory figure came from."""
        if self.gib is None:
            return f"default {self.default_gib:.2f} GiB (no live node read)"
        smallest = min(self.read, key=lambda n: n.total_gib or 0.0)
        extra = f", {len(self.unreachable)} unreachable" if self.unreachable else ""
        return (f"live: {self.gib:.2f} GiB, smallest MemTotal of {len(self.read)} node(s) "
                f"({smallest.node}{extra})")

    def notes(self, gmu: float | None = None) -> list[str]:
        """The plan's reasons about node memory, in plain words."""
        out: list[str] = []
        read = self.read
        if read:
            each = ", ".join(f"{n.node} {n.total_gib:.2f} GiB" for n in read)
            out.append(f"node memory {self.effective_gib:.2f} GiB from the live nodes: the smallest MemTotal "
                       f"({each}); vLLM admits on the smallest rank")
        for n in self.unreachable:
            why = n.error or "MemTotal was not read"
            tail = "" if not read else " for it"
            out.append(f"node {n.node} unreachable: {why}; using {self.default_gib:.2f} GiB{tail}")
        for n in read:
            if n.discrete_gpu:
                out.append(f"node {n.node} has a discrete GPU: MemTotal is host memory, not the GPU's; "
                           "give --node-memory-gib for the GPU's memory")
        if gmu is not None:
            for n in read:
                if n.available_gib is None or n.total_gib is None:
                    continue
                want = gmu * n.total_gib
                if n.available_gib < want:
                    cache = (f"; page cache holds {n.page_cache_gib:.2f} GiB" if n.page_cache_gib else "")
                    out.append(
                        f"node {n.node}: MemAvailable {n.available_gib:.2f} GiB is below gpu_memory_utilization "
                        f"{gmu:g} x {n.total_gib:.2f} = {want:.2f} GiB, so vLLM may refuse to start there"
                        f"{cache}; drop the page cache first ({DROP_CACHES}) or stop what holds the memory")
        return out


def _node_memory(state: Any) -> NodeMemory:
    name = str(getattr(state, "name", "?"))
    sample = getattr(state, "sample", None)
    mem = getattr(sample, "memory", None)
    total = getattr(mem, "total_bytes", None)
    if sample is None or not isinstance(total, int | float) or total <= 0:
        reason = getattr(state, "reason", None) or "no sample"
        if sample is not None:
            reason = "MemTotal was not read"
        return NodeMemory(name, error=str(reason))
    status = getattr(getattr(state, "status", None), "value", "up")
    avail = getattr(mem, "available_bytes", None)
    cache = getattr(mem, "page_cache_bytes", None)
    gpus = getattr(sample, "gpus", ()) or ()
    return NodeMemory(
        name,
        total_gib=total / GIB,
        available_gib=avail / GIB if isinstance(avail, int | float) else None,
        page_cache_gib=cache / GIB if isinstance(cache, int | float) else None,
        discrete_gpu=bool(gpus) and not getattr(mem, "unified", False),
        error=None if status in ("up", "stale") else str(getattr(state, "reason", status)),
    )


def memory_from_states(states: Iterable[Any], default_gib: float = DEFAULT_NODE_MEMORY_GIB) -> LiveMemory:
    """Node memory from NodeState-like objects (read defensively: any field may be missing).

    A node that is DOWN counts as unreachable even with an old sample kept; STALE still counts.
    """
    return LiveMemory(tuple(_node_memory(s) for s in states), default_gib)


async def probe_node_memory(
    config: Any,
    *,
    timeout: float = 20.0,
    transport_factory: Callable[[Any], Any] | None = None,
    default_gib: float = DEFAULT_NODE_MEMORY_GIB,
) -> LiveMemory:
    """Probe every node of ``config`` once (concurrently) and read its memory."""
    from sparkconsole.probe.poller import snapshot_cluster

    states = await snapshot_cluster(config, timeout=timeout, transport_factory=transport_factory)
    return memory_from_states(states, default_gib)
