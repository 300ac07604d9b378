"""Local transport: the same protocol with asyncio subprocesses, for running on a Spark itself.

Every command runs as ``sh -c TEXT`` in its own session (process group) with
``SPARKCONSOLE_RUN=<token>`` in its environment, which every process it starts inherits. A
timeout, the end of a stream or ``close()`` kills the process group and then every process that
carries the token, so the whole tree goes, even a child that left the group (``setsid``). A
timed-out ``run`` raises the same :class:`~sparkconsole.transport.base.CommandTimeout` as the SSH
transport, saying whether the tree was killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

from sparkconsole.errors import TransportError
from sparkconsole.transport.base import (
    DEFAULT_MAX_BYTES,
    CommandLike,
    CommandResult,
    CommandTimeout,
    command_text,
    cut_marker,
    read_both_bounded,
)

_LINE_LIMIT = 16 * 1024 * 1024  # `ip -j addr` on a host with many veths is one long line
RUN_TOKEN_VAR = "SPARKCONSOLE_RUN"  # the same variable the SSH transport exports on the node


def _short(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _carrying(token: str) -> list[int]:
    """The pids of the processes whose environment holds ``SPARKCONSOLE_RUN=token``."""
    needle = f"{RUN_TOKEN_VAR}={token}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            found.append(int(entry.name))
    return found


def _kill_tree(proc: asyncio.subprocess.Process, token: str) -> int | None:
    """SIGKILL ``proc``'s process group and every process carrying ``token``, repeated until
    none is left (a child forked meanwhile inherits it). How many processes were killed, or
    ``None`` when some would not go. Nothing is done once ``proc`` has exited by itself."""
    if proc.returncode is not None:
        return 0
    killed: set[int] = set()
    for round_ in range(5):
        pids = [p for p in _carrying(token) if p != os.getpid()]
        if round_ == 0:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        elif not pids:
            return len(killed)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
        time.sleep(0.01)  # let the kernel take them away (a zombie keeps no environ)
    return None if _carrying(token) else len(killed)


async def _feed(proc: asyncio.subprocess.Process, data: bytes) -> None:
    """Write ``data`` to the command's stdin and close it (a command that stops reading is no error)."""
    assert proc.stdin is not None
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        proc.stdin.write(data)
        await proc.stdin.drain()
    with contextlib.suppress(Exception):
        proc.stdin.close()


