"""The cluster's lock on its head: one deployment wizard per cluster, whoever runs it, from wherever.

The lock file of :class:`~sparkconsole.deploy.opening.ClusterLock` guards one laptop (one state
folder): two operators, or one operator with two state folders, would both pass it and deploy to
the same cluster at once, stopping each other's services and starting two engines into one
memory. So a wizard that may change the nodes also holds a lock on the cluster itself, on its head
(``~/.cache/sparkconsole/lock.d``: the commands are :func:`~sparkconsole.remote.head_lock_take`
and its neighbours), for the session's life:

* taking it is a change like every other: shown, journaled with the deployment, refused
  read-only; a run that only plans (``--plan-only``, the rehearsal's read-only walk) takes none;
* a second wizard is refused at once, in one line, naming the holder's laptop, pid, deployment,
  since when it holds the cluster and when it last refreshed the lock;
* the holder refreshes the lock's beat every :data:`REFRESH_EVERY_S` (node seconds; neither shown
  nor journaled: a line a minute would bury the rest, and the take and the release are both
  journaled); a holder with no refresh for :data:`STALE_AFTER_S`, or
  one on this very laptop whose pid is gone, is stale: it is taken over with a note saying whose
  it was and why it was judged gone;
* the session's end releases it (a finished deployment, a teardown, a failure, Ctrl-C); a lock
  another console took over is left to it, and a holder that finds its lock taken stops before its
  next change.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sparkconsole.errors import UserError
from sparkconsole.logs.follow import display_text
from sparkconsole.remote import (
    HEAD_LOCK_DIR,
    HEAD_LOCK_READ_BYTES,
    head_lock_refresh,
    head_lock_release,
    head_lock_take,
    head_lock_take_over,
)

if TYPE_CHECKING:
    from sparkconsole.deploy.runner import Runner
    from sparkconsole.transport.base import CommandResult

REFRESH_EVERY_S = 60.0  # node seconds between two refreshes of a held lock
STALE_AFTER_S = 600.0  # node seconds without a refresh after which a holder is judged gone
TAKE_TIMEOUT_S = 30.0  # wall seconds the head has to answer a take, a refresh or a release
TAKE_TRIES = 4  # takes: a lock that changes hands meanwhile is looked at again, a few times
UNWRITTEN_PAUSE_S = 1.0  # a lock folder just made has its record within a shell's breath: look again once
_FIELD_CHARS = 200  # the most of one field of a record read from a node that is kept


@dataclass(frozen=True)
class Holder:
    """Who holds (or last held) a lock, as its record says: the laptop's host name, the console's
    pid, the deployment, since when (ISO 8601, UTC) and, on a head, the holder's own token (two
    wizards of one process tell their records apart by it)."""

    host: str = "?"
    pid: int = 0
    deployment: str = "?"
    since: str = ""  # ISO 8601, UTC
    token: str = ""

    @classmethod
    def read(cls, text: str) -> Holder | None:
        """The holder in a record's text; None for an empty or unreadable one (released, or being
        written). The text may come from a node: each field is cut and cleaned of control
        characters before it is kept (it ends up in an error line on a terminal)."""
        try:
            data = json.loads(text)
            return cls(host=_field(data.get("host"), "?"), pid=int(data.get("pid") or 0),
                       deployment=_field(data.get("deployment"), "?"), since=_field(data.get("since"), ""),
                       token=_field(data.get("token"), ""))
        except (ValueError, TypeError, AttributeError, OverflowError):
            return None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"host": self.host, "pid": self.pid, "deployment": self.deployment,
                                "since": self.since}
        if self.token:
            data["token"] = self.token
        return data

    def since_text(self, now: datetime | None = None) -> str:
        """``21:22:33 UTC`` today, ``2026-12-01 21:22:33 UTC`` on another day: short when that is enough."""
        try:
            when = datetime.fromisoformat(self.since).astimezone(UTC)
        except ValueError:
            return self.since or "an unknown time"
        now = now or datetime.now(UTC)
        return when.strftime("%H:%M:%S UTC" if when.date() == now.date() else "%Y-%m-%d %H:%M:%S UTC")

    def describe(self) -> str:
        """``pid 4242 on laptop, deployment 20261201-212233-ab12, since 21:22:33 UTC``."""
        return f"pid {self.pid} on {self.host}, deployment {self.deployment}, since {self.since_text()}"


def _field(value: object, default: str) -> str:
    if value is None or value == "":
        return default
    return display_text(str(value))[:_FIELD_CHARS] or default


@dataclass(frozen=True)
class LockAnswer:
    """What the head said of its lock: the first word (``taken``, ``held``, ``busy``, ``kept``,
    ``lost``, ``released``, ``other``; ``""`` without an answer) and, where the lock is not the
    asker's, the head's clock, the beat and the holder's record as they are there."""

    word: str
    now: int | None = None
    beat: str = ""
    record: str = ""

    @classmethod
    def parse(cls, stdout: str) -> LockAnswer:
        lines = stdout[: HEAD_LOCK_READ_BYTES + 256].split("\n")
        word = lines[0].strip()
        now = int(lines[1]) if len(lines) > 1 and lines[1].strip().isdigit() else None
        beat = lines[2].strip() if len(lines) > 2 and lines[2].strip().isdigit() else ""
        record = "\n".join(lines[3:]).rstrip("\n") if len(lines) > 3 else ""
        return cls(word, now, beat, record)

    @property
    def holder(self) -> Holder | None:
        return Holder.read(self.record) if self.record else None

    @property
    def age_s(self) -> float | None:
        """Node seconds since the holder last refreshed the lock (None: no beat to read)."""
        if self.now is None or not self.beat:
            return None
        return float(max(0, self.now - int(self.beat)))


