"""One deployment session, opened the same way by the CLI, the console and the tests
(:mod:`sparkconsole.deploy.opening`): the per-cluster lock, the one rule for an earlier
deployment, and the session's own opening and closing.

The lock is tested where it lives (two holders in one process: ``flock`` locks belong to open
file descriptions, so two opens conflict as two processes would) and end to end: ``demo --serve``
in one process, two ``sparkconsole deploy --auto`` at once against it with one state directory
(the second refused at once, naming the first), then the first stopped and a third let through.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sparkconsole.config import ClusterConfig, NodeConfig
from sparkconsole.deploy.decisions import ScriptedAnswers
from sparkconsole.deploy.flow import Options
from sparkconsole.deploy.opening import ClusterLock, find_earlier, lock_name, open_deployment
from sparkconsole.deploy.state import DeploymentState, StateStore
from sparkconsole.errors import UserError
from sparkconsole.transport.base import CommandResult
from tests.test_deploy_demo import demo_cluster

ROOT = Path(__file__).resolve().parents[1]
DEPLOYMENT = "20261201-212233-ab12"


# ---- the lock ------------------------------------------------------------------------------------

def test_a_second_holder_is_refused_at_once_naming_the_first(tmp_path):
    with ClusterLock("demo", DEPLOYMENT, directory=tmp_path), pytest.raises(UserError) as refused:
        ClusterLock("demo", "20261201-212300-cd34", directory=tmp_path).acquire()
    err = refused.value
    assert err.exit_code == 1
    assert "\n" not in err.message
    assert err.message.startswith("another deployment wizard holds cluster 'demo': ")
    assert f"pid {os.getpid()} on {socket.gethostname()}, deployment {DEPLOYMENT}, since " in err.message
    assert re.search(r"since \d\d:\d\d:\d\d UTC; wait for it or stop it$", err.message), err.message


def test_another_cluster_is_another_lock(tmp_path):
    with ClusterLock("demo", DEPLOYMENT, directory=tmp_path), \
            ClusterLock("lab", "20261201-212300-cd34", directory=tmp_path) as other:
        assert other.held
    assert lock_name("my sparks/1") != lock_name("my_sparks_1")  # odd names never share a lock
    assert "/" not in lock_name("../../etc/passwd") and not lock_name("..").startswith(".")


def test_a_stale_lock_is_taken_over_and_said(tmp_path):
    gone = _a_gone_pid()
    path = tmp_path / lock_name("demo")
    path.write_text(json.dumps({"host": "laptop", "pid": gone, "deployment": DEPLOYMENT,
                                "since": "2020-01-02T21:22:33+00:00"}))
    notes: list[str] = []
    with ClusterLock("demo", "20261202-080000-ef56", directory=tmp_path, on_note=notes.append) as lock:
        assert len(notes) == 1
        assert notes[0].startswith(f"taking over the lock of pid {gone} (gone) on laptop")
        assert DEPLOYMENT in notes[0] and "2020-01-02 21:22:33 UTC" in notes[0]
        holder = lock.holder()
        assert holder is not None and holder.pid == os.getpid() and holder.deployment == "20261202-080000-ef56"


def test_released_on_close_and_a_clean_release_is_not_stale(tmp_path):
    first = ClusterLock("demo", DEPLOYMENT, directory=tmp_path)
    first.acquire()
    first.release()
    first.release()  # twice is harmless
    assert first.holder() is None  # the file names nobody once released
    notes: list[str] = []
    with ClusterLock("demo", "20261202-080000-ef56", directory=tmp_path, on_note=notes.append) as again:
        assert again.held
    assert notes == []


# ---- the one rule for an earlier deployment ------------------------------------------------------

MODEL = Options().model


def _saved(store: StateStore, ident: str, *, model: str = MODEL, cluster: str = "demo",
           result: str | None = None) -> DeploymentState:
    st = DeploymentState(id=ident, model=model, cluster=cluster, result=result)
    store.save(st)
    return st


def test_find_earlier_takes_the_newest_of_this_cluster_and_model_never_a_torn_down_one(tmp_path):
    store = StateStore(tmp_path / "deployments")
    assert find_earlier(store, "demo", MODEL) is None  # nothing saved yet (no folder either)
    _saved(store, "20261201-080000-0001", result="stopped")
    _saved(store, "20261201-090000-0002", result="served")
    _saved(store, "20261201-100000-0003", model="Qwen/Qwen3-0.6B")  # another model: ignored
    _saved(store, "20261201-110000-0004", cluster="lab")  # another cluster: ignored
    _saved(store, "20261201-120000-0005", result="torn-down")  # over: never resumed
    (store.root / "20261201-130000-0006.json").write_text("{not json")  # unreadable: skipped
    earlier = find_earlier(store, "demo", MODEL)
    assert earlier is not None and earlier.id == "20261201-090000-0002"  # the newest; served counts
    assert find_earlier(store, "demo", "Qwen/Qwen3-0.6B").id == "20261201-100000-0003"
    _saved(store, "20261201-140000-0007")  # unfinished, newer
    assert find_earlier(store, "demo", MODEL).id == "20261201-140000-0007"
    assert find_earlier(store, "elsewhere", MODEL) is None


# ---- the session: lock, transports, runner, flow; all closed on exit -----------------------------

@dataclass
class FakeTransport:
    node: str
    closed: list[str] = field(default_factory=list)
    connected: bool = True  # the console's own tick reads these of every transport
    last_error: str | None = None
    sent: list[str] = field(default_factory=list)

    async def run(self, cmd, timeout: float = 30.0, input: str | None = None):
        """The session itself sends only the cluster's lock on the head: taken at the opening,
        released at the end, answered as a free head answers (tests/test_head_lock.py runs them on
        the simulated head); anything else is a bug."""
        summary = getattr(cmd, "summary", "")
        if "cluster's lock on this head" not in summary:
            raise AssertionError(f"the session sends nothing by itself: {summary or cmd}")
        self.sent.append(summary.split(" (", 1)[0])
        return CommandResult(cmd.shell(), 0, "released\n" if summary.startswith("release") else "taken\n", "", 0.0)

    async def close(self) -> None:
        self.closed.append(self.node)


CONFIG = ClusterConfig(nodes=(NodeConfig("spark-a", "127.0.0.1", role="head"), NodeConfig("spark-b", "127.0.0.1")),
                       name="demo")


async def test_the_session_holds_the_lock_and_closes_everything_on_exit(tmp_path):
    closed: list[str] = []
    made: dict[str, FakeTransport] = {}

    def factory(n: NodeConfig) -> FakeTransport:
        made[n.name] = FakeTransport(n.name, closed)
        return made[n.name]

    state = DeploymentState.new(MODEL, Options().to_json(), CONFIG.name)
    with pytest.raises(RuntimeError, match="boom"):
        async with open_deployment(CONFIG, Options(), state, answer=ScriptedAnswers({}, auto=True),
                                   emit=lambda e: None, locks=tmp_path, transport_factory=factory) as session:
            assert set(session.transports) == {"spark-a", "spark-b"}
            assert session.head_lock is not None and session.head_lock.held  # the head holds it too
            assert session.runner.transports is session.transports and session.flow.runner is session.runner
            assert session.state is state and session.runner.state is state
            with pytest.raises(UserError, match=f"deployment {state.id}"):
                ClusterLock("demo", "x", directory=tmp_path).acquire()
            raise RuntimeError("boom")  # however the session ends, it closes
    assert sorted(closed) == ["spark-a", "spark-b"]
    assert made["spark-a"].sent == ["take the cluster's lock on this head while the wizard runs",
                                     "release the cluster's lock on this head"]  # the head's lock, released
    assert made["spark-b"].sent == []  # only the head holds it
    with ClusterLock("demo", "x", directory=tmp_path) as after:
        assert after.held


async def test_plan_only_takes_no_lock_and_a_refusal_opens_nothing(tmp_path):
    opened: list[str] = []

    def factory(n: NodeConfig) -> FakeTransport:
        opened.append(n.name)
        return FakeTransport(n.name)

    state = DeploymentState.new(MODEL, Options().to_json(), CONFIG.name)
    with ClusterLock("demo", DEPLOYMENT, directory=tmp_path):
        async with open_deployment(CONFIG, Options(), state, answer=ScriptedAnswers({}, auto=True),
                                   emit=lambda e: None, plan_only=True, locks=tmp_path,
                                   transport_factory=factory) as session:
            assert session.lock is None and session.head_lock is None and session.runner.plan_only
        assert opened == ["spark-a", "spark-b"]
        opened.clear()
        with pytest.raises(UserError, match=DEPLOYMENT):
            async with open_deployment(CONFIG, Options(), state, answer=ScriptedAnswers({}, auto=True),
                                       emit=lambda e: None, locks=tmp_path, transport_factory=factory):
                raise AssertionError("not reached")  # pragma: no cover
        assert opened == []  # refused before a node was touched


# ---- the console's wizard: the same opener, the same rule, the same refusal -------------------------

async def test_the_wizard_resumes_by_the_one_rule_and_is_refused_while_another_run_holds_the_cluster(
        tmp_path, monkeypatch):
    from sparkconsole.journal import Journal
    from sparkconsole.ui.app import SparkConsoleApp
    from sparkconsole.ui.screens.wizard import WizardScreen

    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    store = StateStore()
    _saved(store, "20261201-080000-0001", result="stopped")  # the one Enter resumes
    _saved(store, "20261201-090000-0002", result="torn-down")
    _saved(store, "20261201-100000-0003", model="Qwen/Qwen3-0.6B")
    opened: list[str] = []

    def factory(n: NodeConfig) -> FakeTransport:
        opened.append(n.name)
        return FakeTransport(n.name)

    app = SparkConsoleApp(CONFIG, transport_factory=factory, autopoll=False, remember_theme=False,
                          journal=Journal(tmp_path / "journal.jsonl"))
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.pause()
        await pilot.press("w")
        await pilot.pause()
        wizard = app.screen
        assert isinstance(wizard, WizardScreen)
        before = len(opened)  # the poller's own transports
        with ClusterLock(CONFIG.name, DEPLOYMENT):  # another run holds the cluster
            await pilot.press("enter")
            deadline = time.monotonic() + GUARD_S
            while wizard.running or not wizard.error:
                assert time.monotonic() < deadline, "waited for the refusal"
                await pilot.pause(0.05)
        assert wizard.state is not None and wizard.state.id == "20261201-080000-0001"
        assert f"pid {os.getpid()} on {socket.gethostname()}, deployment {DEPLOYMENT}" in wizard.error
        assert wizard.result_text().plain.startswith("✗ another deployment wizard holds cluster 'demo'")
        assert any("another deployment wizard holds" in n.message for n in app._notifications)
        assert len(opened) == before  # refused before a node was touched


# ---- end to end: two `sparkconsole deploy` at once on one served demo ----------------------------

DEMO_SPEED = "20"  # slow enough that the first run is still at work when the second starts
GUARD_S = 120.0  # a generous guard for each wait on a loaded machine (never a measured duration)


def _env(state: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["SPARKCONSOLE_STATE_DIR"] = str(state)
    env["HF_HUB_OFFLINE"] = "1"
    env.pop("SPARKCONSOLE_CONFIG", None)
    return env


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "sparkconsole.cli", *args]


@contextmanager
def served_demo(tmp_path: Path) -> Iterator[str]:
    """``demo --serve`` running (tests/test_deploy_demo.py's), slow enough to overlap; yields its inventory."""
    with demo_cluster(tmp_path, speed=DEMO_SPEED) as found:
        yield found["config"]


def _wait(cond, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + GUARD_S
    while not cond():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: the first run ended first (rc {proc.returncode}): "
                                 f"{proc.stderr.read() if proc.stderr else ''}")
        assert time.monotonic() < deadline, f"waited {GUARD_S:.0f} s for {what}"
        time.sleep(0.1)


def _lock_holder(state: Path) -> dict | None:
    for path in (state / "locks").glob("*.lock"):
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None
    return None


@pytest.mark.timeout(400)
def test_a_second_deploy_on_the_same_cluster_is_refused_naming_the_first_until_it_ends(tmp_path):
    state = tmp_path / "state"
    with served_demo(tmp_path) as inventory:
        first = subprocess.Popen(_cli("deploy", "--config", inventory, "--auto", "--json"), cwd=ROOT, env=_env(state),
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 text=True)
        try:
            # the first holds the lock and has saved its state: its id is the state file's name
            _wait(lambda: list((state / "deployments").glob("*.json")) and _lock_holder(state), "the first's lock",
                  first)
            holder = _lock_holder(state)
            assert holder is not None and holder["pid"] == first.pid
            first_id = holder["deployment"]
            assert [p.stem for p in (state / "deployments").glob("*.json")] == [first_id]

            second = subprocess.run(_cli("deploy", "--config", inventory, "--auto", "--json"), cwd=ROOT,
                                    env=_env(state), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                    timeout=GUARD_S)
            assert first.poll() is None, "the first run must still be at work"
            assert second.returncode == 1, (second.stdout[-2000:], second.stderr[-2000:])
            err = second.stderr.strip()
            assert len(err.splitlines()) == 1 and "Traceback" not in second.stderr
            assert err.startswith("sparkconsole: error: another deployment wizard holds cluster 'demo-story': ")
            assert f"pid {first.pid} on {socket.gethostname()}, deployment {first_id}, since " in err
            assert err.endswith("wait for it or stop it")
            assert not [json.loads(x) for x in second.stdout.splitlines() if '"command"' in x]  # nothing sent
            assert [p.stem for p in (state / "deployments").glob("*.json")] == [first_id]  # nothing saved

            first.terminate()  # SIGTERM: gone without a word, its lock dropped by the OS
            first.wait(timeout=GUARD_S)
        finally:
            if first.poll() is None:
                first.kill()
                first.wait()

        third = subprocess.run(_cli("deploy", "--config", inventory, "--auto", "--until", "recon", "--json"),
                               cwd=ROOT, env=_env(state), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                               timeout=GUARD_S * 2)
    assert third.returncode == 0, (third.stdout[-2000:], third.stderr[-2000:])
    events = [json.loads(x) for x in third.stdout.splitlines() if x.startswith("{")]
    notes = [e["text"] for e in events if e["event"] == "note"]
    assert any(n.startswith(f"taking over the lock of pid {first.pid} (gone)") and first_id in n for n in notes), notes
    assert _lock_holder(state) is None  # released on the way out


def _a_gone_pid() -> int:
    """A pid no process has now (a child that has exited and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid

