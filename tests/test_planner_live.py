"""Node memory for the planner from LIVE nodes: a real OpenSSH sshd (tests/lab) runs the real probe
on this machine, so the plan's node memory must be this machine's own MemTotal.

Nothing is mocked: the probe goes through SshTransport to the lab sshd and reads /proc/meminfo.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sparkconsole.cli import main
from sparkconsole.config import ClusterConfig, NodeConfig
from sparkconsole.planner.budget import DEFAULT_NODE_MEMORY_GIB
from sparkconsole.planner.live import LiveMemory, NodeMemory, memory_from_states, probe_node_memory
from sparkconsole.planner.plan import JSON_KEYS, PlanOptions, node_memory_from_cluster, plan
from sparkconsole.planner.spec import load_spec
from sparkconsole.sim import start_demo_cluster
from tests.lab.sshd import LabSshd, free_port

Q122 = "Qwen/Qwen3.5-122B-A10B-FP8"
GIB = float(1 << 30)


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("SPARKCONSOLE_CONFIG", raising=False)


def memtotal_gib() -> float:
    m = re.search(r"^MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
    assert m
    return int(m.group(1)) * 1024 / GIB


def dead_node(name: str = "spark-gone") -> NodeConfig:
    """A node nobody listens for (a free port on loopback): connection refused at once."""
    return NodeConfig(name=name, host="127.0.0.1", port=free_port(), user="root")


def write_config(path: Path, *nodes: NodeConfig) -> Path:
    blocks = []
    for n in nodes:
        lines = ["[[nodes]]", f'name = "{n.name}"', f'host = "{n.host}"', f"port = {n.port}"]
        for key in ("user", "identity", "known_hosts", "ssh_config"):
            value = getattr(n, key)
            if value:
                lines.append(f'{key} = "{value}"')
        blocks.append("\n".join(lines))
    path.write_text('[cluster]\nname = "lab"\n\n' + "\n\n".join(blocks) + "\n")
    return path


def plan_json(capsys, *args: str) -> tuple[int, dict, str]:
    rc = main(["plan", *args, "--json"])
    out, err = capsys.readouterr()
    return rc, json.loads(out) if out.strip() else {}, err


def kv_gib_for(node_memory_gib: float, tp: int = 2, **kw) -> float:
    return plan(load_spec(Q122), PlanOptions(tp=tp, nodes=tp, node_memory_gib=node_memory_gib, **kw)).kv_cache_gib_per_node


# ---- the probe layer: one real node -----------------------------------------------------------


@pytest.mark.sshd
async def test_live_node_memory_is_this_machines_memtotal(sshd: LabSshd) -> None:
    live = await probe_node_memory(ClusterConfig(nodes=(sshd.node_config("spark-a"),)))
    assert [n.node for n in live.nodes] == ["spark-a"]
    node = live.nodes[0]
    assert node.error is None
    assert node.total_gib == pytest.approx(memtotal_gib(), abs=1e-9)
    assert live.gib == pytest.approx(memtotal_gib(), abs=1e-9)
    assert node.available_gib is not None and 0 < node.available_gib <= node.total_gib
    assert live.unreachable == []
    assert "live:" in live.source and "spark-a" in live.source


@pytest.mark.sshd
def test_node_memory_from_cluster_hook(sshd: LabSshd) -> None:
    """The sync hook the CLI contract names: the smallest MemTotal, None without a cluster."""
    assert node_memory_from_cluster(None) is None
    assert node_memory_from_cluster(ClusterConfig(nodes=())) is None
    got = node_memory_from_cluster(ClusterConfig(nodes=(sshd.node_config("spark-a"),)))
    assert got == pytest.approx(memtotal_gib(), abs=1e-9)
    assert node_memory_from_cluster(ClusterConfig(nodes=(dead_node(),)), timeout=5) is None


@pytest.mark.sshd
async def test_nodes_of_different_memory_the_smallest_wins(sshd: LabSshd) -> None:
    """Two node entries on the lab sshd (this machine) and a simulated GB10 behind its own SSH server
    (MemTotal 119.70 GiB): every node is read, and since the totals differ, taking the largest, or
    the first listed, would give another figure than the smallest. The larger node is listed first."""
    async with start_demo_cluster(nodes=1) as demo:
        gb10 = demo.config.nodes[0]
        here = (sshd.node_config("spark-a", role="worker"), sshd.node_config("spark-b", role="worker"))
        sim_gib = (await probe_node_memory(ClusterConfig(nodes=(gb10,)))).gib
        assert sim_gib is not None and abs(sim_gib - memtotal_gib()) > 1.0  # the two machines really differ
        nodes = (gb10, *here) if sim_gib > memtotal_gib() else (*here, gb10)
        live = await probe_node_memory(ClusterConfig(nodes=nodes))
    assert [n.node for n in live.read] == [n.name for n in nodes]
    totals = {n.node: n.total_gib for n in live.read}
    mine = pytest.approx(memtotal_gib(), abs=1e-9)
    assert totals == {gb10.name: pytest.approx(sim_gib, abs=1e-9), "spark-a": mine, "spark-b": mine}
    smallest = min(sim_gib, memtotal_gib())
    assert live.gib == pytest.approx(smallest, abs=1e-9)
    assert live.gib != pytest.approx(totals[nodes[0].name], abs=0.5)  # neither the first nor the largest
    named = gb10.name if sim_gib < memtotal_gib() else "spark-a"  # the first of the smallest
    assert live.source.endswith(f"smallest MemTotal of 3 node(s) ({named})")
    assert all(n.name in live.notes()[0] for n in nodes)


async def test_unreachable_node_falls_back_with_a_reason() -> None:
    live = await probe_node_memory(ClusterConfig(nodes=(dead_node("spark-gone"),)), timeout=5)
    assert live.gib is None and live.effective_gib == DEFAULT_NODE_MEMORY_GIB
    notes = live.notes(0.85)
    assert len(notes) == 1
    assert notes[0].startswith("node spark-gone unreachable: ")
    assert notes[0].endswith("; using 121.69 GiB")
    assert "refused" in notes[0]
    assert "default 121.69 GiB" in live.source


@pytest.mark.sshd
async def test_one_reachable_one_not(sshd: LabSshd) -> None:
    """The unreachable node counts as the default; the reachable one as read; the smallest wins."""
    live = await probe_node_memory(ClusterConfig(nodes=(sshd.node_config("spark-a"), dead_node("spark-b"))),
                                   timeout=5)
    assert live.gib == pytest.approx(min(memtotal_gib(), DEFAULT_NODE_MEMORY_GIB), abs=1e-9)
    notes = live.notes()
    assert any(n.startswith("node spark-b unreachable: ") and n.endswith("using 121.69 GiB for it") for n in notes)
    assert "1 unreachable" in live.source


@pytest.mark.sshd
async def test_memavailable_below_gmu_total_is_reported(sshd: LabSshd) -> None:
    live = await probe_node_memory(ClusterConfig(nodes=(sshd.node_config("spark-a"),)))
    node = live.nodes[0]
    # MemAvailable is always below 1.0 x MemTotal: reported, with drop_caches.
    note = [n for n in live.notes(1.0) if "MemAvailable" in n]
    assert len(note) == 1
    assert note[0].startswith(f"node spark-a: MemAvailable {node.available_gib:.2f} GiB is below")
    assert "drop_caches" in note[0]
    # ... and never below a tiny fraction of it.
    assert not [n for n in live.notes(0.001) if "MemAvailable" in n]


def test_memory_from_states_is_defensive() -> None:
    """Objects without samples, without memory, or DOWN with an old sample all count as unreachable."""

    class Bare:
        name = "bare"

    class Mem:
        total_bytes = int(100 * GIB)
        available_bytes = int(50 * GIB)
        page_cache_bytes = int(30 * GIB)
        unified = True

    class Sample:
        memory = Mem()
        gpus = ()

    class Status:
        def __init__(self, value: str) -> None:
            self.value = value

    class Up:
        name = "up"
        sample = Sample()
        status = Status("up")

    class Down:
        name = "down"
        sample = Sample()
        status = Status("down")
        reason = "connection lost"

    live = memory_from_states([Bare(), Up(), Down()])
    assert [n.node for n in live.read] == ["up"]
    assert live.gib == 100.0  # min(100 read, 121.69 assumed for the unreachable ones)
    notes = live.notes(0.85)
    assert "node down unreachable: connection lost; using 121.69 GiB for it" in notes
    assert "node bare unreachable: no sample; using 121.69 GiB for it" in notes
    assert any(n.startswith("node up: MemAvailable 50.00 GiB is below gpu_memory_utilization 0.85 x 100.00")
               and "page cache holds 30.00 GiB" in n for n in notes)
    assert LiveMemory((NodeMemory("x", error="e"),)).gib is None


# ---- `sparkconsole plan --config FILE`: end to end through the CLI ------------------------------


@pytest.mark.sshd
def test_plan_config_uses_the_live_memtotal(sshd: LabSshd, tmp_path: Path, capsys) -> None:
    cfg = write_config(tmp_path / "cluster.toml", sshd.node_config("spark-a"))
    rc, j, err = plan_json(capsys, Q122, "--tp", "2", "--config", str(cfg))
    assert rc == (0 if j["fits"] else 1), err
    assert tuple(j) == JSON_KEYS
    mem = memtotal_gib()
    assert f"budget per node: 0.85 x {mem:.2f} GiB" in " ".join(j["reasons"])
    assert any(r.startswith(f"node memory {mem:.2f} GiB from the live nodes") for r in j["reasons"])
    assert j["kv_cache_gib_per_node"] == pytest.approx(round(kv_gib_for(mem), 3), abs=1e-3)


@pytest.mark.sshd
def test_plan_config_text_shows_node_memory(sshd: LabSshd, tmp_path: Path, capsys) -> None:
    cfg = write_config(tmp_path / "cluster.toml", sshd.node_config("spark-a"))
    rc = main(["plan", Q122, "--tp", "2", "--config", str(cfg)])
    out, _ = capsys.readouterr()
    assert rc in (0, 1)
    assert re.search(rf"node memory\s+│\s+{memtotal_gib():.2f} GiB", out), out


@pytest.mark.sshd
def test_plan_config_gmu_above_memavailable_reports_it(sshd: LabSshd, tmp_path: Path, capsys) -> None:
    cfg = write_config(tmp_path / "cluster.toml", sshd.node_config("spark-a"))
    rc, j, err = plan_json(capsys, Q122, "--tp", "2", "--config", str(cfg), "--gpu-memory-utilization", "1.0",
                           "--force")
    assert rc in (0, 1), err
    assert any(r.startswith("node spark-a: MemAvailable ") and "drop_caches" in r for r in j["reasons"])


def test_plan_config_unreachable_is_one_line_exit_3(tmp_path: Path, capsys) -> None:
    """A node of the named cluster that does not answer: its memory is what the plan is about, so
    one line and exit 3 (like every command that cannot reach a node), never a plan for a guess."""
    cfg = write_config(tmp_path / "cluster.toml", dead_node("spark-gone"))
    rc, j, err = plan_json(capsys, Q122, "--tp", "2", "--config", str(cfg), "--probe-timeout", "5")
    assert rc == 3 and j == {}
    assert err.count("\n") == 1 and err.startswith("sparkconsole: error: spark-gone")
    assert "--node-memory-gib" in err


def test_plan_local_reads_this_machine(capsys) -> None:
    """--local: the same probe without SSH, on this machine."""
    rc, j, err = plan_json(capsys, Q122, "--tp", "2", "--local")
    assert rc in (0, 1), err
    assert f"0.85 x {memtotal_gib():.2f} GiB" in " ".join(j["reasons"])


def test_plan_node_memory_flag_wins_and_nothing_is_probed(tmp_path: Path, capsys) -> None:
    """--node-memory-gib with --config: no probe at all (a dead node would otherwise add a reason)."""
    cfg = write_config(tmp_path / "cluster.toml", dead_node("spark-gone"))
    rc, j, err = plan_json(capsys, Q122, "--tp", "2", "--config", str(cfg), "--node-memory-gib", "100")
    assert rc in (0, 1), err
    text = " ".join(j["reasons"])
    assert "unreachable" not in text and "live nodes" not in text
    assert "0.85 x 100.00 GiB" in text


def test_plan_without_cluster_keeps_the_default(capsys) -> None:
    rc, j, _ = plan_json(capsys, Q122, "--tp", "2")
    assert rc == 0
    text = " ".join(j["reasons"])
    assert "0.85 x 121.69 GiB" in text and "live nodes" not in text


def test_plan_broken_config_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[[nodes]]\nname = 'a'\nport = 'x'\n")
    rc = main(["plan", Q122, "--config", str(bad), "--json"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and "port" in err


@pytest.mark.sshd
def test_plan_adhoc_host_unknown_key_is_exit_3(sshd: LabSshd, tmp_path: Path, capsys, monkeypatch) -> None:
    """`--host` cannot carry the lab's known_hosts: the host key is unknown, so the node is unreachable
    for the planner: one line that says so and exit 3 (never a crash, never a plan on a guess)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.ssh of the user's
    rc, j, err = plan_json(capsys, Q122, "--tp", "2", "--host", f"root@{sshd.host}:{sshd.port}",
                           "--probe-timeout", "10")
    assert rc == 3 and j == {}
    assert err.count("\n") == 1 and err.startswith(f"sparkconsole: error: {sshd.host}"), err


