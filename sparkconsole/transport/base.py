"""What every transport offers: run a command, stream its lines, hold a long-lived process.

Two implementations: :mod:`sparkconsole.transport.ssh` (asyncssh, one kept connection per node)
and :mod:`sparkconsole.transport.local` (asyncio subprocess, for running on a Spark itself).
Callers pass either a :class:`~sparkconsole.remote.RemoteCommand` or a string that was built by
:mod:`sparkconsole.remote` / :mod:`sparkconsole.probe.script`; transports never build commands.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from sparkconsole.errors import TransportError, ValidationError
from sparkconsole.remote import RemoteCommand

CommandLike = RemoteCommand | str

#: The most of one stream (stdout, stderr) a ``run`` keeps: a node's answer is data, and no command's
#: output may grow without limit in the console (an endless ``docker ps``, a hostile page). 16 MiB is
#: far above any answer the console reads; callers that need less pass less (``max_bytes``).
DEFAULT_MAX_BYTES = 16 * 1024 * 1024


def cut_marker(max_bytes: int) -> str:
    """The line a ``run`` appends to a stream it cut at ``max_bytes`` (never part of what the node sent)."""
    return f"\n[sparkconsole: output cut at {max_bytes} bytes; the rest was not read]\n"


async def read_bounded(stream: Any, max_bytes: int) -> tuple[Any, bool]:
    """One stream to its end, keeping at most ``max_bytes``; ``(kept, cut)``. The stream yields bytes (a
    subprocess's pipe) or text (an SSH channel, counted as UTF-8). Reading stops at the bound, so nothing
    past it is ever held: the writer then blocks (a full pipe, a full channel window) until the caller
    stops the command."""
    if stream is None:
        return b"", False
    parts: list[Any] = []
    size = 0
    while True:
        chunk = await stream.read(64 * 1024)
        if not chunk:
            return chunk[:0].join(parts), False
        raw = chunk.encode("utf-8", "replace") if isinstance(chunk, str) else chunk
        if size + len(raw) > max_bytes:
            room = max(0, max_bytes - size)
            parts.append(raw[:room].decode("utf-8", "ignore") if isinstance(chunk, str) else raw[:room])
            return chunk[:0].join(parts), True
        parts.append(chunk)
        size += len(raw)


async def read_both_bounded(stdout: Any, stderr: Any, max_bytes: int, *, on_first_cut: Callable[[], None] | None = None,
                            read_on_after_cut: bool = True) -> tuple[Any, Any, set[str]]:
    """stdout and stderr read together, each bounded (:func:`read_bounded`); the names (``out``,
    ``err``) of the streams that were cut. At the first cut ``on_first_cut`` runs (a local run kills the
    command's tree there, so the other stream ends too); without ``read_on_after_cut`` the other stream
    is no longer waited for (an SSH channel is closed by the caller)."""
    tasks = {asyncio.ensure_future(read_bounded(stdout, max_bytes)): "out",
             asyncio.ensure_future(read_bounded(stderr, max_bytes)): "err"}
    got: dict[str, Any] = {}
    cuts: set[str] = set()
    try:
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                data, over = task.result()
                got[tasks[task]] = data
                if over:
                    if not cuts and on_first_cut is not None:
                        on_first_cut()
                    cuts.add(tasks[task])
            if cuts and not read_on_after_cut:
                break
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return got.get("out", b""), got.get("err", b""), cuts


def command_text(cmd: CommandLike) -> str:
    """The exact shell text of ``cmd``. A NUL byte is refused here: no shell word can hold one
    (``shlex.quote`` keeps it), and OpenSSH's sshd drops the whole connection (every other channel
    of the node with it) on an exec request that carries one."""
    text = cmd.shell() if isinstance(cmd, RemoteCommand) else cmd
    if "\x00" in text:
        raise ValidationError(f"a command cannot carry a NUL byte: {text[:80]!r}")
    return text


@dataclass(frozen=True)
class CommandResult:
    """What one finished command gave back."""

    command: str
    exit_status: int | None  # None: killed by a signal or timed out
    stdout: str
    stderr: str
    duration_s: float
    #: a stream passed ``max_bytes``: what was kept ends with :func:`cut_marker`, and the command was
    #: stopped there (its ``exit_status`` is then ``None``: it did not finish by itself)
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_status == 0


@runtime_checkable
class LongProcess(Protocol):
    """A process kept open for the session (the probe): write lines, read lines."""

    async def write_line(self, line: str) -> None: ...

    async def read_line(self) -> str | None:
        """The next stdout line without its newline, or ``None`` at end of stream."""
        ...

    async def close(self) -> None: ...

    @property
    def is_closing(self) -> bool: ...


@runtime_checkable
class Transport(Protocol):
    """How commands reach one node."""

    node: str

    async def connect(self) -> None:
        """Open (or re-open) the connection; idempotent."""
        ...

    async def run(self, cmd: CommandLike, timeout: float = 30.0, input: str | None = None, *,
                  max_bytes: int = DEFAULT_MAX_BYTES) -> CommandResult:
        """Run ``cmd`` to completion; raises :class:`~sparkconsole.errors.TransportError`. At most
        ``max_bytes`` of each of stdout and stderr are kept: past that the command is stopped and the
        result is ``truncated``."""
        ...

    def stream(self, cmd: CommandLike) -> AsyncIterator[str]:
        """Yield the lines of stdout+stderr of ``cmd`` as they come (``docker logs -f``)."""
        ...

    async def open_process(self, cmd: CommandLike) -> LongProcess:
        """Start ``cmd`` and keep it: stdin/stdout lines (the probe)."""
        ...

    async def close(self) -> None: ...

    def server_host_key(self) -> str | None:
        """The host key the open connection verified (``TYPE BASE64``), None without one (the local
        transport, a closed connection): what the node's sshd presents, already checked against
        known_hosts."""
        ...

    @property
    def connected(self) -> bool: ...


class CommandTimeout(TransportError):
    """A ``run`` that did not finish in time, and what became of the command on the node.

    ``killed``: the command's whole process tree was killed there (``processes`` of them), so
    nothing of it still runs; ``False``: it could not be stopped (the connection was gone, the
    kill got no answer) and may still be running. The message says which.
    """

    def __init__(self, message: str, *, killed: bool, processes: int | None = None) -> None:
        super().__init__(message)
        self.killed = killed
        self.processes = processes
