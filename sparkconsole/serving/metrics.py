"""An engine's Prometheus ``/metrics`` text -> one typed sample per engine, and the window arithmetic.

The text is read with ``prometheus_client``'s own text-format parser, not with regexes of ours: the
exposition format has escaping, optional timestamps, ``_created`` samples and TYPE lines with or
without ``_total`` that the reference parser already handles the way the engines' own client writes
them. Matching is on *sample* names (``vllm:prompt_tokens_total``, ``…_bucket``), so a dump whose
HELP/TYPE lines were cut (the grep-filtered ones people paste) reads the same as a full one.

Rules shared with :mod:`sparkconsole.probe.parsers`: pure functions of their input, never raise,
what is absent or not a finite number is ``None`` (never ``0``: a dashboard must not show a made-up
figure). Names follow vLLM's V1 engine first and the older names as a fallback, because NGC images
that still serve them are in use (``vllm:gpu_cache_usage_perc`` before 0.9.2,
``vllm:time_per_output_token_seconds`` before the inter-token-latency rename, ``gpu_prefix_cache_*``);
SGLang's current names first and its 0.3-era ones (``num_requests_running``, a ``name`` label) after.

One :class:`EngineMetrics` per (kind, ``model_name``, ``engine``) label set: vLLM's data-parallel
ranks each carry their own ``engine`` label, and one page may serve several.

A page is data from the node, and a hostile or broken engine can serve anything: a page larger than
:data:`MAX_PAGE_BYTES` or with more than :data:`MAX_PAGE_LINES` lines is not parsed at all
(:func:`page_refusal` says why, in words the console shows), and a figure no engine can have (a
negative counter, a gauge past its bound in :data:`GAUGE_BOUNDS`) is refused: ``None``, with the
reason in :attr:`EngineMetrics.invalid`, never shown as read.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from prometheus_client.parser import text_string_to_metric_families

from sparkconsole.remote import METRICS_FETCH_MAX_BYTES, METRICS_PAGE_MAX_BYTES
from sparkconsole.serving.engines import ENGINES

Kind = str  # an engine's name (sparkconsole.serving.engines.ENGINES)

#: The most of one page the console parses (the lines the node's grep kept; the node cuts its read at
#: the same bound, :data:`sparkconsole.remote.METRICS_PAGE_MAX_BYTES`). A real vLLM page keeps ~12 KB
#: and ~125 lines an engine, so these hold dozens of data-parallel ranks and served models.
MAX_PAGE_BYTES = METRICS_PAGE_MAX_BYTES
MAX_PAGE_LINES = 10_000
#: A page with more lines than this is parsed away from the event loop (``asyncio.to_thread``): the
#: reference parser reads ~20 000 lines a second, and the console's screen must not wait on it.
INLINE_PAGE_LINES = 1_500
#: The largest value a gauge can sanely have; past it the page is inventing figures. Requests running
#: at once are bounded by the engine's batch (vLLM's ``--max-num-seqs``, SGLang's
#: ``--max-running-requests``: hundreds, a few thousand at most); waiting ones by what any client
#: sends; KV usage is a fraction; throughput is what one engine can generate.
GAUGE_BOUNDS: dict[str, float] = {
    "requests_running": 65_536.0,
    "requests_waiting": 1_000_000.0,
    "kv_cache_usage": 1.0,
    "gen_throughput": 10_000_000.0,
}
#: Cumulative counters: never negative.
COUNTERS = ("prompt_tokens", "generation_tokens", "preemptions", "prefix_cache_queries", "prefix_cache_hits")


def page_refusal(text: str, *, limit_bytes: int = MAX_PAGE_BYTES, limit_lines: int = MAX_PAGE_LINES) -> str | None:
    """Why a page is not read at all, in words, or ``None`` when it may be parsed. Counted before any
    parse (``len``, ``str.count``: no copy of the page is made), so a page of millions of series costs
    one pass over the text already held, never the parser's objects for each sample."""
    if not isinstance(text, str):
        return "the page is not text"
    if "curl: (63)" in text:
        return f"metrics page too large (over {METRICS_FETCH_MAX_BYTES} bytes), not read"
    size = len(text)
    lines = text.count("\n") + 1
    if size >= limit_bytes or lines > limit_lines:
        return f"metrics page too large ({size} bytes, {lines} series), not read"
    return None


