"""Model specs: what the planner knows about a model before anything is downloaded.

A :class:`ModelSpec` comes from one of four places, tried in this order by :func:`load_spec`:

1. a ``config.json`` path;
2. a local model directory holding ``config.json`` and, when present,
   ``model.safetensors.index.json`` (its ``metadata.total_size`` gives the exact checkpoint bytes,
   its tensor names tell which optional parts exist: ``mtp.*`` draft layers, ``visual.*`` tower);
3. a bundled spec for the headline models (real configs under ``planner/specs/``), keyed by
   Hugging Face repo id; ``-FP8`` ids always resolve to FP8 weights;
4. a Hugging Face repo id through ``huggingface_hub``: ``config.json`` plus the safetensors headers
   (``HfApi.get_safetensors_metadata``: HTTP range reads, no weights downloaded), summarised and
   cached as JSON under ``state_dir()/specs`` so the next run works offline.

A repo id is validated (:func:`sparkconsole.remote.validate_model_id`) before it is used for
anything; a hostile id, a missing file or a config that cannot describe a model is a
:class:`~sparkconsole.errors.UserError` (exit 2) with one line that says what is wrong.

The geometry the memory math needs is read once into :class:`Geometry` (``text_config`` when the
config is nested, the way vLLM reads multimodal configs), with every number checked: present,
an integer, positive and not absurd.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkconsole.errors import UserError, ValidationError
from sparkconsole.planner.quant import QuantFormat, parse_format
from sparkconsole.remote import validate_model_id

SPECS_DIR = Path(__file__).with_name("specs")
CACHE_SCHEMA = 1

# Bundled configs: repo id -> (file, weight format). "fp8": FP8 block-quantised weights (the
# config's quantization_config, or the Qwen FP8 block scheme when the bundled config has none);
# "bf16": the unquantised repo (any quantization_config in the bundled file is dropped).
BUNDLED: dict[str, tuple[str, str]] = {
    "Qwen/Qwen3.5-122B-A10B-FP8": ("qwen3.5-122B-A10B.config.json", "fp8"),
    "Qwen/Qwen3.5-122B-A10B": ("qwen3.5-122B-A10B.config.json", "bf16"),
    "Qwen/Qwen3.5-35B-A3B-FP8": ("qwen3.5-35B-A3B.config.json", "fp8"),
    "Qwen/Qwen3.5-35B-A3B": ("qwen3.5-35B-A3B.config.json", "bf16"),
    "Qwen/Qwen3-Next-80B-A3B-Instruct-FP8": ("qwen3-next-80B-A3B.config.json", "fp8"),
    "Qwen/Qwen3-Next-80B-A3B-Instruct": ("qwen3-next-80B-A3B.config.json", "bf16"),
    "Qwen/Qwen3-Next-80B-A3B-Thinking-FP8": ("qwen3-next-80B-A3B.config.json", "fp8"),
    "Qwen/Qwen3-Next-80B-A3B-Thinking": ("qwen3-next-80B-A3B.config.json", "bf16"),
    "Qwen/Qwen3-235B-A22B-FP8": ("qwen3-235B-A22B.config.json", "fp8"),
    "Qwen/Qwen3-235B-A22B": ("qwen3-235B-A22B.config.json", "bf16"),
    "Qwen/Qwen3-30B-A3B-FP8": ("qwen3-30B-A3B.config.json", "fp8"),
    "Qwen/Qwen3-30B-A3B": ("qwen3-30B-A3B.config.json", "bf16"),
    "Qwen/Qwen3-8B-FP8": ("qwen3-8B.config.json", "fp8"),
    "Qwen/Qwen3-8B": ("qwen3-8B.config.json", "bf16"),
    "deepseek-ai/DeepSeek-V3": ("deepseek_v3.config.json", "fp8"),
}
_BUNDLED_LOWER = {k.lower(): k for k in BUNDLED}

# What Qwen's own FP8 releases keep in BF16 (Qwen3.5-122B-A10B-FP8's modules_to_not_convert,
# by module kind). Used when an -FP8 id maps to a bundled config without a quantization_config.
QWEN_FP8_KEEP_BF16 = (
    "lm_head", "embed_tokens", "linear_attn.conv1d", "linear_attn.in_proj_a", "linear_attn.in_proj_b",
    "linear_attn.in_proj_ba", "mlp.gate", "mlp.shared_expert_gate", "visual", "mtp.fc",
)

_MAX_DIM = 1 << 24        # no hidden size, head count or vocab is this large
_MAX_LAYERS = 4096
_MAX_LEN = 1 << 30
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}


@dataclass(frozen=True)
class LinearAttn:
    """Gated DeltaNet (Qwen3-Next / Qwen3.5 ``linear_attention``) geometry."""

    k_heads: int
    v_heads: int
    k_dim: int
    v_dim: int
    conv_kernel: int

    @property
    def conv_dim(self) -> int:
        return 2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim


@dataclass(frozen=True)
class Mamba2:
    """Mamba2 mixer geometry (Nemotron-H style ``hybrid_override_pattern``)."""

    n_heads: int
    head_dim: int
    n_groups: int
    d_state: int
    conv_kernel: int

    @property
    def d_inner(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.d_inner + 2 * self.n_groups * self.d_state


@dataclass(frozen=True)
class MLA:
    """Multi-head latent attention (DeepSeek-V2/V3) geometry; ``q_lora_rank`` 0 means none."""

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class Vision:
    """A Qwen-VL style vision tower."""

    depth: int
    hidden: int
    intermediate: int
    out_hidden: int
    patch_size: int
    temporal_patch_size: int
    in_channels: int
    spatial_merge_size: int
    num_position_embeddings: int


@dataclass(frozen=True)
class Quant:
    """Weight quantisation as far as memory goes."""

    method: str                        # "fp8" | "gptq" | "awq" | other (not modelled)
    block: tuple[int, int] | None      # FP8 weight_block_size
    bits: int | None = None            # gptq / awq
    group_size: int | None = None
    keep_bf16: frozenset[str] = frozenset()   # canonical module names (see canonical_name)
    synthesized: bool = False
    fmt: QuantFormat | None = None     # every other format, per module (planner/quant.py)

    @property
    def label(self) -> str:
        """What the plan's reasons call this format."""
        if self.fmt is not None:
            return f"{self.fmt.method} {self.fmt.label}"
        return self.method.upper()


