"""A simulated vLLM engine's ``GET /metrics``: Prometheus text in a real V1 server's exact format,
with figures that follow what that engine has served.

Why a model of its own: the console reads ``/metrics`` over the node's SSH connection (``curl -s
localhost:PORT/metrics``) and must be tested against the same text it will meet on a Spark. The
format is copied from the real full dump of an idle vLLM V1 server
(``tests/fixtures/real/metrics/vllm-0.11-v1-metrics-idle-qwen1.5-0.5b.prom``): the families in its
order, their ``# HELP``/``# TYPE`` lines word for word, labels ``engine="0"`` and
``model_name="<served name>"`` (sorted by key, as prometheus_client writes them), counters as
``NAME_total`` followed by a ``NAME_created`` gauge family, histograms with the dump's bucket
boundaries then ``_count``/``_sum`` and their own ``_created`` family, numbers as prometheus_client
prints them (:func:`_num`). The partial 0.22.1rc1 dump from a DGX Spark
(``vllm-0.22.1rc1-v1-metrics-partial-dgxspark-qwen3-1.7b.prom``) has the same sample lines for the
gauges it kept.

What is left out, and why:

* ``python_*``, ``process_*`` and ``http_*`` (prometheus_client's and the FastAPI instrumentator's
  families): the sim has no honest figures for them and the console reads only ``vllm:``.
* ``vllm:cache_config_info``: its label set is the engine's CacheConfig and changes between
  releases; the one dump we have is 0.11 and the sim runs 0.14 to 0.20.
* ``vllm:time_per_output_token_seconds`` for 0.12 and later: deprecated in 0.11 (its HELP says so)
  and hidden from the next release by vLLM's deprecation policy (``../shared/research``).
* ``vllm:num_requests_waiting_by_reason``: only the 0.22.1rc1 dump has it, without HELP/TYPE, and
  the sim runs nothing that new.

What the figures follow. Each chat completion the sim serves (:mod:`sparkconsole.sim.tools.net`,
or any tool that calls :func:`chat_started` and waits until the returned request's ``end``) goes
through a scheduler model of the engine (:class:`Sched`). Figures are computed from sim time at each
scrape (no wall clock), so they are deterministic and move as a real engine's would: the prompt
tokens count from the first token on, generation tokens one by one, TTFT is observed at the first
token, the inter-token latency per token, the per-request histograms and ``request_success`` when
the request ends. An engine with steady background traffic (the story's ``vllm-glm``: the stats line
every 10 s) counts each active slot as one request with the tokens and the KV usage its log line
reports, so ``/metrics`` and ``docker logs`` agree (but for the running count and KV where two
slots' requests overlap); those slots stay outside the scheduler.

The scheduler, in the spirit of vLLM V1's (``vllm/v1/core/sched/scheduler.py``
``Scheduler.schedule()``), in continuous sim time:

* at most ``max_num_seqs`` requests run (``--max-num-seqs``, else vLLM's default for the OpenAI
  server on a GPU of 70 GiB or more that is not an A100, as a Spark's GB10 is: 1024, 256 on the
  0.14 image whose 2048 batched tokens come from the other branch of ``EngineArgs.get_batch_defaults``
  in ``vllm/engine/arg_utils.py``; :attr:`EngineRun.max_num_seqs` set by the serve planner); the
  others wait first come first served, the head of the queue blocking the rest (FCFS);
* a request is admitted when the KV blocks of its tokens are free (``KVCacheManager.allocate_slots``):
  blocks are ``ceil((prompt + generated) / block size)`` over the engine's ``GPU KV cache size``
  (the figure its start-up log prints); a prompt too long for the free blocks waits;
* once admitted it prefills (the sim's timing model, :mod:`sparkconsole.sim.vllm_logs`: a fixed
  latency plus the prompt at ``PREFILL_TOK_S``), then decodes one token every ``1/rate``, where the
  per-request rate falls as the batch grows: ``decode_rate / (1 + BATCH_SLOWDOWN * (running - 1))``
  (0.1: the engine's total rises 3.1x at 4 running, 4.7x at 8, while each token comes 1.3x, 1.7x
  later, as a memory-bound decode does). Alone, a request takes exactly
  :func:`~sparkconsole.sim.vllm_logs.chat_seconds`, as before;
* a running request that needs one more block when none is free preempts the last scheduled
  running request (``self.running.pop()``; RECOMPUTE: its blocks are freed, it goes back to the
  front of the waiting queue, ``num_preemptions`` + 1; readmitted, it prefills prompt plus output
  again and goes on);
* ``num_requests_waiting`` counts the requests queued at the scrape, ``request_queue_time_seconds``
  observes arrival to first scheduling, ``request_inference_time_seconds`` scheduling to the end,
  ``request_prefill_time_seconds`` scheduling to the first token; ``kv_cache_usage_perc`` is the
  running requests' blocks over the cache, capped at 1.

Each arrival or abort takes the scheduler to that time and projects every request in flight to its
end assuming nothing more arrives; a later arrival can push a request's ``end`` later (a bigger
batch, a preemption), never earlier, so a client waits on ``end`` again after each wait (an abort can
bring others' ends earlier; a client already waiting answers at the end it waited for). A scrape
reads each request's timeline (``Request.segs``), O(requests in flight).

Not modelled: chunked prefill and the batched-token budget (prefills do not slow decodes), prefix
-cache hits saving blocks or recompute, priorities, swapping (V0), the DP/TP split of the batch.

The state lives on the :class:`~sparkconsole.sim.model.EngineRun` (``run.metrics``): one per served
process, so two engines on a cluster are distinct and a restarted engine (a new run) starts at 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from sparkconsole.sim.model import EngineRun, _hash01
from sparkconsole.sim.vllm_logs import (
    FIRST_TOKEN_S,
    PREFILL_TOK_S,
    decode_rate,
    traffic_slot,
    version_at_least,
)

# the real dump's bucket boundaries (vllm-0.11-v1-metrics-idle-qwen1.5-0.5b.prom)
TOKEN_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 20000.0)
ITERATION_BUCKETS = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0)
N_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
PHASE_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                 480.0, 960.0, 1920.0, 7680.0)

# (name, HELP) of the dump's families, in its order; kind g: gauge, c: counter, h: histogram
_FAMILIES: tuple[tuple[str, str, str, tuple[float, ...]], ...] = (
    ("vllm:num_requests_running", "g", "Number of requests in model execution batches.", ()),
    ("vllm:num_requests_waiting", "g", "Number of requests waiting to be processed.", ()),
    ("vllm:kv_cache_usage_perc", "g", "KV-cache usage. 1 means 100 percent usage.", ()),
    ("vllm:prefix_cache_queries", "c", "Prefix cache queries, in terms of number of queried tokens.", ()),
    ("vllm:prefix_cache_hits", "c", "Prefix cache hits, in terms of number of cached tokens.", ()),
    ("vllm:num_preemptions", "c", "Cumulative number of preemption from the engine.", ()),
    ("vllm:prompt_tokens", "c", "Number of prefill tokens processed.", ()),
    ("vllm:generation_tokens", "c", "Number of generation tokens processed.", ()),
    ("vllm:request_success", "c", "Count of successfully processed requests.", ()),
    ("vllm:request_prompt_tokens", "h", "Number of prefill tokens processed.", TOKEN_BUCKETS),
    ("vllm:request_generation_tokens", "h", "Number of generation tokens processed.", TOKEN_BUCKETS),
    ("vllm:iteration_tokens_total", "h", "Histogram of number of tokens per engine_step.", ITERATION_BUCKETS),
    ("vllm:request_max_num_generation_tokens", "h",
     "Histogram of maximum number of requested generation tokens.", TOKEN_BUCKETS),
    ("vllm:request_params_n", "h", "Histogram of the n request parameter.", N_BUCKETS),
    ("vllm:request_params_max_tokens", "h", "Histogram of the max_tokens request parameter.", TOKEN_BUCKETS),
    ("vllm:time_to_first_token_seconds", "h", "Histogram of time to first token in seconds.", TTFT_BUCKETS),
    ("vllm:time_per_output_token_seconds", "h", "Histogram of time per output token in seconds.DEPRECATED: "
     "Use vllm:inter_token_latency_seconds instead.", ITL_BUCKETS),
    ("vllm:inter_token_latency_seconds", "h", "Histogram of inter-token latency in seconds.", ITL_BUCKETS),
    ("vllm:request_time_per_output_token_seconds", "h",
     "Histogram of time_per_output_token_seconds per request.", ITL_BUCKETS),
    ("vllm:e2e_request_latency_seconds", "h", "Histogram of e2e request latency in seconds.", PHASE_BUCKETS),
    ("vllm:request_queue_time_seconds", "h", "Histogram of time spent in WAITING phase for request.",
     PHASE_BUCKETS),
    ("vllm:request_inference_time_seconds", "h", "Histogram of time spent in RUNNING phase for request.",
     PHASE_BUCKETS),
    ("vllm:request_prefill_time_seconds", "h", "Histogram of time spent in PREFILL phase for request.",
     PHASE_BUCKETS),
    ("vllm:request_decode_time_seconds", "h", "Histogram of time spent in DECODE phase for request.",
     PHASE_BUCKETS),
)
FINISHED_REASONS = ("stop", "length", "abort")  # the dump's order of request_success's series
DEPRECATED_ITL = "vllm:time_per_output_token_seconds"
SLOT_S = 10.0  # the background traffic's slot (sparkconsole.sim.model.periodic_lines)


def _num(d: float) -> str:
    """A sample value as prometheus_client writes it (``floatToGoString``): ``0.0``, ``+Inf``, and
    Go's earlier switch to exponents (``1.7624384230434499e+09``), as the real dump shows."""
    d = float(d)
    if d == math.inf:
        return "+Inf"
    if d == -math.inf:
        return "-Inf"
    if math.isnan(d):
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return s


