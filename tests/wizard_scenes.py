"""The wizard's scenes, shared by the snapshot tests (tests/test_wizard_ui.py) and scripts/screenshots.

The screen is fed recorded deploy events (its input contract: the runner emits the same ones), so
the pictures do not move when the flow's wording does; the node panels beside it are the demo's
polled samples, on the reproducible clocks of :mod:`tests.ui_support`.
"""

from __future__ import annotations

import asyncio

from sparkconsole.deploy.decisions import Decision, Option
from sparkconsole.deploy.events import (
    CommandEvent,
    DecisionEvent,
    NoteEvent,
    OutputEvent,
    ProgressEvent,
    StepEvent,
)
from sparkconsole.deploy.state import DeploymentState
from sparkconsole.ui.screens.decision import DecisionScreen
from sparkconsole.ui.screens.wizard import WizardScreen
from tests.ui_support import started, wait_ready

FIXED_ID = "20260327-174000-ab12"
MODEL = "Qwen/Qwen3.5-122B-A10B-FP8"


async def until(pilot, app, cond, timeout: float = 30.0) -> None:
    """Wait for ``cond``, moving the demo's manual clock on (commands on the sim take sim time)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            raise AssertionError(f"condition not met in time; screen: {type(app.screen).__name__}")
        app.demo.sim_clock.advance(0.5)
        await pilot.pause(0.02)


def asking(app, decision_id: str):
    return lambda: isinstance(app.screen, DecisionScreen) and app.screen.decision.id == decision_id


HEAD, WORKER = "spark-1a32", "spark-5be3"

BEFORE_PLAN = [
    StepEvent("recon", "running"),
    NoteEvent("recon", "NVIDIA GB10, driver 580.126.09, CUDA 13.0, 12.9/119.7 GiB available, docker 29.2.1 "
                       "(overlayfs), 3 images, fast link 169.254.115.57, Hub reachable", node=HEAD),
    NoteEvent("recon", "NVIDIA GB10, driver 580.126.09, CUDA 13.0, 106.6/119.7 GiB available, docker 29.2.1 "
                       "(overlayfs), 1 image, fast link 169.254.70.174, Hub not reachable", node=WORKER),
    StepEvent("recon", "done"),
    StepEvent("plan", "running"),
]

PLAN_LAYOUT = Decision(
    "plan.layout", "plan", "Single-node OOM risk: how to lay the model out",
    ("TP=1: 116.1 GiB weights per node, -18.1 GiB KV, 0.0x concurrency at 262,144 tokens: does not fit",
     "TP=2: 58.1 GiB weights per node, 39.4 GiB KV, 12.4x concurrency at 262,144 tokens: fits"),
    (Option("tp1", "one Spark", "116.1 GiB weights per node; out of memory on loading (the single-node OOM risk)"),
     Option("tp2", "TP=2 over 2 Sparks", "58.1 GiB weights per node; fits"),
     Option("tp2-fp8kv", "TP=2 with fp8 KV cache", "24.8x concurrency (twice the tokens, slightly lower quality)"),
     Option("4bit", "a 4-bit variant on one Spark", "an NVFP4/INT4 build fits one node (other checkpoint)")),
    "tp2", "the cheapest layout that fits: TP=2; one Spark would run out of memory loading 116 GiB")


STOPPED = "spark-1a32:reranker,spark-1a32:vllm-glm"  # the story's answer: the embeddings keep serving


def _done(step: str) -> list:
    return [StepEvent(step, "running"), StepEvent(step, "done")]


WEIGHTS_LOADING = [
    *BEFORE_PLAN,
    DecisionEvent("plan.layout", PLAN_LAYOUT.title, "tp2", "tp2", PLAN_LAYOUT.why, by="operator"),
    StepEvent("plan", "done"),
    *_done("engine"), *_done("network"),
    StepEvent("weights", "running"),
    ProgressEvent("weights", HEAD, "download", 1.0, "39/39 files"),
    ProgressEvent("weights", WORKER, "copy", 1.0, "126.3 GB 100% 1.1GB/s"),
    StepEvent("weights", "done"),
    *_done("images"),
    StepEvent("free-memory", "running"),
    DecisionEvent("free-memory.stop", "Free memory: which services to stop", STOPPED, STOPPED,
                  "stopping these frees enough on every node", by="operator"),
    CommandEvent("free-memory", HEAD, "docker stop reranker", 0, "docker stop reranker", True, 0.4),
    CommandEvent("free-memory", HEAD, "docker stop vllm-glm", 0, "docker stop vllm-glm", True, 0.4),
    StepEvent("free-memory", "done"),
    *_done("caches"), *_done("cluster"), *_done("guard"),
    StepEvent("serve", "running"),
    CommandEvent("serve", HEAD, "docker exec -d sparkconsole-ray-74000ab12 sh -c 'vllm serve …'", 0,
                 "start vLLM (Ray, TP=2) in sparkconsole-ray-74000ab12", True, 0.4),
    OutputEvent("serve", HEAD, "INFO 03-27 17:52:10 [api_server.py:1351] vLLM API server version 0.17.0"),
    OutputEvent("serve", HEAD, "INFO 03-27 17:52:31 [ray_utils.py:345] Connected to Ray cluster: 2 nodes, 2 GPUs"),
    OutputEvent("serve", HEAD, "Loading safetensors checkpoint shards:  41% Completed | 16/39 [00:38<00:55]"),
    ProgressEvent("serve", HEAD, "weights", 0.41, "16/39 shards"),
]


async def open_recorded(pilot, app) -> WizardScreen:
    """The wizard over six polls of the demo, showing a deployment with a fixed id (no runner)."""
    await started(pilot, app, ticks=6)
    wizard = WizardScreen(state=DeploymentState(id=FIXED_ID, model=MODEL, cluster=app.config.name))
    app.install_screen(wizard, "wizard")
    await pilot.press("w")
    await pilot.pause()
    return wizard


async def wizard_decision(pilot, app) -> None:
    """The plan.layout decision open, the third option highlighted (the "why" follows it)."""
    wizard = await open_recorded(pilot, app)
    wizard.running = True
    wizard.feed(BEFORE_PLAN)
    await pilot.pause()
    wizard._pending = asyncio.create_task(wizard._answer(PLAN_LAYOUT))  # the runner's own answerer
    await until(pilot, app, asking(app, "plan.layout"))
    await pilot.press("down", "down")
    await pilot.pause(0.2)


def stop_as_recorded(app) -> None:
    """What the recorded free-memory step did, done to the sim (as its ``docker stop`` does), so the
    node panels beside the recorded steps show the head without GLM and the reranker."""
    sim = app.demo_cluster.sim
    t = sim.clock.now()
    for service in STOPPED.split(","):
        node, name = service.split(":")
        ct = sim.container(node, name)
        ct.stopped, ct.exit_code = t, 0
        if ct.engine is not None:
            ct.engine.stop(t)


async def wizard_weights_loading(pilot, app) -> None:
    """The serve step loading shards (41 %), every earlier step done, the engine log beneath; the
    head's panel without the services free-memory stopped."""
    await wait_ready(pilot, app)
    stop_as_recorded(app)
    wizard = await open_recorded(pilot, app)
    wizard.running = True
    wizard.feed(WEIGHTS_LOADING)
    await pilot.pause(0.3)
    await pilot.pause(0.2)
