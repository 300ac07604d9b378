"""Issue 26: the rehearsal. Read a cluster without changing it, build its twin, run the whole flow there.

The "real" cluster here is the story demo reached over SSH like any other (its own sshd, host keys
checked): the read-only walk must send no change to it (its process table, its containers, the
journal), and the twin written from it must lead the wizard to the story's own decisions and send
the very commands the story's own run sends, in the same order. What the twin invents is said.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from sparkconsole.deploy import freeing
from sparkconsole.deploy import twin as T
from sparkconsole.deploy.decisions import ScriptedAnswers
from sparkconsole.deploy.events import CommandEvent, DecisionEvent
from sparkconsole.deploy.flow import DEFAULT_MODEL, Options
from sparkconsole.deploy.recon import Holder, Listener, NodeFacts
from sparkconsole.deploy.rehearsal import TWIN_SPEED, load_answers, read_cluster, rehearse_on_twin
from sparkconsole.errors import UserError
from sparkconsole.journal import Journal
from sparkconsole.remote import hub_read_rate, parse_read_rate
from sparkconsole.sim import start_demo_cluster
from sparkconsole.sim.clock import SimClock
from sparkconsole.sim.model import FAST_LINK_RSYNC_BPS, INTERNET_BPS, PEER_SSH_S
from sparkconsole.sim.shell import Shell
from sparkconsole.sim.twin import build_twin, up_seconds

OPTIONS = Options(model=DEFAULT_MODEL)


@pytest.fixture(autouse=True)
def _catalogues_as_they_were():
    """A twin registers the models and images it guesses in the simulator's catalogues (module-wide):
    each test here leaves them as it found them, so no other test sees a twin's guesses."""
    from sparkconsole.sim import model as M

    saved = (dict(M.MODELS), dict(M.IMAGES), dict(M.HUB_CONFIGS), set(M.TWIN_ARCHS), dict(M._FILES_CACHE))
    yield
    for live, old in zip((M.MODELS, M.IMAGES, M.HUB_CONFIGS, M.TWIN_ARCHS, M._FILES_CACHE), saved, strict=True):
        live.clear()
        live.update(old)


def _ids(command: str) -> str:
    """A command with the deployment's own random ids (job folders, container names) made equal."""
    return re.sub(r"\b[0-9a-f]{8}\b", "ID", command)


def _quiet(sim) -> None:
    """The story's small services (embeddings, reranker) serve no traffic here. With traffic, which
    of the two is less busy (what decides between two services of the same size: freeing._key)
    depends on whether a request is running in the very second the free-memory step reads, and a
    twin copies one second: a real cluster can likewise recommend the other one a minute later."""
    for ct in sim.containers:
        if ct.engine is not None and ct.name in ("embeddings", "reranker"):
            ct.engine.activity = 0.0


async def _story_run() -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    """The story's own deployment, for real on a fresh story cluster, with the recommended answers:
    its decisions and the changes it sent, in order."""
    from sparkconsole.deploy.opening import open_deployment
    from sparkconsole.deploy.runner import Settings
    from sparkconsole.deploy.session import run_flow
    from sparkconsole.deploy.state import DeploymentState, StateStore

    events: list = []

    async def yes(step, commands) -> bool:
        return True

    async with start_demo_cluster(scenario="story", speed=TWIN_SPEED) as demo:
        _quiet(demo.sim)
        state = DeploymentState.new(OPTIONS.model, OPTIONS.to_json(), demo.config.name)
        async with open_deployment(demo.config, OPTIONS, state, answer=ScriptedAnswers({}, auto=True),
                                   emit=events.append, confirm=yes, settings=Settings(poll_s=0.5, speed=TWIN_SPEED),
                                   journal=Journal(), store=StateStore(), lock=False) as session:
            outcome = await run_flow(session.flow)
    assert outcome.ok, outcome.result.message
    decisions = [(e.id, e.answer, e.recommended) for e in events if isinstance(e, DecisionEvent) and e.answer]
    changes = [(e.step, e.node, _ids(e.command)) for e in events
               if isinstance(e, CommandEvent) and e.mutating and e.rc is None]
    return decisions, changes