@dataclass
class Hist:
    bounds: tuple[float, ...]
    counts: list[float] = field(default_factory=list)  # per bucket (not cumulative), the last is +Inf
    total: float = 0.0
    n: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0.0] * (len(self.bounds) + 1)

    def observe(self, v: float, times: float = 1.0) -> None:
        if times <= 0:
            return
        i = next((j for j, b in enumerate(self.bounds) if v <= b), len(self.bounds))
        self.counts[i] += times
        self.total += v * times
        self.n += times

    def copy(self) -> Hist:
        return Hist(self.bounds, list(self.counts), self.total, self.n)


@dataclass
class Request:
    """One request as the engine sees it: arrival, when its first and last tokens come, its tokens.

    A chat completion goes through the scheduler model (:class:`Sched`): its timeline is ``segs``,
    ``(time, kind, tokens generated, decode rate)`` with kind ``w`` waiting, ``p`` prefilling, ``d``
    decoding (tokens grow at the rate from there); ``sched`` is when it was first scheduled,
    ``preempts`` when it was preempted. ``first`` and ``end`` follow from them, and ``end`` moves later
    when later arrivals slow the batch or preempt it (a client waits on ``end``, re-read after each
    wait). A background slot has no ``segs``: it decodes at ``rate`` from ``first`` on."""

    t0: float
    first: float  # sim time of the first token
    rate: float  # decode tokens/s after the first (alone in the batch)
    prompt: int
    completion: int
    max_tokens: int  # the effective limit (the request's, else max_model_len - prompt)
    max_tokens_param: int | None  # what the request asked for, if it did
    hits: int  # prefix-cache hit tokens
    reason: str = "stop"
    kv_frac: float | None = None  # background slots: the KV share their stats line prints
    end: float = 0.0
    segs: list[tuple[float, str, float, float]] = field(default_factory=list)
    sched: float | None = None
    preempts: list[float] = field(default_factory=list)
    commit: tuple[int, int, float | None] = (0, 0, None)  # (len(segs), len(preempts), sched) as of the last event

    def __post_init__(self) -> None:
        if not self.end:
            self.end = self.first + max(0, self.completion - 1) / self.rate

    def seg_at(self, t: float) -> tuple[float, str, float, float] | None:
        for seg in reversed(self.segs):
            if seg[0] <= t:
                return seg
        return None

    def generated(self, t: float) -> int:
        if not self.segs:
            if t < self.first:
                return 0
            return min(self.completion, 1 + int((t - self.first) * self.rate + 1e-9))
        if t >= self.end:
            return self.completion
        seg = self.seg_at(t)
        if seg is None:
            return 0
        ts, kind, x, rate = seg
        if kind != "d":
            return int(x)
        return min(self.completion, int(x + (t - ts) * rate + 1e-9))

    def phase(self, t: float) -> str:
        """``w`` waiting, ``r`` running (prefill or decode), ``-`` not in the engine at ``t``."""
        if t < self.t0 or t >= self.end:
            return "-"
        if not self.segs:
            return "r"
        seg = self.seg_at(t)
        return "-" if seg is None else "w" if seg[1] == "w" else "r"

    def token_time(self, j: int) -> float:
        """When token ``j`` (1-based) came out."""
        for i, (ts, kind, x, rate) in enumerate(self.segs):
            if kind != "d":
                continue
            te = self.segs[i + 1][0] if i + 1 < len(self.segs) else self.end
            if x < j <= x + (te - ts) * rate + 1e-9:
                return ts + (j - x) / rate
        return self.end

    def itl(self, t: float) -> list[tuple[float, float]]:
        """The inter-token latencies of the tokens out by ``t``: (seconds, how many). Within a
        decode stretch one token every ``1/rate``; the first token of a stretch the exact gap since
        the token before (a rate change, or a preemption's wait and recompute)."""
        if not self.segs:
            gen = self.generated(t)
            return [(1.0 / self.rate, gen - 1)] if gen > 1 else []
        out: list[tuple[float, float]] = []
        prev: float | None = None
        for i, (ts, kind, x, rate) in enumerate(self.segs):
            if kind != "d" or ts > t:
                continue
            te = min(t, self.segs[i + 1][0] if i + 1 < len(self.segs) else self.end)
            j0 = int(x + 1e-9)
            j1 = min(self.completion, int(x + (te - ts) * rate + 1e-9))
            if j1 <= j0:
                continue
            if j0 >= 1 and prev is not None:
                out.append((ts + (j0 + 1 - x) / rate - prev, 1.0))
            if j1 - j0 > 1:
                out.append((1.0 / rate, float(j1 - j0 - 1)))
            prev = ts + (j1 - x) / rate
        return out


