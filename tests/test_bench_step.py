"""Issue 24, item 4 (the wizard's part): after verify, the ``benchmark`` step offers to measure the
endpoint (``benchmark.run``: skip, the recommendation, or run). Run: ``vllm bench serve`` in the
engine's own container on the head, at concurrency 1, 4 and 8, bounded; its rows noted beside the
plan's concurrency figure and kept with the endpoint's runs (what ``sparkconsole bench`` compares
with). The key reaches the tool through the head's shell, never in a command's text."""

from __future__ import annotations

import asyncio
import json

from sparkconsole.remote import engine_cmdlines
from sparkconsole.serving.bench import load_runs
from sparkconsole.serving.discover import discover
from tests.deploy_support import demo_flow

SPEED = 100.0


def _notes(run) -> list[str]:
    return [e.text for _t, e in run.events if e.kind == "note" and e.step == "benchmark"]


async def test_the_wizard_offers_a_benchmark_after_verify_runs_it_when_asked_and_keeps_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    async with demo_flow(tmp_path, {"benchmark.run": "run"}, speed=SPEED) as run:
        outcome = await asyncio.wait_for(run.task, 400)
        assert outcome.ok, outcome
        asked = [e for _t, e in run.events if e.kind == "decision" and e.id == "benchmark.run"]
        assert asked[0].recommended == "skip" and [o["value"] for o in asked[0].options] == ["skip", "run"]
        assert asked[-1].answer == "run"
        order = [e.step for _t, e in run.events if e.kind == "step" and e.state == "done"]
        assert order.index("verify") < order.index("benchmark")
        head = next(iter(run.demo.sim.nodes))
        benches = [t for _t, n, t in run.sent if "vllm bench serve" in t and n == head]
        assert len(benches) == 3 and len([1 for _t, _n, t in run.sent if "vllm bench serve" in t]) == 3
        assert [f"--max-concurrency {c} " in t for c, t in zip((1, 4, 8), benches, strict=True)] == [True] * 3
        # the engine's own container on the head (the story starts vLLM natively: no Ray container)
        assert all("docker exec -e OPENAI_API_KEY sparkconsole-vllm-" in t for t in benches)
        key = run.demo.sim.engine_on_port(head, 8000, run.demo.sim.now()).api_key
        assert key and not any(key in t for _t, _n, t in run.sent)
        notes = _notes(run)
        rows = [n for n in notes if n.startswith("concurrency ")]
        assert [r.split(":")[0] for r in rows] == ["concurrency 1", "concurrency 4", "concurrency 8"]
        assert any("beside the plan:" in n and "fit the KV cache at once" in n for n in notes)
        files = list((tmp_path / "state" / "bench").rglob("*.json"))
        assert len(files) == 1
        kept = load_runs(json.loads(files[0].read_text())["key"])
        assert len(kept) == 1 and kept[0].tool == "vllm"
        saved = json.loads(files[0].read_text())
        assert [r["concurrency"] for r in saved["rows"]] == [1, 4, 8]
        assert all(r["generation_tokens_per_s"] > 0 and r["ttft_p50_s"] > 0 for r in saved["rows"])
        # more requests at once: more tokens per second in all
        gen = [r["generation_tokens_per_s"] for r in saved["rows"]]
        assert gen[0] < gen[1] < gen[2]
        assert saved["deployment"] == run.flow.runner.state.id and key not in files[0].read_text()
        # the served engine is the head's vLLM container (the native start's rank 0): the serving poll and
        # `sparkconsole bench` find it there, with its image (an engine `docker exec`ed in a Ray container
        # is found through docker top: tests/test_serving_discover.py)
        found = await run.transports[head].run(engine_cmdlines(), timeout=30)
        qwen = [e for e in discover(found.stdout, node=head) if e.port == 8000]
        assert len(qwen) == 1 and qwen[0].where.startswith("sparkconsole-vllm-"), found.stdout
        assert qwen[0].image == "nvcr.io/nvidia/vllm:26.05-py3" and qwen[0].model == "qwen3.5-122b-a10b-fp8"


async def test_auto_skips_the_benchmark_and_sends_nothing_for_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    async with demo_flow(tmp_path, {}, speed=SPEED) as run:
        outcome = await asyncio.wait_for(run.task, 400)
        assert outcome.ok, outcome
        asked = [e for _t, e in run.events if e.kind == "decision" and e.id == "benchmark.run" and e.answer]
        assert asked and asked[0].answer == "skip"
        assert not any("vllm bench" in t for _t, _n, t in run.sent)
        assert not (tmp_path / "state" / "bench").exists()
