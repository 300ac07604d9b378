"""Start a REAL OpenSSH ``sshd`` for tests: throwaway keys, its own port, log and known_hosts.

:class:`LabSshd` writes an ``sshd_config`` under a scratch directory and runs
``/usr/sbin/sshd -D -f CONFIG -E LOG`` as a child process (``-D``: it does not daemonize, so
the test owns the listener's pid). Every instance has:

- a throwaway ed25519 host key (kept across :meth:`LabSshd.restart`, like a rebooted node),
- a throwaway ed25519 user key and its own ``authorized_keys`` (root logs in by key only),
- a ``known_hosts`` file already holding the host key (``[host]:port ssh-ed25519 ...``),
- an ``ssh_config`` file with a ``Host <alias>`` block (HostName, Port, User, IdentityFile,
  UserKnownHostsFile) for asyncssh's ``config=`` option.

The options that matter on this kind of machine (see the lab notes): ``/run/sshd`` must exist,
``StrictModes no`` (the keys live under /tmp, which is 1777), ``UsePAM no`` (no PAM stack),
``-E LOG`` (no syslog), ``LogLevel VERBOSE`` (so tests can count ``Accepted publickey`` lines).

ProxyJump (:func:`start_jump_pair`) uses a network namespace so the target is TRULY unreachable
except through the jump host: one namespace ``N`` and one veth pair (root side ``10.213.X.1``,
namespace side ``10.213.X.2``). Both sshds run inside ``N``: the jump listens on
``10.213.X.2`` (reachable from the root namespace over the veth), the target listens on ``N``'s
own loopback ``127.0.0.1`` — a different loopback from the test process's, so a direct connection
to it from the tests is refused. Only a ``direct-tcpip`` forward opened on the jump host reaches
it. Cleanup kills the sshds (and their session processes) by pid, deletes the veth and the
namespace.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from sparkconsole.config import NodeConfig

SSHD = "/usr/sbin/sshd"
SSH_KEYGEN = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (bind to port 0 and let it go)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def keygen(path: Path, comment: str = "sparkconsole-lab") -> Path:
    """A fresh ed25519 key pair at ``path`` / ``path.pub``, no passphrase."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for p in (path, path.with_suffix(".pub")):
        p.unlink(missing_ok=True)
    subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], check=True)
    path.chmod(0o600)
    return path


def public_key_line(path: Path) -> tuple[str, str]:
    """``(key_type, base64)`` of an OpenSSH ``.pub`` file."""
    kind, b64 = path.read_text().split()[:2]
    return kind, b64


def known_hosts_entry(host: str, port: int, pub: Path) -> str:
    kind, b64 = public_key_line(pub)
    name = host if port == 22 else f"[{host}]:{port}"
    return f"{name} {kind} {b64}\n"


