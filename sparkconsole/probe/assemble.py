"""One tick's probe sections -> one complete :class:`NodeSample`.

The probe asks for cheap sections every tick and slow ones less often
(:func:`~sparkconsole.probe.script.sections_for_tick`). The UI must still get a complete sample
each tick, so what was not asked this tick is carried over from the previous sample, together
with the reasons it was unknown. ``sample.sections`` says which sections are fresh.

Every reason in ``unknown`` is filed under a key owned by exactly one section (see
:data:`REASON_OWNER`), so a carried-over reason is dropped the moment its section is asked again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TypeVar

from sparkconsole.probe import parsers as p
from sparkconsole.probe.samples import (
    MIB,
    Container,
    DiskUsage,
    FastLink,
    GpuProcess,
    GpuSample,
    IbLink,
    IbPort,
    MemInfo,
    NetInterface,
    NodeSample,
    RayStatus,
    UnifiedMemory,
    freeze_unknown,
)
from sparkconsole.probe.script import PER_SECTION_TIMEOUT_S, SECTIONS, SectionOutput

T = TypeVar("T")

GB10_MEMORY_REASON = "unified memory: nvidia-smi reports Not Supported"

#: Reason key (or key prefix) -> the section whose output decides it.
REASON_OWNER: dict[str, str] = {
    "host.hostname": "hostname",
    "host.kernel": "uname",
    "host.cpu_count": "nproc",
    "host.uptime": "uptime",
    "host.docker_version": "docker-version",
    "memory": "meminfo",
    "memory.gpu_process": "gpu-apps",
    "gpu": "gpu",
    "gpu_processes": "gpu-apps",
    "nvidia-smi": "nvidia-smi",
    "links": "ibdev2netdev",
    "links.rate": "ib-ports",
    "interfaces": "ip-addr",
    "containers": "docker-ps",
    "containers.stats": "docker-stats",
    "cgroups": "cgroups",
    "ray": "ray-status",
    "disk": "df",
}

#: Section -> the key its failure (rc != 0) is filed under.
SECTION_KEY: dict[str, str] = {section: key for key, section in REASON_OWNER.items()
                               if key not in ("memory.gpu_process",)}


def owner_of(key: str) -> str | None:
    """The section that owns reason ``key`` (longest matching dotted prefix)."""
    best = None
    for prefix, section in REASON_OWNER.items():
        if (key == prefix or key.startswith(prefix + ".")) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, section)
    return best[1] if best else None


def section_failure(out: SectionOutput) -> str | None:
    """Why a section failed, in words, or None when it exited 0.

    The first line of its output (``sh: 1: nvidia-smi: not found`` -> ``nvidia-smi: not found``)
    and the exit code: ``nvidia-smi: not found (exit 127)``.
    """
    if out.rc == 0:
        return None
    if out.rc is None:
        line = p.first_line(out.text)
        return f"{line} (no exit code: the probe was cut off)" if line else "no answer: the probe was cut off"
    if out.rc == 124:
        return f"timed out after {_timeout_s()} s (exit 124)"
    line = p.tool_error(out.text) or p.first_line(out.text)
    return f"{line} (exit {out.rc})" if line else f"exit {out.rc}"


def _timeout_s() -> int:
    return PER_SECTION_TIMEOUT_S


def _is_unified(gpus: tuple[GpuSample, ...]) -> bool:
    """A GB10-like node: GPUs present and none reports its own memory size."""
    return bool(gpus) and all(g.memory_total_mib is None for g in gpus)


def _unified_memory(
    meminfo: MemInfo | None, processes: tuple[GpuProcess, ...], apps_ok: bool, gpus: tuple[GpuSample, ...]
) -> UnifiedMemory:
    """Memory as one pool.

    ``gpu_process`` is the compute apps' MiB summed (None when that section failed: a 0 would lie).
    On a unified node (GB10) that memory comes out of MemTotal, so ``other_used`` is
    total - available - gpu_process (clipped at 0). On a discrete GPU it lives on the card, so
    it is not subtracted from host memory.
    """
    if meminfo is None:
        meminfo = MemInfo()
    total, avail = meminfo.mem_total_bytes, meminfo.mem_available_bytes
    gpu_bytes = None
    if apps_ok:
        gpu_bytes = int(sum((pr.memory_mib or 0) for pr in processes) * MIB)
    page_cache = None
    if meminfo.cached_bytes is not None or meminfo.buffers_bytes is not None:
        page_cache = (meminfo.cached_bytes or 0) + (meminfo.buffers_bytes or 0)
    unified = _is_unified(gpus)
    other = None
    if total is not None and avail is not None:
        # GPU memory comes out of this pool only on a unified node; when its share is unknown
        # the whole used amount shows as "other" (the reason for the GPU part is kept apart).
        other = max(0, total - avail - ((gpu_bytes or 0) if unified else 0))
    swap_used = None
    if meminfo.swap_total_bytes is not None and meminfo.swap_free_bytes is not None:
        swap_used = max(0, meminfo.swap_total_bytes - meminfo.swap_free_bytes)
    return UnifiedMemory(
        total_bytes=total,
        available_bytes=avail,
        gpu_process_bytes=gpu_bytes,
        page_cache_bytes=page_cache,
        other_used_bytes=other,
        unified=unified,
        swap_total_bytes=meminfo.swap_total_bytes,
        swap_used_bytes=swap_used,
    )


def join_links(
    ib: tuple[IbLink, ...], ports: tuple[IbPort, ...], interfaces: tuple[NetInterface, ...]
) -> tuple[FastLink, ...]:
    """ibdev2netdev + sysfs port rate + the netdev's IPv4/MTU/carrier, one row per RDMA port.

    Without ``ibdev2netdev`` (it ships with MLNX OFED, not every image has it) the sysfs ports
    alone still give the RDMA side; the netdev stays unknown.
    """
    rate = {(pt.rdma_device, pt.port): pt for pt in ports}
    by_name = {i.name: i for i in interfaces}
    out: list[FastLink] = []
    if ib:
        for link in ib:
            pt = rate.get((link.rdma_device, link.port)) if link.port is not None else None
            nic = by_name.get(link.netdev) if link.netdev else None
            out.append(FastLink(
                rdma_device=link.rdma_device, port=link.port, netdev=link.netdev, state=link.state,
                rate_gbps=pt.rate_gbps if pt else None,
                ipv4=nic.ipv4 if nic else (), mtu=nic.mtu if nic else None,
                carrier=nic.carrier if nic else None,
            ))
        return tuple(out)
    for pt in ports:
        st = (pt.state or "").upper()
        state = "up" if st == "ACTIVE" else "down" if st in ("DOWN", "INIT", "ARMED", "POLLING") else None
        out.append(FastLink(rdma_device=pt.rdma_device, port=pt.port, netdev=None, state=state,
                            rate_gbps=pt.rate_gbps))
    return tuple(out)


def join_containers(
    containers: tuple[Container, ...], stats: Mapping[str, tuple[float | None, int | None, int | None]]
) -> tuple[Container, ...]:
    """Containers with their ``docker stats`` figures, matched by name."""
    out = []
    for c in containers:
        s = stats.get(c.name or "") if c.name else None
        if s is None and c.id:
            s = stats.get(c.id)
        if s is None:
            out.append(replace(c, cpu_pct=None, mem_used_bytes=None, mem_limit_bytes=None))
        else:
            out.append(replace(c, cpu_pct=s[0], mem_used_bytes=s[1], mem_limit_bytes=s[2]))
    return tuple(out)


def _cgroup_stats(containers: tuple[Container, ...], read: Mapping[str, tuple[float | None, int | None, int | None]],
                  before: Mapping[str, tuple[float | None, int | None, int | None]], host_total: int | None
                  ) -> dict[str, tuple[float | None, int | None, int | None]]:
    """``docker stats``' figures from the ``cgroups`` section, keyed by name like docker stats': only
    the containers with a cgroup (the running ones); a first reading (no CPU rate yet) keeps the
    container's last CPU figure; a ``max`` limit is the host's memory, as docker stats shows it."""
    out: dict[str, tuple[float | None, int | None, int | None]] = {}
    for c in containers:
        if c.id is None or c.id[:12] not in read:
            continue
        cpu, used, limit = read[c.id[:12]]
        key = c.name or c.id
        if cpu is None:
            cpu = before.get(key, (None, None, None))[0]
        out[key] = (cpu, used, host_total if limit is None else limit)
    return out


# A node without Ray (not installed, or no instance running): no Ray node, nothing pending; its
# resources were not read, so they stay None
RAY_ABSENT = RayStatus(active_nodes=0, pending_nodes=0)


def _prefixed(prefix: str, reasons: Mapping[str, str]) -> dict[str, str]:
    return {(k if k == prefix or k.startswith(prefix + ".") else f"{prefix}.{k}"): v
            for k, v in reasons.items()}


# What the GPU reader reads every tick (probe.script.GPU_MOVING_FIELDS); the rest of a GpuSample comes
# from ``gpu-static`` or the last sample
_MOVING = ("utilization_pct", "memory_used_mib", "temperature_c", "power_w", "clock_sm_mhz", "pstate")


def _with_static(moving: tuple[GpuSample, ...], sections: dict[str, SectionOutput],
                 before: tuple[GpuSample, ...]) -> tuple[GpuSample, ...]:
    """The reader's rows (moving fields only) on the static fields of the same GPU (by index): this
    tick's ``gpu-static`` when asked, else the previous sample's."""
    static = {g.index: g for g in before}
    if "gpu-static" in sections and sections["gpu-static"].rc == 0:
        static.update({g.index: g for g in p.gpus_from_query(p.parse_nvidia_smi_csv(sections["gpu-static"].text))})
    out = []
    for g in moving:
        base = static.get(g.index)
        out.append(g if base is None else replace(base, **{f: getattr(g, f) for f in _MOVING}))
    return tuple(out)


def assemble_sample(
    node: str,
    taken_at: float,
    sections: dict[str, SectionOutput],
    previous: NodeSample | None = None,
) -> NodeSample:
    """Build the node's sample from one tick's sections, carrying over what was not asked.

    Never raises on odd section text: every parser returns what it could read.
    """
    asked = tuple(s.name for s in SECTIONS if s.name in sections) + tuple(
        n for n in sections if n not in {s.name for s in SECTIONS}
    )
    prev = previous or NodeSample(node=node, taken_at=taken_at)
    fresh: dict[str, str] = {}

    def text(name: str) -> str:
        return sections[name].text if name in sections else ""

    def fail(name: str) -> bool:
        """File the section's failure reason; True when it failed."""
        if name not in sections:
            return False
        why = section_failure(sections[name])
        if why:
            fresh[SECTION_KEY.get(name, name)] = why
        return why is not None

    def parse_into(name: str, key: str, fn: Callable[..., T]) -> tuple[T, dict[str, str]]:
        """Parse one section; file its failure, else the parser's own reasons under ``key``."""
        r: dict[str, str] = {}
        value = fn(text(name), reasons=r)
        if not fail(name):  # a failed section's own reason is the better one
            fresh.update(_prefixed(key, r))
        return value, r

    # --- host
    host = prev.host
    if "hostname" in sections:
        hn, _ = parse_into("hostname", "host.hostname", p.parse_hostname)
        host = replace(host, hostname=hn)
    if "uname" in sections:
        (kernel, arch), _ = parse_into("uname", "host.kernel", p.parse_uname)
        host = replace(host, kernel=kernel, arch=arch)
    if "nproc" in sections:
        n, _ = parse_into("nproc", "host.cpu_count", p.parse_nproc)
        host = replace(host, cpu_count=n)
    if "uptime" in sections:
        up, _ = parse_into("uptime", "host.uptime", p.parse_uptime)
        host = replace(host, uptime_s=up.uptime_s, load1=up.load1)
    if "docker-version" in sections:
        dv, _ = parse_into("docker-version", "host.docker_version", p.parse_docker_version)
        host = replace(host, docker_version=dv)

    # --- GPUs and driver
    gpus = prev.gpus
    driver, cuda = prev.driver_version, prev.cuda_version
    table = None
    table_reasons: dict[str, str] = {}
    if "nvidia-smi" in sections:
        table, table_reasons = parse_into("nvidia-smi", "nvidia-smi", p.parse_nvidia_smi_table)
    gpu_failed = False
    if "gpu" in sections:
        r: dict[str, str] = {}
        csv = p.parse_nvidia_smi_csv(text("gpu"), reasons=r)
        gpus = p.gpus_from_query(csv, reasons=r)
        if csv.rows and "name" not in csv.rows[0]:
            gpus = _with_static(gpus, sections, prev.gpus)
        gpu_failed = fail("gpu")
        if not gpu_failed:
            fresh.update(_prefixed("gpu", {k: v for k, v in r.items() if not k.endswith(".memory")}))
        if not gpus and table is not None and table.gpus:
            gpus = table.gpus  # the CSV failed but the table this tick has them
    elif table is not None and table.gpus:
        gpus = table.gpus
    if table is not None and table.driver_version:
        driver, cuda = table.driver_version, table.cuda_version
    elif "gpu" in sections and gpus and gpus[0].driver_version:
        driver = gpus[0].driver_version
    if ("gpu" in sections or "nvidia-smi" in sections) and gpus and all(
        g.memory_total_mib is None for g in gpus
    ):
        gb10 = any(g.name and "GB10" in g.name for g in gpus) or GB10_MEMORY_REASON in table_reasons.values()
        fresh["gpu.memory"] = GB10_MEMORY_REASON if gb10 else "nvidia-smi reports no memory figure"

    # --- GPU processes (compute apps): the memory figure that works on GB10
    processes = prev.gpu_processes
    apps_ok = prev.memory.gpu_process_bytes is not None if previous is not None else False
    if "gpu-apps" in sections:
        r = {}
        apps_csv = p.parse_nvidia_smi_csv(text("gpu-apps"), reasons=r)
        apps_failed = fail("gpu-apps")
        processes = p.processes_from_query(apps_csv, gpus, reasons=r) if not apps_failed else ()
        header_ok = "csv" not in r or r["csv"] == "no rows"
        apps_ok = not apps_failed and header_ok
        if apps_failed:
            fresh["memory.gpu_process"] = fresh.get("gpu_processes", "nvidia-smi compute apps failed")
        elif not header_ok:
            fresh["gpu_processes"] = r["csv"]
            fresh["memory.gpu_process"] = r["csv"]

    # --- memory
    meminfo = prev.meminfo
    if "meminfo" in sections:
        meminfo, _ = parse_into("meminfo", "memory", p.parse_meminfo)
    memory = _unified_memory(meminfo, processes, apps_ok, gpus)

    # --- network
    interfaces = prev.interfaces
    if "ip-addr" in sections:
        interfaces, _ = parse_into("ip-addr", "interfaces", p.parse_ip_addr)
    ib = tuple(IbLink(fl.rdma_device, fl.port, fl.netdev, fl.state) for fl in prev.links if fl.netdev)
    if "ibdev2netdev" in sections:
        ib, _ = parse_into("ibdev2netdev", "links", p.parse_ibdev2netdev)
    ports = tuple(IbPort(fl.rdma_device, fl.port, None, fl.rate_gbps) for fl in prev.links
                  if fl.port is not None)
    if "ib-ports" in sections:
        ports, _ = parse_into("ib-ports", "links.rate", p.parse_ib_ports)
    links = prev.links
    if {"ip-addr", "ibdev2netdev", "ib-ports"} & set(sections):
        links = join_links(ib, ports, interfaces)

    # --- containers
    containers = prev.containers
    if "docker-ps" in sections:
        containers, _ = parse_into("docker-ps", "containers", p.parse_docker_ps)
    stats = {c.name: (c.cpu_pct, c.mem_used_bytes, c.mem_limit_bytes) for c in prev.containers if c.name}
    if "cgroups" in sections and sections["cgroups"].rc == 0:
        stats = _cgroup_stats(containers, p.parse_cgroups(text("cgroups")), stats,
                              meminfo.mem_total_bytes if meminfo is not None else None)
    elif "docker-stats" in sections:
        stats, _ = parse_into("docker-stats", "containers.stats", p.parse_docker_stats)
    if {"docker-ps", "docker-stats", "cgroups"} & set(sections):
        containers = join_containers(containers, stats)

    # --- ray, disk
    ray = prev.ray
    if "ray-status" in sections and p.ray_absent(text("ray-status"), sections["ray-status"].rc):
        ray = RAY_ABSENT  # not installed, or no instance here: read, and absent (not a "not read" error)
    elif "ray-status" in sections:
        ray, _ = parse_into("ray-status", "ray", p.parse_ray_status)
        if ray == RayStatus():  # nothing readable came back: None, the reason says why
            ray = None
    disk = prev.disk
    if "df" in sections:
        disk, _ = parse_into("df", "disk", p.parse_df)
        if disk == DiskUsage():
            disk = None

    # Unknown sections are reported, not ignored.
    for name in sections:
        if name not in {s.name for s in SECTIONS}:
            fresh[name] = section_failure(sections[name]) or "not a section this console knows"

    asked_set = set(asked)
    carried = {k: v for k, v in prev.unknown.items() if owner_of(k) not in asked_set}
    if "gpu.memory" in carried and ("nvidia-smi" in asked_set or "gpu" in asked_set):
        carried.pop("gpu.memory")
    unknown = {**carried, **fresh}
    return NodeSample(
        node=node,
        taken_at=taken_at,
        host=host,
        memory=memory,
        meminfo=meminfo,
        driver_version=driver,
        cuda_version=cuda,
        gpus=gpus,
        gpu_processes=processes,
        links=links,
        interfaces=interfaces,
        containers=containers,
        ray=ray,
        disk=disk,
        unknown=freeze_unknown(unknown),
        sections=asked,
    )

