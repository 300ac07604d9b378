"""One engine watched over time: its scrapes, and the figures an operator reads from them.

The poller (:mod:`sparkconsole.probe.poller`) finds a node's engines (:mod:`.discover`) and reads
each one's ``/metrics`` page every few ticks; every read lands here with :meth:`EngineWatch.record`.
What the console shows is :meth:`EngineWatch.figures`: gauges from the last page, rates from the
last two (a counter that went down is a restart: no rate, never a negative one), latency
percentiles from histogram bucket differences over one and five minutes, as Prometheus'
``histogram_quantile(q, increase(h[5m]))`` would give them (:mod:`.metrics`).

Windows: the reference page of a window is the newest one at least that old. While the console
has watched the engine for less than the window, it is the first page read, so the figure covers
what the console has watched (a benchmark started a few seconds after the console shows at once);
with one page only (``snapshot``) it covers the engine's whole life (its counters start at zero
with it). Either way a true percentile of what the engine served, never a made-up one.

Pure data, no Textual, no I/O: the UI, ``snapshot --json`` and the alerts read the same figures.
"""

from __future__ import annotations

import hashlib
import re
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from sparkconsole.serving import engines as engine_kinds
from sparkconsole.serving.discover import Engine
from sparkconsole.serving.metrics import (
    EngineMetrics,
    Histogram,
    page_refusal,
    parse_metrics,
    prefix_hit_rate,
    rate,
    window_quantile,
)

KEEP_S = 330.0  # pages kept: five minutes and a margin for the 5-minute window's reference
HISTORY_POINTS = 120  # the sparkline's points (one per read)
WINDOWS = (60.0, 300.0)
# When an engine that answered stops answering: after this many reads in a row, while its
# container (or process) still runs, the console says so (an alert, and "no answer" in its line)
SILENT_AFTER = 2


@dataclass(frozen=True)
class EngineFigures:
    """What one engine is doing, as the console shows it; ``None`` where not known (yet)."""

    node: str
    port: int
    kind: str
    model: str | None
    where: str
    image: str | None
    version: str | None
    answering: bool  # the last read gave a page with the engine's metrics
    reason: str  # why not, in words ("" while answering)
    read_at: float | None  # when the last good page was read
    requests_running: float | None = None
    requests_waiting: float | None = None
    kv_cache_usage: float | None = None
    prompt_tokens_per_s: float | None = None
    generation_tokens_per_s: float | None = None
    ttft_p50_s: float | None = None  # over 1 minute
    ttft_p95_s: float | None = None
    itl_p50_s: float | None = None
    itl_p95_s: float | None = None
    ttft_p50_5m_s: float | None = None
    ttft_p95_5m_s: float | None = None
    itl_p50_5m_s: float | None = None
    itl_p95_5m_s: float | None = None
    queue_p50_s: float | None = None  # 1 minute
    queue_p95_s: float | None = None
    e2e_p50_s: float | None = None  # 5 minutes
    prefix_hit_rate: float | None = None  # 5 minutes
    preemptions: float | None = None  # since the engine started
    preemptions_1m: float | None = None  # in the last minute
    waiting_rising: bool = False  # the queue grew over the last reads
    #: figures the last page gave that no engine can have, refused (shown as unknown): field -> why
    invalid: dict[str, str] = field(default_factory=dict)
    #: percentiles that fell in their histogram's first bucket, by field, with that bucket's bound: the
    #: value is Prometheus' interpolation inside it (all-zero queue times read as half of vLLM's first
    #: 0.3 s bound), so a screen says "< 300 ms" rather than a precise-looking 150 ms
    below: dict[str, float] = field(default_factory=dict)

    def contract_dict(self) -> dict[str, object]:
        """``snapshot --json``'s ``engines`` entry: every key always there, ``null`` when unknown."""
        return {
            "node": self.node, "port": self.port, "model": self.model, "kind": self.kind,
            "version": self.version, "where": self.where, "image": self.image,
            "answering": self.answering, "reason": self.reason or None,
            "requests_running": self.requests_running, "requests_waiting": self.requests_waiting,
            "kv_cache_usage": self.kv_cache_usage, "prompt_tokens_per_s": self.prompt_tokens_per_s,
            "generation_tokens_per_s": self.generation_tokens_per_s,
            "ttft_p50_s": self.ttft_p50_s, "ttft_p95_s": self.ttft_p95_s,
            "itl_p50_s": self.itl_p50_s, "itl_p95_s": self.itl_p95_s,
            "preemptions": self.preemptions,
        }


