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
from tests.ui_support import (  # noqa: E402
    calibration,
    confirm_restart,
    demo_app,
    dense_view,
    engine_view_under_load,
    help_screen,
    link_down,
    node_detail,
    node_down,
    overview,
    planner,
    weights_loading,
)
from tests.wizard_scenes import wizard_decision, wizard_weights_loading  # noqa: E402

OUT = ROOT / "screenshots"
SIZE = (160, 48)


NODES = {"dense-view": 12}  # shots of a bigger cluster than the demo's two Sparks
SHOTS: list[tuple[str, str, Callable[..., Awaitable[None]]]] = [
    ("overview", "story", overview),
    ("dense-view", "story", dense_view),
    ("node-detail", "story", node_detail),
    ("help", "story", help_screen),
    ("node-down", "node-lost", node_down),
    ("link-down", "link-down", link_down),
    ("confirm-restart", "story", confirm_restart),
    ("weights-loading", "story", weights_loading),
    ("planner", "story", planner),
    ("calibration", "healthy", calibration),
    ("wizard-decision", "story", wizard_decision),
    ("wizard-weights-loading", "story", wizard_weights_loading),
    ("engine-view", "story", engine_view_under_load),
]


async def shoot(name: str, scenario: str, steps, tmp: Path) -> Path:
    app = demo_app(tmp, scenario, nodes=NODES.get(name, 2))
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
