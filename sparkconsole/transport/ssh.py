"""SSH transport: one asyncssh connection per node, kept open; every command is a channel on it.

- One connection per node, opened on first use and reused by every ``run``, ``stream`` and
  ``open_process`` (each is one exec channel). A lock is held only while (re)connecting, never
  around I/O: runs on one node go out concurrently. OpenSSH allows ``MaxSessions`` (default 10)
  channels per connection, so channels beyond ``max_sessions`` wait for a free one.
- The user's OpenSSH client config is honoured through asyncssh's ``config=`` (HostName, User,
  Port, IdentityFile, ProxyJump...): ``NodeConfig.ssh_config`` names the file, else
  ``~/.ssh/config``. ``NodeConfig`` values (user, port, identity, jump) win over the file.
  The file is parsed once per host, in a worker thread, and the result reused by every connect and
  retry until the file changes (:func:`parsed_options`): asyncssh runs ``Match exec`` commands
  while it parses, and parsing on the event loop at every attempt froze the UI for as long as they
  took (issue 23 item 13).
- Host keys are ALWAYS verified: against ``NodeConfig.known_hosts``, else the config's
  ``UserKnownHostsFile``, else ``~/.ssh/known_hosts`` (``UserKnownHostsFile none`` does not turn
  checking off: it falls back to the default file; a missing file trusts nothing). An unknown or
  changed key raises :class:`~sparkconsole.errors.HostKeyError` naming the host and the SHA256
  fingerprint offered; ``sparkconsole trust`` is the only way to record a key.
- Jump hosts (``NodeConfig.jump`` or ``ProxyJump`` in the config) are dialled here, hop by hop,
  with the same verification, and the target is reached through a ``direct-tcpip`` tunnel.
- A dead connection (found on next use, or by the SSH keepalive: every ``keepalive`` seconds of
  silence, dropped after ``keepalive_count_max`` unanswered, i.e. ~6 s by default) is dropped and
  re-opened. Attempts run in the background, never cancelled by a caller's own deadline, so an
  attempt always ends with the SSH-level reason (connect timeout, refused...) naming host and port.
  While one attempt is stuck (packets dropped: its SYNs are in TCP's retransmit backoff), a fresh
  one is started beside it every ``beside_after`` seconds (at most ``max_attempts`` at once), so a
  node that answers again is reached within seconds, not when TCP gives up. Fast failures
  (refused, auth) back off exponentially with jitter (:meth:`SshTransport.backoff_delays`); a
  timed-out attempt has already waited, so the next one may start at once. While waiting for the
  next attempt, calls fail at once with a TransportError instead of blocking the UI.
- A ``run`` that times out kills the remote command's whole process tree on the node (every
  process carrying the run's token in its environment) and says so in the
  :class:`~sparkconsole.transport.base.CommandTimeout` it raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shlex
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh

from sparkconsole.config import NodeConfig
from sparkconsole.errors import HostKeyError, TransportError
from sparkconsole.transport.base import (
    DEFAULT_MAX_BYTES,
    CommandLike,
    CommandResult,
    CommandTimeout,
    command_text,
    cut_marker,
    read_both_bounded,
)
from sparkconsole.transport.hostkeys import (
    HostKey,
    default_known_hosts,
    describe,
    fetch_host_key,
    key_status,
    known_host_name,
)

_ENCODING = {"encoding": "utf-8", "errors": "replace"}
_MAX_HOPS = 4
_PTY_MODES = {asyncssh.PTY_ECHO: 0, asyncssh.PTY_OPOST: 0}
RUN_TOKEN_VAR = "SPARKCONSOLE_RUN"
_KILLED = "sparkconsole-killed"


def _kill_script(token: str) -> str:
    """Shell text that SIGKILLs every process whose environment carries ``token``, repeated
    until none is left (a child forked meanwhile inherits it), then prints how many."""
    pat = f"{RUN_TOKEN_VAR}={token}"
    return (
        f"n=0; i=0; while [ $i -lt 5 ]; do i=$((i+1)); "
        f"p=$(grep -ls '{pat}' /proc/[0-9]*/environ 2>/dev/null | sed 's|^/proc/||; s|/environ$||'); "
        '[ -n "$p" ] || break; kill -9 $p 2>/dev/null; n=$((n+$(echo $p | wc -w))); done; '
        f'echo "{_KILLED} $n"'
    )


# ---- the ssh config, parsed once ------------------------------------------------------------

_ParseKey = tuple[tuple[tuple[str, int, int, int, int], ...], str, int | None, str | None]
_PARSED: dict[_ParseKey, asyncssh.SSHClientConnectionOptions] = {}
_PARSING: dict[tuple[_ParseKey, int], asyncio.Future[asyncssh.SSHClientConnectionOptions]] = {}


def _stamp(path: str) -> tuple[str, int, int, int, int]:
    """What says a config file changed: its inode, size and modification and change times."""
    try:
        st = os.stat(path)
    except OSError:
        return (path, -1, -1, -1, -1)
    return (path, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _parse(paths: list[str], host: str, port: int | None, user: str | None) -> asyncssh.SSHClientConnectionOptions:
    kwargs: dict[str, Any] = {"host": host, "config": paths}
    if port:
        kwargs["port"] = port
    if user:
        kwargs["username"] = user
    return asyncssh.SSHClientConnectionOptions(**kwargs)


async def parsed_options(paths: list[str], host: str, port: int | None = None,
                         user: str | None = None) -> asyncssh.SSHClientConnectionOptions:
    """The ssh config's options for ``host`` (as ``port`` and ``user`` ask), parsed once per run.

    The parse runs in a worker thread (``Match exec`` runs its command then) and its result is kept
    until one of ``paths`` changes (inode, size, mtime, ctime; the files its ``Include`` names are
    not watched), so a ``Match exec`` is asked once per run, not at every retry. Callers that ask
    while a parse is under way wait for that one. Pass the result as ``options=`` with
    ``config=[]`` to asyncssh, which then reads no file again.
    """
    key: _ParseKey = (tuple(_stamp(p) for p in paths), host, port, user)
    hit = _PARSED.get(key)
    if hit is not None:
        return hit
    loop = asyncio.get_running_loop()
    pending = _PARSING.get((key, id(loop)))
    if pending is not None:
        return await asyncio.shield(pending)
    fut: asyncio.Future[asyncssh.SSHClientConnectionOptions] = loop.create_future()
    fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # nobody may be waiting
    _PARSING[(key, id(loop))] = fut
    try:
        opts = await asyncio.to_thread(_parse, paths, host, port, user)
    except BaseException as exc:
        if isinstance(exc, Exception):
            fut.set_exception(exc)
        else:
            fut.cancel()
        raise
    finally:
        _PARSING.pop((key, id(loop)), None)
    for old in [k for k in _PARSED if k[1:] == key[1:] and k[0] != key[0]]:
        del _PARSED[old]  # an older version of the file: never asked again
    _PARSED[key] = opts
    fut.set_result(opts)
    return opts


def _verified_as(probe: asyncssh.SSHClientConnectionOptions) -> tuple[str, int | None]:
    """The known_hosts name asyncssh checks a hop's key under: ``HostKeyAlias`` alone, as OpenSSH
    records it (asyncssh tries ``[alias]:port`` first, then the bare alias), else HostName and Port."""
    alias = probe.host_key_alias
    if alias:
        return str(alias), None
    return probe.host, probe.port


@dataclass(frozen=True)
class _KeyPlace:
    """Where a hop's key is checked: its known_hosts name, the files, and the trust line for it."""

    host: str
    port: int | None
    files: list[str]
    trust: str