@dataclass(frozen=True)
class Geometry:
    """Everything the weight and KV math needs, read and checked from config.json."""

    model_type: str
    architectures: tuple[str, ...]
    hidden: int
    num_layers: int
    vocab: int
    tie_embeddings: bool
    num_heads: int
    num_kv_heads: int
    head_dim: int
    attn_output_gate: bool
    attention_bias: bool
    qk_norm: bool
    layer_kinds: tuple[str, ...]        # per layer: "full" | "linear" | "mamba" | "none"
    moe_layers: tuple[bool, ...]        # per layer: MoE MLP (True) or dense MLP (False)
    mlp_layers: tuple[bool, ...]        # per layer: has an MLP at all
    intermediate: int
    num_experts: int
    moe_intermediate: int
    shared_intermediate: int
    shared_expert_gate: bool
    router_bias: bool
    linear: LinearAttn | None
    mamba: Mamba2 | None
    mla: MLA | None
    mtp_layers: int
    mtp_style: str                      # "qwen" | "deepseek" | ""
    vision: Vision | None
    dtype: str
    mamba_ssm_dtype: str | None
    max_position: int
    kv_cache_fp8: bool                  # the checkpoint carries KV-cache scales
    quant: Quant | None
    lm_prefix: str                      # checkpoint name prefix of the language model
    gdn_split: bool                     # Qwen3.5 names: in_proj_qkv/z/a/b; Qwen3-Next: qkvz/ba

    @property
    def dtype_bytes(self) -> int:
        return _DTYPE_BYTES.get(self.dtype, 2)

    @property
    def n_full(self) -> int:
        return sum(1 for k in self.layer_kinds if k == "full")

    @property
    def n_linear(self) -> int:
        return sum(1 for k in self.layer_kinds if k in ("linear", "mamba"))

    @property
    def hybrid(self) -> bool:
        return self.n_linear > 0


@dataclass(frozen=True)
class CheckpointInfo:
    """What the safetensors files say (index or headers), when we have them."""

    total_size: int | None = None
    has_mtp: bool | None = None
    has_visual: bool | None = None
    # exact bytes by bucket from headers: "<lm|visual|mtp>:<sharded|replicated|kv>"
    tensor_bytes: Mapping[str, int] | None = None


@dataclass(frozen=True)
class ModelSpec:
    """A model as the planner sees it."""

    model: str
    source: str
    geometry: Geometry
    checkpoint: CheckpointInfo = field(default_factory=CheckpointInfo)
    notes: tuple[str, ...] = ()
    config: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)


# ---------------------------------------------------------------------------------------------
# reading numbers out of a config


