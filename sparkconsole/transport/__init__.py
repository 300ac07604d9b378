"""How a command reaches a node: SSH (asyncssh, one kept connection) or a local subprocess."""

from __future__ import annotations

from typing import Any

from sparkconsole.config import ClusterConfig, NodeConfig
from sparkconsole.transport.base import CommandLike, CommandResult, LongProcess, Transport, command_text

__all__ = ["CommandLike", "CommandResult", "LongProcess", "Transport", "command_text", "make_transport",
           "node_transport"]


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


def node_transport(config: ClusterConfig, node: NodeConfig, **options: Any) -> Transport:
    """The transport for one node of ``config``. A ``jump`` that names another node of the
    inventory is dialled as that node (its host, port, user, key and known_hosts), not as a host
    name of that spelling."""
    if not config.local and node.jump and "jump_node" not in options:
        jump = next((n for n in config.nodes if n.name == node.jump and n is not node), None)
        if jump is not None:
            options["jump_node"] = jump
    return make_transport(node, local=config.local, **options)
