"""The canary's miniature writer, run here with this machine's Python (no torch) and read back
independently.

The expectations are derived in this file from the real config and the real checkpoint's naming (the
names the published Qwen3.5-122B-A10B-FP8 / Qwen3-8B checkpoints use, as transformers' and vLLM's
loaders read them), never from the writer's own functions: the test's tiny safetensors reader parses
the files' headers, and the tensor table below is written out by hand.
"""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from sparkconsole.serving import miniature

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "sparkconsole" / "planner" / "specs"
QWEN35 = SPECS / "qwen3.5-122B-A10B.config.json"
QWEN3 = SPECS / "qwen3-8B.config.json"
FIXTURE = Path(__file__).parent / "fixtures" / "miniature" / "miniature_gpu_report.json"
H, MOE_I, SHARED_I, DENSE_I = 256, 128, 128, 256  # the writer's documented defaults
SIZES = {"F8_E4M3": 1, "BF16": 2, "F32": 4}


def run_writer(src: Path | str, out: Path, *extra: str) -> subprocess.CompletedProcess:
    """As the canary runs it: the program's text on stdin of ``python3 -``."""
    return subprocess.run([sys.executable, "-", str(src), str(out), *extra], input=miniature.program_text(),
                          capture_output=True, text=True, timeout=120)


def read_safetensors_header(path: Path) -> tuple[dict, int]:
    """An independent reader: u64 LE header length, JSON header; returns (tensors, data start)."""
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    assert n % 8 == 0, "header is padded to 8 bytes"
    assert header.pop("__metadata__") == {"format": "pt"}
    return header, 8 + n


def read_dir(out: Path) -> dict[str, tuple[str, tuple[int, ...], Path, int, int]]:
    """name -> (dtype, shape, file, start, end) over every shard, checking offsets tile the data."""
    found = {}
    for path in sorted(out.glob("*.safetensors")):
        header, start = read_safetensors_header(path)
        spans = sorted((v["data_offsets"][0], v["data_offsets"][1], k) for k, v in header.items())
        pos = 0
        for a, b, k in spans:
            assert a == pos, f"gap or overlap before {k}"
            v = header[k]
            assert b - a == math.prod(v["shape"]) * SIZES[v["dtype"]], k
            pos = b
            found[k] = (v["dtype"], tuple(v["shape"]), path, start + a, start + b)
        assert path.stat().st_size == start + pos, f"{path.name} has bytes beyond its tensors"
    return found