@dataclass
class _Route:
    """One target's last hop, ready to dial: asyncssh's arguments, the options they resolve to, the
    tunnel through the verified jump hosts (None: direct, or the config's ProxyCommand)."""

    kwargs: dict[str, Any]
    probe: asyncssh.SSHClientConnectionOptions
    tunnel: asyncssh.SSHClientConnection | None
    hops: list[asyncssh.SSHClientConnection]
    via: str | None
    place: _KeyPlace

    def close(self) -> None:
        for h in reversed(self.hops):
            h.close()


@dataclass(frozen=True)
class OfferedKey:
    """What :meth:`SshTransport.offered_host_key` saw: the key, the known_hosts name it is checked
    under (``host``, ``port``: None for port 22 and for a HostKeyAlias), the first known_hosts file
    checked, the address dialled, and the jump or proxy it came through."""

    key: HostKey
    host: str
    port: int | None
    known_hosts: str
    address: str
    via: str | None

    @property
    def name(self) -> str:
        return known_host_name(self.host, self.port)


class _ConnectTimeout(TransportError):
    """A connection attempt that got no answer within ``connect_timeout``."""


def _short(text: str, limit: int = 80) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _parse_hop(spec: str) -> tuple[str | None, str, int | None]:
    """``[user@]host[:port]`` -> (user, host, port)."""
    user = None
    if "@" in spec:
        user, spec = spec.rsplit("@", 1)
    port = None
    if spec.startswith("[") and "]" in spec:  # [host]:port
        host, _, rest = spec[1:].partition("]")
        if rest.startswith(":") and rest[1:].isdigit():
            port = int(rest[1:])
        return user, host, port
    if spec.count(":") == 1:
        host, port_s = spec.split(":")
        if port_s.isdigit():
            return user, host, int(port_s)
    return user, spec, port


class _Client(asyncssh.SSHClient):
    """Tells the transport when its connection goes away (peer closed, keepalive timeout)."""

    def __init__(self, transport: SshTransport) -> None:
        self._transport = transport
        self._conn: asyncssh.SSHClientConnection | None = None

    def connection_made(self, conn: asyncssh.SSHClientConnection) -> None:
        self._conn = conn

    def connection_lost(self, exc: Exception | None) -> None:
        if self._conn is not None:
            self._transport._on_connection_lost(self._conn, exc)


async def _collect(proc: asyncssh.SSHClientProcess, max_bytes: int) -> tuple[str, str, set[str]]:
    """stdout and stderr of ``proc`` read together, each bounded (:func:`read_both_bounded`); the names
    of the streams that were cut. At the first cut the other stream is no longer waited for: the
    caller closes the channel and stops the command on the node."""
    out, err, cuts = await read_both_bounded(proc.stdout, proc.stderr, max_bytes, read_on_after_cut=False)
    if not cuts:
        await proc.wait_closed()
    return out or "", err or "", cuts


