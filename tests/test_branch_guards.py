"""Decision branches that a mutation pass found unguarded: each single-line change below passed every
related test. Every test here fails with its branch changed and passes on the real code.

- the planner's verdict must need ONE request of ``max_model_len`` to fit (not just a positive KV
  budget): at gmu 0.55 on TP=2 the 122B has blocks for less than one request, and vLLM refuses to start;
- teardown checks the containers it removed are gone (a daemon can say "removed" and keep them);
- an out-of-memory start on a layout chosen against the plan recommends going back to the plan,
  not a shorter context on the same layout;
- an UP node whose last sample is older than three intervals is stale;
- the console's alerts follow a new sample even when the node's status and reason did not change;
- a page that serves a metric under both its current and its legacy name reads the current one.

Inputs are real where one exists: the bundled model config, a real ``docker ps`` and a real vLLM OOM
log (tests/fixtures), vLLM 0.11's real ``/metrics`` page.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from sparkconsole.config import ClusterConfig, NodeConfig
from sparkconsole.deploy.decisions import ScriptedAnswers
from sparkconsole.deploy.events import DecisionEvent
from sparkconsole.deploy.flow import Flow, Options
from sparkconsole.deploy.runner import Runner, StepFailed
from sparkconsole.deploy.state import DeploymentState, Started, StateStore
from sparkconsole.deploy.steps import Serve
from sparkconsole.deploy.teardown import Teardown
from sparkconsole.logs.vllm import VllmLogTracker
from sparkconsole.planner import budget as bud
from sparkconsole.planner.plan import PlanOptions, plan
from sparkconsole.planner.spec import load_spec
from sparkconsole.probe.alerts import node_alerts
from sparkconsole.probe.parsers import parse_docker_ps
from sparkconsole.probe.poller import NodePoller
from sparkconsole.probe.samples import GIB, GpuSample, NodeSample, UnifiedMemory
from sparkconsole.probe.state import NodeState, NodeStatus
from sparkconsole.serving.metrics import parse_metrics
from sparkconsole.transport.base import CommandResult

FIXTURES = Path(__file__).parent / "fixtures"
Q122 = "Qwen/Qwen3.5-122B-A10B-FP8"


@pytest.fixture(autouse=True)
def _state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


# ---- 1. the planner's verdict needs one whole request ---------------------------------------------

def test_a_positive_kv_budget_with_blocks_for_less_than_one_request_does_not_fit():
    """gmu 0.55, TP=2, 262,144 tokens: KV memory is left (a few GiB), but fewer blocks than one request
    of max_model_len needs; vLLM refuses that start ("max seq len ... larger than the maximum number of
    tokens that can be stored in KV cache"), so the plan must not say it fits."""
    r = plan(load_spec(Q122), PlanOptions(tp=2, gpu_memory_utilization=0.55))
    cap = r.capacity
    assert r.budget.kv_gib > 0  # the weights and overheads fit: only the one-request check can refuse
    assert 0 < cap.num_blocks < cap.blocks_per_request, (cap.num_blocks, cap.blocks_per_request)
    assert not r.fits
    assert r.reasons[0].startswith("does not fit")
    assert any(w.startswith("a shorter context: --max-model-len") for w in r.ways_out)
    # a little more memory gives blocks for a whole request: then it fits (the check is not always "no")
    more = plan(load_spec(Q122), PlanOptions(tp=2, gpu_memory_utilization=0.60))
    assert more.capacity.num_blocks >= more.capacity.blocks_per_request and more.fits


def test_fits_asks_for_one_request_on_both_budget_paths():
    """The same rule with a budget from the estimate and one given (``--kv-cache-gib``)."""
    over = bud.estimate_overheads(tp=2)
    estimated = bud.kv_budget(bud.DEFAULT_NODE_MEMORY_GIB, 0.55, 58.0, over)
    given = bud.kv_budget(bud.DEFAULT_NODE_MEMORY_GIB, 0.85, 58.0, over, kv_cache_gib=2.7)
    for b in (estimated, given):
        assert b.kv_gib > 0
        assert not bud.fits(b, num_blocks=113, blocks_per_request=132)
        assert bud.fits(b, num_blocks=132, blocks_per_request=132)
        assert not bud.fits(b, num_blocks=132, blocks_per_request=0)  # no request size: nothing is known to fit


# ---- 2. teardown checks the containers are gone -----------------------------------------------------

class _Docker:
    """One node's Docker as a real 20.10 daemon printed it (tests/fixtures/docker/docker_ps_json_20.10.txt);
    ``docker rm -f`` answers success and removes the container only when ``removes`` (a daemon that
    says "removed" while the container stays is what the check after removal is for)."""

    def __init__(self, removes: bool) -> None:
        lines = (FIXTURES / "docker" / "docker_ps_json_20.10.txt").read_text().splitlines()
        self.lines = [ln for ln in lines if ln.startswith("{")]
        self.removes = removes
        self.connected, self.last_error = True, None
        self.sent: list[str] = []

    async def run(self, cmd, timeout: float = 30.0, input: str | None = None) -> CommandResult:
        text = cmd.shell()
        self.sent.append(text)
        if text.startswith("docker rm -f") and self.removes:
            self.lines = [ln for ln in self.lines if not any(c.name and c.name in text for c in parse_docker_ps(ln))]
        if text.startswith("docker ps -a"):
            return CommandResult(text, 0, "\n".join(self.lines) + "\n", "", 0.01)
        return CommandResult(text, 0, "", "", 0.01)

    async def close(self) -> None:
        pass


def _teardown_runner(tmp_path: Path, docker: _Docker) -> Runner:
    config = ClusterConfig(nodes=(NodeConfig("spark-a", "127.0.0.1", role="head"),), name="lab")
    state = DeploymentState.new("Q/M", Options().to_json(), "lab")
    state.started.append(Started("spark-a", "container", "sc-parsers-fixture-run"))
    return Runner(config=config, state=state, transports={"spark-a": docker}, answer=ScriptedAnswers({}, auto=True),
                  emit=lambda e: None, store=StateStore(tmp_path / "deployments"))


async def test_teardown_fails_when_a_removed_container_is_still_there(tmp_path):
    docker = _Docker(removes=False)
    r = _teardown_runner(tmp_path, docker)
    with pytest.raises(StepFailed) as failed:
        await Teardown(Flow(r, Options())).run()
    assert failed.value.message == "spark-a: still there after removal: sc-parsers-fixture-run"
    assert any(s.startswith("docker rm -f") and "sc-parsers-fixture-run" in s for s in docker.sent)
    # nothing is forgotten: a later teardown still knows what to remove
    assert [s.name for s in r.state.started] == ["sc-parsers-fixture-run"] and r.state.result != "torn-down"


async def test_teardown_that_removed_its_container_ends_torn_down(tmp_path):
    r = _teardown_runner(tmp_path, _Docker(removes=True))
    await Teardown(Flow(r, Options())).run()
    assert r.state.started == [] and r.state.result == "torn-down"


# ---- 3. an OOM on a layout chosen against the plan: back to the plan --------------------------------

def _oom_report():
    """A real vLLM out-of-memory start (vllm-project/vllm#28143), read by the console's tracker."""
    t = VllmLogTracker()
    for line in (FIXTURES / "real" / "vllm-logs" / "13-v1-cuda-oom-creating-weights.log").read_text().splitlines():
        t.feed(line)
    assert t.report.state == "failed" and t.report.failure_kind == "oom"
    return t.report


async def _failure_decision(plan_fits: bool) -> DecisionEvent:
    class _Node:
        connected, last_error = True, None

        async def run(self, cmd, timeout: float = 30.0, input: str | None = None) -> CommandResult:
            return CommandResult(cmd.shell(), 0, "", "", 0.01)

    opts = Options()
    state = DeploymentState.new(opts.model, opts.to_json(), "lab")
    events: list = []
    runner = Runner(config=ClusterConfig(nodes=(NodeConfig("spark-a", "127.0.0.1", role="head"),), name="lab"),
                    state=state, transports={"spark-a": _Node()},
                    answer=ScriptedAnswers({"serve.failure": "stop"}), emit=events.append)
    flow = Flow(runner, opts)
    flow.update(tp=1, pp=1, gmu=0.85, max_model_len=262_144, engine="vllm", executor="single",
                image="vllm/vllm-openai:v0.17.0", plan_fits=plan_fits)
    with pytest.raises(StepFailed, match=r"the engine failed \(oom\)"):
        await Serve(flow)._failed(_oom_report())
    return [e for e in events if isinstance(e, DecisionEvent) and e.id == "serve.failure"][-1]


async def test_an_oom_on_a_layout_against_the_plan_recommends_the_plan():
    asked = await _failure_decision(plan_fits=False)
    values = [o["value"] for o in asked.options]
    assert asked.recommended == "back-plan" and values[0] == "back-plan"
    assert "shorter" not in values  # the same layout with less context would still not fit
    assert "chosen against the plan's verdict" in next(o["why"] for o in asked.options if o["value"] == "back-plan")


async def test_an_oom_on_a_layout_the_plan_passed_recommends_a_shorter_context():
    asked = await _failure_decision(plan_fits=True)
    assert asked.recommended == "shorter"
    assert "this layout does not fit" not in " ".join(o["label"] for o in asked.options)


# ---- 4. stale after three intervals --------------------------------------------------------------

class _Connected:
    """A transport with its connection up: only the sample's age can make the node stale."""

    connected, last_error = True, None

    async def close(self) -> None:
        pass


@pytest.mark.parametrize("interval", [2.0, 5.0])
def test_an_up_node_is_stale_once_its_sample_is_three_intervals_old(interval):
    state = NodeState("spark-a", status=NodeStatus.UP, reason="", last_ok_at=1000.0)
    node = NodeConfig("spark-a", "127.0.0.1")
    poller = NodePoller(node, _Connected(), interval=interval, state=state)  # type: ignore[arg-type]
    poller.refresh_staleness(now=1000.0 + 2.9 * interval)
    assert state.status is NodeStatus.UP
    poller.refresh_staleness(now=1000.0 + 3.1 * interval)
    assert state.status is NodeStatus.STALE
    assert state.reason == f"no fresh sample for {3.1 * interval:.0f} s"
    assert [a.kind for a in node_alerts(state)] == ["stale"]


# ---- 5. the console's alerts follow a new sample ---------------------------------------------------

def _sample(available_gib: float) -> NodeSample:
    return NodeSample(node="a", taken_at=100.0, driver_version="580.126.09", cuda_version="13.0",
                      memory=UnifiedMemory(total_bytes=int(119.7 * GIB), available_bytes=int(available_gib * GIB),
                                           unified=True),
                      gpus=(GpuSample(index=0, name="NVIDIA GB10", clock_max_sm_mhz=3003),))


def test_the_consoles_alerts_change_with_the_sample_while_status_and_reason_stay():
    from sparkconsole.ui.app import DemoOptions, SparkConsoleApp

    app = SparkConsoleApp(demo=DemoOptions(), clock=lambda: 100.0, remember_theme=False)
    state = NodeState("a", status=NodeStatus.UP, reason="", sample=_sample(60.0), last_ok_at=100.0)
    poller = SimpleNamespace(states=[state], pollers={"a": SimpleNamespace(state=state)})
    app.poller = poller  # type: ignore[assignment]
    assert app.alerts() == []
    state.sample = replace(_sample(5.0), taken_at=102.0)  # same status, reason, failures: only the sample moved
    assert [a.kind for a in app.alerts()] == ["low-memory"]
    state.sample = replace(_sample(60.0), taken_at=104.0)
    assert app.alerts() == []


# ---- 6. the current metric name wins over the legacy one -------------------------------------------

V011 = FIXTURES / "real" / "metrics" / "vllm-0.11-v1-metrics-idle-qwen1.5-0.5b.prom"
LEGACY_KV = 'vllm:gpu_cache_usage_perc{engine="0",model_name="Qwen/Qwen1.5-0.5B-Chat"} 0.5\n'


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_page_with_both_names_reads_the_current_one(where):
    """vLLM 0.11's real page, with the pre-0.9.2 KV gauge added under the same labels (as a build that
    serves both would) before or after the current one: the current name wins either way. The page
    itself serves the latency histogram under both names (``time_per_output_token_seconds``, listed
    first, and ``inter_token_latency_seconds``): the current one wins there too."""
    page = V011.read_text()
    text = LEGACY_KV + page if where == "before" else page + LEGACY_KV
    (e,) = parse_metrics(text)
    assert e.sources["kv_cache_usage"] == "vllm:kv_cache_usage_perc"
    assert e.kv_cache_usage == 0.0  # the page's current gauge, not the legacy 0.5
    assert "vllm:time_per_output_token_seconds_count" in page and "vllm:inter_token_latency_seconds_count" in page
    assert page.index("vllm:time_per_output_token_seconds") < page.index("vllm:inter_token_latency_seconds")
    assert e.sources["itl"] == "vllm:inter_token_latency_seconds"
    # alone, the legacy name is read (the fallback works): the current one wins only when both are there
    (old,) = parse_metrics(page.replace("vllm:kv_cache_usage_perc", "vllm:unrelated_gauge") + LEGACY_KV)
    assert old.sources["kv_cache_usage"] == "vllm:gpu_cache_usage_perc" and old.kv_cache_usage == 0.5


def test_a_silent_engines_alert_follows_its_container_between_reads():
    """The engine alerts' memo (probe/alerts.py) is kept per read of the page; whether the engine's
    container still runs comes from the node's sample, which moves between reads: a container
    stopped on purpose takes its "stopped answering" alert with it at the next sample."""
    from sparkconsole.probe.alerts import engine_alerts
    from sparkconsole.probe.samples import Container
    from sparkconsole.serving.discover import Engine
    from sparkconsole.serving.watch import SILENT_AFTER, EngineWatch

    w = EngineWatch(Engine(node="a", kind="vllm", where="vllm-q", image="vllm/vllm-openai:v0.11.0",
                           model="Qwen/Qwen1.5-0.5B-Chat", port=8000, host="0.0.0.0"), version="0.11.0")
    w.record(100.0, V011.read_text(), 0)
    for i in range(SILENT_AFTER):
        w.record(102.0 + 2 * i, "", None)  # no answer
    assert w.silent
    running = Container("c1", "vllm-q", "vllm/vllm-openai:v0.11.0", "running", "Up 3 hours")
    state = NodeState("a", status=NodeStatus.UP, reason="", sample=replace(_sample(60.0), containers=(running,)),
                      last_ok_at=110.0, engines={8000: w})
    assert [a.kind for a in engine_alerts(state)] == ["engine-silent"]
    exited = replace(running, state="exited", status="Exited (0) 1 second ago")
    state.sample = replace(state.sample, containers=(exited,), taken_at=112.0)  # no new read of the page
    assert engine_alerts(state) == []