def merge(pages: Sequence[EngineMetrics]) -> EngineMetrics | None:
    """The engines one page serves (data-parallel ranks carry their own ``engine`` label) as one:
    counts, counters and histogram buckets add up, KV usage is the fullest rank's (the one that
    preempts first). One page with one engine is returned as it is."""
    if not pages:
        return None
    if len(pages) == 1:
        return pages[0]
    first = pages[0]

    def total(name: str) -> float | None:
        vals = [getattr(p, name) for p in pages if getattr(p, name) is not None]
        return sum(vals) if vals else None

    def hist(name: str) -> Histogram | None:
        hs = [getattr(p, name) for p in pages if getattr(p, name) is not None]
        if not hs:
            return None
        bounds = [le for le, _ in hs[0].buckets]
        if any([le for le, _ in h.buckets] != bounds for h in hs):
            return hs[0]
        buckets = tuple((le, sum(h.buckets[i][1] for h in hs)) for i, le in enumerate(bounds))
        counts = [h.count for h in hs]
        sums = [h.sum for h in hs]
        return Histogram(buckets, None if None in counts else sum(counts),  # type: ignore[arg-type]
                         None if None in sums else sum(sums))  # type: ignore[arg-type]

    kvs = [p.kv_cache_usage for p in pages if p.kv_cache_usage is not None]
    invalid = {k: v for p in pages for k, v in p.invalid.items()}
    merged = EngineMetrics(
        kind=first.kind, model=first.model, engine=None, version=first.version,
        requests_running=total("requests_running"), requests_waiting=total("requests_waiting"),
        kv_cache_usage=max(kvs) if kvs else None, gen_throughput=total("gen_throughput"),
        prompt_tokens=total("prompt_tokens"), generation_tokens=total("generation_tokens"),
        preemptions=total("preemptions"), prefix_cache_queries=total("prefix_cache_queries"),
        prefix_cache_hits=total("prefix_cache_hits"), ttft=hist("ttft"), itl=hist("itl"), e2e=hist("e2e"),
        queue_time=hist("queue_time"), sources=first.sources, invalid=invalid)
    # a figure one rank gave wrong is unknown for the whole engine: the others' sum is not its figure
    return replace(merged, **dict.fromkeys(invalid)) if invalid else merged


def version_from_image(image: str | None) -> str | None:
    """The engine's version when its image's tag says it: the projects' own images are tagged with
    the release (``vllm/vllm-openai:v0.17.0``, ``lmsysorg/sglang:v0.5.4-cu129``); an NGC tag is the
    container release (``nvcr.io/nvidia/vllm:25.09-py3``), not vLLM's, so it says nothing here.
    Neither engine puts its version on ``/metrics``."""
    if not image or ":" not in image.rsplit("/", 1)[-1]:
        return None
    repo, tag = image.rsplit(":", 1)
    engine = engine_kinds.for_image(image)
    if engine is None or repo.rsplit("/", 1)[-1] not in engine.image_repos or repo.startswith("nvcr.io/"):
        return None
    m = re.match(r"v?(\d+\.\d+(?:\.\d+)?(?:rc\d+)?)", tag)
    return m.group(1) if m else None


def _curl_reason(text: str) -> str:
    for line in text.splitlines():
        if line.startswith("curl: ("):
            code, _, msg = line[len("curl: ("):].partition(")")
            msg = msg.strip()
            if code == "7":
                return "not listening (connection refused)"
            if code == "28":
                return "no answer within 2 s"
            return f"curl {code}: {msg}" if msg else f"curl error {code}"
    return ""