@pytest.mark.sshd
def test_plan_config_real_process(sshd: LabSshd, tmp_path: Path) -> None:
    """The installed command in its own process (its own event loop) with --config."""
    cfg = write_config(tmp_path / "cluster.toml", sshd.node_config("spark-a"))
    exe = shutil.which("sparkconsole", path=str(Path(sys.executable).parent))
    cmd = [exe] if exe else [sys.executable, "-m", "sparkconsole.cli"]
    env = {**os.environ, "SPARKCONSOLE_STATE_DIR": str(tmp_path / "s"), "HF_HUB_OFFLINE": "1"}
    env.pop("SPARKCONSOLE_CONFIG", None)
    p = subprocess.run([*cmd, "plan", Q122, "--tp", "2", "--config", str(cfg), "--json"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert p.returncode in (0, 1), p.stderr
    j = json.loads(p.stdout)
    assert f"0.85 x {memtotal_gib():.2f} GiB" in " ".join(j["reasons"])


def test_plan_demo_uses_the_simulated_nodes(capsys) -> None:
    """--demo: the simulated Sparks answer the same probe; their MemTotal is the plan's."""
    rc, j, err = plan_json(capsys, Q122, "--tp", "2", "--demo")
    assert rc in (0, 1), err
    first = next(r for r in j["reasons"] if r.startswith("node memory "))
    assert "from the live nodes" in first
    gib = float(first.split()[2])
    assert 100 < gib < 130
    assert f"0.85 x {gib:.2f} GiB" in " ".join(j["reasons"])


@pytest.mark.sshd
def test_plan_a_configured_cluster_needs_no_flag(sshd: LabSshd, tmp_path: Path, capsys, monkeypatch) -> None:
    """"Node memory from the live node when a cluster is configured": $SPARKCONSOLE_CONFIG is enough."""
    cfg = write_config(tmp_path / "cluster.toml", sshd.node_config("spark-lab"))
    monkeypatch.setenv("SPARKCONSOLE_CONFIG", str(cfg))
    rc, j, err = plan_json(capsys, Q122, "--tp", "2")
    assert rc == (0 if j["fits"] else 1), err
    mem = memtotal_gib()
    assert any(r.startswith(f"node memory {mem:.2f} GiB from the live nodes") for r in j["reasons"])
    assert j["kv_cache_gib_per_node"] == pytest.approx(round(kv_gib_for(mem), 3), abs=1e-3)