class SshProcess:
    """A long-lived remote process on its own channel: write lines, read lines (the probe)."""

    def __init__(self, node: str, proc: asyncssh.SSHClientProcess, release: Any) -> None:
        self._node = node
        self._proc = proc
        self._release = release
        self.stderr_tail: list[str] = []  # the last lines the process wrote on stderr
        self._stderr_task = asyncio.create_task(self._drain_stderr())
        self._watch_task = asyncio.create_task(self._watch())

    async def _drain_stderr(self) -> None:
        # Never leave stderr unread: a full buffer would stall the whole channel.
        with contextlib.suppress(Exception):
            async for line in self._proc.stderr:
                self.stderr_tail.append(line.rstrip("\n"))
                del self.stderr_tail[:-20]

    async def _watch(self) -> None:
        try:
            await self._proc.wait_closed()
        finally:
            self._release()

    async def write_line(self, line: str) -> None:
        if self._proc.is_closing():
            raise TransportError(f"{self._node}: the remote process has ended")
        try:
            self._proc.stdin.write(line + "\n")
            await self._proc.stdin.drain()
        except (OSError, asyncssh.Error) as exc:
            raise TransportError(f"{self._node}: cannot write to the remote process: {describe(exc)}") from None

    async def read_line(self) -> str | None:
        try:
            line = await self._proc.stdout.readline()
        except (OSError, asyncssh.Error) as exc:
            raise TransportError(f"{self._node}: lost the remote process: {describe(exc)}") from None
        if not line:
            return None
        return line[:-1] if line.endswith("\n") else line

    @property
    def is_closing(self) -> bool:
        return self._proc.is_closing()

    @property
    def exit_status(self) -> int | None:
        return self._proc.exit_status

    async def close(self) -> None:
        proc = self._proc
        if not proc.is_closing():
            with contextlib.suppress(Exception):
                proc.stdin.write_eof()
            with contextlib.suppress(Exception):
                proc.kill()
            proc.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(proc.wait_closed(), 5)
        for task in (self._stderr_task, self._watch_task):
            task.cancel()
        await asyncio.gather(self._stderr_task, self._watch_task, return_exceptions=True)
        self._release()


