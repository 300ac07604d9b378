"""The probe parsers against real outputs (tests/fixtures/real, .../h200x2, .../ray, .../docker).

Facts asserted here are the ones the fixtures README lists for each file. Inputs written in this
file (not read from a fixture) are marked SYNTHETIC: they exercise an edge the real files lack.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from sparkconsole.probe import parsers as p
from sparkconsole.probe.samples import MemInfo, RayStatus
from sparkconsole.probe.script import GPU_QUERY_FIELDS
from tests.conftest import FIXTURES, real_fixture, strip_fixture_header


@pytest.fixture(autouse=True)
def strict_parsers(monkeypatch):
    """Bugs must raise here, not hide behind the parsers' safety net."""
    monkeypatch.setattr(p, "STRICT", True)


def fx(rel: str) -> str:
    """A fixture outside tests/fixtures/real (captured for this module), header stripped."""
    return strip_fixture_header((FIXTURES / rel).read_text(encoding="utf-8"))


NOT_FOUND = "sh: 1: nvidia-smi: not found\n"  # what dash prints for a missing tool, rc 127


# --------------------------------------------------------------------------------- helpers


@pytest.mark.parametrize(
    ("raw", "want"),
    [("3.74 W", 3.74), ("109832 MiB", 109832), ("[N/A]", None), ("N/A", None), ("Not Supported", None),
     ("41", 41), ("0 %", 0), ("P8", None), ("580.126.09", None), ("", None), ("1980 MHz", 1980)],
)
def test_number(raw, want):
    assert p.number(raw) == want
    if want is not None:
        assert type(p.number(raw)) is type(want)


@pytest.mark.parametrize(
    ("raw", "want"),
    [("1.5GiB", int(1.5 * 1024**3)), ("119.7GiB", round(119.7 * 1024**3)), ("320KiB", 320 * 1024),
     ("0B", 0), ("12kB", 12000), ("3MB", 3_000_000), ("2TiB", 2 * 1024**4), ("--", None), ("x", None)],
)
def test_size_bytes(raw, want):
    assert p.size_bytes(raw) == want


def test_tool_error_wording():
    assert p.tool_error(NOT_FOUND) == "nvidia-smi: not found"
    # real, from the H200 capture script (bash) and from coreutils timeout on this machine
    assert p.tool_error(real_fixture("h200/ipjson.txt")) == "ip: command not found"
    assert p.tool_error("timeout: failed to run command 'nvidia-smi': No such file or directory") == (
        "nvidia-smi: not found"
    )
    assert p.tool_error(fx("ray/ray_status_no_cluster.txt")).startswith(
        "ConnectionError: Could not find any running Ray instance"
    )
    assert p.tool_error("MemTotal: 1 kB") is None


# --------------------------------------------------------------------------------- meminfo


def test_meminfo_real_h200_capture():
    r: dict[str, str] = {}
    m = p.parse_meminfo(fx("h200x2/proc_meminfo.txt"), reasons=r)
    assert m.mem_total_bytes == 263998500 * 1024
    assert m.mem_available_bytes == 263406644 * 1024
    assert m.mem_free_bytes == 262655788 * 1024
    assert m.cached_bytes == 945604 * 1024  # "Cached:", not "SwapCached:"
    assert m.buffers_bytes == 13196 * 1024
    assert m.swap_total_bytes == 0 and m.swap_free_bytes == 0
    assert r == {}


def test_meminfo_this_machine():
    text = Path("/proc/meminfo").read_text()
    total_kb = int(next(ln.split()[1] for ln in text.splitlines() if ln.startswith("MemTotal:")))
    assert p.parse_meminfo(text).mem_total_bytes == total_kb * 1024


def test_meminfo_missing_tool_and_prompt():
    r: dict[str, str] = {}
    assert p.parse_meminfo("cat: /proc/meminfo: No such file or directory\n", reasons=r) == MemInfo()
    assert "No such file" in r["meminfo"]
    # SYNTHETIC: a prompt echoed in front of two real-format lines
    m = p.parse_meminfo("nvidia@spark:~$ cat /proc/meminfo\nMemTotal:  125411392 kB\nMemAvailable: 1 kB\n")
    assert m.mem_total_bytes == 125411392 * 1024 and m.mem_free_bytes is None


# --------------------------------------------------------------------------------- nvidia-smi table


