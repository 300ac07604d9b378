"""The simulated Sparks behind real SSH servers (asyncssh), one per node, on loopback.

Each node gets its own server on ``127.0.0.1`` and an ephemeral port, its own generated Ed25519
host key, and accepts one generated client key. :func:`start_demo_cluster` writes the client's
private key and a ``known_hosts`` (``[127.0.0.1]:PORT ssh-ed25519 ...``, one line per node) into
a temporary directory and returns a :class:`~sparkconsole.config.ClusterConfig` that points the
real SSH transport at them, so the console verifies host keys exactly as it does with real nodes.
Plain OpenSSH works too::

    ssh -i KEY -p PORT -o UserKnownHostsFile=FILE nvidia@127.0.0.1 nvidia-smi

Who logs in: the node's login user (``SimCluster.login``: ``nvidia`` on a stock node, root on the
permissive twin). A stock node's sshd refuses any other user name, root included, as Ubuntu's does
(``PermitRootLogin prohibit-password`` and no key for root): ``Permission denied (publickey)``.

What the server does with an exec request: a command containing the probe's ``HEADER`` runs the
probe protocol (one line per tick on stdin naming sections; each section's ``argv`` goes through
the node's :class:`~sparkconsole.sim.shell.Shell`; framed as ``::sparkprobe:: begin N`` / ``section
X`` / output / ``rc X code`` / ``end N``); any other command goes to the shell, its output streams
as sim time passes (``docker logs -f``), and closing the channel stops it. A shell request (no
command) gets a one-line notice: the sim is exec-only.

``node-lost``: once the node's ``lost_at`` sim time passes, the node stops answering: existing
channels go silent (nothing more is written, incoming data is no longer read), and the listening
port is taken over by a socket that accepts TCP connections but never sends an SSH banner, so new
connections time out in the handshake like a frozen host. ``DemoCluster.lose(node)`` does the same
at run time; either way the model is told (``SimCluster.mark_lost``), so TP engines spanning the
node hang on their next NCCL collective and die when its timeout runs out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncssh

from sparkconsole.config import ClusterConfig, NodeConfig
from sparkconsole.probe.script import (
    HEADER,
    MARK,
    PRELUDE,
    READERS_SECTION,
    SECTION_BY_NAME,
    section_arm,
)
from sparkconsole.sim import formats as F
from sparkconsole.sim.clock import NOMINAL, SimClock
from sparkconsole.sim.model import SimCluster, WorkSpan
from sparkconsole.sim.readers import SimReaders, interval_from_command
from sparkconsole.sim.shell import Shell

DEMO_USER = "root"


def _drop(_text: str) -> None:
    """A writer that keeps nothing."""




class _Server(asyncssh.SSHServer):
    def __init__(self, owner: NodeServer) -> None:
        self.owner = owner
        self.conn: asyncssh.SSHServerConnection | None = None

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self.conn = conn
        self.owner.connections.add(conn)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.conn is not None:
            self.owner.connections.discard(self.conn)

    def begin_auth(self, username: str) -> bool:
        sim, node = self.owner.sim, self.owner.node
        if not sim.permissive and username != sim.login(node).user and self.conn is not None:
            self.conn.set_authorized_keys(None)  # no key opens this account: "Permission denied (publickey)"
        return True  # public-key auth against the demo's client key (authorized_client_keys)

    def password_auth_supported(self) -> bool:
        return False


_STDIN_SHELLS = frozenset({"sh", "bash", "sh -s", "bash -s", "/bin/sh", "/bin/bash", "/bin/sh -s",
                           "/bin/bash -s", "sh -", "bash -"})
# commands that read their input from the channel: an interactive `docker run -i` (the rest get no stdin:
# a client that keeps its stdin open would otherwise hold every command up)
_READS_STDIN = re.compile(r"\bdocker run\b[^\n|;&]* (?:-i|--interactive)\b")
STDIN_MAX = 1 << 20


async def _read_all(stream, limit: int) -> str:
    """The channel's input to its end (``read(n)`` gives what has arrived so far, as a socket does),
    at most ``limit`` characters."""
    parts: list[str] = []
    got = 0
    while got < limit:
        chunk = await stream.read(limit - got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return "".join(parts)


class NodeServer:
    """One simulated Spark's SSH endpoint."""

    def __init__(self, sim: SimCluster, node: str, host_key: asyncssh.SSHKey,
                 client_keys: asyncssh.SSHAuthorizedKeys, host: str = "127.0.0.1", port: int = 0) -> None:
        self.sim = sim
        self.node = node
        self.host = host
        self.port = port
        self.host_key = host_key
        self.client_keys = client_keys
        self.connections: set[asyncssh.SSHServerConnection] = set()
        self._acceptor: asyncssh.SSHAcceptor | None = None
        self._blackhole: asyncio.base_events.Server | None = None
        self._held: list[asyncio.StreamWriter] = []
        self._watch: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[object]] = set()
        self.frozen = False

    async def start(self) -> int:
        self._acceptor = await asyncssh.create_server(
            lambda: _Server(self), self.host, self.port,
            server_host_keys=[self.host_key], authorized_client_keys=self.client_keys,
            process_factory=self._handle, encoding="utf-8", line_editor=False,
            keepalive_interval=0, login_timeout=30,
        )
        sockets = self._acceptor.sockets
        self.port = sockets[0].getsockname()[1]
        if self.sim.nodes[self.node].lost_at is not None:
            self._watch = asyncio.create_task(self._watch_lost())
        return self.port

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        for t in list(self._tasks):
            t.cancel()
        for conn in list(self.connections):
            conn.abort()
        if self._acceptor is not None:
            self._acceptor.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._acceptor.wait_closed(), 2)
        if self._blackhole is not None:
            self._blackhole.close()
        for w in self._held:
            w.close()

    # ---- node-lost ---------------------------------------------------------------------------

    async def _watch_lost(self) -> None:
        lost_at = self.sim.nodes[self.node].lost_at
        assert lost_at is not None
        await self.sim.clock.sleep(max(0.0, lost_at - self.sim.now()))
        await self.freeze()

    async def freeze(self) -> None:
        """Stop answering: silence live channels, hold new TCP connections without a banner."""
        if self.frozen:
            return
        self.frozen = True
        self.sim.mark_lost(self.node)  # the model agrees (TP engines spanning this node hang, then die)
        for conn in list(self.connections):
            transport = getattr(conn, "_transport", None)
            with contextlib.suppress(Exception):
                transport.pause_reading()  # type: ignore[union-attr]
        if self._acceptor is not None:
            self._acceptor.close()
            self._acceptor = None

        async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self._held.append(writer)

        for _ in range(20):
            try:
                self._blackhole = await asyncio.start_server(hold, self.host, self.port, reuse_address=True)
                break
            except OSError:
                await asyncio.sleep(0.05)

    def _lost(self) -> bool:
        return self.frozen or self.sim.nodes[self.node].lost(self.sim.now())

    async def _hang(self) -> None:
        await asyncio.get_running_loop().create_future()

    # ---- sessions ----------------------------------------------------------------------------

    async def _handle(self, process: asyncssh.SSHServerProcess) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            if self._lost():
                await self._hang()
            cmd = process.command
            if cmd is None and process.get_terminal_type():
                process.stdout.write(f"{self.node}: this simulated Spark only runs commands "
                                     f"(ssh ... {self.sim.login(self.node).user}@127.0.0.1 COMMAND)\r\n")
                process.exit(0)
                return
            if cmd is None or cmd.strip() in _STDIN_SHELLS:
                # `printf 'a\nb' | ssh NODE sh` (or no command at all): the shell reads its script from stdin
                script = await process.stdin.read()
                rc = await self._exec(process, script)
            elif HEADER in cmd:
                rc = await self._probe(process, cmd)
            elif _READS_STDIN.search(cmd):
                # `docker run -i … python3 - …`: the command's input comes on the channel (the console's
                # miniature writer); read to its end (bounded) before the command runs, as the image's
                # python3 would read its program before running it
                rc = await self._exec(process, cmd, await _read_all(process.stdin, STDIN_MAX))
            else:
                rc = await self._exec(process, cmd)
            if self._lost():
                await self._hang()
            process.exit(rc)
        except (asyncio.CancelledError, BrokenPipeError, ConnectionError, asyncssh.Error):
            with contextlib.suppress(Exception):
                process.close()
        finally:
            if task is not None:
                self._tasks.discard(task)

    def _writer(self, stream) -> object:
        def write(s: str) -> None:
            if self._lost() or not s:
                return
            with contextlib.suppress(Exception):
                stream.write(s)
        return write

    async def _exec(self, process: asyncssh.SSHServerProcess, cmd: str, stdin: str | None = None) -> int:
        shell = Shell(self.sim, self.node)
        span = WorkSpan(t0=self.sim.now(), kind="exec", node=self.node)
        if self.sim.record_work:
            self.sim.work_spans.append(span)
        mark = NOMINAL.set(span)  # the run's task takes a copy of this context: its sleeps count there
        try:
            run = asyncio.ensure_future(shell.run(cmd, self._writer(process.stdout), self._writer(process.stderr),
                                                  stdin))
        finally:
            NOMINAL.reset(mark)
        closed = asyncio.ensure_future(process.wait_closed())
        done, _ = await asyncio.wait({run, closed}, return_when=asyncio.FIRST_COMPLETED)
        if run not in done:
            run.cancel()
            with contextlib.suppress(BaseException):
                await run
            raise asyncio.CancelledError
        closed.cancel()
        return run.result()

    async def _probe(self, process: asyncssh.SSHServerProcess, cmd: str) -> int:
        shell = Shell(self.sim, self.node)
        held = shell.hold(["sh", "-c", cmd])  # the probe's one shell: sections run in it, as on the node
        await shell.run_here(PRELUDE, _drop, _drop)  # its helpers, defined once as the script does
        readers = SimReaders(lambda c, o, e: Shell(self.sim, self.node).run(c, o, e), self.sim.now,
                             interval_from_command(cmd))
        try:
            return await self._probe_ticks(process, shell, readers)
        finally:
            await readers.close()
            held.cancel()

    async def _probe_ticks(self, process: asyncssh.SSHServerProcess, shell: Shell, readers: SimReaders) -> int:
        seq = 0
        while True:
            line = await process.stdin.readline()
            if not line:
                return 0
            if self._lost():
                await self._hang()
            seq += 1
            with self.sim.fs(self.node).held():  # one request reads the node's /proc and /sys once
                out = await self._answer(line, seq, shell, readers)
            if self._lost():
                await self._hang()
            process.stdout.write("".join(out))
            await process.stdout.drain()

    async def _answer(self, line: str, seq: int, shell: Shell, readers: SimReaders) -> list[str]:
        """One request line's answer, framed as the probe frames it."""
        out = [f"{MARK} begin {seq}\n"]
        for name in line.split():
            out.append(f"{MARK} section {name}\n")
            sec = section_arm(name)
            if name == READERS_SECTION:
                out.append(readers.state_text())
                rc = 0
            elif sec is None:
                out.append(f"unknown section: {name}\n")
                rc = 1
            elif name in SECTION_BY_NAME and SECTION_BY_NAME[name].reader and (shown := readers.show(name)):
                out.append(shown)
                rc = 0
            else:
                buf: list[str] = []
                rc = await shell.run_here(sec, buf.append, buf.append)
                text = "".join(buf)
                if text and not text.endswith("\n"):
                    text += "\n"
                out.append(text)
            out.append(f"{MARK} rc {name} {rc}\n")
        out.append(f"{MARK} end {seq}\n")
        return out


