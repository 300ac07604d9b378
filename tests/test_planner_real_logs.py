"""The planner's weights against what REAL vLLM starts logged ("Model loading took X GiB"), one
quantised format per test, the arithmetic spelled out in each docstring.

Every log excerpt and config here is real and public; tests/fixtures/quant/README.md says where each
came from. vLLM's "GiB" is bytes / 2**30 (``GiB_bytes = 1 << 30`` in ``vllm/utils``), per rank. Where the
checkpoint's own quantisation block could not be found in a public source, the test asserts a range
whose two ends are named, not a single figure.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from sparkconsole.planner.calibrate import calibrate, read_log
from sparkconsole.planner.plan import PlanOptions
from sparkconsole.planner.spec import SPECS_DIR, spec_from_config
from sparkconsole.planner.weights import GIB, estimate_weights

FIX = Path(__file__).parent / "fixtures" / "quant"


def logged_gib(name: str) -> float:
    lg = read_log((FIX / name).read_text())
    assert lg.weights_gib is not None
    return lg.weights_gib


# ---------------------------------------------------------------- compressed-tensors FP8 (float-quantized)


def fp8_dynamic(strategy: str) -> dict:
    """llm-compressor's FP8_DYNAMIC preset (the recipe of neuralmagic's ``*-FP8-dynamic`` checkpoints:
    ``QuantizationModifier(targets="Linear", scheme="FP8_DYNAMIC", ignore=["lm_head"])``) as the
    ``quantization_config`` it writes. The checkpoint's own block was not found in a public source, so the
    weight-scale strategy is a parameter: "channel" is what the preset writes, "tensor" the other end."""
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"],
                                          "weights": {"num_bits": 8, "type": "float", "strategy": strategy,
                                                      "symmetric": True, "dynamic": False},
                                          "input_activations": {"num_bits": 8, "type": "float",
                                                                "strategy": "token", "dynamic": True}}}}


def qwen25_14b_instruct(q: dict | None) -> object:
    cfg = json.loads((FIX / "qwen2.5-14b.config.json").read_text())
    # the base Qwen2.5-14B config; the Instruct model card: "The current config.json is set for context
    # length up to 32,768 tokens" -- the only field that differs for the weights (the rotary cache)
    cfg["max_position_embeddings"] = 32768
    if q is not None:
        cfg["quantization_config"] = q
    return spec_from_config(cfg, "neuralmagic/Qwen2.5-14B-Instruct-FP8-dynamic", "test")


def test_ct_fp8_dynamic_qwen25_14b_against_a_real_gb10_load():
    """Real log (fixtures/quant/qwen2.5-14b-instruct-fp8-dynamic-gb10-v0.13.0.log): NVIDIA's vLLM 0.13.0
    container on a DGX Spark, neuralmagic/Qwen2.5-14B-Instruct-FP8-dynamic at TP 1, "Model loading took
    15.2227 GiB". Config: the real Qwen2.5-14B config.json with max_position_embeddings 32,768 (Instruct).

    Per layer (48): q 5,120 x 5,120, k and v 1,024 x 5,120 each, o 5,120 x 5,120, gate and up 13,824 x
    5,120 each, down 5,120 x 13,824 = 275,251,200 weights at 1 B (fp8) + one fp32 scale per output row
    (5,120 + 1,024 + 1,024 + 5,120 + 13,824 + 13,824 + 5,120 = 45,056 rows x 4 B = 180,224 B); the q/k/v
    biases (7,168 values) stay bf16. 48 layers: 13,221,396,480 B.
    Left unquantised (vLLM builds them without a quant method): embed_tokens and lm_head, 152,064 x
    5,120 x 2 B = 1,557,135,360 B each; the norms (97 x 5,120 x 2 B) and the rotary cos/sin cache
    (32,768 positions x 128 x 2 B = 8 MiB).
    Sum 16,345,049,088 B = 15.2225 GiB: 0.0012% under the log.

    The quantization_config text of this checkpoint is not in any source found; the two ends of what it
    can be -- fp32 scale per output channel (what FP8_DYNAMIC writes) or one per tensor -- differ by 8.6 MB
    (0.06%), so both ends are asserted within 1%."""
    logged = logged_gib("qwen2.5-14b-instruct-fp8-dynamic-gb10-v0.13.0.log")
    assert logged == 15.2227
    w = estimate_weights(qwen25_14b_instruct(fp8_dynamic("channel")))
    assert w.per_rank_bytes == 16_345_049_088
    rows = 5120 + 1024 + 1024 + 5120 + 13824 + 13824 + 5120
    weights = 5120 * 5120 * 2 + 1024 * 5120 * 2 + 13824 * 5120 * 3
    assert weights == 275_251_200
    bias = (5120 + 2 * 1024) * 2
    assert w.bytes_total["attention"] + w.bytes_total["dense MLP"] == 48 * (weights + 4 * rows + bias)
    assert w.bytes_total["embeddings"] == w.bytes_total["lm_head"] == 152064 * 5120 * 2
    assert w.bytes_total["norms"] == (48 * 2 + 1) * 5120 * 2 + 32768 * 128 * 2
    assert w.per_rank_gib == pytest.approx(15.2225, abs=0.0001)
    assert abs(w.per_rank_gib - logged) / logged < 0.0001
    per_tensor = estimate_weights(qwen25_14b_instruct(fp8_dynamic("tensor"))).per_rank_gib
    assert (w.per_rank_bytes - per_tensor * GIB) == pytest.approx(48 * (4 * rows - 7 * 4))
    for end in (per_tensor, w.per_rank_gib):
        assert abs(end - logged) / logged < 0.01
    # the bf16 model would be 27.52 GiB: the log is not a bf16 load
    assert estimate_weights(qwen25_14b_instruct(None)).per_rank_gib == pytest.approx(27.519, abs=0.001)


# ---------------------------------------------------------------- compressed-tensors int4 (pack-quantized)


def awq_int4_g32(ignore: list[str], symmetric: bool) -> dict:
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ignore,
            "config_groups": {"group_0": {"targets": ["Linear"],
                                          "weights": {"num_bits": 4, "type": "int", "strategy": "group",
                                                      "group_size": 32, "symmetric": symmetric}}}}


# everything but the routed experts kept in bf16: the most a 4-bit MoE checkpoint commonly leaves alone
KEEP_ALL_BUT_EXPERTS = ["lm_head", "re:.*visual.*", "re:.*linear_attn.*", "re:.*self_attn.*",
                        "re:.*shared_expert.*", "re:.*mlp.gate$"]


def test_ct_int4_qwen35_35b_awq_against_a_real_load_is_inside_the_stated_range():
    """Real log (fixtures/quant/qwen3.5-35b-a3b-awq-4bit-v0.17.1.log): vLLM 0.17.1rc1,
    cyankiwi/Qwen3.5-35B-A3B-AWQ-4bit at TP 1, "Model loading took 22.05 GiB"; vLLM names the scheme:
    compressed-tensors WNA16, int4, group_size 32, Marlin. Config: the real Qwen3.5-35B-A3B config
    (bundled, planner/specs); MTP is not loaded (no speculative decoding), the vision tower is.

    Routed experts: 40 layers x 256 x 3 x 512 x 2,048 = 32.2 B weights; at int4 with a bf16 scale per
    32 (0.5 + 2/32 B per weight) 16.875 GiB, with an int4 zero point per group as well (AWQ is asymmetric:
    + 0.5/32 B) 17.344 GiB. Embeddings and lm_head (248,320 x 2,048 x 2 B each, 0.947 GiB), norms,
    router gates, conv1d and the rotary cache (multimodal RoPE: 4 x 262,144 x 64 x 2 B = 0.125 GiB) are bf16
    whatever the checkpoint says.

    The checkpoint's ignore list is not in any source found, so the test holds a range:
    - low end, 19.91 GiB: every other linear (attention, GDN, shared experts, vision) quantised too,
      symmetric (no zero points);
    - high end, 22.86 GiB: only the routed experts quantised, asymmetric (zero points), everything else
      bf16 (KEEP_ALL_BUT_EXPERTS).
    22.05 GiB lies inside, 2.14 GiB over the low end and 0.81 under the high end. Not a 1% check: the
    range is what the public information allows (about +-7% around its middle)."""
    logged = logged_gib("qwen3.5-35b-a3b-awq-4bit-v0.17.1.log")
    assert logged == 22.05
    cfg = json.loads((SPECS_DIR / "qwen3.5-35B-A3B.config.json").read_text())
    cfg.pop("quantization_config", None)

    def gib(ignore: list[str], symmetric: bool) -> float:
        c = copy.deepcopy(cfg)
        c["quantization_config"] = awq_int4_g32(ignore, symmetric)
        w = estimate_weights(spec_from_config(c, "cyankiwi/Qwen3.5-35B-A3B-AWQ-4bit", "test"))
        n = 40 * 256 * 3 * 512 * 2048
        assert w.params["routed experts"] == n
        zero = 0 if symmetric else 0.5 / 32
        assert w.bytes_total["routed experts"] == pytest.approx(n * (0.5 + 2 / 32 + zero))
        assert w.bytes_total["embeddings"] == w.bytes_total["lm_head"] == 248320 * 2048 * 2
        return w.per_rank_gib

    low, high = gib(["lm_head"], True), gib(KEEP_ALL_BUT_EXPERTS, False)
    assert low == pytest.approx(19.912, abs=0.001)
    assert high == pytest.approx(22.861, abs=0.001)
    assert low < logged < high
    # the bf16 model would load 65.52 GiB: the log is a 4-bit load
    assert estimate_weights(spec_from_config(cfg, "bf16", "test")).per_rank_gib == pytest.approx(65.52, abs=0.01)


# ---------------------------------------------------------------- compressed-tensors NVFP4 (nvfp4-pack-quantized)


def redhat_nvfp4(ignore: list[str]) -> dict:
    """The ``quantization_config`` llm-compressor writes for the recipe printed in the model card of
    RedHatAI/Qwen3-30B-A3B-NVFP4 ("Creation" section, verbatim copy of the card in the code index):
    ``QuantizationModifier(ignore=["re:.*lm_head.*"], config_groups={"group_0": {"targets": ["Linear"],
    "weights": {num_bits 4, type float, strategy tensor_group, group_size 16, symmetric},
    "input_activations": {num_bits 4, type float, strategy tensor_group, group_size 16, dynamic "local"}}})``.
    The config.json text itself was not found, so the ignore list is a parameter (see the test)."""
    return {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "ignore": ignore,
            "config_groups": {"group_0": {"targets": ["Linear"],
                                          "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                                                      "group_size": 16, "symmetric": True, "dynamic": False},
                                          "input_activations": {"num_bits": 4, "type": "float",
                                                                "strategy": "tensor_group", "group_size": 16,
                                                                "symmetric": True, "dynamic": "local"}}}}


def fixture_spec(config: str, q: dict | None, name: str) -> object:
    """The spec of a fixture config.json, with ``q`` as its quantization_config (None: as stored)."""
    cfg = json.loads((FIX / config).read_text())
    if q is not None:
        cfg["quantization_config"] = q
    return spec_from_config(cfg, name, "test")


def qwen3_30b_a3b(q: dict | None) -> object:
    return fixture_spec("qwen3-30b-a3b.config.json", q, "RedHatAI/Qwen3-30B-A3B-NVFP4")


def test_ct_nvfp4_qwen3_30b_a3b_against_a_real_gb10_load():
    """Real log (fixtures/quant/qwen3-30b-a3b-nvfp4-gb10-v0.12.0.log, vllm-project/vllm#30855): vLLM 0.12.0
    on a Dell Pro Max GB10, RedHatAI/Qwen3-30B-A3B-NVFP4 at TP 1, "Model loading took 16.8589 GiB" (the
    engine died after the load, at the first kernel launch). Config: the real Qwen3-30B-A3B config.json
    (the card's base_model; max_position_embeddings 40,960 = the log's "Using max model len 40960").

    NVFP4 as vLLM's compressed-tensors W4A4 scheme holds it: two e2m1 weights per byte (0.5 B), one fp8-e4m3
    block scale per 16 weights (1/16 B), fp32 global scales per tensor (weight and input, 8 B); the block
    scales are swizzled to 128 x 4 tiles, and no dimension here needs padding (rows 512..4,096 are
    multiples of 128, scale columns 128 / 48 / 256 multiples of 4). 0.5625 B per weight:
    - routed experts: 48 layers x 128 x (1,536 x 2,048 gate_up + 2,048 x 768 down) = 28,991,029,248
      weights -> 16,307,453,952 B + 48 x 384 x 8 B global scales = 16,307,601,408 B;
    - attention: 48 x (q 4,096 + k 512 + v 512 rows x 2,048, o 2,048 x 4,096) = 48 x 18,874,368 weights
      -> 48 x (10,616,832 + 4 x 8 + the bf16 q/k norms 512) = 509,634,048 B;
    - bf16, whatever the format: embed_tokens and lm_head 151,936 x 2,048 x 2 B = 622,329,856 B each (lm_head
      is the recipe's one ignore), router gates 48 x 128 x 2,048 x 2 B = 25,165,824 B, the layer norms 97 x 2,048 x 2 B and the
      rotary cache 40,960 x 128 x 2 B: 10,883,072 B.
    Sum 18,097,944,064 B = 16.8550 GiB: 0.023% (4.2 MB) under the log.

    The checkpoint's config.json text was not found, only the recipe (ignore: lm_head; targets: Linear).
    In the HF model the MoE router ``mlp.gate`` is an nn.Linear, so the checkpoint may hold it in NVFP4,
    and recent vLLM builds the Qwen3-MoE gate with the quant config; the planner always keeps router
    gates bf16. Both ends are asserted within 1%: gates bf16 (the planner, 16.8550 GiB) and gates NVFP4
    (48 x (131,072 + 16,384 + 8) B instead of 25,165,824 B: 16.8382 GiB, -0.12%). Keeping attention bf16
    as well would give 18.07 GiB (+7.2%), the bf16 model 56.88 GiB: the log is an NVFP4 load of
    attention and experts."""
    logged = logged_gib("qwen3-30b-a3b-nvfp4-gb10-v0.12.0.log")
    assert logged == 16.8589
    w = estimate_weights(qwen3_30b_a3b(redhat_nvfp4(["lm_head"])))
    n_exp = 48 * 128 * (2 * 768 * 2048 + 2048 * 768)
    assert w.params["routed experts"] == n_exp == 28_991_029_248
    assert w.bytes_total["routed experts"] == n_exp * 0.5625 + 48 * 3 * 128 * 8 == 16_307_601_408
    n_att = 4096 * 2048 + 2 * 512 * 2048 + 2048 * 4096
    assert w.bytes_total["attention"] == 48 * (n_att * 0.5625 + 4 * 8 + 2 * 128 * 2) == 509_634_048
    assert w.bytes_total["embeddings"] == w.bytes_total["lm_head"] == 151936 * 2048 * 2
    gates = 48 * 128 * 2048 * 2
    assert w.bytes_total["router gates"] == gates
    assert w.bytes_total["norms"] == 97 * 2048 * 2 + 40960 * 128 * 2
    assert w.per_rank_bytes == 18_097_944_064
    assert w.per_rank_gib == pytest.approx(16.8550, abs=0.0001)
    assert abs(w.per_rank_gib - logged) / logged < 0.0005
    # the other end: the router gates in NVFP4 too (what the recipe's ignore list alone would write)
    gate_nvfp4 = 48 * (128 * 2048 // 2 + 128 * (2048 // 16) + 8)
    low = (w.per_rank_bytes - gates + gate_nvfp4) / GIB
    assert low == pytest.approx(16.8382, abs=0.0001)
    for end in (low, w.per_rank_gib):
        assert abs(end - logged) / logged < 0.01
    # the ignore regex as the card writes it ("re:.*lm_head.*") leaves the same modules bf16
    assert estimate_weights(qwen3_30b_a3b(redhat_nvfp4(["re:.*lm_head.*"]))).per_rank_bytes == w.per_rank_bytes
    # what the log rules out: attention kept bf16 (+7.2%), the bf16 model
    att_bf16 = estimate_weights(qwen3_30b_a3b(redhat_nvfp4(["lm_head", "re:.*self_attn.*"]))).per_rank_gib
    assert att_bf16 == pytest.approx(18.068, abs=0.001)
    assert estimate_weights(qwen3_30b_a3b(None)).per_rank_gib == pytest.approx(56.880, abs=0.001)


# ---------------------------------------------------------------- GPTQ / AWQ / AutoRound (GPTQ-format weights)


def kaitchup_loads() -> dict[str, float]:
    """Model -> "Loading model weights took X GB" (vLLM 0.5.4 prints GiB as "GB": bytes / 2**30), from the
    five starts of fixtures/quant/llama-3.1-8b-gptq-awq-v0.5.4.log."""
    text = (FIX / "llama-3.1-8b-gptq-awq-v0.5.4.log").read_text()
    out: dict[str, float] = {}
    for chunk in text.split("\nInference throughput for ")[1:]:
        model = chunk.split("\n", 1)[0].strip()
        lg = read_log(chunk)
        assert lg.weights_gib is not None
        out[model] = lg.weights_gib
    return out


def llama31_8b(q: dict | None) -> object:
    return fixture_spec("llama-3.1-8b-instruct.config.json", q, "Meta-Llama-3.1-8B-Instruct")


def test_gptq_and_awq_llama31_8b_against_real_loads_and_the_zero_points_marlin_drops():
    """Real log (fixtures/quant/llama-3.1-8b-gptq-awq-v0.5.4.log): one README benchmarking vLLM 0.5.4 at
    TP 1 on the bf16 Meta-Llama-3.1-8B-Instruct and four 4-bit exports of it, with the recipes that made
    them (kept in the fixture's header): AutoRound ``bits, group_size, sym = 4, 128, True`` (and asym),
    optimum's ``GPTQQuantizer(bits=4, ...)`` (group 128, desc_act False, symmetric: its defaults), AutoAWQ
    ``{"zero_point": True, "q_group_size": 128, "w_bit": 4, "version": "GEMM"}``. vLLM picked gptq_marlin
    for the symmetric ones, awq_marlin for AWQ and the plain gptq kernel for the asymmetric one.

    Linears: 32 layers x (q 4,096 + k 1,024 + v 1,024 + o 4,096 rows x 4,096, gate/up 14,336 x 4,096, down
    4,096 x 14,336) = 6,979,321,856 weights. At int4 with an fp16 scale per 128: 0.5 + 2/128 B each =
    3,598,712,832 B. The zero points (int4, packed in int32, one per group: 0.5/128 B per weight =
    27,262,976 B = 0.025391 GiB): gptq_marlin's linear layers replace ``qzeros`` with an empty tensor
    (MarlinLinearKernel, zero_points=False); awq_marlin and the plain gptq kernel keep them. The rest is
    fp16 as in the bf16 model: embed_tokens and lm_head 128,256 x 4,096 x 2 B each, norms, and the rotary
    cache (131,072 positions x 128 x 2 B = 33,554,432 B).

    | load | log | planner | |
    |---|---|---|---|
    | bf16 | 14.9888 | 14.98878 | exact to the printed digits |
    | gptq_marlin (AutoRound sym, optimum GPTQ) | 5.3494 | 5.34034 | -0.17% |
    | awq_marlin | 5.3748 | 5.36573 | -0.17% |
    | gptq (AutoRound asym) | 5.3767 | 5.36573 | -0.21% |

    AWQ minus GPTQ-Marlin is the zero points to the printed digit (0.0254 logged, 0.025391 planned): the
    dropped ``qzeros`` is what the log shows. The 9.7 MB every quantised load logs over its tensors is the
    CUDA caching allocator's: without ``expandable_segments`` a tensor that leaves < 1 MiB of a block
    keeps the whole block (the Qwen3-32B test below shows the same export logging 18.03 and 17.89 GiB with
    and without it)."""
    logged = kaitchup_loads()
    assert list(logged.values()) == [14.9888, 5.3767, 5.3494, 5.3494, 5.3748]
    base = "kaitchup/Meta-Llama-3.1-8B-Instruct-"
    gptq_sym = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False}
    gptq_asym = {**gptq_sym, "sym": False}
    awq = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}
    n_lin = 32 * (4096 * 4096 * 2 + 1024 * 4096 * 2 + 3 * 14336 * 4096)
    assert n_lin == 6_979_321_856
    bf16 = estimate_weights(llama31_8b(None))
    assert bf16.per_rank_gib == pytest.approx(logged["meta-llama/Meta-Llama-3.1-8B-Instruct"], abs=0.00005)
    rest = bf16.per_rank_bytes - 2 * n_lin                       # everything but the linears, fp16/bf16
    zeros = n_lin // 128 // 2
    assert zeros == 27_262_976
    planned = {}
    for name, q, kept_zeros in (("autoround-gptq-4bit-sym", gptq_sym, False), ("gptq-4bit", gptq_sym, False),
                                ("awq-4bit", awq, True), ("autoround-gptq-4bit-asym", gptq_asym, True)):
        w = estimate_weights(llama31_8b(q))
        assert w.per_rank_bytes == rest + n_lin // 2 + n_lin // 128 * 2 + (zeros if kept_zeros else 0)
        planned[name] = w.per_rank_gib
        assert -0.0025 < (w.per_rank_gib - logged[base + name]) / logged[base + name] < 0
    assert planned["gptq-4bit"] == pytest.approx(5.34034, abs=0.00001)
    assert planned["awq-4bit"] == pytest.approx(5.36573, abs=0.00001)
    # the zero points gptq_marlin drops: the logged AWQ - GPTQ difference, to the printed digit
    assert round(planned["awq-4bit"] - planned["gptq-4bit"], 4) == round(logged[base + "awq-4bit"]
                                                                        - logged[base + "gptq-4bit"], 4) == 0.0254


def test_autoround_qwen3_32b_gptq_marlin_against_a_real_load():
    """Real log (fixtures/quant/qwen3-32b-autoround-w4a16-v0.19.1.log): vLLM 0.19.1, an AutoRound 0.12.2
    W4A16 export of Qwen/Qwen3-32B at TP 1 on one 24 GB GPU; its quantization_config.json (verbatim in
    the fixture): bits 4, group_size 128, sym true, packing auto_round:auto_gptq. vLLM loads it with
    "MarlinLinearKernel for GPTQMarlinLinearMethod". The same export logged "Model loading took 18.03
    GiB" in the four starts without ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` and 17.89 GiB in
    the four with it: 0.14 GiB of allocator block slack, not weights.

    Config: the bundled real Qwen3-8B config with the published Qwen3-32B geometry (hidden 5,120, 64
    layers, 64 query / 8 KV heads of 128, MLP 25,600, vocab 151,936, untied, 40,960 positions = the
    log's max_seq_len). AutoRound leaves lm_head and the embeddings bf16 by default.
    - linears: 64 x (q 8,192 + k 1,024 + v 1,024 rows x 5,120, o 5,120 x 8,192, gate/up 25,600 x 5,120,
      down 5,120 x 25,600) = 31,205,621,760 weights x (0.5 + 2/128 B): gptq_marlin keeps no zero points;
    - embed_tokens and lm_head 151,936 x 5,120 x 2 B each; norms; rotary cache 40,960 x 128 x 2 B.
    Planner 17.894 GiB: +0.03% against 17.89, -0.75% against 18.03. Tied embeddings would give 16.45
    (-8%): the log itself says the 32B is untied. The log's KV line checks the geometry too: one request
    of 40,960 tokens "10.0 GiB KV cache is needed" = 64 layers x 2 x 8 x 128 x 2 B x 40,960."""
    text = (FIX / "qwen3-32b-autoround-w4a16-v0.19.1.log").read_text()
    loads = {float(x) for x in re.findall(r"Model loading took (\d+\.\d+) GiB", text)}
    assert loads == {18.03, 17.89}
    assert logged_gib("qwen3-32b-autoround-w4a16-v0.19.1.log") == 18.03
    q = json.loads("\n".join(line[4:] for line in text.splitlines() if line.startswith("#   ") and
                             (line[4:].startswith(("{", "}", "  \"")))))
    assert q == {"bits": 4, "data_type": "int", "group_size": 128, "sym": True, "iters": 0,
                 "autoround_version": "0.12.2", "quant_method": "auto-round", "packing_format": "auto_round:auto_gptq"}
    cfg = json.loads((SPECS_DIR / "qwen3-8B.config.json").read_text())
    cfg.update(hidden_size=5120, num_hidden_layers=64, num_attention_heads=64, num_key_value_heads=8,
               intermediate_size=25600, max_window_layers=64, quantization_config=q)
    w = estimate_weights(spec_from_config(cfg, "Qwen3-32B AutoRound W4A16", "test"))
    n_lin = 64 * (8192 * 5120 + 2 * 1024 * 5120 + 5120 * 8192 + 3 * 25600 * 5120)
    assert n_lin == 31_205_621_760
    assert w.bytes_total["attention"] + w.bytes_total["dense MLP"] == pytest.approx(n_lin * (0.5 + 2 / 128)
                                                                                     + 64 * 2 * 128 * 2)
    assert w.bytes_total["embeddings"] == w.bytes_total["lm_head"] == 151936 * 5120 * 2
    assert w.per_rank_gib == pytest.approx(17.894, abs=0.001)
    assert abs(w.per_rank_gib - 17.89) / 17.89 < 0.001 and abs(w.per_rank_gib - 18.03) / 18.03 < 0.01
    tied = estimate_weights(spec_from_config({**cfg, "tie_word_embeddings": True}, "tied", "test")).per_rank_gib
    assert tied == pytest.approx(16.445, abs=0.001)
    kv_per_token = 64 * 2 * 8 * 128 * 2
    assert round(kv_per_token * 40960 / GIB, 1) == 10.0 and "(10.0 GiB KV cache is needed" in text


# ---------------------------------------------------------------- ModelOpt MIXED_PRECISION (NVFP4 + FP8)


def nvidia_qwen36_27b_mixed(gdn_ab: bool, lm_head: bool) -> dict:
    """The ModelOpt MIXED_PRECISION block of nvidia/Qwen3.6-27B-NVFP4 as its public descriptions give it
    (the file itself is in no source found; fixtures/quant/README.md quotes them): every MLP linear
    W4A16_NVFP4 with group 16, the attention and the GDN projections FP8 (static, per tensor), the mtp.*
    head unquantised, lm_head NVFP4, FP8 KV. Per-layer names as ModelOpt writes them (the checkpoint's
    own prefixes). What the descriptions leave open is a parameter: whether the small GDN in_proj_a/b
    (48 x 5,120 each) are FP8 or bf16, and whether lm_head is listed."""
    kinds = json.loads((FIX / "qwen3.6-27b.config.json").read_text())["text_config"]["layer_types"]
    layers: dict[str, dict] = {}
    for i, kind in enumerate(kinds):
        p = f"model.language_model.layers.{i}."
        for m in ("gate_proj", "up_proj", "down_proj"):
            layers[p + "mlp." + m] = {"quant_algo": "W4A16_NVFP4", "group_size": 16}
        if kind == "full_attention":
            mods = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"]
        else:
            mods = ["linear_attn.in_proj_qkv", "linear_attn.in_proj_z", "linear_attn.out_proj"]
            mods += ["linear_attn.in_proj_a", "linear_attn.in_proj_b"] if gdn_ab else []
        for m in mods:
            layers[p + m] = {"quant_algo": "FP8"}
    if lm_head:
        layers["lm_head"] = {"quant_algo": "W4A16_NVFP4", "group_size": 16}
    return {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": "FP8",
            "quantized_layers": layers}


def test_modelopt_mixed_qwen36_27b_nvfp4_against_a_real_gb10_load_and_its_kv_exactly():
    """Real log (fixtures/quant/qwen3.6-27b-nvfp4-gb10-v0.23.1.log): vLLM 0.23.1rc1 on a DGX Spark (GB10),
    nvidia/Qwen3.6-27B-NVFP4 (quantization=modelopt_mixed: vLLM detects FP8, NVFP4 and W4A16_NVFP4 layers)
    at TP 1, fp8 KV, 262,144 tokens, gmu 0.70: "Checkpoint size: 20.42 GiB", "Model loading took 19.78
    GiB", block 1,568, "Available KV cache memory: 47.84 GiB", "GPU KV cache size: 1,505,068 tokens",
    5.74x. Config: the real Qwen/Qwen3.6-27B config.json (fixtures; a verbatim public copy at revision
    6a9e13bd); the quantisation block is built from the public descriptions (nvidia_qwen36_27b_mixed).

    - MLP, W4A16_NVFP4 (Marlin on a GB10, no native FP4): 64 x 3 x 17,408 x 5,120 = 17,112,760,320
      weights x (0.5 + 1/16 B) + fp32 scalars = 8.9648 GiB;
    - full attention (16 layers), FP8: q 12,288 (gated) + k 1,024 + v 1,024 rows x 5,120, o 5,120 x 6,144,
      1 B each + fp32 weight/input scales = 1.5625 GiB (with the q/k norms);
    - GDN (48 layers), FP8: in_proj_qkv 10,240 + in_proj_z 6,144 rows x 5,120, out_proj 5,120 x 6,144;
      conv1d, A_log, dt_bias, norms bf16: 5.1819 GiB (in_proj_a/b bf16 instead: 5.2039);
    - lm_head NVFP4 248,320 x 5,120 x 0.5625 B = 0.666 GiB (vLLM 0.23+ quantises a listed lm_head);
      embed_tokens bf16 2.3682 GiB; the vision tower bf16 0.8582 GiB (no visual.* entry);
    - the multimodal rotary cache 4 x 262,144 x 64 x 2 B = 0.125 GiB and the norms.
    Planner 19.728 .. 19.750 GiB against 19.78: -0.26% .. -0.15%. As stored (with the bf16 MTP head
    vLLM does not load here, without the rotary cache, which no checkpoint holds): 20.39 .. 20.42 GiB
    against the log's "Checkpoint size: 20.42 GiB". With lm_head bf16 (what vLLM 0.22 would load) the
    planner says 21.43 GiB, +8%: the log rules it out.

    The KV figures are reproduced exactly from the config: FP8 KV, 16 attention layers x 2 x 4 heads x
    256 x 1 B = 32,768 B per token; one GDN state page 3,207,168 B, so the attention block is 1,568
    tokens (page 3,211,264 B: vLLM's "Padding mamba page size by 0.13%"), 1 attention + 3 state groups
    of 16; 47.84 GiB / (16 x 3,211,264 B) -> 999 blocks, one request of 262,144 tokens takes 168 + 3 x 2
    (prefix caching "align") = 174: 5.74x and int(999 / 174 x 262,144) = 1,505,068 tokens."""
    text = (FIX / "qwen3.6-27b-nvfp4-gb10-v0.23.1.log").read_text()
    lg = read_log(text)
    assert (lg.weights_gib, lg.kv_gib, lg.kv_tokens, lg.max_concurrency, lg.block_size) == \
        (19.78, 47.84, 1_505_068, 5.74, 1568)
    assert "Checkpoint size: 20.42 GiB" in text and "Padding mamba page size by 0.13%" in text
    cfg = json.loads((FIX / "qwen3.6-27b.config.json").read_text())

    def est(gdn_ab: bool, lm_head: bool, mtp: bool = False) -> object:
        c = {**cfg, "quantization_config": nvidia_qwen36_27b_mixed(gdn_ab, lm_head)}
        return estimate_weights(spec_from_config(c, "nvidia/Qwen3.6-27B-NVFP4", "test"), include_mtp=mtp)

    w = est(True, True)
    n_mlp = 64 * 3 * 17408 * 5120
    assert w.params["dense MLP"] == n_mlp == 17_112_760_320
    assert w.bytes_total["dense MLP"] == pytest.approx(n_mlp * (0.5 + 1 / 16), rel=1e-6)
    assert w.bytes_total["lm_head"] == pytest.approx(248320 * 5120 * (0.5 + 1 / 16), rel=1e-6)
    assert w.bytes_total["embeddings"] == 248320 * 5120 * 2
    ends = [w.per_rank_gib, est(False, True).per_rank_gib]
    assert ends == [pytest.approx(19.728, abs=0.001), pytest.approx(19.750, abs=0.001)]
    for end in ends:
        assert -0.003 < (end - 19.78) / 19.78 < 0
    rope = 4 * 262144 * 64 * 2 / GIB
    stored = [est(ab, True, mtp=True).per_rank_gib - rope for ab in (True, False)]
    assert stored[0] < 20.42 + 0.005 and abs(stored[1] - 20.42) < 0.01
    assert est(True, False).per_rank_gib == pytest.approx(21.43, abs=0.01)     # lm_head bf16: ruled out
    # the KV cache, calibrated from this start: every logged capacity figure, exactly
    spec = spec_from_config({**cfg, "quantization_config": nvidia_qwen36_27b_mixed(True, True)},
                            "nvidia/Qwen3.6-27B-NVFP4", "test")
    cal = calibrate(spec, lg, PlanOptions())
    lay = cal.calibrated.layout
    assert (lay.kv_bytes_per_token, lay.state_page_bytes, lay.block_size, lay.page_bytes) == \
        (32_768, 3_207_168, 1_568, 3_211_264)
    assert round((lay.page_bytes / lay.state_page_bytes - 1) * 100, 2) == 0.13
    assert cal.num_blocks == 999 and cal.calibrated.capacity.blocks_per_request == 174
    assert cal.reproduced == {"kv_cache_tokens": True, "max_concurrency": True}
    assert cal.calibrated.fits
