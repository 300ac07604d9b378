"""Each engine reads its own log: the tracker, the failure classes and the advice are the engine's.

The SGLang lines below are SGLang's own format strings (file@commit in sgl-project/sglang, cited at
each), filled with values; the record around them is SGLang's ``configure_logger`` format. The
llama.cpp lines are llama-server's (ggml-org/llama.cpp). The vLLM logs are the real ones in
``tests/fixtures/real/vllm-logs``.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from sparkconsole.logs.report import FailureKind, LogReport
from sparkconsole.serving import engines
from sparkconsole.serving.engines import LLAMA_CPP, SGLANG, VLLM
from sparkconsole.ui.screens.logs import report_lines

ROOT = Path(__file__).resolve().parents[1]
VLLM_LOGS = ROOT / "tests" / "fixtures" / "real" / "vllm-logs"

# ---- SGLang's lines, from its source ----------------------------------------------------------------

# python/sglang/srt/utils/common.py@004f0c7a8d398a9c4b6844c1d8071502fa88e78c, configure_logger:
#   format = f"[%(asctime)s{maybe_ms}{prefix}] %(message)s", datefmt="%Y-%m-%d %H:%M:%S"
# python/sglang/srt/managers/scheduler.py@0003215cf1464f44b389cd0b18d0b4c56f2a3da6: prefix += f" TP{shown_tp}"
RECORD = "[{asctime}{prefix}] {message}"
# python/sglang/srt/model_executor/model_runner.py@0005834cdb2a5b7472789ccbf0d3361b5cf853b8, load_model:
#   f"Load weight begin. avail mem={get_available_gpu_memory(self.device, self.gpu_id):.2f} GB"
LOAD_BEGIN = "Load weight begin. avail mem={avail:.2f} GB"
#   f"Load weight end. " f"elapsed={time.perf_counter() - tic_total:.2f} s, " f"type={type(self.model).__name__}, "
#   f"{quant_str + ', ' if quant_str else ''}" f"avail mem={after_avail_memory:.2f} GB, "
#   f"mem usage={self.weight_load_mem_usage:.2f} GB."
LOAD_END = "Load weight end. elapsed={elapsed:.2f} s, type={type}, {quant}avail mem={avail:.2f} GB, mem usage={usage:.2f} GB."
# model_runner.py@01cc04e2b5b01ce379698a3fee1bd17706e1d0ec (the 0.2 era), load_model:
#   f"Load weight end. " f"type={type(self.model).__name__}, " f"dtype={self.dtype}, " f"avail mem=…:.2f} GB"
LOAD_END_OLD = "Load weight end. type={type}, dtype={dtype}, avail mem={avail:.2f} GB"
# model_runner.py@01cc04e2b5b01ce379698a3fee1bd17706e1d0ec, init_cuda_graphs:
GRAPHS_BEGIN = "Capture cuda graph begin. This can take up to several minutes."
# python/sglang/srt/mem_cache/memory_pool.py@000ccdba94d4ed75d4fab7b1dac5f8ebcaaee7e8, MHATokenToKVPool:
#   f"KV Cache is allocated. #tokens: {size}, K size: {k_size / GB:.2f} GB, V size: {v_size / GB:.2f} GB"
KV_MHA = "KV Cache is allocated. #tokens: {size}, K size: {k:.2f} GB, V size: {v:.2f} GB"
# … MLATokenToKVPool: f"KV Cache is allocated. #tokens: {size}, KV size: {kv_size / GB:.2f} GB"
KV_MLA = "KV Cache is allocated. #tokens: {size}, KV size: {kv:.2f} GB"
# encode/uvicorn uvicorn/server.py@00c1280cf93b1f73da3698b805b4bd08f21cc25f, _log_started_message:
#   f"Uvicorn running on {addr_format} (Press CTRL+C to quit)" with "%s://%s:%d"; SGLang's uvicorn format
#   puts "[%(asctime)s] %(levelprefix)s " before it (levelprefix: "INFO:    " padded)
LISTEN = "INFO:     Uvicorn running on {scheme}://{host}:{port} (Press CTRL+C to quit)"
STARTUP = "INFO:     Application startup complete."
# python/sglang/srt/entrypoints/http_server.py@0025436eab0556737d615b36a4dd3e1e26e82f3d, _wait_and_warmup:
READY = "The server is fired up and ready to roll!"
# scheduler.py@0003215cf1464f44b389cd0b18d0b4c56f2a3da6, run_scheduler_process:
#   logger.error(f"Scheduler hit an exception: {traceback}")  (traceback: Python's, "Traceback (most …")
SCHEDULER_EXC = "Scheduler hit an exception: {traceback}"
# python/sglang/srt/entrypoints/engine.py@001067fffe33427bee0ed2f007fb7551a1d76b44, launch_phase_sigquit_handler:
SIGQUIT = "Received sigquit from a child process. It usually means the child failed."
# engine.py@001067fffe33…, _scheduler_died_error:
DIED = ("Rank {rank} scheduler died during initialization (exit code: {code}). If exit code is -9 (SIGKILL), a "
        "common cause is the OS OOM killer. Run `dmesg -T | grep -i oom` to check.")
# model_runner.py@01cc04e2b5b01ce379698a3fee1bd17706e1d0ec, init_memory_pool:
NOT_ENOUGH = "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
# pytorch/pytorch torch/csrc/distributed/c10d/NCCLUtils.hpp@04dbcd01a205761e6e513047ca5c005e981f6d7a,
# C10D_NCCL_CHECK: "NCCL error in: " + __FILE__ + ":" + __LINE__ + ", " + ncclGetErrorWithVersion(result),
# raised as DistBackendError
NCCL_EXC = ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:{line}, "
            "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.27.7")


def sgl(message: str, prefix: str = " TP0", asctime: str = "2026-05-15 08:39:36") -> str:
    return RECORD.format(asctime=asctime, prefix=prefix, message=message)


def traceback_lines(exception: str) -> list[str]:
    """A scheduler's traceback as it reaches the log: the first line logged, the rest bare."""
    return [sgl(SCHEDULER_EXC.format(traceback="Traceback (most recent call last):")),
            '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 3616, in run_scheduler_process',
            "    scheduler = Scheduler(",
            exception,
            sgl(SIGQUIT, prefix="")]


