"""``deploy --recipe NAME|FILE`` on the demo: a recipe in each community format (sparkrun, eugr v1,
Spark Pulse v2) plans and deploys Qwen3.5-122B-A10B-FP8, and the engine runs with what the recipe
says (its image, its native multi-node start, its gpu-memory-utilization and max-model-len, its
flags); without a recipe, the bundled recipe's flags for the model are the default (tool calling,
prefix caching). Bad recipes are one line before anything is opened.

Read back through the CLI's ``--json`` events (the commands the deployment sent, as the operator
sees them), not through the modules that built them.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "sparkconsole" / "recipes" / "bundled"
pytestmark = pytest.mark.timeout(600)
# the flags every field recipe for this model has (research: engines-gb10.md, "Flags field recipes use")
FIELD_FLAGS = ["--enable-prefix-caching", "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder",
               "--reasoning-parser", "qwen3"]


def _deploy(tmp_path: Path, *args: str) -> tuple[int, list[dict], str]:
    env = {**os.environ, "SPARKCONSOLE_STATE_DIR": str(tmp_path / "state")}
    env.pop("SPARKCONSOLE_CONFIG", None)
    r = subprocess.run([sys.executable, "-m", "sparkconsole.cli", "deploy", "--demo", "--speed", "1000", *args, "--json"],
                       cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=500)
    events = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    return r.returncode, events, r.stderr


def _serve_starts(events: list[dict]) -> dict[str, list[str]]:
    """The engine's argv after ``IMAGE serve`` in each ``docker run`` the serve step planned or sent, by node."""
    out = {}
    for e in events:
        cmd = e.get("command") or ""
        if e.get("step") == "serve" and "docker run" in cmd and " serve " in cmd:
            words = shlex.split(cmd[cmd.index("docker run"):])
            out[e["node"]] = words
    return out


def _after(words: list[str], flag: str) -> str:
    return words[words.index(flag) + 1]


@pytest.mark.parametrize("name", ["qwen3.5-122b-a10b-fp8-tp2-ngc.yaml", "qwen3.5-122b-a10b-fp8-tp2-ngc-eugr.yaml",
                                  "qwen3.5-122b-a10b-fp8-tp2-ngc-pulse.yaml"])
def test_a_recipe_in_each_format_plans_and_serves_on_the_demo(tmp_path: Path, name: str) -> None:
    rc, events, err = _deploy(tmp_path, "--recipe", str(BUNDLED / name), "--auto")
    assert rc == 0, err[-2000:]
    result = events[-1]
    assert result["event"] == "result" and result["ok"], result
    starts = _serve_starts(events)
    assert set(starts) == {"spark-1a32", "spark-5be3"}, starts
    for node, words in starts.items():
        assert "nvcr.io/nvidia/vllm:26.05-py3" in words  # the recipe's image, pulled
        assert _after(words, "--distributed-executor-backend") == "mp"  # native multi-node: no Ray
        assert _after(words, "--tensor-parallel-size") == "2"
        assert _after(words, "--max-model-len") == "262144"
        for flag in FIELD_FLAGS:
            assert flag in words, (node, flag)
    assert not any("ray start" in (e.get("command") or "") for e in events)
    # the recipe's gpu-memory-utilization (0.7) is the plan's, lowered only when the nodes have less free
    gmu = float(_after(starts["spark-1a32"], "--gpu-memory-utilization"))
    assert gmu <= 0.7


def test_without_a_recipe_the_bundled_recipes_flags_are_the_default(tmp_path: Path) -> None:
    rc, events, err = _deploy(tmp_path, "--plan-only")
    assert rc == 0, err[-2000:]
    cmds = [e.get("command") or "" for e in events if e.get("step") == "serve"]
    serve = next(c for c in cmds if "vllm serve" in c or " serve Qwen/" in c)
    words = shlex.split(serve[serve.index("serve Qwen/"):].split(" > ")[0])
    for flag in FIELD_FLAGS:
        assert flag in words, flag


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_a_recipe_for_more_sparks_than_there_are_is_one_line(tmp_path: Path) -> None:
    p = _write(tmp_path, "four.yaml", "model: Qwen/Qwen3.5-122B-A10B-FP8\nruntime: vllm\n"
               "container: nvcr.io/nvidia/vllm:26.05-py3\nmin_nodes: 4\n"
               "command: vllm serve {model} --tensor-parallel-size 4\n")
    rc, _, err = _deploy(tmp_path, "--recipe", str(p), "--auto")
    assert rc == 2
    assert len(err.splitlines()) == 1, err
    assert "four" in err and "cannot run here" in err


def test_a_recipe_with_an_api_key_on_its_command_line_is_refused(tmp_path: Path) -> None:
    p = _write(tmp_path, "keyed.yaml", "model: Qwen/Qwen3.5-122B-A10B-FP8\nruntime: vllm\n"
               "container: nvcr.io/nvidia/vllm:26.05-py3\nmin_nodes: 2\n"
               "command: vllm serve {model} -tp 2 --api-key sekrit-123\n")
    rc, _, err = _deploy(tmp_path, "--recipe", str(p), "--plan-only")
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "--api-key" in err and "sekrit-123" not in err


def test_a_broken_recipe_file_is_one_line_naming_it(tmp_path: Path) -> None:
    p = _write(tmp_path, "broken.yaml", "model: [unclosed\n")
    rc, _, err = _deploy(tmp_path, "--recipe", str(p), "--plan-only")
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "broken.yaml" in err


def test_an_unknown_recipe_name_is_one_line(tmp_path: Path) -> None:
    rc, _, err = _deploy(tmp_path, "--recipe", "no-such-recipe", "--plan-only")
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "no-such-recipe" in err
