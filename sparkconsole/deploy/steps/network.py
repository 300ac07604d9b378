"""Network: the fast link's port, addresses and MTU, a don't-fragment ping and ssh between the nodes."""

from __future__ import annotations

import asyncio

from sparkconsole.deploy import netenv
from sparkconsole.deploy.decisions import Decision, Option
from sparkconsole.deploy.recon import INSTALL, missing_tool
from sparkconsole.deploy.runner import StepFailed
from sparkconsole.deploy.steps.base import Step
from sparkconsole.deploy.weights import peer_port
from sparkconsole.remote import (
    command,
    ping_df,
    ssh_to,
)


class Network(Step):
    id, title = "network", "Fast link: port, addresses, MTU, a don't-fragment ping"
    decisions = ("network.mtu",)

    async def decide(self) -> None:
        facts = [self.flow.fact(n) for n in self.flow.nodes]
        if len(facts) < 2:
            return
        problems = netenv.check_links(facts)
        mtu = [p for p in problems if p.kind == "mtu"]
        hard = [p for p in problems if p.kind != "mtu"]
        if hard:
            p = hard[0]
            raise StepFailed((f"{p.node}: " if p.node else "") + p.what, p.fix)
        if mtu:
            low = min(x.fast_link().mtu or 1500 for x in facts)  # type: ignore[union-attr]
            d = Decision("network.mtu", self.id, "MTU differs between the ends of the fast link", (mtu[0].what,),
                         (Option(f"set-{low}", f"set MTU {low} on every fast-link twin", "equal MTU; nothing else "
                                 "changes"), Option("stop", "stop here", "fix the netplan by hand first")),
                         f"set-{low}", "NCCL hangs (IBV_WC_LOC_LEN_ERR) when the MTUs differ")
            if await self.runner.decide(d) == "stop":
                raise StepFailed(mtu[0].what, mtu[0].fix)
            self.flow.update(set_mtu=low)

    async def send(self) -> None:
        low = self.flow.plan.set_mtu
        if not low:
            return
        for n in self.flow.nodes:
            for lk in self.flow.fact(n).up_links():
                if lk.mtu != low and lk.netdev:
                    cmd = command("sudo", "-n", "ip", "link", "set", "dev", lk.netdev, "mtu", str(low),
                                  mutating=True, summary=f"set MTU {low} on {lk.netdev}")
                    res = await self.runner.change(n, cmd)
                    if not res.ok:
                        raise StepFailed(f"{n}: {cmd.summary} failed: {res.stderr.strip()[-300:]}")
        await self.flow.recon(self.flow.nodes)

    async def verify(self) -> None:
        flow = self.flow
        nodes = flow.nodes
        if len(nodes) < 2:
            return
        mtu = min((flow.fact(n).fast_link().mtu or 1500) for n in nodes)  # type: ignore[union-attr]

        cable = f"check the cable and `ip addr` on both ends; ping with `ping -M do -s {mtu - 28} IP` until it answers"

        async def check(i: int) -> tuple[str, str] | None:
            src, dst = nodes[i], nodes[(i + 1) % len(nodes)]
            if missing_tool(flow.fact(src), "ping"):  # a missing tool is not a link fault
                return f"{src}: ping is not installed, so the fast link cannot be checked", INSTALL["ping"]
            res = await self.runner.read(src, ping_df(flow.ip(dst), mtu - 28), timeout=30)
            if not res.ok:
                return (f"{src} → {dst} ({flow.ip(dst)}): a {mtu}-byte don't-fragment ping failed: "
                        f"{(res.stdout + res.stderr).strip().splitlines()[-1:] or ['no reply']}", cable)
            port = peer_port(flow, dst)  # the copies dial the same port
            res = await self.runner.read(src, ssh_to(flow.user_at(dst), "true", port=port), timeout=30)
            if not res.ok:
                return (f"{src} cannot ssh to {dst} over the fast link ({res.stderr.strip()[-200:]}); the copy "
                        "needs it",
                        f"on {src}: `ssh-copy-id {f'-p {port} ' if port else ''}{flow.user_at(dst)}` (NVIDIA's "
                        "playbook sets keys up the same way for $USER@peer), then --resume")
            return None

        errors = [e for e in await asyncio.gather(*(check(i) for i in range(len(nodes)))) if e]
        if errors:
            raise StepFailed(*errors[0])
        for n in nodes:
            env = " ".join(f"{k}={v}" for k, v in flow.env(n))
            self.runner.note(f"environment: {env}", node=n)
