"""SGLang server-log reader: what a ``python -m sglang.launch_server`` is doing, read from its log.

The console feeds it the lines of ``docker logs -f`` as they come (:class:`SglangLogTracker`); the
report is every engine's (:class:`~sparkconsole.logs.report.LogReport`), so the deploy wizard and
the log screen read an SGLang start as they read a vLLM one. Every line below is SGLang's own, read
from its source (sgl-project/sglang, file@commit):

- the record: ``configure_logger`` formats ``[%(asctime)s{maybe_ms}{prefix}] %(message)s`` with
  ``datefmt="%Y-%m-%d %H:%M:%S"`` (python/sglang/srt/utils/common.py@004f0c7a8d39); the prefix names
  a scheduler's ranks, `` DP{n}``, `` PP{n}``, `` ATTN_CP{n}``, `` MOE_DP{n}``, `` TP{n}``, `` EP{n}``
  (python/sglang/srt/managers/scheduler.py@0003215cf146, ``configure_scheduler_process``); no level
  name is printed;
- ``server_args=ServerArgs(model_path='…', …)``: the launch, logged once by the launching process;
- ``Load weight begin. avail mem=%.2f GB`` and ``Load weight end. elapsed=%.2f s, type=…, [quant, ]avail
  mem=%.2f GB, mem usage=%.2f GB.`` (python/sglang/srt/model_executor/model_runner.py@0005834cdb2a;
  the 0.2 era printed ``Load weight end. type=…, dtype=…, avail mem=%.2f GB`` and no usage,
  model_runner.py@01cc04e2b5b0). SGLang's "GB" is ``bytes / (1 << 30)`` (``get_available_gpu_memory``),
  a GiB;
- ``KV Cache is allocated. #tokens: N, K size: %.2f GB, V size: %.2f GB`` (``MHATokenToKVPool``; an
  MLA model's pool prints ``KV size: %.2f GB``), with ``GB = 1024 * 1024 * 1024``
  (python/sglang/srt/mem_cache/memory_pool.py@000ccdba94d4);
- ``Capture cuda graph begin. This can take up to several minutes.`` (model_runner.py@01cc04e2b5b0);
- ``Uvicorn running on http://HOST:PORT (Press CTRL+C to quit)``: uvicorn's, once it listens
  (encode/uvicorn uvicorn/server.py@00c1280cf93b, ``_log_started_message``);
- ``The server is fired up and ready to roll!``: logged after the warmup request answered
  (python/sglang/srt/entrypoints/http_server.py@0025436eab05, ``_wait_and_warmup``). uvicorn's
  ``Application startup complete.`` comes before the warmup, so it is not readiness here;
- failures: ``Scheduler hit an exception: Traceback …`` (scheduler.py@0003215cf146,
  ``run_scheduler_process``), then the launcher's ``Received sigquit from a child process. It
  usually means the child failed.``, ``Rank N scheduler died during initialization (exit code: …)``
  and ``Initialization failed. Please see the error messages above.``
  (python/sglang/srt/entrypoints/engine.py@001067fffe33); ``Initialization failed. warmup error: …``
  (http_server.py@0025436eab05); ``Not enough memory. Please try to increase
  --mem-fraction-static.`` (model_runner.py@01cc04e2b5b0).

Failure classes: ``oom`` (CUDA's out-of-memory messages, SGLang's "Not enough memory"), ``nccl``
(NCCL and torch.distributed between the ranks), ``other`` (the last line of the traceback, the
exception, when no rule names it; a symptom alone when no traceback came). The first root cause wins.
After ``ready``, a traceback alone (a request that failed) does not end the server; a scheduler's
exception does (the scheduler is the server).
"""

from __future__ import annotations

import re

from sparkconsole.logs.envelope import (
    BARE_EXCEPTION,
    CUDA_OOM,
    CUDA_OOM_WORDS,
    NCCL_FAILURE,
    NCCL_WORDS,
    TRACEBACK,
    holds,
)
from sparkconsole.logs.report import (
    PHASE_API_SERVER,
    PHASE_CUDA_GRAPHS,
    PHASE_KV_CACHE,
    PHASE_LOADING,
    PHASE_STARTING,
    LogReport,
)
from sparkconsole.logs.tracker import PhaseTracker

FAILURE_KINDS: tuple[str, ...] = ("oom", "nccl", "other")

