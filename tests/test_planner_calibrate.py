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


# ---- vLLM admits on the smallest rank ----------------------------------------------------------------

QWEN = "Qwen/Qwen3.5-122B-A10B-FP8"
# SYNTHETIC log: every line is in the format a vLLM 0.17 Ray TP=2 start prints (the envelope and the
# RayWorkerWrapper prefixes as in real logs 18/20), the figures are made up so that the two ranks differ.
RANKS_LOG = """\
(APIServer pid=1) INFO 03-27 17:45:01 [utils.py:228] non-default args: {{'model_tag': '{m}', 'model': '{m}', \
'max_model_len': 65536, 'tensor_parallel_size': 2, 'gpu_memory_utilization': 0.85, \
'distributed_executor_backend': 'ray'}}
(EngineCore_DP0 pid=210) INFO 03-27 17:45:10 [core.py:93] Initializing a V1 LLM engine (v0.17.0) with config: \
model='{m}', speculative_config=None, dtype=torch.bfloat16, max_seq_len=65536, tensor_parallel_size=2, \
pipeline_parallel_size=1, quantization=fp8, kv_cache_dtype=auto, enable_prefix_caching=True
{a}
{b}
(EngineCore_DP0 pid=210) INFO 03-27 17:49:02 [kv_cache_utils.py:1319] GPU KV cache size: 737,792 tokens
(EngineCore_DP0 pid=210) INFO 03-27 17:49:02 [kv_cache_utils.py:1324] Maximum concurrency for 65,536 tokens per \
request: 37.05x
(APIServer pid=1) INFO:     Application startup complete.
"""
RANK0 = ("(EngineCore_DP0 pid=210) (RayWorkerWrapper pid=388) INFO 03-27 17:47:30 [gpu_model_runner.py:3846] "
         "Model loading took 58.31 GiB memory and 131.2 seconds\n"
         "(EngineCore_DP0 pid=210) (RayWorkerWrapper pid=388) INFO 03-27 17:49:01 [gpu_worker.py:436] "
         "Available KV cache memory: 34.31 GiB")
RANK1 = ("(EngineCore_DP0 pid=210) (RayWorkerWrapper pid=97, ip=192.168.200.13) INFO 03-27 17:47:31 "
         "[gpu_model_runner.py:3846] Model loading took 58.52 GiB memory and 131.9 seconds\n"
         "(EngineCore_DP0 pid=210) (RayWorkerWrapper pid=97, ip=192.168.200.13) INFO 03-27 17:49:01 "
         "[gpu_worker.py:436] Available KV cache memory: 33.80 GiB")


@pytest.mark.parametrize("first,second", [(RANK0, RANK1), (RANK1, RANK0)])
def test_calibration_takes_the_smallest_ranks_kv_budget(first, second):
    """Block 2,096 tokens x 1,024 B x 12 layers = 25,755,648 B per block id at TP=2.
    The tight rank: 33.80 GiB -> 1,408 or 1,409 blocks within the print's rounding; 1,408 / 38 = 37.05x
    (1,409 / 38 = 37.08x), 1,408 // 4 x 2,096 = 737,792 tokens: reproduced. The other rank's 34.31 GiB
    holds 1,430 blocks (1,430 / 38 = 37.63x), which is not what vLLM allocated."""
    lg = read_log(RANKS_LOG.format(m=QWEN, a=first, b=second))
    assert lg.kv_gib == 33.80 and lg.weights_gib == 58.52  # the tight rank's figures
    assert [v for _k, v in lg.kv_gib_ranks] == [33.80, 34.31]
    assert "ip=192.168.200.13" in lg.kv_gib_ranks[0][0]
    assert int(34.31 * (1 << 30)) // 25_755_648 == 1430
    cal = calibrate(load_spec(QWEN), lg, PlanOptions())
    assert cal.num_blocks == 1408
    assert cal.reproduced == {"kv_cache_tokens": True, "max_concurrency": True}
    assert any("smallest (33.80 GiB" in n for n in cal.notes)


def test_one_rank_or_a_later_start_is_not_mixed_in():
    # the same log twice: only the last start's ranks count (a restart with a bigger budget on one rank)
    again = RANKS_LOG.format(m=QWEN, a=RANK0, b=RANK1.replace("33.80", "34.50"))
    lg = read_log(RANKS_LOG.format(m=QWEN, a=RANK0, b=RANK1) + again)
    assert lg.kv_gib == 34.31 and len(lg.kv_gib_ranks) == 2


