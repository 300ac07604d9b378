"""Issue 23, item 15: who may use the served endpoint. vLLM listened on 0.0.0.0 with no key, so anyone
who reached port 8000 could use the model, and nothing said so. Now the serve step asks
(``serve.access``: an API key, recommended; 127.0.0.1 and an SSH tunnel; or open), the key is made on
the head and never leaves it (not in a command's text, the events, the journal or the state), and
verify says who can reach the endpoint from what the head measures. Every test here failed on the
code before the change."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from sparkconsole.config import ClusterConfig, NodeConfig
from sparkconsole.deploy.decisions import ScriptedAnswers
from sparkconsole.deploy.events import DecisionEvent, NoteEvent
from sparkconsole.deploy.flow import Flow, Options
from sparkconsole.deploy.recon import LinkFacts, NodeFacts
from sparkconsole.deploy.runner import Runner, StepFailed
from sparkconsole.deploy.state import DeploymentState
from sparkconsole.deploy.steps import Serve, Verify
from sparkconsole.remote import api_key_path, http_get_keyed, make_api_key, with_key_from_file
from sparkconsole.sim import SimClock, start_demo_cluster
from sparkconsole.transport.base import CommandResult
from tests.test_deploy_demo import decisions, demo_cluster, deploy, ssh, steps
from tests.test_sim_shell import HEAD, HF, WORKER
from tests.test_sim_shell import ssh as sim_ssh

KEY_FILE = "/home/nvidia/.config/sparkconsole/api-key"
SERVED = "qwen3.5-122b-a10b-fp8"
MODELS = json.dumps({"object": "list", "data": [{"id": SERVED, "object": "model"}]})
CHAT = json.dumps({"choices": [{"message": {"content": "204", "reasoning_content": "12*17"}}],
                   "usage": {"completion_tokens": 4}})


# ---- a pair of stock Sparks on a real Runner, its transport answering from a script ---------------

class _Scripted:
    """A node's transport: each command answered by the first rule whose every needle it contains."""

    def __init__(self, node: str, rules: list[tuple[tuple[str, ...], int, str]], log: list[tuple[str, str]]) -> None:
        self.node, self.rules, self.log = node, rules, log
        self.connected, self.last_error = True, None

    async def run(self, cmd, timeout: float = 30.0, input: str | None = None) -> CommandResult:
        text = cmd.shell()
        self.log.append((self.node, text))
        for needles, rc, out in self.rules:
            if all(n in text for n in needles):
                return CommandResult(text, rc, out, "", 0.01)
        return CommandResult(text, 0, "", "", 0.01)


def _facts(node: str, ip: str) -> dict:
    return NodeFacts(node, gpu="NVIDIA GB10", user="nvidia", uid=1000, gid=1000, home="/home/nvidia",
                     groups=["nvidia", "docker"], sudo="none",
                     tools={"hf": False, "uvx": False, "rsync": True, "ping": True, "curl": True, "ss": True},
                     links=[LinkFacts("rocep1s0f1", "enp1s0f1np1", True, 1, [f"{ip}/16"], 1500, 3)]).to_json()


def _flow(executor: str = "ray", *, engine: str = "vllm", access: str | None = None, tp: int = 2,
          head_rules: list | None = None) -> tuple[Flow, list[tuple[str, str]], list]:
    nodes = (NodeConfig("spark-a", "10.0.0.5", user="nvidia", port=2222, role="head"),
             NodeConfig("spark-b", "10.0.0.6", user="nvidia", role="worker"))
    opts = Options()
    state = DeploymentState.new(opts.model, opts.to_json(), "sparks")
    state.facts["nodes"] = {"spark-a": _facts("spark-a", "169.254.41.7"), "spark-b": _facts("spark-b", "169.254.190.33")}
    log: list[tuple[str, str]] = []
    transports = {"spark-a": _Scripted("spark-a", head_rules or [], log), "spark-b": _Scripted("spark-b", [], log)}
    events: list = []
    runner = Runner(config=ClusterConfig(nodes=nodes, name="sparks"), state=state, transports=transports,
                    answer=ScriptedAnswers({}, auto=True), emit=events.append)
    flow = Flow(runner, opts)
    image = "nvcr.io/nvidia/sglang:26.05-py3" if engine == "sglang" else "vllm/vllm-openai:v0.17.0"
    flow.update(tp=tp, pp=1, image=image, engine=engine, executor=executor, access=access,
                weights_ok={"spark-a": True, "spark-b": True})
    return flow, log, events


