"""The vLLM log phase parser against real logs, the GB10 error strings, and synthetic edge cases.

Synthetic lines are built from the exact format strings in ``research/vllm-log-phases.md``.
"""

from __future__ import annotations

import json
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkconsole.logs.vllm import (
    CONTRACT_KEYS,
    FAILURE_KINDS,
    PHASE_COMPILING,
    PHASE_CUDA_GRAPHS,
    PHASE_LOADING,
    PHASE_RAY_WAIT,
    PHASE_READY,
    STATES,
    VllmLogReport,
    VllmLogTracker,
    parse_vllm_log,
    worst_report,
)
from tests.conftest import REAL, real_fixture

LOGS = REAL / "vllm-logs"
EXPECTED = json.loads((LOGS / "expected.json").read_text(encoding="utf-8"))
BY_FILE = {e["file"]: e for e in EXPECTED}



def _log(name: str) -> str:
    return real_fixture(f"vllm-logs/{name}")


def _physical_lines(text: str) -> list[str]:
    """Split as ``docker logs -f`` delivers: on ``\\n`` only (``\\r`` stays inside a line)."""
    return text.removesuffix("\n").split("\n") if text else []


def _feed_lines(text: str) -> VllmLogTracker:
    tracker = VllmLogTracker()
    for line in _physical_lines(text):
        tracker.feed(line + "\n")
    return tracker


# --------------------------------------------------------------------------------------------
# real logs


@pytest.mark.parametrize("entry", EXPECTED, ids=[e["file"][:2] for e in EXPECTED])
def test_real_log_matches_expected(entry):
    expected = entry
    got = parse_vllm_log(_log(entry["file"])).contract_dict()
    assert {
        "final_state": got["state"],
        "failure_kind": got["failure_kind"],
        "shards_total": got["shards_total"],
        "shards_done_max": got["shards_done"],
        "model_load_gib": got["model_load_gib"],
        "kv_cache_tokens": got["kv_cache_tokens"],
        "max_concurrency": got["max_concurrency"],
        "listen_port": got["port"],
    } == {
        k: expected[k]
        for k in (
            "final_state",
            "failure_kind",
            "shards_total",
            "shards_done_max",
            "model_load_gib",
            "kv_cache_tokens",
            "max_concurrency",
            "listen_port",
        )
    }


def test_expected_json_lists_every_log():
    assert sorted(p.name for p in LOGS.glob("*.log")) == sorted(BY_FILE)


@pytest.mark.parametrize("entry", EXPECTED, ids=[e["file"][:2] for e in EXPECTED])
def test_real_log_incremental_equals_whole(entry):
    text = _log(entry["file"])
    whole = parse_vllm_log(text)
    assert _feed_lines(text).report == whole
    # whole-line chunks of random sizes through feed_text
    rng = random.Random(entry["file"])
    lines = [ln + "\n" for ln in _physical_lines(text)]
    tracker = VllmLogTracker()
    i = 0
    while i < len(lines):
        n = rng.randint(1, 7)
        tracker.feed_text("".join(lines[i : i + n]))
        i += n
    assert tracker.report == whole


def test_02_nemotron_ready_details():
    r = parse_vllm_log(_log("02-dgx-spark-nemotron-hybrid-nv2601-ready.log"))
    assert r.state == "ready" and r.failure_kind is None and r.failure_line is None and r.advice is None
    assert r.vllm_version == "0.13.0+faa43dbf.nv26.01"
    assert r.model == "nvidia/NVIDIA-Nemotron-3-Nano-4B-FP8"
    assert r.architecture == "NemotronHForCausalLM"
    assert r.kv_cache_gib == 11.15
    assert r.max_model_len == 8192
    assert r.weights_seconds == 32.77 and r.load_seconds == 44.986674
    assert r.compile_seconds == 92.20
    assert (r.cuda_graph_done, r.cuda_graph_total, r.cuda_graph_mode) == (35, 35, "decode, FULL")
    assert r.init_engine_seconds == 127.33
    assert r.listen_url == "http://0.0.0.0:8000"
    phases = [p for p, _ in r.phase_events]
    assert phases[0] == "starting" and phases[-1] == PHASE_READY
    for p in (PHASE_LOADING, PHASE_COMPILING, PHASE_CUDA_GRAPHS):
        assert p in phases
    line_nos = [n for _, n in r.phase_events]
    assert line_nos == sorted(line_nos)


def test_04_compose_prefix_and_fastsafetensors():
    r = parse_vllm_log(_log("04-dgx-spark-qwen36-fastsafetensors-compose.log"))
    assert r.shard_desc == "Loading safetensors using Fastsafetensor loader"
    assert (r.shards_done, r.shards_total) == (10, 42)
    assert r.port == 8355 and r.state == "loading"
    assert r.failure_kind is None  # the GDS UserWarning and `warnings.warn(` are not failures


def test_07_collapsed_spacing():
    r = parse_vllm_log(_log("07-v0-multiproc-collapsed-spacing-shards.log"))
    assert (r.shards_done, r.shards_total) == (10, 30)
    assert r.shard_elapsed_s == 3 and r.shard_eta_s == 6
    assert r.shard_seconds_per_it == pytest.approx(1 / 2.90)


def test_09_v06_kv_too_small():
    r = parse_vllm_log(_log("09-v06-kv-cache-smaller-than-max-seq-len.log"))
    assert r.kv_cache_gib == 2.89  # `kv_cache_size=2.89GiB`
    assert r.gpu_blocks == 1478  # the `# GPU blocks` line is a log line, not a comment
    assert r.estimated_max_model_len == 23648 and r.max_model_len == 29000
    assert "23648" in r.advice and "--max-model-len" in r.advice


