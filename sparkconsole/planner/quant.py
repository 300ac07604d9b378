"""Quantised weight formats: bytes per weight, their scales, and what each format leaves alone.

This is the ONE place where a checkpoint's ``quantization_config`` becomes bytes. Every figure is
what vLLM holds on the GPU after loading (the number behind "Model loading took X GiB"), taken from
the parameters vLLM's loader creates for that format, not from the file sizes.

| format (config) | weight | scales (+ what else vLLM creates) | left unquantised by default | vLLM loader (source) |
|---|---|---|---|---|
| ``fp8`` (block, e.g. Qwen ``-FP8``) | 1 B | fp32 per ``weight_block_size`` block (128x128: 4 B per 16,384 weights) | ``modules_to_not_convert`` / ``ignored_layers`` (substring of the module name) | ``quantization/fp8.py`` |
| ``modelopt`` ``FP8`` | 1 B | fp32 ``weight_scale`` + ``input_scale`` per tensor | ``exclude_modules`` / ``ignore`` (fnmatch ``*`` patterns) | ``quantization/modelopt.py`` ``ModelOptFp8Config`` |
| ``modelopt`` ``FP8_PER_CHANNEL_PER_TOKEN`` | 1 B | fp32 per output channel | as above | ``modelopt.py`` |
| ``modelopt`` ``FP8_PB_WO`` | 1 B | fp32 per 128x128 block | as above | ``modelopt.py`` |
| ``modelopt`` ``NVFP4`` (W4A4) / ``W4A16_NVFP4`` | 0.5 B (two e2m1 per byte) | fp8-e4m3 per 16 weights (``group_size``) + fp32 ``weight_scale_2`` and ``input_scale`` per tensor | as above | ``modelopt.py`` ``ModelOptNvFp4Config`` (docs: docs.vllm.ai quantization/modelopt) |
| ``modelopt`` ``MIXED_PRECISION`` | per layer: ``quantized_layers[name].quant_algo`` (any of the above); a layer not listed is unquantised | | | ``modelopt.py`` ``ModelOptMixedPrecisionConfig`` |
| ``compressed-tensors`` ``float-quantized`` (FP8) | 1 B | fp32 per channel (``strategy: channel``), per tensor, or per block; ``dynamic: false`` inputs add one fp32 ``input_scale`` | modules no ``config_groups[*].targets`` matches, and ``ignore`` | ``quantization/compressed_tensors/`` (``schemes/compressed_tensors_w8a8_fp8.py``) |
| ``compressed-tensors`` ``nvfp4-pack-quantized`` | 0.5 B | fp8 per 16 + fp32 global scale(s) | as above | ``schemes/compressed_tensors_w4a4_nvfp4.py`` / ``_w4a16_nvfp4.py`` |
| ``compressed-tensors`` ``pack-quantized`` (int4/int8 WNA16) | ``num_bits`` / 8 B (packed in int32) | model-dtype scale per ``group_size`` (or per channel); int32-packed zero points when ``symmetric: false``; int32 ``g_idx`` per input column with ``actorder: group`` | as above | ``schemes/compressed_tensors_wNa16.py`` |
| ``mxfp4`` (gpt-oss) | 0.5 B, MoE experts only | one e8m0 byte per 32 weights; bf16 expert biases | every linear that is not a MoE expert (vLLM's ``Mxfp4Config`` gives them no quant method), whatever ``modules_to_not_convert`` says | ``quantization/mxfp4.py`` |
| ``gptq`` / ``awq`` / ``auto-round`` | ``bits`` / 8 B | fp16 scale per ``group_size``; zero points: AWQ keeps int32-packed ones; symmetric GPTQ-format weights (gptq_marlin) drop them in a linear and keep ``bits`` / 2 bits per group column in a MoE expert; asymmetric GPTQ (plain ``gptq``) keeps int32-packed ones; ``desc_act`` adds int32 ``g_idx`` (+ sort indices on Marlin) per input column | ``modules_to_not_convert`` (substring), GPTQ ``dynamic`` ``-:regex``, AutoRound ``extra_config`` (``bits`` >= 16 keeps a layer) and ``block_name_to_quantize`` (only layers under those blocks are quantised: vision, MTP stay bf16) | ``gptq.py``, ``awq.py``, ``auto_round.py`` |

Always unquantised, whatever the format (vLLM builds them without a quant method): embeddings,
``lm_head`` (``ParallelLMHead`` is not a ``LinearBase``; the one exception: a ModelOpt
``MIXED_PRECISION`` checkpoint that lists ``lm_head`` in ``quantized_layers``, which vLLM 0.23+ loads
quantised), norms, the GDN / Mamba ``conv1d``, MoE
router gates. ``ignore`` of compressed-tensors is matched the way its own tools and vLLM's
``compressed_tensors/utils.py::should_ignore_layer`` match it: ``re:PATTERN`` is ``re.match`` (anchored
at the start only) against the module's full checkpoint name, anything else must equal that name;
a fused vLLM layer (``qkv_proj``, ``gate_up_proj``) is ignored when its shards are. ModelOpt's
``exclude_modules`` are ``fnmatch`` patterns (``model.layers.*.mlp.gate``); a pattern naming a parent
module (``model.visual``, ``mtp*``) covers everything under it.

Which kernel holds the weights decides the bytes, and the one counted is a GB10's (SM121): Marlin for
GPTQ / AWQ / AutoRound and, without native FP4 kernels, for NVFP4. A Hopper GPU runs GPTQ and AWQ on
Machete from vLLM 0.19 (zero points kept, AWQ's unpacked to bf16): an H100 load of those is larger.

Scales of fused shards (``weight_scale_2``, ``input_scale`` per logical tensor) are counted per
tensor; they are a few bytes. NVFP4 block scales are swizzled to 128x4 tiles on load: rows are
padded to a multiple of 128 and scale columns to a multiple of 4 (counted).
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sparkconsole.errors import UserError

# part kinds that vLLM never quantises (see the module doc)
NEVER_QUANTISED = frozenset({"embed", "norm", "param", "router", "conv", "buffer"})


@dataclass(frozen=True)
class Scheme:
    """How one linear's weight is stored once vLLM has loaded it."""

    name: str                       # e.g. "nvfp4", "fp8-block", "fp8-channel", "int4-g128", "mxfp4"
    weight_bits: float              # bits per weight element
    group: int | None = None        # weights per scale along the input dimension
    group_scale_bytes: float = 0.0  # bytes of one group scale
    block: tuple[int, int] | None = None  # 2-D block scales (fp8 block)
    channel_scale_bytes: float = 0.0      # per output row
    tensor_bytes: float = 0.0       # per tensor scalars (weight_scale_2, input_scale, global scales)
    zero_bits: float = 0.0          # packed zero point per group (asymmetric int)
    moe_zero_bits: float | None = None  # zero point per group of a fused MoE expert, when it differs
    g_idx_bytes: float = 0.0        # per input column (act-order)
    swizzle: bool = False           # NVFP4 scales padded to 128 x 4 tiles
    bias_bytes: float = 0.0         # per output row (mxfp4 expert biases)

    def bytes(self, rows: int, cols: int, moe: bool = False) -> float:
        """Bytes of one ``rows x cols`` (out x in) weight in this scheme (``moe``: a fused MoE
        expert's, whose zero points some loaders keep where a plain linear drops them)."""
        b = rows * cols * self.weight_bits / 8
        if self.group:
            ncols = math.ceil(cols / self.group)
            nrows = rows
            if self.swizzle:
                nrows, ncols = -(-rows // 128) * 128, -(-ncols // 4) * 4
            b += nrows * ncols * self.group_scale_bytes
            zb = self.moe_zero_bits if moe and self.moe_zero_bits is not None else self.zero_bits
            b += rows * math.ceil(cols / self.group) * zb / 8
        if self.block:
            b += math.ceil(rows / self.block[0]) * math.ceil(cols / self.block[1]) * 4
        b += rows * (self.channel_scale_bytes + self.bias_bytes) + cols * self.g_idx_bytes + self.tensor_bytes
        return b


FP8_TENSOR = Scheme("fp8-tensor", 8, tensor_bytes=8)            # weight_scale + input_scale, fp32
FP8_CHANNEL = Scheme("fp8-channel", 8, channel_scale_bytes=4)   # fp32 per output channel
NVFP4 = Scheme("nvfp4", 4, group=16, group_scale_bytes=1, tensor_bytes=8, swizzle=True)
MXFP4 = Scheme("mxfp4", 4, group=32, group_scale_bytes=1, bias_bytes=2)
# vLLM's mxfp4.py, Marlin backend: "the moe marlin kernel requires ... n % 256 == 0 and k % 128 == 0",
# so the experts are created padded (hidden to 256, intermediate to 128). It is the backend vLLM picks
# on a GB10 (SM121 falls through the SM90/SM100 FlashInfer and Triton paths) and on pre-Hopper GPUs.
MARLIN_MXFP4_PAD = (256, 128)


def fp8_block(block: tuple[int, int]) -> Scheme:
    return Scheme(f"fp8-block{block[0]}x{block[1]}", 8, block=block)


def int_group(bits: int, group: int | None, scale_bytes: float = 2, zero: bool = True,
              g_idx: bool = False, g_idx_bytes: float = 4, moe_zero_bits: float | None = None) -> Scheme:
    """GPTQ/AWQ/AutoRound/compressed-tensors WNA16: ``bits`` per weight, a model-dtype scale per
    group (per channel when ``group`` is None), a packed zero point per group when asymmetric."""
    name = f"int{bits}-" + (f"g{group}" if group else "channel")
    if group is None:
        return Scheme(name, bits, channel_scale_bytes=scale_bytes + (bits / 8 if zero else 0))
    return Scheme(name, bits, group=group, group_scale_bytes=scale_bytes, zero_bits=bits if zero else 0,
                  g_idx_bytes=g_idx_bytes if g_idx else 0, moe_zero_bits=moe_zero_bits)


# ---------------------------------------------------------------------------------------------
# name matching, as each format's own tools match


def ct_match(name: str, target: str) -> bool:
    """compressed-tensors: ``re:`` is ``re.match`` (start-anchored), else the exact name."""
    if target.startswith("re:"):
        try:
            return re.match(target[3:], name) is not None
        except re.error:
            return False
    return target == name


def fn_match(name: str, pattern: str) -> bool:
    """ModelOpt / gpt-oss ``*`` patterns: the module itself or anything under it."""
    return fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, pattern.rstrip(".") + ".*")


