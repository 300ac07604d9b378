"""Engines' ``/metrics`` pages -> typed figures, and the window arithmetic (rates, percentiles).

Every figure asserted below was read by eye from the real dumps in ``tests/fixtures/real/metrics/``
(copied from the shared research with their ``# source:`` headers) and agrees with the
``expected.json`` stored beside them; none is taken from the parser's own output. The dumps are
from vLLM 0.7 (V0 names), 0.8 (V1, old names), 0.11 (V1, idle, full page), 0.22.1rc1 (DGX Spark,
grep-filtered) and SGLang 0.3.5 (legacy names) and 0.4.0.
"""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from sparkconsole.cli import main
from sparkconsole.serving.metrics import (
    EngineMetrics,
    Histogram,
    bucket_quantile,
    parse_metrics,
    prefix_hit_rate,
    rate,
    window_buckets,
    window_quantile,
)
from tests.conftest import REAL

METRICS = REAL / "metrics"
ROOT = Path(__file__).resolve().parent.parent
EXPECTED = {e["file"]: e for e in json.loads((METRICS / "expected.json").read_text(encoding="utf-8"))}

V011 = "vllm-0.11-v1-metrics-idle-qwen1.5-0.5b.prom"
V022 = "vllm-0.22.1rc1-v1-metrics-partial-dgxspark-qwen3-1.7b.prom"
V07 = "vllm-0.7-v0-metrics-partial-qwen2.5-coder-1.5b-aibrix-docs.prom"
V08 = "vllm-0.8-v1-metrics-partial-qwen2.5-coder-32b-issue.prom"
SG035 = "sglang-0.3.5-metrics-gemma2-9b-legacy-docs.prom"
SG040 = "sglang-0.4.0-metrics-llama3.1-8b-single-request-docs.prom"
PROM_FILES = [V011, V022, V07, V08, SG035, SG040]


def dump(name: str) -> str:
    return (METRICS / name).read_text(encoding="utf-8")


def only(name: str) -> EngineMetrics:
    engines = parse_metrics(dump(name))
    assert len(engines) == 1, engines
    return engines[0]


# --- each real dump, value by value -------------------------------------------------------------

def test_vllm_0_11_full_idle_page():
    e = only(V011)
    assert (e.kind, e.model, e.engine, e.version) == ("vllm", "Qwen/Qwen1.5-0.5B-Chat", "0", None)
    assert (e.requests_running, e.requests_waiting, e.kv_cache_usage) == (0.0, 0.0, 0.0)
    assert e.sources["kv_cache_usage"] == "vllm:kv_cache_usage_perc"
    assert (e.prompt_tokens, e.generation_tokens, e.preemptions) == (0.0, 0.0, 0.0)
    assert (e.prefix_cache_queries, e.prefix_cache_hits) == (0.0, 0.0)
    assert e.gen_throughput is None  # vLLM V1 has no throughput gauge
    # the page has both ITL and the deprecated time_per_output_token: the new name wins
    assert e.sources["itl"] == "vllm:inter_token_latency_seconds"
    assert e.sources["queue_time"] == "vllm:request_queue_time_seconds"
    for h in (e.ttft, e.itl, e.e2e, e.queue_time):
        assert h is not None and (h.count, h.sum) == (0.0, 0.0)
    # TTFT's buckets as printed: first le="0.001", last le="+Inf", all 0 (idle)
    assert e.ttft.buckets[0] == (0.001, 0.0) and e.ttft.buckets[-1] == (math.inf, 0.0)
    assert window_quantile(None, e.ttft, 0.5) is None  # no observation: no percentile, not 0


def test_vllm_0_22_partial_dgx_spark():
    e = only(V022)
    assert (e.kind, e.model, e.engine) == ("vllm", "qwen3-1.7b", "0")
    assert (e.requests_running, e.requests_waiting, e.kv_cache_usage, e.preemptions) == (0.0, 0.0, 0.0, 0.0)
    # grep-filtered by its author: no token counters, no histograms -> None, never 0
    assert e.prompt_tokens is None and e.generation_tokens is None
    assert e.ttft is None and e.itl is None and e.e2e is None and e.queue_time is None


