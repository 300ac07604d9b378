"""A node's process table: what runs there, independent of any SSH channel.

Why: long work on a node runs detached (``setsid nohup sh -c '...' > /dev/null 2>&1 < /dev/null
& echo $!``) so that the console can disconnect; a later connection finds it again by pid
(``kill -0``), by name (``pgrep -f``, ``ps``) and stops it (``kill``). So processes live on the
:class:`~sparkconsole.sim.model.SimCluster`, not on a shell.

Each process is an asyncio task. The rules kept from Unix, because a deployment depends on them:

* a parent waits on its child without owning it: killing ``sh -c 'hf download ...; echo $? > rc'``
  kills the ``sh`` only, the download goes on (orphaned to pid 1) and the ``rc`` file is never
  written; ``kill -- -PGID`` (or ``kill -TERM -PID`` of a ``setsid`` leader) stops the group;
* ``setsid`` starts a new session and process group (pid = pgid = sid); ``nohup`` ignores SIGHUP;
* when an exec channel closes, its session's foreground processes get SIGHUP (the sim's
  stand-in for the SIGPIPE/SIGHUP a real one gets); background (``&``) jobs and processes that
  ignore SIGHUP keep running;
* ``kill -0 PID`` tests existence; a finished process is reaped at once (no zombies);
* a lost node (:meth:`ProcTable.kill_all`) stops every process at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from sparkconsole.sim.clock import NOMINAL

SIGNALS = {"HUP": 1, "INT": 2, "QUIT": 3, "KILL": 9, "USR1": 10, "USR2": 12, "PIPE": 13, "ALRM": 14,
           "TERM": 15, "CONT": 18, "STOP": 19}
SIGNAL_NAMES = {v: k for k, v in SIGNALS.items()}


@dataclass
class Process:
    pid: int
    ppid: int
    pgid: int
    sid: int
    argv: list[str]
    started: float
    bg: bool = False  # started with & (or below such a job): survives its channel
    nohup: bool = False  # ignores SIGHUP
    task: asyncio.Task[int] | None = None
    rc: int | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    on_kill: list[Callable[[int], None]] = field(default_factory=list)
    killed_by: int | None = None

    @property
    def cmdline(self) -> str:
        return " ".join(self.argv)


class ProcTable:
    """The processes of one node (pids count up from ``first_pid``, as on a fresh boot).

    ``started`` counts every process :meth:`spawn` ever made on the node (each command a shell runs
    as a process, a ``setsid`` fork, an ``&`` job, a ``docker run``'s main process, the ``sh -c`` of
    each channel), never reset, not even by :meth:`restart_pids`: a test reads it before and after a
    command to count the processes that command started. Builtins (``echo``, ``read``, ``[``) and
    wrappers that exec in the same process (``nohup``, ``env``, ``exec``) start none. Pids do not
    count: they skip numbers. (The sim's ``timeout`` runs its command inside its own process, so
    ``timeout 5 nvidia-smi`` counts 1 where the real one forks a second: Interp._timeout.)
    """

    def __init__(self, node: str, now: Callable[[], float], first_pid: int = 48_211) -> None:
        self.node = node
        self.now = now
        self.first_pid = first_pid
        self._next = first_pid
        self.procs: dict[int, Process] = {}
        self.started = 0  # processes spawned so far (see the class docstring)

    def restart_pids(self, next_pid: int | None = None) -> None:
        """After a reboot pids count up from the start again: a saved bare pid may name a stranger."""
        self._next = self.first_pid if next_pid is None else next_pid

    def new_pid(self) -> int:
        pid = self._next
        self._next += 1 + (pid % 3)  # other processes come and go in between
        return pid

    def spawn(self, argv: list[str], parent: Process | None = None, bg: bool = False,
              session_leader: bool = False) -> Process:
        """A new process (not yet running: :meth:`start` gives it its coroutine)."""
        pid = self.new_pid()
        self.started += 1
        if session_leader or parent is None:
            pgid = sid = pid
            ppid = 1 if parent is None else parent.pid
        else:
            pgid, sid, ppid = parent.pgid, parent.sid, parent.pid
        p = Process(pid, ppid, pgid, sid, list(argv), self.now(), bg=bg or (parent is not None and parent.bg),
                    nohup=parent.nohup if parent is not None else False)
        self.procs[pid] = p
        return p

    def start(self, p: Process, coro: Awaitable[int], *, on_its_own: bool = False) -> asyncio.Task[int]:
        """Run ``coro`` as ``p``. ``on_its_own``: a container's detached process, whose time is not
        that of the command that started it (clock.NOMINAL: a `docker run -d` returns at once)."""
        if on_its_own:
            ctx = contextvars.copy_context()
            ctx.run(NOMINAL.set, None)
            task: asyncio.Task[int] = asyncio.get_running_loop().create_task(coro, context=ctx)  # type: ignore[arg-type]
        else:
            task = asyncio.ensure_future(coro)
        p.task = task

        def finished(t: asyncio.Task[int]) -> None:
            if t.cancelled():
                p.rc = 128 + (p.killed_by or SIGNALS["TERM"])
            else:
                exc = t.exception()
                p.rc = t.result() if exc is None else 1
            if self.procs.get(p.pid) is p:  # after a reboot the pid may already be another's
                del self.procs[p.pid]
            for q in self.procs.values():  # orphans go to init
                if q.ppid == p.pid:
                    q.ppid = 1
            p.done.set()

        task.add_done_callback(finished)
        return task

    def get(self, pid: int) -> Process | None:
        return self.procs.get(pid)

    def signal(self, pid: int, sig: int) -> bool:
        """Deliver ``sig`` to ``pid`` (negative: to the process group); False if none exists."""
        targets = ([p for p in self.procs.values() if p.pgid == -pid] if pid < 0
                   else [self.procs[pid]] if pid in self.procs else [])
        if not targets:
            return False
        for p in targets:
            self._deliver(p, sig)
        return True

    def _deliver(self, p: Process, sig: int) -> None:
        if sig in (0, SIGNALS["CONT"], SIGNALS["STOP"]):
            return
        if sig == SIGNALS["HUP"] and p.nohup:
            return
        p.killed_by = sig
        for cb in p.on_kill:
            with contextlib.suppress(Exception):
                cb(sig)
        if p.task is not None and not p.task.done():
            p.task.cancel()
        elif p.task is None:
            self.procs.pop(p.pid, None)
            p.done.set()

    def hangup(self, sid: int) -> None:
        """The session's channel closed: SIGHUP to its foreground processes."""
        for p in list(self.procs.values()):
            if p.sid == sid and not p.bg:
                self._deliver(p, SIGNALS["HUP"])

    def kill_all(self) -> None:
        for p in list(self.procs.values()):
            p.nohup = False
            self._deliver(p, SIGNALS["KILL"])

    def matching(self, pattern_match: Callable[[Process], bool]) -> list[Process]:
        return sorted((p for p in self.procs.values() if pattern_match(p)), key=lambda p: p.pid)
