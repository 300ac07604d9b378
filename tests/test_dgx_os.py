"""What a stock DGX OS node is like, against the wizard's assumptions (issue 22): each test here
failed on the code before it. The real outputs are in tests/fixtures/real/dgx-os/ (sources in
their headers)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from sparkconsole.config import ClusterConfig, NodeConfig
from sparkconsole.deploy.deployment_plan import Stop
from sparkconsole.deploy.engines import version_from_ref
from sparkconsole.deploy.flow import Flow, Options
from sparkconsole.deploy.recon import ImageFacts, LinkFacts, NodeFacts, parse_login_user
from sparkconsole.deploy.runner import StepFailed
from sparkconsole.deploy.state import DeploymentState

REAL = Path(__file__).parent / "fixtures" / "real" / "dgx-os"


def _id_output() -> str:
    """``id`` on a stock Spark, as captured (the lines after ``$ id``)."""
    text = (REAL / "stock-spark-id-ip.txt").read_text()
    return text.split("$ id\n", 1)[1].split("\n\n", 1)[0]


def test_the_login_user_is_read_from_id_as_a_stock_spark_prints_it():
    assert parse_login_user(_id_output()) == "jhunt"  # uid=1000(jhunt) ... 988(docker)
    assert parse_login_user("nvidia\n") == "nvidia"    # id -un
    assert parse_login_user("") is None and parse_login_user("id: command not found\n") is None


def _flow(users: dict[str, str | None], inventory_user: str | None = None) -> Flow:
    nodes = tuple(NodeConfig(n, "127.0.0.1", user=inventory_user, role="head" if i == 0 else "worker")
                  for i, n in enumerate(users))
    config = ClusterConfig(nodes=nodes, name="sparks")
    state = DeploymentState.new("Qwen/Qwen3.5-122B-A10B-FP8", Options().to_json(), "sparks")
    state.facts["nodes"] = {
        n: NodeFacts(n, user=u, links=[LinkFacts("rocep1s0f1", "enp1s0f1np1", True, 1, [f"169.254.127.{30 + i}/16"])]
                     ).to_json() for i, (n, u) in enumerate(users.items())}
    runner = SimpleNamespace(config=config, state=state, save=lambda: None, nodes=list(nodes), head=nodes[0])
    return Flow(runner, Options())  # type: ignore[arg-type]


def test_node_to_node_commands_go_to_the_login_user_read_on_the_peer_never_an_assumed_root():
    """DGX OS logs in as the user made at first boot; NVIDIA's discover-sparks sets keys up for
    $USER@peer and refuses to run as root. Before: ``root@`` whenever the inventory named no user."""
    flow = _flow({"spark-a": "jhunt", "spark-b": "jhunt"})
    assert flow.user_at("spark-b") == "jhunt@169.254.127.31"
    # the inventory's user only when recon could not read one, and never root by default
    assert _flow({"spark-a": None, "spark-b": None}, inventory_user="nvidia").user_at("spark-b") == \
        "nvidia@169.254.127.31"
    with pytest.raises(StepFailed, match="login user is not known"):
        _flow({"spark-a": None, "spark-b": None}).user_at("spark-b")


@pytest.mark.parametrize("ref,version", [
    ("sparkconsole-lab/ray:2.60.0", None),           # Ray's version, not vLLM 2.60 (the lab's image)
    ("nvcr.io/nvidia/vllm:26.05-py3", "0.20.1"),     # an NGC release, not vLLM 26.05
    ("nvcr.io/nvidia/vllm:25.10-py3", "0.10.2"),
    ("nvcr.io/nvidia/vllm:27.01-py3", None),         # a release we do not know: unknown, not 27.01
    ("vllm/vllm-openai:v0.19.1-cu130", "0.19.1"),
    ("example.org/vllm:0.17.0", "0.17.0"),
    ("vllm/vllm-openai:latest", None),
    ("lmsysorg/sglang:v0.5.4", None),
])
def test_the_plans_vllm_version_comes_only_from_what_an_images_name_can_say(ref, version):
    assert version_from_ref(ref) == version


# ---- item 11: a missing tool is said as missing, with its install command ----------------------

def test_recon_reads_which_tools_the_flow_will_run():
    from sparkconsole.deploy.recon import parse_tools
    from sparkconsole.deploy.steps.recon import missing_tools

    tools = parse_tools("hf no\nuvx no\nrsync yes\nping no\ncurl yes\nss yes\nsh: 1: noise\n")
    assert tools == {"hf": False, "uvx": False, "rsync": True, "ping": False, "curl": True, "ss": True}
    assert missing_tools(NodeFacts("n", tools=tools)) == ["hf", "ping"]
    assert missing_tools(NodeFacts("n", tools={**tools, "uvx": True})) == ["ping"]  # uvx hf downloads too
    assert missing_tools(NodeFacts("n")) == []  # not read is not missing


class _Reads:
    """A runner's reads, counted; nothing answers (a test that gets here has failed already)."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    async def read(self, node, cmd, timeout=None, quiet=False):
        self.sent.append(f"{node}: {cmd.shell()}")
        return SimpleNamespace(ok=False, stdout="", stderr="", exit_status=1)


