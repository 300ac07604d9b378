"""`sparkconsole trust HOST`: look at a node's SSH host key and, if the operator agrees, record it.

The console never accepts a host key on its own: an unknown key stops the connection with the
fingerprint offered, and this command is how it gets into ``known_hosts``. It prints the host,
key type and SHA256 fingerprint (compare it with ``ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub``
run on the node itself), then asks. A key already recorded is reported and left alone; a
DIFFERENT key already recorded is refused loudly and never overwritten.

The key is fetched over the route the connection itself takes (issue 23 item 12), by the
transport's own dialling (:meth:`~sparkconsole.transport.ssh.SshTransport.offered_host_key`): the
ssh config's ProxyJump and ProxyCommand, or ``--jump`` (the inventory's ``jump``), each jump host's
key verified as always; and it is recorded under the name the transport checks (the config's
``HostKeyAlias``, else HostName and Port) in the file it checks. Fetched directly from HostName, a
node behind a jump host gave the jump host's key, another machine's, or none.

Exit codes: 0 recorded or already trusted, 1 refused (declined, no answer, changed key),
3 the host could not be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from sparkconsole.config import NodeConfig
from sparkconsole.errors import UserError
from sparkconsole.remote import validate_host
from sparkconsole.transport.hostkeys import add_known_host, key_status
from sparkconsole.transport.ssh import OfferedKey, SshTransport


def add_parser(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser(
        "trust",
        help="show a node's SSH host key fingerprint and record it in known_hosts if you agree",
        description="Fetch HOST's SSH host key, show its SHA256 fingerprint and, after you confirm, "
        "add it to known_hosts. A different key already recorded is refused (possible "
        "man-in-the-middle) and never overwritten.",
    )
    p.add_argument("host", metavar="HOST", help="address, name, or an alias of your ssh config")
    p.add_argument("--port", type=int, default=None, help="SSH port (default: from the ssh config, else 22)")
    p.add_argument("--known-hosts", metavar="FILE", default=None,
                   help="the known_hosts file to check and write (default: the one the connection checks: "
                   "the ssh config's UserKnownHostsFile, else ~/.ssh/known_hosts)")
    p.add_argument("--ssh-config", metavar="FILE", default=None,
                   help="resolve HOST through this ssh config (default: ~/.ssh/config if present)")
    p.add_argument("--jump", metavar="[USER@]HOST[:PORT]", default=None,
                   help="reach HOST through this jump host, as the inventory's `jump` does (comma-separated "
                   "for a chain; its key is checked in the same known_hosts); a ProxyJump or ProxyCommand in "
                   "the ssh config is taken without it")
    p.add_argument("--identity", metavar="FILE", default=None,
                   help="the private key that logs in to the jump host (default: the ssh config's, the agent's)")
    p.add_argument("--yes", action="store_true", help="record the key without asking")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the server (default 10)")
    p.set_defaults(func=run)


async def _offered(node: NodeConfig, timeout: float) -> OfferedKey:
    """The key ``node`` offers over the connection's own route (the transport's dialling)."""
    t = SshTransport(node, connect_timeout=timeout, auto_reconnect=False)
    try:
        return await t.offered_host_key()
    finally:
        await t.close()


def _ask(prompt: str) -> str | None:
    """One answer from stdin; ``None`` when there is none (not interactive, EOF)."""
    print(prompt, end="", flush=True)
    try:
        line = sys.stdin.readline() if sys.stdin is not None else ""
    except (OSError, ValueError):
        line = ""
    if not line:
        print()
        return None
    return line.strip()


def run(args: argparse.Namespace) -> int:
    if args.port is not None and not 0 < args.port < 65536:
        raise UserError("--port must be a number 1-65535")
    validate_host(args.host)
    if args.ssh_config and not Path(args.ssh_config).expanduser().is_file():
        raise UserError(f"{Path(args.ssh_config).expanduser()}: no such ssh config file")
    node = NodeConfig(name=args.host, host=args.host, port=args.port, jump=args.jump,
                      known_hosts=str(Path(args.known_hosts).expanduser()) if args.known_hosts else None,
                      identity=args.identity, ssh_config=args.ssh_config)
    offered = asyncio.run(_offered(node, args.timeout))
    key, host, port, name = offered.key, offered.host, offered.port, offered.name
    path = Path(offered.known_hosts)

    print(f"host:        {name}" + (f"  (alias {args.host})" if args.host != host else ""))
    if offered.via or offered.address.rpartition(":")[0] != host:
        print(f"reached:     {offered.address}" + (f" via {offered.via}" if offered.via else ""))
    print(f"key type:    {key.key_type}")
    print(f"fingerprint: {key.fingerprint}")
    print(f"known_hosts: {path}")

    status = key_status(path, host, port, key)
    if status == "trusted":
        print(f"This key is already trusted for {name}; nothing to do.")
        return 0
    if status in ("changed", "revoked"):
        what = "is marked @revoked" if status == "revoked" else "DIFFERS from the key already recorded"
        print(
            f"\nWARNING: the host key offered by {name} {what} in {path}.\n"
            "Someone could be intercepting the connection (man-in-the-middle), or the node was\n"
            "reinstalled. Check the fingerprint on the node itself. Nothing was changed; if the new\n"
            f"key is genuine, remove the old line first (ssh-keygen -R '{name}' -f {path}).",
            file=sys.stderr,
        )
        return 1

    if not args.yes:
        answer = _ask("Trust this key? [y/N] ")
        if answer is None:
            print("No answer (not interactive): not trusted. Check the fingerprint, then run again "
                  "with --yes.", file=sys.stderr)
            return 1
        if answer.lower() not in ("y", "yes"):
            print("Not trusted; nothing was recorded.")
            return 1
    line = add_known_host(path, host, port, key)
    print(f"Recorded in {path}: {line.strip()}")
    return 0