# ---- the serve step: the decision, where the API listens, how the key reaches vLLM ------------------

async def test_the_serve_step_asks_who_may_use_the_endpoint_and_recommends_a_key():
    """Before: no question; vLLM always started on 0.0.0.0 without a key."""
    flow, _log, events = _flow()
    await Serve(flow).decide()
    asked = [e for e in events if isinstance(e, DecisionEvent) and e.id == "serve.access"][-1]
    assert [o["value"] for o in asked.options] == ["api-key", "local", "open"]
    assert asked.answer == asked.recommended == "api-key" and flow.plan.access == "api-key"
    assert any(KEY_FILE in o["why"] for o in asked.options)
    assert any("6379" in m for m in asked.measured)  # the cluster's own ports take no key, whatever the answer
    # SGLang takes a key only on its command line (and logs it): not offered; 127.0.0.1 recommended
    flow, _log, events = _flow("native", engine="sglang")
    await Serve(flow).decide()
    asked = [e for e in events if isinstance(e, DecisionEvent) and e.id == "serve.access"][-1]
    assert [o["value"] for o in asked.options] == ["local", "open"] and flow.plan.access == "local"


@pytest.mark.parametrize("executor,tp", [("ray", 2), ("native", 2), ("single", 1)])
async def test_with_a_key_only_the_api_server_gets_it_from_its_environment_never_from_a_command(executor, tp):
    """The head's start reads the key from the file on the node into the docker client's environment
    (`-e VLLM_API_KEY`, no value): the text sent, shown and journaled has no key, nor has the engine's
    command line (`ps`, vLLM's logged arguments). Workers (headless, or Ray's) get none."""
    flow, _log, _events = _flow(executor, access="api-key", tp=tp)
    serve = Serve(flow)
    cmds = serve._commands()
    head = [c for n, c in cmds if n == "spark-a"]
    assert len(head) == 1
    text = head[0].shell()
    assert text.startswith(f'k="$(cat {KEY_FILE})" && [ -n "$k" ] && VLLM_API_KEY="$k" docker ')
    assert " -e VLLM_API_KEY " in text and "--api-key" not in text
    assert not any(a.startswith("VLLM_API_KEY=") for a in head[0].argv)
    assert "--host 0.0.0.0" in text
    assert all("VLLM_API_KEY" not in c.shell() for n, c in cmds if n != "spark-a")
    if executor != "ray":  # the container's name is read from the command as before
        assert serve._runs()["spark-a"] == flow.container("vllm")
    # what the step sends, as --plan-only shows it: the key is made on the head before the start that
    # reads it; over Ray it is kept out of vLLM's env carry-over to the workers
    planned = await flow.runner.rehearse(serve.send)
    texts = [c.shell() for _n, c in planned]
    made = next(i for i, t in enumerate(texts) if "/proc/sys/kernel/random/uuid" in t)
    start = next(i for i, t in enumerate(texts) if "VLLM_API_KEY=\"$k\"" in t)
    assert made < start and planned[made][0] == "spark-a"
    if executor == "ray":
        assert any("ray_non_carry_over_env_vars.json" in t and "VLLM_API_KEY" in t for t in texts)


async def test_local_listens_on_loopback_and_open_listens_everywhere_without_a_key():
    """Before: `--host 0.0.0.0` whatever was wanted. Local: every engine's API on 127.0.0.1 (SGLang's
    too); open: every interface, as before; neither makes nor passes a key."""
    for access, host in (("local", "127.0.0.1"), ("open", "0.0.0.0")):
        for executor, tp, engine in (("ray", 2, "vllm"), ("native", 2, "vllm"), ("single", 1, "vllm"),
                                     ("native", 2, "sglang")):
            flow, _log, _events = _flow(executor, engine=engine, access=access, tp=tp)
            head = next(c for n, c in Serve(flow)._commands() if n == "spark-a").shell()
            assert f"--host {host}" in head and "VLLM_API_KEY" not in head, (access, executor, engine)
            planned = await flow.runner.rehearse(Serve(flow).send)
            assert not any("random/uuid" in c.shell() for _n, c in planned)


