"""Issue 24, item 1 (the pure part): a node's vLLM and SGLang engines found from their command
lines (containers through ``docker inspect``'s ``Path``/``Args``, host processes through ``ps``),
the read-only commands that list them and scrape one, and the whole path on the simulated cluster:
discovered on the head over SSH, then scraped there, read by the metrics parser."""

from __future__ import annotations

import shlex
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkconsole import remote as R
from sparkconsole.errors import ValidationError
from sparkconsole.serving.discover import (
    Engine,
    discover,
    engines_from_cmdlines,
    rows_from_engine_cmdlines,
)
from sparkconsole.serving.metrics import parse_metrics, sample_pattern
from sparkconsole.sim import SimClock, start_demo_cluster
from sparkconsole.sim.scenarios import GLM
from tests.lab.docker import DockerLab, docker, docker_lab_fixture
from tests.test_sim_shell import HEAD
from tests.test_sim_shell import _connect as sim_connect
from tests.test_sim_shell import ssh as sim_ssh

NGC = "/opt/nvidia/nvidia_entrypoint.sh"


def one(argv: list[str], image: str | None = "vllm/vllm-openai:v0.14.1", where: str = "c1") -> Engine | None:
    found = engines_from_cmdlines([(where, image, argv)], node="spark-1")
    assert len(found) <= 1
    return found[0] if found else None


# ---- command lines ------------------------------------------------------------------------------

def test_vllm_serve_with_a_served_model_name():
    e = one(["vllm", "serve", "zai-org/GLM-4.7-Flash", "--served-model-name", "glm-4.7-flash", "--port", "8001",
             "--host", "127.0.0.1", "--api-key", "sk-secret"])
    assert e == Engine(node="spark-1", kind="vllm", where="c1", image="vllm/vllm-openai:v0.14.1",
                       model="glm-4.7-flash", port=8001, host="127.0.0.1", api_key_on_cmdline=True,
                       model_path="zai-org/GLM-4.7-Flash")
    assert "sk-secret" not in repr(e)  # the key's value is never kept


def test_vllm_serve_defaults_and_the_image_entrypoint_split():
    # an image whose ENTRYPOINT is ``vllm serve``, run with only the model: Path "vllm", Args ["serve", …]
    e = one(["vllm", "serve", "Qwen/Qwen3-0.6B", "--gpu-memory-utilization", "0.3"])
    assert (e.kind, e.model, e.port, e.host, e.api_key_on_cmdline) == ("vllm", "Qwen/Qwen3-0.6B", 8000, "0.0.0.0", False)
    assert not e.on_host
    # options written with ``=`` and with underscores, as vLLM's parser accepts them
    e = one(["/usr/local/bin/vllm", "serve", "a/b", "--port=9000", "--served_model_name=short", "--api-key=x"])
    assert (e.model, e.port, e.api_key_on_cmdline) == ("short", 9000, True)


def test_the_api_server_module_form_and_the_ngc_entrypoint():
    e = one([NGC, "python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "nvidia/Llama-3.1-8B-FP4",
             "--port", "8010"], image="nvcr.io/nvidia/vllm:26.05-py3")
    assert (e.kind, e.model, e.port, e.image) == ("vllm", "nvidia/Llama-3.1-8B-FP4", 8010, "nvcr.io/nvidia/vllm:26.05-py3")
    e = one([NGC, "vllm", "serve", "a/b", "--served-model-name", "x", "y"], image="nvcr.io/nvidia/vllm:26.05-py3")
    assert (e.model, e.port) == ("x", 8000)  # the first of several served names is the one reported


def test_sglang_launch_server():
    e = one(["python3", "-m", "sglang.launch_server", "--model-path", "Qwen/Qwen3-8B", "--tp", "1"],
            image="lmsysorg/sglang:v0.5.9-cu130")
    assert (e.kind, e.model, e.port, e.host) == ("sglang", "Qwen/Qwen3-8B", 30000, "127.0.0.1")
    e = one(["/usr/bin/python", "-u", "-m", "sglang.launch_server", "--model", "m/n", "--served-model-name", "nn",
             "--host", "0.0.0.0", "--port", "30001"], image=None, where="4242")
    assert (e.kind, e.model, e.port, e.host, e.where, e.on_host) == ("sglang", "nn", 30001, "0.0.0.0", "4242", True)


