"""What must stop so the plan fits: the smallest set of running services, per node.

vLLM refuses to start when free memory is below ``gpu_memory_utilization × total``; on a Spark the
services already running hold that memory (an older model, embeddings, a reranker). For each node
the wizard looks for the fewest running containers whose memory brings ``MemAvailable`` up to the
need (page cache counts as available: the ``caches`` step drops it before launch); between sets of
the same size it keeps the most memory in use (stops no more than needed), then stops the least
busy one (CPU share from ``docker stats``). The old services keep serving until right before launch.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from sparkconsole.deploy.recon import NodeFacts

GIB = float(1 << 30)


@dataclass(frozen=True)
class Choice:
    node: str
    need: int  # bytes that must be available at launch
    available: int  # now
    stop: tuple[str, ...]  # container names, unit:NAME, pid:N (service_bytes)
    frees: int
    enough: bool

    @property
    def after(self) -> int:
        return self.available + self.frees


def service_bytes(f: NodeFacts) -> dict[str, int]:
    """What can be stopped to free memory, by the name a :class:`~sparkconsole.deploy.deployment_plan.Stop`
    carries: running containers (their name), systemd units holding GPU memory (``unit:NAME``) and
    host GPU processes outside both (``pid:N``). Containers were all the wizard offered before, so
    a model served by a unit or started by hand was never offered and the plan stayed short."""
    out = container_bytes(f)
    for h in f.holders:
        if h.kind != "process":
            continue
        if h.detail.startswith("unit "):
            key = "unit:" + h.detail.split(" ", 1)[1]
        elif h.detail.startswith("pid "):
            key = "pid:" + h.detail.split(" ", 1)[1]
        else:
            continue
        out[key] = out.get(key, 0) + h.bytes
    return out


def needs_sudo(name: str) -> bool:
    """Stopping a systemd unit needs root (``sudo -n systemctl stop``)."""
    return name.startswith("unit:")


def container_bytes(f: NodeFacts) -> dict[str, int]:
    """Memory each running container holds: its processes (docker stats) plus the GPU memory of
    the processes attributed to it."""
    out: dict[str, int] = {}
    for h in f.holders:
        if h.kind == "container" and h.running:
            out[h.name] = out.get(h.name, 0) + h.bytes
    for h in f.holders:
        if h.kind == "process" and h.detail.startswith("container "):
            name = h.detail.split(" ", 1)[1]
            if name in out:
                out[name] += h.bytes
    return out


def busy(f: NodeFacts) -> dict[str, float]:
    return {c["name"]: float(c.get("cpu") or 0.0) for c in f.containers if c.get("name")}


def choose(f: NodeFacts, need: int, keep: frozenset[str] = frozenset()) -> Choice:
    avail = int(f.mem_available or 0)
    # a unit is a candidate only where sudo may stop it; the others stay in the "stop every" option
    held = {n: b for n, b in service_bytes(f).items() if n not in keep and (not needs_sudo(n) or f.can_sudo())}
    if avail >= need:
        return Choice(f.node, need, avail, (), 0, True)
    names = sorted(held)
    cpu = busy(f)
    for k in range(1, len(names) + 1):
        fits = [c for c in itertools.combinations(names, k) if avail + sum(held[n] for n in c) >= need]
        if fits:
            best = min(fits, key=lambda c: (round(sum(held[n] for n in c) / GIB), sum(cpu.get(n, 0.0) for n in c), c))
            return Choice(f.node, need, avail, best, sum(held[n] for n in best), True)
    return Choice(f.node, need, avail, tuple(names), sum(held.values()), False)
