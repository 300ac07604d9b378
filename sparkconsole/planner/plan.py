"""``plan(spec, options) -> PlanResult``: will this model fit, and what context and concurrency
does what is left buy? The façade the CLI (``sparkconsole plan``) and the TUI planner panel use.

One GPU per node (a Spark has one), so ``nodes == tp`` and every figure is per node = per rank.
:func:`compare_tp` gives the TP=1 vs TP=N rows the deployment wizard shows side by side.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from sparkconsole.errors import UserError
from sparkconsole.planner import budget as bud
from sparkconsole.planner.kv import Capacity, KVLayout, capacity, kv_layout
from sparkconsole.planner.spec import ModelSpec
from sparkconsole.planner.weights import GIB, WeightEstimate, estimate_weights, four_bit_per_rank

MIB = 1 << 20
JSON_KEYS = (
    "model", "tp", "weights_gib_per_node", "kv_cache_gib_per_node", "kv_bytes_per_token_per_node",
    "state_bytes_per_request_per_node", "block_size_tokens", "num_blocks", "max_concurrency",
    "kv_cache_tokens", "fits", "reasons",
)
_MAX_TP = 64


def node_memory_from_cluster(cluster: Any = None, *, timeout: float = 20.0) -> float | None:
    """Node memory (GiB) from the live nodes of a configured cluster: the smallest MemTotal, as
    vLLM's executor takes the minimum across ranks. None without a cluster, or when no node could
    be read (the plan then uses 121.69 GiB).

    ``cluster`` is a :class:`~sparkconsole.config.ClusterConfig`. This probes the nodes once in a
    fresh event loop; inside a running loop use :func:`sparkconsole.planner.live.probe_node_memory`
    (which also gives the reasons: :meth:`~sparkconsole.planner.live.LiveMemory.notes`).
    """
    if cluster is None or not getattr(cluster, "nodes", None):
        return None
    import asyncio

    from sparkconsole.planner.live import probe_node_memory

    return asyncio.run(probe_node_memory(cluster, timeout=timeout)).gib


@dataclass(frozen=True)
class PlanOptions:
    tp: int | None = None
    nodes: int | None = None
    gpu_memory_utilization: float = bud.DEFAULT_GMU
    max_model_len: int | None = None
    kv_cache_dtype: str = "auto"
    kv_cache_gib: float | None = None
    node_memory_gib: float | None = None
    enable_prefix_caching: bool = True
    num_speculative_tokens: int = 0
    language_model_only: bool = False
    max_num_batched_tokens: int = bud.ACTIVATION_REF_TOKENS
    activation_gib: float | None = None
    non_torch_gib: float | None = None
    cuda_graph_gib: float | None = None
    force: bool = False
    node_memory_notes: tuple[str, ...] = ()  # where node memory came from (live nodes), in plain words


@dataclass
class PlanResult:
    model: str
    tp: int
    nodes: int
    max_model_len: int
    weights: WeightEstimate
    layout: KVLayout
    capacity: Capacity
    budget: bud.Budget
    fits: bool
    reasons: list[str] = field(default_factory=list)
    ways_out: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def weights_gib_per_node(self) -> float:
        return self.weights.per_rank_gib

    @property
    def kv_cache_gib_per_node(self) -> float:
        return self.budget.kv_gib

    @property
    def max_concurrency(self) -> float:
        return self.capacity.max_concurrency

    def to_json(self) -> dict[str, Any]:
        """Exactly the keys of the ``sparkconsole plan --json`` contract."""
        return {
            "model": self.model,
            "tp": self.tp,
            "weights_gib_per_node": round(self.weights_gib_per_node, 3),
            "kv_cache_gib_per_node": round(self.kv_cache_gib_per_node, 3),
            "kv_bytes_per_token_per_node": self.layout.kv_bytes_per_token,
            "state_bytes_per_request_per_node": self.layout.state_bytes_per_request,
            "block_size_tokens": self.layout.block_size,
            "num_blocks": self.capacity.num_blocks,
            "max_concurrency": round(self.capacity.max_concurrency, 2),
            "kv_cache_tokens": self.capacity.kv_cache_tokens,
            "fits": self.fits,
            "reasons": list(self.reasons),
        }


def _finite(name: str, v: float | None, lo: float, hi: float) -> None:
    if v is not None and (not math.isfinite(v) or v < lo or v > hi):
        raise UserError(f"{name} must be between {lo:g} and {hi:g}, got {v}")


def _check_tp(spec: ModelSpec, tp: int) -> None:
    g = spec.geometry
    if g.num_heads % tp:
        raise UserError(f"--tp {tp}: vLLM needs num_attention_heads ({g.num_heads}) divisible by TP")
    if g.mla is None and g.n_full and g.num_kv_heads % tp and tp % g.num_kv_heads:
        raise UserError(f"--tp {tp}: num_key_value_heads ({g.num_kv_heads}) and TP must divide one another")
    for name, n in (("linear_num_key_heads", g.linear.k_heads if g.linear else 0),
                    ("linear_num_value_heads", g.linear.v_heads if g.linear else 0),
                    ("mamba_num_heads", g.mamba.n_heads if g.mamba else 0)):
        if n and n % tp:
            raise UserError(f"--tp {tp}: {name} ({n}) is not divisible by TP")


def resolve(spec: ModelSpec, o: PlanOptions) -> tuple[int, int, int]:
    """Validated (tp, nodes, max_model_len)."""
    for name, v in (("--tp", o.tp), ("--nodes", o.nodes)):
        if v is not None and not 1 <= v <= _MAX_TP:
            raise UserError(f"{name} must be between 1 and {_MAX_TP}, got {v}")
    tp = o.tp or o.nodes or 1
    nodes = o.nodes or tp
    if nodes != tp:
        raise UserError(f"--nodes {nodes} with --tp {tp}: a Spark has one GPU, so nodes must equal TP")
    _check_tp(spec, tp)
    limit = spec.geometry.max_position
    mml = o.max_model_len if o.max_model_len is not None else limit
    if not 1 <= mml <= limit:
        raise UserError(f"--max-model-len must be between 1 and the model's {limit:,} tokens, got {mml}")
    if o.kv_cache_dtype not in ("auto", "fp8"):
        raise UserError(f"--kv-cache-dtype must be auto or fp8, got {o.kv_cache_dtype!r}")
    if not 0 <= o.num_speculative_tokens <= 32:
        raise UserError(f"--num-speculative-tokens must be between 0 and 32, got {o.num_speculative_tokens}")
    if not 1 <= o.max_num_batched_tokens <= 1 << 24:
        raise UserError("--max-num-batched-tokens must be positive")
    _finite("--kv-cache-gib", o.kv_cache_gib, 1e-6, 1e6)
    _finite("--node-memory-gib", o.node_memory_gib, 1, 1e6)
    for name, v in (("--activation-gib", o.activation_gib), ("--non-torch-gib", o.non_torch_gib),
                    ("--cuda-graph-gib", o.cuda_graph_gib)):
        _finite(name, v, 0, 1e6)
    return tp, nodes, mml


def _plan(spec: ModelSpec, o: PlanOptions, weights_bytes: float | None = None,
          explore: bool = True) -> PlanResult:
    tp, nodes, mml = resolve(spec, o)
    warnings = bud.check_gmu(o.gpu_memory_utilization, o.force)
    geo = spec.geometry
    spec_tokens = o.num_speculative_tokens
    w = estimate_weights(spec, tp, include_vision=not o.language_model_only, include_mtp=spec_tokens > 0)
    mtp_loaded = spec_tokens > 0 and geo.mtp_layers > 0 and spec.checkpoint.has_mtp is not False
    if weights_bytes is not None:
        w = dataclasses.replace(w, exact_per_rank=weights_bytes, source="4-bit estimate")
    layout = kv_layout(geo, tp, o.kv_cache_dtype, o.enable_prefix_caching, spec_tokens, mtp_loaded)
    node_mem = o.node_memory_gib if o.node_memory_gib is not None else bud.DEFAULT_NODE_MEMORY_GIB
    over = bud.estimate_overheads(tp, o.max_num_batched_tokens, o.activation_gib, o.non_torch_gib,
                                  o.cuda_graph_gib)
    b = bud.kv_budget(node_mem, o.gpu_memory_utilization, w.per_rank_gib, over, o.kv_cache_gib)
    cap = capacity(layout, int(b.kv_gib * GIB), mml)
    ok = bud.fits(b, cap.num_blocks, cap.blocks_per_request)
    res = PlanResult(spec.model, tp, nodes, mml, w, layout, cap, b, ok, warnings=warnings)
    res.reasons = _reasons(spec, o, res)
    if not ok and explore:
        res.ways_out = _ways_out(spec, o, res)
        res.reasons += [f"way out: {x}" for x in res.ways_out]
    return res


def plan(spec: ModelSpec, options: PlanOptions | None = None) -> PlanResult:
    """Plan ``spec`` under ``options``. Raises :class:`UserError` on options vLLM would refuse."""
    return _plan(spec, options or PlanOptions())


def _reasons(spec: ModelSpec, o: PlanOptions, r: PlanResult) -> list[str]:
    geo, lay, cap, b = spec.geometry, r.layout, r.capacity, r.budget
    out: list[str] = []
    verdict = "fits" if r.fits else "does not fit"
    where = "one Spark" if r.tp == 1 else f"{r.nodes} Sparks (TP={r.tp}, one rank per node)"
    out.append(f"{verdict} on {where}")
    parts = []
    if geo.vision is not None:
        parts.append("LM only" if o.language_model_only else "vision tower included")
    if o.num_speculative_tokens and lay.attn_layers > geo.n_full:
        parts.append(f"{lay.attn_layers - geo.n_full} MTP draft layer(s) included")
    q = geo.quant.method.upper() if geo.quant else geo.dtype
    out.append(f"weights: {r.weights_gib_per_node:.2f} GiB per node ({q}; {', '.join(parts) or 'text model'};"
               f" from {r.weights.source}; {r.weights.total_params / 1e9:.1f}B parameters)")
    if not b.given and b.weights_gib + b.overheads.total_gib > b.requested_gib:
        out.append(f"weights {b.weights_gib:.2f} GiB + overheads {b.overheads.total_gib:.2f} GiB exceed the "
                   f"{b.requested_gib:.2f} GiB that gpu_memory_utilization {b.gmu:g} allows of "
                   f"{b.node_memory_gib:.2f} GiB")
        if b.weights_gib > b.node_memory_gib:
            out.append(f"the weights alone ({b.weights_gib:.2f} GiB) are more than the whole node "
                       f"({b.node_memory_gib:.2f} GiB)")
    out.append(b.describe())
    out += list(o.node_memory_notes)
    kvb = "fp8" if lay.kv_dtype == "fp8" else lay.kv_dtype
    out.append(f"KV cache: {lay.kv_bytes_per_token:,} bytes per token per node ({lay.attn_layers} attention "
               f"layers, {kvb})")
    if lay.state_layers:
        factor = lay.state_blocks_per_request
        mode = "prefix caching 'align' mode" if o.enable_prefix_caching else "no prefix caching"
        out.append(f"state: {lay.state_bytes_per_request / MIB:.1f} MiB per request per node over "
                   f"{lay.state_layers} linear-attention layers, booked {factor}x ({mode}"
                   + (f", +{o.num_speculative_tokens} speculative" if o.num_speculative_tokens else "") + ")")
        out.append(f"hybrid layout: attention block {lay.block_size:,} tokens (page {lay.page_bytes:,} B = "
                   f"one state page padded), {lay.num_groups} KV-cache groups of {lay.group_size}"
                   + (f", {lay.padding_layers} padding layers" if lay.padding_layers else ""))
    if cap.num_blocks or b.kv_gib > 0:
        detail = (f"{lay.attn_groups * -(-r.max_model_len // lay.block_size)} attention + "
                  f"{lay.state_groups * lay.state_blocks_per_request} state" if lay.state_layers else "attention")
        out.append(f"{cap.num_blocks:,} blocks of {lay.block_size:,} tokens; one request of "
                   f"{r.max_model_len:,} tokens takes {cap.blocks_per_request:,} ({detail}); max concurrency "
                   f"{cap.max_concurrency:.2f}x, KV cache size {cap.kv_cache_tokens:,} tokens "
                   f"(older vLLM prints {cap.kv_cache_tokens_old:,})")
    if b.kv_gib > 0 and cap.num_blocks < cap.blocks_per_request:
        out.append(f"one request of {r.max_model_len:,} tokens needs {cap.blocks_per_request:,} blocks but only "
                   f"{cap.num_blocks:,} fit: vLLM refuses to start")
    out += list(spec.notes) + list(r.weights.notes) + list(lay.notes)
    if not b.given:
        out.append(b.overheads.note)
    out += r.warnings
    out += bud.gb10_notes()
    return out


def _try(spec: ModelSpec, o: PlanOptions, weights_bytes: float | None = None) -> PlanResult | None:
    try:
        return _plan(spec, o, weights_bytes, explore=False)
    except UserError:
        return None


def _ways_out(spec: ModelSpec, o: PlanOptions, r: PlanResult) -> list[str]:
    """The cheapest changes that make it fit, cheapest first."""
    ways: list[str] = []
    lay, cap, b = r.layout, r.capacity, r.budget
    weights_fit = b.given or b.kv_gib > 0
    if weights_fit:
        longest = min(lay.longest_len(cap.num_blocks), spec.geometry.max_position)
        if longest >= 1:
            ways.append(f"a shorter context: --max-model-len {longest:,} fits one request")
        if lay.kv_dtype != "fp8":
            alt = _try(spec, dataclasses.replace(o, kv_cache_dtype="fp8"))
            if alt and alt.fits:
                ways.append(f"fp8 KV cache: --kv-cache-dtype fp8 fits ({alt.max_concurrency:.2f}x concurrency)")
    if not o.language_model_only and spec.geometry.vision is not None:
        alt = _try(spec, dataclasses.replace(o, language_model_only=True))
        if alt and alt.fits:
            ways.append("text only: --language-model-only skips the vision tower and fits")
    for tp in (2, 4, 8, 16):
        if tp <= r.tp:
            continue
        alt = _try(spec, dataclasses.replace(o, tp=tp, nodes=tp))
        if alt and alt.fits:
            ways.append(f"more nodes: --tp {tp} --nodes {tp} fits ({alt.weights_gib_per_node:.1f} GiB weights per "
                        f"node, {alt.max_concurrency:.1f}x concurrency at {alt.max_model_len:,} tokens)")
            break
    if not weights_fit or r.tp > 1:
        four = four_bit_per_rank(spec, 1, include_vision=not o.language_model_only)
        alt = _try(spec, dataclasses.replace(o, tp=1, nodes=1), weights_bytes=four)
        if alt and alt.fits:
            ways.append(f"a 4-bit variant (AWQ/GPTQ/NVFP4, about {four / GIB:.1f} GiB) fits on one Spark "
                        f"({alt.max_concurrency:.1f}x concurrency at {alt.max_model_len:,} tokens)")
    if not ways:
        ways.append("no single change found that makes it fit: lower --max-model-len, more nodes and a "
                    "4-bit variant together, or a smaller model")
    return ways


def compare_tp(spec: ModelSpec, options: PlanOptions | None = None,
               tps: tuple[int, ...] | None = None) -> list[dict[str, Any]]:
    """Rows for the TP=1 vs TP=N panel: one dict per TP, errors kept as rows (``error``)."""
    o = options or PlanOptions()
    if tps is None:
        n = o.tp or o.nodes or 1
        tps = (1, n if n > 1 else 2)
    rows: list[dict[str, Any]] = []
    for tp in dict.fromkeys(tps):
        try:
            r = _plan(spec, dataclasses.replace(o, tp=tp, nodes=tp), explore=False)
        except UserError as exc:
            rows.append({"tp": tp, "nodes": tp, "fits": None, "error": exc.message})
            continue
        row = r.to_json()
        row.update(nodes=r.nodes, max_model_len=r.max_model_len, error=None,
                   headline=r.reasons[0], blocks_per_request=r.capacity.blocks_per_request)
        rows.append(row)
    return rows
