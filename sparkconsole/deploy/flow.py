"""The deployment as data: the steps in order, each ``probe → decide → plan → apply → verify``.

Every step has a stable id (the state, the journal, ``--until`` and ``--answer`` use it). A step's
``probe`` says when what it would do is already true (it is then skipped: re-running a finished
deployment sends no change); ``decide`` meets its decisions; ``plan`` lists the exact commands
``apply`` will send, per node (``--plan-only`` prints them, the TUI shows them before they run);
``verify`` checks the outcome on the nodes and raises :class:`StepFailed` with the fix.

Nothing here is fixed to two nodes or one model: the head is the configured head, every other
node is a worker, and the model comes from the options (the default is the story's
Qwen/Qwen3.5-122B-A10B-FP8).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from sparkconsole.deploy import engines, exits, freeing, netenv
from sparkconsole.deploy import weights as W
from sparkconsole.deploy.calibrate import from_log as serve_calibration
from sparkconsole.deploy.decisions import Decision, Option
from sparkconsole.deploy.deployment_plan import DeploymentPlan, ImageChoice, Layout, Stop, parse_stops
from sparkconsole.deploy.recon import NodeFacts, facts_from_output, normalize_image, recon_command
from sparkconsole.deploy.runner import GoTo, Runner, StepFailed
from sparkconsole.deploy.state import Job, Started, Stopped
from sparkconsole.logs.vllm import VllmLogTracker
from sparkconsole.planner.budget import DEFAULT_NODE_MEMORY_GIB
from sparkconsole.planner.plan import PlanOptions, compare_tp, layout_row
from sparkconsole.planner.spec import load_spec
from sparkconsole.probe.parsers import parse_docker_ps, parse_ray_status
from sparkconsole.remote import (
    JobFiles,
    RemoteCommand,
    command,
    docker_action,
    docker_exec,
    docker_pull,
    docker_rm_force,
    docker_run,
    docker_state,
    drop_caches,
    file_from,
    hf_download,
    http_get,
    http_post_json,
    hub_tree,
    image_copy,
    image_id,
    mkdir_p,
    ping_df,
    python_in_image,
    rsync_dir,
    serve_in_container,
    ssh_to,
    stream_copy,
    systemctl_action,
)

GIB = 1 << 30
DEFAULT_MODEL = "Qwen/Qwen3.5-122B-A10B-FP8"
STEP_IDS = ("recon", "plan", "engine", "network", "weights", "images", "free-memory", "caches", "cluster",
            "serve", "verify")
RAY_PORT = 6379
API_PORT = 8000
LAUNCH_MARGIN = 1 * GIB  # free memory kept above vLLM's start-up check
RECON_TIMEOUT_S = 20.0  # a node that does not answer its recon within this is named unreachable
LINK_WAIT_S = 900.0  # how long the weights step waits for a fast link that went down mid-copy
LINK_RETRIES = 3  # copy passes started again after the link came back


@dataclass
class Options:
    """What the operator asked for (``sparkconsole deploy`` flags); ``None``: the wizard proposes."""

    model: str = DEFAULT_MODEL
    engine: str = "vllm"
    executor: str | None = None
    image: str | None = None
    tp: int | None = None
    max_model_len: int | None = None
    port: int = API_PORT
    served_name: str | None = None
    reasoning_parser: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Options:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def model_dir_name(model: str) -> str:
    owner, name = model.split("/", 1)
    return f"models--{owner}--{name}"


class Flow:
    """What the steps share: the runner, the options, and everything read or decided so far."""

    def __init__(self, runner: Runner, options: Options) -> None:
        self.r = runner
        self.o = options
        self.spec = load_spec(options.model, offline=True)
        self._facts: dict[str, NodeFacts] = {}
        self._facts_of: object = None
        self.steps: list[Step] = [cls(self) for cls in STEPS]
        runner.declared = {s.id: s.decisions for s in self.steps} | {"teardown": Teardown.decisions}

    def step(self, step_id: str) -> Step:
        """The step of that id (a failed start names the step to go back to)."""
        return next(s for s in self.steps if s.id == step_id)

    # -- facts --------------------------------------------------------------------------------
    @property
    def facts(self) -> dict[str, NodeFacts]:
        """What recon read, parsed once per read (recon stores a new mapping each time it reads)."""
        raw = self.r.state.facts.get("nodes", {})
        if self._facts_of is not raw:
            self._facts = {n: NodeFacts.from_json(d) for n, d in raw.items()}
            self._facts_of = raw
        return self._facts

    def fact(self, node: str) -> NodeFacts:
        return self.facts[node]

    @property
    def plan(self) -> DeploymentPlan:
        """What the steps decided and measured so far (typed; kept in the state file)."""
        return self.r.state.plan

    def update(self, **changes: Any) -> None:
        """Set plan fields by name (a name the plan lacks fails at once) and save the state."""
        self.plan.update(**changes)
        self.r.save()

    @property
    def head(self) -> str:
        return self.r.head.name

    @property
    def nodes(self) -> list[str]:
        """The nodes this deployment spans: the head and as many workers as TP needs."""
        n = int(self.plan.tp or self.o.tp or len(self.r.nodes)) * int(self.plan.pp or 1)
        names = [self.head] + [x.name for x in self.r.nodes if x.name != self.head]
        return names[:max(1, n)]

    def ip(self, node: str) -> str:
        ip = self.fact(node).fast_ip()
        if ip is None:
            raise StepFailed(f"{node}: no fast-link address", "see the network step")
        return ip

    def user_at(self, node: str) -> str:
        user = self.r.config.node(node).user or "root"
        return f"{user}@{self.ip(node)}"

    def job_dir(self, node: str) -> str:
        return f"{self.fact(node).job_dir_base}/{self.r.state.short_id}"

    def model_dir(self, node: str) -> str:
        return f"{self.fact(node).hf_dir}/hub/{model_dir_name(self.o.model)}"

    @property
    def image(self) -> str:
        return str(self.plan.image or self.o.image or "")

    @property
    def engine(self) -> str:
        return str(self.plan.engine or self.o.engine)

    @property
    def executor(self) -> str:
        """``single`` (one node: the image's own entrypoint, no Ray), else the answer: ray | native."""
        if len(self.nodes) < 2:
            return "single"
        return str(self.plan.executor or self.o.executor or "ray")

    def container(self, role: str) -> str:
        return f"sparkconsole-{role}-{self.r.state.short_id}"

    def env(self, node: str) -> list[tuple[str, str]]:
        return netenv.node_env(self.fact(node), self.ip(self.head))

    async def inspect(self, node: str, name: str) -> exits.ContainerState | None:
        """One container's state on ``node`` (``docker inspect``, read-only); ``missing`` when docker
        knows no such container, None when the node or docker did not answer."""
        res = await self.r.read(node, docker_state(name), timeout=30, quiet=True)
        if res.exit_status is None:
            return None
        return exits.parse_states(res.stdout, res.stderr, [name]).get(name)

    async def serving(self) -> bool:
        """The head already answers /v1/models with this deployment's served name."""
        res = await self.r.read(self.head, http_get(f"http://127.0.0.1:{self.o.port}/v1/models"), quiet=True)
        return res.ok and f'"{self.served_name}"' in res.stdout

    @property
    def served_name(self) -> str:
        return self.o.served_name or self.o.model.split("/", 1)[1].lower()

    async def recon(self, nodes: list[str] | None = None) -> dict[str, NodeFacts]:
        """Read every node once (concurrently) and keep what was read."""
        names = nodes or [n.name for n in self.r.nodes]

        async def one(node: str) -> NodeFacts:
            res = await self.r.read(node, recon_command(self.o.model), timeout=RECON_TIMEOUT_S)
            if res.exit_status is None and not res.stdout:
                return NodeFacts(node=node, reachable=False, reason=res.stderr.strip() or "no answer")
            return facts_from_output(node, res.stdout)

        got = await self.r.on_all(names, one)
        stored = dict(self.r.state.facts.get("nodes", {}))
        for f in got:
            stored[f.node] = f.to_json()
        self.r.state.facts["nodes"] = stored
        self.r.save()
        return {f.node: f for f in got}


class Step:
    """One step of the deployment: ``probe → decide → send → watch → verify``.

    ``probe`` reads what the step needs and returns why its work is already done (the step is then
    skipped) or None. ``decide`` meets the step's decisions. ``send`` is the step's one source of
    changes: every command that changes a node, job starts included, goes out through the runner
    there and nowhere else. The runner first runs it as a rehearsal (nothing sent) to show what it
    would send (``--plan-only``, the confirmation), then runs the same code to send; so what is
    shown is what is sent, by construction. ``watch`` follows what was sent (job waits, progress,
    the engine's log) and may decide again (a failure, a link that went down); ``verify`` checks the
    outcome on the nodes and raises :class:`StepFailed` with the fix.
    """

    id = ""
    title = ""
    # Traits: what differs between steps is declared here, never tested by name in the runner.
    rerun_when_done = False  # probed and run again on --resume even when it finished before
    decisions: tuple[str, ...] = ()  # the ids of the decisions this step may ask

    def __init__(self, flow: Flow) -> None:
        self.f = flow

    @property
    def r(self) -> Runner:
        return self.f.r

    async def probe(self) -> str | None:
        return None

    async def decide(self) -> None:
        return None

    async def send(self) -> None:
        return None

    async def watch(self) -> None:
        return None

    async def verify(self) -> None:
        return None


# ---- recon ----------------------------------------------------------------------------------------

class Recon(Step):
    """Reads every node; run again on resume (the nodes may have changed while the console was away)."""

    id, title = "recon", "Read every node"
    rerun_when_done = True

    async def probe(self) -> str | None:
        got = await self.f.recon()
        for f in got.values():
            if not f.reachable:
                raise StepFailed(f"{f.node} cannot be reached: {f.reason}",
                                 "check the node is on and `ssh` to it works; then --resume")
            gib = (f.mem_available or 0) / GIB
            links = ", ".join(f"{lk.netdev} {'Up' if lk.up else 'Down'}" for lk in f.links if lk.port == 1) or "?"
            self.r.note(f"{f.gpu or 'GPU ?'}, driver {f.driver or '?'}, CUDA {f.cuda or '?'}, "
                        f"{gib:.1f}/{(f.mem_total or 0) / GIB:.1f} GiB available, disk free "
                        f"{(f.disk_free or 0) / 1e12:.2f} TB at {f.hf_dir}, docker {f.docker or '?'} "
                        f"({f.storage_driver or '?'}), {len(f.images)} images, fast link {f.fast_ip() or 'none'} "
                        f"({links}), Hub {'reachable' if f.hub else 'not reachable'}, "
                        f"HF token {'present' if f.token else 'absent'}", node=f.node)
        drivers = {f.driver for f in got.values() if f.driver}
        if len(drivers) > 1:
            self.r.note(f"driver versions differ between nodes: {', '.join(sorted(drivers))}", "warning")
        return None


# ---- plan -----------------------------------------------------------------------------------------

def _cuda_total(f: NodeFacts) -> float:
    """What vLLM calls the device's total: on a GB10 the 121.69 GiB CUDA reports, else MemTotal."""
    if f.gpu and "GB10" in f.gpu:
        return DEFAULT_NODE_MEMORY_GIB * GIB
    return float(f.mem_total or DEFAULT_NODE_MEMORY_GIB * GIB)


class Plan(Step):
    id, title = "plan", "Plan memory: one node or several"
    decisions = ("plan.layout",)

    @staticmethod
    def vllm_version(f: Flow) -> str | None:
        """The vLLM whose rules the plan uses: the image's, once the engine step has read it (a
        re-plan after a failed start), else the version of the image asked for (--image, by its tag
        or the known images), else None: the planner assumes the newest it knows, and says so."""
        if f.plan.vllm_version:
            return str(f.plan.vllm_version)
        img = f.o.image
        if not img:
            return None
        known = next((k.version for k in engines.KNOWN_IMAGES
                      if k.engine == "vllm" and normalize_image(k.ref) == normalize_image(img)), None)
        if known:
            return known
        m = re.search(r":v?(\d+\.\d+(?:\.\d+)?)", img)
        return m.group(1) if m else None

    @staticmethod
    def options(f: Flow, vllm_version: str | None) -> PlanOptions:
        """The chosen plan's options, as the plan step stored them (for a re-plan by version)."""
        node_gib = min(_cuda_total(x) for x in f.facts.values()) / GIB
        return PlanOptions(node_memory_gib=node_gib, max_model_len=f.plan.max_model_len,
                           gpu_memory_utilization=float(f.plan.gmu or 0.85),
                           kv_cache_dtype=f.plan.kv_cache_dtype or "auto", vllm_version=vllm_version, force=True)

    async def decide(self) -> None:
        f = self.f
        facts = f.facts
        n_nodes = len(self.r.nodes)
        node_gib = min(_cuda_total(x) for x in facts.values()) / GIB
        # gmu as memory will be once free-memory has run: at most what stopping every running service
        # frees on the tightest node (vLLM checks free >= gmu x total at start), at most 0.85 (GB10 practice)
        best = min((x.mem_available or 0) + sum(freeing.container_bytes(x).values()) for x in facts.values())
        room = math.floor(100 * (best - LAUNCH_MARGIN) / (node_gib * GIB)) / 100
        gmu = float(f.plan.gmu_override or min(0.85, max(0.5, room)))
        if gmu < 0.85 and not f.plan.gmu_override:
            self.r.note(f"--gpu-memory-utilization {gmu}: even with every service stopped the tightest node has "
                        f"{best / GIB:.1f} GiB free")
        mml_ask = f.plan.max_model_len_override or f.o.max_model_len
        from sparkconsole.planner.overheads import rules_for

        version = self.vllm_version(f)
        base = PlanOptions(node_memory_gib=node_gib, max_model_len=mml_ask, gpu_memory_utilization=gmu,
                           vllm_version=version)
        self.r.note(f"plan: {rules_for(version).note}"
                    + ("" if version else "; the engine step reads the image's version and re-plans"))
        tps = (1, f.o.tp) if f.o.tp and f.o.tp > 1 else (1, *[t for t in (2, 4, 8, 16, 32) if t <= n_nodes])
        layouts = [(t, 1) for t in dict.fromkeys(tps)]
        if n_nodes > 2 and layout_row(f.spec, base, n_nodes).get("error"):
            layouts.append((1, n_nodes))  # TP cannot divide the model over every node: pipeline stages can
        table = {(t, p): layout_row(f.spec, base, t, p) for t, p in layouts}
        rows = {t: r for (t, p), r in table.items() if p == 1}
        multi = [t for t in rows if t > 1 and not rows[t].get("error")]
        tp_n = min((t for t in multi if rows[t]["fits"]), default=max(multi, default=1))
        measured = []
        for (tp, pp), row in table.items():
            name = f"TP={tp}" + (f" x PP={pp}" if pp > 1 else "")
            if row.get("error"):
                measured.append(f"{name}: {row['error']}")
                continue
            if row["kv_cache_gib_per_node"] <= 0:
                measured.append(f"{name}: {row['weights_gib_per_node']:.1f} GiB weights per node: more than the "
                                f"node's budget ({gmu} of {node_gib:.2f} GiB): does not fit")
                continue
            measured.append(f"{name}: {row['weights_gib_per_node']:.1f} GiB weights per node, "
                            f"{row['kv_cache_gib_per_node']:.1f} GiB KV, {row['max_concurrency']:.1f}x "
                            f"concurrency at {row['max_model_len']:,} tokens: "
                            f"{'fits' if row['fits'] else 'does not fit'}")
        options = []

        def offer(layout: Layout, label: str, why: str) -> None:
            options.append(Option(layout.value, label, why, payload=layout))

        for (tp, pp), row in table.items():
            if row.get("error"):
                continue
            label = ("one Spark" if tp * pp == 1 else f"TP={tp} over {tp} Sparks" if pp == 1 else
                     f"PP={pp} pipeline stages over {tp * pp} Sparks")
            why = (f"{row['weights_gib_per_node']:.1f} GiB weights per node; "
                   + ("fits" if row["fits"] else "out of memory on loading (the single-node OOM risk)"))
            offer(Layout(tp, pp), label, why)
        fp8 = compare_tp(f.spec, dataclasses.replace(base, kv_cache_dtype="fp8"), tps=(tp_n,))[0]
        if not fp8.get("error") and tp_n > 1:
            offer(Layout(tp_n, kv_cache_dtype="fp8"), f"TP={tp_n} with fp8 KV cache",
                  f"{fp8['max_concurrency']:.1f}x concurrency (twice the tokens, slightly lower quality)")
        full = rows.get(tp_n) or {}
        if tp_n > 1 and not full.get("error") and full.get("max_model_len", 0) > 32768:
            short = max(32768, int(full["max_model_len"]) // 4)
            alt = compare_tp(f.spec, dataclasses.replace(base, max_model_len=short), tps=(tp_n,))[0]
            if not alt.get("error"):
                offer(Layout(tp_n, max_model_len=short), f"TP={tp_n} with --max-model-len {short:,}",
                      f"{alt['max_concurrency']:.1f}x concurrency: more requests at once, shorter prompts")
        options.append(Option("4bit", "a 4-bit variant on one Spark",
                              "an NVFP4/INT4 build of the model fits one node (other checkpoint; this run stops)"))
        fitting = sorted((t * p, p, t) for (t, p), row in table.items() if row.get("fits"))
        cheapest = fitting[0] if fitting else None
        rec = Layout(cheapest[2], cheapest[1]).value if cheapest else "4bit"
        why = ("the cheapest layout that fits: " + (f"TP={cheapest[2]}" + (f" x PP={cheapest[1]}" if cheapest[1] > 1
                                                                         else "") if cheapest else "none fits as asked")
               + (f"; one Spark would run out of memory loading {rows[1]['weights_gib_per_node']:.0f} GiB"
                  if 1 in rows and not rows[1].get("fits") and not rows[1].get("error") else ""))
        d = Decision("plan.layout", self.id, "Single-node OOM risk: how to lay the model out",
                     tuple(measured), tuple(options), rec, why)
        layout = await self.r.choose(d)
        if not isinstance(layout, Layout):  # the one option without a layout: another checkpoint
            raise StepFailed("a 4-bit variant was chosen: that is another checkpoint",
                             "run `sparkconsole deploy --model <the 4-bit repo> --tp 1` (e.g. an NVFP4 build)")
        tp, pp, kv = layout.tp, layout.pp, layout.kv_cache_dtype
        if layout.max_model_len:
            base = dataclasses.replace(base, max_model_len=layout.max_model_len)
        chosen = layout_row(f.spec, dataclasses.replace(base, kv_cache_dtype=kv), tp, pp)
        f.update(tp=tp)
        f.update(pp=pp)
        f.update(plan_fits=bool(chosen.get("fits")))
        f.update(plan_vllm_version=rules_for(version).version if version else None)
        f.update(kv_cache_dtype=kv)
        mml = int(chosen["max_model_len"])
        f.update(max_model_len=mml)
        # the memory each node must have free at launch
        f.update(gmu=gmu)
        need = {n: int(gmu * _cuda_total(facts[n]) + LAUNCH_MARGIN) for n in f.nodes}
        f.update(need=need)
        choices = {n: freeing.choose(facts[n], need[n]) for n in f.nodes}
        for n, c in choices.items():
            what = ", ".join(c.stop) if c.stop else "nothing"
            self.r.note(f"launch needs {need[n] / GIB:.1f} GiB free (gmu {gmu} of {_cuda_total(facts[n]) / GIB:.2f} "
                        f"GiB); {c.available / GIB:.1f} GiB available now; must go: {what}"
                        + ("" if c.enough else " (and still short)"), node=n)
        self.r.note(f"plan: TP={tp}" + (f" x PP={pp}" if pp > 1 else "") + f", --max-model-len {mml:,}, --gpu-memory-utilization {gmu}, KV {kv}, "
                    f"{chosen['weights_gib_per_node']:.1f} GiB weights and {chosen['kv_cache_gib_per_node']:.1f} "
                    f"GiB KV per node, {chosen['max_concurrency']:.1f}x concurrency; {chosen.get('headline', '')}")


# ---- engine ---------------------------------------------------------------------------------------

class Engine(Step):
    id, title = "engine", "Engine: does the image know the model?"
    decisions = ("engine.image",)

    async def _check(self, node: str, image: str) -> engines.EngineFacts:
        archs = tuple(self.f.spec.geometry.architectures) or engines.QWEN35[:1]
        cmd = python_in_image(image, engines.engine_program(archs))
        res = await self.r.read(node, cmd, timeout=180)
        ef = engines.parse_engine_output(image, res.stdout + res.stderr, res.exit_status)
        checked = dict(self.f.plan.engine_checks or {})
        checked[image] = {"versions": ef.versions, "archs": ef.archs, "error": ef.error}
        self.f.update(engine_checks=checked)
        return ef

    async def decide(self) -> None:
        f = self.f
        archs = tuple(f.spec.geometry.architectures)
        arch = archs[0] if archs else "?"
        head = f.fact(f.head)
        present = {normalize_image(i.ref) for x in f.facts.values() for i in x.images}
        candidates = [f.o.image] if f.o.image else sorted(
            (i.ref for i in head.images if "vllm" in i.ref or "sglang" in i.ref), reverse=True)
        measured, good = [], []
        for img in candidates:
            if normalize_image(img) not in present:
                measured.append(f"{img}: not on any node yet")
                continue
            ef = await self._check(f.head if head.image(img) else self._holder(img), img)
            if ef.error:
                measured.append(f"{img}: could not run its Python ({ef.error})")
                continue
            knows = ef.knows(arch)
            measured.append(f"{img}: vLLM {ef.vllm or '-'}, transformers {ef.versions.get('transformers') or '-'}"
                            f", SGLang {ef.versions.get('sglang') or '-'}: {arch} "
                            f"{'registered' if knows else 'NOT registered' if knows is False else 'unknown'}")
            if knows and ef.vllm:  # an SGLang image is offered as the SGLang engine, below
                good.append((engines.version_tuple(ef.vllm), img))
        options = [Option(img, f"{img} (on the nodes, knows {arch})", "already here: nothing to pull",
                          payload=ImageChoice("vllm", img)) for _, img in sorted(good, reverse=True)]
        for k in engines.KNOWN_IMAGES:
            if k.engine == "vllm" and all(o.value != k.ref for o in options) and arch in k.archs:
                options.append(Option(k.ref, f"{k.ref} (vLLM {k.version}, known to work)",
                                      k.note + ("; present" if normalize_image(k.ref) in present else
                                                "; pulled on a node with internet, copied to the others"),
                                      payload=ImageChoice("vllm", k.ref)))
        sg = next((k for k in engines.KNOWN_IMAGES if k.engine == "sglang"), None)
        if sg is not None:
            options.append(Option("sglang", f"SGLang ({sg.ref})", sg.note, experimental=True,
                                  payload=ImageChoice("sglang", sg.ref)))
        rec = options[0].value
        why = (f"{options[0].value} knows {arch}" if good else
               f"no image on the nodes knows {arch}; {rec} does (pinned by its image ID after the pull)")
        d = Decision("engine.image", self.id, "Engine compatibility: which image serves the model",
                     tuple(measured), tuple(options), rec, why, free_text=True,
                     parse=lambda ref: ImageChoice("vllm", ref))  # an image the operator names
        choice: ImageChoice = await self.r.choose(d)
        f.update(engine=choice.engine, image=choice.ref)

    def _holder(self, image: str) -> str:
        for n, x in self.f.facts.items():
            if x.image(image):
                return n
        return self.f.head

    async def send(self) -> None:
        img = self.f.image
        if not any(x.image(img) for x in self.f.facts.values()):
            src = next((n for n, x in self.f.facts.items() if x.hub), None)
            if src is None:
                raise StepFailed(f"{img} is on no node and no node reaches the internet",
                                 "load it on one node (`docker load < image.tar`), then --resume")
            res = await self.r.change(src, docker_pull(img), timeout=3600, key=f"pull {img} {src}")
            if not res.ok:
                raise StepFailed(f"{src}: docker pull {img} failed: {res.stderr.strip()[-300:]}")
            await self.f.recon([src])

    async def verify(self) -> None:
        f = self.f
        img = f.image
        arch = (f.spec.geometry.architectures or ["?"])[0]
        ef = await self._check(self._holder(img), img)
        if ef.error or not ef.knows(arch):
            self.r.forget("engine.image")
            why = (f"its Python could not be run ({ef.error})" if ef.error else
                   f"its {f.engine} ({ef.vllm or ef.versions.get('sglang') or '-'}) does not register {arch}")
            raise StepFailed(f"{img}: {why}", "choose another image: --resume and answer engine.image, or --image IMG")
        ident = next((i.id for x in f.facts.values() for i in x.images if normalize_image(i.ref) == normalize_image(img)),
                     "")
        f.update(image_id=ident)
        self.r.note(f"{img}: vLLM {ef.vllm or '-'}, SGLang {ef.versions.get('sglang') or '-'}, "
                    f"{arch} registered; image ID {ident[:19]}")
        if f.engine == "vllm" and ef.vllm:
            self._replan(ef.vllm)

    def _replan(self, version: str) -> None:
        """The plan again under the image's vLLM rules (CUDA graphs in the budget from 0.19, the KV
        print from 0.20), when the plan step assumed another version; the verdict names it."""
        from sparkconsole.planner.overheads import rules_for

        f = self.f
        f.update(vllm_version=version)
        if f.plan.tp is None or rules_for(version).version == f.plan.plan_vllm_version:
            return
        row = layout_row(f.spec, Plan.options(f, version), int(f.plan.tp or 1), int(f.plan.pp or 1))
        f.update(plan_vllm_version=rules_for(version).version)
        if row.get("error"):
            self.r.note(f"re-plan for the image's vLLM {version}: {row['error']}")
            return
        f.update(plan_fits=bool(row["fits"]))
        self.r.note(f"re-plan for the image's vLLM {version}: {row['kv_cache_gib_per_node']:.1f} GiB KV per node, "
                    f"{row['max_concurrency']:.1f}x concurrency at {row['max_model_len']:,} tokens; {row['headline']}")


# ---- network --------------------------------------------------------------------------------------

class Network(Step):
    id, title = "network", "Fast link: port, addresses, MTU, a don't-fragment ping"
    decisions = ("network.mtu",)

    async def decide(self) -> None:
        facts = [self.f.fact(n) for n in self.f.nodes]
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
            if await self.r.decide(d) == "stop":
                raise StepFailed(mtu[0].what, mtu[0].fix)
            self.f.update(set_mtu=low)

    async def send(self) -> None:
        low = self.f.plan.set_mtu
        if not low:
            return
        for n in self.f.nodes:
            for lk in self.f.fact(n).up_links():
                if lk.mtu != low and lk.netdev:
                    cmd = command("sudo", "-n", "ip", "link", "set", "dev", lk.netdev, "mtu", str(low),
                                  mutating=True, summary=f"set MTU {low} on {lk.netdev}")
                    res = await self.r.change(n, cmd)
                    if not res.ok:
                        raise StepFailed(f"{n}: {cmd.summary} failed: {res.stderr.strip()[-300:]}")
        await self.f.recon(self.f.nodes)

    async def verify(self) -> None:
        f = self.f
        nodes = f.nodes
        if len(nodes) < 2:
            return
        mtu = min((f.fact(n).fast_link().mtu or 1500) for n in nodes)  # type: ignore[union-attr]

        async def check(i: int) -> str | None:
            src, dst = nodes[i], nodes[(i + 1) % len(nodes)]
            res = await self.r.read(src, ping_df(f.ip(dst), mtu - 28), timeout=30)
            if not res.ok:
                return (f"{src} → {dst} ({f.ip(dst)}): a {mtu}-byte don't-fragment ping failed: "
                        f"{(res.stdout + res.stderr).strip().splitlines()[-1:] or ['no reply']}")
            res = await self.r.read(src, ssh_to(f.user_at(dst), "true"), timeout=30)
            if not res.ok:
                return (f"{src} cannot ssh to {dst} over the fast link ({res.stderr.strip()[-200:]}); the copy "
                        f"needs it: add {src}'s public key to {dst}'s authorized_keys")
            return None

        errors = [e for e in await asyncio.gather(*(check(i) for i in range(len(nodes)))) if e]
        if errors:
            raise StepFailed(errors[0], "check the cable and `ip addr` on both ends; ping with "
                                        f"`ping -M do -s {mtu - 28} IP` until it answers")
        for n in nodes:
            env = " ".join(f"{k}={v}" for k, v in f.env(n))
            self.r.note(f"environment: {env}", node=n)


# ---- weights --------------------------------------------------------------------------------------

def _find_sizes(snap: str) -> RemoteCommand:
    return command("find", "-L", snap, "-type", "f", "-printf", "%s %P\\n")


def _find_broken(snap: str) -> RemoteCommand:
    return command("find", snap, "-xtype", "l")


class Weights(Step):
    id, title = "weights", "Weights: download once, copy over the fast link, verify everywhere"
    decisions = ("weights.link",)

    async def _hub_files(self) -> list[W.HubFile]:
        cached = self.f.plan.hub_files
        if cached:
            return list(cached)
        src = next((n for n, x in self.f.facts.items() if x.hub), None)
        if src is None:
            return []
        res = await self.r.read(src, hub_tree(self.f.o.model), timeout=60)
        files = W.parse_tree(res.stdout)
        self.f.update(hub_files=list(files))
        return files

    async def _verify_node(self, node: str, hub: list[W.HubFile], hashes: bool = False) -> W.Verdict:
        snap_root = f"{self.f.model_dir(node)}/snapshots"
        sizes = await self.r.read(node, _find_sizes(snap_root), timeout=120)
        broken = await self.r.read(node, _find_broken(snap_root), timeout=120)
        listing = {re.sub(r"^[0-9a-f]{40}/", "", p): s for p, s in W.parse_sizes(sizes.stdout).items()}
        bad_links = [re.sub(r"^.*/snapshots/[0-9a-f]{40}/", "", b) for b in broken.stdout.split("\n") if b.strip()]
        sums = None
        if hashes:
            # a file whose sha256 matched before (hashed as it landed, or by an earlier verify) and
            # whose size is still right is not read again (deploy-failures.md §3)
            known = {p: h for p, h in ((self.f.plan.weights_hashed or {}).get(node) or {}).items()
                     if any(f.path == p and f.size == listing.get(p) for f in hub)}
            files = [f.path for f in hub if f.sha256 and listing.get(f.path) == f.size and f.path not in known]
            rev_dir = next((p.split("/")[0] for p in W.parse_sizes(sizes.stdout) if "/" in p), "")
            sums = dict(known)
            if files and rev_dir:
                paths = [f"{snap_root}/{rev_dir}/{p}" for p in files]
                res = await self.r.read(node, command("sha256sum", *paths), timeout=3600)
                sums.update({k.split(f"/{rev_dir}/", 1)[-1]: v for k, v in W.parse_sha256sum(res.stdout).items()})
                good = {f.path: f.sha256 for f in hub if f.sha256 and sums.get(f.path) == f.sha256}
                if good.keys() - known.keys():
                    hashed = dict(self.f.plan.weights_hashed or {})
                    hashed[node] = {**known, **good}
                    self.f.update(weights_hashed=hashed)
        return W.compare(node, hub, listing, bad_links, sums)

    async def probe(self) -> str | None:
        hub = await self._hub_files()
        if not hub:
            return None
        verdicts = await self.r.on_all(self.f.nodes, lambda n: self._verify_node(n, hub))
        if all(v.complete for v in verdicts):
            return "already on every node: " + "; ".join(f"{v.node} {v.summary()}" for v in verdicts)
        return None

    def _source(self) -> str | None:
        done = self.f.plan.weights_ok or {}
        for n in self.f.nodes:
            if done.get(n):
                return n
        return next((n for n in self.f.nodes if self.f.fact(n).hub), None)

    def _copy_cmd(self, src: str, n: str, streamed: bool) -> RemoteCommand:
        """The copy to ``n``: beside a running download, each file as soon as it is whole (then a
        final pass); else one rsync."""
        f = self.f
        rsync = rsync_dir(f.model_dir(src), f.user_at(n), f.model_dir(n))
        if not streamed:
            return rsync
        return stream_copy(rsync, JobFiles.under(f.job_dir(src), "weights-download").rc)

    async def send(self) -> None:
        """The download where the weights are not whole yet, and a copy to every worker that lacks
        them, started beside the download (each file goes as soon as it is whole)."""
        f = self.f
        hub = await self._hub_files()
        if not hub:
            raise StepFailed("no node reaches the Hub, so the model's file list cannot be read",
                             "connect one node to the internet, or copy the weights by hand and --resume")
        src = self._source()
        if src is None:
            raise StepFailed("no node holds the weights and none reaches the Hub",
                             "copy the model to one node's HF cache, then --resume")
        v = await self._verify_node(src, hub)
        self._download: Job | None = None
        self._downloaded = 1.0
        if not v.complete:
            self._downloaded = 0.0
            self._download = await self.r.start_job(src, "weights-download", hf_download(f.o.model), f.job_dir(src))
        # the copies start now, beside the download: each file goes to the workers as soon as it is
        # whole, so the copy ends a pass after the download instead of a whole copy after it
        self._copies: dict[str, Job] = {}
        for n in f.nodes:
            if n == src or (await self._verify_node(n, hub)).complete:
                continue
            await self.r.change(n, mkdir_p(f.model_dir(n)), key=f"mkdir weights {n}")
            self._copies[n] = await self.r.start_job(src, f"weights-copy-{n}",
                                                     self._copy_cmd(src, n, self._download is not None),
                                                     f.job_dir(src))

    async def watch(self) -> None:
        """The download and the copies to their end; files hashed on the workers as they land; a
        fast link that goes down meanwhile is the operator's decision (wait, or back to network)."""
        f = self.f
        hub = await self._hub_files()
        src = self._source()
        assert src is not None  # send found one
        download, copies = self._download, self._copies
        ok = dict(f.plan.weights_ok or {})
        self._link_lock, self._link_back = asyncio.Lock(), set()
        copying = {n: asyncio.ensure_future(self.r.wait_job(job, lambda text, n=n: self._copy_progress(n, text)))
                   for n, job in copies.items()}
        self._copy_errors = {}
        hashing = asyncio.ensure_future(self._hash_as_they_land(hub, set(copies), copying))
        downloading = None
        try:
            if download is not None:
                downloading = asyncio.ensure_future(
                    self.r.wait_job(download, lambda text: self._download_progress(src, text)))
                await asyncio.wait({downloading, hashing}, return_when=asyncio.FIRST_COMPLETED)
                if hashing.done() and hashing.exception() is not None:
                    raise hashing.exception()  # type: ignore[misc]  # the fast link went down: back to network
                rc = await downloading
                self._downloaded = 1.0
                if rc != 0:
                    raise StepFailed(f"{src}: hf download ended with exit {rc}",
                                     "read the job's log; a re-run (--resume) keeps the finished files")
                v = await self._verify_node(src, hub)
                if not v.complete:
                    raise StepFailed(f"{src}: the download is incomplete: {v.summary()}",
                                     "--resume downloads the rest")
            ok[src] = True
            f.update(weights_ok=ok)
            for n in copying:
                rc = await copying[n]
                for _again in range(LINK_RETRIES):
                    if rc == 0 or not await self._link_check(n, ended=True):
                        break
                    # the link was down and is back: the copy starts again where it stopped (--partial)
                    job = await self.r.start_job(src, f"weights-copy-{n}", self._copy_cmd(src, n, False),
                                                 f.job_dir(src))
                    copying[n] = asyncio.ensure_future(
                        self.r.wait_job(job, lambda text, n=n: self._copy_progress(n, text)))
                    rc = await copying[n]
                if rc != 0:
                    raise StepFailed(f"copy to {n} ended with exit {rc}", "--resume continues it (--partial)")
            await hashing
        finally:
            tasks = [*copying.values(), hashing, *([downloading] if downloading is not None else [])]
            for task in tasks:
                task.cancel()  # a failure above: what runs on the nodes goes on (--resume re-attaches)
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _link_check(self, n: str, ended: bool = False) -> bool:
        """A copy to ``n`` failed (``ended``: the job itself; else one of its passes): read the nodes
        again. With the fast link fine, False (the failure was something else), unless the link
        went down and came back while the job ran (then an ended copy is started again: True).
        When it is down the operator decides: wait for it (the download goes on; the copy resumes
        where it stopped once the port is Up: True), or stop, which sends the flow back to the
        network step, where the fix is said. One check at a time: the hashing loop and the end of
        a copy can see the same outage."""
        async with self._link_lock:
            problems = await self._link_problems()
            if problems:
                await self._offer_to_wait(n, problems[0])  # returns once the link is back (adds n)
            if ended and n in self._link_back:
                self._link_back.discard(n)
                return True
            return bool(problems)

    async def _offer_to_wait(self, n: str, p: netenv.Problem) -> None:
        """The decision ``weights.link``: wait for the link (then the copy to ``n`` goes on), or stop
        (back to the network step, which says the fix)."""
        what = f"{(p.node + ': ') if p.node else ''}{p.what}"
        self.r.note(f"the copy to {n} failed: {what}", "error", node=n)
        src = self._source() or self.f.head
        measured = [what, f"copy to {n}: stopped (the cut file stays: rsync --partial)"]
        if self._downloaded < 1.0:
            measured.append(f"download on {src}: {self._downloaded:.0%}, going on (it does not use the fast link)")
        d = Decision("weights.link", self.id, "The fast link went down during the copy", tuple(measured),
                     (Option("wait", "wait for the link, then go on",
                             f"{p.fix}; the copy resumes where it stopped once the port is Up again"),
                      Option("stop", "stop here", "fix the link by hand; --resume copies the rest")),
                     "wait", "only the copy needs the fast link: a reseated cable costs minutes, a restart none of "
                     "the bytes already sent")
        answer = await self.r.decide(d)
        self.r.forget(d.id)  # asked again if the link goes down once more
        if answer == "stop":
            raise GoTo("network", f"the fast link changed during the copy to {n}: {p.what}")
        await self._wait_for_link(n, p.what)
        self._link_back.add(n)

    async def _link_problems(self) -> list[netenv.Problem]:
        facts = await self.f.recon(self.f.nodes)
        return [p for p in netenv.check_links([facts[x] for x in self.f.nodes if x in facts]) if p.kind != "mtu"]

    async def _wait_for_link(self, n: str, what: str) -> None:
        """Read the links every few polls until the fast link is back; past ``LINK_WAIT_S`` the
        flow goes back to the network step (which stops with the fix)."""
        speed = self.r.settings.speed
        started = time.monotonic()
        self.r.note(f"waiting for the fast link ({what}); the download goes on", "warning", node=n)
        while True:
            if self.r.cancelled:
                raise StepFailed("stopped by the operator while waiting for the fast link",
                                 "--resume checks the link and copies the rest")
            await asyncio.sleep(max(self.r.settings.poll_s * 5, 0.05))
            waited = (time.monotonic() - started) * speed
            if not await self._link_problems():
                self.r.note(f"the fast link is back after {waited:.0f} s: the copy to {n} goes on", node=n)
                return
            if waited > LINK_WAIT_S:
                raise GoTo("network", f"the fast link stayed down {waited:.0f} s during the copy to {n}: {what}")

    async def _hash_as_they_land(self, hub: list[W.HubFile], nodes: set[str],
                                 copying: dict[str, asyncio.Future[int]]) -> None:
        """Read-only, while the copies run: hash on each worker the files that arrived whole, so
        the final verify only reads the last ones (about a shard instead of the whole model); a
        copy pass that could not reach its worker has the links read again (:meth:`_link_check`)."""
        while any(not t.done() for t in copying.values()):
            await asyncio.wait(list(copying.values()), timeout=max(self.r.settings.poll_s, 0.05) * 5)
            for n in nodes:
                if copying[n].done():
                    continue
                if self._copy_errors.pop(n, None):
                    await self._link_check(n)
                await self._verify_node(n, hub, hashes=True)

    def _download_progress(self, node: str, text: str) -> None:
        last = re.split(r"[\r\n]", text.strip())[-1] if text.strip() else ""
        m = re.search(r"(\d+)%\|.*?\|\s*(\d+)/(\d+)", last)
        if m:
            self._downloaded = int(m.group(1)) / 100
            self.r.progress(node, "download", self._downloaded, last.strip()[-120:])

    _downloaded = 1.0  # while a download runs: its fraction (a copy beside it cannot be further)

    def __init__(self, flow: Flow) -> None:
        super().__init__(flow)
        self._copy_errors: dict[str, str] = {}  # a copy pass that failed, by worker: the link is read again
        self._download: Job | None = None
        self._copies: dict[str, Job] = {}

    def _copy_progress(self, node: str, text: str) -> None:
        last = text.strip().splitlines()[-3:]
        if any("rsync error" in x or "ssh: connect to host" in x for x in last):
            self._copy_errors[node] = last[-1]  # a pass failed: the link is read again
        for part in reversed(re.split(r"[\r\n]", text.strip())):
            m = re.match(r"\s*([\d,]+)\s+(\d+)%\s+(\S+)\s+(\S+)", part)
            if m:
                # a pass beside the download is at 100% of what was downloaded when it started
                self.r.progress(node, "copy", int(m.group(2)) / 100 * self._downloaded, part.strip())
                return

    async def verify(self) -> None:
        hub = await self._hub_files()
        verdicts = await self.r.on_all(self.f.nodes, lambda n: self._verify_node(n, hub, hashes=n != self._source()))
        bad = [v for v in verdicts if not v.complete]
        for v in verdicts:
            self.r.note(f"weights: {v.summary()}", "info" if v.complete else "error", node=v.node)
        if bad:
            raise StepFailed(f"{bad[0].node}: weights incomplete: {bad[0].summary()}",
                             "--resume copies what is missing (rsync -L --partial)")
        self.f.update(weights_ok={v.node: True for v in verdicts})


# ---- images ---------------------------------------------------------------------------------------

class Images(Step):
    id, title = "images", "The image on every node, with the same ID"

    def _missing(self) -> list[str]:
        return [n for n in self.f.nodes if self.f.fact(n).image(self.f.image) is None]

    async def probe(self) -> str | None:
        ids = await self._ids()
        if all(ids.get(n) for n in self.f.nodes) and len(set(ids.values())) == 1:
            return f"{self.f.image} is on every node ({next(iter(ids.values()))[:19]})"
        return None

    async def _ids(self) -> dict[str, str]:
        async def one(n: str) -> tuple[str, str]:
            res = await self.r.read(n, image_id(self.f.image), timeout=30)
            return n, res.stdout.strip() if res.ok else ""
        return dict(await self.r.on_all(self.f.nodes, one))

    async def send(self) -> None:
        """A pull where the node reaches the internet, else a copy from a node that has the image."""
        ids = await self._ids()
        have = [n for n, i in ids.items() if i]
        if not have:
            raise StepFailed(f"{self.f.image} is on no node", "go back to the engine step (--resume)")
        self._copies: dict[str, Job] = {}

        async def bring(n: str) -> None:
            if ids.get(n):
                return
            if self.f.fact(n).hub:
                res = await self.r.change(n, docker_pull(self.f.image), timeout=3600, key=f"pull {self.f.image} {n}")
                if not res.ok:
                    raise StepFailed(f"{n}: docker pull failed: {res.stderr.strip()[-300:]}")
                return
            key = f"image-copy-{n}-{hashlib.sha256(self.f.image.encode()).hexdigest()[:8]}"  # one job per image
            self._copies[n] = await self.r.start_job(have[0], key, image_copy(self.f.image, self.f.user_at(n)),
                                                     self.f.job_dir(have[0]))

        await asyncio.gather(*(bring(n) for n in self.f.nodes))

    async def watch(self) -> None:
        async def wait(n: str, job: Job) -> None:
            self.r.progress(n, "image", None, f"docker save | ssh {n} docker load")
            rc = await self.r.wait_job(job)
            if rc != 0:
                raise StepFailed(f"copying {self.f.image} to {n} ended with exit {rc}", "--resume tries again")

        await asyncio.gather(*(wait(n, job) for n, job in self._copies.items()))

    async def verify(self) -> None:
        ids = await self._ids()
        if not all(ids.values()) or len(set(ids.values())) != 1:
            desc = ", ".join(f"{n} {i[:19] or 'missing'}" for n, i in ids.items())
            raise StepFailed(f"image IDs differ or are missing: {desc}",
                             "use the same storage driver on every node (docker info) and copy again")
        self.r.note(f"{self.f.image}: the same ID {next(iter(ids.values()))[:19]} on every node")


# ---- free memory ----------------------------------------------------------------------------------

class FreeMemory(Step):
    id, title = "free-memory", "Free the memory the plan needs"
    decisions = ("free-memory.stop",)

    async def probe(self) -> str | None:
        return "the model is already served" if await self.f.serving() else None

    async def decide(self) -> None:
        f = self.f
        facts = await f.recon(f.nodes)  # fresh numbers: services kept serving while weights moved
        need = {n: int(v) for n, v in (f.plan.need or {}).items()}
        choices = {n: freeing.choose(facts[n], need.get(n, 0)) for n in f.nodes}
        measured = []
        for n, c in choices.items():
            held = freeing.container_bytes(facts[n])
            items = ", ".join(f"{k} {b / GIB:.1f} GiB" for k, b in sorted(held.items(), key=lambda kv: -kv[1]))
            measured.append(f"{n}: {c.available / GIB:.1f} GiB available, {c.need / GIB:.1f} GiB needed; "
                            f"running: {items or 'nothing'}; page cache {(facts[n].page_cache or 0) / GIB:.1f} GiB")
        rec_stops = [Stop(n, s) for n, c in choices.items() for s in c.stop]
        rec = ",".join(x.value for x in rec_stops) or "none"
        every = [Stop(n, s) for n in f.nodes for s in sorted(freeing.container_bytes(facts[n]))]
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
        f.update(stops=list(await self.r.choose(d)))

    async def send(self) -> None:
        for stop in self.f.plan.stops:
            n, name = stop.node, stop.name
            res = await self.r.change(n, docker_action("stop", name), key=f"stop {n} {name}")
            if not res.ok:
                raise StepFailed(f"{n}: docker stop {name} failed: {res.stderr.strip()[-200:]}")
            if not any(s.node == n and s.name == name for s in self.r.state.stopped):
                self.r.state.stopped.append(Stopped(n, "container", name))
                self.r.save()

    async def verify(self) -> None:
        facts = await self.f.recon(self.f.nodes)
        need = self.f.plan.need or {}
        for n in self.f.nodes:
            have = facts[n].mem_available or 0
            self.r.note(f"{have / GIB:.1f} GiB available (launch needs {int(need.get(n, 0)) / GIB:.1f})", node=n)
            if have < int(need.get(n, 0)):
                raise StepFailed(f"{n}: only {have / GIB:.1f} GiB available, {int(need[n]) / GIB:.1f} needed",
                                 "stop more services (--resume, answer free-memory.stop) or lower "
                                 "--gpu-memory-utilization")


# ---- caches ---------------------------------------------------------------------------------------

class Caches(Step):
    id, title = "caches", "Drop the page cache right before launch"
    decisions = ("caches.drop",)

    async def probe(self) -> str | None:
        return "the model is already served" if await self.f.serving() else None

    async def decide(self) -> None:
        facts = self.f.facts
        cache = {n: (facts[n].page_cache or 0) / GIB for n in self.f.nodes}
        d = Decision("caches.drop", self.id, "Drop the page cache on every node (sudo)",
                     tuple(f"{n}: {c:.1f} GiB of page cache" for n, c in cache.items()),
                     (Option("yes", "drop it now", "vLLM's start-up check counts only free memory"),
                      Option("no", "leave it", "the start may fail its free-memory check")),
                     "yes", "the weights just read and copied sit in the page cache, which vLLM does not count "
                     "as free (vllm#35313)")
        self.f.update(drop=await self.r.decide(d) == "yes")

    async def send(self) -> None:
        if self.f.plan.drop:
            await drop_page_cache(self.r, self.f.nodes)


async def drop_page_cache(r: Runner, nodes: list[str]) -> None:
    """``sync; echo 3 > drop_caches`` on ``nodes`` through the runner (shown, journaled)."""
    for n in nodes:
        res = await r.change(n, drop_caches())
        if not res.ok:
            raise StepFailed(f"{n}: dropping the page cache failed: {res.stderr.strip()[-200:]}",
                             "allow `sudo -n sh -c 'sync; echo 3 > /proc/sys/vm/drop_caches'` for this user")


# ---- cluster --------------------------------------------------------------------------------------

DOCKER_OPTS = ["--network", "host", "--ipc", "host", "--gpus", "all", "--device", "/dev/infiniband",
               "--ulimit", "memlock=-1", "--shm-size", "16g"]


class Cluster(Step):
    id, title = "cluster", "Ray head and workers, every GPU seen"
    decisions = ("cluster.executor",)
    _cpus = 0.0  # what the last `ray status` read counted

    async def decide(self) -> None:
        if self.f.engine == "sglang":
            self.f.update(executor="native")
            return
        d = Decision("cluster.executor", self.id, "How the nodes join: Ray or vLLM's native multi-node",
                     (f"{len(self.f.nodes)} nodes, TP={self.f.plan.tp}",),
                     (Option("ray", "Ray head and workers in containers", "what the story's working run used; "
                             "`ray status` proves every GPU joined before serving"),
                      Option("native", "vLLM native --nnodes/--node-rank/--headless", "no Ray; workers start first")),
                     self.f.o.executor or "ray", "Ray is what NVIDIA's playbook and the story's working run use")
        self.f.update(executor=await self.r.decide(d))

    def _ray_cmd(self, n: str) -> RemoteCommand:
        f = self.f
        ip = f.ip(n)
        if n == f.head:
            args = ["start", "--block", "--head", f"--node-ip-address={ip}", f"--port={RAY_PORT}"]
        else:
            args = ["start", "--block", f"--address={f.ip(f.head)}:{RAY_PORT}", f"--node-ip-address={ip}"]
        hf = f.fact(n).hf_dir
        return docker_run(f.container("ray"), f.image, options=self._options(n), entrypoint="ray", args=args,
                          env=f.env(n), mounts=[(hf, "/root/.cache/huggingface")],
                          summary=f"start the Ray {'head' if n == f.head else 'worker'} on {n}")

    def _options(self, n: str) -> list[str]:
        """DOCKER_OPTS as far as the node's hardware goes: the GPU only where recon read one, the
        RDMA devices and unlimited locked memory (for RDMA) only where it read an RDMA device. A
        node without them (a CPU-only host, the test lab) starts the same container without."""
        x = self.f.fact(n)
        drop = set()
        if not x.gpu:
            drop.add(("--gpus", "all"))
        if not any(lk.rdma for lk in x.links):
            drop |= {("--device", "/dev/infiniband"), ("--ulimit", "memlock=-1")}
        pairs = [(DOCKER_OPTS[i], DOCKER_OPTS[i + 1]) for i in range(0, len(DOCKER_OPTS), 2)]
        return [a for pair in pairs if pair not in drop for a in pair]

    def _gpus_wanted(self) -> int:
        """One GPU per node when every node has one; 0 when recon read none (Ray on CPUs only)."""
        return len(self.f.nodes) if all(self.f.fact(n).gpu for n in self.f.nodes) else 0

    async def _status(self) -> tuple[int, float]:
        res = await self.r.read(self.f.head, docker_exec(self.f.container("ray"), ["ray", "status"]), timeout=60,
                                quiet=True)
        st = parse_ray_status(res.stdout) if res.ok else None
        self._cpus = (st.cpus_total or 0.0) if st else 0.0
        return (st.active_nodes or 0, st.gpus_total or 0.0) if st else (0, 0.0)

    async def probe(self) -> str | None:
        if len(self.f.nodes) < 2:
            return "one node: no cluster to form"
        if await self.f.serving():
            return "the model is already served"
        if self.f.plan.executor == "ray" and any("-ray-" in s.name for s in self.r.state.started):
            nodes, gpus = await self._status()
            if nodes >= len(self.f.nodes) and gpus >= self._gpus_wanted():
                return f"Ray is up: {nodes} nodes, {gpus:g} GPUs"
        return None

    async def send(self) -> None:
        f = self.f
        if f.executor != "ray":
            self.r.note("native multi-node: the serve step starts one engine container per node, workers first")
            return
        name = f.container("ray")
        for n in f.nodes:
            # the name carries this deployment's id: a container of that name is ours (a run killed
            # between `docker run` and saving the state left it unrecorded)
            st = await self.f.inspect(n, name)
            ours = any(s.node == n and s.name == name for s in self.r.state.started)
            if st is not None and st.status == "running":
                if not ours:
                    self.r.state.started.append(Started(n, "container", name))
                    self.r.save()
                continue
            if st is not None and not st.missing:
                await self.r.change(n, docker_rm_force(name))
            res = await self.r.change(n, self._ray_cmd(n), timeout=300)
            if not res.ok:
                raise StepFailed(f"{n}: the Ray container did not start: {res.stderr.strip()[-300:]}",
                                 "check the port is free (ss -ltnp) and the image has Ray")
            if not ours:
                self.r.state.started.append(Started(n, "container", name, res.stdout.strip()[:64]))
                self.r.save()

    async def verify(self) -> None:
        if self.f.executor != "ray":
            return
        want = len(self.f.nodes)
        want_gpus = self._gpus_wanted()
        if not want_gpus:
            self.r.note("no GPU read on the nodes: Ray runs on their CPUs only (nothing can serve)", "warning")
        deadline = time.monotonic() + self.r.settings.ray_join_timeout_s / self.r.settings.speed
        nodes, gpus = 0, 0.0
        while time.monotonic() < deadline:
            nodes, gpus = await self._status()
            self.r.progress(self.f.head, "ray", min(1.0, nodes / want), f"{nodes}/{want} nodes, {gpus:g} GPUs")
            if nodes >= want and gpus >= want_gpus:
                self.r.note(f"ray status: {nodes} nodes, {gpus:g} GPUs, {self._cpus:g} CPUs")
                return
            await asyncio.sleep(self.r.settings.poll_s)
        raise StepFailed(f"Ray shows {nodes}/{want} nodes and {gpus:g} GPUs",
                         "a worker did not join: check the fast link (network step) and the Ray port 6379")


# ---- serve ----------------------------------------------------------------------------------------

class Serve(Step):
    id, title = "serve", "Start the engine and follow it to ready"
    decisions = ("serve.failure", "serve.hang")
    STATE_EVERY_POLLS = 3  # the engine's containers are read at least this often while the log moves

    def _vllm_args(self) -> list[str]:
        f = self.f
        pp = int(f.plan.pp or 1)
        args = [f.o.model, "--tensor-parallel-size", str(f.plan.tp or 1),
                *(["--pipeline-parallel-size", str(pp)] if pp > 1 else []),
                "--gpu-memory-utilization", str(f.plan.gmu or 0.85),
                "--max-model-len", str(f.plan.max_model_len or 65536),
                "--served-model-name", self.f.served_name, "--host", "0.0.0.0", "--port", str(f.o.port)]
        if f.plan.kv_cache_dtype == "fp8":
            args += ["--kv-cache-dtype", "fp8"]
        parser = f.o.reasoning_parser or ("qwen3" if "qwen3" in f.o.model.lower() else None)
        if parser:
            args += ["--reasoning-parser", parser]
        return args

    def _log(self) -> str:
        return f"{self.f.fact(self.f.head).hf_dir}/sparkconsole/{self.r.state.short_id}/serve.log"

    def _commands(self) -> list[tuple[str, RemoteCommand]]:
        f = self.f
        env = [("VLLM_ENGINE_READY_TIMEOUT_S", "3600")]
        if f.engine == "sglang":
            out = []
            for rank, n in reversed(list(enumerate(f.nodes))):
                args = ["-m", "sglang.launch_server", "--model-path", f.o.model, "--tp", str(f.plan.tp or 1),
                        "--nnodes", str(len(f.nodes)), "--node-rank", str(rank), "--dist-init-addr",
                        f"{f.ip(f.head)}:20000", "--host", "0.0.0.0", "--port", str(f.o.port),
                        "--mem-fraction-static", "0.70"]
                out.append((n, docker_run(f.container("sglang"), f.image, options=DOCKER_OPTS, entrypoint="python3",
                                          args=args, env=[*f.env(n), ("SGLANG_HOST_IP", f.ip(n))],
                                          mounts=[(f.fact(n).hf_dir, "/root/.cache/huggingface")],
                                          summary=f"start SGLang rank {rank} on {n}")))
            return out
        if f.executor == "single":
            return [(f.head, docker_run(f.container("vllm"), f.image, options=DOCKER_OPTS, args=self._vllm_args(),
                                        env=[*f.env(f.head), *env] if len(self.r.nodes) > 1 else env,
                                        mounts=[(f.fact(f.head).hf_dir, "/root/.cache/huggingface")],
                                        summary=f"start vLLM (TP=1) on {f.head}"))]
        if f.executor == "native":
            out = []
            for rank, n in reversed(list(enumerate(f.nodes))):
                args = [*self._vllm_args(), "--distributed-executor-backend", "mp", "--nnodes", str(len(f.nodes)),
                        "--node-rank", str(rank), "--master-addr", f.ip(f.head), "--master-port", "29501"]
                if rank:
                    args.append("--headless")
                out.append((n, docker_run(f.container("vllm"), f.image, options=DOCKER_OPTS, args=args,
                                          env=[*f.env(n), *env], mounts=[(f.fact(n).hf_dir, "/root/.cache/huggingface")],
                                          summary=f"start vLLM rank {rank} on {n}")))
            return out
        args = ["vllm", "serve", *self._vllm_args(), "--distributed-executor-backend", "ray"]
        return [(f.head, serve_in_container(f.container("ray"), args, "/root/.cache/huggingface/sparkconsole/"
                                            f"{self.r.state.short_id}/serve.log", env=env))]

    async def probe(self) -> str | None:
        if await self.f.serving():
            return f"already serving {self.f.served_name} on port {self.f.o.port}"
        return None

    async def send(self) -> None:
        f = self.f
        if f.executor == "ray" and f.engine == "vllm":
            await self.r.change(f.head, mkdir_p(f"{f.fact(f.head).hf_dir}/sparkconsole/{self.r.state.short_id}"),
                                key="mkdir serve log")
        for n, cmd in self._commands():
            key = f"serve {n} {self.r.state.steps.get('serve-attempt', '1')}"
            res = await self.r.change(n, cmd, timeout=300, key=key)
            if not res.ok:
                raise StepFailed(f"{n}: the engine did not start: {res.stderr.strip()[-300:]}")
            if cmd.argv[:2] == ("docker", "run") and res.stdout.strip():
                name = cmd.argv[cmd.argv.index("--name") + 1]
                if not any(s.node == n and s.name == name for s in self.r.state.started):
                    self.r.state.started.append(Started(n, "container", name, res.stdout.strip()[:64]))
                    self.r.save()

    async def watch(self) -> None:
        await self._follow()

    async def _follow(self) -> None:
        f = self.f
        tracker = VllmLogTracker()
        self._seen: list[str] = []
        offset = 0
        last_change = time.monotonic()
        deadline = time.monotonic() + self.r.settings.serve_timeout_s / self.r.settings.speed
        in_container = f.engine == "sglang" or f.executor in ("native", "single")
        polls = quiet = 0

        async def read_log() -> str:
            nonlocal offset, last_change
            if in_container:
                res = await self.r.read(f.head, command("docker", "logs", f.container(
                    "sglang" if f.engine == "sglang" else "vllm")), quiet=True)
                text = (res.stdout + res.stderr)[offset:]
                offset += len(text)
            else:
                res = await self.r.read(f.head, file_from(self._log(), offset), quiet=True)
                text = res.stdout if res.ok else ""
                offset += len(text.encode())
            if text:
                last_change = time.monotonic()
                self._seen.append(text)
                for line in text.splitlines():
                    tracker.feed(line)
                    if line.strip():
                        self.r.emit_output(f.head, line)
            return text

        while True:
            text = await read_log()
            polls += 1
            quiet = 0 if text else quiet + 1
            rep = tracker.report
            if rep.shards_total:
                self.r.progress(f.head, "weights", rep.shard_fraction,
                                f"{rep.shards_done}/{rep.shards_total} shards")
            if rep.state == "ready":
                self.r.note(f"ready: weights {rep.model_load_gib} GiB per node, KV cache {rep.kv_cache_gib} GiB "
                            f"({rep.kv_cache_tokens or '?'} tokens, {rep.max_concurrency or '?'}x concurrency)")
                self._calibrate()
                return
            if rep.state == "failed":
                self._calibrate()
                await self._failed(rep)
                return
            # the engine's containers: read when the log was quiet for a poll, and every few polls
            # (a worker's container can die while the head's log still moves)
            if quiet or polls % self.STATE_EVERY_POLLS == 0:
                death = await self._dead_container(tracker.report)
                if death is not None and death.kind not in exits.CONTAINER_KINDS:
                    await read_log()  # an ordinary exit: its last lines may name the cause
                    death = exits.classify(death.node, self._states[(death.node, death.container)], tracker.report,
                                           self._plan_figures())
                if death is not None:
                    quiet_s = (time.monotonic() - last_change) * self.r.settings.speed
                    self.r.note(f"{death.what}; the log had been quiet for {quiet_s:.0f} s", "error", death.node)
                    self._calibrate()
                    rep = tracker.report
                    from_log = rep.state == "failed" and death.kind not in exits.CONTAINER_KINDS
                    await self._failed(rep, None if from_log else death)
                    return
            idle = (time.monotonic() - last_change) * self.r.settings.speed
            if idle > self.r.settings.hang_after_s:
                await self._hung(idle)
                return
            if time.monotonic() > deadline:
                await self._timeout()
                return
            await asyncio.sleep(self.r.settings.poll_s)

    def _engine_containers(self) -> dict[str, list[str]]:
        """The containers this deployment starts for the engine, by node (their names carry the
        deployment's id): the Ray head and workers (vLLM runs in the head's), else one vLLM or SGLang
        container per node of the start (one on the head for a single-node start)."""
        f = self.f
        if f.engine == "sglang":
            return {n: [f.container("sglang")] for n in f.nodes}
        if f.executor == "single":
            return {f.head: [f.container("vllm")]}
        return {n: [f.container("ray" if f.executor == "ray" else "vllm")] for n in f.nodes}

    def _plan_figures(self) -> dict[str, Any]:
        need = (self.f.plan.need or {}).get(self.f.head)
        return {"tp": self.f.plan.tp, "gmu": self.f.plan.gmu, "max_model_len": self.f.plan.max_model_len,
                "need_gib": need / GIB if need else None}

    async def _dead_container(self, rep: Any) -> exits.ContainerDeath | None:
        """One ``docker inspect`` per node (at once) of the engine's containers; the first dead one
        (the head's first), classified with what the log says the engine was doing. A node that does
        not answer says nothing: unknown is not dead."""
        names = self._engine_containers()

        async def one(n: str) -> dict[str, exits.ContainerState]:
            res = await self.r.read(n, docker_state(*names[n]), timeout=30, quiet=True)
            if res.exit_status is None:
                return {}
            return exits.parse_states(res.stdout, res.stderr, names[n])

        got = await self.r.on_all(list(names), one)
        self._states = {(n, name): st for n, states in zip(names, got, strict=True) for name, st in states.items()}
        for n, states in zip(names, got, strict=True):
            for name in names[n]:
                st = states.get(name)
                death = exits.classify(n, st, rep, self._plan_figures()) if st is not None else None
                if death is not None:
                    return death
        return None

    def _calibrate(self) -> None:
        """Plan notes from the start's own figures (deploy/calibrate.py); kept for a re-plan."""
        try:
            spec = load_spec(self.f.o.model, offline=True)
        except Exception:
            return
        opts = PlanOptions(tp=int(self.f.plan.tp or 1), max_model_len=self.f.plan.max_model_len,
                           gpu_memory_utilization=float(self.f.plan.gmu or 0.85), force=True,
                           vllm_version=self.f.plan.vllm_version)  # the image's, as the engine step read it
        cal = serve_calibration(spec, "".join(getattr(self, "_seen", [])), opts)
        if cal is None:
            return
        for line in cal.lines:
            self.r.note(f"calibration: {line}")
        if cal.longest_len:
            self.f.update(calibrated_longest_len=cal.longest_len)

    async def _failed(self, rep: Any, death: exits.ContainerDeath | None = None) -> None:
        """A failed start, read from the log (``rep``) or from a dead container (``death``: killed,
        OOM-killed, crashed or removed while the log said nothing)."""
        kind = death.kind if death is not None else (rep.failure_kind or "other")
        back = {"oom": "plan", "unsupported_architecture": "engine", "nccl": "network", "ray": "cluster",
                "segfault": "engine"}.get(kind)
        proof = death.what if death is not None else rep.failure_line or ""
        advice = death.advice if death is not None else rep.advice or ""
        options = []
        layout_fits = bool(self.f.plan.plan_fits)
        if death is not None and kind in ("killed", "removed", "exited"):
            options.append(Option("again", "start again", "the engine's containers started afresh ("
                                  + ("the Ray cluster formed again, then vLLM" if self.f.executor == "ray"
                                     else "the same command")
                                  + ("; the page cache dropped again first" if self.f.plan.drop else "")
                                  + "): nothing in the log says the start was wrong"))
        if kind == "oom" and not layout_fits:
            options.append(Option("back-plan", "back to the plan: this layout does not fit",
                                  f"TP={self.f.plan.tp} was chosen against the plan's verdict; choose again"))
        elif kind == "oom":
            options.append(Option("shorter", "a shorter context and less memory", "--max-model-len halved, "
                                  "gmu 0.80: more room for the weights' peak"))
        if kind == "killed":
            options.append(Option("back-plan", "back to the plan: less memory per node", "if earlyoom or "
                                  "systemd-oomd killed it, the node was short of memory: choose a layout with room"))
        if back and all(o.value != f"back-{back}" for o in options):
            options.append(Option(f"back-{back}", f"back to the {back} step", advice))
        options.append(Option("stop", "stop here", "read the log and decide by hand"))
        seen = list(self.f.plan.failures or [])
        again = kind in seen  # the same failure twice: going back once more would not help
        rec = "stop" if again else options[0].value
        self.f.update(failures=[*seen, kind])
        measured = (proof[:300], advice) if death is None else (proof[:300], f"the log: {death.during}", advice)
        title = (f"The engine failed to start ({kind})" if death is None or "ready" not in death.during
                 else f"The engine stopped after it was ready ({kind})")
        d = Decision("serve.failure", self.id, title, measured, tuple(options), rec,
                     (f"the same {kind} failure again: going back once more would not help" if again
                      else advice or f"the log shows a {kind} failure"))
        answer = await self.r.decide(d)
        self.r.forget("serve.failure")
        await self._remove_started()
        if answer == "again":
            await self._start_again(kind)
        if answer == "shorter":
            halved = max(4096, int(self.f.plan.max_model_len or 65536) // 2)
            measured = self.f.plan.calibrated_longest_len
            self.f.update(max_model_len_override=int(measured) if measured and measured >= 4096 else halved)
            self.f.update(gmu_override=0.80)
            raise GoTo("plan", "less context and memory after an out-of-memory start")
        if answer.startswith("back-"):
            target = answer.removeprefix("back-")
            self.r.forget(*self.f.step(target).decisions)
            raise GoTo(target, f"{kind} failure")
        raise StepFailed(f"the engine failed ({kind}): {proof[:200]}", advice or "read the log")

    async def _start_again(self, kind: str) -> None:
        """After a container was killed or removed: over Ray, every Ray container of this deployment
        goes (a Ray worker whose head died does not rejoin a new one) and the cluster step forms it
        again; else the serve step starts its containers again. The page cache is dropped again first
        when the operator had it dropped before launch: the shards the killed start read sit there, and
        vLLM's start-up check counts only free memory (a retry failed it by 0.3-0.9 GiB on the demo)."""
        if self.f.plan.drop:
            await drop_page_cache(self.r, self.f.nodes)
        if self.f.executor == "ray" and self.f.engine == "vllm":
            for s in [s for s in self.r.state.started if s.name == self.f.container("ray")]:
                await self.r.change(s.node, docker_rm_force(s.name))
                self.r.state.started.remove(s)
            self.r.save()
            raise GoTo("cluster", f"start again after the engine's container was {kind}")
        raise GoTo("serve", f"start again after the engine's container was {kind}")

    async def _hung(self, idle: float) -> None:
        waits = int(self.f.plan.hang_waits or 0)
        rec = "vllm" if self.f.engine == "sglang" else "wait" if waits < 2 else "stop"
        why = ("SGLang's two-node NCCL start on GB10 stalls after 'CustomAllreduce is disabled'; vLLM over Ray "
               "worked in the same setup" if self.f.engine == "sglang" else
               "a cold start compiles kernels and can be quiet for long" if rec == "wait" else
               f"no progress after waiting {waits} times: read the engine's log")
        options = [Option("wait", "wait longer", "a cold start can be slow"), Option("stop", "stop here", "")]
        if self.f.engine == "sglang":
            options.insert(0, Option("vllm", "back to vLLM with Ray", "vLLM over Ray worked in the same setup"))
        d = Decision("serve.hang", self.id, "No progress: the start looks hung",
                     (f"no new log line for {idle:.0f} s ({self.f.engine}, {len(self.f.nodes)} nodes)",),
                     tuple(options), rec, why)
        answer = await self.r.decide(d)
        self.r.forget("serve.hang")
        if answer == "wait":
            self.f.update(hang_waits=waits + 1)
            return await self._follow()
        await self._remove_started()
        if answer == "vllm":
            self.r.preset("engine.image", next(k.ref for k in engines.KNOWN_IMAGES if k.engine == "vllm"))
            self.f.update(engine="vllm")
            self.f.update(executor="ray")
            raise GoTo("engine", "the SGLang start hung: back to vLLM")
        raise StepFailed("the engine start hung", "read the engine's log; NCCL needs both ranks")

    async def _timeout(self) -> None:
        raise StepFailed("the engine did not become ready in time",
                         "a cold start can take long: --resume keeps waiting (VLLM_ENGINE_READY_TIMEOUT_S is 3600)")

    async def _remove_started(self) -> None:
        """Remove the engine containers this attempt started (the Ray cluster stays) and count the
        attempt, so the next start is a new command and not one 'done before'."""
        self.r.state.steps["serve-attempt"] = str(int(self.r.state.steps.get("serve-attempt", "1")) + 1)
        names = [s for s in self.r.state.started if "-ray-" not in s.name]
        for s in names:
            await self.r.change(s.node, docker_rm_force(s.name))
            self.r.state.started.remove(s)
        self.r.save()


# ---- verify ---------------------------------------------------------------------------------------

CHAT_PROMPT = "What is 12*17? Answer with the number."


class Verify(Step):
    id, title = "verify", "Health, models, one chat completion"

    async def verify(self) -> None:
        f = self.f
        base = f"http://127.0.0.1:{f.o.port}"
        served = f.served_name
        health = await self.r.read(f.head, http_get(f"{base}/health", fail=True), timeout=30)
        if not health.ok:
            raise StepFailed(f"/health did not answer 200 (exit {health.exit_status})", "read the engine's log")
        models = await self.r.read(f.head, http_get(f"{base}/v1/models"), timeout=30)
        if f'"{served}"' not in models.stdout:
            raise StepFailed(f"/v1/models does not name {served}: {models.stdout[:200]}",
                             "another server holds the port? ss -ltnp")
        body = json.dumps({"model": served, "messages": [{"role": "user", "content": CHAT_PROMPT}],
                           "max_tokens": 512})
        t0 = time.monotonic()
        chat = await self.r.read(f.head, http_post_json(f"{base}/v1/chat/completions", body), timeout=600)
        wall = (time.monotonic() - t0) * self.r.settings.speed
        try:
            data = json.loads(chat.stdout)
            msg = data["choices"][0]["message"]
            tokens = int((data.get("usage") or {}).get("completion_tokens") or 0)
        except (ValueError, KeyError, IndexError, TypeError):
            raise StepFailed(f"the chat completion did not come back: {chat.stdout[:200] or chat.stderr[:200]}",
                             "read the engine's log") from None
        tps = tokens / wall if wall > 0 and tokens else None
        f.update(tokens_per_s=tps)
        answer = (msg.get("content") or "").strip().replace("\n", " ")
        reasoning = msg.get("reasoning_content") or msg.get("reasoning") or ""
        self.r.note(f"chat: {answer[:80]!r}; reasoning returned apart ({len(reasoning)} chars); "
                    f"{tokens} tokens" + (f", {tps:.1f} tok/s" if tps else ""))
        head = self.r.head
        self.r.state.endpoint = f"http://{head.host}:{f.o.port}/v1"
        self.r.note(f"endpoint {self.r.state.endpoint} (listening on {head.name}, all interfaces; from a laptop "
                    f"without a route to it: ssh -L {f.o.port}:localhost:{f.o.port} {head.host})")
        self.r.state.result = "served"
        self.r.save()


STEPS: list[type[Step]] = [Recon, Plan, Engine, Network, Weights, Images, FreeMemory, Caches, Cluster, Serve, Verify]
assert tuple(s.id for s in STEPS) == STEP_IDS


@dataclass
class Teardown:
    """Stops only what this deployment started (by name and id), checks they are gone, and offers the
    services it stopped back."""

    decisions: ClassVar[tuple[str, ...]] = ("teardown.restore",)
    flow: Flow
    restored: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    async def run(self) -> None:
        r = self.flow.r
        r.step = "teardown"
        r.set_step("teardown", "running")
        by_node: dict[str, list[str]] = {}
        for s in r.state.started:
            by_node.setdefault(s.node, []).append(s.name)
        for n, names in by_node.items():
            res = await r.change(n, docker_rm_force(*names))
            if not res.ok and "No such container" not in res.stderr:
                raise StepFailed(f"{n}: docker rm -f failed: {res.stderr.strip()[-200:]}")
        for n, names in by_node.items():
            ps = await r.read(n, command("docker", "ps", "-a", "--format", "{{json .}}"))
            left = {c.name for c in parse_docker_ps(ps.stdout)} & set(names)
            if left:
                raise StepFailed(f"{n}: still there after removal: {', '.join(sorted(left))}")
        r.state.started = []
        r.save()
        if r.state.stopped:
            d = Decision("teardown.restore", "teardown", "Start the services this deployment stopped again",
                         tuple(f"{s.node}: {s.name}" for s in r.state.stopped),
                         (Option("yes", "start them again", "they ran before the deployment"),
                          Option("no", "leave them stopped", "")), "yes", "put the nodes back as they were")
            if await r.decide(d) == "yes":
                # the page cache the model's weights left would fail the services' own start-up memory check
                for n in dict.fromkeys(s.node for s in r.state.stopped):
                    await r.change(n, drop_caches())
                for s in list(r.state.stopped):
                    cmd = (docker_action("start", s.name) if s.kind == "container"
                           else systemctl_action("start", s.name))
                    res = await r.change(s.node, cmd)
                    if res.ok:
                        self.restored.append(f"{s.node}:{s.name}")
                        r.state.stopped.remove(s)
                        r.save()
                await asyncio.sleep(20 / r.settings.speed)  # a vLLM start fails its memory check within seconds
                for item in self.restored:
                    n, name = item.split(":", 1)
                    st = await self.flow.inspect(n, name)
                    if st is not None and st.status != "running":
                        self.failed.append(item)
                        r.note(f"{name} did not stay up after its start ({st.status or 'gone'}): read its log "
                               f"(docker logs {name})", "error", node=n)
        r.state.result = "torn-down"
        r.state.endpoint = None
        r.set_step("teardown", "done")
