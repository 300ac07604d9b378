"""Write a MINIATURE of a model: the same architecture and quantization format, random weights, tiny.

Why it exists: before 119 GB of weights move to the nodes, the deploy wizard runs a *canary* — it
serves a miniature of the chosen model with the engine image's own Python and the recipe's flags, sends
one chat and stops. That catches, in about a minute, what would otherwise fail after an hour of copying:
an unknown flag, a config or tokenizer the image cannot load, missing GPU kernels (the block-FP8
CUTLASS GEMM on sm_121), a tool-parser or chat-template error. So the miniature must be *the model's
own format* — tensor names, dtypes, shapes rules, ``quantization_config`` — only small.

This file is a STANDALONE program, stdlib only (no torch, numpy or safetensors): it is piped over ssh
into an arbitrary engine image (``python3 - SRC OUT < miniature_writer.py``) and run in CI where there
is no torch. It keeps to Python 3.8 syntax at run time for the same reason.

Input: a model directory holding the real ``config.json`` (and the tokenizer files, copied unchanged),
or a ``config.json`` path. Output: a directory with a shrunk ``config.json``, ``model.safetensors``
(or shards plus ``model.safetensors.index.json``), the tokenizer files and ``generation_config.json``.

It prints one line per phase on stdout, ``::miniature:: <phase> <json>`` (phases: ``config``,
``plan``, ``written`` (one per file), ``copied``, ``done``), for the console to show; bad input gives ONE
line on stderr and exit status 2.

Sources the tensor names and shapes come from (read, not copied):

* transformers ``models/qwen3_5_moe/modeling_qwen3_5_moe.py`` (5.17.0): ``Qwen3_5MoeGatedDeltaNet``
  (``in_proj_qkv`` [2*key_dim+value_dim, H], ``in_proj_z`` [value_dim, H], ``in_proj_b``/``in_proj_a``
  [num_v_heads, H], ``conv1d`` [conv_dim, 1, K], ``dt_bias``/``A_log`` [num_v_heads], ``norm``
  [head_v_dim], ``out_proj`` [H, value_dim]); ``Qwen3_5MoeAttention`` (``q_proj`` doubled by the output
  gate, ``q_norm``/``k_norm`` [head_dim]); ``Qwen3_5MoeSparseMoeBlock`` (``gate`` [E, H],
  ``shared_expert``, ``shared_expert_gate`` [1, H]); the vision tower (``patch_embed.proj`` Conv3d,
  ``pos_embed``, ``blocks.N.{norm1,norm2,attn.qkv,attn.proj,mlp.linear_fc1,mlp.linear_fc2}``,
  ``merger.{norm,linear_fc1,linear_fc2}``).
* transformers ``conversion_mapping.py`` ("qwen2_moe" converter, reused for ``qwen3_5_moe_text``):
  checkpoints keep experts PER EXPERT, ``mlp.experts.E.{gate,up,down}_proj.weight``, merged at load time
  into ``experts.gate_up_proj``; the fine-grained FP8 quantizer merges ``..._proj.weight_scale_inv``
  the same way (``integrations/finegrained_fp8.py`` ``FP8Linear``/``FP8Experts``: scales float32
  [ceil(out/128), ceil(in/128)]).
* vLLM ``model_executor/models/qwen3_5.py`` / ``qwen3_5_mtp.py`` ``load_weights``: the per-expert
  mapping (``ckpt_gate_proj_name="gate_proj"``), and the MTP block ``mtp.fc`` [H, 2H],
  ``mtp.pre_fc_norm_{embedding,hidden}``, ``mtp.layers.N`` (a full-attention MoE layer), ``mtp.norm``.
* the published Qwen3.5-122B-A10B-FP8 ``config.json`` (bundled in sparkconsole/planner/specs): its
  ``modules_to_not_convert`` says which linears stay BF16 (``in_proj_a``/``in_proj_b``, ``mlp.gate``,
  ``shared_expert_gate``, ``conv1d``, the whole vision tower, ``mtp.fc``, ``embed_tokens``, ``lm_head``).

Adding a model family touches one place: :data:`FAMILIES` (a shrink function and a tensor-plan function).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import struct
import sys
import time

EVENT_PREFIX = "::miniature::"
BLOCK = 128  # the default FP8 block edge; the config's weight_block_size wins where it is given
DEFAULT_SHARD_BYTES = 256 * 1024 * 1024
# files a model directory carries beside its weights that the engine reads; copied byte for byte
SIDE_FILES = (
    "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "tokenizer.model",
    "special_tokens_map.json", "added_tokens.json", "chat_template.jinja", "chat_template.json",
    "generation_config.json", "preprocessor_config.json", "video_preprocessor_config.json",
    "processor_config.json",
)
DTYPE_SIZE = {"F8_E4M3": 1, "BF16": 2, "F32": 4}
NAN_FP8 = (0x7F, 0xFF)  # E4M3FN has no infinities; these two codes are its NaNs


class MiniatureError(Exception):
    """Bad input: the message is the one line the caller shows."""


def emit(phase: str, **data: object) -> None:
    """One event line on stdout, flushed at once so a console reading over ssh sees it as it happens."""
    sys.stdout.write(f"{EVENT_PREFIX} {phase} {json.dumps(data, sort_keys=True)}\n")
    sys.stdout.flush()


# --------------------------------------------------------------------------------------------------
# The tensor plan: (name, dtype, shape, fill). ``fill`` says what the bytes look like.
# --------------------------------------------------------------------------------------------------


class Plan:
    """The tensors of one miniature, in writing order, and which linears are FP8-quantized."""

    def __init__(self, quant: dict | None, not_convert: set[str]) -> None:
        self.tensors: list[tuple[str, str, tuple[int, ...], str]] = []
        self.quant = quant
        self.not_convert = not_convert
        block = (quant or {}).get("weight_block_size") or [BLOCK, BLOCK]
        self.block = (int(block[0]), int(block[1]))

    def add(self, name: str, dtype: str, shape: tuple[int, ...] | list[int], fill: str = "small") -> None:
        self.tensors.append((name, dtype, tuple(int(d) for d in shape), fill))

    def quantized(self, module: str) -> bool:
        """FP8 where the checkpoint is fp8 and the module is not on its skip list (the list's entries are
        module paths; transformers' ``should_convert_module`` also skips what lies under one)."""
        if not self.quant or self.quant.get("quant_method") != "fp8":
            return False
        parts = module.split(".")
        return not any(".".join(parts[:i]) in self.not_convert for i in range(1, len(parts) + 1))

    def linear(self, module: str, out_f: int, in_f: int, bias: bool = False) -> None:
        """A linear's weight: FP8 E4M3 bytes plus a float32 ``weight_scale_inv`` of one value per
        128x128 block where quantized (the DeepSeek/Qwen block convention), else BF16."""
        if self.quantized(module):
            self.add(module + ".weight", "F8_E4M3", (out_f, in_f), "fp8")
            bo, bi = self.block
            self.add(module + ".weight_scale_inv", "F32", (math.ceil(out_f / bo), math.ceil(in_f / bi)),
                     "scale")
        else:
            self.add(module + ".weight", "BF16", (out_f, in_f), "small")
        if bias:
            self.add(module + ".bias", "BF16", (out_f,), "zeros")


# --------------------------------------------------------------------------------------------------
# Shared pieces of the Qwen families
# --------------------------------------------------------------------------------------------------


def _attention(plan: Plan, prefix: str, c: dict, gated: bool) -> None:
    """Qwen3-style attention: q/k/v/o plus per-head q_norm/k_norm; Qwen3.5's output gate doubles q_proj."""
    hd = int(c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])
    nh, nkv, h = int(c["num_attention_heads"]), int(c["num_key_value_heads"]), int(c["hidden_size"])
    bias = bool(c.get("attention_bias", False))
    plan.linear(prefix + ".q_proj", nh * hd * (2 if gated else 1), h, bias)
    plan.linear(prefix + ".k_proj", nkv * hd, h, bias)
    plan.linear(prefix + ".v_proj", nkv * hd, h, bias)
    plan.linear(prefix + ".o_proj", h, nh * hd, False)
    plan.add(prefix + ".q_norm.weight", "BF16", (hd,), c.get("_norm_fill", "ones"))
    plan.add(prefix + ".k_norm.weight", "BF16", (hd,), c.get("_norm_fill", "ones"))