async def test_the_read_only_walk_changes_nothing_and_the_twin_meets_the_story_s_decisions_and_commands(tmp_path):
    journal = Journal(tmp_path / "journal.jsonl")
    seen: list = []
    async with start_demo_cluster(scenario="story", speed=40) as demo:
        _quiet(demo.sim)
        before = {n: [(c.name, c.state(demo.sim.now())) for c in demo.sim.containers_on(n)] for n in demo.sim.nodes}
        files_before = {n: len(demo.sim.fs(n).entries) for n in demo.sim.nodes}
        twin = await read_cluster(demo.config, OPTIONS, {}, journal=journal, emit=seen.append)
        after = {n: [(c.name, c.state(demo.sim.now())) for c in demo.sim.containers_on(n)] for n in demo.sim.nodes}
        files_after = {n: len(demo.sim.fs(n).entries) for n in demo.sim.nodes}
    reads = [e for e in seen if isinstance(e, CommandEvent)]
    assert reads and not [e for e in reads if e.mutating]  # recon and every probe went out; no change did
    assert before == after and files_before == files_after
    assert not journal.path.exists()
    assert [n.node for n in twin.nodes] == ["spark-1a32", "spark-5be3"]
    assert twin.weights == {"spark-1a32": False, "spark-5be3": False}
    assert any("own Python" in x for x in twin.not_checked)  # the engine check needs a container
    assert twin.measured["command_s"] is not None

    # the Hub's rate, read as a bounded ranged read to /dev/null on the node that downloads
    assert twin.measured["hub_download"] == pytest.approx(INTERNET_BPS, rel=0.05)
    # the fast link as a copy sees it, and one ssh connection's cost: zeros streamed over ssh to `wc -c`
    # on the peer, timed on the node (the simulator's own milliseconds are not in a node's clock)
    assert twin.measured["fast_link_copy"] == pytest.approx(FAST_LINK_RSYNC_BPS, rel=0.05)
    assert twin.measured["peer_ssh_s"] == pytest.approx(PEER_SSH_S, rel=0.05)
    assert twin.measured["hf_start_s"] is None  # a stock Spark has no hf on the host: nothing to time
    path = T.save(twin, tmp_path / "twin.json")
    token = demo.sim.nodes["spark-1a32"].hf_token
    assert token and token not in path.read_text() and twin.nodes[0].token  # its presence only
    r = await rehearse_on_twin(T.load(path), OPTIONS, {})
    assert r.result.ok, r.result.message
    decisions, changes = await _story_run()
    assert [(d.id, d.answer, d.recommended) for d in r.decisions] == decisions
    assert [(p.step, p.node, _ids(p.command)) for p in r.changes] == changes
    # the estimate: the download (125 GB at the Hub's 112 MB/s: about 19 min) is the longest step
    weights = next(s for s in r.steps if s.step == "weights")
    assert 17 * 60 < (weights.seconds or 0) < 22 * 60
    assert r.critical_path()[0].step == "weights"
    assert any("image copy" in x and "not measured" in x for x in r.invented)  # docker load is a change
    assert not any("hub download" in x or "fast link" in x or "ssh connection" in x for x in r.invented)  # measured

    # a line half as fast: the download, the critical path, takes about twice as long
    slow = T.load(path)
    slow.measured["hub_download"] = INTERNET_BPS / 2
    r2 = await rehearse_on_twin(slow, OPTIONS, {"free-memory.stop": r.answers()["free-memory.stop"]})
    weights2 = next(s for s in r2.steps if s.step == "weights")
    assert (weights2.seconds or 0) == pytest.approx(2 * (weights.seconds or 0), rel=0.1)


