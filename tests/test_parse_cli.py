"""`sparkconsole parse KIND FILE|-`: one JSON object with exactly the contract's keys.

Fixture headers (`# source:` ...) are stripped and the text written to tmp_path, as a real saved
output would be; one test keeps a prompt line to show it is ignored.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sparkconsole.cli import main
from tests.conftest import FIXTURES, REAL, strip_fixture_header

ROOT = Path(__file__).resolve().parent.parent
EXE = ROOT / ".venv" / "bin" / "sparkconsole"

GPU_KEYS = {"index", "name", "temperature_c", "power_w", "power_limit_w", "memory_used_mib",
            "memory_total_mib", "utilization_pct", "pstate"}
PROC_KEYS = {"gpu", "pid", "type", "name", "memory_mib"}
MEMINFO_KEYS = {"mem_total_bytes", "mem_available_bytes", "mem_free_bytes", "cached_bytes", "buffers_bytes",
                "swap_total_bytes", "swap_free_bytes"}
RAY_KEYS = {"active_nodes", "pending_nodes", "cpus_total", "cpus_used", "gpus_total", "gpus_used"}
VLLM_KEYS = {"state", "failure_kind", "shards_done", "shards_total", "model_load_gib", "kv_cache_gib",
             "kv_cache_tokens", "max_concurrency", "port", "vllm_version"}
METRICS_KEYS = {"kind", "model", "engine", "version", "requests_running", "requests_waiting", "kv_cache_usage",
                "prompt_tokens_total", "generation_tokens_total", "preemptions_total",
                "prefix_cache_queries_total", "prefix_cache_hits_total", "gen_throughput", "histograms"}


def check_contract(kind: str, data: dict) -> None:
    """Exactly the keys of the ARCHITECTURE.md contract table for ``kind``."""
    if kind == "nvidia-smi":
        assert set(data) == {"driver_version", "cuda_version", "gpus", "processes"}
        assert all(set(g) == GPU_KEYS for g in data["gpus"])
        assert all(set(pr) == PROC_KEYS for pr in data["processes"])
    elif kind == "nvidia-smi-csv":
        assert set(data) == {"rows"} and all(isinstance(r, dict) for r in data["rows"])
    elif kind == "meminfo":
        assert set(data) == MEMINFO_KEYS
    elif kind == "ibdev2netdev":
        assert set(data) == {"links"}
        assert all(set(link) == {"rdma_device", "port", "netdev", "state"} for link in data["links"])
        assert all(link["state"] in ("up", "down", None) for link in data["links"])
    elif kind == "docker-ps":
        assert set(data) == {"containers"}
        assert all(set(c) == {"id", "name", "image", "state", "status"} for c in data["containers"])
    elif kind == "ray-status":
        assert set(data) == RAY_KEYS
    elif kind == "vllm-log":
        assert set(data) == VLLM_KEYS
    elif kind == "vllm-metrics":
        assert set(data) == {"engines"}
        assert all(set(e) == METRICS_KEYS for e in data["engines"])
        assert all(set(e["histograms"]) == {"ttft", "itl", "e2e", "queue_time"} for e in data["engines"])
    elif kind == "ib-ports":
        assert set(data) == {"ports"}
    elif kind == "ip-addr":
        assert set(data) == {"interfaces"}
    elif kind == "docker-stats":
        assert set(data) == {"containers"}
    else:  # pragma: no cover
        raise AssertionError(kind)


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["parse", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def ok_cli(capsys, *argv: str) -> str:
    rc, out, err = run_cli(capsys, *argv)
    assert rc == 0, err
    return out


def stripped(tmp_path: Path, path: Path) -> Path:
    dest = tmp_path / path.name
    dest.write_text(strip_fixture_header(path.read_text(encoding="utf-8")), encoding="utf-8")
    return dest


# Every relevant fixture for every kind.
CASES = [
    ("nvidia-smi", REAL / "gb10/nvidia-smi_gb10_idle_desktop.txt"),
    ("nvidia-smi", REAL / "h200/nvsmi_idle.txt"),
    ("nvidia-smi", FIXTURES / "h200x2/nvsmi_idle_x2.txt"),
    ("nvidia-smi", FIXTURES / "h200x2/nvsmi_2procs_x2.txt"),
    ("nvidia-smi-csv", REAL / "gb10/nvidia-smi_query-gpu_csv_header_partial_gb10.txt"),
    ("nvidia-smi-csv", REAL / "gb10/nvidia-smi_query-compute-apps_vllm_gb10.txt"),
    ("nvidia-smi-csv", REAL / "h200/nvsmi_query_idle.txt"),  # noheader: rows [] (no field names)
    ("nvidia-smi-csv", FIXTURES / "h200x2/nvsmi_query_gpu_csv_x2.txt"),
    ("nvidia-smi-csv", FIXTURES / "h200x2/nvsmi_query_gpu_csv_x2_nounits.txt"),
    ("nvidia-smi-csv", FIXTURES / "h200x2/nvsmi_query_apps_csv_x2.txt"),
    ("nvidia-smi-csv", FIXTURES / "h200x2/nvsmi_query_apps_csv_x2_gpu.txt"),
    ("nvidia-smi-csv", FIXTURES / "h200x2/nvsmi_query_apps_csv_none_x2.txt"),
    ("meminfo", FIXTURES / "h200x2/proc_meminfo.txt"),
    ("meminfo", Path("/proc/meminfo")),
    ("ibdev2netdev", REAL / "gb10/ibdev2netdev_port1_up.txt"),
    ("ibdev2netdev", FIXTURES / "h200x2/ibdev2netdev.txt"),  # "command not found"
    ("docker-ps", REAL / "gb10/docker_ps_format_gb10.txt"),
    ("docker-ps", FIXTURES / "docker/docker_ps_json_20.10.txt"),
    ("ray-status", FIXTURES / "ray/ray_status_head_only.txt"),
    ("ray-status", FIXTURES / "ray/ray_status_two_nodes_busy.txt"),
    ("ray-status", FIXTURES / "ray/ray_status_no_cluster.txt"),
    ("ip-addr", REAL / "gb10/ip_addr_show_enp1s0f1np1_static.txt"),
    ("ip-addr", REAL / "gb10/ip-s_link_show_gb10_qsfp_nocarrier.txt"),
    ("ip-addr", REAL / "h200/ipjson.txt"),
    ("docker-stats", FIXTURES / "docker/docker_stats_json_20.10.txt"),
    *[("vllm-log", f) for f in sorted((REAL / "vllm-logs").glob("*.log"))],
    *[("vllm-metrics", f) for f in sorted((REAL / "metrics").glob("*.prom"))],
]


@pytest.mark.parametrize(("kind", "path"), CASES, ids=[f"{k}:{p.name}" for k, p in CASES])
def test_every_fixture_gives_contract_keys(capsys, tmp_path, kind, path):
    src = stripped(tmp_path, path) if path.is_relative_to(FIXTURES) else path
    rc, out, err = run_cli(capsys, kind, str(src))
    assert rc == 0, err
    assert out.count("\n") == 1  # exactly one JSON object, one line
    check_contract(kind, json.loads(out))


def test_values_gb10_nvidia_smi(capsys, tmp_path):
    out = ok_cli(capsys, "nvidia-smi", str(stripped(tmp_path, REAL / "gb10/nvidia-smi_gb10_idle_desktop.txt")))
    data = json.loads(out)
    assert data["driver_version"] == "580.126.09" and data["cuda_version"] == "13.0"
    assert data["gpus"] == [{"index": 0, "name": "NVIDIA GB10", "temperature_c": 41, "power_w": 4,
                             "power_limit_w": None, "memory_used_mib": None, "memory_total_mib": None,
                             "utilization_pct": 0, "pstate": "P8"}]
    assert data["processes"][0] == {"gpu": 0, "pid": 2804, "type": "G", "name": "/usr/lib/xorg/Xorg",
                                    "memory_mib": 179}


def test_values_csv_units_and_na(capsys, tmp_path):
    out = ok_cli(capsys, "nvidia-smi-csv",
                  str(stripped(tmp_path, REAL / "gb10/nvidia-smi_query-gpu_csv_header_partial_gb10.txt")))
    assert json.loads(out) == {"rows": [{"name": "NVIDIA GB10", "memory.total": None, "memory.free": None,
                                         "memory.used": None, "col4": 39, "col5": 3.74}]}
    out = ok_cli(capsys, "nvidia-smi-csv",
                  str(stripped(tmp_path, REAL / "gb10/nvidia-smi_query-compute-apps_vllm_gb10.txt")))
    assert json.loads(out) == {"rows": [{"pid": 37388, "process_name": "VLLM::EngineCore",
                                         "used_gpu_memory": 109832}]}


def test_values_vllm_log_matches_expected(capsys, tmp_path):
    expected = {e["file"]: e for e in json.loads((REAL / "vllm-logs/expected.json").read_text())}
    name = "02-dgx-spark-nemotron-hybrid-nv2601-ready.log"
    out = ok_cli(capsys, "vllm-log", str(stripped(tmp_path, REAL / "vllm-logs" / name)))
    data = json.loads(out)
    assert data["state"] == expected[name]["final_state"]
    assert data["port"] == expected[name]["listen_port"]


def test_prompt_line_is_ignored(capsys):
    """The fixture as stored, header and the doc's `nvidia@dxg-spark-1:~$ ibdev2netdev` prompt kept."""
    rc, out, _ = run_cli(capsys, "ibdev2netdev", str(REAL / "gb10/ibdev2netdev_port1_up.txt"))
    links = json.loads(out)["links"]
    assert rc == 0 and len(links) == 4
    assert {(x["rdma_device"], x["netdev"]) for x in links if x["state"] == "up"} == {
        ("rocep1s0f1", "enp1s0f1np1"), ("roceP2p1s0f1", "enP2p1s0f1np1")}