def substring_match(name: str, key: str) -> bool:
    """GPTQ/AWQ/fp8 ``modules_to_not_convert``: a dotted component run of the name."""
    return f".{key}." in f".{name}." or name.startswith(key + ".") or name == key


@dataclass(frozen=True)
class QuantFormat:
    """A checkpoint's quantisation: which scheme each linear gets (None: unquantised)."""

    method: str                                   # "modelopt" | "compressed-tensors" | "mxfp4" | "gptq" ...
    label: str                                    # e.g. "NVFP4", "FP8 channel", "MXFP4 experts"
    default: Scheme | None                        # scheme of a linear nothing else decides
    rules: tuple[tuple[str, str, Scheme | None], ...] = ()  # (match kind, pattern, scheme), first wins
    skip: tuple[tuple[str, str], ...] = ()        # (match kind, pattern): unquantised
    only_experts: bool = False                    # mxfp4: experts only
    expert_pad: tuple[int, int] | None = None     # routed experts' (hidden, intermediate) padded to multiples
    only_under: tuple[str, ...] = ()              # AutoRound block_name_to_quantize
    quantized_lm_head: bool = False               # ModelOpt MIXED_PRECISION listing lm_head (vLLM 0.23+)
    source: str = ""
    notes: tuple[str, ...] = field(default=())

    def scheme_for(self, names: Iterable[str], kind: str, module: str) -> Scheme | None:
        """The scheme of a linear known by ``names`` (its checkpoint names, fused shards included)."""
        lm_head = self.quantized_lm_head and module == "lm_head"
        if kind in NEVER_QUANTISED and not lm_head:
            return None
        names = tuple(names)
        if self.only_experts and module not in ("routed experts",):
            return None
        if self.only_under and not any(n.startswith(b + ".") or n == b for n in names for b in self.only_under):
            return None
        for how, pat in self.skip:
            if any(_MATCH[how](n, pat) for n in names):
                return None
        for how, pat, scheme in self.rules:
            if any(_MATCH[how](n, pat) for n in names):
                return scheme
        return self.default


