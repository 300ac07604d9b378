"""The network between the nodes: what must hold before NCCL is asked to use it, and the
per-node environment derived from what recon read.

Every value is per node and read, never one global guess: the fast-link address and netdev
(``VLLM_HOST_IP``, ``NCCL_SOCKET_IFNAME``, ``GLOO_SOCKET_IFNAME``, ``TP_SOCKET_IFNAME``,
``UCX_NET_DEVICES``), both RoCE twins of the cabled port in ``NCCL_IB_HCA`` (one twin halves the
bandwidth), and the RoCE v2 GID index of *this* node's device (it differs between nodes on some
kits: deploy-failures.md §10).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from sparkconsole.deploy.recon import NodeFacts


@dataclass(frozen=True)
class Problem:
    """Something off on the fast link, in words, with the exact fix."""

    node: str
    what: str
    fix: str
    kind: str  # link-down | no-address | subnet | mtu | port


def check_links(facts: list[NodeFacts]) -> list[Problem]:
    out: list[Problem] = []
    ports = {}
    for f in facts:
        up = f.up_links()
        set_down = [lk.netdev for lk in f.links if lk.admin_down and lk.netdev]
        if not up and set_down:
            out.append(Problem(f.node, f"no ConnectX-7 port is Up: {', '.join(set_down)} is set down on {f.node}",
                               f"on {f.node}: `sudo ip link set dev {set_down[0]} up` (and check `ip -br link` shows "
                               "it UP on every node)", "link-down"))
            continue
        if not up:
            downs = ", ".join(f"{lk.netdev or lk.rdma}" for lk in f.links if lk.netdev) or "no ConnectX-7 port"
            out.append(Problem(f.node, f"no ConnectX-7 port is Up ({downs} Down)",
                               "seat one QSFP cable in the same port of every Spark (the outer port: enp1s0f1np1 "
                               "/ enP2p1s0f1np1), then check `ibdev2netdev` shows (Up) on each; if it stays Down, "
                               "power-cycle the Spark (a warm reboot can leave the f1 twins down)", "link-down"))
            continue
        ports[f.node] = sorted({lk.port for lk in up if lk.port is not None} | {_port_of(lk.netdev) for lk in up})
        if f.fast_ip() is None:
            names = ", ".join(lk.netdev or lk.rdma for lk in up)
            out.append(Problem(f.node, f"the Up port ({names}) has no IPv4 address",
                               f"give it one on every node, e.g. `sudo ip addr add 192.168.200.1X/24 dev "
                               f"{up[0].netdev}` (netplan to keep it across reboots)", "no-address"))
    if len({tuple(v) for v in ports.values()}) > 1:
        desc = "; ".join(f"{n}: port {','.join(str(p) for p in v)}" for n, v in ports.items())
        out.append(Problem("", f"the cable is not in the same port on every node ({desc})",
                           "move the cable so the same physical port is used on each Spark", "port"))
    ips = {f.node: f.fast_ip() for f in facts if f.fast_ip()}
    nets = {}
    for f in facts:
        lk = f.fast_link()
        if lk is None:
            continue
        addr = next(a for a in lk.ipv4 if a.split("/")[0] == ips[f.node])
        nets[f.node] = ipaddress.ip_interface(addr if "/" in addr else addr + "/24").network
    if len(set(nets.values())) > 1:
        desc = ", ".join(f"{n} {ips[n]} ({net})" for n, net in nets.items())
        out.append(Problem("", f"the fast-link addresses are not on one subnet: {desc}",
                           "address the same twin of every node in one /24 (e.g. 192.168.200.0/24)", "subnet"))
    links = {f.node: f.fast_link() for f in facts}
    mtus = {n: (lk.mtu if lk else None) for n, lk in links.items()}
    if len({m for m in mtus.values() if m}) > 1:
        desc = ", ".join(f"{n} {m}" for n, m in mtus.items())
        high = max(m for m in mtus.values() if m)
        fixes = [f"on {n}: `sudo ip link set dev {lk.netdev} mtu {high}`" for n, lk in links.items()
                 if lk is not None and lk.netdev and lk.mtu and lk.mtu != high]
        out.append(Problem("", f"the MTU differs between the ends of the fast link ({desc}): NCCL hangs on that",
                           "; ".join(fixes) + " (the same MTU on every node's fast-link twins; netplan keeps it "
                           "across reboots)", "mtu"))
    # a link set down is the one to fix first: the other end only shows it as a missing carrier
    out.sort(key=lambda p: 0 if p.kind == "link-down" and "set down" in p.what else 1)
    return out


def _port_of(netdev: str | None) -> int:
    if netdev and netdev.endswith(("np1", "f1")):
        return 1
    return 0


def ib_devices(f: NodeFacts) -> tuple[list[str], int | None]:
    """The RDMA devices NCCL may use on this node and the GID index to pin, if any.

    Only Up twins whose GID table has a RoCE v2 entry for an IPv4 address are listed: under NVIDIA's
    earlier netplan one twin of each pair has no IPv4 (a real ``ip -br addr`` shows
    ``enP2p1s0f1np1`` with fe80 only), and NCCL on it fails at the queue-pair transition. The index
    is pinned only when it is the same for every listed device of this node; it differs between
    nodes (3 on one, 5 on a peer with an extra IPv6 address) and moves when addresses change, so
    it is read per node at launch, and left to NCCL (which picks a GID per device) when the
    devices disagree. A wrong one fails with ``ibv_modify_qp failed with 22 Invalid argument …
    INIT → RTR`` (deploy-failures; docs/dgx-os.md)."""
    listed = [x for x in f.up_links() if x.rdma and x.gid_v2_index is not None]
    if not listed:
        return [x.rdma for x in f.up_links() if x.rdma], None
    indexes = {x.gid_v2_index for x in listed}
    return [x.rdma for x in listed], (indexes.pop() if len(indexes) == 1 else None)


# The names node_env sets whose value is this node's own (its address, its devices, its GID index).
# vLLM >= 0.17 copies the Ray driver's NCCL_*/UCX_*/VLLM_*/HF_* variables to every worker (PR #34383),
# so any of these that differ between nodes go in ray_non_carry_over_env_vars.json on the head.
PER_NODE = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "UCX_NET_DEVICES", "NCCL_IB_HCA",
            "NCCL_IB_DISABLE", "NCCL_IB_GID_INDEX")


def node_env(f: NodeFacts, head_ip: str) -> list[tuple[str, str]]:
    """The environment one node's containers start with (Ray does not carry it across nodes)."""
    lk = f.fast_link()
    ip = f.fast_ip()
    if lk is None or ip is None or not lk.netdev:
        return []
    hcas, gid_index = ib_devices(f)
    env = [("VLLM_HOST_IP", ip), ("RAY_NODE_IP_ADDRESS", ip), ("MASTER_ADDR", head_ip),
           ("NCCL_SOCKET_IFNAME", lk.netdev), ("GLOO_SOCKET_IFNAME", lk.netdev), ("TP_SOCKET_IFNAME", lk.netdev),
           ("UCX_NET_DEVICES", lk.netdev)]
    # no RDMA device read on the link: NCCL over sockets on that netdev, never a guessed HCA
    env += [("NCCL_IB_HCA", ",".join(hcas)), ("NCCL_IB_DISABLE", "0")] if hcas else [("NCCL_IB_DISABLE", "1")]
    if gid_index is not None:
        env.append(("NCCL_IB_GID_INDEX", str(gid_index)))
    env += [("RAY_memory_monitor_refresh_ms", "0"), ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")]
    return env


def not_carried(envs: list[list[tuple[str, str]]]) -> list[str]:
    """The per-node names whose value is not the same on every node (set differently, or set on
    some and not others): what the head's Ray driver must not copy over the workers' own."""
    out = []
    for name in PER_NODE:
        values = {dict(e).get(name) for e in envs}
        if len(values) > 1:
            out.append(name)
    return out
