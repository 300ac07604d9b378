"""Recon: one read-only exec per node that reads everything the deployment decides on.

The script is the probe's own sections (memory, GPU, per-process GPU memory, ConnectX-7 ports,
addresses, containers: read by the same parsers into a :class:`NodeSample`) plus what only a
deployment needs: Docker's storage driver and images with digests, the RoCE v2 GID table, where
``$HOME``/``HF_HOME`` point and how much disk is free there, whether the node reaches the Hub,
whether a Hugging Face token is present (never its value), and who listens on which port.

:class:`NodeFacts` is plain data (it is saved in the deployment's state, so a resumed run knows
what was read without reading it again).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from sparkconsole.probe import parsers as P
from sparkconsole.probe.assemble import assemble_sample
from sparkconsole.probe.samples import NodeSample
from sparkconsole.probe.script import SECTION_BY_NAME, split_tick
from sparkconsole.remote import SECTION_MARK, RemoteScript, hub_reachable, sectioned

PROBE_SECTIONS = ("hostname", "uname", "meminfo", "gpu", "gpu-apps", "nvidia-smi", "ibdev2netdev", "ib-ports",
                  "ip-addr", "docker-ps", "docker-stats", "docker-version")

# Constant shell text (nothing interpolated): where the weights go, and what is there.
_HF_DIR = '"${HF_HOME:-$HOME/.cache/huggingface}"'
HOME_TEXT = 'echo "$HOME"; echo "${HF_HOME:-}"'
# The login user: DGX OS makes it at first boot (no fixed name, never root), and node-to-node ssh,
# rsync and docker load go to that user on the peer, as NVIDIA's playbooks set the keys up.
USER_TEXT = "id -un; id -u; id -g; id -Gn"
# sudo without a password: on stock DGX OS `sudo -n` answers "a password is required" (exit 1; sudo-rs:
# "interactive authentication is required": the exit status is what counts). `all`: a NOPASSWD rule for
# everything; `drop-caches`: only sparkrun's narrow rule (`USER ALL=(root) NOPASSWD: /usr/bin/tee
# /proc/sys/vm/drop_caches`; `sudo -n -l CMD` lists an allowed command without a password, sudo's
# default listpw=any); `none`: neither, so the flow runs nothing that needs sudo.
SUDO_TEXT = ("if sudo -n true >/dev/null 2>&1; then echo all; elif sudo -n -l /usr/bin/tee /proc/sys/vm/drop_caches "
             ">/dev/null 2>&1; then echo drop-caches; else echo none; fi")
# The tools the flow runs on a node. A missing one must be said as missing, with its install command,
# not met later as a network fault ("ping failed: check the cable", "rsync ended with exit 127").
FLOW_TOOLS = ("hf", "uvx", "rsync", "ping", "curl", "ss")
TOOLS_TEXT = ("for t in " + " ".join(FLOW_TOOLS) + '; do if command -v "$t" >/dev/null 2>&1; '
              'then echo "$t yes"; else echo "$t no"; fi; done')
INSTALL = {  # how to add each on DGX OS (Ubuntu); hf is not on DGX OS and system pip refuses it (PEP 668)
    "rsync": "sudo apt-get install -y rsync",
    "ping": "sudo apt-get install -y iputils-ping",
    "curl": "sudo apt-get install -y curl",
    "ss": "sudo apt-get install -y iproute2",
    "hf": "curl -LsSf https://astral.sh/uv/install.sh | sh, then `uvx hf` (or `uv tool install huggingface_hub`)",
}
# Free space where the weights will go, read without making anything: recon is read-only (it runs
# under --read-only and --plan-only too), so where the cache's hub folder does not exist yet, the
# nearest folder above it that does is measured (a folder made later lands on that file system).
DISK_TEXT = (f"d={_HF_DIR}/hub; while [ ! -d \"$d\" ] && [ \"$d\" != / ]; do d=$(dirname \"$d\"); done; "
             'df -B1 -P "$d"')
TOKEN_TEXT = (f'if [ -n "${{HF_TOKEN:-}}" ] || [ -s {_HF_DIR}/token ]; then echo yes; else echo no; fi')
GIDS_TEXT = ("grep -H . /sys/class/infiniband/*/ports/1/gids/* /sys/class/infiniband/*/ports/1/gid_attrs/types/* "
             "2>/dev/null")
IMAGES_TEXT = "docker images --digests --format '{{json .}}'"
# the store kind too: under Docker's containerd image store (Driver "overlayfs", DriverStatus driver-type
# io.containerd.snapshotter.v1; Docker 29's default on new installs) an image's ID can change across
# `docker save | docker load` (moby#48401, #47674, docker/cli#6670); a stock Spark capture shows overlay2.
DRIVER_TEXT = "docker info --format '{{.Driver}} {{json .DriverStatus}}'"
PORTS_TEXT = "ss -ltnp"
# which container each GPU process, and each process listening on a TCP port, belongs to: the first
# line of its cgroup names the scope (a twin keeps a port held by the container that holds it: the
# port frees when that container stops)
CGROUP_TEXT = ("for p in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader) "
               "$(ss -ltnp 2>/dev/null | grep -o 'pid=[0-9]*'); do p=${p#pid=}; "
               'echo "$p $(head -n 1 /proc/$p/cgroup 2>/dev/null)"; done')


def recon_command(model: str) -> RemoteScript:
    sections: list[tuple[str, Any]] = [(n, SECTION_BY_NAME[n].shell()) for n in PROBE_SECTIONS]
    sections += [("user", USER_TEXT), ("sudo", SUDO_TEXT), ("tools", TOOLS_TEXT), ("home", HOME_TEXT), ("disk", DISK_TEXT), ("token", TOKEN_TEXT), ("gids", GIDS_TEXT),
                 ("images", IMAGES_TEXT), ("storage", DRIVER_TEXT), ("ports", PORTS_TEXT),
                 ("cgroups", CGROUP_TEXT), ("hub", hub_reachable(model))]
    return sectioned(sections, summary="read the node (recon)")


@dataclass
class ImageFacts:
    ref: str  # repo:tag
    id: str  # sha256:…
    digest: str | None = None
    size: str | None = None


@dataclass
class Listener:
    port: int
    address: str
    process: str | None = None
    pid: int | None = None
    container: str | None = None  # the container its process runs in (its cgroup), where one does


@dataclass
class Holder:
    """What holds memory on the node: a container (by name) or a GPU process without one."""

    kind: str  # container | process | unit
    name: str
    bytes: int
    detail: str = ""
    running: bool = True


@dataclass
class LinkFacts:
    rdma: str
    netdev: str | None
    up: bool
    port: int | None
    ipv4: list[str] = field(default_factory=list)
    mtu: int | None = None
    gid_v2_index: int | None = None  # the RoCE v2 entry whose address is ::ffff:<ipv4>
    admin_down: bool = False  # set down on this node (`ip link set … down`), not a missing carrier


@dataclass
class NodeFacts:
    node: str
    reachable: bool = True
    reason: str = ""
    gpu: str | None = None
    driver: str | None = None
    cuda: str | None = None
    mem_total: int | None = None
    mem_available: int | None = None
    page_cache: int | None = None
    user: str | None = None  # the login user (``id -un``)
    uid: int | None = None
    gid: int | None = None
    groups: list[str] = field(default_factory=list)  # ``id -Gn``: ``docker`` among them lets it use docker
    sudo: str | None = None  # all | drop-caches | none (SUDO_TEXT); None: not read
    tools: dict[str, bool] = field(default_factory=dict)  # FLOW_TOOLS found on PATH (absent: not read)
    home: str | None = None
    hf_home: str | None = None
    disk_free: int | None = None
    disk_mount: str | None = None
    docker: str | None = None
    kernel: str | None = None  # ``uname -r``'s release (the probe's uname section)
    storage_driver: str | None = None
    image_store: str | None = None  # containerd | classic (the graph drivers: overlay2 ...); None: not read
    images: list[ImageFacts] = field(default_factory=list)
    containers: list[dict[str, Any]] = field(default_factory=list)
    holders: list[Holder] = field(default_factory=list)
    links: list[LinkFacts] = field(default_factory=list)
    hub: bool = False
    hub_detail: str = ""
    token: bool = False
    listeners: list[Listener] = field(default_factory=list)
    read_at: float = 0.0

    # -- derived ------------------------------------------------------------------------------
    @property
    def hf_dir(self) -> str:
        if self.hf_home:
            return self.hf_home.rstrip("/")
        return f"{(self.home or '/root').rstrip('/')}/.cache/huggingface"

    @property
    def job_dir_base(self) -> str:
        return f"{(self.home or '/root').rstrip('/')}/.cache/sparkconsole"

    def up_links(self) -> list[LinkFacts]:
        return [lk for lk in self.links if lk.up]

    def fast_ip(self) -> str | None:
        """The first IPv4 on an Up ConnectX-7 twin (the one NCCL/Ray/rsync should use)."""
        for lk in sorted(self.up_links(), key=lambda x: (x.netdev or "").startswith("enP")):
            if lk.ipv4:
                return lk.ipv4[0].split("/")[0]
        return None

    def fast_link(self) -> LinkFacts | None:
        ip = self.fast_ip()
        return next((lk for lk in self.links if ip and any(a.split("/")[0] == ip for a in lk.ipv4)), None)

    def image(self, ref: str) -> ImageFacts | None:
        want = normalize_image(ref)
        return next((i for i in self.images if normalize_image(i.ref) == want), None)

    @property
    def docker_denied(self) -> bool:
        """The login user may not use docker: not root and not in the ``docker`` group (NVIDIA's
        playbook: ``sudo usermod -aG docker $USER``, then ``newgrp docker``)."""
        return bool(self.user) and self.user != "root" and bool(self.groups) and "docker" not in self.groups

    def can_sudo(self, what: str = "all") -> bool:
        """``sudo -n`` may run ``what`` here: ``all`` needs a rule for everything; ``drop-caches``
        is allowed by that or by the narrow tee rule."""
        return self.sudo == "all" or (what == "drop-caches" and self.sudo == "drop-caches")

    def holder_of_port(self, port: int) -> Listener | None:
        return next((x for x in self.listeners if x.port == port), None)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NodeFacts:
        d = dict(data)
        d["images"] = [ImageFacts(**i) for i in d.get("images") or []]
        d["holders"] = [Holder(**h) for h in d.get("holders") or []]
        d["links"] = [LinkFacts(**x) for x in d.get("links") or []]
        d["listeners"] = [Listener(**x) for x in d.get("listeners") or []]
        return cls(**d)


def parse_ids(text: str) -> tuple[str | None, int | None, int | None, list[str]]:
    """``USER_TEXT``'s four lines (``id -un``, ``-u``, ``-g``, ``-Gn``) → user, uid, gid, groups;
    plain ``id`` (a real Spark's line) gives all four too."""
    m = re.search(r"uid=(\d+)\(([^)\s]+)\)\s+gid=(\d+)\([^)]*\)(?:\s+groups=(\S+))?", text)
    if m:
        groups = re.findall(r"\d+\(([^)]+)\)", m.group(4) or "")
        return m.group(2), int(m.group(1)), int(m.group(3)), groups
    lines = [x.strip() for x in text.splitlines()]
    user = parse_login_user(lines[0] if lines else "")
    uid = int(lines[1]) if len(lines) > 1 and lines[1].isdigit() else None
    gid = int(lines[2]) if len(lines) > 2 and lines[2].isdigit() else None
    groups = lines[3].split() if len(lines) > 3 and re.fullmatch(r"[\w.\- $]+", lines[3]) else []
    return user, uid, gid, groups


def parse_login_user(text: str) -> str | None:
    """The login user from ``id -un`` (a name alone), or from plain ``id`` (``uid=1000(jhunt) …``,
    as a real Spark prints it); None when neither is there."""
    for line in text.splitlines():
        line = line.strip()
        m = re.match(r"uid=\d+\(([^)\s]+)\)", line)
        if m:
            return m.group(1)
        if re.fullmatch(r"[a-z_][a-z0-9_.-]*\$?", line, re.I):
            return line
    return None


def parse_tools(text: str) -> dict[str, bool]:
    """``TOOLS_TEXT``'s lines (``rsync yes``, ``ping no``) → {tool: found}; other lines ignored."""
    out: dict[str, bool] = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) == 2 and words[0] in FLOW_TOOLS and words[1] in ("yes", "no"):
            out[words[0]] = words[1] == "yes"
    return out