def test_stdin(capsys, monkeypatch):
    text = strip_fixture_header((FIXTURES / "ray/ray_status_two_nodes_busy.txt").read_text())
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    rc, out, _ = run_cli(capsys, "ray-status", "-")
    assert rc == 0
    assert json.loads(out) == {"active_nodes": 2, "pending_nodes": 0, "cpus_total": 3.0, "cpus_used": 2.0,
                               "gpus_total": 3.0, "gpus_used": 2.0}


def test_missing_file_exit_2_one_line(capsys, tmp_path):
    rc, out, err = run_cli(capsys, "meminfo", str(tmp_path / "nope.txt"))
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and "nope.txt" in err and "Traceback" not in err


def test_directory_exit_2(capsys, tmp_path):
    rc, out, err = run_cli(capsys, "meminfo", str(tmp_path))
    assert rc == 2 and out == "" and err.count("\n") == 1


@pytest.mark.parametrize("data", [b"\x7fELF\x02\x01\x01\x00\x00\x00", b"MemTotal: \xff\xfe 1 kB\n"],
                         ids=["nul-bytes", "not-utf8"])
def test_binary_exit_2(capsys, tmp_path, data):
    f = tmp_path / "blob"
    f.write_bytes(data)
    rc, out, err = run_cli(capsys, "meminfo", str(f))
    assert rc == 2 and out == "" and err.count("\n") == 1


