"""Lost work and teardown (issue 23, items 4, 5, 7 and 8), on the simulated cluster behind real SSH:

- a detached job is found on the node by its key alone (an identity file the job writes itself: pid,
  boot id, start time), so a console killed between sending the start and saving the pid re-attaches
  on resume instead of starting a second download beside the first;
- a reboot that hands the job's pid to a stranger reads as "lost", never as the job still running,
  and a wait has an overall deadline;
- teardown stops the deployment's jobs that still run, and a streamed copy ends when its download is
  gone without an exit code (it used to re-run rsync every 5 s for ever);
- ``deploy --teardown``/``--resume`` take only a state of this cluster (``latest`` is per cluster)
  and teardown asks before each change, as the forward run does.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from sparkconsole import remote as R
from sparkconsole.deploy.decisions import ScriptedAnswers
from sparkconsole.deploy.flow import Flow, Options
from sparkconsole.deploy.runner import Runner, Settings, StepFailed
from sparkconsole.deploy.state import DeploymentState, Started, StateStore
from sparkconsole.deploy.teardown import Teardown
from sparkconsole.errors import UserError
from sparkconsole.sim import start_demo_cluster
from sparkconsole.transport import node_transport
from sparkconsole.transport.base import CommandResult

ROOT = Path(__file__).resolve().parent.parent
SPEED = 40.0
JOB_DIR = "/home/nvidia/.cache/sparkconsole/jobtest"


@asynccontextmanager
async def sim_runner(tmp_path: Path, lose_start: bool = False) -> AsyncIterator[tuple[Any, Any]]:
    """The demo cluster and a factory of runners over real SSH to it (one per "console run"); with
    ``lose_start`` the first detached start reaches the node but its answer is lost (the console was
    killed, or its connection dropped, before it saved the pid)."""
    async with start_demo_cluster(speed=SPEED) as demo:
        config = demo.config
        opened: list[Any] = []

        def runner(state: DeploymentState, lose: bool = False, **settings: Any) -> Runner:
            transports = {}
            for n in config.nodes:
                t = node_transport(config, n)
                opened.append(t)
                if lose:
                    real = t.run

                    async def run(cmd: Any, *a: Any, _real=real, **kw: Any) -> CommandResult:
                        res = await _real(cmd, *a, **kw)
                        if "setsid nohup" in cmd.shell():
                            return CommandResult(cmd.shell(), None, "", "connection lost", res.duration_s)
                        return res

                    t.run = run  # type: ignore[method-assign]
                transports[n.name] = t
            events: list[Any] = []
            r = Runner(config=config, state=state, transports=transports, answer=ScriptedAnswers({}, auto=True),
                       emit=events.append, store=StateStore(tmp_path / "deployments"),
                       settings=Settings(poll_s=0.05, speed=SPEED, **settings))
            r.events = events  # type: ignore[attr-defined]
            return r

        try:
            yield demo, runner
        finally:
            for t in opened:
                await t.close()


def _jobs(demo: Any, node: str, word: str) -> list[Any]:
    return demo.sim.proc_table(node).matching(lambda p: word in p.cmdline and p.argv[0] == "sleep")


async def test_a_start_whose_answer_was_lost_is_found_by_its_key_and_never_started_twice(tmp_path):
    async with sim_runner(tmp_path) as (demo, runner):
        head = demo.config.nodes[0].name
        state = DeploymentState.new("Q/M", {}, demo.config.name)
        first = runner(state, lose=True)
        with pytest.raises(StepFailed, match="could not start"):
            await first.start_job(head, "weights-download", R.command("sleep", "777"), JOB_DIR)
        assert "weights-download" not in state.jobs  # the pid was never saved
        assert len(_jobs(demo, head, "777")) == 1  # yet the job runs on the node

        resumed = runner(DeploymentState.from_json(json.loads(json.dumps(state.to_json()))))
        job = await resumed.start_job(head, "weights-download", R.command("sleep", "777"), JOB_DIR)
        assert len(_jobs(demo, head, "777")) == 1  # re-attached: no second download beside the first
        assert job.pid == _jobs(demo, head, "777")[0].pgid  # the job: the sh -c that setsid made a group leader
        assert any("re-attached" in getattr(e, "text", "") for e in resumed.events)
        assert not [e for e in resumed.events if getattr(e, "mutating", False)]  # nothing was sent


async def test_a_reboot_that_hands_the_jobs_pid_to_a_stranger_reads_as_lost(tmp_path):
    async with sim_runner(tmp_path) as (demo, runner):
        head = demo.config.nodes[0].name
        r = runner(DeploymentState.new("Q/M", {}, demo.config.name))
        job = await r.start_job(head, "weights-download", R.command("sleep", "888"), JOB_DIR)
        demo.sim.reboot(head, next_pid=job.pid)
        stranger = demo.sim.proc_table(head).spawn(["sleep", "999999"])  # takes the job's pid
        assert stranger.pid == job.pid
        rc = await asyncio.wait_for(r.wait_job(job), timeout=60)
        assert rc == -1  # "kill -0 PID" said running: the wait never ended
        # and the saved job is started again on resume, not re-attached to the stranger
        again = await r.start_job(head, "weights-download", R.command("sleep", "888"), JOB_DIR)
        assert again.pid != stranger.pid and len(_jobs(demo, head, "888")) == 1


async def test_a_wait_gives_up_at_its_deadline_and_says_the_job_runs_on(tmp_path):
    async with sim_runner(tmp_path) as (demo, runner):
        head = demo.config.nodes[0].name
        r = runner(DeploymentState.new("Q/M", {}, demo.config.name), job_deadline_s=30.0)
        job = await r.start_job(head, "image-copy", R.command("sleep", "100000"), JOB_DIR)
        with pytest.raises(StepFailed) as failed:
            await asyncio.wait_for(r.wait_job(job), timeout=60)
        assert "has not ended after 30 s" in failed.value.message and "--resume" in failed.value.fix
        assert len(_jobs(demo, head, "100000")) == 1  # left running, as said


async def test_teardown_stops_the_jobs_that_still_run_and_asks_first(tmp_path):
    async with sim_runner(tmp_path) as (demo, runner):
        head = demo.config.nodes[0].name
        state = DeploymentState.new("Q/M", Options().to_json(), demo.config.name)
        r = runner(state)
        await r.start_job(head, "weights-download", R.command("sleep", "4444"), JOB_DIR)
        done = await r.start_job(head, "weights-copy-x", R.command("true"), JOB_DIR)
        assert await r.wait_job(done) == 0
        asked: list[list[str]] = []

        async def confirm(step: str, commands: Any) -> bool:
            asked.append([c.shell() for _n, c in commands])
            return True

        r.confirm = confirm
        await Teardown(Flow(r, Options())).run()
        assert _jobs(demo, head, "4444") == []
        assert len(asked) == 1 and [c for c in asked[0] if c.startswith("kill -TERM --")] == asked[0]
        assert len(asked[0]) == 1  # the job that ended is not "stopped" again
        assert state.jobs == {} and state.result == "torn-down"


async def test_a_streamed_copy_ends_when_its_download_is_gone_without_an_exit_code(tmp_path):
    async with sim_runner(tmp_path) as (demo, runner):
        head = demo.config.nodes[0].name
        r = runner(DeploymentState.new("Q/M", {}, demo.config.name))
        download = await r.start_job(head, "weights-download", R.command("sleep", "5555"), JOB_DIR)
        src = "/home/nvidia/.cache/sparkconsole"
        copy_cmd = R.stream_copy(R.rsync_dir(src, "nvidia@127.0.0.1", "/tmp/dst"),
                                 R.JobFiles.under(JOB_DIR, "weights-download"), every_s=5)
        copy = await r.start_job(head, "weights-copy-x", copy_cmd, JOB_DIR)
        # the download's shell dies without writing its exit code (kill -9 of the whole group)
        demo.sim.proc_table(head).signal(-download.pid, 9)
        rc = await asyncio.wait_for(r.wait_job(copy), timeout=60)
        assert rc == 1  # the copy loop saw its download gone and ended, instead of polling for ever


def test_latest_is_kept_per_cluster_and_a_state_of_another_cluster_is_refused(tmp_path):
    store = StateStore(tmp_path)
    a = DeploymentState.new("Q/M", {}, "lab-a")
    b = DeploymentState.new("Q/M", {}, "lab b/odd")
    store.save(a)
    store.save(b)
    assert store.load(cluster="lab-a").id == a.id and store.load(cluster="lab b/odd").id == b.id
    with pytest.raises(UserError, match="made on cluster 'lab-a', not on 'lab b/odd'"):
        store.load(a.id, cluster="lab b/odd")
    with pytest.raises(UserError, match="no deployment to resume on cluster 'lab-c'"):
        store.load(cluster="lab-c")


def _cli(state: Path, *args: str, stdin: Any = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SPARKCONSOLE_STATE_DIR=str(state))
    env.pop("SPARKCONSOLE_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "sparkconsole.cli", "deploy", *args], cwd=ROOT, env=env,
                          stdin=stdin, capture_output=True, text=True, timeout=120)


def _state_naming(state_dir: Path, cluster: str) -> DeploymentState:
    """A deployment that says it started ``vllm-glm`` on the demo's head (the demo runs a container of
    that name: acting on this state would remove a service nobody deployed)."""
    st = DeploymentState.new("Qwen/Qwen3.5-122B-A10B-FP8", Options().to_json(), cluster)
    st.started.append(Started("spark-1a32", "container", "vllm-glm"))
    StateStore(state_dir / "deployments").save(st)
    return st


def test_teardown_of_another_clusters_state_is_refused_and_sends_nothing(tmp_path):
    st = _state_naming(tmp_path, "lab-a")
    r = _cli(tmp_path, "--demo", "--teardown", st.id, "--yes")
    assert r.returncode == 2, r.stderr
    assert "made on cluster 'lab-a', not on 'demo-story'" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "journal.jsonl").exists()


def test_teardown_asks_before_it_removes_anything(tmp_path):
    st = _state_naming(tmp_path, "demo-story")
    r = _cli(tmp_path, "--demo", "--teardown", st.id)  # stdin is not a terminal and no --yes
    assert r.returncode == 1, r.stderr
    assert "would change the nodes" in r.stderr and "docker rm" not in r.stdout
    assert not (tmp_path / "journal.jsonl").exists()
    r = _cli(tmp_path, "--demo", "--teardown", "--yes")  # the latest of this cluster, confirmed
    assert r.returncode == 0, r.stderr + r.stdout
    journal = [json.loads(x) for x in (tmp_path / "journal.jsonl").read_text().splitlines()]
    assert [j["command"] for j in journal] == ["docker rm -f vllm-glm"]


def test_a_state_naming_a_node_the_inventory_lacks_is_one_line_not_a_traceback(tmp_path):
    st = DeploymentState.new("Qwen/Qwen3.5-122B-A10B-FP8", Options().to_json(), "demo-story")
    st.started.append(Started("spark-gone", "container", "sparkconsole-vllm-x"))
    StateStore(tmp_path / "deployments").save(st)
    r = _cli(tmp_path, "--demo", "--resume", "--yes")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().endswith("lacks: spark-gone; run it with the inventory it was made with")