@dataclass(frozen=True)
class Histogram:
    """One Prometheus histogram as scraped: cumulative bucket counts by upper bound (``le``), sorted,
    ``+Inf`` last when the page had it; ``count`` and ``sum`` as printed (``None`` when cut off)."""

    buckets: tuple[tuple[float, float], ...] = ()
    count: float | None = None
    sum: float | None = None


@dataclass(frozen=True)
class EngineMetrics:
    """The figures one engine exposes, as read. Gauges are instantaneous; counters are cumulative since
    the engine started (rates need two scrapes: :func:`rate`); ``kv_cache_usage`` is a fraction 0–1
    (vLLM's ``kv_cache_usage_perc`` is a fraction despite its name, SGLang's ``token_usage`` too)."""

    kind: Kind
    model: str | None = None
    engine: str | None = None
    #: None from every page seen so far: neither vLLM (0.7 → 0.22) nor SGLang (0.3.5, 0.4) puts its
    #: own version on ``/metrics`` (``python_info`` is the interpreter's); kept so the JSON has the
    #: key when the version is known another way (the log's banner, the image)
    version: str | None = None
    requests_running: float | None = None
    requests_waiting: float | None = None
    kv_cache_usage: float | None = None
    gen_throughput: float | None = None  # SGLang computes it; vLLM V1 has no such gauge
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    preemptions: float | None = None
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None
    ttft: Histogram | None = None
    itl: Histogram | None = None
    e2e: Histogram | None = None
    queue_time: Histogram | None = None
    #: which metric name each figure came from (shows when the legacy fallback was used)
    sources: Mapping[str, str] = field(default_factory=dict)
    #: figures the page gave that no engine can have, refused (their field is ``None``): field -> why
    invalid: Mapping[str, str] = field(default_factory=dict)


# Sample names by field, preferred first, as each engine declares them (``engine.metrics``). Only
# these are read: a metric we do not know cannot make an entry of its own (SGLang 0.4's
# ``func_latency_seconds{name="generate_request"}`` has a ``name`` label that is a function, not a model).
_HIST_SUFFIXES = ("_bucket", "_count", "_sum")

# sample name -> (kind, field, preference rank, part) with part "" for scalars, else the suffix
_INDEX: dict[str, tuple[Kind, str, int, str]] = {}
for _engine in ENGINES.values():
    for _field, _names in _engine.metrics.scalars.items():
        for _rank, _name in enumerate(_names):
            _INDEX[_name] = (_engine.name, _field, _rank, "")
    for _field, _names in _engine.metrics.histograms.items():
        for _rank, _name in enumerate(_names):
            for _suffix in _HIST_SUFFIXES:
                _INDEX[_name + _suffix] = (_engine.name, _field, _rank, _suffix)


def _finite(v: object) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def _parses(line: str) -> bool:
    try:
        for _ in text_string_to_metric_families(line):
            pass
    except Exception:
        return False
    return True


def _samples(text: str) -> Iterable[tuple[str, dict[str, str], float]]:
    """Every (name, labels, value) the reference parser reads from ``text``.

    The parser stops at the first line it cannot read (``ValueError``), which would lose the rest of
    a page because of one truncated line. Its errors are per line (a sample's syntax, a HELP/TYPE
    line's name), so on a failure each line is tried alone and the ones that fail are dropped; the
    rest is parsed again in its original order, so TYPE context (``_total`` on counters) is kept.
    """
    if not isinstance(text, str):
        return []
    try:
        return [(s.name, dict(s.labels), s.value)
                for fam in text_string_to_metric_families(text) for s in fam.samples]
    except Exception:
        pass
    kept = "\n".join(ln for ln in text.split("\n") if _parses(ln))
    try:
        return [(s.name, dict(s.labels), s.value)
                for fam in text_string_to_metric_families(kept) for s in fam.samples]
    except Exception:  # not expected after the filter; never let a page raise
        return []


