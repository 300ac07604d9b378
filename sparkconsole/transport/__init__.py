"""How a command reaches a node: SSH (asyncssh, one kept connection) or a local subprocess."""

from __future__ import annotations

from typing import Any

from sparkconsole.config import NodeConfig
from sparkconsole.transport.base import CommandLike, CommandResult, LongProcess, Transport, command_text

__all__ = ["CommandLike", "CommandResult", "LongProcess", "Transport", "command_text", "make_transport"]


def make_transport(node: NodeConfig, local: bool = False, **options: Any) -> Transport:
    """The transport for ``node``: a local subprocess runner with ``local``, else SSH.

    ``options`` go to :class:`~sparkconsole.transport.ssh.SshTransport` (timeouts, backoff,
    ``jump_node``); they are ignored for the local transport.
    """
    if local:
        from sparkconsole.transport.local import LocalTransport

        return LocalTransport(node.name)
    from sparkconsole.transport.ssh import SshTransport

    return SshTransport(node, **options)
