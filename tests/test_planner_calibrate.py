"""Calibration from a real vLLM start (planner/calibrate.py, ``plan --from-log``), and the
overheads by vLLM version (planner/overheads.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sparkconsole.planner import overheads as ov
from sparkconsole.planner.calibrate import calibrate, read_log
from sparkconsole.planner.plan import PlanOptions, plan
from sparkconsole.planner.spec import load_spec

REAL = Path(__file__).parent / "fixtures" / "real" / "vllm-logs"
LLAMA = Path(__file__).parent / "fixtures" / "quant" / "llama-3.1-8b-instruct.config.json"
LOG09 = REAL / "09-v06-kv-cache-smaller-than-max-seq-len.log"


def test_read_log_real_gb10_hybrid_start():
    lg = read_log((REAL / "02-dgx-spark-nemotron-hybrid-nv2601-ready.log").read_text())
    assert (lg.weights_gib, lg.kv_gib, lg.kv_tokens, lg.max_concurrency) == (4.9054, 11.15, 208_320, 98.2)
    assert (lg.block_size, lg.padding_layers, lg.max_model_len, lg.gpu_memory_utilization) == (992, 3, 8192, 0.15)
    assert (lg.tp, lg.kv_cache_dtype, lg.enable_prefix_caching, lg.max_num_batched_tokens) == (1, "fp8", False, 2048)
    assert lg.cuda_graph_captured_gib == 1.0 and lg.ran
    # vLLM 0.13 prints the OLD "GPU KV cache size" (blocks // groups x block) and the real concurrency:
    # 208,320 = 210 x 992 and 98.20 x 15 blocks per request = 1,473 blocks = 210 x 7 groups + 3
    assert 208_320 == 210 * 992 and round(1473 / 15, 2) == 98.2 and 1473 // 7 == 210
    assert not ov.rules_for(lg.vllm_version).new_kv_print


def test_read_log_v06_profile_and_odd_input():
    lg = read_log(LOG09.read_text())
    # "Memory profiling results: total_gpu_memory=23.58GiB ... peak_torch_memory=17.98GiB
    # non_torch_memory=0.35GiB": activation = peak torch 17.98 - weights 14.9888
    assert lg.total_gib == 23.58 and lg.non_torch_gib == 0.35
    assert lg.activation_gib == pytest.approx(17.98 - 14.9888)
    assert lg.gpu_blocks == 1478 and not lg.ran and lg.state == "failed"
    assert read_log("") == read_log("\x00\x01 garbage [1;36m") == read_log(None)  # type: ignore[arg-type]


def test_calibrated_plan_reproduces_the_real_v06_log_exactly():
    """Real log 09 (vLLM 0.6, Llama-3.1-8B-Instruct, RTX 3090, gmu 0.90, max_model_len 29,000).

    Weights: the planner's 14.9888 GiB = the logged "14.9888 GB" (8.03B params x 2 B + the rotary
    cache of 131,072 x 128 x 2 B). KV: 1,478 blocks of 16 tokens x 131,072 B/token = 2 MiB each =
    2.887 GiB ("kv_cache_size=2.89GiB"); one request of 29,000 tokens needs cdiv(29000, 16) = 1,813
    blocks: 1,478 / 1,813 = 0.815 -> "0.82x", and 1,478 x 16 = 23,648 tokens fit (the log's error).
    """
    spec = load_spec(str(LLAMA))
    lg = read_log(LOG09.read_text())
    cal = calibrate(spec, lg, PlanOptions(), {"max_model_len": 23_648})
    assert cal.at_log.weights_gib_per_node == pytest.approx(14.9888, abs=0.0001)
    assert cal.num_blocks == 1478 and cal.reproduced == {"max_concurrency": True}
    assert cal.calibrated.capacity.kv_cache_tokens_old == 23_648
    assert not cal.calibrated.fits      # vLLM refused it: 1,478 < 1,813 blocks
    assert cal.replan is not None and cal.replan.fits
    assert cal.replan.capacity.num_blocks == 1478 and cal.replan.capacity.max_concurrency == 1.0
    # the budget held 3.34 GiB besides weights and KV: 0.90 x 23.58 - 14.99 - 2.89
    assert any("3.34 GiB besides weights and KV" in n for n in cal.notes)


def test_calibrated_gmu_change_adds_exactly_the_difference():
    spec = load_spec(str(LLAMA))
    cal = calibrate(spec, read_log(LOG09.read_text()), PlanOptions(force=True), {"gpu_memory_utilization": 0.95})
    # + 0.05 x 23.58 GiB = 1.179 GiB = 603 more 2-MiB blocks
    assert cal.replan.capacity.num_blocks == 1478 + int(0.05 * 23.58 * 1024 / 2)
    assert cal.replan.fits


def test_a_configuration_vllm_ran_is_never_does_not_fit():
    """SYNTHETIC log (the lines are real vLLM wording, the numbers made up): the weights logged are
    far above the planner's node memory, yet vLLM allocated its KV cache, so the verdict is fits."""
    spec = load_spec("Qwen/Qwen3-8B")
    log = ("INFO 01-01 00:00:00 [gpu_model_runner.py:1] Model loading took 150.00 GiB memory and 9.0 seconds\n"
           "INFO 01-01 00:00:01 [gpu_worker.py:1] Available KV cache memory: 4.00 GiB\n"
           "INFO 01-01 00:00:01 [kv_cache_utils.py:1] Maximum concurrency for 4,096 tokens per request: 7.11x\n"
           "INFO 01-01 00:00:02 [launcher.py:1] Application startup complete.\n")
    cal = calibrate(spec, read_log(log), PlanOptions(max_model_len=4096))
    assert cal.logged.ran and cal.calibrated.fits
    assert cal.calibrated.reasons[0].startswith("fits")


def test_ways_out_never_repeat_the_request():
    spec = load_spec("Qwen/Qwen3.5-122B-A10B-FP8")
    r = plan(spec, PlanOptions(tp=1, max_model_len=262_144))
    assert not r.fits
    assert not any("--max-model-len 262,144" in w for w in r.ways_out)
    assert not any(w.startswith("more nodes: --tp 1 ") for w in r.ways_out)


def test_overheads_by_version():
    assert ov.rules_for("0.13.0+faa43dbf.nv26.01").graphs_in_budget is False
    assert ov.rules_for("0.19.1").graphs_in_budget and not ov.rules_for("0.19.1").new_kv_print
    assert ov.rules_for(None).version == ov.NEWEST and "assumed" in ov.rules_for(None).note
    # the activation estimate: linear to 8,192 tokens, square root above (not 32 GiB at 65,536)
    assert ov.activation_gib(2048) == 1.0 and ov.activation_gib(8192) == 4.0
    assert ov.activation_gib(65_536) == pytest.approx(4 * 8 ** 0.5)
    spec = load_spec("Qwen/Qwen3-8B")
    old, new = (plan(spec, PlanOptions(vllm_version=v)) for v in ("0.13", "0.20"))
    assert old.budget.overheads.cuda_graph_gib == 0.0 and new.budget.overheads.cuda_graph_gib == 0.5
    assert "(vLLM 0.13)" in old.reasons[0] and "(vLLM 0.20, assumed)" in plan(spec).reasons[0]


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparkconsole.cli", "plan", *args], input=stdin, text=True,
                          capture_output=True, timeout=60)


def test_cli_from_log_side_by_side_and_json():
    p = _cli(str(LLAMA), "--from-log", str(LOG09), "--max-model-len", "23648", "--offline")
    assert p.returncode == 0, p.stderr
    assert "1,478 (derived)" in p.stdout and "reproduced exactly: max_concurrency yes" in p.stdout
    j = _cli(str(LLAMA), "--from-log", "-", "--json", "--offline", stdin=LOG09.read_text())
    doc = json.loads(j.stdout)
    assert j.returncode == 1 and doc["num_blocks"] == 1478 and doc["calibration"]["num_blocks"] == 1478


@pytest.mark.parametrize("arg", ["/nonexistent/vllm.log", "-"])
def test_cli_from_log_bad_input_is_one_line_exit_2(arg):
    p = _cli(str(LLAMA), "--from-log", arg, "--offline", stdin="nothing vLLM said\n")
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