def sglang_start() -> list[str]:
    return [
        sgl("server_args=ServerArgs(model_path='Qwen/Qwen3-32B', tokenizer_path='Qwen/Qwen3-32B', port=30000)",
            prefix=""),
        sgl("Init torch distributed begin."),
        sgl(LOAD_BEGIN.format(avail=112.31)),
        sgl(LOAD_END.format(elapsed=41.27, type="Qwen3ForCausalLM", quant="", avail=50.87, usage=61.44)),
        sgl(KV_MHA.format(size=463_712, k=14.15, v=14.15)),
        sgl(GRAPHS_BEGIN),
        sgl(LISTEN.format(scheme="http", host="0.0.0.0", port=30000), prefix=""),
        sgl(STARTUP, prefix=""),
        sgl(READY, prefix=""),
    ]


def read(engine: engines.EngineKind, lines: list[str]) -> LogReport:
    tracker = engine.log_tracker()
    assert tracker is not None
    for line in lines:
        tracker.feed(line)
    return tracker.report


def phases(report: LogReport) -> list[str]:
    return [phase for phase, _ in report.phase_events]


# ---- SGLang ------------------------------------------------------------------------------------


def test_sglang_reads_its_start_into_phases_and_figures():
    lines = sglang_start()
    tracker = SGLANG.log_tracker()
    seen = []
    for line in lines:
        tracker.feed(line)
        seen.append(tracker.report.state)
    report = tracker.report
    # starting until the weights load, loading until SGLang says it is ready: uvicorn's "startup
    # complete" comes before the warmup and is not readiness
    assert seen == ["starting", "starting", "loading", "loading", "loading", "loading", "loading", "loading", "ready"]
    assert phases(report) == ["starting", "loading weights", "allocating KV cache", "capturing CUDA graphs",
                              "starting API server", "ready"]
    assert (report.model, report.model_load_gib, report.load_seconds) == ("Qwen/Qwen3-32B", 61.44, 41.27)
    assert (report.kv_cache_tokens, report.kv_cache_gib) == (463_712, 28.3)  # K + V, SGLang's GB are GiB
    assert (report.port, report.listen_url) == (30000, "http://0.0.0.0:30000")
    assert report.failure_kind is None and report.advice is None