def _with_tools(flow: Flow, node: str, **tools: bool) -> Flow:
    facts = dict(flow.runner.state.facts["nodes"])
    facts[node] = {**facts[node], "tools": tools}
    flow.runner.state.facts["nodes"] = facts
    return flow


async def test_a_node_without_ping_is_told_to_install_it_not_to_check_the_cable():
    """Before: "a 9000-byte don't-fragment ping failed … check the cable" on a host without ping."""
    from sparkconsole.deploy.steps import Network

    flow = _with_tools(_flow({"spark-a": "jhunt", "spark-b": "jhunt"}), "spark-a", ping=False)
    reads = _Reads()
    flow.runner.read = reads.read
    with pytest.raises(StepFailed) as failed:
        await Network(flow).verify()
    assert "spark-a: ping is not installed" in failed.value.message
    assert failed.value.fix == "sudo apt-get install -y iputils-ping" and "cable" not in failed.value.fix
    assert not [s for s in reads.sent if s.startswith("spark-a: ping")]


async def test_a_copy_without_rsync_at_either_end_stops_before_anything_starts():
    """Before: the copy job started and "ended with exit 127 — fix: --resume continues it"."""
    from sparkconsole.deploy import weights as weight_files
    from sparkconsole.deploy.steps import Weights

    flow = _with_tools(_flow({"spark-a": "jhunt", "spark-b": "jhunt"}), "spark-b", rsync=False)
    flow.plan.hub_files = [weight_files.HubFile("model-00001-of-00001.safetensors", 10, None)]
    flow.plan.weights_ok = {"spark-a": True}
    reads = _Reads()
    flow.runner.read = reads.read
    with pytest.raises(StepFailed) as failed:
        await Weights(flow).send()
    assert failed.value.message.startswith("spark-b: rsync is not installed")
    assert failed.value.fix.startswith("on spark-b: sudo apt-get install -y rsync")
    assert reads.sent == []  # said before a node was asked anything


# ---- a stock pair, on a real Runner whose transport answers from a script -------------------------

class _Scripted:
    """A node's transport answering each command by the first rule whose text it contains
    (``(needle, rc, stdout, stderr)``); every command is recorded."""

    def __init__(self, node: str, rules: list[tuple[str, int, str, str]], log: list[tuple[str, str]]) -> None:
        self.node, self.rules, self.log = node, rules, log
        self.connected, self.last_error = True, None

    async def run(self, cmd, timeout: float = 30.0, input: str | None = None):
        from sparkconsole.transport.base import CommandResult

        text = cmd.shell()
        self.log.append((self.node, text))
        for needle, rc, out, err in self.rules:
            if needle in text:
                return CommandResult(text, rc, out, err, 0.01)
        return CommandResult(text, 0, "", "", 0.01)


def _stock_facts(node: str, *, ip: str, gid: int | None, **over) -> dict:
    """A stock Spark as recon reads it: the login user in the docker group, sudo with a password, no
    hf/uvx on the host, NVIDIA's earlier netplan (one link-local IPv4, on the f1np1 twin only, so
    only that twin has a RoCE v2 IPv4 GID), a GB10 and the story's image."""
    facts = NodeFacts(node, gpu="NVIDIA GB10", user="nvidia", uid=1000, gid=1000,
                      groups=["nvidia", "adm", "sudo", "docker"], sudo="none", home="/home/nvidia",
                      tools={"hf": False, "uvx": False, "rsync": True, "ping": True, "curl": True, "ss": True},
                      mem_total=int(119.7 * (1 << 30)), mem_available=100 * (1 << 30),
                      links=[LinkFacts("rocep1s0f1", "enp1s0f1np1", True, 1, [f"{ip}/16"], 1500, gid),
                             LinkFacts("roceP2p1s0f1", "enP2p1s0f1np1", True, 1, [], 1500, None)],
                      images=[ImageFacts("vllm/vllm-openai:v0.17.0", "sha256:" + "c" * 64)],
                      image_store="containerd", storage_driver="overlayfs")
    for k, v in over.items():
        setattr(facts, k, v)
    return facts.to_json()


