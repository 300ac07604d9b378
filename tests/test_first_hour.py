"""The first hour with the console: what a newcomer meets before anything is deployed.

The wizard's plan and ``sparkconsole plan`` agree on the same cluster; an unreachable node is one line
and exit 3; an unknown model offline is one line at once; Ctrl-C while Python is still importing is
one line and exit 130; ``demo --serve``'s suggested command works as printed; ``--plan-only`` says
what it cannot know; a node without Ray shows Ray absent, not as a reading that failed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkconsole.cli import main
from sparkconsole.probe.assemble import RAY_ABSENT, assemble_sample
from sparkconsole.probe.samples import RayStatus
from sparkconsole.probe.script import SectionOutput
from tests.conftest import strip_fixture_header
from tests.demo_support import read_until, stop_demo
from tests.lab.sshd import free_port
from tests.proc_support import line_reader

ROOT = Path(__file__).resolve().parents[1]
FP8 = "Qwen/Qwen3.5-122B-A10B-FP8"
SSH = "/usr/bin/ssh"
GUARD_S = 120.0  # a guard against a hang, never a bound on speed

pytestmark = pytest.mark.timeout(400)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SPARKCONSOLE_CONFIG", "HF_HUB_OFFLINE")}
    env.update(SPARKCONSOLE_STATE_DIR=str(tmp_path / "state"), XDG_CONFIG_HOME=str(tmp_path / "xdg"),
               LANG="C.UTF-8", **extra)
    return env


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("SPARKCONSOLE_CONFIG", raising=False)
    return tmp_path


@pytest.fixture(scope="module")
def plan_only_events(tmp_path_factory) -> list[dict]:
    """One ``deploy --demo --plan-only --json`` run (its own process), its events."""
    tmp = tmp_path_factory.mktemp("plan-only")
    r = subprocess.run([sys.executable, "-m", "sparkconsole.cli", "deploy", "--demo", "--plan-only", "--model", FP8,
                        "--json"], cwd=ROOT, env=_env(tmp, HF_HUB_OFFLINE="1"), stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=GUARD_S * 2)
    assert r.returncode == 0, r.stderr
    return [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]


# ---- 1. the wizard plans with the nodes' live memory, as `plan --demo` does --------------------


def test_wizard_plan_only_agrees_with_the_planner_on_the_demo(plan_only_events, isolated, capsys) -> None:
    notes = [e["text"] for e in plan_only_events if e.get("event") == "note" and e["step"] == "plan"]
    final = next(n for n in notes if n.startswith("plan: TP=2,"))
    # the wizard's gmu (the field's at the model's full context: docs/wizard.md), given to the planner
    gmu = re.search(r"--gpu-memory-utilization ([\d.]+)", final).group(1)
    rc = main(["plan", FP8, "--demo", "--tp", "2", "--gpu-memory-utilization", gmu, "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    planner = json.loads(out)
    budget = next(m for r in planner["reasons"]
                  if (m := re.match(rf"budget per node: {re.escape(gmu)} x ([\d.]+) GiB", r)))
    live_gib = budget.group(1)
    assert any(r.startswith(f"node memory {live_gib} GiB from the live nodes") for r in planner["reasons"])

    layout = next(e for e in plan_only_events if e.get("event") == "decision" and e["id"] == "plan.layout")
    tp2 = next(m for m in layout["measured"] if m.startswith("TP=2:"))
    assert (f"{planner['kv_cache_gib_per_node']:.1f} GiB KV, {planner['max_concurrency']:.1f}x concurrency"
            in tp2), tp2
    tp1 = next(m for m in layout["measured"] if m.startswith("TP=1:"))
    assert f"({gmu} of {live_gib} GiB)" in tp1, tp1
    assert any(n.startswith(f"plan: node memory {live_gib} GiB from the live nodes") for n in notes), notes
    assert f"{planner['kv_cache_gib_per_node']:.1f} GiB KV per node, {planner['max_concurrency']:.1f}x" in final


# ---- 5. --plan-only says what it cannot know ---------------------------------------------------


def test_plan_only_ends_with_what_it_cannot_know(plan_only_events) -> None:
    assert plan_only_events[-1]["event"] == "result" and plan_only_events[-1]["ok"] is True
    last_note = plan_only_events[-2]
    assert last_note["event"] == "note", plan_only_events[-3:]
    assert "deploy --rehearse" in last_note["text"]
    assert "caches step" in last_note["text"] and "canary" in last_note["text"]
    assert sum("--rehearse" in e.get("text", "") for e in plan_only_events) == 1  # said once, at the end


# ---- 2. an unreachable node: one line, exit 3 --------------------------------------------------


@pytest.mark.parametrize("as_json", [False, True])
def test_plan_with_an_unreachable_host_is_one_line_exit_3(isolated, capsys, as_json: bool) -> None:
    port = free_port()
    rc = main(["plan", FP8, "--tp", "2", "--host", f"127.0.0.1:{port}", "--probe-timeout", "5",
               *(["--json"] if as_json else [])])
    out, err = capsys.readouterr()
    assert rc == 3, (out, err)
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("sparkconsole: error: 127.0.0.1")
    assert f"127.0.0.1:{port}" in err and "--node-memory-gib" in err


def test_plan_unreachable_host_with_node_memory_given_still_plans(isolated, capsys) -> None:
    """--node-memory-gib plans without the nodes: nothing is probed, so nothing is unreachable."""
    rc = main(["plan", FP8, "--tp", "2", "--host", f"127.0.0.1:{free_port()}", "--node-memory-gib", "100",
               "--json"])
    out, err = capsys.readouterr()
    assert rc in (0, 1), err
    assert "0.85 x 100.00 GiB" in " ".join(json.loads(out)["reasons"])


# ---- 3. offline with an unknown model: one line, no retries ------------------------------------


def test_unknown_model_with_the_hub_unreachable_is_one_line_without_retries(isolated, capsys, monkeypatch) -> None:
    for k in ("HF_HUB_OFFLINE", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)  # huggingface_hub's back-off sleeps here between retries
    rc = main(["plan", "SomeOrg/Unknown-Model"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert err.count("\n") == 1, err
    assert "SomeOrg/Unknown-Model: cannot reach the Hugging Face Hub" in err
    assert slept == []  # not one retry


def test_unknown_model_unreachable_hub_real_process_prints_one_line(tmp_path) -> None:
    """The installed command in its own process: huggingface_hub's own warnings would be lines too."""
    env = _env(tmp_path, HF_ENDPOINT=f"http://127.0.0.1:{free_port()}")
    for k in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        env.pop(k, None)
    r = subprocess.run([sys.executable, "-m", "sparkconsole.cli", "plan", "SomeOrg/Unknown-Model"], cwd=ROOT,
                       env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=GUARD_S)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "Retrying" not in r.stderr, r.stderr


