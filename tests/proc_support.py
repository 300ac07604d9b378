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