def _stock(rules: dict[str, list] | None = None, options: Options | None = None, **facts_over: dict):
    """A Flow over two stock Sparks (head spark-a at GID index 3, worker spark-b at 5) on a real
    Runner; returns the flow and the log of every command its transports were sent."""
    from sparkconsole.deploy.decisions import ScriptedAnswers
    from sparkconsole.deploy.runner import Runner

    names = ("spark-a", "spark-b")
    nodes = tuple(NodeConfig(n, "127.0.0.1", role="head" if i == 0 else "worker") for i, n in enumerate(names))
    config = ClusterConfig(nodes=nodes, name="sparks")
    opts = options or Options()
    state = DeploymentState.new(opts.model, opts.to_json(), "sparks")
    state.facts["nodes"] = {
        "spark-a": _stock_facts("spark-a", ip="169.254.41.7", gid=3, **facts_over.get("spark-a", {})),
        "spark-b": _stock_facts("spark-b", ip="169.254.190.33", gid=5, **facts_over.get("spark-b", {}))}
    log: list[tuple[str, str]] = []
    transports = {n: _Scripted(n, (rules or {}).get(n, []), log) for n in names}
    events: list = []
    runner = Runner(config=config, state=state, transports=transports, answer=ScriptedAnswers({}, auto=True),
                    emit=events.append)
    flow = Flow(runner, opts)
    flow.update(tp=2, pp=1, image="vllm/vllm-openai:v0.17.0", engine="vllm", executor="ray",
                weights_ok={"spark-a": True, "spark-b": True})
    flow.events = events  # type: ignore[attr-defined]
    return flow, log


def _asked(flow: Flow, decision: str) -> dict:
    """The decision as the operator met it (its last event): answer, measured lines, options."""
    from sparkconsole.deploy.events import DecisionEvent

    e = [x for x in flow.events if isinstance(x, DecisionEvent) and x.id == decision][-1]  # type: ignore[attr-defined]
    return {"answer": e.answer, "measured": e.measured, "options": e.options}


# ---- item 2: the download runs where hf is -------------------------------------------------------

def test_the_download_runs_where_the_tool_is_never_an_hf_the_host_lacks():
    """Before: `hf download` on the host, which a stock Spark does not have ("command not found")."""
    from sparkconsole.deploy.steps import Weights

    flow, _ = _stock()
    flow.update(engine_checks={flow.image: {"clis": {"hf": "/usr/local/bin/hf"}}})
    argv = Weights(flow)._download_cmd("spark-a").argv
    # the engine image's own hf, as the login user (nothing root-owned left in the user's cache), the
    # cache mounted where a non-root user can reach it, the token the cache's own file
    assert argv[:3] == ("docker", "run", "--rm") and argv[5:7] == ("--user", "1000:1000")
    assert "/home/nvidia/.cache/huggingface:/hf" in argv and "HF_HOME=/hf" in argv
    assert argv[argv.index("--entrypoint") + 1] == "hf" and argv[-2:] == ("download", flow.options.model)
    assert not any("token" in a.lower() for a in argv)
    flow, _ = _stock(**{"spark-a": {"tools": {"hf": False, "uvx": True}}})
    assert Weights(flow)._download_cmd("spark-a").argv[:3] == ("uvx", "hf", "download")
    flow, _ = _stock(**{"spark-a": {"tools": {"hf": True}}})
    assert Weights(flow)._download_cmd("spark-a").argv[:2] == ("hf", "download")
    flow, _ = _stock()  # no hf anywhere, and the image was not asked: stop with how to get one
    with pytest.raises(StepFailed, match="no `hf` to download with") as failed:
        Weights(flow)._download_cmd("spark-a")
    assert "uv" in failed.value.fix


# ---- item 3: sudo -n, read in recon; the caches step goes on without it ----------------------------

