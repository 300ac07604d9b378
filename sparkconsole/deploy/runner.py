"""The runner: walks the steps, sends their commands, keeps the state, and says what happens.

Every command goes through :meth:`Runner.read` (read-only) or :meth:`Runner.change` (changes a
node: refused read-only, shown before it runs by a :class:`CommandEvent` without ``rc``, confirmed
through the step's ``confirm`` callback, journaled with the deployment and step ids, and the state
saved right after). Once a change was sent, what it did is kept before anything can fail: the state
(with the change's key) is saved first, then the journal is written, each tried whatever the other
did, and only then is a failure of either raised, in one line. The cluster's lock on the head goes
through :meth:`Runner.housekeeping`: shown and journaled the same way, outside the steps. Long work runs detached on the node (:meth:`start_job`): its pid and files are
saved before anything waits on it, so a console killed mid-copy re-attaches on ``--resume`` and
never starts the same job twice (:meth:`wait_job`).

A step raises :class:`StepFailed` (with the fix in words) to end the run, or :class:`GoTo` to send
the flow back to an earlier step (a failed start turned into a decision: OOM → plan, unsupported
architecture → engine, NCCL → network).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkconsole.config import ClusterConfig, NodeConfig
from sparkconsole.deploy.decisions import Answerer, Decision
from sparkconsole.deploy.events import (
    CommandEvent,
    DecisionEvent,
    Event,
    NoteEvent,
    OutputEvent,
    ProgressEvent,
    StepEvent,
)
from sparkconsole.deploy.state import DeploymentState, Job, StateStore
from sparkconsole.errors import ReadOnlyError, TransportError, UserError
from sparkconsole.journal import Journal
from sparkconsole.remote import JobFiles, RemoteCommand, detached, job_check, kill_job
from sparkconsole.transport.base import CommandResult, Transport


class StepFailed(Exception):
    """The step cannot go on; ``fix`` says what the operator should do."""

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix


class GoTo(Exception):
    """Go back to ``step`` (and run every step after it again)."""

    def __init__(self, step: str, why: str) -> None:
        super().__init__(step)
        self.step = step
        self.why = why


Confirm = Callable[[str, Sequence[tuple[str, RemoteCommand]]], Awaitable[bool]]


async def _yes(step: str, commands: Sequence[tuple[str, RemoteCommand]]) -> bool:
    return True


@dataclass
class Settings:
    """How the runner paces itself: job polls, command timeouts, how long a start may take."""

    poll_s: float = 2.0
    command_timeout_s: float = 120.0
    serve_timeout_s: float = 3600.0
    hang_after_s: float = 600.0  # no new engine log line for this long: a hang (SGLang's NCCL stall)
    ray_join_timeout_s: float = 180.0
    unreachable_after_s: float = 120.0  # wall seconds a node may not answer while a job is waited on
    # node seconds a detached job may run before the wait gives up (the job runs on: --resume): 119 GB
    # over a slow line is hours, never days
    job_deadline_s: float = 24 * 3600.0
    speed: float = 1.0  # node seconds per wall second (the demo runs accelerated)


@dataclass
class Runner:
    config: ClusterConfig
    state: DeploymentState
    transports: dict[str, Transport]
    answer: Answerer
    emit: Callable[[Event], None]
    store: StateStore | None = None
    journal: Journal | None = None
    confirm: Confirm = _yes
    settings: Settings = field(default_factory=Settings)
    read_only: bool = False
    plan_only: bool = False
    step: str = ""  # the step running now (commands are journaled under it)
    cancelled: bool = False  # the operator asked to stop: no further change is sent
    stop_reason: str = ""  # why no further change is sent, when not the operator's word
    # the cluster's lock on the head (:class:`~sparkconsole.deploy.head_lock.HeadLock`), set by the
    # opening: the walk releases it as it ends, so its release is shown before the result
    head_lock: Any = field(default=None, repr=False)
    # While a step's ``send`` runs as a rehearsal (:meth:`rehearse`): the changes it would send, in
    # order; nothing is sent, journaled or saved. ``None``: changes are sent.
    _recorded: list[tuple[str, RemoteCommand]] | None = field(default=None, repr=False)
    # The decisions each step declares (step id → decision ids), set by the flow: a step asking one
    # it did not declare is a bug, said at once.
    declared: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # What the operator confirmed for the step now sending: a change outside it is confirmed on its own.
    _confirmed: set[tuple[str, str]] | None = field(default=None, repr=False)

    @property
    def rehearsing(self) -> bool:
        """A step's ``send`` is running without sending (plan-only, or the look before a confirmation)."""
        return self._recorded is not None

    async def rehearse(self, send: Callable[[], Awaitable[None]]) -> list[tuple[str, RemoteCommand]]:
        """Run ``send`` (a step's one command source) without sending: the changes it would make, in
        order. Reads still go out (they change nothing); what ``send`` writes into the state is put back
        afterwards, and nothing is saved, journaled or shown meanwhile. The same code then sends for
        real, so what was shown is what is sent (pyinfra's model: dry run and apply are one path)."""
        import copy

        kept = copy.deepcopy(self.state.__dict__)
        self._recorded = []
        try:
            await send()
            return self._recorded
        finally:
            self._recorded = None
            self.state.__dict__.update(kept)

    async def apply(self, step: str, title: str, send: Callable[[], Awaitable[None]],
                    on_plan: Callable[[str, str, list[tuple[str, RemoteCommand]]], None] | None = None) -> bool:
        """Show, confirm, send: ``send`` runs first as a rehearsal (what it would change is what
        ``on_plan`` prints and what the operator confirms), then (not plan-only) the same ``send``
        sends it. The one path every change takes, the forward steps' and teardown's alike. False
        when only planned."""
        planned = await self.rehearse(send)
        if on_plan is not None:
            on_plan(step, title, planned)
        if self.plan_only:
            return False
        mutating = [(n, c) for n, c in planned if c.mutating]
        if mutating and not await self.confirm(step, mutating):
            raise StepFailed("not confirmed", "run again and confirm, or --auto")
        self.expect(planned)
        try:
            await send()
        finally:
            self.expect(None)
        return True

    def expect(self, changes: Sequence[tuple[str, RemoteCommand]] | None) -> None:
        """The changes the operator confirmed for the step about to send (``None``: no check)."""
        self._confirmed = None if changes is None else {(n, c.shell()) for n, c in changes}

    def cancel(self, why: str = "") -> None:
        """Stop before the next change (what runs detached on the nodes keeps running; --resume).
        ``why``: the reason the run then says, when it is not the operator's (the cluster's lock
        was taken over)."""
        self.cancelled = True
        self.stop_reason = why or self.stop_reason

    def _stopped(self, fix: str) -> StepFailed:
        return StepFailed(self.stop_reason or "stopped by the operator", fix)

    # ---- nodes ------------------------------------------------------------------------------
    @property
    def nodes(self) -> list[NodeConfig]:
        return list(self.config.nodes)

    @property
    def head(self) -> NodeConfig:
        head = self.config.head
        assert head is not None
        return head

    def transport(self, node: str) -> Transport:
        return self.transports[node]

    def save(self) -> None:
        if self.store is not None and not self.plan_only and not self.rehearsing:
            self.store.save(self.state)

    def note(self, text: str, level: str = "info", node: str = "") -> None:
        if not self.rehearsing:
            self.emit(NoteEvent(self.step, text, level, node))  # type: ignore[arg-type]

    def emit_output(self, node: str, text: str) -> None:
        if not self.rehearsing:
            self.emit(OutputEvent(self.step, node, text))

    def progress(self, node: str, label: str, fraction: float | None, detail: str = "") -> None:
        if not self.rehearsing:
            self.emit(ProgressEvent(self.step, node, label, fraction, detail))

    def set_step(self, step: str, state: str, note: str = "") -> None:
        self.state.steps[step] = state
        self.save()
        self.emit(StepEvent(step, state, note))  # type: ignore[arg-type]

    # ---- commands ---------------------------------------------------------------------------
    async def _send(self, node: str, cmd: RemoteCommand, timeout: float) -> CommandResult:
        text = cmd.shell()
        start = time.monotonic()
        try:
            return await self.transport(node).run(cmd, timeout=timeout, input=cmd.stdin)
        except TransportError as exc:
            return CommandResult(text, None, "", exc.message, time.monotonic() - start)

    async def read(self, node: str, cmd: RemoteCommand, timeout: float | None = None,
                   quiet: bool = False) -> CommandResult:
        """A read-only command: sent at once, never journaled."""
        res = await self._send(node, cmd, timeout or self.settings.command_timeout_s)
        if not quiet and not self.rehearsing:
            self.emit(CommandEvent(self.step, node, cmd.shell(), _rc(res), cmd.summary, False,
                                   round(res.duration_s, 3), "" if res.ok else _tail(res)))
        return res

    async def change(self, node: str, cmd: RemoteCommand, timeout: float | None = None,
                     key: str | None = None) -> CommandResult:
        """A command that changes the node: refused read-only, shown, journaled, state saved.

        ``key`` names the change for resume: a change whose key finished before is not sent again
        (its result is taken as ok)."""
        text = cmd.shell()
        if key is not None and key in self.state.done_commands:
            if not self.rehearsing:
                self.emit(CommandEvent(self.step, node, text, 0, cmd.summary + " (done before, not repeated)", True))
            return CommandResult(text, 0, "", "", 0.0)
        if self._recorded is not None:
            self._recorded.append((node, cmd))
            return CommandResult(text, 0, "", "", 0.0)
        if self.cancelled:
            raise self._stopped("resume when ready (what ran detached keeps running)")
        if self.read_only:
            raise ReadOnlyError(f"read-only: {cmd.summary or text} on {node} refused")
        if self._confirmed is not None and (node, text) not in self._confirmed:
            # the node changed between the look and the send: this one was not shown, so ask for it
            if not await self.confirm(self.step, [(node, cmd)]):
                raise StepFailed("not confirmed", "run again and confirm, or --auto")
            self._confirmed.add((node, text))
        self.emit(CommandEvent(self.step, node, text, None, cmd.summary, True))
        res = await self._send(node, cmd, timeout or self.settings.command_timeout_s)
        # sent: what it did is kept before anything may fail. The state first (a resume must not send a
        # finished change again), then the journal, each whatever the other did; a failure is said after
        if res.ok and key is not None:
            self.state.done_commands.append(key)
        problems: list[str] = []
        try:
            self.save()
        except UserError as exc:
            problems.append(exc.message)
        problems += self._journal_change(node, cmd, res, self.step, saved=not problems)
        self.emit(CommandEvent(self.step, node, text, _rc(res), cmd.summary, True, round(res.duration_s, 3),
                               "" if res.ok else _tail(res)))
        if problems:
            raise UserError("; ".join(problems), exit_code=1)
        return res

    async def housekeeping(self, node: str, cmd: RemoteCommand, *, quiet: bool = False, step: str = "lock",
                           timeout: float | None = None) -> CommandResult:
        """A change the console makes for itself, outside the steps: the cluster's lock on the head
        (:mod:`sparkconsole.deploy.head_lock`). Refused read-only, shown and journaled (under ``step``)
        like every change; ``quiet``: neither, for the lock's refresh (a beat file rewritten every
        minute while the lock, whose take and release are journaled, is held: shown, it would fill
        the screen and the journal with one line a minute). Unlike a step's change it is never
        recorded by a rehearsal running meanwhile (the refresh runs beside the steps), never refused
        after a stop (a lock is released however the run ends), and saves no state (a refused
        opening leaves no deployment behind). A journal that cannot take it is raised, in one line,
        after the command was sent."""
        if self.read_only:
            raise ReadOnlyError(f"read-only: {cmd.summary or cmd.shell()} on {node} refused")
        text = cmd.shell()
        if not quiet:
            self.emit(CommandEvent(step, node, text, None, cmd.summary, True))
        res = await self._send(node, cmd, timeout or self.settings.command_timeout_s)
        if quiet:
            return res
        problems = self._journal_change(node, cmd, res, step, saved=None)
        self.emit(CommandEvent(step, node, text, _rc(res), cmd.summary, True, round(res.duration_s, 3),
                               "" if res.ok else _tail(res)))
        if problems:
            raise UserError("; ".join(problems), exit_code=1)
        return res

    def _journal_change(self, node: str, cmd: RemoteCommand, res: CommandResult, step: str,
                        saved: bool | None) -> list[str]:
        """Journal a sent change; what went wrong, in words (``saved``: whether the state was saved
        just before, None where no state is kept), for the caller to raise once all is kept."""
        if self.journal is None:
            return []
        try:
            self.journal.record(node=node, command=cmd.shell(), summary=cmd.summary, exit_code=res.exit_status,
                                duration_s=res.duration_s, error=None if res.ok else _tail(res),
                                deployment=self.state.id, step=step)
        except UserError as exc:
            what = cmd.summary or "a change"
            done = f"exit {res.exit_status}" if res.exit_status is not None else "no answer"
            kept = ("; the deployment's state was saved" if saved else "") if saved is not None else ""
            return [f"{exc.message}: it missed {what} on {node} ({done}){kept}; free some disk, then --resume"]
        return []

    async def on_all(self, nodes: Sequence[str], fn: Callable[[str], Awaitable[Any]]) -> list[Any]:
        """``fn(node)`` on every node at once (one slow node never holds the others up)."""
        return list(await asyncio.gather(*(fn(n) for n in nodes)))

    # ---- decisions --------------------------------------------------------------------------
    async def decide(self, d: Decision) -> str:
        """The answer to ``d``: kept from an earlier run of this deployment, else asked."""
        if d.step in self.declared and d.id not in self.declared[d.step]:
            raise AssertionError(f"step {d.step} asks {d.id}, which it does not declare")
        options = [{"value": o.value, "label": o.label, "why": o.why,
                    **({"experimental": "yes"} if o.experimental else {})} for o in d.options]
        if d.id in self.state.answers and (d.option(self.state.answers[d.id]) or d.free_text):
            answer, by = self.state.answers[d.id], "earlier"
        else:
            # asked: the same event without an answer, so a screen can show the question is open
            self.emit(DecisionEvent(d.id, d.title, d.recommended, None, d.why, list(d.measured), options, ""))
            answer, by = await self.answer(d)
            self.state.answers[d.id] = answer
            self.save()
        self.emit(DecisionEvent(d.id, d.title, d.recommended, answer, d.why, list(d.measured), options, by))
        return answer

    async def choose(self, d: Decision) -> Any:
        """The answer to ``d`` as the step uses it: its option's payload (see :meth:`Decision.payload`)."""
        return d.payload(await self.decide(d))

    def preset(self, decision_id: str, answer: str) -> None:
        """Answer a decision before it is met again: the flow goes back with the choice already made
        (SGLang hung → the engine step, answered with the known-good vLLM image)."""
        self.state.answers[decision_id] = answer
        self.save()

    def forget(self, *decision_ids: str) -> None:
        """Drop answers so the decisions are asked again (the flow went back)."""
        for d in decision_ids:
            self.state.answers.pop(d, None)
            forget = getattr(self.answer, "forget", None)
            if forget is not None:
                forget(d)

    # ---- detached jobs ----------------------------------------------------------------------
    async def start_job(self, node: str, key: str, inner: RemoteCommand, job_dir: str) -> Job:
        """Start ``inner`` detached on ``node`` unless it already runs there or ended well (then that job
        is returned and waited on again: nothing runs twice).

        The node is asked by the job's key alone (its identity file, written by the job itself), not by
        what the state saved: a console killed between sending the start and saving the pid finds the
        job running and re-attaches, however the moment of the kill fell (issue 23, item 5)."""
        files = JobFiles.under(job_dir, key)
        saved = self.state.jobs.get(key)
        word, pid = await self._look_for_job(node, files)
        if word in ("running", "rc 0"):  # this deployment's job (its folder is the deployment's): adopt it
            job = Job(node=node, pid=pid or (saved.pid if saved else 0), log=files.log, rc=files.rc,
                      what=inner.summary, started=saved.started if saved else time.time(), pid_file=files.pid)
            if saved is None or saved.pid != job.pid:
                self.state.jobs[key] = job
                self.save()
            self.note(f"{inner.summary}: re-attached to the job started before (pid {job.pid}"
                      f"{', ended well' if word == 'rc 0' else ''})", node=node)
            return job
        if saved is not None or word not in ("none", "unknown"):
            # it failed or is gone (killed, node rebooted): re-attaching would only read that again
            ended = ("is gone without an exit code" if word == "lost"
                     else f"ended with exit {word[3:]}" if word.startswith("rc ") else "left nothing on the node")
            self.note(f"{inner.summary}: the job started before {ended}; starting it again", "warning", node=node)
        res = await self.change(node, detached(job_dir, files, inner))
        if self.rehearsing:  # shown, not started: a job that would be waited on, and ends well
            return Job(node=node, pid=0, log=files.log, rc=files.rc, what=inner.summary, pid_file=files.pid)
        pid = _last_int(res.stdout)
        if not res.ok or pid is None:
            raise StepFailed(f"{node}: could not start {inner.summary or 'the job'}: {_tail(res) or 'no pid'}",
                             "--resume finds the job on the node if it did start")
        job = Job(node=node, pid=pid, log=files.log, rc=files.rc, what=inner.summary, started=time.time(),
                  pid_file=files.pid)
        self.state.jobs[key] = job
        self.save()
        return job

    async def _look_for_job(self, node: str, files: JobFiles) -> tuple[str, int | None]:
        """What the node says of the job under ``files``: ``running`` (with its pid), ``rc N``,
        ``lost``, ``none`` (never started), or ``unknown`` (the node did not answer)."""
        res = await self.read(node, job_check(files, tail_bytes=0), quiet=True)
        if res.exit_status is None:
            return "unknown", None
        word = res.stdout.partition("\n")[0].strip()
        if word.startswith("running"):
            return "running", _last_int(word.split()[-1])
        return word or "unknown", None

    async def wait_job(self, job: Job, on_output: Callable[[str], None] | None = None,
                       deadline_s: float | None = None) -> int:
        """Poll the job until it ends; its exit code. A job that neither runs nor left an exit code
        was killed (the node rebooted, someone killed it): -1; the job is known by pid, boot id and
        start time, so a pid reused after a reboot never reads as the job running. ``deadline_s``
        (node seconds, default :attr:`Settings.job_deadline_s`) bounds the whole wait: past it the
        step fails and says the job keeps running. Rehearsing: 0 at once (the job was only shown)."""
        if self.rehearsing:
            return 0
        limit = (deadline_s if deadline_s is not None else self.settings.job_deadline_s) / self.settings.speed
        begun = time.monotonic()
        silent_since: float | None = None
        while True:
            if self.cancelled:
                raise self._stopped(f"the job keeps running on {job.node}; --resume re-attaches to it")
            if time.monotonic() - begun > limit:
                raise StepFailed(f"{job.what or 'a job'} on {job.node} has not ended after "
                                 f"{_duration(limit * self.settings.speed)}",
                                 f"it keeps running on {job.node} (its log: {job.log}); --resume re-attaches, "
                                 "--teardown stops it")
            res = await self.read(job.node, job_check(job.files), quiet=True)
            if res.exit_status is None:
                now = time.monotonic()
                silent_since = silent_since or now
                if now - silent_since > self.settings.unreachable_after_s:
                    raise StepFailed(f"{job.node} stopped answering while {job.what or 'a job'} ran there "
                                     f"({res.stderr.strip()[-200:] or 'no answer'})",
                                     "when the node answers again, --resume re-attaches to the job (it keeps "
                                     "running on the node)")
                await asyncio.sleep(self.settings.poll_s)
                continue
            silent_since = None
            head, _, rest = res.stdout.partition("\n")
            if on_output is not None and rest:
                on_output(rest)
            word = head.strip()
            if word.startswith("rc ") or word in ("lost", "none"):
                rc = -1
                with contextlib.suppress(ValueError, IndexError):
                    rc = int(word.split()[1])
                self._journal_job_end(job, rc, rest)
                return rc
            await asyncio.sleep(self.settings.poll_s)

    def _journal_job_end(self, job: Job, rc: int, log_tail: str) -> None:
        """The journal says how a detached job ended, not only that it was started (a journal that
        cannot take it: one line, raised; the job's end is read again on --resume)."""
        if self.journal is None:
            return
        tail = log_tail.strip().replace("\r", "\n").splitlines()[-1:] if rc != 0 else []
        try:
            self.journal.record(node=job.node, command=f"(detached job, pid {job.pid}) {job.what}",
                                summary=f"{job.what}: ended" if rc >= 0 else f"{job.what}: gone without an exit code",
                                exit_code=None if rc < 0 else rc,
                                duration_s=time.time() - job.started if job.started else None,
                                error=(tail[0] if tail else None) if rc != 0 else None,
                                deployment=self.state.id, step=self.step)
        except UserError as exc:
            raise UserError(f"{exc.message}: it missed the end of {job.what or 'a job'} on {job.node}; free some "
                            "disk, then --resume", exit_code=1) from None

    async def stop_job(self, job: Job) -> bool:
        """Stop ``job`` if it still runs (the pid checked against its identity first: never a stranger's
        process that took the pid); True when a stop was sent."""
        word, pid = await self._look_for_job(job.node, job.files)
        if word != "running" or not pid:
            return False
        await self.change(job.node, kill_job(pid))
        return True


def _rc(res: CommandResult) -> int:
    return -1 if res.exit_status is None else res.exit_status


def _tail(res: CommandResult, lines: int = 4) -> str:
    text = (res.stderr or res.stdout or "").strip()
    return "\n".join(text.splitlines()[-lines:])


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


def _last_int(text: str) -> int | None:
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.isdigit():
            return int(line)
    return None