def missing_tool(facts: NodeFacts, *tools: str) -> str | None:
    """The first of ``tools`` recon read as missing on the node (one not read is not missing)."""
    return next((t for t in tools if facts.tools.get(t) is False), None)


def normalize_image(ref: str) -> str:
    ref = ref.removeprefix("docker.io/")
    if "@" in ref:
        return ref
    if ":" not in ref.rsplit("/", 1)[-1]:
        ref += ":latest"
    return ref


# ---- parsing ----------------------------------------------------------------------------------

def parse_gids(text: str) -> dict[str, int]:
    """``grep -H .`` over ``gids/N`` and ``gid_attrs/types/N``: RDMA device → the index of its RoCE v2
    GID whose address is IPv4-mapped (``::ffff:a.b.c.d``), the one NCCL_IB_GID_INDEX must name."""
    gids: dict[tuple[str, int], str] = {}
    types: dict[tuple[str, int], str] = {}
    rx = re.compile(r"^/sys/class/infiniband/([^/]+)/ports/\d+/(gids|gid_attrs/types)/(\d+):(.*)$")
    for line in text.splitlines():
        m = rx.match(line.strip())
        if not m:
            continue
        key = (m.group(1), int(m.group(3)))
        (gids if m.group(2) == "gids" else types)[key] = m.group(4).strip()
    out: dict[str, int] = {}
    for (dev, idx), gid in sorted(gids.items()):
        if dev in out:
            continue
        if gid.lower().startswith("0000:0000:0000:0000:0000:ffff:") and "v2" in types.get((dev, idx), "").lower():
            out[dev] = idx
    return out