def _mlp(plan: Plan, prefix: str, hidden: int, inter: int) -> None:
    plan.linear(prefix + ".gate_proj", inter, hidden)
    plan.linear(prefix + ".up_proj", inter, hidden)
    plan.linear(prefix + ".down_proj", hidden, inter)


def _experts(plan: Plan, prefix: str, c: dict) -> None:
    """The router and the experts, one module per expert as checkpoints store them."""
    h, e, inter = int(c["hidden_size"]), int(c["num_experts"]), int(c["moe_intermediate_size"])
    plan.add(prefix + ".gate.weight", "BF16", (e, h), "small")
    for i in range(e):
        _mlp(plan, f"{prefix}.experts.{i}", h, inter)


def _keep_layers(layer_types: list[str]) -> list[int]:
    """The first layer of each kind, in model order: one of each is what proves the kernels."""
    seen: dict[str, int] = {}
    for i, kind in enumerate(layer_types):
        seen.setdefault(kind, i)
    return sorted(seen.values())


def _remap_not_convert(entries: list[str], layer_map: dict[int, int], layer_prefix: str,
                       keep_visual_blocks: int, keep_mtp_layers: int) -> list[str]:
    """Regenerate ``modules_to_not_convert`` for the kept layers: entries of a kept layer are renumbered,
    those of dropped layers (text layers, vision blocks, MTP layers) go, the rest stay as they were."""
    out: list[str] = []
    pat = re.compile(rf"^{re.escape(layer_prefix)}\.(\d+)\.(.*)$")
    for name in entries:
        m = pat.match(name)
        if m:
            old = int(m.group(1))
            if old in layer_map:
                out.append(f"{layer_prefix}.{layer_map[old]}.{m.group(2)}")
            continue
        m = re.match(r"^(.*\bvisual\.blocks)\.(\d+)\.(.*)$", name)
        if m:
            if int(m.group(2)) < keep_visual_blocks:
                out.append(name)
            continue
        m = re.match(r"^(mtp\.layers)\.(\d+)\.(.*)$", name)
        if m:
            if int(m.group(2)) < keep_mtp_layers:
                out.append(name)
            continue
        out.append(name)
    # a stable order that reads like the original (sorted, as published configs are)
    return sorted(set(out), key=lambda s: (s not in ("lm_head",), s))