def test_nvidia_smi_table_gb10():
    r: dict[str, str] = {}
    t = p.parse_nvidia_smi_table(real_fixture("gb10/nvidia-smi_gb10_idle_desktop.txt"), reasons=r)
    assert t.driver_version == "580.126.09"
    assert t.cuda_version == "13.0"
    (g,) = t.gpus
    assert g.index == 0 and g.name == "NVIDIA GB10"
    assert g.bus_id == "0000000F:01:00.0"
    assert g.memory_used_mib is None and g.memory_total_mib is None  # "Not Supported"
    assert g.power_w == 4 and g.power_limit_w is None  # "4W /  N/A"
    assert g.temperature_c == 41 and g.pstate == "P8" and g.utilization_pct == 0
    assert r["gpu0.memory"] == "unified memory: nvidia-smi reports Not Supported"
    assert [(pr.name, pr.memory_mib, pr.type, pr.pid, pr.gpu) for pr in t.processes] == [
        ("/usr/lib/xorg/Xorg", 179, "G", 2804, 0),
        ("/usr/bin/gnome-shell", 48, "G", 3060, 0),
    ]


def test_nvidia_smi_table_h200_idle():
    r: dict[str, str] = {}
    t = p.parse_nvidia_smi_table(real_fixture("h200/nvsmi_idle.txt"), reasons=r)
    assert (t.driver_version, t.cuda_version) == ("580.159.04", "13.0")
    (g,) = t.gpus
    assert g.name == "NVIDIA H200" and g.bus_id == "00000000:00:06.0"
    assert (g.memory_used_mib, g.memory_total_mib) == (0, 143771)
    assert (g.power_w, g.power_limit_w) == (122, 700)
    assert (g.temperature_c, g.pstate, g.utilization_pct) == (32, "P0", 0)
    assert t.processes == ()  # "No running processes found"
    assert r == {}


def test_nvidia_smi_table_two_gpus_with_processes():
    """Real 2x H200 table: GPU rows repeat per GPU, one compute process on each."""
    t = p.parse_nvidia_smi_table(fx("h200x2/nvsmi_2procs_x2.txt"))
    assert [g.index for g in t.gpus] == [0, 1]
    assert [g.bus_id for g in t.gpus] == ["00000000:00:06.0", "00000000:00:07.0"]
    assert [g.memory_used_mib for g in t.gpus] == [2575, 3599]
    assert [g.temperature_c for g in t.gpus] == [39, 36]
    assert [(pr.gpu, pr.pid, pr.type, pr.name, pr.memory_mib) for pr in t.processes] == [
        (0, 563, "C", "python3", 2566), (1, 564, "C", "python3", 3590)]
    idle = p.parse_nvidia_smi_table(fx("h200x2/nvsmi_idle_x2.txt"))
    assert len(idle.gpus) == 2 and idle.processes == ()


def test_nvidia_smi_table_missing_tool():
    r: dict[str, str] = {}
    t = p.parse_nvidia_smi_table(NOT_FOUND, reasons=r)
    assert t.gpus == () and t.driver_version is None
    assert r["nvidia-smi"] == "nvidia-smi: not found"


def test_nvidia_smi_table_old_layout_and_mig_block():
    # SYNTHETIC: the older (470-era) layout without GI/CI columns, followed by a MIG block whose
    # rows must not be taken for GPUs.
    text = """\
+-----------------------------------------------------------------------------+
| NVIDIA-SMI 470.82.01    Driver Version: 470.82.01    CUDA Version: 11.4     |
|-------------------------------+----------------------+----------------------+
| GPU  Name        Persistence-M| Bus-Id        Disp.A | Volatile Uncorr. ECC |
| Fan  Temp  Perf  Pwr:Usage/Cap|         Memory-Usage | GPU-Util  Compute M. |
|===============================+======================+======================|
|   0  Tesla V100-SXM2...  On   | 00000000:00:1E.0 Off |                    0 |
| N/A   34C    P0    43W / 300W |   1234MiB / 16160MiB |     12%      Default |
+-------------------------------+----------------------+----------------------+
| MIG devices:                                                                |
+------------------+----------------------+-----------+-----------------------+
|  0    1   0   0  |     10MiB / 20096MiB | 42      0 |  3   0    2    0    0 |
+------------------+----------------------+-----------+-----------------------+
| Processes:                                                                  |
|  GPU   PID   Type   Process name                                GPU Memory  |
|=============================================================================|
|    0      4242      C   python                                     1230MiB  |
+-----------------------------------------------------------------------------+
"""
    t = p.parse_nvidia_smi_table(text)
    assert len(t.gpus) == 1
    g = t.gpus[0]
    assert (g.name, g.temperature_c, g.power_w, g.power_limit_w) == ("Tesla V100-SXM2...", 34, 43, 300)
    assert (g.memory_used_mib, g.memory_total_mib, g.utilization_pct) == (1234, 16160, 12)
    assert [(pr.pid, pr.name, pr.memory_mib) for pr in t.processes] == [(4242, "python", 1230)]