def test_13_oom_root_cause_is_first_error():
    r = parse_vllm_log(_log("13-v1-cuda-oom-creating-weights.log"))
    assert r.failure_kind == "oom"
    assert r.failure_line.startswith("Failed to create unquantized linear weights: CUDA out of memory")
    assert r.failure_line_no == 1
    assert "--gpu-memory-utilization" in r.advice and "drop_caches" in r.advice


def test_15_reports_unsupported_architecture():
    r = parse_vllm_log(_log("15-qwen3-arch-not-supported-old-vllm.log"))
    assert r.unsupported_architectures == ("Qwen3ForCausalLM",)
    assert "Qwen3ForCausalLM" in r.advice


def test_18_surfaces_remote_node_ip():
    r = parse_vllm_log(_log("18-ray-multinode-nccl-watchdog-timeout.log"))
    assert r.failure_node_ip == "10.175.94.190"
    assert "10.175.94.190" in r.remote_ips
    assert "Watchdog caught collective operation timeout" in r.failure_line
    assert not r.failure_line.startswith("(")  # prefixes stripped
    assert "NCCL_SOCKET_IFNAME" in r.advice and "GLOO_SOCKET_IFNAME" in r.advice


def test_20_banner_version_model_no_port_from_echoed_command():
    r = parse_vllm_log(_log("20-dgx-spark-2node-ray-launch-banner.log"))
    assert r.vllm_version == "0.16.1rc1.dev296+ga73af584f.d20260305"
    assert r.model == "QuantTrio/MiniMax-M2-AWQ"
    assert r.port is None  # `--port 8000` is only in the echoed command


def test_25_kv_and_cuda_graph_capture():
    r = parse_vllm_log(_log("25-qwen35-gguf-kv-cache-and-cudagraph-capture.log"))
    assert r.kv_cache_gib == 6.9
    assert (r.cuda_graph_done, r.cuda_graph_total) == (51, 51)
    assert r.phase == PHASE_CUDA_GRAPHS


def test_31_ray_no_gpu():
    r = parse_vllm_log(_log("31-ray-current-node-has-no-gpu.log"))
    assert r.failure_line.startswith("ValueError: Current node has no GPU available")
    assert "ray status" in r.advice


def test_gb10_startup_excerpt():
    text = real_fixture("gb10/vllm_serve_startup_log_excerpt_gb10.txt")
    r = parse_vllm_log(text)
    assert r.vllm_version == "0.14.0rc1.dev265+g951302989.d20260105"
    assert r.architecture == "Qwen3NextForCausalLM"
    assert r.model == "Qwen/Qwen3-Next-80B-A3B-Instruct-FP8"
    assert (r.shards_done, r.shards_total) == (0, 8)
    assert r.state == "loading" and r.failure_kind is None
    assert r.port is None  # only in the echoed command and in non-default args
    assert _feed_lines(text).report == r


# --------------------------------------------------------------------------------------------
# GB10 error strings: each block classified


def _error_blocks() -> dict[str, list[str]]:
    text = real_fixture("gb10/error_strings_collection.txt")
    blocks: dict[str, list[str]] = {}
    for chunk in text.split("## from ")[1:]:
        title, *lines = chunk.splitlines()
        # '# ^ doc: ...' lines are the collector's comments, not output
        blocks[title.split(" (")[0]] = [ln for ln in lines if ln.strip() and not ln.startswith("# ")]
    return blocks


ERROR_BLOCKS = _error_blocks()
ERROR_EXPECTED = {
    "github.com/eugr/spark-vllm-docker issue #396": ("failed", "oom"),
    "github.com/vllm-project/vllm issue #35313": ("failed", "oom"),
    "github.com/vllm-project/vllm issue #42354": ("failed", "nccl"),
    "github.com/MiaAI-Lab/Qwen3.8-Flash-Next-Dual-DGX-Sparks issue #3": ("failed", "nccl"),
    "github.com/TechPreacher/dgx-spark-vllm-cluster CLAUDE.md / README.md": ("failed", "other"),
    "github.com/sgl-project/sglang issue #29317": ("failed", "other"),
    "github.com/vllm-project/vllm issue #30855": ("failed", "other"),
    "github.com/vllm-project/vllm docs/serving/parallelism_scaling.md": ("unknown", None),
}


def test_error_blocks_all_covered():
    assert set(ERROR_BLOCKS) == set(ERROR_EXPECTED)


@pytest.mark.parametrize("title", sorted(ERROR_EXPECTED))
def test_error_block_classified(title):
    r = parse_vllm_log("\n".join(ERROR_BLOCKS[title]))
    assert (r.state, r.failure_kind) == ERROR_EXPECTED[title]


def test_error_block_kv_too_small_details():
    r = parse_vllm_log("\n".join(ERROR_BLOCKS["github.com/eugr/spark-vllm-docker issue #396"]))
    assert r.kv_cache_gib == 22.5
    assert r.estimated_max_model_len == 190272
    assert r.kv_cache_needed_gib == 23.25  # read across the paste's line break
    assert "190272" in r.advice