def _alive(pid: int) -> bool:
    """A process of this pid runs on this machine (one of another user's counts: it exists)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return True
    return True


def ago(seconds: float) -> str:
    """``45 s``, ``12 min``, ``3.5 h``: how long ago, in the unit that reads best."""
    if seconds >= 3 * 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


class HeadLock:
    """The cluster's lock on ``runner``'s head for ``runner.state``'s deployment (see the module).

    :meth:`acquire` takes it or raises :class:`UserError` (exit 1) naming the holder; while held, a
    task refreshes it; :meth:`release` stops the refresh and lets it go (said, not raised, when the
    head does not answer: it goes stale after :data:`STALE_AFTER_S`)."""

    def __init__(self, runner: Runner, cluster: str, on_note: Callable[[str], None]) -> None:
        self.runner = runner
        self.cluster = cluster
        self.node = runner.head.name
        self.on_note = on_note
        self.me = Holder(host=socket.gethostname(), pid=os.getpid(), deployment=runner.state.id,
                         since=datetime.now(UTC).isoformat(timespec="seconds"), token=secrets.token_hex(8))
        self.record = json.dumps(self.me.to_json(), sort_keys=True)
        self.held = False
        self._refresh: asyncio.Task[None] | None = None

    @property
    def where(self) -> str:
        return f"its lock on the head {self.node}"

    async def _send(self, cmd: Any, *, quiet: bool = False) -> CommandResult:
        return await self.runner.housekeeping(self.node, cmd, quiet=quiet, timeout=TAKE_TIMEOUT_S)

    async def acquire(self) -> None:
        """Take the lock now or raise :class:`UserError` (exit 1); never waits for a live holder."""
        deployment = self.runner.state.id
        for attempt in range(TAKE_TRIES):
            res = await self._send(head_lock_take(self.record, deployment))
            ans = LockAnswer.parse(res.stdout)
            if ans.word == "taken":
                self._held()
                return
            if ans.word != "held":
                raise UserError(f"cannot take the lock of cluster {self.cluster!r} on its head {self.node}: "
                                f"{_said(res)}; the deployment needs the head to answer", exit_code=1)
            if not ans.record and attempt == 0:
                await asyncio.sleep(UNWRITTEN_PAUSE_S)  # made a moment ago: its record comes next
                continue
            why = self._stale_because(ans)
            if why is None:
                raise UserError(self._refusal(ans), exit_code=1)
            res = await self._send(head_lock_take_over(self.record, ans.record, ans.beat, deployment))
            over = LockAnswer.parse(res.stdout)
            if over.word == "taken":
                h = ans.holder
                whose = f"{h.describe()}" if h is not None else "a holder that never wrote its name"
                self.on_note(f"took over the stale lock of cluster {self.cluster!r} on its head {self.node} "
                             f"(~/{HEAD_LOCK_DIR}): it was {whose}; {why}")
                self._held()
                return
            if over.word == "busy":
                await asyncio.sleep(UNWRITTEN_PAUSE_S)
            elif over.word != "held":
                raise UserError(f"cannot take over the lock of cluster {self.cluster!r} on its head {self.node}: "
                                f"{_said(res)}", exit_code=1)
        raise UserError(f"the lock of cluster {self.cluster!r} on its head {self.node} changed hands while it was "
                        f"taken ({TAKE_TRIES} tries): another console is taking it; try again", exit_code=1)

    def _held(self) -> None:
        self.held = True
        self._refresh = asyncio.ensure_future(self._keep())

    def _stale_because(self, ans: LockAnswer) -> str | None:
        """Why the holder in ``ans`` is gone, in words; None while it may be at work."""
        h = ans.holder
        if (h is not None and h.host == self.me.host and h.pid > 0 and h.pid != self.me.pid
                and not _alive(h.pid)):
            return f"its pid {h.pid} is gone on this laptop ({h.host})"
        age = ans.age_s
        if age is not None and age > STALE_AFTER_S:
            return f"it was not refreshed for {ago(age)} (a holder at work refreshes it every {ago(REFRESH_EVERY_S)})"
        if not ans.record and not ans.beat:
            return "it names no holder (a console stopped while it took it)"
        return None

    def _refusal(self, ans: LockAnswer) -> str:
        h = ans.holder
        who = h.describe() if h is not None else "a holder whose record cannot be read"
        age = ans.age_s
        seen = f", refreshed {ago(age)} ago" if age is not None else ""
        return (f"another deployment wizard holds cluster {self.cluster!r} ({self.where}): {who}{seen}; "
                "wait for it or stop it")

    async def _keep(self) -> None:
        """Refresh the beat every :data:`REFRESH_EVERY_S` node seconds; a lock found taken over stops
        the run before its next change; a head that does not answer is said once."""
        every = REFRESH_EVERY_S / max(self.runner.settings.speed, 1e-6)
        said = False
        while True:
            await asyncio.sleep(every)
            res = await self._send(head_lock_refresh(self.record, self.runner.state.id), quiet=True)
            ans = LockAnswer.parse(res.stdout)
            if ans.word == "kept":
                said = False
                continue
            if ans.word == "lost":
                self.held = False
                h = ans.holder
                who = h.describe() if h is not None else "its folder is gone"
                self.on_note(f"the lock of cluster {self.cluster!r} on its head {self.node} was taken over ({who}): "
                             "this deployment stops before its next change")
                self.runner.cancel(f"the lock of cluster {self.cluster!r} on its head {self.node} was taken over by "
                                   "another console")
                return
            if not said:
                self.on_note(f"could not refresh the lock of cluster {self.cluster!r} on its head {self.node} "
                             f"({_said(res)}); trying again (it goes stale after {ago(STALE_AFTER_S)} without one)")
                said = True

    async def release(self) -> None:
        """Stop refreshing and remove the lock (only while it is still this holder's); what goes
        wrong is said through ``on_note``, never raised: the session is ending anyway."""
        task, self._refresh = self._refresh, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if not self.held:
            return
        self.held = False
        try:
            res = await self._send(head_lock_release(self.record, self.runner.state.id))
        except UserError as exc:  # sent, but the journal could not take it
            self.on_note(f"the lock of cluster {self.cluster!r} on its head {self.node}: {exc.message}")
            return
        ans = LockAnswer.parse(res.stdout)
        if ans.word == "released":
            return
        if ans.word == "other":
            h = ans.holder
            self.on_note(f"the lock of cluster {self.cluster!r} on its head {self.node} is no longer this "
                         f"deployment's ({h.describe() if h is not None else 'nobody holds it'}): left as it is")
            return
        self.on_note(f"could not release the lock of cluster {self.cluster!r} on its head {self.node} ({_said(res)}): "
                     f"it goes stale after {ago(STALE_AFTER_S)}, and a wizard from this laptop takes it over at once")


def _said(res: CommandResult) -> str:
    """What a failed lock command said, in one line (node text: cleaned, cut)."""
    text = (res.stderr or "").strip() or (res.stdout or "").strip()
    if res.exit_status is None:
        text = text or "no answer"
    else:
        text = f"exit {res.exit_status}" + (f": {text}" if text else "")
    return display_text(text.replace("\n", " "))[:300]
