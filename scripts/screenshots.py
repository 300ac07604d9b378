"""Regenerate screenshots/*.svg from the demo cluster (run: ./scripts/screenshots).

Each shot drives the real console on the simulated two-Spark cluster through the real SSH
transport, with the same reproducible clocks as the snapshot tests, and saves what the screen
shows at 160×48.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sparkconsole.probe import poller  # noqa: E402
from tests.ui_support import demo_app, poll_ticks, run_actions, started, wait_ready  # noqa: E402

OUT = ROOT / "screenshots"
SIZE = (160, 48)


async def overview(pilot, app) -> None:
    await started(pilot, app, ticks=12)


async def node_detail(pilot, app) -> None:
    await started(pilot, app, ticks=8)
    await pilot.press("1")
    await app.workers.wait_for_complete()  # the configured units are read on open
    await pilot.pause()


async def help_screen(pilot, app) -> None:
    await started(pilot, app, ticks=4)
    await pilot.press("question_mark")
    await pilot.pause()


async def node_down(pilot, app) -> None:
    await wait_ready(pilot, app)
    for p in app.poller.pollers.values():
        p.tick_timeout = 0.5
    await poll_ticks(pilot, app, ticks=8)
    app.demo.sim_clock.advance(30)
    await poll_ticks(pilot, app, ticks=3)


async def link_down(pilot, app) -> None:
    await started(pilot, app, ticks=8)


async def confirm_restart(pilot, app) -> None:
    await started(pilot, app, ticks=4)
    await pilot.press("1")
    await pilot.pause()
    table = app.screen.query_one("#containers-table")
    for row in range(table.row_count):
        if table.get_row_at(row)[0] == "vllm-glm":
            table.move_cursor(row=row)
    await pilot.press("R")
    await pilot.pause(0.2)


async def weights_loading(pilot, app) -> None:
    await confirm_restart(pilot, app)
    await pilot.press("y")
    await run_actions(pilot, app)
    app.clear_notifications()
    await pilot.press("l")
    await pilot.pause(0.3)
    screen = app.screen
    for _ in range(600):
        r = screen.tracker.report
        if r.shards_total and r.shards_done is not None and r.shards_done / r.shards_total >= 0.4:
            break
        app.demo.sim_clock.advance(0.25)
        await pilot.pause(0.01)
    await pilot.pause(0.2)


async def planner(pilot, app) -> None:
    await started(pilot, app, ticks=2)
    await pilot.press("m")
    await pilot.pause(0.2)
    await app.workers.wait_for_complete()
    await pilot.pause(0.2)


SHOTS: list[tuple[str, str, Callable[..., Awaitable[None]]]] = [
    ("overview", "story", overview),
    ("node-detail", "story", node_detail),
    ("help", "story", help_screen),
    ("node-down", "node-lost", node_down),
    ("link-down", "link-down", link_down),
    ("confirm-restart", "story", confirm_restart),
    ("weights-loading", "story", weights_loading),
    ("planner", "story", planner),
]


async def shoot(name: str, scenario: str, steps, tmp: Path) -> Path:
    app = demo_app(tmp, scenario)
    async with app.run_test(size=SIZE) as pilot:
        await steps(pilot, app)
        app.save_screenshot(filename=f"{name}.svg", path=str(OUT))
    return OUT / f"{name}.svg"


def main() -> int:
    os.environ["TZ"] = "UTC"
    time.tzset()
    poller._with_probe_ms = lambda sample, ms: replace(sample, probe_ms=12.0)  # a stable number on screen
    OUT.mkdir(exist_ok=True)
    only = set(sys.argv[1:])
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["SPARKCONSOLE_STATE_DIR"] = str(Path(tmp) / "state")
        for name, scenario, steps in SHOTS:
            if only and name not in only:
                continue
            path = asyncio.run(shoot(name, scenario, steps, Path(tmp)))
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
