"""Helpers for UI tests: the console on the demo cluster, reproducibly.

The sim runs on a manual clock and the console on a frozen wall clock; the tests drive every
poll themselves (``autopoll=False``), advancing sim time between polls, so the history, the ages
and every number on screen are the same on every run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from textual.app import App, ComposeResult
from textual.screen import Screen
from textual.widgets import Static

from sparkconsole.journal import Journal
from sparkconsole.sim.clock import SimClock
from sparkconsole.ui.app import DemoOptions, SparkConsoleApp

WALL = 1_774_700_000.0


class Host(App[None]):
    """A bare app that pushes one screen on mount and keeps what it was dismissed with."""

    def __init__(self, make: Callable[[], Screen]) -> None:
        super().__init__()
        self.make = make
        self.results: list[object] = []

    def compose(self) -> ComposeResult:
        yield Static("host app underneath")

    def on_mount(self) -> None:
        self.push_screen(self.make(), callback=self.results.append)


class FrozenClock:
    """A wall clock that only moves when told to."""

    def __init__(self, t: float = WALL) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def demo_app(tmp_path, scenario: str = "story", *, read_only: bool = False, nodes: int = 2) -> SparkConsoleApp:
    return SparkConsoleApp(
        demo=DemoOptions(nodes=nodes, scenario=scenario, sim_clock=SimClock.frozen(), read_only=read_only),
        clock=FrozenClock(),
        remember_theme=False,
        journal=Journal(tmp_path / "journal.jsonl"),
        autopoll=False,
    )


# How long a tick the test drives waits for its node's answer. The tests set the pace, not the
# console's interval: on a busy machine twelve SSH handshakes and probes can take longer than one
# interval, and a tick that gave up early would draw a gap, a "connecting", a different picture.
PATIENCE_S = 120.0


async def wait_ready(pilot, app: SparkConsoleApp, timeout: float = 120.0) -> None:
    """Until the demo runs and the overview is up; from then on every tick the test drives waits
    for its answer (``PATIENCE_S``), whatever the speed of the machine."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while app.poller is None or not app.screen_stack or type(app.screen).__name__ != "OverviewScreen":
        if loop.time() > end:
            raise TimeoutError("the console did not start")
        await pilot.pause(0.05)
    for p in app.poller.pollers.values():
        p.patience = PATIENCE_S


def expect_silence(app: SparkConsoleApp, node: str, wait: float = 0.5) -> None:
    """``node`` is about to stop answering: its ticks give up after ``wait`` seconds. An answer that
    never comes is missed whatever the machine's speed; every other node keeps waiting for its own."""
    assert app.poller is not None
    app.poller.pollers[node].patience = wait


async def poll_ticks(pilot, app: SparkConsoleApp, ticks: int = 6, step: float = 2.0,
                     nodes: list[str] | None = None) -> None:
    """``ticks`` polls of every node (or ``nodes``), ``step`` sim seconds apart."""
    assert app.poller is not None and app.demo is not None
    sim_clock: SimClock = app.demo.sim_clock
    names = nodes or list(app.poller.pollers)
    for _ in range(ticks):
        await asyncio.gather(*(app.poller.pollers[n].poll_once() for n in names))
        sim_clock.advance(step)
        if isinstance(app.clock, FrozenClock):
            app.clock.advance(step)  # wall time passes with sim time
        app._tick_ages()
    await pilot.pause()


async def started(pilot, app: SparkConsoleApp, ticks: int = 6) -> None:
    await wait_ready(pilot, app)
    await poll_ticks(pilot, app, ticks)


async def run_actions(pilot, app: SparkConsoleApp, step: float = 0.5, limit: int = 200) -> None:
    """Let running service actions finish, moving sim time on (a docker stop takes sim time)."""
    for _ in range(limit):
        busy = [w for w in app.workers if w.group == "service-action" and not w.is_finished]
        if not busy:
            return
        app.demo.sim_clock.advance(step)
        await pilot.pause(0.02)
    raise TimeoutError("a service action did not finish")


async def settle_log(pilot, screen, rounds: int = 40) -> None:
    """Wait until the followed log stops growing (lines printed so far have arrived)."""
    last = -1
    for _ in range(rounds):
        await pilot.pause(0.01)
        if len(screen.buffer) == last:
            return
        last = len(screen.buffer)


async def screen_is(pilot, app: SparkConsoleApp, name: str, timeout: float = 120.0) -> Screen:
    """Until the screen on top is the one called ``name`` (a key opened it): a condition, not a
    pause, so a busy machine draws the same picture as an idle one."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while type(app.screen).__name__ != name:
        if loop.time() > end:
            raise TimeoutError(f"{name} did not open; on top: {type(app.screen).__name__}")
        await pilot.pause(0.02)
    await pilot.pause()
    return app.screen


async def holds(pilot, cond: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    """Until ``cond()`` holds; ``what`` names it when it never does (a guard, not a pace)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            raise TimeoutError(f"not reached: {what}")
        await pilot.pause(0.02)
    await pilot.pause()


# ---- scenes: the screens the snapshot tests check and scripts/screenshots saves ------------

async def overview(pilot, app) -> None:
    await started(pilot, app, ticks=12)


async def dense_view(pilot, app) -> None:
    """Many nodes: the overview shows one row per node by itself, sorted by unified memory."""
    await started(pilot, app, ticks=12)
    await pilot.press("s", "s", "s")  # node -> status -> gpu -> memory
    await pilot.pause()


