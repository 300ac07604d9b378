"""Cluster: the Ray head and workers in containers (or vLLM's native multi-node), every GPU seen."""

from __future__ import annotations

import asyncio
import time

from sparkconsole.deploy.decisions import Decision, Option
from sparkconsole.deploy.runner import StepFailed
from sparkconsole.deploy.state import Started
from sparkconsole.deploy.steps.base import Step
from sparkconsole.probe.parsers import parse_ray_status
from sparkconsole.remote import (
    RemoteCommand,
    docker_exec,
    docker_rm_force,
    docker_run,
)

RAY_PORT = 6379


DOCKER_OPTS = ["--network", "host", "--ipc", "host", "--gpus", "all", "--device", "/dev/infiniband",
               "--ulimit", "memlock=-1", "--shm-size", "16g"]


class Cluster(Step):
    id, title = "cluster", "Ray head and workers, every GPU seen"
    decisions = ("cluster.executor",)
    _cpus = 0.0  # what the last `ray status` read counted

    async def decide(self) -> None:
        if self.flow.engine == "sglang":
            self.flow.update(executor="native")
            return
        d = Decision("cluster.executor", self.id, "How the nodes join: Ray or vLLM's native multi-node",
                     (f"{len(self.flow.nodes)} nodes, TP={self.flow.plan.tp}",),
                     (Option("ray", "Ray head and workers in containers", "what the story's working run used; "
                             "`ray status` proves every GPU joined before serving"),
                      Option("native", "vLLM native --nnodes/--node-rank/--headless", "no Ray; workers start first")),
                     self.flow.options.executor or "ray", "Ray is what NVIDIA's playbook and the story's working run use")
        self.flow.update(executor=await self.runner.decide(d))

    def _ray_cmd(self, n: str) -> RemoteCommand:
        flow = self.flow
        ip = flow.ip(n)
        if n == flow.head:
            args = ["start", "--block", "--head", f"--node-ip-address={ip}", f"--port={RAY_PORT}"]
        else:
            args = ["start", "--block", f"--address={flow.ip(flow.head)}:{RAY_PORT}", f"--node-ip-address={ip}"]
        hf = flow.fact(n).hf_dir
        return docker_run(flow.container("ray"), flow.image, options=self._options(n), entrypoint="ray", args=args,
                          env=flow.env(n), mounts=[(hf, "/root/.cache/huggingface")],
                          summary=f"start the Ray {'head' if n == flow.head else 'worker'} on {n}")

    def _options(self, n: str) -> list[str]:
        """DOCKER_OPTS as far as the node's hardware goes: the GPU only where recon read one, the
        RDMA devices and unlimited locked memory (for RDMA) only where it read an RDMA device. A
        node without them (a CPU-only host, the test lab) starts the same container without."""
        x = self.flow.fact(n)
        drop = set()
        if not x.gpu:
            drop.add(("--gpus", "all"))
        if not any(lk.rdma for lk in x.links):
            drop |= {("--device", "/dev/infiniband"), ("--ulimit", "memlock=-1")}
        pairs = [(DOCKER_OPTS[i], DOCKER_OPTS[i + 1]) for i in range(0, len(DOCKER_OPTS), 2)]
        return [a for pair in pairs if pair not in drop for a in pair]

    def _gpus_wanted(self) -> int:
        """One GPU per node when every node has one; 0 when recon read none (Ray on CPUs only)."""
        return len(self.flow.nodes) if all(self.flow.fact(n).gpu for n in self.flow.nodes) else 0

    async def _status(self) -> tuple[int, float]:
        res = await self.runner.read(self.flow.head, docker_exec(self.flow.container("ray"), ["ray", "status"]), timeout=60,
                                quiet=True)
        st = parse_ray_status(res.stdout) if res.ok else None
        self._cpus = (st.cpus_total or 0.0) if st else 0.0
        return (st.active_nodes or 0, st.gpus_total or 0.0) if st else (0, 0.0)

    async def probe(self) -> str | None:
        if len(self.flow.nodes) < 2:
            return "one node: no cluster to form"
        if await self.flow.serving():
            return "the model is already served"
        if self.flow.plan.executor == "ray" and any("-ray-" in s.name for s in self.runner.state.started):
            nodes, gpus = await self._status()
            if nodes >= len(self.flow.nodes) and gpus >= self._gpus_wanted():
                return f"Ray is up: {nodes} nodes, {gpus:g} GPUs"
        return None

    async def send(self) -> None:
        flow = self.flow
        if flow.executor != "ray":
            self.runner.note("native multi-node: the serve step starts one engine container per node, workers first")
            return
        name = flow.container("ray")
        for n in flow.nodes:
            # the name carries this deployment's id: a container of that name is ours (a run killed
            # between `docker run` and saving the state left it unrecorded)
            st = await self.flow.inspect(n, name)
            ours = any(s.node == n and s.name == name for s in self.runner.state.started)
            if st is not None and st.status == "running":
                if not ours:
                    self.runner.state.started.append(Started(n, "container", name))
                    self.runner.save()
                continue
            if st is not None and not st.missing:
                await self.runner.change(n, docker_rm_force(name))
            res = await self.runner.change(n, self._ray_cmd(n), timeout=300)
            if not res.ok:
                raise StepFailed(f"{n}: the Ray container did not start: {res.stderr.strip()[-300:]}",
                                 "check the port is free (ss -ltnp) and the image has Ray")
            if not ours:
                self.runner.state.started.append(Started(n, "container", name, res.stdout.strip()[:64]))
                self.runner.save()

    async def verify(self) -> None:
        if self.flow.executor != "ray":
            return
        want = len(self.flow.nodes)
        want_gpus = self._gpus_wanted()
        if not want_gpus:
            self.runner.note("no GPU read on the nodes: Ray runs on their CPUs only (nothing can serve)", "warning")
        deadline = time.monotonic() + self.runner.settings.ray_join_timeout_s / self.runner.settings.speed
        nodes, gpus = 0, 0.0
        while time.monotonic() < deadline:
            nodes, gpus = await self._status()
            self.runner.progress(self.flow.head, "ray", min(1.0, nodes / want), f"{nodes}/{want} nodes, {gpus:g} GPUs")
            if nodes >= want and gpus >= want_gpus:
                self.runner.note(f"ray status: {nodes} nodes, {gpus:g} GPUs, {self._cpus:g} CPUs")
                return
            await asyncio.sleep(self.runner.settings.poll_s)
        raise StepFailed(f"Ray shows {nodes}/{want} nodes and {gpus:g} GPUs",
                         "a worker did not join: check the fast link (network step) and the Ray port 6379")
