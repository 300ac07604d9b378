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