def test_a_hub_read_is_bounded_and_written_nowhere():
    cmd = hub_read_rate(DEFAULT_MODEL, "model-00001-of-00040.safetensors").shell()
    assert "-r 0-67108863" in cmd and "-o /dev/null" in cmd and "--max-time 20" in cmd
    assert parse_read_rate("67108864 0.180000 0.779000\n") == pytest.approx(67108864 / 0.599)
    assert parse_read_rate("1024 0.1 0.2") is None and parse_read_rate("curl: (6) no host") is None
    with pytest.raises(UserError):
        hub_read_rate(DEFAULT_MODEL, "../../etc/passwd")


def _facts(**over) -> NodeFacts:
    base = dict(node="gx10-a", user="jhunt", uid=1001, gid=1001, groups=["jhunt", "adm", "sudo", "render", "docker"],
                home="/home/jhunt", sudo="none", tools={"hf": False, "uvx": False, "rsync": False, "ping": True},
                hub=True, token=True, mem_total=None, mem_available=100 << 30, page_cache=2 << 30,
                containers=[{"name": "ollama", "image": "ollama/ollama:latest", "state": "running",
                             "status": "Up 3 days", "mem": 900 << 20, "cpu": 4.2}],
                holders=[Holder("process", "/usr/bin/ollama", 6 << 30, detail="container ollama")],
                listeners=[Listener(11434, "0.0.0.0", "ollama", 4242, container="ollama"),
                           Listener(3000, "0.0.0.0", "node", 777)])
    base.update(over)
    return NodeFacts(**base)


async def test_the_twin_node_is_the_node_read():
    f = _facts()
    twin = T.Twin("lab", DEFAULT_MODEL, 0.0, [f, _facts(node="gx10-b", token=False, hub=False, containers=[],
                                                         holders=[], listeners=[], groups=["jhunt", "adm"])])
    sim = build_twin(twin, SimClock(speed=1))
    out, err, _rc = await Shell(sim, "gx10-a").capture("id; echo $HOME; sudo -n true; rsync --version")
    assert "uid=1001(jhunt) gid=1001(jhunt)" in out and "/home/jhunt" in out and "(docker)" in out
    assert "a password is required" in err
    assert "rsync: not found" in err
    out, _e, _rc = await Shell(sim, "gx10-a").capture("ss -ltnp; docker ps --format '{{.Names}} {{.Status}}'")
    assert ":11434" in out and ":3000" in out and "ollama Up 3 days" in out
    # not in the docker group there: docker is refused, as on that node
    _o, err, rc = await Shell(sim, "gx10-b").capture("docker ps")
    assert rc != 0 and "permission denied" in err
    out, _e, _rc = await Shell(sim, "gx10-a").capture("test -s ~/.cache/huggingface/token && echo yes")
    assert out.strip() == "yes"  # a stand-in: the file records presence only
    assert any("ids of groups render" in x for x in sim.invented)


def test_the_twin_file_holds_no_secret_and_says_so(tmp_path):
    f = _facts()
    text = T.dumps(T.Twin("lab", DEFAULT_MODEL, 0.0, [f]))
    assert '"token": true' in text and not re.search(r'hf_[A-Za-z0-9]{20,}', text)
    leaky = _facts(containers=[{"name": "hf_" + "a" * 34, "state": "running"}])
    with pytest.raises(UserError, match="shaped like a secret"):
        T.save(T.Twin("lab", DEFAULT_MODEL, 0.0, [leaky]), tmp_path / "t.json")
    assert not (tmp_path / "t.json").exists()


