"""Weights of quantised checkpoints from config.json alone (planner/quant.py), one worked example
per format, the arithmetic spelled out.

The dense examples use a SYNTHETIC tiny Llama-shaped config (``TINY``, below); its shapes are
chosen so every term is easy to check by hand. The gpt-oss-120b config and the AutoRound form are
real (tests/fixtures/quant/README.md says where from).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from sparkconsole.planner.quant import ct_match, fn_match, parse_format
from sparkconsole.planner.spec import SPECS_DIR, load_spec, spec_from_config
from sparkconsole.planner.weights import GIB, estimate_weights

FIX = Path(__file__).parent / "fixtures" / "quant"

# SYNTHETIC: 2 layers, hidden 1024, 8 heads of 128 (2 KV heads), MLP 4096, vocab 32,000, bf16.
TINY = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 2,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128, "intermediate_size": 4096,
    "vocab_size": 32000, "max_position_embeddings": 4096, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
}
# the linears of one layer, (out, in): q, k, v, o, gate, up, down
LINEARS = [(1024, 1024), (256, 1024), (256, 1024), (1024, 1024), (4096, 1024), (4096, 1024), (1024, 4096)]
LINEAR_PARAMS = sum(r * c for r, c in LINEARS)          # 15,204,352 per layer
EMBED = 32000 * 1024 * 2                                  # embed_tokens and lm_head, bf16 each
ROPE = 4096 * 128 * 2                                     # cos/sin cache: 4,096 positions x 128 x bf16


def tiny(q: dict, **over) -> object:
    return spec_from_config({**TINY, **over, "quantization_config": q}, "tiny", "test")


def linear_bytes(spec) -> float:
    w = estimate_weights(spec)
    return w.bytes_total["attention"] + w.bytes_total["dense MLP"]


def test_tiny_bf16_baseline():
    w = estimate_weights(spec_from_config(TINY, "tiny", "test"))
    assert linear_bytes(spec_from_config(TINY, "tiny", "test")) == 2 * LINEAR_PARAMS * 2
    assert w.bytes_total["embeddings"] + w.bytes_total["lm_head"] == 2 * EMBED
    assert w.bytes_total["norms"] == 2 * (2 * 1024 * 2) + 1024 * 2 + ROPE


# ---------------------------------------------------------------- modelopt


def nvfp4(r: int, c: int) -> int:
    """ModelOpt NVFP4 linear: r*c/2 packed e2m1 + one fp8 scale per 16 weights (rows padded to 128,
    scale columns to 4: vLLM swizzles them) + fp32 weight_scale_2 and input_scale."""
    return r * c // 2 + (-(-r // 128) * 128) * (-(-(c // 16) // 4) * 4) + 8


def test_modelopt_nvfp4_with_exclude_patterns():
    # per layer: q 524,288 + 65,536 + 8 = 589,832; k, v 131,072 + 16,384 + 8 = 147,464 each;
    # o 589,832; gate, up 2,097,152 + 262,144 + 8 = 2,359,304 each; down 2,359,304
    # = 8,552,504 B per layer (15,204,352 weights x 0.5625 + 7 x 8)
    per_layer = sum(nvfp4(r, c) for r, c in LINEARS)
    assert per_layer == 8_552_504
    s = tiny({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
              "exclude_modules": ["lm_head", "model.layers.1.mlp*"]})
    w = estimate_weights(s)
    # layer 1's MLP is excluded by the fnmatch pattern and stays bf16: 3 x 4096 x 1024 x 2 B
    mlp1_bf16 = 3 * 4096 * 1024 * 2
    assert linear_bytes(s) == 2 * per_layer - sum(nvfp4(r, c) for r, c in LINEARS[4:]) + mlp1_bf16
    assert w.bytes_total["lm_head"] == 32000 * 1024 * 2      # lm_head is never quantised by vLLM
    assert s.geometry.quant.label == "modelopt NVFP4"


def test_modelopt_w4a16_nvfp4_weighs_what_nvfp4_weighs():
    a = tiny({"quant_method": "modelopt", "quant_algo": "NVFP4"})
    b = tiny({"quant_method": "modelopt", "quant_algo": "W4A16_NVFP4"})
    assert linear_bytes(a) == linear_bytes(b) == 2 * 8_552_504


def test_modelopt_mixed_precision_from_hf_quant_config(tmp_path):
    """hf_quant_config.json beside config.json (vLLM reads it there): each listed layer gets its own
    algo, a layer not listed stays bf16."""
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(TINY))
    layers = {"model.layers.0.mlp.gate_proj": {"quant_algo": "W4A16_NVFP4", "group_size": 16},
              "model.layers.0.mlp.up_proj": {"quant_algo": "W4A16_NVFP4", "group_size": 16},
              "model.layers.0.mlp.down_proj": {"quant_algo": "W4A16_NVFP4", "group_size": 16},
              "model.layers.*.self_attn.q_proj": {"quant_algo": "FP8"}}
    (d / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt"}, "quantization": {
        "quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": "FP8", "quantized_layers": layers}}))
    s = load_spec(str(d))
    # layer 0 MLP NVFP4 (3 x 2,359,304); q_proj FP8 in both layers (1024 x 1024 + 8 B scales);
    # everything else bf16: k, v, o x 2 layers and layer 1's MLP
    want = (3 * nvfp4(4096, 1024) + 2 * (1024 * 1024 + 8)
            + 2 * 2 * (256 * 1024 * 2) + 2 * (1024 * 1024 * 2) + 3 * 4096 * 1024 * 2)
    assert linear_bytes(s) == want
    assert s.geometry.kv_cache_fp8           # kv_cache_quant_algo FP8: vLLM's KV is fp8
    assert "MIXED_PRECISION" in s.geometry.quant.label


# ---------------------------------------------------------------- compressed-tensors


def ct(weights: dict, fmt: str, ignore: list[str], inputs: dict | None = None) -> dict:
    return {"quant_method": "compressed-tensors", "format": fmt, "ignore": ignore,
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": inputs}}}


def test_ct_fp8_dynamic_per_channel():
    # RedHatAI *-FP8-dynamic form: fp8 weights, one fp32 scale per output channel, dynamic inputs
    s = tiny(ct({"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False},
                "float-quantized", ["lm_head"], {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}))
    # per layer: 15,204,352 B of weights + 4 B x (1024 + 256 + 256 + 1024 + 4096 + 4096 + 1024) rows
    assert linear_bytes(s) == 2 * (LINEAR_PARAMS + 4 * sum(r for r, _ in LINEARS))


def test_ct_fp8_static_per_tensor_adds_input_scales():
    s = tiny(ct({"num_bits": 8, "type": "float", "strategy": "tensor"}, "float-quantized", ["lm_head"],
                {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False}))
    # one fp32 weight_scale + one fp32 input_scale per tensor: 7 tensors x 8 B per layer
    assert linear_bytes(s) == 2 * (LINEAR_PARAMS + 7 * 8)


def test_ct_nvfp4_pack_quantized():
    s = tiny(ct({"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16},
                "nvfp4-pack-quantized", ["lm_head"],
                {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "dynamic": "local"}))
    # like ModelOpt NVFP4: weight_packed + fp8 group scales + fp32 weight/input global scales
    assert linear_bytes(s) == 2 * 8_552_504


@pytest.mark.parametrize(("sym", "zeros"), [(True, 0), (False, 1)])
def test_ct_pack_quantized_int4_groups(sym, zeros):
    s = tiny(ct({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": sym},
                "pack-quantized", ["lm_head"]))
    # int4: r x c / 2 B; a bf16 scale per 128 weights (2 B x r x c/128); asymmetric adds a packed
    # int4 zero point per group (0.5 B x r x c/128)
    groups = sum(r * (c // 128) for r, c in LINEARS)
    assert linear_bytes(s) == 2 * (LINEAR_PARAMS / 2 + groups * 2 + zeros * groups * 0.5)


def test_ct_ignore_is_matched_as_compressed_tensors_matches():
    # "re:" is re.match: anchored at the START of the name, so ".*" is needed to reach a suffix
    assert ct_match("model.layers.0.mlp.gate", "re:.*mlp.gate$")
    assert not ct_match("model.layers.0.mlp.gate", "re:mlp.gate$")
    assert not ct_match("model.layers.0.mlp.gate_proj", "re:.*mlp.gate$")
    # a bare name must be the whole name
    assert ct_match("lm_head", "lm_head") and not ct_match("model.lm_head", "lm_head")
    # a fused vLLM layer is ignored through its shards: gate_up_proj <- gate_proj/up_proj
    s = tiny(ct({"num_bits": 8, "type": "float", "strategy": "channel"}, "float-quantized",
                ["lm_head", "re:.*layers\\.1\\.mlp\\.(gate|up)_proj$", "model.layers.0.self_attn.q_proj"]))
    w = estimate_weights(s)
    fp8 = [r * c + 4 * r for r, c in LINEARS]          # q, k, v, o, gate, up, down
    kept_bf16 = 2 * (4096 * 1024 * 2) + 1024 * 1024 * 2   # layer 1 gate + up, layer 0 q_proj
    want = 2 * sum(fp8) - fp8[4] - fp8[5] - fp8[0] + kept_bf16
    assert w.bytes_total["attention"] + w.bytes_total["dense MLP"] == want


def test_modelopt_patterns_cover_children():
    assert fn_match("model.visual.blocks.0.attn.qkv", "model.visual")
    assert fn_match("mtp.layers.0.mlp.experts", "mtp*")
    assert fn_match("model.layers.7.mlp.gate", "model.layers.*.mlp.gate")
    assert not fn_match("model.layers.7.mlp.gate_proj", "model.layers.*.mlp.gate")


# ---------------------------------------------------------------- mxfp4 (gpt-oss), real config


def test_gpt_oss_120b_mxfp4_experts_only():
    s = load_spec(str(FIX / "gpt-oss-120b.config.json"))
    w = estimate_weights(s)
    # 116.8B parameters: llama.cpp prints "model params = 116.83 B" for the same model (ollama#16480);
    # the 39.8M expert biases (36 x 128 x (5,760 + 2,880)) are in the bytes below, not in params
    assert (w.total_params + 36 * 128 * 8640) / 1e9 == pytest.approx(116.83, abs=0.01)
    # experts: 36 layers x 128 x (2 x I x H + H x I) weights at 0.5 B + one e8m0 byte per 32 + bf16
    # biases (2 x I + H per expert), with H = 2,880 and I = 2,880 as the Marlin path pads them
    # (H to 256: 3,072; I to 128: 2,944); the checkpoint as stored is the unpadded figure
    n = 36 * 128

    def experts(h: int, i: int) -> float:
        return n * (3 * h * i * (0.5 + 1 / 32) + (2 * i + h) * 2)

    assert w.bytes_total["routed experts"] == pytest.approx(experts(3072, 2944))
    stored = w.per_rank_bytes - experts(3072, 2944) + experts(2880, 2880)
    assert stored / GIB == pytest.approx(60.78, abs=0.01)
    # everything else bf16, whatever modules_to_not_convert lists: attention (q 4096, k/v 512 wide)
    params_attn = 36 * (4096 * 2880 + 2 * 512 * 2880 + 2880 * 4096)
    assert w.bytes_total["attention"] >= params_attn * 2
    assert w.per_rank_gib == pytest.approx(65.91, abs=0.01)  # as the Marlin path (GB10) loads it
    assert any("pads" in n for n in s.notes)


# ---------------------------------------------------------------- AutoRound keep-lists


def test_autoround_keep_lists_on_the_122b():
    """The AutoRound 0.12.3 form (real, fixtures/quant) on the bundled 122B config: only blocks under
    model.language_model.layers are quantised (vision tower, MTP stay bf16), GDN in_proj_a/b stay
    bf16 through extra_config, conv1d and router gates are never quantised. Symmetric int4 in the
    auto_gptq packing runs on gptq_marlin: the routed experts (GPTQMarlinMoEMethod) keep their qzeros
    in bf16, one value per packed int32 column (4 bits / 2 per group column: 0.25 B per 128 weights),
    the linears drop theirs.

    Reported for Intel's INT4 AutoRound 122B on one GB10 (vLLM 0.17.0rc1): "GPU memory 62.65 GiB"
    (research/memory-planning.md §4.1; a forum table, not a log line in this repo). Intel's extra_config
    is not public, so two ends: this form, 62.00 GiB (-1.0%), and this form with the shared experts kept
    bf16 as well (the community's 122B AutoRound recipe leaves shared_expert out), 62.63 GiB (-0.03%)."""
    cfg = json.loads((SPECS_DIR / "qwen3.5-122B-A10B.config.json").read_text())
    cfg["quantization_config"] = json.loads((FIX / "autoround-qwen3.5.quantization_config.json").read_text())
    s = spec_from_config(cfg, "Intel-style AutoRound 122B", "test")
    w = estimate_weights(s)
    bf16 = copy.deepcopy(cfg)
    del bf16["quantization_config"]
    wb = estimate_weights(spec_from_config(bf16, "bf16", "test"))
    assert w.bytes_total["vision tower"] == wb.bytes_total["vision tower"]      # outside the blocks
    # routed experts: int4 (0.5 B) + fp16 scale per 128 (2 B / 128) + bf16 qzeros per 8 columns (0.25 B / 128)
    assert w.bytes_total["routed experts"] == pytest.approx(w.params["routed experts"] * (0.5 + 2.25 / 128))
    # shared experts are plain linears: no zero points on gptq_marlin
    assert w.bytes_total["shared experts"] == pytest.approx(w.params["shared experts"] * (0.5 + 2 / 128))
    gdn_ab = 36 * 2 * 64 * 3072 * 2                                                # in_proj_a/b, bf16
    assert w.bytes_total["linear attention"] > gdn_ab
    keep_shared = copy.deepcopy(cfg)
    extra = keep_shared["quantization_config"].setdefault("extra_config", {})
    for i in range(48):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            extra[f"model.language_model.layers.{i}.mlp.shared_expert.{proj}"] = {"bits": 16}
    hi = estimate_weights(spec_from_config(keep_shared, "shared experts bf16", "test"))
    assert hi.bytes_total["shared experts"] == wb.bytes_total["shared experts"]
    assert w.per_rank_gib == pytest.approx(62.00, abs=0.01)
    assert hi.per_rank_gib == pytest.approx(62.63, abs=0.01)
    for end in (w.per_rank_gib, hi.per_rank_gib):
        assert abs(end - 62.65) / 62.65 < 0.011


def test_gptq_modules_to_not_convert_and_dynamic():
    q = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True,
         "modules_to_not_convert": ["self_attn"], "dynamic": {"-:.*layers\\.1\\.mlp\\..*": {}}}
    s = tiny(q)
    w = estimate_weights(s)
    assert w.bytes_total["attention"] == 2 * 2 * (1024 * 1024 + 256 * 1024) * 2          # kept bf16
    # int4 + fp16 scale per 128; symmetric GPTQ runs on gptq_marlin, whose linears drop qzeros
    mlp0 = sum(r * c / 2 + r * (c // 128) * 2 for r, c in LINEARS[4:])
    assert w.bytes_total["dense MLP"] == mlp0 + 3 * 4096 * 1024 * 2                        # layer 1 skipped


def test_unknown_format_is_still_named():
    s = tiny({"quant_method": "bitsandbytes"})
    assert any("not modelled" in n for n in s.notes)
    assert parse_format({"quant_method": "fp8"}) is None   # FP8 block stays on its own path


def test_safetensors_headers_win_over_the_config(tmp_path):
    """An index's total_size is the exact path: the format only splits it (and the rotary buffer is
    added, it is in no checkpoint)."""
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**TINY, "quantization_config": {
        "quant_method": "modelopt", "quant_algo": "NVFP4"}}))
    total = 123_456_789
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                "weight_map": {"model.embed_tokens.weight": "a"}}))
    w = estimate_weights(load_spec(str(d)))
    assert w.source == "safetensors index"
    assert w.per_rank_bytes == pytest.approx(total + ROPE)
    assert w.per_rank_bytes / GIB < 0.2