def test_error_block_free_memory_advice():
    r = parse_vllm_log("\n".join(ERROR_BLOCKS["github.com/vllm-project/vllm issue #35313"]))
    assert "drop_caches" in r.advice


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("nvidia-container-cli: initialization error: nvml error: driver not loaded", "other"),
        ("Failed to initialize NVML: Unknown Error", "other"),
        ("CUDA error: operation not permitted", "other"),
        ("current platform None does not support ray", "other"),
        ("WARNING: Using default MoE config ... GB10.json", None),
        ("CustomAllreduce is disabled because this process group spans across nodes.", None),
        ("proxy.cc:1716 NCCL WARN ... operation=Connect, res=3", "nccl"),
        ("[send] via NET/IB/GDRDMA", None),
        ("[send] via NET/Socket", None),
    ],
)
def test_error_single_lines(line, kind):
    r = parse_vllm_log(line + "\n")
    assert r.failure_kind == kind
    assert (r.state == "failed") == (kind is not None)


# --------------------------------------------------------------------------------------------
# synthetic edge cases (format strings from the research note)

EC = "(EngineCore_DP0 pid=165) INFO 03-18 06:55:04 "
API = "(APIServer pid=1) INFO 03-18 06:54:54 "
BAR = (
    "Loading safetensors checkpoint shards: {pct:3d}% Completed | {n}/{t} [00:{e:02d}<00:{r:02d},  3.05s/it]"
)


def bar(n: int, t: int) -> str:
    return BAR.format(pct=round(100 * n / t), n=n, t=t, e=3 * n, r=3 * (t - n))


def test_unknown_on_unrelated_text():
    assert parse_vllm_log("").state == "unknown"
    r = parse_vllm_log("hello\nroot@spark:~# ls\nfoo bar baz\n")
    assert r.state == "unknown" and r.phase is None and r.phase_events == ()
    assert r.contract_dict() == dict.fromkeys(CONTRACT_KEYS) | {"state": "unknown"}


def test_starting_until_weight_loading_begins():
    r = parse_vllm_log(API + "[api_server.py:1354] vLLM API server version 0.10.2\n")
    assert r.state == "starting" and r.vllm_version == "0.10.2"
    r = parse_vllm_log(
        API
        + "[api_server.py:1354] vLLM API server version 0.10.2\n"
        + EC
        + "[gpu_model_runner.py:1] Starting to load model Qwen/Qwen3-8B...\n"
    )
    assert r.state == "loading" and r.model == "Qwen/Qwen3-8B"


def test_v033_merged_kv_line_and_server_on():
    text = (
        "(APIServer pid=1) INFO 05-01 10:00:00 [startup.py:50] vLLM server version 0.33.0, "
        "serving model Qwen/Qwen3.5-122B-A10B-FP8\n"
        "(EngineCore pid=230) INFO [interface.py:773] Model loading took 55.19 GiB memory and 301.250000 seconds\n"
        "(EngineCore pid=230) INFO 05-01 10:05:00 [gpu_worker.py:300] Available KV cache memory: 31.42 GiB\n"
        "(EngineCore pid=230) INFO 05-01 10:05:00 [kv_cache_utils.py:1300] GPU KV cache size: 1,234,560 tokens, "
        "Maximum concurrency for 262,144 tokens per request: 4.71x\n"
        "(APIServer pid=1) INFO 05-01 10:06:00 [entry.py:40] Starting vLLM server on http://0.0.0.0:8355\n"
        "(APIServer pid=1) INFO:     Application startup complete.\n"
    )
    r = parse_vllm_log(text)
    assert r.contract_dict() == {
        "state": "ready",
        "failure_kind": None,
        "shards_done": None,
        "shards_total": None,
        "model_load_gib": 55.19,
        "kv_cache_gib": 31.42,
        "kv_cache_tokens": 1234560,
        "max_concurrency": 4.71,
        "port": 8355,
        "vllm_version": "0.33.0",
    }
    assert r.model == "Qwen/Qwen3.5-122B-A10B-FP8"
    assert r.load_seconds == 301.25


def test_port_only_from_vllm_listen_line():
    text = (
        "$ vllm serve Qwen/Qwen3-8B --port 9000\n"
        "echo Starting on http://0.0.0.0:9001\n"
        + API
        + "[utils.py:253] non-default args: {'model_tag': 'Qwen/Qwen3-8B', 'port': 9000}\n"
        + "INFO:     Uvicorn running on http://0.0.0.0:9002 (Press CTRL+C to quit)\n"
    )
    assert parse_vllm_log(text).port is None
    for line, port in [
        ("INFO 04-20 17:00:47 [api_server.py:1] Starting vLLM API server on http://0.0.0.0:8000", 8000),
        (API + "[api_server.py:1428] Starting vLLM API server 0 on http://0.0.0.0:8001", 8001),
        (API + "[api_server.py:602] Starting vLLM server on https://[::]:8443", 8443),
    ]:
        assert parse_vllm_log(line).port == port


def test_version_sources_and_precedence():
    assert (
        parse_vllm_log(
            EC + "[core.py:93] Initializing a V1 LLM engine (v0.8.5) with config: "
            "model='m/x', speculative_config=None\n"
        ).vllm_version
        == "0.8.5"
    )
    r = parse_vllm_log(
        API
        + "[api_server.py:1] vLLM API server version 0.9.1\n"
        + EC
        + "[core.py:93] Initializing a V1 LLM engine (v0.9.1.dev0) with config: model='m/x'\n"
    )
    assert r.vllm_version == "0.9.1" and r.model == "m/x"
    r = parse_vllm_log(
        "INFO 08-26 14:33:37 llm_engine.py:237] Initializing an LLM engine (v0.6.3.post1) with config\n"
    )
    assert r.vllm_version == "0.6.3.post1"