_MATCH = {"ct": ct_match, "fn": fn_match, "sub": substring_match,
          "re": lambda n, p: _safe_search(p, n)}


def _safe_search(pattern: str, name: str) -> bool:
    try:
        return re.search(pattern, name) is not None
    except re.error:
        return False


# ---------------------------------------------------------------------------------------------
# reading quantization_config blocks


def _bad(where: str, msg: str) -> UserError:
    return UserError(f"{where}: quantization_config: {msg}")


def _strs(q: Mapping[str, Any], key: str, where: str) -> list[str]:
    v = q.get(key)
    if v is None:
        return []
    if isinstance(v, str):
        return [v]
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise _bad(where, f"{key!r} must be a list of names")
    return list(v)


def _int(v: Any, default: int | None) -> int | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return default
    return int(v)


def modelopt_scheme(algo: str, group: int | None = None) -> Scheme | None:
    """A ModelOpt ``quant_algo`` as a scheme; None for anything vLLM leaves unquantised."""
    a = algo.upper()
    if a in ("NVFP4", "W4A16_NVFP4", "NVFP4_AWQ", "W4A8_NVFP4_FP8"):
        g = group or 16
        return Scheme(a.lower(), 4, group=g, group_scale_bytes=1, tensor_bytes=8, swizzle=True)
    if a == "FP8":
        return FP8_TENSOR
    if a == "FP8_PER_CHANNEL_PER_TOKEN":
        return FP8_CHANNEL
    if a in ("FP8_PB_WO", "FP8_BLOCK"):
        return fp8_block((group or 128, group or 128))
    if a == "MXFP8":
        return Scheme("mxfp8", 8, group=32, group_scale_bytes=1)
    if a in ("W4A16_AWQ", "INT4_AWQ", "W4A8_AWQ"):
        return int_group(4, group or 128, zero=False)
    return None


