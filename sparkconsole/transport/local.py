"""Local transport: the same protocol with asyncio subprocesses, for running on a Spark itself.

Every command runs as ``sh -c TEXT`` in its own session (process group), so a timeout, the end
of a stream or ``close()`` kills the whole tree the command started, not just the shell.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator

from sparkconsole.errors import TransportError
from sparkconsole.transport.base import CommandLike, CommandResult, command_text

_LINE_LIMIT = 16 * 1024 * 1024  # `ip -j addr` on a host with many veths is one long line


def _short(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _kill_tree(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


async def _reap(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(proc.wait(), 5)


class LocalProcess:
    """A long-lived local process: write lines to its stdin, read lines from its stdout."""

    def __init__(self, node: str, proc: asyncio.subprocess.Process) -> None:
        self._node = node
        self._proc = proc
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
        _kill_tree(self._proc)
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

    async def close(self) -> None:
        self._closed = True

    async def _spawn(self, text: str, *, stdin: int, stderr: int) -> asyncio.subprocess.Process:
        try:
            return await asyncio.create_subprocess_exec(
                self.shell, "-c", text,
                stdin=stdin, stdout=asyncio.subprocess.PIPE, stderr=stderr,
                start_new_session=True, limit=_LINE_LIMIT,
            )
        except OSError as exc:
            raise TransportError(f"{self.node}: cannot start {self.shell}: {exc.strerror or exc}") from None

    async def run(self, cmd: CommandLike, timeout: float = 30.0, input: str | None = None) -> CommandResult:
        text = command_text(cmd)
        start = time.monotonic()
        proc = await self._spawn(
            text,
            stdin=asyncio.subprocess.DEVNULL if input is None else asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(
                proc.communicate(None if input is None else input.encode()), timeout
            )
        except TimeoutError:
            _kill_tree(proc)
            await _reap(proc)
            raise TransportError(f"{self.node}: timed out after {timeout:g} s: {_short(text)}") from None
        except BaseException:
            _kill_tree(proc)
            await _reap(proc)
            raise
        rc = proc.returncode
        return CommandResult(
            command=text,
            exit_status=rc if rc is not None and rc >= 0 else None,
            stdout=_decode(out),
            stderr=_decode(err),
            duration_s=time.monotonic() - start,
        )

    async def stream(self, cmd: CommandLike) -> AsyncIterator[str]:
        """Lines of stdout and stderr (merged) as they come; stopping kills the process tree."""
        text = command_text(cmd)
        proc = await self._spawn(text, stdin=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.STDOUT)
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
            _kill_tree(proc)
            await _reap(proc)

    async def open_process(self, cmd: CommandLike) -> LocalProcess:
        text = command_text(cmd)
        proc = await self._spawn(text, stdin=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        return LocalProcess(self.node, proc)

    def __repr__(self) -> str:
        return f"<LocalTransport {self.node}>"
