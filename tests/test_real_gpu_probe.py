"""The local probe on a real H200 (captured through the device tool) agrees with nvidia-smi.

The snapshot was taken by ``sparkconsole snapshot --local --json`` while a PyTorch process held
30 GiB; nvidia-smi ran seconds later under the same load. Static facts must be equal; moving
ones (power, memory in use) must be close.
"""

from __future__ import annotations

import json

from sparkconsole.probe.parsers import parse_meminfo, parse_nvidia_smi_csv, parse_nvidia_smi_table
from tests.conftest import FIXTURES

DIR = FIXTURES / "h200-local-probe"


def _snapshot(name: str) -> dict:
    data = json.loads((DIR / name).read_text())
    (node,) = data["nodes"]
    assert node["status"] == "up"
    return node["sample"]


def test_probe_matches_nvidia_smi_under_load():
    sample = _snapshot("snapshot_local_load.json")
    (gpu,) = sample["gpus"]
    (row,) = parse_nvidia_smi_csv((DIR / "query_gpu_load.csv").read_text()).rows
    assert gpu["name"] == row["name"] == "NVIDIA H200"
    assert gpu["uuid"] == row["uuid"] and gpu["bus_id"] == row["pci.bus_id"]
    assert gpu["driver_version"] == row["driver_version"] == sample["driver_version"] == "580.159.04"
    assert gpu["memory_total_mib"] == row["memory.total"] == 143771
    assert abs(gpu["memory_used_mib"] - row["memory.used"]) < 0.01 * row["memory.total"]
    assert abs(gpu["power_w"] - row["power.draw"]) < 50
    assert gpu["power_limit_w"] == row["power.limit"] == 700.0
    assert gpu["utilization_pct"] == 100 and row["utilization.gpu"] == 100

    table = parse_nvidia_smi_table((DIR / "nvidia-smi_load.txt").read_text())
    assert sample["cuda_version"] == table.cuda_version == "13.0"
    (app,) = sample["gpu_processes"]
    (apps_row,) = parse_nvidia_smi_csv((DIR / "query_apps_load.csv").read_text()).rows
    assert app["pid"] == apps_row["pid"] and app["memory_mib"] == apps_row["used_gpu_memory"] == 32106
    # a discrete GPU: its memory is on the card, not part of the host pool
    assert sample["memory"]["unified"] is False
    assert sample["memory"]["gpu_process_bytes"] == 32106 * 2**20


def test_probe_host_memory_is_the_real_meminfo():
    sample = _snapshot("snapshot_local_load.json")
    meminfo = parse_meminfo((DIR / "meminfo.txt").read_text())
    assert sample["memory"]["total_bytes"] == meminfo.mem_total_bytes
    assert abs(sample["memory"]["available_bytes"] - meminfo.mem_available_bytes) < 2 * 2**30


def test_probe_idle_says_why_values_are_missing():
    sample = _snapshot("snapshot_local_idle.json")
    assert sample["gpus"][0]["utilization_pct"] == 0
    assert sample["gpu_processes"] == []
    # the machine has no docker, ip or RDMA stack: each gap carries its reason, nothing reads 0
    assert "not found" in sample["unknown"]["containers"]
    assert "not found" in sample["unknown"]["links"]
    assert sample["links"] == [] and sample["ray"] is None
