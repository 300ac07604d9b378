"""Memory: free what the plan needs (stop services, the operator choosing) and drop the page cache before
launch (vLLM's start-up check counts only free memory)."""

from __future__ import annotations

import math

from sparkconsole.deploy import freeing
from sparkconsole.deploy.decisions import Decision, Option
from sparkconsole.deploy.deployment_plan import Stop, parse_stops
from sparkconsole.deploy.flow import GIB, Flow
from sparkconsole.deploy.runner import GoTo, StepFailed
from sparkconsole.deploy.state import Stopped
from sparkconsole.deploy.steps.base import Step
from sparkconsole.deploy.steps.plan import LAUNCH_MARGIN, _cuda_total
from sparkconsole.logs.follow import display_text
from sparkconsole.planner.budget import DEFAULT_GMU
from sparkconsole.remote import (
    docker_action,
    drop_caches,
    drop_caches_rule,
    evict_page_cache,
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
        # the search runs in a worker thread, once per node per decision: the UI and every SSH keepalive
        # keep running meanwhile (issue 23 item 11: a node with 25 containers froze both)
        choices = await freeing.choose_all(facts, need, flow.nodes)
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


# What the engine's start takes before vLLM's free-memory check, after this step has read what is
# free: the Ray or vLLM containers' processes and the CUDA context (1.3 GiB on the demo's native start)
START_OVERHEAD = int(1.5 * GIB)


class Caches(Step):
    id, title = "caches", "Free the page cache right before launch"
    decisions = ("caches.drop", "caches.fit")
    done_when_serving = True

    async def decide(self) -> None:
        """Free the page cache before launch: vLLM's start-up check counts only free memory, and the
        weights just read and copied sit in the cache (vllm#35313). Where ``sudo -n`` may (recon's
        ``sudo -n true`` / ``sudo -n -l`` of the tee rule) the whole cache is dropped; a stock node
        has no such sudo, and there the model's own files are evicted (``dd iflag=nocache``, no root
        needed), which is most of it. The other choices: leave it, or stop and add the narrow rule."""
        flow = self.flow
        facts = flow.facts
        cache = {n: (facts[n].page_cache or 0) / GIB for n in flow.nodes}
        denied = [n for n in flow.nodes if not facts[n].can_sudo("drop-caches")]
        measured = [f"{n}: {c:.1f} GiB of page cache" + ("; sudo -n needs a password here" if n in denied else "")
                    for n, c in cache.items()]
        how = ("drop it on every node (sudo)" if not denied else
               f"evict the HF cache's model files on {', '.join(denied)} (no sudo: dd iflag=nocache)"
               + (f", drop it on {', '.join(n for n in flow.nodes if n not in denied)}"
                  if len(denied) < len(flow.nodes) else ""))
        options = [Option("yes", "free it now: " + how, "vLLM's start-up check counts only free memory"),
                   Option("no", "leave it", "the start may fail its free-memory check")]
        if denied:
            rules = "; ".join(f"on {n}: {drop_caches_rule(facts[n].user or 'USER')}" for n in denied)
            options.append(Option("stop", "stop here and allow dropping the whole cache",
                                  f"add the narrow sudoers rule sparkrun uses (tee to drop_caches only): {rules}; "
                                  "then --resume"))
        d = Decision("caches.drop", self.id, "Free the page cache before launch", tuple(measured), tuple(options),
                     "yes", "the weights just read and copied sit in the page cache, which vLLM does not count "
                     "as free (vllm#35313)" + ("; without sudo the model files, most of it, can still be evicted"
                                               if denied else ""))
        answer = await self.runner.decide(d)
        if answer == "stop":
            raise StepFailed("stopped to allow dropping the page cache", options[-1].why)
        flow.update(drop=answer == "yes")

    async def send(self) -> None:
        if self.flow.plan.drop:
            await drop_page_cache(self.flow, self.flow.nodes)

    async def verify(self) -> None:
        """What is free now, against what vLLM's start-up check will ask (``gmu × total``): where the
        cache could not all go (no sudo: the image just loaded and the system's files stay cached,
        root's to drop), the budget is fitted to what is free, the operator deciding, before a start
        that would fail with "Free memory on device … is less than desired GPU memory utilization"."""
        flow = self.flow
        need = {n: int(v) for n, v in (flow.plan.need or {}).items()}
        if not need:
            return
        facts = await flow.recon(flow.nodes)
        unread = [n for n in flow.nodes if not facts[n].reachable or facts[n].mem_available is None]
        if unread:  # no figure is no zero: a budget fitted to it would be nonsense (a negative gmu)
            raise StepFailed(f"{', '.join(unread)} did not answer: its free memory is unknown",
                             "check the node answers over SSH, then --resume")
        free = {n: int((facts[n].mem_available or 0) - (facts[n].page_cache or 0)) for n in flow.nodes}
        short = [n for n in flow.nodes if free[n] < need.get(n, 0) + START_OVERHEAD]
        for n in flow.nodes:
            self.runner.note(f"{free[n] / GIB:.1f} GiB free, {(facts[n].page_cache or 0) / GIB:.1f} GiB still cached "
                             f"(launch needs {need.get(n, 0) / GIB:.1f} free)", node=n)
        if not short:
            return
        total = min(_cuda_total(facts[n]) for n in flow.nodes)
        fit = math.floor((min(free.values()) - LAUNCH_MARGIN - START_OVERHEAD) / total * 100) / 100
        gmu = float(flow.plan.gmu or DEFAULT_GMU)
        d = Decision("caches.fit", self.id, "Less is free than the plan's memory budget",
                     tuple(f"{n}: {free[n] / GIB:.1f} GiB free of {(need[n] + START_OVERHEAD) / GIB:.1f} GiB "
                           "needed (the start's own 1.5 GiB included); "
                           f"{(facts[n].page_cache or 0) / GIB:.1f} GiB still in the page cache" for n in short),
                     (Option("lower", f"re-plan at --gpu-memory-utilization {fit:.2f} (now {gmu:.2f})",
                             "the weights stay as they are; the KV cache shrinks to fit what is free"),
                      Option("go-on", "start as planned", "vLLM's start-up check will fail on " + ", ".join(short)),
                      Option("stop", "stop here and drop the cache by hand",
                             "`sync; echo 3 | sudo tee /proc/sys/vm/drop_caches` on " + ", ".join(short)
                             + ", then --resume")),
                     "lower" if fit >= 0.5 else "stop",
                     "the start-up check counts only free memory; what stays cached is root's to drop"
                     if fit >= 0.5 else "too little is free to fit the weights and a useful KV cache")
        answer = await self.runner.decide(d)
        if answer == "lower" and fit < 0.5:  # an answer kept from an earlier pass, when more was free
            answer = "stop"
        if answer == "stop":
            raise StepFailed("stopped: the page cache holds memory the plan needs",
                             "`sync; echo 3 | sudo tee /proc/sys/vm/drop_caches` on " + ", ".join(short)
                             + ", then --resume")
        if answer == "lower":
            flow.update(gmu_override=fit)
            raise GoTo("plan", f"fit the memory budget to what is free ({fit:.2f})")


async def drop_page_cache(flow: Flow, nodes: list[str], *, strict: bool = True) -> None:
    """Free the page cache on ``nodes`` through the runner (shown, journaled): ``sync; echo 3 |
    sudo -n tee drop_caches`` where recon found sudo may run it, else the HF cache's model files
    evicted (no root needed). ``strict=False`` (teardown): a failure is said, not fatal; what
    teardown must do (remove what it started, start what it stopped) does not stop on it."""
    for n in nodes:
        allowed = n not in flow.facts or flow.fact(n).can_sudo("drop-caches")
        res = await flow.runner.change(n, drop_caches() if allowed else evict_page_cache(f"{flow.fact(n).hf_dir}/hub"),
                                       timeout=600)
        if not res.ok and not strict:
            why = display_text((res.stderr.strip() or f"exit {res.exit_status}")[-200:])  # a node's words
            flow.runner.note(f"the page cache could not be freed ({why}): a service started again may fail its "
                             "start-up memory check", "warning", node=n)
            continue
        if not res.ok:
            raise StepFailed(f"{n}: freeing the page cache failed: {res.stderr.strip()[-200:]}",
                             "allow dropping it with the narrow sudoers rule: " + drop_caches_rule("USER")
                             if allowed else "read the error; --resume tries again")