def test_wrappers_a_shell_and_the_console_script_under_python():
    e = one(["sh", "-c", "exec vllm serve a/b --port 8003 > /logs/serve.log 2>&1"])
    assert (e.model, e.port) == ("a/b", 8003)
    e = one(["env", "VLLM_HOST_IP=10.0.0.1", "nohup", "vllm", "serve", "a/b"], image=None, where="77")
    assert (e.model, e.where) == ("a/b", "77")
    # how ``ps`` shows a pip-installed vllm: the interpreter, then the console script
    e = one(["/usr/bin/python3", "/usr/local/bin/vllm", "serve", "a/b", "--port", "8004"], image=None, where="9")
    assert (e.model, e.port) == ("a/b", 8004)


def test_junk_is_no_engine_and_never_raises():
    for argv in ([], [""], ["ray", "start", "--head", "--block"], ["vllm"], ["vllm", "--version"], ["/bin/bash"],
                 ["sh", "-c", "echo 'unterminated"], ["sh", "-c"], ["python3", "-m"], ["python3", "-c", "import vllm"],
                 ["docker", "exec", "ray-head", "vllm", "serve", "a/b"],  # the client, not the engine
                 ["vllm", "serve", "a/b", "--port", "eighty"], ["vllm", "serve", "a/b", "--port", "0"],
                 ["grep", "-E", "[v]llm|[s]glang"], ["sh", "-c", "sh -c 'sh -c \"sh -c \\'sh -c x\\'\"'"]):
        assert one(argv) is None, argv
    assert engines_from_cmdlines([("c", None, [None, 3, "serve"])]) == []  # type: ignore[list-item]


def test_a_containers_engine_seen_again_in_the_host_table_counts_once():
    rows = [("vllm-glm", "vllm/vllm-openai:v0.14.1", ["vllm", "serve", "a/b", "--port", "8000"]),
            ("1234", None, ["/usr/bin/python3", "/usr/local/bin/vllm", "serve", "a/b", "--port", "8000"]),
            ("1300", None, ["/usr/bin/python3", "/usr/local/bin/vllm", "serve", "a/b", "--port", "8000"]),
            ("2000", None, ["vllm", "serve", "c/d", "--port", "8100"])]
    assert [(e.where, e.model) for e in engines_from_cmdlines(rows)] == [("vllm-glm", "a/b"), ("2000", "c/d")]


# ---- the node's output ---------------------------------------------------------------------------

def test_rows_from_the_sectioned_output_skip_what_is_not_a_row():
    m = R.SECTION_MARK
    out = (f"{m} section containers\n"
           '/vllm-glm vllm/vllm-openai:v0.14.1 "vllm" ["serve","zai-org/GLM-4.7-Flash","--port","8000"]\n'
           '/odd img:1 "sh" ["-c","exec vllm serve a/b --port 8009"]\n'
           "Error response from daemon: No such container: gone\n"
           '/broken img:1 "vllm" [not json\n'
           '/$(touch x) img:1 "vllm" ["serve","m/y","--port","8021"]\n'  # a space: not a docker name
           '/$(touch${IFS}x) img:1 "vllm" ["serve","m/x","--port","8020"]\n'
           f"{m} rc containers 1\n"
           f"{m} section processes\n"
           "   4242 /usr/bin/python3 -m sglang.launch_server --model-path q/w --port 30000\n"
           "garbage\n"
           f"{m} rc processes 0\n")
    rows = rows_from_engine_cmdlines(out)
    assert [r[0] for r in rows] == ["vllm-glm", "odd", "$(touch${IFS}x)", "4242"]
    # a name is data: it is kept in the Engine and no builder of this module takes it back to a shell
    found = discover(out, node="n1")
    assert [(e.where, e.kind, e.model, e.port) for e in found] == [
        ("vllm-glm", "vllm", "zai-org/GLM-4.7-Flash", 8000), ("odd", "vllm", "a/b", 8009),
        ("$(touch${IFS}x)", "vllm", "m/x", 8020), ("4242", "sglang", "q/w", 30000)]
    assert discover("") == [] and discover("\x00\xff{{") == []