# --------------------------------------------------------------------------------------------------
# Family: qwen3_5_moe (Qwen3.5 MoE, e.g. Qwen/Qwen3.5-122B-A10B-FP8) — the headline model
# --------------------------------------------------------------------------------------------------


def shrink_qwen3_5_moe(cfg: dict, dims: dict) -> tuple[dict, dict]:
    """Keep one layer of each kind, the expert count, every head shape and the quantization config;
    shrink the widths; the vision tower keeps its own widths (its head_dim) at depth 1."""
    new = json.loads(json.dumps(cfg))
    t = new["text_config"]
    kinds = t.get("layer_types") or [
        "full_attention" if (i + 1) % int(t.get("full_attention_interval", 4)) == 0 else "linear_attention"
        for i in range(int(t["num_hidden_layers"]))
    ]
    keep = _keep_layers(kinds)
    new_kinds = [kinds[i] for i in keep]
    t["layer_types"] = new_kinds
    t["num_hidden_layers"] = len(keep)
    if "full_attention" in new_kinds and "linear_attention" in new_kinds:
        # transformers/vLLM derive layer kinds as (i + 1) % interval == 0 → full attention
        interval = new_kinds.index("full_attention") + 1
        if all((k == "full_attention") == ((i + 1) % interval == 0) for i, k in enumerate(new_kinds)):
            t["full_attention_interval"] = interval
    t["mlp_only_layers"] = [keep.index(i) for i in t.get("mlp_only_layers") or [] if i in keep]
    t["hidden_size"] = dims["hidden"]
    t["moe_intermediate_size"] = dims["moe"]
    t["shared_expert_intermediate_size"] = dims["shared"]
    mtp = min(int(t.get("mtp_num_hidden_layers", 0) or 0), 1)
    if "mtp_num_hidden_layers" in t:
        t["mtp_num_hidden_layers"] = mtp
    v = new.get("vision_config")
    depth = 0
    if v is not None:
        depth = 1
        v["depth"] = depth
        v["out_hidden_size"] = dims["hidden"]
        v["deepstack_visual_indexes"] = [i for i in v.get("deepstack_visual_indexes") or [] if i < depth]
    q = new.get("quantization_config")
    if q and q.get("modules_to_not_convert") is not None:
        q["modules_to_not_convert"] = _remap_not_convert(
            q["modules_to_not_convert"], {old: i for i, old in enumerate(keep)},
            "model.language_model.layers", depth, mtp)
    return new, {"kept_layers": keep, "layer_types": new_kinds, "vision_depth": depth, "mtp_layers": mtp}