class _Reader:
    def __init__(self, d: Mapping[str, Any], where: str) -> None:
        self.d = d
        self.where = where

    def bad(self, msg: str) -> UserError:
        return UserError(f"{self.where}: {msg}")

    def int(self, *keys: str, default: int | None = None, minimum: int = 1,
            maximum: int = _MAX_DIM) -> int:
        for key in keys:
            if key in self.d and self.d[key] is not None:
                v = self.d[key]
                if isinstance(v, bool) or not isinstance(v, int | float):
                    raise self.bad(f"{key!r} must be a number, not {type(v).__name__}")
                if isinstance(v, float):
                    if not math.isfinite(v) or v != int(v):
                        raise self.bad(f"{key!r} must be a whole number, got {v!r}")
                    v = int(v)
                if v < minimum or v > maximum:
                    raise self.bad(f"{key!r} = {v} is out of range ({minimum}..{maximum})")
                return v
        if default is None:
            raise self.bad(f"missing {keys[0]!r}")
        return default

    def bool(self, key: str, default: bool = False) -> bool:
        v = self.d.get(key, default)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise self.bad(f"{key!r} must be true or false")
        return v

    def str(self, key: str, default: str | None = None) -> str | None:
        v = self.d.get(key, default)
        if v is None:
            return default
        if not isinstance(v, str):
            raise self.bad(f"{key!r} must be a string")
        return v

    def dict(self, key: str) -> Mapping[str, Any] | None:
        v = self.d.get(key)
        if v is None:
            return None
        if not isinstance(v, Mapping):
            raise self.bad(f"{key!r} must be an object")
        return v


