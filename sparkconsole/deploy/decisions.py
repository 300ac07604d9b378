"""Decisions: where the deployment stops and asks, with what was measured and a recommendation.

A :class:`Decision` carries the numbers it rests on (``measured``), the recommended answer first
among its :class:`Option` s, and why. Who answers is pluggable (:class:`Answerer`): the operator in
a modal, ``--auto`` (the recommendation), ``--answer ID=VALUE`` (a preset), or a previous run's
answer kept in the deployment's state. An answer outside the options is refused in words.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from sparkconsole.errors import UserError


@dataclass(frozen=True)
class Option:
    value: str
    label: str
    why: str = ""
    experimental: bool = False


@dataclass(frozen=True)
class Decision:
    """One question. ``id`` is stable (``plan.layout``, ``engine.image``…): answers are keyed by it."""

    id: str
    step: str
    title: str
    measured: tuple[str, ...]
    options: tuple[Option, ...]
    recommended: str
    why: str
    free_text: bool = False  # an answer outside the options is allowed (an image the operator names)

    def option(self, value: str) -> Option | None:
        return next((o for o in self.options if o.value == value), None)

    def check(self, value: str) -> str:
        if self.option(value) is None and not self.free_text:
            allowed = ", ".join(o.value for o in self.options)
            raise UserError(f"{self.id}: {value!r} is not one of {allowed}")
        return value


Answerer = Callable[[Decision], Awaitable[tuple[str, str]]]
"""Given a decision, returns ``(answer, by)``; ``by`` names who answered (auto, preset, operator)."""


@dataclass
class ScriptedAnswers:
    """``--auto`` and ``--answer ID=VALUE``: presets first, else the recommendation when ``auto``,
    else stop (:class:`DecisionStop`) so the caller can say which answer is needed."""

    presets: Mapping[str, str] = field(default_factory=dict)
    auto: bool = False

    def forget(self, decision_id: str) -> None:
        """A preset that led somewhere the flow came back from is not given again."""
        if decision_id in self.presets:
            self.presets = {k: v for k, v in self.presets.items() if k != decision_id}

    async def __call__(self, decision: Decision) -> tuple[str, str]:
        if decision.id in self.presets:
            return decision.check(self.presets[decision.id]), "preset"
        if self.auto:
            return decision.recommended, "auto"
        raise DecisionStop(decision)


class DecisionStop(Exception):
    """A decision nobody answered (a script without ``--auto`` or ``--answer``)."""

    def __init__(self, decision: Decision) -> None:
        super().__init__(decision.id)
        self.decision = decision


def parse_answers(pairs: list[str] | None) -> dict[str, str]:
    """``["plan.layout=tp2", …]`` → dict; a malformed pair is a one-line error (exit 2)."""
    out: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise UserError(f"--answer wants ID=VALUE, got {pair!r}")
        out[key.strip()] = value.strip()
    return out
