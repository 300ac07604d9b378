"""What a deployment's steps share: the options asked for, the runner, what recon read and the plan.

:class:`Flow` is the steps' one collaborator: the nodes the deployment spans (the head and as many
workers as the layout needs), their facts as recon read them, the typed
:class:`~sparkconsole.deploy.deployment_plan.DeploymentPlan` the steps fill in, and the names a
deployment gives what it starts on the nodes (containers, job folders). The steps themselves are
listed in :mod:`sparkconsole.deploy.steps`.

Nothing here is fixed to two nodes or one model: the head is the configured head, every other
node is a worker, and the model comes from the options (the default is the story's
Qwen/Qwen3.5-122B-A10B-FP8).
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparkconsole.deploy import exits, netenv
from sparkconsole.deploy.deployment_plan import DeploymentPlan
from sparkconsole.deploy.recon import NodeFacts, facts_from_output, recon_command
from sparkconsole.deploy.runner import Runner, StepFailed
from sparkconsole.errors import UserError
from sparkconsole.planner.spec import ModelSpec, load_spec, spec_from_hub_files
from sparkconsole.remote import (
    api_key_path,
    docker_state,
    http_get,
    http_get_keyed,
    hub_file,
)
from sparkconsole.serving import engines as engine_kinds
from sparkconsole.serving.engines import EngineKind

if TYPE_CHECKING:
    from sparkconsole.deploy.steps.base import Step
    from sparkconsole.recipes import Recipe

GIB = 1 << 30
DEFAULT_MODEL = "Qwen/Qwen3.5-122B-A10B-FP8"
API_PORT = 8000
RECON_TIMEOUT_S = 20.0  # a node that does not answer its recon within this is named unreachable


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
    #: the engine's own flags beyond what the plan sets (a recipe's); None: the bundled recipe's for
    #: this model and engine, if there is one (:func:`default_flags`)
    extra_args: list[str] | None = None
    recipe: str | None = None  # the recipe the options came from (its name), for the record
    gmu: float | None = None  # a recipe's gpu-memory-utilization: the plan takes it as given

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_recipe(cls, recipe: Recipe, **given: Any) -> Options:
        """What a recipe asks for, where the command line (``given``, None: not said) says nothing.

        The flags the console sets itself are taken out of the recipe's: ``--served-model-name``
        becomes the served name (verify asks the engine for it), and an ``--api-key`` on a command
        line is refused outright (``ps`` shows it to every user of the node; the console gives the
        key in the engine's environment)."""
        args = list(recipe.serve_args)
        served = None
        if "--api-key" in args or any(a.startswith("--api-key=") for a in args):
            raise UserError(f"recipe {recipe.name}: --api-key on a command line is visible to every user of the node; "
                            "take it out (the deployment's access decision sets a key through the environment)")
        for i, a in enumerate(args):
            if a == "--served-model-name" and i + 1 < len(args):
                served = args[i + 1]
                del args[i:i + 2]
                break
            if a.startswith("--served-model-name="):
                served = a.partition("=")[2]
                del args[i]
                break
        executor = {"native": "native", "ray": "ray"}.get(recipe.distributed)
        picked = {"model": recipe.model, "engine": recipe.engine, "executor": executor, "image": recipe.image,
                  "tp": recipe.tp, "max_model_len": recipe.max_model_len, "served_name": served,
                  "extra_args": args, "recipe": recipe.name, "gmu": recipe.gpu_memory_utilization}
        picked.update({k: v for k, v in given.items() if v is not None})
        return cls(**picked)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Options:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


@functools.lru_cache(maxsize=16)
def default_flags(model: str, engine: str) -> tuple[tuple[str, ...], str | None]:
    """The engine flags the field runs a model with, when the operator named no recipe: the first
    bundled recipe for this model and engine (tool calling and prefix caching for Qwen3.5: every
    field recipe for it has them; without, an agent's tool calls come back as text and every turn
    is prefilled again). Its numbers are not taken, only its flags; ``((), None)`` when none. Kept
    once per model and engine: the bundled files do not change while the console runs, and the serve
    step asks for its launches several times."""
    from sparkconsole.recipes import RecipeError, bundled_recipes

    try:
        found = next((r for r in bundled_recipes() if r.model == model and r.engine == engine), None)
    except RecipeError:
        return (), None
    if found is None:
        return (), None
    return tuple(Options.from_recipe(found).extra_args or ()), found.name


def model_dir_name(model: str) -> str:
    owner, name = model.split("/", 1)
    return f"models--{owner}--{name}"


class Flow:
    """What the steps share: the runner, the options, and everything read or decided so far."""

    def __init__(self, runner: Runner, options: Options) -> None:
        self.runner = runner
        self.options = options
        # bundled or cached: known at once; else read from the Hub in recon (find_spec), never refused
        # up front as "not bundled and not cached, and offline" (a model `plan` had never seen)
        self._spec: ModelSpec | None = None
        try:
            self._spec = load_spec(options.model, offline=True)
        except UserError as exc:
            self._spec_missing = str(exc)
        self._facts: dict[str, NodeFacts] = {}
        self._facts_of: object = None
        from sparkconsole.deploy.steps import STEPS  # the steps import this module: at call time
        from sparkconsole.deploy.teardown import Teardown

        self.steps: list[Step] = [cls(self) for cls in STEPS]
        runner.declared = {s.id: s.decisions for s in self.steps} | {"teardown": Teardown.decisions}

    @property
    def spec(self) -> ModelSpec:
        """The model's spec (config and checkpoint facts): the planner's arithmetic needs it."""
        if self._spec is None:
            raise StepFailed(f"{self.options.model}: its config could not be read ({self._spec_missing})",
                             "give a node or this laptop a route to the Hub, or run `sparkconsole plan MODEL` "
                             "where the Hub is reached; then --resume")
        return self._spec

    async def find_spec(self) -> None:
        """The spec from the Hub when it was neither bundled nor cached: from this laptop as ``plan``
        reads it (config and safetensors headers), else through a node recon found online (config and
        the safetensors index, with the node's token for gated repos); cached either way."""
        if self._spec is not None:
            return
        try:
            self._spec = await asyncio.to_thread(load_spec, self.options.model, False)
            return
        except UserError as exc:
            laptop = str(exc)
        node = next((n for n, f in self.facts.items() if f.hub), None)
        if node is None:
            self._spec_missing = f"{laptop}; and no node reaches the Hub"
            return
        cfg = await self.runner.read(node, hub_file(self.options.model, "config.json"), timeout=60)
        if not cfg.ok:
            self._spec_missing = f"{laptop}; through {node}: {(cfg.stderr.strip() or 'no config.json')[-200:]}"
            return
        idx = await self.runner.read(node, hub_file(self.options.model, "model.safetensors.index.json"), timeout=60)
        try:
            self._spec = spec_from_hub_files(self.options.model, cfg.stdout, idx.stdout if idx.ok else None, node)
        except UserError as exc:
            self._spec_missing = str(exc)

    def step(self, step_id: str) -> Step:
        """The step of that id (a failed start names the step to go back to)."""
        return next(s for s in self.steps if s.id == step_id)

    # -- facts --------------------------------------------------------------------------------
    @property
    def facts(self) -> dict[str, NodeFacts]:
        """What recon read, parsed once per read (recon stores a new mapping each time it reads)."""
        raw = self.runner.state.facts.get("nodes", {})
        if self._facts_of is not raw:
            self._facts = {n: NodeFacts.from_json(d) for n, d in raw.items()}
            self._facts_of = raw
        return self._facts

    def fact(self, node: str) -> NodeFacts:
        return self.facts[node]

    @property
    def plan(self) -> DeploymentPlan:
        """What the steps decided and measured so far (typed; kept in the state file)."""
        return self.runner.state.plan

    def update(self, **changes: Any) -> None:
        """Set plan fields by name (a name the plan lacks fails at once) and save the state."""
        self.plan.update(**changes)
        self.runner.save()

    @property
    def head(self) -> str:
        return self.runner.head.name

    @property
    def nodes(self) -> list[str]:
        """The nodes this deployment spans: the head and as many workers as TP needs."""
        n = int(self.plan.tp or self.options.tp or len(self.runner.nodes)) * int(self.plan.pp or 1)
        names = [self.head] + [x.name for x in self.runner.nodes if x.name != self.head]
        return names[:max(1, n)]

    def ip(self, node: str) -> str:
        ip = self.fact(node).fast_ip()
        if ip is None:
            raise StepFailed(f"{node}: no fast-link address", "see the network step")
        return ip

    def user_at(self, node: str) -> str:
        """``user@fast-ip`` of ``node`` for node-to-node ssh, rsync and ``docker load``: the login
        user recon read there (``id -un``), else the inventory's; never an assumed ``root`` (DGX OS
        logs in as the user made at first boot, and NVIDIA's playbooks set keys up for it)."""
        user = self.fact(node).user or self.runner.config.node(node).user
        if not user:
            raise StepFailed(f"{node}: its login user is not known", "recon reads it with `id -un`: --resume")
        return f"{user}@{self.ip(node)}"

    def job_dir(self, node: str) -> str:
        return f"{self.fact(node).job_dir_base}/{self.runner.state.short_id}"

    def model_dir(self, node: str) -> str:
        return f"{self.fact(node).hf_dir}/hub/{model_dir_name(self.options.model)}"

    @property
    def image(self) -> str:
        return str(self.plan.image or self.options.image or "")

    @property
    def engine(self) -> str:
        return str(self.plan.engine or self.options.engine)

    @property
    def extra_args(self) -> list[str]:
        """The engine's own flags beyond the plan's: the recipe's, else the bundled recipe's for this
        model and engine (:func:`default_flags`)."""
        if self.options.extra_args is not None:
            return list(self.options.extra_args)
        return list(default_flags(self.options.model, self.engine)[0])

    @property
    def engine_kind(self) -> EngineKind:
        """The chosen engine's object (:mod:`sparkconsole.serving.engines`): what it takes, how it starts."""
        return engine_kinds.get(self.engine)

    @property
    def executor(self) -> str:
        """``single`` (one node: the image's own entrypoint, no Ray), else the answer: ray | native."""
        if len(self.nodes) < 2:
            return "single"
        return str(self.plan.executor or self.options.executor or "ray")

    def container(self, role: str) -> str:
        return f"sparkconsole-{role}-{self.runner.state.short_id}"

    def env(self, node: str) -> list[tuple[str, str]]:
        """The node's own network environment, and the Hub switched off: the engines start only after
        the weights step verified every file on every node (it stops the flow otherwise), so they
        need nothing from the Hub, and a worker without internet would otherwise wait out a Hub
        timeout on every file it opens (sparkrun sets both once weights are local)."""
        env = netenv.node_env(self.fact(node), self.ip(self.head))
        return [*env, ("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1")] if env else env

    async def inspect(self, node: str, name: str) -> exits.ContainerState | None:
        """One container's state on ``node`` (``docker inspect``, read-only); ``missing`` when docker
        knows no such container, None when the node or docker did not answer."""
        res = await self.runner.read(node, docker_state(name), timeout=30, quiet=True)
        if res.exit_status is None:
            return None
        return exits.parse_states(res.stdout, res.stderr, [name]).get(name)

    async def serving(self) -> bool:
        """The head already answers /v1/models with this deployment's served name. The head's API key
        goes along when it has one (an engine started with a key answers /v1 with 401 without it; one
        without a key ignores the header), so a keyed engine is known as serving on a resume."""
        url = f"http://127.0.0.1:{self.options.port}/v1/models"
        key = self.api_key_file if self.head in self.facts else None
        res = await self.runner.read(self.head, http_get_keyed(url, key) if key else http_get(url), quiet=True)
        return res.ok and f'"{self.served_name}"' in res.stdout

    @property
    def api_key_file(self) -> str:
        """Where the head keeps the served endpoint's API key (its login user's home, as recon read it)."""
        return api_key_path(self.fact(self.head).home or "/root")

    @property
    def served_name(self) -> str:
        return self.options.served_name or self.options.model.split("/", 1)[1].lower()

    async def recon(self, nodes: list[str] | None = None) -> dict[str, NodeFacts]:
        """Read every node (concurrently; one that did not answer, once more) and keep what was read."""
        names = nodes or [n.name for n in self.runner.nodes]

        async def one(node: str) -> NodeFacts:
            res = await self.runner.read(node, recon_command(self.options.model), timeout=RECON_TIMEOUT_S)
            if res.exit_status is None and not res.stdout:
                return NodeFacts(node=node, reachable=False, reason=res.stderr.strip() or "no answer")
            return facts_from_output(node, res.stdout)

        got = await self.runner.on_all(names, one)
        missed = [f.node for f in got if not f.reachable]
        if missed:  # a busy node may miss one read: read it once more (recon changes nothing)
            again = {f.node: f for f in await self.runner.on_all(missed, one)}
            got = [again.get(f.node, f) for f in got]
        stored = dict(self.runner.state.facts.get("nodes", {}))
        for f in got:
            stored[f.node] = f.to_json()
        self.runner.state.facts["nodes"] = stored
        self.runner.save()
        return {f.node: f for f in got}