@dataclass
class Counters:
    counters: dict[str, float] = field(default_factory=dict)
    success: dict[str, float] = field(default_factory=lambda: dict.fromkeys(FINISHED_REASONS, 0.0))
    hists: dict[str, Hist] = field(default_factory=lambda: {n: Hist(b) for n, k, _h, b in _FAMILIES if k == "h"})

    def add(self, name: str, v: float) -> None:
        self.counters[name] = self.counters.get(name, 0.0) + v

    def copy(self) -> Counters:
        return Counters(dict(self.counters), dict(self.success), {k: h.copy() for k, h in self.hists.items()})


@dataclass
class EngineMetrics:
    """One engine's figures: the finished requests folded in, the ones still in flight."""

    done: Counters = field(default_factory=Counters)
    flight: list[Request] = field(default_factory=list)
    seen_prompts: set[str] = field(default_factory=set)
    bg_slot: int = 0  # background slots folded in so far (1..bg_slot)
    sched: Sched | None = None  # the scheduler of its chat completions (made on the first)


def state(run: EngineRun) -> EngineMetrics:
    if run.metrics is None:
        run.metrics = EngineMetrics()
    return run.metrics


def _account(c: Counters, r: Request, t: float) -> None:
    """What request ``r`` has added to the figures by sim time ``t``."""
    c.add("vllm:num_preemptions", sum(1 for p in r.preempts if p <= t))
    gen = r.generated(t)
    if gen == 0:
        if t >= r.end:  # aborted before its first token
            c.success[r.reason] = c.success.get(r.reason, 0.0) + 1
        return
    c.add("vllm:prompt_tokens", r.prompt)
    c.add("vllm:prefix_cache_queries", r.prompt)
    c.add("vllm:prefix_cache_hits", r.hits)
    c.add("vllm:generation_tokens", gen)
    h = c.hists
    ttft = r.first - r.t0
    h["vllm:time_to_first_token_seconds"].observe(ttft)
    h["vllm:iteration_tokens_total"].observe(r.prompt - r.hits + 1)  # the prefill step makes the first token
    h["vllm:iteration_tokens_total"].observe(1.0, gen - 1)  # then one decode step per token
    for v, n in r.itl(t):
        h["vllm:inter_token_latency_seconds"].observe(v, n)
        h[DEPRECATED_ITL].observe(v, n)
    if t < r.end:
        return
    c.success[r.reason] = c.success.get(r.reason, 0.0) + 1
    decode = max(0.0, r.end - r.first)
    sched = r.t0 if r.sched is None else r.sched  # vLLM's queued -> scheduled, then the RUNNING phase
    h["vllm:request_prompt_tokens"].observe(r.prompt)
    h["vllm:request_generation_tokens"].observe(gen)
    h["vllm:request_max_num_generation_tokens"].observe(r.max_tokens)
    h["vllm:request_params_n"].observe(1.0)
    if r.max_tokens_param is not None:
        h["vllm:request_params_max_tokens"].observe(r.max_tokens_param)
    h["vllm:request_time_per_output_token_seconds"].observe(decode / (gen - 1) if gen > 1 else 0.0)
    h["vllm:e2e_request_latency_seconds"].observe(r.end - r.t0)
    h["vllm:request_queue_time_seconds"].observe(sched - r.t0)
    h["vllm:request_inference_time_seconds"].observe(r.end - sched)
    h["vllm:request_prefill_time_seconds"].observe(r.first - sched)
    h["vllm:request_decode_time_seconds"].observe(decode)