def _le(v: str | None) -> float | None:
    if v is None:
        return None
    try:
        f = float(v)  # "+Inf" reads as inf
    except ValueError:
        return None
    return None if math.isnan(f) else f


def parse_metrics(text: str) -> list[EngineMetrics]:
    """One :class:`EngineMetrics` per (kind, model, engine) label set found in a ``/metrics`` page, in
    the order first seen. Text that is not a metrics page, or has none of the engines' metrics, gives
    ``[]``; so does a page :func:`page_refusal` refuses (too large to read: it is not parsed); a line
    that cannot be read is skipped, never an exception."""
    if page_refusal(text) is not None:
        return []
    try:
        return [_checked(e) for e in _parse_metrics(text)]
    except Exception:  # the last line of defence, as in probe.parsers: odd input is never a traceback
        return []


def _bad_hist(h: Histogram) -> str | None:
    if (h.count is not None and h.count < 0) or (h.sum is not None and h.sum < 0):
        return "a negative count or sum"
    if any(c < 0 for _, c in h.buckets):
        return "a negative bucket count"
    return None


def _checked(e: EngineMetrics) -> EngineMetrics:
    """``e`` with every figure no engine can have set to ``None`` and said in ``invalid``: a counter
    below zero, a gauge below zero or past :data:`GAUGE_BOUNDS`, a histogram with a negative count."""
    bad: dict[str, str] = {}
    for name in COUNTERS:
        v = getattr(e, name)
        if v is not None and v < 0:
            bad[name] = f"negative counter ({v:g})"
    for name, top in GAUGE_BOUNDS.items():
        v = getattr(e, name)
        if v is not None and (v < 0 or v > top):
            bad[name] = f"{v:g} is outside 0–{top:g}"
    for name in ("ttft", "itl", "e2e", "queue_time"):
        h = getattr(e, name)
        why = _bad_hist(h) if h is not None else None
        if why:
            bad[name] = why
    if not bad:
        return e
    return replace(e, invalid=bad, **dict.fromkeys(bad))


def _parse_metrics(text: str) -> list[EngineMetrics]:
    # key -> field -> (rank, value); histogram parts kept apart until assembled
    scalars: dict[tuple, dict[str, tuple[int, float | None, str]]] = {}
    hists: dict[tuple, dict[str, dict[int, dict]]] = {}
    order: list[tuple] = []
    for name, labels, value in _samples(text):
        hit = _INDEX.get(name)
        if hit is None:
            continue
        kind, fld, rank, part = hit
        model = next((labels[k] for k in ENGINES[kind].metrics.model_labels if labels.get(k)), None)
        key = (kind, model, labels.get("engine"))
        if key not in scalars:
            scalars[key] = {}
            hists[key] = {}
            order.append(key)
        if not part:
            have = scalars[key].get(fld)
            if have is None or rank < have[0]:  # the newer name wins; the first sample of a name wins
                scalars[key][fld] = (rank, _finite(value), name)
            continue
        h = hists[key].setdefault(fld, {}).setdefault(rank, {"buckets": {}, "count": None, "sum": None,
                                                             "name": name[: -len(part)]})
        v = _finite(value)
        if part == "_bucket":
            le = _le(labels.get("le"))
            if le is not None and v is not None:
                h["buckets"].setdefault(le, v)
        elif h[part[1:]] is None:
            h[part[1:]] = v
    out = []
    for key in order:
        kind, model, engine = key
        values: dict[str, object] = {}
        sources: dict[str, str] = {}
        for fld, (_rank, v, src) in scalars[key].items():
            values[fld] = v
            sources[fld] = src
        for fld, by_rank in hists[key].items():
            best = by_rank[min(by_rank)]
            values[fld] = Histogram(tuple(sorted(best["buckets"].items())), best["count"], best["sum"])
            sources[fld] = best["name"]
        out.append(EngineMetrics(kind=kind, model=model, engine=engine, sources=sources,
                                 **values))  # type: ignore[arg-type]
    return out


