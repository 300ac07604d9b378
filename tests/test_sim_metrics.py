"""Issue 24, item 5 (part): the simulated vLLM engine answers ``GET /metrics`` in a real V1 server's
text format, with figures that follow what it served. The format is held to the real dumps copied
into ``tests/fixtures/real/metrics/`` (family names, HELP/TYPE lines, label keys, bucket
boundaries), read with a small parser here so the test depends on nothing the console ships; the
figures are held to the ``usage`` the chat completions reported."""

from __future__ import annotations

import asyncio
import json
import math
import re
from pathlib import Path

from sparkconsole.sim import SimClock, start_demo_cluster
from sparkconsole.sim.scenarios import EMBED, GLM, _service
from tests.test_sim_model import cluster, settle, sh
from tests.test_sim_shell import HEAD
from tests.test_sim_shell import _connect as sim_connect
from tests.test_sim_shell import ssh as sim_ssh

REAL = Path(__file__).parent / "fixtures" / "real" / "metrics"
IDLE = REAL / "vllm-0.11-v1-metrics-idle-qwen1.5-0.5b.prom"
SPARK = REAL / "vllm-0.22.1rc1-v1-metrics-partial-dgxspark-qwen3-1.7b.prom"
# what the sim leaves out on purpose (sparkconsole/sim/vllm_metrics.py says why)
LEFT_OUT = {"vllm:cache_config_info", "vllm:time_per_output_token_seconds",
            "vllm:time_per_output_token_seconds_created"}
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_]+="[^"]*",?)*\})? (\S+)$')
GLM_ARGS = [GLM, "--served-model-name", "glm-4.7-flash", "--gpu-memory-utilization", "0.70",
            "--max-model-len", "131072"]


def parse(text: str) -> dict[str, dict]:
    """Prometheus text: {family: {help, type, samples: [(name, labels, value)]}}, in order."""
    fams: dict[str, dict] = {}
    cur = None
    for line in text.splitlines():
        if not line or (line.startswith("#") and not line.startswith(("# HELP ", "# TYPE "))):
            continue
        if line.startswith("# HELP "):
            name, _, help_ = line[7:].partition(" ")
            cur = fams.setdefault(name, {"help": help_, "type": None, "samples": []})
            continue
        if line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            fams.setdefault(name, {"help": None, "type": kind, "samples": []})["type"] = kind
            cur = fams[name]
            continue
        m = SAMPLE.match(line)
        assert m, f"not an exposition sample line: {line!r}"
        labels = dict(re.findall(r'([a-zA-Z_]+)="([^"]*)"', m.group(2) or ""))
        if cur is None or not m.group(1).startswith(_base(cur)):
            cur = fams.setdefault(m.group(1), {"help": None, "type": None, "samples": []})
        cur["samples"].append((m.group(1), labels, float(m.group(3))))
    return fams


def _base(fam: dict) -> str:
    return fam["samples"][0][0].removesuffix("_bucket") if fam["samples"] else ""


def value(fams: dict, sample: str, **labels: str) -> float:
    for fam in fams.values():
        for name, lb, v in fam["samples"]:
            if name == sample and all(lb.get(k) == x for k, x in labels.items()):
                return v
    raise KeyError(sample)


def vllm_families(fams: dict) -> list[str]:
    return [n for n in fams if n.startswith("vllm:")]


async def metrics(c, node: str = HEAD, port: int = 8000) -> tuple[str, dict]:
    out, err, rc = await sh(c, node, f"curl -s localhost:{port}/metrics", step=0.05)
    assert rc == 0, err
    return out, parse(out)


def chat_cmd(served: str, content: str, port: int = 8000) -> str:
    body = json.dumps({"model": served, "messages": [{"role": "user", "content": content}]})
    return (f"curl -s http://localhost:{port}/v1/chat/completions -H 'Content-Type: application/json' "
            f"-d '{body}'")


def quiet_engine(port: int = 8000, name: str = "vllm-glm"):
    """A cluster whose head serves GLM with no background traffic: every figure is the test's own."""
    c = cluster("healthy")
    ct = _service(c, HEAD, name, GLM, [*GLM_ARGS, "--port", str(port)], -3_000.0, activity=0.0)
    return c, ct


# ---- format --------------------------------------------------------------------------------------

