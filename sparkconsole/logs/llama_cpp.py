"""llama.cpp server-log reader: what a ``llama-server`` is doing, read from its log.

A small reader: llama-server says little about its start, and the console reads only what it says
plainly. Its lines, from its source (ggml-org/llama.cpp, file@commit):

- ``SRV_INF`` prints ``"srv  %12.*s: "`` then the message, the function's name right-aligned in 12
  columns (tools/server/server-common.h@006639c3ff51), so ``main``'s lines read
  ``srv          main: …``; older servers printed ``main: …`` (``LOG_INF("%s: …", __func__)``);
- ``loading model``, then ``model loaded`` once the weights and the KV cache are in memory, or
  ``exiting due to model loading error``; then ``server is listening on http://HOST:PORT``, after
  which it answers (tools/server/server.cpp@00dd0816129a). Older servers ended that line with
  `` - starting the main loop``;
- CUDA's out-of-memory (ggml's ``allocating %.2f MiB on device %d: cudaMalloc failed: out of memory``,
  ggml/src/ggml-cuda/ggml-cuda.cu): ``oom``.

Phases: ``starting`` → ``loading weights`` → ``ready``; failure classes ``oom`` and ``other``.
"""

from __future__ import annotations

import re

from sparkconsole.logs.envelope import CUDA_OOM, CUDA_OOM_WORDS, holds
from sparkconsole.logs.report import PHASE_API_SERVER, PHASE_LOADING, LogReport
from sparkconsole.logs.tracker import PhaseTracker

FAILURE_KINDS: tuple[str, ...] = ("oom", "other")

_MAIN = r"^(?:srv +)?main: "
_LOADING = re.compile(_MAIN + r"loading model$")
_LOADED = re.compile(_MAIN + r"model loaded$")
_LISTENING = re.compile(
    _MAIN + r"server is listening on (?P<url>(?P<scheme>https?)://(?P<host>\[[^\]\s]+\]|[^:\s/]+):(?P<port>\d{1,5}))"
)
_EXIT = re.compile(_MAIN + r"exiting due to (?:model loading|HTTP server) error")
_WORDS = ("main: ",)
_OOM = re.compile(CUDA_OOM, re.I)


class LlamaCppLogTracker(PhaseTracker):
    """Incremental llama-server log reader: ``feed`` lines as they come, read ``report`` any time."""

    label = "llama.cpp"

    def _read(self, msg: str) -> None:
        text = msg.strip()
        if holds(text, _WORDS):
            if _LOADING.match(text):
                self._to_loading()
                self._enter_phase(PHASE_LOADING)
                return
            if _LOADED.match(text):
                self._to_loading()
                self._enter_phase(PHASE_API_SERVER)
                return
            m = _LISTENING.match(text)
            if m:
                self._v["port"] = int(m.group("port"))
                self._v["listen_url"] = m.group("url")
                self._to_ready()
                return
            if _EXIT.match(text):
                self._fail("other", text, specific=False)
                return
        if holds(text.lower(), CUDA_OOM_WORDS) and _OOM.search(text):
            self._fail("oom", text, specific=True)

    def _advise(self, report: LogReport) -> str | None:
        return advise(report)


def advise(report: LogReport) -> str | None:
    """A plain-words next step for a failed llama-server start (``None`` when it did not fail)."""
    if report.failure_kind is None:
        return None
    if report.failure_kind == "oom":
        return ("Out of memory while loading: lower --ctx-size (the KV cache), offload fewer layers "
                "(-ngl), pick a smaller quantization, or stop other models on the node.")
    return ("llama-server could not load the model: the lines above the failure say why (a missing or "
            "damaged GGUF file, an unknown architecture for this build).")


__all__ = ["FAILURE_KINDS", "LlamaCppLogTracker", "advise"]
