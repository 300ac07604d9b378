"""The whole deployment on the demo cluster, as an operator runs it: ``sparkconsole demo --serve`` in
one process (the cluster, reached over real SSH), ``sparkconsole deploy --config FILE`` in another,
read back through its ``--json`` event lines, its journal and its state file.

The demo's clock runs fast (``--speed``), which the deploy's settings follow; every number the flow
decides on comes from the simulated nodes through the same parsers the console uses.
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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from unittest.mock import ANY

import pytest
import yaml

from sparkconsole.deploy.steps import STEP_IDS
from tests.proc_support import line_reader

BUNDLED = Path(__file__).parents[1] / "sparkconsole" / "recipes" / "bundled"

ROOT = Path(__file__).resolve().parents[1]
SPEED = "100"
pytestmark = pytest.mark.timeout(400)


def _env(state: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["SPARKCONSOLE_STATE_DIR"] = str(state)
    env.pop("SPARKCONSOLE_CONFIG", None)
    return env


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "sparkconsole.cli", *args]


@contextmanager
def demo_cluster(tmp_path: Path, scenario: str = "story", speed: str = SPEED) -> Iterator[dict[str, str]]:
    """``demo --serve`` running; yields the inventory path and each node's printed ssh command."""
    proc = subprocess.Popen(_cli("demo", "--serve", "--scenario", scenario, "--speed", speed), cwd=ROOT,
                            env=_env(tmp_path / "demo-state"), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        lines = line_reader(proc.stdout)
        found: dict[str, str] = {}
        deadline = time.monotonic() + 120  # a guard against a hang: a busy machine starts Python slowly
        while "config" not in found or len([k for k in found if k.startswith("spark-")]) < 2:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            assert line is not None, proc.stderr.read() if proc.stderr else "demo --serve ended"
            m = re.search(r"deploy --config (\S+)", line)
            if m:
                found["config"] = m.group(1)
            m = re.match(r"^\s*(spark-[0-9a-z]+): (ssh .*)$", line)
            if m:
                found[m.group(1)] = m.group(2)
        yield found
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def deploy(state: Path, *args: str, timeout: float = 300) -> tuple[int, list[dict], str]:
    r = subprocess.run(_cli("deploy", *args, "--json"), cwd=ROOT, env=_env(state), stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=timeout)
    events = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    return r.returncode, events, r.stderr


def ssh(cmdline: str, remote: str) -> str:
    return subprocess.run([*cmdline.split(), remote], capture_output=True, text=True, timeout=30).stdout


def _answers(cmdline: str) -> bool:
    """Whether the node behind an ssh command line still runs a command within two seconds."""
    *opts, dest = cmdline.split()
    try:
        return subprocess.run([*opts, "-o", "ConnectTimeout=2", dest, "true"], capture_output=True,
                              timeout=2).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def steps(events: list[dict]) -> dict[str, str]:
    out: dict[str, str] = {}
    for e in events:
        if e["event"] == "step":
            out[e["step"]] = e["state"]
    return out


def d_answer(events: list[dict], ident: str) -> str:
    return decisions(events)[ident]["answer"]


def decisions(events: list[dict]) -> dict[str, dict]:
    """Each decision as it was first answered (a flow sent back asks it again: "earlier")."""
    out: dict[str, dict] = {}
    for e in events:
        if e["event"] == "decision" and e["answer"] is not None:
            out.setdefault(e["id"], e)
    return out


def test_story_by_auto_meets_the_decisions_serves_repeats_without_change_and_tears_down(tmp_path):
    state = tmp_path / "state"
    with demo_cluster(tmp_path) as demo:
        token = ssh(demo["spark-1a32"], "cat /home/nvidia/.cache/huggingface/token").strip()
        assert token.startswith("hf_")
        rc, events, err = deploy(state, "--config", demo["config"], "--auto")
        assert rc == 0, (err, events[-3:])
        # run again: everything is already true, so nothing changes a node but the cluster's lock on the
        # head (docs/security.md), taken before the first step and released before the result is said
        rc2, again, err2 = deploy(state, "--config", demo["config"], "--auto")
        assert rc2 == 0, (err2, again[-3:])
        assert [(e["step"], e["summary"].split(" (", 1)[0], e["rc"]) for e in again
                if e["event"] == "command" and e["mutating"]] == [
            ("lock", "take the cluster's lock on this head while the wizard runs", None), ("lock", ANY, 0),
            ("lock", "release the cluster's lock on this head", None), ("lock", ANY, 0)]
        assert again[-1]["event"] == "result"
        assert steps(again)["serve"] == "skipped" and steps(again)["weights"] == "skipped"
        # teardown of the first: exactly what it started goes, the services it stopped come back
        first = next(e for e in events if e["event"] == "result")
        dep_id = sorted(p.stem for p in (state / "deployments").glob("*.json"))[0]
        rc3, down, err3 = deploy(state, "--config", demo["config"], "--teardown", dep_id, "--auto")
        assert rc3 == 0, (err3, down[-3:])
        removed = [e["command"] for e in down if e["event"] == "command" and e["mutating"] and e["rc"] == 0]
        # the engine's containers (vLLM's native start on both nodes: the story's default, no Ray)
        assert sum(c.startswith("docker rm -f sparkconsole-vllm-") for c in removed) == 2
        assert {c for c in removed if c.startswith("docker start")} == {
            f"docker start {s.split(':', 1)[1]}" for s in d_answer(events, "free-memory.stop").split(",")}
        ps = ssh(demo["spark-1a32"], "docker ps --format '{{.Names}}'")
        assert "sparkconsole-" not in ps and "vllm-glm" in ps
        assert first["ok"]
    result = events[-1]
    assert result["event"] == "result" and result["ok"] and result["endpoint"].endswith(":8000/v1")
    assert result["model"] == "qwen3.5-122b-a10b-fp8"  # the repository's name in lower case: what a request names
    assert set(steps(events).values()) <= {"done", "skipped"} and len(steps(events)) == len(STEP_IDS)  # every step, the benchmark offered last
    d = decisions(events)
    assert d["plan.layout"]["answer"] == d["plan.layout"]["recommended"] == "tp2"
    assert any("TP=1" in m and "does not fit" in m for m in d["plan.layout"]["measured"])
    # a GB10 build, pulled: the head's vllm/vllm-openai:v0.17.0 knows the model but is an upstream build
    # without vLLM's sm_121 kernels, offered last with the field's warning
    assert d["engine.image"]["answer"] == "nvcr.io/nvidia/vllm:26.05-py3"
    upstream = next(o for o in d["engine.image"]["options"] if o["value"] == "vllm/vllm-openai:v0.17.0")
    assert "Error Internal" in upstream["why"]
    assert d["cluster.executor"]["answer"] == "native"
    # at the model's full 262,144 tokens the gmu is at most the field's (the bundled field recipe's own
    # figure, spark-arena's), not GB10's general 0.85; lower where a node's page cache leaves less room
    recipe = yaml.safe_load((BUNDLED / "qwen3.5-122b-a10b-fp8-tp2-ngc.yaml").read_text())["defaults"]
    serves = [shlex.split(e["command"]) for e in events if e["event"] == "command" and e["step"] == "serve"
              and e["command"].startswith("docker run") and e["rc"] == 0]
    assert serves and all(float(a[a.index("--gpu-memory-utilization") + 1]) <= recipe["gpu_memory_utilization"]
                          and int(a[a.index("--max-model-len") + 1]) == recipe["max_model_len"] for a in serves), serves
    assert any("as the field runs it" in e["text"] for e in events if e["event"] == "note" and e["step"] == "plan")
    assert any("v0.14.1" in m and "NOT registered" in m for m in d["engine.image"]["measured"])
    stops = set(d["free-memory.stop"]["answer"].split(","))
    # GLM goes (at the field's gmu for 262,144 tokens stopping it frees enough); the rest keeps serving
    assert stops == {"spark-1a32:vllm-glm"}
    # every command that changed a node was shown before it ran, and journaled under its step
    changed = [e for e in events if e["event"] == "command" and e["mutating"] and e["rc"] is not None
               and not e["summary"].endswith("(done before, not repeated)")]  # the flow went back once
    shown = [e for e in events if e["event"] == "command" and e["mutating"] and e["rc"] is None]
    assert len(shown) == len(changed) > 10
    journal = [json.loads(x) for x in (state / "journal.jsonl").read_text().splitlines()]
    # (the cluster step sends nothing for vLLM's native start: there is no Ray to form)
    assert {j["step"] for j in journal} >= {"engine", "weights", "images", "free-memory", "caches", "serve"}
    # (the cluster's lock on the head is each run's own housekeeping: the run again takes and frees it)
    assert len({j["deployment"] for j in journal if j["step"] != "lock"}) == 1
    # one download, where the tool is: the engine image's hf (a stock Spark has none on the host)
    assert sum("--entrypoint hf" in j["command"] for j in journal if j["step"] == "weights") == 1
    # the token never left the node
    for text in [json.dumps(events), (state / "journal.jsonl").read_text(),
                 *(p.read_text() for p in (state / "deployments").glob("*.json"))]:
        assert token not in text


def test_plan_only_on_stock_dgx_os_sends_nothing_a_stock_spark_would_refuse(tmp_path):
    """The demo's nodes are stock DGX OS (docs/dgx-os.md): the login user nvidia, sudo that wants a
    password, no hf on the host, NVIDIA's earlier netplan (one link-local IPv4, on the f1np1 twin), the
    RoCE v2 IPv4 GID at index 3 on the head and 5 on the worker. What the plan sends fits that:
    node-to-node commands to nvidia@, never root@; the download in the image's hf; no sudo at all;
    NCCL_IB_HCA with the one twin that has an IPv4 GID and each node's own index; the head's variables
    kept from vLLM's Ray carry-over; an entrypoint named on every docker run; and nothing changed."""
    state = tmp_path / "state"
    with demo_cluster(tmp_path) as demo:
        # the Ray path on stock DGX OS (native is the default; Ray is the operator's choice), with the
        # image already on the head
        rc, events, err = deploy(state, "--config", demo["config"], "--plan-only", "--executor", "ray",
                                 "--image", "vllm/vllm-openai:v0.17.0")
    assert rc == 0, err
    planned = [e for e in events if e["event"] == "planned"]
    text = "\n".join(f"{e['node']} {e['command']}" for e in planned)
    notes = "\n".join(e["text"] for e in events if e["event"] == "note")
    head_ip, worker_ip = re.findall(r"fast link (169\.254\.\d+\.\d+)", notes)[:2]
    assert "root@" not in text and "sudo" not in text  # a stock Spark refuses both
    assert re.search(rf"rsync -a --partial -L --exclude blobs/ .* nvidia@{re.escape(worker_ip)}:", text)
    assert f"docker save vllm/vllm-openai:v0.17.0 | ssh -o BatchMode=yes -o ConnectTimeout=5 nvidia@{worker_ip}" in text
    (download,) = [e["command"] for e in planned if "--entrypoint hf" in e["command"] and e["step"] == "weights"]
    assert "docker run --rm --name sparkconsole-download-" in download and "--user 1000:1000" in download
    assert "hf download" not in text  # the host has no hf
    assert "iflag=nocache" in text and "drop_caches" not in text  # the page cache freed without sudo
    heads = [e["command"] for e in planned if e["step"] == "cluster" and "docker run" in e["command"]]
    # Ray's token: made on the head, copied node to node as nvidia@ (never root@), before the containers
    tokens = [e["command"] for e in planned if e["step"] == "cluster" and "ray-token" in e["command"]
              and "docker run" not in e["command"]]
    assert len(tokens) == 2 and f"nvidia@{worker_ip}" in tokens[1]
    assert len(heads) == 2 and "--head" in heads[0] and f"--address={head_ip}:6379" in heads[1]
    assert f"-e VLLM_HOST_IP={head_ip}" in heads[0] and f"-e VLLM_HOST_IP={worker_ip}" in heads[1]
    assert all("-e NCCL_IB_HCA=rocep1s0f1 " in h for h in heads)  # not roceP2p1s0f1: no IPv4 GID there
    assert "-e NCCL_IB_GID_INDEX=3 " in heads[0] and "-e NCCL_IB_GID_INDEX=5 " in heads[1]
    assert all("-e HF_HUB_OFFLINE=1 " in h for h in heads)
    carry = [e["command"] for e in planned if "ray_non_carry_over_env_vars.json" in e["command"]]
    # and the endpoint's API key (--auto's serve.access) stays on the head: no worker serves the API
    assert len(carry) == 1 and carry[0].endswith("""sh '["NCCL_IB_GID_INDEX", "VLLM_API_KEY"]'""")
    runs = [e["command"] for e in planned if e["command"].startswith("docker run ") or "sh -c 'docker run " in e["command"]]
    assert runs and all("--entrypoint " in c for c in runs)
    assert not [e for e in events if e["event"] == "command" and e["mutating"]]
    assert not (state / "journal.jsonl").exists()


_OUR_NAMES = re.compile(r"(sparkconsole-(?:ray|vllm|sglang|download|canary|canary-fetch|canary-write)-|/sparkconsole/)"
                        r"[0-9a-z]{8}")


def _changes(events: list[dict], kind: str) -> list[tuple[str, str, str]]:
    """(step, node, command) of every change: ``planned`` events, or the changes a run showed before
    sending them (``command``, mutating, no exit code yet); the deployment's own id made neutral."""
    if kind == "planned":
        picked = [e for e in events if e["event"] == "planned"]
    else:  # the cluster's lock on the head is the session's, not a step's: --plan-only takes none
        picked = [e for e in events if e["event"] == "command" and e["mutating"] and e["rc"] is None
                  and e["step"] != "lock"]
    return sorted((e["step"], e["node"], _OUR_NAMES.sub(r"\1<id>", e["command"])) for e in picked)


def test_plan_only_prints_exactly_the_changes_auto_then_sends(tmp_path):
    """The promise "every change shown before it runs", by construction: a step's ``send`` is the
    one source of its changes, rehearsed for --plan-only and run for --auto; on the same cluster
    both list the same commands, job starts included, per step and node."""
    # the same answers for both: which of the two equal services is "less busy" follows the live
    # docker stats, which move between the two runs as they would on real nodes
    # and the memory budget given: on stock nodes what stays cached after the caches step (root's to drop)
    # is measured only then, and fitting the budget to it would re-plan what --plan-only showed
    # and an image already on every node: a pulled image copied to a worker stays in its page cache,
    # root's to drop, measured only by the caches step (what --plan-only cannot know); a GB10 build, so
    # the canary passes (an upstream one fails it, which --plan-only cannot know either)
    stops = ("--answer", "free-memory.stop=spark-1a32:vllm-glm,spark-1a32:reranker",
             "--gpu-memory-utilization", "0.68", "--image", "nvcr.io/nvidia/vllm:26.03-py3")
    with demo_cluster(tmp_path, scenario="gb10-ray") as demo:
        rc, planned, err = deploy(tmp_path / "plan-state", "--config", demo["config"], "--plan-only", *stops)
        assert rc == 0, err
        rc, ran, err = deploy(tmp_path / "state", "--config", demo["config"], "--auto", *stops)
        assert rc == 0, (err, ran[-3:])
    shown, sent = _changes(planned, "planned"), _changes(ran, "sent")
    assert len(sent) > 10 and any("(detached job" in c or "setsid" in c for _s, _n, c in sent)
    assert shown == sent, "\n".join(f"{'-' if x in sent else '+'} {x}" for x in set(shown) ^ set(sent))


@pytest.mark.parametrize("scenario,step,words", [
    ("link-down", "network", "same port"),
    ("node-lost", "recon", "spark-5be3 cannot be reached"),
])
def test_a_broken_cluster_stops_at_the_step_that_sees_it_with_the_fix(tmp_path, scenario, step, words):
    with demo_cluster(tmp_path, scenario) as demo:
        if scenario == "node-lost":  # lost 20 simulated seconds in: wait until its ssh no longer answers
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and _answers(demo["spark-5be3"]):
                pass
        rc, events, err = deploy(tmp_path / "state", "--config", demo["config"], "--auto")
    assert rc == 1, err
    assert steps(events)[step] == "failed"
    assert words in events[-1]["message"] and "fix:" in events[-1]["message"]


def test_old_image_pulls_the_known_good_one_and_serves(tmp_path):
    with demo_cluster(tmp_path, "old-image") as demo:
        rc, events, err = deploy(tmp_path / "state", "--config", demo["config"], "--auto")
    assert rc == 0, (err, events[-3:])
    d = decisions(events)["engine.image"]
    # the first known-good image on a GB10: NVIDIA's GB10 build (CUDA 13, vLLM 0.20.1)
    assert d["answer"] == "nvcr.io/nvidia/vllm:26.05-py3" and "no image on the nodes knows" in d["why"]
    assert any(e["event"] == "command" and e["command"].startswith("docker pull nvcr.io/nvidia/vllm:26.05-py3")
               for e in events)


def test_killed_during_the_copy_resumes_without_downloading_again(tmp_path):
    state = tmp_path / "state"
    with demo_cluster(tmp_path) as demo:
        proc = subprocess.Popen(_cli("deploy", "--config", demo["config"], "--auto", "--json"), cwd=ROOT,
                                env=_env(state), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
        first: list[dict] = []
        lines = line_reader(proc.stdout)
        try:
            while True:
                line = lines.get(timeout=120)
                assert line is not None, first[-3:]
                e = json.loads(line)
                first.append(e)
                if e["event"] == "progress" and e["label"] == "copy":
                    proc.send_signal(signal.SIGKILL)
                    break
        finally:
            proc.wait(timeout=10)
        rc, events, err = deploy(state, "--config", demo["config"], "--resume", "--auto")
    assert rc == 0, (err, events[-3:])
    everything = first + events
    downloads = [e for e in everything if e["event"] == "command" and e["rc"] is None
                 and "--entrypoint hf" in e["command"] and e["step"] == "weights"]
    assert len(downloads) == 1  # started once, re-attached after the kill
    assert steps(events)["recon"] == "done"
    assert any(e["event"] == "note" and "re-attached" in e["text"] for e in events)


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    for args in (["--model", "x;rm -rf /"], ["--answer", "novalue"], ["--tp", "0"], ["--resume", "nosuch"]):
        r = subprocess.run(_cli("deploy", "--demo", *args), cwd=ROOT, env=_env(tmp_path / "s"), capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_three_sparks_with_pipeline_stages_when_tp_cannot_span_them(tmp_path):
    """Qwen3.5-122B's 32 heads do not divide over 3 nodes: the plan offers PP=3, and the deployment
    copies to both workers in parallel, forms a 3-node Ray cluster and serves with the stages."""
    # over Ray, as the operator chooses it: the simulator's native start does not model pipeline
    # stages across nodes yet (its vLLM loads the whole model on each rank)
    rc, events, err = deploy(tmp_path / "state", "--demo", "--nodes", "3", "--speed", SPEED, "--auto",
                             "--answer", "plan.layout=tp1-pp3", "--executor", "ray",
                             "--answer", "engine.image=nvcr.io/nvidia/vllm:26.03-py3")
    assert rc == 0, (err, events[-3:])
    plan = decisions(events)["plan.layout"]
    assert any("TP=1 x PP=3" in m and "fits" in m for m in plan["measured"])
    assert plan["answer"] == "tp1-pp3" and plan["by"] == "preset"
    cmds = [e["command"] for e in events if e["event"] == "command" and e["rc"] is None]
    assert sum("rsync -a --partial -L" in c for c in cmds) == 2
    assert sum(c.startswith("docker run -d --name sparkconsole-ray-") for c in cmds) == 3
    (serve,) = [c for c in cmds if "vllm serve" in c]
    assert "--tensor-parallel-size 1 --pipeline-parallel-size 3" in serve
    assert events[-1]["ok"] and events[-1]["tokens_per_s"]


def test_read_only_refuses_the_first_change_and_sends_nothing(tmp_path):
    state = tmp_path / "state"
    rc, events, err = deploy(state, "--demo", "--speed", SPEED, "--read-only", "--auto")
    assert rc == 1, err
    assert "read-only" in events[-1]["message"] and "refused" in events[-1]["message"]
    assert not [e for e in events if e["event"] == "command" and e["mutating"]]
    assert steps(events)["recon"] == "done" and not (state / "journal.jsonl").exists()


def test_an_ngc_image_without_ray_serves_by_vllms_native_multi_node(tmp_path):
    """NVIDIA's NGC 26.05 (vLLM 0.20.1) has no Ray and its entrypoint is not `vllm serve`: the engine
    check reads both, the cluster step recommends vLLM's native multi-node, and every `docker run`
    names its entrypoint, so the model id is never taken for a command (docs/dgx-os.md items 7, 8)."""
    rc, events, err = deploy(tmp_path / "state", "--demo", "--scenario", "ngc-image", "--speed", SPEED, "--auto")
    assert rc == 0, (err, events[-3:])
    d = decisions(events)
    assert d["engine.image"]["answer"] == "nvcr.io/nvidia/vllm:26.05-py3"
    assert d["cluster.executor"]["answer"] == "native" and "Ray ABSENT" in " ".join(d["cluster.executor"]["measured"])
    # the head's start (rank 0, the API) reads the endpoint's API key first: `... docker run -e VLLM_API_KEY -d`
    runs = [e["command"] for e in events if e["event"] == "command" and e["rc"] is None
            and re.search(r"(^|&& VLLM_API_KEY=\"\$k\" )docker run (-e VLLM_API_KEY )?-d --name sparkconsole-vllm-",
                          e["command"])]
    assert len(runs) == 2 and all("--entrypoint vllm nvcr.io/nvidia/vllm:26.05-py3 serve Qwen/" in c for c in runs)
    assert not any("sparkconsole-ray-" in e.get("command", "") for e in events if e["event"] == "command")
    assert events[-1]["ok"] and events[-1]["tokens_per_s"]
