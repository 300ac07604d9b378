"""The simulated ConnectX-7 addressing and RoCE GID tables, held to real Sparks' shapes.

Real outputs (tests/fixtures/real/dgx-os): ``stock-spark-id-ip.txt`` (``ip -br addr`` / ``ip -br link``
of a stock Spark: NVIDIA's earlier netplan gives the cabled ``enp1s0f1np1`` one IPv4 link-local
address and its ``enP2p1s0f1np1`` twin fe80 only) and ``gid-table-rocep1s0f1.txt`` (a GID table: 0/1
the fe80 RoCE v1/v2 pair, 2/3 the IPv4-mapped pair). Shapes are compared, not values: the sim's
addresses are its own. The RoCE v2 IPv4 GID index differs between the nodes of the default story
(3 on the head, 5 on a worker whose fast link carries one more IPv6 address), and the console's
own recon reads it so (``sparkconsole.deploy.recon.parse_gids``).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import re

import pytest

from sparkconsole.deploy.recon import GIDS_TEXT, facts_from_output, parse_gids, recon_command
from sparkconsole.probe import parsers as P
from sparkconsole.sim import Shell, SimClock, build
from sparkconsole.sim.model import link_local4, link_local6, roce_gid
from tests.conftest import real_fixture

HEAD, WORKER = "spark-1a32", "spark-5be3"
PORT = "/sys/class/infiniband/{dev}/ports/1"
CX7 = ("enp1s0f0np0", "enp1s0f1np1", "enP2p1s0f0np0", "enP2p1s0f1np1")


def cluster(scenario: str = "story", nodes: int = 2):
    return build(scenario, nodes=nodes, clock=SimClock.frozen())


async def sh(c, node: str, cmd: str) -> tuple[str, str, int]:
    """Run ``cmd`` on the manual clock, a second at a time, until it finishes."""
    task = asyncio.ensure_future(Shell(c, node).capture(cmd))
    for _ in range(400):
        for _ in range(40):
            await asyncio.sleep(0)
        if task.done():
            return task.result()
        c.clock.advance(1.0)
    task.cancel()
    raise AssertionError(f"{cmd!r} did not finish")


def section(text: str, cmd: str) -> str:
    """The output under ``$ cmd`` in a fixture (up to the next ``$`` line)."""
    out, on = [], False
    for line in text.splitlines():
        if line.startswith("$ "):
            on = line == f"$ {cmd}"
            continue
        if on:
            out.append(line)
    return "\n".join(out).strip("\n") + "\n"


def brief(text: str) -> dict[str, tuple[str, list[str]]]:
    """``ip -br addr``: name -> (state, addresses)."""
    rows = {}
    for line in text.splitlines():
        if line.strip():
            name, state, *addrs = line.split()
            rows[name] = (state, addrs)
    return rows


def kind(addr: str) -> str:
    """An address's shape: IPv4 link-local /16, other IPv4, fe80 /64, ULA /64, other IPv6."""
    net = ipaddress.ip_interface(addr)
    if net.version == 4:
        return f"v4{'-ll' if net.ip.is_link_local else ''}/{net.network.prefixlen}"
    if net.ip.is_link_local:
        return f"fe80/{net.network.prefixlen}"
    return f"{'ula' if net.ip in ipaddress.ip_network('fc00::/7') else 'v6'}/{net.network.prefixlen}"


# ---- addressing ------------------------------------------------------------------------------