def test_sglang_older_and_mla_lines_and_a_millisecond_record_read_the_same_way():
    report = read(SGLANG, [
        sgl(LOAD_BEGIN.format(avail=93.61), asctime="2026-05-15 08:39:36.125", prefix=" DP0 TP1 EP1"),
        sgl(LOAD_END_OLD.format(type="DeepseekV3ForCausalLM", dtype="torch.bfloat16", avail=20.5)),
        sgl(KV_MLA.format(size=120_000, kv=7.5)),
    ])
    assert report.state == "loading" and report.phase == "allocating KV cache"
    assert report.model_load_gib is None  # the 0.2 line says no usage: not read, not guessed
    assert (report.kv_cache_tokens, report.kv_cache_gib) == (120_000, 7.5)


def test_an_sglang_oom_in_a_schedulers_traceback_is_oom_with_sglangs_words():
    lines = [*sglang_start()[:4], *traceback_lines("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                                                    "2.00 GiB. GPU 0 has a total capacity of 119.70 GiB")]
    report = read(SGLANG, lines)
    assert (report.state, report.failure_kind) == ("failed", "oom")
    assert report.failure_line is not None and report.failure_line.startswith("torch.OutOfMemoryError")
    assert report.advice == SGLANG.advise(report) and "--mem-fraction-static" in report.advice
    assert report.advice != VLLM.advise(report)  # SGLang's flags, not vLLM's --gpu-memory-utilization
    assert "--gpu-memory-utilization" not in report.advice


def test_sglangs_not_enough_memory_is_oom_and_says_to_raise_the_fraction():
    report = read(SGLANG, [*sglang_start()[:4], *traceback_lines(NOT_ENOUGH)])
    assert report.failure_kind == "oom" and report.failure_line == NOT_ENOUGH
    assert "raise it" in (report.advice or "")


def test_an_nccl_error_between_sglang_ranks_is_nccl():
    report = read(SGLANG, [sgl("Init torch distributed begin."), *traceback_lines(NCCL_EXC.format(line=268))])
    assert (report.state, report.failure_kind) == ("failed", "nccl")
    assert "NCCL_SOCKET_IFNAME" in (report.advice or "") and report.advice == SGLANG.advise(report)


def test_a_tracebacks_last_line_is_the_root_cause_of_an_other_failure():
    exception = "ValueError: Qwen3NextForCausalLM has no SGlang implementation and the Transformers implementation " \
                "is not compatible with SGLang."
    report = read(SGLANG, [*sglang_start()[:3], *traceback_lines(exception)])
    assert (report.state, report.failure_kind, report.failure_line) == ("failed", "other", exception)
    assert report.advice == SGLANG.advise(report) and "traceback" in report.advice
    # the symptom alone (the log cut before the exception) still fails the start, as "other"
    cut = read(SGLANG, [*sglang_start()[:3], traceback_lines(exception)[0]])
    assert (cut.state, cut.failure_kind) == ("failed", "other")
    # a scheduler killed by the host's OOM killer says so
    died = read(SGLANG, [*sglang_start()[:3], sgl(DIED.format(rank=0, code=-9), prefix="")])
    assert died.failure_kind == "other" and "dmesg" in (died.advice or "")


def test_after_ready_a_requests_traceback_keeps_it_ready_a_dead_scheduler_does_not():
    ready = sglang_start()
    request_error = [sgl("ERROR:    Exception in ASGI application", prefix=""), "Traceback (most recent call last):",
                     '  File "/usr/lib/python3/dist-packages/uvicorn/protocols/http/httptools_impl.py", line 409',
                     "ValueError: bad request"]
    assert read(SGLANG, ready + request_error).state == "ready"
    dead = read(SGLANG, ready + request_error + traceback_lines("RuntimeError: CUDA error: an illegal memory access "
                                                                "was encountered"))
    assert (dead.state, dead.failure_kind) == ("failed", "other")
    assert dead.failure_line == "RuntimeError: CUDA error: an illegal memory access was encountered"


def test_a_restarted_sglang_container_starts_a_fresh_report():
    first = [*sglang_start()[:4], *traceback_lines(NOT_ENOUGH)]
    report = read(SGLANG, first + sglang_start())
    assert (report.state, report.restarts, report.failure_kind) == ("ready", 1, None)


def test_the_merged_log_of_an_sglang_deployment_is_ready_once_its_head_is():
    tracker = SGLANG.log_tracker()
    for line in sglang_start():
        tracker.feed(line, source="spark-1")
    for line in sglang_start()[1:4]:  # the worker rank loads and never serves the API
        tracker.feed(line, source="spark-2")
    report = tracker.report
    assert report.state == "ready" and report.node == "spark-1"
    assert report.node_states == (("spark-1", "ready"), ("spark-2", "loading"))


def test_a_vllm_log_read_by_sglangs_tracker_does_not_claim_ready():
    text = (VLLM_LOGS / "02-dgx-spark-nemotron-hybrid-nv2601-ready.log").read_text(errors="replace")
    vllm = VLLM.log_tracker()
    vllm.feed_text(text)
    assert vllm.report.state == "ready"  # it is a ready log: vLLM's rules say so
    sglang = SGLANG.log_tracker()
    sglang.feed_text(text)
    assert sglang.report.state != "ready"
    assert "Application startup complete" in text  # uvicorn's line, which SGLang's rules do not take for ready


def test_text_from_the_node_is_cut_and_100000_lines_stay_linear():
    """A guard against quadratic code, not a benchmark: a long, mixed log through SGLang's tracker
    takes time in proportion to its lines, and a line that never ends is cut before any rule."""
    kinds = [*sglang_start()[1:6], "x" * 2000, "  File \"/x.py\", line 3, in f", "\x1b[31mnot ours\x1b[0m | a b c",
             sgl('INFO:     127.0.0.1:5050 - "POST /generate HTTP/1.1" 200 OK', prefix=""),
             "Traceback (most recent call last):"]
    lines = [kinds[i % len(kinds)] for i in range(100_000)]
    tracker = SGLANG.log_tracker()
    t0 = time.perf_counter()
    for line in lines:
        tracker.feed(line)
    report = tracker.report
    took = time.perf_counter() - t0
    assert report.lines == 100_000
    assert took < 5.0, f"{took:.2f} s for 100,000 lines"
    # one line of 10 MB costs what its first 64 KiB cost
    huge = SGLANG.log_tracker()
    t0 = time.perf_counter()
    huge.feed(sgl(READY, prefix="") + "!" * 10_000_000)
    assert time.perf_counter() - t0 < 1.0 and huge.report.state == "ready"


# ---- vLLM, through its engine ------------------------------------------------------------------


def test_vllms_engine_reads_its_own_log_into_phases_and_its_failures_with_its_words():
    report = read(VLLM, (VLLM_LOGS / "02-dgx-spark-nemotron-hybrid-nv2601-ready.log").read_text().splitlines())
    order = phases(report)
    assert report.state == "ready"
    assert order.index("loading weights") < order.index("allocating KV cache") < order.index("ready")
    failed = read(VLLM, (VLLM_LOGS / "13-v1-cuda-oom-creating-weights.log").read_text().splitlines())
    assert failed.failure_kind == "oom"
    assert failed.advice == VLLM.advise(failed) and "--gpu-memory-utilization" in failed.advice


# ---- llama.cpp ---------------------------------------------------------------------------------

# ggml-org/llama.cpp tools/server/server-common.h@006639c3ff51a3dbde5f52ebf4c5a55ad5306caf:
#   #define SRV_INF(fmt, ...) LOG_INF("srv  %12.*s: " fmt, 12, __func__, __VA_ARGS__)
# tools/server/server.cpp@00dd0816129a5210351c78bb90e0828f8eb69f99, main():
#   SRV_INF("%s", "loading model\n"); SRV_INF("%s", "model loaded\n");
#   SRV_INF("server is listening on %s\n", ctx_http.listening_address.c_str());
#   SRV_ERR("%s", "exiting due to model loading error\n");
def srv(message: str, func: str = "main") -> str:
    return f"srv  {func[:12]:>12}: {message}"  # C's "%12.*s" with 12: at most 12 characters, right-aligned in 12


def test_llama_servers_engine_reads_loading_then_ready_and_its_failures():
    report = read(LLAMA_CPP, [srv("loading model"), "load_tensors: loading model tensors, this can take a while...",
                              srv("model loaded"), srv("server is listening on http://127.0.0.1:8080")])
    assert report.state == "ready" and phases(report) == ["loading weights", "starting API server", "ready"]
    assert report.port == 8080
    # the older server's line ("main: server is listening on http://%s:%d - starting the main loop")
    older = read(LLAMA_CPP, ["main: loading model", "main: model loaded",
                             "main: server is listening on http://0.0.0.0:8080 - starting the main loop"])
    assert older.state == "ready"
    # ggml/src/ggml-cuda/ggml-cuda.cu: "%s: allocating %.2f MiB on device %d: cudaMalloc failed: %s" (CUDA's own
    # string for cudaErrorMemoryAllocation is "out of memory")
    oom = read(LLAMA_CPP, [srv("loading model"), "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 70000.00 MiB "
                           "on device 0: cudaMalloc failed: out of memory", srv("exiting due to model loading error")])
    assert (oom.state, oom.failure_kind) == ("failed", "oom") and "--ctx-size" in (oom.advice or "")
    other = read(LLAMA_CPP, [srv("loading model"), srv("exiting due to model loading error")])
    assert other.failure_kind == "other" and other.advice == LLAMA_CPP.advise(other)


# ---- the protocol ------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", list(engines.ENGINES.values()), ids=lambda e: e.name)
def test_every_engine_gives_a_fresh_tracker_and_names_its_failure_classes(engine):
    tracker = engine.log_tracker()
    if tracker is None:  # the protocol's "plain text": nothing more to check
        return
    assert tracker is not engine.log_tracker()  # a new one for each log
    assert tracker.label == engine.label and tracker.report.state == "unknown"
    assert engine.failure_kinds[-1] == "other"
    assert set(engine.failure_kinds) <= set(FailureKind.__args__)  # type: ignore[attr-defined]
    assert engine.advise(LogReport()) is None  # no failure, no words
    for kind in engine.failure_kinds:
        words = engine.advise(LogReport(state="failed", failure_kind=kind, failure_line="x"))  # type: ignore[arg-type]
        assert words and words.strip()


def test_the_log_panel_names_the_engine_whose_log_it_reads():
    report = read(SGLANG, sglang_start())
    assert report_lines(report, SGLANG.label)["head"].startswith("SGLang ")
    assert report_lines(report, SGLANG.label)["ready"] == "✓ ready: serving on port 30000"


def test_no_module_outside_the_log_readers_and_the_engines_uses_vllms_tracker():
    """Callers take the tracker from the engine (``engine.log_tracker()``): a module that names
    vLLM's tracker reads every engine's log with vLLM's rules."""
    allowed = (ROOT / "sparkconsole" / "logs", ROOT / "sparkconsole" / "serving" / "engines")
    word = re.compile(r"\bVllmLogTracker\b")
    offenders = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "sparkconsole").rglob("*.py"))
                 if not any(p.is_relative_to(a) for a in allowed) and word.search(p.read_text(errors="replace"))]
    assert offenders == []
    # and the check finds what it looks for
    assert word.search((ROOT / "sparkconsole" / "serving" / "engines" / "vllm.py").read_text())