# ---- the demo cluster --------------------------------------------------------------------------


@dataclass
class DemoCluster:
    """A running simulated cluster: ``config`` for the console, ``sim`` for tests."""

    sim: SimCluster
    config: ClusterConfig
    servers: dict[str, NodeServer]
    workdir: Path
    key_path: Path
    known_hosts_path: Path
    _tmp: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    @property
    def clock(self) -> SimClock:
        return self.sim.clock

    def ssh_commands(self) -> list[str]:
        """How to reach each node with plain OpenSSH."""
        out = []
        for name, srv in self.servers.items():
            out.append(f"{name}: ssh -i {self.key_path} -p {srv.port} -o UserKnownHostsFile={self.known_hosts_path} "
                       f"-o IdentitiesOnly=yes {self.sim.login(name).user}@127.0.0.1")
        return out

    def inventory_toml(self) -> str:
        """The cluster as a config file (the format :func:`sparkconsole.config.parse_config` reads),
        so a second process (``sparkconsole --config FILE``, ``sparkconsole deploy --config FILE``)
        can drive this running cluster."""
        q = json.dumps  # a JSON string is a valid TOML basic string
        c = self.config
        lines = ["# the simulated cluster started by `sparkconsole demo --serve` (valid while it runs)",
                 "[cluster]", f"name = {q(c.name)}", f"read_only = {'true' if c.read_only else 'false'}",
                 f"time_scale = {self.sim.clock.speed:g}  # the simulated nodes' clock runs this much faster",
                 f"services = [{', '.join(q(s) for s in c.services)}]", ""]
        for n in c.nodes:
            lines += ["[[nodes]]", f"name = {q(n.name)}", f"host = {q(n.host)}", f"user = {q(n.user or DEMO_USER)}",
                      f"port = {n.port}", f"role = {q(n.role)}"]
            for key in ("fast_link", "known_hosts", "identity"):
                val = getattr(n, key)
                if val:
                    lines.append(f"{key} = {q(val)}")
            lines.append("")
        return "\n".join(lines)

    def write_inventory(self, path: str | os.PathLike[str] | None = None) -> Path:
        out = Path(path) if path is not None else self.workdir / "cluster.toml"
        out.write_text(self.inventory_toml())
        return out

    async def lose(self, node: str) -> None:
        """Mark ``node`` lost now: it stops answering over SSH and the model treats it as gone."""
        await self.servers[node].freeze()

    async def stop(self) -> None:
        try:
            for srv in self.servers.values():
                await srv.stop()
        finally:
            if self._tmp is not None:
                _LIVE_WORKDIRS.discard(self._tmp)
                self._tmp.cleanup()
                self._tmp = None


