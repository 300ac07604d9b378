"""`sparkconsole trust HOST`: look at a node's SSH host key and, if the operator agrees, record it.

The console never accepts a host key on its own: an unknown key stops the connection with the
fingerprint offered, and this command is how it gets into ``known_hosts``. It prints the host,
key type and SHA256 fingerprint (compare it with ``ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub``
run on the node itself), then asks. A key already recorded is reported and left alone; a
DIFFERENT key already recorded is refused loudly and never overwritten.

Exit codes: 0 recorded or already trusted, 1 refused (declined, no answer, changed key),
3 the host could not be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import asyncssh

from sparkconsole.errors import UserError
from sparkconsole.remote import validate_host
from sparkconsole.transport.hostkeys import (
    DEFAULT_PORT,
    add_known_host,
    default_known_hosts,
    describe,
    fetch_host_key,
    key_status,
    known_host_name,
)


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
                   help="the known_hosts file to check and write (default: ~/.ssh/known_hosts)")
    p.add_argument("--ssh-config", metavar="FILE", default=None,
                   help="resolve HOST through this ssh config (default: ~/.ssh/config if present)")
    p.add_argument("--yes", action="store_true", help="record the key without asking")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the server (default 10)")
    p.set_defaults(func=run)


def _resolve(host: str, port: int | None, ssh_config: str | None) -> tuple[str, int]:
    """HostName and Port the way the transport will see them (the names known_hosts must hold)."""
    if ssh_config:
        paths = [str(Path(ssh_config).expanduser())]
        if not Path(paths[0]).is_file():
            raise UserError(f"{paths[0]}: no such ssh config file")
    else:
        default = Path("~/.ssh/config").expanduser()
        paths = [str(default)] if default.is_file() else []
    kwargs: dict[str, object] = {"host": host, "config": paths}
    if port:
        kwargs["port"] = port
    try:
        opts = asyncssh.SSHClientConnectionOptions(**kwargs)
    except (OSError, ValueError, asyncssh.Error) as exc:
        raise UserError(f"cannot read the ssh config: {describe(exc)}") from None
    return opts.host, int(opts.port or DEFAULT_PORT)


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
    host, port = _resolve(args.host, args.port, args.ssh_config)
    path = Path(args.known_hosts).expanduser() if args.known_hosts else default_known_hosts()
    name = known_host_name(host, port)

    key = asyncio.run(fetch_host_key(host, port, timeout=args.timeout))
    print(f"host:        {name}" + (f"  (alias {args.host})" if args.host != host else ""))
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
