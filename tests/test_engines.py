"""Engines as objects: each engine is one module behind one protocol, and nothing else compares names.

The command lines are the ones the engines' own docs and the field give (vLLM's ``vllm serve``
and its multi-node flags, SGLang's ``launch_server`` with ``--nnodes/--node-rank/--dist-init-addr``,
llama.cpp's ``llama-server -hf``); the facts asserted are written out here, not computed with the
modules under test.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sparkconsole.serving import engines
from sparkconsole.serving.engines import LLAMA_CPP, SGLANG, VLLM, ServeSpec
from sparkconsole.serving.engines.base import EngineKind

ROOT = Path(__file__).resolve().parents[1]
SPEC = ServeSpec(model="Qwen/Qwen3.5-122B-A10B-FP8", served_name="qwen", host="0.0.0.0", port=8000, tp=2,
                 gpu_memory_utilization=0.7, max_model_len=262144,
                 extra_args=("--enable-prefix-caching", "--tool-call-parser", "qwen3_coder"))
NODES = [("spark-a", "192.168.100.10"), ("spark-b", "192.168.100.11")]


def test_every_engine_satisfies_the_protocol() -> None:
    fields = list(EngineKind.__annotations__)
    assert {"name", "label", "default_port", "executors", "launch_env", "metrics"} <= set(fields)
    for engine in engines.ENGINES.values():
        for name in fields:
            assert hasattr(engine, name), (engine.name, name)
        assert engine.executors and "single" in engine.executors


@pytest.mark.parametrize(("argv", "name", "model"), [
    (["vllm", "serve", "Qwen/Qwen3-8B", "--port", "8001"], "vllm", "Qwen/Qwen3-8B"),
    (["/usr/local/bin/vllm", "serve", "--model", "m"], "vllm", None),
    (["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"], "vllm", None),
    (["python3", "-X", "utf8", "-m", "vllm.entrypoints.cli.main", "serve", "m"], "vllm", "m"),
    (["python3", "-m", "sglang.launch_server", "--model-path", "m"], "sglang", None),
    (["sglang", "serve", "--model-path", "m"], "sglang", None),
    (["/app/llama-server", "-hf", "unsloth/Qwen3-8B-GGUF:Q4_K_M", "--port", "8080"], "llama-cpp", None),
])
def test_an_engine_recognises_its_own_command_line(argv: list[str], name: str, model: str | None) -> None:
    hit = engines.recognise(argv)
    assert hit is not None
    engine, _args, positional = hit
    assert engine.name == name
    assert positional == model
    others = [e for e in engines.ENGINES.values() if e.name != name]
    assert all(e.recognise(argv) is None for e in others)


@pytest.mark.parametrize("argv", [["python3", "-m", "http.server"], ["vllm", "bench", "serve"], ["nginx"], []])
def test_other_command_lines_are_no_engine(argv: list[str]) -> None:
    assert engines.recognise(argv) is None


def test_defaults_from_the_engines_own_docs() -> None:
    assert (VLLM.default_port, VLLM.default_host) == (8000, "0.0.0.0")
    assert (SGLANG.default_port, SGLANG.default_host) == (30000, "127.0.0.1")
    assert (LLAMA_CPP.default_port, LLAMA_CPP.default_host) == (8080, "127.0.0.1")


def test_vllm_native_multi_node_starts_workers_first_headless() -> None:
    launches = VLLM.launches(SPEC, "native", NODES)
    assert [la.rank for la in launches] == [1, 0]
    worker, head = launches
    assert worker.args[:2] == ("serve", "Qwen/Qwen3.5-122B-A10B-FP8")
    for la, rank in ((worker, "1"), (head, "0")):
        a = list(la.args)
        assert a[a.index("--nnodes") + 1] == "2" and a[a.index("--node-rank") + 1] == rank
        assert a[a.index("--master-addr") + 1] == "192.168.100.10"
        assert a[a.index("--distributed-executor-backend") + 1] == "mp"
        assert "--enable-prefix-caching" in a and a[a.index("--tool-call-parser") + 1] == "qwen3_coder"
    assert "--headless" in worker.args and "--headless" not in head.args


def test_vllm_over_ray_is_one_start_on_the_head() -> None:
    (only,) = VLLM.launches(SPEC, "ray", NODES)
    a = list(only.args)
    assert a[a.index("--distributed-executor-backend") + 1] == "ray"
    assert "--nnodes" not in a and only.rank == 0


def test_sglang_has_no_ray_and_meets_at_its_rendezvous() -> None:
    with pytest.raises(ValueError):
        SGLANG.launches(SPEC, "ray", NODES)
    worker, head = SGLANG.launches(SPEC, "native", NODES)
    a = list(head.args)
    assert a[:2] == ["-m", "sglang.launch_server"]
    assert a[a.index("--dist-init-addr") + 1] == "192.168.100.10:20000"
    assert dict(worker.env)["SGLANG_HOST_IP"] == "192.168.100.11"


def test_llama_cpp_runs_on_one_node_only() -> None:
    with pytest.raises(ValueError):
        LLAMA_CPP.launches(SPEC, "native", NODES)
    one = ServeSpec(model="unsloth/Qwen3-8B-GGUF:Q4_K_M", served_name="q", host="127.0.0.1", port=8080)
    (only,) = LLAMA_CPP.launches(one, "single", NODES[:1])
    assert only.entrypoint == "llama-server"
    assert "--metrics" in only.args  # its /metrics is off without it


def test_the_image_name_says_the_engine() -> None:
    assert engines.for_image("vllm/vllm-openai:v0.17.0-cu130") is VLLM
    assert engines.for_image("nvcr.io/nvidia/vllm:26.05-py3") is VLLM
    assert engines.for_image("lmsysorg/sglang:v0.5.9-cu130") is SGLANG
    assert engines.for_image("scitrera/dgx-spark-llama-cpp:b8192-cu131") is LLAMA_CPP
    assert engines.for_image("busybox:latest") is None


def test_unknown_engine_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="vllm, sglang, llama-cpp"):
        engines.get("tensorrt")


def test_no_engine_name_is_compared_outside_the_engine_modules() -> None:
    """A third engine touches serving/engines/ and nothing else: no ``== "vllm"`` elsewhere."""
    pattern = re.compile(r'[!=]= *"(vllm|sglang|llama-cpp)"|"(vllm|sglang|llama-cpp)" *[!=]=')
    engine_dir = ROOT / "sparkconsole" / "serving" / "engines"
    found = [f"{p.relative_to(ROOT)}:{i}" for p in (ROOT / "sparkconsole").rglob("*.py") if engine_dir not in p.parents
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert found == []
