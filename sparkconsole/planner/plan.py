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
from sparkconsole.planner.overheads import rules_for
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
    pp: int = 1  # pipeline stages: each holds a contiguous slice of the layers (nodes = TP x PP)
    gpu_memory_utilization: float = bud.DEFAULT_GMU
    max_model_len: int | None = None
    kv_cache_dtype: str = "auto"
    kv_cache_gib: float | None = None
    kv_blocks: int | None = None  # the KV block count a vLLM start allocated (calibration): bytes per stage
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
    vllm_version: str | None = None   # the overheads' and the KV print's rules (None: the newest known)


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
    vllm_version: str | None = None   # as asked (None: the newest known assumed)

    @property
    def kv_cache_tokens_printed(self) -> int:
        """"GPU KV cache size" as the planned vLLM version prints it (blocks // groups x block before 0.20)."""
        new = rules_for(self.vllm_version).new_kv_print
        return self.capacity.kv_cache_tokens if new else self.capacity.kv_cache_tokens_old

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
        raise UserError(f"--tp {tp}: vLLM needs num_attention_heads ({g.num_heads}) divisible by TP "
                        "(pipeline stages, --pp N, split the layers instead)")
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
    if not 1 <= o.pp <= _MAX_TP:
        raise UserError(f"--pp must be between 1 and {_MAX_TP}, got {o.pp}")
    if o.pp > spec.geometry.num_layers:
        raise UserError(f"--pp {o.pp}: the model has only {spec.geometry.num_layers} layers")
    tp = o.tp or (o.nodes // o.pp if o.nodes else 1) or 1
    nodes = o.nodes or tp * o.pp
    if nodes != tp * o.pp:
        raise UserError(f"--nodes {nodes} with --tp {tp} --pp {o.pp}: a Spark has one GPU, so nodes must equal "
                        "TP x PP")
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


def pp_slices(num_layers: int, pp: int) -> list[range]:
    """The layers of each pipeline stage, as vLLM's ``get_pp_indices`` splits them: equal parts, the
    remainder given to the stages before the last (the first and last also hold embeddings/head)."""
    sizes = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        sizes[-i] += 1
    out, start = [], 0
    for n in sizes:
        out.append(range(start, start + n))
        start += n
    return out


def _stage_spec(spec: ModelSpec, layers: range) -> ModelSpec:
    g = spec.geometry
    geo = dataclasses.replace(g, num_layers=len(layers), layer_kinds=tuple(g.layer_kinds[i] for i in layers),
                              moe_layers=tuple(g.moe_layers[i] for i in layers),
                              mlp_layers=tuple(g.mlp_layers[i] for i in layers))
    return dataclasses.replace(spec, geometry=geo, checkpoint=dataclasses.replace(spec.checkpoint, tensor_bytes=None,
                                                                                  total_size=None))


def _plan_pp(spec: ModelSpec, o: PlanOptions, explore: bool) -> PlanResult:
    """Pipeline parallel: each stage planned on its own slice of the layers (the first stage also
    holds the embeddings and the vision tower, the last the lm_head); vLLM sizes the KV cache per
    worker and admits on the smallest, so the stage with the fewest blocks speaks for the plan."""
    tp, _nodes, _mml = resolve(spec, o)
    whole = estimate_weights(spec, tp, include_vision=not o.language_model_only,
                             include_mtp=o.num_speculative_tokens > 0)
    scale = whole.per_rank_bytes / max(1.0, sum(whole.bytes_per_rank.values()))  # exact sizes when known
    slices = pp_slices(spec.geometry.num_layers, o.pp)
    stages: list[PlanResult] = []
    for k, layers in enumerate(slices):
        sub = _stage_spec(spec, layers)
        w = estimate_weights(sub, tp, include_vision=False, include_mtp=False)
        per = dict(w.bytes_per_rank)
        per.pop("embeddings", None)
        per.pop("lm_head", None)
        if k == 0:
            per["embeddings"] = whole.bytes_per_rank.get("embeddings", 0.0)
            per["vision tower"] = whole.bytes_per_rank.get("vision tower", 0.0)
        if k == len(slices) - 1:
            head = whole.bytes_per_rank.get("lm_head") or whole.bytes_per_rank.get("embeddings", 0.0)
            per["lm_head"] = head
        if o.num_speculative_tokens and k == len(slices) - 1:
            per["MTP draft layers"] = whole.bytes_per_rank.get("MTP draft layers", 0.0)
        r = _plan(sub, dataclasses.replace(o, pp=1, tp=tp, nodes=tp), weights_bytes=sum(per.values()) * scale,
                  explore=False, weights_source=f"pipeline stage {k}: layers {layers.start}-{layers.stop - 1}")
        stages.append(r)
    limiting = min(stages, key=lambda r: (r.fits, r.capacity.num_blocks))
    heaviest = max(stages, key=lambda r: r.weights_gib_per_node)
    res = dataclasses.replace(limiting, nodes=tp * o.pp, fits=all(r.fits for r in stages))
    res.model = spec.model
    k = stages.index(limiting)
    res.reasons = [f"{'fits' if res.fits else 'does not fit'} on {tp * o.pp} Sparks (TP={tp} x PP={o.pp}, "
                   f"{len(slices[0])}-{max(len(x) for x in slices)} layers per stage)",
                   f"the heaviest stage loads {heaviest.weights_gib_per_node:.2f} GiB; stage {k} (layers "
                   f"{slices[k].start}-{slices[k].stop - 1}) has the fewest KV blocks and sets the concurrency",
                   *limiting.reasons[1:]]
    refused = _pp_whole_model_check(spec, o, res, stages, tp)
    if not res.fits and explore:  # never what was asked: no fp8 KV when it is already fp8
        res.ways_out = refused or ["more stages or nodes, a shorter --max-model-len, "
                                   + ("" if o.kv_cache_dtype == "fp8" else "fp8 KV, ") + "or a 4-bit variant"]
        res.reasons += [f"way out: {x}" for x in res.ways_out]
    return res


def _pp_whole_model_check(spec: ModelSpec, o: PlanOptions, res: PlanResult, stages: list[PlanResult],
                          tp: int) -> list[str]:
    """vLLM 0.14.0-0.16.0 refuse a pipeline-parallel start when ONE request of max_model_len, counted
    over the whole model's layers, does not fit the smallest stage's KV memory (overheads.py says
    where; vllm#32105, fixed in 0.17): the plan says so, and gives its ways out (the longest context
    those versions take)."""
    rules = rules_for(o.vllm_version)
    if not rules.pp_whole_model_kv_check or not res.fits:
        return []
    geo = spec.geometry
    whole = kv_layout(geo, tp, o.kv_cache_dtype, o.enable_prefix_caching, o.num_speculative_tokens,
                      o.num_speculative_tokens > 0 and geo.mtp_layers > 0 and spec.checkpoint.has_mtp is not False)
    need = whole.blocks_per_request(res.max_model_len) * whole.bytes_per_block
    avail = min(int(r.budget.kv_gib * GIB) for r in stages)
    if need <= avail:
        return []
    longest = whole.longest_len(avail // whole.bytes_per_block) if whole.bytes_per_block else 0
    res.fits = False
    res.reasons[0] = res.reasons[0].replace("fits", "does not fit", 1)
    res.reasons.insert(1, f"vLLM {rules.version} refuses this start: it checks one request of "
                          f"{res.max_model_len:,} tokens over the whole model's layers ({need / GIB:.2f} GiB of KV) "
                          f"against one stage's KV memory ({avail / GIB:.2f} GiB), although each stage holds only "
                          f"its own layers (vllm#32105; 0.14.0-0.16.0, fixed in 0.17.0)")
    return ["vLLM 0.17 or newer (each stage checked against its own layers)",
            f"--max-model-len {longest:,} or less on this image" if longest > 0 else
            "tensor parallel instead of pipeline stages"]


def _plan(spec: ModelSpec, o: PlanOptions, weights_bytes: float | None = None,
          explore: bool = True, weights_source: str = "4-bit estimate") -> PlanResult:
    if o.pp > 1:
        return _plan_pp(spec, o, explore)
    tp, nodes, mml = resolve(spec, o)
    warnings = bud.check_gmu(o.gpu_memory_utilization, o.force, mml)
    geo = spec.geometry
    spec_tokens = o.num_speculative_tokens
    w = estimate_weights(spec, tp, include_vision=not o.language_model_only, include_mtp=spec_tokens > 0)
    mtp_loaded = spec_tokens > 0 and geo.mtp_layers > 0 and spec.checkpoint.has_mtp is not False
    if weights_bytes is not None:
        w = dataclasses.replace(w, exact_per_rank=weights_bytes, source=weights_source)
    layout = kv_layout(geo, tp, o.kv_cache_dtype, o.enable_prefix_caching, spec_tokens, mtp_loaded)
    node_mem = o.node_memory_gib if o.node_memory_gib is not None else bud.DEFAULT_NODE_MEMORY_GIB
    over = bud.estimate_overheads(tp, o.max_num_batched_tokens, o.activation_gib, o.non_torch_gib,
                                  o.cuda_graph_gib, o.vllm_version)
    kv_given = o.kv_cache_gib if o.kv_blocks is None else o.kv_blocks * layout.bytes_per_block / GIB
    b = bud.kv_budget(node_mem, o.gpu_memory_utilization, w.per_rank_gib, over, kv_given)
    cap = capacity(layout, int(b.kv_gib * GIB), mml)
    ok = bud.fits(b, cap.num_blocks, cap.blocks_per_request)
    res = PlanResult(spec.model, tp, nodes, mml, w, layout, cap, b, ok, warnings=warnings,
                     vllm_version=o.vllm_version)
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
    out.append(f"{verdict} on {where} (vLLM {rules_for(o.vllm_version).version}"
               + (")" if o.vllm_version else ", assumed)"))
    parts = []
    if geo.vision is not None:
        parts.append("LM only" if o.language_model_only else "vision tower included")
    if o.num_speculative_tokens and lay.attn_layers > geo.n_full:
        parts.append(f"{lay.attn_layers - geo.n_full} MTP draft layer(s) included")
    q = geo.quant.label if geo.quant else geo.dtype
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
        if 1 <= longest < r.max_model_len:  # never the length that was asked
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
    if o.pp == 1 and not any(w.startswith("more nodes") for w in ways):
        for pp in (2, 3, 4, 6, 8):  # when TP cannot divide the model (or does not fit): pipeline stages
            alt = _try(spec, dataclasses.replace(o, tp=1, pp=pp, nodes=pp))
            if alt and alt.fits:
                ways.append(f"pipeline stages: --pp {pp} --nodes {pp} fits ({alt.weights_gib_per_node:.1f} GiB "
                            f"weights on the heaviest node, {alt.max_concurrency:.1f}x concurrency)")
                break
    if not weights_fit or r.tp > 1:
        four = four_bit_per_rank(spec, 1, include_vision=not o.language_model_only)
        now = estimate_weights(spec, 1, include_vision=not o.language_model_only,
                               include_mtp=o.num_speculative_tokens > 0).per_rank_bytes
        alt = _try(spec, dataclasses.replace(o, tp=1, nodes=1), weights_bytes=four)
        if alt and alt.fits and four < 0.9 * now:  # not when the checkpoint is already about that size
            ways.append(f"a 4-bit variant (AWQ/GPTQ/NVFP4, about {four / GIB:.1f} GiB) fits on one Spark "
                        f"({alt.max_concurrency:.1f}x concurrency at {alt.max_model_len:,} tokens)")
    if not ways:
        ways.append("no single change found that makes it fit: lower --max-model-len, more nodes and a "
                    "4-bit variant together, or a smaller model")
    return ways


def layout_row(spec: ModelSpec, options: PlanOptions, tp: int, pp: int = 1) -> dict[str, Any]:
    """One row of a layout comparison (TP x PP), an error kept as a row (``error``)."""
    try:
        r = _plan(spec, dataclasses.replace(options, tp=tp, pp=pp, nodes=tp * pp), explore=False)
    except UserError as exc:
        return {"tp": tp, "pp": pp, "nodes": tp * pp, "fits": None, "error": exc.message}
    row = r.to_json()
    row.update(pp=pp, nodes=r.nodes, max_model_len=r.max_model_len, error=None, headline=r.reasons[0],
               blocks_per_request=r.capacity.blocks_per_request)
    return row


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


@dataclass(frozen=True)
class VllmKV:
    """What a vLLM start logs about its KV cache, by the planner's arithmetic (for the simulator,
    and to hold a log against): the layout of the rank with the fewest blocks, the block count
    every rank allocates (the smallest), and the figures as that vLLM version prints them."""

    layout: KVLayout
    capacity: Capacity
    printed_tokens: int        # "GPU KV cache size: N tokens" as ``version`` prints it
    version: str               # the rules used (overheads.rules_for)
    limiting_rank: int
    mamba_padding_pct: float | None  # "Padding mamba page size by X%" (hybrid models)


def vllm_kv(spec: ModelSpec, available_bytes: list[int] | tuple[int, ...], max_model_len: int, tp: int = 1,
            pp: int = 1, kv_cache_dtype: str = "auto", enable_prefix_caching: bool = True,
            num_speculative_tokens: int = 0, vllm_version: str | None = None) -> VllmKV:
    """The KV figures vLLM logs for ``available_bytes`` per rank (rank = stage x TP + TP rank).

    Each worker sizes its pool from its own available memory (``get_num_blocks``:
    ``available // page // layers per group``); the engine then gives every worker the smallest
    count (``get_kv_cache_configs``: "change the num_blocks of each rank to the smallest"), so
    concurrency is that count over the blocks one request takes, and "GPU KV cache size" is
    ``blocks // groups x block`` before 0.20 and ``int(concurrency x max_model_len)`` from 0.20.
    With PP each stage holds only its slice of the layers (:func:`pp_slices`)."""
    rules = rules_for(vllm_version)
    geo = spec.geometry
    mtp = num_speculative_tokens > 0 and geo.mtp_layers > 0 and spec.checkpoint.has_mtp is not False
    slices = pp_slices(geo.num_layers, pp) if pp > 1 else [range(geo.num_layers)]
    layouts = []
    for k, layers in enumerate(slices):
        g = _stage_spec(spec, layers).geometry if pp > 1 else geo
        layouts.append(kv_layout(g, tp, kv_cache_dtype, enable_prefix_caching, num_speculative_tokens,
                                 mtp and k == len(slices) - 1))
    per_rank = []
    for rank, avail in enumerate(available_bytes):
        lay = layouts[min(rank // max(1, tp), len(layouts) - 1)]
        per_rank.append((capacity(lay, int(avail), max_model_len).num_blocks, rank, lay))
    blocks, rank, lay = min(per_rank, key=lambda x: (x[0], x[1]))
    cap = capacity(lay, blocks * lay.bytes_per_block, max_model_len)
    printed = cap.kv_cache_tokens if rules.new_kv_print else cap.kv_cache_tokens_old
    pad = None
    if lay.state_layers and lay.attn_layers and lay.state_page_bytes:
        pad = (lay.page_bytes - lay.state_page_bytes) / lay.state_page_bytes * 100
    return VllmKV(lay, cap, printed, rules.version, rank, pad)
