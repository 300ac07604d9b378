"""The console, instrumented from outside, for ``benchmarks/ui_cost.py``; or the no-draw baseline.

``python -m benchmarks.ui_console --stats FILE -- <sparkconsole args>`` runs the real console
(``sparkconsole.cli.main``) with two wrappers installed before it starts, so the product code
carries no benchmark hooks:

* every Textual frame (``Screen._on_timer_update``: layout when needed, compositor, write to the
  terminal) is timed;
* every node poll (``NodePoller.poll_once``) is counted with its end time.

On exit it writes ``{"frames": [[end, seconds], ...], "polls": [end, ...]}`` to FILE.

``python -m benchmarks.ui_console --poll-only CONFIG --seconds S --stats FILE`` is the baseline:
the same pollers on the same connections at the same interval (a poll, then the interval, as the
console's self-rescheduling workers do), parsing every sample, drawing nothing. It writes the
same file plus its own CPU seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import sys
import time
from pathlib import Path

FRAMES: list[tuple[float, float]] = []
POLLS: list[float] = []


def _instrument() -> None:
    from textual.screen import Screen

    from sparkconsole.probe.poller import NodePoller

    frame = Screen._on_timer_update

    def timed_frame(self: Screen) -> None:
        start = time.perf_counter()
        frame(self)
        FRAMES.append((time.time(), time.perf_counter() - start))

    Screen._on_timer_update = timed_frame  # type: ignore[method-assign]
    poll = NodePoller.poll_once

    async def counted_poll(self: NodePoller):
        state = await poll(self)
        POLLS.append(time.time())
        return state

    NodePoller.poll_once = counted_poll  # type: ignore[method-assign]


def _write(path: Path, extra: dict | None = None) -> None:
    data = {"frames": FRAMES, "polls": POLLS, **(extra or {})}
    path.write_text(json.dumps(data))


async def _poll_only(config_path: str, seconds: float, interval: float) -> None:
    from sparkconsole.config import load_config
    from sparkconsole.probe.poller import ClusterPoller

    config = load_config(config_path)
    cluster = ClusterPoller(config, interval=interval)
    end = time.monotonic() + seconds

    async def loop(poller) -> None:
        while time.monotonic() < end:
            await poller.poll_once()
            await asyncio.sleep(interval)

    try:
        await asyncio.gather(*(loop(p) for p in cluster.pollers.values()))
    finally:
        await cluster.close()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, rest = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="benchmarks.ui_console")
    p.add_argument("--stats", required=True, type=Path)
    p.add_argument("--poll-only", metavar="CONFIG")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--interval", type=float, default=1.0)
    args = p.parse_args(argv)
    _instrument()
    if args.poll_only:
        cpu0, t0 = time.process_time(), time.time()
        asyncio.run(_poll_only(args.poll_only, args.seconds, args.interval))
        _write(args.stats, {"cpu_s": time.process_time() - cpu0, "start": t0, "end": time.time()})
        return 0
    atexit.register(_write, args.stats)
    from sparkconsole.cli import main as console_main

    return console_main(rest)


if __name__ == "__main__":
    sys.exit(main())