@dataclass
class LabSshd:
    """One real sshd. ``host``/``port`` are what a client in the root namespace dials."""

    workdir: Path
    alias: str = "lab"
    listen: str = "127.0.0.1"
    port: int = 0
    user: str = "root"
    netns: str | None = None  # run inside this network namespace
    user_key: Path | None = None  # shared between instances of a pair
    extra_config: str = ""
    host_key: Path = field(init=False)
    log_path: Path = field(init=False)
    config_path: Path = field(init=False)
    pid_path: Path = field(init=False)
    known_hosts: Path = field(init=False)
    ssh_config: Path = field(init=False)
    authorized_keys: Path = field(init=False)
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if not self.port:
            self.port = free_port(self.listen if self.netns is None else "127.0.0.1")
        self.host_key = keygen(self.workdir / "ssh_host_ed25519_key", comment=f"host-{self.alias}")
        if self.user_key is None:
            self.user_key = keygen(self.workdir / "id_ed25519", comment=f"user-{self.alias}")
        self.authorized_keys = self.workdir / "authorized_keys"
        self.authorized_keys.write_text(self.user_key.with_suffix(".pub").read_text())
        self.authorized_keys.chmod(0o600)
        self.log_path = self.workdir / "sshd.log"
        self.pid_path = self.workdir / "sshd.pid"
        self.config_path = self.workdir / "sshd_config"
        self.known_hosts = self.workdir / "known_hosts"
        self.known_hosts.write_text(known_hosts_entry(self.host, self.port, self.host_key.with_suffix(".pub")))
        self.ssh_config = self.workdir / "ssh_config"
        self.ssh_config.write_text(self.ssh_config_block())
        self.write_sshd_config()

    # ---- what a client needs --------------------------------------------------------------

    @property
    def host(self) -> str:
        return self.listen

    @property
    def host_pub(self) -> Path:
        return self.host_key.with_suffix(".pub")

    def ssh_config_block(self, proxy_jump: str | None = None) -> str:
        lines = [
            f"Host {self.alias}",
            f"  HostName {self.host}",
            f"  Port {self.port}",
            f"  User {self.user}",
            f"  IdentityFile {self.user_key}",
            "  IdentitiesOnly yes",
            f"  UserKnownHostsFile {self.known_hosts}",
        ]
        if proxy_jump:
            lines.append(f"  ProxyJump {proxy_jump}")
        return "\n".join(lines) + "\n"

    def node_config(self, name: str | None = None, jump: str | None = None, **overrides: object) -> NodeConfig:
        """A :class:`NodeConfig` that reaches this sshd with the lab's own keys and files."""
        fields: dict[str, object] = dict(
            name=name or self.alias,
            host=self.host,
            user=self.user,
            port=self.port,
            jump=jump,
            known_hosts=str(self.known_hosts),
            identity=str(self.user_key),
            ssh_config=str(self.ssh_config),
        )
        fields.update(overrides)
        return NodeConfig(**fields)  # type: ignore[arg-type]

    # ---- the daemon -------------------------------------------------------------------------

    def write_sshd_config(self) -> None:
        # sshd keeps the FIRST value of an option: extra_config goes first so it can override.
        self.config_path.write_text(
            f"""{self.extra_config}
Port {self.port}
ListenAddress {self.listen}
HostKey {self.host_key}
PidFile {self.pid_path}
AuthorizedKeysFile {self.authorized_keys}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AllowTcpForwarding yes
PermitTTY yes
MaxSessions 10
Subsystem sftp internal-sftp
LogLevel VERBOSE
"""
        )

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def count(self, pattern: str) -> int:
        return len(re.findall(pattern, self.log_text()))

    def accepted_logins(self) -> int:
        return self.count(r"Accepted publickey for ")

    def start(self, timeout: float = 10.0) -> None:
        if self.running:
            return
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        before = self.count(r"Server listening on ")
        cmd = [SSHD, "-D", "-f", str(self.config_path), "-E", str(self.log_path)]
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns, *cmd]
        self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"sshd exited with {self._proc.returncode}:\n{self.log_text()[-2000:]}")
            if self.count(r"Server listening on ") > before:
                return
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"sshd did not start within {timeout} s:\n{self.log_text()[-2000:]}")

    def stop(self) -> None:
        """Kill the listener AND every session process it forked (a node going away)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        victims: list[psutil.Process] = []
        with contextlib.suppress(psutil.Error):
            parent = psutil.Process(proc.pid)
            victims = [*parent.children(recursive=True), parent]
        for v in victims:
            with contextlib.suppress(psutil.Error):
                v.send_signal(signal.SIGKILL)
        with contextlib.suppress(Exception):
            proc.wait(timeout=5)
        psutil.wait_procs(victims, timeout=5)

    def restart(self) -> None:
        self.stop()
        self.start()

    def __enter__(self) -> LabSshd:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class JumpPair:
    """A jump host and a target reachable only through it (see the module docstring)."""

    jump: LabSshd
    target: LabSshd
    netns: str
    veth_root: str  # the root namespace's end of the link
    veth_ns: str  # the namespace's end (``ip -n NETNS link set VETH down`` unplugs the cable)
    ssh_config: Path

    def stop(self) -> None:
        self.target.stop()
        self.jump.stop()
        subprocess.run(["ip", "link", "del", self.veth_root], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def start_jump_pair(workdir: Path) -> JumpPair:
    tag = f"{os.getpid() % 100000}{random.randrange(100, 1000)}"
    netns = f"sclab{tag}"
    veth_root, veth_ns = f"scj{tag}a", f"scj{tag}b"
    subnet = random.randrange(0, 64) * 4
    third = random.randrange(0, 256)
    root_ip, ns_ip = f"10.213.{third}.{subnet + 1}", f"10.213.{third}.{subnet + 2}"
    _ip("netns", "add", netns)
    pair: JumpPair | None = None
    try:
        _ip("link", "add", veth_root, "type", "veth", "peer", "name", veth_ns)
        _ip("link", "set", veth_ns, "netns", netns)
        _ip("addr", "add", f"{root_ip}/30", "dev", veth_root)
        _ip("link", "set", veth_root, "up")
        _ip("-n", netns, "addr", "add", f"{ns_ip}/30", "dev", veth_ns)
        _ip("-n", netns, "link", "set", veth_ns, "up")
        _ip("-n", netns, "link", "set", "lo", "up")
        jump = LabSshd(workdir / "jump", alias="lab-jump", listen=ns_ip, port=free_port(), netns=netns)
        # The target's port is free in the root namespace too, so "refused" there proves isolation.
        target = LabSshd(workdir / "target", alias="lab-target", listen="127.0.0.1", port=free_port(),
                         netns=netns, user_key=jump.user_key)
        config = workdir / "ssh_config"
        config.write_text(jump.ssh_config_block() + target.ssh_config_block(proxy_jump=jump.alias))
        # one known_hosts for both, like a user's ~/.ssh/known_hosts
        both = jump.known_hosts.read_text() + target.known_hosts.read_text()
        for s in (jump, target):
            s.known_hosts.write_text(both)
            s.ssh_config = config
        pair = JumpPair(jump, target, netns, veth_root, veth_ns, config)
        jump.start()
        target.start()
        return pair
    except BaseException:
        if pair is not None:
            pair.stop()
        else:
            subprocess.run(["ip", "link", "del", veth_root], capture_output=True)
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        raise