@pytest.mark.parametrize("kind", ["nvidia-smi", "nvidia-smi-csv", "meminfo", "ibdev2netdev", "docker-ps",
                                  "ray-status", "vllm-log", "vllm-metrics", "ib-ports", "ip-addr",
                                  "docker-stats"])
@pytest.mark.parametrize("text", ["", "hello world\n", "sh: 1: tool: not found\n", "| | |\n,,,\n{]\n"],
                         ids=["empty", "words", "not-found", "junk"])
def test_odd_text_exit_0_with_nulls(capsys, tmp_path, kind, text):
    f = tmp_path / "odd.txt"
    f.write_text(text)
    rc, out, err = run_cli(capsys, kind, str(f))
    assert rc == 0, err
    data = json.loads(out)
    check_contract(kind, data)
    for v in data.values():  # nothing invented: every value is null, an empty list, or "unknown"
        assert v in (None, [], "unknown")


def test_unknown_kind_exit_2(capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        main(["parse", "lspci", str(tmp_path)])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_real_subprocess(tmp_path):
    """The installed console script, as other tools call it, with a file and with stdin."""
    assert EXE.exists()
    src = stripped(tmp_path, REAL / "gb10/nvidia-smi_query-compute-apps_vllm_gb10.txt")
    proc = subprocess.run([str(EXE), "parse", "nvidia-smi-csv", str(src)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["rows"][0]["used_gpu_memory"] == 109832
    proc = subprocess.run([str(EXE), "parse", "meminfo", "-"], input=Path("/proc/meminfo").read_text(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and set(json.loads(proc.stdout)) == MEMINFO_KEYS
    proc = subprocess.run([str(EXE), "parse", "meminfo", str(tmp_path / "missing")], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1
    proc = subprocess.run([str(EXE), "parse", "nope", "-"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
