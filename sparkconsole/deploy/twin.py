"""The twin file: everything a read-only look at a real cluster read, as one JSON document.

A rehearsal (:mod:`sparkconsole.deploy.rehearsal`) reads the operator's cluster without changing it
and writes this file; :func:`sparkconsole.sim.twin.build_twin` turns it into a simulated cluster that
the demo's SSH servers serve (``sparkconsole demo --twin FILE``, ``deploy --demo --twin FILE``), so
the whole deployment can run there first. An operator may attach the file to a bug report: it holds
what recon read per node (:class:`~sparkconsole.deploy.recon.NodeFacts`: users, sudo, tools, memory
and who holds it, containers, images, links, MTU, GID indexes, the Hub's reachability, versions) and
what the plan-only walk found (the model's files on the Hub, where its weights already are), and no
secret: a Hugging Face token is recorded as present or not, never its value; :func:`check_no_secret`
refuses to write a document that carries anything shaped like a token or key.

Plain data, free of Textual and of the simulator (the layer rule).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkconsole.deploy.recon import NodeFacts
from sparkconsole.durable import replace_file
from sparkconsole.errors import UserError
from sparkconsole.schema import (
    BYTES_MAX,
    MAX_NODES,
    PRINTABLE,
    Bool,
    Checker,
    Int,
    Json,
    ListOf,
    MapOf,
    NodeId,
    Num,
    Record,
    Str,
    load_json,
    read_capped,
)

TWIN_FORMAT = "sparkconsole-twin"
TWIN_VERSION = 1

# what a secret looks like, wherever it might hide in node text: Hugging Face tokens (hf_ and 30+
# characters), OpenAI-style keys (sk-), and the key this tool makes for a served endpoint (scak-)
SECRET_SHAPES = re.compile(r"\b(?:hf_[A-Za-z0-9]{30,}|sk-[A-Za-z0-9_-]{20,}|scak-[A-Za-z0-9_-]{16,})")


class TwinError(UserError):
    """A twin file that cannot be read (exit 2, one line)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, exit_code=2)


# What a twin file may hold. It is read as a stranger's file (it travels with bug reports and can be
# edited by hand): each value is checked here before the simulator computes with it or starts a
# server for it, so a bad one is one line (exit 2), not a TypeError, an OverflowError or 300 SSH
# listeners. The limits are far beyond any Spark cluster's reading.
MAX_TWIN_BYTES = 16 << 20
MAX_TWIN_DEPTH = 32
_TEXT = Str(max_len=4096)
_OPT = Str(nullable=True, max_len=4096)
_BYTES = Int(0, BYTES_MAX, nullable=True)
_ID = Int(0, (1 << 32) - 1, nullable=True)
_PORT = Int(0, 65535, nullable=True)
_MANY = 4096
_REPO_PATH = r"(?!/)(?!(?:.*/)?\.\.(?:/|$))[^\x00-\x1f\x7f-\x9f]+"

