"""SSH host keys: fetch the key a server offers, look it up, record it. Nothing else accepts keys.

The transport never trusts a key on first use. A key gets into ``known_hosts`` only through
:func:`add_known_host`, which ``sparkconsole trust`` calls after the operator has seen the
SHA256 fingerprint and said yes. Lines are written in OpenSSH's own format (``[host]:port
keytype base64``, plain ``host`` for port 22), so ``ssh`` and asyncssh read the same file.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import asyncssh

from sparkconsole.errors import TransportError

DEFAULT_PORT = 22

KeyStatus = Literal["trusted", "unknown", "changed", "revoked"]


def default_known_hosts() -> Path:
    return Path("~/.ssh/known_hosts").expanduser()


def known_host_name(host: str, port: int | None) -> str:
    """How OpenSSH names a host in known_hosts: ``host`` on port 22, else ``[host]:port``."""
    return host if not port or port == DEFAULT_PORT else f"[{host}]:{port}"


@dataclass(frozen=True)
class HostKey:
    """A server's public host key, in the forms people and files need."""

    key_type: str  # "ssh-ed25519"
    fingerprint: str  # "SHA256:..."
    openssh_line: str  # "ssh-ed25519 AAAA..." (no comment)

    def __iter__(self):  # ``key_type, fingerprint, line = fetch_host_key(...)``
        return iter((self.key_type, self.fingerprint, self.openssh_line))

    @property
    def blob(self) -> bytes:
        return base64.b64decode(self.openssh_line.split()[1])


def host_key_from(key: asyncssh.SSHKey | str | HostKey) -> HostKey:
    """A :class:`HostKey` from an asyncssh key, an OpenSSH public key line or a HostKey."""
    if isinstance(key, HostKey):
        return key
    if isinstance(key, str):
        try:
            key = asyncssh.import_public_key(key.strip())
        except (asyncssh.KeyImportError, ValueError) as exc:
            raise TransportError(f"not an OpenSSH public key: {exc}") from None
    line = key.export_public_key("openssh").decode("ascii").split()
    return HostKey(key_type=line[0], fingerprint=key.get_fingerprint("sha256"), openssh_line=f"{line[0]} {line[1]}")


async def fetch_host_key(
    host: str,
    port: int | None = DEFAULT_PORT,
    *,
    tunnel: asyncssh.SSHClientConnection | None = None,
    timeout: float = 10.0,
    options: asyncssh.SSHClientConnectionOptions | None = None,
) -> HostKey:
    """The host key ``host:port`` offers in its handshake (no authentication is attempted).

    ``options``: the ssh config as the connection resolved it (the transport's, parsed once), so
    the handshake takes the connection's own route (its ProxyCommand); without them no config is
    read and ``host`` is dialled directly (or through ``tunnel``)."""
    where = f"{host}:{port or DEFAULT_PORT}"
    try:
        key = await asyncio.wait_for(
            asyncssh.get_server_host_key(host, port or DEFAULT_PORT, tunnel=tunnel or (), config=[],
                                         options=options),
            timeout,
        )
    except TimeoutError:
        raise TransportError(f"{where}: timed out waiting for the SSH handshake") from None
    except (OSError, asyncssh.Error) as exc:
        raise TransportError(f"{where}: cannot fetch the host key: {describe(exc)}") from None
    if key is None:
        raise TransportError(f"{where}: the server offered no host key")
    return host_key_from(key)


def describe(exc: BaseException) -> str:
    """One line for a low-level error."""
    if isinstance(exc, asyncssh.DisconnectError):
        return exc.reason or exc.__class__.__name__
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc).strip().splitlines()
    return text[0] if text else exc.__class__.__name__


# ---- reading known_hosts --------------------------------------------------------------------


def _hashed_match(pattern: str, name: str) -> bool:
    try:
        _, magic, salt, digest = pattern.split("|")
        if magic != "1":
            return False
        mac = hmac.new(base64.b64decode(salt), name.encode(), hashlib.sha1).digest()
        return hmac.compare_digest(mac, base64.b64decode(digest))
    except (ValueError, TypeError):
        return False


def _glob_match(pattern: str, name: str) -> bool:
    """OpenSSH host patterns: ``*`` and ``?`` are wildcards, everything else (``[``!) is literal."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern.lower())
    return re.fullmatch(regex, name.lower()) is not None


def _patterns_match(field: str, name: str) -> bool:
    if field.startswith("|"):
        return _hashed_match(field, name)
    hit = False
    for pat in field.split(","):
        negate = pat.startswith("!")
        pat = pat[1:] if negate else pat
        if _glob_match(pat, name):
            if negate:
                return False
            hit = True
    return hit


def recorded_keys(path: str | os.PathLike[str], host: str, port: int | None) -> tuple[list[HostKey], list[HostKey]]:
    """``(trusted, revoked)`` keys recorded for exactly ``host`` on ``port`` in ``path``."""
    name = known_host_name(host, port)
    trusted: list[HostKey] = []
    revoked: list[HostKey] = []
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return trusted, revoked
    except OSError as exc:
        raise TransportError(f"{path}: cannot read known_hosts: {describe(exc)}") from None
    for raw in text.splitlines():
        parts = raw.split()
        if not parts or parts[0].startswith("#"):
            continue
        marker = None
        if parts[0].startswith("@"):
            marker, parts = parts[0], parts[1:]
        if len(parts) < 3 or marker == "@cert-authority" or not _patterns_match(parts[0], name):
            continue
        try:
            key = host_key_from(f"{parts[1]} {parts[2]}")
        except TransportError:
            continue
        (revoked if marker == "@revoked" else trusted).append(key)
    return trusted, revoked


def key_status(path: str | os.PathLike[str], host: str, port: int | None, key: HostKey) -> KeyStatus:
    """Is ``key`` what ``path`` records for ``host:port``? ``changed``: a different key is."""
    trusted, revoked = recorded_keys(path, host, port)
    if any(k.blob == key.blob for k in revoked):
        return "revoked"
    if any(k.blob == key.blob for k in trusted):
        return "trusted"
    return "changed" if trusted else "unknown"


def add_known_host(path: str | os.PathLike[str], host: str, port: int | None, key: HostKey | str) -> str:
    """Append ``key`` for ``host:port`` to ``path`` (created 0600, parents 0700); the line written.

    Refuses (TransportError) when a different key is already recorded for that host: a changed
    key is never overwritten here. Recording the same key twice is a no-op.
    """
    hk = host_key_from(key)
    status = key_status(path, host, port, hk)
    name = known_host_name(host, port)
    if status == "changed":
        raise TransportError(f"{name}: a different host key is already recorded in {path}; not overwriting it")
    if status == "revoked":
        raise TransportError(f"{name}: this host key is marked @revoked in {path}")
    line = f"{name} {hk.openssh_line}\n"
    if status == "trusted":
        return line
    p = Path(path).expanduser()
    if not p.parent.exists():
        p.parent.mkdir(parents=True, mode=0o700)
    existing = p.read_bytes() if p.exists() else b""
    fd = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as fh:
        if existing and not existing.endswith(b"\n"):
            fh.write("\n")
        fh.write(line)
    return line
