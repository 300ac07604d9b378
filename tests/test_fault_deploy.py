"""Faults during a deployment on the demo cluster (issue 14, part 3): the wizard (Flow + Runner,
as ``sparkconsole deploy --auto`` drives them) against ``sparkconsole.sim`` over real SSH.

The fast link set down on the worker while the weights copy beside the download: the copy's
rsync notices within ssh's keepalive (3 x 5 s), the nodes are read again, and the decision
``weights.link`` is offered with what was measured:

- *wait* (the recommendation, what ``--auto`` takes): the download goes on; once the port is Up
  again the copy resumes where it stopped (``--partial``) and the step ends verified;
- *stop*: the flow goes back to the network step, which stops with the exact fix.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from tests.deploy_support import demo_flow

SPEED = 100.0
LINK_DOWN_SIM_S = 60.0  # how long the cable stays out in the "wait" case


@dataclass
class Run:
    outcome: object
    events: list = field(default_factory=list)
    down_at: float = 0.0
    offered_at: float | None = None
    up_at: float | None = None
    worker: str = ""

    def decisions(self, did: str) -> list:
        return [e for _t, e in self.events if e.kind == "decision" and e.id == did]

    def steps(self) -> list[tuple[str, str, str]]:
        return [(e.step, e.state, e.note) for _t, e in self.events if e.kind == "step"]


async def _link_down_mid_copy(tmp_path, presets: dict[str, str], restore_after: float | None) -> Run:
    """Run the story deployment; set the worker's port down once the copy moves bytes; when the
    decision is offered, put it back ``restore_after`` sim s later (None: never)."""
    copying, offered = asyncio.Event(), asyncio.Event()

    def watch(e) -> None:
        if e.kind == "progress" and e.label == "copy" and (e.fraction or 0) > 0:
            copying.set()
        if e.kind == "decision" and e.id == "weights.link":
            offered.set()

    async with demo_flow(tmp_path, presets, speed=SPEED, on_event=watch) as flow:
        clock = flow.demo.sim.clock
        run = Run(outcome=None, events=flow.events, worker=list(flow.demo.sim.nodes)[-1])
        await flow.until(copying, timeout=120)
        run.down_at = clock.now()
        flow.demo.sim.nodes[run.worker].port1_up = False  # `ip link set enp1s0f1np1 down`, as the lab does
        await flow.until(offered, timeout=120)
        run.offered_at = next(t for t, e in flow.events if e.kind == "decision" and e.id == "weights.link")
        if restore_after is not None:
            await clock.sleep(restore_after)
            run.up_at = clock.now()
            flow.demo.sim.nodes[run.worker].port1_up = True  # the cable reseated
        run.outcome = await asyncio.wait_for(flow.task, 240)
    return run


def _offered_with_what_was_measured(run: Run) -> None:
    asked = run.decisions("weights.link")
    assert asked and [o["value"] for o in asked[0].options] == ["wait", "stop"] and asked[0].recommended == "wait"
    measured = " ".join(asked[0].measured)
    assert "ConnectX-7" in measured and f"copy to {run.worker}: stopped" in measured
    assert "download on" in measured and "going on" in measured  # seen while the download still ran
    notes = [e.text for _t, e in run.events if e.kind == "note" and e.level == "error"]
    assert any(f"the copy to {run.worker} failed" in t for t in notes)


async def test_fast_link_down_mid_copy_offers_to_wait_and_the_copy_resumes_when_it_is_back(tmp_path):
    run = await _link_down_mid_copy(tmp_path, {}, restore_after=LINK_DOWN_SIM_S)
    _offered_with_what_was_measured(run)
    answered = [e for e in run.decisions("weights.link") if e.answer]
    assert answered and answered[0].answer == "wait" and answered[0].by == "auto"
    out = run.outcome
    assert out.ok, out.result.message  # type: ignore[attr-defined]
    notes = [e.text for _t, e in run.events if e.kind == "note"]
    back = next(t for t in notes if t.startswith("the fast link is back"))
    assert f"the copy to {run.worker} goes on" in back
    verified = [t for t in notes if t.startswith("weights:") and "verified" in t]
    assert len(verified) == 2, notes  # both nodes hold every file, sizes and sha256 checked
    assert ("weights", "done", "") in [(s, st, "") for s, st, _n in run.steps()]
    assert not any(s == "network" and st == "failed" for s, st, _n in run.steps())
    print(f"\nfast link down mid-copy, answer 'wait': offered {run.offered_at - run.down_at:.0f} sim s after the "
          f"link went down; link back {LINK_DOWN_SIM_S:.0f} s later; {back}; deployment served")


async def test_fast_link_down_mid_copy_answer_stop_goes_back_to_network_with_the_fix(tmp_path):
    run = await _link_down_mid_copy(tmp_path, {"weights.link": "stop"}, restore_after=None)
    _offered_with_what_was_measured(run)
    out = run.outcome
    assert not out.ok and out.stopped_at == "network", out.result.message  # type: ignore[attr-defined]
    assert "same port" in out.result.message and "fix:" in out.result.message  # type: ignore[attr-defined]
    back = next(n for s, st, n in run.steps() if s == "weights" and st == "failed")
    assert back.startswith("back to network") and "fast link changed" in back
    print(f"\nfast link down mid-copy, answer 'stop': offered {run.offered_at - run.down_at:.0f} sim s after the "
          f"link went down; stopped at network: {out.result.message[:160]}")  # type: ignore[attr-defined]
