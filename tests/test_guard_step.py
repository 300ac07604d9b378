"""The wizard's ``guard`` step on the demo cluster, as an operator runs it (``demo --serve`` in one
process, ``deploy --config FILE --json`` in another): the memory guard's watcher armed on every node
before the engine starts, shown first and journaled, skipped when it is already in place; on the
``prefill-squeeze`` twin, the watcher itself (the node's shell running it, not the console) stops the
engine before the head runs out of memory and says why; and teardown leaves nothing of it.

Waits are on conditions, bounded in the node's own time (``/proc/uptime``: the demo's clock runs
fast), with a wall guard only against a hang."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from sparkconsole.probe.memory_guard import GuardStatus, floors, parse_guard_status
from sparkconsole.remote import GUARD_MARK, GuardFiles, memory_guard_status
from sparkconsole.sim.scenarios import SQUEEZE_SERVED_AT, SQUEEZE_SPAN
from tests.test_deploy_demo import demo_cluster, deploy, ssh, steps

pytestmark = pytest.mark.timeout(400)
HANG_GUARD_S = 120.0  # wall seconds: a guard against a hang, never a bound on speed
WATCHER = "sparkguar[d]"  # pgrep -f's pattern for the watcher, which its own command line does not match


def _state(state_dir: Path, ident: str | None = None) -> dict:
    paths = sorted((state_dir / "deployments").glob("*.json"))
    path = next(p for p in paths if ident is None or p.stem == ident)
    return json.loads(path.read_text())


def _status(cmdline: str, files: GuardFiles, extra: str = "") -> tuple[GuardStatus, str]:
    """What ``memory_guard_status`` says on the node (as the console reads it), and the rest of the output."""
    out = ssh(cmdline, memory_guard_status(files).shell() + extra)
    st = parse_guard_status(out)
    assert st is not None, out
    return st, out


def _kib(out: str, key: str) -> int:
    m = re.search(rf"^{key}:\s+(\d+) kB$", out, re.M)
    assert m, out
    return int(m.group(1))


def _uptime(out: str) -> float:
    m = re.search(r"^(\d+\.\d+) \d+\.\d+$", out, re.M)
    assert m, out
    return float(m.group(1))


def test_armed_before_serve_shown_and_journaled_skipped_again_and_removed_by_teardown(tmp_path):
    state = tmp_path / "state"
    with demo_cluster(tmp_path) as demo:
        nodes = sorted(k for k in demo if k.startswith("spark-"))
        # --plan-only lists the watcher's start on every node, with the rest of what the run would send
        rc, planned, err = deploy(tmp_path / "plan-state", "--config", demo["config"], "--plan-only")
        assert rc == 0, err
        shown = [e for e in planned if e["event"] == "planned" and e["step"] == "guard"]
        assert sorted(e["node"] for e in shown) == nodes and all(GUARD_MARK in e["command"] for e in shown)

        rc, events, err = deploy(state, "--config", demo["config"], "--auto")
        assert rc == 0, (err, events[-3:])
        st = _state(state)
        short = st["id"].replace("-", "")[-8:]
        # before the engine starts: the guard step ends before the serve step begins
        order = [(e["step"], e["state"]) for e in events if e["event"] == "step"]
        assert order.index(("guard", "done")) < order.index(("serve", "running"))
        assert steps(events)["guard"] == "done"
        # each arm was shown before it was sent, sent once per node, and journaled under its step
        cmds = [e for e in events if e["event"] == "command" and e["step"] == "guard" and e["mutating"]]
        before = sorted((e["node"], e["command"]) for e in cmds if e["rc"] is None)
        after = sorted((e["node"], e["command"]) for e in cmds if e["rc"] == 0)
        assert before == after and [n for n, _c in before] == nodes
        assert all(GUARD_MARK in c and "sudo" not in c for _n, c in before)
        journal = [json.loads(x) for x in (state / "journal.jsonl").read_text().splitlines()]
        assert sorted((j["node"], j["command"]) for j in journal if j["step"] == "guard") == before
        # the state keeps each watcher: the engine's container on its node is what it may stop
        engine = f"sparkconsole-vllm-{short}"  # the story's native start: one vLLM container per node
        assert sorted(g["node"] for g in st["guards"]) == nodes
        assert all(g["targets"] == [engine] and g["job_dir"].endswith(f"/sparkconsole/{short}") for g in st["guards"])
        for g in st["guards"]:
            files = GuardFiles.under(g["job_dir"])
            status, out = _status(demo[g["node"]], files, "; grep MemTotal /proc/meminfo; pgrep -f " + WATCHER)
            assert status.armed and status.running and status.level in ("ok", "warn") and status.event is None, out
            # its floors are the node's own (MemTotal), as the policy makes them
            warn, hard = floors(_kib(out, "MemTotal") * 1024)
            assert f" warn_kib={warn // 1024} hard_kib={hard // 1024} " in out, out
            assert str(g["pid"]) in out.split()  # the watcher runs under the pid the state kept

        # run again: the model is served, its guard with it; the step is skipped and sends nothing
        rc, again, err = deploy(state, "--config", demo["config"], "--auto")
        assert rc == 0, (err, again[-3:])
        assert steps(again)["guard"] == "skipped"
        assert not [e for e in again if e["event"] == "command" and e["step"] == "guard" and e["mutating"]]

        rc, down, err = deploy(state, "--config", demo["config"], "--teardown", st["id"], "--auto")
        assert rc == 0, (err, down[-3:])
        removed = [e for e in down if e["event"] == "command" and e["mutating"] and e["rc"] == 0
                   and e["summary"] == "remove the memory guard"]
        assert sorted(e["node"] for e in removed) == nodes
        assert _state(state, st["id"])["guards"] == []
        for g in st["guards"]:
            files = GuardFiles.under(g["job_dir"])
            status, out = _status(demo[g["node"]], files, f"; ls -a {g['job_dir']}; pgrep -f {WATCHER}; echo rc=$?")
            assert not status.armed and not status.running and status.level == "" and status.event is None, out
            assert "memguard" not in out and out.rstrip().endswith("rc=1"), out  # no file, no process


def test_on_the_squeeze_the_armed_watcher_stops_the_engine_before_memory_runs_out_and_says_why(tmp_path):
    state = tmp_path / "state"
    with demo_cluster(tmp_path, "prefill-squeeze") as demo:
        rc, events, err = deploy(state, "--config", demo["config"], "--auto")
        assert rc == 0 and events[-1]["ok"] and events[-1]["message"] == "served and verified", (err, events[-3:])
        st = _state(state)
        head = next(g for g in st["guards"] if g["node"] == "spark-1a32")  # the story's head, where the prompt comes
        (engine,) = head["targets"]
        files = GuardFiles.under(head["job_dir"])
        probe = "; grep -E '^Mem(Total|Available):' /proc/meminfo; cat /proc/uptime"
        status, out = _status(demo["spark-1a32"], files, probe)
        assert status.armed and status.running and status.event is None, out  # served, and not acted yet
        warn, _hard = floors(_kib(out, "MemTotal") * 1024)
        # the long prompt comes SQUEEZE_SERVED_AT after the engine was ready and would take the head past
        # empty within SQUEEZE_SPAN: read the node until the watcher has acted, for at most that long
        deadline = _uptime(out) + SQUEEZE_SERVED_AT + SQUEEZE_SPAN
        wall = time.monotonic() + HANG_GUARD_S
        low = _kib(out, "MemAvailable")
        while status.event is None:
            assert _uptime(out) < deadline, f"the squeeze came and went and the watcher did not act: {out}"
            assert time.monotonic() < wall, out
            status, out = _status(demo["spark-1a32"], files, probe)
            low = min(low, _kib(out, "MemAvailable"))
            assert low > 0, f"the head ran out of memory before the watcher acted: {out}"
        ev = status.event
        # the watcher stopped the engine (only it: nothing the console did not start) and ended
        assert ev.node == "spark-1a32" and ev.stopped == (engine,) and not status.running, out
        assert ev.cause in ("available memory below the hard floor", "memory pressure stalled the node")
        assert re.search(r"^reason acted node=spark-1a32 cause=(floor|pressure) ", out, re.M), out
        assert ev.available_bytes is not None and ev.available_bytes > 0, out  # what it read when it acted
        assert ev.words().startswith(f"spark-1a32: the memory guard stopped {engine}: ")
        ps = ssh(demo["spark-1a32"], f"docker inspect -f '{{{{.State.Status}}}} {{{{.State.ExitCode}}}}' {engine}")
        assert ps.split() == ["exited", "0"], ps
        # and the head has its memory back (docker stop freed what the prefill held)
        while _kib(out, "MemAvailable") * 1024 <= warn:
            assert _uptime(out) < deadline + SQUEEZE_SPAN and time.monotonic() < wall, out
            out = ssh(demo["spark-1a32"], probe.lstrip("; "))