async def test_netplan_ll_matches_the_stock_spark_capture():
    real_text = section(real_fixture("dgx-os/stock-spark-id-ip.txt"), "ip -br addr")
    c = cluster()
    sim_text, _, rc = await sh(c, HEAD, "ip -br addr")
    assert rc == 0
    real, sim = brief(real_text), brief(sim_text)
    # the same interfaces in the same order and states
    assert list(sim) == list(real)
    assert {n: s for n, (s, _a) in sim.items()} == {n: s for n, (s, _a) in real.items()}
    # the fast link: one IPv4 link-local /16 and an fe80 on enp1s0f1np1, fe80 only on its enP2 twin,
    # nothing on the uncabled f0 twins
    for name in CX7:
        assert [kind(a) for a in sim[name][1]] == [kind(a) for a in real[name][1]], name
    assert [kind(a) for a in sim["enp1s0f1np1"][1]] == ["v4-ll/16", "fe80/64"]
    assert [kind(a) for a in sim["enP2p1s0f1np1"][1]] == ["fe80/64"]
    # iproute2's columns: name in 16, state in 14, then each address and a space (also on empty rows)
    for s_line, r_line in zip(sim_text.splitlines(), real_text.splitlines(), strict=True):
        assert s_line.endswith(" ") and r_line.endswith(" ")
        assert s_line[:32].split() == r_line[:32].split() and len(s_line[:32]) == 32 == len(r_line[:32])
        assert (s_line[32:] == "") == (r_line[32:] == "")
    # the address is the sim's own (not the capture's), stable, and the fe80 is the MAC's EUI-64
    assert c.node(HEAD).fast_ip != "169.254.127.30" and c.node(HEAD).fast_ip == cluster().node(HEAD).fast_ip
    mac = brief(section(real_fixture("dgx-os/stock-spark-id-ip.txt"), "ip -br link"))["enp1s0f1np1"][1][0]
    assert f"{link_local6(mac)}/64" == real["enp1s0f1np1"][1][1]  # the derivation reproduces the capture
    sim_mac = c.node(HEAD).iface("enp1s0f1np1").mac
    assert sim["enp1s0f1np1"][1] == [f"{c.node(HEAD).fast_ip}/16", f"{link_local6(sim_mac)}/64"]


async def test_netplan_ll_nodes_differ_and_the_worker_carries_a_ula():
    c = cluster(nodes=3)
    ips = [n.fast_ip for n in c.nodes.values()]
    assert len(set(ips)) == 3 and all(ipaddress.ip_address(ip).is_link_local for ip in ips)
    assert all(n.fast_ip2 == "" for n in c.nodes.values())
    for name, n in c.nodes.items():
        rows = brief((await sh(c, name, "ip -br addr"))[0])
        want = ["v4-ll/16", "fe80/64"] if n.role == "head" else ["v4-ll/16", "ula/64", "fe80/64"]
        assert [kind(a) for a in rows["enp1s0f1np1"][1]] == want, name
        assert [kind(a) for a in rows["enP2p1s0f1np1"][1]] == ["fe80/64"]
        assert rows["enp1s0f0np0"] == ("DOWN", []) and rows["enP2p1s0f0np0"] == ("DOWN", [])
    # IPv4LL re-picks an address another host holds (the ARP probe's conflict)
    first = link_local4(WORKER)
    assert link_local4(WORKER, {first}) != first and link_local4(WORKER, {first}).startswith("169.254.")


