"""The deployment wizard's screen (``w``) on the demo cluster, driven by keyboard, and its snapshots.

The Pilot tests run the headless flow for real over the demo's SSH and answer with keys:

* the whole story deployment on a running demo (sim time x100, the console polling by itself):
  every decision and every step's confirmation by keyboard, to a served and verified model, with
  the head's node panel seen to lose vllm-glm's memory after free-memory and to show the Ray
  container once it runs;
* an answer other than the recommendation, by number key, recorded as the operator's;
* on a frozen clock (each wait moves sim time on): plan and engine, Esc at a decision and resume,
  a question that waits for the operator to come back, auto, read-only.

The snapshots (and scripts/screenshots) feed the screen recorded deploy events
(tests/wizard_scenes.py) so they do not move when the flow's wording does.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import replace
from pathlib import Path

import pytest

from sparkconsole.deploy.decisions import Decision, Option
from sparkconsole.deploy.events import (
    CommandEvent,
    ProgressEvent,
    StepEvent,
)
from sparkconsole.deploy.state import DeploymentState, StateStore
from sparkconsole.journal import Journal, read_journal
from sparkconsole.probe import poller
from sparkconsole.remote import drop_caches
from sparkconsole.ui.app import DemoOptions, SparkConsoleApp
from sparkconsole.ui.screens.confirm import ConfirmScreen
from sparkconsole.ui.screens.decision import DecisionScreen
from sparkconsole.ui.screens.help import HelpScreen
from sparkconsole.ui.screens.overview import OverviewScreen
from sparkconsole.ui.screens.wizard import (
    StepConfirmScreen,
    WizardEvent,
    WizardRun,
    WizardScreen,
    step_body_text,
    step_list_text,
)
from sparkconsole.ui.widgets.node_card import renderable_text
from sparkconsole.ui.widgets.node_panel import NodePanel
from tests.ui_support import demo_app, started, wait_ready
from tests.wizard_scenes import FIXED_ID, asking, until, wizard_decision, wizard_weights_loading

SIZE = (160, 48)


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


async def open_wizard(pilot, app, **kwargs) -> WizardScreen:
    await started(pilot, app, ticks=2)
    app.install_screen(WizardScreen(**kwargs), "wizard")  # `w` shows the installed one
    await pilot.press("w")
    await pilot.pause()
    assert isinstance(app.screen, WizardScreen)
    return app.screen


# ---- Pilot: the whole deployment on a running demo ----------------------------------------------

LIVE_SPEED = 100.0  # sim seconds per wall second: the story's ~50 sim minutes in about half a minute
LIVE_DEADLINE = 60.0  # per wait, generous for a loaded 2-core machine
LIVE_SIZE = (200, 60)  # the node panels beside the steps


def live_demo_app(tmp_path, scenario: str = "story") -> SparkConsoleApp:
    """The demo on a running sim clock, the console polling every second by itself (panels alive)."""
    return SparkConsoleApp(demo=DemoOptions(nodes=2, scenario=scenario, speed=LIVE_SPEED), interval=1.0,
                           remember_theme=False, journal=Journal(tmp_path / "journal.jsonl"))


async def wait_for(pilot, app, cond, what: str, timeout: float = LIVE_DEADLINE) -> None:
    """Until ``cond`` (the demo's clock runs by itself); fails with what was awaited and the screen."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            raise AssertionError(f"waited {timeout:.0f} s for {what}; screen: {type(app.screen).__name__}")
        await pilot.pause(0.05)


async def stop_polling(pilot, app) -> None:
    """Let the last polls end while the screens are still there (a poll that ends during the app's
    shutdown finds no screen to draw on: app._show_node raises ScreenStackError)."""
    app.autopoll = False
    for timer in app._poll_timers.values():
        timer.stop()
    await app.workers.wait_for_complete()
    await pilot.pause()


def used_gib(panel: NodePanel) -> float | None:
    m = re.search(r"memory ([\d.]+) / [\d.]+ GiB used", panel.plain_text(60))
    return float(m.group(1)) if m else None


def containers_line(panel: NodePanel) -> str:
    text = " ".join(panel.plain_text(200).split())  # one line, whatever the panel's wrapping
    return text[text.find("containers"):]


async def answer_everything(pilot, app, wizard: WizardScreen, keys: dict[str, str] | None = None,
                            at: dict | None = None) -> list[tuple[str, str]]:
    """Answer each question by keyboard as it comes until the run ends: a decision with Enter (after
    the key in ``keys`` for its id, if any), a step's commands with y. ``at[("decision", id)]`` or
    ``at[("confirm", step)]`` is awaited first, with the question on screen. Returns what was asked."""
    keys, at = keys or {}, at or {}
    asked: list[tuple[str, str]] = []

    def question_or_end() -> bool:
        return (isinstance(app.screen, DecisionScreen | StepConfirmScreen)
                or (not wizard.running and wizard.run.result is not None))

    while True:
        await wait_for(pilot, app, question_or_end, f"a question or the end after {asked[-1:] or 'the start'}")
        screen = app.screen
        if isinstance(screen, DecisionScreen):
            asked.append(("decision", screen.decision.id))
        elif isinstance(screen, StepConfirmScreen):
            asked.append(("confirm", screen.step))
        else:
            return asked
        if asked[-1] in at:
            await at[asked[-1]]()
        if asked[-1][0] == "decision":
            if asked[-1][1] in keys:
                await pilot.press(keys[asked[-1][1]])
            await pilot.press("enter")
        else:
            await pilot.press("y")
        await wait_for(pilot, app, lambda s=screen: app.screen is not s, f"{asked[-1]} to close")


async def test_the_whole_story_by_keyboard_with_the_node_panels_alive(tmp_path):
    app = live_demo_app(tmp_path)
    async with app.run_test(size=LIVE_SIZE) as pilot:
        await wait_ready(pilot, app)
        await pilot.press("w")
        await wait_for(pilot, app, lambda: isinstance(app.screen, WizardScreen), "the wizard")
        wizard: WizardScreen = app.screen
        head = next(p for p in wizard.query(NodePanel) if p.node == "spark-1a32")
        await wait_for(pilot, app, lambda: used_gib(head) is not None, "the head's first sample")
        seen: dict[str, object] = {}

        async def before_any_change() -> None:  # the plan.layout question: the old services still run
            seen["used before"] = used_gib(head)
            seen["containers before"] = containers_line(head)

        async def after_free_memory() -> None:
            # the run waits for this answer, so the head stays as free-memory left it; the panel (under
            # the dialog) must show the memory vllm-glm held (85 GiB) gone, and vllm-glm with it (the
            # container list is probed every other poll)
            await wait_for(pilot, app, lambda: used_gib(head) < seen["used before"] - 60
                           and "vllm-glm" not in containers_line(head),
                           "the head's panel to show what free-memory stopped and freed")
            seen["used after"] = used_gib(head)
            seen["containers after"] = containers_line(head)

        await pilot.press("enter")
        asked = await answer_everything(pilot, app, wizard, at={("decision", "plan.layout"): before_any_change,
                                                                ("decision", "caches.drop"): after_free_memory})

        assert [a for a in asked if a[0] == "decision"] == [
            ("decision", d) for d in ("plan.layout", "plan.text-only", "engine.image", "free-memory.stop", "caches.drop",
                                      # stock nodes: what stays cached (root's to drop) re-fits the budget
                                      "caches.fit", "cluster.executor", "serve.access",
                                      # after verify: the benchmark offered (Enter: skip, the recommendation)
                                      "benchmark.run")]
        confirmed = [s for kind, s in asked if kind == "confirm"]
        # (no cluster step's changes: vLLM's native start forms no Ray cluster)
        for step in ("engine", "weights", "images", "free-memory", "caches", "guard", "serve"):
            assert step in confirmed, (step, asked)
        assert asked.index(("decision", "free-memory.stop")) < asked.index(("confirm", "free-memory"))

        result = wizard.run.result
        assert result is not None and result.ok and result.endpoint, wizard.result_text().plain
        assert "served and verified" in wizard.result_text().plain
        states = {s: wizard.run.view(s).state for s in (
            "recon", "plan", "engine", "network", "weights", "images", "free-memory", "caches", "cluster",
            "guard", "serve", "verify")}
        assert set(states.values()) <= {"done", "skipped"}, states
        decisions = {d.id: d for s in states for d in wizard.run.view(s).decisions}
        # each was asked of the operator once (the modals above); after caches.fit sent the flow back
        # to the plan, the ones met again kept that answer ("earlier")
        assert {d.by for d in decisions.values()} <= {"operator", "earlier"}
        assert decisions["cluster.executor"].by == decisions["caches.fit"].by == "operator"
        assert all(d.answer == d.recommended for d in decisions.values() if d.by == "operator")
        assert "spark-1a32:vllm-glm" in decisions["free-memory.stop"].answer
        assert decisions["cluster.executor"].answer == "native"  # the story's GB10 build has no Ray
        # the weights bars of the serve step went to the end
        assert wizard.run.progress[("spark-1a32", "weights")].fraction == 1.0

        # the panels beside: the head lost GLM's 85 GiB after free-memory, its container list changed,
        # and the engine's container with the model's weights (memory up again) shows once it serves
        assert seen["used before"] > 100
        assert "vllm-glm" in seen["containers before"] and "vllm-glm" not in seen["containers after"]
        await wait_for(pilot, app, lambda: "sparkconsole-vllm" in containers_line(head)
                       and used_gib(head) > seen["used after"] + 40, "the head's panel to show the engine")
        saved = StateStore().load(wizard.state.id)
        assert saved.result == "served"
        assert saved.answers["cluster.executor"] == "native"
        await stop_polling(pilot, app)


async def test_an_answer_other_than_the_recommendation_is_the_operators(tmp_path):
    app = live_demo_app(tmp_path)
    async with app.run_test(size=LIVE_SIZE) as pilot:
        await wait_ready(pilot, app)
        await pilot.press("w")
        await wait_for(pilot, app, lambda: isinstance(app.screen, WizardScreen), "the wizard")
        wizard: WizardScreen = app.screen
        wizard.until = "plan"

        async def check_the_highlight() -> None:
            modal = app.screen
            assert modal.options[0].value == "vision" == modal.decision.recommended
            await pilot.press("2")  # a number highlights, it does not answer on its own
            assert app.screen is modal and modal.options[modal.index].value == "text"

        await pilot.press("enter")
        asked = await answer_everything(pilot, app, wizard, keys={"plan.text-only": "2"},
                                        at={("decision", "plan.text-only"): check_the_highlight})
        assert ("decision", "plan.text-only") in asked
        text_only = [d for d in wizard.run.view("plan").decisions if d.id == "plan.text-only"]
        assert [(d.answer, d.recommended, d.by) for d in text_only] == [("text", "vision", "operator")]
        body = renderable_text(step_body_text(wizard.run, "plan"), 160)
        assert "text (operator; recommended vision)" in body
        assert wizard.run.view("plan").state == "done" and wizard.run.view("engine").state == "pending"
        assert StateStore().load(wizard.state.id).answers["plan.text-only"] == "text"
        await stop_polling(pilot, app)


# ---- Pilot: the real flow on a frozen clock ----------------------------------------------------

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
        await until(pilot, app, asking(app, "plan.text-only"))
        assert app.screen.options[0].value == app.screen.decision.recommended == "vision"
        await pilot.press("enter")

        await until(pilot, app, asking(app, "engine.image"))
        modal = app.screen
        assert modal.options[0].value == modal.decision.recommended
        assert any(o.experimental and o.value == "sglang" for o in modal.options)
        await pilot.press("enter")
        # the chosen image's own Python starts a container: a change, confirmed like any other (issue 23 item 10)
        await until(pilot, app, lambda: isinstance(app.screen, StepConfirmScreen) and app.screen.step == "engine")
        assert "--entrypoint python3" in app.screen.command_text
        await pilot.press("y")

        await until(pilot, app, lambda: not wizard.running and wizard.run.result is not None)
        plan = wizard.run.view("plan")
        assert plan.state == "done"
        assert [(d.id, d.answer, d.by) for d in plan.decisions] == [("plan.layout", "tp2", "operator"),
                                                                    ("plan.text-only", "vision", "operator")]
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
        await until(pilot, app, asking(app, "plan.text-only"))
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
        await until(pilot, app, asking(app, "plan.text-only"))
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
        assert [d.by for d in wizard.run.view("plan").decisions] == ["auto", "auto"]  # the layout, text-only
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
        for ident in ("wizard.start", "wizard.auto", "wizard.teardown", "wizard.rehearse", "wizard.back", "app.wizard"):
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


# ---- snapshots: recorded events (tests/wizard_scenes.py), the demo's live node panels ----------

def _snap(snap_compare, tmp_path, scene, size: tuple[int, int] = SIZE) -> bool:
    app = demo_app(tmp_path)

    async def run_before(pilot) -> None:
        await scene(pilot, app)

    return snap_compare(app, terminal_size=size, run_before=run_before)


def test_snapshot_at_the_layout_decision(snap_compare, tmp_path):
    assert _snap(snap_compare, tmp_path, wizard_decision)


def test_snapshot_while_weights_load(snap_compare, tmp_path):
    assert _snap(snap_compare, tmp_path, wizard_weights_loading)


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 60)], ids=["80x24", "120x40", "200x60"])
def test_snapshot_while_weights_load_at(snap_compare, tmp_path, size):
    """The header on one line from 120 columns (the demo's pace in it), the steps beside the step."""
    assert _snap(snap_compare, tmp_path, wizard_weights_loading, size)