async def test_metrics_have_the_real_dumps_families_help_type_labels_and_buckets():
    c = cluster("story")  # the story's vllm-glm: a day of background traffic, so nothing is all zero
    text, sim = await metrics(c)
    real = parse(IDLE.read_text())
    want = [n for n in vllm_families(real) if n not in LEFT_OUT]
    assert vllm_families(sim) == want  # the same families, in the dump's order
    for name in want:
        r, s = real[name], sim[name]
        assert (s["help"], s["type"]) == (r["help"], r["type"]), name
        # the same sample names and label keys, series for series (buckets: the same boundaries)
        shape = [(n, sorted(lb), lb.get("le"), lb.get("finished_reason")) for n, lb, _v in r["samples"]]
        assert [(n, sorted(lb), lb.get("le"), lb.get("finished_reason")) for n, lb, _v in s["samples"]] == shape, name
        assert all(lb["engine"] == "0" and lb["model_name"] == "glm-4.7-flash" for _n, lb, _v in s["samples"])
    # label order and number spelling as prometheus_client writes them (the dump's)
    assert 'vllm:request_success_total{engine="0",finished_reason="stop",model_name="glm-4.7-flash"} ' in text
    assert re.search(r'vllm:time_to_first_token_seconds_bucket\{engine="0",le="0\.001",model_name=', text)
    assert re.search(r'^vllm:prompt_tokens_created\{[^}]*\} 1\.\d+e\+09$', text, re.M)
    assert value(sim, "vllm:prompt_tokens_total") > 0  # the background slots counted
    # the DGX Spark dump's sample lines (0.22.1rc1) have the same names and label keys
    spark = parse(SPARK.read_text())
    for fam in spark.values():
        for name, lb, _v in fam["samples"]:
            if name == "vllm:num_requests_waiting_by_reason":
                continue  # only that release has it (vllm_metrics.py)
            assert any(n == name and sorted(x) == sorted(lb) for f in sim.values() for n, x, _ in f["samples"]), name


async def test_metrics_need_no_api_key_over_ssh():
    """Read as the console will: ``curl -s localhost:8000/metrics`` through the node's SSH connection;
    vLLM guards only /v1 with its key."""
    async with start_demo_cluster(clock=SimClock.frozen()) as demo:
        run = demo.sim.engine_on_port(HEAD, 8000, demo.sim.now())
        run.api_key = "sk-test"
        async with sim_connect(demo.config.node(HEAD)) as conn:
            r = await sim_ssh(demo, HEAD, "curl -s localhost:8000/metrics", step=0.05, conn=conn)
            denied = await sim_ssh(demo, HEAD, "curl -s localhost:8000/v1/models", step=0.05, conn=conn)
        assert r.exit_status == 0
        fams = parse(r.stdout)
        assert fams["vllm:num_requests_running"]["type"] == "gauge"
        assert denied.stdout == '{"error":"Unauthorized"}'


# ---- figures -------------------------------------------------------------------------------------

async def test_counters_and_histograms_rise_by_what_the_completions_reported():
    c, _ct = quiet_engine()
    _, before = await metrics(c)
    assert value(before, "vllm:prompt_tokens_total") == 0.0
    assert value(before, "vllm:time_to_first_token_seconds_count") == 0.0
    usages = []
    for content in ("12*17", "Say hello", "12*17"):  # the third repeats the first: a prefix-cache hit
        out, _, rc = await sh(c, HEAD, chat_cmd("glm-4.7-flash", content), step=0.05)
        assert rc == 0
        usages.append(json.loads(out)["usage"])
    _, after = await metrics(c)
    n = len(usages)
    ptoks = sum(u["prompt_tokens"] for u in usages)
    ctoks = sum(u["completion_tokens"] for u in usages)

    def delta(sample: str, **lb: str) -> float:
        return value(after, sample, **lb) - value(before, sample, **lb)

    assert delta("vllm:prompt_tokens_total") == ptoks
    assert delta("vllm:generation_tokens_total") == ctoks
    assert delta("vllm:prefix_cache_queries_total") == ptoks
    assert delta("vllm:prefix_cache_hits_total") == (usages[2]["prompt_tokens"] - 1) // 16 * 16
    assert delta("vllm:request_success_total", finished_reason="stop") == n
    for h in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds",
              "request_prompt_tokens", "request_generation_tokens", "request_prefill_time_seconds"):
        assert delta(f"vllm:{h}_count") == n, h
        assert delta(f"vllm:{h}_bucket", le="+Inf") == n, h
    assert delta("vllm:request_prompt_tokens_sum") == ptoks
    assert delta("vllm:request_generation_tokens_sum") == ctoks
    assert delta("vllm:inter_token_latency_seconds_count") == ctoks - n  # one per token after the first
    # the sim's timing model: TTFT = 0.12 s + prompt at 1,500 tok/s + one token at GLM's 48 tok/s
    ttft = sum(0.12 + u["prompt_tokens"] / 1500.0 + 1 / 48.0 for u in usages)
    assert math.isclose(delta("vllm:time_to_first_token_seconds_sum"), ttft, rel_tol=1e-9)
    assert delta("vllm:time_to_first_token_seconds_bucket", le="0.1") == 0
    assert delta("vllm:time_to_first_token_seconds_bucket", le="0.25") == n
    assert value(after, "vllm:num_requests_running") == 0.0
    assert value(after, "vllm:kv_cache_usage_perc") == 0.0


