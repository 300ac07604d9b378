"""What an engine's log says, whichever engine wrote it: the report every tracker builds, the
tracker's shape, and the plumbing every tracker shares.

Each engine reads its own log lines (:mod:`sparkconsole.logs.vllm`, :mod:`sparkconsole.logs.sglang`,
:mod:`sparkconsole.logs.llama_cpp`), but the deploy wizard, the log screen and ``--json`` read one
report: :class:`LogReport`, with one state machine (``starting`` → ``loading`` → ``ready``, or
``failed``), one timeline of phases and one set of failure classes. So adding an engine is a tracker
that fills this report, and no caller learns a new shape. The JSON contract of ``sparkconsole parse
vllm-log`` is :meth:`LogReport.contract_dict`.

Pure Python (no Textual, no I/O).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Literal, Protocol

State = Literal["starting", "loading", "ready", "failed", "unknown"]
#: every engine's failure classes together; each engine names the ones it reads (``failure_kinds``)
FailureKind = Literal["oom", "unsupported_architecture", "nccl", "ray", "other"]

STATES: tuple[str, ...] = ("starting", "loading", "ready", "failed", "unknown")

# Phase names for the UI timeline (``phase`` / ``phase_events``), in the order a start goes through
# them; an engine's tracker uses those its log shows.
PHASE_STARTING = "starting"
PHASE_RAY_WAIT = "waiting for Ray placement group"
PHASE_LOADING = "loading weights"
PHASE_COMPILING = "compiling"
PHASE_PROFILING = "profiling"
PHASE_KV_CACHE = "allocating KV cache"
PHASE_CUDA_GRAPHS = "capturing CUDA graphs"
PHASE_API_SERVER = "starting API server"
PHASE_READY = "ready"
PHASE_FAILED = "failed"

PHASE_ORDER = {
    phase: i
    for i, phase in enumerate(
        (
            PHASE_STARTING,
            PHASE_RAY_WAIT,
            PHASE_LOADING,
            PHASE_COMPILING,
            PHASE_PROFILING,
            PHASE_KV_CACHE,
            PHASE_CUDA_GRAPHS,
            PHASE_API_SERVER,
            PHASE_READY,
            PHASE_FAILED,
        )
    )
}

CONTRACT_KEYS: tuple[str, ...] = (
    "state",
    "failure_kind",
    "shards_done",
    "shards_total",
    "model_load_gib",
    "kv_cache_gib",
    "kv_cache_tokens",
    "max_concurrency",
    "port",
    "vllm_version",
)


@dataclass(frozen=True)
class LogReport:
    """What an engine's log says, at the time it was built. ``None`` means "not read"."""

    # the contract (``contract_dict``)
    state: State = "unknown"
    failure_kind: FailureKind | None = None
    shards_done: int | None = None
    shards_total: int | None = None
    model_load_gib: float | None = None
    kv_cache_gib: float | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    port: int | None = None
    vllm_version: str | None = None
    # extras for the console
    phase: str | None = None
    compiling: bool = False
    model: str | None = None
    architecture: str | None = None
    unsupported_architectures: tuple[str, ...] = ()
    unsupported_model_type: str | None = None
    max_model_len: int | None = None
    listen_url: str | None = None
    shard_desc: str | None = None
    shard_percent: int | None = None
    shard_elapsed_s: int | None = None
    shard_eta_s: int | None = None
    shard_rate: str | None = None
    shard_seconds_per_it: float | None = None
    weights_seconds: float | None = None
    load_seconds: float | None = None
    compile_seconds: float | None = None
    cuda_graph_done: int | None = None
    cuda_graph_total: int | None = None
    cuda_graph_mode: str | None = None
    cuda_graph_seconds: float | None = None
    init_engine_seconds: float | None = None
    gpu_blocks: int | None = None
    kv_cache_needed_gib: float | None = None
    estimated_max_model_len: int | None = None
    remote_ips: tuple[str, ...] = ()
    failure_line: str | None = None
    failure_line_no: int | None = None
    failure_node_ip: str | None = None
    # a failure read from a traceback with no recognised cause: its first and last lines
    failure_proof: tuple[str, ...] = ()
    advice: str | None = None
    phase_events: tuple[tuple[str, int], ...] = ()
    restarts: int = 0
    lines: int = 0
    # a merged log of several nodes (``feed(line, source=node)``): the node this report is from,
    # and every node's state in the order first seen (empty for a one-node log)
    node: str | None = None
    node_states: tuple[tuple[str, str], ...] = ()

    def contract_dict(self) -> dict[str, Any]:
        """Exactly the ``sparkconsole parse vllm-log`` JSON object."""
        return {key: getattr(self, key) for key in CONTRACT_KEYS}

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready (tuples become lists)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "phase_events":
                value = [[phase, line_no] for phase, line_no in value]
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out

    @property
    def shard_fraction(self) -> float | None:
        if self.shards_done is None or not self.shards_total:
            return None
        return min(1.0, self.shards_done / self.shards_total)


# how bad a state is, for the merged view: a failed rank is the news, then the least advanced one
_STATE_BADNESS = {"failed": 4, "starting": 3, "loading": 2, "ready": 1, "unknown": 0}


def worst_report(reports: Mapping[str, LogReport], fail_order: Iterable[str] = ()) -> LogReport:
    """The report that stands for several nodes' logs of one deployment, with ``node`` naming
    whose it is and ``node_states`` listing every node's state.

    A failed node wins (the first in ``fail_order``, the nodes in the order they failed, else
    the first failed one listed). Otherwise the least advanced
    node (``starting`` before ``loading``), except that once one node is ``ready`` the deployment
    is: only the head serves the API, so a worker rank (vLLM's ``--headless``, a Ray worker's own
    log, SGLang's rank > 0) never logs the ready line and would otherwise hold it at ``loading``.
    Nodes whose log holds no line of the engine (``unknown``) count only when every node's does not."""
    if not reports:
        return LogReport()
    items = list(reports.items())
    states = tuple((node, r.state) for node, r in items)
    order = {node: i for i, node in enumerate(fail_order)}
    failed = sorted(
        ((node, r) for node, r in items if r.state == "failed"), key=lambda item: order.get(item[0], len(order))
    )
    if failed:
        node, chosen = failed[0]
    elif any(r.state == "ready" for _, r in items):
        node, chosen = next((n, r) for n, r in items if r.state == "ready")
    else:
        node, chosen = max(items, key=lambda item: _STATE_BADNESS[item[1].state])
    return replace(chosen, node=node or None, node_states=states)


class LogTracker(Protocol):
    """An engine's log reader, as the deploy wizard and the log screen use it: lines in as they
    come, the report out at any time. One tracker reads one start (or a merged log of one
    deployment's nodes, each line fed with its node as ``source``)."""

    #: whose log it reads, in the words people read ("vLLM"): the log screen's panel names it
    label: str

    def feed(self, line: str, source: str = "") -> None:
        """One physical line (a trailing newline is fine); ``source`` names the node of a merged log."""
        ...

    def feed_text(self, text: str) -> None:
        """Several whole lines; a last line without a newline is taken as complete."""
        ...

    @property
    def report(self) -> LogReport:
        """What the lines fed so far say."""
        ...


__all__ = [
    "CONTRACT_KEYS",
    "PHASE_ORDER",
    "STATES",
    "FailureKind",
    "LogReport",
    "LogTracker",
    "State",
    "worst_report",
]
