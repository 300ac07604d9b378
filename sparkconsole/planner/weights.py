"""Weights per node: parameters by module, bytes by dtype, and what tensor parallelism shards.

The model is enumerated as checkpoint-like modules (:class:`Part`), named the way the checkpoint
names them, so a quantisation config's ``modules_to_not_convert`` can be matched against them:

- full attention: ``q_proj`` (twice as wide with ``attn_output_gate``), ``k_proj``, ``v_proj``,
  ``o_proj``, q/k norms; MLA (DeepSeek-V3): ``q_a_proj``/``q_b_proj``, ``kv_a_proj_with_mqa``,
  ``kv_b_proj``, ``o_proj`` and the latent norms;
- Gated DeltaNet (``linear_attention``): ``in_proj_qkvz`` + ``in_proj_ba`` (Qwen3-Next) or
  ``in_proj_qkv``/``in_proj_z``/``in_proj_a``/``in_proj_b`` (Qwen3.5), ``conv1d``, ``out_proj``,
  ``A_log``, ``dt_bias``, the gated norm; Mamba2 mixers (``in_proj``, ``conv1d``, ``out_proj``...);
- MLP: dense gate/up/down, or MoE routed experts + shared expert(s) + the router gate;
- embeddings and (untied) ``lm_head``, the per-layer and final norms;
- a Qwen-VL vision tower (blocks, patch embed, position embed, merger);
- MTP draft layers, counted only when speculative decoding loads them.

Bytes: the model dtype (bf16) by default; FP8 block quantisation stores a linear weight in one byte
plus one fp32 scale per ``weight_block_size`` block (128x128: 1/4096 extra bytes per weight), with
``modules_to_not_convert`` -- and always embeddings, ``lm_head`` and router gates, which vLLM builds
without a quant method -- kept in the model dtype. GPTQ/AWQ: ``bits`` per weight plus an fp16
scale and packed zero per group.

TP sharding as vLLM does it: column/row-parallel linears and experts divide by TP; embeddings and
``lm_head`` are vocab-parallel (vocab padded to 64); K/V projections hold ``max(1, kv_heads // tp)``
heads per rank (replicated past TP = kv heads); router gates, norms and MLA's down-projections
(``q_a_proj``, ``kv_a_proj_with_mqa``) are replicated on every rank.

When the checkpoint is known, its sizes win: exact per-bucket bytes from safetensors headers
(Hub), or the index's ``total_size`` (local directory), with this enumeration used only to take
out what vLLM will not load (``mtp.*`` without speculative decoding, ``visual.*`` with
``--language-model-only``) and to split the rest across ranks.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sparkconsole.planner.quant import int_group
from sparkconsole.planner.spec import QWEN_FP8_KEEP_BF16, Geometry, ModelSpec, Quant

GIB = 1 << 30

# module categories, in display order
MODULES = (
    "routed experts", "shared experts", "dense MLP", "attention", "linear attention", "mamba",
    "router gates", "norms", "embeddings", "lm_head", "vision tower", "MTP draft layers",
)


@dataclass(frozen=True)
class Part:
    """``count`` identical tensors of ``rows x cols`` (cols 1 for vectors)."""

    name: str            # checkpoint module name, canonical (no language-model prefix)
    module: str          # one of MODULES
    rows: int
    cols: int
    count: int = 1
    kind: str = "linear"  # linear | embed | norm | param | router | conv | buffer
    shard: str = "col"    # col | row | heads | rep | vocab | kv
    dtype_bytes: int | None = None   # forced dtype (e.g. fp32 correction bias)

    @property
    def numel(self) -> int:
        return self.rows * self.cols * self.count


@dataclass
class WeightEstimate:
    tp: int
    params: dict[str, int] = field(default_factory=dict)            # by module, whole model
    bytes_total: dict[str, float] = field(default_factory=dict)     # by module, whole model
    bytes_per_rank: dict[str, float] = field(default_factory=dict)  # by module, one rank
    fp8_params: int = 0
    notes: list[str] = field(default_factory=list)
    exact_per_rank: float | None = None   # from checkpoint sizes, when known
    source: str = "config"

    @property
    def total_params(self) -> int:
        return sum(self.params.values())

    @property
    def total_bytes(self) -> float:
        return sum(self.bytes_total.values())

    @property
    def per_rank_bytes(self) -> float:
        if self.exact_per_rank is not None:
            return self.exact_per_rank
        return sum(self.bytes_per_rank.values())

    @property
    def per_rank_gib(self) -> float:
        return self.per_rank_bytes / GIB


def _mlp_parts(geo: Geometry, p: str, moe: bool, module_prefix: str = "") -> list[Part]:
    h = geo.hidden
    mod = module_prefix
    out: list[Part] = []
    if moe:
        e, mi = geo.num_experts, geo.moe_intermediate
        out += [
            Part(p + "mlp.gate", mod or "router gates", e, h, kind="router", shard="rep"),
            Part(p + "mlp.experts.gate_up_proj", mod or "routed experts", mi, h, 2 * e),
            Part(p + "mlp.experts.down_proj", mod or "routed experts", h, mi, e, shard="row"),
        ]
        if geo.router_bias:
            out.append(Part(p + "mlp.gate.e_score_correction_bias", mod or "router gates", e, 1,
                            kind="param", shard="rep", dtype_bytes=4))
        if geo.shared_intermediate:
            si = geo.shared_intermediate
            name = "mlp.shared_expert" if geo.shared_expert_gate else "mlp.shared_experts"
            out += [
                Part(p + name + ".gate_up_proj", mod or "shared experts", si, h, 2),
                Part(p + name + ".down_proj", mod or "shared experts", h, si, shard="row"),
            ]
            if geo.shared_expert_gate:
                out.append(Part(p + "mlp.shared_expert_gate", mod or "router gates", 1, h,
                                kind="router", shard="rep"))
    else:
        inter = geo.intermediate
        gated = geo.mamba is None  # Nemotron-H MLPs are up/down (relu^2)
        out += [
            Part(p + "mlp.gate_up_proj", mod or "dense MLP", inter, h, 2 if gated else 1),
            Part(p + "mlp.down_proj", mod or "dense MLP", h, inter, shard="row"),
        ]
    return out


def _attention_parts(geo: Geometry, p: str, mod: str) -> list[Part]:
    h = geo.hidden
    if geo.mla is not None:
        m = geo.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        parts: list[Part] = []
        if m.q_lora_rank:
            parts += [
                Part(p + "self_attn.q_a_proj", mod, m.q_lora_rank, h, shard="rep"),
                Part(p + "self_attn.q_a_layernorm", mod, m.q_lora_rank, 1, kind="norm", shard="rep"),
                Part(p + "self_attn.q_b_proj", mod, geo.num_heads * qk, m.q_lora_rank),
            ]
        else:
            parts.append(Part(p + "self_attn.q_proj", mod, geo.num_heads * qk, h))
        parts += [
            Part(p + "self_attn.kv_a_proj_with_mqa", mod, m.kv_lora_rank + m.qk_rope_head_dim, h, shard="rep"),
            Part(p + "self_attn.kv_a_layernorm", mod, m.kv_lora_rank, 1, kind="norm", shard="rep"),
            Part(p + "self_attn.kv_b_proj", mod, geo.num_heads * (m.qk_nope_head_dim + m.v_head_dim),
                 m.kv_lora_rank),
            Part(p + "self_attn.o_proj", mod, h, geo.num_heads * m.v_head_dim, shard="row"),
        ]
        return parts
    hd = geo.head_dim
    q_out = geo.num_heads * hd * (2 if geo.attn_output_gate else 1)
    kv_out = geo.num_kv_heads * hd
    parts = [
        Part(p + "self_attn.q_proj", mod, q_out, h),
        Part(p + "self_attn.k_proj", mod, kv_out, h, shard="kv"),
        Part(p + "self_attn.v_proj", mod, kv_out, h, shard="kv"),
        Part(p + "self_attn.o_proj", mod, h, geo.num_heads * hd, shard="row"),
    ]
    if geo.attention_bias:
        parts += [
            Part(p + "self_attn.q_proj.bias", mod, q_out, 1, kind="param"),
            Part(p + "self_attn.k_proj.bias", mod, kv_out, 2, kind="param", shard="kv"),
        ]
    if geo.qk_norm:
        parts.append(Part(p + "self_attn.qk_norm", mod, hd, 2, kind="norm", shard="rep"))
    return parts


def _linear_attn_parts(geo: Geometry, p: str, mod: str) -> list[Part]:
    la = geo.linear
    assert la is not None
    h = geo.hidden
    kd, vd = la.k_heads * la.k_dim, la.v_heads * la.v_dim
    a = p + "linear_attn."
    if geo.gdn_split:
        parts = [
            Part(a + "in_proj_qkv", mod, 2 * kd + vd, h),
            Part(a + "in_proj_z", mod, vd, h),
            Part(a + "in_proj_a", mod, la.v_heads, h),
            Part(a + "in_proj_b", mod, la.v_heads, h),
        ]
    else:
        parts = [
            Part(a + "in_proj_qkvz", mod, 2 * kd + 2 * vd, h),
            Part(a + "in_proj_ba", mod, 2 * la.v_heads, h),
        ]
    parts += [
        Part(a + "conv1d", mod, la.conv_dim, la.conv_kernel, kind="conv"),
        Part(a + "out_proj", mod, h, vd, shard="row"),
        Part(a + "A_log", mod, la.v_heads, 1, kind="param", shard="heads"),
        Part(a + "dt_bias", mod, la.v_heads, 1, kind="param", shard="heads"),
        Part(a + "norm", mod, la.v_dim, 1, kind="norm", shard="rep"),
    ]
    return parts


def _mamba_parts(geo: Geometry, p: str, mod: str) -> list[Part]:
    m = geo.mamba
    assert m is not None
    h = geo.hidden
    a = p + "mixer."
    return [
        Part(a + "in_proj", mod, 2 * m.d_inner + 2 * m.n_groups * m.d_state + m.n_heads, h),
        Part(a + "conv1d", mod, m.conv_dim, m.conv_kernel + 1, kind="conv"),  # weight + bias
        Part(a + "out_proj", mod, h, m.d_inner, shard="row"),
        Part(a + "A_log", mod, m.n_heads, 3, kind="param", shard="heads"),  # A_log, D, dt_bias
        Part(a + "norm", mod, m.d_inner, 1, kind="norm", shard="heads"),
    ]


def enumerate_parts(geo: Geometry, include_vision: bool = True, include_mtp: bool = False) -> list[Part]:
    """Every module of the model vLLM would load, as :class:`Part` groups."""
    h = geo.hidden
    parts: list[Part] = [Part("embed_tokens", "embeddings", geo.vocab, h, kind="embed", shard="vocab")]
    if not geo.tie_embeddings:
        parts.append(Part("lm_head", "lm_head", geo.vocab, h, kind="embed", shard="vocab"))
    parts.append(Part("norm", "norms", h, 1, kind="norm", shard="rep"))
    for i in range(geo.num_layers):
        p = f"layers.{i}."
        kind = geo.layer_kinds[i]
        if kind == "full":
            parts += _attention_parts(geo, p, "attention")
        elif kind == "linear":
            parts += _linear_attn_parts(geo, p, "linear attention")
        elif kind == "mamba":
            parts += _mamba_parts(geo, p, "mamba")
        if geo.mlp_layers[i]:
            parts += _mlp_parts(geo, p, geo.moe_layers[i])
        parts.append(Part(p + "layernorms", "norms", h, 2, kind="norm", shard="rep"))
    if include_vision and geo.vision is not None:
        parts += _vision_parts(geo)
    if include_mtp and geo.mtp_layers:
        parts += mtp_parts(geo)
    return parts


def mtp_parts(geo: Geometry) -> list[Part]:
    h = geo.hidden
    mod = "MTP draft layers"
    parts: list[Part] = []
    moe = geo.num_experts > 0
    for j in range(geo.mtp_layers):
        if geo.mtp_style == "deepseek":
            p = f"layers.{geo.num_layers + j}."
            parts += [
                Part(p + "eh_proj", mod, h, 2 * h),
                Part(p + "enorm_hnorm", mod, h, 3, kind="norm", shard="rep"),
                Part(p + "embed_tokens", mod, geo.vocab, h, kind="embed", shard="vocab"),
                Part(p + "shared_head.head", mod, geo.vocab, h, kind="embed", shard="vocab"),
            ]
        else:
            p = f"mtp.layers.{j}."
            if j == 0:
                parts += [
                    Part("mtp.fc", mod, h, 2 * h),
                    Part("mtp.norms", mod, h, 3, kind="norm", shard="rep"),
                ]
        attn = _attention_parts(geo, p, mod)
        parts += attn
        parts += [dataclasses.replace(x, module=mod) for x in _mlp_parts(geo, p, moe)]
        parts.append(Part(p + "layernorms", mod, h, 2, kind="norm", shard="rep"))
    return parts


def _vision_parts(geo: Geometry) -> list[Part]:
    v = geo.vision
    assert v is not None
    mod = "vision tower"
    h, inter = v.hidden, v.intermediate
    merged = h * v.spatial_merge_size ** 2
    patch = v.in_channels * v.temporal_patch_size * v.patch_size ** 2
    parts: list[Part] = []
    for b in range(v.depth):
        p = f"visual.blocks.{b}."
        parts += [
            Part(p + "norm1_norm2", mod, h, 4, kind="norm", shard="rep"),
            Part(p + "attn.qkv", mod, 3 * h, h + 1),
            Part(p + "attn.proj", mod, h, h + 1, shard="row"),
            Part(p + "mlp.linear_fc1", mod, inter, h + 1),
            Part(p + "mlp.linear_fc2", mod, h, inter + 1, shard="row"),
        ]
    parts += [
        Part("visual.patch_embed.proj", mod, h, patch + 1, shard="rep"),
        Part("visual.pos_embed", mod, v.num_position_embeddings, h, kind="embed", shard="rep"),
        Part("visual.merger.norm", mod, h, 2, kind="norm", shard="rep"),
        Part("visual.merger.linear_fc1", mod, merged, merged + 1),
        Part("visual.merger.linear_fc2", mod, v.out_hidden, merged + 1, shard="row"),
    ]
    return parts


def _kept(name: str, keep: frozenset[str]) -> bool:
    padded = f".{name}."
    return any(f".{k}." in padded for k in keep)


def checkpoint_names(part: Part, geo: Geometry) -> tuple[str, ...]:
    """The names a quantisation config may use for ``part``: its full checkpoint name, and for a
    vLLM-fused linear the names of its shards (``gate_up_proj`` -> ``gate_proj``, ``up_proj``;
    fused experts -> the ``experts`` module and expert 0's projections)."""
    n = part.name
    if n.startswith("visual."):
        full = ("model." + n) if geo.lm_prefix == "model.language_model." else n
    elif n.startswith(("mtp.", "lm_head")):
        full = n
    else:
        full = geo.lm_prefix + n
    out = [full]
    head, _, leaf = full.rpartition(".")
    if head.endswith(".experts"):
        out.append(head)
        shards = ("gate_proj", "up_proj") if leaf == "gate_up_proj" else (leaf,)
        out += [f"{head}.0.{x}" for x in shards] + [f"{head}.{x}" for x in shards]
    elif leaf == "gate_up_proj":
        out += [f"{head}.gate_proj", f"{head}.up_proj"]
    elif leaf == "in_proj_qkvz":
        out += [f"{head}.in_proj_qkv", f"{head}.in_proj_z"]
    elif leaf == "in_proj_ba":
        out += [f"{head}.in_proj_b", f"{head}.in_proj_a"]
    return tuple(out)


def _part_bytes(part: Part, geo: Geometry, quant: Quant | None) -> tuple[float, bool]:
    """Bytes of a part (whole model) and whether it is stored quantised."""
    if part.dtype_bytes is not None:
        return float(part.numel * part.dtype_bytes), False
    base = geo.dtype_bytes
    if quant is not None and quant.fmt is not None:
        scheme = quant.fmt.scheme_for(checkpoint_names(part, geo), part.kind, part.module)
        if scheme is None:
            return float(part.numel * base), False
        rows, cols = part.rows, part.cols
        if quant.fmt.expert_pad and part.module == "routed experts":
            # the kernel's layout: hidden and intermediate rounded up (down_proj is hidden x intermediate)
            ph, pi = quant.fmt.expert_pad
            hidden_rows = part.name.endswith("down_proj")
            rows = -(-rows // (ph if hidden_rows else pi)) * (ph if hidden_rows else pi)
            cols = -(-cols // (pi if hidden_rows else ph)) * (pi if hidden_rows else ph)
        return part.count * scheme.bytes(rows, cols, moe=part.module == "routed experts"), True
    if quant is None or part.kind != "linear" or _kept(part.name, quant.keep_bf16):
        return float(part.numel * base), False
    r, c, n = part.rows, part.cols, part.count
    if quant.method == "fp8":
        blk = quant.block
        scales = math.ceil(r / blk[0]) * math.ceil(c / blk[1]) if blk else 1
        return float(n * (r * c + scales * 4)), True
    if quant.method in ("gptq", "awq") and quant.bits:
        # only four_bit_per_rank comes here (a checkpoint's own gptq/awq block has a QuantFormat): the
        # layout of quant.py's int_group with AWQ's zero points, the largest of the 4-bit variants
        return n * int_group(quant.bits, quant.group_size, zero=True).bytes(r, c), True
    return float(part.numel * base), False


def _rope_config(spec: ModelSpec) -> Mapping[str, Any]:
    cfg = spec.config if isinstance(spec.config, Mapping) else {}
    d = cfg.get("text_config") or cfg.get("llm_config") or cfg
    return d if isinstance(d, Mapping) else {}


def rotary_parts(spec: ModelSpec) -> list[Part]:
    """vLLM's rotary ``cos_sin_cache`` buffer (``rotary_embedding``): ``positions x rotary_dim`` in the
    model dtype, one per model (``get_rope`` shares it across layers), on every rank. Positions are
    ``max_position_embeddings``, or ``original_max_position_embeddings x factor`` under YaRN, and four
    times that under multimodal RoPE (``mrope_section`` in the rope parameters: ``MRotaryEmbedding``
    builds ``cache_max_position_num = max_position_embeddings * 4``, rotary_embedding/mrope.py, 0.19-0.24;
    Qwen3.5 / 3.6: 4 x 262,144 x 64 x 2 B = 128 MiB)."""
    geo = spec.geometry
    d = _rope_config(spec)
    rs = d.get("rope_scaling") or d.get("rope_parameters") or {}
    rs = rs if isinstance(rs, Mapping) else {}
    if geo.mla is not None:
        rot = geo.mla.qk_rope_head_dim
    else:
        prf = d.get("partial_rotary_factor", rs.get("partial_rotary_factor", 1.0))
        prf = prf if isinstance(prf, int | float) and not isinstance(prf, bool) and 0 < prf <= 1 else 1.0
        rot = int(geo.head_dim * prf)
    positions = geo.max_position
    kind = str(rs.get("rope_type") or rs.get("type") or "")
    factor, orig = rs.get("factor"), rs.get("original_max_position_embeddings")
    if kind in ("yarn", "deepseek_yarn") and isinstance(factor, int | float) and isinstance(orig, int) \
            and not isinstance(factor, bool) and 0 < factor < 1024 and 0 < orig < 1 << 24:
        positions = int(orig * factor)
    if isinstance(rs.get("mrope_section"), list):
        positions *= 4
    if rot <= 0 or not geo.n_full:
        return []
    return [Part("rotary_emb.cos_sin_cache", "norms", positions, rot, kind="buffer", shard="rep")]


def _rank_fraction(part: Part, geo: Geometry, tp: int) -> float:
    if tp == 1 or part.shard == "rep":
        return 1.0
    if part.shard == "vocab":
        padded = -(-geo.vocab // 64) * 64
        return math.ceil(padded / tp) / geo.vocab
    if part.shard == "kv":
        return max(1, geo.num_kv_heads // tp) / geo.num_kv_heads
    return 1.0 / tp


def estimate_parts(parts: list[Part], geo: Geometry, tp: int, quant: Quant | None) -> WeightEstimate:
    est = WeightEstimate(tp=tp)
    for part in parts:
        b, q = _part_bytes(part, geo, quant)
        frac = _rank_fraction(part, geo, tp)
        if part.kind != "buffer":  # the rotary cache is built at start, not a parameter of the model
            est.params[part.module] = est.params.get(part.module, 0) + part.numel
        est.bytes_total[part.module] = est.bytes_total.get(part.module, 0.0) + b
        est.bytes_per_rank[part.module] = est.bytes_per_rank.get(part.module, 0.0) + b * frac
        if q:
            est.fp8_params += part.numel
    return est


def estimate_weights(spec: ModelSpec, tp: int = 1, include_vision: bool = True,
                     include_mtp: bool = False) -> WeightEstimate:
    """What vLLM loads on one rank, in bytes, with how it was worked out in ``notes``."""
    geo = spec.geometry
    ck = spec.checkpoint
    notes: list[str] = []
    if include_mtp and not geo.mtp_layers:
        notes.append("the config has no MTP layers: a speculative draft adds no weights here")
    if include_mtp and geo.mtp_layers and ck.has_mtp is False:
        notes.append("the checkpoint has no mtp.* tensors: MTP draft layers cannot be loaded from it")
        include_mtp = False
    if include_vision and geo.vision is not None and ck.has_visual is False:
        include_vision = False
    rotary = rotary_parts(spec)
    parts = enumerate_parts(geo, include_vision, include_mtp) + rotary
    est = estimate_parts(parts, geo, tp, geo.quant)
    rotary_bytes = estimate_parts(rotary, geo, tp, None).per_rank_bytes
    est.notes = notes
    if ck.tensor_bytes:
        tb = ck.tensor_bytes
        kv_frac = max(1, geo.num_kv_heads // tp) / geo.num_kv_heads if tp > 1 else 1.0
        total = 0.0
        for key, size in tb.items():
            group, _, shard = key.partition(":")
            if (group == "visual" and not include_vision) or (group == "mtp" and not include_mtp):
                continue
            total += size * (1.0 if shard == "replicated" else kv_frac if shard == "kv" else 1.0 / tp)
        est.exact_per_rank = total + rotary_bytes  # a runtime buffer: in no checkpoint
        est.source = "safetensors headers"
        est.notes.append("weights from the safetensors headers (exact tensor bytes)")
    elif ck.total_size:
        loaded = float(ck.total_size)
        if geo.mtp_layers and not include_mtp and ck.has_mtp is not False:
            loaded -= estimate_parts(mtp_parts(geo), geo, 1, geo.quant).total_bytes
        if geo.vision is not None and not include_vision and ck.has_visual is not False:
            loaded -= estimate_parts(_vision_parts(geo), geo, 1, geo.quant).total_bytes
        if est.total_bytes > 0 and loaded > 0:
            share = (est.per_rank_bytes - rotary_bytes) / max(1.0, est.total_bytes - rotary_bytes)
            est.exact_per_rank = loaded * share + rotary_bytes
            est.source = "safetensors index"
            est.notes.append("weights from the safetensors index total_size, less parts vLLM skips")
    return est


def four_bit_per_rank(spec: ModelSpec, tp: int = 1, include_vision: bool = True) -> float:
    """Bytes per rank of a 4-bit (group 128) variant: quantisable linears at 4.125 bits."""
    geo = spec.geometry
    keep = geo.quant.keep_bf16 if geo.quant and geo.quant.keep_bf16 else frozenset(QWEN_FP8_KEEP_BF16)
    q = Quant("gptq", None, bits=4, group_size=128, keep_bf16=keep)
    return estimate_parts(enumerate_parts(geo, include_vision, False), geo, tp, q).per_rank_bytes
