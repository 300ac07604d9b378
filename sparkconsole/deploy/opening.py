"""Opening one deployment: the one place that wires a run, for the CLI, the TUI and the tests.

``sparkconsole deploy``, the console's wizard (``w``) and the tests' demo flow all need the same
things around a :class:`~sparkconsole.deploy.flow.Flow`: the cluster's lock, a connection per node,
the :class:`~sparkconsole.deploy.runner.Runner` and the flow itself, and all of it closed again
whatever happens. Wired three times, they drifted (two rules for "an earlier deployment", no guard
against two wizards on one cluster), so they are wired here once:

* :class:`ClusterLock`: one deployment at a time per cluster from this laptop. Two wizards on one
  cluster would stop each other's services, start two engines into the same memory and fight over
  the same containers, so the second is refused at once with the first's name, pid, host and
  deployment. It is an ``flock`` on a file under the (private) state directory, held for the
  session's life: the OS drops it when the holder dies, however it dies, so a lock is never left
  behind (the file's contents then say who held it, and the next opener says it takes it over);
* :class:`~sparkconsole.deploy.head_lock.HeadLock`: the same rule across laptops and state
  folders, held on the cluster's head (a run that may change the nodes takes it, as a shown and
  journaled change, after the local lock; a stale one is taken over with a note);
* :func:`find_earlier`: the one rule for "an earlier deployment" (the CLI's note, the TUI's
  resume offer);
* :func:`open_deployment`: the state folder checked, locks, transports, runner, flow; yields a
  :class:`DeploymentSession`.

Nothing here imports Textual: the wizard screen is only one caller.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkconsole.config import ClusterConfig, NodeConfig, state_dir
from sparkconsole.deploy.events import Event, NoteEvent
from sparkconsole.deploy.flow import Flow, Options
from sparkconsole.deploy.head_lock import HeadLock, Holder
from sparkconsole.deploy.runner import Runner
from sparkconsole.deploy.state import DeploymentState, StateStore
from sparkconsole.durable import file_name_for, open_private, private_dir, read_private, why, write_all
from sparkconsole.errors import UserError

if TYPE_CHECKING:
    from sparkconsole.deploy.decisions import Answerer
    from sparkconsole.deploy.runner import Confirm, Settings
    from sparkconsole.journal import Journal
    from sparkconsole.transport.base import Transport

TORN_DOWN = "torn-down"
_HOLDER_READ_TRIES = 10  # a holder that has just taken the lock may not have written its name yet
_HOLDER_READ_PAUSE_S = 0.02


# ---- the lock ---------------------------------------------------------------------------------


def lock_dir() -> Path:
    """Where the cluster locks live: beside the deployments, so one state directory, one set of locks."""
    return state_dir() / "locks"


def lock_name(cluster: str) -> str:
    """The lock file's name for ``cluster``: the name itself when it is a safe file name, else a
    safe form of it plus a short hash, so two names that differ only in odd characters never share
    a lock."""
    return file_name_for(cluster) + ".lock"


class ClusterLock:
    """One deployment at a time on a cluster: ``flock(LOCK_EX | LOCK_NB)`` on
    ``<locks>/<cluster>.lock``, held on an open descriptor for the session's life.

    The file holds the holder as JSON (``host``, ``pid``, ``deployment``, ``since``) so a refused
    opener can say who to wait for. ``flock`` (not the file's existence) is the truth: the OS
    releases it when the holder's process ends, so a file whose lock nobody holds is stale (its
    holder is gone) and is taken over, said through ``on_note``. A clean release empties the file.

    The folder is private (:func:`~sparkconsole.durable.private_dir`) and the file is opened without
    following a symbolic link (one found there is refused, whatever it points at, untouched); a
    write that fails (a full disk) is one line, the lock not taken.
    """

    def __init__(self, cluster: str, deployment: str, *, directory: Path | None = None,
                 on_note: Callable[[str], None] | None = None) -> None:
        self.cluster = cluster
        self.deployment = deployment
        self.path = (directory if directory is not None else lock_dir()) / lock_name(cluster)
        self._base = state_dir() if directory is None else None  # the state folder: private too
        self.on_note = on_note
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock now or raise :class:`UserError` (exit 1) naming the holder; never waits."""
        if self._fd is not None:
            return
        if self._base is not None:
            private_dir(self._base)
        private_dir(self.path.parent, "lock folder")
        try:
            fd = open_private(self.path, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            raise UserError(f"cannot open the lock of cluster {self.cluster!r} ({self.path}): {why(exc)}",
                            exit_code=1) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._holder_of(fd)
            os.close(fd)
            who = holder.describe() if holder is not None else "its holder has not written its name yet"
            raise UserError(f"another deployment wizard holds cluster {self.cluster!r}: {who}; "
                            "wait for it or stop it", exit_code=1) from None
        except OSError as exc:
            os.close(fd)
            raise UserError(f"cannot lock cluster {self.cluster!r} ({self.path}): {exc.strerror or exc}",
                            exit_code=1) from None
        try:
            before = Holder.read(_read_all(fd))
            if before is not None and self.on_note is not None:
                self.on_note(f"taking over the lock of pid {before.pid} (gone) on {before.host}: deployment "
                             f"{before.deployment} on cluster {self.cluster!r}, since {before.since_text()}")
            me = Holder(host=socket.gethostname(), pid=os.getpid(), deployment=self.deployment,
                        since=datetime.now(UTC).isoformat(timespec="seconds"))
            _write_all(fd, json.dumps(me.to_json()).encode())
        except OSError as exc:  # a full disk: the lock is not taken, and says why in one line
            os.close(fd)  # closing drops the flock too
            raise UserError(f"cannot write the lock of cluster {self.cluster!r} ({self.path}): {why(exc)}; "
                            "free some disk and run again", exit_code=1) from None
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def release(self) -> None:
        """Empty the file (a released lock names nobody) and let go; safe to call twice."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def holder(self) -> Holder | None:
        """Who the lock file names now (None when empty or absent), whether or not the lock is held."""
        try:
            return Holder.read(read_private(self.path, 1 << 16))
        except OSError:
            return None

    def _holder_of(self, fd: int) -> Holder | None:
        for _ in range(_HOLDER_READ_TRIES):
            holder = Holder.read(_read_all(fd))
            if holder is not None:
                return holder
            time.sleep(_HOLDER_READ_PAUSE_S)
        return None

    def __enter__(self) -> ClusterLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_all(fd: int) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks).decode("utf-8", "replace")
    except OSError:
        return ""


def _write_all(fd: int, data: bytes) -> None:
    """The file becomes ``data``: written over its start, then cut to its length (a write that fails
    part way leaves a record that does not parse: read as "not written yet", never as someone else)."""
    os.lseek(fd, 0, os.SEEK_SET)
    write_all(fd, data)
    os.ftruncate(fd, len(data))
    os.fsync(fd)


# ---- an earlier deployment ---------------------------------------------------------------------


def find_earlier(store: StateStore, cluster: str, model: str) -> DeploymentState | None:
    """The one rule for "an earlier deployment": the newest saved deployment on ``cluster`` of
    ``model`` that was not torn down. A served one counts (running it again changes nothing, and
    teardown needs it); one of another model is another deployment; a torn-down one is over and is
    never resumed. Unreadable state files are skipped, as the store's own listing does."""
    best: DeploymentState | None = None
    for st in store.saved():
        if st.cluster != cluster or st.model != model or st.result == TORN_DOWN:
            continue
        if best is None or st.id > best.id:  # ids start with their UTC time: newest sorts last
            best = st
    return best


# ---- the session ---------------------------------------------------------------------------------


@dataclass
class DeploymentSession:
    """One open deployment: what a caller runs (``run_flow(session.flow)``) and reads."""

    config: ClusterConfig
    state: DeploymentState
    runner: Runner
    flow: Flow
    transports: dict[str, Transport]
    lock: ClusterLock | None = field(default=None, repr=False)
    head_lock: HeadLock | None = field(default=None, repr=False)


@asynccontextmanager
async def open_deployment(
    config: ClusterConfig,
    options: Options,
    state: DeploymentState,
    *,
    answer: Answerer,
    emit: Callable[[Event], None],
    confirm: Confirm | None = None,
    settings: Settings | None = None,
    journal: Journal | None = None,
    store: StateStore | None = None,
    read_only: bool = False,
    plan_only: bool = False,
    transport_factory: Callable[[NodeConfig], Transport] | None = None,
    lock: bool = True,
    locks: Path | None = None,
    on_note: Callable[[str], None] | None = None,
) -> AsyncIterator[DeploymentSession]:
    """Open ``state`` (new, resumed or to be torn down) on ``config``; close it all on exit.

    In order: the state folder checked (private, or refused in one line), the cluster's
    :class:`ClusterLock` (refused at once, :class:`UserError` exit 1, while another run on this
    laptop holds it), one transport per node (``transport_factory`` or
    :func:`sparkconsole.transport.node_transport`: the deployment's own connections, since one of
    its commands may take an hour and a console's poller reopens its own when a probe hangs), the
    :class:`Runner`, the cluster's :class:`~sparkconsole.deploy.head_lock.HeadLock` on its head
    (refused the same way while a wizard elsewhere holds it: another laptop, another state folder)
    and the :class:`Flow`. On exit the head's lock is released, the transports close and the local
    lock goes.

    ``plan_only`` and ``read_only`` take no lock on the head, and ``plan_only`` none here either:
    they send nothing that changes a node. ``lock=False`` takes neither: it is for a cluster no
    other process can reach (a demo simulated inside this process: its name is shared with every
    other such demo, so locking it would refuse runs that cannot collide). ``locks`` is the lock
    folder (default ``state_dir()/locks``). ``on_note`` hears what the opening says (a stale lock
    taken over); by default it is a warning in the event stream."""

    def note(text: str) -> None:
        if on_note is not None:
            on_note(text)
        else:
            emit(NoteEvent("", text, "warning"))

    if state.cluster != config.name:
        raise UserError(f"deployment {state.id} was made on cluster {state.cluster!r}, not on {config.name!r}: "
                        "run it with that cluster's inventory (--config)")
    unknown = sorted(state.nodes() - {n.name for n in config.nodes})
    if unknown:
        raise UserError(f"deployment {state.id} names nodes the inventory of {config.name!r} lacks: "
                        f"{', '.join(unknown)}; run it with the inventory it was made with")
    if store is not None and not plan_only:
        store.check()  # a folder another user may write is refused before any node is touched
    held: ClusterLock | None = None
    if lock and not plan_only:
        held = ClusterLock(config.name, state.id, directory=locks, on_note=note)
        held.acquire()
    transports: dict[str, Transport] = {}
    head: HeadLock | None = None
    try:
        from sparkconsole.transport import node_transport

        make = transport_factory or (lambda node: node_transport(config, node))
        for node in config.nodes:
            transports[node.name] = make(node)
        extra: dict[str, Any] = {}
        if confirm is not None:
            extra["confirm"] = confirm  # else the runner's own default (yes: the caller asked nothing)
        if settings is not None:
            extra["settings"] = settings
        runner = Runner(config=config, state=state, transports=transports, answer=answer, emit=emit, store=store,
                        journal=journal, read_only=read_only, plan_only=plan_only, **extra)
        if lock and not plan_only and not read_only:
            head = HeadLock(runner, config.name, note)
            await head.acquire()
            runner.head_lock = head  # the walk releases it as it ends (before its result is said)
        flow = Flow(runner, options)
        yield DeploymentSession(config=config, state=state, runner=runner, flow=flow, transports=transports,
                                lock=held, head_lock=head)
    finally:
        if head is not None:
            await head.release()
        for t in transports.values():
            with contextlib.suppress(Exception):
                await t.close()
        if held is not None:
            held.release()


__all__ = [
    "ClusterLock",
    "DeploymentSession",
    "Holder",
    "find_earlier",
    "lock_dir",
    "lock_name",
    "open_deployment",
]
