"""Guard: before the engine starts, arm the memory guard's watcher on every node the engine runs on.

A Spark's CPU and GPU share one pool of memory, and a prefill that takes the last of it can freeze
the whole host (docs/memory-guard.md). The watcher (:func:`~sparkconsole.remote.memory_guard_watch`)
lives on the node, not in the console: a laptop asleep or a dropped connection does not stop it
from stopping the engine in time. It is armed here, before ``serve`` starts the engine, so no
moment of the engine's life is unguarded; its targets are the containers this deployment runs the
engine in on that node (the engine's own, or the Ray container it runs in), the only things it may
stop (:func:`~sparkconsole.probe.memory_guard.stop_order`: what the console started, nothing else).
Its floors come from the node's own ``MemTotal`` (:func:`~sparkconsole.probe.memory_guard.floors`).
It is a process and a few files in the deployment's job folder, started as the login user (no
sudo); the state keeps each one (:class:`~sparkconsole.deploy.state.Guard`) and teardown removes it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparkconsole.deploy.runner import StepFailed
from sparkconsole.deploy.state import Guard as ArmedGuard
from sparkconsole.deploy.steps.base import Step
from sparkconsole.logs.follow import display_text
from sparkconsole.probe.memory_guard import GuardConfig, GuardStatus, floors, parse_guard_status
from sparkconsole.remote import (
    GUARD_INTERVAL_S,
    GuardFiles,
    RemoteCommand,
    memory_guard_arm,
    memory_guard_remove,
    memory_guard_status,
    memory_guard_watch,
)

if TYPE_CHECKING:
    from sparkconsole.deploy.flow import Flow

CONFIG = GuardConfig()  # the defaults (docs/memory-guard.md); not yet read from the inventory


class Guard(Step):
    id, title = "guard", "Arm the memory guard on every node"
    done_when_serving = True  # an engine already serving was guarded by the deployment that started it
    jobs_run_beside = True  # the watcher runs as long as the engine: no step waits for it

    def __init__(self, flow: Flow) -> None:
        super().__init__(flow)
        self._seen: dict[str, GuardStatus | None] = {}  # what probe read on each node

    def _targets(self) -> dict[str, list[str]]:
        """What the watcher on each node may stop: the containers this deployment runs the engine in
        there, named as the serve step names them (one source: its own list)."""
        return self.flow.step("serve")._engine_containers()  # type: ignore[attr-defined]

    def _files(self, node: str) -> GuardFiles:
        return GuardFiles.under(self.flow.job_dir(node))

    def _watch(self, node: str, targets: list[str]) -> RemoteCommand:
        # recon reads MemTotal on every node; without it the floors are their minimums (4 and 2 GiB)
        warn, hard = floors(self.flow.fact(node).mem_total or 0, CONFIG)
        return memory_guard_watch(node, self._files(node), targets, warn_floor_bytes=warn, hard_floor_bytes=hard,
                                  full_act_pct=CONFIG.full_act_pct, stall_ticks=CONFIG.stall_ticks,
                                  interval_s=GUARD_INTERVAL_S)

    def _recorded(self, node: str) -> ArmedGuard | None:
        return next((g for g in self.runner.state.guards if g.node == node), None)

    async def _status(self, node: str) -> GuardStatus | None:
        res = await self.runner.read(node, memory_guard_status(self._files(node)), quiet=True)
        return parse_guard_status(res.stdout) if res.ok else None

    def _in_place(self, node: str, targets: list[str]) -> bool:
        """Armed, running, and watching these targets (the flow may have gone back and changed them)."""
        st, rec = self._seen.get(node), self._recorded(node)
        return st is not None and st.armed and st.running and rec is not None and rec.targets == targets

    async def probe(self) -> str | None:
        targets = self._targets()
        nodes = sorted(set(targets) | {g.node for g in self.runner.state.guards})
        got = await self.runner.on_all(nodes, self._status)
        self._seen = dict(zip(nodes, got, strict=True))
        if all(self._in_place(n, t) for n, t in targets.items()) and all(
                g.node in targets for g in self.runner.state.guards):
            return f"armed and running on {', '.join(targets)}"
        return None

    async def send(self) -> None:
        """Per node: a watcher armed before for other targets (or one the state does not know) is
        removed first, so that one runs per node; then the watcher is armed. It is kept in the state
        before its start is sent (the start saves the state): teardown removes it, whatever the answer."""
        state = self.runner.state
        targets = self._targets()
        for g in [g for g in state.guards if g.node not in targets]:  # the flow went back to fewer nodes
            await self.runner.change(g.node, memory_guard_remove(GuardFiles.under(g.job_dir)))
            state.guards.remove(g)
        for n, names in targets.items():
            if self._in_place(n, names):
                continue
            files, st = self._files(n), self._seen.get(n)
            if self._recorded(n) is not None or (st is not None and (st.armed or st.running)):
                await self.runner.change(n, memory_guard_remove(files))
            armed = ArmedGuard(n, self.flow.job_dir(n), 0, list(names))
            state.guards[:] = [*(g for g in state.guards if g.node != n), armed]
            res = await self.runner.change(n, memory_guard_arm(armed.job_dir, files, self._watch(n, names)))
            pid = res.stdout.strip().rsplit("\n", 1)[-1].strip()
            if self.runner.rehearsing:
                continue
            if not res.ok or not pid.isdigit():
                why = display_text((res.stderr or res.stdout).strip()[-200:])
                raise StepFailed(f"{n}: the memory guard did not start: {why}", "--resume arms it again")
            armed.pid = int(pid)
            self.runner.save()

    async def verify(self) -> None:
        """Each watcher runs and its arm file is there (it wrote its pid first, so a dead start shows)."""
        nodes = list(self._targets())
        for n, st in zip(nodes, await self.runner.on_all(nodes, self._status), strict=True):
            if st is None or not (st.armed and st.running):
                acted = f" (it acted at once: {display_text(st.event.words())})" if st and st.event else ""
                raise StepFailed(f"{n}: the memory guard is not running after its start{acted}",
                                 f"read its log in {self._files(n).job.log}; --resume arms it again")
            self.runner.note(f"memory guard armed: it stops {', '.join(self._targets()[n])} before {n} runs out "
                             "of memory", node=n)
