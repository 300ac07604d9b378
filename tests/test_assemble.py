"""assemble_sample: one tick's sections -> one complete NodeSample.

Two kinds of input: the real probe script run by /bin/sh on this machine (real meminfo, uptime,
df, ip, and real "not found" failures for nvidia-smi/ibdev2netdev/ray), and sections built from
the real GB10 fixtures (what a Spark prints), framed the way the probe frames them.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from sparkconsole.probe import parsers
from sparkconsole.probe.assemble import RAY_ABSENT, assemble_sample, owner_of, section_failure
from sparkconsole.probe.samples import MIB
from sparkconsole.probe.script import MARK, SECTION_BY_NAME, SectionOutput, probe_script, split_tick
from tests.conftest import FIXTURES, real_fixture, strip_fixture_header


@pytest.fixture(autouse=True)
def strict_parsers(monkeypatch):
    monkeypatch.setattr(parsers, "STRICT", True)


def run_probe(names: list[str]) -> dict[str, SectionOutput]:
    """Run the real probe script with /bin/sh for one tick and split it like the poller does."""
    script = probe_script(tuple(SECTION_BY_NAME[n] for n in names))
    proc = subprocess.run(["/bin/sh", "-c", script], input=" ".join(names) + "\n",
                          capture_output=True, text=True, timeout=60)
    lines = proc.stdout.splitlines()
    begin = next(i for i, ln in enumerate(lines) if ln.startswith(f"{MARK} begin"))
    end = next(i for i, ln in enumerate(lines) if ln.startswith(f"{MARK} end"))
    return split_tick(lines[begin + 1 : end])


def ok(name: str, text: str) -> SectionOutput:
    return SectionOutput(name, text, 0)


def gb10_sections() -> dict[str, SectionOutput]:
    """A GB10 tick from the real fixtures. The compute-apps CSV is the real one; the GPU query is
    the real partial-header CSV (its author elided columns)."""
    meminfo = (
        # SYNTHETIC figures in /proc/meminfo format: no raw GB10 meminfo is public; MemTotal is in
        # the range others' tests saw (125,411,392 kB).
        "MemTotal:       125411392 kB\nMemFree:         9000000 kB\nMemAvailable:   10000000 kB\n"
        "Buffers:          100000 kB\nCached:          2000000 kB\nSwapTotal:      16000000 kB\n"
        "SwapFree:       15000000 kB\n"
    )
    return {
        "meminfo": ok("meminfo", meminfo),
        "gpu": ok("gpu", real_fixture("gb10/nvidia-smi_query-gpu_csv_header_partial_gb10.txt")),
        "gpu-apps": ok("gpu-apps", real_fixture("gb10/nvidia-smi_query-compute-apps_vllm_gb10.txt")),
        "nvidia-smi": ok("nvidia-smi", real_fixture("gb10/nvidia-smi_gb10_idle_desktop.txt")),
        "ibdev2netdev": ok("ibdev2netdev", real_fixture("gb10/ibdev2netdev_port1_up.txt")),
        "ip-addr": ok("ip-addr", real_fixture("gb10/ip_addr_show_enp1s0f1np1_static.txt")),
        "docker-ps": ok("docker-ps", real_fixture("gb10/docker_ps_format_gb10.txt")),
    }


# --------------------------------------------------------------------------------- this machine


def test_real_probe_this_machine():
    names = ["hostname", "uname", "nproc", "uptime", "meminfo", "df", "gpu", "gpu-apps", "ray-status"]
    secs = run_probe(names)
    s = assemble_sample("local", 123.0, secs)
    total_kb = int(next(ln.split()[1] for ln in Path("/proc/meminfo").read_text().splitlines()
                        if ln.startswith("MemTotal:")))
    assert s.memory.total_bytes == total_kb * 1024
    assert s.meminfo is not None and s.meminfo.mem_total_bytes == total_kb * 1024
    assert s.memory.available_bytes is not None and 0 < s.memory.available_bytes <= s.memory.total_bytes
    assert s.host.uptime_s and s.host.uptime_s > 0 and s.host.load1 is not None
    assert s.host.cpu_count == int(subprocess.run(["nproc"], capture_output=True, text=True).stdout)
    assert s.host.hostname == subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip()
    assert s.disk is not None and s.disk.mount == "/" and s.disk.total_bytes
    assert set(s.sections) == set(names)  # in SECTIONS order
    if secs["gpu"].rc == 127:  # no NVIDIA GPU on this machine: the failure is said, not zeroed
        assert s.unknown["gpu"] == "nvidia-smi: not found (exit 127)"
        assert s.gpus == () and s.memory.gpu_process_bytes is None
        # no GPU: everything used is "other"
        assert s.memory.other_used_bytes == s.memory.total_bytes - s.memory.available_bytes
    if secs["ray-status"].rc not in (0, None):  # no Ray here is Ray absent; any other failure is "not read"
        if parsers.ray_absent(secs["ray-status"].text, secs["ray-status"].rc):
            assert s.ray == RAY_ABSENT and "ray" not in s.unknown
        else:
            assert s.ray is None and "ray" in s.unknown
    json.dumps(s.to_dict())  # snapshot --json must be able to print it


def test_real_probe_carry_over():
    first = assemble_sample("local", 1.0, run_probe(["hostname", "meminfo", "df"]))
    second = assemble_sample("local", 2.0, run_probe(["meminfo"]), previous=first)
    assert second.sections == ("meminfo",)
    assert second.host.hostname == first.host.hostname  # not asked: carried
    assert second.disk == first.disk
    assert second.memory.total_bytes == first.memory.total_bytes


# --------------------------------------------------------------------------------- GB10


def test_gb10_unified_memory_and_reasons():
    s = assemble_sample("spark-1", 10.0, gb10_sections())
    g = s.gpus[0]
    assert g.name == "NVIDIA GB10"
    assert g.memory_total_mib is None and g.memory_used_mib is None
    assert s.unknown["gpu.memory"] == "unified memory: nvidia-smi reports Not Supported"
    # driver/CUDA from the table section
    assert (s.driver_version, s.cuda_version) == ("580.126.09", "13.0")
    # unified memory: compute apps are the GPU share of the one pool
    m = s.memory
    assert m.total_bytes == 125411392 * 1024 and m.available_bytes == 10000000 * 1024
    assert m.gpu_process_bytes == 109832 * MIB
    assert m.page_cache_bytes == (2000000 + 100000) * 1024
    assert m.other_used_bytes == max(0, m.total_bytes - m.available_bytes - 109832 * MIB)
    assert m.swap_used_bytes == 1000000 * 1024
    assert [pr.name for pr in s.gpu_processes] == ["VLLM::EngineCore"]


def test_gb10_links_joined():
    s = assemble_sample("spark-1", 10.0, gb10_sections())
    links = {fl.rdma_device: fl for fl in s.links}
    up = links["rocep1s0f1"]
    assert (up.netdev, up.state, up.mtu, up.ipv4, up.carrier) == (
        "enp1s0f1np1", "up", 1500, ("192.168.100.10/24",), True)
    assert links["roceP2p1s0f1"].state == "up" and links["roceP2p1s0f1"].mtu is None  # not in ip output
    assert "interfaces.enp1s0f1np1.ipv4" in s.unknown  # the '**' decoration is reported
    # the rate joins from the sysfs section when it arrives (SYNTHETIC arrangement, kernel format)
    ports = "/sys/class/infiniband/rocep1s0f1/ports/1/rate:200 Gb/sec (4X HDR)\n"
    s2 = assemble_sample("spark-1", 11.0, {"ib-ports": ok("ib-ports", ports)}, previous=s)
    links2 = {fl.rdma_device: fl for fl in s2.links}
    assert links2["rocep1s0f1"].rate_gbps == 200.0
    assert links2["rocep1s0f1"].ipv4 == ("192.168.100.10/24",)  # carried from the ip-addr section


def test_gb10_containers_with_stats():
    s = assemble_sample("spark-1", 10.0, gb10_sections())
    assert s.containers[0].name == "project-agentic-rag"
    # SYNTHETIC stats line for one of the real container names
    stats = json.dumps({"Name": "workbench-proxy", "CPUPerc": "12.34%", "MemUsage": "1.5GiB / 119.7GiB"})
    s2 = assemble_sample("spark-1", 11.0, {"docker-stats": ok("docker-stats", stats)}, previous=s)
    c = {c.name: c for c in s2.containers}
    assert c["workbench-proxy"].cpu_pct == 12.34 and c["workbench-proxy"].mem_used_bytes == int(1.5 * 1024**3)
    assert c["project-agentic-rag"].cpu_pct is None
    assert len(s2.containers) == 3  # docker-ps not asked: the list is carried


def test_failed_gpu_apps_means_unknown_not_zero():
    secs = gb10_sections()
    secs["gpu-apps"] = SectionOutput("gpu-apps", "sh: 1: nvidia-smi: not found", 127)
    s = assemble_sample("spark-1", 10.0, secs)
    assert s.memory.gpu_process_bytes is None
    # the GPU share is unknown, so the used amount is not split (and not shown as 0)
    assert s.memory.other_used_bytes == s.memory.total_bytes - s.memory.available_bytes
    assert s.unknown["gpu_processes"] == "nvidia-smi: not found (exit 127)"
    assert "memory.gpu_process" in s.unknown


def test_no_processes_is_zero():
    secs = gb10_sections()
    header_only = strip_fixture_header((FIXTURES / "h200x2/nvsmi_query_apps_csv_none_x2.txt").read_text())
    secs["gpu-apps"] = ok("gpu-apps", header_only)
    s = assemble_sample("spark-1", 10.0, secs)
    assert s.memory.gpu_process_bytes == 0
    assert s.memory.other_used_bytes == s.memory.total_bytes - s.memory.available_bytes


def test_reason_replaced_when_section_asked_again():
    bad = {"gpu": SectionOutput("gpu", "sh: 1: nvidia-smi: not found", 127)}
    s1 = assemble_sample("n", 1.0, bad)
    assert s1.unknown["gpu"] == "nvidia-smi: not found (exit 127)"
    s2 = assemble_sample("n", 2.0, {"meminfo": ok("meminfo", "MemTotal: 1 kB\n")}, previous=s1)
    assert s2.unknown["gpu"] == s1.unknown["gpu"]  # not asked: the reason is carried too
    good = ok("gpu", strip_fixture_header((FIXTURES / "h200x2/nvsmi_query_gpu_csv_x2.txt").read_text()))
    s3 = assemble_sample("n", 3.0, {"gpu": good}, previous=s2)
    assert "gpu" not in s3.unknown and len(s3.gpus) == 2
    assert s3.driver_version == "580.159.04"  # no table this tick: driver from the CSV


def test_discrete_gpu_memory_not_subtracted():
    """H200 (real 2x capture): GPU memory is on the card, host memory is not reduced by it."""
    secs = {
        "meminfo": ok("meminfo", strip_fixture_header((FIXTURES / "h200x2/proc_meminfo.txt").read_text())),
        "gpu": ok("gpu", strip_fixture_header((FIXTURES / "h200x2/nvsmi_query_gpu_csv_x2.txt").read_text())),
        "gpu-apps": ok("gpu-apps",
                       strip_fixture_header((FIXTURES / "h200x2/nvsmi_query_apps_csv_x2_gpu.txt").read_text())),
    }
    s = assemble_sample("h200", 1.0, secs)
    assert s.memory.gpu_process_bytes == (2566 + 3590) * MIB
    assert s.memory.other_used_bytes == s.memory.total_bytes - s.memory.available_bytes
    assert "gpu.memory" not in s.unknown
    assert [pr.gpu for pr in s.gpu_processes] == [0, 1]


def test_section_failure_words():
    assert section_failure(SectionOutput("gpu", "sh: 1: nvidia-smi: not found", 127)) == (
        "nvidia-smi: not found (exit 127)")
    assert section_failure(SectionOutput("gpu", "", 124)).startswith("timed out")
    assert "cut off" in section_failure(SectionOutput("gpu", "", None))
    assert section_failure(SectionOutput("gpu", "x", 0)) is None
    assert owner_of("memory.gpu_process") == "gpu-apps"
    assert owner_of("interfaces.enp1s0f1np1.ipv4") == "ip-addr"
    assert owner_of("gpu.memory") == "gpu"


def test_odd_sections_never_raise():
    secs = {n: SectionOutput(n, "\x00garbage ][ {\n| 0 | 1 |\n::", rc) for n, rc in
            zip(SECTION_BY_NAME, [0, 1, None, 127] * 5, strict=False)}
    secs["made-up"] = ok("made-up", "hello")
    s = assemble_sample("n", 1.0, secs)
    assert "made-up" in s.sections and "made-up" in s.unknown
    json.dumps(s.to_dict())
