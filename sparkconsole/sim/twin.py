"""A simulated cluster built from a twin file: the operator's own cluster, as its recon read it.

:func:`build_twin` starts from the stock node of the model (:func:`~sparkconsole.sim.model.make_node`)
and puts on it what the twin read, node by node: the name, the login account (user, uid, gid,
groups, home), sudo (a NOPASSWD rule for all, sparkrun's narrow drop-caches rule, or none), the
host tools found or missing, the Hub's reachability and a token's presence, the images, the
running containers and the memory they and the GPU processes hold, the ConnectX-7 ports (their
netdev and RDMA names, IPv4 addresses, MTU, carrier, the RoCE v2 GID index), Docker's image store,
and the model's weights where the walk found them whole.

What the twin cannot know it takes from the stock model, and says so: :attr:`TwinCluster.invented`
lists every such fact, and the rehearsal's report carries the list, so a difference between the
rehearsal and the real run can be traced to a guess and the twin mended. An image outside the
simulator's catalogue is guessed from its name (the vLLM version of its tag), as the engine step
guesses before it runs the image's own check.
"""

from __future__ import annotations

import re
from dataclasses import replace

from sparkconsole.deploy.engines import version_from_ref, version_tuple
from sparkconsole.deploy.recon import NodeFacts, normalize_image
from sparkconsole.deploy.twin import Twin, TwinError
from sparkconsole.sim.clock import SimClock
from sparkconsole.sim.model import (
    DISK_TOTAL,
    DOCKER_VERSION,
    DRIVER,
    GB,
    GIB,
    HUB_CONFIGS,
    IMAGES,
    MEM_TOTAL,
    MODELS,
    PAGE_CACHE_FLOOR,
    PY_CMDS,
    RAY_CMDS,
    STOCK_GROUPS,
    TWIN_ARCHS,
    VLLM_CMDS,
    Account,
    CacheRamp,
    Container,
    Curve,
    Holder,
    Iface,
    Image,
    ModelSpec,
    RepoFile,
    SimCluster,
    hf_hub,
    make_node,
    set_repo_files,
    stable_hex,
    stable_int,
)
from sparkconsole.sim.scenarios import wire

SUDO_RULES = {"all": [("ALL",)], "drop-caches": [("/usr/bin/tee", "/proc/sys/vm/drop_caches")], "none": []}


class TwinCluster(SimCluster):
    """A :class:`SimCluster` that knows it is a twin: ``invented`` says what it guessed."""

    invented: list[str]
    twin: Twin


def build_twin(twin: Twin, clock: SimClock | None = None, seed: int = 1234, image: str | None = None) -> TwinCluster:
    """The twin of ``twin``'s cluster; ``image``: the engine image the operator chose (``--image``)."""
    invented = _model(twin)
    unreachable = [n.node for n in twin.nodes if not n.reachable]
    if unreachable:
        raise TwinError(f"the twin cannot stand in for {', '.join(unreachable)}: recon did not reach it")
    c = TwinCluster(clock or SimClock(), n_nodes=len(twin.nodes), seed=seed)
    c.twin = twin
    c.invented = invented
    wire(c)
    c.scenario = "twin"
    # what the rehearsal timed on the real nodes (deploy/rehearsal.py: read_cluster); the rest keeps
    # a Spark pair's figures, and the report says they were not measured
    m = twin.measured
    if m.get("hub_download"):
        c.internet_bps = float(m["hub_download"])  # a ranged read of the largest weight file
    if m.get("fast_link_copy"):
        c.fast_bps = float(m["fast_link_copy"])  # a stream over ssh to the peer
    if m.get("peer_ssh_s") is not None:
        c.peer_ssh_s = float(m["peer_ssh_s"])  # one `ssh PEER true`
    if m.get("hf_start_s") is not None:
        c.hf_start_s = float(m["hf_start_s"])  # `hf version`
    c.nodes = {}
    two = any(sum(1 for lk in f.links if lk.ipv4) > 1 for f in twin.nodes)
    c.layout = "two-subnet" if two else "netplan-ll"
    stores = {f.image_store for f in twin.nodes if f.image_store}
    c.image_store = "overlay2" if stores == {"classic"} else "containerd"
    if len(stores) > 1:
        c.invented.append(f"Docker's image store differs between the nodes ({', '.join(sorted(stores))}); "
                          "the twin uses containerd's on every node")
    for i, f in enumerate(twin.nodes):
        n = make_node(i, f.node, internet=f.hub, layout=c.layout)
        c.nodes[f.node] = n
        _links(c, i, f)
        _account(c, f)
        n.sudo_rules = list(SUDO_RULES.get(f.sudo or "none", []))
        n.tools = dict(f.tools)
        if not f.gpu:  # recon read no GPU (no nvidia-smi answered): the twin has none either
            n.tools["nvidia-smi"] = False
            c.invented.append(f"{f.node}: no GPU was read; the twin has no nvidia-smi there (and starts no "
                              "container with --gpus)")
        if f.token:
            # a stand-in: the twin file records that a token is there, never its value
            n.hf_token = "hf_" + stable_hex(34, "twin-token", f.node)
        n.images = {img.ref: img for img in (_image(c, f.node, x.ref, image, x.size) for x in f.images)
                    if img is not None}
        if twin.weights.get(f.node):
            c.seed_model(f.node, twin.model)
        _holders(c, f)
        _versions(c, f)
        _cache_and_disk(c, f)
    return c