def test_a_pipeline_parallel_start_is_calibrated_stage_by_stage():
    """SYNTHETIC log in the RANKS_LOG envelope (real wording): a vLLM 0.17 start of the 122B at TP 1 x PP 2,
    its figures the planner's own PP plan (no real PP start with its capacity lines was found). Under
    PP each worker logs "Available KV cache memory" for its own 24 layers, and the engine core prints
    the capacity once for the shared block pool. Read as a TP=1 start of the whole model, the stage's
    GiB would buy half the blocks; the calibration reads pipeline_parallel_size, takes the block count
    from the capacity lines and gives each stage that many blocks of its own layers."""
    from sparkconsole.planner.weights import GIB

    P = PlanOptions
    spec = load_spec(QWEN)
    p = plan(spec, P(tp=1, pp=2, kv_cache_dtype="fp8", max_model_len=131_072, vllm_version="0.17.0"))
    assert p.fits and p.nodes == 2
    n, per_req = p.capacity.num_blocks, p.capacity.blocks_per_request
    rank = ("(EngineCore_DP0 pid=210) (RayWorkerWrapper pid={pid}) INFO 03-27 17:47:30 [gpu_model_runner.py:3846] "
            "Model loading took {w:.2f} GiB memory and 131.2 seconds\n"
            "(EngineCore_DP0 pid=210) (RayWorkerWrapper pid={pid}) INFO 03-27 17:49:01 [gpu_worker.py:436] "
            "Available KV cache memory: {kv:.2f} GiB")
    log = (RANKS_LOG.format(m=QWEN, a=rank.format(pid=388, w=p.weights_gib_per_node, kv=p.kv_cache_gib_per_node),
                            b=rank.format(pid=97, w=p.weights_gib_per_node - 1, kv=p.kv_cache_gib_per_node + 0.4))
           .replace("tensor_parallel_size=2, pipeline_parallel_size=1", "tensor_parallel_size=1, pipeline_parallel_size=2")
           .replace("'tensor_parallel_size': 2", "'pipeline_parallel_size': 2")
           .replace("kv_cache_dtype=auto", "kv_cache_dtype=fp8").replace("max_seq_len=65536", "max_seq_len=131072")
           .replace("737,792", f"{p.capacity.kv_cache_tokens_old:,}")
           .replace("65,536 tokens per request: 37.05x", f"131,072 tokens per request: {n / per_req:.2f}x"))
    lg = read_log(log)
    assert (lg.tp, lg.pp, lg.max_model_len, lg.kv_cache_dtype) == (1, 2, 131_072, "fp8")
    cal = calibrate(spec, lg, P())
    assert cal.num_blocks == n and cal.calibrated.capacity.num_blocks == n
    assert cal.reproduced == {"kv_cache_tokens": True, "max_concurrency": True}
    assert cal.calibrated.nodes == 2 and any("pipeline parallel (2 stages" in x for x in cal.notes)
    # what reading the stage's GiB against the whole model's block would have said: about half
    whole_bpb = p.layout.bytes_per_block * 2
    assert int(lg.kv_gib * GIB) // whole_bpb < 0.6 * n
    # 5 more points of gmu on 121.69 GiB buy each stage floor(6.08 GiB / its block) more blocks
    more = calibrate(spec, lg, P(), {"gpu_memory_utilization": (lg.gpu_memory_utilization or 0.85) + 0.05})
    assert more.replan is not None
    assert more.replan.capacity.num_blocks == n + int(0.05 * 121.69 * GIB // p.layout.bytes_per_block)


# ---- a way out never repeats the request; what vLLM ran (or less) never "does not fit" -----------------

def test_ways_out_never_offer_what_was_asked():
    spec = load_spec(QWEN)
    r = plan(spec, PlanOptions(tp=1, kv_cache_dtype="fp8", language_model_only=True))
    assert not r.fits and r.ways_out
    assert not any("--kv-cache-dtype fp8" in w or "--language-model-only" in w for w in r.ways_out)
    pp = plan(spec, PlanOptions(tp=1, pp=2, nodes=2, kv_cache_dtype="fp8", max_model_len=262_144,
                                gpu_memory_utilization=0.5, force=True))
    assert not pp.fits and pp.ways_out and "fp8 KV" not in pp.ways_out[0]


def test_a_four_bit_checkpoint_is_not_told_to_become_four_bit():
    """SYNTHETIC: the bundled Qwen3-235B-A22B config with a ModelOpt NVFP4 quantization_config
    (~125 GiB of NVFP4 weights: does not fit one Spark). The 4-bit way out would be the same size."""
    from sparkconsole.planner.spec import SPECS_DIR, spec_from_config

    raw = json.loads((SPECS_DIR / "qwen3-235B-A22B.config.json").read_text())
    raw["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                                  "exclude_modules": ["lm_head"]}
    spec = spec_from_config(raw, "synthetic/Qwen3-235B-A22B-NVFP4", "test")
    r = plan(spec, PlanOptions(tp=1))
    assert not r.fits and r.weights_gib_per_node > 100
    assert not any("4-bit variant" in w for w in r.ways_out)
    assert any(w.startswith("more nodes") for w in r.ways_out)
    # an FP8 checkpoint still hears of it (about 62 GiB of 4-bit weights against 116 GiB of FP8)
    fp8 = plan(load_spec(QWEN), PlanOptions(tp=1))
    assert any(w.startswith("a 4-bit variant") for w in fp8.ways_out)


def test_calibrated_replan_of_the_logged_settings_is_no_replan_and_less_still_fits():
    """SYNTHETIC log (real wording, made-up numbers, as above): weights far above the node, yet vLLM ran."""
    spec = load_spec("Qwen/Qwen3-8B")
    log = ("INFO 01-01 00:00:00 [gpu_model_runner.py:1] Model loading took 150.00 GiB memory and 9.0 seconds\n"
           "INFO 01-01 00:00:01 [gpu_worker.py:1] Available KV cache memory: 4.00 GiB\n"
           "INFO 01-01 00:00:01 [kv_cache_utils.py:1] Maximum concurrency for 4,096 tokens per request: 7.11x\n"
           "INFO 01-01 00:00:02 [launcher.py:1] Application startup complete.\n")
    lg = read_log(log)
    same = calibrate(spec, lg, PlanOptions(max_model_len=4096), {"max_model_len": 4096})
    assert same.replan is None and same.calibrated.fits
    less = calibrate(spec, lg, PlanOptions(max_model_len=4096), {"max_model_len": 2048})
    assert less.replan is not None and less.replan.fits and not less.replan.ways_out
    assert less.replan.reasons[0].startswith("fits")