def test_ansi_escapes_and_residue_keep_ray_ip():
    text = (
        "[36m(RayWorkerWrapper pid=383, ip=192.168.200.12)[0m INFO 03-06 08:41:00 [default_loader.py:1] "
        "Loading weights took 10.50 seconds\n"
        "\x1b[1;36m(RayWorkerWrapper pid=384, ip=192.168.200.13)\x1b[0m \x1b[32mINFO\x1b[0m 03-06 08:41:01 "
        "[gpu_model_runner.py:1] Model loading took 59.60 GiB memory and 70.100000 seconds\n"
    )
    r = parse_vllm_log(text)
    assert r.remote_ips == ("192.168.200.12", "192.168.200.13")
    assert r.weights_seconds == 10.5 and r.model_load_gib == 59.6 and r.state == "loading"


def test_docker_timestamps_compose_and_stacked_prefixes():
    text = (
        "2026-08-29T04:20:14.338370303Z (APIServer pid=1) INFO 08-29 04:20:14 [api_server.py:1] "
        "vLLM API server version 0.14.1\n"
        "[2026-02-24T20:21:58Z] " + bar(1, 4) + "\n"
        "vllm_node  | 2026-08-29T04:20:20Z (EngineCore_DP0 pid=5919) (RayWorkerWrapper pid=383, "
        "ip=192.168.200.12) INFO 08-29 04:20:20 [gpu_worker.py:1] Available KV cache memory: 20.25 GiB "
        "[repeated 2x across cluster]\n"
        "qwen3-1  | (APIServer pid=1) INFO:     Application startup complete.\n"
    )
    r = parse_vllm_log(text)
    assert r.vllm_version == "0.14.1"
    assert (r.shards_done, r.shards_total) == (1, 4)
    assert r.kv_cache_gib == 20.25
    assert r.remote_ips == ("192.168.200.12",)
    assert r.state == "ready"


def test_progress_bar_and_log_line_on_one_physical_line():
    text = (
        "Loading safetensors checkpoint shards: 100% Completed | 4/4 [00:00<00:00, 42.01it/s]"
        "(Worker_TP1 pid=114767) INFO 05-01 10:00:00 [default_loader.py:1] Loading weights took 0.11 seconds\n"
        "Loading pt checkpoint shards: 100% Completed | 2/2 [00:01<00:00,  1.50it/s]"
        "INFO 04-20 17:00:47 [loader.py:447] Loading weights took 79.31 seconds\n"
    )
    r = parse_vllm_log(text)
    assert (r.shards_done, r.shards_total) == (2, 2)
    assert r.weights_seconds == 79.31
    assert parse_vllm_log(text.split("\n")[0]).weights_seconds == 0.11


def test_carriage_return_tqdm_updates():
    line = "\r".join(bar(n, 4) for n in range(4)) + "\r" + bar(3, 4)
    t = VllmLogTracker()
    t.feed(line + "\n")
    r = t.report
    assert (r.shards_done, r.shards_total) == (3, 4)
    assert r.shard_eta_s == 3 and r.shard_seconds_per_it == 3.05
    assert r.lines == 1 and r.phase_events == ((PHASE_LOADING, 1),)