def plan_qwen3_5_moe(cfg: dict) -> Plan:
    t = cfg["text_config"]
    q = cfg.get("quantization_config")
    plan = Plan(q, set((q or {}).get("modules_to_not_convert") or []))
    h, vocab = int(t["hidden_size"]), int(t["vocab_size"])
    # Qwen3.5's RMSNorm scales by (1 + weight): a checkpoint's norms sit near zero
    t = dict(t, _norm_fill="small")
    lm = "model.language_model"
    plan.add(lm + ".embed_tokens.weight", "BF16", (vocab, h), "small")

    def moe_layer(prefix: str, kind: str) -> None:
        plan.add(prefix + ".input_layernorm.weight", "BF16", (h,), "small")
        plan.add(prefix + ".post_attention_layernorm.weight", "BF16", (h,), "small")
        if kind == "linear_attention":
            la = prefix + ".linear_attn"
            nk, nv = int(t["linear_num_key_heads"]), int(t["linear_num_value_heads"])
            kd, vd = nk * int(t["linear_key_head_dim"]), nv * int(t["linear_value_head_dim"])
            conv_dim = 2 * kd + vd
            plan.linear(la + ".in_proj_qkv", conv_dim, h)
            plan.linear(la + ".in_proj_z", vd, h)
            plan.linear(la + ".in_proj_b", nv, h)
            plan.linear(la + ".in_proj_a", nv, h)
            plan.add(la + ".conv1d.weight", "BF16", (conv_dim, 1, int(t["linear_conv_kernel_dim"])), "small")
            plan.add(la + ".dt_bias", "BF16", (nv,), "ones")
            plan.add(la + ".A_log", "BF16", (nv,), "small")
            plan.add(la + ".norm.weight", "BF16", (int(t["linear_value_head_dim"]),), "ones")
            plan.linear(la + ".out_proj", h, vd)
        else:
            _attention(plan, prefix + ".self_attn", t, bool(t.get("attn_output_gate", True)))
        mlp = prefix + ".mlp"
        _experts(plan, mlp, t)
        _mlp(plan, mlp + ".shared_expert", h, int(t["shared_expert_intermediate_size"]))
        plan.linear(mlp + ".shared_expert_gate", 1, h)

    for i, kind in enumerate(t["layer_types"]):
        moe_layer(f"{lm}.layers.{i}", kind)
    plan.add(lm + ".norm.weight", "BF16", (h,), "small")
    if not cfg.get("tie_word_embeddings", t.get("tie_word_embeddings", False)):
        plan.linear("lm_head", vocab, h)

    v = cfg.get("vision_config")
    if v is not None:
        vh, vi = int(v["hidden_size"]), int(v["intermediate_size"])
        vis = "model.visual"
        ps, tps = int(v["patch_size"]), int(v["temporal_patch_size"])
        plan.add(vis + ".patch_embed.proj.weight", "BF16", (vh, int(v["in_channels"]), tps, ps, ps), "small")
        plan.add(vis + ".patch_embed.proj.bias", "BF16", (vh,), "zeros")
        plan.add(vis + ".pos_embed.weight", "BF16", (int(v["num_position_embeddings"]), vh), "small")
        for b in range(int(v["depth"])):
            blk = f"{vis}.blocks.{b}"
            for norm in ("norm1", "norm2"):
                plan.add(f"{blk}.{norm}.weight", "BF16", (vh,), "ones")
                plan.add(f"{blk}.{norm}.bias", "BF16", (vh,), "zeros")
            plan.linear(blk + ".attn.qkv", 3 * vh, vh, bias=True)
            plan.linear(blk + ".attn.proj", vh, vh, bias=True)
            plan.linear(blk + ".mlp.linear_fc1", vi, vh, bias=True)
            plan.linear(blk + ".mlp.linear_fc2", vh, vi, bias=True)
        merged = vh * int(v["spatial_merge_size"]) ** 2
        plan.add(vis + ".merger.norm.weight", "BF16", (vh,), "ones")
        plan.add(vis + ".merger.norm.bias", "BF16", (vh,), "zeros")
        plan.linear(vis + ".merger.linear_fc1", merged, merged, bias=True)
        plan.linear(vis + ".merger.linear_fc2", int(v["out_hidden_size"]), merged, bias=True)

    for m in range(int(t.get("mtp_num_hidden_layers", 0) or 0)):
        if m == 0:
            plan.linear("mtp.fc", h, 2 * h)
            plan.add("mtp.pre_fc_norm_embedding.weight", "BF16", (h,), "small")
            plan.add("mtp.pre_fc_norm_hidden.weight", "BF16", (h,), "small")
        moe_layer(f"mtp.layers.{m}", "full_attention")
    if int(t.get("mtp_num_hidden_layers", 0) or 0):
        plan.add("mtp.norm.weight", "BF16", (h,), "small")
    return plan