@dataclass(eq=False)
class EngineWatch:
    """One engine on one node: the pages read from it over the last five minutes. Compared by
    identity: a screen's cache key holds the watch itself (with ``reads``), never a copy of its pages."""

    engine: Engine
    version: str | None = None
    pages: deque[tuple[float, EngineMetrics]] = field(default_factory=deque)
    history: deque[tuple[float, float | None]] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    reads: int = 0  # every read counted, page or not: what is drawn from the watch changes only with it
    failures: int = 0  # reads in a row without a page
    answered: bool = False  # ever answered
    reason: str = "not read yet"
    _digest: bytes = b""
    _figures: tuple[tuple, EngineFigures] | None = field(default=None, repr=False, compare=False)
    #: what readers derive from this watch (the alerts), kept with it and keyed by ``reads`` by them
    memo: dict[str, tuple] = field(default_factory=dict, repr=False, compare=False)

    def unchanged(self, text: str, rc: int | None) -> bool:
        """Whether ``text`` is the last page read again (an idle engine): :meth:`record` then reuses
        its figures, and a caller that parses big pages away from the event loop need not."""
        return (rc == 0 and bool(self.pages) and page_refusal(text) is None
                and hashlib.blake2b(text.encode("utf-8", "replace"), digest_size=16).digest() == self._digest)

    def record(self, t: float, text: str, rc: int | None, *, parsed: list[EngineMetrics] | None = None) -> None:
        """One read of the page (the probe section's text and exit code). A page identical to the last
        one (an idle engine) is not parsed again: its figures are the last ones, at the new time.
        ``parsed``: ``parse_metrics(text)`` already done (off the event loop, for a big page).

        A page too large to read (:func:`~sparkconsole.serving.metrics.page_refusal`) is refused
        before anything else is done with it (not hashed, not parsed): a failed read, its reason
        said, as long as the engine serves such pages."""
        self.reads += 1
        refused = page_refusal(text)
        if refused is not None:
            self._fail(t, refused)
            return
        digest = hashlib.blake2b(text.encode("utf-8", "replace"), digest_size=16).digest()
        page: EngineMetrics | None
        if digest == self._digest and self.pages and rc == 0:
            page = self.pages[-1][1]
        else:
            page = merge(parse_metrics(text) if parsed is None else parsed) if rc == 0 else None
        if page is None:
            self._fail(t, _curl_reason(text) or ("no answer (read cut short)" if rc is None
                                                 else "the page has no engine metrics"))
            return
        self._digest = digest
        prev = self.pages[-1] if self.pages else None
        self.pages.append((t, page))
        while self.pages and self.pages[0][0] < t - KEEP_S:
            self.pages.popleft()
        self.failures = 0
        self.answered = True
        self.reason = ""
        self.history.append((t, rate(prev[1].generation_tokens, page.generation_tokens, t - prev[0])
                             if prev else None))

    def _fail(self, t: float, reason: str) -> None:
        self.failures += 1
        self._digest = b""
        self.reason = reason
        self.history.append((t, None))

    def _reference(self, now: float, window: float) -> EngineMetrics | None:
        """The newest page at least ``window`` old; while none is, the oldest page read (the window is
        then the time the console has watched); with a single page, None: the engine's whole life."""
        ref = None
        for t, page in self.pages:
            if t <= now - window + 1e-9:
                ref = page
            else:
                break
        if ref is None and len(self.pages) > 1:
            ref = self.pages[0][1]
        return ref

    @property
    def silent(self) -> bool:
        """It answered before and the last reads did not."""
        return self.answered and self.failures >= SILENT_AFTER

    def figures(self, now: float | None = None) -> EngineFigures:
        """The figures as of ``now`` (default: the last read). Kept until the next read: the card,
        the table row, the engine view and every tick's alerts ask for the same figures, and the
        percentiles walk the kept pages (a 32-node console asked for them 32 times a second)."""
        at = self.pages[-1][0] if self.pages else None
        key = (self.reads, None if now is None or now == at else now)
        if self._figures is not None and self._figures[0] == key:
            return self._figures[1]
        f = self._compute(now)
        self._figures = (key, f)
        return f

    def _compute(self, now: float | None) -> EngineFigures:
        e = self.engine
        base = dict(node=e.node, port=e.port, kind=e.kind, model=e.model, where=e.where, image=e.image,
                    version=self.version)
        if not self.pages:
            return EngineFigures(**base, answering=False, reason=self.reason, read_at=None)  # type: ignore[arg-type]
        t, cur = self.pages[-1]
        now = t if now is None else now
        base["model"] = cur.model or e.model
        prev = self.pages[-2] if len(self.pages) > 1 else None
        dt = t - prev[0] if prev else None
        p_rate = rate(prev[1].prompt_tokens, cur.prompt_tokens, dt) if prev else None
        g_rate = rate(prev[1].generation_tokens, cur.generation_tokens, dt) if prev else None
        if g_rate is None and cur.gen_throughput is not None and engine_kinds.get(cur.kind).metrics.rate_gauge:
            g_rate = cur.gen_throughput  # the engine computes its own over its last interval (SGLang)
        r1, r5 = self._reference(now, WINDOWS[0]), self._reference(now, WINDOWS[1])

        below: dict[str, float] = {}

        def q(h: str, ref: EngineMetrics | None, quant: float, name: str) -> float | None:
            hist = getattr(cur, h)
            v = window_quantile(getattr(ref, h) if ref is not None else None, hist, quant)
            first = hist.buckets[0][0] if hist is not None and hist.buckets else None
            if v is not None and first is not None and 0 < first < float("inf") and v <= first:
                below[name] = first
            return v

        pre_1m = None
        if cur.preemptions is not None:
            before = r1.preemptions if r1 is not None else 0.0
            pre_1m = cur.preemptions - before if before is not None and cur.preemptions >= before else cur.preemptions
        waits = [p.requests_waiting for _, p in list(self.pages)[-3:]]
        rising = (len(waits) == 3 and None not in waits and waits[0] < waits[1] < waits[2])  # type: ignore[operator]
        return EngineFigures(
            **base, answering=self.failures == 0, reason=self.reason, read_at=t,  # type: ignore[arg-type]
            requests_running=cur.requests_running, requests_waiting=cur.requests_waiting,
            kv_cache_usage=cur.kv_cache_usage, prompt_tokens_per_s=p_rate, generation_tokens_per_s=g_rate,
            ttft_p50_s=q("ttft", r1, 0.5, "ttft_p50_s"), ttft_p95_s=q("ttft", r1, 0.95, "ttft_p95_s"),
            itl_p50_s=q("itl", r1, 0.5, "itl_p50_s"), itl_p95_s=q("itl", r1, 0.95, "itl_p95_s"),
            ttft_p50_5m_s=q("ttft", r5, 0.5, "ttft_p50_5m_s"), ttft_p95_5m_s=q("ttft", r5, 0.95, "ttft_p95_5m_s"),
            itl_p50_5m_s=q("itl", r5, 0.5, "itl_p50_5m_s"), itl_p95_5m_s=q("itl", r5, 0.95, "itl_p95_5m_s"),
            queue_p50_s=q("queue_time", r1, 0.5, "queue_p50_s"), queue_p95_s=q("queue_time", r1, 0.95, "queue_p95_s"),
            e2e_p50_s=q("e2e", r5, 0.5, "e2e_p50_s"), prefix_hit_rate=prefix_hit_rate(r5, cur),
            preemptions=cur.preemptions, preemptions_1m=pre_1m, waiting_rising=rising, below=below,
            invalid=dict(cur.invalid))

    def rates(self, last: int | None = None) -> list[float | None]:
        """Generation tok/s per read, oldest first (the sparkline); ``None`` where unknown."""
        values = [v for _, v in self.history]
        return values if last is None else values[-last:]