def canonical_name(name: str) -> str:
    """A checkpoint module name without its language-model prefix and ``.weight`` suffix."""
    for prefix in ("model.language_model.", "language_model.model.", "language_model.", "model."):
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    for suffix in (".weight", ".bias", ".weight_scale_inv", ".weight_scale"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return name


def _quant(q: Mapping[str, Any] | None, where: str) -> Quant | None:
    if q is None:
        return None
    r = _Reader(q, f"{where}: quantization_config")
    method = (r.str("quant_method") or "").lower()
    if method == "fp8":
        block = q.get("weight_block_size")
        if block is not None:
            if (not isinstance(block, list) or len(block) != 2
                    or not all(isinstance(b, int) and not isinstance(b, bool) and 0 < b <= 1 << 16
                               for b in block)):
                raise r.bad("'weight_block_size' must be two positive integers")
            blk: tuple[int, int] | None = (block[0], block[1])
        else:
            blk = None
        keep = q.get("modules_to_not_convert") or q.get("ignored_layers") or []
        if not isinstance(keep, list) or not all(isinstance(k, str) for k in keep):
            raise r.bad("'modules_to_not_convert' must be a list of names")
        return Quant("fp8", blk, keep_bf16=frozenset(canonical_name(k) for k in keep))
    if method in ("gptq", "awq", "gptq_marlin", "awq_marlin", "auto-round", "autoround", "auto_round"):
        bits = r.int("bits", "w_bit", default=4, maximum=16)
        group = r.int("group_size", "q_group_size", default=128, minimum=-1, maximum=1 << 20)
        return Quant("awq" if "awq" in method else "gptq", None, bits=bits,
                     group_size=group if group > 0 else None, fmt=parse_format(q, where))
    fmt = parse_format(q, where)
    return Quant(method or "unknown", None, fmt=fmt)


def geometry_from_config(config: Any, where: str = "config.json") -> Geometry:
    """Read and check the fields the memory math needs. Raises :class:`UserError`."""
    if not isinstance(config, Mapping):
        raise UserError(f"{where}: not a JSON object (got {type(config).__name__})")
    top = _Reader(config, where)
    text_cfg = top.dict("text_config") or top.dict("llm_config")
    d = text_cfg if text_cfg is not None else config
    r = _Reader(d, where + (": text_config" if text_cfg is not None else ""))

    model_type = (r.str("model_type") or top.str("model_type") or "").lower()
    archs = config.get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise top.bad("'architectures' must be a list of names")

    hidden = r.int("hidden_size", "d_model", "n_embd")
    layers = r.int("num_hidden_layers", "n_layer", "num_layers", maximum=_MAX_LAYERS)
    vocab = r.int("vocab_size", maximum=1 << 26)
    heads = r.int("num_attention_heads", "n_head")
    kv_heads = r.int("num_key_value_heads", default=heads)
    if kv_heads > heads:
        raise r.bad(f"num_key_value_heads ({kv_heads}) is larger than num_attention_heads ({heads})")
    head_dim = r.int("head_dim", default=max(1, hidden // heads))
    # the text config's own flag wins; else the top level's (Qwen3.5 keeps it at the top)
    tie = r.bool("tie_word_embeddings", top.bool("tie_word_embeddings", False)) if "tie_word_embeddings" in d \
        else top.bool("tie_word_embeddings", False)

    # ---- layer kinds
    kinds: list[str]
    mamba: Mamba2 | None = None
    linear: LinearAttn | None = None
    mlp_layers = [True] * layers
    pattern = d.get("hybrid_override_pattern")
    layer_types = d.get("layer_types")
    if isinstance(pattern, str) and pattern:
        if len(pattern) != layers or set(pattern) - set("M*-E"):
            raise r.bad("'hybrid_override_pattern' must have one of M * - E per layer")
        kinds = [{"M": "mamba", "*": "full"}.get(c, "none") for c in pattern]
        mlp_layers = [c in "-E" for c in pattern]
    elif layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != layers:
            raise r.bad(f"'layer_types' must list {layers} layer kinds")
        kinds = []
        for t in layer_types:
            if t in ("full_attention", "attention", "sliding_attention", "chunked_attention"):
                kinds.append("full")
            elif t in ("linear_attention",):
                kinds.append("linear")
            elif t in ("mamba", "mamba2"):
                kinds.append("mamba")
            else:
                raise r.bad(f"unknown layer type {t!r} in 'layer_types'")
    elif "full_attention_interval" in d or model_type in ("qwen3_next", "qwen3_5", "qwen3_5_moe"):
        interval = r.int("full_attention_interval", default=4, maximum=_MAX_LAYERS)
        kinds = ["full" if (i + 1) % interval == 0 else "linear" for i in range(layers)]
    else:
        kinds = ["full"] * layers

    if "linear" in kinds:
        linear = LinearAttn(
            k_heads=r.int("linear_num_key_heads"),
            v_heads=r.int("linear_num_value_heads"),
            k_dim=r.int("linear_key_head_dim"),
            v_dim=r.int("linear_value_head_dim"),
            conv_kernel=r.int("linear_conv_kernel_dim", default=4, maximum=1024),
        )
        if linear.v_heads % linear.k_heads:
            raise r.bad("linear_num_value_heads must be a multiple of linear_num_key_heads")
    if "mamba" in kinds:
        mamba = Mamba2(
            n_heads=r.int("mamba_num_heads"),
            head_dim=r.int("mamba_head_dim"),
            n_groups=r.int("n_groups", "mamba_n_groups", default=1),
            d_state=r.int("ssm_state_size", "mamba_d_state"),
            conv_kernel=r.int("conv_kernel", "mamba_d_conv", default=4, maximum=1024),
        )

    # ---- MLA
    mla = None
    if "kv_lora_rank" in d and d.get("kv_lora_rank") is not None:
        q_lora = d.get("q_lora_rank")
        mla = MLA(
            q_lora_rank=0 if q_lora is None else r.int("q_lora_rank"),
            kv_lora_rank=r.int("kv_lora_rank"),
            qk_nope_head_dim=r.int("qk_nope_head_dim"),
            qk_rope_head_dim=r.int("qk_rope_head_dim"),
            v_head_dim=r.int("v_head_dim"),
        )

    # ---- MLP / MoE
    num_experts = r.int("num_experts", "n_routed_experts", "num_routed_experts", "num_local_experts",
                        default=0, minimum=0)
    moe_inter = r.int("moe_intermediate_size", default=0, minimum=0)
    if num_experts and not moe_inter:
        moe_inter = r.int("intermediate_size")
    moe: list[bool] = [False] * layers
    if num_experts:
        if "first_k_dense_replace" in d or "moe_layer_freq" in d:
            first = r.int("first_k_dense_replace", default=0, minimum=0, maximum=_MAX_LAYERS)
            freq = r.int("moe_layer_freq", default=1, maximum=_MAX_LAYERS)
            moe = [i >= first and i % freq == 0 for i in range(layers)]
        else:
            step = r.int("decoder_sparse_step", default=1, maximum=_MAX_LAYERS)
            only = d.get("mlp_only_layers") or []
            if not isinstance(only, list) or not all(isinstance(i, int) for i in only):
                raise r.bad("'mlp_only_layers' must be a list of layer numbers")
            moe = [(i not in only) and (i + 1) % step == 0 for i in range(layers)]
        if pattern:
            moe = [c == "E" for c in pattern]
    needs_dense = any(m and not e for m, e in zip(mlp_layers, moe, strict=True))
    intermediate = r.int("intermediate_size", "ffn_hidden_size", default=0 if not needs_dense else None,
                         minimum=0 if not needs_dense else 1)
    shared = r.int("shared_expert_intermediate_size", default=0, minimum=0)
    shared_gate = shared > 0
    n_shared = r.int("n_shared_experts", "num_shared_experts", default=0, minimum=0, maximum=1024)
    if n_shared and not shared:
        shared = n_shared * moe_inter
    router_bias = (r.str("topk_method") or "") == "noaux_tc"

    # ---- MTP / vision
    mtp = r.int("mtp_num_hidden_layers", default=0, minimum=0, maximum=64)
    mtp_style = "qwen" if mtp else ""
    if not mtp:
        mtp = r.int("num_nextn_predict_layers", default=0, minimum=0, maximum=64)
        mtp_style = "deepseek" if mtp else ""
    vision = None
    vc = top.dict("vision_config")
    if vc is not None and "depth" in vc:
        vr = _Reader(vc, where + ": vision_config")
        vh = vr.int("hidden_size")
        vision = Vision(
            depth=vr.int("depth", maximum=_MAX_LAYERS), hidden=vh,
            intermediate=vr.int("intermediate_size"),
            out_hidden=vr.int("out_hidden_size", default=hidden),
            patch_size=vr.int("patch_size", default=14, maximum=4096),
            temporal_patch_size=vr.int("temporal_patch_size", default=2, maximum=64),
            in_channels=vr.int("in_channels", default=3, maximum=64),
            spatial_merge_size=vr.int("spatial_merge_size", default=2, maximum=64),
            num_position_embeddings=vr.int("num_position_embeddings", default=0, minimum=0),
        )

    dtype = (r.str("dtype") or r.str("torch_dtype") or top.str("torch_dtype") or top.str("dtype")
             or "bfloat16").lower()
    if dtype not in _DTYPE_BYTES:
        raise r.bad(f"unsupported dtype {dtype!r}")
    ssm = r.str("mamba_ssm_dtype")
    if ssm is not None and ssm.lower() not in _DTYPE_BYTES:
        raise r.bad(f"unsupported mamba_ssm_dtype {ssm!r}")
    max_pos = r.int("max_position_embeddings", "n_positions", "max_sequence_length", default=4096,
                    maximum=_MAX_LEN)

    qcfg = top.dict("quantization_config") or r.dict("quantization_config")
    quant = _quant(qcfg, where)
    kv_fp8 = bool(qcfg and (qcfg.get("kv_cache_scheme") or qcfg.get("kv_cache_quant_algo")))
    lm_prefix = "model.language_model." if text_cfg is not None else "model."
    return Geometry(
        model_type=model_type, architectures=tuple(archs), hidden=hidden, num_layers=layers,
        vocab=vocab, tie_embeddings=tie, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        attn_output_gate=r.bool("attn_output_gate", False),
        attention_bias=r.bool("attention_bias", model_type in ("qwen2", "qwen2_moe")),
        qk_norm=model_type.startswith("qwen3"),
        layer_kinds=tuple(kinds), moe_layers=tuple(moe), mlp_layers=tuple(mlp_layers),
        intermediate=intermediate, num_experts=num_experts, moe_intermediate=moe_inter,
        shared_intermediate=shared, shared_expert_gate=shared_gate, router_bias=router_bias,
        linear=linear, mamba=mamba, mla=mla, mtp_layers=mtp, mtp_style=mtp_style, vision=vision,
        dtype=dtype, mamba_ssm_dtype=ssm.lower() if ssm else None, max_position=max_pos,
        kv_cache_fp8=kv_fp8, quant=quant, lm_prefix=lm_prefix,
        gdn_split=model_type.startswith("qwen3_5"),
    )


def _apply_format(config: dict[str, Any], fmt: str, file: str) -> tuple[dict[str, Any], list[str]]:
    """Make a bundled config describe the repo's weights: FP8 or BF16."""
    notes: list[str] = []
    config = copy.deepcopy(config)
    has_q = "quantization_config" in config
    if fmt == "bf16" and has_q:
        del config["quantization_config"]
        notes.append(f"bundled {file} is the FP8 checkpoint's config: its quantization_config was "
                     "dropped for this BF16 repo")
    elif fmt == "fp8" and not has_q:
        config["quantization_config"] = {
            "quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128],
            "modules_to_not_convert": list(QWEN_FP8_KEEP_BF16),
        }
        notes.append(f"bundled {file} has no quantization_config; the FP8 block scheme "
                     "(128x128, fp32 scales) was applied for this -FP8 repo, with embeddings, "
                     "lm_head, router gates, GDN conv/a/b, vision and MTP fc kept BF16 as in "
                     "Qwen's FP8 releases")
    return config, notes


def _read_json(path: Path, what: str) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read {what}: {exc.__class__.__name__}") from None
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        msg = getattr(exc, "msg", "too deeply nested")
        line = getattr(exc, "lineno", "?")
        raise UserError(f"{path}: {what} is not valid JSON ({msg}, line {line})") from None


def _index_info(path: Path) -> CheckpointInfo:
    idx = _read_json(path, "safetensors index")
    if not isinstance(idx, Mapping):
        raise UserError(f"{path}: not a JSON object")
    meta = idx.get("metadata") or {}
    wmap = idx.get("weight_map") or {}
    if not isinstance(meta, Mapping) or not isinstance(wmap, Mapping):
        raise UserError(f"{path}: 'metadata' and 'weight_map' must be objects")
    total = meta.get("total_size")
    if total is not None and (isinstance(total, bool) or not isinstance(total, int) or total <= 0
                              or total > 1 << 50):
        raise UserError(f"{path}: metadata.total_size must be a positive byte count")
    names = [str(n) for n in wmap]
    return CheckpointInfo(
        total_size=total,
        has_mtp=any(is_mtp_name(n, None) for n in names) if names else None,
        has_visual=any(is_visual_name(n) for n in names) if names else None,
    )


def is_mtp_name(name: str, num_layers: int | None) -> bool:
    if name.startswith("mtp.") or ".mtp." in name:
        return True
    if num_layers is not None:
        m = re.match(r"^model\.layers\.(\d+)\.", name)
        if m and int(m.group(1)) >= num_layers:
            return True
    return False


def is_visual_name(name: str) -> bool:
    return name.startswith(("visual.", "model.visual.", "vision_tower.", "model.vision_tower.",
                            "vision_model.", "model.vision_model."))


def spec_from_config(config: Any, model: str, source: str, checkpoint: CheckpointInfo | None = None,
                     notes: tuple[str, ...] = (), where: str = "config.json") -> ModelSpec:
    geo = geometry_from_config(config, where)
    extra: list[str] = list(notes)
    if geo.quant is not None and geo.quant.fmt is not None:
        extra += list(geo.quant.fmt.notes)
    if geo.quant is not None and geo.quant.fmt is None and geo.quant.method not in ("fp8", "gptq", "awq"):
        extra.append(f"quantization {geo.quant.method!r} is not modelled: weights counted at "
                     f"{geo.dtype} (an upper bound)")
    return ModelSpec(model=model, source=source, geometry=geo, checkpoint=checkpoint or CheckpointInfo(),
                     notes=tuple(extra), config=config if isinstance(config, Mapping) else {})


def load_bundled(repo_id: str) -> ModelSpec:
    key = _BUNDLED_LOWER[repo_id.lower()]
    file, fmt = BUNDLED[key]
    raw = _read_json(SPECS_DIR / file, "bundled config")
    config, notes = _apply_format(raw, fmt, file)
    return spec_from_config(config, key, f"bundled {file}", notes=tuple(notes), where=file)


def is_bundled(repo_id: str) -> bool:
    return repo_id.lower() in _BUNDLED_LOWER


# ---------------------------------------------------------------------------------------------
# Hugging Face Hub, with an offline cache


def cache_path(repo_id: str) -> Path:
    from sparkconsole.config import state_dir

    owner, name = validate_model_id(repo_id).split("/")
    return state_dir() / "specs" / f"{owner}--{name}.json"


def _bucket(name: str, num_layers: int) -> str:
    group = "mtp" if is_mtp_name(name, num_layers) else "visual" if is_visual_name(name) else "lm"
    base = canonical_name(name)
    leaf = base.rsplit(".", 1)[-1]
    if group == "visual":
        return "visual:sharded"
    if ("norm" in leaf or leaf in ("gate", "shared_expert_gate", "e_score_correction_bias", "q_a_proj",
                                   "kv_a_proj_with_mqa", "A_log", "dt_bias", "D")
            or name.endswith("e_score_correction_bias")):
        shard = "replicated"
    elif leaf in ("k_proj", "v_proj"):
        shard = "kv"
    else:
        shard = "sharded"
    return f"{group}:{shard}"


def summarize_safetensors(meta: Any, num_layers: int) -> CheckpointInfo:
    """Bucket exact tensor bytes from ``huggingface_hub``'s ``SafetensorsRepoMetadata``."""
    buckets: dict[str, int] = {}
    total = 0
    for fmeta in meta.files_metadata.values():
        for tname, info in fmeta.tensors.items():
            start, end = info.data_offsets
            size = int(end) - int(start)
            total += size
            b = _bucket(tname, num_layers)
            buckets[b] = buckets.get(b, 0) + size
    return CheckpointInfo(
        total_size=total,
        has_mtp=any(k.startswith("mtp:") for k in buckets),
        has_visual=any(k.startswith("visual:") for k in buckets),
        tensor_bytes=buckets,
    )


HUB_CONNECT_TIMEOUT = 5.0  # seconds to open the Hub's port before the plan says it cannot


def _hub_unreachable(endpoint: str) -> str | None:
    """Why the Hub's host cannot be reached (None: it answers, or a proxy stands between).

    huggingface_hub retries a refused or unresolved connection five times with back-off (about 24 s
    of "Retrying in 1s" warnings) before it gives up; one plain connect, bounded, says the same at
    once. Behind a proxy the direct connect proves nothing, so the library's own request decides."""
    import socket
    from urllib.parse import urlsplit

    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy",
                                       "ALL_PROXY", "all_proxy")):
        return None
    url = urlsplit(endpoint)
    if not url.hostname:
        return None
    port = url.port or (80 if url.scheme == "http" else 443)
    try:
        with socket.create_connection((url.hostname, port), timeout=HUB_CONNECT_TIMEOUT):
            return None
    except OSError as exc:
        return (exc.strerror or exc.__class__.__name__).strip() or exc.__class__.__name__


def _fetch_hub(repo_id: str) -> dict[str, Any]:
    """config.json + safetensors headers from the Hub (or ``$HF_ENDPOINT``); no weights."""
    import logging

    try:
        from huggingface_hub import HfApi, constants
        from huggingface_hub.errors import HfHubHTTPError, NotASafetensorsRepoError
    except ImportError:  # pragma: no cover - a declared dependency
        raise UserError("huggingface_hub is not installed; give a local config.json instead") from None
    endpoint = os.environ.get("HF_ENDPOINT") or None
    down = _hub_unreachable(endpoint or constants.ENDPOINT)
    if down:
        raise UserError(f"{repo_id}: cannot reach the Hugging Face Hub ({down}) and no cached spec; give a "
                        "local config.json or directory instead")
    # the library's retry warnings would be lines of their own before the one-line error
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    api = HfApi(endpoint=endpoint)
    try:
        cfg_path = api.hf_hub_download(repo_id, "config.json", etag_timeout=HUB_CONNECT_TIMEOUT * 2)
        config = _read_json(Path(cfg_path), "config.json")
        geo = geometry_from_config(config, f"{repo_id}: config.json")
        try:
            meta = api.get_safetensors_metadata(repo_id)
            ck = summarize_safetensors(meta, geo.num_layers)
            st = {"total_size": ck.total_size, "has_mtp": ck.has_mtp, "has_visual": ck.has_visual,
                  "tensor_bytes": dict(ck.tensor_bytes or {})}
        except NotASafetensorsRepoError:
            st = None
    except UserError:
        raise
    except HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status in (401, 403, 404):
            raise UserError(f"{repo_id}: not found on the Hugging Face Hub (or gated: HTTP {status})") from None
        raise UserError(f"{repo_id}: Hugging Face Hub error: {str(exc).splitlines()[0]}") from None
    except Exception as exc:  # network down, offline mode, DNS...
        raise UserError(
            f"{repo_id}: cannot reach the Hugging Face Hub and no cached spec "
            f"({exc.__class__.__name__}); give a local config.json or directory instead"
        ) from None
    return {"schema": CACHE_SCHEMA, "repo_id": repo_id, "config": config, "safetensors": st}


def _from_cache_doc(doc: Any, repo_id: str, source: str) -> ModelSpec:
    if not isinstance(doc, Mapping) or doc.get("schema") != CACHE_SCHEMA or "config" not in doc:
        raise UserError(f"{source}: not a sparkconsole spec cache file (delete it to refetch)")
    st = doc.get("safetensors")
    ck = CheckpointInfo()
    if isinstance(st, Mapping):
        tb = st.get("tensor_bytes")
        ck = CheckpointInfo(
            total_size=st.get("total_size") if isinstance(st.get("total_size"), int) else None,
            has_mtp=st.get("has_mtp") if isinstance(st.get("has_mtp"), bool) else None,
            has_visual=st.get("has_visual") if isinstance(st.get("has_visual"), bool) else None,
            tensor_bytes={str(k): int(v) for k, v in tb.items() if isinstance(v, int)}
            if isinstance(tb, Mapping) else None,
        )
    return spec_from_config(doc["config"], repo_id, source, checkpoint=ck, where=f"{repo_id}: config.json")


def load_hub(repo_id: str, offline: bool = False) -> ModelSpec:
    """A repo id through the cache, else the Hub (then cached)."""
    path = cache_path(repo_id)
    if path.exists():
        return _from_cache_doc(_read_json(path, "cached spec"), repo_id, f"cached {path.name}")
    if offline or os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise UserError(f"{repo_id}: not bundled and not cached, and offline (give a local config.json "
                        "or model directory)")
    doc = _fetch_hub(repo_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc), encoding="utf-8")
    tmp.replace(path)
    return _from_cache_doc(doc, repo_id, "huggingface_hub (headers only)")