def test_vllm_0_7_v0_legacy_names_fallback():
    e = only(V07)
    assert (e.kind, e.model, e.engine) == ("vllm", "Qwen/Qwen2.5-Coder-1.5B-Instruct", None)
    assert e.kv_cache_usage == 0.0 and e.sources["kv_cache_usage"] == "vllm:gpu_cache_usage_perc"
    assert (e.requests_running, e.requests_waiting) == (0.0, 0.0)
    assert (e.prompt_tokens, e.generation_tokens, e.preemptions) == (148.0, 955.0, 0.0)
    # the page was cut before any latency histogram; gpu_prefix_cache_hit_rate (-1.0) is a V0 gauge,
    # not the queries/hits counters
    assert e.ttft is None and e.prefix_cache_queries is None and e.prefix_cache_hits is None


def test_vllm_0_8_v1_old_kv_name():
    e = only(V08)
    assert (e.model, e.engine) == ("Qwen/Qwen2.5-Coder-32B-Instruct", None)
    assert (e.requests_running, e.requests_waiting, e.kv_cache_usage) == (0.0, 0.0, 0.0)
    assert e.sources["kv_cache_usage"] == "vllm:gpu_cache_usage_perc"
    # its gpu_prefix_cache_queries_total TYPE line survived, the sample was cut
    assert e.prefix_cache_queries is None and e.prompt_tokens is None and e.preemptions is None


def test_sglang_0_3_5_legacy_names_and_name_label():
    e = only(SG035)
    assert (e.kind, e.model, e.engine) == ("sglang", "google/gemma-2-9b-it", None)
    assert (e.requests_running, e.requests_waiting) == (0.0, 0.0)
    assert e.sources["requests_running"] == "sglang:num_requests_running"
    assert e.kv_cache_usage == 0.01 and e.gen_throughput == 0.0
    assert (e.prompt_tokens, e.generation_tokens) == (506780.0, 424549.0)
    assert e.preemptions is None
    assert (e.ttft.count, e.ttft.sum) == (2124.0, 656.0780844688416)
    assert (e.itl.count, e.itl.sum) == (422425.0, 29846.5393948555)  # time_per_output_token
    assert (e.e2e.count, e.e2e.sum) == (2104.0, 70517.99934530258)
    assert (e.queue_time.count, e.queue_time.sum) == (2104.0, 24885.007263183594)
    assert e.sources["queue_time"] == "sglang:waiting_request_latency_seconds"


def test_sglang_0_4_0_current_names():
    e = only(SG040)  # func_latency_seconds{name="generate_request"} makes no entry of its own
    assert (e.kind, e.model, e.engine) == ("sglang", "meta-llama/Llama-3.1-8B-Instruct", None)
    assert e.sources["requests_running"] == "sglang:num_running_reqs"
    assert e.sources["requests_waiting"] == "sglang:num_queue_reqs"
    assert (e.requests_running, e.requests_waiting, e.kv_cache_usage, e.gen_throughput) == (0.0, 0.0, 0.0, 0.0)
    assert (e.prompt_tokens, e.generation_tokens) == (7.0, 8.0)
    assert (e.ttft.count, e.ttft.sum) == (1.0, 0.30457592010498047)
    assert (e.e2e.count, e.e2e.sum) == (1.0, 0.30521273612976074)
    assert (e.itl.count, e.itl.sum) == (1.0, 0.0381757915019989)
    assert e.queue_time is None