# The temporary folders of the demo clusters running in this process (the client's private key is
# in them): :func:`remove_workdirs` takes them away when the process must end at once (a signal).
_LIVE_WORKDIRS: set[tempfile.TemporaryDirectory[str]] = set()


def remove_workdirs() -> None:
    """Remove every running demo cluster's temporary folder now (safe from a signal handler)."""
    while _LIVE_WORKDIRS:
        tmp = _LIVE_WORKDIRS.pop()
        with contextlib.suppress(OSError):
            tmp.cleanup()


async def start_cluster(sim: SimCluster, workdir: str | os.PathLike[str] | None = None,
                        read_only: bool = False) -> DemoCluster:
    tmp = None
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="sparkconsole-demo-")
        _LIVE_WORKDIRS.add(tmp)
        workdir = tmp.name
    wd = Path(workdir)
    wd.mkdir(parents=True, exist_ok=True)
    client_key = asyncssh.generate_private_key("ssh-ed25519", comment="sparkconsole-demo")
    key_path = wd / "id_ed25519"
    key_path.write_bytes(client_key.export_private_key())
    os.chmod(key_path, 0o600)
    (wd / "id_ed25519.pub").write_bytes(client_key.export_public_key())
    authorized = asyncssh.import_authorized_keys(client_key.export_public_key().decode())
    servers: dict[str, NodeServer] = {}
    kh_lines = []
    nodes = []
    for name, node in sim.nodes.items():
        # the key in the node's /etc/ssh file (sim/formats.py), as a real sshd serves its own
        host_key = asyncssh.import_private_key(F.ssh_host_private_key(sim, name))
        srv = NodeServer(sim, name, host_key, authorized)
        port = await srv.start()
        servers[name] = srv
        pub = host_key.export_public_key("openssh").decode().strip()
        kh_lines.append(f"[127.0.0.1]:{port} {pub}")
        nodes.append(NodeConfig(name=name, host="127.0.0.1", user=sim.login(name).user, port=port, role=node.role,
                                fast_link=_fast_netdev(node), known_hosts=str(wd / "known_hosts"),
                                identity=str(key_path)))
    kh = wd / "known_hosts"
    kh.write_text("\n".join(kh_lines) + "\n")
    twin = getattr(sim, "twin", None)  # a twin of a real cluster is named after it
    config = ClusterConfig(nodes=tuple(nodes), name=f"twin-{twin.cluster}" if twin else f"demo-{sim.scenario}",
                           read_only=read_only,
                           services=("nvidia-dgx-dashboard", "ollama"), source="demo",
                           time_scale=sim.clock.speed if not sim.clock.manual else 1.0)
    return DemoCluster(sim=sim, config=config, servers=servers, workdir=wd, key_path=key_path,
                       known_hosts_path=kh, _tmp=tmp)


def _fast_netdev(node) -> str:
    """The node's cabled ConnectX-7 port with an address (a twin's keeps the name its node gave it)."""
    return next((i.name for i in node.ifaces if i.kind == "cx7" and i.port1 and i.ipv4), "enp1s0f1np1")


@contextlib.asynccontextmanager
async def start_demo_cluster(nodes: int = 2, scenario: str = "story", speed: float = 1.0,
                             clock: SimClock | None = None, seed: int = 1234, read_only: bool = False,
                             lost_after: float = 20.0, twin: Any = None) -> AsyncIterator[DemoCluster]:
    """``async with start_demo_cluster() as demo:`` — a simulated cluster behind SSH, torn down after.
    ``twin`` (a :class:`~sparkconsole.deploy.twin.Twin`): the cluster is that twin, not a scenario."""
    from sparkconsole.sim.scenarios import build
    from sparkconsole.sim.twin import build_twin

    clock = clock or SimClock(speed=speed)
    if twin is not None:
        sim = build_twin(twin, clock=clock, seed=seed)
    else:
        sim = build(scenario, nodes=nodes, clock=clock, seed=seed, lost_after=lost_after)
    demo = await start_cluster(sim, read_only=read_only)
    try:
        yield demo
    finally:
        await demo.stop()