def parse_images(text: str) -> list[ImageFacts]:
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            d = json.loads(line)
        except ValueError:
            continue
        repo, tag = d.get("Repository"), d.get("Tag")
        if not repo or repo == "<none>":
            continue
        digest = d.get("Digest")
        out.append(ImageFacts(ref=f"{repo}:{tag}", id=str(d.get("ID") or ""),
                              digest=None if digest in (None, "", "<none>") else digest, size=d.get("Size")))
    return out


def parse_storage(text: str) -> tuple[str | None, str | None]:
    """``docker info --format '{{.Driver}} {{json .DriverStatus}}'`` → (driver, store kind):
    ``overlayfs [["driver-type","io.containerd.snapshotter.v1"]]`` is the containerd image store,
    ``overlay2 [["Backing Filesystem","extfs"],…]`` a classic graph driver."""
    words = text.strip().split(None, 1)
    if not words:
        return None, None
    driver = words[0]
    rest = words[1] if len(words) > 1 else ""
    store = "containerd" if "io.containerd.snapshotter" in rest or driver.startswith("io.containerd") else "classic"
    return driver, store


_SS = re.compile(r"^LISTEN\s+\d+\s+\d+\s+(\S+):(\d+)\s+\S+\s*(.*)$")
_SS_USER = re.compile(r'\(\("([^"]+)",pid=(\d+)')