def _fold(run: EngineRun, m: EngineMetrics, t: float) -> None:
    """Fold the requests finished by ``t`` (and the background slots over by then) into ``done``."""
    for r in [r for r in m.flight if r.end <= t]:
        _account(m.done, r, t)
        m.flight.remove(r)
    for r in _background(run, m, t):
        m.flight.append(r)  # a slot still under way at t: in flight like any other
    for r in [r for r in m.flight if r.end <= t]:
        _account(m.done, r, t)
        m.flight.remove(r)


def _background(run: EngineRun, m: EngineMetrics, t: float) -> list[Request]:
    """The background slots (``periodic_lines``) that have begun by ``t`` and were not yet taken:
    slot k's request runs so that it is in flight when its stats line prints (``Running: 1``): it ends
    a second after, or, when it takes longer than the slot, arrives as the slot begins; its tokens
    are the line's (10 s at its average throughputs), its KV share the line's."""
    if not run.periodic or run.ready_at is None or run.activity <= 0:
        return []
    end = t if run.stopped_at is None else min(t, run.stopped_at)
    if run.hung_at is not None:
        end = min(end, run.hung_at)
    out = []
    k = m.bg_slot + 1
    while True:
        slot_t = run.ready_at + SLOT_S * k
        prompt_tps, gen_tps, kv_pct, hit_pct = traffic_slot(run, k)
        p, g = round(prompt_tps * SLOT_S), max(1, round(gen_tps * SLOT_S))
        hits = round(p * hit_pct / 100.0)
        r = _request(run, slot_t + 1.0, p, g, None, hits, end_at=True)
        if r.t0 < slot_t - SLOT_S:  # a long one: it arrives as its slot begins (never before the engine was up)
            r = _request(run, slot_t - SLOT_S, p, g, None, hits)
        if r.t0 > end:
            break
        m.bg_slot = k
        if _hash01("slot", run.model, run.started, k) < run.activity:
            r.kv_frac = kv_pct / 100.0
            out.append(r)
        k += 1
    return out


