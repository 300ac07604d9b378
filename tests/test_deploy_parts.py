"""The wizard's pure parts: what recon reads, the per-node environment, weights checks, which
services to stop, the image probe, the saved state and the commands it builds (no node needed)."""

from __future__ import annotations

import json
import os
import shlex
import stat

import pytest

from sparkconsole.deploy import engines, freeing, netenv
from sparkconsole.deploy import weights as W
from sparkconsole.deploy.decisions import Decision, DecisionStop, Option, ScriptedAnswers, parse_answers
from sparkconsole.deploy.recon import (
    Holder,
    LinkFacts,
    NodeFacts,
    parse_cgroups,
    parse_gids,
    parse_images,
    parse_ss,
)
from sparkconsole.deploy.state import DeploymentState, Started, StateStore, Stopped
from sparkconsole.errors import UserError, ValidationError
from sparkconsole.remote import (
    JobFiles,
    detached,
    docker_run,
    image_copy,
    job_check,
    rsync_dir,
    serve_in_container,
)

GIB = 1 << 30


# ---- recon parsers --------------------------------------------------------------------------------

def test_gid_index_is_the_roce_v2_ipv4_mapped_entry_per_device():
    # sysfs as the kernel lays it out: gids/N holds the GID, gid_attrs/types/N its type
    text = "\n".join([
        "/sys/class/infiniband/rocep1s0f1/ports/1/gids/0:fe80:0000:0000:0000:4ebb:47ff:fe2f:9113",
        "/sys/class/infiniband/rocep1s0f1/ports/1/gids/1:fe80:0000:0000:0000:4ebb:47ff:fe2f:9113",
        "/sys/class/infiniband/rocep1s0f1/ports/1/gids/2:0000:0000:0000:0000:0000:ffff:c0a8:c80c",
        "/sys/class/infiniband/rocep1s0f1/ports/1/gids/3:0000:0000:0000:0000:0000:ffff:c0a8:c80c",
        "/sys/class/infiniband/rocep1s0f1/ports/1/gid_attrs/types/0:IB/RoCE v1",
        "/sys/class/infiniband/rocep1s0f1/ports/1/gid_attrs/types/1:RoCE v2",
        "/sys/class/infiniband/rocep1s0f1/ports/1/gid_attrs/types/2:IB/RoCE v1",
        "/sys/class/infiniband/rocep1s0f1/ports/1/gid_attrs/types/3:RoCE v2",
        "/sys/class/infiniband/roceP2p1s0f1/ports/1/gids/5:0000:0000:0000:0000:0000:ffff:c0a8:c90c",
        "/sys/class/infiniband/roceP2p1s0f1/ports/1/gids/4:0000:0000:0000:0000:0000:ffff:c0a8:c90c",
        "/sys/class/infiniband/roceP2p1s0f1/ports/1/gid_attrs/types/4:IB/RoCE v1",
        "/sys/class/infiniband/roceP2p1s0f1/ports/1/gid_attrs/types/5:RoCE v2",
        "grep: /sys/class/infiniband/rocep1s0f1/ports/1/gid_attrs/types/6: Invalid argument",
    ])
    assert parse_gids(text) == {"rocep1s0f1": 3, "roceP2p1s0f1": 5}
    assert parse_gids("") == {} and parse_gids("garbage\n:::") == {}


def test_ss_names_the_holder_of_each_port():
    text = ("State  Recv-Q Send-Q Local Address:Port  Peer Address:PortProcess\n"
            'LISTEN 0      2048         0.0.0.0:8000       0.0.0.0:*    users:(("vllm",pid=2211,fd=23))\n'
            'LISTEN 0      4096       127.0.0.1:6379       0.0.0.0:*    users:(("gcs_server",pid=91,fd=7))\n'
            "LISTEN 0      128          0.0.0.0:22         0.0.0.0:*\n")
    got = {x.port: (x.process, x.pid) for x in parse_ss(text)}
    assert got == {22: (None, None), 6379: ("gcs_server", 91), 8000: ("vllm", 2211)}