def _modelopt(q: Mapping[str, Any], where: str) -> QuantFormat:
    inner = q.get("quantization") if isinstance(q.get("quantization"), Mapping) else q
    algo = str(inner.get("quant_algo") or "").upper()
    group = _int(inner.get("group_size"), None)
    skip = tuple(("fn", p) for p in _strs(inner, "exclude_modules", where) + _strs(q, "ignore", where))
    if algo == "MIXED_PRECISION":
        layers = inner.get("quantized_layers") or q.get("quantized_layers") or {}
        if not isinstance(layers, Mapping):
            raise _bad(where, "'quantized_layers' must be an object")
        rules = []
        algos: dict[str, int] = {}
        for name, spec in layers.items():
            if not isinstance(spec, Mapping):
                continue
            la = str(spec.get("quant_algo") or "")
            rules.append(("fn", str(name), modelopt_scheme(la, _int(spec.get("group_size"), group))))
            algos[la.upper()] = algos.get(la.upper(), 0) + 1
        label = "MIXED_PRECISION (" + ", ".join(f"{k} x{v}" for k, v in sorted(algos.items())) + ")"
        head = next((r for r in rules if r[1] == "lm_head" and r[2] is not None), None)
        notes = () if head is None else (
            f"lm_head is listed as {head[2].name.upper()} and counted so: vLLM 0.23+ builds ParallelLMHead with "
            "the quant config (modelopt.py checks LinearBase or ParallelLMHead); 0.22 and older keep it bf16, "
            "which costs vocab x hidden x 2 B instead",)
        return QuantFormat("modelopt", label, None, tuple(rules), skip, quantized_lm_head=head is not None,
                           source="modelopt.py ModelOptMixedPrecisionConfig", notes=notes)
    scheme = modelopt_scheme(algo, group)
    if scheme is None:
        raise _bad(where, f"modelopt quant_algo {algo or '(none)'!r} is not known")
    return QuantFormat("modelopt", algo, scheme, (), skip, source="modelopt.py")


