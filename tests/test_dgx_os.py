"""What a stock DGX OS node is like, against the wizard's assumptions (issue 22): each test here
failed on the code before it. The real outputs are in tests/fixtures/real/dgx-os/ (sources in
their headers)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from sparkconsole.config import ClusterConfig, NodeConfig
from sparkconsole.deploy.engines import version_from_ref
from sparkconsole.deploy.flow import Flow, Options
from sparkconsole.deploy.recon import LinkFacts, NodeFacts, parse_login_user
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