def parse_ss(text: str) -> list[Listener]:
    """``ss -ltnp``: each listening TCP port with the process holding it when ss could tell."""
    out: dict[int, Listener] = {}
    for line in text.splitlines():
        m = _SS.match(line.strip())
        if not m:
            continue
        port = int(m.group(2))
        u = _SS_USER.search(m.group(3))
        if port not in out or (u and out[port].process is None):
            out[port] = Listener(port=port, address=m.group(1), process=u.group(1) if u else None,
                                 pid=int(u.group(2)) if u else None)
    return sorted(out.values(), key=lambda x: x.port)


_SCOPE = re.compile(r"(?:docker[-/]|/)([0-9a-f]{64})(?:\.scope)?")
_UNIT = re.compile(r"^0::/system\.slice/(?:[^/]+\.slice/)*([A-Za-z0-9:_.@-]+\.service)(?:/|$)")


def parse_cgroups(text: str) -> dict[int, str]:
    """``PID 0::/system.slice/docker-<64 hex>.scope`` lines: GPU pid → full container id."""
    return {pid: owner for pid, (kind, owner) in parse_owners(text).items() if kind == "container"}


def parse_owners(text: str) -> dict[int, tuple[str, str]]:
    """Who owns each GPU process, from the first line of its cgroup: ``("container", <64 hex>)``
    for a docker scope, ``("unit", "vllm-cluster.service")`` for a systemd service (Spark owners
    run models as units too: the seed article stopped ``vllm-cluster`` and ``vllm-proxy``), and
    nothing for a process in a login session (a host process: Ollama, ComfyUI started by hand)."""
    out: dict[int, tuple[str, str]] = {}
    for line in text.splitlines():
        pid, _, rest = line.strip().partition(" ")
        if not pid.isdigit():
            continue
        m = _SCOPE.search(rest)
        u = _UNIT.match(rest.strip())
        if m:
            out[int(pid)] = ("container", m.group(1))
        elif u and not u.group(1).startswith("docker"):
            out[int(pid)] = ("unit", u.group(1))
    return out