# --------------------------------------------------------------------------------- nvidia-smi csv


def test_csv_gb10_partial_header():
    r: dict[str, str] = {}
    t = p.parse_nvidia_smi_csv(real_fixture("gb10/nvidia-smi_query-gpu_csv_header_partial_gb10.txt"), reasons=r)
    (row,) = t.rows
    assert row == {"name": "NVIDIA GB10", "memory.total": None, "memory.free": None, "memory.used": None,
                   "col4": 39, "col5": 3.74}
    assert "csv.header" in r
    (g,) = p.gpus_from_query(t)
    assert g.name == "NVIDIA GB10" and g.memory_total_mib is None


def test_csv_compute_apps_gb10():
    t = p.parse_nvidia_smi_csv(real_fixture("gb10/nvidia-smi_query-compute-apps_vllm_gb10.txt"))
    assert t.rows == ({"pid": 37388, "process_name": "VLLM::EngineCore", "used_gpu_memory": 109832},)
    (pr,) = p.processes_from_query(t)
    assert (pr.pid, pr.name, pr.memory_mib, pr.type) == (37388, "VLLM::EngineCore", 109832, "C")


def test_csv_h200_noheader_needs_fields():
    text = real_fixture("h200/nvsmi_query_idle.txt")
    r: dict[str, str] = {}
    assert p.parse_nvidia_smi_csv(text, reasons=r).rows == ()
    assert "noheader" in r["csv"]
    what = (FIXTURES / "real/h200/nvsmi_query_idle.txt").read_text().splitlines()[0]
    fields = what.split("--query-gpu=")[1].split()[0].split(",")  # the list is on the "# what:" line
    assert len(fields) == 15
    t = p.parse_nvidia_smi_csv(text, fields=fields)
    (row,) = t.rows
    assert row["memory.total"] == 143771 and row["power.draw"] == 122.06 and row["pstate"] == "P0"
    assert row["driver_version"] == "580.159.04" and isinstance(row["driver_version"], str)
    (g,) = p.gpus_from_query(t)
    assert (g.memory_total_mib, g.power_w, g.power_limit_w, g.clock_sm_mhz) == (143771, 122.06, 700.0, 1980)
    assert g.uuid == "GPU-cd544f5c-7fbe-d34e-b3cf-86188cbe06e0"


@pytest.mark.parametrize("name", ["nvsmi_query_gpu_csv_x2.txt", "nvsmi_query_gpu_csv_x2_nounits.txt"])
def test_csv_two_gpus_probe_fields(name):
    """The probe's own GPU_QUERY_FIELDS on a real 2x H200 (units in values, and nounits)."""
    assert "clocks.sm" in GPU_QUERY_FIELDS
    t = p.parse_nvidia_smi_csv(fx(f"h200x2/{name}"))
    assert "clocks.current.sm" in t.rows[0]  # nvidia-smi renames clocks.sm in its header
    gpus = p.gpus_from_query(t)
    assert [g.index for g in gpus] == [0, 1]
    assert [g.bus_id for g in gpus] == ["00000000:00:06.0", "00000000:00:07.0"]
    assert [g.memory_used_mib for g in gpus] == [4, 3599]
    assert [g.clock_sm_mhz for g in gpus] == [345, 1980]
    assert gpus[0].power_w == pytest.approx(79.8, abs=0.05) and gpus[1].power_limit_w == 700.0
    assert all(g.driver_version == "580.159.04" and g.pstate == "P0" for g in gpus)