async def node_detail(pilot, app) -> None:
    await started(pilot, app, ticks=8)
    await pilot.press("1")
    screen = await screen_is(pilot, app, "NodeDetailScreen")
    # the configured units are read by a worker the screen starts on open: wait for them in the table
    # (waiting for the app's workers raced that start on a busy machine and drew the table without them)
    want = len(app.config.services)
    table = screen.query_one("#containers-table")
    await holds(pilot, lambda: len(screen.units) == want and table.row_count >= want,
                "the configured units in the services table")


async def help_screen(pilot, app) -> None:
    await started(pilot, app, ticks=4)
    await pilot.press("question_mark")
    await pilot.pause()


async def node_down(pilot, app) -> None:
    await started(pilot, app, ticks=8)
    expect_silence(app, app.config.nodes[-1].name)  # the node-lost scenario's last node
    app.demo.sim_clock.advance(30)
    await poll_ticks(pilot, app, ticks=3)


async def node_stale(pilot, app) -> None:
    await started(pilot, app, ticks=8)
    expect_silence(app, app.config.nodes[-1].name)
    app.demo.sim_clock.advance(30)  # the worker stops answering
    await poll_ticks(pilot, app, ticks=1)


async def link_down(pilot, app) -> None:
    await started(pilot, app, ticks=8)


async def confirm_restart(pilot, app) -> None:
    await started(pilot, app, ticks=4)
    await pilot.press("1")
    await app.workers.wait_for_complete()
    await pilot.pause()
    table = app.screen.query_one("#containers-table")
    for row in range(table.row_count):
        if str(table.get_row_at(row)[0]) == "vllm-glm":  # a Text cell (node text is never markup)
            table.move_cursor(row=row)
    await pilot.press("R")
    await screen_is(pilot, app, "ConfirmScreen")


async def weights_loading(pilot, app) -> None:
    await confirm_restart(pilot, app)
    await pilot.press("y")
    await run_actions(pilot, app)
    app.clear_notifications()
    await pilot.press("l")
    screen = await screen_is(pilot, app, "LogScreen")
    for _ in range(600):
        r = screen.tracker.report
        if r.shards_total and r.shards_done is not None and r.shards_done / r.shards_total >= 0.4:
            break
        app.demo.sim_clock.advance(0.25)
        await settle_log(pilot, screen)
    await pilot.pause(0.2)


def steady_cursors(app) -> None:
    """Inputs show their cursor without blinking: a blinking one is drawn or not by the wall clock."""
    from textual.widgets import Input

    for field in app.screen.query(Input):
        field.cursor_blink = False


async def planner(pilot, app) -> None:
    await started(pilot, app, ticks=2)
    await pilot.press("m")
    await screen_is(pilot, app, "PlannerScreen")
    await app.workers.wait_for_complete()
    steady_cursors(app)
    await pilot.pause(0.2)


async def calibration(pilot, app) -> None:
    """The demo head's 122B TP=2 start (the sim's vLLM 0.17 log, tests/test_planner_sim.py) followed
    from its last lines, and ``c``: the planner beside the log, re-planned at 262,144 tokens."""
    from sparkconsole.logs.follow import LogLine
    from sparkconsole.ui.screens.logs import LogScreen
    from tests.test_planner_sim import _tp2_log

    await started(pilot, app, ticks=2)
    log = await _tp2_log(65_536)

    async def tail():
        for line in log.splitlines()[-12:]:
            yield LogLine(line)

    async def start() -> str:
        return log

    app.push_screen(LogScreen(app.config.nodes[0].name, "vllm-qwen3.5-122b", tail, start_reader=start))
    screen = await screen_is(pilot, app, "LogScreen")
    await holds(pilot, lambda: len(screen.buffer) >= 12 and screen.tracker.report.vllm_version is not None,
                "the tail and the start of the log read")
    await pilot.press("c")
    cal = await screen_is(pilot, app, "CalibrationScreen")
    await holds(pilot, lambda: cal.calibration is not None, "the calibration computed")
    cal.query_one("#cal-mml").value = "262144"
    await pilot.press("enter")
    await holds(pilot, lambda: cal.calibration is not None and cal.calibration.replan is not None, "the re-plan")
    steady_cursors(app)
    await pilot.pause(0.2)


async def engine_view_under_load(pilot, app) -> None:
    """The head's engine view while ``vllm bench serve`` runs in ``vllm-glm`` at concurrency 8: the
    twin's engine counts every request the benchmark sends, and the console reads it every third
    tick (the README's picture of the engine view)."""
    from sparkconsole.sim.shell import Shell

    await started(pilot, app, ticks=12)
    head = app.config.nodes[0].name
    bench = ("docker exec vllm-glm vllm bench serve --backend openai-chat --base-url http://127.0.0.1:8000 "
             "--endpoint /v1/chat/completions --model glm-4.7-flash --tokenizer GadflyII/GLM-4.7-Flash-NVFP4 "
             "--dataset-name random --random-input-len 1024 --random-output-len 256 --num-prompts 64 "
             "--max-concurrency 8")
    task = asyncio.ensure_future(Shell(app.demo_cluster.sim, head).capture(bench))
    await poll_ticks(pilot, app, ticks=15)
    await pilot.press("1")
    await screen_is(pilot, app, "NodeDetailScreen")
    await pilot.press("e")
    screen = await screen_is(pilot, app, "EngineScreen")
    await poll_ticks(pilot, app, ticks=3)
    await holds(pilot, lambda: screen.focused is not None, "an engine focused")
    task.cancel()