@pytest.mark.parametrize(("content", "words"), [
    (None, "no such twin file"),
    ("{", "not JSON"),
    ('{"format": "x"}', "not a sparkconsole twin file"),
    ('{"format": "sparkconsole-twin", "version": 9}', "version 9"),
    ('{"format": "sparkconsole-twin", "version": 1, "cluster": "c"}', "missing or of the wrong kind"),
    ('{"format": "sparkconsole-twin", "version": 1, "cluster": "c", "model": "m", "read_at": 0, "nodes": []}',
     "no node"),
])
def test_a_bad_twin_file_is_one_line(tmp_path, content, words):
    p = tmp_path / "twin.json"
    if content is not None:
        p.write_text(content)
    with pytest.raises(T.TwinError, match=words) as exc:
        T.load(p)
    assert exc.value.exit_code == 2 and "\n" not in exc.value.message


def test_docker_status_ages():
    assert up_seconds("Up 25 hours") == 25 * 3600
    assert up_seconds("Up About an hour") == 3600
    assert up_seconds("Up 3 minutes (healthy)") == 180
    assert up_seconds("Up Less than a second") == 1
    assert up_seconds("Exited (0) 2 hours ago") is None


def test_a_fraction_of_a_percent_of_cpu_does_not_decide_what_stops():
    """Two idle services of the same size: the name decides, whatever their CPU read this second
    (0.51 % and 0.77 %, or the other way round the next): the twin and the node agree."""
    def node(a: float, b: float) -> NodeFacts:
        return NodeFacts("n", mem_available=10 << 30,
                         holders=[Holder("container", "embeddings", 8 << 30), Holder("container", "reranker", 8 << 30)],
                         containers=[{"name": "embeddings", "cpu": a}, {"name": "reranker", "cpu": b}])
    assert freeing.choose(node(0.77, 0.51), 17 << 30).stop == ("embeddings",)
    assert freeing.choose(node(0.51, 0.77), 17 << 30).stop == ("embeddings",)
    assert freeing.choose(node(1.4, 0.4), 17 << 30).stop == ("embeddings",)
    assert freeing.choose(node(30.0, 0.5), 17 << 30).stop == ("reranker",)  # a busy one is still spared


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sparkconsole.cli", *args], capture_output=True, text=True,
                          timeout=280, cwd=cwd)


