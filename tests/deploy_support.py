"""The wizard on the demo cluster, as ``sparkconsole deploy --auto`` drives it (Flow + Runner
against ``sparkconsole.sim`` over real SSH), for the fault tests: opened by the same
:func:`~sparkconsole.deploy.opening.open_deployment` as the CLI and the console (lock, transports,
runner, flow), recording every event with its sim time and every command sent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkconsole.config import NodeConfig
from sparkconsole.deploy.decisions import ScriptedAnswers
from sparkconsole.deploy.flow import Flow, Options
from sparkconsole.deploy.opening import open_deployment
from sparkconsole.deploy.runner import Settings
from sparkconsole.deploy.session import run_flow
from sparkconsole.deploy.state import DeploymentState, StateStore
from sparkconsole.sim import start_demo_cluster
from sparkconsole.transport import node_transport


@dataclass
class DemoFlow:
    demo: Any                       # the running demo cluster (``demo.sim`` is the model)
    flow: Flow
    transports: dict[str, Any]
    task: asyncio.Future
    events: list[tuple[float, Any]] = field(default_factory=list)
    sent: list[tuple[float, str, str]] = field(default_factory=list)  # (sim time, node, shell text)

    def sent_between(self, node: str, start: float, end: float, contains: str = "") -> list[str]:
        """The commands the flow sent to ``node`` in [start, end] of sim time (reads included)."""
        return [text for t, n, text in self.sent if n == node and start <= t <= end and contains in text]

    def now(self) -> float:
        return self.demo.sim.clock.now()

    async def until(self, event: asyncio.Event, timeout: float = 200.0) -> None:
        """Wait for ``event`` while the flow runs; the flow must not have ended first."""
        await asyncio.wait({self.task, asyncio.ensure_future(event.wait())}, timeout=timeout,
                           return_when=asyncio.FIRST_COMPLETED)
        assert event.is_set() and not self.task.done(), [e for _t, e in self.events[-5:]]


@asynccontextmanager
async def demo_flow(tmp_path: Path, presets: dict[str, str], *, speed: float, poll_sim_s: float = 2.0,
                    scenario: str = "story", on_event: Callable[[Any], None] | None = None
                    ) -> AsyncIterator[DemoFlow]:
    """Start the demo cluster and the whole deployment (``--auto`` plus ``presets``) in a task."""
    async with start_demo_cluster(scenario=scenario, speed=speed) as demo:
        events: list[tuple[float, Any]] = []  # from the opening on (the cluster's lock on the head is taken there)

        def emit(e: Any) -> None:
            events.append((demo.sim.clock.now(), e))
            if on_event is not None:
                on_event(e)

        config = demo.config
        state = DeploymentState.new(Options().model, Options().to_json(), config.name)
        sent: list[tuple[float, str, str]] = []

        def recorded_transport(node: NodeConfig) -> Any:
            transport = node_transport(config, node)
            transport.run = _recording(transport.run, node.name, sent, demo.sim.clock.now)
            return transport

        # the lock under the test's own folder: this demo lives in this process, yet the session is
        # opened exactly as the CLI opens one (lock included)
        async with open_deployment(config, Options(), state, answer=ScriptedAnswers(presets, auto=True), emit=emit,
                                   store=StateStore(tmp_path / "deployments"),
                                   settings=Settings(poll_s=poll_sim_s / speed, speed=speed),
                                   transport_factory=recorded_transport, locks=tmp_path / "locks") as session:
            run = DemoFlow(demo, session.flow, session.transports, asyncio.ensure_future(run_flow(session.flow)),
                           events=events, sent=sent)
            try:
                yield run
            finally:
                run.task.cancel()
                await asyncio.gather(run.task, return_exceptions=True)


def _recording(run: Callable[..., Any], node: str, sent: list[tuple[float, str, str]],
               now: Callable[[], float]) -> Callable[..., Any]:
    """``transport.run`` that first notes what it sends and when (sim time): the fault tests count
    the polls between a fault and its diagnosis, never wall seconds."""
    async def recorded(cmd: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append((now(), node, cmd.shell()))
        return await run(cmd, *args, **kwargs)
    return recorded
