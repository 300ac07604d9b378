"""The interpreter: runs a parsed ``sh`` script on one simulated node, as dash would.

A :class:`Interp` is one shell process's state (variables, exported names, positional
parameters, ``$?``, ``$!``, working directory, functions, its background jobs) plus the node it
runs on. Builtins that change that state (``cd``, ``export``, ``exit``, ``wait``, ``kill`` ...)
run here; every other command is a *tool* (``c_NAME`` methods of the tool mixins, see
:mod:`sparkconsole.sim.tools`) run as its own process in the node's process table
(:mod:`sparkconsole.sim.procs`), so ``ps``/``pgrep``/``kill`` from another connection see it.

Redirections write into the node's file system (:mod:`sparkconsole.sim.vfs`) as the output is
produced, so a log grows while the job runs. Pipelines run stage by stage (each stage's output is
the next one's input), which is exact for finite commands; a stage piped into ``head -c N`` keeps
at most ``N`` characters of what it writes (:class:`Capture`); ``docker save X | ssh HOST docker
load`` is recognised as one image copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import fnmatch
import functools
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sparkconsole.sim.clock import NOMINAL
from sparkconsole.sim.model import ROOT, Account, WorkSpan
from sparkconsole.sim.procs import SIGNALS, Process, ProcTable
from sparkconsole.sim.sh import expand as X
from sparkconsole.sim.sh.parse import (
    AndOr,
    Case,
    For,
    FuncDef,
    Group,
    HereDoc,
    If,
    ListNode,
    Loop,
    Node,
    Pipeline,
    Redir,
    ShSyntaxError,
    Simple,
    parse,
)
from sparkconsole.sim.vfs import VFS, FsError

if TYPE_CHECKING:
    from sparkconsole.sim.model import SimCluster

Writer = Callable[[str], None]


def _null(_s: str) -> None:
    return None


@dataclass
class IO:
    """What a command gets: its stdout/stderr writers, its stdin text, its environment and process."""

    out: Writer
    err: Writer
    stdin: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    proc: Process | None = None


class Stream(str):
    """A stdin that ``read`` consumes: a pipe's data or a redirected file, one object per opening (a
    ``str`` subclass, so two openings of the same text are two objects). Every command of a ``while``
    loop gets the same one, and ``read`` keeps how far it got beside it (:meth:`Interp.b_read`)."""

    __slots__ = ()


@functools.lru_cache(maxsize=1)
def zeros(n: int) -> Stream:
    """``n`` NULs as a pipe's data, made once (a rehearsal streams the same 128 MiB each time)."""
    return Stream("\0" * n)


class Capture:
    """A pipe's data, kept for the next stage. ``limit``: that stage is ``head -c N`` and reads ``N``
    bytes (at most ``N`` characters) of it: past them the pipe is ``closed`` and what comes is dropped,
    so a producer writing in pieces never makes more than ``head`` keeps; one that looks at ``closed``
    stops there, as a real one stops on SIGPIPE (``docker logs | head -c``: sim/hostile.py)."""

    def __init__(self, limit: int | None = None) -> None:
        self.parts: list[str] = []
        self.limit = limit
        self.size = 0
        self.closed = False

    def __call__(self, s: str) -> None:
        if self.limit is None:
            self.parts.append(s)
            return
        if self.closed:
            return
        room = self.limit - self.size
        self.parts.append(s[:room])
        self.size += min(len(s), room)
        self.closed = self.size >= self.limit

    def text(self) -> str:
        return "".join(self.parts)


def _head_bytes(node: Node) -> int | None:
    """``N`` when ``node`` is ``head -c N`` written out (no expansion, no redirection): the most of its
    input it reads; else None."""
    if (isinstance(node, Simple) and not node.assigns and not node.redirs and len(node.words) == 3
            and node.words[:2] == ["head", "-c"] and node.words[2].isdigit()):
        return int(node.words[2])
    return None