NODE_FACTS_SPEC = Record({
    "node": NodeId, "reachable": Bool(), "reason": _TEXT, "gpu": _OPT, "driver": _OPT, "cuda": _OPT,
    "mem_total": _BYTES, "mem_available": _BYTES, "page_cache": _BYTES,
    "user": Str(nullable=True, max_len=64, pattern=r"[^\s/:\x00-\x1f\x7f-\x9f]+",
                says="a user name (no space, '/', ':' or control character)"),
    "uid": _ID, "gid": _ID, "groups": ListOf(Str(max_len=256), max_items=256),
    "sudo": Str(nullable=True, choices=("all", "drop-caches", "none")),
    "tools": MapOf(Bool(required=True), max_items=64, key=Str(max_len=64)),
    "home": _OPT, "hf_home": _OPT, "disk_free": _BYTES, "disk_mount": _OPT, "docker": _OPT, "kernel": _OPT,
    "storage_driver": _OPT, "image_store": _OPT,
    "images": ListOf(Record({"ref": Str(required=True, max_len=1024), "id": Str(required=True, max_len=256),
                             "digest": _OPT, "size": Str(nullable=True, max_len=64)}), max_items=_MANY),
    "containers": ListOf(Record({"name": _OPT, "image": _OPT, "state": _OPT, "status": _OPT, "mem": _BYTES,
                                 "cpu": Num(0, 1e6, nullable=True)}), max_items=_MANY),
    "holders": ListOf(Record({"kind": Str(required=True, choices=("container", "process", "unit")),
                              "name": Str(required=True, max_len=4096), "bytes": Int(0, BYTES_MAX, required=True),
                              "detail": _TEXT, "running": Bool()}), max_items=_MANY),
    "links": ListOf(Record({"rdma": Str(required=True, max_len=256), "netdev": Str(required=True, nullable=True,
                                                                                   max_len=64),
                            "up": Bool(required=True), "port": Int(0, 65535, required=True, nullable=True),
                            "ipv4": ListOf(Str(max_len=64), max_items=64), "mtu": Int(0, 1 << 20, nullable=True),
                            "gid_v2_index": Int(0, 65535, nullable=True), "admin_down": Bool()}), max_items=64),
    "hub": Bool(), "hub_detail": _TEXT, "token": Bool(),
    "listeners": ListOf(Record({"port": Int(0, 65535, required=True), "address": Str(required=True, max_len=256),
                                "process": _OPT, "pid": _ID, "container": _OPT}), max_items=_MANY),
    "read_at": Num(0, 1e12),
})

TWIN_SPEC = Record({
    "format": Str(required=True), "version": Int(0, 1 << 31, required=True),
    "cluster": Str(required=True, max_len=128, pattern=PRINTABLE, says="a name of at most 128 printable characters"),
    "model": Str(required=True, max_len=256, pattern=r"[A-Za-z0-9][A-Za-z0-9._-]*(?:/[A-Za-z0-9._-]+)?",
                 says="a model id (owner/name)"),
    "read_at": Num(0, 1e12, required=True),
    "nodes": ListOf(NODE_FACTS_SPEC, min_items=1, max_items=MAX_NODES, required=True),
    "weights": MapOf(Bool(required=True), max_items=MAX_NODES, key=NodeId),
    "hub_files": ListOf(Record({"path": Str(required=True, max_len=1024, pattern=_REPO_PATH,
                                            says="a file's path in the repository (no '..', not absolute)"), "size": Int(0, BYTES_MAX, required=True),
                                "sha256": Str(nullable=True, max_len=128)}), max_items=100_000),
    "measured": MapOf(Num(0, 1e15, nullable=True), max_items=64, key=Str(max_len=64, pattern=r"[a-z0-9_]+")),
    "not_checked": ListOf(Str(max_len=4096), max_items=1024),
    "model_config": MapOf(Json(), max_items=4096),
})


@dataclass
class HubFileFacts:
    """One file of the model's repository as the Hub listed it (path and size)."""

    path: str
    size: int
    sha256: str | None = None  # an LFS file's (the Hub's lfs.oid)


