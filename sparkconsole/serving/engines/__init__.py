"""The engines the console knows, one module each behind :class:`~.base.EngineKind`.

``ENGINES`` is the registry: adding an engine is a module here and one entry below. Everything
else asks :func:`get` (by the name a recipe or the state file holds) or :func:`recognise` (which
engine a command line starts) and then the object, never compares names.
"""

from __future__ import annotations

from collections.abc import Sequence

from sparkconsole.serving.engines.base import (
    EngineKind,
    Executor,
    LogTracker,
    MetricNames,
    NodeLaunch,
    ServeSpec,
)
from sparkconsole.serving.engines.llama_cpp import LLAMA_CPP
from sparkconsole.serving.engines.sglang import SGLANG
from sparkconsole.serving.engines.vllm import VLLM

ENGINES: dict[str, EngineKind] = {e.name: e for e in (VLLM, SGLANG, LLAMA_CPP)}
#: the engine a deployment uses unless a recipe or the operator says otherwise
DEFAULT = VLLM


def get(name: str) -> EngineKind:
    """The engine called ``name``; KeyError names the ones there are."""
    try:
        return ENGINES[name]
    except KeyError:
        raise KeyError(f"unknown engine {name!r} (known: {', '.join(ENGINES)})") from None


def known(name: str | None) -> EngineKind | None:
    return ENGINES.get(name or "")


def recognise(argv: Sequence[str]) -> tuple[EngineKind, list[str], str | None] | None:
    """Which engine ``argv`` starts (past no wrappers: :mod:`sparkconsole.serving.discover` strips
    them), with its own arguments and positional model; None when none does."""
    for engine in ENGINES.values():
        hit = engine.recognise(argv)
        if hit is not None:
            return engine, *hit
    return None


def script_names() -> frozenset[str]:
    """Every engine's console-script name (``vllm``, ``sglang``, ``llama-server``): a shell or a
    Python running one of these runs that engine."""
    return frozenset(s for e in ENGINES.values() for s in e.scripts)


def for_image(image: str | None) -> EngineKind | None:
    """The engine an image's repository name says it holds (``…/vllm-openai``, ``…/sglang``), or None."""
    if not image:
        return None
    repo = image.rsplit(":", 1)[0] if ":" in image.rsplit("/", 1)[-1] else image
    last = repo.rsplit("/", 1)[-1]
    return next((e for e in ENGINES.values() if last in e.image_repos or e.name in last), None)


__all__ = ["DEFAULT", "ENGINES", "LLAMA_CPP", "SGLANG", "VLLM", "EngineKind", "Executor", "LogTracker", "MetricNames", "NodeLaunch",
           "ServeSpec", "for_image",
           "get", "known", "recognise", "script_names"]
