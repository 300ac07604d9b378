"""The engine protocol: everything the console knows of one kind of inference server, in one place.

An engine (vLLM, SGLang, llama.cpp's ``llama-server``) is one module in this package holding one
object that satisfies :class:`EngineKind`. Code elsewhere asks the object (``engine.label``,
``engine.recognise(argv)``, ``engine.launches(...)``) instead of comparing a name with a string, so
adding a third engine touches this package and nothing else. The objects are plain data and pure
functions: no I/O, no Textual (they are used by the probe, the deploy engine and the UI alike).

An engine's log is part of it too: :meth:`EngineKind.log_tracker` gives a reader of its log (its
module under :mod:`sparkconsole.logs`), which fills the report every engine shares
(:class:`~sparkconsole.logs.report.LogReport`: phases, figures, a failure class from
:attr:`EngineKind.failure_kinds`), and :meth:`EngineKind.advise` words a failure. The deploy wizard's
serve and canary steps and the log screen take the tracker from the engine, never from a name.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from sparkconsole.logs.report import LogReport, LogTracker

Executor = Literal["single", "native", "ray"]


@dataclass(frozen=True)
class MetricNames:
    """The ``/metrics`` sample names an engine exposes, by the console's field, preferred first
    (the later ones are older releases' names)."""

    scalars: dict[str, tuple[str, ...]] = field(default_factory=dict)
    histograms: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: label that carries the served model's name, the older releases' one after it
    model_labels: tuple[str, ...] = ("model_name",)
    #: the engine computes its own decode rate (a gauge) where a counter's rate is not to be had
    rate_gauge: str | None = None


@dataclass(frozen=True)
class ServeSpec:
    """What to serve, in the engine's neutral terms: the plan's numbers and the flags a recipe (or
    the console's defaults) adds. ``extra_args`` are the engine's own flags, passed as they are."""

    model: str
    served_name: str
    host: str
    port: int
    tp: int = 1
    pp: int = 1
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    kv_cache_dtype: str | None = None
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodeLaunch:
    """One process an engine starts on one node (rank 0 serves the API): the container's
    entrypoint, its arguments, the variables it needs beyond the cluster's, and a line for the
    operator."""

    rank: int
    entrypoint: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    summary: str = ""


class EngineKind(Protocol):
    """What every engine module offers (see the package docstring)."""

    #: the name recipes, the state file and ``--json`` use ("vllm", "sglang", "llama-cpp")
    name: str
    #: the name people read ("vLLM")
    label: str
    #: where the server listens when its command line says nothing
    default_port: int
    default_host: str
    metrics_path: str
    metrics: MetricNames
    #: the Python module whose ``__version__`` the image check reads (None: not a Python engine)
    version_module: str | None
    #: the image's command that starts the server (its entrypoint in a launch)
    entrypoint: str
    #: its console scripts: a shell or a Python running one of these runs this engine
    scripts: tuple[str, ...]
    #: how it spans nodes: "single", and "native" (its own multi-node) and/or "ray"
    executors: tuple[Executor, ...]
    #: the port its ranks meet on in a native multi-node start (None: single node only)
    rendezvous_port: int | None
    #: what listens on the rendezvous port, in words ending in ", " ("" when nothing to add)
    rendezvous_what: str
    #: it takes an API key from its environment (vLLM's ``VLLM_API_KEY``), never from argv
    api_key_env: str | None
    #: variables every start of it needs (beyond the cluster's network environment)
    launch_env: tuple[tuple[str, str], ...]
    #: a stall the field reports for it, in words (None: none known)
    known_hang: str | None
    #: it takes the console's ``--reasoning-parser``
    takes_reasoning_parser: bool
    #: the deploy wizard's canary serves a miniature of the model with this engine before the weights
    #: move (:mod:`sparkconsole.deploy.steps.canary`); False: its start is checked at serve time only
    canary: bool
    #: what the engine serves to anyone, whatever its API key: (paths that run the model, paths that read
    #: its tokenizer or state, control paths); None where it is not known
    keyless_paths: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]] | None
    #: the benchmark tool its own image carries (sparkconsole.serving.bench.TOOLS), or None
    bench_tool: str | None
    #: its own flags for a recipe's neutral fields (``-c`` → max_model_len), beyond the shared long ones
    recipe_flags: dict[str, str]
    #: repository names (the last part of an image's repo) whose tags are this engine's version
    image_repos: tuple[str, ...]
    #: the failure classes its log tracker tells apart (``LogReport.failure_kind``; "other" last)
    failure_kinds: tuple[str, ...]

    def log_tracker(self) -> LogTracker | None:
        """A new reader of this engine's log: its phases (loading, KV cache, ready), its figures and
        its failure, as a :class:`~sparkconsole.logs.report.LogReport`. None: the console does not
        read this engine's log (a log screen shows it as plain text; a start cannot be followed)."""
        ...

    def advise(self, report: LogReport) -> str | None:
        """The next step for a failure its tracker read, in plain words (None when it did not fail)."""
        ...

    def recognise(self, argv: Sequence[str]) -> tuple[list[str], str | None] | None:
        """``(the server's own arguments, the positional model or None)`` when ``argv`` (past
        wrappers such as ``env`` and ``nohup``) starts this engine's server, else None."""
        ...

    def served_model(self, opts: dict[str, str], positional: str | None) -> str | None:
        """The name the server reports for its model, from its parsed options."""
        ...

    def launches(self, spec: ServeSpec, executor: Executor, nodes: Sequence[tuple[str, str]]) -> list[NodeLaunch]:
        """The processes that serve ``spec`` over ``nodes`` (``(name, address)``, the head
        first), workers first, the head (rank 0) last."""
        ...


def positional(args: Sequence[str]) -> str | None:
    """``vllm serve MODEL …``: the model is the first argument when it is not an option."""
    return args[0] if args and not args[0].startswith("-") else None
