"""Alerts: each condition the dashboard must raise, and none on a healthy pair of nodes.

The samples here are built by hand (typed values, not command output), each changing one fact
of an otherwise healthy GB10 node.
"""

from __future__ import annotations

from dataclasses import replace

from sparkconsole.probe.alerts import cluster_alerts
from sparkconsole.probe.samples import GIB, Container, FastLink, GpuSample, NodeSample, UnifiedMemory
from sparkconsole.probe.state import NodeState, NodeStatus


def healthy(name: str) -> NodeState:
    sample = NodeSample(
        node=name,
        taken_at=100.0,
        memory=UnifiedMemory(total_bytes=int(119.7 * GIB), available_bytes=int(60 * GIB), unified=True),
        driver_version="580.126.09",
        cuda_version="13.0",
        gpus=(GpuSample(index=0, name="NVIDIA GB10", clock_max_sm_mhz=3003),),
        links=(
            FastLink("rocep1s0f1", 1, "enp1s0f1np1", "up", 200.0),
            FastLink("rocep1s0f0", 1, "enp1s0f0np0", "down"),
        ),
        containers=(Container("a1", "vllm", "vllm/vllm-openai:v0.17.0", "running", "Up 3 hours"),),
    )
    return NodeState(name, status=NodeStatus.UP, sample=sample, last_ok_at=100.0)


def with_sample(state: NodeState, **changes) -> NodeState:
    state.sample = replace(state.sample, **changes)
    return state


def test_healthy_nodes_raise_nothing():
    assert cluster_alerts([healthy("a"), healthy("b")]) == []


def test_low_memavailable():
    a = with_sample(healthy("a"), memory=UnifiedMemory(total_bytes=int(119.7 * GIB), available_bytes=int(9 * GIB)))
    (alert,) = cluster_alerts([a, healthy("b")])
    assert alert.node == "a" and alert.severity == "critical" and "under 10%" in alert.text


def test_link_down():
    a = with_sample(healthy("a"), links=(FastLink("rocep1s0f1", 1, "enp1s0f1np1", "down"),))
    (alert,) = cluster_alerts([a, healthy("b")])
    assert alert.node == "a" and "link down" in alert.text


def test_no_links_read_is_not_a_link_alert():
    a = with_sample(healthy("a"), links=())  # no ConnectX-7 seen: unknown, not "down"
    assert cluster_alerts([a]) == []


def test_container_restarting():
    c = Container("b2", "ray-worker", "vllm/vllm-openai:v0.17.0", "restarting", "Restarting (1) 3 seconds ago")
    a = with_sample(healthy("a"), containers=(c,))
    (alert,) = cluster_alerts([a])
    assert "ray-worker is restarting" in alert.text


def test_driver_cuda_and_clocks_that_differ_between_nodes():
    b = with_sample(healthy("b"), driver_version="580.95.05", cuda_version="12.9",
                    gpus=(GpuSample(index=0, name="NVIDIA GB10", clock_max_sm_mhz=1500),))
    texts = [a.text for a in cluster_alerts([healthy("a"), b])]
    assert any(t.startswith("driver versions differ: a 580.126.09, b 580.95.05") for t in texts)
    assert any(t.startswith("CUDA versions differ") for t in texts)
    assert any(t.startswith("max GPU clocks differ") for t in texts)


def test_down_and_stale_nodes_come_first():
    """Critical before warning whatever the nodes' order: the stale node is listed first, and its
    warning still comes after the down node and the low-memory one."""
    stale = healthy("c")
    stale.status, stale.reason = NodeStatus.STALE, "no fresh sample for 7 s"
    down = healthy("b")
    down.status, down.reason = NodeStatus.DOWN, "no answer in time"
    low = with_sample(healthy("a"), memory=UnifiedMemory(total_bytes=100 * GIB, available_bytes=5 * GIB))
    alerts = cluster_alerts([stale, low, down])
    assert [a.severity for a in alerts] == ["critical", "critical", "warning"]
    assert [(a.node, a.kind) for a in alerts] == [("a", "low-memory"), ("b", "down"), ("c", "stale")]
    assert alerts[1].text == "node down: no answer in time"
    assert alerts[2].text == "stale: no fresh sample for 7 s"


def test_an_alerts_identity_is_kind_node_subject_not_its_live_text():
    def low(avail_gib: float) -> NodeState:
        memory = UnifiedMemory(total_bytes=int(119.7 * GIB), available_bytes=int(avail_gib * GIB), unified=True)
        return with_sample(healthy("a"), memory=memory)

    (first,) = cluster_alerts([low(7.3)])
    (second,) = cluster_alerts([low(7.2)])
    assert first.text != second.text  # the text carries the live number...
    assert first.key == second.key == ("low-memory", "a", "")  # ...the identity does not
    restarting = [Container(f"c{i}", name, "img", "restarting", "Restarting (1) 2 seconds ago") for i, name in
                  enumerate(("vllm", "ray"))]
    keys = {a.key for a in cluster_alerts([with_sample(healthy("a"), containers=tuple(restarting))])}
    assert keys == {("container-restarting", "a", "vllm"), ("container-restarting", "a", "ray")}


def test_the_console_logs_one_event_while_memory_stays_low_and_its_value_moves():
    from types import SimpleNamespace

    from sparkconsole.ui.app import DemoOptions, SparkConsoleApp

    app = SparkConsoleApp(demo=DemoOptions(), clock=lambda: 100.0, remember_theme=False)
    state = healthy("a")
    app.poller = SimpleNamespace(pollers={"a": SimpleNamespace(state=state)})
    for avail in (7.3, 7.2, 7.1, 6.9):
        memory = UnifiedMemory(total_bytes=int(119.7 * GIB), available_bytes=int(avail * GIB), unified=True)
        with_sample(state, memory=memory)
        app._note_changes("a", cluster_alerts([state]))
    assert [text for _, _, text in app.events] == ["alert a: MemAvailable 7.3 GiB (6%) — under 10%"]
    with_sample(state, memory=UnifiedMemory(total_bytes=int(119.7 * GIB), available_bytes=60 * GIB, unified=True))
    app._note_changes("a", cluster_alerts([state]))
    with_sample(state, memory=UnifiedMemory(total_bytes=int(119.7 * GIB), available_bytes=5 * GIB, unified=True))
    app._note_changes("a", cluster_alerts([state]))
    assert len(app.events) == 2  # over, then back: a new event