def test_an_engine_execed_in_a_ray_container_is_that_containers():
    """vLLM over Ray: the Ray head container's main process is ``ray start``; ``vllm serve`` was
    ``docker exec``ed in it and shows in ``docker top`` (section ``inside``), so the engine is the
    container's, with its image, and the host table's copy of the same process is not counted again."""
    m = R.SECTION_MARK
    out = (f"{m} section containers\n"
           '/sparkconsole-ray-ab12 vllm/vllm-openai:v0.17.0 "ray" ["start","--head","--block"]\n'
           f"{m} rc containers 0\n{m} section inside\n"
           "sparkconsole-ray-ab12 31337 vllm serve Qwen/Qwen3.5-122B-A10B-FP8 --tensor-parallel-size 2 "
           "--served-model-name qwen3.5-122b-a10b-fp8 --port 8000 --distributed-executor-backend ray\n"
           "gone-by-now 5 vllm serve x/y --port 8009\n"  # not a container listed above: no row
           f"{m} rc inside 0\n{m} section processes\n"
           "31337 vllm serve Qwen/Qwen3.5-122B-A10B-FP8 --tensor-parallel-size 2 "
           "--served-model-name qwen3.5-122b-a10b-fp8 --port 8000 --distributed-executor-backend ray\n"
           f"{m} rc processes 0\n")
    found = discover(out, node="n1")
    assert [(e.where, e.image, e.model, e.port) for e in found] == [
        ("sparkconsole-ray-ab12", "vllm/vllm-openai:v0.17.0", "qwen3.5-122b-a10b-fp8", 8000)]


def test_builders_are_read_only_and_constant():
    cmd = R.engine_cmdlines()
    assert not cmd.mutating
    assert "docker inspect -f '{{.Name}} {{.Config.Image}} {{json .Path}} {{json .Args}}' $n" in cmd.shell()
    scrape = R.metrics_probe(8001)
    assert not scrape.mutating and scrape.argv[:3] == ("sh", "-c", R.METRICS_PAGE_SCRIPT)
    assert f"curl -sS -m 2 --max-filesize {R.METRICS_FETCH_MAX_BYTES} --stderr - -w" in R.METRICS_PAGE_SCRIPT and R.metrics_probe(8001, 8002).argv[4] == "8001,8002"
    for bad in (0, 65536, "8000; touch x", True, None):
        try:
            R.metrics_probe(bad)  # type: ignore[arg-type]
        except ValidationError as exc:
            assert "\n" not in str(exc)
        else:
            raise AssertionError(bad)
    argv = shlex.split(scrape.shell())
    assert argv[4] == "8001" and argv[5] == sample_pattern() + "|^curl: |^::sparkpage:: "  # arguments, not text


# ---- on the simulated cluster --------------------------------------------------------------------

async def test_the_story_engine_is_found_on_the_head_and_scraped_there():
    async with start_demo_cluster(clock=SimClock.frozen()) as demo:
        async with sim_connect(demo.config.node(HEAD)) as conn:
            r = await sim_ssh(demo, HEAD, R.engine_cmdlines().shell(), step=0.05, conn=conn)
            assert r.exit_status == 0, r.stderr
            engines = {e.where: e for e in discover(r.stdout, node=HEAD)}
            glm = engines["vllm-glm"]
            assert (glm.kind, glm.model, glm.port, glm.image, glm.node) == (
                "vllm", "glm-4.7-flash", 8000, "vllm/vllm-openai:v0.14.1", HEAD)
            assert {e.port for e in engines.values()} >= {8000, 8001, 8002}
            page = await sim_ssh(demo, HEAD, R.metrics_probe(glm.port).shell(), step=0.05, conn=conn)
        assert page.exit_status == 0
        metrics = parse_metrics(page.stdout)
        assert [m.model for m in metrics] == ["glm-4.7-flash"] and metrics[0].kind == "vllm"
        assert glm.model != GLM  # the served name, not the repo id


# ---- on a real Docker engine ---------------------------------------------------------------------

@pytest.fixture
def docker_lab(tmp_path: Path) -> Iterator[DockerLab]:
    yield from docker_lab_fixture(tmp_path)


@pytest.mark.docker
def test_real_docker_top_ties_an_execed_engine_to_its_container(docker_lab):
    """The discovery script under the real ``sh`` against the real Docker engine: the container's main
    process is not an engine (``sleep``, as ``ray start`` is not), and a ``vllm serve`` started in it
    with ``docker exec`` (here a shell script named vllm, run by busybox's sh) shows in ``docker top``'s
    real output, so it is the container's, with its image."""
    import subprocess

    name = docker_lab.run("engine", "echo 'sleep 600' > /tmp/vllm; sleep 600")
    docker("exec", "-d", name, "sh", "/tmp/vllm", "serve", "m/x", "--served-model-name", "x", "--port", "8123")
    deadline = time.monotonic() + 30
    found: list = []
    while time.monotonic() < deadline:
        out = subprocess.run(["sh", "-c", R.engine_cmdlines().shell()], capture_output=True, text=True,
                             timeout=60).stdout
        found = [e for e in discover(out, node="lab") if e.where == name]
        if found:
            break
        time.sleep(0.5)
    assert [(e.kind, e.model, e.port, e.image) for e in found] == [("vllm", "x", 8123, docker_lab.image)], out