@dataclass
class Twin:
    """The cluster as read: per node its facts, and what the walk learnt about the model."""

    cluster: str
    model: str
    read_at: float
    nodes: list[NodeFacts]
    # node -> whether the model's weights were whole in its HF cache (the weights step's reading)
    weights: dict[str, bool] = field(default_factory=dict)
    hub_files: list[HubFileFacts] = field(default_factory=list)
    # bytes per second measured without writing (None: not measured; the twin then uses its defaults)
    measured: dict[str, float | None] = field(default_factory=dict)
    # what the read-only walk could not check (running an image, say), with what a real run does
    not_checked: list[str] = field(default_factory=list)
    # the model's config.json as the Hub serves it (public: what the planner read), so a twin can
    # stand in for a model outside the simulator's catalogue
    model_config: dict[str, Any] = field(default_factory=dict)

    def node(self, name: str) -> NodeFacts:
        return next(n for n in self.nodes if n.node == name)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": TWIN_FORMAT, "version": TWIN_VERSION, "cluster": self.cluster, "model": self.model,
            "read_at": self.read_at, "nodes": [n.to_json() for n in self.nodes], "weights": dict(self.weights),
            "hub_files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in self.hub_files],
            "measured": dict(self.measured), "not_checked": list(self.not_checked),
            "model_config": dict(self.model_config),
        }

    @classmethod
    def from_json(cls, data: Any, source: str = "twin") -> Twin:
        if not isinstance(data, dict) or data.get("format") != TWIN_FORMAT:
            raise TwinError(f"{source}: not a sparkconsole twin file (no \"format\": \"{TWIN_FORMAT}\")")
        if data.get("version") != TWIN_VERSION:
            raise TwinError(f"{source}: twin format version {data.get('version')!r}; this sparkconsole reads "
                            f"version {TWIN_VERSION}")
        if not data.get("nodes") and isinstance(data.get("nodes"), list):
            raise TwinError(f"{source}: the twin has no node")
        Checker(source, TwinError).check(data, TWIN_SPEC)
        try:
            nodes = [NodeFacts.from_json(n) for n in data["nodes"]]
            twin = cls(cluster=str(data["cluster"]), model=str(data["model"]), read_at=float(data["read_at"]),
                       nodes=nodes, weights={str(k): bool(v) for k, v in (data.get("weights") or {}).items()},
                       hub_files=[HubFileFacts(str(f["path"]), int(f["size"]),
                                               None if f.get("sha256") is None else str(f["sha256"]))
                                  for f in data.get("hub_files") or []],
                       measured={str(k): (None if v is None else float(v))
                                 for k, v in (data.get("measured") or {}).items()},
                       not_checked=[str(x) for x in data.get("not_checked") or []],
                       model_config=dict(data.get("model_config") or {}))
        except (KeyError, TypeError, ValueError) as exc:
            raise TwinError(f"{source}: a field is missing or of the wrong kind ({type(exc).__name__}: {exc})") from None
        if not nodes:
            raise TwinError(f"{source}: the twin has no node")
        names = [n.node for n in nodes]
        if len(set(names)) != len(names):
            raise TwinError(f"{source}: two nodes share a name")
        return twin


def check_no_secret(text: str) -> None:
    """Refuse a document carrying something shaped like a token or key (it would leave the machine
    with a bug report): recon records a token's presence only, so this never fires unless node text
    itself held one (a container named after a key, a listener's command line)."""
    m = SECRET_SHAPES.search(text)
    if m:
        raise UserError(f"the twin would hold something shaped like a secret ({m.group(0)[:5]}…): not written",
                        exit_code=1)


def dumps(twin: Twin) -> str:
    text = json.dumps(twin.to_json(), indent=1, default=str)  # a config value JSON lacks: as its text
    check_no_secret(text)
    return text + "\n"


def save(twin: Twin, path: str | Path) -> Path:
    """Write the twin whole (never half a file); a file that cannot be written is one line, exit 1."""
    return write_json_file(Path(path).expanduser(), dumps(twin), "the twin")


def write_json_file(out: Path, text: str, what: str) -> Path:
    """``text`` as ``out`` (its folder made), whole or not at all (:func:`durable.replace_file`), mode
    0600; an error is said in one line."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        return replace_file(out, text.encode())
    except OSError as exc:
        raise UserError(f"{what} could not be written to {out} ({exc.strerror or exc})", exit_code=1) from None


def load(path: str | Path) -> Twin:
    """The twin file at ``path``, checked whole (:data:`TWIN_SPEC`) before anything is built from it:
    its size before it is read, its nesting before it is parsed; else one line, exit 2."""
    p = Path(path).expanduser()
    text = read_capped(p, MAX_TWIN_BYTES, "twin file", TwinError)
    data = load_json(text, str(p), max_depth=MAX_TWIN_DEPTH, error=TwinError)
    return Twin.from_json(data, source=str(p))
