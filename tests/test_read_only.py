"""Read-only and plan-only change nothing on a node (issue 23, item 10).

Two things changed nodes while the deployment only "looked": the engine check ran the image
(``docker run --rm IMAGE python3 -c …`` creates a container and takes the GPU) as a read, and recon
made the HF cache's hub folder (``mkdir -p``) before measuring its free space. Now the check is a
change of the engine step's ``send``: shown (``--plan-only`` prints it), confirmed, journaled, and
never sent read-only or plan-only, where the step says what it did not check and decides by the
images' names (the known images, the vLLM version in a tag). Recon measures the nearest folder that
exists.

Every command the flow sent is recorded at the transport (demo cluster over real SSH), so the test
asserts over what reached the nodes, not over what the flow meant to send.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from sparkconsole.config import NodeConfig
from sparkconsole.deploy.decisions import ScriptedAnswers
from sparkconsole.deploy.flow import Options
from sparkconsole.deploy.opening import open_deployment
from sparkconsole.deploy.recon import recon_command
from sparkconsole.deploy.runner import Settings
from sparkconsole.deploy.session import run_flow
from sparkconsole.deploy.state import DeploymentState, StateStore
from sparkconsole.journal import Journal
from sparkconsole.remote import command
from sparkconsole.sim import start_demo_cluster
from sparkconsole.transport import node_transport

SPEED = 100.0
pytestmark = pytest.mark.timeout(300)

# What changes a node, by its words: whatever the command's own flag says (the engine check was
# flagged a read). Recon's own `sudo -n -l /usr/bin/tee …` only lists a rule, its `for t in … rsync …` looks
# for tools, and `2>/dev/null` writes nothing.
CHANGES = re.compile(
    r"\bdocker\s+(?:run|rm|stop|start|restart|kill|pull|exec|load|create|rename|update)\b"
    r"|\bmkdir\b|\btouch\b|\brm\s+-|\bsetsid\b|\bdd\s+if=|\brsync\s+-|\bsystemctl\s+(?:start|stop|restart)\b"
    r"|\bkill\s+-(?:TERM|KILL|9|15)\b|\|\s*(?:sudo\s+-n\s+)?/usr/bin/tee\b|\bip\s+link\s+set\b"
    r"|(?<![0-9&>])>\s*(?!/dev/null|&)[\"'$/~\w]")


async def _session(tmp_path: Path, scenario: str, *, plan_only: bool = False, read_only: bool = False,
                   presets: dict[str, str] | None = None, confirm=None, journal: Journal | None = None,
                   before=None, after=None, until: str | None = None
                   ) -> tuple[Any, list[tuple[str, Any]], list[Any], list[tuple[str, str, list]]]:
    """The whole flow on a demo cluster: its outcome, every command sent (node, RemoteCommand), every
    event, and what each step planned (``--plan-only``'s listing). ``before(demo)`` / ``after(demo)``
    run on the cluster around it."""
    async with start_demo_cluster(scenario=scenario, speed=SPEED) as demo:
        if before is not None:
            await before(demo)
        sent: list[tuple[str, Any]] = []
        events: list[Any] = []
        planned: list[tuple[str, str, list]] = []

        def factory(node: NodeConfig):
            t = node_transport(demo.config, node)
            inner = t.run

            async def run(cmd, *args, **kwargs):
                sent.append((node.name, cmd))
                return await inner(cmd, *args, **kwargs)

            t.run = run
            return t

        state = DeploymentState.new(Options().model, Options().to_json(), demo.config.name)
        extra = {"confirm": confirm} if confirm is not None else {}
        async with open_deployment(demo.config, Options(), state, answer=ScriptedAnswers(presets or {}, auto=True),
                                   emit=events.append, store=StateStore(tmp_path / "deployments"),
                                   settings=Settings(poll_s=2.0 / SPEED, speed=SPEED), journal=journal,
                                   read_only=read_only, plan_only=plan_only, transport_factory=factory,
                                   locks=tmp_path / "locks", **extra) as session:
            outcome = await run_flow(session.flow, until=until,
                                     on_plan=lambda s, t, cmds: planned.append((s, t, list(cmds))))
        if after is not None:
            await after(demo)
        return outcome, sent, events, planned


def _changes_sent(sent: list[tuple[str, Any]]) -> list[str]:
    return [f"{n}: {c.shell()[:160]}" for n, c in sent if c.mutating or CHANGES.search(c.shell())]


def _decision(events: list[Any], ident: str) -> Any:
    return next(e for e in events if e.kind == "decision" and e.id == ident and e.answer is not None)


def test_the_change_words_see_the_two_changes_that_went_out_as_reads():
    """The classifier the tests below rely on: it sees the engine check and recon's old mkdir, and
    none of recon's reads."""
    old_disk = 'mkdir -p "${HF_HOME:-$HOME/.cache/huggingface}"/hub && df -B1 -P "${HF_HOME:-$HOME/.cache/huggingface}"'
    assert CHANGES.search("docker run --rm --gpus all --entrypoint python3 vllm/vllm-openai:v0.17.0 -c 'x'")
    assert CHANGES.search(old_disk) and CHANGES.search("docker exec -d c sh -c 'exec vllm serve > /x/serve.log 2>&1'")
    assert not CHANGES.search(recon_command("Qwen/Qwen3.5-122B-A10B-FP8").shell())


async def test_plan_only_sends_no_change_shows_the_engine_check_and_still_decides(tmp_path):
    outcome, sent, events, planned = await _session(tmp_path, "story", plan_only=True)
    assert outcome.ok, outcome.result.message
    assert _changes_sent(sent) == []
    assert sent and all(not c.mutating for _n, c in sent)
    # the check a real run makes is shown, as a change of the engine step
    engine = [c for s, _t, cmds in planned if s == "engine" for _n, c in cmds]
    # the GB10 build is pulled, then its own Python run: both shown as the engine step's changes
    assert [c.argv[:2] for c in engine] == [("docker", "pull"), ("docker", "run")] and all(c.mutating for c in engine)
    assert engine[1].shell().startswith("docker run --rm --gpus all --entrypoint python3 nvcr.io/nvidia/vllm:26.05-py3 -c ")
    # said, and decided by the images' names: the GB10 build; of the head's, the upstream 0.17 knows the
    # model (Qwen3.5 from vLLM 0.16 on) but has no sm_121 kernels, the 0.14 one does not know it
    said = [e.text for e in events if e.kind == "note" and e.step == "engine"]
    assert any(t.startswith("not checked: the own Python of ") and "plan-only sends no change" in t for t in said)
    assert any(t.startswith("not recommended on GB10: vllm/vllm-openai:v0.17.0") for t in said)
    d = _decision(events, "engine.image")
    assert d.answer == "nvcr.io/nvidia/vllm:26.05-py3"
    assert any("v0.14.1" in m and "NOT registered" in m and "by its name" in m for m in d.measured)
    # the later steps still plan: the download in the image's own hf (a stock Spark has none on the host)
    weights = [c.shell() for s, _t, cmds in planned if s == "weights" for _n, c in cmds]
    assert any("--entrypoint hf nvcr.io/nvidia/vllm:26.05-py3 download" in w for w in weights)


async def test_plan_only_with_an_image_without_ray_still_recommends_native_by_its_name(tmp_path):
    outcome, sent, events, _planned = await _session(tmp_path, "ngc-image", plan_only=True)
    assert outcome.ok and _changes_sent(sent) == []
    assert _decision(events, "engine.image").answer == "nvcr.io/nvidia/vllm:26.05-py3"
    d = _decision(events, "cluster.executor")
    assert d.answer == "native" and any("Ray ABSENT (by its name" in m for m in d.measured), d.measured


async def test_read_only_sends_no_change_and_the_engine_step_says_what_it_did_not_check(tmp_path):
    # the image on the head, chosen (a GB10 build would first be pulled: a change, refused read-only)
    outcome, sent, events, _planned = await _session(tmp_path, "story", read_only=True,
                                                     presets={"engine.image": "vllm/vllm-openai:v0.17.0"})
    assert _changes_sent(sent) == []
    steps = {e.step: e.state for e in events if e.kind == "step"}
    assert steps["recon"] == "done" and steps["engine"] == "done"
    # it goes on until the first change, which is refused (the download of the weights)
    assert not outcome.ok and "read-only" in outcome.result.message and "refused" in outcome.result.message
    said = [e.text for e in events if e.kind == "note" and e.step == "engine"]
    assert any(t.startswith("not checked: vllm/vllm-openai:v0.17.0's own Python") for t in said), said
    assert _decision(events, "engine.image").answer == "vllm/vllm-openai:v0.17.0"
    assert not any(e.kind == "command" and e.mutating for e in events)


async def test_a_real_run_shows_confirms_and_journals_the_engine_check(tmp_path):
    asked: list[tuple[str, str]] = []

    async def confirm(step, commands) -> bool:
        asked.extend((step, c.shell()) for _n, c in commands)
        return True

    journal = Journal(tmp_path / "journal.jsonl")
    outcome, sent, events, _planned = await _session(tmp_path, "healthy", confirm=confirm, journal=journal)
    assert outcome.ok, outcome.result.message
    # the engine step's check (`python3 -c PROGRAM`), not the canary's writer (`python3 -`, on stdin)
    checks = [c for _n, c in sent if "--entrypoint python3" in c.shell() and c.stdin is None]
    assert len(checks) == 1 and checks[0].mutating  # run once, on the chosen image, as a change
    text = checks[0].shell()
    assert ("engine", text) in asked
    shown = [e for e in events if e.kind == "command" and e.command == text]
    assert [e.rc for e in shown] == [None, 0] and shown[0].mutating  # shown before it ran, then its result
    assert any(j.step == "engine" and j.command == text and j.exit_code == 0 for j in journal.read())


async def test_recon_measures_the_disk_where_the_weights_go_without_making_anything(tmp_path):
    """A node with no HF cache yet: recon reads the free space of the nearest folder that exists (the
    one a new cache would land on) and leaves the node as it was."""
    hf = "/home/nvidia/.cache/huggingface"
    seen: list[int | None] = []

    async def on_worker(demo, argv: list[str]) -> int | None:
        t = node_transport(demo.config, demo.config.node("spark-5be3"))
        try:
            return (await t.run(command(*argv))).exit_status
        finally:
            await t.close()

    async def no_cache(demo) -> None:
        assert await on_worker(demo, ["rm", "-rf", hf]) == 0

    async def still_none(demo) -> None:
        seen.append(await on_worker(demo, ["test", "-e", hf]))

    _outcome, sent, events, _planned = await _session(tmp_path, "story", plan_only=True, before=no_cache,
                                                      after=still_none)
    assert _changes_sent(sent) == []
    assert seen == [1]  # recon made no folder
    recon = [e.text for e in events if e.kind == "note" and e.step == "recon" and e.node == "spark-5be3"
             and "disk free" in e.text]
    m = re.search(r"disk free (\d+\.\d\d) TB at " + re.escape(hf), recon[0])
    assert m and float(m.group(1)) > 1.0, recon  # the file system the cache will land on


async def test_an_image_chosen_by_its_name_that_does_not_serve_the_model_is_asked_again_with_the_measurement(
        tmp_path, monkeypatch):
    """The decision goes by the images' names until one is run; a name can mislead (here a vLLM 0.14.1
    image tagged v0.16.0, a version that registers Qwen3.5). The chosen image's own Python says so,
    and the flow goes back to the engine step, which asks again with what was measured: the known
    image, pulled, then checked in its turn."""
    import dataclasses

    from sparkconsole.sim.model import IMAGE_OLD, IMAGES

    misleading = "example.org/vllm:v0.16.0"  # not an upstream repo: on a GB10 those are never recommended
    fake = dataclasses.replace(IMAGE_OLD, ref=misleading)
    monkeypatch.setitem(IMAGES, misleading, fake)  # what the twin's docker runs under that name

    async def retagged(demo) -> None:
        head = demo.sim.nodes[next(iter(demo.sim.nodes))]
        head.images[misleading] = fake

    outcome, sent, events, _planned = await _session(tmp_path, "old-image", before=retagged, until="engine")
    assert outcome.ok, outcome.result.message
    asked = [e for e in events if e.kind == "decision" and e.id == "engine.image" and e.answer is not None]
    assert [e.answer for e in asked] == [misleading, "nvcr.io/nvidia/vllm:26.05-py3"]
    assert any(m.startswith(f"{misleading}: vLLM 0.16.0") and "by its name" in m for m in asked[0].measured)
    assert any(m.startswith(f"{misleading}: vLLM 0.14.1,") and "NOT registered" in m for m in asked[1].measured)
    back = [e.note for e in events if e.kind == "step" and e.step == "engine" and e.state == "failed"]
    assert back and back[0].startswith(f"back to engine: {misleading}: its vllm (0.14.1) does not register")
    checks = [c.argv[c.argv.index("python3") + 1] for _n, c in sent if "--entrypoint python3" in c.shell()]
    assert checks == [misleading, "nvcr.io/nvidia/vllm:26.05-py3"]  # each run once, as a change
    assert all(c.mutating for _n, c in sent if "--entrypoint python3" in c.shell())