def _holders(sample: NodeSample, owners: dict[int, tuple[str, str]]) -> list[Holder]:
    """Memory per container (``docker stats``: its processes' host memory) and every GPU process
    (``--query-compute-apps``: on a Spark the engine's CUDA allocations, which docker stats does
    not count), each GPU process tied to its container, or its systemd unit, through its cgroup
    when that was read; one in neither is a host process (detail ``pid N``)."""
    out: list[Holder] = []
    ids: dict[str, str] = {}
    for c in sample.containers:
        if c.name is None:
            continue
        out.append(Holder("container", c.name, int(c.mem_used_bytes or 0), detail=c.image or "",
                          running=c.state == "running"))
        if c.id:
            ids[c.id] = c.name
    for p in sample.gpu_processes:
        kind, full = owners.get(int(p.pid or -1), ("", ""))
        owner = next((name for short, name in ids.items() if kind == "container" and full.startswith(short)), None)
        detail = f"container {owner}" if owner else f"unit {full}" if kind == "unit" else f"pid {p.pid}"
        out.append(Holder("process", p.name or f"pid {p.pid}", int(p.memory_mib or 0) << 20, detail=detail))
    return out


def facts_from_output(node: str, stdout: str, now: float | None = None) -> NodeFacts:
    """Everything one recon exec printed, read into :class:`NodeFacts` (never raises)."""
    now = time.time() if now is None else now
    secs = split_tick(stdout.splitlines(), mark=SECTION_MARK)
    sample = assemble_sample(node, now, {k: v for k, v in secs.items() if k in PROBE_SECTIONS})
    f = NodeFacts(node=node, read_at=now)
    g = sample.gpus[0] if sample.gpus else None
    f.gpu = g.name if g else None
    f.driver = sample.driver_version or (g.driver_version if g else None)
    f.cuda = sample.cuda_version
    f.mem_total = sample.memory.total_bytes
    f.mem_available = sample.memory.available_bytes
    f.page_cache = sample.memory.page_cache_bytes
    f.docker = sample.host.docker_version
    f.kernel = sample.host.kernel
    f.containers = [{"name": c.name, "image": c.image, "state": c.state, "status": c.status,
                     "mem": c.mem_used_bytes, "cpu": c.cpu_pct} for c in sample.containers]
    owners = parse_owners(secs["cgroups"].text) if "cgroups" in secs else {}
    f.holders = _holders(sample, owners)
    if "user" in secs:
        f.user, f.uid, f.gid, f.groups = parse_ids(secs["user"].text)
    sudo = secs["sudo"].text.strip().splitlines()[-1:] if "sudo" in secs else []
    f.sudo = sudo[0] if sudo and sudo[0] in ("all", "drop-caches", "none") else None
    f.tools = parse_tools(secs["tools"].text) if "tools" in secs else {}
    home = (secs["home"].text.splitlines() if "home" in secs else []) + ["", ""]
    f.home, f.hf_home = home[0].strip() or None, home[1].strip() or None
    if "disk" in secs:
        du = P.parse_df(secs["disk"].text)
        f.disk_free, f.disk_mount = du.available_bytes, du.mount
    f.token = "token" in secs and secs["token"].text.strip().endswith("yes")
    if "images" in secs:
        f.images = parse_images(secs["images"].text)
    if "storage" in secs and secs["storage"].rc == 0:
        f.storage_driver, f.image_store = parse_storage(secs["storage"].text)
    if "ports" in secs:
        f.listeners = parse_ss(secs["ports"].text)
        ids = {c.id: c.name for c in sample.containers if c.id and c.name}
        for lst in f.listeners:
            kind, full = owners.get(lst.pid or -1, ("", ""))
            lst.container = next((n for short, n in ids.items() if kind == "container" and full.startswith(short)), None)
    hub = secs.get("hub")
    code = hub.text.strip().splitlines()[-1] if hub and hub.text.strip() else ""
    f.hub = bool(hub and hub.rc == 0 and code in ("200", "401", "403"))
    f.hub_detail = code if f.hub else (code or "no answer")
    gid = parse_gids(secs["gids"].text) if "gids" in secs else {}
    nics = {i.name: i for i in sample.interfaces}
    for lk in sample.links:
        f.links.append(LinkFacts(rdma=lk.rdma_device, netdev=lk.netdev, up=lk.state == "up", port=lk.port,
                                 ipv4=list(lk.ipv4), mtu=lk.mtu, gid_v2_index=gid.get(lk.rdma_device),
                                 admin_down=_admin_down(nics.get(lk.netdev or ""))))
    if not sample.links:
        f.links = netdev_links(sample.interfaces)
    return f


