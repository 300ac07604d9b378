"""`sparkconsole snapshot`: one probe of every node, through the real transport, as JSON or lines."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sparkconsole.cli import main


def _meminfo_total_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal")


def test_local_json_is_this_machines_real_memory(capsys):
    assert main(["snapshot", "--local", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (node,) = data["nodes"]
    assert node["status"] == "up"
    assert node["sample"]["memory"]["total_bytes"] == _meminfo_total_bytes()
    assert node["sample"]["meminfo"]["mem_total_bytes"] == _meminfo_total_bytes()


def test_demo_link_down_raises_the_alerts(capsys):
    assert main(["snapshot", "--demo", "--scenario", "link-down", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [n["node"] for n in data["nodes"]] == ["spark-1a32", "spark-5be3"]
    for node in data["nodes"]:
        assert node["sample"]["gpus"][0]["name"] == "NVIDIA GB10"
        assert all(link["state"] == "down" for link in node["sample"]["links"])
    assert {(a["node"], a["text"]) for a in data["alerts"]} == {
        ("spark-1a32", "ConnectX-7 link down: no twin is Up"),
        ("spark-5be3", "ConnectX-7 link down: no twin is Up"),
    }


def test_demo_lines_as_a_real_process():
    exe = Path(sys.executable).parent / "sparkconsole"
    out = subprocess.run([str(exe), "snapshot", "--demo"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("spark-1a32") and "NVIDIA GB10" in lines[0] and "links up 2/4" in lines[0]
    assert lines[1].startswith("spark-5be3")


def test_bad_arguments_are_one_line(capsys):
    assert main(["snapshot", "--demo", "--nodes", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--nodes" in err
