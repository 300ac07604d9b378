"""Typed, frozen samples: what one probe of one node saw.

Rules every parser and the UI follow:

* A value that was not read is ``None``, never ``0``. The reason lives in the sample's
  ``unknown`` mapping (field path -> plain-words reason), so the UI can show "—" and explain it.
* Samples are frozen: the poller hands the same object to the UI and to the history without
  copying, and nobody can change what was seen.
* Sizes are bytes, temperatures °C, power W, rates Gb/s, clocks MHz, percentages 0-100.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal

MIB = 1024 * 1024
GIB = 1024 * MIB


def _frozen_map(value: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    return MappingProxyType(dict(value or {}))


@dataclass(frozen=True)
class MemInfo:
    """``/proc/meminfo``, in bytes (the file says kB and means KiB)."""

    mem_total_bytes: int | None = None
    mem_available_bytes: int | None = None
    mem_free_bytes: int | None = None
    cached_bytes: int | None = None
    buffers_bytes: int | None = None
    swap_total_bytes: int | None = None
    swap_free_bytes: int | None = None


@dataclass(frozen=True)
class GpuSample:
    """One GPU as ``nvidia-smi`` reports it. On a GB10 the memory fields are ``None``."""

    index: int | None = None
    name: str | None = None
    uuid: str | None = None
    bus_id: str | None = None
    driver_version: str | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    utilization_pct: float | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    clock_sm_mhz: float | None = None
    clock_max_sm_mhz: float | None = None
    pstate: str | None = None


@dataclass(frozen=True)
class GpuProcess:
    """A process holding GPU memory (``--query-compute-apps`` or the table's process rows)."""

    gpu: int | None = None
    pid: int | None = None
    type: str | None = None
    name: str | None = None
    memory_mib: float | None = None


@dataclass(frozen=True)
class NvidiaSmiTable:
    """The default ``nvidia-smi`` table."""

    driver_version: str | None = None
    cuda_version: str | None = None
    gpus: tuple[GpuSample, ...] = ()
    processes: tuple[GpuProcess, ...] = ()


@dataclass(frozen=True)
class CsvTable:
    """Any ``nvidia-smi --query-... --format=csv`` output: header names without unit suffix."""

    rows: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class IbLink:
    """One ``ibdev2netdev`` line: ``rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)``."""

    rdma_device: str
    port: int | None
    netdev: str | None
    state: Literal["up", "down"] | None


@dataclass(frozen=True)
class IbPort:
    """``/sys/class/infiniband/<dev>/ports/<n>/{state,rate}``."""

    rdma_device: str
    port: int
    state: str | None = None  # "ACTIVE", "DOWN", ...
    rate_gbps: float | None = None


@dataclass(frozen=True)
class NetInterface:
    """One interface from ``ip -j addr``."""

    name: str
    ifindex: int | None = None
    mtu: int | None = None
    operstate: str | None = None  # "UP", "DOWN", "UNKNOWN"
    carrier: bool | None = None  # False when flags carry NO-CARRIER
    mac: str | None = None
    ipv4: tuple[str, ...] = ()  # "192.168.200.12/24"


@dataclass(frozen=True)
class FastLink:
    """A ConnectX-7 twin as the console shows it: RDMA device joined with its netdev."""

    rdma_device: str
    port: int | None
    netdev: str | None
    state: Literal["up", "down"] | None
    rate_gbps: float | None = None
    ipv4: tuple[str, ...] = ()
    mtu: int | None = None
    carrier: bool | None = None


@dataclass(frozen=True)
class Container:
    """A container from ``docker ps -a`` (and ``docker stats`` when it was read)."""

    id: str | None
    name: str | None
    image: str | None
    state: str | None  # running / exited / restarting / created / paused / dead
    status: str | None  # "Up 25 hours (healthy)"
    ports: str | None = None
    running_for: str | None = None
    cpu_pct: float | None = None
    mem_used_bytes: int | None = None
    mem_limit_bytes: int | None = None
    labels: str | None = None


@dataclass(frozen=True)
class RayStatus:
    """``ray status``: the cluster as Ray sees it."""

    active_nodes: int | None = None
    pending_nodes: int | None = None
    cpus_total: float | None = None
    cpus_used: float | None = None
    gpus_total: float | None = None
    gpus_used: float | None = None


@dataclass(frozen=True)
class DiskUsage:
    """``df -B1 -P PATH`` for the filesystem holding the model cache."""

    mount: str | None = None
    total_bytes: int | None = None
    used_bytes: int | None = None
    available_bytes: int | None = None


@dataclass(frozen=True)
class UnifiedMemory:
    """Memory as one pool, the way a GB10 has it.

    ``total``/``available`` come from ``/proc/meminfo`` (MemTotal, MemAvailable); ``gpu_process``
    is the sum of per-process GPU memory; ``page_cache`` is Cached+Buffers; ``other_used`` is
    what is used and is neither. On a discrete GPU the same fields describe host memory and the
    GPU's own memory is in :class:`GpuSample`.
    """

    total_bytes: int | None = None
    available_bytes: int | None = None
    gpu_process_bytes: int | None = None
    page_cache_bytes: int | None = None
    other_used_bytes: int | None = None
    swap_total_bytes: int | None = None
    swap_used_bytes: int | None = None
    unified: bool = False  # GPU memory is part of this pool (GB10), not on a card of its own

    @property
    def used_bytes(self) -> int | None:
        if self.total_bytes is None or self.available_bytes is None:
            return None
        return self.total_bytes - self.available_bytes

    @property
    def available_fraction(self) -> float | None:
        if not self.total_bytes or self.available_bytes is None:
            return None
        return self.available_bytes / self.total_bytes


@dataclass(frozen=True)
class HostInfo:
    hostname: str | None = None
    kernel: str | None = None
    arch: str | None = None
    uptime_s: float | None = None
    load1: float | None = None
    cpu_count: int | None = None
    docker_version: str | None = None


@dataclass(frozen=True)
class NodeSample:
    """Everything one probe tick saw on one node.

    ``unknown`` maps a field path (``"gpu.memory"``, ``"links"``, ``"ray"``) to the reason it
    could not be read. ``sections`` lists the probe sections this tick asked for, so a value
    missing because it was not asked for this tick is not mistaken for one that failed.
    """

    node: str
    taken_at: float
    host: HostInfo = field(default_factory=HostInfo)
    memory: UnifiedMemory = field(default_factory=UnifiedMemory)
    meminfo: MemInfo | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    gpus: tuple[GpuSample, ...] = ()
    gpu_processes: tuple[GpuProcess, ...] = ()
    links: tuple[FastLink, ...] = ()
    interfaces: tuple[NetInterface, ...] = ()
    containers: tuple[Container, ...] = ()
    ray: RayStatus | None = None
    disk: DiskUsage | None = None
    unknown: Mapping[str, str] = field(default_factory=_frozen_map)
    sections: tuple[str, ...] = ()
    probe_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data (``snapshot --json``)."""
        # asdict() deep-copies every field and a MappingProxyType cannot be copied: swap it out.
        data = asdict(replace(self, unknown={}))
        data["unknown"] = dict(self.unknown)
        data["memory"]["used_bytes"] = self.memory.used_bytes
        return data


def freeze_unknown(reasons: Mapping[str, str]) -> Mapping[str, str]:
    """A read-only copy of a reasons mapping, for building a :class:`NodeSample`."""
    return _frozen_map(reasons)
