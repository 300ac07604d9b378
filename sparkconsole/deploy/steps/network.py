"""Network: the fast link's port, addresses and MTU, the nodes' trust in each other's ssh host keys,
a don't-fragment ping and ssh between the nodes.

Nothing here runs sudo: a fix that needs root (an MTU, an address, a link set down) is printed for
the operator to run, and the step stops or reads the nodes again once they say it is done. Trust is
never blind: each node's host key is read over the console's own ssh connection to that node (the
transport verified its key), its fingerprint shown, and added to the peers' ``~/.ssh/known_hosts``
under the fast-link address only after a yes.
"""

from __future__ import annotations

import asyncio

from sparkconsole.deploy import netenv
from sparkconsole.deploy.decisions import Decision, Option
from sparkconsole.deploy.recon import INSTALL, missing_tool
from sparkconsole.deploy.runner import StepFailed
from sparkconsole.deploy.steps.base import Step
from sparkconsole.deploy.weights import peer_port
from sparkconsole.remote import (
    HOST_KEY_FILE,
    add_known_hosts,
    host_key_fingerprint,
    known_hosts_entry,
    known_hosts_lines,
    parse_host_key,
    ping_df,
    read_host_key,
    ssh_to,
)


class Network(Step):
    id, title = "network", "Fast link: port, addresses, MTU, host keys, a don't-fragment ping"
    decisions = ("network.mtu", "network.trust")

    def __init__(self, flow) -> None:  # type: ignore[no-untyped-def]
        super().__init__(flow)
        self._trust: dict[str, list[tuple[str, str]]] = {}  # node → [(peer, known_hosts line)] to add

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
            await self._mtu(mtu[0])
        await self._decide_trust()

    async def _mtu(self, problem: netenv.Problem) -> None:
        """MTUs that differ: the commands that fix them need root, so they are printed for the
        operator to run (stock DGX OS sudo asks a password, which the console never sends or holds);
        ``checked`` reads the nodes again once they have."""
        d = Decision("network.mtu", self.id, "MTU differs between the ends of the fast link",
                     (problem.what, f"run: {problem.fix}"),
                     (Option("stop", "stop here", "run the printed commands yourself, then --resume"),
                      Option("checked", "I ran them: read the nodes again", "the step goes on once the MTUs agree")),
                     "stop", "NCCL hangs (IBV_WC_LOC_LEN_ERR) when the MTUs differ; setting an MTU needs sudo, "
                     "which the console does not run")
        if await self.runner.decide(d) == "stop":
            raise StepFailed(problem.what, problem.fix + ", then --resume")
        await self.flow.recon(self.flow.nodes)
        again = [p for p in netenv.check_links([self.flow.fact(n) for n in self.flow.nodes]) if p.kind == "mtu"]
        if again:
            raise StepFailed(again[0].what, again[0].fix + ", then --resume")

    async def _decide_trust(self) -> None:
        """Each node's ssh host key, read over the console's verified connection to it, offered to
        every other node's ``known_hosts`` under its fast-link address (the copies, the image load,
        the Ray token and the check below all ssh between the nodes with BatchMode, which fails with
        "Host key verification failed." on an unknown key). Asked only for keys not there yet."""
        flow, nodes = self.flow, self.flow.nodes
        # the key each node's sshd presented to the console's own connection (verified against the
        # laptop's known_hosts): the daemon that answers the peers too; its file where there is no
        # such connection (a local node), read over the same verified connection
        live = {n: _verified_key(self.runner.transport(n)) for n in nodes}
        files = [n for n in nodes if live[n] is None]
        reads = await asyncio.gather(*(self.runner.read(n, read_host_key(), timeout=30) for n in files))
        read_of = dict(zip(files, reads, strict=True))
        keys: dict[str, tuple[str, str]] = {}
        for n in nodes:
            res = read_of.get(n)
            key = (parse_host_key(live[n] or "") if live[n] else
                   parse_host_key(res.stdout) if res is not None and res.ok else None)
            if key is None:
                raise StepFailed(f"{n}: no ed25519 host key could be read from {HOST_KEY_FILE}",
                                 f"on {n}: `ls -l /etc/ssh/ssh_host_*` (`sudo ssh-keygen -A` makes missing "
                                 "keys), then --resume")
            keys[n] = key
        wanted = {src: [(dst, known_hosts_entry(flow.ip(dst), peer_port(flow, dst), *keys[dst]))
                        for dst in nodes if dst != src] for src in nodes}
        held = await asyncio.gather(*(self.runner.read(src, known_hosts_lines([e for _, e in wanted[src]]),
                                                       timeout=30) for src in nodes))
        self._trust = {}
        for src, res in zip(nodes, held, strict=True):
            have = set(res.stdout.splitlines()) if res.ok else set()
            missing = [(dst, e) for dst, e in wanted[src] if e not in have]
            if missing:
                self._trust[src] = missing
        if not self._trust:
            return
        peers = sorted({dst for pairs in self._trust.values() for dst, _ in pairs}, key=nodes.index)
        measured = tuple(f"{dst} {flow.ip(dst)}: {keys[dst][0]} {host_key_fingerprint(keys[dst][1])} (read from "
                         f"{HOST_KEY_FILE} over the console's verified ssh connection to {dst})" for dst in peers)
        measured += tuple(f"add to {src}'s ~/.ssh/known_hosts: {', '.join(d for d, _ in pairs)}"
                          for src, pairs in self._trust.items())
        d = Decision("network.trust", self.id, "Trust these host keys for ssh between the nodes?", measured,
                     (Option("add", "add them to each node's ~/.ssh/known_hosts",
                             "compare each fingerprint with `ssh-keygen -lf " + HOST_KEY_FILE + "` on that node"),
                      Option("stop", "stop here", "add the keys yourself, then --resume")),
                     "add", "node-to-node ssh runs with BatchMode (nobody to answer a prompt), so an unknown host "
                     "key fails the copies; each key shown came from its node over a connection whose own host "
                     "key the console verified")
        if await self.runner.decide(d) == "stop":
            src, pairs = next(iter(self._trust.items()))
            raise StepFailed(f"{src} does not know {', '.join(d for d, _ in pairs)}'s host key for the fast link",
                             f"on {src}, append to ~/.ssh/known_hosts: {pairs[0][1]} (after comparing its "
                             "fingerprint on the peer), then --resume")

    async def send(self) -> None:
        for src, pairs in self._trust.items():
            names = ", ".join(d for d, _ in pairs)
            await self.runner.change(src, add_known_hosts([e for _, e in pairs],
                                                          summary=f"trust {names}'s ssh host key on the fast link"))

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
            if not res.ok and "Host key verification failed" in res.stderr:
                return (f"{src} does not trust {dst}'s ssh host key at {flow.ip(dst)}; the copy needs it",
                        "answer network.trust=add (the step reads and shows the key), then --resume")
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


def _verified_key(transport: object) -> str | None:
    """The key the transport's connection verified (:meth:`Transport.server_host_key`); None for a
    transport without one (a local node, a test's stand-in)."""
    fn = getattr(transport, "server_host_key", None)
    return fn() if callable(fn) else None
