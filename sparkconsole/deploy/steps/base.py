"""The shape every deployment step has; the steps themselves are listed in :mod:`sparkconsole.deploy.steps`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparkconsole.deploy.runner import Runner

if TYPE_CHECKING:
    from sparkconsole.deploy.flow import Flow


class Step:
    """One step of the deployment: ``probe → decide → send → watch → verify``.

    ``probe`` reads what the step needs and returns why its work is already done (the step is then
    skipped) or None. ``decide`` meets the step's decisions. ``send`` is the step's one source of
    changes: every command that changes a node, job starts included, goes out through the runner
    there and nowhere else. The runner first runs it as a rehearsal (nothing sent) to show what it
    would send (``--plan-only``, the confirmation), then runs the same code to send; so what is
    shown is what is sent, by construction. ``watch`` follows what was sent (job waits, progress,
    the engine's log) and may decide again (a failure, a link that went down); ``verify`` checks the
    outcome on the nodes and raises :class:`StepFailed` with the fix.
    """

    id = ""
    title = ""
    # Traits: what differs between steps is declared here, never tested by name in the runner.
    rerun_when_done = False  # probed and run again on --resume even when it finished before
    decisions: tuple[str, ...] = ()  # the ids of the decisions this step may ask
    done_when_serving = False  # skipped when the head already serves this deployment's model (a resume)
    jobs_run_beside = False  # its detached jobs run beside the deployment, never waited on (a rehearsal's
    # estimate does not count them as work: the memory guard's watcher)

    def __init__(self, flow: Flow) -> None:
        self.flow = flow  # the options, the nodes and their facts, the plan: what the steps share

    @property
    def runner(self) -> Runner:
        """Sends the step's commands, asks its decisions, keeps the state (the flow's runner)."""
        return self.flow.runner

    async def probe(self) -> str | None:
        return None

    async def decide(self) -> None:
        return None

    async def send(self) -> None:
        return None

    async def watch(self) -> None:
        return None

    async def verify(self) -> None:
        return None