# --------------------------------------------------------------------------------------------------
# Families: qwen3 (dense, e.g. Qwen3-8B) and qwen3_moe (e.g. Qwen3-30B-A3B) — flat configs
# --------------------------------------------------------------------------------------------------


def _shrink_flat(cfg: dict, dims: dict, moe: bool) -> tuple[dict, dict]:
    new = json.loads(json.dumps(cfg))
    n = min(2, int(new["num_hidden_layers"]))
    keep = list(range(n))
    new["num_hidden_layers"] = n
    if new.get("layer_types"):
        new["layer_types"] = new["layer_types"][:n]
    if "max_window_layers" in new:
        new["max_window_layers"] = min(int(new["max_window_layers"]), n)
    new["hidden_size"] = dims["hidden"]
    if "intermediate_size" in new:
        new["intermediate_size"] = dims["dense"]
    if moe:
        new["moe_intermediate_size"] = dims["moe"]
        new["mlp_only_layers"] = [i for i in new.get("mlp_only_layers") or [] if i < n]
    q = new.get("quantization_config")
    if q and q.get("modules_to_not_convert") is not None:
        q["modules_to_not_convert"] = _remap_not_convert(q["modules_to_not_convert"], {i: i for i in keep},
                                                         "model.layers", 0, 0)
    return new, {"kept_layers": keep, "layer_types": new.get("layer_types")}


def _plan_flat(cfg: dict, moe: bool) -> Plan:
    q = cfg.get("quantization_config")
    plan = Plan(q, set((q or {}).get("modules_to_not_convert") or ["lm_head"]))
    h, vocab = int(cfg["hidden_size"]), int(cfg["vocab_size"])
    plan.add("model.embed_tokens.weight", "BF16", (vocab, h), "small")
    step = int(cfg.get("decoder_sparse_step", 1) or 1)
    for i in range(int(cfg["num_hidden_layers"])):
        p = f"model.layers.{i}"
        plan.add(p + ".input_layernorm.weight", "BF16", (h,), "ones")
        plan.add(p + ".post_attention_layernorm.weight", "BF16", (h,), "ones")
        _attention(plan, p + ".self_attn", cfg, False)
        sparse = moe and i not in (cfg.get("mlp_only_layers") or []) and (i + 1) % step == 0
        if sparse:
            _experts(plan, p + ".mlp", cfg)
        else:
            _mlp(plan, p + ".mlp", h, int(cfg["intermediate_size"]))
    plan.add("model.norm.weight", "BF16", (h,), "ones")
    if not cfg.get("tie_word_embeddings", False):
        plan.linear("lm_head", vocab, h)
    return plan


FAMILIES = {
    # model_type: (shrink(config, dims) -> (config, facts), plan(shrunk config) -> Plan)
    "qwen3_5_moe": (shrink_qwen3_5_moe, plan_qwen3_5_moe),
    "qwen3": (lambda c, d: _shrink_flat(c, d, False), lambda c: _plan_flat(c, False)),
    "qwen3_moe": (lambda c, d: _shrink_flat(c, d, True), lambda c: _plan_flat(c, True)),
}


# --------------------------------------------------------------------------------------------------
# Bytes: random but in format, at C speed (bytes.translate over a random pool, bytearray slicing)
# --------------------------------------------------------------------------------------------------