def expected_qwen35(cfg: dict) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The miniature's tensors by hand: layer 0 Gated DeltaNet, layer 1 full attention, one MTP layer,
    a depth-1 vision tower; FP8 (+ float32 128x128-block scales) wherever the real checkpoint is FP8."""
    t, v = cfg["text_config"], cfg["vision_config"]
    vocab, e = t["vocab_size"], t["num_experts"]
    nk, nv = t["linear_num_key_heads"], t["linear_num_value_heads"]
    kd, vd = nk * t["linear_key_head_dim"], nv * t["linear_value_head_dim"]
    hd, nh, nkv = t["head_dim"], t["num_attention_heads"], t["num_key_value_heads"]
    exp: dict[str, tuple[str, tuple[int, ...]]] = {}

    def fp8(name: str, out_f: int, in_f: int) -> None:
        exp[name + ".weight"] = ("F8_E4M3", (out_f, in_f))
        exp[name + ".weight_scale_inv"] = ("F32", (-(-out_f // 128), -(-in_f // 128)))

    def bf16(name: str, *shape: int) -> None:
        exp[name] = ("BF16", tuple(shape))

    def moe(p: str) -> None:
        bf16(p + ".input_layernorm.weight", H)
        bf16(p + ".post_attention_layernorm.weight", H)
        bf16(p + ".mlp.gate.weight", e, H)
        for i in range(e):
            fp8(f"{p}.mlp.experts.{i}.gate_proj", MOE_I, H)
            fp8(f"{p}.mlp.experts.{i}.up_proj", MOE_I, H)
            fp8(f"{p}.mlp.experts.{i}.down_proj", H, MOE_I)
        fp8(p + ".mlp.shared_expert.gate_proj", SHARED_I, H)
        fp8(p + ".mlp.shared_expert.up_proj", SHARED_I, H)
        fp8(p + ".mlp.shared_expert.down_proj", H, SHARED_I)
        bf16(p + ".mlp.shared_expert_gate.weight", 1, H)

    def full(p: str) -> None:
        fp8(p + ".self_attn.q_proj", nh * hd * 2, H)  # attn_output_gate: query and gate
        fp8(p + ".self_attn.k_proj", nkv * hd, H)
        fp8(p + ".self_attn.v_proj", nkv * hd, H)
        fp8(p + ".self_attn.o_proj", H, nh * hd)
        bf16(p + ".self_attn.q_norm.weight", hd)
        bf16(p + ".self_attn.k_norm.weight", hd)
        moe(p)

    lm = "model.language_model"
    bf16(lm + ".embed_tokens.weight", vocab, H)
    la = lm + ".layers.0.linear_attn"
    fp8(la + ".in_proj_qkv", 2 * kd + vd, H)
    fp8(la + ".in_proj_z", vd, H)
    bf16(la + ".in_proj_b.weight", nv, H)
    bf16(la + ".in_proj_a.weight", nv, H)
    bf16(la + ".conv1d.weight", 2 * kd + vd, 1, t["linear_conv_kernel_dim"])
    bf16(la + ".dt_bias", nv)
    bf16(la + ".A_log", nv)
    bf16(la + ".norm.weight", t["linear_value_head_dim"])
    fp8(la + ".out_proj", H, vd)
    moe(lm + ".layers.0")
    full(lm + ".layers.1")
    bf16(lm + ".norm.weight", H)
    bf16("lm_head.weight", vocab, H)
    vh, vi, ps = v["hidden_size"], v["intermediate_size"], v["patch_size"]
    merged = vh * v["spatial_merge_size"] ** 2
    bf16("model.visual.patch_embed.proj.weight", vh, v["in_channels"], v["temporal_patch_size"], ps, ps)
    bf16("model.visual.patch_embed.proj.bias", vh)
    bf16("model.visual.pos_embed.weight", v["num_position_embeddings"], vh)
    b = "model.visual.blocks.0"
    for n in ("norm1", "norm2"):
        bf16(f"{b}.{n}.weight", vh)
        bf16(f"{b}.{n}.bias", vh)
    for name, o, i in (("attn.qkv", 3 * vh, vh), ("attn.proj", vh, vh), ("mlp.linear_fc1", vi, vh),
                       ("mlp.linear_fc2", vh, vi)):
        bf16(f"{b}.{name}.weight", o, i)
        bf16(f"{b}.{name}.bias", o)
    bf16("model.visual.merger.norm.weight", vh)
    bf16("model.visual.merger.norm.bias", vh)
    bf16("model.visual.merger.linear_fc1.weight", merged, merged)
    bf16("model.visual.merger.linear_fc1.bias", merged)
    bf16("model.visual.merger.linear_fc2.weight", H, merged)
    bf16("model.visual.merger.linear_fc2.bias", H)
    bf16("mtp.fc.weight", H, 2 * H)
    bf16("mtp.pre_fc_norm_embedding.weight", H)
    bf16("mtp.pre_fc_norm_hidden.weight", H)
    bf16("mtp.norm.weight", H)
    full("mtp.layers.0")
    return exp


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("q35") / "mini"
    proc = run_writer(QWEN35, out)
    assert proc.returncode == 0, proc.stderr
    return out, proc


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("q3") / "mini"
    proc = run_writer(QWEN3, out)
    assert proc.returncode == 0, proc.stderr
    return out, proc


def test_qwen35_tensors_are_the_checkpoints_names_dtypes_and_shapes(qwen35):
    out, _ = qwen35
    found = read_dir(out)
    exp = expected_qwen35(json.loads(QWEN35.read_text()))
    assert set(found) - set(exp) == set(), "tensors the real checkpoint does not have"
    assert set(exp) - set(found) == set(), "tensors the real checkpoint has that are missing"
    assert {k: (v[0], v[1]) for k, v in found.items()} == exp


def test_qwen35_every_fp8_weight_has_its_block_scale(qwen35):
    out, _ = qwen35
    found = read_dir(out)
    fp8 = [k for k, v in found.items() if v[0] == "F8_E4M3"]
    assert len(fp8) > 1500
    for k in fp8:
        scale = found[k + "_scale_inv"]
        rows, cols = found[k][1]
        assert scale[0] == "F32" and scale[1] == (math.ceil(rows / 128), math.ceil(cols / 128)), k
    assert not [k for k in found if k.endswith("_scale_inv") and k[: -len("_scale_inv")] not in fp8]


def test_qwen35_bytes_are_in_format(qwen35):
    """No FP8 NaN code (0x7F/0xFF) in a sample, BF16 finite and small, scales positive and finite."""
    out, _ = qwen35
    found = read_dir(out)
    picks = [k for k in found if k.endswith(("in_proj_qkv.weight", "q_proj.weight", "experts.7.down_proj.weight",
                                             "embed_tokens.weight", "lm_head.weight", "weight_scale_inv"))]
    for k in picks[:60]:
        dtype, _shape, path, a, b = found[k]
        with path.open("rb") as f:
            f.seek(a)
            data = f.read(min(b - a, 1 << 20))
        if dtype == "F8_E4M3":
            assert 0x7F not in data and 0xFF not in data, k
        elif dtype == "BF16":
            vals = [struct.unpack("<f", b"\x00\x00" + data[i:i + 2])[0] for i in range(0, min(len(data), 4000), 2)]
            assert all(math.isfinite(x) and abs(x) < 1.0 for x in vals), k
        else:
            vals = [x for (x,) in struct.iter_unpack("<f", data)]
            assert all(math.isfinite(x) and 0 < x < 1 for x in vals), k


def test_qwen35_config_keeps_kinds_heads_experts_and_quantization(qwen35):
    out, _ = qwen35
    real = json.loads(QWEN35.read_text())
    mini = json.loads((out / "config.json").read_text())
    t, rt = mini["text_config"], real["text_config"]
    assert set(t["layer_types"]) == set(rt["layer_types"]) == {"linear_attention", "full_attention"}
    assert t["num_hidden_layers"] == len(t["layer_types"]) == 2
    interval = t["full_attention_interval"]
    assert all((k == "full_attention") == ((i + 1) % interval == 0) for i, k in enumerate(t["layer_types"]))
    for key in ("num_experts", "num_experts_per_tok", "head_dim", "num_attention_heads", "num_key_value_heads",
                "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads", "linear_num_value_heads",
                "linear_conv_kernel_dim", "vocab_size", "attn_output_gate", "rope_parameters", "model_type"):
        assert t[key] == rt[key], key
    assert (t["hidden_size"], t["moe_intermediate_size"], t["shared_expert_intermediate_size"]) == (H, MOE_I,
                                                                                                      SHARED_I)
    assert mini["architectures"] == real["architectures"] and mini["model_type"] == real["model_type"]
    assert mini["vision_config"]["depth"] == 1 and mini["vision_config"]["out_hidden_size"] == H
    found = read_dir(out)
    mtp_layers = {k.split(".")[2] for k in found if k.startswith("mtp.layers.")}
    assert t["mtp_num_hidden_layers"] == len(mtp_layers) == 1
    q, rq = dict(mini["quantization_config"]), dict(real["quantization_config"])
    skip, rskip = q.pop("modules_to_not_convert"), rq.pop("modules_to_not_convert")
    assert q == rq, "quantization_config changed beyond modules_to_not_convert"
    # the skip list names modules that exist, stay BF16, and covers every BF16 linear the real list skips
    for m in skip:
        assert found.get(m + ".weight", ("BF16",))[0] == "BF16", m
        assert any(k.startswith(m + ".") for k in found), m
    assert {"lm_head", "model.language_model.embed_tokens", "mtp.fc"} <= set(skip) <= set(rskip) | {
        "model.language_model.layers.1.mlp.gate", "model.language_model.layers.1.mlp.shared_expert_gate"}
    for suffix in ("linear_attn.in_proj_a", "linear_attn.in_proj_b", "linear_attn.conv1d", "mlp.gate",
                   "mlp.shared_expert_gate"):
        assert f"model.language_model.layers.0.{suffix}" in skip
    assert "model.language_model.layers.1.mlp.gate" in skip
    assert not [m for m in skip if m.startswith("model.visual.blocks.") and not m.startswith("model.visual.blocks.0.")]


def test_qwen35_events_and_index(qwen35):
    out, proc = qwen35
    events = miniature.parse_events(proc.stdout)
    phases = [e.phase for e in events]
    assert phases[0] == "config" and phases[1] == "plan" and phases[-2:] == ["copied", "done"]
    assert set(phases[2:-2]) == {"written"}
    found = read_dir(out)
    data_bytes = sum(math.prod(v[1]) * SIZES[v[0]] for v in found.values())
    s = miniature.summarize(events, proc.stderr, proc.returncode)
    assert s.done and s.error is None and s.tensors == len(found) and s.bytes == data_bytes
    assert s.model_type == "qwen3_5_moe" and s.architecture == "Qwen3_5MoeForConditionalGeneration"
    assert events[0].data["kept_layers"] == [0, 3]
    assert len(s.files) == len(list(out.glob("*.safetensors"))) >= 2
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == data_bytes
    assert {k: Path(v[2]).name for k, v in found.items()} == index["weight_map"]


def test_dense_qwen3_is_one_bf16_file(qwen3):
    out, proc = qwen3
    real = json.loads(QWEN3.read_text())
    mini = json.loads((out / "config.json").read_text())
    assert not (out / "model.safetensors.index.json").exists()
    found = read_dir(out)
    hd, nh, nkv, vocab = real["head_dim"], real["num_attention_heads"], real["num_key_value_heads"], real["vocab_size"]
    exp = {"model.embed_tokens.weight": (vocab, H), "model.norm.weight": (H,), "lm_head.weight": (vocab, H)}
    for i in range(2):
        p = f"model.layers.{i}"
        exp |= {p + ".input_layernorm.weight": (H,), p + ".post_attention_layernorm.weight": (H,),
                p + ".self_attn.q_proj.weight": (nh * hd, H), p + ".self_attn.k_proj.weight": (nkv * hd, H),
                p + ".self_attn.v_proj.weight": (nkv * hd, H), p + ".self_attn.o_proj.weight": (H, nh * hd),
                p + ".self_attn.q_norm.weight": (hd,), p + ".self_attn.k_norm.weight": (hd,),
                p + ".mlp.gate_proj.weight": (DENSE_I, H), p + ".mlp.up_proj.weight": (DENSE_I, H),
                p + ".mlp.down_proj.weight": (H, DENSE_I)}
    assert {k: v[1] for k, v in found.items()} == exp
    assert {v[0] for v in found.values()} == {"BF16"}
    assert (mini["num_hidden_layers"], mini["hidden_size"], mini["intermediate_size"]) == (2, H, DENSE_I)
    assert mini["max_window_layers"] == 2 and mini["vocab_size"] == vocab
    assert [e.phase for e in miniature.parse_events(proc.stdout)][-1] == "done"


def test_tokenizer_and_generation_config_are_copied_unchanged(tmp_path):
    src = tmp_path / "model"
    src.mkdir()
    (src / "config.json").write_text(QWEN3.read_text())
    files = {"tokenizer.json": b'{"model": {"vocab": {"a": 0}}}\n', "tokenizer_config.json": b'{"x": 1}',
             "generation_config.json": b'{"temperature": 0.6}', "chat_template.jinja": b"{{ messages }}\xe2\x9c\x93"}
    for name, data in files.items():
        (src / name).write_bytes(data)
    (src / "model-00001-of-00009.safetensors").write_bytes(b"not copied")
    proc = run_writer(src, tmp_path / "mini")
    assert proc.returncode == 0, proc.stderr
    for name, data in files.items():
        assert (tmp_path / "mini" / name).read_bytes() == data
    assert not (tmp_path / "mini" / "model-00001-of-00009.safetensors").exists()
    copied = next(e for e in miniature.parse_events(proc.stdout) if e.phase == "copied")
    assert sorted(copied.data["files"]) == sorted(files)


@pytest.mark.parametrize(("setup", "needle"), [
    ("deepseek", "deepseek_v3"),
    ("missing", "no config.json"),
    ("badjson", "cannot read"),
    ("badhidden", "multiple of the FP8 block"),
])
def test_bad_input_is_one_line_and_nonzero(tmp_path, setup, needle):
    extra: list[str] = []
    src: Path = tmp_path / "model"
    if setup == "deepseek":
        src = SPECS / "deepseek_v3.config.json"
    elif setup == "badjson":
        src.mkdir()
        (src / "config.json").write_text("{not json")
    elif setup == "badhidden":
        src, extra = QWEN35, ["--hidden", "200"]
    proc = run_writer(src, tmp_path / "out", *extra)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("miniature: error:")
    s = miniature.summarize(miniature.parse_events(proc.stdout), proc.stderr, proc.returncode)
    assert not s.done and s.error == lines[0]
    assert not list((tmp_path / "out").glob("*.safetensors")) if (tmp_path / "out").exists() else True


def test_event_parser_is_bounded_and_typed():
    good = '::miniature:: plan {"tensors": 3, "bytes": 10, "files": 1}'
    assert miniature.parse_event_line(good) == miniature.MiniatureEvent("plan", {"tensors": 3, "bytes": 10,
                                                                                  "files": 1})
    for bad in ("plan {}", "::miniature:: nosuch {}", "::miniature:: plan {bad", "::miniature:: plan [1]",
                "::miniature:: plan " + '{"x": "' + "y" * miniature.MAX_LINE_CHARS + '"}'):
        assert miniature.parse_event_line(bad) is None
    flood = "\n".join([good] * (miniature.MAX_EVENTS + 50))
    assert len(miniature.parse_events(flood)) == miniature.MAX_EVENTS
    s = miniature.summarize(miniature.parse_events("noise\n" + good + "\n"), "", None)
    assert (s.done, s.tensors, s.bytes) == (False, 3, 10)
    assert miniature.remote_command("/m/a b", "/tmp/o", shard_mb=64) == "python3 - '/m/a b' /tmp/o --shard-mb 64"
    assert miniature.program_text().startswith('"""Write a MINIATURE')


