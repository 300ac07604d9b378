"""Faults during a deployment on the demo cluster (issue 14, part 3): the wizard (Flow + Runner,
as ``sparkconsole deploy --auto`` drives them) against ``sparkconsole.sim`` over real SSH.

- the fast link set down on the worker while the weights copy beside the download: the failed
  copy pass is seen, the nodes are read again, and the flow goes back to the network step, which
  stops with the exact fix (the same port Up on both nodes) instead of waiting for the download.
"""

from __future__ import annotations

import asyncio

from sparkconsole.deploy.decisions import ScriptedAnswers
from sparkconsole.deploy.flow import Flow, Options
from sparkconsole.deploy.runner import Runner, Settings
from sparkconsole.deploy.session import run_flow
from sparkconsole.deploy.state import DeploymentState, StateStore
from sparkconsole.sim import start_demo_cluster
from sparkconsole.transport import node_transport

SPEED = 100.0


async def test_fast_link_set_down_mid_copy_is_detected_and_sends_the_flow_back_to_network(tmp_path):
    async with start_demo_cluster(scenario="story", speed=SPEED) as demo:
        clock = demo.sim.clock
        worker = list(demo.sim.nodes)[-1]
        events: list = []
        copying = asyncio.Event()

        def emit(e) -> None:
            events.append((clock.now(), e))
            if e.kind == "progress" and e.label == "copy" and (e.fraction or 0) > 0:
                copying.set()

        config = demo.config
        state = DeploymentState.new(Options().model, Options().to_json(), config.name)
        transports = {n.name: node_transport(config, n) for n in config.nodes}
        runner = Runner(config=config, state=state, transports=transports, answer=ScriptedAnswers({}, auto=True),
                        emit=emit, store=StateStore(tmp_path / "deployments"),
                        settings=Settings(poll_s=2.0 / SPEED, speed=SPEED))
        try:
            flow = asyncio.ensure_future(run_flow(Flow(runner, Options())))
            await asyncio.wait({flow, asyncio.ensure_future(copying.wait())}, timeout=120,
                               return_when=asyncio.FIRST_COMPLETED)
            assert copying.is_set() and not flow.done(), [e for _t, e in events[-5:]]
            down_at = clock.now()
            demo.sim.nodes[worker].port1_up = False  # `ip link set enp1s0f1np1 down`, as the lab does
            outcome = await asyncio.wait_for(flow, 120)
            detected = clock.now() - down_at
        finally:
            for t in transports.values():
                await t.close()
    assert not outcome.ok and outcome.stopped_at == "network", outcome.result.message
    assert "same port" in outcome.result.message and "fix:" in outcome.result.message
    steps = [(e.step, e.state, e.note) for _t, e in events if e.kind == "step"]
    assert ("weights", "failed") in [(s, st) for s, st, _n in steps]
    back = next(n for s, st, n in steps if s == "weights" and st == "failed")
    assert back.startswith("back to network") and "fast link changed" in back
    notes = [e.text for _t, e in events if e.kind == "note" and e.level == "error"]
    assert any(f"the copy to {worker} failed" in t for t in notes)
    downloaded = max((e.fraction or 0) for _t, e in events if e.kind == "progress" and e.label == "download")
    assert downloaded < 1.0  # seen while the download still ran, not at its end
    print(f"\nfast link down mid-copy: back to network and stopped with the fix {detected:.0f} sim s after the link "
          f"went down (download at {downloaded:.0%}): {outcome.result.message[:160]}")
