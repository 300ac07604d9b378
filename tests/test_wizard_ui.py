"""The deployment wizard's screen (``w``) on the demo cluster, driven by keyboard, and its snapshots.

The Pilot tests run the headless flow for real (recon, plan, engine over the demo's SSH) and answer
its decisions with keys. The simulated cluster cannot carry a whole deployment yet, so they stop
after the engine step (the screen's ``until``), which meets the ``plan.layout`` and ``engine.image``
decisions. The snapshots feed the screen recorded deploy events (its input contract) so they do
not move when the flow's wording does; the node panels are the demo's polled samples.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest

from sparkconsole.deploy.decisions import Decision, Option
from sparkconsole.deploy.events import (
    CommandEvent,
    DecisionEvent,
    NoteEvent,
    OutputEvent,
    ProgressEvent,
    StepEvent,
)
from sparkconsole.deploy.state import DeploymentState, StateStore
from sparkconsole.journal import read_journal
from sparkconsole.probe import poller
from sparkconsole.remote import drop_caches
from sparkconsole.ui.screens.confirm import ConfirmScreen
from sparkconsole.ui.screens.decision import DecisionScreen
from sparkconsole.ui.screens.help import HelpScreen
from sparkconsole.ui.screens.overview import OverviewScreen
from sparkconsole.ui.screens.wizard import WizardEvent, WizardRun, WizardScreen, step_list_text
from sparkconsole.ui.widgets.node_panel import NodePanel
from tests.ui_support import demo_app, started

SIZE = (160, 48)
FIXED_ID = "20260327-174000-ab12"


@pytest.fixture(autouse=True)
def _deterministic(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(poller, "_with_probe_ms", lambda sample, ms: replace(sample, probe_ms=12.0))
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


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


async def open_wizard(pilot, app, **kwargs) -> WizardScreen:
    await started(pilot, app, ticks=2)
    app.install_screen(WizardScreen(**kwargs), "wizard")  # `w` shows the installed one
    await pilot.press("w")
    await pilot.pause()
    assert isinstance(app.screen, WizardScreen)
    return app.screen


# ---- Pilot: the real flow on the demo cluster --------------------------------------------------

async def test_decisions_answered_by_keyboard_through_plan_and_engine(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        wizard = await open_wizard(pilot, app, until="engine")
        panels = {p.node: p.plain_text(44) for p in wizard.query(NodePanel)}
        assert set(panels) == {"spark-1a32", "spark-5be3"}
        assert all("memory" in t and "GiB used" in t and "link" in t and "containers" in t for t in panels.values())
        assert "vllm-glm" in panels["spark-1a32"]

        await pilot.press("enter")
        await until(pilot, app, asking(app, "plan.layout"))
        modal = app.screen
        assert modal.options[0].value == modal.decision.recommended == "tp2"  # recommended first
        assert wizard.run.view("plan").state == "waiting"
        assert wizard.run.view("recon").state == "done"
        await pilot.press("down")
        assert modal.options[modal.index].value != "tp2"
        await pilot.press("1")  # back to the first (recommended) one
        assert modal.index == 0
        await pilot.press("enter")

        await until(pilot, app, asking(app, "engine.image"))
        modal = app.screen
        assert modal.options[0].value == modal.decision.recommended
        assert any(o.experimental and o.value == "sglang" for o in modal.options)
        await pilot.press("enter")

        await until(pilot, app, lambda: not wizard.running and wizard.run.result is not None)
        plan = wizard.run.view("plan")
        assert plan.state == "done"
        assert [(d.id, d.answer, d.by) for d in plan.decisions] == [("plan.layout", "tp2", "operator")]
        engine = wizard.run.view("engine")
        assert [(d.id, d.by) for d in engine.decisions] == [("engine.image", "operator")]
        assert engine.state in ("done", "failed")  # failed while the sim's `docker run` is being rewritten
        assert wizard.run.view("network").state == "pending"  # --until engine
        assert any(c.rc is not None for c in engine.commands)  # the image's Python was run and came back
        saved = StateStore().load(wizard.state.id)
        assert saved.answers["plan.layout"] == "tp2"


async def test_esc_at_a_decision_stops_there_and_enter_asks_again(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        wizard = await open_wizard(pilot, app, until="plan")
        await pilot.press("enter")
        await until(pilot, app, asking(app, "plan.layout"))
        await pilot.press("escape")
        await until(pilot, app, lambda: not wizard.running and wizard.run.result is not None)
        assert app.screen is wizard
        assert wizard.run.view("plan").state == "waiting"
        assert not wizard.run.result.ok
        assert "stopped at a decision in plan" in wizard.result_text().plain
        first_id = wizard.state.id

        await pilot.press("escape")  # back to the overview...
        assert isinstance(app.screen, OverviewScreen)
        await pilot.press("w")  # ...and the same run is there
        assert app.screen is wizard and wizard.state.id == first_id
        await pilot.press("r")  # resume: the same deployment, the decision asked again
        await until(pilot, app, asking(app, "plan.layout"))
        await pilot.press("enter")
        await until(pilot, app, lambda: not wizard.running and wizard.run.result is not None)
        assert wizard.run.result.ok and wizard.state.id == first_id
        assert wizard.run.view("plan").state == "done"


async def test_the_run_goes_on_in_the_background_and_asks_when_the_wizard_is_back(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        wizard = await open_wizard(pilot, app, until="plan")
        await pilot.press("escape")
        assert isinstance(app.screen, OverviewScreen)
        wizard.action_start()  # as if Enter had been pressed just before leaving
        await until(pilot, app, lambda: wizard.run.view("plan").state == "waiting")
        assert isinstance(app.screen, OverviewScreen)  # no dialog over the overview
        assert wizard.running
        assert any("waits for you" in n.message for n in app._notifications)
        await pilot.press("w")
        await until(pilot, app, asking(app, "plan.layout"))
        await pilot.press("enter")
        await until(pilot, app, lambda: not wizard.running)
        assert wizard.run.result is not None and wizard.run.result.ok


async def test_confirm_shows_the_commands_and_auto_stops_asking(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        wizard = await open_wizard(pilot, app)
        wizard.state = DeploymentState(id=FIXED_ID, model=wizard.options.model)
        commands = [("spark-1a32", drop_caches()), ("spark-5be3", drop_caches())]
        task = asyncio.create_task(wizard._confirm("caches", commands))
        await until(pilot, app, lambda: isinstance(app.screen, ConfirmScreen))
        confirm = app.screen
        assert confirm.command_text == "\n".join(f"{n} $ {c.shell()}" for n, c in commands)
        assert "the caches step's 2 commands" in confirm.service
        await pilot.press("y")
        assert await task is True

        await pilot.press("a")
        assert wizard.auto and "AUTO" in wizard.status_text().plain
        assert await wizard._confirm("caches", commands) is True  # no dialog
        d = Decision("caches.drop", "caches", "Drop?", (), (Option("yes", "drop"), Option("no", "leave")), "yes", "")
        assert await wizard._answer(d) == ("yes", "auto")
        assert not isinstance(app.screen, ConfirmScreen | DecisionScreen)


async def test_read_only_plans_and_sends_nothing(tmp_path):
    app = demo_app(tmp_path, read_only=True)
    async with app.run_test(size=SIZE) as pilot:
        wizard = await open_wizard(pilot, app, until="engine", auto=True)
        assert "READ-ONLY" in wizard.status_text().plain
        await pilot.press("enter")
        await until(pilot, app, lambda: not wizard.running and wizard.run.result is not None)
        assert wizard.run.view("plan").state == "done" and wizard.run.view("plan").note == "planned"
        assert [d.by for d in wizard.run.view("plan").decisions] == ["auto"]
        assert read_journal(tmp_path / "journal.jsonl") == []
        assert not (tmp_path / "state" / "deployments").exists()  # plan-only: no state written


async def test_keys_are_in_the_help_and_the_palette_opens_the_wizard(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await started(pilot, app, ticks=1)
        await pilot.press("ctrl+p")
        await pilot.press(*"deploy a model")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, WizardScreen)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        table = app.screen.table_text()
        for ident in ("wizard.start", "wizard.auto", "wizard.teardown", "wizard.back", "app.wizard"):
            assert ident in table
        await pilot.press("escape")
        await pilot.press("t")  # nothing started: teardown says so instead of asking
        await pilot.pause()
        assert any("nothing to tear down" in n.message for n in app._notifications)


def test_events_fold_into_the_view():
    run = WizardRun()
    run.apply(StepEvent("weights", "running"))
    run.apply(CommandEvent("weights", "spark-1a32", "mkdir -p /m", None, "mkdir", True))
    run.apply(CommandEvent("weights", "spark-1a32", "mkdir -p /m", 0, "mkdir", True, 0.2))
    run.apply(ProgressEvent("weights", "spark-1a32", "download", 0.5, "20/39"))
    run.apply(ProgressEvent("weights", "spark-1a32", "download", 0.75, "29/39"))
    view = run.view("weights")
    assert [(c.rc, c.duration_s) for c in view.commands] == [(0, 0.2)]  # sent, then came back: one line
    assert run.progress[("spark-1a32", "download")].fraction == 0.75
    assert run.current == "weights"
    assert "▶ weights" in step_list_text(run, None).plain
    newer = WizardEvent(ProgressEvent("weights", "spark-1a32", "download", 0.8))
    assert newer.can_replace(WizardEvent(ProgressEvent("weights", "spark-1a32", "download", 0.7)))
    assert not newer.can_replace(WizardEvent(ProgressEvent("weights", "spark-5be3", "copy", 0.7)))


# ---- snapshots: recorded events, the demo's live node panels ----------------------------------

HEAD, WORKER = "spark-1a32", "spark-5be3"

BEFORE_PLAN = [
    StepEvent("recon", "running"),
    NoteEvent("recon", "NVIDIA GB10, driver 580.126.09, CUDA 13.0, 12.9/119.7 GiB available, docker 29.2.1 "
                       "(overlay2), 3 images, fast link 192.168.200.12, Hub reachable", node=HEAD),
    NoteEvent("recon", "NVIDIA GB10, driver 580.126.09, CUDA 13.0, 106.6/119.7 GiB available, docker 29.2.1 "
                       "(overlay2), 1 image, fast link 192.168.200.13, Hub not reachable", node=WORKER),
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
    DecisionEvent("free-memory.stop", "Free memory: which services to stop", "spark-1a32:vllm-glm",
                  "spark-1a32:vllm-glm", "the smallest set that makes the plan fit", by="operator"),
    CommandEvent("free-memory", HEAD, "docker stop vllm-glm", 0, "docker stop vllm-glm", True, 11.2),
    StepEvent("free-memory", "done"),
    *_done("caches"), *_done("cluster"),
    StepEvent("serve", "running"),
    CommandEvent("serve", HEAD, "docker exec -d sparkconsole-ray-74000ab12 sh -c 'vllm serve …'", 0,
                 "start vLLM (Ray, TP=2) in sparkconsole-ray-74000ab12", True, 0.4),
    OutputEvent("serve", HEAD, "INFO 03-27 17:52:10 [api_server.py:1351] vLLM API server version 0.17.0"),
    OutputEvent("serve", HEAD, "INFO 03-27 17:52:31 [ray_utils.py:345] Connected to Ray cluster: 2 nodes, 2 GPUs"),
    OutputEvent("serve", HEAD, "Loading safetensors checkpoint shards:  41% Completed | 16/39 [00:38<00:55]"),
    ProgressEvent("serve", HEAD, "weights", 0.41, "16/39 shards"),
]


def _snap(snap_compare, tmp_path, monkeypatch, scene) -> bool:
    app = demo_app(tmp_path)

    async def run_before(pilot) -> None:
        await started(pilot, app, ticks=6)
        wizard = WizardScreen(state=DeploymentState(id=FIXED_ID, model="Qwen/Qwen3.5-122B-A10B-FP8",
                                                    cluster=app.config.name))
        app.install_screen(wizard, "wizard")
        await pilot.press("w")
        await pilot.pause()
        await scene(pilot, app, wizard)
        await pilot.pause(0.2)

    return snap_compare(app, terminal_size=SIZE, run_before=run_before)


async def _at_decision(pilot, app, wizard: WizardScreen) -> None:
    wizard.running = True
    wizard.feed(BEFORE_PLAN)
    await pilot.pause()
    wizard._pending = asyncio.create_task(wizard._answer(PLAN_LAYOUT))  # the runner's own answerer
    await until(pilot, app, asking(app, "plan.layout"))
    await pilot.press("down", "down")  # the "why" follows the highlight


async def _weights_loading(pilot, app, wizard: WizardScreen) -> None:
    wizard.running = True
    wizard.feed(WEIGHTS_LOADING)
    await pilot.pause(0.3)


def test_snapshot_at_the_layout_decision(snap_compare, tmp_path, monkeypatch):
    assert _snap(snap_compare, tmp_path, monkeypatch, _at_decision)


def test_snapshot_while_weights_load(snap_compare, tmp_path, monkeypatch):
    assert _snap(snap_compare, tmp_path, monkeypatch, _weights_loading)
