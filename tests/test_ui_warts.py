"""The console's rough edges, each pinned by a test that drives the app with Textual's pilot.

* the demo console's wizard runs a deployment at ``sparkconsole deploy --demo``'s pace and says so;
* a step's confirmation shows what each command does first, the exact commands on ``c``;
* a teardown confirmation names each node's command once;
* the node detail opens at its top and scrolls with PageUp, Home and Up;
* a step that ran keeps its state when a later loop of the flow skips it;
* ``q`` asks before leaving a running deployment; Ctrl+C's hint is not raw markup;
* the command palette lists the console's own commands before anything is typed.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest

from sparkconsole.journal import Journal
from sparkconsole.probe import poller
from sparkconsole.ui.app import DemoOptions, SparkConsoleApp
from sparkconsole.ui.screens.decision import DecisionScreen
from sparkconsole.ui.screens.wizard import StepConfirmScreen, WizardScreen


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


# ---- the demo console's wizard runs at the CLI demo's pace -------------------------------------

SERVED_WITHIN_S = 180.0  # wall seconds, whatever the sim's clock says


async def test_the_demo_consoles_wizard_serves_within_three_minutes_with_its_default_keys(tmp_path):
    """The console as ``sparkconsole --demo`` opens it (its clock running, its default options): w,
    Enter, then Enter at every decision and y at every step's commands, until "served"."""
    app = SparkConsoleApp(demo=DemoOptions(), interval=1.0, remember_theme=False,
                          journal=Journal(tmp_path / "journal.jsonl"))
    async with app.run_test(size=(200, 60)) as pilot:
        loop = asyncio.get_running_loop()
        end = loop.time() + SERVED_WITHIN_S

        async def until(cond, what: str) -> None:
            while not cond():
                assert loop.time() < end, f"not {what} within {SERVED_WITHIN_S:.0f} s of wall time"
                await pilot.pause(0.05)

        await until(lambda: app.poller is not None and type(app.screen).__name__ == "OverviewScreen", "started")
        await pilot.press("w")
        await until(lambda: isinstance(app.screen, WizardScreen), "in the wizard")
        wizard: WizardScreen = app.screen
        assert "demo x40" in wizard.status_text().plain.replace("\u00a0", " ")  # the header says the pace
        await pilot.press("enter")
        await until(lambda: wizard.running, "running")
        while True:
            await until(lambda: isinstance(app.screen, DecisionScreen | StepConfirmScreen)
                        or (not wizard.running and wizard.run.result is not None), "asked or ended")
            screen = app.screen
            if isinstance(screen, DecisionScreen):
                await pilot.press("enter")
            elif isinstance(screen, StepConfirmScreen):
                await pilot.press("y")
            else:
                break
            await until(lambda s=screen: app.screen is not s, "answered")
        result = wizard.run.result
        assert result is not None and result.ok and result.endpoint, wizard.result_text().plain
        assert app.demo_cluster.clock.speed == app.demo.speed  # the overview's pace again after the run
        app.autopoll = False
        for timer in app._poll_timers.values():
            timer.stop()
        await app.workers.wait_for_complete()
        await pilot.pause()


# ---- confirmations: what each command does first, the exact commands on c; teardown asks once ----

from sparkconsole.deploy.state import DeploymentState, Started  # noqa: E402
from sparkconsole.remote import docker_rm_force, drop_caches  # noqa: E402
from sparkconsole.ui.screens.confirm import ConfirmScreen  # noqa: E402
from tests.test_node_text import screen_text  # noqa: E402
from tests.ui_support import demo_app, holds, started  # noqa: E402
from tests.wizard_scenes import until  # noqa: E402


async def open_wizard(pilot, app, **kwargs) -> WizardScreen:
    await started(pilot, app, ticks=2)
    app.install_screen(WizardScreen(**kwargs), "wizard")
    await pilot.press("w")
    await holds(pilot, lambda: isinstance(app.screen, WizardScreen), "the wizard")
    return app.screen


