"""The canary's miniature, product side: the writer program's text and its event lines, read typed.

The writer (:mod:`sparkconsole.serving.miniature_writer`) is a standalone stdlib program that runs
inside the engine image's own ``python3`` (sent over ssh on stdin, ``python3 - SRC OUT``), so the
console never imports it to run it: it sends its *text* and reads back the ``::miniature:: <phase>
<json>`` lines it prints. Reading is bounded (line length, line count) because the lines come from a
remote process: a runaway or hostile output costs at most :data:`MAX_EVENTS` small objects.

No Textual here: the deploy wizard, the CLI and the tests share it.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

EVENT_PREFIX = "::miniature::"
PHASES = ("config", "plan", "written", "copied", "done")
MAX_LINE_CHARS = 8192  # a done/written line is ~300 chars; a config line a few hundred
MAX_EVENTS = 256  # one config, one plan, a few written, one copied, one done
PROGRAM_FILE = Path(__file__).with_name("miniature_writer.py")


def program_text() -> str:
    """The writer's source, to pipe into the image's ``python3 -`` (read next to this module, so an
    installed wheel carries it as package data like any ``.py``)."""
    return PROGRAM_FILE.read_text(encoding="utf-8")


def remote_command(src: str, out: str, python: str = "python3", *, shard_mb: int | None = None,
                   seed: int | None = None) -> str:
    """The shell command that runs the writer from stdin: ``python3 - SRC OUT [...]``."""
    argv = [python, "-", src, out]
    if shard_mb is not None:
        argv += ["--shard-mb", str(int(shard_mb))]
    if seed is not None:
        argv += ["--seed", str(int(seed))]
    return shlex.join(argv)


@dataclass(frozen=True)
class MiniatureEvent:
    """One ``::miniature::`` line: its phase and its JSON object."""

    phase: str
    data: dict[str, Any]


@dataclass
class MiniatureSummary:
    """What a run's events say, for the wizard's line: done or not, how much was written."""

    done: bool = False
    model_type: str | None = None
    architecture: str | None = None
    tensors: int | None = None
    bytes: int | None = None
    files: list[str] = field(default_factory=list)
    seconds: float | None = None
    error: str | None = None


def parse_event_line(line: str) -> MiniatureEvent | None:
    """The event on ``line``, or ``None`` for any other text (engine noise, a truncated line, bad JSON,
    an unknown phase, an overlong line)."""
    if len(line) > MAX_LINE_CHARS:
        return None
    text = line.strip()
    if not text.startswith(EVENT_PREFIX + " "):
        return None
    rest = text[len(EVENT_PREFIX) + 1:]
    phase, _, payload = rest.partition(" ")
    if phase not in PHASES:
        return None
    try:
        data = json.loads(payload) if payload else {}
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    return MiniatureEvent(phase, data)


def parse_events(lines: Iterable[str] | str) -> list[MiniatureEvent]:
    """Every event in ``lines`` (or one text), in order, at most :data:`MAX_EVENTS` of them."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    events: list[MiniatureEvent] = []
    for line in lines:
        event = parse_event_line(line)
        if event is not None:
            events.append(event)
            if len(events) >= MAX_EVENTS:
                break
    return events


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def summarize(events: Iterable[MiniatureEvent], stderr: str = "", returncode: int | None = None
              ) -> MiniatureSummary:
    """Fold the events (and the writer's stderr line, when it failed) into one summary."""
    s = MiniatureSummary()
    for e in events:
        if e.phase == "config":
            s.model_type = e.data.get("model_type") if isinstance(e.data.get("model_type"), str) else None
            arch = e.data.get("architecture")
            s.architecture = arch if isinstance(arch, str) else None
        elif e.phase == "plan":
            s.tensors, s.bytes = _int(e.data.get("tensors")), _int(e.data.get("bytes"))
        elif e.phase == "written" and isinstance(e.data.get("file"), str):
            s.files.append(e.data["file"])
        elif e.phase == "done":
            s.done = True
            s.tensors = _int(e.data.get("tensors")) or s.tensors
            s.bytes = _int(e.data.get("bytes")) or s.bytes
            sec = e.data.get("seconds")
            s.seconds = float(sec) if isinstance(sec, int | float) and not isinstance(sec, bool) else None
    if returncode not in (None, 0) or (stderr.strip() and not s.done):
        lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
        s.error = (lines[-1][:MAX_LINE_CHARS] if lines else f"miniature writer exited {returncode}")
        s.done = False
    return s
