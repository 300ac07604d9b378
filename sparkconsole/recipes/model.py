"""The one typed recipe every community format is read into, and the error a bad file gives.

Three formats are shared by DGX Spark users (sparkrun, eugr v1, Spark Pulse v2). Each reader in
this package turns its format into the same :class:`Recipe`, so the planner, the deploy engine
and the UI never care which format a recipe came in.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from sparkconsole.errors import UserError

Format = Literal["sparkrun", "eugr-v1", "spark-pulse-v2"]
Distributed = Literal["native", "ray", "single"]
Origin = Literal["bundled", "user", "file"]

# The engines the console knows how to start. Anything else (trtllm, atlas, a typo) is listed
# but "cannot run here".
RUNNABLE_ENGINES = ("vllm", "sglang", "llama-cpp")


class RecipeError(UserError):
    """A recipe file that cannot be used: one line naming the file and, where known, the key."""


@dataclass(frozen=True)
class Measurement:
    """A speed the field published for this recipe (or one close to it): where and how."""

    tok_s: float
    concurrency: int | None = None
    setup: str | None = None
    source: str | None = None


@dataclass(frozen=True)
class Provenance:
    """Where a recipe comes from and what is known about its image, read from its ``metadata``
    map. Free data: nothing here changes how the recipe runs. ``None`` is "not stated"."""

    source: str | None = None
    description: str | None = None
    vllm_version: str | None = None
    cuda: str | None = None
    arch: tuple[str, ...] = ()
    measured: tuple[Measurement, ...] = ()
    notes: str | None = None


@dataclass(frozen=True)
class Recipe:
    """One way to serve one model, whatever format it was written in.

    ``name`` is the file's stem in every format (sparkrun's rule, and the name both sparkrun and
    eugr's ``run-recipe.py`` look recipes up by); a format's own human-readable ``name`` field is
    ``title``. ``command`` is the rendered serve command as argv; ``serve_args`` is the part of it
    beyond model, tp, pp, gpu-memory-utilization, max-model-len, port, host and the distributed
    executor backend, in order (those are fields of their own, so a deploy can set them).
    """

    name: str
    path: str
    format: Format
    model: str
    engine: str
    image: str | None
    tp: int
    pp: int
    min_nodes: int
    max_nodes: int | None
    gpu_memory_utilization: float | None
    max_model_len: int | None
    port: int | None
    host: str | None
    serve_args: tuple[str, ...]
    command: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict, hash=False)
    mods: tuple[str, ...] = ()
    distributed: Distributed = "single"
    provenance: Provenance = field(default_factory=Provenance)
    title: str | None = None
    description: str | None = None
    origin: Origin = "file"

    @property
    def nodes(self) -> int:
        """Sparks the recipe needs: one GPU per Spark, so tp × pp (never below ``min_nodes``)."""
        return max(self.tp * self.pp, self.min_nodes)

    def cannot_run_here(self, nodes: int | None) -> str | None:
        """One line saying why the console cannot run this recipe on a cluster of ``nodes``
        Sparks (``None``: size unknown, not checked), or ``None`` when nothing stands in the way.

        The console applies no mods yet: a mod patches the engine inside the container before it
        serves (eugr recipes/README.md, mods/*), and serving without it fails, so any mod is a
        reason.
        """
        reasons = []
        if self.engine not in RUNNABLE_ENGINES:
            reasons.append(f"engine '{self.engine}' is not one the console runs ({', '.join(RUNNABLE_ENGINES)})")
        if self.mods:
            more = f" (+{len(self.mods) - 1} more)" if len(self.mods) > 1 else ""
            reasons.append(f"needs mod {self.mods[0]}{more}, and the console applies no mods")
        if not self.image:
            reasons.append("names no container image")
        if nodes is not None and nodes < self.nodes:
            reasons.append(f"needs {self.nodes} Sparks (tp {self.tp} × pp {self.pp}), the cluster has {nodes}")
        return "; ".join(reasons) or None

    def to_json(self, nodes: int | None = None) -> dict[str, Any]:
        """Plain JSON data (lists for tuples), with ``nodes`` and ``cannot_run_here`` added."""
        data = asdict(self)
        data["nodes"] = self.nodes
        data["cannot_run_here"] = self.cannot_run_here(nodes)
        return data