async def test_every_view_of_the_addresses_agrees():
    """``ip -j addr``, ``ip addr``, ``ip -br addr`` and ``-4``/``-6`` list the same IPv4 and IPv6
    addresses per interface, with the scopes the kernel gives them."""
    c = cluster()
    for node in c.nodes:
        js = json.loads((await sh(c, node, "ip -j addr"))[0])
        from_json = {d["ifname"]: [f"{a['local']}/{a['prefixlen']}" for a in d["addr_info"]] for d in js}
        text = (await sh(c, node, "ip addr"))[0]
        from_text: dict[str, list[str]] = {}
        cur = ""
        for line in text.splitlines():
            if m := re.match(r"^\d+: (\S+): <", line):
                cur = m.group(1)
                from_text[cur] = []
            elif m := re.match(r"^    inet6? (\S+) ", line):
                from_text[cur].append(m.group(1))
        from_brief = {n: a for n, (_s, a) in brief((await sh(c, node, "ip -br addr"))[0]).items()}
        assert from_json == from_text == from_brief
        v4 = {n: a for n, (_s, a) in brief((await sh(c, node, "ip -4 -br addr"))[0]).items()}
        v6 = {n: a for n, (_s, a) in brief((await sh(c, node, "ip -6 -br addr"))[0]).items()}
        assert {n: v4[n] + v6[n] for n in v4} == from_json
        scopes = {(d["ifname"], a["local"]): a["scope"] for d in js for a in d["addr_info"]}
        n = c.node(node)
        assert scopes[("enp1s0f1np1", n.fast_ip)] == "link"  # IPv4LL: RT_SCOPE_LINK (networkd-ipv4ll.c)
        assert scopes[("enP2p1s0f1np1", link_local6(n.iface("enP2p1s0f1np1").mac))] == "link"
        assert ("enp1s0f0np0" not in {k[0] for k in scopes}) and ("docker0", "172.17.0.1") in scopes
        assert not [k for k in scopes if k[0] == "docker0" and ":" in k[1]]  # NO-CARRIER: no fe80
        # the console's parsers read the same IPv4s
        ifs = {i.name: i for i in P.parse_ip_addr_json((await sh(c, node, "ip -j addr"))[0])}
        assert ifs["enp1s0f1np1"].ipv4 == (f"{n.fast_ip}/16",) and ifs["enP2p1s0f1np1"].ipv4 == ()
        links = {lk.rdma_device: lk.state for lk in P.parse_ibdev2netdev((await sh(c, node, "ibdev2netdev"))[0])}
        assert links == {"rocep1s0f0": "down", "rocep1s0f1": "up", "roceP2p1s0f0": "down", "roceP2p1s0f1": "up"}
        assert (await sh(c, node, "cat /sys/class/net/enP2p1s0f1np1/operstate"))[0] == "up\n"


async def test_two_subnet_addresses_both_twins():
    c = cluster("two-subnet")
    assert c.layout == "two-subnet"
    for k, (name, n) in enumerate(c.nodes.items()):
        assert (n.fast_ip, n.fast_ip2) == (f"192.168.200.{12 + k}", f"192.168.201.{12 + k}")
        rows = brief((await sh(c, name, "ip -br addr"))[0])
        assert rows["enp1s0f1np1"][1][0] == f"{n.fast_ip}/24" and rows["enP2p1s0f1np1"][1][0] == f"{n.fast_ip2}/24"
        assert [kind(a) for a in rows["enp1s0f1np1"][1]] == ["v4/24", "fe80/64"]
        assert [kind(a) for a in rows["enP2p1s0f1np1"][1]] == ["v4/24", "fe80/64"]
        gids = parse_gids((await sh(c, name, GIDS_TEXT))[0])
        assert gids == {"rocep1s0f1": 3, "roceP2p1s0f1": 3}  # both twins addressed, no extra IPv6
    # a test may switch the layout of a built cluster: every node is re-addressed
    c.layout = "netplan-ll"
    assert all(ipaddress.ip_address(n.fast_ip).is_link_local and n.fast_ip2 == "" for n in c.nodes.values())
    with pytest.raises(ValueError):
        c.layout = "dhcp"


async def test_the_link_local_addresses_carry_ping_ssh_and_ray():
    c = cluster("healthy")
    head, worker = c.node(HEAD), c.node(WORKER)
    assert c.node_by_ip(worker.fast_ip) is worker and c.reachable(head, worker.fast_ip) is worker
    out, _, rc = await sh(c, HEAD, f"ping -c 2 -M do -s 1472 {worker.fast_ip}")
    assert rc == 0 and "2 received" in out and "time=0.1" in out  # over the fast link, not the LAN
    out, _, rc = await sh(c, WORKER, f"ssh -o BatchMode=yes {head.fast_ip} hostname")
    assert rc == 0 and out == f"{HEAD}\n"
    img = "vllm/vllm-openai:v0.17.0"
    _, err, rc = await sh(c, HEAD, f"docker run -d --name rh --network host --entrypoint ray {img} start --block "
                                   f"--head --node-ip-address={head.fast_ip} --port=6379")
    assert rc == 0, err
    _, err, rc = await sh(c, WORKER, f"docker run -d --name rw --network host --entrypoint ray {img} start --block "
                                     f"--address={head.fast_ip}:6379 --node-ip-address={worker.fast_ip}")
    assert rc == 0, err
    c.clock.advance(10)
    ray = P.parse_ray_status((await sh(c, HEAD, "docker exec rh ray status"))[0])
    assert ray.active_nodes == 2
    # the cable out: the link-local address is not reachable any more
    head.port1_up = worker.port1_up = False
    assert c.reachable(head, worker.fast_ip) is None
    out, _, rc = await sh(c, HEAD, f"ping -c 3 {worker.fast_ip}")
    assert rc == 1 and "Destination Host Unreachable" in out