def test_cuda_graph_capture_progress():
    blocks = "█" * 10
    graph = "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): {p:3d}%|{b}| {n}/51 [00:01<00:02, 10.66it/s]"
    line = "\r".join(graph.format(p=round(100 * n / 51), b=blocks[: n // 6], n=n) for n in (0, 10, 30))
    r = parse_vllm_log(EC + "[kv_cache_utils.py:1] GPU KV cache size: 89,760 tokens\n" + line + "\n")
    assert (r.cuda_graph_done, r.cuda_graph_total) == (30, 51)
    assert r.cuda_graph_mode == "mixed prefill-decode, PIECEWISE"
    assert r.phase == PHASE_CUDA_GRAPHS and r.state == "loading"
    r = parse_vllm_log("Capturing CUDA graph shapes: 100%|██████████| 35/35 [00:18<00:00,  1.90it/s]\n")
    assert (r.cuda_graph_done, r.cuda_graph_total) == (35, 35)


def test_hard_wrapped_lines():
    text = "".join(
        [
            API + "[utils.py:292]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.16.1rc1.dev296+ga73af5\n",
            "84f.d20260305\n",
            API + "[utils.py:292]   █▄█▀ █     █     █     █  model   QuantTrio/MiniMax-\n",
            "M2-AWQ\n",
            EC + "[gpu_model_runner.py:1] Starting to load model QuantTrio/MiniMax-M2-AWQ...\n",
            EC + "[gpu_model_runner.py:3659] Model loading took 4.9054 GiB memory and 44.98\n",
            "6674 seconds\n",
            API + "[api_server.py:1428] Starting vLLM API server 0 on http://0.0.0.0:80\n",
            "00\n",
        ]
    )
    r = parse_vllm_log(text)
    assert r.vllm_version == "0.16.1rc1.dev296+ga73af584f.d20260305"
    assert r.model == "QuantTrio/MiniMax-M2-AWQ"
    assert r.load_seconds == 44.986674
    assert r.port == 8000
    assert r.restarts == 0
    assert _feed_lines(text).report == r


def test_prefix_only_line_then_unprefixed_bar():
    text = (
        "(RayWorkerWrapper pid=5, ip=10.0.0.2) INFO 05-01 10:00:00 [gpu_model_runner.py:1] "
        "Starting to load model m/x...\n"
        "(Worker_TP0 pid=1700) \n" + bar(1, 2) + "\n" + "(Worker_TP0 pid=1700) \n" + bar(2, 2) + "\n"
    )
    r = parse_vllm_log(text)
    assert (r.shards_done, r.shards_total) == (2, 2)
    assert r.state == "loading" and r.remote_ips == ("10.0.0.2",)


def test_ray_placement_group_wait_stays_loading():
    wait = (
        "(APIServer pid=1) INFO 03-06 08:40:40 [ray_utils.py:300] Waiting for creating a placement group of "
        "specs for {s} seconds. specs=[{{'GPU': 1.0, 'node:169.254.252.227': 0.001}}, {{'GPU': 1.0}}]. "
        "Check `ray status` and `ray list nodes` to see if you have enough resources, and make sure the IP "
        "addresses used by ray cluster are the same as VLLM_HOST_IP environment variable specified in "
        "each node if you are running on a multi-node.\n"
    )
    text = (
        API + "[api_server.py:1] vLLM API server version 0.14.1\n"
        "(APIServer pid=1) WARNING 03-06 08:40:35 [ray_utils.py:1] tensor_parallel_size=2 is bigger than a "
        "reserved number of GPUs (1 GPUs) in a node 1a2b. Tensor parallel workers can be spread out to 2+ "
        "nodes which can degrade the performance unless you have fast interconnect across nodes.\n"
        + wait.format(s=10)
        + wait.format(s=20)
        + wait.format(s=30)
    )
    r = parse_vllm_log(text)
    assert r.state == "loading" and r.failure_kind is None
    assert r.phase == PHASE_RAY_WAIT
    r = parse_vllm_log(
        text + "ValueError: Cannot provide a placement group requiring 2 GPUs "
        "(placement_group_specs=[{'GPU': 1.0}, {'GPU': 1.0}]) within 1800 seconds.\n"
    )
    assert (r.state, r.failure_kind) == ("failed", "ray")


KV_TOO_SMALL = (
    "To serve at least one request with the {who} max seq len (262144), (46.00 GiB KV cache is needed, "
    "which is larger than the available KV cache memory (22.50 GiB). Based on the available memory, the "
    "estimated maximum model length is 128000. Try increasing `gpu_memory_utilization` or decreasing "
    "`max_model_len` when initializing the engine."
)


@pytest.mark.parametrize("who", ["models's", "model's"])
def test_kv_cache_too_small_value_error_frame_by_frame(who):
    err = "(EngineCore_DP0 pid=12473) ERROR 11-05 12:19:32 [core.py:708] "
    text = (
        EC
        + "[gpu_worker.py:375] Available KV cache memory: 22.50 GiB\n"
        + err
        + "EngineCore failed to start.\n"
        + err
        + "Traceback (most recent call last):\n"
        + err
        + '  File "/usr/lib/python3/vllm/v1/core/kv_cache_utils.py", line 700, in check_enough_kv_cache_memory\n'
        + err
        + "    raise ValueError(\n"
        + err
        + "ValueError: "
        + KV_TOO_SMALL.format(who=who)
        + "\n"
        "(APIServer pid=1) Traceback (most recent call last):\n"
        "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {}\n"
    )
    r = parse_vllm_log(text)
    assert (r.state, r.failure_kind) == ("failed", "oom")
    assert r.failure_line.startswith("ValueError: To serve at least one request")
    assert r.estimated_max_model_len == 128000 and r.kv_cache_needed_gib == 46.0
    assert r.max_model_len == 262144
    assert "--max-model-len 128000" in r.advice
    # while only the generic part has arrived, it is already failed ("other" for now)
    head = "\n".join(text.split("\n")[:3])
    assert (parse_vllm_log(head).state, parse_vllm_log(head).failure_kind) == ("failed", "other")


def test_first_root_cause_wins():
    text = (
        EC + "[gpu_model_runner.py:1] Starting to load model m/x...\n"
        "(Worker_TP1 pid=7) ERROR 05-01 10:00:00 [worker.py:1] torch.OutOfMemoryError: CUDA out of memory. "
        "Tried to allocate 2.00 GiB\n"
        "(Worker_TP0 pid=6) [rank0]:[E501 10:00:05.1 ProcessGroupNCCL.cpp:1] NCCL error in: x, unhandled "
        "system error, ncclSystemError\n"
        "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above.\n"
    )
    r = parse_vllm_log(text)
    assert r.failure_kind == "oom"
    assert r.failure_line.startswith("torch.OutOfMemoryError")
    assert r.failure_line_no == 2
    # progress printed by other ranks after the failure does not move the timeline
    r = parse_vllm_log(text + bar(2, 2) + "\n")
    assert (r.state, r.phase, r.phase_events[-1][0]) == ("failed", "failed", "failed")


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("RuntimeError: CUDA driver error: out of memory", "oom"),
        ("NVRM: nvCheckOkFailedNoLog: Check failed: Out of memory [NV_ERR_NO_MEMORY]", "oom"),
        (
            "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`",
            "oom",
        ),
        (
            "ValueError: Free memory on device cuda:0 (60.1/121.69 GiB) on startup is less than desired GPU "
            "memory utilization (0.85, 103.44 GiB). Decrease GPU memory utilization or reduce GPU memory used "
            "by other processes.",
            "oom",
        ),
        (
            "ValueError: Model architectures ['Qwen3_5MoeForConditionalGeneration'] failed to be inspected. "
            "Please check the logs for more details.",
            "unsupported_architecture",
        ),
        (
            "ValueError: The checkpoint you are trying to load has model type `qwen3_next` but Transformers "
            "does not recognize this architecture.",
            "unsupported_architecture",
        ),
        (
            "torch.distributed.DistStoreError: Timed out after 601 seconds waiting for clients. 1/2 clients "
            "joined.",
            "nccl",
        ),
        ("ray.exceptions.RayActorError: The actor died unexpectedly before finishing this task.", "ray"),
        (
            "safetensors_rust.SafetensorError: Error while deserializing header: MetadataIncompleteBuffer",
            "other",
        ),
        (
            "(EngineCore_DP0 pid=5) ERROR 05-01 10:00:00 [core.py:1] EngineCore encountered a fatal error.",
            "other",
        ),
    ],
)
def test_failure_signatures(line, kind):
    r = parse_vllm_log(line + "\n")
    assert (r.state, r.failure_kind) == ("failed", kind)
    assert r.advice


def test_qwen35_unsupported_advice():
    r = parse_vllm_log(
        "ValueError: Model architectures ['Qwen3_5MoeForConditionalGeneration'] are not supported for now. "
        "Supported architectures: dict_keys(['LlamaForCausalLM'])\n"
    )
    assert r.unsupported_architectures == ("Qwen3_5MoeForConditionalGeneration",)
    assert "0.17" in r.advice and "Qwen3_5MoeForConditionalGeneration" in r.advice


def test_warnings_are_not_failures():
    text = (
        EC + "[gpu_model_runner.py:1] Starting to load model m/x...\n"
        "(EngineCore pid=194) /usr/local/lib/python3.12/dist-packages/fastsafetensors/copier/gds.py:201: "
        "UserWarning: GDS is not supported in this platform but nogds is False. use nogds=True\n"
        "(EngineCore pid=194)   warnings.warn(\n"
        "/usr/lib/python3/torchvision/io/image.py:14: UserWarning: Failed to load image Python extension\n"
        "  warn(\n"
        "(EngineCore_DP0 pid=165) WARNING 03-18 06:57:25 [kv_cache_utils.py:1033] Add 3 padding layers, may "
        "waste at most 14.29% KV cache memory\n"
        "(APIServer pid=1) WARNING 03-06 08:40:35 [ray_utils.py:1] tensor_parallel_size=2 is bigger than a "
        "reserved number of GPUs (1 GPUs) in a node x.\n"
        "(EngineCore_DP0 pid=165) WARNING 03-18 06:57:25 [x.py:1] To avoid CUDA out of memory errors, "
        "lower max_num_seqs\n"
        "(EngineCore_DP0 pid=165) INFO 03-18 06:57:25 [gpu_worker.py:1] Free memory on device (119.2/121.69 "
        "GiB) on startup. Desired GPU memory utilization is (0.85, 103.44 GiB).\n"
    )
    r = parse_vllm_log(text)
    assert (r.state, r.failure_kind) == ("loading", None)


def test_ready_only_on_application_startup_complete():
    text = (
        EC
        + "[core.py:259] init engine (profile, create kv cache, warmup model) took 127.33 seconds\n"
        + API
        + "[api_server.py:1428] Starting vLLM API server 0 on http://0.0.0.0:8000\n"
        "INFO:     Uvicorn running on http://0.0.0.0:8000 (Press CTRL+C to quit)\n"
        "INFO:     Started server process [5969]\nINFO:     Waiting for application startup.\n"
    )
    assert parse_vllm_log(text).state == "loading"
    assert parse_vllm_log(text + "INFO:     Application startup complete.\n").state == "ready"


def test_after_ready_request_traceback_is_not_fatal_but_engine_death_is():
    ready = (
        API
        + "[api_server.py:1] vLLM API server version 0.14.1\n"
        + bar(2, 2)
        + "\n"
        + ("(APIServer pid=1) INFO:     Application startup complete.\n")
    )
    request_error = (
        "(APIServer pid=1) ERROR 05-01 10:00:00 [serving_chat.py:1] Error in preprocessing prompt inputs\n"
        "(APIServer pid=1) ERROR 05-01 10:00:00 [serving_chat.py:1] Traceback (most recent call last):\n"
        "(APIServer pid=1) ERROR 05-01 10:00:00 [serving_chat.py:1] ValueError: This model's maximum context "
        "length is 8192 tokens.\n"
        '(APIServer pid=1) INFO:     127.0.0.1:36506 - "POST /v1/chat/completions HTTP/1.1" 400 Bad Request\n'
    )
    assert parse_vllm_log(ready + request_error).state == "ready"
    dead = (
        "(EngineCore_DP0 pid=5) ERROR 05-01 10:01:00 [core.py:1] EngineCore encountered a fatal error.\n"
        "(APIServer pid=1) ERROR 05-01 10:01:00 [async_llm.py:1] vllm.v1.engine.exceptions.EngineDeadError: "
        "EngineCore encountered an issue.\n"
    )
    r = parse_vllm_log(ready + request_error + dead)
    assert (r.state, r.failure_kind) == ("failed", "other")


def test_restart_after_failure_starts_a_fresh_run():
    first = (
        API + "[api_server.py:1] vLLM API server version 0.14.1\n" + bar(1, 4) + "\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB\n"
    )
    second = API + "[api_server.py:1] vLLM API server version 0.14.1\n" + bar(2, 4) + "\n"
    r = parse_vllm_log(first + second)
    assert (r.state, r.failure_kind, r.restarts) == ("loading", None, 1)
    assert r.shards_done == 2 and r.failure_line is None


def test_v06_envelope_and_gb_wording():
    text = (
        "INFO 08-26 14:33:37 api_server.py:528] vLLM API server version 0.6.3.post1\n"
        "INFO 08-26 14:33:37 model_runner.py:890] Loading model weights took 1.9634 GB\n"
        "INFO 08-26 14:33:40 distributed_gpu_executor.py:57] # GPU blocks: 8025, # CPU blocks: 2048\n"
        "INFO 08-26 14:33:40 distributed_gpu_executor.py:61] Maximum concurrency for 8192 tokens per "
        "request: 15.67x\n"
        "INFO 08-26 14:33:50 model_runner.py:1] Graph capturing finished in 10 secs.\n"
        "INFO:     Application startup complete.\n"
        "INFO:     Uvicorn running on http://0.0.0.0:8000 (Press CTRL+C to quit)\n"
    )
    r = parse_vllm_log(text)
    assert r.contract_dict() == {
        "state": "ready",
        "failure_kind": None,
        "shards_done": None,
        "shards_total": None,
        "model_load_gib": 1.9634,
        "kv_cache_gib": None,
        "kv_cache_tokens": None,
        "max_concurrency": 15.67,
        "port": None,
        "vllm_version": "0.6.3.post1",
    }
    assert r.gpu_blocks == 8025


def test_compiling_flag():
    r = parse_vllm_log(
        EC
        + "[gpu_model_runner.py:1] Model loading took 4.9054 GiB memory and 44.986674 seconds\n"
        + EC
        + "[backends.py:643] Using cache directory: /root/.cache/vllm/torch_compile_cache/x for "
        "vLLM's torch.compile\n" + EC + "[backends.py:703] Dynamo bytecode transform time: 1.81 s\n"
    )
    assert r.compiling and r.phase == PHASE_COMPILING and r.state == "loading"
    r = parse_vllm_log(
        EC
        + "[backends.py:703] Dynamo bytecode transform time: 1.81 s\n"
        + EC
        + "[monitor.py:34] torch.compile takes 92.20 s in total\n"
    )
    assert not r.compiling and r.compile_seconds == 92.2


def test_contract_and_full_dicts_are_json():
    r = parse_vllm_log(_log("18-ray-multinode-nccl-watchdog-timeout.log"))
    c = r.contract_dict()
    assert tuple(c) == CONTRACT_KEYS
    assert set(c) == {
        "state",
        "failure_kind",
        "shards_done",
        "shards_total",
        "model_load_gib",
        "kv_cache_gib",
        "kv_cache_tokens",
        "max_concurrency",
        "port",
        "vllm_version",
    }
    full = json.loads(json.dumps(r.to_dict()))
    assert set(c) <= set(full)
    assert full["remote_ips"] == ["10.175.94.190"] and full["failure_node_ip"] == "10.175.94.190"
    assert all(isinstance(ev, list) and len(ev) == 2 for ev in full["phase_events"])


def test_report_is_frozen_and_cached():
    t = VllmLogTracker()
    t.feed(bar(1, 2))
    r1 = t.report
    assert t.report is r1
    with pytest.raises(AttributeError):
        r1.state = "ready"  # type: ignore[misc]
    t.feed(bar(2, 2))
    assert t.report.shards_done == 2 and r1.shards_done == 1


def test_crlf_line_endings():
    text = _log("02-dgx-spark-nemotron-hybrid-nv2601-ready.log")
    assert parse_vllm_log(text.replace("\n", "\r\n")) == parse_vllm_log(text)


@pytest.mark.parametrize(
    "junk",
    [
        "(x pid=1) " * 6000,
        "a(x pid=1) " + "(x pid=1) " * 6000,
        "a(Worker_TP0 pid=1) b" * 5000,
        "[1;36m" * 10000,
        "Loading " * 8000,
        "Model architectures " + "[" * 60000,
        "non-default args: {" + "'" * 60000,
        "\r" * 60000,
        "x" * 200000,
    ],
    ids=range(9),
)
def test_pathological_lines_stay_fast(junk):
    start = time.perf_counter()
    r = parse_vllm_log(junk)
    assert r.state in STATES
    assert time.perf_counter() - start < 2.0


# --------------------------------------------------------------------------------------------
# property: never raises, always a valid state

_REAL_LINES = [
    ln
    for p in sorted(LOGS.glob("*.log"))
    for ln in real_fixture(f"vllm-logs/{p.name}").splitlines()
    if ln.strip()
][:400]
_line = st.one_of(
    st.text(max_size=200),
    st.sampled_from(_REAL_LINES),
    st.builds(lambda a, b: a + b, st.sampled_from(_REAL_LINES), st.text(max_size=40)),
    st.builds(lambda a, b: a[: len(a) // 2] + b, st.sampled_from(_REAL_LINES), st.sampled_from(_REAL_LINES)),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_line, max_size=30))
def test_never_raises_and_state_is_valid(lines):
    text = "\n".join(lines)
    r = parse_vllm_log(text)
    assert r.state in STATES
    assert r.failure_kind is None or r.failure_kind in FAILURE_KINDS
    assert (r.state == "failed") == (r.failure_kind is not None)
    json.dumps(r.to_dict())
    assert _feed_lines(text).report == r


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=400))
def test_never_raises_on_binary_garbage(data):
    r = parse_vllm_log(data.decode("utf-8", errors="replace"))
    assert r.state in STATES


# --------------------------------------------------------------------------------------------
# a merged log of several nodes (one container on each): one tracker per node


def _interleave(*texts: str) -> list[tuple[int, str]]:
    """Round-robin the logs' physical lines: (which log, line), as a merged view shows them."""
    per = [_physical_lines(t) for t in texts]
    out: list[tuple[int, str]] = []
    for i in range(max(len(p) for p in per)):
        out.extend((k, p[i]) for k, p in enumerate(per) if i < len(p))
    return out


def test_merged_log_keeps_each_nodes_run_and_reports_the_failed_one():
    ready = _log("02-dgx-spark-nemotron-hybrid-nv2601-ready.log")
    oom = _log("13-v1-cuda-oom-creating-weights.log")
    assert parse_vllm_log(ready).state == "ready" and parse_vllm_log(oom).failure_kind == "oom"
    tracker = VllmLogTracker()
    nodes = ("spark-1", "spark-2")
    for k, line in _interleave(ready, oom):
        tracker.feed(line + "\n", source=nodes[k])
    reports = tracker.node_reports
    assert list(reports) == ["spark-1", "spark-2"]
    # each node reads exactly as its own log alone
    assert reports["spark-1"].contract_dict() == parse_vllm_log(ready).contract_dict()
    assert reports["spark-2"].contract_dict() == parse_vllm_log(oom).contract_dict()
    merged = tracker.report
    assert (merged.state, merged.failure_kind, merged.node) == ("failed", "oom", "spark-2")
    assert merged.node_states == (("spark-1", "ready"), ("spark-2", "failed"))
    assert merged.advice and "memory" in merged.advice.lower()


def test_worst_report_rules():
    def rep(state):
        return VllmLogReport(state=state)

    # a failed rank wins, the first to fail when several did
    assert worst_report({"a": rep("ready"), "b": rep("failed"), "c": rep("failed")}, ["c", "b"]).node == "c"
    # the least advanced rank otherwise; a node with no vLLM line does not count
    w = worst_report({"a": rep("loading"), "b": rep("starting"), "c": rep("unknown")})
    assert (w.state, w.node) == ("starting", "b")
    # the head is ready: a headless worker rank, which never logs "Application startup complete", does
    # not hold the deployment at loading
    w = worst_report({"head": rep("ready"), "worker": rep("loading")})
    assert (w.state, w.node) == ("ready", "head")
    assert worst_report({"a": rep("unknown")}).state == "unknown"
    assert worst_report({}).state == "unknown"


def test_one_node_log_has_no_node_reports():
    t = _feed_lines(_log("02-dgx-spark-nemotron-hybrid-nv2601-ready.log"))
    assert t.node_reports == {}
    assert t.report.node is None and t.report.node_states == ()


# --------------------------------------------------------------------------------------------
# an engine-core traceback with no recognised cause


_EC = "(EngineCore_DP0 pid=274) ERROR 01-15 10:00:09 [core.py:708] "
_EC_TRACEBACK = [
    "(APIServer pid=1) INFO 01-15 10:00:00 [api_server.py:1000] vLLM API server version 0.11.0",
    "(APIServer pid=1) INFO 01-15 10:00:01 [utils.py:233] non-default args: {'model': 'Qwen/Qwen3-8B'}",
    "(EngineCore_DP0 pid=274) INFO 01-15 10:00:05 [core.py:77] Initializing a V1 LLM engine (v0.11.0) with "
    "config: model='Qwen/Qwen3-8B'",
    _EC + "Traceback (most recent call last):",
    _EC + '  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 699, in run_engine_core',
    _EC + "    engine_core = EngineCoreProc(*args, **kwargs)",
    _EC + "                  ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    _EC + '  File "/usr/local/lib/python3.12/dist-packages/vllm/model_executor/models/qwen3.py", line 12, in init',
    _EC + "    raise Unsupported('rope_scaling')",
    _EC + "torch._dynamo.exc.Unsupported: rope_scaling",
]


@pytest.mark.parametrize(
    "variant",
    ["as logged", "header cut off", "year in the date", "KeyError"],
)
def test_engine_core_traceback_without_known_cause_is_failed_other(variant):
    lines = list(_EC_TRACEBACK)
    last = "torch._dynamo.exc.Unsupported: rope_scaling"
    first = "Traceback (most recent call last):"
    if variant == "header cut off":
        del lines[3]
        first = 'File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 699, in run_engine_core'
    elif variant == "year in the date":
        lines = [ln.replace(" 01-15 ", " 2026-01-15 ") for ln in lines]
    elif variant == "KeyError":
        lines[-1] = _EC + "KeyError: 'rope_scaling'"
        last = "KeyError: 'rope_scaling'"
    r = parse_vllm_log("\n".join(lines) + "\n")
    assert (r.state, r.failure_kind) == ("failed", "other")
    assert r.failure_proof == (first, last)
    assert r.failure_line == f"{first} … {last}"
    assert r.advice and "full traceback" in r.advice
    # line by line, as the console reads it, the same
    assert _feed_lines("\n".join(lines) + "\n").report == r


def test_recognised_cause_keeps_its_own_line_not_the_traceback():
    # an OOM inside the same traceback: the cause is named, the proof is its line
    lines = [*_EC_TRACEBACK[:-1], _EC + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."]
    r = parse_vllm_log("\n".join(lines) + "\n")
    assert (r.state, r.failure_kind, r.failure_proof) == ("failed", "oom", ())
    assert r.failure_line.startswith("torch.OutOfMemoryError")