def test_processes_map_bus_id_to_gpu_index():
    gpus = p.gpus_from_query(p.parse_nvidia_smi_csv(fx("h200x2/nvsmi_query_gpu_csv_x2.txt")))
    apps = p.parse_nvidia_smi_csv(fx("h200x2/nvsmi_query_apps_csv_x2_gpu.txt"))
    assert [(pr.gpu, pr.pid, pr.memory_mib) for pr in p.processes_from_query(apps, gpus)] == [
        (0, 563, 2566), (1, 564, 3590)]
    r: dict[str, str] = {}
    none = p.parse_nvidia_smi_csv(fx("h200x2/nvsmi_query_apps_csv_none_x2.txt"), reasons=r)
    assert none.rows == () and r["csv"] == "no rows"


def test_csv_missing_tool_and_prompt():
    r: dict[str, str] = {}
    assert p.parse_nvidia_smi_csv(NOT_FOUND, reasons=r).rows == ()
    assert r["csv"] == "nvidia-smi: not found"
    # SYNTHETIC: prompt + the real compute-apps lines
    text = "nvidia@spark:~$ nvidia-smi --query-compute-apps=pid,process_name --format=csv\n" + real_fixture(
        "gb10/nvidia-smi_query-compute-apps_vllm_gb10.txt")
    assert p.parse_nvidia_smi_csv(text).rows[0]["pid"] == 37388


# --------------------------------------------------------------------------------- RDMA


def test_ibdev2netdev_port1_twins_up():
    links = p.parse_ibdev2netdev(real_fixture("gb10/ibdev2netdev_port1_up.txt"))  # prompt line kept
    assert len(links) == 4
    up = {(link.rdma_device, link.netdev) for link in links if link.state == "up"}
    assert up == {("rocep1s0f1", "enp1s0f1np1"), ("roceP2p1s0f1", "enP2p1s0f1np1")}
    assert all(link.port == 1 for link in links)
    assert {link.state for link in links} == {"up", "down"}


def test_ibdev2netdev_order_does_not_matter():
    lines = real_fixture("gb10/ibdev2netdev_port1_up.txt").splitlines()
    assert p.parse_ibdev2netdev("\n".join(reversed(lines))) == p.parse_ibdev2netdev("\n".join(lines))


def test_ibdev2netdev_missing():
    r: dict[str, str] = {}
    assert p.parse_ibdev2netdev("sh: 1: ibdev2netdev: not found", reasons=r) == ()
    assert r["ibdev2netdev"] == "ibdev2netdev: not found"


def test_ib_ports_sysfs():
    # SYNTHETIC in arrangement (no real grep of a Spark's sysfs is public); the line formats are
    # the kernel's: state "N: NAME", rate "X Gb/sec (...)".
    text = """\
/sys/class/infiniband/rocep1s0f1/ports/1/state:4: ACTIVE
/sys/class/infiniband/rocep1s0f0/ports/1/state:1: DOWN
/sys/class/infiniband/rocep1s0f1/ports/1/rate:200 Gb/sec (4X HDR)
/sys/class/infiniband/rocep1s0f0/ports/1/rate:40 Gb/sec (4X QDR)
grep: /sys/class/infiniband/*/ports/*/rate: No such file or directory
"""
    ports = p.parse_ib_ports(text)
    assert [(x.rdma_device, x.port, x.state, x.rate_gbps) for x in ports] == [
        ("rocep1s0f0", 1, "DOWN", 40.0), ("rocep1s0f1", 1, "ACTIVE", 200.0)]


def test_ib_ports_none():
    r: dict[str, str] = {}
    text = "grep: /sys/class/infiniband/*/ports/*/state: No such file or directory\n"  # real, this machine
    assert p.parse_ib_ports(text, reasons=r) == ()
    assert "No such file" in r["ib-ports"]


# --------------------------------------------------------------------------------- ip


def test_ip_addr_text_decorated_static():
    r: dict[str, str] = {}
    (i,) = p.parse_ip_addr_text(real_fixture("gb10/ip_addr_show_enp1s0f1np1_static.txt"), reasons=r)
    assert (i.name, i.ifindex, i.operstate, i.mtu, i.carrier) == ("enp1s0f1np1", 4, "UP", 1500, True)
    assert i.mac == "3c:6d:66:cc:b3:b7"
    assert i.ipv4 == ("192.168.100.10/24",)
    assert "decorated" in r["enp1s0f1np1.ipv4"]