def test_images_and_cgroups():
    line = json.dumps({"Containers": "N/A", "CreatedAt": "2026-03-07 10:00:00 +0000 UTC", "CreatedSince": "2 weeks ago",
                       "Digest": "sha256:" + "a" * 64, "ID": "3f0c1a2b4d5e", "Repository": "vllm/vllm-openai",
                       "SharedSize": "N/A", "Size": "21.4GB", "Tag": "v0.17.0", "UniqueSize": "N/A",
                       "VirtualSize": "21.4GB"})
    none = json.dumps({"Repository": "<none>", "Tag": "<none>", "ID": "0"})
    (img,) = parse_images(line + "\n" + none + "\nnot json\n")
    assert (img.ref, img.id, img.digest) == ("vllm/vllm-openai:v0.17.0", "3f0c1a2b4d5e", "sha256:" + "a" * 64)
    cid = "b" * 64
    assert parse_cgroups(f"3047 0::/system.slice/docker-{cid}.scope\n12 0::/user.slice\nx y") == {3047: cid}


# ---- network ---------------------------------------------------------------------------------------

def _node(name: str, ip: str | None, mtu: int = 1500, up: bool = True, gid: int | None = 3) -> NodeFacts:
    return NodeFacts(node=name, links=[
        LinkFacts("rocep1s0f1", "enp1s0f1np1", up, 1, [f"{ip}/24"] if ip else [], mtu, gid),
        LinkFacts("roceP2p1s0f1", "enP2p1s0f1np1", up, 1, [], mtu, gid),
        LinkFacts("rocep1s0f0", "enp1s0f0np0", False, 1, [], 1500, None)])


def test_environment_is_per_node_from_what_was_read():
    head, worker = _node("a", "192.168.200.12", gid=3), _node("b", "192.168.200.13", gid=5)
    env_a, env_b = dict(netenv.node_env(head, "192.168.200.12")), dict(netenv.node_env(worker, "192.168.200.12"))
    assert env_a["VLLM_HOST_IP"] == "192.168.200.12" and env_b["VLLM_HOST_IP"] == "192.168.200.13"
    assert env_b["MASTER_ADDR"] == "192.168.200.12"
    assert env_a["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1"  # both twins of the cabled port
    assert (env_a["NCCL_IB_GID_INDEX"], env_b["NCCL_IB_GID_INDEX"]) == ("3", "5")  # never one global value
    for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "UCX_NET_DEVICES"):
        assert env_a[k] == "enp1s0f1np1"
    assert env_a["RAY_memory_monitor_refresh_ms"] == "0"
    assert netenv.check_links([head, worker]) == []


def test_link_problems_say_what_and_how_to_fix():
    (p,) = netenv.check_links([_node("a", "192.168.200.12"), _node("b", "192.168.200.13", up=False)])
    assert p.kind == "link-down" and p.node == "b" and "same port" in p.fix
    kinds = {p.kind for p in netenv.check_links([_node("a", "192.168.200.12", mtu=9000),
                                                  _node("b", "192.168.201.13")])}
    assert kinds == {"mtu", "subnet"}
    (p,) = netenv.check_links([_node("a", "192.168.200.12"), _node("b", None)])
    assert p.kind == "no-address" and "ip addr add" in p.fix


# ---- weights ---------------------------------------------------------------------------------------

def test_weights_verdict_keeps_missing_wrong_size_hash_and_broken_links_apart():
    tree = json.dumps([
        {"type": "file", "oid": "1", "size": 10, "path": "config.json"},
        {"type": "file", "oid": "2", "size": 99, "path": "a.safetensors", "lfs": {"oid": "f" * 64, "size": 100,
                                                                                 "pointerSize": 133}},
        {"type": "file", "oid": "3", "size": 99, "path": "b.safetensors", "lfs": {"oid": "e" * 64, "size": 200}},
        {"type": "file", "oid": "4", "size": 99, "path": "c.safetensors", "lfs": {"oid": "d" * 64, "size": 300}},
        {"type": "directory", "oid": "5", "size": 0, "path": "sub"},
    ])
    hub = W.parse_tree(tree)
    assert [f.size for f in hub] == [10, 100, 200, 300] and hub[1].sha256 == "f" * 64
    sizes = W.parse_sizes("10 config.json\n100 a.safetensors\n150 b.safetensors\n")
    v = W.compare("n", hub, sizes, ["c.safetensors"], {"a.safetensors": "0" * 64})
    assert (v.missing, v.wrong_size, v.wrong_hash, v.broken_links) == ([], ["b.safetensors"], ["a.safetensors"],
                                                                        ["c.safetensors"])
    assert not v.complete and "1/4 files good" in v.summary()
    ok = W.compare("n", hub, {"config.json": 10, "a.safetensors": 100, "b.safetensors": 200,
                              "c.safetensors": 300}, [])
    assert ok.complete and ok.bytes_total == 610
    assert W.parse_tree("not json") == [] and W.parse_sha256sum("f" * 64 + "  /x/a\n") == {"/x/a": "f" * 64}


