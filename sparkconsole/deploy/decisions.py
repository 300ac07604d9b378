"""Decisions: where the deployment stops and asks, with what was measured and a recommendation.

A :class:`Decision` carries the numbers it rests on (``measured``), the recommended answer first
among its :class:`Option` s, and why. Who answers is pluggable (:class:`Answerer`): the operator in
a modal, ``--auto`` (the recommendation), ``--answer ID=VALUE`` (a preset), or a previous run's
answer kept in the deployment's state. An answer outside the options is refused in words.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sparkconsole.errors import UserError


@dataclass(frozen=True)
class Option:
    """One answer. ``value`` is its word (``--answer ID=VALUE``, the state's ``answers``); ``payload``
    is what the step does with it (a layout, a list of services to stop), so no step parses its
    own answers back out of strings."""

    value: str
    label: str
    why: str = ""
    experimental: bool = False
    payload: Any = field(default=None, compare=False)


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
    # the payload of a free-text answer (an image the operator names, a list of services)
    parse: Callable[[str], Any] | None = field(default=None, compare=False)

    def option(self, value: str) -> Option | None:
        return next((o for o in self.options if o.value == value), None)

    def payload(self, answer: str) -> Any:
        """What ``answer`` means to the step: its option's payload, else (free text) the decision's
        own reading of it, else the words themselves."""
        opt = self.option(answer)
        if opt is not None and opt.payload is not None:
            return opt.payload
        if opt is None and self.parse is not None:
            return self.parse(answer)
        return answer

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
    #: the operator at a terminal: the decision's open question asked there, its reply the answer
    #: (:func:`sparkconsole.commands.deploy._ask`); None: a script, which stops instead
    ask: Callable[[Decision], Awaitable[str]] | None = None

    def forget(self, decision_id: str) -> None:
        """A preset that led somewhere the flow came back from is not given again."""
        if decision_id in self.presets:
            self.presets = {k: v for k, v in self.presets.items() if k != decision_id}

    async def __call__(self, decision: Decision) -> tuple[str, str]:
        if decision.id in self.presets:
            return decision.check(self.presets[decision.id]), "preset"
        if self.auto:
            return decision.recommended, "auto"
        if self.ask is not None:
            return decision.check(await self.ask(decision)), "operator"
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