def _request(run: EngineRun, t: float, prompt: int, completion: int, max_tokens: int | None, hits: int,
             end_at: bool = False) -> Request:
    """A request arriving at ``t`` (``end_at``: ending at ``t``) under the sim's timing model."""
    rate = decode_rate(run)
    ttft = FIRST_TOKEN_S + prompt / PREFILL_TOK_S + 1.0 / rate
    span = ttft + max(0, completion - 1) / rate
    t0 = t - span if end_at else t
    limit = max_tokens if max_tokens is not None else max(1, (run.max_model_len or 0) - prompt)
    return Request(t0, t0 + ttft, rate, prompt, completion, limit, max_tokens, hits)


# ---- the scheduler -------------------------------------------------------------------------------

BATCH_SLOWDOWN = 0.1  # per-request decode rate = alone / (1 + BATCH_SLOWDOWN * (running - 1))
# vLLM's default --max-num-seqs for the OpenAI server on a GPU of 70 GiB or more that is not an A100
# (a Spark's GB10 reports ~120 GiB): vllm/engine/arg_utils.py EngineArgs.get_batch_defaults
DEFAULT_MAX_NUM_SEQS = 1024
_MAX_EVENTS = 2_000_000  # a guard: a projection never loops for ever


@dataclass
class _Slot:
    """A running request: its blocks, its prefill's end (None once decoding), its decode stretch."""

    r: Request
    held: int
    pre_end: float | None
    gen0: int  # tokens generated before this stint (a preempted request keeps its output)
    seg_t: float = 0.0
    seg_x: float = 0.0
    rate: float = 0.0

    def x(self, t: float) -> float:
        return self.seg_x + (t - self.seg_t) * self.rate if self.pre_end is None else float(self.gen0)


