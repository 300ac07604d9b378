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

What the figures follow. Each chat completion the sim serves (:mod:`sparkconsole.sim.tools.net`)
is registered with :func:`chat_started` and takes the sim's own timing model
(:mod:`sparkconsole.sim.vllm_logs`: a fixed latency plus prefill at ``PREFILL_TOK_S``, then one
token every ``1/decode_rate`` seconds, the same arithmetic that decides how long ``curl`` waits).
Figures are computed from sim time at each scrape, so they are deterministic and move as a real
engine's would: the prompt tokens count from the first token on, generation tokens one by one,
TTFT is observed at the first token, the inter-token latency per token, the per-request histograms
and ``request_success`` when the request ends. An engine with steady background traffic (the
story's ``vllm-glm``: the stats line every 10 s) counts each active slot as one request with the
tokens and the KV usage its log line reports, so ``/metrics`` and ``docker logs`` agree (but for
the running count and KV where two slots' requests overlap).

Concurrency: the sim serves every request at once (its timing model has no batch limit and no
queue), so ``num_requests_running`` counts the requests in flight, ``num_requests_waiting`` and
``num_preemptions`` stay 0 and the queue time is 0. KV usage is the blocks the in-flight requests
hold (prompt plus tokens generated so far, rounded up to the block size) over the engine's
``GPU KV cache size`` (the figure its start-up log prints), capped at 1.

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
    """One request as the engine sees it: arrival, when its first and last tokens come, its tokens."""

    t0: float
    first: float  # sim time of the first token
    rate: float  # decode tokens/s after the first
    prompt: int
    completion: int
    max_tokens: int  # the effective limit (the request's, else max_model_len - prompt)
    max_tokens_param: int | None  # what the request asked for, if it did
    hits: int  # prefix-cache hit tokens
    reason: str = "stop"
    kv_frac: float | None = None  # background slots: the KV share their stats line prints
    end: float = 0.0

    def __post_init__(self) -> None:
        if not self.end:
            self.end = self.first + max(0, self.completion - 1) / self.rate

    def generated(self, t: float) -> int:
        if t < self.first:
            return 0
        return min(self.completion, 1 + int((t - self.first) * self.rate + 1e-9))


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


def state(run: EngineRun) -> EngineMetrics:
    if run.metrics is None:
        run.metrics = EngineMetrics()
    return run.metrics


def _account(c: Counters, r: Request, t: float) -> None:
    """What request ``r`` has added to the figures by sim time ``t``."""
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
    h["vllm:inter_token_latency_seconds"].observe(1.0 / r.rate, gen - 1)
    h[DEPRECATED_ITL].observe(1.0 / r.rate, gen - 1)
    if t < r.end:
        return
    c.success[r.reason] = c.success.get(r.reason, 0.0) + 1
    decode = max(0.0, r.end - r.first)
    h["vllm:request_prompt_tokens"].observe(r.prompt)
    h["vllm:request_generation_tokens"].observe(gen)
    h["vllm:request_max_num_generation_tokens"].observe(r.max_tokens)
    h["vllm:request_params_n"].observe(1.0)
    if r.max_tokens_param is not None:
        h["vllm:request_params_max_tokens"].observe(r.max_tokens_param)
    h["vllm:request_time_per_output_token_seconds"].observe(decode / (gen - 1) if gen > 1 else 0.0)
    h["vllm:e2e_request_latency_seconds"].observe(r.end - r.t0)
    h["vllm:request_queue_time_seconds"].observe(0.0)  # the sim has no queue: scheduled on arrival
    h["vllm:request_inference_time_seconds"].observe(r.end - r.t0)
    h["vllm:request_prefill_time_seconds"].observe(ttft)
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


def chat_started(run: EngineRun, t: float, prompt: int, completion: int, max_tokens: int | None = None,
                 prompt_text: str = "") -> Request:
    """A chat completion the sim is about to serve (it answers at ``Request.end``, which equals
    :func:`sparkconsole.sim.vllm_logs.chat_seconds` after ``t``). A prompt seen before hits the
    prefix cache for its whole blocks, as vLLM's automatic prefix caching would."""
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
    return r


def chat_aborted(run: EngineRun, r: Request, t: float) -> None:
    """The client gave up at ``t`` (``curl -m``): vLLM aborts the request there."""
    if r in state(run).flight and t < r.end:
        r.completion = r.generated(t)
        r.end = t
        r.reason = "abort"


def render(run: EngineRun, t: float, epoch0: float) -> str:
    """``GET /metrics`` at sim time ``t`` (``epoch0``: unix time of sim time 0, for ``_created``)."""
    m = state(run)
    _fold(run, m, t)
    c = m.done.copy()
    for r in m.flight:
        _account(c, r, t)
    running = [r for r in m.flight if r.t0 <= t < r.end]
    bs = run.kv_block_size or 16
    kv = 0.0
    if run.kv_cache_tokens:
        for r in running:
            kv += r.kv_frac if r.kv_frac is not None else \
                math.ceil((r.prompt + r.generated(t)) / bs) * bs / run.kv_cache_tokens
    gauges = {"vllm:num_requests_running": float(len(running)), "vllm:num_requests_waiting": 0.0,
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
