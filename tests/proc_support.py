"""Helpers for tests that run sparkconsole as a separate process and read what it prints."""

from __future__ import annotations

import queue
import threading


def line_reader(stream) -> queue.Queue[str | None]:
    """Lines of ``stream`` in a queue as they come (``None`` at its end), read on a daemon thread so
    a test can wait with a deadline instead of blocking on ``readline``."""
    q: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in stream:
            q.put(line)
        q.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return q


def processes_with(marker: str) -> list:
    """The live processes (psutil) whose command line contains ``marker``."""
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if marker in " ".join(p.info["cmdline"] or []):
                found.append(p)
        except psutil.Error:
            pass
    return found


async def wait_until(pred, timeout: float = 5.0, step: float = 0.05) -> bool:
    """Poll ``pred`` until it holds or ``timeout`` seconds pass; its last value."""
    import asyncio
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        await asyncio.sleep(step)
    return bool(pred())