# ---- what to stop ----------------------------------------------------------------------------------

def test_smallest_set_that_fits_keeps_the_rest_serving():
    f = NodeFacts(node="head", mem_available=int(13 * GIB), holders=[
        Holder("container", "vllm-glm", int(2.4 * GIB)), Holder("container", "embeddings", int(1.3 * GIB)),
        Holder("container", "reranker", int(1.3 * GIB)),
        Holder("process", "VLLM::EngineCore", int(83 * GIB), detail="container vllm-glm"),
        Holder("process", "VLLM::EngineCore", int(7 * GIB), detail="container embeddings"),
        Holder("process", "VLLM::EngineCore", int(7 * GIB), detail="container reranker")],
        containers=[{"name": "embeddings", "cpu": 3.0}, {"name": "reranker", "cpu": 1.0}])
    c = freeing.choose(f, int(104.4 * GIB))
    assert c.enough and c.stop == ("reranker", "vllm-glm")  # the least busy of the two equal ones goes
    assert freeing.choose(f, int(90 * GIB)).stop == ("vllm-glm",)
    assert freeing.choose(f, int(10 * GIB)).stop == ()
    short = freeing.choose(f, int(500 * GIB))
    assert not short.enough and set(short.stop) == {"vllm-glm", "embeddings", "reranker"}


# ---- engine probe ----------------------------------------------------------------------------------

def test_engine_program_and_its_answer():
    prog = engines.engine_program(("Qwen3_5MoeForConditionalGeneration",))
    compile(prog, "<engine>", "exec")  # real Python
    out = "vllm 0.14.1\ntransformers 4.57.1\ntorch 2.9.0\nsglang -\narch Qwen3_5MoeForConditionalGeneration no\n"
    ef = engines.parse_engine_output("img", out, 0)
    assert ef.vllm == "0.14.1" and ef.versions["sglang"] is None and ef.knows("Qwen3_5MoeForConditionalGeneration") is False
    assert engines.parse_engine_output("img", "docker: Error response from daemon: x\n", 125).error
    with pytest.raises(ValueError):
        engines.engine_program(("bad'; import os",))
    assert engines.version_tuple("0.17.1rc2") == (0, 17, 1)


# ---- decisions and state ---------------------------------------------------------------------------

async def test_scripted_answers():
    d = Decision("plan.layout", "plan", "t", (), (Option("tp1", "a"), Option("tp2", "b")), "tp2", "why")
    assert await ScriptedAnswers({}, auto=True)(d) == ("tp2", "auto")
    assert await ScriptedAnswers({"plan.layout": "tp1"})(d) == ("tp1", "preset")
    with pytest.raises(DecisionStop):
        await ScriptedAnswers({})(d)
    with pytest.raises(UserError, match="not one of"):
        await ScriptedAnswers({"plan.layout": "tp9"})(d)
    assert parse_answers(["a.b=c", "x=y=z"]) == {"a.b": "c", "x": "y=z"}
    with pytest.raises(UserError):
        parse_answers(["novalue="])