class SshTransport:
    """The :class:`~sparkconsole.transport.base.Transport` for one node over SSH."""

    def __init__(
        self,
        node: NodeConfig,
        *,
        connect_timeout: float = 10.0,
        keepalive: float = 2.0,
        keepalive_count_max: int = 2,
        backoff_base: float = 0.5,
        backoff_factor: float = 2.0,
        backoff_max: float = 4.0,
        beside_after: float = 2.0,
        max_attempts: int = 4,
        auto_reconnect: bool = True,
        max_sessions: int = 10,
        jump_node: NodeConfig | None = None,
    ) -> None:
        self.node = node.name
        self.config = node
        self.jump_node = jump_node
        self.connect_timeout = connect_timeout
        self.keepalive = keepalive
        self.keepalive_count_max = keepalive_count_max
        self.backoff_base = backoff_base
        self.backoff_factor = backoff_factor
        self.backoff_max = backoff_max
        self.beside_after = beside_after
        self.max_attempts = max_attempts
        self.attempts_made = 0  # connection attempts started (beside ones included)
        self.auto_reconnect = auto_reconnect
        self.max_sessions = max_sessions
        self.connections_made = 0  # how many times a connection was opened (1 = never dropped)
        self.last_error: str | None = None
        self._last_exc: TransportError | None = None
        self._conn: asyncssh.SSHClientConnection | None = None
        self._hops: list[asyncssh.SSHClientConnection] = []  # jump connections, nearest first
        self._where = (f"[{node.host}]" if ":" in node.host else node.host) + f":{node.port or 22}"  # the last target
        self._target_port: int | None = node.port  # the port dialled last (the ssh config's Port counts)
        self._attempts: list[tuple[float, asyncio.Task[asyncssh.SSHClientConnection]]] = []
        self._outcome: asyncio.Future[asyncssh.SSHClientConnection] | None = None
        self._beside_timer: asyncio.TimerHandle | None = None
        self._slots = asyncio.Semaphore(max_sessions)
        self._failures = 0
        self._retry_at = 0.0
        self._closed = False
        self._reconnect_task: asyncio.Task[None] | None = None

    # ---- state ----------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._conn.is_closed()

    def backoff_delays(self) -> Iterator[float]:
        """The waits between reconnect attempts: exponential, capped, with jitter (half to full)."""
        delay = self.backoff_base
        while True:
            capped = min(delay, self.backoff_max)
            yield capped / 2 + random.uniform(0, capped / 2)
            delay *= self.backoff_factor

    def _delay_after(self, failures: int) -> float:
        it = self.backoff_delays()
        delay = 0.0
        for _ in range(max(failures, 1)):
            delay = next(it)
        return delay

    @property
    def target_port(self) -> int | None:
        """The node's SSH port as the last dial resolved it (the inventory's, else the ssh config's
        Port, else 22); before any dial, the inventory's. Node-to-node copies start from it."""
        return self._target_port

    @property
    def retry_in(self) -> float:
        """Seconds until the next connection attempt is allowed (0 when allowed now)."""
        return max(0.0, self._retry_at - time.monotonic())

    # ---- connecting -----------------------------------------------------------------------

    def _config_paths(self, cfg: NodeConfig) -> list[str]:
        if cfg.ssh_config:
            path = Path(cfg.ssh_config).expanduser()
            if not path.is_file():
                raise TransportError(f"{self.node}: ssh config file {path} not found")
            return [str(path)]
        default = Path("~/.ssh/config").expanduser()
        return [str(default)] if default.is_file() else []

    @staticmethod
    def _known_hosts_paths(cfg: NodeConfig, opts: asyncssh.SSHClientConnectionOptions) -> list[str]:
        """The known_hosts files a hop's key is checked against, present or not (the first is where
        ``sparkconsole trust`` records it)."""
        if cfg.known_hosts:
            return [str(Path(cfg.known_hosts).expanduser())]
        if isinstance(opts.known_hosts, list | tuple) and opts.known_hosts:
            return [str(Path(str(p)).expanduser()) for p in opts.known_hosts]
        return [str(default_known_hosts())]

    def _known_hosts(self, cfg: NodeConfig, opts: asyncssh.SSHClientConnectionOptions) -> Any:
        """What host keys are checked against. Never "no checking"."""
        paths = self._known_hosts_paths(cfg, opts)
        existing = [p for p in paths if os.path.isfile(p)]
        if not existing:
            return asyncssh.import_known_hosts("")  # trusts nothing: every key is unknown
        return existing

    async def _options(
        self,
        cfg: NodeConfig,
        host: str,
        port: int | None,
        user: str | None,
        identity: str | None,
        fallback_identity: str | None = None,
    ) -> tuple[dict[str, Any], asyncssh.SSHClientConnectionOptions]:
        """asyncssh keyword arguments for one hop, and the options they resolve to.

        ``identity`` always wins over the config file; ``fallback_identity`` is used only when
        the config names no IdentityFile for that host. The config is the one parsed once
        (:func:`parsed_options`): the keyword arguments carry it as ``options=`` and no path, so
        asyncssh does not read the file again.
        """
        try:
            probe = await parsed_options(self._config_paths(cfg), host, port, user)
        except (OSError, ValueError, asyncssh.Error) as exc:
            raise TransportError(f"{self.node}: cannot read the ssh config for {host}: {describe(exc)}") from None
        kwargs: dict[str, Any] = {
            "host": host,
            "options": probe,
            "config": [],
            "connect_timeout": self.connect_timeout,
            "keepalive_interval": self.keepalive,
            "keepalive_count_max": self.keepalive_count_max,
        }
        if port:
            kwargs["port"] = port
        if user:
            kwargs["username"] = user
        key = identity or (fallback_identity if not probe.config.get("IdentityFile") else None)
        if key:
            kwargs["client_keys"] = [str(Path(key).expanduser())]
        kwargs["known_hosts"] = self._known_hosts(cfg, probe)
        return kwargs, probe

    def _hop(self, spec: str) -> tuple[NodeConfig, str, int | None, str | None, str | None, str | None]:
        """(config, host, port, user, identity, fallback identity) of one jump host."""
        j = self.jump_node
        if j is not None and spec in (j.name, j.host):
            return j, j.host, j.port, j.user, j.identity, self.config.identity
        user, host, port = _parse_hop(spec)
        # a bare jump spec shares the node's known_hosts and ssh config; the node's key is
        # used for it only when the config names none for that host
        return self.config, host, port, user, None, self.config.identity

    def _trust_command(self, cfg: NodeConfig, host: str, port: int | None, jump: str | None,
                       files: list[str]) -> str:
        """The ``sparkconsole trust`` line that fetches this hop's key over the same route and
        records it where the transport checks it."""
        parts = ["sparkconsole", "trust", host]
        if port:
            parts += ["--port", str(port)]
        if jump:
            parts += ["--jump", ",".join(self._cli_hop(s.strip()) for s in jump.split(",") if s.strip())]
            key = cfg.identity or self.config.identity
            if key:
                parts += ["--identity", key]
        if cfg.ssh_config:
            parts += ["--ssh-config", cfg.ssh_config]
        parts += ["--known-hosts", files[0]]
        return shlex.join(parts)

    def _place(self, cfg: NodeConfig, host: str, port: int | None, probe: asyncssh.SSHClientConnectionOptions,
               jump: str | None) -> _KeyPlace:
        files = self._known_hosts_paths(cfg, probe)
        key_host, key_port = _verified_as(probe)
        return _KeyPlace(key_host, key_port, files, self._trust_command(cfg, host, port, jump, files))

    def _cli_hop(self, spec: str) -> str:
        """A jump spec ``sparkconsole trust --jump`` understands: an inventory node named as the
        jump becomes its ``user@host:port`` (the command line has no inventory)."""
        j = self.jump_node
        if j is None or spec not in (j.name, j.host):
            return spec
        host = f"[{j.host}]" if ":" in j.host and j.port else j.host
        return (f"{j.user}@" if j.user else "") + host + (f":{j.port}" if j.port else "")

    async def _route(
        self,
        cfg: NodeConfig,
        host: str,
        port: int | None,
        user: str | None,
        identity: str | None,
        fallback_identity: str | None,
        jump: str | None,
        depth: int = 0,
    ) -> _Route:
        """Everything up to the last hop: its options, and the verified jump connections it rides
        on (dialled here, hop by hop). The connection (:meth:`_dial`) and the key capture
        (:meth:`offered_host_key`) both go this way, so ``trust`` sees the key the connection will."""
        if depth > _MAX_HOPS:
            raise TransportError(f"{self.node}: more than {_MAX_HOPS} jump hosts (a ProxyJump loop?)")
        kwargs, probe = await self._options(cfg, host, port, user, identity, fallback_identity)
        if depth == 0:
            self._where = f"[{probe.host}]:{probe.port}" if ":" in probe.host else f"{probe.host}:{probe.port}"
            self._target_port = probe.port
        place = self._place(cfg, host, port, probe, jump)  # trust reads a ProxyJump from the same file
        if jump is None and isinstance(probe.tunnel, str) and probe.tunnel.lower() != "none":
            jump = probe.tunnel  # ProxyJump from the ssh config: dialled here, not by asyncssh
        hops: list[asyncssh.SSHClientConnection] = []
        tunnel: asyncssh.SSHClientConnection | None = None
        before: list[str] = []
        try:
            for spec in (jump or "").split(","):
                if not spec.strip():
                    continue
                hcfg, hhost, hport, huser, hid, hfall = self._hop(spec.strip())
                if tunnel is None:
                    tunnel, sub = await self._dial(hcfg, hhost, hport, huser, hid, hfall, None, depth + 1)
                    hops.extend(sub)
                else:
                    hkw, hprobe = await self._options(hcfg, hhost, hport, huser, hid, hfall)
                    hplace = self._place(hcfg, hhost, hport, hprobe, ",".join(before))
                    tunnel = await self._connect_one(hkw, tunnel, hprobe.host, hprobe.port,
                                                     via=",".join(before), place=hplace)
                hops.append(tunnel)
                before.append(spec.strip())
        except BaseException:
            for h in reversed(hops):
                h.close()
            raise
        return _Route(kwargs, probe, tunnel, hops, jump, place)

    async def _dial(
        self,
        cfg: NodeConfig,
        host: str,
        port: int | None,
        user: str | None,
        identity: str | None,
        fallback_identity: str | None,
        jump: str | None,
        depth: int = 0,
    ) -> tuple[asyncssh.SSHClientConnection, list[asyncssh.SSHClientConnection]]:
        """One verified connection to ``host``, through its jump chain (each hop verified too).

        Returns the connection and the jump connections it rides on, nearest first.
        """
        route = await self._route(cfg, host, port, user, identity, fallback_identity, jump, depth)
        try:
            conn = await self._connect_one(route.kwargs, route.tunnel, route.probe.host, route.probe.port,
                                           via=route.via, place=route.place)
        except BaseException:
            route.close()
            raise
        return conn, route.hops

    def server_host_key(self) -> str | None:
        """The host key this transport's open connection verified (``TYPE BASE64``), or None."""
        conn = self._conn
        key = conn.get_server_host_key() if conn is not None else None
        if key is None:
            return None
        return " ".join(key.export_public_key("openssh").decode().split()[:2])

    async def offered_host_key(self) -> OfferedKey:
        """The host key the node offers over the very route :meth:`connect` takes (the inventory's
        jump, ProxyJump and ProxyCommand from the ssh config; every jump verified as usual), and
        the known_hosts name and file the transport checks it under (``HostKeyAlias`` honoured).
        No login is attempted on the node itself. This is what ``sparkconsole trust`` shows and
        records: fetched any other way, a node behind a jump host got the wrong key, or none."""
        cfg = self.config
        route = await self._route(cfg, cfg.host, cfg.port, cfg.user, cfg.identity, None, cfg.jump)
        try:
            key = await fetch_host_key(route.probe.host, route.probe.port, tunnel=route.tunnel,
                                       timeout=self.connect_timeout, options=route.probe)
        finally:
            route.close()
            for h in route.hops:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(h.wait_closed(), 5)
        proxy = route.probe.proxy_command
        via = route.via or (shlex.join(proxy) if proxy and route.tunnel is None else None)
        return OfferedKey(key, route.place.host, route.place.port, route.place.files[0],
                          f"{route.probe.host}:{route.probe.port}", via)

    async def _connect_one(
        self,
        kwargs: dict[str, Any],
        tunnel: asyncssh.SSHClientConnection | None,
        real_host: str,
        real_port: int,
        via: str | None,
        place: _KeyPlace,
    ) -> asyncssh.SSHClientConnection:
        where = f"{real_host}:{real_port}"
        suffix = f" (via {via})" if via else ""
        try:
            return await asyncssh.connect(
                **kwargs,
                tunnel=tunnel if tunnel is not None else (),
                client_factory=lambda: _Client(self),
            )
        except asyncssh.HostKeyNotVerifiable:
            raise await self._host_key_error(kwargs, tunnel, real_host, real_port, place) from None
        except asyncssh.PermissionDenied as exc:
            user = kwargs.get("username") or "the configured user"
            raise TransportError(
                f"{self.node}: authentication failed for {user} at {where}{suffix}: {describe(exc)}"
            ) from None
        except ConnectionRefusedError:
            raise TransportError(f"{self.node}: connection refused by {where}{suffix}") from None
        except socket.gaierror:
            raise TransportError(f"{self.node}: cannot resolve host name {real_host!r}") from None
        except TimeoutError:
            raise _ConnectTimeout(
                f"{self.node}: timed out connecting to {where}{suffix} after {self.connect_timeout:g} s"
            ) from None
        except asyncssh.ChannelOpenError as exc:
            raise TransportError(f"{self.node}: the jump host could not reach {where}: {describe(exc)}") from None
        except (OSError, asyncssh.Error, ValueError) as exc:
            raise TransportError(f"{self.node}: cannot connect to {where}{suffix}: {describe(exc)}") from None

    async def _host_key_error(
        self, kwargs: dict[str, Any], tunnel: asyncssh.SSHClientConnection | None, host: str, port: int,
        place: _KeyPlace,
    ) -> HostKeyError:
        """The key offered (fetched again over the same route: the tunnel, or the ssh config's
        ProxyCommand), under the name asyncssh checked it by, and the ``trust`` line that records it."""
        name = known_host_name(place.host, place.port)
        files = [f for f in place.files if os.path.isfile(f)]
        try:
            key = await fetch_host_key(host, port, tunnel=tunnel, timeout=self.connect_timeout,
                                       options=kwargs["options"])
        except TransportError as exc:
            return HostKeyError(f"{self.node}: host key of {name} not verified ({exc.message})", host=name)
        changed = any(key_status(f, place.host, place.port, key) in ("changed", "revoked") for f in files)
        where = place.files[0]
        trust = place.trust
        if changed:
            msg = (
                f"{self.node}: host key of {name} has CHANGED (possible man-in-the-middle): offered "
                f"{key.key_type} {key.fingerprint}, which differs from the one recorded in {where}"
            )
        else:
            msg = (
                f"{self.node}: unknown host key for {name}: {key.key_type} {key.fingerprint} "
                f"(not in {where}); check it, then run: {trust}"
            )
        return HostKeyError(msg, host=name, fingerprint=key.fingerprint)

    async def _attempt(self) -> asyncssh.SSHClientConnection:
        """One connection attempt (run as a task: see :meth:`_start_attempt`)."""
        cfg = self.config
        try:
            conn, hops = await self._dial(cfg, cfg.host, cfg.port, cfg.user, cfg.identity, None, cfg.jump)
        except TransportError as exc:
            self._failures += 1
            # a timed-out attempt has already waited connect_timeout: the next may start at once
            wait = 0.0 if isinstance(exc, _ConnectTimeout) else self._delay_after(self._failures)
            self._retry_at = time.monotonic() + wait
            self.last_error = exc.message
            self._last_exc = exc
            raise
        if self._closed or self.connected:  # closed meanwhile, or an attempt beside won
            conn.close()
            for h in reversed(hops):
                h.close()
            if self._closed or self._conn is None:
                raise TransportError(f"{self.node}: transport is closed")
            return self._conn
        self._failures = 0
        self._retry_at = 0.0
        self.last_error = None
        self._last_exc = None
        self._conn, self._hops = conn, hops
        self.connections_made += 1
        return conn

    def _start_attempt(self) -> None:
        loop = asyncio.get_running_loop()
        if self._outcome is None or self._outcome.done():
            self._outcome = loop.create_future()
            # nobody may be waiting when it fails: never log "exception was never retrieved"
            self._outcome.add_done_callback(lambda f: f.cancelled() or f.exception())
        task = loop.create_task(self._attempt())
        self.attempts_made += 1
        self._attempts.append((time.monotonic(), task))
        task.add_done_callback(self._attempt_done)
        if self._beside_timer is None:
            self._beside_timer = loop.call_later(self.beside_after, self._beside)

    def _beside(self) -> None:
        """A fresh attempt beside the stuck ones (their SYNs wait in TCP's retransmit backoff)."""
        self._beside_timer = None
        if self._closed or self.connected or not self._attempts:
            return
        if len(self._attempts) < self.max_attempts:
            self._start_attempt()
        else:
            self._beside_timer = asyncio.get_running_loop().call_later(self.beside_after, self._beside)

    def _attempt_done(self, task: asyncio.Task[asyncssh.SSHClientConnection]) -> None:
        self._attempts = [(t0, t) for t0, t in self._attempts if t is not task]
        fut = self._outcome
        if task.cancelled():
            exc: BaseException = TransportError(f"{self.node}: transport is closed")
        elif task.exception() is None:
            if fut is not None and not fut.done():
                fut.set_result(task.result())
            self._stop_attempts()
            return
        else:
            exc = task.exception()  # type: ignore[assignment]
        if self._attempts or self.connected:
            return  # the others may still get through
        if self._beside_timer is not None:
            self._beside_timer.cancel()
            self._beside_timer = None
        if fut is not None and not fut.done():
            fut.set_exception(exc)
        if self.auto_reconnect and not self._closed and not isinstance(exc, HostKeyError):
            self._start_reconnect_loop()

    def _stop_attempts(self) -> None:
        """A connection is up: the attempts still stuck beside it are no longer needed."""
        if self._beside_timer is not None:
            self._beside_timer.cancel()
            self._beside_timer = None
        for _, task in self._attempts:
            task.cancel()

    async def _connection(self) -> asyncssh.SSHClientConnection:
        """The kept connection, or one attempt's outcome (joined if one is running).

        The attempt is shielded: a caller that gives up (its own timeout) does not cancel it, so
        it always ends with the SSH-level reason and counts towards the backoff.
        """
        if not self._attempts:
            wait = self.retry_in
            if wait > 0:
                last = self._last_exc
                if isinstance(last, HostKeyError):  # a key problem stays a key problem
                    raise HostKeyError(last.message, host=last.host, fingerprint=last.fingerprint)
                raise TransportError(
                    f"{self.node}: not connected ({self.last_error or 'connection lost'}); "
                    f"next attempt in {wait:.1f} s"
                )
            self._start_attempt()
        assert self._outcome is not None
        return await asyncio.shield(self._outcome)

    async def connect(self) -> None:
        """Open the connection now (ignores a pending backoff wait); idempotent."""
        self._closed = False
        if self.connected:
            return
        self._retry_at = 0.0
        await self._ensure()

    async def _ensure(self) -> asyncssh.SSHClientConnection:
        if self._closed:
            raise TransportError(f"{self.node}: transport is closed")
        conn = self._conn
        if conn is not None and not conn.is_closed():
            return conn
        self._drop()
        return await self._connection()

    def _start_reconnect_loop(self) -> None:
        if self._closed or (self._reconnect_task is not None and not self._reconnect_task.done()):
            return
        self._reconnect_task = asyncio.get_running_loop().create_task(self._reconnect_loop())

    async def _reconnect_loop(self) -> None:
        while not self._closed and not self.connected:
            await asyncio.sleep(max(self.retry_in, 0.01))
            if self._closed or self.connected:
                return
            try:
                await self._ensure()
            except HostKeyError:
                return  # a key problem needs the operator, not retries
            except TransportError:
                continue

    def _on_connection_lost(self, conn: asyncssh.SSHClientConnection, exc: Exception | None) -> None:
        if conn is not self._conn:
            return
        self._drop()
        if self._closed:
            return
        if exc is not None and "keepalive" in str(exc):
            silent = self.keepalive * (self.keepalive_count_max + 1)
            why = (f"no answer to SSH keepalive for {silent:g} s "
                   f"({self.keepalive_count_max} unanswered, every {self.keepalive:g} s)")
        else:
            why = describe(exc) if exc else "closed by the server"
        self.last_error = f"{self.node}: connection to {self._where} lost: {why}"
        self._last_exc = None
        if self.auto_reconnect:
            self._retry_at = time.monotonic()  # the first attempt right away, then back off
            with contextlib.suppress(RuntimeError):  # no running loop: the next call reconnects
                self._start_reconnect_loop()

    def _drop(self) -> None:
        conn, hops = self._conn, self._hops
        self._conn, self._hops = None, []
        if conn is not None:
            conn.close()
        for h in reversed(hops):
            h.close()

    async def close(self) -> None:
        self._closed = True
        task, self._reconnect_task = self._reconnect_task, None
        pending = [t for _, t in self._attempts]
        if self._beside_timer is not None:
            self._beside_timer.cancel()
            self._beside_timer = None
        for t in [task, *pending]:
            if t is not None:
                t.cancel()
        await asyncio.gather(*(t for t in [task, *pending] if t is not None), return_exceptions=True)
        conn, hops = self._conn, self._hops
        self._drop()
        for c in [c for c in (conn, *hops) if c is not None]:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(c.wait_closed(), 5)

    # ---- channels ---------------------------------------------------------------------------

    async def _open(self, text: str, wait: float, **kwargs: Any) -> asyncssh.SSHClientProcess:
        """One exec channel on the kept connection.

        A connection found dead is dropped and dialled again, once (the command never started).
        A session refused by a live server (OpenSSH's ``MaxSessions``, counting sessions whose
        commands still run after their channel closed) is retried for up to ``wait`` seconds.
        """
        redialled = False
        deadline = time.monotonic() + wait
        pause = 0.05
        while True:
            conn = await self._ensure()
            try:
                return await conn.create_process(text, **_ENCODING, **kwargs)
            except asyncssh.ChannelOpenError as exc:
                if not conn.is_closed():
                    if time.monotonic() + pause > deadline:
                        raise TransportError(
                            f"{self.node}: the server refused a new session: {describe(exc)}"
                        ) from None
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, 0.5)
                    continue
                error = describe(exc)
            except (OSError, asyncssh.Error) as exc:
                error = describe(exc)
            if redialled:
                raise TransportError(f"{self.node}: connection lost: {error}")
            redialled = True
            if conn is self._conn:
                self._drop()
                self._retry_at = 0.0

    @staticmethod
    def _kill(proc: asyncssh.SSHClientProcess) -> None:
        """Stop a remote command and close its channel.

        The ``signal`` request works for ordinary users; OpenSSH refuses it for root logins
        ("session signalling requires privilege separation"), where closing the channel is what
        stops the command (its pipes close: SIGPIPE on its next write, EOF on its next read).
        Streams run on a PTY, so closing one also sends SIGHUP to the whole remote session.
        """
        if proc.exit_status is None:
            with contextlib.suppress(Exception):
                proc.kill()
        proc.close()

    async def _acquire_slot(self) -> None:
        await self._slots.acquire()

    async def run(self, cmd: CommandLike, timeout: float = 30.0, input: str | None = None, *,
                  max_bytes: int = DEFAULT_MAX_BYTES) -> CommandResult:
        """Run ``cmd`` to completion.

        At most ``max_bytes`` of stdout and of stderr are kept (counted as UTF-8): a stream that passes
        the bound is cut there (:func:`~sparkconsole.transport.base.cut_marker`), the channel is closed
        and the command's processes are killed on the node by their token, so an endless writer costs
        the console ``max_bytes`` rather than its memory; the result is ``truncated``.

        The command runs with ``SPARKCONSOLE_RUN=<token>`` exported, which every process it starts
        inherits. On timeout the channel is closed and every process carrying the token is killed
        on the node (closing the channel alone leaves a quiet command running: OpenSSH refuses
        signals for root logins); the :class:`CommandTimeout` says whether that worked.
        """
        text = command_text(cmd)
        token = uuid.uuid4().hex
        wire = f"export {RUN_TOKEN_VAR}={token}\n{text}"
        start = time.monotonic()
        proc: asyncssh.SSHClientProcess | None = None
        slot = False
        try:
            async with asyncio.timeout(timeout):
                await self._acquire_slot()
                slot = True
                wait = timeout  # bounded by the asyncio.timeout around it
                if input is None:
                    proc = await self._open(wire, wait, stdin=asyncssh.DEVNULL)
                else:
                    proc = await self._open(wire, wait, input=input)
                stdout, stderr, cuts = await _collect(proc, max(0, int(max_bytes)))
                if cuts:
                    self._kill(proc)
                    await self._kill_on_node(token)
        except TimeoutError:
            started = proc is not None
            if proc is not None:
                self._kill(proc)
                proc = None
            if slot:
                slot = False
                self._slots.release()
            raise await self._timed_out(text, timeout, token, started) from None
        except (OSError, asyncssh.Error) as exc:
            raise TransportError(f"{self.node}: {describe(exc)} while running: {_short(text)}") from None
        finally:
            if proc is not None:
                self._kill(proc)
            if slot:
                self._slots.release()
        assert proc is not None
        limit = max(0, int(max_bytes))
        return CommandResult(
            command=text,
            exit_status=None if cuts or proc.exit_signal else proc.exit_status,
            stdout=(stdout or "") + (cut_marker(limit) if "out" in cuts else ""),
            stderr=(stderr or "") + (cut_marker(limit) if "err" in cuts else ""),
            duration_s=time.monotonic() - start,
            truncated=bool(cuts),
        )

    async def _kill_on_node(self, token: str) -> None:
        """Best effort: kill what still carries ``token`` on the node (a cut ``run``: its channel is
        closed, which ends a writer at its next write, but not a child that went quiet)."""
        conn = self._conn
        if conn is None or conn.is_closed():
            return
        with contextlib.suppress(Exception):
            async with asyncio.timeout(min(max(self.connect_timeout, 1.0), 10.0)):
                proc = await conn.create_process(_kill_script(token), stdin=asyncssh.DEVNULL, **_ENCODING)
                await proc.communicate()

    async def _timed_out(self, text: str, timeout: float, token: str, started: bool) -> CommandTimeout:
        """Kill what a timed-out ``run`` left on the node; the error says what happened there."""
        head = f"{self.node}: timed out after {timeout:g} s: {_short(text)}"
        if not started:
            return CommandTimeout(f"{head}; it never started on the node", killed=True, processes=0)
        conn = self._conn
        if conn is None or conn.is_closed():
            return CommandTimeout(
                f"{head}; the connection is gone, so it may still be running on the node", killed=False
            )
        why = "no answer"
        try:
            async with asyncio.timeout(min(max(self.connect_timeout, 1.0), 10.0)):
                proc = await conn.create_process(_kill_script(token), stdin=asyncssh.DEVNULL, **_ENCODING)
                out, _ = await proc.communicate()
            for line in str(out or "").splitlines():
                if line.startswith(_KILLED + " "):
                    n = int(line.split()[1])
                    return CommandTimeout(
                        f"{head}; killed on the node ({n} process{'' if n == 1 else 'es'})",
                        killed=True, processes=n,
                    )
            why = "the node did not confirm"
        except (TimeoutError, OSError, ValueError, asyncssh.Error) as exc:
            why = describe(exc) if not isinstance(exc, TimeoutError) else "no answer"
        return CommandTimeout(
            f"{head}; could not kill it on the node ({why}): it may still be running", killed=False
        )

    async def stream(self, cmd: CommandLike) -> AsyncIterator[str]:
        """Lines of stdout and stderr (merged, in arrival order) as they come.

        The command runs on a PTY (no echo, no output post-processing): stdout and stderr
        interleave exactly as written, most tools flush per line on a terminal, and closing the
        channel hangs up the remote session. Stopping the iteration (``aclose()``, cancellation)
        therefore ends the remote command and its children, even where OpenSSH refuses signals.
        """
        text = command_text(cmd)
        await self._acquire_slot()
        proc: asyncssh.SSHClientProcess | None = None
        try:
            proc = await self._open(
                text,
                self.connect_timeout,
                stdin=asyncssh.DEVNULL,
                stderr=asyncssh.STDOUT,
                term_type="dumb",
                term_modes=_PTY_MODES,
            )
            while True:
                try:
                    line = await proc.stdout.readline()
                except (OSError, asyncssh.Error) as exc:
                    raise TransportError(f"{self.node}: stream lost: {describe(exc)}") from None
                if not line:
                    break
                if line.endswith("\n"):
                    line = line[:-1]
                    if line.endswith("\r"):
                        line = line[:-1]
                yield line
            if proc.exit_status is None and self._conn is None:
                raise TransportError(f"{self.node}: connection lost while streaming: {_short(text)}")
        finally:
            if proc is not None:
                self._kill(proc)
            self._slots.release()

    async def open_process(self, cmd: CommandLike) -> SshProcess:
        text = command_text(cmd)
        await self._acquire_slot()
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._slots.release()

        try:
            proc = await self._open(text, self.connect_timeout)
        except BaseException:
            release()
            raise
        return SshProcess(self.node, proc, release)

    def __repr__(self) -> str:
        state = "connected" if self.connected else "disconnected"
        return f"<SshTransport {self.node} {state}>"