@pytest.mark.parametrize("name", PROM_FILES)
def test_agrees_with_expected_json(name):
    """The shared research's expected figures for every dump, key by key."""
    want = EXPECTED[name]
    assert len(want["entries"]) == 1
    w = want["entries"][0]
    e = only(name)
    assert e.kind == want["engine_type"]
    assert e.model == w["model_name"]
    assert e.engine == w.get("engine_label")
    assert e.requests_running == w["num_requests_running"]
    assert e.requests_waiting == w["num_requests_waiting"]
    assert e.kv_cache_usage == w["kv_cache_usage"]
    assert e.prompt_tokens == w["prompt_tokens_total"]
    assert e.generation_tokens == w["generation_tokens_total"]
    assert e.preemptions == w["num_preemptions_total"]
    assert (e.ttft.count if e.ttft else None) == w["ttft_count"]
    assert (e.ttft.sum if e.ttft else None) == w["ttft_sum"]
    if "gen_throughput" in w:
        assert e.gen_throughput == w["gen_throughput"]


def test_two_engines_data_parallel():
    """No real dump has two DP ranks, so this one is built from the real 0.22 dump: its sample lines
    copied with ``engine="1"`` and other values (running 3, waiting 2, KV 0.42, preemptions 5)."""
    text = dump(V022)
    rank1 = [ln.replace('engine="0"', 'engine="1"') for ln in text.splitlines() if ln.startswith("vllm:")]
    rank1 = [ln.replace("} 0.0", "} 3.0") if "num_requests_running" in ln else ln for ln in rank1]
    rank1 = [ln.replace("} 0.0", "} 2.0") if ln.startswith("vllm:num_requests_waiting{") else ln for ln in rank1]
    rank1 = [ln.replace("} 0.0", "} 0.42") if "kv_cache_usage_perc" in ln else ln for ln in rank1]
    rank1 = [ln.replace("} 0.0", "} 5.0") if "num_preemptions_total" in ln else ln for ln in rank1]
    engines = parse_metrics(text + "\n".join(rank1) + "\n")
    assert [(e.model, e.engine) for e in engines] == [("qwen3-1.7b", "0"), ("qwen3-1.7b", "1")]
    e0, e1 = engines
    assert (e0.requests_running, e0.requests_waiting, e0.kv_cache_usage, e0.preemptions) == (0.0, 0.0, 0.0, 0.0)
    assert (e1.requests_running, e1.requests_waiting, e1.kv_cache_usage, e1.preemptions) == (3.0, 2.0, 0.42, 5.0)


# --- odd input ----------------------------------------------------------------------------------

def test_junk_truncated_and_hostile_lines_skipped_not_raised():
    """The reference parser raises on the first bad line; the lines around it must still count."""
    lines = dump(SG040).splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("sglang:num_running_reqs"))
    bad = [
        "garbage that is not a sample",
        'sglang:num_queue_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"',  # truncated mid-line
        'sglang:token_usage{model_name="x"} not-a-number',
        "# TYPE sglang:broken",  # TYPE without a type
        '\x1b[31mvllm:num_requests_running{engine="0"} 1\x1b[0m',  # ANSI around a sample
        'x{a="1",a="2"} 1',  # duplicate label
        "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 1e999",  # inf: not a figure
        "\x00\x00",
    ]
    text = "\n".join(lines[:at] + bad + lines[at:])
    e = only_text(text)
    assert e.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert (e.prompt_tokens, e.generation_tokens, e.requests_running, e.kv_cache_usage) == (7.0, 8.0, 0.0, 0.0)
    # the inf sample makes a vllm entry of model "m" whose running count is None, not inf
    vllm = [x for x in parse_metrics(text) if x.kind == "vllm"]
    assert [(x.model, x.requests_running) for x in vllm] == [("m", None)]
    # a page cut in the middle of its last line: everything before the cut still read
    full = dump(SG035)
    cut = full[: full.index("sglang:token_usage{") + 30]
    e = only_text(cut)
    assert (e.prompt_tokens, e.gen_throughput, e.kv_cache_usage) == (506780.0, 0.0, None)


def only_text(text: str) -> EngineMetrics:
    engines = [e for e in parse_metrics(text) if e.kind == "sglang"]
    assert len(engines) == 1, engines
    return engines[0]


@pytest.mark.parametrize("text", ["", "hello\n", "{}", "<html><body>404</body></html>", "# TYPE\n",
                                  "\r\n\r\n", "vllm:\n", "a" * 10000, "\ud800"])