def rate(prev: float | None, cur: float | None, dt: float | None) -> float | None:
    """Per-second increase of a counter between two scrapes ``dt`` seconds apart.

    ``None`` without a previous value, without a positive ``dt``, or when the counter went down: a
    counter only falls when the engine restarted, and the new value counts from an instant inside
    the window that the page does not tell, so no rate over ``dt`` would be true (and a negative
    one would be nonsense). The next pair of scrapes gives a rate again.
    """
    p, c, d = _finite(prev), _finite(cur), _finite(dt)
    if p is None or c is None or d is None or d <= 0 or c < p:
        return None
    return (c - p) / d


def _reset(prev: Histogram, cur: Histogram) -> bool:
    if [le for le, _ in prev.buckets] != [le for le, _ in cur.buckets]:
        return True  # other bucket bounds: another engine (or config) answers now
    if prev.count is not None and cur.count is not None and cur.count < prev.count:
        return True
    return any(c < p for (_, p), (_, c) in zip(prev.buckets, cur.buckets, strict=True))


def window_buckets(prev: Histogram | None, cur: Histogram | None) -> tuple[tuple[float, float], ...]:
    """The cumulative bucket counts of the observations made between two scrapes.

    Without ``prev``, ``cur``'s own buckets (everything since the engine started). After a reset (a
    count went down, or the bounds changed) also ``cur`` alone: the engine restarted inside the
    window, its counters began again at zero, so ``cur`` holds exactly the observations made since
    the restart, all of them inside the window; the ones before the restart are lost either way.
    Prometheus' ``increase()`` treats a counter reset the same way (the value after it is the increase).
    """
    if cur is None:
        return ()
    if prev is None or _reset(prev, cur):
        return cur.buckets
    return tuple((le, c - p) for (le, c), (_, p) in zip(cur.buckets, prev.buckets, strict=True))


def bucket_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """Prometheus' ``histogram_quantile`` on cumulative ``(le, count)`` buckets; ``None`` where it
    gives NaN or ±Inf (nothing a dashboard can show as a latency).

    The semantics are Prometheus' (``promql/quantile.go``, ``bucketQuantile``; documented at
    https://prometheus.io/docs/prometheus/latest/querying/functions/#histogram_quantile):
    buckets sorted by upper bound, the highest must be ``+Inf`` (else NaN), equal bounds merged,
    counts forced monotonic, at least two buckets, NaN without observations; ``rank = q × total``;
    the first bucket whose count reaches the rank holds the quantile, found by linear interpolation
    between that bucket's lower bound (the previous bucket's ``le``, or 0 for the first) and its
    upper bound, assuming observations spread evenly in it; a rank in the ``+Inf`` bucket returns
    the highest finite bound; a first bucket with a bound ≤ 0 returns that bound.
    """
    qf = _finite(q)
    if qf is None or qf < 0 or qf > 1:
        return None
    merged: dict[float, float] = {}
    for le, c in buckets:
        lf, cf = _finite(le) if le != math.inf else math.inf, _finite(c)
        if lf is None or cf is None:
            continue
        merged[lf] = merged.get(lf, 0.0) + cf
    bs = sorted(merged.items())
    if len(bs) < 2 or bs[-1][0] != math.inf:
        return None
    mono: list[tuple[float, float]] = []
    top = -math.inf
    for le, c in bs:
        top = max(top, c)
        mono.append((le, top))
    observations = mono[-1][1]
    if observations <= 0:
        return None
    rank = qf * observations
    b = next((i for i in range(len(mono) - 1) if mono[i][1] >= rank), len(mono) - 1)
    if b == len(mono) - 1:
        return mono[-2][0]
    if b == 0 and mono[0][0] <= 0:
        return mono[0][0]
    start, end, count = 0.0, mono[b][0], mono[b][1]
    if b > 0:
        start = mono[b - 1][0]
        count -= mono[b - 1][1]
        rank -= mono[b - 1][1]
    if count <= 0:  # only at q=0 with an empty first bucket: 0/0, NaN in Prometheus too
        return None
    return start + (end - start) * (rank / count)