def _cache_and_disk(c: TwinCluster, f: NodeFacts) -> None:
    """The page cache as read (a drop long ago, then what was read since), and the disk's free space
    as read (what the twin does not model as files is counted as used beside the OS). Which files
    the page cache holds is not read: the twin counts it as the HF cache's (the running services'
    weights, as on a Spark that serves models), so evicting the model files evicts it."""
    if f.page_cache is not None:
        c.drop_caches(f.node, -7200.0)
        more = f.page_cache - PAGE_CACHE_FLOOR
        if more > 0:
            c.cache_ramps.append(CacheRamp(f.node, -7100.0, -7000.0, float(more), path=hf_hub(c.login(f.node).home)))
            c.invented.append(f"{f.node}: which files its {f.page_cache / GIB:.1f} GiB of page cache hold; the twin "
                              "counts them as the HF cache's (evicted with the model files)")
    if f.disk_free is not None:
        c.nodes[f.node].disk_extra = max(0, DISK_TOTAL - f.disk_free - c.disk_used(f.node, 0.0))
        if f.disk_free > DISK_TOTAL:
            c.invented.append(f"{f.node}: its disk is larger than a Spark's; the twin's holds {DISK_TOTAL / GB:.0f} GB")


def _model(twin: Twin) -> list[str]:
    """A model outside the simulator's catalogue, from what the rehearsal read of it: its files as
    the Hub listed them (names, sizes, sha256) and its config.json. Registered with the simulated
    Hub and catalogue (module-wide, by repo id: two twins of one model share it). What the config
    does not say is invented and listed."""
    if twin.model in MODELS:
        return []
    config = twin.model_config
    archs = config.get("architectures") if isinstance(config, dict) else None
    if archs is not None and (not isinstance(archs, list) or not all(isinstance(a, str) for a in archs)):
        raise TwinError(f"the twin's model_config.architectures must be a list of names, as in {twin.model}'s "
                        "config.json")
    if not twin.hub_files or not archs:
        raise TwinError(f"the twin knows {twin.model} only from its files and config on the Hub, and the rehearsal "
                        "read neither (no node reached the Hub?)")
    shards = [f for f in twin.hub_files if f.path.endswith(".safetensors")]
    weights = sum(f.size for f in shards) or sum(f.size for f in twin.hub_files)
    invented = [f"{twin.model}: not in the twin's catalogue; its load and memory after loading are guessed from "
                "its size (overhead 2 GiB)",
                f"{twin.model}: whether the engine images register {archs[0]} is not read (the engine check is a "
                "change); the twin says every vLLM image does"]
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    layers = _config_int(twin, text, "num_hidden_layers")
    heads = _config_int(twin, text, "num_attention_heads")
    kv_heads = _config_int(twin, text, "num_key_value_heads") or heads
    head_dim = _config_int(twin, text, "head_dim") or (_config_int(twin, text, "hidden_size") // heads if heads else 0)
    per_token = 2 * layers * kv_heads * head_dim * 2  # K and V, every layer, bf16
    if per_token <= 0:
        invented.append(f"{twin.model}: its KV cache per token (the config does not say its geometry)")
    MODELS[twin.model] = ModelSpec(
        twin.model, str(archs[0]), sum(f.size for f in twin.hub_files), len(twin.hub_files), max(1, len(shards)),
        weights / GIB, 2.0, GIB / per_token if per_token > 0 else 10_000.0,
        _config_int(twin, text, "max_position_embeddings") or _config_int(twin, config, "max_position_embeddings")
        or 4096, layers=layers)
    set_repo_files(twin.model, [RepoFile(f.path, f.size, f.sha256 or stable_hex(64, twin.model, f.path, "sha"),
                                         stable_hex(40, twin.model, f.path, "git"), f.sha256 is not None)
                                for f in twin.hub_files])
    HUB_CONFIGS[twin.model] = dict(config)
    TWIN_ARCHS.add(str(archs[0]))
    return invented


def _config_int(twin: Twin, config: dict, key: str) -> int:
    """A whole number the model's config.json gives (0 when it gives none): the file passed the twin's
    schema as any JSON, so a number here may still be text or absurd; that is one line, not a crash."""
    value = config.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1 << 24:
        raise TwinError(f"the twin's model_config: key {key!r} must be a whole number from 0 to {1 << 24}, "
                        f"as in {twin.model}'s config.json")
    return value


def _links(c: TwinCluster, index: int, f: NodeFacts) -> None:
    """The node's ConnectX-7 ports as read: each read netdev takes the place of the stock twin of
    the same role (port 1 first), with its name, RDMA device, addresses and MTU."""
    n = c.nodes[f.node]
    read = [lk for lk in f.links if lk.netdev]
    if not read:
        c.invented.append(f"{f.node}: no ConnectX-7 port was read; the twin gives it the stock ports")
        return
    ordered = sorted(read, key=lambda lk: (not lk.up, not lk.ipv4, (lk.netdev or "").startswith("enP")))
    stock = [i for i in n.ifaces if i.kind == "cx7" and i.port1] + [i for i in n.ifaces if i.kind == "cx7"
                                                                    and not i.port1]
    swap: dict[str, Iface] = {}
    for lk, old in zip(ordered, stock, strict=False):
        # the twin's carrier follows the read state (a ConnectX-7 twin is Up when it is the cabled one)
        swap[old.name] = replace(old, name=lk.netdev or old.name, ipv4=tuple(lk.ipv4), ipv6=(),
                                 rdma=lk.rdma or None, mtu=lk.mtu or old.mtu, port1=lk.up)
    # a stock port the node did not show is not there (a host with one fast netdev has one)
    n.ifaces = tuple(swap.get(i.name, i) for i in n.ifaces if i.kind != "cx7" or i.name in swap)
    fast = [lk for lk in ordered if lk.up and lk.ipv4]
    n.fast_ip = fast[0].ipv4[0].split("/")[0] if fast else ""
    n.fast_ip2 = fast[1].ipv4[0].split("/")[0] if len(fast) > 1 else ""
    n.port1_up = any(lk.up for lk in read)
    pins = {lk.gid_v2_index for lk in read if lk.gid_v2_index is not None and lk.gid_v2_index >= 3}
    if pins:
        n.gid_v2_index = min(pins)
    if any(not lk.rdma for lk in read):
        c.invented.append(f"{f.node}: no RDMA device was read for its fast link; the twin gives it none")


def _account(c: TwinCluster, f: NodeFacts) -> None:
    n = c.nodes[f.node]
    if not f.user:
        c.invented.append(f"{f.node}: the login user was not read; the twin logs in as the stock 'nvidia'")
        return
    uid = f.uid if f.uid is not None else 1000
    gid = f.gid if f.gid is not None else uid
    stock = dict((name, g) for g, name in STOCK_GROUPS)
    extra = [g for g in f.groups if g != f.user]
    groups = ((gid, f.groups[0] if f.groups else f.user),
              *((stock.get(g) or stable_int(2000, 3000, "group", g), g) for g in extra if g != (f.groups or [""])[0]))
    home = f.home or ("/root" if uid == 0 else f"/home/{f.user}")
    n.account = Account(f.user, uid, gid, groups, home)
    n.user = f.user
    n.docker_group = "docker" in f.groups or uid == 0
    if extra and any(g not in stock for g in extra):
        c.invented.append(f"{f.node}: the ids of groups {', '.join(g for g in extra if g not in stock)} "
                          "(recon reads their names)")
    if f.hf_home and f.hf_home.rstrip("/") != f"{home.rstrip('/')}/.cache/huggingface":
        c.invented.append(f"{f.node}: HF_HOME is {f.hf_home} there; the twin keeps the cache under {home}")


def _image(c: TwinCluster, node: str, ref: str, chosen: str | None = None, size: str | None = None) -> Image | None:
    """An image as the twin holds it: the catalogue's, else guessed. The image the operator chose
    (``--image``) is taken to serve the model with vLLM and Ray, as the real run's own check will
    verify; another one holds what its name says (a vLLM version in its tag, or no vLLM) and a
    Python. A guessed image joins the simulator's catalogue (module-wide, by reference)."""
    ref = normalize_image(ref)
    known = IMAGES.get(ref)
    if known is not None:
        return known
    if chosen is not None and normalize_image(chosen) == ref:
        version = version_from_ref(ref) or ASSUMED_VLLM
        c.invented.append(f"{node}: image {ref} (the one chosen) is not in the twin's catalogue; the twin takes it "
                          f"to hold vLLM {version} and Ray and to register the model; the real run checks it")
        img = Image(ref, version, docker_size(size), "", True, ray=ASSUMED_RAY, commands=(*VLLM_CMDS, *RAY_CMDS))
    else:
        version = version_from_ref(ref) or ""
        c.invented.append(f"{node}: image {ref} is not in the twin's catalogue; what it holds is guessed from its "
                          f"name ({'vLLM ' + version if version else 'no vLLM'}); the real run checks it")
        img = Image(ref, version, docker_size(size), "", bool(version) and version_tuple(version) >= (0, 16),
                    entrypoint=("vllm", "serve") if version else (), commands=VLLM_CMDS if version else PY_CMDS)
    IMAGES[ref] = img
    return img


def docker_size(text: str | None) -> int:
    """``docker images``' SIZE (``259MB``, ``21.4GB``, ``512kB``; decimal units, as docker prints
    them) in bytes; 20 GB (a vLLM image's order) when it says nothing readable."""
    m = re.fullmatch(r"\s*([0-9]{1,12}(?:\.[0-9]{1,6})?)\s*([kKMGT]?B)\s*", text or "")
    if not m:
        return int(20 * GB)
    return int(float(m.group(1)) * {"B": 1, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}[m.group(2)])


ASSUMED_VLLM = "0.17.0"  # the chosen image's vLLM where its name says none (the newest the twin models)
ASSUMED_RAY = "2.54.0"


def _holders(c: TwinCluster, f: NodeFacts) -> None:
    """Each running container as a container holding what ``docker stats`` said, and each GPU process
    as a process holding what ``--query-compute-apps`` said, in its container where one owns it."""
    t0 = -3600.0
    running = {str(ct.get("name")): ct for ct in f.containers if ct.get("state") == "running" and ct.get("name")}
    listens: dict[str, list[tuple[str, int, str]]] = {}
    for lst in f.listeners:
        if lst.container in running:
            listens.setdefault(lst.container, []).append((lst.address, lst.port, lst.process or "?"))
        elif lst.port not in STOCK_PORTS:
            c.nodes[f.node].listens.append((lst.address, lst.port, lst.process or "?", lst.pid or 0))
    # docker ps lists the newest first (the sim: the last added first): the order read is kept, and
    # the age its status says
    for k, (name, ct) in enumerate(reversed(running.items())):
        image = normalize_image(str(ct.get("image") or "unknown:latest"))
        started = -(up_seconds(str(ct.get("status") or "")) or 3600.0) + k * 1e-3
        c.add_container(Container(id=stable_hex(64, f.node, name, "twin"), name=name, image=image, argv=(),
                                  node=f.node, created=started - 2.0, started=started,
                                  host_rss=int(ct.get("mem") or 0), cpu_pct=float(ct.get("cpu") or 0.0),
                                  listens=tuple(listens.get(name, ()))))
    for k, h in enumerate(x for x in f.holders if x.kind == "process"):
        owner = h.detail.removeprefix("container ") if h.detail.startswith("container ") else None
        if owner is not None and owner not in running:
            owner = None
        pid = int(h.detail[4:]) if re.fullmatch(r"pid [0-9]{1,9}", h.detail) else \
            stable_int(2000, 400_000, f.node, "twin-pid", k)
        c.holders.append(Holder(node=f.node, pid=pid, name=h.name, curve=Curve([(t0, float(h.bytes))]),
                                container=owner))
        if owner is None and not h.detail.startswith("container "):
            c.invented.append(f"{f.node}: {h.name} ({h.bytes / GIB:.1f} GiB) runs outside any container there "
                              "(a host process or a unit); the twin keeps it but cannot stop it")
    if f.mem_total and abs(f.mem_total - MEM_TOTAL) > 0.01 * MEM_TOTAL:
        c.invented.append(f"{f.node}: its memory is {f.mem_total / GIB:.1f} GiB; the twin's is a GB10's "
                          f"{MEM_TOTAL / GIB:.1f} GiB")


STOCK_PORTS = (22, 53, 11000)  # what every simulated node listens on (sshd, resolved, the DGX dashboard)
_UNITS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400, "week": 604800, "month": 2592000}


def up_seconds(status: str) -> float | None:
    """How long docker's status says a container has been up: ``Up 25 hours``, ``Up About an hour``,
    ``Up 3 minutes (healthy)``, ``Up Less than a second``; None for anything else."""
    m = re.match(r"Up (?:(About an?|Less than an?|[0-9]{1,9}) )?(second|minute|hour|day|week|month)s?", status)
    if not m:
        return None
    count = 1 if m.group(1) is None or not m.group(1)[0].isdigit() else int(m.group(1))
    return float(count * _UNITS[m.group(2)])


def _versions(c: TwinCluster, f: NodeFacts) -> None:
    if f.driver and f.driver != DRIVER:
        c.invented.append(f"{f.node}: driver {f.driver} there; the twin's nvidia-smi says {DRIVER}")
    if f.docker and f.docker != DOCKER_VERSION:
        c.invented.append(f"{f.node}: Docker {f.docker} there; the twin's says {DOCKER_VERSION}")
