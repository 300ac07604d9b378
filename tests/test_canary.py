"""The canary on the demo: before the weights move, the chosen image writes a miniature of the model
with its own Python, serves it at TP=1 with the deployment's flags and answers one chat; an image
whose kernels fail on GB10 meets its failure there, with the engine's own words, and the recommended
answer recovers through a GB10 build.

Read back through the CLI's ``--json`` events, as an operator's script would, not through the
modules that built them. The simulated node does what a Spark does with each command (``hf download``
of named files, ``python3 -`` reading the writer from stdin, vLLM serving a model folder, an upstream
build's block-FP8 GEMM failing on sm_121: vllm#40758, vllm#43367).
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from sparkconsole.deploy.steps.canary import _drop_layout_flags
from sparkconsole.remote import python_stdin_in_image
from sparkconsole.sim import start_demo_cluster
from sparkconsole.sim.sh.interp import Capture
from sparkconsole.sim.shell import Shell

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(600)
WRITER = (ROOT / "sparkconsole" / "serving" / "miniature_writer.py").read_text()


def _deploy(tmp_path: Path, *args: str) -> tuple[int, list[dict], str]:
    env = {**os.environ, "SPARKCONSOLE_STATE_DIR": str(tmp_path / "state")}
    env.pop("SPARKCONSOLE_CONFIG", None)
    r = subprocess.run([sys.executable, "-m", "sparkconsole.cli", "deploy", "--demo", "--speed", "1000", *args, "--json"],
                       cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=500)
    return r.returncode, [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")], r.stderr


def _phases(events: list[dict], level: str = "info") -> list[str]:
    return [e["phase"] for e in events if e["event"] == "canary" and e["level"] == level]


def _step_order(events: list[dict]) -> list[str]:
    return [e["step"] for e in events if e["event"] == "step" and e["state"] == "running"]


def test_auto_runs_the_canary_before_the_weights_and_serves_natively_with_the_fields_flags(tmp_path: Path) -> None:
    rc, events, err = _deploy(tmp_path, "--auto")
    assert rc == 0, err[-2000:]
    assert events[-1]["event"] == "result" and events[-1]["ok"], events[-1]
    assert _phases(events) == ["config", "written", "served", "answered"]
    order = _step_order(events)
    assert order.index("canary") < order.index("weights")
    # the recommended image is a GB10 build, and it is what the canary proved
    image = next(e["answer"] for e in events if e["event"] == "decision" and e["id"] == "engine.image"
                 and e["answer"] is not None)
    assert image.startswith("nvcr.io/nvidia/vllm:")
    canary = [e["command"] for e in events if e["event"] == "command" and e.get("step") == "canary" and e["rc"] is None]
    start = shlex.split(next(c for c in canary if "docker run -d" in c))
    assert image in start and start[start.index("--tensor-parallel-size") + 1] == "1"
    assert start[start.index("--host") + 1] == "127.0.0.1"
    for flag in ("--enable-auto-tool-choice", "--enable-prefix-caching"):
        assert flag in start
    # the writer travelled on stdin: its text is in no command line (nor, so, in the journal)
    assert not any("make_miniature" in (e.get("command") or "") for e in events)
    # the canary's container is gone; the model then serves natively (no Ray) with tool calling
    assert any("docker rm -f" in c and "canary" in c for c in canary)
    assert not any("ray start" in (e.get("command") or "") for e in events)
    serves = [e["command"] for e in events if e.get("step") == "serve" and "docker run" in (e.get("command") or "")]
    assert serves and all("--enable-auto-tool-choice" in c and "--tool-call-parser qwen3_coder" in c
                          and "--enable-prefix-caching" in c for c in serves)
    answered = next(e["text"] for e in events if e["event"] == "canary" and e["phase"] == "answered")
    assert "no performance claim" in answered


def test_an_upstream_image_fails_at_the_canary_and_the_recommended_answer_recovers(tmp_path: Path) -> None:
    rc, events, err = _deploy(tmp_path, "--auto", "--image", "vllm/vllm-openai:v0.17.0")
    assert rc == 0, err[-2000:]
    failed = [e for e in events if e["event"] == "canary" and e["level"] == "error"]
    assert len(failed) == 1 and failed[0]["phase"] == "served"
    assert "Error Internal" in failed[0]["text"]  # the engine's own line, not a paraphrase
    decision = next(e for e in events if e["event"] == "decision" and e["id"] == "canary.failure" and e["answer"])
    assert decision["answer"] == decision["recommended"] == "image"
    assert any("Error Internal" in m for m in decision["measured"])
    images = [e["answer"] for e in events if e["event"] == "decision" and e["id"] == "engine.image" and e["answer"]]
    assert images[0] == "vllm/vllm-openai:v0.17.0" and images[-1].startswith("nvcr.io/nvidia/vllm:")
    # asked again, the failed image is offered last, said why, and not recommended
    again = [e for e in events if e["event"] == "decision" and e["id"] == "engine.image" and e["answer"]][1]
    assert again["options"][-1]["value"] == "vllm/vllm-openai:v0.17.0" or \
        again["options"][-2]["value"] == "vllm/vllm-openai:v0.17.0"  # (an experimental engine may follow)
    assert again["recommended"] != "vllm/vllm-openai:v0.17.0"
    assert _phases(events)[-4:] == ["config", "written", "served", "answered"]
    assert events[-1]["event"] == "result" and events[-1]["ok"]
    # nothing of the weights moved before the canary passed
    order = _step_order(events)
    assert "weights" not in order[:order.index("canary") + 1]


def test_plan_only_shows_the_canary_and_runs_nothing(tmp_path: Path) -> None:
    rc, events, err = _deploy(tmp_path, "--plan-only")
    assert rc == 0, err[-2000:]
    canary = [e["command"] for e in events if e["event"] == "planned" and e.get("step") == "canary"]
    assert any(" download Qwen/Qwen3.5-122B-A10B-FP8 config.json" in c for c in canary)
    fetch = next(c for c in canary if " download Qwen/" in c)
    src = shlex.split(fetch)[shlex.split(fetch).index("--local-dir") + 1]
    assert src.startswith("/hf/sparkconsole/") and src.endswith("/canary/src")  # known before the download
    assert any(f" - {src} " in c for c in canary)
    assert any("docker run -d" in c and "--port 18999" in c for c in canary)
    assert not _phases(events) and not _phases(events, "error")


def test_the_layout_flags_are_the_serve_steps_own() -> None:
    args = ("--tensor-parallel-size", "2", "--nnodes=2", "--headless", "--enable-prefix-caching",
            "--master-addr", "10.0.0.1", "--tool-call-parser", "qwen3_coder", "-pp", "2")
    assert _drop_layout_flags(args) == ("--enable-prefix-caching", "--tool-call-parser", "qwen3_coder")


def test_the_writer_goes_on_stdin_never_on_the_command_line() -> None:
    cmd = python_stdin_in_image("nvcr.io/nvidia/vllm:26.05-py3", WRITER, ["/hf/a", "/hf/b"], name="x", hf_dir="/h",
                                user=(1000, 1000), what="write a miniature")
    assert cmd.stdin == WRITER
    assert "make_miniature" not in cmd.shell() and cmd.shell().endswith("python3 nvcr.io/nvidia/vllm:26.05-py3 - /hf/a /hf/b")
    assert f"{len(WRITER.encode()):,} bytes" in cmd.summary and "--user 1000:1000" in cmd.shell()


async def _sh(demo, node: str, cmd: str, stdin: str | None = None) -> tuple[int, str, str]:
    out, err = Capture(), Capture()
    rc = await Shell(demo.sim, node).run(cmd, out, err, stdin)
    return rc, out.text(), err.text()


def test_the_twin_fetches_only_the_named_files_and_its_writer_refuses_a_family_it_has_none_for() -> None:
    async def main() -> None:
        async with start_demo_cluster(scenario="story", speed=1000) as demo:
            node = next(iter(demo.sim.nodes))  # the demo's first node reaches the internet
            img = "nvcr.io/nvidia/vllm:26.05-py3"
            rc, _o, _e = await _sh(demo, node, f"docker pull {img}")
            assert rc == 0
            run = f"docker run --rm -v /home/nvidia/fresh:/hf -e HF_HOME=/hf --entrypoint hf {img} download"  # an empty cache
            rc, out, err = await _sh(demo, node, f"{run} GadflyII/GLM-4.7-Flash-NVFP4 config.json generation_config.json")
            assert rc == 0, err
            snap = out.strip().splitlines()[-1]
            assert snap.startswith("/hf/hub/models--GadflyII--GLM-4.7-Flash-NVFP4/snapshots/")
            rc, listing, _e = await _sh(demo, node, f"ls {snap.replace('/hf', '/home/nvidia/fresh', 1)}")
            assert sorted(listing.split()) == ["config.json", "generation_config.json"]  # no shard came along
            rc, out, err = await _sh(demo, node, f"docker run --rm -i -v /home/nvidia/fresh:/hf "
                                     f"--entrypoint python3 {img} - {snap} /hf/mini", WRITER)
            assert rc == 2 and out == ""
            assert err.count("\n") == 1 and "unknown model_type 'glm4_moe_lite'" in err

    asyncio.run(main())
