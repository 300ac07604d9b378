"""The last step every format shares: a filled command plus the recipe's declarations become
one :class:`Recipe`, with the node count, the distributed mode and the provenance worked out once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkconsole.recipes.bounded import fail
from sparkconsole.recipes.command import RAY_FLAG, RenderError, fold, read_command
from sparkconsole.recipes.fields import Fields
from sparkconsole.recipes.model import Format, Measurement, Origin, Provenance, Recipe


@dataclass
class Parts:
    """What a format reader hands over: its own fields already checked, the command filled."""

    name: str
    label: str
    format: Format
    model: str
    engine: str
    image: str | None
    command: str
    command_key: str  # the key the command came from, for errors ("command", "engines.vllm.args")
    env: dict[str, str] = field(default_factory=dict)
    mods: tuple[str, ...] = ()
    min_nodes: int | None = None
    max_nodes: int | None = None
    solo_only: bool = False
    cluster_only: bool = False
    solo_key: str = "solo_only"
    ray: bool | None = None  # None: read the command's --distributed-executor-backend
    title: str | None = None
    description: str | None = None
    metadata: Fields | None = None


def provenance(meta: Fields | None, description: str | None) -> Provenance:
    """The ``metadata`` map's free facts (the console's own keys; a registry's other metadata keys,
    such as sparkrun's VRAM estimates, are left alone)."""
    if meta is None or not meta.data:
        return Provenance(description=description)
    image = meta.mapping("image")
    arch = image.data.get("arch")
    if isinstance(arch, str):
        arch_list: tuple[str, ...] = (arch,)
    else:
        arch_list = image.text_list("arch")
    measured = []
    raw = meta.data.get("measured")
    if raw is not None and not isinstance(raw, list):
        raise meta.error("measured", "must be a list of {tok_s, concurrency, setup, source}")
    for i, item in enumerate(raw or []):
        if not isinstance(item, dict):
            raise meta.error(f"measured[{i}]", "must be a mapping")
        m = Fields(item, meta.label, meta.key(f"measured[{i}]"))
        tok = item.get("tok_s")
        if isinstance(tok, bool) or not isinstance(tok, int | float) or tok <= 0:
            raise m.error("tok_s", "must be a positive number")
        measured.append(Measurement(float(tok), m.integer("concurrency"), m.text("setup"), m.text("source")))
    version = image.data.get("vllm")
    cuda = image.data.get("cuda")
    for k, v in (("vllm", version), ("cuda", cuda)):
        if v is not None and not isinstance(v, str | int | float):
            raise image.error(k, "must be a version string")
    return Provenance(
        source=meta.text("source"),
        description=meta.text("description") or description,
        vllm_version=None if version is None else str(version),
        cuda=None if cuda is None else str(cuda),
        arch=arch_list,
        measured=tuple(measured),
        notes=meta.text("notes"),
    )


def assemble(p: Parts, origin: Origin = "file") -> Recipe:
    try:
        read = read_command(fold(p.command), p.engine)
    except RenderError as exc:
        raise fail(p.label, p.command_key, str(exc)) from None
    tp, pp = read.tp or 1, read.pp or 1
    if p.solo_only and p.cluster_only:
        raise fail(p.label, p.solo_key, "and cluster_only are both true")
    min_nodes = max(p.min_nodes or 1, 2 if p.cluster_only else 1, tp * pp)
    max_nodes = 1 if p.solo_only else p.max_nodes
    if max_nodes is not None and max_nodes < min_nodes:
        key = p.solo_key if p.solo_only else "max_nodes"
        raise fail(p.label, key, f"allows {max_nodes} node(s), but the recipe needs {min_nodes} "
                   f"(tp {tp} × pp {pp}{', cluster_only' if p.cluster_only else ''})")
    # the format's own rule where it has one (eugr and Spark Pulse drop the flag), else the command's
    ray = p.ray if p.ray is not None else (read.backend == "ray" or bool(RAY_FLAG.search(p.command)))
    distributed = "single" if tp * pp == 1 and min_nodes == 1 else "ray" if ray else "native"
    return Recipe(
        name=p.name,
        path=p.label,
        format=p.format,
        model=p.model,
        engine=p.engine,
        image=p.image,
        tp=tp,
        pp=pp,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        gpu_memory_utilization=read.gmu,
        max_model_len=read.max_model_len,
        port=read.port,
        host=read.host,
        serve_args=read.serve_args,
        command=read.argv,
        env=dict(p.env),
        mods=p.mods,
        distributed=distributed,
        provenance=provenance(p.metadata, p.description),
        title=p.title,
        description=p.description,
        origin=origin,
    )