# FP8 E4M3FN codes with exponent field 4..7 (|x| in [2^-3, 1.875]), both signs: never 0x7F/0xFF (NaN),
# so weight * scale_inv (0.02) stays around the magnitude of a trained checkpoint's weights.
_FP8_TABLE = bytes((b & 0x80) | ((4 + ((b >> 3) & 3)) << 3) | (b & 7) for b in range(256))
# high byte of a BF16: sign plus exponent 120..123 (|x| in [2^-7, 2^-4)); the low byte is random
_BF16_HIGH = bytes((b & 0x80) | (60 + (b & 1)) for b in range(256))
POOL = 1 << 22


class Filler:
    """Makes each tensor's bytes from one random pool, so hundreds of MB take seconds."""

    def __init__(self, seed: int | None) -> None:
        rnd = random.Random(seed)
        self.rnd = rnd
        raw = bytes(rnd.getrandbits(8) for _ in range(4096)) * (POOL // 4096)
        # mix so the pool does not repeat at 4 KiB: rotate each 64 KiB stripe by a random amount
        stripes = []
        for i in range(0, POOL, 1 << 16):
            s = raw[i:i + (1 << 16)]
            k = rnd.randrange(len(s))
            stripes.append(s[k:] + s[:k])
        self.pool = b"".join(stripes)
        self.fp8 = self.pool.translate(_FP8_TABLE)
        self.bf16_high = self.pool.translate(_BF16_HIGH)

    def _take(self, src: bytes, n: int) -> bytes:
        start = self.rnd.randrange(len(src))
        reps = (start + n) // len(src) + 1
        return (src * reps)[start:start + n] if reps > 1 else src[start:start + n]

    def chunks(self, dtype: str, fill: str, count: int, step: int = 1 << 22):
        """Yield the tensor's bytes in chunks of at most ``step`` elements."""
        done = 0
        while done < count:
            n = min(step, count - done)
            done += n
            if dtype == "F8_E4M3":
                yield self._take(self.fp8, n)
            elif dtype == "F32":
                yield struct.pack("<f", 0.02 if fill == "scale" else 0.0) * n
            elif fill == "ones":
                yield b"\x80\x3f" * n
            elif fill == "zeros":
                yield b"\x00\x00" * n
            else:
                out = bytearray(2 * n)
                out[0::2] = self._take(self.pool, n)
                out[1::2] = self._take(self.bf16_high, n)
                yield bytes(out)


# --------------------------------------------------------------------------------------------------
# safetensors, by hand: u64 little-endian header length, JSON header, data; header padded to 8 bytes
# --------------------------------------------------------------------------------------------------


def _nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    n = DTYPE_SIZE[dtype]
    for d in shape:
        n *= d
    return n


def shard(tensors: list, max_bytes: int) -> list[list]:
    shards: list[list] = [[]]
    size = 0
    for t in tensors:
        nb = _nbytes(t[1], t[2])
        if shards[-1] and size + nb > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += nb
    return shards


def write_safetensors(path: str, tensors: list, filler: Filler) -> int:
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape, _fill in tensors:
        nb = _nbytes(dtype, shape)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nb]}
        offset += nb
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * ((8 - len(raw) % 8) % 8)
    tmp = path + ".part"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for _name, dtype, shape, fill in tensors:
            count = _nbytes(dtype, shape) // DTYPE_SIZE[dtype]
            for chunk in filler.chunks(dtype, fill, count):
                f.write(chunk)
    os.replace(tmp, path)
    return offset


# --------------------------------------------------------------------------------------------------
# The program
# --------------------------------------------------------------------------------------------------


def _read_config(src: str) -> tuple[dict, str | None]:
    if os.path.isdir(src):
        path, folder = os.path.join(src, "config.json"), src
    else:
        path, folder = src, None
    if not os.path.isfile(path):
        raise MiniatureError(f"no config.json at {path}")
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        raise MiniatureError(f"cannot read {path}: {e}") from None
    if not isinstance(cfg, dict):
        raise MiniatureError(f"{path} is not a JSON object")
    return cfg, folder