def test_gpt_oss_20b_against_a_real_vllm_load_on_a100():
    """Real log (fixtures/quant/gpt-oss-20b-a100-v0.19.0.log): vLLM 0.19.0 on an A100 logged "Model
    loading took 13.72 GiB". Config: the real gpt-oss-120b config with the 20b's counts (24 layers,
    32 experts; README says so).

    The checkpoint as stored is 12.83 GiB (the model card's 12.8 GiB), what native FP4 kernels
    load. An A100 has no FP4 and a GB10 (SM121) gets none of vLLM's FP4 MoE paths, so vLLM's mxfp4
    method takes the Marlin path, which pads each expert's hidden size to a multiple of 256 and its
    intermediate size to 128 (``mxfp4.py``: "the moe marlin kernel requires ... n % 256 == 0 and
    k % 128 == 0"): 2,880 -> 3,072 and 2,880 -> 2,944. Experts then hold 24 x 32 x (3 x 3,072 x
    2,944 x (0.5 + 1/32) + (2 x 2,944 + 3,072) x 2 B of bf16 bias) instead of 2,880 x 2,880, and
    the planner, which counts that padding, gives 13.687 GiB: 0.24% under the log (within 1%)."""
    log = (FIX / "gpt-oss-20b-a100-v0.19.0.log").read_text()
    from sparkconsole.planner.calibrate import read_log

    logged = read_log(log).weights_gib
    assert logged == 13.72
    raw = json.loads((FIX / "gpt-oss-120b.config.json").read_text())
    raw.update(num_hidden_layers=24, num_local_experts=32, layer_types=["sliding_attention", "full_attention"] * 12)
    s = spec_from_config(raw, "openai/gpt-oss-20b (derived)", "test")
    w = estimate_weights(s)
    n = 24 * 32

    def experts(h: int, i: int) -> float:
        return n * (3 * h * i * (0.5 + 1 / 32) + (2 * i + h) * 2)

    assert w.bytes_total["routed experts"] == pytest.approx(experts(3072, 2944))
    stored = (w.per_rank_bytes - experts(3072, 2944) + experts(2880, 2880)) / GIB
    assert stored == pytest.approx(12.83, abs=0.01)  # the checkpoint as stored
    assert w.per_rank_gib == pytest.approx(13.687, abs=0.001)
    assert abs(w.per_rank_gib - logged) / logged < 0.01
    assert any("pads" in x for x in s.notes)


def test_asymmetric_gptq_is_counted_with_its_zero_points_and_named_for_what_new_vllm_refuses():
    """Asymmetric GPTQ is not Marlin-compatible: vLLM's plain gptq kernel keeps int32-packed zeros
    (0.5/128 B per weight at int4 g128); vLLM 0.22+ has no kernel for it and refuses the checkpoint."""
    sym = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False}
    w_sym = estimate_weights(tiny(sym))
    s_asym = tiny({**sym, "sym": False})
    w_asym = estimate_weights(s_asym)
    n = 2 * LINEAR_PARAMS
    assert linear_bytes(s_asym) - linear_bytes(tiny(sym)) == n // 128 // 2
    assert w_asym.per_rank_bytes > w_sym.per_rank_bytes
    assert any("0.22" in x and "refuse" in x for x in s_asym.notes)
    assert not any("refuse" in x for x in tiny(sym).notes)
