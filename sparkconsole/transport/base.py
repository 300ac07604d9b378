"""What every transport offers: run a command, stream its lines, hold a long-lived process.

Two implementations: :mod:`sparkconsole.transport.ssh` (asyncssh, one kept connection per node)
and :mod:`sparkconsole.transport.local` (asyncio subprocess, for running on a Spark itself).
Callers pass either a :class:`~sparkconsole.remote.RemoteCommand` or a string that was built by
:mod:`sparkconsole.remote` / :mod:`sparkconsole.probe.script`; transports never build commands.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

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
