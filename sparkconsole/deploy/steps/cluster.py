"""Cluster: the Ray head and workers in containers (or vLLM's native multi-node), every GPU seen."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from sparkconsole.deploy import engines, exits
from sparkconsole.deploy.decisions import Decision, Option
from sparkconsole.deploy.runner import GoTo, StepFailed
from sparkconsole.deploy.state import Started
from sparkconsole.deploy.steps.base import Step
from sparkconsole.probe.parsers import parse_ray_status

if TYPE_CHECKING:
    from sparkconsole.deploy.flow import Flow
from sparkconsole.deploy.weights import peer_port
from sparkconsole.remote import (
    RemoteCommand,
    copy_ray_token,
    docker_exec,
    docker_rm_force,
    docker_run,
    make_ray_token,
    ray_token_env,
    ray_token_mount,
    ray_token_path,
)

RAY_PORT = 6379
# Ray's token authentication exists from Ray 2.52.0 (docs.ray.io ray-security/token-auth.html: "Token
# authentication is available in Ray 2.52.0 or later"); an older Ray ignores RAY_AUTH_MODE and its ports
# take no authentication
RAY_AUTH_SINCE = (2, 52)
# where the deployment's state keeps the files it made on the nodes ({node: [path, ...]}): teardown removes them
MADE_FILES = "made_files"


DOCKER_OPTS = ["--network", "host", "--ipc", "host", "--gpus", "all", "--device", "/dev/infiniband",
               "--ulimit", "memlock=-1", "--shm-size", "16g"]


async def adopt_or_clear(flow: Flow, n: str, name: str, st: exits.ContainerState | None) -> bool:
    """Before ``docker run --name NAME`` on ``n``: what to do with the container of that name that
    is already there (``st``, as ``docker inspect`` read it; None: the node did not say). The name
    carries this deployment's id, so such a container is ours: a ``docker run`` whose result was
    lost (the connection dropped, the console was killed before the state was saved) created it
    without it being recorded, so teardown would never remove it and every later ``docker run`` of
    the name would fail on the conflict.

    Running: *adopted*: recorded in ``started`` (teardown removes it) and True, so it is not started
    twice (it runs the very command that would be sent again; its log is followed from its start).
    Created, exited or dead: *removed* (a change, shown and confirmed with the step's others: its
    name blocks the start, and an engine that ended has nothing to give), and False: start it."""
    runner = flow.runner
    ours = any(s.node == n and s.name == name for s in runner.state.started)
    if st is not None and st.status == "running":
        if not ours:
            runner.state.started.append(Started(n, "container", name))
            runner.save()
            runner.note(f"{name} already runs on {n}: started by this deployment, its result lost before it was "
                        "recorded; adopted (recorded for teardown), not started twice", "warning", n)
        return True
    if st is not None and not st.missing:
        runner.note(f"{name} on {n} is {st.status or 'there'}"
                    + (f" (exit {st.exit_code})" if st.status in ("exited", "dead") else "")
                    + ": a start of this deployment that did not run on; removed so the name is free", "warning", n)
        await runner.change(n, docker_rm_force(name))
        if ours:
            runner.state.started[:] = [s for s in runner.state.started if not (s.node == n and s.name == name)]
            runner.save()
    return False


# the vLLM the wizard trusts with the native multi-node start (`--nnodes/--node-rank/--headless`): the
# oldest it has seen run it (0.17, NGC 26.03's vLLM 0.17.1 and upstream v0.17.0)
NATIVE_SINCE = (0, 17)


class Cluster(Step):
    id, title = "cluster", "Ray head and workers, every GPU seen"
    decisions = ("cluster.executor",)
    done_when_serving = True
    _cpus = 0.0  # what the last `ray status` read counted
    _states: dict[str, exits.ContainerState | None] = {}  # node -> its Ray container, as the probe read it

    def _image_has_ray(self) -> bool | None:
        """What the engine check read: the image's ``ray`` module and command (None: not asked). Where
        the image was not run (read-only, plan-only) the known images' list says it, or nothing."""
        check = (self.flow.plan.engine_checks or {}).get(self.flow.image) or {}
        clis, versions = check.get("clis") or {}, check.get("versions") or {}
        if check.get("expected"):
            return bool(clis["ray"]) if "ray" in clis else None
        if "ray" not in clis and "ray" not in versions:
            return None
        return bool(clis.get("ray")) and bool(versions.get("ray"))

    async def decide(self) -> None:
        if "ray" not in self.flow.engine_kind.executors:  # no Ray path (SGLang): its own multi-node start
            self.flow.update(executor="native")
            return
        has_ray = self._image_has_ray()
        ray_why = ("`ray status` proves every GPU joined before serving; Ray's own token (made on the head, copied to "
                   "each worker, never in a command line) guards its ports"
                   if has_ray is not False else
                   f"{self.flow.image} has no Ray (NGC 26.05 and vLLM images from about 0.19 ship without it): "
                   "`ray start` would fail with \"ray\": executable file not found")
        options = [Option("native", "vLLM native --nnodes/--node-rank/--headless",
                          "one vLLM process per node, no Ray; workers start first"),
                   Option("ray", "Ray head and workers in containers", ray_why)]
        if has_ray is False:
            options.append(Option("back-engine", "choose another image (one with Ray)",
                                  "back to the engine step: a vllm/vllm-openai -cu130 tag or NGC 26.03 has Ray"))
        # native by default where the image's vLLM has it (every image the wizard recommends: 0.17 and newer):
        # the field moved to it (eugr's launcher defaults to no Ray, AINode 0.5 dropped Ray) and newer images
        # ship without Ray; Ray only when asked, or for an older vLLM
        version = engines.version_tuple(self.flow.plan.vllm_version or (
            (self.flow.plan.engine_checks or {}).get(self.flow.image, {}).get("versions") or {}).get("vllm"))
        old = bool(version) and version < NATIVE_SINCE and has_ray is not False
        rec = self.flow.options.executor or ("ray" if old else "native")
        why = ("the image has no Ray; vLLM's native multi-node needs none" if has_ray is False else
               f"its vLLM {'.'.join(map(str, version))} predates the native multi-node start the field runs" if old else
               "vLLM's own multi-node start: no Ray to form, one process per node (the field's default: eugr's "
               "launcher, AINode; newer images ship without Ray)")
        by_name = bool(((self.flow.plan.engine_checks or {}).get(self.flow.image) or {}).get("expected"))
        d = Decision("cluster.executor", self.id, "How the nodes join: Ray or vLLM's native multi-node",
                     (f"{len(self.flow.nodes)} nodes, TP={self.flow.plan.tp}",
                      f"{self.flow.image}: Ray " + {True: "present", False: "ABSENT", None: "not checked"}[has_ray]
                      + (" (by its name: the image was not run)" if by_name and has_ray is not None else "")),
                     tuple(options), rec, why)
        answer = await self.runner.decide(d)
        if answer == "back-engine":
            self.runner.forget("engine.image", *self.decisions)
            raise GoTo("engine", "the image has no Ray")
        self.flow.update(executor=answer)

    def _ray_cmd(self, n: str) -> RemoteCommand:
        flow = self.flow
        ip = flow.ip(n)
        if n == flow.head:
            # Ray's GCS listens on every interface (--node-ip-address is the address it gives out, not a
            # bind); with the token (below) its RPCs and HTTP need it (docs.ray.io ray-core/internals/
            # token-authentication.html: "all supported RPC and HTTP entry points enforce token based
            # authentication"), but the token crosses the wire in clear ("Token authentication does not
            # encrypt traffic", docs.ray.io kuberay auth guide), so the cluster still belongs on a trusted
            # network. What can be bound is: the dashboard (it submits jobs, that is, runs code) on
            # 127.0.0.1, named rather than left to the image's Ray (`ray start --dashboard-host`: "either
            # localhost (127.0.0.1) or 0.0.0.0 (available from all interfaces)", docs.ray.io cluster/cli.html)
            args = ["start", "--block", "--head", f"--node-ip-address={ip}", f"--port={RAY_PORT}",
                    "--dashboard-host=127.0.0.1"]
        else:
            args = ["start", "--block", f"--address={flow.ip(flow.head)}:{RAY_PORT}", f"--node-ip-address={ip}"]
        hf = flow.fact(n).hf_dir
        # Ray's authentication made explicit (RAY_AUTH_MODE must be the same on every node; Ray 2.61 turns
        # token mode on by default for all clusters, so an unset mode would need a token anyway): token
        # mode, the token's file mounted read-only and named by RAY_AUTH_TOKEN_PATH, never its value
        return docker_run(flow.container("ray"), flow.image, options=[*self._options(n), *ray_token_mount(
                          self._token_file(n))], entrypoint="ray", args=args, env=[*flow.env(n), *ray_token_env()],
                          mounts=[(hf, "/root/.cache/huggingface")],
                          summary=f"start the Ray {'head' if n == flow.head else 'worker'} on {n} "
                                  "(token authentication: the token read from a mounted file)")

    def _token_file(self, n: str) -> str:
        """The node's file of Ray's token (its login user's ``~/.config/sparkconsole/ray-token``)."""
        return ray_token_path(self.flow.fact(n).home or "/root")

    async def _tokens(self) -> None:
        """Ray's token, before any Ray container starts: made on the head (kept if there: a resume), then
        copied head → each worker over ssh's stdin (the network step checked that ssh), each a change
        shown, confirmed and journaled. Each file is recorded in the state for teardown."""
        flow = self.flow
        head_file = self._token_file(flow.head)
        made: dict[str, list[str]] = dict(self.runner.state.facts.get(MADE_FILES) or {})
        res = await self.runner.change(flow.head, make_ray_token(head_file), timeout=60)
        if not res.ok:
            raise StepFailed(f"{flow.head}: Ray's token could not be made in {head_file}: {res.stderr.strip()[-200:]}",
                             f"check {head_file.rsplit('/', 1)[0]} is the login user's and writable")
        made[flow.head] = sorted({*made.get(flow.head, []), head_file})
        for n in flow.nodes:
            if n == flow.head:
                continue
            dest = self._token_file(n)
            res = await self.runner.change(flow.head, copy_ray_token(head_file, flow.user_at(n), dest,
                                                                     port=peer_port(flow, n)), timeout=60)
            if not res.ok:
                raise StepFailed(f"{flow.head} could not copy Ray's token to {n}: {res.stderr.strip()[-200:]}",
                                 f"on {flow.head}: `ssh {flow.user_at(n)} true` must work without a password "
                                 "(the network step checks it), then --resume")
            made[n] = sorted({*made.get(n, []), dest})
        self.runner.state.facts[MADE_FILES] = made
        self.runner.save()
        ray = ((((self.flow.plan.engine_checks or {}).get(flow.image) or {}).get("versions")) or {}).get("ray")
        version = engines.version_tuple(ray)
        if version and version < RAY_AUTH_SINCE:
            self.runner.note(f"{flow.image}'s Ray {ray} predates token authentication (Ray 2.52): it ignores the "
                             "token, and its ports take no authentication; keep the cluster on a trusted network",
                             "warning")

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
        # the container's own environment has the token's mode and file already (docker run -e); said again
        # here so `ray status` authenticates whatever the container was started with
        res = await self.runner.read(self.flow.head, docker_exec(self.flow.container("ray"), ["ray", "status"],
                                                                 env=ray_token_env()), timeout=60, quiet=True)
        st = parse_ray_status(res.stdout) if res.ok else None
        self._cpus = (st.cpus_total or 0.0) if st else 0.0
        return (st.active_nodes or 0, st.gpus_total or 0.0) if st else (0, 0.0)

    async def probe(self) -> str | None:
        if len(self.flow.nodes) < 2:
            return "one node: no cluster to form"
        if self.flow.plan.executor == "ray" and any("-ray-" in s.name for s in self.runner.state.started):
            nodes, gpus = await self._status()
            if nodes >= len(self.flow.nodes) and gpus >= self._gpus_wanted():
                return f"Ray is up: {nodes} nodes, {gpus:g} GPUs"
        # what send decides from (its rehearsal then reads nothing): each node's Ray container, if any
        name = self.flow.container("ray")
        self._states = dict(zip(self.flow.nodes, await self.runner.on_all(
            self.flow.nodes, lambda n: self.flow.inspect(n, name)), strict=True))
        return None

    async def send(self) -> None:
        flow = self.flow
        if flow.executor != "ray":
            self.runner.note("native multi-node: the serve step starts one engine container per node, workers first")
            return
        name = flow.container("ray")
        await self._tokens()
        for n in flow.nodes:
            st = self._states[n] if n in self._states else await self.flow.inspect(n, name)
            if await adopt_or_clear(self.flow, n, name, st):
                continue
            ours = any(s.node == n and s.name == name for s in self.runner.state.started)
            res = await self.runner.change(n, self._ray_cmd(n), timeout=300)
            if not res.ok:
                err = res.stderr.strip()
                if "executable file not found" in err or "ray: not found" in err:
                    raise StepFailed(f"{n}: {flow.image} has no Ray (\"ray\": executable file not found)",
                                     "--resume and answer cluster.executor=native, or choose an image with Ray")
                raise StepFailed(f"{n}: the Ray container did not start: {err[-300:]}",
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
