"""Teardown: remove exactly what one deployment started, and offer back what it stopped."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import ClassVar

from sparkconsole.deploy.decisions import Decision, Option
from sparkconsole.deploy.flow import Flow
from sparkconsole.deploy.runner import StepFailed
from sparkconsole.deploy.steps.cluster import MADE_FILES
from sparkconsole.deploy.steps.memory import drop_page_cache
from sparkconsole.logs.follow import display_text
from sparkconsole.probe.memory_guard import parse_guard_status
from sparkconsole.probe.parsers import parse_docker_ps
from sparkconsole.remote import (
    GuardFiles,
    command,
    docker_action,
    docker_rm_force,
    memory_guard_remove,
    memory_guard_status,
    remove_file,
    systemctl_action,
)


@dataclass
class Teardown:
    """Stops only what this deployment started (by name and id), checks they are gone, and offers the
    services it stopped back."""

    decisions: ClassVar[tuple[str, ...]] = ("teardown.restore",)
    flow: Flow
    restored: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    async def run(self) -> None:
        """Remove, check, offer back. Every change goes the forward steps' way (:meth:`Runner.apply`):
        shown, confirmed, then sent and journaled; a state run against a cluster without asking
        anybody is what issue 23 (item 4) found."""
        runner = self.flow.runner
        runner.step = "teardown"
        runner.set_step("teardown", "running")
        if not await runner.apply("teardown", "Remove what this deployment started", self._remove):
            runner.set_step("teardown", "done", "planned")  # plan-only: shown, nothing sent
            return
        by_node = self._started_by_node()
        for n, names in by_node.items():
            ps = await runner.read(n, command("docker", "ps", "-a", "--format", "{{json .}}"))
            left = {c.name for c in parse_docker_ps(ps.stdout)} & set(names)
            if left:
                raise StepFailed(f"{n}: still there after removal: {', '.join(sorted(left))}")
        for g in runner.state.guards:  # no watcher left running, no arm or state file left behind
            st = parse_guard_status((await runner.read(g.node, memory_guard_status(GuardFiles.under(g.job_dir)))).stdout)
            if st is None or st.armed or st.running or st.level:
                raise StepFailed(f"{g.node}: the memory guard is still there after its removal ({g.job_dir})")
        runner.state.started = []
        runner.state.jobs = {}
        runner.state.guards = []
        runner.state.facts.pop(MADE_FILES, None)
        runner.save()
        if runner.state.stopped:
            d = Decision("teardown.restore", "teardown", "Start the services this deployment stopped again",
                         tuple(f"{s.node}: {s.name}" for s in runner.state.stopped),
                         (Option("yes", "start them again", "they ran before the deployment"),
                          Option("no", "leave them stopped", "")), "yes", "put the nodes back as they were")
            if await runner.decide(d) == "yes":
                await runner.apply("teardown", "Start the stopped services again", self._restore)
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

    def _started_by_node(self) -> dict[str, list[str]]:
        by_node: dict[str, list[str]] = {}
        for s in self.flow.runner.state.started:
            by_node.setdefault(s.node, []).append(s.name)
        return by_node

    async def _remove(self) -> None:
        """Remove the memory guard's watchers first (one left would stop nothing of ours, yet run on;
        removed, each leaves no file), stop the deployment's detached jobs that still run (a download, a
        copy, an image transfer would go on filling the disk, and a copy would wait on its download:
        issue 23, item 7), then remove its containers by name."""
        runner = self.flow.runner
        for g in runner.state.guards:
            res = await runner.change(g.node, memory_guard_remove(GuardFiles.under(g.job_dir)))
            if not res.ok:
                raise StepFailed(f"{g.node}: the memory guard's removal failed: "
                                 f"{display_text(res.stderr.strip()[-200:])}")
        for key, job in sorted(runner.state.jobs.items()):
            if await runner.stop_job(job) and not runner.rehearsing:
                runner.note(f"stopped {job.what or key} (pid {job.pid})", node=job.node)
        for n, names in self._started_by_node().items():
            res = await runner.change(n, docker_rm_force(*names))
            if not res.ok and "No such container" not in res.stderr:
                raise StepFailed(f"{n}: docker rm -f failed: {display_text(res.stderr.strip()[-200:])}")
        # the files the deployment made on the nodes (Ray's token: cluster step), once no container
        # mounts them any more; `rm -f`: one already gone is no failure
        for n, paths in sorted((runner.state.facts.get(MADE_FILES) or {}).items()):
            for path in paths:
                res = await runner.change(n, remove_file(path, f"remove {path} (made by this deployment)"))
                if not res.ok:
                    raise StepFailed(f"{n}: rm -f {path} failed: {display_text(res.stderr.strip()[-200:])}")

    async def _restore(self) -> None:
        """The page cache the model's weights left would fail the services' own start-up memory check:
        free it, then start each stopped service again."""
        runner = self.flow.runner
        await drop_page_cache(self.flow, list(dict.fromkeys(s.node for s in runner.state.stopped)), strict=False)
        for s in list(runner.state.stopped):
            cmd = docker_action("start", s.name) if s.kind == "container" else systemctl_action("start", s.name)
            res = await runner.change(s.node, cmd)
            if res.ok and not runner.rehearsing:
                self.restored.append(f"{s.node}:{s.name}")
                runner.state.stopped.remove(s)
                runner.save()
