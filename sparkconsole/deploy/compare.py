"""After the real run: where reality differed from the rehearsal (``deploy --compare-rehearsal``).

The rehearsal's report (``*.rehearsal.json``: its answers, its events, its estimates) against what
the real deployment left behind: its state (the answers given, each step's outcome) and the
journal's entries of that deployment (every change it sent, per step, with the time it was sent).
Each difference is a line: a decision answered otherwise, a step that ended otherwise, a change the
rehearsal did not foresee or one it foresaw that never went, and each step's time against its
estimate. Those lines are the twin's errors, visible, so the twin can be mended (issue 26 item 4).

Plain data in, words out; free of Textual.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sparkconsole.deploy.rehearsal import duration_words as _duration
from sparkconsole.deploy.state import DeploymentState
from sparkconsole.journal import JournalEntry, redact

# the deployment's own random ids (its job folder, its containers' names) differ between two runs
_IDS = re.compile(r"\b[0-9a-f]{8}\b")


JOB_END = "(detached job, pid "  # the journal's line for a detached job's end (runner), not a change sent


def same_command(text: str) -> str:
    """A command as both runs can be compared: the journal's redaction (a secret's value as ``***``)
    applied, the deployment's random ids made equal."""
    return _IDS.sub("ID", redact(text))


@dataclass
class Comparison:
    deployment: str
    decisions: list[str] = field(default_factory=list)  # "id: rehearsal X, real Y"
    steps: list[str] = field(default_factory=list)
    unforeseen: list[tuple[str, str, str]] = field(default_factory=list)  # (step, node, command) only real
    not_sent: list[tuple[str, str, str]] = field(default_factory=list)  # only rehearsed
    times: list[tuple[str, float | None, float | None]] = field(default_factory=list)  # (step, estimate, real)
    not_reached: list[str] = field(default_factory=list)  # decisions the real run has not met yet (--until)
    same_decisions: int = 0
    same_changes: int = 0

    @property
    def agrees(self) -> bool:
        return not (self.decisions or self.steps or self.unforeseen or self.not_sent)

    def to_json(self) -> dict[str, Any]:
        return {"event": "comparison", "deployment": self.deployment, "agrees": self.agrees,
                "decisions": self.decisions, "steps": self.steps,
                "unforeseen": [{"step": s, "node": n, "command": c} for s, n, c in self.unforeseen],
                "not_sent": [{"step": s, "node": n, "command": c} for s, n, c in self.not_sent],
                "times": [{"step": s, "estimate_s": e, "real_s": r} for s, e, r in self.times],
                "not_reached": self.not_reached, "same_decisions": self.same_decisions,
                "same_changes": self.same_changes}


def compare(report: dict[str, Any], state: DeploymentState, journal: list[JournalEntry]) -> Comparison:
    out = Comparison(state.id)
    rehearsed: dict[str, str] = dict(report.get("answers") or {})
    finished = state.result in ("served", "failed")  # a run that stopped early (--until) did not reach the rest
    for key in sorted(set(rehearsed) | set(state.answers)):
        a, b = rehearsed.get(key), state.answers.get(key)
        if a == b:
            out.same_decisions += 1
        elif b is None and not finished:
            out.not_reached.append(key)
        else:
            out.decisions.append(f"{key}: rehearsal {a or '(not asked)'}, real {b or '(not asked)'}")
    events = [e for e in report.get("events") or [] if isinstance(e, dict)]
    last: dict[str, str] = {}
    for e in events:
        if e.get("event") == "step" and e.get("state") != "running":
            last[str(e.get("step"))] = str(e.get("state"))
    for step, rehearsed_state in last.items():
        real = state.steps.get(step)
        if real is None and not finished:
            continue  # not reached yet
        if real != rehearsed_state:
            out.steps.append(f"{step}: rehearsal {rehearsed_state}, real {real or '(not run)'}")
    planned = [(str(e["step"]), str(e["node"]), same_command(str(e["command"]))) for e in events
               if e.get("event") == "planned" and e.get("mutating")]
    # (the cluster's lock on the head is the session's housekeeping, not a step's change: a rehearsal
    # takes none, so it is left out of both sides)
    mine = [x for x in journal if x.deployment == state.id and not x.command.startswith(JOB_END)
            and x.step != "lock"]
    sent = [(x.step or "", x.node, same_command(x.command)) for x in mine]
    left = list(planned)
    for item in sent:
        if item in left:
            left.remove(item)
            out.same_changes += 1
        else:
            out.unforeseen.append(item)
    reached = {s for s, _n, _c in sent}
    out.not_sent = [x for x in left if x[0] in reached or state.steps.get(x[0]) in ("done", "failed")]
    estimates = (report.get("estimates") or {}).get("steps") or {}
    spans = _spans(mine)
    # a step that sent no change has no time of its own in the journal: it is in the span of the
    # step before it, so its estimate is added there and the two are named together
    groups: list[tuple[list[str], float, float | None]] = []
    for step, est in estimates.items():
        if groups and groups[-1][2] is not None and step not in spans:
            names, total, real = groups[-1]
            groups[-1] = ([*names, step], total + float(est or 0.0), real)
        else:
            groups.append(([step], float(est or 0.0), spans.get(step)))
    out.times = [(" + ".join(names), round(est, 1), None if real is None else round(real, 1))
                 for names, est, real in groups if real is not None or est]
    return out


def _spans(entries: list[JournalEntry]) -> dict[str, float]:
    """Each step's time in the real run as the journal shows it: from its first change's start to
    the next step's first change's start (the last step: to its last change's end). An entry is
    written when its command has ended (its time) and says how long it took, so it started that long
    before. A step that sent nothing has none."""
    firsts: list[tuple[str, float]] = []
    seen: set[str] = set()
    end = 0.0
    for x in entries:
        try:
            t = datetime.fromisoformat(x.time).timestamp()
        except ValueError:
            continue
        end = max(end, t)
        if x.step and x.step not in seen:
            seen.add(x.step)
            firsts.append((x.step, t - (x.duration_s or 0.0)))
    out = {}
    for i, (step, t) in enumerate(firsts):
        nxt = firsts[i + 1][1] if i + 1 < len(firsts) else end
        out[step] = max(0.0, nxt - t)
    return out


def format_comparison(c: Comparison) -> list[str]:
    lines = [f"deployment {c.deployment} against its rehearsal: "
             + ("the rehearsal foresaw it" if c.agrees else "reality differed")]
    lines.append(f"  decisions: {c.same_decisions} the same" + (f", {len(c.decisions)} not" if c.decisions else "")
                 + (f"; not reached yet: {', '.join(c.not_reached)}" if c.not_reached else ""))
    lines += [f"    ≠ {d}" for d in c.decisions]
    lines += [f"  ≠ step {s}" for s in c.steps]
    lines.append(f"  changes: {c.same_changes} as rehearsed" + (f", {len(c.unforeseen)} not foreseen" if c.unforeseen
                                                                  else "")
                 + (f", {len(c.not_sent)} rehearsed but not sent" if c.not_sent else ""))
    lines += [f"    + {s} {n} $ {cmd.splitlines()[0][:120]}" for s, n, cmd in c.unforeseen]
    lines += [f"    - {s} {n} $ {cmd.splitlines()[0][:120]}" for s, n, cmd in c.not_sent]
    if c.times:
        lines.append("  time per step (estimate → real, from the journal):")
        lines += [f"    {s:<24} {_duration(e):>8} → {_duration(r)}" for s, e, r in c.times]
    return lines