def _ct_scheme(weights: Mapping[str, Any], fmt: str, group_input: Mapping[str, Any] | None) -> Scheme | None:
    bits = _int(weights.get("num_bits"), 8) or 8
    typ = str(weights.get("type") or "int")
    strategy = str(weights.get("strategy") or ("group" if weights.get("group_size") else "channel"))
    group = _int(weights.get("group_size"), None)
    static_input = bool(group_input) and group_input.get("dynamic") is False
    extra = 4.0 if static_input else 0.0
    if typ == "float" and bits == 4:  # nvfp4-pack-quantized (W4A4 or W4A16)
        g = group or 16
        # weight_global_scale, plus input_global_scale when activations are quantised (W4A4)
        return Scheme("nvfp4", 4, group=g, group_scale_bytes=1, tensor_bytes=4 + (4 if group_input else 0),
                      swizzle=True)
    if typ == "float" and bits == 8:
        if strategy == "block":
            blk = weights.get("block_structure") or [128, 128]
            b = (int(blk[0]), int(blk[1])) if isinstance(blk, list) and len(blk) == 2 else (128, 128)
            return Scheme(f"fp8-block{b[0]}x{b[1]}", 8, block=b, tensor_bytes=extra)
        if strategy == "channel":
            return Scheme("fp8-channel", 8, channel_scale_bytes=4, tensor_bytes=extra)
        if strategy == "group":
            return Scheme(f"fp8-g{group}", 8, group=group or 128, group_scale_bytes=4, tensor_bytes=extra)
        return Scheme("fp8-tensor", 8, tensor_bytes=4 + extra)
    if typ == "int":
        sym = weights.get("symmetric") is not False
        actorder = str(weights.get("actorder") or "") == "group"
        if fmt in ("naive-quantized", "int-quantized") and bits == 8:  # W8A8 int8
            return Scheme("int8-channel", 8, channel_scale_bytes=4, tensor_bytes=extra)
        return int_group(bits, group if strategy == "group" else None, zero=not sym, g_idx=actorder)
    return None


def _compressed_tensors(q: Mapping[str, Any], where: str) -> QuantFormat:
    groups = q.get("config_groups") or {}
    if not isinstance(groups, Mapping):
        raise _bad(where, "'config_groups' must be an object")
    top_fmt = str(q.get("format") or "")
    rules: list[tuple[str, str, Scheme | None]] = []
    default: Scheme | None = None
    labels = []
    for g in groups.values():
        if not isinstance(g, Mapping) or not isinstance(g.get("weights"), Mapping):
            continue
        fmt = str(g.get("format") or top_fmt)
        scheme = _ct_scheme(g["weights"], fmt, g.get("input_activations")
                            if isinstance(g.get("input_activations"), Mapping) else None)
        labels.append(f"{fmt or 'compressed'} {scheme.name if scheme else '?'}")
        for t in _strs(g, "targets", where):
            if t in ("Linear", "FusedMoE", "re:.*"):
                default = default or scheme
            else:
                rules.append(("ct", t, scheme))
    skip = tuple(("ct", p) for p in _strs(q, "ignore", where))
    return QuantFormat("compressed-tensors", "; ".join(dict.fromkeys(labels)) or "compressed-tensors", default,
                       tuple(rules), skip, source="compressed_tensors/compressed_tensors.py")


