"""Memory: free what the plan needs (stop services, the operator choosing) and drop the page cache before
launch (vLLM's start-up check counts only free memory)."""

from __future__ import annotations

from sparkconsole.deploy import freeing
from sparkconsole.deploy.decisions import Decision, Option
from sparkconsole.deploy.deployment_plan import Stop, parse_stops
from sparkconsole.deploy.flow import GIB, Flow
from sparkconsole.deploy.runner import StepFailed
from sparkconsole.deploy.state import Stopped
from sparkconsole.deploy.steps.base import Step
from sparkconsole.remote import (
    docker_action,
    drop_caches,
    drop_caches_rule,
    kill_process,
    systemctl_action,
)


class FreeMemory(Step):
    id, title = "free-memory", "Free the memory the plan needs"
    decisions = ("free-memory.stop",)
    done_when_serving = True

    async def decide(self) -> None:
        flow = self.flow
        facts = await flow.recon(flow.nodes)  # fresh numbers: services kept serving while weights moved
        need = {n: int(v) for n, v in (flow.plan.need or {}).items()}
        choices = {n: freeing.choose(facts[n], need.get(n, 0)) for n in flow.nodes}
        measured = []
        for n, c in choices.items():
            held = freeing.service_bytes(facts[n])
            items = ", ".join(f"{k} {b / GIB:.1f} GiB" for k, b in sorted(held.items(), key=lambda kv: -kv[1]))
            measured.append(f"{n}: {c.available / GIB:.1f} GiB available, {c.need / GIB:.1f} GiB needed; "
                            f"running: {items or 'nothing'}; page cache {(facts[n].page_cache or 0) / GIB:.1f} GiB")
        rec_stops = [Stop(n, s) for n, c in choices.items() for s in c.stop]
        rec = ",".join(x.value for x in rec_stops) or "none"
        every = [Stop(n, s) for n in flow.nodes for s in sorted(freeing.service_bytes(facts[n]))
                 if not freeing.needs_sudo(s) or facts[n].can_sudo()]
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
            kind, _, what = name.partition(":") if ":" in name else ("container", "", name)
            if kind == "unit":
                cmd = systemctl_action("stop", what)
            elif kind == "pid":
                cmd = kill_process(int(what))
            else:
                cmd = docker_action("stop", what)
            res = await self.runner.change(n, cmd, key=f"stop {n} {name}")
            if not res.ok:
                fix = ("allow the login user `sudo systemctl stop` on that node, or stop it by hand; then --resume"
                       if kind == "unit" else "")
                raise StepFailed(f"{n}: stopping {name} failed: {res.stderr.strip()[-200:]}", fix)
            if kind != "pid" and not any(s.node == n and s.name == what for s in self.runner.state.stopped):
                # a killed host process cannot be started again; a container or a unit can (teardown)
                self.runner.state.stopped.append(Stopped(n, "unit" if kind == "unit" else "container", what))
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
    done_when_serving = True

    async def decide(self) -> None:
        """Drop where ``sudo -n`` may (recon's ``sudo -n true`` / ``sudo -n -l`` of the tee rule); a
        stock node has neither, so there the choice is to go on without dropping (vLLM's check may
        then count the weights' page cache as used) or to stop and add the narrow rule, printed."""
        flow = self.flow
        facts = flow.facts
        cache = {n: (facts[n].page_cache or 0) / GIB for n in flow.nodes}
        denied = [n for n in flow.nodes if not facts[n].can_sudo("drop-caches")]
        measured = [f"{n}: {c:.1f} GiB of page cache" + ("; sudo -n needs a password here" if n in denied else "")
                    for n, c in cache.items()]
        if not denied:
            d = Decision("caches.drop", self.id, "Drop the page cache on every node (sudo)", tuple(measured),
                         (Option("yes", "drop it now", "vLLM's start-up check counts only free memory"),
                          Option("no", "leave it", "the start may fail its free-memory check")),
                         "yes", "the weights just read and copied sit in the page cache, which vLLM does not count "
                         "as free (vllm#35313)")
            flow.update(drop=await self.runner.decide(d) == "yes")
            return
        rules = "; ".join(f"on {n}: {drop_caches_rule(facts[n].user or 'USER')}" for n in denied)
        can = [n for n in flow.nodes if n not in denied]
        d = Decision("caches.drop", self.id, "Drop the page cache: sudo needs a password on "
                     + ", ".join(denied), tuple(measured),
                     (Option("go-on", "go on without dropping" + (f" on {', '.join(denied)}" if can else ""),
                             "vLLM's check counts the page cache as used; the free-memory step left room"
                             + (f"; dropped on {', '.join(can)}" if can else "")),
                      Option("stop", "stop here and allow the drop", f"add the narrow sudoers rule sparkrun uses "
                             f"(tee to drop_caches only): {rules}; then --resume")),
                     "go-on", "the console never types a password; the narrow rule lets it drop the cache and "
                     "nothing else")
        if await self.runner.decide(d) == "stop":
            raise StepFailed("stopped to allow dropping the page cache", rules + "; then --resume")
        flow.update(drop=bool(can))

    async def send(self) -> None:
        if self.flow.plan.drop:
            await drop_page_cache(self.flow, self.flow.nodes)


async def drop_page_cache(flow: Flow, nodes: list[str]) -> None:
    """``sync; echo 3 | sudo -n tee drop_caches`` on those of ``nodes`` where recon found sudo may
    run it, through the runner (shown, journaled); the others are left as they are."""
    for n in nodes:
        if n in flow.facts and not flow.fact(n).can_sudo("drop-caches"):
            continue
        res = await flow.runner.change(n, drop_caches())
        if not res.ok:
            raise StepFailed(f"{n}: dropping the page cache failed: {res.stderr.strip()[-200:]}",
                             "allow it with the narrow sudoers rule: " + drop_caches_rule("USER"))