def test_not_a_metrics_page_is_empty(text):
    assert parse_metrics(text) == []


# --- arithmetic ---------------------------------------------------------------------------------

def test_rate_from_counter_differences():
    # the real SGLang 0.3.5 generation counter (424549) and a later scrape 10 s on with 1200 more
    assert rate(424549.0, 425749.0, 10.0) == 120.0
    assert rate(None, 425749.0, 10.0) is None  # no previous scrape
    assert rate(424549.0, 425749.0, 0.0) is None and rate(424549.0, None, 10.0) is None
    # a restart: the counter drops to what the new process counted since: no rate, not negative
    assert rate(424549.0, 955.0, 10.0) is None
    assert rate(5.0, 5.0, 2.0) == 0.0


def _h(*buckets: tuple[float, float], count: float | None = None) -> Histogram:
    return Histogram(tuple(buckets), count if count is not None else buckets[-1][1], None)


def test_bucket_quantile_on_the_real_sglang_ttft_buckets():
    """histogram_quantile by hand on SGLang 0.3.5's TTFT (since start): 2124 observations; le=0.1 holds
    707, le=0.25 1187, le=0.5 1350, le=0.75 2124."""
    ttft = only(SG035).ttft
    # p50: rank 1062 falls in (0.1, 0.25]: 0.1 + 0.15 × (1062 − 707) / (1187 − 707)
    assert window_quantile(None, ttft, 0.5) == pytest.approx(0.1 + 0.15 * 355 / 480)
    # p99: rank 2102.76 in (0.5, 0.75]: 0.5 + 0.25 × (2102.76 − 1350) / (2124 − 1350)
    assert window_quantile(None, ttft, 0.99) == pytest.approx(0.5 + 0.25 * 752.76 / 774)
    # p5: rank 106.2 in the first non-empty bucket (0.02, 0.04] of 207: 0.02 + 0.02 × 106.2 / 207
    assert window_quantile(None, ttft, 0.05) == pytest.approx(0.02 + 0.02 * 106.2 / 207)


def test_window_quantile_over_bucket_differences():
    prev = _h((0.1, 10.0), (0.5, 20.0), (1.0, 20.0), (math.inf, 20.0))
    cur = _h((0.1, 10.0), (0.5, 24.0), (1.0, 30.0), (math.inf, 30.0))
    # the window: 0 in (0, 0.1], 4 in (0.1, 0.5], 6 in (0.5, 1.0] -> cumulative 0, 4, 10, 10
    assert window_buckets(prev, cur) == ((0.1, 0.0), (0.5, 4.0), (1.0, 10.0), (math.inf, 10.0))
    # p50: rank 5 > 4, in (0.5, 1.0]: 0.5 + 0.5 × (5 − 4) / 6
    assert window_quantile(prev, cur, 0.5) == pytest.approx(0.5 + 0.5 * 1 / 6)
    # p25: rank 2.5 in (0.1, 0.5]: 0.1 + 0.4 × 2.5 / 4
    assert window_quantile(prev, cur, 0.25) == pytest.approx(0.1 + 0.4 * 2.5 / 4)
    # since start instead (no prev): rank 15 of 30 in (0.1, 0.5]: 0.1 + 0.4 × 5 / 14
    assert window_quantile(None, cur, 0.5) == pytest.approx(0.1 + 0.4 * 5 / 14)
    # nothing observed in the window: None, not 0
    assert window_quantile(cur, cur, 0.5) is None
    # a rank in the +Inf bucket: the highest finite bound, as Prometheus returns
    top = _h((0.1, 1.0), (1.0, 1.0), (math.inf, 4.0))
    assert window_quantile(None, top, 0.9) == 1.0
    # q outside 0–1, or a page cut before +Inf: None
    assert window_quantile(None, cur, 1.5) is None
    assert bucket_quantile(0.5, ((0.1, 1.0), (0.5, 2.0))) is None


