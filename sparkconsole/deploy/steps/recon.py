"""Recon: read every node once (GPU, memory, disk, Docker and images, links, the Hub, tools) and keep it."""

from __future__ import annotations

from sparkconsole.deploy.flow import GIB
from sparkconsole.deploy.recon import INSTALL, NodeFacts, known_bad_on
from sparkconsole.deploy.runner import StepFailed
from sparkconsole.deploy.steps.base import Step
from sparkconsole.logs.follow import display_text


class Recon(Step):
    """Reads every node; run again on resume (the nodes may have changed while the console was away)."""

    id, title = "recon", "Read every node"
    rerun_when_done = True

    async def probe(self) -> str | None:
        got = await self.flow.recon()
        for f in got.values():
            if not f.reachable:
                raise StepFailed(f"{f.node} cannot be reached: {f.reason}",
                                 "check the node is on and `ssh` to it works; then --resume")
            bad = known_bad_on(f)
            if bad is not None:
                raise StepFailed(*bad)
            gib = (f.mem_available or 0) / GIB
            links = ", ".join(f"{lk.netdev} {'Up' if lk.up else 'Down'}" for lk in f.links if lk.port == 1) or "?"
            self.runner.note(f"{f.gpu or 'GPU ?'}, driver {f.driver or '?'}, CUDA {f.cuda or '?'}, "
                        f"{gib:.1f}/{(f.mem_total or 0) / GIB:.1f} GiB available, disk free "
                        f"{(f.disk_free or 0) / 1e12:.2f} TB at {f.hf_dir}, docker {f.docker or '?'} "
                        f"({f.storage_driver or '?'}), {len(f.images)} images, fast link {f.fast_ip() or 'none'} "
                        f"({links}), Hub {'reachable' if f.hub else 'not reachable'}, "
                        f"HF token {'present' if f.token else 'absent'}", node=f.node)
            for tool in missing_tools(f):
                self.runner.note(f"{tool} is not installed: {INSTALL[tool]}", "warning", node=f.node)
            self._access(f)
        await self.flow.find_spec()
        self.flow.spec  # noqa: B018 - a model whose config cannot be read stops here, with the reason
        drivers = {f.driver for f in got.values() if f.driver}
        if len(drivers) > 1:
            self.runner.note(f"driver versions differ between nodes: {', '.join(sorted(drivers))}", "warning")
        return None


    def _access(self, f: NodeFacts) -> None:
        """What the login user may do: docker (a stock user is in its group; one who is not cannot
        deploy), sudo without a password (stock: none, so nothing required needs it), and whether
        the ports the flow will open are free."""
        if f.docker_denied:
            raise StepFailed(f"{f.node}: {f.user} is not in the docker group, so docker refuses it",
                             f"on {f.node}: `sudo usermod -aG docker {f.user}`, then log in again (or `newgrp "
                             "docker`); then --resume")
        if f.sudo == "none":
            self.runner.note(f"sudo needs a password for {f.user or 'the login user'}: the page cache is dropped "
                             "only where a rule allows it (the caches step says how)", node=f.node)
        ports = {6379: "Ray", self.flow.options.port: "the engine's API"}
        for port, what in ports.items():
            held = f.holder_of_port(port)
            if held is not None:
                self.runner.note(f"port {port} ({what}) is taken by {display_text(held.process or 'another process')}"
                                 f"{f' (pid {held.pid})' if held.pid else ''}", "warning", node=f.node)


def missing_tools(facts: NodeFacts) -> list[str]:
    """The tools the flow will run that recon read as missing; ``hf`` only when ``uvx`` is missing
    too (either downloads the weights)."""
    out = [t for t in ("rsync", "ping", "curl", "ss") if facts.tools.get(t) is False]
    if facts.tools.get("hf") is False and facts.tools.get("uvx") is not True:
        out.insert(0, "hf")
    return out
