"""Issue 24, items 1 and 3 (the data part): the serving poll finds each node's engines and reads their
``/metrics`` through the node's one probe process, one request per engine every few ticks, and the
figures (rates, windowed percentiles, alerts, ``snapshot --json``'s ``engines``) come out right.

The probe script's ``metrics-PORT`` branch runs here under the real ``/bin/sh`` with real ``curl``
and ``grep`` against a real HTTP server serving the real dumps; the poller runs against the demo's
twin over SSH, as the console does."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import math
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from sparkconsole.probe.alerts import node_alerts
from sparkconsole.probe.poller import SERVING_EVERY, ClusterPoller, engines_to_json
from sparkconsole.probe.samples import Container, NodeSample
from sparkconsole.probe.script import MARK, metrics_section, probe_script, split_pages, split_tick
from sparkconsole.probe.state import NodeState, NodeStatus
from sparkconsole.remote import PAGE_MARK
from sparkconsole.serving.discover import Engine
from sparkconsole.serving.metrics import parse_metrics
from sparkconsole.serving.watch import EngineWatch, merge, version_from_image
from sparkconsole.sim import SimClock, start_demo_cluster
from sparkconsole.sim.scenarios import GLM, _service
from tests.test_sim_metrics import GLM_ARGS, chat_cmd
from tests.test_sim_model import cluster, sh
from tests.test_sim_shell import HEAD

REAL = Path(__file__).parent / "fixtures" / "real" / "metrics"
IDLE = REAL / "vllm-0.11-v1-metrics-idle-qwen1.5-0.5b.prom"
SGLANG = REAL / "sglang-0.4.0-metrics-llama3.1-8b-single-request-docs.prom"
ENGINE = Engine(node="n1", kind="vllm", where="vllm-glm", image="vllm/vllm-openai:v0.17.0", model="glm",
                port=8000, host="0.0.0.0")


# ---- the probe script's page read, under the real sh ---------------------------------------------

@contextlib.contextmanager
def serving(page: bytes):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/metrics":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()


def probe_tick(request: str) -> dict:
    """One request line to the real probe script under /bin/sh; its sections."""
    out = subprocess.run(["sh", "-c", probe_script()], input=request + "\n", capture_output=True, text=True,
                         timeout=30).stdout
    lines = out.splitlines()
    begin = next(i for i, ln in enumerate(lines) if ln.startswith(f"{MARK} begin"))
    end = next(i for i, ln in enumerate(lines) if ln.startswith(f"{MARK} end"))
    return split_tick(lines[begin + 1:end])


@pytest.mark.skipif(not shutil.which("curl"), reason="needs curl (scripts/test installs it)")
def test_the_real_probe_reads_a_real_page_filtered_on_the_node_to_what_the_parser_reads():
    for dump, kept in ((IDLE, 0.3), (SGLANG, 0.7)):
        text = dump.read_text()
        with serving(text.encode()) as port:
            secs = probe_tick(f"uptime {metrics_section(port)}")
        page = secs[metrics_section(port)]
        assert page.rc == 0 and "uptime" in secs
        assert parse_metrics(page.text) == parse_metrics(text)  # nothing the parser reads was lost
        assert len(page.text) < kept * len(text)  # the rest stayed on the node
        assert "python_gc" not in page.text and "# HELP" not in page.text


@pytest.mark.skipif(not shutil.which("curl"), reason="needs curl (scripts/test installs it)")
def test_the_real_probe_says_why_an_engine_did_not_answer_and_refuses_a_port_that_is_not_one():
    with serving(b"") as port:
        pass  # closed again: nothing listens there now
    secs = probe_tick(f"{metrics_section(port)} metrics-80;id metrics-")
    refused = secs[metrics_section(port)]
    assert refused.text.startswith("curl: (7)")
    w = EngineWatch(ENGINE)
    w.record(0.0, refused.text, refused.rc)
    assert w.reason == "not listening (connection refused)" and not w.figures().answering
    # ``metrics-80;id`` is two words for the loop (``metrics-80;id``): the case refuses it as no port
    assert "not a port: 80;id" in secs["metrics-80;id"].text and secs["metrics-80;id"].rc == 1
    assert secs["metrics-"].rc == 1


# ---- the watch: rates, windows, restarts ---------------------------------------------------------

async def test_rates_and_windowed_percentiles_follow_the_twins_engine():
    c = cluster("healthy")
    _service(c, HEAD, "vllm-glm", GLM, [*GLM_ARGS, "--port", "8000"], -3_000.0, activity=0.0)
    w = EngineWatch(ENGINE)

    async def read() -> None:
        out, _, rc = await sh(c, HEAD, "curl -s localhost:8000/metrics", step=0.05)
        w.record(c.clock.now(), out, rc)

    await read()
    f = w.figures()
    assert f.answering and f.requests_running == 0 and f.generation_tokens_per_s is None  # one page: no rate
    assert f.ttft_p50_s is None  # nothing served yet: no percentile, not 0
    t0 = c.clock.now()
    usage = []
    for content in ("12*17", "Say hello"):
        out, _, _ = await sh(c, HEAD, chat_cmd("glm-4.7-flash", content), step=0.05)
        usage.append(json.loads(out)["usage"])
    await read()
    f = w.figures()
    dt = c.clock.now() - t0
    gen = sum(u["completion_tokens"] for u in usage)
    assert math.isclose(f.generation_tokens_per_s, gen / dt, rel_tol=1e-9)
    assert math.isclose(f.prompt_tokens_per_s, sum(u["prompt_tokens"] for u in usage) / dt, rel_tol=1e-9)
    assert f.ttft_p50_s is not None and 0 < f.ttft_p50_s <= f.ttft_p95_s
    assert f.itl_p50_s is not None and f.itl_p50_s <= f.itl_p95_s
    assert w.rates()[-1] == f.generation_tokens_per_s
    # five quiet minutes later: the 1-minute window has no request, the 5-minute one still has them
    c.clock.advance(200.0)
    await read()
    c.clock.advance(90.0)
    await read()
    f = w.figures()
    assert f.ttft_p50_s is None and f.itl_p50_s is None
    assert f.ttft_p50_5m_s is not None and f.generation_tokens_per_s == 0.0


def page(gen: float, *, kv: float = 0.1, waiting: float = 0, preempt: float = 0, running: float = 1) -> str:
    """A minimal page with the V1 names (test input written here, not a captured output)."""
    lb = '{engine="0",model_name="glm"}'
    return "\n".join([f"vllm:num_requests_running{lb} {running}", f"vllm:num_requests_waiting{lb} {waiting}",
                      f"vllm:kv_cache_usage_perc{lb} {kv}", f"vllm:generation_tokens_total{lb} {gen}",
                      f"vllm:num_preemptions_total{lb} {preempt}", ""])


def test_a_counter_that_drops_is_a_restart_not_a_negative_rate_and_an_identical_page_is_not_parsed_again():
    w = EngineWatch(ENGINE)
    w.record(0.0, page(1000), 0)
    w.record(6.0, page(1600), 0)
    assert w.figures().generation_tokens_per_s == 100.0
    w.record(12.0, page(40), 0)  # restarted
    assert w.figures().generation_tokens_per_s is None
    w.record(18.0, page(40), 0)  # idle: the same text
    assert w.pages[-1][1] is w.pages[-2][1] and w.figures().generation_tokens_per_s == 0.0


def test_data_parallel_ranks_on_one_page_add_up():
    two = page(100, kv=0.2, waiting=1) + page(50, kv=0.6, waiting=2).replace('engine="0"', 'engine="1"')
    m = merge(parse_metrics(two))
    assert (m.generation_tokens, m.requests_waiting, m.kv_cache_usage, m.requests_running) == (150, 3, 0.6, 2)


def test_version_from_the_image_tag_only_where_it_is_the_engines():
    assert version_from_image("vllm/vllm-openai:v0.17.0") == "0.17.0"
    assert version_from_image("lmsysorg/sglang:v0.5.4-cu129") == "0.5.4"
    assert version_from_image("nvcr.io/nvidia/vllm:25.09-py3") is None  # NGC's release, not vLLM's
    assert version_from_image("vllm/vllm-openai:latest") is None and version_from_image(None) is None


# ---- alerts --------------------------------------------------------------------------------------

def state_with(watch: EngineWatch, running: bool = True) -> NodeState:
    ct = Container(id="c1", name="vllm-glm", image="x", state="running" if running else "exited", status="Up")
    s = NodeState("n1", status=NodeStatus.UP, sample=NodeSample(node="n1", taken_at=0.0, containers=(ct,)))
    s.engines[8000] = watch
    return s


def kinds(state: NodeState) -> set[str]:
    return {a.kind for a in node_alerts(state) if a.kind.startswith("engine")}


def test_alerts_kv_full_preemptions_a_growing_queue_and_an_engine_gone_quiet():
    w = EngineWatch(ENGINE)
    w.record(0.0, page(0, kv=0.5), 0)
    assert kinds(state_with(w)) == set()
    w.record(6.0, page(10, kv=0.92, waiting=1), 0)
    w.record(12.0, page(20, kv=0.93, waiting=3), 0)
    assert kinds(state_with(w)) == {"engine-queue"}
    w.record(18.0, page(30, kv=0.97, waiting=5, preempt=4), 0)
    alerts = {a.kind: a for a in node_alerts(state_with(w))}
    assert set(alerts) >= {"engine-kv-full", "engine-preempting", "engine-queue"}
    assert "4 preemptions in the last minute" in alerts["engine-preempting"].text
    assert alerts["engine-kv-full"].subject == "8000"
    # stops answering: one miss is a blip, two are an alert, but only while the container runs
    refused = "curl: (7) Failed to connect to 127.0.0.1 port 8000 after 0 ms: Couldn't connect to server"
    w.record(24.0, refused, 0)
    assert "engine-silent" not in kinds(state_with(w))
    w.record(30.0, refused, 0)
    silent = [a for a in node_alerts(state_with(w)) if a.kind == "engine-silent"]
    assert silent and "connection refused" in silent[0].text and silent[0].severity == "critical"
    assert "engine-silent" not in kinds(state_with(w, running=False))  # stopped on purpose: no alarm


# ---- the poller on the twin: discovery, cadence, one request per engine --------------------------

async def test_the_poller_finds_the_engines_and_reads_their_pages_together_every_few_ticks():
    async with start_demo_cluster(clock=SimClock.frozen()) as demo:
        poller = ClusterPoller(demo.config, clock=demo.sim.now)
        asked: list[str] = []
        try:
            p = poller.pollers[HEAD]
            p.patience = 30.0
            await p.poll_once()  # tick 0: everything, the engines' discovery among it
            ports = sorted(p.state.engines)
            assert ports == [8000, 8001, 8002]
            real_ask = p._ask

            async def ask(process, wanted):
                asked.append(" ".join(wanted))
                return await real_ask(process, wanted)

            p._ask = ask
            for _ in range(2 * SERVING_EVERY):
                demo.sim.clock.advance(2.0)
                await p.poll_once()
            pages = [[w for w in line.split() if w.startswith("metrics-")] for line in asked]
            # the first tick after discovery reads every page, with one curl; then every SERVING_EVERY ticks
            every = "metrics-" + ",".join(str(q) for q in ports)
            assert pages[0] == [every]
            due = [t - 1 for t in range(1, 2 * SERVING_EVERY + 1) if t % SERVING_EVERY == 0]
            assert [i for i, x in enumerate(pages) if x] == [0, *due]  # then on the cadence only
            assert all(x in ([], [every]) for x in pages)
            glm = p.state.engines[8000].figures()
            assert glm.answering and glm.model == "glm-4.7-flash" and glm.version == "0.14.1"
            assert glm.generation_tokens_per_s is not None  # two pages read: a rate
            rows = engines_to_json([p.state])
            assert [r["port"] for r in rows] == ports
            # the serving poll off: neither discovery nor pages are asked
            off = poller.pollers[HEAD]
            off.serving = False
            asked.clear()
            for _ in range(SERVING_EVERY):
                demo.sim.clock.advance(2.0)
                await off.poll_once()
            assert not any("metrics-" in line or "engines" in line.split() for line in asked)
        finally:
            await poller.close()


async def test_a_new_container_is_discovered_on_the_next_tick_not_a_minute_later():
    async with start_demo_cluster(scenario="healthy", clock=SimClock.frozen()) as demo:
        poller = ClusterPoller(demo.config, clock=demo.sim.now)
        try:
            p = poller.pollers[HEAD]
            p.patience = 30.0
            await p.poll_once()
            assert p.state.engines == {}
            _service(demo.sim, HEAD, "vllm-late", GLM, [*GLM_ARGS, "--port", "8010"], demo.sim.now() - 600.0, 0.0)
            for _ in range(4):  # docker ps (every 2nd tick) sees it, the next tick asks who it is
                demo.sim.clock.advance(2.0)
                await p.poll_once()
                if 8010 in p.state.engines and p.state.engines[8010].pages:
                    break
            assert p.state.engines[8010].engine.where == "vllm-late"
            assert p.state.engines[8010].figures().answering
        finally:
            await poller.close()


def test_snapshot_json_has_engines_with_every_contract_key():
    out = subprocess.run([str(Path(__import__("sys").executable).with_name("sparkconsole")), "snapshot", "--demo",
                          "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    engines = json.loads(out.stdout)["engines"]
    keys = {"node", "port", "model", "kind", "version", "requests_running", "requests_waiting", "kv_cache_usage",
            "prompt_tokens_per_s", "generation_tokens_per_s", "ttft_p50_s", "ttft_p95_s", "itl_p50_s",
            "itl_p95_s", "preemptions"}
    assert engines and all(keys <= set(e) for e in engines)
    glm = next(e for e in engines if e["model"] == "glm-4.7-flash")
    assert glm["kind"] == "vllm" and glm["port"] == 8000 and 0 <= glm["kv_cache_usage"] <= 1
    assert glm["generation_tokens_per_s"] is None  # one page read: no rate yet (null, not 0)


if __name__ == "__main__":  # pragma: no cover
    asyncio.run(test_rates_and_windowed_percentiles_follow_the_twins_engine())


def test_a_percentile_in_the_first_bucket_is_said_as_below_its_bound():
    """vLLM's queue-time buckets start at 0.3 s: requests that never waited all land in the first one,
    and Prometheus' interpolation reads their median as 0.15 s. The figure keeps that number (it is
    what histogram_quantile gives) and says it is below the bucket's bound."""
    lb = 'engine="0",model_name="glm"'
    buckets = "\n".join(f'vllm:request_queue_time_seconds_bucket{{{lb},le="{le}"}} {n}'
                        for le, n in (("0.3", 10), ("0.5", 10), ("+Inf", 10)))
    text = buckets + f"\nvllm:request_queue_time_seconds_count{{{lb}}} 10\n"
    w = EngineWatch(ENGINE)
    w.record(0.0, text, 0)
    f = w.figures()
    assert math.isclose(f.queue_p50_s, 0.15) and f.below["queue_p50_s"] == 0.3


@pytest.mark.skipif(not shutil.which("curl"), reason="needs curl (scripts/test installs it)")
def test_one_curl_reads_every_engine_and_each_page_comes_back_to_its_port():
    """Two real pages and a closed port in one ``metrics-P1,P2,P3`` section: one curl on the node
    (issue 25), split back by port, each as a page read alone would be."""
    with serving(IDLE.read_bytes()) as a, serving(SGLANG.read_bytes()) as b:
        with serving(b"") as closed:
            pass
        name = metrics_section(a, closed, b)
        secs = probe_tick(f"{name} uptime")
    pages = split_pages(secs[name])
    assert sorted(pages) == sorted([a, b, closed])
    assert parse_metrics(pages[a].text) == parse_metrics(IDLE.read_text()) and pages[a].rc == 0
    assert parse_metrics(pages[b].text) == parse_metrics(SGLANG.read_text()) and pages[b].rc == 0
    assert pages[closed].text.startswith("curl: (7)")
    assert not any(PAGE_MARK in p.text for p in pages.values())