async def test_running_and_kv_while_a_request_is_in_flight():
    c, ct = quiet_engine()
    run = ct.engine
    assert run.kv_cache_tokens > 0  # the "GPU KV cache size" its start-up log printed
    from sparkconsole.sim import Shell

    task = asyncio.ensure_future(Shell(c, HEAD).capture(chat_cmd("glm-4.7-flash", "12*17")))
    await settle(task)
    c.clock.advance(0.5)  # first token at ~0.15 s; about 17 tokens out by now
    await settle(task)
    assert not task.done()
    _, mid = await metrics(c)
    assert value(mid, "vllm:num_requests_running") == 1.0
    assert value(mid, "vllm:num_requests_waiting") == 0.0
    kv = value(mid, "vllm:kv_cache_usage_perc")
    assert 0 < kv <= 32 / run.kv_cache_tokens * 2  # two blocks at most: 14 prompt + ~17 generated tokens
    assert value(mid, "vllm:time_to_first_token_seconds_count") == 1.0
    assert 0 < value(mid, "vllm:generation_tokens_total") < run.metrics.flight[0].completion  # one by one
    assert value(mid, "vllm:e2e_request_latency_seconds_count") == 0.0  # not finished yet
    while not task.done():
        c.clock.advance(0.5)
        await settle(task)
    _, end = await metrics(c)
    assert value(end, "vllm:num_requests_running") == 0.0
    assert value(end, "vllm:kv_cache_usage_perc") == 0.0
    assert value(end, "vllm:e2e_request_latency_seconds_count") == 1.0


async def test_an_aborted_request_counts_as_abort():
    c, _ct = quiet_engine()
    _, _, rc = await sh(c, HEAD, chat_cmd("glm-4.7-flash", "12*17").replace("curl -s", "curl -s -m 0.5"), step=0.05)
    assert rc == 28
    _, fams = await metrics(c)
    assert value(fams, "vllm:request_success_total", finished_reason="abort") == 1.0
    assert value(fams, "vllm:request_success_total", finished_reason="stop") == 0.0
    assert value(fams, "vllm:num_requests_running") == 0.0


async def test_two_engines_are_distinct_and_a_restart_starts_at_zero():
    c, _ct = quiet_engine()
    _service(c, HEAD, "embeddings", EMBED, [EMBED, "--port", "8003", "--gpu-memory-utilization", "0.05", "--runner",
                                             "pooling", "--served-model-name", "embed-b"], -2_000.0, activity=0.0)
    out, _, _ = await sh(c, HEAD, chat_cmd("glm-4.7-flash", "12*17"), step=0.05)
    p = json.loads(out)["usage"]["prompt_tokens"]
    _, a = await metrics(c, port=8000)
    _, b = await metrics(c, port=8003)
    assert value(a, "vllm:prompt_tokens_total") == p
    assert value(b, "vllm:prompt_tokens_total") == 0.0
    assert value(b, "vllm:num_requests_running", model_name="embed-b") == 0.0
    # docker restart: a new process, its counters from 0
    _, _, rc = await sh(c, HEAD, "docker restart vllm-glm", step=1.0)
    assert rc == 0
    for _ in range(2000):
        out, _, rc = await sh(c, HEAD, "curl -s -o /dev/null -w '%{http_code}' localhost:8000/health", step=0.05)
        if out == "200":
            break
        c.clock.advance(5.0)
    _, fresh = await metrics(c, port=8000)
    assert value(fresh, "vllm:prompt_tokens_total") == 0.0
    assert value(fresh, "vllm:request_success_total", finished_reason="stop") == 0.0