async def test_a_steps_confirmation_says_what_each_command_does_and_shows_the_commands_on_c(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        wizard = await open_wizard(pilot, app)
        caches, rm = drop_caches(), docker_rm_force("vllm-glm")
        asked = asyncio.ensure_future(wizard._confirm("free-memory", [("spark-1a32", caches), ("spark-5be3", rm)]))
        await holds(pilot, lambda: isinstance(app.screen, StepConfirmScreen), "the step's confirmation")
        text = screen_text(app)
        assert caches.summary.split(" (")[0] in text and "remove vllm-glm" in text  # what each does
        assert "/proc/sys/vm/drop_caches" not in text.replace(caches.summary, "")  # not the plumbing
        assert "docker rm -f" not in text
        await pilot.press("c")
        await pilot.pause()
        text = screen_text(app)
        assert "docker rm -f vllm-glm" in text and "These commands will run on 2 nodes" in text
        await pilot.press("c")  # and back
        await pilot.pause()
        assert "docker rm -f" not in screen_text(app)
        await pilot.press("n")
        assert await asked is False


async def test_teardown_asks_once_and_names_each_nodes_command(tmp_path):
    app = demo_app(tmp_path)
    head = "spark-1a32"
    state = DeploymentState(id="20260327-174000-ab12", model="Qwen/Qwen3.5-122B-A10B-FP8", cluster="demo-story",
                            started=[Started(head, "container", "vllm-glm")])
    async with app.run_test(size=(160, 48)) as pilot:
        wizard = await open_wizard(pilot, app, state=state)
        asked: list[ConfirmScreen] = []
        await pilot.press("t")
        while True:
            await until(pilot, app, lambda: (isinstance(app.screen, ConfirmScreen) and app.screen not in asked)
                        or (not wizard.running and wizard.run.result is not None))
            if not isinstance(app.screen, ConfirmScreen):
                break
            asked.append(app.screen)
            text = screen_text(app)
            await pilot.press("y")
            await until(pilot, app, lambda s=asked[-1]: app.screen is not s)
        assert len(asked) == 1, [type(s).__name__ for s in asked]
        assert isinstance(asked[0], StepConfirmScreen) and asked[0].step == "teardown"
        assert "This command" not in text and "remove vllm-glm" in text
        assert wizard.run.result is not None and wizard.run.result.ok, wizard.result_text().plain


# ---- the node detail opens at its top, pages with the keys, fits a small terminal ----------------

from tests.ui_support import node_detail  # noqa: E402


def _lines(app) -> list[str]:
    return screen_text(app).splitlines()


def _memory_bar_whole(app) -> bool:
    """The line under "Unified memory" is the bar, and the legend follows it (a wrapped bar pushes
    its rest onto a line of its own)."""
    lines = _lines(app)
    at = next(i for i, line in enumerate(lines) if "Unified memory" in line)
    return "█" in lines[at + 1] and "GPU procs" in lines[at + 2]


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_the_node_detail_opens_at_the_top_and_pages_back_to_the_card(tmp_path, size):
    app = demo_app(tmp_path)
    async with app.run_test(size=size) as pilot:
        await node_detail(pilot, app)
        detail = app.screen.query_one("#detail")
        assert detail.scroll_y == 0 and "spark-1a32 · head" in screen_text(app)
        assert _memory_bar_whole(app)
        assert detail.max_scroll_y > 0  # the services are below: there is somewhere to page to
        await pilot.press("end")
        await holds(pilot, lambda: detail.scroll_y == detail.max_scroll_y, "the bottom")
        await pilot.press("home")
        await holds(pilot, lambda: detail.scroll_y == 0, "the top again (Home)")
        await pilot.press("pagedown")
        await holds(pilot, lambda: detail.scroll_y > 0, "a page down")
        for _ in range(10):
            if detail.scroll_y == 0:
                break
            await pilot.press("pageup")
            await pilot.pause()
        assert detail.scroll_y == 0  # PageUp
        await pilot.press("end")
        await holds(pilot, lambda: detail.scroll_y == detail.max_scroll_y, "the bottom")
        for _ in range(12):  # Up walks the rows to the first, then scrolls the detail up
            if detail.scroll_y == 0:
                break
            await pilot.press("up")
            await pilot.pause()
        assert detail.scroll_y == 0 and "spark-1a32 · head" in screen_text(app)


# ---- a step that ran keeps its state when a later loop skips it ---------------------------------

from sparkconsole.deploy.events import StepEvent  # noqa: E402
from sparkconsole.ui.screens.wizard import WizardRun, step_list_text  # noqa: E402


def test_a_step_that_ran_stays_done_when_a_later_loop_skips_it():
    run = WizardRun()
    for step in ("weights", "images"):
        run.apply(StepEvent(step, "running"))
        run.apply(StepEvent(step, "done"))
    run.apply(StepEvent("caches", "running"))
    run.apply(StepEvent("caches", "done"))
    run.apply(StepEvent("plan", "running"))  # the caches step sent the flow back to plan
    run.apply(StepEvent("plan", "done"))
    run.apply(StepEvent("weights", "skipped", "already here"))
    run.apply(StepEvent("images", "skipped", "already here"))
    listed = step_list_text(run, None).plain
    assert run.view("weights").state == "done" and run.view("images").state == "done"
    assert "skipped" not in listed
    run.apply(StepEvent("network", "skipped", "one node"))  # a step that never ran shows skipped
    assert run.view("network").state == "skipped"


# ---- q asks before leaving a running deployment; Ctrl+C's hint is words --------------------------

from sparkconsole.ui.screens.quit import QuitScreen  # noqa: E402


async def test_q_asks_before_it_leaves_a_running_deployment(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=(160, 48)) as pilot:
        wizard = await open_wizard(pilot, app, auto=True)  # no question in the way: the run goes on
        await pilot.press("enter")
        await holds(pilot, lambda: wizard.running, "the run started")  # the clock is frozen: it waits there
        assert app.deployment_running()
        await pilot.press("q")
        await holds(pilot, lambda: isinstance(app.screen, QuitScreen), "the quit question")
        assert "detached work" in screen_text(app)
        await pilot.press("n")
        await holds(pilot, lambda: not isinstance(app.screen, QuitScreen), "the question closed")
        assert app.return_code is None and app.deployment_running()
        await pilot.press("q")
        await holds(pilot, lambda: isinstance(app.screen, QuitScreen), "the quit question again")
        await pilot.press("y")
        await holds(pilot, lambda: app.return_code is not None, "the console quit")


async def test_q_quits_at_once_when_nothing_runs(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot, app, ticks=1)
        await pilot.press("q")
        await holds(pilot, lambda: app.return_code is not None, "the console quit")


async def test_ctrl_c_says_how_to_quit_in_words(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot, app, ticks=1)
        await pilot.press("ctrl+c")
        await holds(pilot, lambda: any("to quit" in n.message for n in app._notifications), "the hint")
        hint = next(n for n in app._notifications if "to quit" in n.message)
        assert "[" not in hint.message and "q" in hint.message.split()


# ---- the palette lists the console's own commands first -------------------------------------------


async def test_the_palette_lists_the_consoles_commands_before_anything_is_typed(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await started(pilot, app, ticks=1)
        await pilot.press("ctrl+p")
        await holds(pilot, lambda: "Memory planner" in screen_text(app) and "Go to node spark-1a32" in screen_text(app),
                    "the console's commands in the palette's first list", timeout=20)


# ---- the wizard's header fits one line at 120 columns ---------------------------------------------

from tests.wizard_scenes import wizard_weights_loading  # noqa: E402


async def test_the_wizard_header_is_one_line_at_120_columns(tmp_path):
    app = demo_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await wizard_weights_loading(pilot, app)
        status = app.screen.query_one("#wizard-status")
        assert status.size.height == 1, status.render()
        assert "demo x40" in screen_text(app).replace("\u00a0", " ")