def test_state_round_trips_atomically_private_and_without_secrets(tmp_path):
    store = StateStore(tmp_path)
    st = DeploymentState.new("Qwen/Qwen3.5-122B-A10B-FP8", {"engine": "vllm"}, "demo")
    st.answers["plan.layout"] = "tp2"
    st.started.append(Started("a", "container", "sparkconsole-ray-x", "abc"))
    st.stopped.append(Stopped("a", "container", "vllm-glm"))
    st.facts["note"] = "HF_TOKEN=hf_CANARYCANARY123 leaked by a node"
    path = store.save(st)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert "hf_CANARYCANARY123" not in path.read_text()
    back = store.load(cluster="demo")
    assert back.id == st.id and back.answers == {"plan.layout": "tp2"} and back.started[0].id == "abc"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    with pytest.raises(UserError):
        StateStore(tmp_path / "none").load(cluster="demo")


# ---- commands --------------------------------------------------------------------------------------

def test_detached_job_and_its_check_are_quoted_and_parse_as_sh():
    files = JobFiles.under("/home/nvidia/.cache/sparkconsole/abc", "weights-copy-spark-5be3")
    text = detached("/home/nvidia/.cache/sparkconsole/abc", files,
                    rsync_dir("/home/nvidia/.cache/huggingface/hub/models--Q--M", "nvidia@192.168.200.13",
                              "/home/nvidia/.cache/huggingface/hub/models--Q--M")).shell()
    assert text.startswith("mkdir -p /home/nvidia/.cache/sparkconsole/abc && ") and text.endswith("sleep 0.1; done; echo $!")
    assert "< /dev/null & for i in " in text  # setsid alone in the background, then the wait for its pid file
    assert "setsid nohup sh -c " in text and "--partial -L --exclude blobs/" in text
    inner = shlex.split(text.split("setsid nohup sh -c ", 1)[1])[0]
    assert inner.endswith(f"echo $? > {files.rc}") and f"> {files.log} 2>&1" in inner
    check = job_check(files).shell()
    assert files.pid in check and "/proc/sys/kernel/random/boot_id" in check and "kill -0" not in check
    assert f"{files.pid}" in inner.split(";")[2] and inner.startswith("read b < /proc/sys/kernel/random/boot_id")
    for bad in ("../x", "a b", "$(rm -rf /)"):
        with pytest.raises(ValidationError):
            JobFiles.under("/tmp/" + bad, "x")
    with pytest.raises(ValidationError):
        rsync_dir("/a", "root@host;rm -rf /", "/b")
    with pytest.raises(ValidationError):
        image_copy("img|evil", "root@1.2.3.4")


def test_container_commands_keep_values_as_single_arguments():
    cmd = docker_run("sparkconsole-ray-1", "vllm/vllm-openai:v0.17.0", options=["--network", "host"],
                     entrypoint="ray", args=["start", "--block", "--head"], env=[("NCCL_IB_HCA", "a,b")],
                     mounts=[("/root/.cache/huggingface", "/root/.cache/huggingface")])
    argv = shlex.split(cmd.shell())
    assert argv[:5] == ["docker", "run", "-d", "--name", "sparkconsole-ray-1"]
    assert "NCCL_IB_HCA=a,b" in argv and argv[argv.index("--entrypoint") + 1] == "ray"
    with pytest.raises(ValidationError):
        docker_run("x", "img", options=[], env=[("BAD NAME", "1")])
    s = serve_in_container("c", ["vllm", "serve", "Q/M", "--served-model-name", "a'b"], "/root/x/serve.log")
    argv = shlex.split(s.shell())
    assert argv[:5] == ["docker", "exec", "-d", "c", "sh"] and argv[5] == "-c"
    assert shlex.split(argv[6])[:5] == ["exec", "vllm", "serve", "Q/M", "--served-model-name"]
    assert shlex.split(argv[6])[5] == "a'b"


async def test_waiting_on_a_job_gives_up_when_its_node_stops_answering(tmp_path):
    """A node that never answers again must not hold the deployment forever: the wait ends with the
    node named and the way back (--resume re-attaches; the job keeps running there)."""
    from sparkconsole.config import ClusterConfig, NodeConfig
    from sparkconsole.deploy.runner import Runner, Settings, StepFailed
    from sparkconsole.deploy.state import Job
    from sparkconsole.errors import TransportError

    class Silent:
        node = "n1"

        async def run(self, cmd, timeout=30.0, input=None):
            raise TransportError("n1: connection lost")

    cfg = ClusterConfig(nodes=(NodeConfig(name="n1", host="127.0.0.1"),))
    events = []
    r = Runner(config=cfg, state=DeploymentState.new("Q/M", {}, "c"), transports={"n1": Silent()},
               answer=ScriptedAnswers({}, auto=True), emit=events.append,
               settings=Settings(poll_s=0.01, unreachable_after_s=0.05))
    with pytest.raises(StepFailed) as info:
        await r.wait_job(Job("n1", 42, "/x/j.log", "/x/j.rc", "copy weights"))
    assert "n1 stopped answering while copy weights ran" in info.value.message and "--resume" in info.value.fix