# ---- GID tables ------------------------------------------------------------------------------

def _table(out: str) -> dict[str, dict[int, tuple[str, str | None]]]:
    """``grep -H .`` output: device -> index -> (gid, type or None when unreadable)."""
    rx = re.compile(r"^/sys/class/infiniband/([^/]+)/ports/1/(gids|gid_attrs/types)/(\d+):(.*)$")
    gids: dict[str, dict[int, str]] = {}
    types: dict[str, dict[int, str]] = {}
    for line in out.splitlines():
        m = rx.match(line)
        assert m, line
        (gids if m.group(2) == "gids" else types).setdefault(m.group(1), {})[int(m.group(3))] = m.group(4)
    return {d: {k: (g, types.get(d, {}).get(k)) for k, g in t.items()} for d, t in gids.items()}


async def test_gid_tables_follow_the_addresses_head_3_worker_5():
    c = cluster()
    zero = "0000:0000:0000:0000:0000:0000:0000:0000"
    for node, v2 in ((HEAD, 3), (WORKER, 5)):
        n = c.node(node)
        out, err, rc = await sh(c, node, GIDS_TEXT)
        # the empty entries' types are unreadable: grep prints nothing for them and exits 2 (2>/dev/null)
        assert rc == 2 and err == ""
        t = _table(out)
        assert set(t) == {"rocep1s0f0", "rocep1s0f1", "roceP2p1s0f0", "roceP2p1s0f1"}
        for dev, table in t.items():
            iface = next(i for i in n.ifaces if i.rdma == dev)
            fe80 = roce_gid(link_local6(iface.mac))
            assert table[0] == (fe80, "IB/RoCE v1") and table[1] == (fe80, "RoCE v2")  # whatever the link
            used = {k for k, (_g, typ) in table.items() if typ is not None}
            assert all(table[k] == (zero, None) for k in table if k not in used)
            if dev != "rocep1s0f1":  # the f0 twins and the enP2 twin without an IPv4: the fe80 pair only
                assert used == {0, 1}, (node, dev)
        f1 = t["rocep1s0f1"]
        ipv4 = roce_gid(n.fast_ip)
        assert ipv4 == "0000:0000:0000:0000:0000:ffff:" + "{:02x}{:02x}:{:02x}{:02x}".format(
            *map(int, n.fast_ip.split(".")))
        assert f1[v2 - 1] == (ipv4, "IB/RoCE v1") and f1[v2] == (ipv4, "RoCE v2")
        if v2 == 5:  # the worker's ULA inserts its pair before the IPv4 one
            ula = next(a for a in n.iface("enp1s0f1np1").ipv6 if a.startswith("fd"))
            assert f1[2] == (roce_gid(ula), "IB/RoCE v1") and f1[3] == (roce_gid(ula), "RoCE v2")
        assert n.gid_v2_ipv4(n.iface("enp1s0f1np1")) == v2
        # an empty entry's type reads EINVAL, as sysfs answers it
        types = PORT.format(dev="rocep1s0f1") + "/gid_attrs/types"
        _, err, rc = await sh(c, node, f"cat {types}/7")
        assert rc == 1 and err == f"cat: {types}/7: Invalid argument\n"
        _, err, rc = await sh(c, node, f"grep -H . {types}/7")
        assert rc == 2 and err == f"grep: {types}/7: Invalid argument\n"
        assert (await sh(c, node, f"cat {PORT.format(dev='rocep1s0f1')}/gid_attrs/ndevs/{v2}"))[0] == "enp1s0f1np1\n"
        assert len((await sh(c, node, f"ls {types}"))[0].split()) == 8  # every slot is listed