@dataclass
class Sched:
    """One engine's scheduler, in the spirit of vLLM V1's (vllm/v1/core/sched/scheduler.py
    ``Scheduler.schedule()``), in continuous sim time: at most ``max_num_seqs`` requests running, the
    rest waiting first come first served (the head of the queue blocks the others, as FCFS does);
    a request is admitted when its tokens' KV blocks are free (``KVCacheManager.allocate_slots``),
    and a running request that needs one more block when none is free preempts the last scheduled
    running request (``self.running.pop()``, RECOMPUTE: its blocks are freed, it goes back to the
    front of the waiting queue with ``num_computed_tokens = 0``; it keeps its output and prefills
    prompt plus output again when readmitted), possibly itself."""

    t: float
    free: float  # free KV blocks (inf: unknown capacity)
    max_seqs: int
    bs: int
    rate1: float
    running: list[_Slot] = field(default_factory=list)
    waiting: list[tuple[Request, int]] = field(default_factory=list)  # (request, tokens it has generated)

    def copy(self) -> Sched:
        return Sched(self.t, self.free, self.max_seqs, self.bs, self.rate1,
                     [_Slot(**vars(s)) for s in self.running], list(self.waiting))

    def rate(self) -> float:
        return self.rate1 / (1.0 + BATCH_SLOWDOWN * max(0, len(self.running) - 1))

    def admit(self) -> None:
        t = self.t
        while self.waiting and len(self.running) < self.max_seqs:
            r, gen = self.waiting[0]
            need = max(1, math.ceil((r.prompt + gen) / self.bs))
            if need > self.free and self.running:
                break  # FCFS: the head waits for blocks, and the rest behind it
            self.waiting.pop(0)
            self.free -= need
            if r.sched is None:
                r.sched = t
            self.running.append(_Slot(r, need, t + FIRST_TOKEN_S + (r.prompt + gen) / PREFILL_TOK_S, gen))
            r.segs.append((t, "p", float(gen), 0.0))

    def rerate(self) -> None:
        """The batch changed: every decoding request goes on at the new per-request rate."""
        rate, t = self.rate(), self.t
        for s in self.running:
            if s.pre_end is None and s.rate != rate:
                s.seg_x, s.seg_t, s.rate = s.x(t), t, rate
                s.r.segs.append((t, "d", s.seg_x, rate))

    def preempt_for(self, s: _Slot) -> None:
        """``s`` needs one more block: take a free one, else preempt from the back until one is."""
        t = self.t
        while self.free < 1:
            victim = self.running[-1]
            if victim is s and len(self.running) == 1:
                break  # alone and still short (the engine's start-up check rules this out): let it be
            self.running.pop()
            self.free += victim.held
            gen = int(victim.x(t) + 1e-9) if victim.pre_end is None else victim.gen0
            victim.r.preempts.append(t)
            victim.r.segs.append((t, "w", float(gen), 0.0))
            self.waiting.insert(0, (victim.r, gen))
            if victim is s:
                return
        s.held += 1
        self.free -= 1

    def catch_up(self, t: float) -> None:
        """Each decoding request's blocks for its tokens at ``t`` (taken without a check: enough are free)."""
        if t == math.inf:
            return
        for s in self.running:
            if s.pre_end is None:
                held = math.ceil((s.r.prompt + min(s.r.completion, int(s.x(t) + 1e-9))) / self.bs)
                if held > s.held:
                    self.free -= held - s.held
                    s.held = held

    def run(self, until: float) -> None:
        """Advance to ``until`` with no new arrival (``math.inf``: until every request is done)."""
        for _ in range(_MAX_EVENTS):
            if not self.running:
                break
            best, slot, kind = math.inf, None, ""
            # blocks one at a time only while they could run short before the batch finishes; else
            # each request's blocks are brought up to date at the next event (admissions need them)
            limited = self.free < sum(math.ceil((s.r.prompt + s.r.completion) / self.bs) - s.held
                                      for s in self.running)
            for s in self.running:
                if s.pre_end is not None:
                    cand = [(s.pre_end, "p")]
                else:
                    c = s.r.completion
                    cand = [(s.seg_t + (c - s.seg_x) / s.rate, "f")]
                    need = s.held * self.bs - s.r.prompt + 1  # the token that wants one more block
                    if limited and need < c:
                        cand.append((s.seg_t + (need - s.seg_x) / s.rate, "b"))
                for when, k in cand:
                    if when < best:
                        best, slot, kind = when, s, k
            if best > until or slot is None:
                if not limited:
                    self.catch_up(until)
                break
            self.t = max(self.t, best)
            t = self.t
            if not limited:
                self.catch_up(t)
            r = slot.r
            if kind == "p":  # prefill done: decoding from here (its first token after one step)
                slot.pre_end = None
                slot.seg_t, slot.seg_x, slot.rate = t, float(slot.gen0), self.rate()
                r.segs.append((t, "d", slot.seg_x, slot.rate))
                continue
            if kind == "f":
                self.running.remove(slot)
                self.free += slot.held
                r.end = t
            else:
                n = len(self.running)
                self.preempt_for(slot)
                if len(self.running) == n:
                    continue
            self.admit()
            self.rerate()
        if until != math.inf:
            self.t = max(self.t, until)