# ---- the plan by the image's vLLM version (issue 13) ----------------------------------------------

class _Res:
    def __init__(self, stdout: str, rc: int = 0) -> None:
        self.stdout, self.stderr, self.exit_status, self.ok = stdout, "", rc, rc == 0


class _Runner:
    """Just what the plan, engine and serve steps touch: saved facts, notes, reads of the image's Python."""

    def __init__(self, facts: dict, engine_out: str = "") -> None:
        from types import SimpleNamespace

        from sparkconsole.deploy.deployment_plan import DeploymentPlan

        plan = DeploymentPlan.from_json({k: v for k, v in facts.items() if k != "nodes"})
        self.state = SimpleNamespace(facts={"nodes": facts["nodes"]}, plan=plan, steps={}, started=[], short_id="t1")
        self.notes: list[str] = []
        self.head = SimpleNamespace(name="spark-1a32")
        self.nodes = [SimpleNamespace(name="spark-1a32"), SimpleNamespace(name="spark-5be3")]
        self._out = engine_out

    def save(self) -> None:
        pass

    def note(self, msg: str, node: str | None = None) -> None:
        self.notes.append(msg)

    def forget(self, key: str) -> None:
        pass

    async def read(self, node, cmd, timeout=None, quiet=False):
        return _Res(self._out)

    # the image's own Python is run as a change (it creates a container), from the engine step's send
    rehearsing = read_only = plan_only = False

    async def change(self, node, cmd, timeout=None, key=None):
        assert cmd.mutating
        return _Res(self._out)


def _flow(opt_image: str | None = None, engine_out: str = "", **facts):
    from sparkconsole.deploy.flow import Flow, Options

    img = [{"ref": "vllm/vllm-openai:v0.17.0", "id": "sha256:" + "c" * 64}]
    nodes = {n: NodeFacts(n, gpu="NVIDIA GB10", mem_total=int(119.7 * GIB), mem_available=int(110 * GIB)).to_json()
             for n in ("spark-1a32", "spark-5be3")}
    for n in nodes.values():
        n["images"] = img
    r = _Runner({"nodes": nodes, **facts}, engine_out)
    return Flow(r, Options(image=opt_image)), r


def test_plan_takes_the_vllm_version_of_the_image():
    from sparkconsole.deploy.steps import Plan

    assert Plan.vllm_version(_flow("vllm/vllm-openai:v0.17.0")[0]) == "0.17.0"
    assert Plan.vllm_version(_flow("nvcr.io/nvidia/vllm:26.03-py3")[0]) == "0.17.1"  # a known image
    assert Plan.vllm_version(_flow("example.org/vllm:v0.19.1-cu130")[0]) == "0.19.1"  # from the tag
    assert Plan.vllm_version(_flow(None)[0]) is None                                  # the newest, assumed
    assert Plan.vllm_version(_flow("example.org/vllm:latest")[0]) is None
    # what the engine step read from the image's own Python wins over a tag
    assert Plan.vllm_version(_flow("vllm/vllm-openai:v0.19.0", vllm_version="0.17.0")[0]) == "0.17.0"