async def test_a_gid_entry_has_the_shape_of_the_real_table():
    real = {}
    for line in real_fixture("dgx-os/gid-table-rocep1s0f1.txt").splitlines():
        if m := re.match(r"^gid\[(\d+)\]=(\S+)\s+type=(.+)$", line):
            real[int(m.group(1))] = (m.group(2), m.group(3).strip())
    assert sorted(real) == [0, 1, 2, 3]
    c = cluster()
    sim = _table((await sh(c, HEAD, GIDS_TEXT))[0])["rocep1s0f1"]

    def pattern(elided: str) -> re.Pattern[str]:
        """The capture's GID with ``...`` for the groups its author left out: literal groups kept
        (fe80, 0000, ffff), any other group any 4 hex digits."""
        parts = [r"(?:[0-9a-f]{4}:)*[0-9a-f]{4}" if g == "..." else re.escape(g) if g in ("fe80", "0000", "ffff")
                 else r"[0-9a-f]{4}" for g in elided.split(":")]
        return re.compile(":".join(parts))

    for k, (gid, typ) in real.items():
        assert sim[k][1] == typ, k
        assert pattern(gid).fullmatch(sim[k][0]), (k, gid, sim[k][0])
        assert re.fullmatch(r"[0-9a-f]{4}(?::[0-9a-f]{4}){7}", sim[k][0])  # %pI6: 8 groups of 4
    # the fe80 pair is the MAC's EUI-64 (ff:fe in the middle of the interface ID) in both
    for gid in (real[0][0], sim[0][0]):
        groups = gid.split(":")
        assert groups[-3].endswith("ff") and groups[-2].startswith("fe")


async def test_the_console_reads_3_on_the_head_and_5_on_the_worker():
    c = cluster()
    want = {HEAD: 3, WORKER: 5}
    for node in c.nodes:
        assert parse_gids((await sh(c, node, GIDS_TEXT))[0]) == {"rocep1s0f1": want[node]}
        # the whole recon, as the console sends it: the fast link, its address and its index
        out, _, _ = await sh(c, node, recon_command("Qwen/Qwen3.5-122B-A10B-FP8").shell())
        f = facts_from_output(node, out, now=1.0)
        assert f.fast_ip() == c.node(node).fast_ip
        lk = f.fast_link()
        assert lk is not None and (lk.rdma, lk.netdev, lk.gid_v2_index) == ("rocep1s0f1", "enp1s0f1np1", want[node])
        twin = next(x for x in f.links if x.rdma == "roceP2p1s0f1")
        assert twin.up and twin.ipv4 == [] and twin.gid_v2_index is None


async def test_a_test_can_pin_the_index():
    c = cluster()
    c.node(HEAD).gid_v2_index = 5  # holes at 2/3, as an address that came and went leaves them
    c.node(WORKER).gid_v2_index = 3  # the IPv4 pair first, the ULA's after it
    assert parse_gids((await sh(c, HEAD, GIDS_TEXT))[0]) == {"rocep1s0f1": 5}
    t = _table((await sh(c, WORKER, GIDS_TEXT))[0])["rocep1s0f1"]
    assert parse_gids((await sh(c, WORKER, GIDS_TEXT))[0]) == {"rocep1s0f1": 3}
    assert t[4][0].startswith("fd") and t[5][1] == "RoCE v2"
    c.node(HEAD).gid_v2_index = 2
    with pytest.raises(ValueError):
        c.node(HEAD).gid_table(c.node(HEAD).iface("enp1s0f1np1"))
