"""Teardown: remove exactly what one deployment started, and offer back what it stopped."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import ClassVar

from sparkconsole.deploy.decisions import Decision, Option
from sparkconsole.deploy.flow import Flow
from sparkconsole.deploy.runner import StepFailed
from sparkconsole.deploy.steps.memory import drop_page_cache
from sparkconsole.probe.parsers import parse_docker_ps
from sparkconsole.remote import command, docker_action, docker_rm_force, systemctl_action


@dataclass
class Teardown:
    """Stops only what this deployment started (by name and id), checks they are gone, and offers the
    services it stopped back."""

    decisions: ClassVar[tuple[str, ...]] = ("teardown.restore",)
    flow: Flow
    restored: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    async def run(self) -> None:
        runner = self.flow.runner
        runner.step = "teardown"
        runner.set_step("teardown", "running")
        by_node: dict[str, list[str]] = {}
        for s in runner.state.started:
            by_node.setdefault(s.node, []).append(s.name)
        for n, names in by_node.items():
            res = await runner.change(n, docker_rm_force(*names))
            if not res.ok and "No such container" not in res.stderr:
                raise StepFailed(f"{n}: docker rm -f failed: {res.stderr.strip()[-200:]}")
        for n, names in by_node.items():
            ps = await runner.read(n, command("docker", "ps", "-a", "--format", "{{json .}}"))
            left = {c.name for c in parse_docker_ps(ps.stdout)} & set(names)
            if left:
                raise StepFailed(f"{n}: still there after removal: {', '.join(sorted(left))}")
        runner.state.started = []
        runner.save()
        if runner.state.stopped:
            d = Decision("teardown.restore", "teardown", "Start the services this deployment stopped again",
                         tuple(f"{s.node}: {s.name}" for s in runner.state.stopped),
                         (Option("yes", "start them again", "they ran before the deployment"),
                          Option("no", "leave them stopped", "")), "yes", "put the nodes back as they were")
            if await runner.decide(d) == "yes":
                # the page cache the model's weights left would fail the services' own start-up memory check
                await drop_page_cache(self.flow, list(dict.fromkeys(s.node for s in runner.state.stopped)),
                                      strict=False)
                for s in list(runner.state.stopped):
                    cmd = (docker_action("start", s.name) if s.kind == "container"
                           else systemctl_action("start", s.name))
                    res = await runner.change(s.node, cmd)
                    if res.ok:
                        self.restored.append(f"{s.node}:{s.name}")
                        runner.state.stopped.remove(s)
                        runner.save()
                await asyncio.sleep(20 / runner.settings.speed)  # a vLLM start fails its memory check within seconds
                for item in self.restored:
                    n, name = item.split(":", 1)
                    st = await self.flow.inspect(n, name)
                    if st is not None and st.status != "running":
                        self.failed.append(item)
                        runner.note(f"{name} did not stay up after its start ({st.status or 'gone'}): read its log "
                               f"(docker logs {name})", "error", node=n)
        runner.state.result = "torn-down"
        runner.state.endpoint = None
        runner.set_step("teardown", "done")
