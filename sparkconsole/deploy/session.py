"""One deployment, start to end: open the nodes, walk the flow, say the result.

:func:`run_flow` is what the CLI and the TUI both call. It honours ``--until`` (stop after that
step, a success), ``--plan-only`` (decide with the given answerer and print the changes each step's ``send``
would make, found by running it without sending: the very commands a real run sends), resume (steps already ``done`` are skipped without being
probed again; a step that was ``running`` is re-entered and its jobs re-attached), and
:class:`GoTo` (back to an earlier step, at most a few times). However the walk (or a teardown)
ends, the cluster's lock on the head is released before the result is said (the session's close
would release it too, but after the result: its shown release would come last).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sparkconsole.deploy.decisions import DecisionStop
from sparkconsole.deploy.events import Event, NoteEvent, ResultEvent
from sparkconsole.deploy.flow import Flow
from sparkconsole.deploy.runner import GoTo, StepFailed
from sparkconsole.deploy.steps import STEP_IDS, Step
from sparkconsole.deploy.teardown import Teardown
from sparkconsole.errors import ReadOnlyError, UserError
from sparkconsole.remote import RemoteCommand

MAX_JUMPS = 4


@dataclass
class Outcome:
    ok: bool
    result: ResultEvent
    stopped_at: str | None = None


def _result(flow: Flow, ok: bool, message: str) -> ResultEvent:
    st = flow.runner.state
    tps = flow.plan.tokens_per_s
    return ResultEvent(ok, st.endpoint if ok else None, message, round(tps, 1) if tps else None,
                       flow.served_name if ok and st.endpoint else None)


async def run_flow(flow: Flow, *, until: str | None = None,
                   on_plan: Callable[[str, str, list[tuple[str, RemoteCommand]]], None] | None = None) -> Outcome:
    """Walk the steps. ``on_plan(step, title, commands)`` receives each step's planned commands
    (``--plan-only``: only that, nothing applied)."""
    try:
        return await _walk(flow, until, on_plan)
    finally:
        await _let_go(flow)


async def _let_go(flow: Flow) -> None:
    """The run is over: the cluster's lock on the head goes (a run that took none has none)."""
    lock = flow.runner.head_lock
    if lock is not None:
        await lock.release()


async def _walk(flow: Flow, until: str | None,
                on_plan: Callable[[str, str, list[tuple[str, RemoteCommand]]], None] | None) -> Outcome:
    r = flow.runner
    if until is not None and until not in STEP_IDS:
        raise UserError(f"--until: no step {until!r} (steps: {', '.join(STEP_IDS)})")
    order = [s.id for s in flow.steps]
    i = 0
    jumps = 0
    while i < len(flow.steps):
        step = flow.steps[i]
        r.step = step.id
        try:
            if r.state.steps.get(step.id) in ("done", "skipped") and not step.rerun_when_done:
                r.emit(_step_event(step.id, r.state.steps[step.id], "finished before: not repeated"))
            else:
                await _run_step(flow, step, on_plan)
        except GoTo as jump:
            jumps += 1
            if jumps > MAX_JUMPS:
                r.set_step(step.id, "failed", "went back too many times")
                return Outcome(False, _result(flow, False, f"{step.id}: went back {MAX_JUMPS} times"), step.id)
            target = order.index(jump.step)
            for later in order[target:]:
                r.state.steps.pop(later, None)
            r.set_step(step.id, "failed", f"back to {jump.step}: {jump.why}")
            i = target
            continue
        except StepFailed as exc:
            r.set_step(step.id, "failed", exc.message + (f" — fix: {exc.fix}" if exc.fix else ""))
            r.state.result = "failed"
            r.save()
            return Outcome(False, _result(flow, False, f"{step.id}: {exc.message}"
                                          + (f" — fix: {exc.fix}" if exc.fix else "")), step.id)
        except DecisionStop as stop:
            r.set_step(step.id, "waiting", f"decision {stop.decision.id} needs an answer")
            d = stop.decision
            return Outcome(False, _result(flow, False, f"decision {d.id} needs an answer: --answer "
                                          f"{d.id}={d.recommended} (recommended) or --auto"), step.id)
        except ReadOnlyError as exc:
            r.set_step(step.id, "failed", exc.message)
            return Outcome(False, _result(flow, False, exc.message), step.id)
        if until == step.id:
            return Outcome(True, _result(flow, True, f"stopped after {step.id}, as asked (--until)"), step.id)
        i += 1
    if r.plan_only:
        _say_what_plan_only_cannot_know(flow)
        return Outcome(True, _result(flow, True, "plan only: nothing was changed"), None)
    ok = r.state.result == "served"
    return Outcome(ok, _result(flow, ok, "served and verified" if ok else "not served"), None)


PLAN_ONLY_UNKNOWN = ("plan only: the plan stands on what the nodes show now; a later step's reading can "
                     "change it (the caches step re-plans --gpu-memory-utilization when page cache only root "
                     "can drop stays; the canary can fail an image and another is chosen). "
                     "`sparkconsole deploy --rehearse` walks every step on a twin of the cluster and shows it")


def _say_what_plan_only_cannot_know(flow: Flow) -> None:
    """The last word of a plan-only run: what it could not know (it sends nothing, so no later
    step reads the nodes as a real run would), and where that is shown."""
    r = flow.runner
    r.emit(NoteEvent(r.step or flow.steps[-1].id, PLAN_ONLY_UNKNOWN, "info"))  # under the last step walked


def _step_event(step: str, state: str, note: str) -> Event:
    from sparkconsole.deploy.events import StepEvent

    return StepEvent(step, state, note)  # type: ignore[arg-type]


async def _run_step(flow: Flow, step: Step, on_plan) -> None:
    """``probe → decide → send → watch → verify``, the same for every step and in every mode. The
    step's ``send`` runs first as a rehearsal: what it would send is what ``--plan-only`` prints and
    what the operator confirms; then (not plan-only) the same ``send`` sends it."""
    r = flow.runner
    r.set_step(step.id, "running")
    why = "the model is already served" if step.done_when_serving and await flow.serving() else None
    why = why or await step.probe()
    if why:
        r.set_step(step.id, "skipped", why)
        return
    await step.decide()
    if not await r.apply(step.id, step.title, step.send, on_plan):
        r.set_step(step.id, "done", "planned")
        return
    await step.watch()
    await step.verify()
    r.set_step(step.id, "done")


async def run_teardown(flow: Flow) -> Outcome:
    """Remove what the deployment started (:class:`Teardown`); the lock on the head goes after."""
    try:
        return await _tear_down(flow)
    finally:
        await _let_go(flow)


async def _tear_down(flow: Flow) -> Outcome:
    r = flow.runner
    td = Teardown(flow)
    try:
        await td.run()
    except StepFailed as exc:
        r.set_step("teardown", "failed", exc.message)
        return Outcome(False, ResultEvent(False, None, exc.message), "teardown")
    except DecisionStop as stop:
        return Outcome(False, ResultEvent(False, None, f"decision {stop.decision.id} needs an answer"), "teardown")
    msg = "removed what this deployment started" + (f"; started again: {', '.join(td.restored)}" if td.restored else "")
    if td.failed:
        msg += f"; did not stay up: {', '.join(td.failed)} (see their logs)"
    return Outcome(not td.failed, ResultEvent(not td.failed, None, msg), None)