def test_ip_s_link_nocarrier():
    ifs = {i.name: i for i in p.parse_ip_addr_text(real_fixture("gb10/ip-s_link_show_gb10_qsfp_nocarrier.txt"))}
    for cx7 in ("enp1s0f0np0", "enp1s0f1np1", "enP2p1s0f0np0", "enP2p1s0f1np1"):
        assert (ifs[cx7].carrier, ifs[cx7].operstate, ifs[cx7].mtu) == (False, "DOWN", 1500)
    assert (ifs["enP7s7"].operstate, ifs["enP7s7"].mtu, ifs["enP7s7"].carrier) == ("UP", 9000, True)
    assert "veth5b4ba42" in ifs  # "veth5b4ba42@if2:" -> the name without the peer


def test_ip_json_this_machine():
    """Real `ip -j addr` of this machine, checked against `ip -o -4 addr` of the same machine."""
    try:
        js = subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, timeout=10).stdout
        o4 = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True, timeout=10).stdout
    except FileNotFoundError:
        pytest.skip("no ip here")
    ifs = {i.name: i for i in p.parse_ip_addr_json(js)}
    assert "lo" in ifs and "127.0.0.1/8" in ifs["lo"].ipv4
    for line in o4.splitlines():
        parts = line.split()
        assert parts[3] in ifs[parts[1]].ipv4
    for item in json.loads(js):
        assert ifs[item["ifname"]].mtu == item["mtu"]
        if "NO-CARRIER" in item["flags"]:
            assert ifs[item["ifname"]].carrier is False


def test_ip_json_missing_tool():
    r: dict[str, str] = {}
    assert p.parse_ip_addr_json(real_fixture("h200/ipjson.txt"), reasons=r) == ()
    assert r["ip-addr"] == "ip: command not found"
    assert p.parse_ip_addr(fx("h200x2/ip_j_addr.txt")) == ()


# --------------------------------------------------------------------------------- docker


def test_docker_ps_table_gb10():
    cs = p.parse_docker_ps(real_fixture("gb10/docker_ps_format_gb10.txt"))
    assert [c.name for c in cs] == ["project-agentic-rag", "workbench-proxy", "openshell-cluster-nemoclaw"]
    assert cs[0].ports is None  # empty PORTS cell at end of line
    assert cs[1].ports == "80/tcp, 127.0.0.1:10000->10000/tcp"
    assert cs[2].status == "Up 25 hours (healthy)" and cs[2].image == "ghcr.io/nvidia/openshell/cluster:0.0.16"
    assert all(c.state == "running" for c in cs)


def test_docker_ps_json_real():
    cs = {c.name: c for c in p.parse_docker_ps(fx("docker/docker_ps_json_20.10.txt"))}
    run, ex = cs["sc-parsers-fixture-run"], cs["sc-parsers-fixture-exited"]
    assert (run.state, run.id, run.image) == ("running", "60f52fa1f678", "sparkconsole-test/busybox:1")
    assert run.ports == "127.0.0.1:18080->80/tcp" and run.status.startswith("Up ")
    assert (ex.state, ex.status) == ("exited", "Exited (3) 2 seconds ago")
    assert ex.ports is None and ex.labels is None


def test_docker_ps_json_without_state():
    """Older docker has no State key: derived from Status. Made from the real lines minus State."""
    lines = []
    for line in fx("docker/docker_ps_json_20.10.txt").splitlines():
        if line.startswith("{"):
            d = json.loads(line)
            d.pop("State")
            lines.append(json.dumps(d))
    # SYNTHETIC: a restarting one, same keys
    lines.append(json.dumps({"ID": "abc", "Names": "r", "Image": "i", "Status": "Restarting (1) 3 seconds ago"}))
    states = {c.name: c.state for c in p.parse_docker_ps("\n".join(lines))}
    assert states == {"sc-parsers-fixture-run": "running", "sc-parsers-fixture-exited": "exited", "r": "restarting"}


def test_docker_ps_daemon_down():
    r: dict[str, str] = {}
    text = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"
    assert p.parse_docker_ps(text, reasons=r) == ()
    assert r["docker"].startswith("Cannot connect")