def test_gpu_fixture_agrees_with_what_the_writer_writes_here(qwen35, qwen3):
    """The GPU run's report (tests/fixtures/miniature, a real output of benchmarks/miniature_gpu.py on an
    H100) describes the same miniature this machine's writer makes: same tensor count, bytes, files,
    architecture; transformers loaded it as that architecture with the same FP8 block config, every key
    matched, the loaded bytes are the file's; and one forward pass ran on the GPU.

    Qwen3.5's FP8 forward through transformers' own FP8 GEMM needs its ``kernels`` package, which
    fetches compiled kernels from the Hub (no network there): the report keeps that failure, and the
    forward ran on the same files dequantized at load (each FP8 block times its ``weight_scale_inv``)."""
    report = json.loads(FIXTURE.read_text())
    assert report["_header"]["machine"] and report["_header"]["date"] and report["_header"]["command"]
    assert "H100" in report["device_name"]
    for key, (out, _proc) in (("qwen3.5-122B-A10B-FP8", qwen35), ("qwen3-8B", qwen3)):
        rep = report["models"][key]
        found = read_dir(out)
        data_bytes = sum(math.prod(v[1]) * SIZES[v[0]] for v in found.values())
        assert rep["write"]["tensors"] == rep["files"]["tensors"] == len(found), key
        assert rep["write"]["bytes"] == rep["files"]["bytes"] == data_bytes, key
        assert rep["write"]["files"] == sorted(p.name for p in out.glob("*.safetensors")), key
        arch = json.loads((out / "config.json").read_text())["architectures"][0]
        assert rep["load"]["class"] == arch and rep["load"]["class_is_config_architecture"], key
        assert rep["load"]["missing_keys_count"] == 0 and rep["load"]["mismatched_keys"] == [], key
        assert rep["same_bytes"]["all_equal"] and rep["same_bytes"]["compared"] >= 4, key
        assert rep["files"]["fp8_nan_codes"] == 0, key
        ran = rep["forward"] if "finite" in rep["forward"] else rep["forward_dequantized"]
        assert ran["finite"] is True and ran["logits_shape"][-1] == json.loads(
            (out / "config.json").read_text()).get("text_config", {}).get("vocab_size", ran["logits_shape"][-1]), key
    q35 = report["models"]["qwen3.5-122B-A10B-FP8"]
    q = q35["load"]["quantization_config"]
    assert q == {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
    assert q35["load"]["module_kinds"].get("FP8Linear", 0) > 0 and q35["load"]["module_kinds"].get("FP8Experts", 0) > 0
    assert "kernels" in q35["forward"]["error"]  # transformers' FP8 GEMM kernel: not to be had offline
    assert q35["forward_dequantized"]["class"] == "Qwen3_5MoeForConditionalGeneration"