def window_quantile(prev: Histogram | None, cur: Histogram | None, q: float) -> float | None:
    """The ``q`` quantile (0–1) of the observations made between two scrapes: Prometheus'
    ``histogram_quantile(q, increase(h_bucket[window]))`` on two samples (:func:`window_buckets`,
    :func:`bucket_quantile`). ``None`` when nothing was observed in the window, or the page lacks the
    ``+Inf`` bucket; after a restart the observations since it (``cur`` alone)."""
    try:
        return bucket_quantile(q, window_buckets(prev, cur))
    except Exception:
        return None


def prefix_hit_rate(prev: EngineMetrics | None, cur: EngineMetrics) -> float | None:
    """The share (0–1) of prefix-cache queries that hit, over the window between two scrapes, or since
    the engine started without ``prev``. vLLM counts both in tokens (blocks before V1), so the ratio
    is the share of prompt tokens served from the cache. ``None`` without queries in the window (0/0
    is not 0 %); after a restart the counts since it (``cur`` alone), as for histograms."""
    q1, h1 = _finite(cur.prefix_cache_queries), _finite(cur.prefix_cache_hits)
    if q1 is None or h1 is None:
        return None
    q0 = _finite(prev.prefix_cache_queries) if prev is not None else None
    h0 = _finite(prev.prefix_cache_hits) if prev is not None else None
    if q0 is not None and h0 is not None and q1 >= q0 and h1 >= h0:
        q1, h1 = q1 - q0, h1 - h0
    if q1 <= 0 or h1 < 0:
        return None
    return min(h1 / q1, 1.0)


def _hist_dict(h: Histogram | None) -> dict[str, float | None]:
    return {"count": h.count if h else None, "sum": h.sum if h else None}


def contract_dict(engines: Iterable[EngineMetrics]) -> dict[str, list[dict[str, object]]]:
    """The JSON of ``sparkconsole parse vllm-metrics``: every key always there, ``null`` where absent."""
    return {"engines": [{
        "kind": e.kind, "model": e.model, "engine": e.engine, "version": e.version,
        "requests_running": e.requests_running, "requests_waiting": e.requests_waiting,
        "kv_cache_usage": e.kv_cache_usage,
        "prompt_tokens_total": e.prompt_tokens, "generation_tokens_total": e.generation_tokens,
        "preemptions_total": e.preemptions, "prefix_cache_queries_total": e.prefix_cache_queries,
        "prefix_cache_hits_total": e.prefix_cache_hits, "gen_throughput": e.gen_throughput,
        "histograms": {"ttft": _hist_dict(e.ttft), "itl": _hist_dict(e.itl), "e2e": _hist_dict(e.e2e),
                       "queue_time": _hist_dict(e.queue_time)},
    } for e in engines]}


def sample_pattern() -> str:
    """An extended regex (``grep -E``) for exactly the sample lines :func:`parse_metrics` reads.

    The node filters its own page with it before the text crosses the SSH connection: a full vLLM
    page is ~45 KB (``python_*``, ``process_*``, ``http_*``, ``_created`` and the histograms the
    console does not show), the lines read here are a fraction of it, and the parse costs in
    proportion (``benchmarks/ui_cost.py``). Names come from the same tables the parser uses, so the
    two cannot drift; a name is followed by its labels or by the value (``NAME{`` / ``NAME ``), so
    ``vllm:time_per_output_token_seconds`` never matches ``…request_time_per_output_token…``."""
    scalars = sorted({n for e in ENGINES.values() for names in e.metrics.scalars.values() for n in names})
    hists = sorted({n for e in ENGINES.values() for names in e.metrics.histograms.values() for n in names})
    return "^(" + "|".join(scalars) + "|(" + "|".join(hists) + ")_(bucket|count|sum))[{ ]"
