"""What a deployment run says while it works: one typed event stream for every face of it.

The runner emits these; the TUI wizard screen, the plain CLI printer and ``--json`` all read the
same stream, so what the operator sees in one is what a script gets from the other. Every event
turns into one JSON object (:meth:`to_json`) with an ``event`` key.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

StepState = Literal["pending", "running", "done", "skipped", "failed", "waiting"]


@dataclass(frozen=True)
class Event:
    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["event"] = self.kind
        return data

    kind = "event"


@dataclass(frozen=True)
class StepEvent(Event):
    """A step changed state; ``note`` says why in words (what was skipped, what failed)."""

    step: str
    state: StepState
    note: str = ""
    kind = "step"


@dataclass(frozen=True)
class CommandEvent(Event):
    """A command was sent (``rc`` None) or came back (``rc`` its exit code, -1: never finished)."""

    step: str
    node: str
    command: str
    rc: int | None = None
    summary: str = ""
    mutating: bool = False
    duration_s: float | None = None
    output: str = ""  # the tail of what it printed, when it failed
    kind = "command"


@dataclass(frozen=True)
class ProgressEvent(Event):
    """Long work on a node moved on: a download, a copy, weights loading."""

    step: str
    node: str
    label: str
    fraction: float | None = None
    detail: str = ""
    kind = "progress"


@dataclass(frozen=True)
class OutputEvent(Event):
    """Lines worth showing as they come (the engine's log while it starts)."""

    step: str
    node: str
    text: str
    kind = "output"


@dataclass(frozen=True)
class NoteEvent(Event):
    """A finding in words: what recon read, what a check saw, what was decided for the operator."""

    step: str
    text: str
    level: Literal["info", "warning", "error"] = "info"
    node: str = ""
    kind = "note"


@dataclass(frozen=True)
class CanaryEvent(NoteEvent):
    """A phase of the canary (``config``, ``written``, ``served``, ``answered``) passed, or failed
    (level ``error``): a note everywhere a note shows, with its phase for ``--json`` readers."""

    phase: str = ""
    kind = "canary"


@dataclass(frozen=True)
class DecisionEvent(Event):
    """A decision was met and answered (``answer``) by ``by``: auto, preset, operator."""

    id: str
    title: str
    recommended: str
    answer: str | None
    why: str
    measured: list[str] = field(default_factory=list)
    options: list[dict[str, str]] = field(default_factory=list)
    by: str = ""
    kind = "decision"


@dataclass(frozen=True)
class ResultEvent(Event):
    """The end: served and verified (``ok``) or stopped, with the endpoint when there is one."""

    ok: bool
    endpoint: str | None
    message: str = ""
    tokens_per_s: float | None = None
    model: str | None = None  # the served model name: what a request's "model" must say
    kind = "result"
