"""The probe's long-lived GPU readers on a simulated node (issue 25).

The real probe keeps ``nvidia-smi --query-gpu=… -lms N`` (and the compute-apps query) running beside
its shell and answers ``gpu``/``gpu-apps`` from their newest block (:mod:`sparkconsole.probe.script`,
``READER_FUNCS``). The twin answers the protocol in Python (:mod:`sparkconsole.sim.server`), so it
keeps the same readers here: each one is the node's own ``nvidia-smi`` in loop mode, run through its
shell as a background task (one process in the node's table, started once), its lines stamped with
sim time and grouped into blocks the same way (rows within :data:`STRAY_S` of each other), and a
section is answered from a block younger than two intervals. What the node would do on a failure is
done here too: a reader that ends is restarted (counted), one that never printed its header is given
up and the section falls back to the one-shot command, and a reader quiet when empty (no GPU
process) reads as the header alone once it has run two intervals.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from sparkconsole.probe.script import MAX_RESTARTS, READER_BY_NAME, READERS, SECTION_BY_NAME, STRAY_CS, Reader

STRAY_S = STRAY_CS / 100
_INTERVAL = re.compile(r"-lms'? '?([0-9]+)")


def interval_from_command(cmd: str, default_ms: int = 2000) -> int:
    """The readers' interval written into the probe command (``… -lms 2000; }``)."""
    m = _INTERVAL.search(cmd)
    return int(m.group(1)) if m else default_ms


@dataclass
class _Live:
    reader: Reader
    started: float
    task: asyncio.Task[int] | None = None
    header: str | None = None
    block: list[str] = field(default_factory=list)
    block_at: float | None = None
    last_line_at: float = -1e9
    partial: str = ""
    err: str = ""
    restarts: int = 0
    oneshot: bool = False


class SimReaders:
    """The readers of one probe session on one node; ``close()`` when the session ends."""

    def __init__(self, run: Callable[[str, Callable[[str], None], Callable[[str], None]], object],
                 now: Callable[[], float], interval_ms: int) -> None:
        self._run = run  # (command, out, err) -> awaitable exit code, through the node's shell
        self._now = now
        self.interval_s = interval_ms / 1000
        self.interval_ms = interval_ms
        self._live: dict[str, _Live] = {}

    def _start(self, live: _Live) -> None:
        live.started = self._now()
        live.partial = ""

        def out(text: str) -> None:
            text = live.partial + text
            *lines, live.partial = text.split("\n")
            for line in lines:
                t = self._now()
                if live.header is None:
                    live.header = line
                    continue
                if live.block_at is None or t - live.last_line_at > STRAY_S:
                    live.block, live.block_at = [line], t
                else:
                    live.block.append(line)
                live.last_line_at = t

        def err(text: str) -> None:
            if not live.err:
                live.err = text.splitlines()[0] if text.strip() else ""

        live.task = asyncio.ensure_future(self._run(live.reader.shell(self.interval_ms), out, err))

    def _keep(self, name: str) -> _Live | None:
        live = self._live.get(name)
        if live is None:
            live = self._live[name] = _Live(READER_BY_NAME[name], self._now())
            self._start(live)
            return live
        if live.oneshot:
            return None
        if live.task is not None and live.task.done():
            if not live.header or live.restarts >= MAX_RESTARTS:
                live.oneshot = True
                return None
            live.restarts += 1
            self._start(live)
        return live

    def show(self, section: str) -> str | None:
        """The text of ``section`` from its reader, or None (the one-shot command answers)."""
        name = SECTION_BY_NAME[section].reader
        live = self._keep(name) if name else None
        if live is None or not live.header:
            return None
        now = self._now()
        if live.block_at is not None and now - live.block_at <= 2 * self.interval_s:
            return live.header + "\n" + "".join(line + "\n" for line in live.block)
        if live.reader.quiet_when_empty and now - live.started > 2 * self.interval_s:
            return live.header + "\n"
        return None

    def state_text(self) -> str:
        """The ``readers`` section, as the probe prints it."""
        lines = []
        now = self._now()
        for r in READERS:
            live = self._live.get(r.name)
            if live is None:
                state, age, restarts, why = "idle", "", 0, ""
            else:
                state = ("oneshot" if live.oneshot else "dead" if live.task is not None and live.task.done()
                         else "running")
                age = "" if live.block_at is None else str(int((now - live.block_at) * 1000))
                restarts, why = live.restarts, live.err
            lines.append(f"{r.name} state={state} restarts={restarts} age_ms={age} pid= why={why}\n")
        return "".join(lines)

    async def close(self) -> None:
        for live in self._live.values():
            if live.task is not None and not live.task.done():
                live.task.cancel()
                with contextlib.suppress(BaseException):
                    await live.task
