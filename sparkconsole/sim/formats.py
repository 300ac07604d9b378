"""Renderers: the simulated cluster's state in the exact formats real tools print.

Each function takes the cluster, a node name and a sim time and returns the text the real
command prints on a DGX Spark (shapes from ``tests/fixtures/real/gb10``): the GB10 ``nvidia-smi``
table (Memory-Usage ``Not Supported``, power cap ``N/A``), ``--query-gpu`` CSV (``[N/A]`` for
memory), ``--query-compute-apps`` (``VLLM::EngineCore, 109832 MiB``), ``/proc/meminfo``,
``ibdev2netdev``, the InfiniBand sysfs files (the RoCE GID tables), ``ip -j addr`` / ``ip addr`` /
``ip -br addr`` / ``ip -br link`` (IPv4 and IPv6: stock-spark-id-ip.txt in tests/fixtures/real/dgx-os),
``docker ps``/``stats``/``images``/``version`` and Ray 2.x ``ray status``.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import math
import posixpath
import time
import uuid

from sparkconsole.sim.model import (
    CLOCK_MAX_SM,
    CPUS,
    CUDA,
    DISK_TOTAL,
    DRIVER,
    GIB,
    GPU_BUS_ID,
    GPU_NAME,
    KERNEL,
    KIB,
    MIB,
    MODELS,
    ZERO_GID,
    Container,
    Iface,
    SimCluster,
    SimNode,
    _hash01,
    image_digest,
    noise,
)
from sparkconsole.sim.vfs import EINVAL, Unreadable

# ---- /proc -------------------------------------------------------------------------------------


def meminfo(c: SimCluster, node: str, t: float) -> str:
    m = c.memory(node, t)
    kb = lambda b: int(b // KIB)  # noqa: E731
    anon = m.used_apps // 3 + 2_900 * MIB
    rows = [
        ("MemTotal", kb(m.total)), ("MemFree", kb(m.free)), ("MemAvailable", kb(m.available)),
        ("Buffers", kb(m.buffers)), ("Cached", kb(m.cached)), ("SwapCached", 21_312),
        ("Active", kb(anon + m.cached // 2)), ("Inactive", kb(m.cached // 2 + 600 * MIB)),
        ("Active(anon)", kb(anon)), ("Inactive(anon)", 612_448), ("Active(file)", kb(m.cached // 2)),
        ("Inactive(file)", kb(m.cached - m.cached // 2)), ("Unevictable", 31_744), ("Mlocked", 27_648),
        ("SwapTotal", kb(m.swap_total)), ("SwapFree", kb(m.swap_free)), ("Zswap", 0), ("Zswapped", 0),
        ("Dirty", 1_204), ("Writeback", 0), ("AnonPages", kb(anon)), ("Mapped", 1_063_212),
        ("Shmem", 41_880), ("KReclaimable", 402_116), ("Slab", 1_031_540), ("SReclaimable", 402_116),
        ("SUnreclaim", 629_424), ("KernelStack", 31_472), ("ShadowCallStack", 7_904),
        ("PageTables", 84_560), ("SecPageTables", 0), ("NFS_Unstable", 0), ("Bounce", 0),
        ("WritebackTmp", 0), ("CommitLimit", kb(m.total // 2 + m.swap_total)),
        ("Committed_AS", kb(m.used_apps + 9 * GIB)), ("VmallocTotal", 133_141_626_880),
        ("VmallocUsed", 172_364), ("VmallocChunk", 0), ("Percpu", 16_640),
        ("HardwareCorrupted", 0), ("AnonHugePages", 1_359_872), ("ShmemHugePages", 0),
        ("ShmemPmdMapped", 0), ("FileHugePages", 0), ("FilePmdMapped", 0), ("CmaTotal", 0),
        ("CmaFree", 0), ("HugePages_Total", None), ("HugePages_Free", None), ("HugePages_Rsvd", None),
        ("HugePages_Surp", None), ("Hugepagesize", 2_048), ("Hugetlb", 0),
    ]
    out = []
    for key, val in rows:
        if val is None:
            out.append(f"{key + ':':<16}{0:>8}")
        else:
            out.append(f"{key + ':':<16}{val:>8} kB")
    return "\n".join(out) + "\n"


def pressure_memory(c: SimCluster, node: str, t: float) -> str:
    """``/proc/pressure/memory`` (PSI, Documentation/accounting/psi.rst): the share of recent time
    some (``some``) or all (``full``) tasks stalled on memory. The twin's stall follows what is left:
    nothing above a tenth of the total available, then steeply more as reclaim fights for the last
    gigabytes (``full`` about two thirds of ``some``, as a real node's trace shows them); the longer
    averages lag behind. ``total`` (microseconds stalled since boot) grows with uptime."""
    m = c.memory(node, t)
    share = m.available / m.total if m.total else 1.0
    some = 0.0 if share >= 0.10 else min(99.0, ((0.10 - share) / 0.10) ** 0.5 * 90.0)
    full = some * 0.66
    up_us = int(c.uptime(node, t) * 1e6)
    line = lambda kind, v, frac: (  # noqa: E731
        f"{kind} avg10={v:.2f} avg60={v * 0.6:.2f} avg300={v * 0.2:.2f} total={int(up_us * frac)}")
    return line("some", some, 0.0004) + "\n" + line("full", full, 0.0002) + "\n"


def uptime(c: SimCluster, node: str, t: float) -> str:
    up = c.uptime(node, t)
    idle = up * CPUS * 0.93
    return f"{up:.2f} {idle:.2f}\n"


def proc_stats(c: SimCluster, node: str) -> dict[str, str]:
    """``/proc/PID/stat`` of every process (proc(5)): field 22, ``starttime``, is when it started in
    clock ticks (USER_HZ 100) since boot; with the boot id it tells a job from a stranger that took its
    pid. The other fields are plausible constants (the console reads only 22)."""
    up0 = c.nodes[node].boot_uptime
    out = {}
    for p in c.proc_table(node).procs.values():
        comm = posixpath.basename(p.argv[0])[:15] if p.argv else "sh"
        start = int((up0 + p.started) * 100)
        out[f"/proc/{p.pid}/stat"] = (f"{p.pid} ({comm}) S {p.ppid} {p.pgid} {p.sid} 0 -1 4194560 120 0 0 0 "
                                      f"1 0 0 0 20 0 1 0 {start} 2514944 215 18446744073709551615\n")
    return out


def loadavg(c: SimCluster, node: str, t: float) -> str:
    a, b, cc = c.load_avg(node, t)
    running = 1 + int(c.gpu_activity(node, t) * 3)
    return f"{a:.2f} {b:.2f} {cc:.2f} {running}/1503 {3_770_418 + int(t) % 9000}\n"


def free_b(c: SimCluster, node: str, t: float, human: bool = False) -> str:
    m = c.memory(node, t)
    used = m.total - m.free - m.cached - m.buffers
    shared = 41 * MIB
    swap_used = m.swap_total - m.swap_free
    vals = [m.total, used, m.free, shared, m.cached + m.buffers, m.available]
    if human:
        def h(b: int) -> str:
            for unit, size in (("Ti", 1024**4), ("Gi", GIB), ("Mi", MIB), ("Ki", KIB)):
                if b >= size:
                    v = b / size
                    return f"{v:.1f}{unit}" if v < 10 else f"{round(v)}{unit}"
            return f"{b}B"
        mem = "".join(f"{h(v):>12}" for v in vals)
        sw = "".join(f"{h(v):>12}" for v in (m.swap_total, swap_used, m.swap_free))
    else:
        mem = "".join(f"{v:>12}" for v in vals)
        sw = "".join(f"{v:>12}" for v in (m.swap_total, swap_used, m.swap_free))
    return (f"{'total':>19}{'used':>12}{'free':>12}{'shared':>12}{'buff/cache':>12}{'available':>12}\n"
            f"Mem:   {mem}\nSwap:  {sw}\n")


def df(c: SimCluster, node: str, t: float) -> str:
    used = c.disk_used(node, t)
    avail = DISK_TOTAL - used - int(DISK_TOTAL * 0.0)
    cap = -(-used * 100 // (used + avail))
    return ("Filesystem        1-blocks          Used     Available Capacity Mounted on\n"
            f"/dev/nvme0n1p2 {DISK_TOTAL} {used:>13} {avail:>13}      {cap}% /\n")


def df_h(c: SimCluster, node: str, t: float) -> str:
    used = c.disk_used(node, t)
    avail = DISK_TOTAL - used

    def h(b: int) -> str:
        v = b / 1024**4
        if v >= 1:
            return f"{-(-int(v * 10) // 1) / 10:.1f}T" if v < 10 else f"{int(v)}T"
        v = b / GIB
        return f"{int(-(-v // 1))}G"
    cap = -(-used * 100 // DISK_TOTAL)
    return ("Filesystem      Size  Used Avail Use% Mounted on\n"
            f"/dev/nvme0n1p2  3.7T  {h(used):>4}  {h(avail):>4}  {cap:>2}% /\n")


# ---- nvidia-smi --------------------------------------------------------------------------------

_QUERY_HEADERS = {
    "index": ("index", None), "name": ("name", None), "uuid": ("uuid", None),
    "pci.bus_id": ("pci.bus_id", None), "driver_version": ("driver_version", None),
    "utilization.gpu": ("utilization.gpu [%]", "%"), "utilization.memory": ("utilization.memory [%]", "%"),
    "memory.total": ("memory.total [MiB]", "MiB"), "memory.used": ("memory.used [MiB]", "MiB"),
    "memory.free": ("memory.free [MiB]", "MiB"), "memory.reserved": ("memory.reserved [MiB]", "MiB"),
    "temperature.gpu": ("temperature.gpu", None), "power.draw": ("power.draw [W]", "W"),
    "power.limit": ("power.limit [W]", "W"), "clocks.sm": ("clocks.current.sm [MHz]", "MHz"),
    "clocks.current.sm": ("clocks.current.sm [MHz]", "MHz"), "clocks.max.sm": ("clocks.max.sm [MHz]", "MHz"),
    "pstate": ("pstate", None), "fan.speed": ("fan.speed [%]", "%"), "persistence_mode": ("persistence_mode", None),
    "timestamp": ("timestamp", None),
}


def smi_timestamp(c: SimCluster, t: float) -> str:
    """nvidia-smi's ``timestamp`` query field at sim time ``t``: ``2026/12/02 11:37:38.557`` (UTC, the
    clock the one-shot table's date line reads)."""
    sec, ms = divmod(round(c.clock.epoch(t) * 1000), 1000)
    return time.strftime("%Y/%m/%d %H:%M:%S", time.gmtime(sec)) + f".{ms:03d}"


def query_gpu(c: SimCluster, node: str, t: float, fields: list[str], header: bool = True,
              units: bool = True) -> tuple[str, int]:
    n = c.node(node)
    vals = {
        "index": "0", "name": GPU_NAME, "uuid": n.gpu_uuid, "pci.bus_id": "0000000F:01:00.0",
        "driver_version": DRIVER, "utilization.gpu": str(c.gpu_util(node, t)), "utilization.memory": None,
        "memory.total": None, "memory.used": None, "memory.free": None, "memory.reserved": None,
        "temperature.gpu": str(c.gpu_temp(node, t)), "power.draw": f"{c.gpu_power(node, t):.2f}",
        "power.limit": None, "clocks.sm": str(c.gpu_clock(node, t)),
        "clocks.current.sm": str(c.gpu_clock(node, t)), "clocks.max.sm": str(CLOCK_MAX_SM),
        "pstate": c.pstate(node, t), "fan.speed": None, "persistence_mode": "Enabled",
        "timestamp": smi_timestamp(c, t),
    }
    for f in fields:
        if f not in _QUERY_HEADERS:
            return (f'Field "{f}" is not a valid field to query.\n\n', 2)
    head = ", ".join(_QUERY_HEADERS[f][0] for f in fields)
    cells = []
    for f in fields:
        v = vals[f]
        unit = _QUERY_HEADERS[f][1]
        if v is None:
            cells.append("[N/A]")
        elif units and unit:
            cells.append(f"{v} {unit}" if unit != "%" else f"{v} %")
        else:
            cells.append(v)
    out = (head + "\n" if header else "") + ", ".join(cells) + "\n"
    return out, 0


def query_compute_apps(c: SimCluster, node: str, t: float, fields: list[str], header: bool = True,
                       units: bool = True) -> tuple[str, int]:
    names = {"pid": "pid", "process_name": "process_name", "used_gpu_memory": "used_gpu_memory [MiB]",
             "used_memory": "used_gpu_memory [MiB]", "gpu_uuid": "gpu_uuid", "gpu_bus_id": "gpu_bus_id",
             "name": "process_name", "timestamp": "timestamp"}
    for f in fields:
        if f not in names:
            return (f'Field "{f}" is not a valid field to query.\n\n', 2)
    lines = [", ".join(names[f] for f in fields)] if header else []
    for h, b in c.memory(node, t).gpu_holders:
        row = []
        for f in fields:
            if f == "timestamp":  # one stamp for every row of a sample
                row.append(smi_timestamp(c, t))
            elif f == "pid":
                row.append(str(h.pid))
            elif f in ("process_name", "name"):
                row.append(h.name)
            elif f in ("used_gpu_memory", "used_memory"):
                mib = b // MIB
                row.append(f"{mib} MiB" if units else str(mib))
            elif f == "gpu_uuid":
                row.append(c.node(node).gpu_uuid)
            else:
                row.append("0000000F:01:00.0")
        lines.append(", ".join(row))
    return ("\n".join(lines) + "\n") if lines else "", 0


def nvidia_smi(c: SimCluster, node: str, t: float) -> str:
    temp = c.gpu_temp(node, t)
    power = round(c.gpu_power(node, t))
    util = c.gpu_util(node, t)
    ps = c.pstate(node, t)
    date = time.strftime("%a %b %d %H:%M:%S %Y", time.gmtime(c.clock.epoch(t)))
    sep = "+-----------------------------------------+------------------------+----------------------+"
    out = [
        f"{date}       ",
        "+-----------------------------------------------------------------------------------------+",
        f"| NVIDIA-SMI {DRIVER}             Driver Version: {DRIVER}     CUDA Version: {CUDA}     |",
        sep,
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
        "|                                         |                        |               MIG M. |",
        "|=========================================+========================+======================|",
        f"|   0  {GPU_NAME}                    On  |   {GPU_BUS_ID} Off |                  N/A |",
        f"| N/A  {temp:>3}C    {ps:<2}{str(power) + 'W':>16} /  N/A  | Not Supported          |{util:>7}%      Default |",
        "|                                         |                        |                  N/A |",
        sep,
        "",
        "+-----------------------------------------------------------------------------------------+",
        "| Processes:                                                                              |",
        "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
        "|        ID   ID                                                               Usage      |",
        "|=========================================================================================|",
    ]
    procs = c.memory(node, t).gpu_holders
    if not procs:
        out.append("|  No running processes found                                                             |")
    for h, b in procs:
        mem = f"{b // MIB}MiB"
        out.append(f"|    0   N/A  N/A  {h.pid:>14}      C   {h.name:<37}{mem:>9} |")
    out.append("+-----------------------------------------------------------------------------------------+")
    return "\n".join(out) + "\n"


def nvidia_smi_L(c: SimCluster, node: str) -> str:
    return f"GPU 0: {GPU_NAME} (UUID: {c.node(node).gpu_uuid})\n"


# ---- links -------------------------------------------------------------------------------------


def ibdev2netdev(c: SimCluster, node: str) -> str:
    n = c.node(node)
    order = ["roceP2p1s0f0", "roceP2p1s0f1", "rocep1s0f0", "rocep1s0f1"]
    by_rdma = {i.rdma: i for i in n.ifaces if i.rdma}
    out = []
    for r in order:
        i = by_rdma[r]
        out.append(f"{r} port 1 ==> {i.name} ({'Up' if n.link_up(i) else 'Down'})")
    return "\n".join(out) + "\n"


def virtual_file(c: SimCluster, node: str, path: str, t: float) -> str | None:
    """``path`` as :func:`sysfs_files` renders it, rendered alone, for the files read every few
    seconds (a memory watcher's tick); None for any other (the caller renders them all)."""
    render = _ALONE.get(path)
    if render is None:
        return None
    mine = c.node(node).files
    return mine[path] if path in mine else render(c, node, t)


def sysfs_files(c: SimCluster, node: str, t: float) -> dict[str, str]:
    """The small virtual files a probe may read (``cat``/``grep`` them)."""
    n = c.node(node)
    files: dict[str, str] = {}
    for i in n.ifaces:
        up = n.carrier(i)
        base = f"/sys/class/net/{i.name}"
        files[f"{base}/operstate"] = ("unknown" if i.kind == "loopback" else ("up" if up else "down")) + "\n"
        files[f"{base}/mtu"] = f"{n.mtu_of(i)}\n"
        files[f"{base}/address"] = f"{i.mac}\n"
        files[f"{base}/carrier"] = ("1" if up else "0") + "\n"
        if i.kind == "cx7":
            files[f"{base}/speed"] = ("200000" if up else "-1") + "\n"
        if i.rdma:
            p = f"/sys/class/infiniband/{i.rdma}/ports/1"
            files[f"{p}/state"] = ("4: ACTIVE" if up else "1: DOWN") + "\n"
            files[f"{p}/phys_state"] = ("5: LinkUp" if up else "3: Disabled") + "\n"
            files[f"{p}/rate"] = ("200 Gb/sec (4X HDR)" if up else "40 Gb/sec (4X QDR)") + "\n"
            files[f"{p}/link_layer"] = "Ethernet\n"
            files.update(_gids(n, i, p))
    files["/proc/meminfo"] = meminfo(c, node, t)
    files["/proc/uptime"] = uptime(c, node, t)
    files["/proc/pressure/memory"] = pressure_memory(c, node, t)
    files["/proc/sys/kernel/random/boot_id"] = c.boot_id(node) + "\n"
    # a new random UUID at every read (the kernel's CSPRNG): what the head's API key is made from
    files["/proc/sys/kernel/random/uuid"] = str(uuid.uuid4()) + "\n"
    files.update(proc_stats(c, node))
    files["/proc/loadavg"] = loadavg(c, node, t)
    files["/etc/hostname"] = node + "\n"
    files[SSH_HOST_KEY_FILE] = ssh_host_key(c, node) + "\n"
    files["/proc/sys/kernel/hostname"] = node + "\n"
    # cgroup v2 is mounted (DGX OS 7 / Ubuntu 24.04); the controllers a real v2 host lists
    # (tests/fixtures/real/cgroup-v2: the device capture)
    files["/sys/fs/cgroup/cgroup.controllers"] = "cpuset cpu io memory hugetlb pids\n"
    files["/proc/sys/vm/drop_caches"] = "0\n"
    files["/etc/os-release"] = (
        'PRETTY_NAME="Ubuntu 24.04.3 LTS"\nNAME="Ubuntu"\nVERSION_ID="24.04"\n'
        'VERSION="24.04.3 LTS (Noble Numbat)"\nVERSION_CODENAME=noble\nID=ubuntu\nID_LIKE=debian\n')
    files["/etc/dgx-release"] = 'DGX_NAME="DGX Spark"\nDGX_PRETTY_NAME="NVIDIA DGX Spark"\nDGX_SWBUILD_VERSION="7.2.3"\n'
    files["/proc/driver/nvidia/version"] = (
        f"NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  {DRIVER}  Release Build  "
        "(dvs-builder@U22-I3-AE18-23-3)  Wed Jan  7 22:08:01 UTC 2026\nGCC version:  gcc version 13.3.0 "
        "(Ubuntu 13.3.0-6ubuntu2~24.04) \n")
    # /proc/PID/cgroup of each GPU process: cgroup v2's one line naming its container's scope
    for holder, _b in c.memory(node, t).gpu_holders:
        ct = c.container(node, holder.container.split("#")[0]) if holder.container else None  # exec: its container
        scope = f"system.slice/docker-{ct.id}.scope" if ct is not None else "user.slice/user-0.slice/session-3.scope"
        files[f"/proc/{holder.pid}/cgroup"] = f"0::/{scope}\n"
    for ct in c.containers_on(node):  # a twin's container's listening process (ss -p names its pid)
        if ct.listens and ct.running(t):
            files[f"/proc/{ct.host_pid}/cgroup"] = f"0::/system.slice/docker-{ct.id}.scope\n"
    files.update(cgroup_files(c, node, t))
    files.update(n.files)
    return files


# A port lists every slot of its GID table (a real mlx5 RoCE port: hundreds); the sim lists 8, enough
# for the pairs it fills, or up to the last one used.
GID_ENTRIES = 8


def _gids(n: SimNode, i: Iface, port: str) -> dict[str, str]:
    """``ports/1/gids/N``, ``gid_attrs/types/N`` and ``gid_attrs/ndevs/N`` of ``i``'s RDMA device
    from :meth:`SimNode.gid_table` (0/1 fe80 v1/v2, then a v1/v2 pair per further address: the shape
    of tests/fixtures/real/dgx-os/gid-table-rocep1s0f1.txt). An empty entry reads as the zero GID and
    its ``types``/``ndevs`` files fail with EINVAL (drivers/infiniband/core/sysfs.c keeps EINVAL
    there), so ``grep -H .`` over them prints the zeros and nothing for the types."""
    table = n.gid_table(i)
    out: dict[str, str] = {}
    for k in range(max(GID_ENTRIES, max(table) + 1)):
        gid, typ = table.get(k, (ZERO_GID, ""))
        out[f"{port}/gids/{k}"] = gid + "\n"
        out[f"{port}/gid_attrs/types/{k}"] = typ + "\n" if typ else Unreadable(EINVAL)
        out[f"{port}/gid_attrs/ndevs/{k}"] = i.name + "\n" if typ else Unreadable(EINVAL)
    return out


def _flags(n: SimNode, i: Iface) -> list[str]:
    if i.kind == "loopback":
        return ["LOOPBACK", "UP", "LOWER_UP"]
    return (["BROADCAST", "MULTICAST", "UP", "LOWER_UP"] if n.carrier(i)
            else ["NO-CARRIER", "BROADCAST", "MULTICAST", "UP"])


def _operstate(n: SimNode, i: Iface) -> str:
    if i.kind == "loopback":
        return "UNKNOWN"
    return "UP" if n.carrier(i) else "DOWN"


def _addrs(n: SimNode, i: Iface, family: str | None = None) -> list[dict[str, object]]:
    """``i``'s addresses as ``ip`` lists them (IPv4 first, then IPv6, global before link), each
    with its scope, broadcast, flags and lifetimes. IPv4 link-local (169.254/16, IPv4LL) has scope
    link, as systemd-networkd claims it (networkd-ipv4ll.c: prefix 16, RT_SCOPE_LINK, broadcast);
    a static CX-7 address and the DHCP lease are noprefixroute (NetworkManager's routes)."""
    out: list[dict[str, object]] = []
    life = 76_113 if i.dynamic else 4294967295  # the DHCP lease's remaining seconds; else forever
    for a in i.ipv4 if family in (None, "inet") else ():
        net = ipaddress.ip_interface(a)
        d: dict[str, object] = {"family": "inet", "local": str(net.ip), "prefixlen": net.network.prefixlen}
        if i.kind != "loopback":
            d["broadcast"] = str(net.network.broadcast_address)
        d["scope"] = "host" if i.kind == "loopback" else "link" if net.ip.is_link_local else "global"
        if i.dynamic:
            d["dynamic"] = True
        if i.dynamic or (i.kind == "cx7" and not net.ip.is_link_local):
            d["noprefixroute"] = True
        d["label"] = i.name
        d["valid_life_time"] = d["preferred_life_time"] = life
        out.append(d)
    for a in n.ipv6(i) if family in (None, "inet6") else ():
        net = ipaddress.ip_interface(a)
        d = {"family": "inet6", "local": str(net.ip), "prefixlen": net.network.prefixlen,
             "scope": "host" if i.kind == "loopback" else "link" if net.ip.is_link_local else "global"}
        if i.kind == "loopback" or not net.ip.is_link_local:
            d["noprefixroute"] = True
        d["valid_life_time"] = d["preferred_life_time"] = 4294967295
        out.append(d)
    return out


def ip_j_addr(c: SimCluster, node: str, family: str | None = None) -> str:
    n = c.node(node)
    out = []
    for i in n.ifaces:
        d: dict[str, object] = {"ifindex": i.ifindex, "ifname": i.name, "flags": _flags(n, i), "mtu": n.mtu_of(i),
                                "qdisc": "noqueue" if i.kind in ("loopback", "bridge", "wifi") else "mq"}
        d["operstate"] = _operstate(n, i)
        d["group"] = "default"
        if i.kind != "bridge":
            d["txqlen"] = 1000
        d["link_type"] = "loopback" if i.kind == "loopback" else "ether"
        d["address"] = i.mac
        d["broadcast"] = "00:00:00:00:00:00" if i.kind == "loopback" else "ff:ff:ff:ff:ff:ff"
        if i.name == "enP7s7":
            d["altnames"] = ["enP7p1s0"]
        if i.name == "wlP9s9":
            d["altnames"] = ["wlP9p1s0"]
        d["addr_info"] = _addrs(n, i, family)
        out.append(d)
    return json.dumps(out, separators=(",", ":")) + "\n"


def _lft(seconds: object) -> str:
    return "forever" if seconds == 4294967295 else f"{seconds}sec"


def ip_addr(c: SimCluster, node: str, only: str | None = None, family: str | None = None) -> tuple[str, int]:
    n = c.node(node)
    lines = []
    found = False
    for i in n.ifaces:
        if only and i.name != only:
            continue
        found = True
        flags = ",".join(_flags(n, i))
        q = "noqueue" if i.kind in ("loopback", "bridge", "wifi") else "mq"
        tail = " qlen 1000" if i.kind != "bridge" else " "
        lines.append(f"{i.ifindex}: {i.name}: <{flags}> mtu {n.mtu_of(i)} qdisc {q} state {_operstate(n, i)} group default{tail}")
        lt = "loopback" if i.kind == "loopback" else "ether"
        brd = "00:00:00:00:00:00" if i.kind == "loopback" else "ff:ff:ff:ff:ff:ff"
        lines.append(f"    link/{lt} {i.mac} brd {brd}")
        if i.name == "enP7s7":
            lines.append("    altname enP7p1s0")
        for d in _addrs(n, i, family):
            flags = "".join(f" {f}" for f in ("dynamic", "noprefixroute") if d.get(f))
            a = f"{d['local']}/{d['prefixlen']}"
            if d["family"] == "inet":  # iproute2 ends an IPv4 line with its label, an IPv6 one with a space
                brd = f" brd {d['broadcast']}" if "broadcast" in d else ""
                lines.append(f"    inet {a}{brd} scope {d['scope']}{flags} {i.name}")
            else:
                lines.append(f"    inet6 {a} scope {d['scope']}{flags} ")
            lines.append(f"       valid_lft {_lft(d['valid_life_time'])} preferred_lft {_lft(d['preferred_life_time'])}")
    if not found:
        return f'Device "{only}" does not exist.\n', 1
    return "\n".join(lines) + "\n", 0


def ip_br_addr(c: SimCluster, node: str, only: str | None = None, family: str | None = None) -> tuple[str, int]:
    """``ip -br addr``: name (16 wide), state (14 wide), then each address and a space, as iproute2
    prints it (stock-spark-id-ip.txt: ``enp1s0f1np1      UP             169.254.127.30/16 fe80::…/64 ``)."""
    n = c.node(node)
    rows = [f"{i.name:<16} {_operstate(n, i):<14} " + "".join(f"{d['local']}/{d['prefixlen']} "
                                                           for d in _addrs(n, i, family)) + "\n"
            for i in n.ifaces if not only or i.name == only]
    if not rows:
        return f'Device "{only}" does not exist.\n', 1
    return "".join(rows), 0


def ip_br_link(c: SimCluster, node: str) -> str:
    n = c.node(node)
    return "".join(f"{i.name:<17}{_operstate(n, i):<15}{i.mac} <{','.join(_flags(n, i))}> \n" for i in n.ifaces)


def ethtool(c: SimCluster, node: str, ifname: str) -> tuple[str, int]:
    n = c.node(node)
    i = n.iface(ifname)
    if i is None:
        return f"netlink error: no device matches name ({ifname})\n", 1
    up = n.link_up(i) if i.kind == "cx7" else i.kind == "ether"
    speed = ("200000Mb/s" if i.kind == "cx7" else "10000Mb/s") if up else "Unknown!"
    return (f"Settings for {ifname}:\n\tSpeed: {speed}\n\tDuplex: {'Full' if up else 'Unknown! (255)'}\n"
            f"\tAuto-negotiation: on\n\tPort: {'Direct Attach Copper' if i.kind == 'cx7' else 'Twisted Pair'}\n"
            f"\tLink detected: {'yes' if up else 'no'}\n", 0)


# ---- docker ------------------------------------------------------------------------------------


def _ago(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 1:
        return "Less than a second"
    if s < 60:
        return f"{s} seconds"
    if s < 120:
        return "About a minute"
    if s < 3600:
        return f"{s // 60} minutes"
    if s < 7200:
        return "About an hour"
    if s < 48 * 3600:
        return f"{s // 3600} hours"
    return f"{s // 86400} days"


def container_status(ct: Container, t: float) -> str:
    st = ct.state(t)
    if st == "created":
        return "Created"
    if st == "running":
        since = max((ct.started or 0.0), ct.stopped or -1e18) if ct.restarts else (ct.started or 0.0)
        return f"Up {_ago(t - since)}"
    info = ct.exit_info(t)
    code, when = info if info else (0, t)
    return f"Exited ({code}) {_ago(t - when)} ago"


def _cmd_display(ct: Container) -> str:
    s = " ".join(ct.argv) if ct.argv else ""
    s = '"' + s.replace('"', '\\"') + '"'
    return s if len(s) <= 22 else s[:21] + "…\""


def _listed(c: SimCluster, node: str) -> list:
    """The containers docker lists: not the engine a ``docker exec`` runs inside one (it is a process
    of that container, kept as a pseudo-container named ``NAME#exec`` by the model)."""
    return [ct for ct in reversed(c.containers_on(node)) if ct.network != "exec"]


def _exec_rss(c: SimCluster, parent, t: float) -> int:
    return sum(x.host_rss for x in c.containers_on(parent.node)
               if x.network == "exec" and x.name.split("#")[0] == parent.name and x.running(t))


def docker_ps_json(c: SimCluster, node: str, t: float, all_: bool = True) -> str:
    lines = []
    for ct in _listed(c, node):
        st = ct.state(t)
        if not all_ and st != "running":
            continue
        created = time.strftime("%Y-%m-%d %H:%M:%S +0000 UTC", time.gmtime(c.clock.epoch(ct.created)))
        d = {
            "Command": _cmd_display(ct), "CreatedAt": created, "ID": ct.id[:12], "Image": ct.image,
            "Labels": "", "LocalVolumes": "0", "Mounts": ct.mounts, "Names": ct.name,
            "Networks": ct.network, "Ports": "", "RunningFor": f"{_ago(t - ct.created)} ago",
            "Size": "0B", "State": st, "Status": container_status(ct, t),
        }
        lines.append(json.dumps(d, separators=(",", ":"), ensure_ascii=False))
    return "".join(line + "\n" for line in lines)


def docker_ps_table(c: SimCluster, node: str, t: float, all_: bool = False) -> str:
    rows = [("CONTAINER ID", "IMAGE", "COMMAND", "CREATED", "STATUS", "PORTS", "NAMES")]
    for ct in _listed(c, node):
        if not all_ and ct.state(t) != "running":
            continue
        rows.append((ct.id[:12], ct.image, _cmd_display(ct), f"{_ago(t - ct.created)} ago",
                     container_status(ct, t), "", ct.name))
    widths = [max(len(r[i]) for r in rows) for i in range(7)]
    out = []
    for r in rows:
        out.append("   ".join(r[i].ljust(widths[i]) for i in range(6)) + "   " + r[6])
    return "\n".join(out) + "\n"


def _hsize(b: float, binary: bool = True) -> str:
    if binary:
        for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
            if b >= size:
                return f"{b / size:.2f}{unit}" if b / size < 100 else f"{b / size:.1f}{unit}"
        return f"{int(b)}B"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= size:
            return f"{b / size:.3g}{unit}"
    return f"{int(b)}B"


def docker_stats_json(c: SimCluster, node: str, t: float) -> str:
    m = c.memory(node, t)
    lines = []
    for ct in _listed(c, node):
        if not ct.running(t):
            continue
        mem = container_mem_used(c, ct, t)
        cpu = container_cpu_percent(c, ct, node, t)
        net = (t - (ct.started or 0.0)) * 41_000
        d = {"BlockIO": f"{_hsize(2.1e9, False)} / {_hsize(3.4e6, False)}", "CPUPerc": f"{cpu:.2f}%",
             "Container": ct.id[:12], "ID": ct.id[:12], "MemPerc": f"{100 * mem / m.total:.2f}%",
             "MemUsage": f"{_hsize(mem)} / {_hsize(m.total)}", "Name": ct.name,
             "NetIO": f"{_hsize(net, False)} / {_hsize(net * 3.1, False)}", "PIDs": str(87 + len(ct.name))}
        lines.append(json.dumps(d, separators=(",", ":")))
    return "".join(line + "\n" for line in lines)


def _n(c: SimCluster, key: str, t: float) -> float:
    return noise(c.seed, key, t, 3.0)


# ---- a running container's cgroup (v2, Docker's systemd driver) ----------------------------------
#
# Docker with the systemd cgroup driver on cgroup v2 (stock DGX OS: tests/fixtures/real/dgx-os/
# stock-spark-docker-info.txt) puts each running container in /sys/fs/cgroup/system.slice/
# docker-<full id>.scope; the scope goes when the container stops (and a restart makes a new one,
# its counters from 0). Its memory.current counts the page cache the container read (docker stats
# subtracts inactive_file), its cpu.stat the CPU time used since the scope began.


def container_mem_used(c: SimCluster, ct: Container, t: float) -> int:
    """Bytes ``docker stats`` reports as MemUsage's used part for ``ct`` at ``t`` (memory.current
    less inactive_file); the one figure both renderers take."""
    return int((ct.host_rss + _exec_rss(c, ct, t)) * (0.97 + 0.03 * (1 + _n(c, ct.name, t)) / 2))


def _inactive_file(c: SimCluster, ct: Container, node: str, t: float, used: int) -> int:
    """The container's inactive page cache: a vLLM engine read its checkpoint, so a share of the
    weights (per rank: the checkpoint over its world size), no more than its share of the node's page
    cache; any other container a small fixed fraction of what it uses."""
    e = ct.engine
    spec = MODELS.get(e.model) if e is not None else None
    if spec is None:
        return int(0.04 * used)
    m = c.memory(node, t)
    running = sum(1 for x in _listed(c, node) if x.running(t))
    return max(0, min(int(0.35 * spec.disk_bytes / max(1, e.world)), m.cached // max(1, running)))


# cpu.stat: a container's CPU time is the integral of its CPU percent (100 % = one core), docker's
# CPUPerc that rate over its last second (:func:`container_cpu_percent`). The integrand:
#     cpu(s) = 0.4 + 0.3 * (1 + w(s)) + 98 * a(s)
# w a smooth wobble in [-1, 1] (two sines, phases from the container's name); a(s) the engine's
# activity as :meth:`SimCluster.engine_activity` has it: 0.25 while loading / profiling / compiling;
# once ready, 10 s traffic slots, each busy or idle by the engine's own draw (the GPU is busy exactly
# then), a busy one 0.725 + 0.175 * w'(s) (engine_activity's 0.55..0.9, a wobble for its noise). Every
# part has a closed form over an interval but the slots' draws: whole slots are summed in blocks of
# _BLOCK, cached, so the integral since a start a day back costs a few additions.
_BLOCK = 512
_CPU_USER = 0.83  # share of usage_usec in user mode (a serving engine: Python, tokenizer, scheduler)
_WOBBLE = ((0.6, 7.3), (0.4, 2.9))  # (amplitude, period s)


@functools.lru_cache(maxsize=1024)
def _phases(seed: int, key: str) -> tuple[float, ...]:
    return tuple(2 * math.pi * _hash01(seed, key, "phase", i) for i in range(len(_WOBBLE)))


def _wobble(seed: int, key: str, s: float) -> float:
    """A smooth deterministic value in [-1, 1] at ``s``."""
    return sum(amp * math.sin(2 * math.pi * s / per + ph) for (amp, per), ph in zip(_WOBBLE, _phases(seed, key), strict=True))


def _wobble_int(seed: int, key: str, a: float, b: float) -> float:
    """The integral of :func:`_wobble` over ``[a, b]`` (closed form)."""
    total = 0.0
    for (amp, per), ph in zip(_WOBBLE, _phases(seed, key), strict=True):
        w = 2 * math.pi / per
        total += amp / w * (math.cos(w * a + ph) - math.cos(w * b + ph))
    return total


def _busy(model: str, started: float, activity: float, k: int) -> bool:
    """engine_activity's draw: traffic slot ``k`` after ready is busy."""
    return _hash01("slot", model, started, k) < activity


@functools.lru_cache(maxsize=8192)
def _slot_block(params: tuple, j: int) -> tuple[float, ...]:
    """Running sums of the activity over whole slots ``j*_BLOCK`` .. ``(j+1)*_BLOCK - 1`` (from 0)."""
    seed, wkey, model, started, ready_at, activity = params
    out, acc = [0.0], 0.0
    for k in range(j * _BLOCK, (j + 1) * _BLOCK):
        if _busy(model, started, activity, k):
            lo = ready_at + 10.0 * k
            acc += 10.0 * 0.725 + 0.175 * _wobble_int(seed, wkey, lo, lo + 10.0)
        out.append(acc)
    return tuple(out)


def _sum_slots(params: tuple, k1: int, k2: int) -> float:
    """The activity over whole slots ``k1 <= k < k2``."""
    if k2 <= k1:
        return 0.0
    j1, r1 = divmod(k1, _BLOCK)
    j2, r2 = divmod(k2, _BLOCK)
    if j1 == j2:
        blk = _slot_block(params, j1)
        return blk[r2] - blk[r1]
    first = _slot_block(params, j1)
    total = first[_BLOCK] - first[r1]
    for j in range(j1 + 1, j2):
        total += _slot_block(params, j)[_BLOCK]
    return total + _slot_block(params, j2)[r2]


def _activity_int(c: SimCluster, ct: Container, node: str, lo: float, hi: float) -> float:
    """The integral of ``ct``'s engine activity on ``node`` over ``[lo, hi]`` (``ct`` running throughout)."""
    e = ct.engine
    if e is None or hi <= lo or node not in (e.nodes or (ct.node,)):
        return 0.0
    inf = math.inf
    ready = e.ready_at if e.ready_at is not None else inf
    stop = e.stopped_at if e.stopped_at is not None else inf
    fail = e.failed_at if e.failed_at is not None else inf
    total = 0.25 * max(0.0, min(hi, ready, stop, fail) - lo)  # loading / profiling / compiling
    a, b = max(lo, ready), min(hi, stop)
    if e.activity <= 0 or b <= a:
        return total
    wkey = node + e.model

    def part(k: int, x: float, y: float) -> float:  # slot k over [x, y], within the slot
        if y <= x or not _busy(e.model, e.started, e.activity, k):
            return 0.0
        return 0.725 * (y - x) + 0.175 * _wobble_int(c.seed, wkey, x, y)

    ka = math.floor((a - ready) / 10.0)
    kb = math.floor((b - ready) / 10.0)
    if ka == kb:
        return total + part(ka, a, b)
    total += part(ka, a, ready + 10.0 * (ka + 1))
    total += _sum_slots((c.seed, wkey, e.model, e.started, ready, e.activity), ka + 1, kb)
    return total + part(kb, ready + 10.0 * kb, b)


def _cpu_percent_int(c: SimCluster, ct: Container, node: str, lo: float, hi: float) -> float:
    """The integral of the container's CPU percent over ``[lo, hi]`` (percent-seconds)."""
    if hi <= lo:
        return 0.0
    base = (0.7 + max(0.0, ct.cpu_pct - 0.7)) * (hi - lo) + 0.3 * _wobble_int(c.seed, ct.name + "c", lo, hi)
    return base + 98.0 * _activity_int(c, ct, node, lo, hi)


def container_cpu_usec(c: SimCluster, ct: Container, node: str, t: float) -> int:
    """cpu.stat's ``usage_usec`` of running ``ct`` at ``t``: CPU time since its scope began (its
    last start), cumulative and non-decreasing in ``t`` (the integrand is at least 0.4 %)."""
    start = ct.started or 0.0
    return int(1e4 * _cpu_percent_int(c, ct, node, start, max(start, t)))


def container_cpu_percent(c: SimCluster, ct: Container, node: str, t: float) -> float:
    """docker stats' CPUPerc: as docker computes it, the CPU time used between its previous read and
    this one (about 1 s apart) over that interval, in percent of one core: here the rate of
    :func:`container_cpu_usec` over ``[t - 1, t]`` (from the start, in a container's first second)."""
    start = ct.started or 0.0
    lo = max(start, t - 1.0)
    if t <= lo:  # the first instant: the integrand itself
        return (0.7 + max(0.0, ct.cpu_pct - 0.7) + 0.3 * _wobble(c.seed, ct.name + "c", t)
                + 98.0 * _activity_int(c, ct, node, t - 1e-3, t) / 1e-3)
    return _cpu_percent_int(c, ct, node, lo, t) / (t - lo)


# /sys/fs/cgroup/<scope>/memory.stat: the keys, in order, that a cgroup v2 kernel prints
# (tests/fixtures/real/cgroup-v2/memory.stat.txt)
MEMORY_STAT_KEYS = (
    "anon", "file", "kernel", "kernel_stack", "pagetables", "sec_pagetables", "percpu", "sock", "vmalloc",
    "shmem", "zswap", "zswapped", "file_mapped", "file_dirty", "file_writeback", "swapcached", "anon_thp",
    "file_thp", "shmem_thp", "inactive_anon", "active_anon", "inactive_file", "active_file", "unevictable",
    "slab_reclaimable", "slab_unreclaimable", "slab", "workingset_refault_anon", "workingset_refault_file",
    "workingset_activate_anon", "workingset_activate_file", "workingset_restore_anon",
    "workingset_restore_file", "workingset_nodereclaim", "pgdemote_kswapd", "pgdemote_direct",
    "pgdemote_khugepaged", "pgdemote_proactive", "pgpromote_success", "pgscan", "pgsteal", "pswpin", "pswpout",
    "pgscan_kswapd", "pgscan_direct", "pgscan_khugepaged", "pgscan_proactive", "pgsteal_kswapd",
    "pgsteal_direct", "pgsteal_khugepaged", "pgsteal_proactive", "pgfault", "pgmajfault", "pgrefill",
    "pgactivate", "pgdeactivate", "pglazyfree", "pglazyfreed", "swpin_zero", "swpout_zero", "zswpin", "zswpout",
    "zswpwb", "thp_fault_alloc", "thp_collapse_alloc", "thp_swpout", "thp_swpout_fallback",
    "numa_pages_migrated", "numa_pte_updates", "numa_hint_faults",
)
PAGE = 4096


def _memory_stat(used: int, inactive: int, up_s: float) -> tuple[int, str]:
    """(memory.current, memory.stat) of a container using ``used`` bytes besides ``inactive`` bytes
    of inactive page cache: anon + file + kernel + percpu == memory.current, memory.current -
    inactive_file == ``used``."""
    percpu = 609_264
    kernel = int(0.006 * used) // PAGE * PAGE
    shmem = min(64 * 1024 * 1024, used // 50) // PAGE * PAGE
    active_file = min(256 * 1024 * 1024, used // 40) // PAGE * PAGE
    file = inactive + active_file + shmem
    current = used + inactive
    anon = max(0, current - file - kernel - percpu)
    kernel_stack = min(kernel, 442_368)
    pagetables = min(kernel - kernel_stack, used // 1000 // PAGE * PAGE)
    slab = kernel - kernel_stack - pagetables
    slab_reclaimable = slab * 9 // 10
    v = dict.fromkeys(MEMORY_STAT_KEYS, 0)
    faults = int(up_s * 40) + used // PAGE
    v.update(
        anon=anon, file=file, kernel=kernel, kernel_stack=kernel_stack, pagetables=pagetables, percpu=percpu,
        shmem=shmem, file_mapped=active_file + shmem, file_dirty=0, inactive_anon=anon // 10 + shmem,
        active_anon=anon - anon // 10, inactive_file=inactive, active_file=active_file,
        slab_reclaimable=slab_reclaimable, slab_unreclaimable=slab - slab_reclaimable, slab=slab,
        pgfault=faults, pgmajfault=(inactive + active_file) // PAGE // 64, pgactivate=active_file // PAGE,
    )
    return current, "".join(f"{k} {v[k]}\n" for k in MEMORY_STAT_KEYS)


def cgroup_files(c: SimCluster, node: str, t: float) -> dict[str, str]:
    """Each running container's scope under /sys/fs/cgroup: ``memory.current``, ``memory.max``,
    ``memory.stat``, ``cpu.stat`` (cgroup v2's formats: tests/fixtures/real/cgroup-v2)."""
    files: dict[str, str] = {}
    for ct in _listed(c, node):
        if not ct.running(t):
            continue
        d = f"/sys/fs/cgroup/system.slice/docker-{ct.id}.scope"
        used = container_mem_used(c, ct, t)
        inactive = _inactive_file(c, ct, node, t, used)
        current, stat = _memory_stat(used, inactive, t - (ct.started or 0.0))
        files[f"{d}/memory.current"] = f"{current}\n"
        files[f"{d}/memory.max"] = "max\n"
        files[f"{d}/memory.stat"] = stat
        usage = container_cpu_usec(c, ct, node, t)
        user = int(usage * _CPU_USER)
        files[f"{d}/cpu.stat"] = (
            f"usage_usec {usage}\nuser_usec {user}\nsystem_usec {usage - user}\nnice_usec 0\n"
            "nr_periods 0\nnr_throttled 0\nthrottled_usec 0\nnr_bursts 0\nburst_usec 0\n")
    return files


def docker_images(c: SimCluster, node: str, t: float, fmt_json: bool = False, digests: bool = False) -> str:
    imgs = c.images_on(node, t)
    if fmt_json:
        return "".join(json.dumps({"Containers": "N/A", "CreatedAt": f"{i.created} 10:12:44 +0000 UTC",
                                   "CreatedSince": "2 months ago", "Digest": image_digest(i.ref) if digests else "<none>",
                                   "ID": c.image_id(node, i, t)[:12],
                                   "Repository": i.repo, "SharedSize": "N/A", "Size": _hsize(i.size_bytes, False),
                                   "Tag": i.tag, "UniqueSize": "N/A", "VirtualSize": _hsize(i.size_bytes, False)},
                                  separators=(",", ":")) + "\n" for i in imgs.values())
    rows = [("REPOSITORY", "TAG", *(("DIGEST",) if digests else ()), "IMAGE ID", "CREATED", "SIZE")]
    for i in imgs.values():
        rows.append((i.repo, i.tag, *((image_digest(i.ref),) if digests else ()), c.image_id(node, i, t)[:12],
                     "2 months ago", _hsize(i.size_bytes, False)))
    k_last = len(rows[0]) - 1
    widths = [max(len(r[k]) for r in rows) for k in range(k_last + 1)]
    return "".join("   ".join(r[k].ljust(widths[k]) for k in range(k_last)) + "   " + r[k_last] + "\n"
                   for r in rows)


# ---- ray ---------------------------------------------------------------------------------------


def ray_status(c: SimCluster, t: float) -> str:
    members = c.ray_members(t)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(c.clock.epoch(t)))
    us = int((c.clock.epoch(t) % 1) * 1e6)
    cpus = sum(m.cpus for m in members)
    gpus = sum(m.gpus for m in members)
    mem = sum(m.memory_gib for m in members)
    obj = sum(m.object_store_gib for m in members)
    used = min(gpus, c.ray_gpus_used(t))
    gpu_line = f" {used:.1f}/{gpus:.1f} GPU"
    if used:
        gpu_line += f" ({used:.1f} used of {used:.1f} reserved in placement groups)"
    lines = [f"======== Autoscaler status: {stamp}.{us:06d} ========", "Node status",
             "---------------------------------------------------------------", "Active:"]
    lines += [f" 1 node_{m.node_id}" for m in members] or [" (no active nodes)"]
    lines += ["Pending:", " (no pending nodes)", "Recent failures:", " (no failures)", "",
              "Resources", "---------------------------------------------------------------", "Total Usage:",
              f" {used:.1f}/{cpus:.1f} CPU", gpu_line, f" 0B/{mem:.2f}GiB memory", f" 0B/{obj:.2f}GiB object_store_memory",
              "", "From request_resources:", " (none)", "Pending Demands:", " (no resource demands)"]
    return "\n".join(lines) + "\n"


# A kernel that breaks RoCE memory registration on a Spark: ibv_reg_mr_iova2 fails with ENOMEM, so
# NCCL over the fast link dies at its first registration (sparkconsole/deploy/data/known_bad.json
# names the source). The ``bad-kernel`` scenario's nodes run it.
BAD_KERNEL = "7.0.0-1019-nvidia"


def kernel_release(c: SimCluster | None) -> str:
    """The release ``uname -r`` prints on the cluster's nodes."""
    return BAD_KERNEL if c is not None and getattr(c, "scenario", "") == "bad-kernel" else KERNEL


def kernel_uname(node: str, flags: str, c: SimCluster | None = None) -> str:
    parts = {"s": "Linux", "n": node, "r": kernel_release(c), "v": "#15-Ubuntu SMP PREEMPT_DYNAMIC Tue Feb 10 18:02:14 UTC 2026",
             "m": "aarch64", "p": "aarch64", "i": "aarch64", "o": "GNU/Linux"}
    if "a" in flags:
        return " ".join(parts[k] for k in "snrvmpio") + "\n"
    keys = [k for k in "snrvmpio" if k in flags] or ["s"]
    return " ".join(parts[k] for k in keys) + "\n"


SSH_HOST_KEY_FILE = "/etc/ssh/ssh_host_ed25519_key.pub"


def ssh_host_private_key(c: SimCluster, node: str) -> bytes:
    """The node's sshd host key, private, in OpenSSH's format: what the simulated sshd serves, so the
    key a connection verifies is the one in the node's ``/etc/ssh`` file (:func:`ssh_host_key`)."""
    import hashlib

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

    seed = hashlib.sha256(f"sshd {getattr(c, 'seed', 0)} {node}".encode()).digest()
    return Ed25519PrivateKey.from_private_bytes(seed).private_bytes(Encoding.PEM, PrivateFormat.OpenSSH,
                                                                    NoEncryption())


def ssh_host_key(c: SimCluster, node: str) -> str:
    """The node's sshd host key, ``ssh-ed25519 BASE64 root@NODE``: a real ed25519 public key made
    from the cluster's seed and the node's name (the same every run), what node-to-node ssh is
    checked against in ``~/.ssh/known_hosts`` (tools/net.py)."""
    import base64
    import hashlib

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    seed = hashlib.sha256(f"sshd {getattr(c, 'seed', 0)} {node}".encode()).digest()
    raw = Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    kind = b"ssh-ed25519"
    blob = len(kind).to_bytes(4, "big") + kind + len(raw).to_bytes(4, "big") + raw
    return f"ssh-ed25519 {base64.b64encode(blob).decode()} root@{node}"


_ALONE = {"/proc/meminfo": meminfo, "/proc/pressure/memory": pressure_memory, "/proc/uptime": uptime}