def test_window_quantile_after_a_restart_uses_the_new_process_alone():
    prev = _h((0.1, 100.0), (0.5, 200.0), (math.inf, 200.0))
    cur = _h((0.1, 1.0), (0.5, 3.0), (math.inf, 4.0))  # counts fell: the engine restarted
    assert window_buckets(prev, cur) == cur.buckets
    # rank 2 of 4 in (0.1, 0.5]: 0.1 + 0.4 × (2 − 1) / 2
    assert window_quantile(prev, cur, 0.5) == pytest.approx(0.3)
    # other bucket bounds (another engine answers on the port): also cur alone
    other = _h((0.2, 1.0), (math.inf, 2.0))
    assert window_buckets(prev, other) == other.buckets


def test_prefix_hit_rate():
    e = only(V011)
    assert prefix_hit_rate(None, e) is None  # 0 queries on the idle page: no rate, not 0 %
    a = EngineMetrics(kind="vllm", prefix_cache_queries=1000.0, prefix_cache_hits=250.0)
    b = EngineMetrics(kind="vllm", prefix_cache_queries=1400.0, prefix_cache_hits=550.0)
    assert prefix_hit_rate(None, a) == 0.25  # since start
    assert prefix_hit_rate(a, b) == 0.75  # window: 300 of 400
    assert prefix_hit_rate(b, a) == 0.25  # restart: the new process's counts alone
    assert prefix_hit_rate(b, b) is None  # no query in the window


# --- the CLI ------------------------------------------------------------------------------------

def test_cli_file(capsys):
    rc = main(["parse", "vllm-metrics", str(METRICS / SG035)])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert out.count("\n") == 1
    assert json.loads(out) == {"engines": [{
        "kind": "sglang", "model": "google/gemma-2-9b-it", "engine": None, "version": None,
        "requests_running": 0.0, "requests_waiting": 0.0, "kv_cache_usage": 0.01,
        "prompt_tokens_total": 506780.0, "generation_tokens_total": 424549.0, "preemptions_total": None,
        "prefix_cache_queries_total": None, "prefix_cache_hits_total": None, "gen_throughput": 0.0,
        "histograms": {"ttft": {"count": 2124.0, "sum": 656.0780844688416},
                       "itl": {"count": 422425.0, "sum": 29846.5393948555},
                       "e2e": {"count": 2104.0, "sum": 70517.99934530258},
                       "queue_time": {"count": 2104.0, "sum": 24885.007263183594}}}]}


def test_cli_stdin(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(dump(V011).encode())))
    rc = main(["parse", "vllm-metrics", "-"])
    out, _ = capsys.readouterr()
    data = json.loads(out)
    assert rc == 0 and len(data["engines"]) == 1
    e = data["engines"][0]
    assert (e["kind"], e["model"], e["engine"]) == ("vllm", "Qwen/Qwen1.5-0.5B-Chat", "0")
    assert (e["prefix_cache_queries_total"], e["prefix_cache_hits_total"], e["gen_throughput"]) == (0.0, 0.0, None)
    assert e["histograms"]["itl"] == {"count": 0.0, "sum": 0.0}


def test_cli_subprocess_file_stdin_junk_missing(tmp_path):
    """``python -m sparkconsole.cli`` as another tool would call it."""
    exe = [sys.executable, "-m", "sparkconsole.cli", "parse", "vllm-metrics"]
    proc = subprocess.run([*exe, str(METRICS / V07)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    e = json.loads(proc.stdout)["engines"][0]
    assert (e["model"], e["kv_cache_usage"], e["prompt_tokens_total"], e["generation_tokens_total"]) == (
        "Qwen/Qwen2.5-Coder-1.5B-Instruct", 0.0, 148.0, 955.0)
    proc = subprocess.run([*exe, "-"], input=dump(SG040), capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["engines"][0]["prompt_tokens_total"] == 7.0
    proc = subprocess.run([*exe, "-"], input="hello\n{]\n\x1b[2Jjunk 1 2\n", capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert proc.returncode == 0 and json.loads(proc.stdout) == {"engines": []}
    proc = subprocess.run([*exe, str(tmp_path / "nope.prom")], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "nope.prom" in proc.stderr and "Traceback" not in proc.stderr