# ---- the key on the node, by a real shell ----------------------------------------------------------

def _sh(text: str, path: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(["/bin/sh", "-c", text], capture_output=True, text=True, input=stdin, timeout=20,
                          env={**os.environ, "PATH": path})


def test_the_key_is_made_on_the_node_readable_by_its_user_only_and_kept(tmp_path):
    """The node's own shell makes the key from the kernel's random UUIDs (it never crosses the network),
    mode 600 in a 700 folder; a second run (a resume, a later deployment) keeps it."""
    key_file = api_key_path(str(tmp_path / "home"))
    text = make_api_key(key_file).shell()
    assert _sh(text, os.environ["PATH"]).returncode == 0
    key = Path(key_file).read_text().strip()
    assert len(key) >= 64 and key not in text
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(Path(key_file).parent).st_mode) == 0o700
    assert _sh(text, os.environ["PATH"]).returncode == 0
    assert Path(key_file).read_text().strip() == key
    other = api_key_path(str(tmp_path / "other"))  # another head makes its own
    _sh(make_api_key(other).shell(), os.environ["PATH"])
    assert Path(other).read_text().strip() != key


def test_the_engine_and_curl_get_the_key_from_the_file_never_from_their_command_lines(tmp_path):
    """`-e VLLM_API_KEY` takes the value from the docker client's environment (docker's rule for a name
    without `=`); curl reads the header from its stdin (`-H @-`). A missing key file stops the start
    instead of starting an engine without a key."""
    key_file = api_key_path(str(tmp_path / "home"))
    _sh(make_api_key(key_file).shell(), os.environ["PATH"])
    key = Path(key_file).read_text().strip()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text('#!/bin/sh\nprintf "env=%s\\n" "${VLLM_API_KEY-unset}"\nprintf "arg=%s\\n" "$@"\n')
    (bin_dir / "curl").write_text('#!/bin/sh\nprintf "stdin=%s\\n" "$(cat)"\nprintf "arg=%s\\n" "$@"\n')
    for f in ("docker", "curl"):
        (bin_dir / f).chmod(0o755)
    path = f"{bin_dir}:{os.environ['PATH']}"
    flow, _log, _events = _flow("single", access="api-key", tp=1)
    start = next(c for _n, c in Serve(flow)._launches())
    keyed = with_key_from_file(start, key_file)
    out = _sh(keyed.shell(), path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"env={key}"
    args = [ln[4:] for ln in lines[1:]]
    assert args[:3] == ["run", "-e", "VLLM_API_KEY"] and not any(key in a for a in args)
    out = _sh(http_get_keyed("http://127.0.0.1:8000/v1/models", key_file).shell(), path)
    assert out.stdout.splitlines()[0] == f"stdin=Authorization: Bearer {key}"
    assert not any(key in ln for ln in out.stdout.splitlines()[1:])
    Path(key_file).unlink()
    out = _sh(keyed.shell(), path)
    assert out.returncode != 0 and "env=" not in out.stdout and "No such file" in out.stderr
    out = _sh(http_get_keyed("http://127.0.0.1:8000/v1/models", key_file).shell(), path)
    assert out.stdout.splitlines()[0] == "stdin="  # no file, no header: an engine without a key ignores it


# ---- verify: who can reach it, as the head measures it -------------------------------------------------

def _head_rules(code: str, bound: str) -> list:
    ss = ("State  Recv-Q Send-Q Local Address:Port Peer Address:Port\n"
          "LISTEN 0      128         0.0.0.0:22        0.0.0.0:*\n"
          f"LISTEN 0      4096     {bound}:8000      0.0.0.0:*\n")
    return [(("/health",), 0, ""), (("%{http_code}", "/v1/models"), 0, f"{code}\n"),
            (("-H @-", "/v1/models"), 0, MODELS), (("/v1/models",), 0, '{"error":"Unauthorized"}'),
            (("ss -ltn",), 0, ss), (("-H @-", "/v1/chat/completions"), 0, CHAT)]


def _notes(events: list) -> list[tuple[str, str]]:
    return [(e.level, e.text) for e in events if isinstance(e, NoteEvent)]


async def test_verify_says_the_key_is_needed_and_where_it_is_kept():
    """Before: "listening on spark-a, all interfaces", whoever could reach it."""
    flow, log, events = _flow("ray", access="api-key", head_rules=_head_rules("401", "0.0.0.0"))
    await Verify(flow).verify()
    notes = _notes(events)
    said = next(t for _lvl, t in notes if t.startswith("endpoint "))
    assert said.startswith("endpoint http://10.0.0.5:8000/v1: anyone who reaches it with the API key")
    assert f"`ssh -p 2222 nvidia@10.0.0.5 cat {KEY_FILE}`" in said and "401" in said
    assert any("6379" in t and "no authentication" in t and "trusted network" in t for _lvl, t in notes)
    assert flow.runner.state.endpoint == "http://10.0.0.5:8000/v1" and flow.runner.state.result == "served"
    sent = [t for _n, t in log]
    # /v1 asked with the key read on the node; the check without it is what says who can reach
    assert any("/v1/chat/completions" in t and "-H @-" in t and f"cat {KEY_FILE}" in t for t in sent)
    assert any("%{http_code}" in t and "/v1/models" in t and "-H @-" not in t for t in sent)


async def test_verify_says_a_local_endpoint_is_reached_through_a_tunnel_and_an_open_one_by_anyone():
    flow, _log, events = _flow("native", access="local", head_rules=_head_rules("200", "127.0.0.1"))
    await Verify(flow).verify()
    said = next(t for _lvl, t in _notes(events) if t.startswith("endpoint "))
    assert said.startswith("endpoint http://localhost:8000/v1 through an SSH tunnel only")
    assert "ssh -L 8000:localhost:8000 -p 2222 nvidia@10.0.0.5" in said
    assert any("29501" in t and "no authentication" in t for _lvl, t in _notes(events))
    flow, _log, events = _flow("ray", access="open", head_rules=_head_rules("200", "0.0.0.0"))
    await Verify(flow).verify()
    level, said = next((lvl, t) for lvl, t in _notes(events) if t.startswith("endpoint "))
    assert level == "warning"
    assert said.startswith("endpoint http://10.0.0.5:8000/v1: anyone who reaches 10.0.0.5:8000 can use the model, "
                           "with no key")


async def test_verify_fails_when_what_was_asked_is_not_what_the_head_does():
    """A key was asked for but /v1 answers without one (an engine started before): said, not hidden."""
    flow, _log, _events = _flow("ray", access="api-key", head_rules=_head_rules("200", "0.0.0.0"))
    with pytest.raises(StepFailed, match="without the API key"):
        await Verify(flow).verify()
    flow, _log, _events = _flow("ray", access="local", head_rules=_head_rules("200", "0.0.0.0"))
    with pytest.raises(StepFailed, match=r"not on 127\.0\.0\.1 only"):
        await Verify(flow).verify()


async def test_an_engine_that_wants_the_key_is_known_as_serving_on_a_resume():
    """`serving()` decides whether the steps before serve are skipped on a resume: without the key it
    read 401 and started everything again over a running engine."""
    flow, log, _events = _flow("ray", access="api-key", head_rules=_head_rules("401", "0.0.0.0"))
    assert await flow.serving()
    assert "-H @-" in log[-1][1] and f"cat {KEY_FILE}" in log[-1][1]


# ---- the twin behaves as vLLM does --------------------------------------------------------------------

async def test_the_twins_vllm_wants_its_key_on_v1_only_and_a_loopback_one_is_local():
    """vllm/entrypoints/openai/api_server.py: with a token (``--api-key`` or ``VLLM_API_KEY``) /v1 answers
    401 ``{"error": "Unauthorized"}`` unless ``Authorization: Bearer TOKEN``; /health stays open. ``--host
    127.0.0.1`` is not reached from another host. ``docker run -e NAME`` of a name the client has not
    set sets nothing (docker's rule)."""
    embed = "Qwen/Qwen3-Embedding-0.6B"
    async with start_demo_cluster(scenario="healthy", clock=SimClock.frozen()) as demo:
        r = await sim_ssh(demo, HEAD, make_api_key(KEY_FILE).shell())
        assert r.exit_status == 0, r.stderr
        key = (await sim_ssh(demo, HEAD, f"cat {KEY_FILE}")).stdout.strip()
        common = (f"--network host --gpus all -v {HF}:/root/.cache/huggingface --entrypoint vllm "
                  f"vllm/vllm-openai:v0.17.0 serve {embed} --runner pooling --gpu-memory-utilization 0.1")
        r = await sim_ssh(demo, HEAD, f'k="$(cat {KEY_FILE})" && VLLM_API_KEY="$k" docker run -e VLLM_API_KEY -d '
                                      f"--name keyed {common} --port 8001")
        assert r.exit_status == 0, r.stderr
        r = await sim_ssh(demo, HEAD, f"docker run -d -e NOT_SET_HERE --name local {common} --host 127.0.0.1 --port 8002")
        assert r.exit_status == 0, r.stderr
        for _ in range(200):
            if (await sim_ssh(demo, HEAD, "curl -sf http://127.0.0.1:8001/health && "
                                          "curl -sf http://127.0.0.1:8002/health")).exit_status == 0:
                break
            demo.clock.advance(5)
        assert "NOT_SET_HERE" not in dict(demo.sim.container(HEAD, "local").env)

        async def on(node: str, cmd: str) -> tuple[int, str]:
            got = await sim_ssh(demo, node, cmd)
            return got.exit_status, got.stdout

        status = "curl -s -o /dev/null -w '%{http_code}\\n'"
        assert await on(HEAD, f"{status} http://127.0.0.1:8001/v1/models") == (0, "401\n")
        assert await on(HEAD, "curl -s http://127.0.0.1:8001/v1/models") == (0, '{"error":"Unauthorized"}')
        assert (await on(HEAD, "curl -sf http://127.0.0.1:8001/v1/models"))[0] == 22
        assert await on(HEAD, f"{status} -H 'Authorization: Bearer nope' http://127.0.0.1:8001/v1/models") == \
            (0, "401\n")
        assert await on(HEAD, f"{status} http://127.0.0.1:8001/health") == (0, "200\n")
        rc, body = await on(HEAD, http_get_keyed("http://127.0.0.1:8001/v1/models", KEY_FILE).shell())
        assert rc == 0 and json.loads(body)["data"][0]["id"] == embed
        assert await on(HEAD, f"{status} -H 'Authorization: Bearer {key}' http://127.0.0.1:8001/v1/models") == \
            (0, "200\n")
        lan = demo.sim.nodes[HEAD].lan_ip
        assert await on(WORKER, f"{status} http://{lan}:8001/v1/models") == (0, "401\n")
        assert (await on(WORKER, f"curl -s http://{lan}:8002/v1/models"))[0] == 7  # bound to 127.0.0.1
        assert (await on(HEAD, f"curl -s http://{lan}:8002/v1/models"))[0] == 7
        assert await on(HEAD, f"{status} http://127.0.0.1:8002/v1/models") == (0, "200\n")  # no key: open
        listening = (await on(HEAD, "ss -ltn"))[1]
        assert "0.0.0.0:8001 " in listening and "127.0.0.1:8002 " in listening


# ---- the whole deployment on the demo cluster ---------------------------------------------------------

def _fast_ip(state: Path, node: str) -> str:
    dep = next((state / "deployments").glob("*.json"))
    ip = NodeFacts.from_json(json.loads(dep.read_text())["facts"]["nodes"][node]).fast_ip()
    assert ip is not None
    return ip


def _everything_said(state: Path, *runs: tuple[list[dict], str]) -> list[str]:
    """What the console printed and kept: the events and stderr of each run, the journal, every state file."""
    return [*(json.dumps(events) + err for events, err in runs), (state / "journal.jsonl").read_text(),
            *(p.read_text() for p in (state / "deployments").glob("*.json"))]


@pytest.mark.timeout(400)
def test_auto_serves_with_a_key_that_never_leaves_the_head_and_a_resume_keeps(tmp_path):
    """--auto takes the recommended key: the endpoint answers 401 without it, 200 with it, from the head
    and from the worker; the key's value is nowhere the console wrote; a resume (a new process, which
    never held the key) reaches the engine with the same key."""
    state = tmp_path / "state"
    with demo_cluster(tmp_path) as demo:
        head, worker = demo["spark-1a32"], demo["spark-5be3"]
        rc, first, err1 = deploy(state, "--config", demo["config"], "--auto", "--until", "serve")
        assert rc == 0, (err1, first[-3:])
        assert decisions(first)["serve.access"]["answer"] == "api-key"
        key = ssh(head, f"cat {KEY_FILE}").strip()
        assert len(key) >= 64
        dep_id = next((state / "deployments").glob("*.json")).stem
        rc, resumed, err2 = deploy(state, "--config", demo["config"], "--resume", dep_id, "--auto")
        assert rc == 0, (err2, resumed[-3:])
        assert steps(resumed)["verify"] == "done" and ssh(head, f"cat {KEY_FILE}").strip() == key
        ip = _fast_ip(state, "spark-1a32")
        status = "curl -s -o /dev/null -w '%{http_code}' --max-time 10"
        assert ssh(head, f"{status} http://127.0.0.1:8000/v1/models") == "401"
        assert ssh(head, f"{status} -H 'Authorization: Bearer {key}' http://127.0.0.1:8000/v1/models") == "200"
        assert ssh(worker, f"{status} http://{ip}:8000/v1/models") == "401"
        assert ssh(worker, f"{status} -H 'Authorization: Bearer {key}' http://{ip}:8000/v1/models") == "200"
        assert ssh(worker, f"{status} http://{ip}:8000/health") == "200"
        listening = ssh(head, "ss -ltn")
        assert ":8265 " not in listening  # no Ray dashboard: the story starts vLLM natively, no Ray
    said = next(e["text"] for e in resumed if e["event"] == "note" and e["text"].startswith("endpoint "))
    assert "with the API key" in said and f"cat {KEY_FILE}" in said
    for text in _everything_said(state, (first, err1), (resumed, err2)):
        assert key not in text


@pytest.mark.timeout(400)
def test_local_listens_on_the_heads_loopback_and_verify_says_tunnel(tmp_path):
    """serve.access=local: vLLM on 127.0.0.1, unreachable from the worker, no key made or passed; verify
    gives the tunnel, and the result's endpoint is the tunnel's end. (Open, the third answer, is the
    engine of before: the twin test and the verify tests above say what it answers and what is said.)"""
    state = tmp_path / "state"
    with demo_cluster(tmp_path) as demo:
        head, worker = demo["spark-1a32"], demo["spark-5be3"]
        rc, events, err = deploy(state, "--config", demo["config"], "--auto", "--answer", "serve.access=local")
        assert rc == 0, (err, events[-3:])
        ip = _fast_ip(state, "spark-1a32")
        assert "127.0.0.1:8000 " in ssh(head, "ss -ltn")
        assert subprocess.run([*worker.split(), f"curl -s http://{ip}:8000/v1/models"], capture_output=True,
                              timeout=30).returncode == 7
        assert ssh(head, "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/v1/models") == "200"
    said = next(e["text"] for e in events if e["event"] == "note" and e["text"].startswith("endpoint "))
    assert said.startswith("endpoint http://localhost:8000/v1 through an SSH tunnel only") and "ssh -L 8000" in said
    assert events[-1]["endpoint"] == "http://localhost:8000/v1"
    journal = (state / "journal.jsonl").read_text()
    assert "VLLM_API_KEY" not in journal and "random/uuid" not in journal and "--host 127.0.0.1" in journal
