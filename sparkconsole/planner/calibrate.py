"""Plans calibrated from what vLLM logged on the node itself (``sparkconsole plan ... --from-log``).

A start of vLLM measures what the planner can only estimate: the weights it loaded ("Model loading
took W GiB"), the KV budget left ("Available KV cache memory: K GiB"), where printed the activation
peak, non-torch and CUDA-graph memory ("Actual usage is ..."; 0.6-0.9 "Memory profiling results"),
the KV block size ("Setting attention block size to N tokens") and the capacity ("GPU KV cache
size: T tokens", "Maximum concurrency for L tokens per request: Cx").

:func:`read_log` takes those figures (and the settings of that start: gmu, TP, max_model_len, KV
dtype, prefix caching, vLLM version) from the log text; :func:`calibrate` finds the block count
that reproduces every logged capacity figure with the planner's KV layout (the printed figures
are rounded, so the count is the one consistent with all of them), shows planner against log, and
re-plans another ``--max-model-len``, ``--gpu-memory-utilization`` or TP from the measured figures:

- same TP: KV bytes = blocks x bytes per block (what vLLM allocated), plus ``(gmu' - gmu) x total``;
- another TP: weights = logged x (planned at TP' / planned at the logged TP), overheads as logged
  (or, when not itemised, the whole measured rest ``gmu x total - weights - KV`` as activation).

A configuration the log shows vLLM ran (KV cache allocated, not failed) is never "does not fit".
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sparkconsole.errors import UserError
from sparkconsole.logs.vllm import parse_vllm_log
from sparkconsole.planner.budget import DEFAULT_NODE_MEMORY_GIB
from sparkconsole.planner.kv import kv_layout
from sparkconsole.planner.overheads import rules_for
from sparkconsole.planner.plan import PlanOptions, PlanResult, _plan, _stage_spec, pp_slices, resolve
from sparkconsole.planner.spec import ModelSpec
from sparkconsole.planner.weights import GIB, estimate_weights

_NUM = r"(\d+(?:\.\d+)?)"
_ANSI = re.compile(r"\x1b\[[0-9;]*m|\[\d{1,3}(?:;\d{1,3})*m")
_PATTERNS: dict[str, re.Pattern[str]] = {
    "block_size": re.compile(r"Setting attention block size to (\d+) tokens"),
    "padding_layers": re.compile(r"Add (\d+) padding layers"),
    "actual": re.compile(rf"Actual usage is {_NUM} GiB for weight, {_NUM} GiB for peak activation, {_NUM} GiB "
                         rf"for non-torch memory(?:, and {_NUM} GiB for CUDAGraph memory)?"),
    "free_total": re.compile(rf"Free memory on device \({_NUM}/{_NUM} GiB\)"),
    "desired": re.compile(rf"Desired GPU memory utilization is \({_NUM}, {_NUM} GiB\)"),
    "graph_est": re.compile(rf"Estimated CUDA graph memory: {_NUM} GiB"),
    "graph_took": re.compile(rf"Graph capturing finished in \d+ secs?, took {_NUM} GiB"),
    "v06": re.compile(rf"total_gpu_memory={_NUM}GiB.*?peak_torch_memory={_NUM}GiB.*?non_torch_memory={_NUM}GiB"),
    "v07": re.compile(rf"total_gpu_memory \({_NUM}GiB\) x gpu_memory_utilization \({_NUM}\)"),
    "v07_parts": re.compile(rf"non_torch_memory takes {_NUM}GiB; PyTorch activation peak memory takes {_NUM}GiB"),
    "nbt": re.compile(r"max_num_batched_tokens=(\d+)"),
    "tp": re.compile(r"tensor_parallel_size[=:]\s*'?(\d+)"),
    "pp": re.compile(r"pipeline_parallel_size[=:]\s*'?(\d+)"),
    "gmu": re.compile(rf"'gpu_memory_utilization': {_NUM}|gpu_memory_utilization[=:]\s*{_NUM}"),
    "kvdt": re.compile(r"kv_cache_dtype[=:]\s*'?(\w+)"),
    "prefix": re.compile(r"enable_prefix_caching[=:]\s*'?(True|False)"),
    "mml": re.compile(r"'max_model_len': (\d+)|max_seq_len=(\d+)"),
}
# one rank's lines: Ray workers "(RayWorkerWrapper pid=M[, ip=A])", multiproc "(VllmWorker TP1 pid=M)",
# "(Worker_TP1 pid=M)" / "(Worker pid=M)"; anything else is the driver's own worker
_RANK = re.compile(r"\((?:RayWorkerWrapper|VllmWorker|Worker)[^()]*\)")
_RANK_KV = re.compile(rf"Available KV cache memory: {_NUM} GiB")
_RANK_W = re.compile(rf"Model loading took {_NUM} ?GiB")
_START = re.compile(r"vLLM API server version|Initializing a V1 LLM engine|Initializing an LLM engine|"
                    r"█ +version \S+")


@dataclass(frozen=True)
class Logged:
    """What one vLLM start logged; None: not in the log."""

    state: str = "unknown"
    failure_kind: str | None = None
    vllm_version: str | None = None
    model: str | None = None
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    tp: int | None = None
    pp: int | None = None
    kv_cache_dtype: str | None = None
    enable_prefix_caching: bool | None = None
    max_num_batched_tokens: int | None = None
    total_gib: float | None = None
    weights_gib: float | None = None
    kv_gib: float | None = None
    kv_tokens: int | None = None
    max_concurrency: float | None = None
    gpu_blocks: int | None = None               # v0.6 "# GPU blocks: N": the count itself
    block_size: int | None = None
    padding_layers: int | None = None
    activation_gib: float | None = None
    non_torch_gib: float | None = None
    cuda_graph_gib: float | None = None        # subtracted from the budget (newer vLLM)
    cuda_graph_captured_gib: float | None = None  # "Graph capturing finished ..., took X GiB"
    kv_gib_ranks: tuple[tuple[str, float], ...] = ()  # (rank prefix, its "Available KV cache memory")

    @property
    def ran(self) -> bool:
        """vLLM allocated its KV cache for this configuration and did not fail."""
        return self.state != "failed" and (self.kv_tokens is not None or self.max_concurrency is not None)


def read_log(text: str) -> Logged:
    """The memory figures and settings of the LAST start in ``text`` (never raises)."""
    if not isinstance(text, str):
        return Logged()
    rep = parse_vllm_log(text)
    found: dict[str, Any] = {}
    kv_by_rank: dict[str, float] = {}
    w_by_rank: dict[str, float] = {}
    for raw in text.splitlines():
        line = _ANSI.sub("", raw)
        if _START.search(line):  # a new start: only the last one's ranks count
            kv_by_rank.clear()
            w_by_rank.clear()
        for pat, into in ((_RANK_KV, kv_by_rank), (_RANK_W, w_by_rank)):
            m = pat.search(line)
            if m:
                r = _RANK.search(line[:m.start()])
                try:
                    into[r.group(0) if r else "(driver)"] = float(m.group(1))
                except ValueError:
                    pass
        for key, pat in _PATTERNS.items():
            m = pat.search(line)
            if m:
                found[key] = [g for g in m.groups()]
    def f(key: str, i: int = 0) -> float | None:
        g = found.get(key)
        try:
            return float(g[i]) if g and g[i] is not None else None
        except (ValueError, IndexError):
            return None
    weights, act, nontorch, graphs, total = rep.model_load_gib, None, None, None, None
    if "actual" in found:
        weights = f("actual", 0) or weights
        act, nontorch, graphs = f("actual", 1), f("actual", 2), f("actual", 3)
    if "v06" in found:
        total = f("v06", 0)
        if weights is not None and f("v06", 1) is not None:
            act = max(0.0, (f("v06", 1) or 0) - weights)
        nontorch = f("v06", 2)
    if "v07_parts" in found:
        nontorch, act = f("v07_parts", 0), f("v07_parts", 1)
    total = f("free_total", 1) or f("v07", 0) or total
    gmu = f("desired", 0) or f("gmu", 0) or f("gmu", 1) or f("v07", 1)
    kv = rep.kv_cache_gib
    if kv_by_rank:
        # vLLM admits on the smallest rank: every worker gets the block count of the tightest one
        tight = min(kv_by_rank, key=lambda k: (kv_by_rank[k], k))
        kv = kv_by_rank[tight]
        if len(kv_by_rank) > 1 and tight in w_by_rank and "actual" not in found:
            weights = w_by_rank[tight]
    mml_g = found.get("mml")
    mml = rep.max_model_len or (int(next(x for x in mml_g if x)) if mml_g else None)
    prefix = found.get("prefix")
    return Logged(
        state=rep.state, failure_kind=rep.failure_kind, vllm_version=rep.vllm_version, model=rep.model,
        max_model_len=mml, gpu_memory_utilization=gmu,
        tp=int(f("tp")) if f("tp") else None, pp=int(f("pp")) if f("pp") else None,
        kv_cache_dtype=("fp8" if str(found["kvdt"][0]).startswith("fp8") else "auto") if "kvdt" in found else None,
        enable_prefix_caching=(prefix[0] == "True") if prefix else None,
        max_num_batched_tokens=int(f("nbt")) if f("nbt") else None,
        total_gib=total, weights_gib=weights, kv_gib=kv, kv_tokens=rep.kv_cache_tokens,
        max_concurrency=rep.max_concurrency, gpu_blocks=rep.gpu_blocks, block_size=int(f("block_size")) if f("block_size") else None,
        padding_layers=int(f("padding_layers")) if f("padding_layers") is not None else None,
        activation_gib=act, non_torch_gib=nontorch,
        cuda_graph_gib=graphs if graphs is not None else None,
        cuda_graph_captured_gib=f("graph_took") or f("graph_est"),
        kv_gib_ranks=tuple(sorted(kv_by_rank.items(), key=lambda x: (x[1], x[0]))),
    )


@dataclass
class Calibration:
    logged: Logged
    at_log: PlanResult                 # the planner's own estimate at the logged settings
    calibrated: PlanResult             # the logged start, re-planned from the measured figures
    replan: PlanResult | None          # the requested change, from the measured figures
    num_blocks: int | None             # the block count consistent with every logged figure
    reproduced: dict[str, bool] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def rows(self) -> list[tuple[str, str, str]]:
        """(figure, planner estimate, logged) rows for the side-by-side table."""
        lg, p, c = self.logged, self.at_log, self.calibrated

        def g(v: float | None) -> str:
            return "-" if v is None else f"{v:.2f} GiB"
        kv_tok = c.capacity.kv_cache_tokens if rules_for(lg.vllm_version).new_kv_print else \
            c.capacity.kv_cache_tokens_old
        return [
            ("weights per node", g(p.weights_gib_per_node), g(lg.weights_gib)),
            ("KV budget per node", g(p.kv_cache_gib_per_node), g(lg.kv_gib)),
            ("block size", f"{p.layout.block_size:,}", "-" if lg.block_size is None else f"{lg.block_size:,}"),
            ("blocks", f"{p.capacity.num_blocks:,}", "-" if self.num_blocks is None else f"{self.num_blocks:,} (derived)"),
            ("max concurrency", f"{p.capacity.max_concurrency:.2f}x",
             "-" if lg.max_concurrency is None else f"{lg.max_concurrency:.2f}x"),
            ("GPU KV cache size", f"{kv_tok:,} tokens (calibrated)",
             "-" if lg.kv_tokens is None else f"{lg.kv_tokens:,} tokens"),
        ]

    def to_json(self) -> dict[str, Any]:
        return {"logged": dataclasses.asdict(self.logged), "num_blocks": self.num_blocks,
                "reproduced": dict(self.reproduced), "rows": [list(r) for r in self.rows()],
                "calibrated": self.calibrated.to_json(),
                "replan": self.replan.to_json() if self.replan else None, "notes": list(self.notes)}


def _blocks_consistent(lg: Logged, layout: Any, mml: int, new_print: bool, bpb: int) -> list[int]:
    """Block counts that reproduce every capacity figure the log printed (rounded as printed).
    ``bpb``: the bytes of one block on the rank whose "Available KV cache memory" was logged (the
    whole model's layout; under PP the tightest stage's)."""
    per_req = layout.blocks_per_request(mml)
    groups, block = layout.num_groups, layout.block_size
    if lg.gpu_blocks is not None:
        return [lg.gpu_blocks]
    printed = lg.kv_tokens is not None or lg.max_concurrency is not None
    # under PP every stage logs its own KV GiB for its own layers; the capacity lines (printed once, by
    # the engine core, for the one block pool) do not depend on how the layers are split: use them
    if lg.kv_gib is not None and bpb and ((lg.pp or 1) == 1 or not printed):
        lo = int(max(0.0, lg.kv_gib - 0.005) * GIB) // bpb
        hi = int((lg.kv_gib + 0.005) * GIB) // bpb
    elif lg.kv_tokens is not None and block and groups:
        lo, hi = max(0, lg.kv_tokens // block * groups - groups), lg.kv_tokens // block * groups + 2 * groups
        if new_print and per_req:
            lo, hi = int(lg.kv_tokens / mml * per_req) - 2, int(lg.kv_tokens / mml * per_req) + 2
    else:
        return []
    out = []
    for n in range(max(0, lo), hi + 1):
        conc = n / per_req if per_req else 0.0
        if lg.max_concurrency is not None and f"{conc:.2f}" != f"{lg.max_concurrency:.2f}":
            continue
        if lg.kv_tokens is not None:
            printed = int(conc * mml) if new_print else (n // groups) * block if groups else 0
            if printed != lg.kv_tokens:
                continue
        out.append(n)
    return out


def calibrate(spec: ModelSpec, lg: Logged, base: PlanOptions, change: Mapping[str, Any] | None = None) -> Calibration:
    """Planner against log at the logged settings, the block count behind the logged figures, and
    a re-plan of ``change`` (keys ``max_model_len``, ``gpu_memory_utilization``, ``tp``)."""
    if lg.weights_gib is None and lg.kv_gib is None and lg.kv_tokens is None and lg.max_concurrency is None:
        raise UserError("the log holds no vLLM memory figures (Model loading took / Available KV cache memory / "
                        "GPU KV cache size / Maximum concurrency)")
    change = dict(change or {})
    version = base.vllm_version or lg.vllm_version
    at = dataclasses.replace(
        base, tp=lg.tp or base.tp, nodes=None if lg.tp else base.nodes, vllm_version=version,
        max_model_len=lg.max_model_len or base.max_model_len,
        gpu_memory_utilization=lg.gpu_memory_utilization or base.gpu_memory_utilization,
        kv_cache_dtype=lg.kv_cache_dtype or base.kv_cache_dtype,
        enable_prefix_caching=base.enable_prefix_caching if lg.enable_prefix_caching is None
        else lg.enable_prefix_caching,
        max_num_batched_tokens=lg.max_num_batched_tokens or base.max_num_batched_tokens,
        node_memory_gib=lg.total_gib or base.node_memory_gib, force=True)
    if lg.pp is not None:  # the logged layout wins over the options' --pp
        at = dataclasses.replace(at, pp=lg.pp, nodes=None if lg.pp > 1 else at.nodes)
    tp, _nodes, mml = resolve(spec, at)
    est = _plan(spec, at, explore=False)
    rules = rules_for(version)
    notes = [f"calibrated from a vLLM {lg.vllm_version or '(version not logged)'} start "
             f"({'it ran' if lg.ran else lg.state}); " + rules.note]
    geo = spec.geometry
    layout = kv_layout(geo, tp, at.kv_cache_dtype, at.enable_prefix_caching, at.num_speculative_tokens,
                       at.num_speculative_tokens > 0 and geo.mtp_layers > 0)
    if lg.block_size is not None and lg.block_size != layout.block_size:
        notes.append(f"the log's attention block ({lg.block_size:,} tokens) is not the planner's "
                     f"({layout.block_size:,}): the config does not describe what vLLM ran (another model, "
                     "--block-size, or a kernel alignment other than 16)")
    pp = at.pp
    # the bytes of one block on the rank that sets the count: under PP the stage whose layers need the most
    bpb_rank = layout.bytes_per_block if pp == 1 else max(
        kv_layout(_stage_spec(spec, r).geometry, tp, at.kv_cache_dtype, at.enable_prefix_caching).bytes_per_block
        for r in pp_slices(geo.num_layers, pp))
    if pp > 1:
        notes.append(f"pipeline parallel ({pp} stages of {geo.num_layers} layers): the block count is taken from "
                     "the capacity lines the engine core prints once; each stage holds it for its own layers, "
                     "and the stages' weights are the planner's")
    cands = _blocks_consistent(lg, layout, mml, rules.new_kv_print, bpb_rank)
    n = cands[0] if cands else None
    total = at.node_memory_gib or DEFAULT_NODE_MEMORY_GIB
    weights = lg.weights_gib if lg.weights_gib is not None else est.weights_gib_per_node
    if n is None:
        notes.append("no block count reproduces every logged figure with this config: the KV figures are "
                     "re-planned from the logged KV GiB")
        kv_bytes = (lg.kv_gib if lg.kv_gib is not None else est.kv_cache_gib_per_node) * GIB
    else:
        kv_bytes = n * bpb_rank
    kv_at = dict(kv_blocks=n) if n is not None else dict(kv_cache_gib=kv_bytes / GIB)
    cal = _plan(spec, dataclasses.replace(at, **kv_at), weights_bytes=weights * GIB,
                explore=False, weights_source="the log (Model loading took)")
    if lg.ran and not cal.fits:  # what vLLM ran is never "does not fit"
        cal.fits = True
        cal.reasons[0] = cal.reasons[0].replace("does not fit", "fits", 1)
    if lg.ran:
        cal.reasons.insert(1, "vLLM ran this configuration (the log shows its KV cache allocated)")
    new_tok = cal.capacity.kv_cache_tokens if rules.new_kv_print else cal.capacity.kv_cache_tokens_old
    reproduced = {}
    if lg.kv_tokens is not None:
        reproduced["kv_cache_tokens"] = new_tok == lg.kv_tokens
    if lg.max_concurrency is not None:
        reproduced["max_concurrency"] = f"{cal.capacity.max_concurrency:.2f}" == f"{lg.max_concurrency:.2f}"
    # the measured rest: what the budget held besides weights and KV
    measured_rest = None
    if lg.gpu_memory_utilization and lg.kv_gib is not None and lg.weights_gib is not None and lg.total_gib:
        measured_rest = lg.gpu_memory_utilization * lg.total_gib - lg.weights_gib - lg.kv_gib
    # a change to what was logged is no change (a re-plan of the same settings would repeat the request)
    same = {"max_model_len": mml, "gpu_memory_utilization": at.gpu_memory_utilization, "tp": tp}
    change = {k: v for k, v in change.items() if v is not None and v != same.get(k)}
    replan = None
    if change:
        tgt = dataclasses.replace(at, **{k: v for k, v in change.items() if v is not None and k != "tp"}, force=base.force)
        new_tp = change.get("tp") or tp
        if new_tp == tp:
            extra = (tgt.gpu_memory_utilization - at.gpu_memory_utilization) * total * GIB
            kv_new = dict(kv_blocks=max(0, n + math.floor(extra / bpb_rank))) if n is not None and pp > 1 else \
                dict(kv_cache_gib=max(1e-6, (kv_bytes + extra) / GIB))
            replan = _plan(spec, dataclasses.replace(tgt, **kv_new),
                           weights_bytes=weights * GIB, weights_source="the log (Model loading took)")
            if extra and replan.capacity.num_blocks:
                replan.reasons.append(f"KV budget: the logged {kv_bytes / GIB:.2f} GiB "
                                      f"{'+' if extra > 0 else '-'} {abs(extra) / GIB:.2f} GiB for gmu "
                                      f"{tgt.gpu_memory_utilization:g}")
        else:
            ratio = (estimate_weights(spec, new_tp, not at.language_model_only, at.num_speculative_tokens > 0)
                     .per_rank_bytes / estimate_weights(spec, tp, not at.language_model_only,
                                                        at.num_speculative_tokens > 0).per_rank_bytes)
            if lg.activation_gib is not None:
                ov = dict(activation_gib=lg.activation_gib, non_torch_gib=lg.non_torch_gib,
                          cuda_graph_gib=lg.cuda_graph_gib)
            elif measured_rest is not None:
                ov = dict(activation_gib=max(0.0, measured_rest), non_torch_gib=0.0, cuda_graph_gib=0.0)
            else:
                ov = {}
            replan = _plan(spec, dataclasses.replace(tgt, tp=new_tp, nodes=new_tp * pp, kv_cache_gib=None, **ov),
                           weights_bytes=weights * GIB * ratio,
                           weights_source=f"the log's weights x {ratio:.3f} (TP {tp} -> {new_tp})")
    if len({v for _k, v in lg.kv_gib_ranks}) > 1:
        (tk, tv), (_hk, hv) = lg.kv_gib_ranks[0], lg.kv_gib_ranks[-1]
        notes.append(f"the ranks logged {tv:.2f}-{hv:.2f} GiB of KV budget: vLLM gives every rank the block count "
                     f"of the smallest ({tv:.2f} GiB, {tk}), and so does this calibration")
    if (replan is not None and lg.ran and not replan.fits and "tp" not in change
            and replan.max_model_len <= mml and replan.budget.gmu >= at.gpu_memory_utilization):
        # what vLLM ran, or a start that asks less of it (no longer context, no less memory), fits
        replan.fits = True
        replan.ways_out = []
        replan.reasons = [x for x in replan.reasons if not x.startswith("way out: ")]
        replan.reasons[0] = replan.reasons[0].replace("does not fit", "fits", 1)
        replan.reasons.insert(1, "vLLM ran the logged start, which asked more of it than this")
    if measured_rest is not None:
        notes.append(f"measured overheads: {measured_rest:.2f} GiB besides weights and KV "
                     f"(gmu {lg.gpu_memory_utilization:g} x {lg.total_gib:.2f} GiB - {lg.weights_gib:.2f} - "
                     f"{lg.kv_gib:.2f}); the planner estimated {est.budget.overheads.total_gib:.2f}")
    if not math.isclose(total, DEFAULT_NODE_MEMORY_GIB) and lg.total_gib:
        notes.append(f"node memory {lg.total_gib:.2f} GiB as vLLM logged it")
    return Calibration(lg, est, cal, replan, n, reproduced, notes)


def summary_lines(cal: Calibration) -> list[str]:
    """Planner against log side by side, what was reproduced, the notes, and the verdicts of the
    logged start and of the re-plan, as plain lines: the CLI's ``plan --from-log`` and the
    console's calibration view print the same words."""
    rows = cal.rows()
    width = max(len(r[0]) for r in rows)
    lines = [f"{'':<{width}}  {'planner':<26}  log", *(f"{a:<{width}}  {b:<26}  {c}" for a, b, c in rows)]
    if cal.reproduced:
        lines.append("reproduced exactly: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in cal.reproduced.items()))
    lines += [f"- {x}" for x in cal.notes]
    lines.append("")
    lines.append(f"calibrated (the logged start): {cal.calibrated.reasons[0]}")
    if cal.replan is not None:
        lines.append(f"re-planned: {cal.replan.reasons[0]}")
    return lines
