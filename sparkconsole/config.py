"""The cluster inventory: which nodes, how to reach them, what role each plays.

A TOML file::

    [cluster]
    name = "sparks"
    read_only = false          # refuse every change from the console
    services = ["ollama", "nvidia-dgx-dashboard"]   # systemd units worth controlling

    [[nodes]]
    name = "spark-1a32"        # shown in the UI, used in the journal
    host = "spark-1a32"        # an ~/.ssh/config alias or an address
    user = "nvidia"            # optional: else ~/.ssh/config, else the local user
    port = 22                  # optional
    role = "head"              # head | worker
    jump = "spark-1a32"        # optional ProxyJump (a node name or a host)
    fast_link = "enp1s0f1np1"  # optional: the ConnectX-7 netdev to use

    [keymap]                   # optional: binding id -> keys (Textual set_keymap)
    "app.quit" = "q,ctrl+q"

Found by ``--config FILE``, then ``$SPARKCONSOLE_CONFIG``, then the platformdirs user config
dir (:func:`default_config_path`). :func:`config_search` is the one seam tests patch.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from platformdirs import user_config_path, user_state_path

from sparkconsole.errors import ConfigError
from sparkconsole.remote import is_ipv6, validate_host, validate_ifname, validate_unit
from sparkconsole.schema import MAX_NODES, NODE_NAME, PRINTABLE, clean_node_name, read_capped, unknown_key

APP_NAME = "sparkconsole"
ENV_CONFIG = "SPARKCONSOLE_CONFIG"
MAX_CONFIG_BYTES = 1 << 20  # an inventory of 64 nodes is a few kB

# Every key the inventory knows, per table. Anything else is refused with the closest known key: a
# typo (``read_ony = true``) must not quietly leave a safety setting off.
TOP_KEYS = ("cluster", "nodes", "keymap")
CLUSTER_KEYS = ("name", "read_only", "services", "time_scale")
NODE_KEYS = ("name", "host", "user", "port", "role", "jump", "fast_link", "known_hosts", "identity", "ssh_config")

Role = Literal["head", "worker"]


@dataclass(frozen=True)
class NodeConfig:
    name: str
    host: str
    user: str | None = None
    port: int | None = None
    role: Role = "worker"
    jump: str | None = None
    fast_link: str | None = None
    known_hosts: str | None = None  # a known_hosts file for this node (the demo writes one)
    identity: str | None = None  # a private key file (else ~/.ssh/config / agent)
    ssh_config: str | None = None  # an ssh_config file to read instead of ~/.ssh/config


@dataclass(frozen=True)
class ClusterConfig:
    nodes: tuple[NodeConfig, ...]
    name: str = "cluster"
    read_only: bool = False
    services: tuple[str, ...] = ()
    keymap: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    source: str | None = None  # the file it came from, if any
    local: bool = False  # probe this machine itself, no SSH
    time_scale: float = 1.0  # node seconds per wall second: only a simulated cluster runs faster

    @property
    def head(self) -> NodeConfig | None:
        return next((n for n in self.nodes if n.role == "head"), self.nodes[0] if self.nodes else None)

    def node(self, name: str) -> NodeConfig:
        for n in self.nodes:
            if n.name == name:
                return n
        raise ConfigError(f"no node named {name!r} in the cluster")


def default_config_path() -> Path:
    return user_config_path(APP_NAME, appauthor=False) / "cluster.toml"


def state_dir() -> Path:
    """Where the journal, the theme choice and cached model specs live."""
    override = os.environ.get("SPARKCONSOLE_STATE_DIR")
    return Path(override) if override else user_state_path(APP_NAME, appauthor=False)


def config_search(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """The config file to use: ``--config``, then ``$SPARKCONSOLE_CONFIG``, then the user dir."""
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise ConfigError(f"{path}: no such config file")
        return path
    env = os.environ.get(ENV_CONFIG)
    if env:
        path = Path(env).expanduser()
        if not path.is_file():
            raise ConfigError(f"{path}: no such config file (from ${ENV_CONFIG})")
        return path
    path = default_config_path()
    return path if path.is_file() else None


def _where(path: str, text: str, key: str, index: int | None = None, table: str | None = None) -> str:
    """``file:line`` of ``key`` (inside the ``index``-th ``[[nodes]]`` table when given, or inside
    the ``[table]`` table, else at the top before any table).

    tomllib keeps no positions, so the line is found again in the text: the first line that
    assigns ``key`` in the right table, else the table's header line.
    """
    lines = text.splitlines()
    start, end = 0, len(lines)
    header_line = 0
    if index is not None:
        seen = -1
        for i, line in enumerate(lines):
            if line.strip() == "[[nodes]]":
                seen += 1
                if seen == index:
                    start, header_line = i + 1, i + 1
                elif seen == index + 1:
                    end = i
                    break
    elif table is not None:
        inside = False
        for i, line in enumerate(lines):
            head = line.strip()
            if head.startswith("["):
                if inside:
                    end = i
                    break
                if head.split("#")[0].strip() == f"[{table}]":
                    inside, start, header_line = True, i + 1, i + 1
    elif not key.startswith("["):  # a top-level key: before the first table header
        end = next((i for i, line in enumerate(lines) if line.strip().startswith("[")), len(lines))
    pattern = re.compile(rf"^\s*[\"']?{re.escape(key)}[\"']?\s*=")
    for i in range(start, end):
        if pattern.match(lines[i]) or lines[i].strip() == key:
            return f"{path}:{i + 1}"
    return f"{path}:{header_line}" if header_line else path


def split_host_spec(spec: str) -> tuple[str | None, str, int | None]:
    """``[USER@]HOST[:PORT]`` as ssh users write it: ``(user, host, port)``.

    An IPv6 HOST is written bare (``::1``, ``fe80::1%enp1s0``: then there is no port, every colon
    belongs to the address) or in brackets, with or without a port (``[2001:db8::1]:2222``,
    ``user@[::1]:2200``), as OpenSSH's own ``[host]:port`` form. Before, every colon but one was
    refused and the address with it. Raises ConfigError naming the spec."""
    user, at, rest = spec.rpartition("@")
    if at and not user:
        raise ConfigError(f"{spec}: nothing before '@' (USER@HOST)")
    port_s: str | None = None
    if rest.startswith("["):
        host, closed, tail = rest[1:].partition("]")
        if not closed or (tail and not tail.startswith(":")):
            raise ConfigError(f"{spec}: a bracketed host is written [HOST] or [HOST]:PORT")
        port_s = tail[1:] if tail else None
    elif rest.count(":") == 1:
        host, port_s = rest.split(":")
    else:
        host = rest  # a name, an IPv4 address, or a bare IPv6 one (no port: its colons are its own)
    port = None
    if port_s is not None:
        if not port_s.isdigit() or not 0 < int(port_s) < 65536:
            raise ConfigError(f"{spec}: port must be a number 1-65535")
        port = int(port_s)
    try:
        validate_host(host)
    except Exception as exc:
        raise ConfigError(f"{spec}: {exc}") from None
    return (user or None), host, port


def _opt_str(raw: Mapping[str, Any], key: str, where: str) -> str | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: key {key!r} must be a non-empty string")
    return value


def parse_config(text: str, source: str = "<config>") -> ClusterConfig:
    """Parse and check a config file's text; every error names file, line and key."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{source}: is larger than {MAX_CONFIG_BYTES >> 20} MiB; an inventory is a few kB")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise ConfigError(f"{source}: not valid TOML: nested too deeply") from None
    for key, value in data.items():
        if key not in TOP_KEYS:
            where = _where(source, text, f"[{key}]" if isinstance(value, dict) else key)
            if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
                where = _where(source, text, f"[[{key}]]")
            raise unknown_key(key, TOP_KEYS, where, "the file (it holds [cluster], [[nodes]] and [keymap])",
                              ConfigError)
    cluster = data.get("cluster", {})
    if not isinstance(cluster, dict):
        raise ConfigError(f"{_where(source, text, '[cluster]')}: [cluster] must be a table")
    for key in cluster:
        if key not in CLUSTER_KEYS:
            raise unknown_key(key, CLUSTER_KEYS, _where(source, text, key, table="cluster"), "[cluster]", ConfigError)
    raw_nodes = data.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise ConfigError(f"{source}: key 'nodes' missing: add at least one [[nodes]] table")
    if len(raw_nodes) > MAX_NODES:
        raise ConfigError(f"{source}: {len(raw_nodes)} [[nodes]] tables; the console watches at most {MAX_NODES} nodes")
    nodes: list[NodeConfig] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_nodes):
        if not isinstance(raw, dict):
            raise ConfigError(f"{source}: nodes[{i}] must be a table")
        for key in raw:
            if key not in NODE_KEYS:
                raise unknown_key(key, NODE_KEYS, _where(source, text, key, i), "[[nodes]]", ConfigError)
        name = raw.get("name") or raw.get("host")
        where = _where(source, text, "name", i)
        if not isinstance(name, str) or not NODE_NAME.fullmatch(name):
            if "name" not in raw and isinstance(name, str) and (is_ipv6(name) or name.startswith("[")):
                raise ConfigError(f"{where}: key 'name' missing: an IPv6 host needs a name for the node")
            raise ConfigError(f"{where}: key 'name' must be a short name (letters, digits, '-', '_', '.')")
        if name in seen:
            raise ConfigError(f"{where}: key 'name': node {name!r} is listed twice")
        seen.add(name)
        host = raw.get("host", name)
        where = _where(source, text, "host", i)
        if not isinstance(host, str):
            raise ConfigError(f"{where}: key 'host' must be a string")
        spec_port = None
        if host.startswith("["):  # [v6] or [v6]:port, as ssh users write it
            try:
                _, host, spec_port = split_host_spec(host)
            except ConfigError as exc:
                raise ConfigError(f"{where}: key 'host': {exc.message}") from None
        try:
            validate_host(host)
        except Exception as exc:
            raise ConfigError(f"{where}: key 'host': {exc}") from None
        port = raw.get("port")
        if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536):
            raise ConfigError(f"{_where(source, text, 'port', i)}: key 'port' must be a number 1-65535")
        if spec_port is not None:
            if port is not None and port != spec_port:
                raise ConfigError(f"{where}: key 'host' says port {spec_port}, key 'port' says {port}")
            port = spec_port
        role = raw.get("role", "head" if i == 0 else "worker")
        if role not in ("head", "worker"):
            raise ConfigError(f"{_where(source, text, 'role', i)}: key 'role' must be \"head\" or \"worker\"")
        fast = _opt_str(raw, "fast_link", _where(source, text, "fast_link", i))
        if fast is not None:
            try:
                validate_ifname(fast)
            except Exception as exc:
                raise ConfigError(f"{_where(source, text, 'fast_link', i)}: key 'fast_link': {exc}") from None
        nodes.append(
            NodeConfig(
                name=name,
                host=host,
                user=_opt_str(raw, "user", _where(source, text, "user", i)),
                port=port,
                role=role,
                jump=_opt_str(raw, "jump", _where(source, text, "jump", i)),
                fast_link=fast,
                known_hosts=_opt_str(raw, "known_hosts", _where(source, text, "known_hosts", i)),
                identity=_opt_str(raw, "identity", _where(source, text, "identity", i)),
                ssh_config=_opt_str(raw, "ssh_config", _where(source, text, "ssh_config", i)),
            )
        )
    services = cluster.get("services", [])
    where = _where(source, text, "services", table="cluster")
    if not isinstance(services, list) or not all(isinstance(s, str) for s in services) or len(services) > 64:
        raise ConfigError(f"{where}: key 'services' must be a list of at most 64 unit names")
    for s in services:
        try:
            validate_unit(s)
        except Exception as exc:
            raise ConfigError(f"{where}: key 'services': {exc}") from None
    read_only = cluster.get("read_only", False)
    if not isinstance(read_only, bool):
        raise ConfigError(f"{_where(source, text, 'read_only', table='cluster')}: key 'read_only' must be true or false")
    keymap = data.get("keymap", {})
    if not isinstance(keymap, dict) or not all(isinstance(v, str) for v in keymap.values()):
        raise ConfigError(f"{_where(source, text, '[keymap]')}: [keymap] must map binding ids to key strings")
    name = cluster.get("name", "cluster")
    if not isinstance(name, str) or len(name) > 64 or not PRINTABLE.fullmatch(name):
        raise ConfigError(f"{_where(source, text, 'name', table='cluster')}: key 'name' must be a string of at most "
                          "64 printable characters")
    scale = cluster.get("time_scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, int | float) or not 0 < scale <= 1000:
        raise ConfigError(f"{_where(source, text, 'time_scale', table='cluster')}: key 'time_scale' must be a number "
                          "in (0, 1000]")
    return ClusterConfig(
        nodes=tuple(nodes),
        name=name,
        read_only=read_only,
        services=tuple(services),
        keymap=MappingProxyType(dict(keymap)),
        source=source,
        time_scale=float(scale),
    )


def load_config(path: str | os.PathLike[str]) -> ClusterConfig:
    p = Path(path).expanduser()
    return parse_config(read_capped(p, MAX_CONFIG_BYTES, "config file", ConfigError), str(p))


def adhoc_cluster(hosts: list[str], read_only: bool = False) -> ClusterConfig:
    """``--host A --host B``: the first is the head. ``user@host:port`` is accepted, and IPv6
    addresses bare or bracketed (``::1``, ``user@[fe80::1%enp1s0]:2200``: :func:`split_host_spec`)."""
    nodes = []
    for i, spec in enumerate(hosts):
        try:
            user, host, port = split_host_spec(spec)
        except ConfigError as exc:
            raise ConfigError(f"--host {exc.message}") from None
        nodes.append(NodeConfig(name=host, host=host, user=user, port=port, role="head" if i == 0 else "worker"))
    names = [n.name for n in nodes]
    if len(set(names)) != len(names):
        raise ConfigError("--host: the same host is given twice")
    return ClusterConfig(nodes=tuple(nodes), name="adhoc", read_only=read_only)


def local_cluster(read_only: bool = False) -> ClusterConfig:
    import socket

    # the hostname is this machine's, not the user's to fix here: shown cleaned (an escape sequence in
    # it would otherwise reach the terminal, a '[' would be read as markup)
    name = clean_node_name(socket.gethostname() or "localhost")
    return ClusterConfig(nodes=(NodeConfig(name=name, host="localhost", role="head"),), name="local",
                         read_only=read_only, local=True)
