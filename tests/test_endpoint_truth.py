"""What the served endpoint exposes, said exactly: vLLM checks its API key only on paths that start with
/v1 (vllm/entrypoints/openai/api_server.py's ``authentication`` middleware; ``AuthenticationMiddleware``
in vllm/entrypoints/openai/server_utils.py later), so verify names what still answers without it; Ray's
ports (the GCS, the client server, the dashboard agent that takes jobs) are named where Ray runs; the
closed layout (127.0.0.1 and the SSH tunnel) is offered. And the benchmark a keyed engine gets runs with
the key and a pinned llama-benchy."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from sparkconsole import remote as R
from sparkconsole.deploy.steps import Verify
from sparkconsole.deploy.steps.verify import (
    RAY_HEAD_PORTS,
    RAY_NODE_PORTS,
    VLLM_KEYLESS_MODEL_PATHS,
    VLLM_KEYLESS_READ_PATHS,
)
from sparkconsole.serving import bench as B
from sparkconsole.sim import SimClock, start_demo_cluster
from tests.test_bench import GLM_REPO, GLM_SERVED, KEY, _glm, _put_key
from tests.test_endpoint_access import _flow, _head_rules, _notes
from tests.test_sim_shell import HEAD
from tests.test_sim_shell import ssh as sim_ssh

ROOT = Path(__file__).resolve().parent.parent


async def test_verify_names_every_path_the_key_leaves_open_and_the_closed_layout():
    flow, _log, events = _flow("ray", access="api-key", head_rules=_head_rules("401", "0.0.0.0"))
    await Verify(flow).verify()
    level, said = next((lvl, t) for lvl, t in _notes(events) if t.startswith("endpoint "))
    assert level == "warning"  # a keyed endpoint is not a closed one
    for path in (*VLLM_KEYLESS_MODEL_PATHS, *VLLM_KEYLESS_READ_PATHS):
        assert re.search(rf"{re.escape(path)}[ ,]", said), path
    assert {"/invocations", "/tokenize", "/detokenize", "/pooling", "/score", "/rerank", "/metrics",
            "/health"} <= set(VLLM_KEYLESS_MODEL_PATHS + VLLM_KEYLESS_READ_PATHS)
    assert "only on paths that start with /v1" in said
    assert "serve.access=local" in said and "ssh -L 8000:localhost:8000 -p 2222 nvidia@10.0.0.5" in said


async def test_verify_names_rays_ports_when_ray_runs_and_only_then():
    flow, _log, events = _flow("ray", access="api-key", head_rules=_head_rules("401", "0.0.0.0"))
    await Verify(flow).verify()
    cluster = next(t for _lvl, t in _notes(events) if "Ray's ports" in t)
    for port, _what in (*RAY_HEAD_PORTS, *RAY_NODE_PORTS):
        assert str(port) in cluster
    assert {6379, 10001, 52365} <= {p for p, _ in (*RAY_HEAD_PORTS, *RAY_NODE_PORTS)}
    assert "job submissions" in cluster and "8265" in cluster and "127.0.0.1 only" in cluster
    flow, _log, events = _flow("native", access="local", head_rules=_head_rules("200", "127.0.0.1"))
    await Verify(flow).verify()
    notes = [t for _lvl, t in _notes(events)]
    assert not any("10001" in t or "52365" in t for t in notes)
    said = next(t for t in notes if t.startswith("endpoint "))
    assert "nothing on the network reaches any of its paths" in said and "/metrics" in said


def test_the_llama_benchy_command_carries_the_key_from_the_file_and_a_pinned_version():
    key_file = R.api_key_path("/home/nvidia")
    (cmd,) = B.bench_commands(8000, GLM_SERVED, GLM_REPO, None, [1, 4], 8, 128, 16, "llama-benchy",
                              key_file=key_file)
    text = cmd.shell()
    assert text.startswith(f'k="$(cat {key_file})" && [ -n "$k" ] && ')
    words = shlex.split(text.split(" && ", 2)[2])
    assert words[:6] == ["timeout", "600", "uvx", "--from", f"llama-benchy=={R.LLAMA_BENCHY_VERSION}", "llama-benchy"]
    assert words[6:8] == ["--api-key", "$k"]
    assert re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+", R.LLAMA_BENCHY_VERSION)
    (plain,) = B.bench_commands(8000, GLM_SERVED, GLM_REPO, None, [1], 8, 128, 16, "llama-benchy")
    assert f"llama-benchy=={R.LLAMA_BENCHY_VERSION}" in plain.shell() and "--api-key" not in plain.shell()
    # one place: the version is written nowhere else in the package
    hits = [p for p in (ROOT / "sparkconsole").rglob("*.py") if p.name != "remote.py"
            and re.search(r"llama-benchy[=@]=?[0-9]", p.read_text(encoding="utf-8"))]
    assert hits == []


async def test_a_keyed_engine_answers_llama_benchy_only_with_the_key():
    """On the simulated head (with uvx): without the key its warmup gets 401; with it, rows."""
    async with start_demo_cluster(scenario="permissive", clock=SimClock.frozen()) as demo:
        run = _glm(demo)
        run.api_key = KEY
        key_file = R.api_key_path(demo.sim.login(HEAD).home)
        _put_key(demo, key_file)
        (plain,) = B.bench_commands(8000, GLM_SERVED, GLM_REPO, None, [1], 1, 64, 4, "llama-benchy")
        r = await sim_ssh(demo, HEAD, plain.shell(), step=0.25)
        assert r.exit_status != 0 and "401" in r.stderr
        (keyed,) = B.bench_commands(8000, GLM_SERVED, GLM_REPO, None, [1], 1, 64, 4, "llama-benchy",
                                    key_file=key_file)
        assert KEY not in keyed.shell()
        r = await sim_ssh(demo, HEAD, keyed.shell(), step=0.25)
    assert r.exit_status == 0, r.stderr[-500:]
    assert [x.concurrency for x in B.parse_llama_benchy(r.stdout)] == [1]
    assert KEY not in r.stdout + r.stderr