def _gptq_like(q: Mapping[str, Any], method: str, where: str) -> QuantFormat:
    bits = _int(q.get("bits", q.get("w_bit")), 4) or 4
    group = _int(q.get("group_size", q.get("q_group_size")), 128)
    sym = q.get("sym", q.get("symmetric"))
    desc_act = bool(q.get("desc_act"))
    if method == "awq":
        # awq_marlin keeps the zero points (repacked, same int32 size), in a linear and in MoE experts
        zero, marlin = q.get("zero_point") is not False, True
    else:
        # GPTQ-format weights (gptq, AutoRound's auto_gptq packing): symmetric 4/8-bit runs on
        # gptq_marlin, whose linear layers replace qzeros with an empty tensor (MarlinLinearKernel:
        # zero_points=False) and whose MoE layers keep qzeros in the model dtype, one value per
        # packed int32 column (GPTQMarlinMoEMethod: bits / 2 bits per group column). Asymmetric
        # GPTQ is not Marlin-compatible and stays on the plain gptq path with int32-packed zeros.
        zero = sym is False
        marlin = not zero and bits in (4, 8)
    moe_zero = bits / 2 if method != "awq" and marlin else None
    # act-order: Marlin keeps the sorted g_idx and its sort indices (int32 each), plain gptq the g_idx
    gidx_b = 8 if marlin else 4

    def scheme(b: int, g: int | None) -> Scheme | None:
        if b >= 16:
            return None
        return int_group(b, g if g and g > 0 else None, zero=zero, g_idx=desc_act and method != "awq",
                         g_idx_bytes=gidx_b, moe_zero_bits=moe_zero)
    base = scheme(bits, group)
    skip: list[tuple[str, str]] = [("sub", k) for k in _strs(q, "modules_to_not_convert", where)]
    rules: list[tuple[str, str, Scheme | None]] = []
    dyn = q.get("dynamic")
    if isinstance(dyn, Mapping):  # GPTQModel: "-:regex" skip, "+:regex" / "regex" override
        for k, v in dyn.items():
            k = str(k)
            if k.startswith("-:"):
                skip.append(("re", k[2:]))
            elif isinstance(v, Mapping):
                b = _int(v.get("bits"), bits) or bits
                g = _int(v.get("group_size"), group)
                rules.append(("re", k[2:] if k.startswith("+:") else k, scheme(b, g)))
    extra = q.get("extra_config")
    if isinstance(extra, Mapping):  # AutoRound: per-layer bits, names or regexes
        for k, v in extra.items():
            if not isinstance(v, Mapping):
                continue
            b = _int(v.get("bits"), bits) or bits
            g = _int(v.get("group_size"), group)
            how = "re" if any(c in str(k) for c in "*^$[]\\") else "sub"
            rules.append((how, str(k), scheme(b, g)))
    blocks = q.get("block_name_to_quantize")
    if isinstance(blocks, str):
        only = tuple(x.strip() for x in blocks.split(",") if x.strip())
    elif isinstance(blocks, list):
        only = tuple(str(x) for x in blocks)
    else:
        only = ()
    label = f"{method.upper()} int{bits}" + (f" g{group}" if group and group > 0 else "")
    notes = () if method == "awq" or not zero else (
        f"asymmetric {method} weights: counted on vLLM's plain gptq kernel (zero points kept); vLLM 0.22 and "
        "newer have no kernel for them and refuse to load the checkpoint",)
    return QuantFormat(method, label, base, tuple(rules), tuple(skip), only_under=only, notes=notes,
                       source={"gptq": "gptq.py / gptq_marlin.py", "awq": "awq.py / awq_marlin.py",
                               "auto-round": "auto_round.py"}.get(method, method))


def parse_format(q: Mapping[str, Any], where: str = "config.json") -> QuantFormat | None:
    """A ``quantization_config`` (or ``hf_quant_config.json``) as a :class:`QuantFormat`; None for
    the FP8 block method (kept on the older, tested path) and for no quantisation."""
    method = str(q.get("quant_method") or "").lower().replace("_", "-")
    if not method and isinstance(q.get("quantization"), Mapping):
        method = "modelopt"  # hf_quant_config.json: {"producer": ..., "quantization": {...}}
    if method in ("modelopt", "modelopt-fp4", "modelopt-mixed", "modelopt-mxfp8"):
        return _modelopt(q, where)
    if method == "compressed-tensors":
        return _compressed_tensors(q, where)
    if method == "mxfp4":
        return QuantFormat("mxfp4", "MXFP4 experts", MXFP4, only_experts=True, source="mxfp4.py",
                           expert_pad=MARLIN_MXFP4_PAD,
                           notes=("mxfp4: vLLM quantises only the MoE experts (attention, router, embeddings "
                                  "bf16); on a GB10 (SM121), as on GPUs without FP4, it takes the Marlin MoE path, "
                                  "which pads each expert's hidden size to a multiple of 256 and its intermediate "
                                  "size to 128 (counted: gpt-oss 2,880 -> 3,072 / 2,944, about 7% more; an image built with "
                                  "the CUTLASS MXFP4 path loads the checkpoint as stored)",))
    if method in ("gptq", "gptq-marlin"):
        return _gptq_like(q, "gptq", where)
    if method in ("awq", "awq-marlin"):
        return _gptq_like(q, "awq", where)
    if method in ("auto-round", "autoround", "intel/auto-round"):
        return _gptq_like(q, "auto-round", where)
    return None