def spec_from_hub_files(repo_id: str, config_text: str, index_text: str | None, where: str) -> ModelSpec:
    """A spec from the Hub's ``config.json`` (and ``model.safetensors.index.json`` when there is
    one) as a node read them (the laptop may have no route to the Hub while a Spark does); cached
    like a laptop fetch, so ``plan`` and later runs find it offline. The index gives the checkpoint's
    size and whether it holds MTP or vision weights, not the per-tensor bytes a header read gives."""
    try:
        config = json.loads(config_text)
    except ValueError:
        raise UserError(f"{repo_id}: the Hub's config.json read through {where} is not JSON") from None
    geometry_from_config(config, f"{repo_id}: config.json")  # a bad config fails here, with its reason
    st = None
    if index_text:
        with tempfile.TemporaryDirectory() as tmp:
            idx_path = Path(tmp) / "model.safetensors.index.json"
            idx_path.write_text(index_text, encoding="utf-8")
            try:
                ck = _index_info(idx_path)
                st = {"total_size": ck.total_size, "has_mtp": ck.has_mtp, "has_visual": ck.has_visual,
                      "tensor_bytes": None}
            except UserError:
                st = None
    doc = {"schema": CACHE_SCHEMA, "repo_id": repo_id, "config": config, "safetensors": st}
    path = cache_path(repo_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_file = path.with_suffix(".tmp")
    tmp_file.write_text(json.dumps(doc), encoding="utf-8")
    tmp_file.replace(path)
    return _from_cache_doc(doc, repo_id, f"the Hub through {where} (config + index)")


# ---------------------------------------------------------------------------------------------


def _with_hf_quant(config: Any, folder: Path) -> Any:
    """ModelOpt checkpoints may keep their scheme in ``hf_quant_config.json`` beside config.json
    (vLLM reads it there too): merged in when config.json has no quantization_config."""
    hq = folder / "hf_quant_config.json"
    if not isinstance(config, dict) or "quantization_config" in config or not hq.is_file():
        return config
    doc = _read_json(hq, "hf_quant_config.json")
    if isinstance(doc, Mapping) and isinstance(doc.get("quantization"), Mapping):
        config = dict(config, quantization_config={"quant_method": "modelopt", **doc["quantization"]})
    return config


def load_spec(model: str, offline: bool = False) -> ModelSpec:
    """Resolve MODEL: a config.json path, a model directory, a bundled id, or a Hub repo id."""
    if not isinstance(model, str) or not model.strip():
        raise ValidationError("no model given")
    if "\x00" in model or len(model) > 4096:
        raise ValidationError(f"not a model id or path: {model[:60]!r}")
    p = Path(model).expanduser()
    if p.is_file():
        config = _with_hf_quant(_read_json(p, "config"), p.parent)
        ck = None
        idx = p.with_name("model.safetensors.index.json")
        if p.name == "config.json" and idx.is_file():
            ck = _index_info(idx)
        return spec_from_config(config, str(p), "config.json", checkpoint=ck, where=str(p))
    if p.is_dir():
        cfg = p / "config.json"
        if not cfg.is_file():
            raise UserError(f"{p}: no config.json in this directory")
        idx = p / "model.safetensors.index.json"
        ck = _index_info(idx) if idx.is_file() else None
        source = "local directory" + (" + safetensors index" if ck else "")
        return spec_from_config(_with_hf_quant(_read_json(cfg, "config"), p), str(p), source, checkpoint=ck,
                                where=str(cfg))
    if model.startswith(("/", "./", "~")) or model.endswith(".json"):
        raise UserError(f"{model}: no such file or directory")
    validate_model_id(model)
    if is_bundled(model):
        return load_bundled(model)
    return load_hub(model, offline=offline)