def make_miniature(src: str, out: str, hidden: int = 256, moe: int = 128, shared: int = 128,
                   dense: int = 256, shard_bytes: int = DEFAULT_SHARD_BYTES, seed: int | None = 0) -> dict:
    """Write the miniature of the model at ``src`` into ``out``; returns the ``done`` event's data."""
    t0 = time.time()
    cfg, folder = _read_config(src)
    model_type = cfg.get("model_type")
    if model_type not in FAMILIES:
        raise MiniatureError(f"unknown model_type {model_type!r}: the miniature writer knows {', '.join(sorted(FAMILIES))}")
    q = cfg.get("quantization_config")
    block = tuple((q or {}).get("weight_block_size") or (BLOCK, BLOCK))
    if q and q.get("quant_method") not in ("fp8", None):
        raise MiniatureError(f"quant_method {q.get('quant_method')!r} is not supported (fp8 block or unquantized only)")
    for label, value in (("hidden", hidden), ("moe", moe), ("shared", shared), ("dense", dense)):
        if value <= 0 or (q and value % max(block) != 0):
            raise MiniatureError(f"--{label} {value} must be a positive multiple of the FP8 block {max(block)}")
    shrink, planner = FAMILIES[model_type]
    try:
        small, facts = shrink(cfg, {"hidden": hidden, "moe": moe, "shared": shared, "dense": dense})
    except (KeyError, TypeError, ValueError) as e:
        raise MiniatureError(f"config.json of {model_type} lacks what its family needs: {e!r}") from None
    emit("config", model_type=model_type, architecture=(cfg.get("architectures") or [None])[0],
         quantization=(q or {}).get("quant_method"), source=os.path.abspath(src), **facts)
    plan = planner(small)
    total = sum(_nbytes(d, s) for _n, d, s, _f in plan.tensors)
    shards = shard(plan.tensors, shard_bytes)
    emit("plan", tensors=len(plan.tensors), bytes=total, files=len(shards),
         fp8_tensors=sum(1 for t in plan.tensors if t[1] == "F8_E4M3"))
    if os.path.exists(out) and not os.path.isdir(out):
        raise MiniatureError(f"output {out} exists and is not a directory")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as f:
        json.dump(small, f, indent=2)
        f.write("\n")
    filler = Filler(seed)
    weight_map: dict[str, str] = {}
    names = (["model.safetensors"] if len(shards) == 1 else
             [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))])
    for i, part in enumerate(shards):  # no zip(strict=): the writer runs on any image's Python 3
        name = names[i]
        nb = write_safetensors(os.path.join(out, name), part, filler)
        weight_map.update((t[0], name) for t in part)
        emit("written", file=name, tensors=len(part), bytes=nb)
    if len(shards) > 1:
        with open(os.path.join(out, "model.safetensors.index.json"), "w", encoding="utf-8") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
            f.write("\n")
    copied = []
    if folder is not None:
        for side in SIDE_FILES:
            p = os.path.join(folder, side)
            if os.path.isfile(p) and os.path.abspath(folder) != os.path.abspath(out):
                shutil.copyfile(p, os.path.join(out, side))
                copied.append(side)
    emit("copied", files=copied)
    done = {"dir": os.path.abspath(out), "tensors": len(plan.tensors), "bytes": total,
            "files": names, "seconds": round(time.time() - t0, 3)}
    emit("done", **done)
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="miniature_writer", description=__doc__.split("\n\n")[0])
    ap.add_argument("src", help="model directory holding config.json (and tokenizer files), or a config.json")
    ap.add_argument("out", help="directory to write the miniature into")
    ap.add_argument("--hidden", type=int, default=256, help="hidden_size of the miniature")
    ap.add_argument("--moe", type=int, default=128, help="moe_intermediate_size")
    ap.add_argument("--shared", type=int, default=128, help="shared_expert_intermediate_size")
    ap.add_argument("--dense", type=int, default=256, help="intermediate_size of dense MLPs")
    ap.add_argument("--shard-mb", type=int, default=DEFAULT_SHARD_BYTES >> 20, help="largest shard, MiB")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        make_miniature(args.src, args.out, hidden=args.hidden, moe=args.moe, shared=args.shared,
                       dense=args.dense, shard_bytes=max(1, args.shard_mb) << 20, seed=args.seed)
    except MiniatureError as e:
        sys.stderr.write(f"miniature: error: {e}\n")
        return 2
    except OSError as e:
        sys.stderr.write(f"miniature: error: {e}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
