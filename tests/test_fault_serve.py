"""Faults during the serve step (issue 14, part 3): the engine's container dies while vLLM loads the
weights, and the log just stops.

- ``docker kill`` of the Ray head's container (where vLLM runs), sent through the head's own SSH
  transport as an operator would type it: the serve step reads the engine's containers with one
  ``docker inspect -f '{{.Name}} {{json .State}}'`` per node, sees exit 137 without ``OOMKilled``,
  calls it ``killed`` while loading shard k of n within a couple of polls (not after the 600 s a
  hang needs), offers "start again", and the flow forms the Ray cluster again and serves.
- the kernel's OOM killer ends the same container (the sim's fault: exit 137, ``OOMKilled`` true,
  the kernel's report in ``journalctl -k``): ``oom``, and "back to the plan" is offered.
- the parser and classifier of :mod:`sparkconsole.deploy.exits` on the output of a real Docker
  engine (``tests/fixtures/docker/docker_inspect_state_20.10.txt``), and the sim's output for the
  same command in the same shape.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparkconsole.deploy import exits
from sparkconsole.errors import ValidationError
from sparkconsole.logs.vllm import VllmLogTracker
from sparkconsole.remote import command, docker_state
from sparkconsole.sim import start_demo_cluster
from sparkconsole.sim.tools.docker import kernel_oom_kill
from sparkconsole.transport import node_transport
from tests.deploy_support import demo_flow

SPEED = 100.0
POLL_SIM_S = 2.0
FIXTURE = Path(__file__).parent / "fixtures" / "docker" / "docker_inspect_state_20.10.txt"
pytestmark = pytest.mark.timeout(300)


# ---- the real engine's output ---------------------------------------------------------------------

def _captured() -> dict[str, tuple[str, str, int]]:
    """The fixture's cases: name -> (stdout, stderr, rc) of ``docker inspect -f '{{.Name}} {{json .State}}'``."""
    cases: dict[str, tuple[str, str, int]] = {}
    name, out, err = None, [], []
    for line in FIXTURE.read_text().splitlines():
        if line.startswith("## "):
            name, out, err = line[3:].split()[0], [], []
        elif name and line.startswith("stderr: "):
            err.append(line[len("stderr: "):])
        elif name and line.startswith("rc: "):
            cases.setdefault(name, ("\n".join(out) + "\n", "\n".join(err) + ("\n" if err else ""), int(line[4:])))
        elif name and not line.startswith("#"):
            out.append(line)
    return cases


def _loading_report(done: int = 12, total: int = 48):
    t = VllmLogTracker()
    t.feed("INFO 03-01 10:00:00 [gpu_model_runner.py:2602] Starting to load model Qwen/Qwen3.5-122B-A10B-FP8...")
    t.feed(f"Loading safetensors checkpoint shards:  {done * 100 // total}% Completed | {done}/{total} "
           "[00:39<01:57,  3.27s/it]")
    return t.report


def test_the_real_engines_states_parse_and_classify_by_exit_code_and_oom_flag():
    cases = _captured()
    assert set(cases) == {"running", "killed", "oom", "segv", "exit1", "missing", "docker"}
    rep = _loading_report()
    assert rep.state == "loading" and (rep.shards_done, rep.shards_total) == (12, 48)
    kinds = {}
    for case in ("running", "killed", "oom", "segv", "exit1", "missing"):
        out, err, rc = cases[case]
        name = f"sctest-state-15012-{case}"
        states = exits.parse_states(out, err, [name])
        st = states[name]
        assert (rc == 1) == (case == "missing")
        death = exits.classify("spark-1a32", st, rep, {"tp": 2, "gmu": 0.85, "max_model_len": 65536})
        kinds[case] = death.kind if death else None
        if death:
            assert "while loading weights, shard 12 of 48" in death.what, death.what
    assert kinds == {"running": None, "killed": "killed", "oom": "oom", "segv": "segfault", "exit1": "exited",
                     "missing": "removed"}
    killed = exits.parse_states(*cases["killed"][:2])["sctest-state-15012-killed"]
    assert (killed.status, killed.exit_code, killed.oom_killed, killed.signal) == ("exited", 137, False, "SIGKILL")
    assert killed.finished_at == "2026-11-30T22:45:02.713306863Z" and killed.pid == 0
    running = exits.parse_states(*cases["running"][:2])["sctest-state-15012-running"]
    assert running.running and running.finished_at == "" and running.pid == 15051 and not running.dead
    oom = exits.classify("spark-1a32", exits.parse_states(*cases["oom"][:2])["sctest-state-15012-oom"], rep,
                         {"tp": 2, "gmu": 0.85, "max_model_len": 65536, "need_gib": 110.2})
    assert "OOM killer" in oom.what and "OOMKilled true" in oom.what
    assert "gpu-memory-utilization 0.85" in oom.advice and "journalctl -k" in oom.advice
    k = exits.classify("spark-1a32", killed, rep)
    assert "earlyoom" in k.advice and "journalctl -k | grep -i oom" in k.advice and "docker kill" in k.advice


