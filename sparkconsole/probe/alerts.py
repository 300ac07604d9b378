"""Alerts: the few conditions an operator must see without looking for them.

Pure functions over the node states, so the dashboard, ``snapshot`` and tests agree. Each alert
names its node and says what is wrong in plain words; severity orders them. An alert's identity
(:attr:`Alert.key`) is its kind, node and subject, never its text: the text carries live numbers
(``MemAvailable 7.3 GiB``) that move while the condition lasts, and the condition is one event.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from sparkconsole.probe.samples import NodeSample
from sparkconsole.probe.state import NodeState, NodeStatus
from sparkconsole.serving.watch import EngineWatch

Severity = Literal["critical", "warning", "info"]
LOW_MEMORY_FRACTION = 0.10


@dataclass(frozen=True)
class Alert:
    node: str
    severity: Severity
    text: str
    kind: str = ""  # what is wrong: "down", "low-memory", "container-restarting", ...
    subject: str = ""  # what it is wrong with, when a node can have several (a container's name)

    @property
    def key(self) -> tuple[str, str, str]:
        """The alert's identity: the same condition on the same thing keeps it while its text changes."""
        return (self.kind or self.text, self.node, self.subject)


def node_alerts(state: NodeState) -> list[Alert]:
    """Alerts that one node raises on its own."""
    out: list[Alert] = []
    if state.status is NodeStatus.DOWN:
        out.append(Alert(state.name, "critical", f"node down: {state.reason}", kind="down"))
    elif state.status is NodeStatus.STALE:
        out.append(Alert(state.name, "warning", f"stale: {state.reason}", kind="stale"))
    sample = state.sample
    if sample is None:
        return out
    frac = sample.memory.available_fraction
    if frac is not None and frac < LOW_MEMORY_FRACTION:
        avail = (sample.memory.available_bytes or 0) / 2**30
        out.append(Alert(state.name, "critical", f"MemAvailable {avail:.1f} GiB ({frac:.0%}) — under 10%",
                         kind="low-memory"))
    if sample.links:
        up = [link for link in sample.links if link.state == "up"]
        if not up:
            out.append(Alert(state.name, "critical", "ConnectX-7 link down: no twin is Up", kind="links-down"))
    for c in sample.containers:
        if c.state == "restarting" or (c.status or "").startswith("Restarting"):
            out.append(Alert(state.name, "warning", f"container {c.name} is restarting",
                             kind="container-restarting", subject=c.name))
    if state.status is NodeStatus.UP:  # a node that does not answer says nothing of its engines
        out.extend(engine_alerts(state))
    return out


KV_FULL = 0.95  # vLLM preempts when it cannot grow a running request's blocks: near full is the warning
KV_BUSY = 0.90


def engine_alerts(state: NodeState) -> list[Alert]:
    """What the serving poll sees going wrong (issue 24): the signals vLLM's own DGX Spark guide
    says to watch (KV usage, running/waiting, preemptions), and an engine gone quiet. The subject is
    the engine's port, so two engines on one node are two alerts."""
    sample = state.sample
    running = {c.name for c in sample.containers if c.state == "running"} if sample else set()
    out: list[Alert] = []
    for port, watch in sorted(state.engines.items()):
        alive = watch.engine.on_host or watch.engine.where in running
        key = (state.name, watch.reads, alive)
        memo = watch.memo.get("alerts")
        if memo is None or memo[0] != key:  # every tick asks; only a new read changes the answer
            memo = watch.memo["alerts"] = (key, tuple(_engine_alerts(state.name, port, watch, alive)))
        out.extend(memo[1])
    return out


def _engine_alerts(node: str, port: int, watch: EngineWatch, alive: bool) -> list[Alert]:
    """One engine's alerts; ``alive``: its container (or process) still runs."""
    e = watch.engine
    name = f"{e.model or e.kind} on :{port}"
    subject = str(port)
    if watch.silent:
        if not alive:
            return []  # stopped on purpose: no alarm
        where = "its process" if e.on_host else f"container {e.where}"
        return [Alert(node, "critical", f"{name} stopped answering /metrics ({watch.reason}) while {where} runs",
                      kind="engine-silent", subject=subject)]
    f = watch.figures()
    if not f.answering:
        return []
    out: list[Alert] = []
    kv = f.kv_cache_usage
    if f.preemptions_1m:
        out.append(Alert(node, "warning", f"{name}: {f.preemptions_1m:.0f} preemptions in the last minute (KV "
                         "cache too small for the load: requests are recomputed)", kind="engine-preempting",
                         subject=subject))
    if f.waiting_rising and kv is not None and kv >= KV_BUSY:
        out.append(Alert(node, "warning", f"{name}: queue growing ({f.requests_waiting:.0f} waiting) while the KV "
                         f"cache is {kv:.0%} full", kind="engine-queue", subject=subject))
    if kv is not None and kv >= KV_FULL:
        out.append(Alert(node, "warning", f"{name}: KV cache {kv:.0%} full", kind="engine-kv-full", subject=subject))
    return out


def _first_gpu(sample: NodeSample | None):
    return sample.gpus[0] if sample is not None and sample.gpus else None


def cluster_alerts(states: Sequence[NodeState]) -> list[Alert]:
    """All alerts: per node, plus differences between nodes (driver, CUDA, clocks)."""
    out: list[Alert] = []
    for state in states:
        out.extend(node_alerts(state))
    sampled = [s for s in states if s.sample is not None]
    drivers = {s.name: s.sample.driver_version for s in sampled if s.sample and s.sample.driver_version}
    if len(set(drivers.values())) > 1:
        detail = ", ".join(f"{n} {v}" for n, v in drivers.items())
        out.append(Alert("cluster", "warning", f"driver versions differ: {detail}", kind="driver-differs"))
    cudas = {s.name: s.sample.cuda_version for s in sampled if s.sample and s.sample.cuda_version}
    if len(set(cudas.values())) > 1:
        detail = ", ".join(f"{n} {v}" for n, v in cudas.items())
        out.append(Alert("cluster", "warning", f"CUDA versions differ: {detail}", kind="cuda-differs"))
    max_clocks = {}
    for s in sampled:
        gpu = _first_gpu(s.sample)
        if gpu is not None and gpu.clock_max_sm_mhz is not None:
            max_clocks[s.name] = gpu.clock_max_sm_mhz
    if len(max_clocks) > 1 and max(max_clocks.values()) - min(max_clocks.values()) > 50:
        detail = ", ".join(f"{n} {v:.0f} MHz" for n, v in max_clocks.items())
        out.append(Alert("cluster", "warning", f"max GPU clocks differ: {detail}", kind="clocks-differ"))
    order = {"critical": 0, "warning": 1, "info": 2}
    return sorted(out, key=lambda a: order[a.severity])