def _sudo_answer(tmp_path: Path, rule_allows_tee: bool) -> str:
    """Recon's sudo check run by the real /bin/sh against a `sudo` that answers as sudo.ws does on a
    stock Spark (the captured message, exit 1), optionally with sparkrun's narrow rule in place."""
    import os
    import subprocess

    from sparkconsole.deploy.recon import SUDO_TEXT

    message = (REAL / "sudo-n-password-required.txt").read_text().splitlines()[2]
    assert message == "sudo: a password is required"
    allowed = "/usr/bin/tee /proc/sys/vm/drop_caches" if rule_allows_tee else "-"
    fake = tmp_path / "sudo"
    fake.write_text("#!/bin/sh\n[ \"$1\" = -n ] && [ \"$2\" = -l ] && shift 2 && "
                    f"[ \"$*\" = '{allowed}' ] && {{ echo \"$*\"; exit 0; }}\n"
                    f"echo '{message}' >&2; exit 1\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    return subprocess.run(["/bin/sh", "-c", SUDO_TEXT], env=env, capture_output=True, text=True).stdout.strip()


def test_recon_reads_whether_sudo_needs_a_password(tmp_path):
    assert _sudo_answer(tmp_path, rule_allows_tee=False) == "none"
    assert _sudo_answer(tmp_path, rule_allows_tee=True) == "drop-caches"  # sparkrun's narrow rule
    assert NodeFacts("n", sudo="drop-caches").can_sudo("drop-caches") and not NodeFacts("n", sudo="none").can_sudo()


async def test_the_caches_step_frees_the_cache_without_sudo_and_drops_it_only_where_a_rule_allows():
    """Before: `sudo -n sh -c 'sync; echo 3 > …'` on every node, a failure fatal ("a password is
    required" on a stock node), and a fix (`sh -c`) no narrow sudoers rule can allow."""
    from sparkconsole.deploy.steps import Caches

    flow, _ = _stock()
    step = Caches(flow)
    await step.decide()
    planned = [(n, c.shell()) for n, c in await flow.runner.rehearse(step.send)]
    hub = "/home/nvidia/.cache/huggingface/hub"
    assert planned == [(n, f"sync && for f in {hub}/*/blobs/* {hub}/*/snapshots/*/* {hub}/*/snapshots/*/*/*; do "
                           '[ -f "$f" ] && [ ! -h "$f" ] || continue; dd if="$f" iflag=nocache count=0 status=none '
                           "|| exit 1; done") for n in ("spark-a", "spark-b")]
    asked = _asked(flow, "caches.drop")
    assert asked["answer"] == "yes" and not any("sudo" in c for _n, c in planned)
    assert any("sudo -n needs a password" in m for m in asked["measured"])
    stop = next(o for o in asked["options"] if o["value"] == "stop")
    assert "nvidia ALL=(root) NOPASSWD: /usr/bin/tee /proc/sys/vm/drop_caches" in stop["why"]
    assert "visudo -cf" in stop["why"]

    flow, _ = _stock(**{"spark-a": {"sudo": "drop-caches"}})
    step = Caches(flow)
    await step.decide()
    planned = [(n, c.shell()) for n, c in await flow.runner.rehearse(step.send)]
    assert planned[0] == ("spark-a", "sync && echo 3 | sudo -n /usr/bin/tee /proc/sys/vm/drop_caches > /dev/null")
    assert planned[1][0] == "spark-b" and "iflag=nocache" in planned[1][1]


def test_a_models_files_leave_the_page_cache_without_root(tmp_path):
    """The eviction the caches step sends where sudo needs a password, run by the real /bin/sh and
    GNU dd on a file in the page cache: ``fincore`` (util-linux) shows its pages gone."""
    import shutil
    import subprocess

    from sparkconsole.remote import evict_page_cache

    if shutil.which("fincore") is None:  # util-linux: scripts/test installs it
        pytest.fail("fincore (util-linux) is needed to see the page cache")
    model = tmp_path / "models--a--b"
    blob = model / "blobs" / ("0" * 64)  # where hf downloaded: a blob, and the snapshot's link to it
    snap = model / "snapshots" / ("1" * 40)
    copied = snap / "sub" / "model-00002.safetensors"  # where rsync -L copied: a regular file, one level down
    blob.parent.mkdir(parents=True)
    copied.parent.mkdir(parents=True)
    (snap / "model-00001.safetensors").symlink_to(blob)
    for f in (blob, copied):
        f.write_bytes(b"\x5a" * (16 << 20))
        f.read_bytes()  # now in the page cache

    def cached(f: Path) -> int:
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(f)],
                             capture_output=True, text=True, check=True).stdout
        return int(out.split()[0])

    subprocess.run(["sync"], check=True)
    before = [cached(blob), cached(copied)]
    res = subprocess.run(["/bin/sh", "-c", evict_page_cache(str(tmp_path)).shell()], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert min(before) > 0 and [cached(blob), cached(copied)] == [0, 0]


# ---- item 4: the GID index per node, pinned only where every listed HCA has it ---------------------

def test_each_node_lists_only_twins_with_an_ipv4_gid_and_pins_its_own_index():
    """Before: both twins listed and one index assumed for both (3), though the earlier netplan
    gives the enP2 twin no IPv4 GID and the peer's index was 5: NCCL failed INIT → RTR."""
    from sparkconsole.deploy.netenv import ib_devices

    flow, _ = _stock()
    head, worker = dict(flow.env("spark-a")), dict(flow.env("spark-b"))
    assert head["NCCL_IB_HCA"] == worker["NCCL_IB_HCA"] == "rocep1s0f1"  # not roceP2p1s0f1: no IPv4 GID
    assert (head["NCCL_IB_GID_INDEX"], worker["NCCL_IB_GID_INDEX"]) == ("3", "5")
    two = NodeFacts("n", links=[LinkFacts("rocep1s0f1", "enp1s0f1np1", True, 1, ["192.168.100.11/24"], 9000, 3),
                                LinkFacts("roceP2p1s0f1", "enP2p1s0f1np1", True, 1, ["192.168.101.11/24"], 9000, 5)])
    assert ib_devices(two) == (["rocep1s0f1", "roceP2p1s0f1"], None)  # they disagree: NCCL picks per device
    same = NodeFacts("n", links=[LinkFacts("rocep1s0f1", "enp1s0f1np1", True, 1, ["192.168.100.11/24"], 9000, 3),
                                 LinkFacts("roceP2p1s0f1", "enP2p1s0f1np1", True, 1, ["192.168.101.11/24"], 9000, 3)])
    assert ib_devices(same) == (["rocep1s0f1", "roceP2p1s0f1"], 3)


# ---- item 5: the head's variables are not carried over the workers' own ---------------------------

async def test_the_head_keeps_each_nodes_own_variables_from_vllms_ray_carry_over():
    """vLLM >= 0.17 copies the driver's NCCL_*/UCX_*/VLLM_*/HF_* to every Ray worker (PR #34383):
    the head's NCCL_IB_GID_INDEX=3 over the worker's 5. Before: no ray_non_carry_over_env_vars.json."""
    import json
    import shlex

    from sparkconsole.deploy.steps import Serve

    flow, _ = _stock()
    planned = await flow.runner.rehearse(Serve(flow).send)
    write = [c for n, c in planned if n == "spark-a" and "ray_non_carry_over_env_vars.json" in c.shell()]
    assert len(write) == 1
    argv = list(write[0].argv)
    assert argv[:3] == ["docker", "exec", flow.container("ray")]
    assert "/root/.config/vllm/ray_non_carry_over_env_vars.json" in argv[-3]
    assert json.loads(argv[-1]) == ["NCCL_IB_GID_INDEX"]  # the one per-node value that differs here
    serve = [c for n, c in planned if "vllm serve" in c.shell()]
    assert planned.index(("spark-a", write[0])) < planned.index(("spark-a", serve[0]))  # read when serve starts
    assert "VLLM_CONFIG_ROOT=/root/.config/vllm" in shlex.split(serve[0].shell())
    # the engine's log is made by the login user first, so root in the container writes into the
    # user's file, not a root-owned one in the user's cache (item 2's "given back to the user")
    log = f"/home/nvidia/.cache/huggingface/sparkconsole/{flow.runner.state.short_id}/serve.log"
    made = next(i for i, (n, c) in enumerate(planned) if n == "spark-a" and f"touch {log}" in c.shell())
    assert made < planned.index(("spark-a", serve[0])) and f"> {log.replace('/home/nvidia', '/root')}" in \
        serve[0].shell()


# ---- item 6: the engine check runs with the GPU and reads the build's CUDA and kernels ------------

def test_the_engine_check_says_a_build_without_kernels_for_gb10():
    """vllm#30855: torch 2.9.0+cu128 on GB10, "no kernel image is available" (the fixture)."""
    from sparkconsole.deploy.engines import KNOWN_IMAGES, parse_engine_output, version_tuple

    assert "no kernel image is available" in (REAL / "gb10-cuda12-build.txt").read_text()
    head = "vllm 0.12.0\ntransformers 4.57.1\ntorch 2.9.0+cu128\nsglang -\nray 2.49.0\ncuda 12.8\ndevice 12.1\n"
    old = parse_engine_output("x", head + "archs sm_80 sm_90\n", 0)
    assert old.gpu_verdict() and "sm_121" in old.gpu_verdict() and "cu130" in old.gpu_verdict()
    assert parse_engine_output("x", head + "archs sm_80 sm_90 sm_120\n", 0).gpu_verdict() is None  # sm_120 runs on 12.1
    assert parse_engine_output("x", head + "archs sm_90 compute_90\n", 0).gpu_verdict() is None  # PTX is compiled
    assert parse_engine_output("x", head.replace("device 12.1\n", "") + "archs -\n", 0).gpu_verdict() is None
    # the bundled known-good images are Blackwell builds: no plain vllm-openai tag before 0.20 (CUDA 12.9)
    for k in KNOWN_IMAGES:
        if k.ref.startswith("vllm/vllm-openai:") and version_tuple(k.version) < (0, 20):
            assert k.ref.endswith("-cu130"), k.ref


async def test_the_engine_check_gives_the_image_the_gpu():
    from sparkconsole.deploy.steps import Engine

    flow, log = _stock()
    await Engine(flow)._check("spark-a", "vllm/vllm-openai:v0.17.0")
    check = next(t for n, t in log if "--entrypoint python3" in t)
    assert check.startswith("docker run --rm --gpus all --entrypoint python3 vllm/vllm-openai:v0.17.0 -c")


# ---- item 7: an image without Ray ---------------------------------------------------------------

async def test_an_image_without_ray_is_offered_vllms_native_multi_node():
    """NGC 26.05 ships without ray; `ray start` in it fails with "ray": executable file not found."""
    from sparkconsole.deploy.steps import Cluster

    assert '"ray": executable file not found' in (REAL / "ray-not-found.txt").read_text()
    flow, _ = _stock()
    flow.update(image="nvcr.io/nvidia/vllm:26.05-py3", executor=None,
                engine_checks={"nvcr.io/nvidia/vllm:26.05-py3": {"versions": {"vllm": "0.20.1", "ray": None},
                                                                 "clis": {"ray": None, "vllm": "/usr/bin/vllm"}}})
    await Cluster(flow).decide()
    asked = _asked(flow, "cluster.executor")
    assert asked["answer"] == "native" and flow.plan.executor == "native"
    assert "back-engine" in [o["value"] for o in asked["options"]]
    assert any("Ray ABSENT" in m for m in asked["measured"])


# ---- item 8: every launch names its entrypoint ---------------------------------------------------

@pytest.mark.parametrize("executor,tp", [("single", 1), ("native", 2)])
def test_every_engine_launch_names_its_entrypoint(executor, tp):
    """Only vllm/vllm-openai's ENTRYPOINT is `vllm serve`; NGC's is /opt/nvidia/nvidia_entrypoint.sh,
    which took the model id for a command. Before: the model id alone after the image."""
    from sparkconsole.deploy.steps import Serve

    flow, _ = _stock()
    flow.update(executor=executor, tp=tp)
    for _n, cmd in Serve(flow)._commands():
        argv = list(cmd.argv)
        assert argv[argv.index("--entrypoint") + 1] == "vllm"
        assert argv[argv.index(flow.image) + 1] == "serve"


# ---- item 9: the same image is the same layers --------------------------------------------------

async def test_images_are_compared_by_layers_not_ids_under_the_containerd_store():
    """Under Docker's containerd store an image's ID can change across docker save | docker load
    (moby#48401); its layers do not. Before: "image IDs differ" and a copy that never converged."""
    from sparkconsole.deploy.recon import parse_storage
    from sparkconsole.deploy.steps import Images

    layers = '["sha256:' + "1" * 64 + '","sha256:' + "2" * 64 + '"]\n'
    flow, log = _stock({n: [("RootFS.Layers", 0, layers, "")] for n in ("spark-a", "spark-b")})
    assert await Images(flow).probe() == "vllm/vllm-openai:v0.17.0 is on every node (the same 2 layers)"
    assert all("{{json .RootFS.Layers}}" in t for _n, t in log) and not any("{{.Id}}" in t for _n, t in log)
    assert parse_storage('overlayfs [["driver-type","io.containerd.snapshotter.v1"]]') == ("overlayfs", "containerd")
    info = (REAL / "stock-spark-docker-info.txt").read_text()
    assert " Storage Driver: overlay2" in info  # the real capture's store: a classic graph driver
    assert parse_storage('overlay2 [["Backing Filesystem","extfs"]]') == ("overlay2", "classic")


# ---- item 10: the engines stay off the Hub once the weights are verified ----------------------------

def test_engines_start_offline_after_the_weights_step():
    """The engines start after the weights step verified every file on every node, so they need
    nothing from the Hub; before, a worker without internet waited out a Hub timeout per file."""
    from sparkconsole.deploy.steps import STEP_IDS

    assert STEP_IDS.index("weights") < STEP_IDS.index("cluster") < STEP_IDS.index("serve")
    flow, _ = _stock()
    for n in ("spark-a", "spark-b"):
        assert {("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1")} <= set(flow.env(n))


# ---- item 12: a model the console has not bundled ------------------------------------------------

async def test_a_model_neither_bundled_nor_cached_is_read_from_the_hub_through_a_node(monkeypatch):
    """Before: `deploy --model X` stopped at once: "not bundled and not cached, and offline"."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the laptop has no route to the Hub
    config = (Path(__file__).parents[1] / "sparkconsole" / "planner" / "specs" / "qwen3-8B.config.json").read_text()
    index = '{"metadata": {"total_size": 16381470720}, "weight_map": {"model.embed_tokens.weight": "m-1.safetensors"}}'
    rules = {"spark-a": [("/resolve/main/config.json", 0, config, ""),
                         ("/resolve/main/model.safetensors.index.json", 0, index, "")]}
    flow, log = _stock(rules, options=Options(model="acme/Qwen3-8B-finetune"))
    with pytest.raises(StepFailed, match="could not be read"):
        flow.spec  # noqa: B018
    flow.runner.state.facts["nodes"] = {**flow.runner.state.facts["nodes"],
                                        "spark-a": {**flow.runner.state.facts["nodes"]["spark-a"], "hub": True}}
    await flow.find_spec()
    assert flow.spec.geometry.num_layers == 36 and flow.spec.checkpoint.total_size == 16381470720
    sent = [t for n, t in log if n == "spark-a"]
    assert all("-H @-" in t and "Authorization: Bearer" in t for t in sent)  # the node's token, as a header
    from sparkconsole.planner.spec import load_spec
    assert load_spec("acme/Qwen3-8B-finetune", offline=True).geometry.num_layers == 36  # cached for next time


# ---- item 14: units and host processes are offered for freeing -------------------------------------

async def test_units_and_host_gpu_processes_are_offered_for_freeing_memory():
    """Before: only containers; a model served by a systemd unit (the seed stopped vllm-cluster) or
    started by hand was never offered, and the plan stayed short."""
    from sparkconsole.deploy import freeing
    from sparkconsole.deploy.recon import Holder, parse_owners
    from sparkconsole.deploy.steps import FreeMemory

    owners = parse_owners("4242 0::/system.slice/vllm-cluster.service\n5151 0::/user.slice/user-1000.slice/"
                          "session-3.scope\n6161 0::/system.slice/docker-" + "a" * 64 + ".scope\n")
    assert owners == {4242: ("unit", "vllm-cluster.service"), 6161: ("container", "a" * 64)}
    gib = 1 << 30
    holders = [Holder("process", "python3", 60 * gib, detail="unit vllm-cluster.service"),
               Holder("process", "ollama", 20 * gib, detail="pid 5151")]
    f = NodeFacts("spark-a", mem_available=30 * gib, holders=holders, sudo="all")
    assert freeing.service_bytes(f) == {"unit:vllm-cluster.service": 60 * gib, "pid:5151": 20 * gib}
    assert freeing.choose(f, 80 * gib).stop == ("unit:vllm-cluster.service",)
    f.sudo = "none"  # a unit needs sudo to stop: without it, only what the user may stop is recommended
    assert freeing.choose(f, 80 * gib).stop == ("pid:5151",) and not freeing.choose(f, 80 * gib).enough

    flow, _ = _stock()
    flow.update(stops=[Stop("spark-a", "unit:vllm-cluster.service"), Stop("spark-b", "pid:5151")])
    planned = [(n, c.shell()) for n, c in await flow.runner.rehearse(FreeMemory(flow).send)]
    assert planned == [("spark-a", "sudo -n systemctl stop vllm-cluster.service"), ("spark-b", "kill -TERM 5151")]


def test_the_engine_check_as_a_real_gpu_answered_it():
    """The check's program run by a real torch on a real GPU (an H200: the device machine): what it
    prints is what the parser reads, and a CUDA 13 build's arch list (it has sm_120) runs on GB10."""
    from sparkconsole.deploy.engines import parse_engine_output

    text = (REAL.parent / "h200" / "engine-check-torch-cu130.txt").read_text()
    f = parse_engine_output("torch-cu130", "\n".join(x for x in text.splitlines() if not x.startswith("#")), 0)
    assert (f.cuda, f.device, f.versions["torch"]) == ("13.0", "9.0", "2.11.0+cu130")
    assert f.has("hf") and f.has("ray") is False and f.versions["ray"] is None and not f.error
    assert "sm_120" in f.cuda_archs and f.gpu_verdict() is None  # sm_90 for the H200 itself
    f.device = "12.1"  # the same build on a GB10: sm_120 code runs on sm_121 (same major, lower minor)
    assert f.gpu_verdict() is None
    f.cuda_archs = tuple(a for a in f.cuda_archs if a != "sm_120")
    assert "no kernels for this GPU (sm_121)" in (f.gpu_verdict() or "")


# ---- what stays cached without sudo, and a native start's cause on its worker ----------------------

async def test_what_stays_cached_without_sudo_refits_the_memory_budget_before_the_start():
    """After the HF files are evicted, an image just loaded stays cached (root's to drop): the worker
    has 86.2 GiB free where gmu 0.85 needs 104.4. Before: the start failed vLLM's check ("Free memory
    on device … less than desired GPU memory utilization", vllm#35313) and the wizard went round."""
    from sparkconsole.deploy.runner import GoTo
    from sparkconsole.deploy.steps import Caches

    gib = 1 << 30
    flow, _ = _stock()
    flow.update(gmu=0.85, need={n: int(104.4 * gib) for n in ("spark-a", "spark-b")})
    facts = {"spark-a": NodeFacts("spark-a", gpu="NVIDIA GB10", mem_available=int(106.6 * gib), page_cache=int(0.4 * gib)),
             "spark-b": NodeFacts("spark-b", gpu="NVIDIA GB10", mem_available=int(106.6 * gib), page_cache=int(20.4 * gib))}

    async def recon(nodes=None):
        return facts

    flow.recon = recon  # type: ignore[method-assign]
    with pytest.raises(GoTo) as back:
        await Caches(flow).verify()
    assert back.value.step == "plan" and flow.plan.gmu_override == 0.68  # (86.2 - 1 - 1.5) / 121.69, floored
    asked = _asked(flow, "caches.fit")
    assert asked["answer"] == "lower" and [m.split(":")[0] for m in asked["measured"]] == ["spark-b"]
    flow.update(need={n: int(0.68 * 121.69 * gib + gib) for n in ("spark-a", "spark-b")}, gmu=0.68)
    await Caches(flow).verify()  # re-planned: it fits, nothing asked


async def test_a_native_start_that_failed_on_a_worker_is_explained_by_the_workers_log():
    """vLLM's head says only "Engine core initialization failed … Failed core proc(s): {}" when a
    headless worker died; the cause is in the worker's own log. Before: "an error the console does
    not recognise". The worker's line is vllm#35313's, as reported (error_strings_collection.txt)."""
    from sparkconsole.deploy.steps import Serve
    from sparkconsole.logs.vllm import VllmLogTracker

    real = (REAL.parent / "gb10" / "error_strings_collection.txt").read_text()
    cause = next(x for x in real.splitlines() if x.startswith("ValueError: Free memory on device"))
    worker_log = f"(Worker_TP1 pid=573) ERROR [multiproc_executor.py:772] WorkerProc failed to start.\n{cause}\n"
    flow, log = _stock({"spark-b": [("docker logs --tail 400", 0, worker_log, "")]})
    flow.update(executor="native")
    head = VllmLogTracker()
    for line in ("(APIServer pid=1) Traceback (most recent call last):",
                 "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. "
                 "Failed core proc(s): {}"):
        head.feed(line)
    assert head.report.failure_kind == "other"
    got = await Serve(flow)._root_cause(head.report)
    assert got.failure_kind == "oom" and got.failure_line.startswith("ValueError: Free memory on device")
    assert [n for n, t in log if "docker logs" in t] == ["spark-b"]


def test_recon_says_what_the_login_user_may_not_do_and_which_ports_are_taken():
    """Item 11's rest: docker without the group stops at recon with the playbook's fix (before: the
    first `docker` of a later step failed with "permission denied"); a taken Ray or engine port and
    sudo without a password are said there, not met later."""
    from sparkconsole.deploy.recon import Listener, parse_ids
    from sparkconsole.deploy.steps import Recon

    user, uid, gid, groups = parse_ids(_id_output())  # the real capture: in the docker group
    assert (user, uid, gid) == ("jhunt", 1000, 1000) and "docker" in groups
    flow, _ = _stock()
    notes: list[tuple[str, str]] = []
    flow.runner.note = lambda text, level="info", node=None: notes.append((level, text))  # type: ignore[method-assign]
    f = NodeFacts("spark-a", user="jhunt", groups=[g for g in groups if g != "docker"], sudo="none",
                  listeners=[Listener(6379, "0.0.0.0", "gcs_server", 4242)])
    with pytest.raises(StepFailed) as failed:
        Recon(flow)._access(f)
    assert "jhunt is not in the docker group" in failed.value.message
    assert failed.value.fix.startswith("on spark-a: `sudo usermod -aG docker jhunt`")
    f.groups = groups
    Recon(flow)._access(f)
    assert ("warning", "port 6379 (Ray) is taken by gcs_server (pid 4242)") in notes
    assert any("sudo needs a password for jhunt" in t for _lvl, t in notes)


def test_the_endpoints_tunnel_goes_to_the_login_user_on_the_heads_ssh_port():
    """Before: `ssh -L 8000:localhost:8000 HOST`, which logs in as the laptop's user on port 22."""
    from sparkconsole.deploy.steps.verify import _tunnel

    assert _tunnel(NodeConfig("spark-a", "127.0.0.1", user="nvidia", port=2222), 8000) == \
        "ssh -L 8000:localhost:8000 -p 2222 nvidia@127.0.0.1"
    assert _tunnel(NodeConfig("spark-a", "spark-a.lan"), 8000) == "ssh -L 8000:localhost:8000 spark-a.lan"


async def test_teardown_goes_on_when_the_page_cache_cannot_be_freed():
    """Freeing the cache before the stopped services start again is best effort in teardown: a
    failure is said, and the teardown still starts them (the forward run stops on it instead)."""
    from sparkconsole.deploy.steps.memory import drop_page_cache

    flow, _ = _stock({n: [("iflag=nocache", 1, "", "dd: failed to open 'x': Permission denied")]
                      for n in ("spark-a", "spark-b")})
    with pytest.raises(StepFailed, match="freeing the page cache failed"):
        await drop_page_cache(flow, ["spark-a"])
    notes: list[tuple[str, str]] = []
    flow.runner.note = lambda text, level="info", node=None: notes.append((level, text))  # type: ignore[method-assign]
    await drop_page_cache(flow, ["spark-a", "spark-b"], strict=False)
    assert [lvl for lvl, _t in notes] == ["warning", "warning"] and "Permission denied" in notes[0][1]


def test_a_process_name_read_from_a_node_reaches_the_notes_as_plain_text():
    """``ss`` prints the process name a node chose: an escape in it must not reach the screen."""
    from sparkconsole.deploy.recon import Listener
    from sparkconsole.deploy.steps import Recon

    flow, _ = _stock()
    notes: list[str] = []
    flow.runner.note = lambda text, level="info", node=None: notes.append(text)  # type: ignore[method-assign]
    f = NodeFacts("spark-a", user="nvidia", groups=["docker"], sudo="all",
                  listeners=[Listener(8000, "0.0.0.0", "evil\x1b]52;c;eA==\x07\x1b[2J", 7)])
    Recon(flow)._access(f)
    assert notes == ["port 8000 (the engine's API) is taken by evil (pid 7)"]