def test_the_cli_rehearses_writes_the_twin_and_its_answers_lead_the_real_run(tmp_path):
    twin_file = tmp_path / "story-twin.json"
    out = _cli("deploy", "--demo", "--rehearse", "--json", "--twin-out", str(twin_file), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [json.loads(x) for x in out.stdout.splitlines()]
    summary = lines[-1]
    assert summary["event"] == "rehearsal" and summary["ok"] and summary["estimates"]["total_s"] > 0
    assert any(e["event"] == "planned" and e["mutating"] for e in lines)
    assert summary["answers"]["plan.layout"] == "tp2"
    report = twin_file.with_name("story-twin.rehearsal.json")
    assert load_answers(report) == summary["answers"]
    # the twin opens as the demo's cluster (named after the cluster it copies, apart from it)
    out = _cli("deploy", "--demo", "--twin", str(twin_file), "--until", "recon", "--yes", cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "on spark-1a32, spark-5be3" in out.stdout and "twin-demo-story" not in out.stderr
    # the real run (here the story cluster again) takes the rehearsal's answers
    out = _cli("deploy", "--demo", "--answers-from", str(report), "--until", "plan", "--yes", cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "plan.layout" in out.stdout and "→ tp2 (preset" in out.stdout
    # and afterwards, where the real run differed from the rehearsal (it stopped after plan: the rest
    # is not reached yet, and nothing it sent was unforeseen)
    out = _cli("deploy", "--compare-rehearsal", str(report), "--json", cwd=tmp_path)
    assert out.stdout.strip(), out.stderr
    cmp = json.loads(out.stdout)
    assert out.returncode == 0 and cmp["agrees"], out.stdout + out.stderr
    # the plan step's two decisions: the layout, and images too or text only
    assert cmp["same_decisions"] == 2 and "free-memory.stop" in cmp["not_reached"] and cmp["unforeseen"] == []


@pytest.mark.parametrize(("args", "words"), [
    (("--twin", "x.json"), "add --demo"),
    (("--twin-out", "x.json"), "goes with --rehearse"),
    (("--rehearse", "--plan-only"), "cannot be combined"),
    (("--demo", "--twin", "missing.json"), "no such twin file"),
    (("--demo", "--answers-from", "missing.json"), "no such rehearsal report"),
])
def test_bad_rehearsal_flags_are_one_line(tmp_path, args, words):
    out = _cli("deploy", *args, cwd=tmp_path)
    assert out.returncode == 2 and words in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_a_model_outside_the_catalogue_needs_what_the_hub_said_of_it():
    with pytest.raises(T.TwinError, match="from its files and config on the Hub"):
        build_twin(T.Twin("lab", "sclab/never-read", 0.0, [_facts()]))


def test_the_comparison_names_what_reality_did_otherwise():
    from sparkconsole.deploy.compare import compare, format_comparison
    from sparkconsole.deploy.state import DeploymentState
    from sparkconsole.journal import JournalEntry

    report = {"event": "rehearsal", "cluster": "sparks", "model": DEFAULT_MODEL,
              "answers": {"plan.layout": "tp2", "free-memory.stop": "spark-a:reranker"},
              "estimates": {"steps": {"free-memory": 2.0}},
              "events": [{"event": "step", "step": "free-memory", "state": "done"},
                         {"event": "planned", "step": "free-memory", "node": "spark-a",
                          "command": "docker stop reranker", "mutating": True}]}
    st = DeploymentState.new(DEFAULT_MODEL, {}, "sparks")
    st.answers = {"plan.layout": "tp2", "free-memory.stop": "spark-a:embeddings"}
    st.steps = {"free-memory": "done"}
    st.result = "served"
    journal = [JournalEntry("2026-12-02T10:00:00+00:00", "spark-a", "docker stop embeddings", "stop", 0, 1.0,
                            deployment=st.id, step="free-memory"),
               JournalEntry("2026-12-02T10:00:01+00:00", "spark-a", "docker stop other", "stop", 0, 1.0,
                            deployment="another", step="free-memory")]
    c = compare(report, st, journal)
    assert not c.agrees and c.same_decisions == 1
    assert c.decisions == ["free-memory.stop: rehearsal spark-a:reranker, real spark-a:embeddings"]
    assert c.unforeseen == [("free-memory", "spark-a", "docker stop embeddings")]
    assert c.not_sent == [("free-memory", "spark-a", "docker stop reranker")]
    text = "\n".join(format_comparison(c))
    assert "reality differed" in text and "+ free-memory spark-a $ docker stop embeddings" in text


async def test_a_model_outside_the_catalogue_is_served_by_the_twin_s_hub_as_it_was_read():
    """The lab's tiny model (tests/lab: its config and generated weights): the twin's Hub lists its
    files with the sizes and sha256 the rehearsal read, and serves its config; the load is invented."""
    import hashlib

    from tests.lab.hosts import MODEL_ID, model_files

    files = model_files()
    hub = [T.HubFileFacts(p, len(b), hashlib.sha256(b).hexdigest() if p.endswith(".safetensors") else None)
           for p, b in sorted(files.items())]
    config = json.loads(files["config.json"])
    twin = T.Twin("lab", MODEL_ID, 0.0, [_facts()], hub_files=hub, model_config=config)
    twin = T.Twin.from_json(json.loads(T.dumps(twin)))  # through the file
    sim = build_twin(twin, SimClock(speed=1))
    base = "https://huggingface.co"
    out, _e, rc = await Shell(sim, "gx10-a").capture(f"curl -sS '{base}/api/models/{MODEL_ID}/tree/main?recursive=true'")
    listed = {f["path"]: f for f in json.loads(out)}
    assert rc == 0 and set(listed) == set(files)
    st = listed["model.safetensors"]
    assert st["size"] == len(files["model.safetensors"])
    assert st["lfs"]["oid"] == hashlib.sha256(files["model.safetensors"]).hexdigest()
    out, _e, rc = await Shell(sim, "gx10-a").capture(f"curl -sSfL '{base}/{MODEL_ID}/resolve/main/config.json'")
    assert rc == 0 and json.loads(out) == config
    assert any("not in the twin's catalogue" in x for x in sim.invented)
    assert any(config["architectures"][0] in x for x in sim.invented)


async def test_the_console_opens_on_a_twin(tmp_path):
    """``sparkconsole demo --twin FILE``: the console on the twin's nodes, said in its title."""
    from sparkconsole.ui.app import DemoOptions, SparkConsoleApp
    from tests.ui_support import wait_ready

    twin = T.Twin("lab", DEFAULT_MODEL, 0.0, [_facts(), _facts(node="gx10-b", containers=[], holders=[], listeners=[])])
    app = SparkConsoleApp(demo=DemoOptions(nodes=2, twin=twin, speed=1.0), interval=1.0, remember_theme=False,
                          journal=Journal(tmp_path / "journal.jsonl"))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_ready(pilot, app)
        assert "twin of lab" in app.sub_title
        assert app.demo_cluster is not None and list(app.demo_cluster.sim.nodes) == ["gx10-a", "gx10-b"]
        assert [n.name for n in app.config.nodes] == ["gx10-a", "gx10-b"]
        while not all(p.state.sample for p in app.poller.pollers.values()):
            await pilot.pause(0.05)
        a = app.poller.pollers["gx10-a"].state.sample
        assert [c.name for c in a.containers] == ["ollama"]
        app.autopoll = False
        await app.workers.wait_for_complete()


# ---- what decides a small copy's time (the lab's tiny model: fixed costs, not bytes) ----------

def test_a_link_stream_is_bounded_timed_on_the_node_and_written_nowhere():
    from sparkconsole.remote import hf_start_time, parse_link_rate, parse_span, peer_link_rate

    cmd = peer_link_rate("nvidia@192.168.200.2").shell()
    assert "head -c 134217728 /dev/zero | timeout 30 ssh -o BatchMode=yes" in cmd and "'wc -c'" in cmd
    assert cmd.count("$(date +%s.%N)") == 3 and ">" not in cmd.replace("2>", "")  # nothing is written
    # the lab's own numbers (lab-a to lab-b): 0.326 s for `ssh true`, then 0.926 s for the stream's ssh
    got = parse_link_rate("134217728 1796238482.184686751 1796238482.510767273 1796238483.436431203\n")
    assert got is not None and got[0] == pytest.approx(0.326, abs=1e-3)
    assert got[1] == pytest.approx(134217728 / (0.926 - 0.326), rel=1e-3)
    assert parse_link_rate("ssh: connect to host 192.168.200.2 port 22: No route to host") is None
    assert parse_link_rate("0 1 2 3") == (1.0, None)  # nothing went through: no rate
    assert "hf version > /dev/null" in hf_start_time().shell()
    assert parse_span("1796238483.438368342 1796238483.867399657") == pytest.approx(0.429, abs=1e-3)
    assert parse_span("hf: not found") is None
    with pytest.raises(UserError):
        peer_link_rate("nvidia@192.168.200.2;reboot")


async def test_a_node_s_clock_inside_a_command_counts_what_it_waited_for_not_the_simulator():
    """At x1000 every millisecond the simulator computes reads as a second of the node's time; a
    command's own clock (``date`` inside it) counts what it waited for, so the stream's timing on a
    simulated node is the link's, as on a real one. A sleep cut short (a ``timeout``'s watch) adds
    nothing."""
    import asyncssh

    from sparkconsole.remote import parse_link_rate, peer_link_rate

    async with start_demo_cluster(scenario="story", speed=1000) as demo:
        sim, node = demo.sim, demo.config.nodes[0]
        a, b = list(sim.nodes)
        cmd = peer_link_rate(f"{sim.login(b).user}@{sim.nodes[b].fast_ip}").shell()
        async with asyncssh.connect(node.host, port=node.port, username=node.user, client_keys=[node.identity],
                                    known_hosts=node.known_hosts) as conn:  # as the console sends it
            res = await conn.run(cmd)
    assert res.exit_status == 0, res.stderr
    got = parse_link_rate(str(res.stdout))
    assert got is not None and str(res.stdout).split()[0] == "134217728"  # every byte reached the peer's wc
    assert got[0] == pytest.approx(PEER_SSH_S, rel=0.01) and got[1] == pytest.approx(FAST_LINK_RSYNC_BPS, rel=0.01)
    sim.nodes[a].tools["hf"] = True  # a host with hf (the lab's): it says its version so, into a pipe too
    out, _e, rc = await Shell(sim, a).capture("hf version")
    assert rc == 0 and out.endswith("  version: 2.4.0\n") and "hf version" in out


def test_a_twin_with_little_to_move_runs_at_wall_speed():
    """The console runs at wall speed beside the twin: at x1000 a small model's download ends before
    the copy beside it has started, so a twin with little to move runs at x1, and a 125 GB one fast."""
    from sparkconsole.deploy.rehearsal import TWIN_SPEED, TWIN_WALL_S, twin_speed

    small = T.Twin(cluster="lab", model="sclab/tiny-qwen3", read_at=0.0, nodes=[],
                   weights={"a": False, "b": False}, hub_files=[T.HubFileFacts("model.safetensors", 5 << 20, "0" * 64)])
    assert twin_speed(small) == 1.0
    big = T.Twin(cluster="sparks", model=DEFAULT_MODEL, read_at=0.0, nodes=[], weights={"a": False, "b": False},
                 hub_files=[T.HubFileFacts(f"model-{i:05d}.safetensors", 3_125_000_000, "0" * 64) for i in range(40)],
                 measured={"hub_download": INTERNET_BPS, "fast_link_copy": FAST_LINK_RSYNC_BPS})
    work = 125e9 / INTERNET_BPS + 125e9 / FAST_LINK_RSYNC_BPS
    assert twin_speed(big) == pytest.approx(work / TWIN_WALL_S) and 1 < twin_speed(big) < TWIN_SPEED
    assert twin_speed(replace(big, weights={"a": True, "b": True})) == 1.0  # nothing to move


def test_a_step_that_sent_nothing_is_timed_with_the_step_before_it():
    """The journal holds changes only: a step that sent none (free-memory answering "none") has no
    time of its own there, so its estimate joins the step before it, and each span starts where its
    first change started (an entry is written when its command ended)."""
    from sparkconsole.deploy.compare import compare
    from sparkconsole.deploy.state import DeploymentState
    from sparkconsole.journal import JournalEntry

    report = {"answers": {}, "events": [],
              "estimates": {"steps": {"recon": 0.3, "weights": 6.5, "images": 1.4, "free-memory": 0.5, "caches": 0.3}}}
    st = DeploymentState.new(DEFAULT_MODEL, {}, "lab")
    st.steps = {"recon": "done", "weights": "done", "images": "done", "free-memory": "done", "caches": "done"}
    j = [JournalEntry("2026-12-02T10:00:00.100000+00:00", "a", "mkdir -p x", "", 0, 0.1, deployment=st.id, step="weights"),
         JournalEntry("2026-12-02T10:00:07+00:00", "a", "copy image", "", 0, 1.0, deployment=st.id, step="images"),
         JournalEntry("2026-12-02T10:00:17+00:00", "a", "evict", "", 0, 0.5, deployment=st.id, step="caches")]
    times = {s: (e, r) for s, e, r in compare(report, st, j).times}
    assert times["recon"] == (0.3, None)
    assert times["weights"] == (6.5, 6.0)  # 10:00:00.0 (started) → 10:00:06.0 (the images' first change started)
    assert times["images + free-memory"] == (1.9, 10.5)
    assert times["caches"] == (0.3, 0.5)