def _sched(run: EngineRun, m: EngineMetrics) -> Sched:
    if m.sched is None:
        bs = run.kv_block_size or 16
        free = run.kv_cache_tokens // bs if run.kv_cache_tokens else math.inf
        m.sched = Sched(run.started, free, getattr(run, "max_num_seqs", 0) or DEFAULT_MAX_NUM_SEQS, bs,
                        decode_rate(run))
    return m.sched


def _event(run: EngineRun, m: EngineMetrics, t: float, change) -> None:
    """Something happens at ``t`` (an arrival, an abort): take the scheduler there (undoing what the
    last projection had guessed of the time after it), apply ``change``, schedule, then project
    every request in flight to its end assuming nothing more arrives (their ``end``)."""
    s = _sched(run, m)
    live = [x.r for x in s.running] + [r for r, _g in s.waiting]
    for r in live:
        nseg, npre, sched = r.commit
        del r.segs[nseg:]
        del r.preempts[npre:]
        r.sched = sched
    s.run(max(t, s.t))
    change(s)
    s.admit()
    s.rerate()
    live = [x.r for x in s.running] + [r for r, _g in s.waiting]
    for r in live:
        r.commit = (len(r.segs), len(r.preempts), r.sched)
    s.copy().run(math.inf)
    for r in live:
        r.first = r.token_time(1)


def chat_started(run: EngineRun, t: float, prompt: int, completion: int, max_tokens: int | None = None,
                 prompt_text: str = "") -> Request:
    """A chat completion arriving at ``t``. The client gets its answer at ``Request.end``: alone on the
    engine that is :func:`sparkconsole.sim.vllm_logs.chat_seconds` after ``t``; with others it may
    wait for a slot or blocks, decodes slower in a bigger batch, and later arrivals can push ``end``
    later still (re-read it after each wait). A prompt seen before hits the prefix cache for its
    whole blocks, as vLLM's automatic prefix caching would."""
    m = state(run)
    _fold(run, m, t)
    bs = run.kv_block_size or 16
    hits = 0
    if prompt_text:
        if prompt_text in m.seen_prompts:
            hits = (prompt - 1) // bs * bs  # vLLM recomputes at least the last token
        m.seen_prompts.add(prompt_text)
    r = _request(run, t, prompt, completion, max_tokens, hits)
    m.flight.append(r)
    if completion <= 0:
        return r

    def arrive(s: Sched) -> None:
        r.segs.append((s.t, "w", 0.0, 0.0))
        s.waiting.append((r, 0))

    _event(run, m, t, arrive)
    return r