# mlx5 names a ConnectX port's netdev by its PCI path and physical port: enp1s0f1np1, enP2p1s0f1np1
_CX_NETDEV = re.compile(r"^en[pP]\d+(?:p\d+)?s\d+f\d+np\d+$")


def _admin_down(nic: Any) -> bool:
    """``ip -j addr`` of an interface set down: operstate DOWN and neither LOWER_UP nor NO-CARRIER
    (the other end of a link set down shows NO-CARRIER / LOWERLAYERDOWN instead)."""
    return nic is not None and (nic.operstate or "").upper() == "DOWN" and nic.carrier is None


def netdev_links(interfaces: Any) -> list[LinkFacts]:
    """The fast link read from ``ip -j addr`` alone, for a node without RDMA devices (no
    ``ibdev2netdev``, nothing under /sys/class/infiniband: a driver not loaded, a container, the
    test lab): every netdev named like a ConnectX port, Up when the kernel says so. The RDMA side
    stays unknown (``rdma`` empty), so NCCL is told to use sockets on it (netenv)."""
    out = []
    for nic in interfaces:
        if not _CX_NETDEV.match(nic.name):
            continue
        up = (nic.operstate or "").upper() == "UP" and nic.carrier is not False
        out.append(LinkFacts(rdma="", netdev=nic.name, up=up, port=1, ipv4=list(nic.ipv4), mtu=nic.mtu,
                             admin_down=_admin_down(nic)))
    return out


def known_bad() -> list[dict[str, str]]:
    """The kernels and drivers known to break a Spark cluster (``deploy/data/known_bad.json``, shipped
    in the package): data, so an entry is added with its source and no code changes."""
    from importlib import resources

    text = resources.files("sparkconsole.deploy").joinpath("data/known_bad.json").read_text(encoding="utf-8")
    entries = json.loads(text).get("entries") or []
    return [e for e in entries if isinstance(e, dict) and e.get("kind") in ("kernel", "driver") and e.get("match")]


def known_bad_on(facts: NodeFacts) -> tuple[str, str] | None:
    """``(what, fix)`` when the node runs a kernel or driver listed in :func:`known_bad`, else None
    (a release not read is not bad)."""
    have = {"kernel": facts.kernel, "driver": facts.driver}
    for e in known_bad():
        if have.get(e["kind"]) == e["match"]:
            return (f"{facts.node}: {e['kind']} {e['match']} is known to break the cluster: {e.get('what', '')}",
                    str(e.get("fix") or "use another release, then --resume"))
    return None
