"""The deployment plan: what the steps decided and measured, as one typed record in the state file.

The steps used to pass their results through about 27 string keys (``put("tp", …)``,
``get("gmu")``), where nothing said which step wrote what and a misspelt key read as ``None``.
Here every field is named and typed once, with the step that writes it; a step reads and writes
attributes (``flow.plan.tp``, ``flow.update(tp=2)``), and a name that does not exist fails at once.

The payloads of structured decision options live here too: a :class:`Layout` (the plan step's
answer) and a :class:`Stop` (a service the free-memory step stops).
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field
from typing import Any

from sparkconsole.deploy.weights import HubFile


@dataclass(frozen=True)
class Layout:
    """How the model is laid out over the nodes: the plan step's answer (``tp2``, ``tp2-fp8kv``,
    ``tp2-ctx65536``, ``tp1-pp3``)."""

    tp: int
    pp: int = 1
    kv_cache_dtype: str = "auto"
    max_model_len: int | None = None  # a shorter context than the config's, when the option says so

    @property
    def value(self) -> str:
        """The answer's words (``--answer plan.layout=…``)."""
        text = f"tp{self.tp}" + (f"-pp{self.pp}" if self.pp > 1 else "")
        if self.kv_cache_dtype == "fp8":
            text += "-fp8kv"
        if self.max_model_len:
            text += f"-ctx{self.max_model_len}"
        return text


@dataclass(frozen=True)
class Stop:
    """A running service on a node that the free-memory step stops (``node:name`` in an answer)."""

    node: str
    name: str

    @property
    def value(self) -> str:
        return f"{self.node}:{self.name}"


def parse_stops(answer: str) -> list[Stop]:
    """``"spark-1a32:vllm-glm,spark-1a32:reranker"`` or ``"none"`` → the stops; an item without a
    node is left out (the decision's check has said what it accepts)."""
    if answer.strip() == "none":
        return []
    stops = []
    for item in answer.split(","):
        node, sep, name = item.strip().partition(":")
        if sep and node and name:
            stops.append(Stop(node, name))
    return stops


@dataclass(frozen=True)
class ImageChoice:
    """The engine step's answer: which engine serves, from which image."""

    engine: str  # vllm | sglang
    ref: str


@dataclass
class DeploymentPlan:
    """Every result a step hands to a later one, by the step that writes it."""

    # plan: the layout and the memory figures it rests on
    tp: int | None = None
    pp: int = 1
    gmu: float | None = None
    max_model_len: int | None = None
    kv_cache_dtype: str = "auto"
    plan_fits: bool = True
    # --language-model-only: the vision tower is not loaded (plan.text-only); None: not asked
    language_model_only: bool | None = None
    plan_vllm_version: str | None = None  # the vLLM whose rules the plan used
    max_concurrency: float | None = None  # requests of max_model_len tokens the KV cache holds at once
    need: dict[str, int] = field(default_factory=dict)  # bytes free each node must have at launch
    # a failed start asks for less next time (serve → plan)
    gmu_override: float | None = None
    max_model_len_override: int | None = None
    # engine
    engine: str | None = None
    image: str | None = None
    image_id: str = ""
    vllm_version: str | None = None  # the image's own, once the engine step has read it
    engine_checks: dict[str, dict[str, Any]] = field(default_factory=dict)
    # canary: {"ok", "key" (the image and flags it proved), "summary"} or the failure's
    # {"ok": False, "failed_key", "phase", "error"}
    canary: dict[str, Any] = field(default_factory=dict)
    # network
    set_mtu: int | None = None
    # weights
    hub_files: list[HubFile] = field(default_factory=list)
    weights_hashed: dict[str, dict[str, str]] = field(default_factory=dict)  # node → path → sha256 that matched
    weights_ok: dict[str, bool] = field(default_factory=dict)
    # free memory, caches
    stops: list[Stop] = field(default_factory=list)
    drop: bool = False
    # cluster
    executor: str | None = None
    # serve
    access: str | None = None  # who may use the endpoint: api-key | local | open (serve.access)
    calibrated_longest_len: int | None = None
    failures: list[str] = field(default_factory=list)
    hang_waits: int = 0
    # verify
    tokens_per_s: float | None = None
    # benchmark
    benchmark: bool = False  # the operator asked for one (benchmark.run)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DeploymentPlan:
        """A plan from the state file; keys it does not know are left out (a newer file, a removed
        field), and a state written before the plan was typed keeps the same keys in ``facts``."""
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in data.items() if k in names and v is not None}
        kw["hub_files"] = [x if isinstance(x, HubFile) else HubFile(**x) for x in kw.get("hub_files") or []]
        kw["stops"] = [_stop(x) for x in kw.get("stops") or []]
        return cls(**kw)

    def update(self, **changes: Any) -> None:
        """Set fields by name; a name the plan does not have is a bug, said at once."""
        names = {f.name for f in dataclasses.fields(self)}
        wrong = sorted(set(changes) - names)
        if wrong:
            raise AttributeError(f"the deployment plan has no field {', '.join(wrong)}")
        for k, v in changes.items():
            setattr(self, k, v)


def _stop(x: Any) -> Stop:
    if isinstance(x, Stop):
        return x
    if isinstance(x, dict):
        return Stop(str(x["node"]), str(x["name"]))
    node, name = x  # a state written before: [node, name]
    return Stop(str(node), str(name))