# ---- 3b. Ctrl-C while the command is still importing -------------------------------------------

_INTERRUPT_AT_IMPORT = """
import os, signal, sys

class InterruptAt:
    def find_spec(self, name, path=None, target=None):
        if name == TARGET:
            sys.meta_path.remove(self)
            print("interrupting", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, exactly while this module is being imported
        return None

TARGET = sys.argv[1]
sys.meta_path.insert(0, InterruptAt())
sys.argv = ["sparkconsole", "plan", sys.argv[2], "--json"]
from sparkconsole.cli import main
sys.exit(main())
"""


@pytest.mark.parametrize("module", [
    "sparkconsole.dependency_warnings",  # imported by the entry point itself, before main() runs
    "sparkconsole.commands.plan",  # imported by main() while it builds the parser
])
def test_ctrl_c_while_importing_is_one_line_exit_130(tmp_path, module: str) -> None:
    r = subprocess.run([sys.executable, "-c", _INTERRUPT_AT_IMPORT, module, FP8], cwd=ROOT,
                       env=_env(tmp_path, HF_HUB_OFFLINE="1"), stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, timeout=GUARD_S)
    assert r.stderr.startswith("interrupting\n"), r.stderr  # the interrupt came where the test meant it
    assert r.returncode == 130, r.stderr
    assert r.stdout == ""
    assert r.stderr == "interrupting\nsparkconsole: interrupted\n"


# ---- 4. demo --serve: the suggested command works as printed -----------------------------------


@pytest.mark.skipif(not os.access(SSH, os.X_OK), reason="no OpenSSH client at /usr/bin/ssh")
def test_demo_serve_suggestion_runs_as_printed(tmp_path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "sparkconsole.cli", "demo", "--serve"], cwd=ROOT,
                            env=_env(tmp_path), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        printed = read_until(proc, line_reader(proc.stdout), lambda p: any(s.startswith("Try:") for s in p),
                             "demo --serve's suggestion")
        suggestion = next(s for s in printed if s.startswith("Try:"))
        m = re.match(r"^Try: (ssh .*? nvidia-smi)\b", suggestion)
        assert m, suggestion
        argv = shlex.split(m.group(1))
        login = argv[-2]
        assert login.endswith("@127.0.0.1") and login != "root@127.0.0.1", suggestion  # the stock login: nvidia
        r = subprocess.run([SSH, *argv[1:]], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=GUARD_S, start_new_session=True)
        assert r.returncode == 0, r.stderr
        assert "NVIDIA GB10" in r.stdout, r.stdout
    finally:
        stop_demo(proc, signal.SIGINT)


# ---- 6. a node without Ray: Ray absent, not "not read" ----------------------------------------


def _ray(text: str, rc: int | None):
    return assemble_sample("spark-a", 1.0, {"ray-status": SectionOutput("ray-status", text, rc)})


def test_no_running_ray_instance_is_ray_absent() -> None:
    """Ray 2.60's own output with no cluster (tests/fixtures/ray): ConnectionError ... RAY_ADDRESS."""
    text = strip_fixture_header((ROOT / "tests/fixtures/ray/ray_status_no_cluster.txt").read_text())
    assert "RAY_ADDRESS" in text
    s = _ray(text, 1)
    assert s.ray == RAY_ABSENT and s.ray.active_nodes == 0 and s.ray.gpus_total is None
    assert "ray" not in s.unknown and not any("RAY_ADDRESS" in v for v in s.unknown.values())


@pytest.mark.parametrize("text,rc", [("sh: 1: ray: not found\n", 127), ("bash: ray: command not found\n", 127),
                                     ("timeout: failed to run command 'ray': No such file or directory\n", 127)])
def test_ray_not_installed_is_ray_absent(text: str, rc: int) -> None:
    s = _ray(text, rc)
    assert s.ray == RAY_ABSENT and "ray" not in s.unknown


def test_a_ray_that_fails_otherwise_is_still_not_read() -> None:
    """A timeout, or a crash that is not "no instance", stays a reading that failed, with its reason."""
    s = _ray("", 124)
    assert s.ray is None and "timed out" in s.unknown["ray"]
    s = _ray("Traceback (most recent call last):\n  File \"x\"\nRuntimeError: GCS lost\n", 1)
    assert s.ray is None and "GCS lost" in s.unknown["ray"]


def test_a_running_ray_is_read_as_before() -> None:
    text = strip_fixture_header((ROOT / "tests/fixtures/ray/ray_status_two_nodes_busy.txt").read_text())
    s = _ray(text, 0)
    assert isinstance(s.ray, RayStatus) and s.ray != RAY_ABSENT and s.ray.active_nodes == 2