async def test_engine_step_reads_the_version_and_replans_under_its_rules():
    """The plan assumed the newest vLLM (0.20: CUDA graphs' 0.5 GiB in the budget); the image runs
    0.17.0, where they are not: the re-plan of TP=2 at 65,536 tokens has 0.5 GiB more KV per node."""
    out = ("vllm 0.17.0\ntransformers 4.57.1\ntorch 2.9.0\nsglang -\n"
           "arch Qwen3_5MoeForConditionalGeneration yes\n")
    f, r = _flow(None, out, tp=2, pp=1, gmu=0.85, max_model_len=65536, kv_cache_dtype="auto",
                 plan_vllm_version=None, engine="vllm", image="vllm/vllm-openai:v0.17.0")
    from sparkconsole.deploy.steps import Engine, Plan
    from sparkconsole.planner.plan import layout_row

    await Engine(f).send()  # runs the image's Python (a change)
    await Engine(f).verify()
    assert f.plan.vllm_version == "0.17.0" and f.plan.plan_vllm_version == "0.17"
    (note,) = [n for n in r.notes if n.startswith("re-plan for the image's vLLM 0.17.0")]
    assert "(vLLM 0.17)" in note and "fits on 2 Sparks" in note and f.plan.plan_fits is True
    new, old = (layout_row(f.spec, Plan.options(f, v), 2) for v in ("0.17.0", None))
    assert new["kv_cache_gib_per_node"] - old["kv_cache_gib_per_node"] == pytest.approx(0.5)
    assert f"{new['kv_cache_gib_per_node']:.1f} GiB KV per node" in note
    await Engine(f).verify()  # the same version again: no second re-plan
    assert sum(n.startswith("re-plan") for n in r.notes) == 1


def test_serve_calibration_uses_the_images_version():
    """SYNTHETIC log lines (real vLLM wording, made-up figures, no version line): the calibration
    notes name the version the engine step read, not the planner's newest."""
    from sparkconsole.deploy.steps import Serve

    f, r = _flow(None, tp=2, gmu=0.85, max_model_len=65536, vllm_version="0.17.0")
    s = Serve(f)
    s._seen = ["INFO 01-01 00:00:00 [gpu_model_runner.py:1] Model loading took 58.31 GiB memory and 9.0 seconds\n"
               "INFO 01-01 00:00:01 [gpu_worker.py:1] Available KV cache memory: 33.80 GiB\n"
               "INFO 01-01 00:00:01 [kv_cache_utils.py:1] GPU KV cache size: 737,792 tokens\n"
               "INFO 01-01 00:00:01 [kv_cache_utils.py:1] Maximum concurrency for 65,536 tokens per request: 37.05x\n"]
    s._calibrate()
    cal = [n for n in r.notes if n.startswith("calibration: ")]
    assert any("vLLM 0.17: CUDA-graph memory is not subtracted" in n for n in cal)
    # 1,408 blocks (see tests/test_planner_sim.py): the longest request they hold is
    # (1,408 - 3 x 2) // 1 x 2,096 = 2,938,592 tokens, capped at the model's 262,144
    assert f.plan.calibrated_longest_len == 262_144
    assert any("blocks: plan" in n and "1,408 (derived)" in n for n in cal)


async def test_the_fast_loader_is_used_only_where_the_images_own_python_imported_it():
    """``--load-format fastsafetensors`` needs the package in the image: the engine step's check
    (the image's Python printing the module's version) decides, never the image's name."""
    from sparkconsole.deploy.steps import Engine, Serve

    with_it = ("vllm 0.20.1\ntransformers 4.57.5\ntorch 2.10.0\nsglang -\nray -\nfastsafetensors 0.1.15\n"
               "arch Qwen3_5MoeForConditionalGeneration yes\n")
    without = with_it.replace("fastsafetensors 0.1.15", "fastsafetensors -")
    for out, expected in ((with_it, True), (without, False)):
        f, _ = _flow(None, out, tp=2, pp=1, gmu=0.85, max_model_len=65536, engine="vllm",
                     image="vllm/vllm-openai:v0.17.0")
        await Engine(f).send()
        args = list(Serve(f)._spec().extra_args)
        assert ("--load-format" in args and args[args.index("--load-format") + 1] == "fastsafetensors") is expected
    # by its name only (read-only, plan-only): not assumed
    f, _ = _flow(None, "", tp=2, engine="vllm", image="nvcr.io/nvidia/vllm:26.05-py3",
                 engine_checks={"nvcr.io/nvidia/vllm:26.05-py3": {"versions": {"fastsafetensors": "0.1"},
                                                                   "expected": True}})
    assert "--load-format" not in Serve(f)._spec().extra_args