# the record's header: "[2026-05-15 08:39:36 TP0] ", the milliseconds with SGLANG_LOG_MS
_HEADER = re.compile(
    r"\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d{3})?(?: (?:DP|PP|ATTN_CP|MOE_DP|TP|EP)\d{1,5}){0,6}\] ?"
)
# uvicorn's records behind the header: "INFO:     Uvicorn running on …"
_LEVEL = re.compile(r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL):\s+")

_LAUNCH = re.compile(r"^server_args=ServerArgs\(")
_MODEL_PATH = re.compile(r"\bmodel_path='(?P<m>[^']{1,1000})'")
_DIST_BEGIN = re.compile(r"^Init torch distributed begin\.")
_LOAD_BEGIN = re.compile(r"^Load weight begin\. avail mem=(?P<gib>\d+(?:\.\d+)?) GB")
_LOAD_END = re.compile(r"^Load weight end\.")
_ELAPSED = re.compile(r"\belapsed=(?P<sec>\d+(?:\.\d+)?) s\b")
_MEM_USAGE = re.compile(r"\bmem usage=(?P<gib>\d+(?:\.\d+)?) GB")
_KV = re.compile(
    r"^KV Cache is allocated\. #tokens: (?P<tok>\d+), "
    r"(?:K size: (?P<k>\d+(?:\.\d+)?) GB, V size: (?P<v>\d+(?:\.\d+)?) GB|KV size: (?P<kv>\d+(?:\.\d+)?) GB)"
)
_GRAPHS = re.compile(r"^Capture cuda graph begin\.")
_LISTEN = re.compile(
    r"^Uvicorn running on (?P<url>(?P<scheme>https?)://(?P<host>\[[^\]\s]+\]|[^:\s/]+):(?P<port>\d{1,5}))"
)
_READY = re.compile(r"^The server is fired up and ready to roll!")
# words one of which every line of a rule holds: most lines of a log are no rule's
_RULE_WORDS = ("ServerArgs(", "Init torch", "Load weight", "KV Cache is allocated", "Capture cuda graph",
               "Uvicorn running", "fired up")

# SGLang's own words for a KV pool the weights left no room for, after CUDA's out-of-memory messages
_OOM = re.compile(CUDA_OOM + r"|Not enough memory\. Please try (?:to )?increas", re.I)
_OOM_WORDS = (*CUDA_OOM_WORDS,)
# symptoms: a process saying another died; the cause is the traceback around them
_FATAL = re.compile(
    r"Scheduler hit an exception|Received sigquit from a child process|"
    r"scheduler died during initialization|Initialization failed\."
)
_FATAL_WORDS = ("Scheduler hit", "sigquit", "scheduler died", "Initialization failed")
# of the symptoms, those that also end a server that was ready (its scheduler is gone)
_FATAL_AFTER_READY = re.compile(r"Scheduler hit an exception|Received sigquit|scheduler died")