def chat_aborted(run: EngineRun, r: Request, t: float) -> None:
    """The client gave up at ``t`` (``curl -m``): vLLM aborts the request there (its blocks freed)."""
    m = state(run)
    if r not in m.flight or t >= r.end:
        return
    if not r.segs:
        r.completion = r.generated(t)
        r.end = t
        r.reason = "abort"
        return

    def abort(s: Sched) -> None:
        r.completion = r.generated(s.t)
        r.end = s.t
        r.reason = "abort"
        for x in s.running:
            if x.r is r:
                s.running.remove(x)
                s.free += x.held
                break
        s.waiting = [w for w in s.waiting if w[0] is not r]

    _event(run, m, t, abort)


def render(run: EngineRun, t: float, epoch0: float) -> str:
    """``GET /metrics`` at sim time ``t`` (``epoch0``: unix time of sim time 0, for ``_created``)."""
    m = state(run)
    _fold(run, m, t)
    c = m.done.copy()
    for r in m.flight:
        _account(c, r, t)
    phases = [(r, r.phase(t)) for r in m.flight]
    running = [r for r, ph in phases if ph == "r"]
    waiting = sum(1 for _r, ph in phases if ph == "w")
    bs = run.kv_block_size or 16
    kv = 0.0
    if run.kv_cache_tokens:
        for r in running:
            kv += r.kv_frac if r.kv_frac is not None else \
                math.ceil((r.prompt + r.generated(t)) / bs) * bs / run.kv_cache_tokens
    gauges = {"vllm:num_requests_running": float(len(running)), "vllm:num_requests_waiting": float(waiting),
              "vllm:kv_cache_usage_perc": min(1.0, kv)}
    labels = {"engine": "0", "model_name": run.served_name}
    # the registry is made as the API server starts: each family a few microseconds after the last
    created = epoch0 + (run.ready_at if run.ready_at is not None else run.started) - 0.7
    hidden = {DEPRECATED_ITL} if version_at_least(run.version, 0, 12) else set()
    out: list[str] = []
    for i, (name, kind, help_, _b) in enumerate(f for f in _FAMILIES if f[0] not in hidden):
        when = _num(created + 2.5e-5 * i)
        if kind == "g":
            out += [f"# HELP {name} {help_}", f"# TYPE {name} gauge", f"{name}{_labels(labels)} {_num(gauges[name])}"]
            continue
        if kind == "c":
            out += [f"# HELP {name}_total {help_}", f"# TYPE {name}_total counter"]
            if name == "vllm:request_success":
                series = [({**labels, "finished_reason": fr}, c.success.get(fr, 0.0)) for fr in FINISHED_REASONS]
            else:
                series = [(labels, c.counters.get(name, 0.0))]
            out += [f"{name}_total{_labels(lb)} {_num(v)}" for lb, v in series]
            out += [f"# HELP {name}_created {help_}", f"# TYPE {name}_created gauge"]
            out += [f"{name}_created{_labels(lb)} {_num(created + 2.5e-5 * i + 1.4e-5 * j)}"
                    for j, (lb, _v) in enumerate(series)]
            continue
        h = c.hists[name]
        out += [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
        cum = 0.0
        for b, n in zip((*h.bounds, math.inf), h.counts, strict=True):
            cum += n
            out.append(f"{name}_bucket{_labels({**labels, 'le': _num(b)})} {_num(cum)}")
        out += [f"{name}_count{_labels(labels)} {_num(h.n)}", f"{name}_sum{_labels(labels)} {_num(h.total)}",
                f"# HELP {name}_created {help_}", f"# TYPE {name}_created gauge",
                f"{name}_created{_labels(labels)} {when}"]
    return "\n".join(out) + "\n"


def _labels(lb: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{lb[k]}"' for k in sorted(lb)) + "}"