def test_the_classifier_names_the_phase_and_defers_an_ordinary_exit_to_the_log():
    st = exits.ContainerState("c", status="exited", exit_code=1, finished_at="2026-11-30T22:45:01Z")
    failed = VllmLogTracker()
    failed.feed("INFO 03-01 10:00:00 [gpu_model_runner.py:2602] Starting to load model m/x...")
    failed.feed("ERROR 03-01 10:00:01 [core.py:708] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                "2.00 GiB. GPU 0 has a total capacity of 119.70 GiB of which 1.02 GiB is free.")
    d = exits.classify("n", st, failed.report)
    assert failed.report.state == "failed" and d.kind == failed.report.failure_kind == "oom"
    assert d.kind not in exits.CONTAINER_KINDS or d.kind == "oom"
    ready = VllmLogTracker()
    ready.feed("INFO:     Application startup complete.")
    assert exits.during(ready.report) == "after ready (it was serving)"
    assert exits.during(None) == "before the engine logged anything"
    assert exits.classify("n", exits.ContainerState("c", status="restarting"), None) is None
    assert exits.classify("n", exits.ContainerState("c", status="created"), None) is None
    # a name docker did not speak of (docker itself did not answer) is unknown, not dead
    assert exits.parse_states("", "Cannot connect to the Docker daemon at unix:///var/run/docker.sock.\n", ["c"]) == {}
    assert exits.parse_state_line("garbage") is None and exits.parse_state_line("/c {not json") is None


def test_the_builder_quotes_the_template_and_refuses_odd_names():
    cmd = docker_state("sparkconsole-ray-1a2b", "x.y")
    assert cmd.shell() == "docker inspect -f '{{.Name}} {{json .State}}' sparkconsole-ray-1a2b x.y"
    assert not cmd.mutating
    for bad in ("a;touch /tmp/x", "$(id)", "-f", ""):
        with pytest.raises(ValidationError):
            docker_state(bad)
    with pytest.raises(ValidationError):
        docker_state()


async def test_the_sim_answers_kill_and_inspect_in_the_real_engines_shape():
    """`docker run`, `docker kill`, `docker inspect -f …` and the OOM fault on a demo node, through
    its SSH transport: the same line shape and State field order as the real engine in the fixture."""
    real = _captured()
    real_keys = list(json.loads(real["killed"][0].split(" ", 1)[1]))
    async with start_demo_cluster(scenario="healthy", speed=SPEED) as demo:
        head = next(iter(demo.sim.nodes))
        t = node_transport(demo.config, demo.config.node(head))
        try:
            img = "vllm/vllm-openai:v0.17.0"
            run = await t.run(command("docker", "run", "-d", "--name", "h3a", "--entrypoint", "sleep", img, "1000"))
            assert run.exit_status == 0, run.stderr
            await t.run(command("docker", "run", "-d", "--name", "h3b", "--entrypoint", "sleep", img, "1000"))
            killed = await t.run(command("docker", "kill", "h3a"))
            assert (killed.exit_status, killed.stdout) == (0, "h3a\n")
            again = await t.run(command("docker", "kill", "h3a"))
            assert again.exit_status == 1 and re.fullmatch(
                r"Error response from daemon: Cannot kill container: h3a: Container [0-9a-f]{64} is not running\n",
                again.stderr)
            nosuch = await t.run(command("docker", "kill", "h3z"))
            assert nosuch.stderr == "Error response from daemon: Cannot kill container: h3z: No such container: h3z\n"
            kernel_oom_kill(demo.sim, head, "h3b")
            res = await t.run(docker_state("h3a", "h3b", "h3z"))
            assert res.exit_status == 1 and res.stderr == "Error: No such object: h3z\n"
            lines = res.stdout.splitlines()
            assert [ln.split(" ", 1)[0] for ln in lines] == ["/h3a", "/h3b"]
            for ln in lines:
                assert list(json.loads(ln.split(" ", 1)[1])) == real_keys  # docker's field order, compact JSON
                assert ", " not in ln and '": ' not in ln
            st = exits.parse_states(res.stdout, res.stderr, ["h3a", "h3b", "h3z"])
            assert (st["h3a"].exit_code, st["h3a"].oom_killed, st["h3a"].status) == (137, False, "exited")
            assert (st["h3b"].exit_code, st["h3b"].oom_killed) == (137, True) and st["h3z"].missing
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z", st["h3a"].finished_at)
            none = await t.run(docker_state("h3z"))
            assert (none.stdout, none.exit_status) == (real["missing"][0], real["missing"][2])  # "\n", 1
            k = await t.run(command("journalctl", "-k"))
            assert "kernel: Out of memory: Killed process" in k.stdout
        finally:
            await t.close()


# ---- the serve step on the demo cluster ------------------------------------------------------------

def run_nodes(events) -> list[str]:
    """The nodes the flow started Ray containers on (every node of the deployment)."""
    return sorted({e.node for _t, e in events if e.kind == "command" and e.mutating and "docker run" in e.command})


async def _serve_fault(tmp_path, fault: str, presets: dict[str, str], on: int = 0):
    """Run the story's flow (auto) over Ray on the demo cluster (the operator's choice: native is the
    default; the head's vLLM 0.17 image has Ray); when the weights are loading (past 20 %), end the Ray
    container of node ``on`` (0: the head, where vLLM runs) with ``fault``; return what the serve step
    did and when."""
    presets = {"engine.image": "nvcr.io/nvidia/vllm:26.03-py3", "cluster.executor": "ray", **presets}
    loading = asyncio.Event()

    def watch(e) -> None:
        if e.kind == "progress" and e.label == "weights" and (e.fraction or 0) > 0.2:
            loading.set()

    async with demo_flow(tmp_path, presets, speed=SPEED, poll_sim_s=POLL_SIM_S, on_event=watch) as run:
        clock, head = run.demo.sim.clock, list(run.demo.sim.nodes)[on]
        await run.until(loading)
        name = run.flow.container("ray")
        killed_at = clock.now()
        if fault == "docker kill":
            res = await run.transports[head].run(command("docker", "kill", name))  # as the operator would
            assert res.exit_status == 0 and res.stdout.strip() == name, res.stderr
        else:
            kernel_oom_kill(run.demo.sim, head, name)
        outcome = await asyncio.wait_for(run.task, 200)
    events = run.events
    decisions = [(t, e) for t, e in events if e.kind == "decision" and e.id == "serve.failure"]
    asked_t, asked = decisions[0]
    answered = next(e for _t, e in decisions if e.answer is not None)
    shards = [e for t, e in events if e.kind == "progress" and e.label == "weights" and t <= killed_at]
    # the serve step's polls of the engine log (``tail -c +N …/serve.log`` on the head) from the kill
    # to the question: counted, not timed, so a busy machine reads the same as an idle one
    head_node = next(iter(run.demo.sim.nodes))
    polls = len(run.sent_between(head_node, killed_at, asked_t, contains="/serve.log"))
    return outcome, events, asked, answered, Detection(asked_t - killed_at, polls), shards[-1].detail


@dataclass(frozen=True)
class Detection:
    sim_s: float   # for the record only: sim time runs on with the wall clock at SPEED
    polls: int     # log polls between the kill and the failure decision


async def test_docker_kill_while_the_weights_load_is_classified_within_two_polls_and_started_again(tmp_path):
    outcome, events, asked, answered, detected, shards = await _serve_fault(tmp_path, "docker kill", {})
    m = re.match(r"(\d+)/(\d+) shards", shards)
    assert m, shards
    assert "(killed)" in asked.title
    proof = asked.measured[0]
    assert "killed with SIGKILL from outside the engine" in proof and "exit 137, OOMKilled false" in proof
    where = re.search(r"while loading weights, shard (\d+) of (\d+)", proof)
    assert where and where.group(2) == m.group(2) and int(where.group(1)) >= int(m.group(1)), (proof, shards)
    assert "journalctl -k | grep -i oom" in asked.measured[-1] and "earlyoom" in asked.measured[-1]
    values = [o["value"] for o in asked.options]
    assert values[0] == "again" and "stop" in values and asked.recommended == "again"
    # a couple of polls (none when the poll in flight at the kill already saw it), not hang_after_s (600 s)
    assert detected.polls <= 2, detected
    assert not any(e.kind == "decision" and e.id == "serve.hang" for _t, e in events)
    # "start again": the Ray cluster formed again, vLLM loaded again, and it serves
    assert answered.answer == "again"
    steps = [(e.step, e.state, e.note) for _t, e in events if e.kind == "step"]
    assert any(s == "serve" and st == "failed" and n.startswith("back to cluster") for s, st, n in steps)
    # the shards the killed start read sit in the page cache, which vLLM's start-up check does not count
    # as free: "again" frees it on every node before the Ray cluster forms again (a stock node has no sudo:
    # the model files are evicted with dd iflag=nocache; it failed that check
    # by 0.3-0.9 GiB before, depending on how far the load had got)
    answered_at = next(t for t, e in events if e is answered)
    drops = {e.node for t, e in events if e.kind == "command" and e.mutating and e.rc == 0 and t >= answered_at
             and ("drop_caches" in e.command or "iflag=nocache" in e.command)}
    assert drops == set(run_nodes(events)), drops
    assert "the page cache freed again first" in next(o["why"] for o in asked.options if o["value"] == "again")
    assert outcome.ok, outcome.result.message
    print(f"\ndocker kill of the Ray head's container at {shards}: classified 'killed' "
          f"{detected.polls} log polls later ({detected.sim_s:.1f} sim s): {proof[:150]}; "
          f"started again and served")


async def test_the_kernels_oom_kill_while_the_weights_load_is_oom_and_offers_the_plan(tmp_path):
    outcome, events, asked, answered, detected, shards = await _serve_fault(tmp_path, "oom",
                                                                           {"serve.failure": "stop"})
    assert "(oom)" in asked.title
    proof = asked.measured[0]
    assert "killed by the kernel's OOM killer while loading weights, shard" in proof
    assert "exit 137, OOMKilled true" in proof
    values = [o["value"] for o in asked.options]
    assert "back-plan" in values and "shorter" in values and asked.recommended in ("shorter", "back-plan")
    assert "gpu-memory-utilization" in asked.measured[-1]
    assert detected.polls <= 2, detected
    assert not outcome.ok and outcome.stopped_at == "serve" and "(oom)" in outcome.result.message
    assert answered.answer == "stop" and not any(e.kind == "decision" and e.id == "serve.hang" for _t, e in events)
    print(f"\nthe kernel's OOM killer ended the Ray head's container at {shards}: classified 'oom' "
          f"{detected.polls} log polls later; offered {values}: {proof[:150]}")


async def test_a_ray_workers_container_killed_while_the_head_still_logs_is_seen_within_three_polls(tmp_path):
    """The worker's Ray container dies while the head's log still moves (the container states are
    read every third poll, not only when the log is quiet)."""
    outcome, _events, asked, _answered, detected, shards = await _serve_fault(tmp_path, "docker kill",
                                                                             {"serve.failure": "stop"}, on=1)
    proof = asked.measured[0]
    assert proof.startswith("spark-5be3: container sparkconsole-ray-") and "killed with SIGKILL" in proof, proof
    assert "while loading weights, shard" in proof
    assert detected.polls <= 3, detected  # the containers are read every third poll at least
    assert not outcome.ok and outcome.stopped_at == "serve"
    print(f"\ndocker kill of the Ray worker's container at {shards}: classified 'killed' {detected.polls} log polls later")