class SglangLogTracker(PhaseTracker):
    """Incremental SGLang log reader: ``feed`` lines as they come, read ``report`` any time."""

    label = "SGLang"
    header = _HEADER

    def _reset_run(self) -> None:
        super()._reset_run()
        self._tb_open = False  # inside a Python traceback: its exception line is the root cause

    def _read(self, msg: str) -> None:
        indented = msg[:1].isspace()
        text = msg.strip()
        level = None
        m = _LEVEL.match(text)
        if m:
            level, text = m.group("level"), text[m.end():]
        if indented:
            return  # a traceback's frame or source line: its exception line, unindented, names the cause
        if holds(text, _RULE_WORDS) and self._rules(text):
            return  # a line of the start's progress is no failure
        if level not in ("DEBUG", "INFO", "WARNING"):
            self._check_failure(text)

    def _rules(self, text: str) -> bool:
        """Whether ``text`` is a line of the start's progress (and what it says about it)."""
        if _LAUNCH.match(text):
            self._launch()
            self._enter_phase(PHASE_STARTING)
            m = _MODEL_PATH.search(text)
            if m:
                self._v["model"] = m.group("m")
        elif _DIST_BEGIN.match(text):
            self._seen = True
            self._enter_phase(PHASE_STARTING)
        elif _LOAD_BEGIN.match(text):
            self._to_loading()
            self._enter_phase(PHASE_LOADING)
        elif _LOAD_END.match(text):
            self._to_loading()
            self._enter_phase(PHASE_LOADING)
            sec, usage = _ELAPSED.search(text), _MEM_USAGE.search(text)
            if sec:
                self._v["load_seconds"] = float(sec.group("sec"))
            if usage:
                self._v["model_load_gib"] = float(usage.group("gib"))
        elif m := _KV.match(text):
            self._to_loading()
            self._enter_phase(PHASE_KV_CACHE)
            self._v["kv_cache_tokens"] = int(m.group("tok"))
            if m.group("kv") is not None:
                gib = float(m.group("kv"))
            else:
                gib = float(m.group("k")) + float(m.group("v"))
            self._v["kv_cache_gib"] = round(gib, 2)
        elif _GRAPHS.match(text):
            self._to_loading()
            self._enter_phase(PHASE_CUDA_GRAPHS)
        elif m := _LISTEN.match(text):
            # uvicorn's line: any FastAPI server prints it, so it does not by itself make this
            # SGLang's log
            self._v["port"] = int(m.group("port"))
            self._v["listen_url"] = m.group("url")
            self._enter_phase(PHASE_API_SERVER)
        elif _READY.match(text):
            self._to_ready()
        else:
            return False
        return True

    def _check_failure(self, text: str) -> None:
        lowered = text.lower()
        if holds(lowered, _OOM_WORDS) and _OOM.search(text):
            self._fail("oom", text, specific=True)
            self._tb_open = False
            return
        if holds(lowered, NCCL_WORDS) and NCCL_FAILURE.search(text):
            self._fail("nccl", text, specific=True)
            self._tb_open = False
            return
        if holds(text, _FATAL_WORDS) and _FATAL.search(text):
            if not self._ready or _FATAL_AFTER_READY.search(text):
                self._fail("other", text, specific=False)
                self._tb_open = "Traceback" in text
            return
        if TRACEBACK.match(text):
            self._tb_open = True
            if not self._ready:
                self._fail("other", text, specific=False)
            return
        if self._tb_open and BARE_EXCEPTION.match(text):
            # the exception that ends the traceback: the root cause, unless the server was ready and
            # nothing said it died (a request's own error)
            self._tb_open = False
            if self._failed or not self._ready:
                self._fail("other", text, specific=True)

    def _advise(self, report: LogReport) -> str | None:
        return advise(report)


def advise(report: LogReport) -> str | None:
    """A plain-words next step for a failed SGLang start (``None`` when it did not fail)."""
    kind = report.failure_kind
    line = report.failure_line or ""
    if kind is None:
        return None
    if kind == "oom":
        if "mem-fraction-static" in line:
            return (
                "The weights left no memory for SGLang's KV cache at this --mem-fraction-static: raise it if "
                "the node has memory to spare (drop the page cache and stop other models on the node first), "
                "or spread the model over more nodes with --tp."
            )
        return (
            "Out of memory. SGLang takes --mem-fraction-static of the GPU's memory for the weights and the KV "
            "cache: lower it or --context-length, drop the page cache (`sync; echo 3 | sudo tee "
            "/proc/sys/vm/drop_caches`) and stop other models on the node, or spread the model over more "
            "nodes with --tp."
        )
    if kind == "nccl":
        return (
            "The NCCL link between the ranks failed or hung. Check that NCCL_SOCKET_IFNAME and "
            "GLOO_SOCKET_IFNAME name the ConnectX-7 netdev (see `ibdev2netdev`), that the link is Up on "
            "every node and the nodes ping each other over it, that --dist-init-addr is the head's address "
            "on that link, and that every node runs the same image."
        )
    if "exit code: -9" in line:
        return ("A scheduler was killed (SIGKILL) while it started: usually the host's OOM killer. Run "
                "`dmesg -T | grep -i oom` on the node; lower --mem-fraction-static or stop other models there.")
    return ("The SGLang server failed to start: the failure line is the exception that ended the scheduler's "
            "traceback; the frames above it in the log show where it was raised.")


def parse_sglang_log(text: str) -> LogReport:
    """Read a whole SGLang log. Never raises on odd input."""
    tracker = SglangLogTracker()
    tracker.feed_text(text if isinstance(text, str) else str(text))
    return tracker.report


__all__ = ["FAILURE_KINDS", "SglangLogTracker", "advise", "parse_sglang_log"]