async def test_R_rehearses_on_a_twin_and_shows_the_report_without_changing_a_node(tmp_path):
    """Issue 26: ``R`` in the wizard reads the nodes read-only, builds their twin, runs the whole
    deployment there and shows the report; nothing is journaled, no deployment state is written."""
    from sparkconsole.config import state_dir
    from sparkconsole.ui.screens.rehearsal import RehearsalScreen

    app = live_demo_app(tmp_path)
    async with app.run_test(size=LIVE_SIZE) as pilot:
        await wait_ready(pilot, app)
        await pilot.press("w")
        await wait_for(pilot, app, lambda: isinstance(app.screen, WizardScreen), "the wizard")
        before = {n: [c.name for c in app.demo_cluster.sim.containers_on(n)] for n in app.demo_cluster.sim.nodes}
        await pilot.press("R")
        await wait_for(pilot, app, lambda: isinstance(app.screen, RehearsalScreen), "the rehearsal's report",
                       timeout=180)
        report = app.screen
        text = "\n".join(report.lines)
        assert "on a twin of demo-story" in text and "served and verified" in text
        assert "? plan.layout" in text and "docker stop vllm-glm" in text
        assert Path(report.twin_path).is_file() and Path(report.twin_path).parent == state_dir() / "twins"
        after = {n: [c.name for c in app.demo_cluster.sim.containers_on(n)] for n in app.demo_cluster.sim.nodes}
        assert before == after  # the story's services still run: only the twin's were stopped
        assert read_journal(tmp_path / "journal.jsonl") == []
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, WizardScreen)
        await stop_polling(pilot, app)