def test_docker_stats_real():
    s = p.parse_docker_stats(fx("docker/docker_stats_json_20.10.txt"))
    assert s["sc-parsers-fixture-run"] == (0.0, 320 * 1024, round(23.54 * 1024**3))
    assert s["sc-parsers-fixture-exited"] == (0.0, 0, 0)
    # SYNTHETIC: the brief's example figures and a stopped container's "--"
    line = json.dumps({"Name": "vllm", "CPUPerc": "12.34%", "MemUsage": "1.5GiB / 119.7GiB"})
    stopped = json.dumps({"Name": "old", "CPUPerc": "--", "MemUsage": "-- / --"})
    s = p.parse_docker_stats(line + "\n" + stopped)
    assert s["vllm"] == (12.34, int(1.5 * 1024**3), round(119.7 * 1024**3))
    assert s["old"] == (None, None, None)


# --------------------------------------------------------------------------------- ray


def test_ray_status_head_only():
    r = p.parse_ray_status(fx("ray/ray_status_head_only.txt"))
    assert r == RayStatus(active_nodes=1, pending_nodes=0, cpus_total=2.0, cpus_used=0.0,
                          gpus_total=0.0, gpus_used=0.0)  # Ray omits a resource it has none of


def test_ray_status_two_nodes_busy():
    r = p.parse_ray_status(fx("ray/ray_status_two_nodes_busy.txt"))
    assert r == RayStatus(active_nodes=2, pending_nodes=0, cpus_total=3.0, cpus_used=2.0,
                          gpus_total=3.0, gpus_used=2.0)


def test_ray_status_no_cluster():
    reasons: dict[str, str] = {}
    assert p.parse_ray_status(fx("ray/ray_status_no_cluster.txt"), reasons=reasons) == RayStatus()
    assert "Could not find any running Ray instance" in reasons["ray"]


def test_ray_status_pending_and_idle_synthetic():
    # SYNTHETIC, in the layout of the real files: an autoscaler with typed nodes, one launching
    # and an Idle section, plus a per-node Usage block (ray status -v) that must not count.
    text = """\
======== Autoscaler status: 2026-01-01 00:00:00 ========
Node status
---------------------------------------------------------------
Active:
 1 ray.head.default
Idle:
 1 ray.worker.spark
Pending:
 ray.worker.spark, 2 launching
 10.0.0.3: ray.worker.spark, setting up
Recent failures:
 (no failures)

Resources
---------------------------------------------------------------
Total Usage:
 1.0/40.0 CPU
 2.0/2.0 GPU
 0B/221.76GiB memory

Node: abc
 Usage:
  9.0/20.0 CPU
  1.0/1.0 GPU
"""
    r = p.parse_ray_status(text)
    assert (r.active_nodes, r.pending_nodes) == (2, 3)
    assert (r.cpus_used, r.cpus_total, r.gpus_used, r.gpus_total) == (1.0, 40.0, 2.0, 2.0)


# --------------------------------------------------------------------------------- df, uptime, host


def test_df_real():
    d = p.parse_df(fx("h200x2/df_root.txt"))
    assert (d.mount, d.total_bytes, d.used_bytes, d.available_bytes) == (
        "/", 270553174016, 17286995968, 137421418496)


def test_df_this_machine():
    out = subprocess.run(["df", "-B1", "-P", "/"], capture_output=True, text=True, timeout=10).stdout
    d = p.parse_df(out)
    assert d.mount == "/" and d.total_bytes and d.total_bytes >= d.used_bytes


def test_uptime_real():
    u = p.parse_uptime(fx("h200x2/uptime_loadavg.txt"))
    assert (u.uptime_s, u.load1, u.load5, u.load15) == (92.81, 0.15, 0.03, 0.01)
    r: dict[str, str] = {}
    assert p.parse_uptime("cat: /proc/uptime: No such file or directory", reasons=r) == p.Uptime()
    assert "uptime" in r


def test_host_facts():
    uname = real_fixture("h200/uname.txt")  # uname -a; -srm is a subset of its words
    words = uname.split()
    assert p.parse_uname(f"{words[0]} {words[2]} {words[-2]}") == ("6.18.44-fc-v657-gpu", "x86_64")
    assert p.parse_nproc(real_fixture("h200/nproc.txt")) == 16
    assert p.parse_hostname("vm\n") == "vm"
    assert p.parse_docker_version("20.10.24+dfsg1\n") == "20.10.24+dfsg1"
    assert p.parse_docker_version(NOT_FOUND.replace("nvidia-smi", "docker")) is None
    assert p.parse_nproc("sh: 1: nproc: not found") is None
