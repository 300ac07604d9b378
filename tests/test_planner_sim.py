"""The simulator's vLLM log and the planner agree exactly on the KV figures (blocks, tokens,
concurrency), and ``plan --from-log`` on the sim's own log reproduces them.

The sim's engine for a model the planner bundles logs the planner's own hybrid KV arithmetic
(``planner.plan.vllm_kv``) for the vLLM its image runs (0.17 in the story), so what the console,
the wizard's calibration and ``sparkconsole plan`` read from the sim is what vLLM would print.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys

import pytest

from sparkconsole.planner.calibrate import calibrate, read_log
from sparkconsole.planner.plan import PlanOptions, plan
from sparkconsole.planner.spec import load_spec
from sparkconsole.sim import Shell, SimClock, build
from sparkconsole.sim.model import CUDA_TOTAL_GIB, GIB, MODELS

HEAD, WORKER = "spark-1a32", "spark-5be3"
QWEN = "Qwen/Qwen3.5-122B-A10B-FP8"
IMG = "vllm/vllm-openai:v0.17.0"


async def _sh(c, node: str, cmd: str) -> tuple[str, str, int]:
    """Run ``cmd`` on the manual clock, 5 sim seconds at a time, until it finishes."""
    task = asyncio.ensure_future(Shell(c, node).capture(cmd))
    for _ in range(1000):
        for _ in range(40):
            await asyncio.sleep(0)
        if task.done():
            return task.result()
        c.clock.advance(5.0)
    task.cancel()
    raise AssertionError(f"{cmd!r} did not finish")


async def _tp2_log(mml: int) -> str:
    """A TP=2 Qwen3.5-122B-A10B-FP8 start over Ray on the healthy demo cluster (vLLM 0.17.0)."""
    c = build("healthy", nodes=2, clock=SimClock.frozen())
    head_ip, worker_ip = c.node(HEAD).fast_ip, c.node(WORKER).fast_ip  # the fast link's (link-local) IPv4s
    await _sh(c, HEAD, f"docker run -d --name ray-head --network host --entrypoint ray {IMG} start --block --head "
                       f"--node-ip-address={head_ip} --port=6379")
    await _sh(c, WORKER, f"docker run -d --name ray-worker --network host --entrypoint ray {IMG} start --block "
                         f"--address={head_ip}:6379 --node-ip-address={worker_ip}")
    _, err, rc = await _sh(c, HEAD, f"docker exec -d ray-head vllm serve {QWEN} --tensor-parallel-size 2 "
                                    f"--gpu-memory-utilization 0.85 --max-model-len {mml} --served-model-name q "
                                    "--distributed-executor-backend ray")
    assert rc == 0, err
    run = next(x.engine for x in c.containers if x.engine and x.engine.tp == 2)
    assert run.failure is None and run.ready_at is not None
    return "\n".join(ln.text for ln in run.lines)


# The sim's budget per rank: 0.85 x 121.69 - 116.62 / 2 (weights) - 11.33 (its overheads) = 33.7965 GiB
# = 36,288,715,554 B. The planner's layout at TP=2 (bf16 KV): 12,288 B per token over 12 attention
# layers = 1,024 B per token and layer; GDN state page 2,134,016 B -> block 2,096 tokens (page
# 2,146,304 B, the state page padded by 12,288 / 2,134,016 = 0.58%); 4 groups of 12 layers, so one
# block id costs 2,146,304 x 12 = 25,755,648 B and 36,288,715,554 // 25,755,648 = 1,408 blocks.
# A request of L tokens takes cdiv(L, 2,096) + 3 x 2 (align mode) blocks; vLLM 0.17 prints
# "GPU KV cache size" as 1,408 // 4 x 2,096 = 737,792 tokens.
CASES = [
    (65_536, 32 + 6, "37.05"),     # 1,408 / 38 = 37.05
    (262_144, 126 + 6, "10.67"),   # 1,408 / 132 = 10.67 (the old sim printed 736,480 tokens / 2.81x)
]


@pytest.mark.parametrize("mml,per_req,conc", CASES)
async def test_sim_logs_the_planners_hybrid_kv_and_from_log_reproduces_it(mml, per_req, conc):
    log = await _tp2_log(mml)
    assert "Setting attention block size to 2096 tokens" in log
    assert "Padding mamba page size by 0.58%" in log
    assert "GPU KV cache size: 737,792 tokens" in log
    assert f"Maximum concurrency for {mml:,} tokens per request: {conc}x" in log
    # every worker logs its budget: the remote one under its Ray prefix
    assert re.search(r"\(RayWorkerWrapper pid=\d+, ip=169\.254\.\d+\.\d+\) INFO .* Available KV cache memory: 33\.8 GiB",
                     log)

    # the planner at the same budget and vLLM version: the same blocks, tokens and concurrency
    budget = 0.85 * CUDA_TOTAL_GIB - MODELS[QWEN].weights_gib_tp1 / 2 - MODELS[QWEN].overhead_gib
    assert int(budget * GIB) == 36_288_715_554
    spec = load_spec(QWEN)
    r = plan(spec, PlanOptions(tp=2, nodes=2, max_model_len=mml, vllm_version="0.17", kv_cache_gib=budget))
    assert (r.capacity.num_blocks, r.capacity.blocks_per_request) == (1408, per_req)
    assert r.capacity.kv_cache_tokens_old == 737_792 and f"{r.capacity.max_concurrency:.2f}" == conc
    assert r.layout.block_size == 2096 and r.reasons[0].endswith("(vLLM 0.17)")

    # calibrated from the sim's own log: the block count behind every logged figure, reproduced exactly
    lg = read_log(log)
    assert (lg.vllm_version, lg.tp, lg.max_model_len, lg.kv_gib, lg.weights_gib) == ("0.17.0", 2, mml, 33.8, 58.31)
    cal = calibrate(spec, lg, PlanOptions())
    assert cal.num_blocks == 1408
    assert cal.reproduced == {"kv_cache_tokens": True, "max_concurrency": True}
    assert cal.calibrated.capacity.num_blocks == 1408 and cal.calibrated.fits


async def test_cli_from_log_on_the_sims_log_and_the_version_print():
    log = await _tp2_log(65_536)
    p = subprocess.run([sys.executable, "-m", "sparkconsole.cli", "plan", QWEN, "--from-log", "-", "--json",
                        "--offline"], input=log, text=True, capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["num_blocks"] == 1408 and doc["max_concurrency"] == 37.05
    assert doc["calibration"]["reproduced"] == {"kv_cache_tokens": True, "max_concurrency": True}
    # the text table names the figure this vLLM version prints beside the 0.20+ one:
    # 1,408 / 38 x 65,536 = 2,428,281 (0.20+), 737,792 (0.17)
    t = subprocess.run([sys.executable, "-m", "sparkconsole.cli", "plan", QWEN, "--tp", "2", "--nodes", "2",
                        "--max-model-len", "65536", "--vllm-version", "0.17", "--kv-cache-gib",
                        repr(0.85 * CUDA_TOTAL_GIB - MODELS[QWEN].weights_gib_tp1 / 2 - MODELS[QWEN].overhead_gib),
                        "--offline"], text=True, capture_output=True, timeout=120)
    assert t.returncode == 0, t.stderr
    assert "1,408 (38 per request)" in t.stdout and "37.05x" in t.stdout
    assert "2,428,281 tokens (vLLM 0.17 prints 737,792)" in t.stdout
