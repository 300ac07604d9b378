"""Memory: free what the plan needs (stop services, the operator choosing) and drop the page cache before
launch (vLLM's start-up check counts only free memory)."""

from __future__ import annotations

from sparkconsole.deploy import freeing
from sparkconsole.deploy.decisions import Decision, Option
from sparkconsole.deploy.deployment_plan import Stop, parse_stops
from sparkconsole.deploy.flow import GIB
from sparkconsole.deploy.runner import Runner, StepFailed
from sparkconsole.deploy.state import Stopped
from sparkconsole.deploy.steps.base import Step
from sparkconsole.remote import (
    docker_action,
    drop_caches,
)


class FreeMemory(Step):
    id, title = "free-memory", "Free the memory the plan needs"
    decisions = ("free-memory.stop",)

    async def probe(self) -> str | None:
        return "the model is already served" if await self.flow.serving() else None

    async def decide(self) -> None:
        flow = self.flow
        facts = await flow.recon(flow.nodes)  # fresh numbers: services kept serving while weights moved
        need = {n: int(v) for n, v in (flow.plan.need or {}).items()}
        choices = {n: freeing.choose(facts[n], need.get(n, 0)) for n in flow.nodes}
        measured = []
        for n, c in choices.items():
            held = freeing.container_bytes(facts[n])
            items = ", ".join(f"{k} {b / GIB:.1f} GiB" for k, b in sorted(held.items(), key=lambda kv: -kv[1]))
            measured.append(f"{n}: {c.available / GIB:.1f} GiB available, {c.need / GIB:.1f} GiB needed; "
                            f"running: {items or 'nothing'}; page cache {(facts[n].page_cache or 0) / GIB:.1f} GiB")
        rec_stops = [Stop(n, s) for n, c in choices.items() for s in c.stop]
        rec = ",".join(x.value for x in rec_stops) or "none"
        every = [Stop(n, s) for n in flow.nodes for s in sorted(freeing.container_bytes(facts[n]))]
        options = [Option(rec, "stop " + (", ".join(x.value for x in rec_stops) or "nothing"),
                          "the smallest set that makes the plan fit; the rest keeps serving", payload=rec_stops)]
        if every and ",".join(x.value for x in every) != rec:
            options.append(Option(",".join(x.value for x in every), "stop every running service on these nodes",
                                  "most headroom", payload=every))
        options.append(Option("none", "stop nothing", "the start will fail its free-memory check"
                              if rec != "none" else "enough is free already", payload=[]))
        short = [n for n, c in choices.items() if not c.enough]
        why = ("stopping these frees enough on every node" if not short else
               f"even stopping everything leaves {', '.join(short)} short: lower --gpu-memory-utilization")
        d = Decision("free-memory.stop", self.id, "Free memory: which services to stop", tuple(measured),
                     tuple(options), rec, why, free_text=True, parse=parse_stops)
        flow.update(stops=list(await self.runner.choose(d)))

    async def send(self) -> None:
        for stop in self.flow.plan.stops:
            n, name = stop.node, stop.name
            res = await self.runner.change(n, docker_action("stop", name), key=f"stop {n} {name}")
            if not res.ok:
                raise StepFailed(f"{n}: docker stop {name} failed: {res.stderr.strip()[-200:]}")
            if not any(s.node == n and s.name == name for s in self.runner.state.stopped):
                self.runner.state.stopped.append(Stopped(n, "container", name))
                self.runner.save()

    async def verify(self) -> None:
        facts = await self.flow.recon(self.flow.nodes)
        need = self.flow.plan.need or {}
        for n in self.flow.nodes:
            have = facts[n].mem_available or 0
            self.runner.note(f"{have / GIB:.1f} GiB available (launch needs {int(need.get(n, 0)) / GIB:.1f})", node=n)
            if have < int(need.get(n, 0)):
                raise StepFailed(f"{n}: only {have / GIB:.1f} GiB available, {int(need[n]) / GIB:.1f} needed",
                                 "stop more services (--resume, answer free-memory.stop) or lower "
                                 "--gpu-memory-utilization")


class Caches(Step):
    id, title = "caches", "Drop the page cache right before launch"
    decisions = ("caches.drop",)

    async def probe(self) -> str | None:
        return "the model is already served" if await self.flow.serving() else None

    async def decide(self) -> None:
        facts = self.flow.facts
        cache = {n: (facts[n].page_cache or 0) / GIB for n in self.flow.nodes}
        d = Decision("caches.drop", self.id, "Drop the page cache on every node (sudo)",
                     tuple(f"{n}: {c:.1f} GiB of page cache" for n, c in cache.items()),
                     (Option("yes", "drop it now", "vLLM's start-up check counts only free memory"),
                      Option("no", "leave it", "the start may fail its free-memory check")),
                     "yes", "the weights just read and copied sit in the page cache, which vLLM does not count "
                     "as free (vllm#35313)")
        self.flow.update(drop=await self.runner.decide(d) == "yes")

    async def send(self) -> None:
        if self.flow.plan.drop:
            await drop_page_cache(self.runner, self.flow.nodes)


async def drop_page_cache(r: Runner, nodes: list[str]) -> None:
    """``sync; echo 3 > drop_caches`` on ``nodes`` through the runner (shown, journaled)."""
    for n in nodes:
        res = await r.change(n, drop_caches())
        if not res.ok:
            raise StepFailed(f"{n}: dropping the page cache failed: {res.stderr.strip()[-200:]}",
                             "allow `sudo -n sh -c 'sync; echo 3 > /proc/sys/vm/drop_caches'` for this user")