async def _reap(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(proc.wait(), 5)


class LocalProcess:
    """A long-lived local process: write lines to its stdin, read lines from its stdout."""

    def __init__(self, node: str, proc: asyncio.subprocess.Process, token: str) -> None:
        self._node = node
        self._proc = proc
        self._token = token
        self.stderr_tail: list[str] = []
        self._stderr_task = asyncio.create_task(self._drain_stderr())
        self._closing = False

    async def _drain_stderr(self) -> None:
        assert self._proc.stderr is not None
        with contextlib.suppress(Exception):
            while line := await self._proc.stderr.readline():
                self.stderr_tail.append(_decode(line).rstrip("\n"))
                del self.stderr_tail[:-20]

    async def write_line(self, line: str) -> None:
        assert self._proc.stdin is not None
        if self.is_closing:
            raise TransportError(f"{self._node}: the process has ended")
        try:
            self._proc.stdin.write((line + "\n").encode())
            await self._proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise TransportError(f"{self._node}: cannot write to the process: {exc}") from None

    async def read_line(self) -> str | None:
        assert self._proc.stdout is not None
        try:
            line = await self._proc.stdout.readline()
        except (ValueError, asyncio.LimitOverrunError) as exc:
            raise TransportError(f"{self._node}: a line too long from the process: {exc}") from None
        if not line:
            return None
        text = _decode(line)
        return text[:-1] if text.endswith("\n") else text

    @property
    def is_closing(self) -> bool:
        return self._closing or self._proc.returncode is not None

    @property
    def exit_status(self) -> int | None:
        return self._proc.returncode

    async def close(self) -> None:
        self._closing = True
        if self._proc.stdin is not None:
            with contextlib.suppress(Exception):
                self._proc.stdin.close()
        _kill_tree(self._proc, self._token)
        await _reap(self._proc)
        self._stderr_task.cancel()
        await asyncio.gather(self._stderr_task, return_exceptions=True)


class LocalTransport:
    """The :class:`~sparkconsole.transport.base.Transport` for the machine the console runs on."""

    def __init__(self, node_name: str, shell: str = "sh") -> None:
        self.node = node_name
        self.shell = shell
        self._closed = False

    @property
    def connected(self) -> bool:
        return not self._closed

    async def connect(self) -> None:
        self._closed = False

    def server_host_key(self) -> str | None:
        return None  # no ssh: the node's key is read from its file

    async def close(self) -> None:
        self._closed = True

    async def _spawn(self, text: str, *, stdin: int, stderr: int) -> tuple[asyncio.subprocess.Process, str]:
        """Start ``sh -c text`` in a session of its own, marked with a fresh run token."""
        token = uuid.uuid4().hex
        try:
            proc = await asyncio.create_subprocess_exec(
                self.shell, "-c", text,
                stdin=stdin, stdout=asyncio.subprocess.PIPE, stderr=stderr,
                start_new_session=True, limit=_LINE_LIMIT, env={**os.environ, RUN_TOKEN_VAR: token},
            )
            return proc, token
        except OSError as exc:
            raise TransportError(f"{self.node}: cannot start {self.shell}: {exc.strerror or exc}") from None

    async def run(self, cmd: CommandLike, timeout: float = 30.0, input: str | None = None, *,
                  max_bytes: int = DEFAULT_MAX_BYTES) -> CommandResult:
        """Run ``cmd`` to completion, keeping at most ``max_bytes`` of stdout and of stderr: a stream
        that passes the bound is cut there (:func:`~sparkconsole.transport.base.cut_marker`) and the
        command's tree is killed, so an endless writer costs the console ``max_bytes``, not its memory."""
        text = command_text(cmd)
        limit = max(0, int(max_bytes))
        start = time.monotonic()
        proc, token = await self._spawn(
            text,
            stdin=asyncio.subprocess.DEVNULL if input is None else asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        cuts: set[str] = set()

        async def talk() -> tuple[bytes, bytes]:
            feeder = asyncio.ensure_future(_feed(proc, input.encode())) if input is not None else None
            try:
                # at the first cut the command's tree is killed: the other stream ends with it
                out, err, over = await read_both_bounded(proc.stdout, proc.stderr, limit,
                                                         on_first_cut=lambda: _kill_tree(proc, token))
                cuts.update(over)
                if feeder is not None:
                    await feeder
                await proc.wait()
            finally:
                if feeder is not None:
                    feeder.cancel()
            return out, err

        try:
            out, err = await asyncio.wait_for(talk(), timeout)
        except TimeoutError:
            n = _kill_tree(proc, token)
            await _reap(proc)
            head = f"{self.node}: timed out after {timeout:g} s: {_short(text)}"
            if n is None:
                raise CommandTimeout(f"{head}; could not kill all of it: it may still be running",
                                     killed=False) from None
            raise CommandTimeout(
                f"{head}; killed on the node ({n} process{'' if n == 1 else 'es'})", killed=True, processes=n
            ) from None
        except BaseException:
            _kill_tree(proc, token)
            await _reap(proc)
            raise
        rc = proc.returncode
        stdout, stderr = _decode(out), _decode(err)
        if "out" in cuts:
            stdout += cut_marker(limit)
        if "err" in cuts:
            stderr += cut_marker(limit)
        cut = bool(cuts)
        return CommandResult(
            command=text,
            exit_status=None if cut else (rc if rc is not None and rc >= 0 else None),
            stdout=stdout,
            stderr=stderr,
            duration_s=time.monotonic() - start,
            truncated=cut,
        )

    async def stream(self, cmd: CommandLike) -> AsyncIterator[str]:
        """Lines of stdout and stderr (merged) as they come; stopping kills the process tree."""
        text = command_text(cmd)
        proc, token = await self._spawn(text, stdin=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.STDOUT)
        assert proc.stdout is not None
        try:
            while line := await proc.stdout.readline():
                s = _decode(line)
                if s.endswith("\n"):
                    s = s[:-1]
                    if s.endswith("\r"):
                        s = s[:-1]
                yield s
        finally:
            _kill_tree(proc, token)
            await _reap(proc)

    async def open_process(self, cmd: CommandLike) -> LocalProcess:
        text = command_text(cmd)
        proc, token = await self._spawn(text, stdin=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        return LocalProcess(self.node, proc, token)

    def __repr__(self) -> str:
        return f"<LocalTransport {self.node}>"