class ShellExit(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


class _Break(Exception):
    def __init__(self, n: int) -> None:
        self.n = n


class _Continue(_Break):
    pass


class _Return(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def login_env(acct: Account) -> dict[str, str]:
    """What sshd gives a session of ``acct``: its home, name and shell (pam_env and login.defs)."""
    return {"HOME": acct.home, "PATH": PATH, "USER": acct.user, "LOGNAME": acct.user, "SHELL": "/bin/bash",
            "LANG": "C.UTF-8", "PWD": acct.home}


# Tools a stock DGX OS host does not have: no ``hf``/``huggingface-cli`` (system pip refuses installs,
# PEP 668) and no ``uv``/``uvx`` ("Tools on the host" in the DGX OS research: dgx-spark-playbooks,
# eugr/spark-vllm-docker). Containers (the vLLM images) have ``hf``; the permissive twin keeps it.
HOST_ABSENT = frozenset({"hf", "huggingface-cli", "uv", "uvx"})

# sudo as Ubuntu 24.04 ships it (sudo.ws 1.9): ``Defaults secure_path`` in /etc/sudoers, and the texts of
# a refused authentication (tests/fixtures/real/dgx-os/sudo-n-password-required.txt; sudo.ws's
# plugins/sudoers/auth/sudo_auth.c and src/tgetpass.c)
SUDO_SECURE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/snap/bin"
SUDO_PASSWORD_REQUIRED = "sudo: a password is required\n"
SUDO_NO_TERMINAL = ("sudo: a terminal is required to read the password; either use the -S option to read from "
                    "standard input or configure an askpass helper\n")
SUDO_VALUE_OPTS = "CDgpRrTtUu"  # short options that take a value (sudo(8))
SUDO_LONG = {"--non-interactive": "n", "--list": "l", "--stdin": "S", "--preserve-env": "E", "--set-home": "H",
             "--login": "i", "--shell": "s", "--background": "b", "--reset-timestamp": "k", "--validate": "v",
             "--remove-timestamp": "K", "--version": "V", "--help": "h"}
SUDO_LONG_VALUE = {"--user": "u", "--group": "g", "--close-from": "C", "--chdir": "D", "--prompt": "p",
                   "--chroot": "R", "--role": "r", "--type": "t", "--command-timeout": "T", "--other-user": "U",
                   "--host": "h"}

# prefixes that run the rest of their arguments in the same process (exec)
WRAPPERS = ("nohup", "setsid", "sudo", "timeout", "env", "nice", "exec", "stdbuf", "ionice", "command")


class Interp:
    """One shell's state on one node; subclasses add the tools (``c_NAME`` methods)."""

    def __init__(self, cluster: SimCluster, node: str) -> None:
        self.cluster = cluster
        self.node_name = node
        # who this shell runs as: the node's login user (root under ``sudo``, in a container, or on the
        # permissive twin); $HOME, ~, cd, id, whoami, sudo and ssh between nodes follow it
        self.account: Account = cluster.login(node)
        self.vars: dict[str, str] = login_env(self.account)
        self.exported: set[str] = set(self.vars)
        self.params: list[str] = []
        self.arg0 = "sh"
        self.last_rc = 0
        self.last_bg: int | None = None
        self.cwd = self.account.home
        self.funcs: dict[str, Node] = {}
        self.jobs: dict[int, Process] = {}
        self._stdin_pos: dict[int, tuple[str, int]] = {}  # how far ``read`` got in a stdin text (b_read)
        self.proc: Process | None = None
        self.lineno = 1

    # ---- plumbing ----------------------------------------------------------------------------

    @property
    def clock(self):
        return self.cluster.clock

    def now(self) -> float:
        return self.cluster.now()

    @property
    def fs(self) -> VFS:
        """The node's files (a shell in a container sees its own: ``DockerTools.fs``)."""
        return self.cluster.fs(self.node_name)

    def absent(self, name: str) -> bool:
        """Whether tool ``name`` is missing here (stock host: no ``hf``; see ``HOST_ABSENT``; a twin
        of a real node: what its recon found)."""
        if getattr(self, "container", None) is not None:
            return False
        found = self.cluster.nodes[self.node_name].tools.get(name)
        if found is not None:
            return not found
        return name in HOST_ABSENT and not self.cluster.permissive

    @property
    def procs(self) -> ProcTable:
        return self.cluster.proc_table(self.node_name)

    def fork(self, proc: Process | None = None) -> Interp:
        """A subshell: a copy of this shell's state, sharing the node."""
        sub = copy.copy(self)
        sub.vars = dict(self.vars)
        sub.exported = set(self.exported)
        sub.params = list(self.params)
        sub.funcs = dict(self.funcs)
        sub.jobs = {}
        sub.proc = proc if proc is not None else self.proc
        return sub

    def fresh(self, proc: Process | None) -> Interp:
        """A new ``sh`` process: only the exported variables come along."""
        sub = self.fork(proc)
        sub.vars = {k: v for k, v in self.vars.items() if k in self.exported}
        sub.exported = set(sub.vars)
        sub.funcs = {}
        sub.params = []
        sub.last_rc = 0
        sub.last_bg = None
        return sub

    def env_for(self, assigns: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in self.vars.items() if k in self.exported}
        env.update(assigns)
        return env

    def getvar(self, name: str) -> str | None:
        if name == "?":
            return str(self.last_rc)
        if name == "!":
            return "" if self.last_bg is None else str(self.last_bg)
        if name == "$":
            return str(self.proc.pid if self.proc else 1)
        if name == "#":
            return str(len(self.params))
        if name in ("@", "*"):
            return " ".join(self.params)
        if name == "0":
            return self.arg0
        if name.isdigit():
            k = int(name)
            return self.params[k - 1] if k <= len(self.params) else None
        if name == "-":
            return ""
        if name == "PWD":
            return self.cwd
        return self.vars.get(name)

    def setvar(self, name: str, value: str) -> None:
        self.vars[name] = value

    async def command_subst(self, script: str) -> str:
        cap = Capture()
        sub = self.fork()
        rc = await sub.run_script(script, IO(cap, self._cur_err, None, proc=self.proc), subshell=True)
        self.last_rc = rc
        self._subst_rc = rc
        return cap.text().rstrip("\n")

    def glob(self, pattern: str) -> list[str]:
        try:
            return self.fs.glob(pattern, self.cwd)
        except FsError:
            return []

    def err_prefix(self) -> str:
        return f"{self.arg0}: {self.lineno}: "

    # ---- running scripts ---------------------------------------------------------------------

    async def run_script(self, src: str, io: IO, subshell: bool = False, exec_in: Process | None = None) -> int:
        """Parse and run ``src``; ``exec_in``: a lone simple command runs in that process (as dash
        and bash exec the last command of ``sh -c``)."""
        try:
            tree = parse(src)
        except ShSyntaxError as exc:
            io.err(f"{self.arg0}: {exc.line}: {exc}\n")
            self.last_rc = 2
            return 2
        except ValueError as exc:
            io.err(f"{self.arg0}: 1: Syntax error: {exc}\n")
            return 2
        self._cur_err = io.err
        try:
            lone = (len(tree.items) == 1 and not tree.items[0][1] and not tree.items[0][0].rest
                    and len(tree.items[0][0].first.cmds) == 1 and not tree.items[0][0].first.bang
                    and isinstance(tree.items[0][0].first.cmds[0], Simple))
            if lone and exec_in is not None:
                cmd = tree.items[0][0].first.cmds[0]
                assert isinstance(cmd, Simple)
                return await self.simple(cmd, io, reuse=exec_in)
            return await self.run_list(tree, io)
        except ShellExit as e:
            self.last_rc = e.code
            return e.code
        except _Return as r:
            return r.code
        except _Break:
            return self.last_rc

    async def run_list(self, node: ListNode, io: IO) -> int:
        for ao, bg in node.items:
            if bg:
                self.background(ao, io)
                self.last_rc = 0
            else:
                self.last_rc = await self.and_or(ao, io)
        return self.last_rc

    def background(self, ao: AndOr, io: IO) -> Process:
        parent = self.proc
        argv = list(parent.argv) if parent is not None else ["sh"]
        p = self.procs.spawn(argv, parent=parent, bg=True)
        sub = self.fork(p)
        bg_io = IO(io.out, io.err, "", proc=p)  # stdin of an async list is /dev/null
        lone = (not ao.rest and len(ao.first.cmds) == 1 and not ao.first.bang
                and isinstance(ao.first.cmds[0], Simple))

        span = None
        first = ao.first.cmds[0]
        if self.cluster.record_work and lone and isinstance(first, Simple) and first.words[:1] == ["setsid"]:
            # remote.detached's form: a job the console waits for
            span = WorkSpan(t0=self.cluster.clock.now(), kind="job", node=self.node_name)
            self.cluster.work_spans.append(span)

        async def job() -> int:
            if span is not None:
                NOMINAL.set(span)
            try:
                if lone:
                    cmd = ao.first.cmds[0]
                    assert isinstance(cmd, Simple)
                    return await sub.simple(cmd, bg_io, reuse=p)
                return await sub.and_or(ao, bg_io, exec_last=p)
            except ShellExit as e:
                return e.code

        self.procs.start(p, job())
        self.jobs[p.pid] = p
        self.last_bg = p.pid
        return p

    async def and_or(self, ao: AndOr, io: IO, exec_last: Process | None = None) -> int:
        """``exec_last``: a subshell's process; its last simple command runs in it (dash execs the
        last command of a subshell, so ``a && b &`` gives ``$!`` = ``b``'s pid)."""
        async def step(pl: Pipeline, last: bool) -> int:
            if last and exec_last is not None and len(pl.cmds) == 1 and not pl.bang and isinstance(
                    pl.cmds[0], Simple):
                return await self.simple(pl.cmds[0], io, reuse=exec_last)
            return await self.pipeline(pl, io)

        rc = await step(ao.first, not ao.rest)
        self.last_rc = rc
        for k, (op, pl) in enumerate(ao.rest):
            if (op == "&&" and rc == 0) or (op == "||" and rc != 0):
                rc = await step(pl, k == len(ao.rest) - 1)
                self.last_rc = rc
        return rc

    async def pipeline(self, pl: Pipeline, io: IO) -> int:
        if len(pl.cmds) == 1:
            rc = await self.command(pl.cmds[0], io)
        else:
            rc = await self._pipe(pl.cmds, io)
        return (0 if rc else 1) if pl.bang else rc

    async def _pipe(self, cmds: list[Node], io: IO) -> int:
        special = await self._special_pipe(cmds, io)
        if special is not None:
            return special
        data = io.stdin
        rc = 0
        for i, cmd in enumerate(cmds):
            sub = self.fork()
            last = i == len(cmds) - 1
            if last:
                rc = await sub.command(cmd, IO(io.out, io.err, data, proc=io.proc))
            else:
                cap = Capture(_head_bytes(cmds[i + 1]))
                rc = await sub.command(cmd, IO(cap, io.err, data, proc=io.proc))
                data = Stream(cap.text())
        return rc

    async def _special_pipe(self, cmds: list[Node], io: IO) -> int | None:
        """``docker save IMAGE | ssh [opts] HOST docker load``: one image copy over the link."""
        if len(cmds) != 2 or not all(isinstance(c, Simple) for c in cmds):
            return None
        left = await self._expand_words(cmds[0].words)  # type: ignore[union-attr]
        right = await self._expand_words(cmds[1].words)  # type: ignore[union-attr]
        raw_left = left
        left, right = self.peel(left), self.peel(right)
        if left[:2] == ["docker", "save"] and right[:1] == ["ssh"]:
            refused = self.sudo_refusal(raw_left)
            if refused is not None:  # nothing is saved: the far side's load reads an empty stream
                io.err(refused)
                io.err("requested load from stdin, but stdin is empty\n")
                return 1
            saver = self
            if raw_left[:1] == ["sudo"] and not self.account.root:
                saver = self.fork()
                saver.account = ROOT
            return await saver.image_copy(left, right, io)  # type: ignore[attr-defined]
        if left[:2] == ["head", "-c"] and left[3:] == ["/dev/zero"] and left[2].isdigit():
            # `head -c N /dev/zero | CMD` (remote.peer_link_rate's stream): the same N NULs, made
            # once and not copied on the way. A node's `date` leaves the simulator's computing out
            # (clock.node_now), but the simulated `timeout 30` around the stream runs on the shared
            # clock, where 100 ms of copying 128 MiB at x1000 would read as its 30 s running out
            return await self.fork().command(cmds[1], IO(io.out, io.err, zeros(int(left[2])), proc=io.proc))
        return None

    @staticmethod
    def peel(argv: list[str]) -> list[str]:
        """Drop exec-style prefixes (``sudo -n``, ``timeout N``, ``env K=V``, ``nohup``...)."""
        while argv:
            a = argv[0]
            if a == "sudo":
                argv = argv[1:]
                while argv and argv[0].startswith("-"):
                    argv = argv[2:] if argv[0] in ("-u", "-g") else argv[1:]
            elif a == "timeout":
                argv = argv[1:]
                while argv and argv[0].startswith("-"):
                    argv = argv[2:] if argv[0] in ("-k", "-s") else argv[1:]
                argv = argv[1:]
            elif a == "env":
                argv = argv[1:]
                while argv and ("=" in argv[0] or argv[0].startswith("-")):
                    argv = argv[1:]
            elif a in ("nohup", "setsid", "exec", "nice", "stdbuf") or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", a):
                argv = argv[1:]
                while a in ("setsid", "nice", "stdbuf") and argv and argv[0].startswith("-"):
                    argv = argv[1:]
            else:
                break
        return argv

    async def command(self, node: Node, io: IO) -> int:
        if isinstance(node, Simple):
            return await self.simple(node, io)
        if isinstance(node, FuncDef):
            self.funcs[node.name] = node.body
            return 0
        redirs = getattr(node, "redirs", [])
        io2 = await self._redirect(redirs, io) if redirs else io
        if io2 is None:
            return 2
        if isinstance(node, If):
            for cond, body in node.clauses:
                if await self.run_list(cond, io2) == 0:
                    return await self.run_list(body, io2)
            if node.else_ is not None:
                return await self.run_list(node.else_, io2)
            return 0
        if isinstance(node, For):
            words = (await self._expand_words(node.words)) if node.words is not None else list(self.params)
            rc = 0
            for w in words:
                self.vars[node.var] = w
                try:
                    rc = await self.run_list(node.body, io2)
                except _Continue as c:
                    if c.n > 1:
                        raise _Continue(c.n - 1) from None
                    continue
                except _Break as b:
                    if b.n > 1:
                        raise _Break(b.n - 1) from None
                    break
            return rc
        if isinstance(node, Loop):
            rc = 0
            while True:
                c = await self.run_list(node.cond, io2)
                if (c == 0) == node.until:
                    return rc
                try:
                    rc = await self.run_list(node.body, io2)
                except _Continue as cc:
                    if cc.n > 1:
                        raise _Continue(cc.n - 1) from None
                    continue
                except _Break as b:
                    if b.n > 1:
                        raise _Break(b.n - 1) from None
                    return rc
                await asyncio.sleep(0)
        if isinstance(node, Group):
            if node.subshell:
                sub = self.fork()
                try:
                    return await sub.run_list(node.body, io2)
                except ShellExit as e:
                    return e.code
            return await self.run_list(node.body, io2)
        if isinstance(node, Case):
            word = await X.expand_str(self, node.word)
            for pats, body in node.arms:
                for p in pats:
                    if fnmatch.fnmatchcase(word, await X.expand_str(self, p)):
                        return await self.run_list(body, io2)
            return 0
        raise AssertionError(f"unknown node {node!r}")

    async def _expand_words(self, words: list[str]) -> list[str]:
        out: list[str] = []
        for w in words:
            out.extend(await X.expand_word(self, w))
        return out

    # ---- simple commands ---------------------------------------------------------------------

    async def simple(self, cmd: Simple, io: IO, reuse: Process | None = None) -> int:
        self.lineno = cmd.line
        self._cur_err = io.err
        self._subst_rc = None
        try:
            argv = await self._expand_words(cmd.words)
            assigns = {}
            for a in cmd.assigns:
                name, _, raw = a.partition("=")
                assigns[name] = await X.expand_str(self, raw)
        except X.ExpandError as exc:
            io.err(f"{self.err_prefix()}{exc}\n")
            return 2
        io2 = await self._redirect(cmd.redirs, io)
        if io2 is None:
            return 1 if argv else 2
        if not argv:
            self.vars.update(assigns)
            return self._subst_rc if self._subst_rc is not None else 0
        name = argv[0]
        if name in self.funcs:
            saved = self.params
            self.params = argv[1:]
            try:
                return await self.command(self.funcs[name], io2)
            except _Return as r:
                return r.code
            finally:
                self.params = saved
        builtin = getattr(self, "b_" + name.replace("[", "lbracket").replace(":", "colon").replace(".", "dot"),
                          None)
        if builtin is not None and re.fullmatch(r"[a-z\[:.]+", name):
            io2.env = self.env_for(assigns)
            try:
                return await builtin(argv, io2)
            except (ShellExit, _Break, _Return):
                raise
        env = self.env_for(assigns)
        return await self.external(argv, IO(io2.out, io2.err, io2.stdin, env, io2.proc), reuse)

    async def external(self, argv: list[str], io: IO, reuse: Process | None = None) -> int:
        """Run a tool as a process: in ``reuse`` (exec), else as a new child of this shell."""
        if reuse is not None:
            reuse.argv = list(argv)
            return await self.exec_argv(argv, IO(io.out, io.err, io.stdin, io.env, reuse))
        p = self.procs.spawn(argv, parent=self.proc)
        task = self.procs.start(p, self.exec_argv(argv, IO(io.out, io.err, io.stdin, io.env, p)))
        await asyncio.wait({task})  # our own cancellation does not cancel the child
        assert p.rc is not None
        return p.rc

    async def exec_argv(self, argv: list[str], io: IO) -> int:
        """``argv`` run inside process ``io.proc`` (wrappers exec the rest in the same process)."""
        try:
            return await self._exec_argv(argv, io)
        except ShellExit as e:
            return e.code
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug in a tool: say so instead of dying silently
            io.err(f"sparksim: internal error in {argv[0]}: {exc!r}\n")
            return 1

    async def _exec_argv(self, argv: list[str], io: IO) -> int:
        p = io.proc
        while argv:
            name = argv[0]
            if p is not None:
                p.argv = list(argv)  # what ps shows after each exec
            if name in ("nohup",):
                if p is not None:
                    p.nohup = True
                argv = argv[1:]
                if not argv:
                    io.err("nohup: missing operand\nTry 'nohup --help' for more information.\n")
                    return 125
                continue
            if name == "setsid":
                argv = argv[1:]
                while argv and argv[0].startswith("-"):
                    argv = argv[1:]
                if not argv:
                    io.err("setsid: no command specified\n")
                    return 1
                if p is not None and p.pid == p.pgid:
                    # a group leader cannot setsid(): setsid forks, the child runs on, the parent returns
                    child = self.procs.spawn(argv, parent=p, session_leader=True)
                    child.bg = True
                    child.nohup = p.nohup
                    self.procs.start(child, self.exec_argv(argv, IO(io.out, io.err, io.stdin, io.env, child)))
                    return 0
                if p is not None:
                    p.pgid = p.sid = p.pid
                    p.bg = True
                continue
            if name in ("exec", "nice", "stdbuf", "ionice"):
                argv = argv[1:]
                while name != "exec" and argv and argv[0].startswith("-"):
                    argv = argv[2:] if argv[0] in ("-n", "-c") else argv[1:]
                continue
            if name == "sudo":
                return await self._sudo(argv, io)
            if name == "env":
                argv = argv[1:]
                env = dict(io.env)
                while argv and (argv[0].startswith("-") or "=" in argv[0]):
                    if "=" in argv[0] and not argv[0].startswith("-"):
                        k, _, v = argv[0].partition("=")
                        env[k] = v
                    argv = argv[1:]
                io = IO(io.out, io.err, io.stdin, env, io.proc)
                if not argv:
                    io.out("".join(f"{k}={v}\n" for k, v in env.items()))
                    return 0
                continue
            if name == "timeout":
                return await self._timeout(argv, io)
            if name in ("sh", "bash", "/bin/sh", "/bin/bash", "dash"):
                return await self._sh(argv, io)
            break
        if not argv:
            return 0
        return await self.tool(argv, io)

    async def _timeout(self, argv: list[str], io: IO) -> int:
        args = argv[1:]
        while args and args[0].startswith("-"):
            args = args[2:] if args[0] in ("-k", "-s") else args[1:]
        if len(args) < 2:
            io.err("timeout: missing operand\nTry 'timeout --help' for more information.\n")
            return 125
        m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd]?)", args[0])
        if not m:
            io.err(f"timeout: invalid time interval '{args[0]}'\nTry 'timeout --help' for more information.\n")
            return 125
        secs = float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
        # coreutils' timeout forks its command and waits for it: two processes, as on the node (the
        # probe's process count, issue 25); a signal to timeout reaches the command too
        child = self.procs.spawn(args[1:], parent=io.proc)
        inner = self.procs.start(child, self._exec_argv(args[1:], IO(io.out, io.err, io.stdin, io.env, child)))
        timer = asyncio.ensure_future(self.clock.sleep(secs))
        try:
            await asyncio.wait({inner, timer}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            inner.cancel()
            raise
        finally:
            timer.cancel()
        if inner.done():
            return inner.result()
        inner.cancel()
        with contextlib.suppress(BaseException):
            await inner
        return 124

    # ---- sudo --------------------------------------------------------------------------------

    @staticmethod
    def _sudo_parse(argv: list[str]) -> tuple[set[str], str, list[str]]:
        """``sudo [OPTIONS] [--] COMMAND...``: (the option letters, the -u user, the command)."""
        args = list(argv[1:])
        opts: set[str] = set()
        user = "root"
        while args and args[0].startswith("-") and args[0] != "-":
            a = args.pop(0)
            if a == "--":
                break
            if a.startswith("--"):
                key, eq, val = a.partition("=")
                if key in SUDO_LONG_VALUE:
                    if not eq:
                        val = args.pop(0) if args else ""
                    if SUDO_LONG_VALUE[key] == "u":
                        user = val
                elif key in SUDO_LONG:
                    opts.add(SUDO_LONG[key])
                continue
            j = 1
            while j < len(a):
                ch = a[j]
                if ch in SUDO_VALUE_OPTS:
                    val = a[j + 1:] or (args.pop(0) if args else "")
                    if ch == "u":
                        user = val
                    break
                opts.add(ch)
                j += 1
        return opts, user, args

    def _sudo_path(self, name: str) -> str | None:
        """Where sudo finds ``name`` (``secure_path``; a path is taken as it is)."""
        return self.which(name)  # type: ignore[attr-defined]

    def sudo_allows(self, cmd: list[str]) -> bool:
        """Whether sudo runs ``cmd`` without a password: root and the permissive twin always; else
        only a NOPASSWD rule of the node (``SimNode.sudo_rules``) that matches the command's full
        path and arguments, as sudoers(5) matches a Cmnd: a rule with a path only allows any
        arguments, ``ALL`` allows everything."""
        if self.account.root or self.cluster.permissive:
            return True
        path = self._sudo_path(cmd[0]) if cmd else None
        for rule in self.cluster.node(self.node_name).sudo_rules:
            if tuple(rule) == ("ALL",):
                return True
            if path is not None and rule[0] == path and (len(rule) == 1 or tuple(rule[1:]) == tuple(cmd[1:])):
                return True
        return False

    def sudo_refusal(self, argv: list[str]) -> str | None:
        """What ``sudo`` at the head of ``argv`` prints when it will not run the command (None: it
        runs, or there is no sudo): ``sudo -n`` says a password is required; without ``-n`` there is
        no terminal to ask one on (an SSH exec channel has none)."""
        if argv[:1] != ["sudo"]:
            return None
        opts, _user, cmd = self._sudo_parse(argv)
        if self.sudo_allows(cmd):
            return None
        return SUDO_PASSWORD_REQUIRED if "n" in opts else SUDO_NO_TERMINAL + SUDO_PASSWORD_REQUIRED

    def _sudo_env(self, env: dict[str, str], target: Account, argv: list[str]) -> dict[str, str]:
        """sudoers' ``env_reset`` (the default): a fresh environment with the target user's HOME,
        USER, LOGNAME and SHELL, ``secure_path`` as PATH, the SUDO_* variables, and only the
        locale and terminal variables of the caller (sudoers(5), "Command environment")."""
        kept = {k: v for k, v in env.items()
                if k in ("TERM", "LANG", "LANGUAGE", "DISPLAY", "XAUTHORITY", "COLORTERM", "TZ") or k.startswith("LC_")}
        return {**kept, "HOME": target.home, "USER": target.user, "LOGNAME": target.user, "SHELL": "/bin/bash",
                "PATH": SUDO_SECURE_PATH, "SUDO_COMMAND": " ".join(argv), "SUDO_USER": self.account.user,
                "SUDO_UID": str(self.account.uid), "SUDO_GID": str(self.account.gid)}

    async def _sudo(self, argv: list[str], io: IO) -> int:
        """``sudo [-n] [-l] [-u USER] CMD...`` as on stock DGX OS: the login user has no password-less
        sudo (it is in the ``sudo`` group, which needs a password), so only a NOPASSWD rule lets a
        command through an SSH exec channel [real-dgx-os.md "The login user": sudo.ws, sparkrun]. A
        command sudo allows runs as root (a new shell process: ``id`` says root, ``$HOME`` is /root,
        /proc/sys/vm/drop_caches is writable)."""
        opts, user, cmd = self._sudo_parse(argv)
        if opts & {"k", "K"} and not cmd:
            return 0
        if "V" in opts:
            io.out("Sudo version 1.9.15p5\nSudoers policy plugin version 1.9.15p5\n")
            return 0
        if not cmd and not opts & {"l", "v", "i", "s"}:
            io.err("usage: sudo -h | -K | -k | -V\nusage: sudo -v [-ABkNnS] [-g group] [-h host] [-p prompt] "
                   "[-u user]\nusage: sudo -l [-ABkNnS] [-g group] [-h host] [-p prompt] [-U user]\n"
                   "            [-u user] [command [arg ...]]\n")
            return 1
        if user in ("root", "0", "#0"):
            target = ROOT
        elif user == self.account.user:
            target = self.account
        else:
            io.err(f"sudo: unknown user {user}\nsudo: error initializing audit plugin sudoers_audit\n")
            return 1
        rules = self.cluster.node(self.node_name).sudo_rules
        if "l" in opts:  # listpw=any (the default): one NOPASSWD entry lets the user list without a password
            if not cmd:
                if not (self.account.root or self.cluster.permissive or rules):
                    io.err(SUDO_PASSWORD_REQUIRED)
                    return 1
                shown = ["ALL"] if self.account.root or self.cluster.permissive else [" ".join(r) for r in rules]
                io.out(f"User {self.account.user} may run the following commands on {self.node_name}:\n"
                       + "".join(f"    (root) NOPASSWD: {r}\n" for r in shown))
                return 0
            if not self.sudo_allows(cmd):
                io.err(SUDO_PASSWORD_REQUIRED)
                return 1
            path = self._sudo_path(cmd[0])
            if path is None:
                return 1
            io.out(" ".join([path, *cmd[1:]]) + "\n")  # sudo -l CMD: the command as it would run
            return 0
        if not self.sudo_allows(cmd):
            io.err(SUDO_PASSWORD_REQUIRED if "n" in opts else SUDO_NO_TERMINAL + SUDO_PASSWORD_REQUIRED)
            return 1
        if not cmd:  # -v: the cached credentials are fine
            return 0
        path = self._sudo_path(cmd[0])
        if path is None:
            io.err(f"sudo: {cmd[0]}: command not found\n")
            return 1
        sub = self.fork()
        sub.account = target
        env = dict(io.env) if self.account.root else self._sudo_env(io.env, target, [path, *cmd[1:]])
        sub.vars, sub.exported = dict(env), set(env)
        return await sub._exec_argv(cmd, IO(io.out, io.err, io.stdin, env, io.proc))

    async def _sh(self, argv: list[str], io: IO) -> int:
        args = argv[1:]
        script: str | None = None
        while args and args[0].startswith("-") and args[0] != "-":
            flag = args.pop(0)
            if "c" in flag:
                if not args:
                    io.err(f"{argv[0]}: 0: -c requires an argument\n")
                    return 2
                script = args.pop(0)
        sub = self.fresh(io.proc)
        sub.vars.update(io.env)
        sub.exported |= set(io.env)
        if script is not None:
            if args:
                sub.arg0, sub.params = args[0], args[1:]
            else:
                sub.arg0 = argv[0].rsplit("/", 1)[-1]
            return await sub.run_script(script, io, exec_in=io.proc)
        if args:
            try:
                text = self.fs.read_text(args[0], self.cwd)
            except FsError:
                io.err(f"{argv[0]}: 0: cannot open {args[0]}: No such file\n")
                return 2
            sub.arg0, sub.params = args[0], args[1:]
            return await sub.run_script(text, io)
        return await sub.run_script(io.stdin or "", IO(io.out, io.err, "", io.env, io.proc))

    async def tool(self, argv: list[str], io: IO) -> int:
        name = argv[0]
        base = name.rsplit("/", 1)[-1] if name.startswith(("/usr/", "/bin/", "/sbin/")) else name
        handler: Callable[[list[str], IO], Awaitable[int]] | None = None
        if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", base) and not self.absent(base):
            handler = getattr(self, "c_" + base.replace("-", "_").replace(".", "_"), None)
        if handler is None:
            io.err(f"{self.err_prefix()}{name}: not found\n")
            return 127
        return await handler([base, *argv[1:]], io)

    # ---- redirections ------------------------------------------------------------------------

    async def _redirect(self, redirs: list[Redir], io: IO) -> IO | None:
        if not redirs:
            return io
        fds: dict[int, Writer] = {1: io.out, 2: io.err}
        stdin = io.stdin
        for r in redirs:
            if isinstance(r.target, HereDoc):
                hd = r.target
                stdin = Stream(hd.body if hd.quoted else await X.expand_heredoc(self, hd.body))
                continue
            try:
                fields = await X.expand_word(self, r.target, split=True, glob=True)
            except X.ExpandError as exc:
                io.err(f"{self.err_prefix()}{exc}\n")
                return None
            if len(fields) != 1:
                io.err(f"{self.err_prefix()}{r.target}: Ambiguous redirect\n" if fields else
                       f"{self.err_prefix()}: Ambiguous redirect\n")
                return None
            target = fields[0]
            if r.op in (">&", "<&"):
                if target == "-":
                    fds[r.fd] = _null
                    continue
                if target.isdigit():
                    src = int(target)
                    if src == 0 and r.op == "<&":
                        continue
                    if src not in fds:
                        io.err(f"{self.err_prefix()}{src}: Bad file descriptor\n")
                        return None
                    fds[r.fd] = fds[src]
                    continue
                # >& FILE (bash): both to the file
            if r.op in ("<", "<>"):
                if r.fd != 0:
                    continue
                if target == "/dev/null":
                    stdin = ""
                    continue
                try:
                    stdin = Stream(self.fs.read_text(target, self.cwd))
                except FsError:
                    io.err(f"{self.err_prefix()}cannot open {target}: No such file\n")
                    return None
                continue
            w = self._open_writer(target, r.op == ">>", io.err)
            if w is None:
                return None
            fds[r.fd] = w
            if r.op == ">&":
                fds[1] = fds[2] = w
        return IO(fds.get(1, _null), fds.get(2, _null), stdin, io.env, io.proc)

    def _open_writer(self, target: str, append: bool, err: Writer) -> Writer | None:
        if target in ("/dev/null", "/dev/zero"):
            return _null
        if target in ("/dev/stderr", "/dev/fd/2"):
            return err
        if target == "/proc/sys/vm/drop_caches":
            if not self.account.root:  # mode 0200 root: the login user cannot open it (proc_sys_kernel(5))
                err(f"{self.err_prefix()}cannot create {target}: Permission denied\n")
                return None

            def drop(s: str) -> None:
                if s.strip() in ("1", "2", "3"):
                    self.cluster.drop_caches(self.node_name)
            return drop
        try:
            real = self.fs.open_write(target, append, self.cwd)
        except FsError as exc:
            why = "Directory nonexistent" if exc.reason == "No such file or directory" else exc.reason
            err(f"{self.err_prefix()}cannot create {target}: {why}\n")
            return None
        fs = self.fs
        return lambda s: fs.append(real, s)

    # ---- builtins ----------------------------------------------------------------------------

    async def b_colon(self, argv: list[str], io: IO) -> int:
        return 0

    async def b_true(self, argv: list[str], io: IO) -> int:
        return 0

    async def b_false(self, argv: list[str], io: IO) -> int:
        return 1

    async def b_exit(self, argv: list[str], io: IO) -> int:
        if len(argv) > 1 and not re.fullmatch(r"\d+", argv[1]):
            io.err(f"{self.err_prefix()}exit: Illegal number: {argv[1]}\n")
            raise ShellExit(2)
        raise ShellExit(int(argv[1]) % 256 if len(argv) > 1 else self.last_rc)

    async def b_return(self, argv: list[str], io: IO) -> int:
        raise _Return(int(argv[1]) if len(argv) > 1 and argv[1].isdigit() else self.last_rc)

    async def b_break(self, argv: list[str], io: IO) -> int:
        raise _Break(int(argv[1]) if len(argv) > 1 and argv[1].isdigit() else 1)

    async def b_continue(self, argv: list[str], io: IO) -> int:
        raise _Continue(int(argv[1]) if len(argv) > 1 and argv[1].isdigit() else 1)

    async def b_export(self, argv: list[str], io: IO) -> int:
        args = [a for a in argv[1:] if a != "-p"]
        if not args:
            io.out("".join(f"export {k}='{v}'\n" for k, v in sorted(self.vars.items()) if k in self.exported))
            return 0
        for a in args:
            name, eq, val = a.partition("=")
            if eq:
                self.vars[name] = val
            self.exported.add(name)
        return 0

    async def b_readonly(self, argv: list[str], io: IO) -> int:
        for a in argv[1:]:
            name, eq, val = a.partition("=")
            if eq:
                self.vars[name] = val
        return 0

    async def b_local(self, argv: list[str], io: IO) -> int:
        return await self.b_readonly(argv, io)

    async def b_unset(self, argv: list[str], io: IO) -> int:
        for a in argv[1:]:
            if a in ("-v", "-f"):
                continue
            self.vars.pop(a, None)
            self.exported.discard(a)
            self.funcs.pop(a, None)
        return 0

    async def b_set(self, argv: list[str], io: IO) -> int:
        if len(argv) == 1:
            io.out("".join(f"{k}='{v}'\n" for k, v in sorted(self.vars.items())))
            return 0
        args = argv[1:]
        if args and args[0] == "--":
            self.params = args[1:]
        elif args and not args[0].startswith(("-", "+")):
            self.params = args
        return 0  # options (-e, -u, -x, -o pipefail) are accepted and not modelled

    async def b_shift(self, argv: list[str], io: IO) -> int:
        n = int(argv[1]) if len(argv) > 1 and argv[1].isdigit() else 1
        if n > len(self.params):
            io.err(f"{self.err_prefix()}shift: can't shift that many\n")
            return 2
        self.params = self.params[n:]
        return 0

    async def b_trap(self, argv: list[str], io: IO) -> int:
        return 0

    async def b_umask(self, argv: list[str], io: IO) -> int:
        if len(argv) == 1:
            io.out("0022\n")
        return 0

    async def b_cd(self, argv: list[str], io: IO) -> int:
        target = argv[1] if len(argv) > 1 else self.vars.get("HOME", self.account.home)
        if target == "-":
            target = self.vars.get("OLDPWD", self.cwd)
        ent = self.fs.lookup(target, True, self.cwd)
        if ent is None or ent.kind != "dir":
            io.err(f"{self.err_prefix()}cd: can't cd to {target}\n")
            return 2
        self.vars["OLDPWD"] = self.cwd
        self.cwd = self.fs.resolve(target, True, self.cwd)
        self.vars["PWD"] = self.cwd
        return 0

    async def b_pwd(self, argv: list[str], io: IO) -> int:
        io.out(self.cwd + "\n")
        return 0

    async def b_eval(self, argv: list[str], io: IO) -> int:
        return await self.run_script(" ".join(argv[1:]), io)

    async def b_read(self, argv: list[str], io: IO) -> int:
        """``read [-r] NAME…``: one line of stdin, consumed, as a shell's ``read`` does, so ``… | while
        read -r a b; do …; done`` walks the lines and ends at the last (exit 1 at end of input). Every
        command of the loop gets the same stdin text (one ``str``), so how far it was read is kept
        beside it, by that object."""
        names = [a for a in argv[1:] if not a.startswith("-")] or ["REPLY"]
        data = io.stdin or ""
        if not isinstance(data, Stream):  # text handed over whole, not through a pipe or a file: from its start
            data = Stream(data)
        held = self._stdin_pos.get(id(data))
        pos = held[1] if held is not None and held[0] is data else 0
        if pos >= len(data):
            self._stdin_pos.pop(id(data), None)
            for n in names:  # at end of input the names are emptied (dash): `while read -r l || [ -n "$l" ]` ends
                self.vars[n] = ""
            return 1
        end = data.find("\n", pos)
        line = data[pos:] if end < 0 else data[pos:end]
        nxt = len(data) if end < 0 else end + 1
        if len(self._stdin_pos) > 64:  # loops that stopped reading before the end
            self._stdin_pos.clear()
        self._stdin_pos[id(data)] = (data, nxt)
        parts = line.split(None, len(names) - 1)
        for k, n in enumerate(names):
            self.vars[n] = parts[k] if k < len(parts) else ""
        return 0

    async def b_wait(self, argv: list[str], io: IO) -> int:
        pids = [int(a) for a in argv[1:] if a.isdigit()]
        rc = 0
        if not pids:
            for p in list(self.jobs.values()):
                await p.done.wait()
            self.jobs.clear()
            return 0
        for pid in pids:
            p = self.jobs.pop(pid, None)
            if p is None:
                rc = 127
                continue
            await p.done.wait()
            rc = p.rc if p.rc is not None else 0
        return rc

    async def b_kill(self, argv: list[str], io: IO) -> int:
        args = argv[1:]
        sig = SIGNALS["TERM"]
        if args and args[0] == "-l":
            io.out(" ".join(n for _s, n in sorted((s, n) for n, s in SIGNALS.items())) + "\n")
            return 0
        if args and args[0] == "-s" and len(args) > 1:
            name = args[1].upper().removeprefix("SIG")
            if name not in SIGNALS and not name.isdigit():
                io.err(f"{self.err_prefix()}kill: invalid signal number or name: {args[1]}\n")
                return 2
            sig = int(name) if name.isdigit() else SIGNALS[name]
            args = args[2:]
        elif (args and args[0].startswith("-") and args[0] != "--" and not args[0][1:].isdigit()) or (
                args and re.fullmatch(r"-\d+", args[0]) and len(args) > 1):
            name = args[0][1:].upper().removeprefix("SIG")
            if name.isdigit():
                sig = int(name)
            elif name in SIGNALS:
                sig = SIGNALS[name]
            else:
                io.err(f"{self.err_prefix()}kill: invalid signal number or name: {args[0][1:]}\n")
                return 2
            args = args[1:]
        if args and args[0] == "--":
            args = args[1:]
        if not args:
            io.err(f"{self.err_prefix()}kill: Usage: kill [-s sigspec | -signum | -sigspec] [pid | job]... or\n"
                   "kill -l [exitstatus]\n")
            return 2
        rc = 0
        for a in args:
            if not re.fullmatch(r"-?\d+", a):
                io.err(f"{self.err_prefix()}kill: Illegal number: {a}\n")
                rc = 2
                continue
            if not self.procs.signal(int(a), sig):
                io.err(f"{self.err_prefix()}kill: No such process\n")
                rc = 1
        await asyncio.sleep(0)
        return rc

    async def b_echo(self, argv: list[str], io: IO) -> int:
        args = argv[1:]
        nl = True
        if args and args[0] == "-n":
            nl, args = False, args[1:]
        text = " ".join(args)
        if "\\" in text:  # dash's echo interprets escapes
            cut = text.find("\\c")
            if cut >= 0:
                text, nl = text[:cut], False
            text = _escapes(text)
        io.out(text + ("\n" if nl else ""))
        return 0

    async def b_printf(self, argv: list[str], io: IO) -> int:
        if len(argv) < 2:
            io.err(f"{self.err_prefix()}printf: usage: printf format [arg ...]\n")
            return 2
        fmt, args = argv[1], argv[2:]
        out: list[str] = []
        while True:
            text, used = _printf(fmt, args)
            out.append(text)
            args = args[used:]
            if not args or used == 0:
                break
        io.out("".join(out))
        return 0

    async def b_test(self, argv: list[str], io: IO) -> int:
        return self._test(argv[1:], io)

    async def b_lbracket(self, argv: list[str], io: IO) -> int:
        if argv[-1] != "]":
            io.err(f"{self.err_prefix()}[: missing ]\n")
            return 2
        return self._test(argv[1:-1], io)

    async def b_command(self, argv: list[str], io: IO) -> int:
        if len(argv) >= 3 and argv[1] in ("-v", "-V"):
            rc = 0
            for a in argv[2:]:
                path = self.which(a)  # type: ignore[attr-defined]
                if path:
                    io.out(path + "\n")
                else:
                    rc = 127 if argv[1] == "-V" else 1
            return rc
        if len(argv) < 2:
            return 0
        return await self.external(argv[1:], io)

    async def b_type(self, argv: list[str], io: IO) -> int:
        rc = 0
        for a in argv[1:]:
            path = self.which(a)  # type: ignore[attr-defined]
            if path:
                io.out(f"{a} is {path}\n")
            else:
                io.out(f"{a}: not found\n")
                rc = 127
        return rc

    def _test(self, args: list[str], io: IO) -> int:
        try:
            return 0 if self._test_expr(args) else 1
        except ValueError as exc:
            io.err(f"{self.err_prefix()}{'test'}: {exc}\n")
            return 2

    def _test_expr(self, a: list[str]) -> bool:
        if not a:
            return False
        if "-o" in a[1:-1]:
            k = a.index("-o", 1)
            return self._test_expr(a[:k]) or self._test_expr(a[k + 1:])
        if "-a" in a[1:-1]:
            k = a.index("-a", 1)
            return self._test_expr(a[:k]) and self._test_expr(a[k + 1:])
        if a[0] == "!" and len(a) > 1:
            return not self._test_expr(a[1:])
        if a[0] == "(" and a[-1] == ")":
            return self._test_expr(a[1:-1])
        if len(a) == 1:
            return a[0] != ""
        if len(a) == 2:
            op, x = a
            if op == "-n":
                return x != ""
            if op == "-z":
                return x == ""
            ent = self.fs.lookup(x, True, self.cwd) if op != "-L" and op != "-h" else self.fs.lookup(x, False, self.cwd)
            if op == "-e" or op in ("-r", "-w"):
                return ent is not None
            if op == "-x":
                return ent is not None and (ent.kind == "dir" or self.which(x) is not None)  # type: ignore[attr-defined]
            if op == "-f":
                return ent is not None and ent.kind == "file"
            if op == "-d":
                return ent is not None and ent.kind == "dir"
            if op == "-s":
                return (ent is not None and ent.kind != "dir" and ent.nbytes() > 0) or (
                    ent is not None and ent.kind == "dir")
            if op in ("-L", "-h"):
                return ent is not None and ent.kind == "link"
            if op == "-t":
                return False
            raise ValueError(f"{op}: unexpected operator")
        if len(a) == 3:
            x, op, y = a
            if op == "=":
                return x == y
            if op == "!=":
                return x != y
            ints = {"-eq": int.__eq__, "-ne": int.__ne__, "-lt": int.__lt__, "-le": int.__le__,
                    "-gt": int.__gt__, "-ge": int.__ge__}
            if op in ints:
                for v in (x, y):
                    if not re.fullmatch(r"\s*-?\d+\s*", v):
                        raise ValueError(f"Illegal number: {v}")
                return bool(ints[op](int(x), int(y)))
            raise ValueError(f"{op}: unexpected operator")
        raise ValueError(f"{a[1]}: unexpected operator")


def _escapes(s: str) -> str:
    table = {"n": "\n", "t": "\t", "\\": "\\", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v", "e": "\x1b"}
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 1 < len(s):
            c = s[i + 1]
            if c in table:
                out.append(table[c])
                i += 2
                continue
            if c == "0":
                m = re.match(r"0([0-7]{0,3})", s[i + 1:])
                assert m
                out.append(chr(int(m.group(1) or "0", 8)))
                i += 1 + len(m.group(0))
                continue
        out.append(s[i])
        i += 1
    return "".join(out)


def _printf(fmt: str, args: list[str]) -> tuple[str, int]:
    out: list[str] = []
    used = 0
    i = 0
    while i < len(fmt):
        ch = fmt[i]
        if ch == "\\":
            j = i + 2
            if fmt[i + 1:i + 2] == "0":
                m = re.match(r"[0-7]{1,3}", fmt[i + 2:])
                j = i + 2 + (len(m.group(0)) if m else 0)
            out.append(_escapes(fmt[i:j]))
            i = j
            continue
        if ch == "%":
            m = re.match(r"%([-+ #0]*)(\d*)(?:\.(\d+))?([sdiuxXobcf%])", fmt[i:])
            if not m:
                out.append(ch)
                i += 1
                continue
            conv = m.group(4)
            if conv == "%":
                out.append("%")
            else:
                arg = args[used] if used < len(args) else ""
                used += 1
                spec = "%" + m.group(1) + m.group(2) + (("." + m.group(3)) if m.group(3) else "")
                if conv == "s":
                    out.append((spec + "s") % arg)
                elif conv == "b":
                    out.append((spec + "s") % _escapes(arg))
                elif conv == "c":
                    out.append(arg[:1])
                elif conv == "f":
                    out.append((spec + "f") % float(arg or 0))
                else:
                    try:
                        num = int(arg or "0", 0) if arg.startswith("0x") else int(arg or "0")
                    except ValueError:
                        num = 0
                    out.append((spec + ("d" if conv in "iu" else conv)) % num)
            i += len(m.group(0))
            continue
        out.append(ch)
        i += 1
    return "".join(out), used
