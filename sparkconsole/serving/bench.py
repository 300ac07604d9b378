"""Benchmarks with the tools people publish results from (issue 24, item 4): ``vllm bench serve`` (its
``--save-result`` JSON, its stdout as a fallback) and ``llama-benchy`` (its ``--format md`` table, the
format Spark Arena collects), read into one typed row per concurrency; the commands that run them on
the head (built in :mod:`sparkconsole.remote`); the runs kept per deployment, and two runs side by side.

Pure but for :func:`save_run`/:func:`load_runs` (files under the console's state directory). Parsers
never raise on odd text: what they cannot read is ``None`` ("unknown stays unknown"), a text with
nothing of its tool in it gives no row.

What each tool measures, read honestly:

* ``vllm bench serve``: ``total_input_tokens / duration`` is the prompt tok/s (the tool prints no such
  line: the figure is the run's, over its whole duration), ``output_throughput`` the generation tok/s,
  TTFT and ITL percentiles in ms (→ s). One run per concurrency (``--max-concurrency C``).
* ``llama-benchy``: per concurrency a ``ppN (cC)`` row (prompt tok/s in ``t/s (total)``, TTFT in
  ``ttfr (ms)``) and a ``tgM (cC)`` row (generation tok/s in ``t/s (total)``); values are ``mean ± std``
  over its runs. It reports no percentiles: ``ttft_p50_s``/``ttft_p95_s``/``itl_p50_s`` are ``None``
  and the means are kept in ``ttft_mean_s``.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sparkconsole.errors import UserError, ValidationError

#: the benchmark tools: ``vllm bench serve`` inside a vLLM engine's own container (an engine names
#: it as its ``bench_tool``), and llama-benchy from ``uvx`` on the node for any OpenAI endpoint (a pinned
#: release: :data:`sparkconsole.remote.LLAMA_BENCHY_VERSION`)
VLLM_BENCH = "vllm"
LLAMA_BENCHY = "llama-benchy"
TOOLS = (VLLM_BENCH, LLAMA_BENCHY)
TOOL_NAMES = {VLLM_BENCH: "vllm bench serve", LLAMA_BENCHY: "llama-benchy"}
# the fields ``bench --json`` gives per row (the issue's, plus the tool that measured it)
JSON_FIELDS = ("concurrency", "requests", "prompt_tokens_per_s", "generation_tokens_per_s", "ttft_p50_s",
               "ttft_p95_s", "itl_p50_s", "tool")
RESULT_DIR = "/tmp/sparkconsole-bench"  # in the engine's container: where vllm bench writes its JSON
DEFAULT_TIME_LIMIT_S = 600


@dataclass(frozen=True)
class BenchRow:
    """One concurrency's figures, as one tool measured them. Seconds and tokens per second; ``None``
    where the tool reports nothing."""

    concurrency: int | None
    requests: int | None  # requests that completed
    prompt_tokens_per_s: float | None
    generation_tokens_per_s: float | None
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    itl_p50_s: float | None
    tool: str
    itl_p95_s: float | None = None
    ttft_mean_s: float | None = None
    itl_mean_s: float | None = None
    failed: int | None = None
    duration_s: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def json_row(self) -> dict[str, Any]:
        """The row as ``bench --json`` prints it: exactly :data:`JSON_FIELDS`."""
        d = self.to_dict()
        return {k: d[k] for k in JSON_FIELDS}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchRow:
        names = {f for f in cls.__dataclass_fields__}
        kw = {k: v for k, v in data.items() if k in names}
        kw.setdefault("tool", "")
        for k in JSON_FIELDS:
            kw.setdefault(k, None)
        return cls(**kw)


# ---- vllm bench serve ---------------------------------------------------------------------------

def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def _ms(v: Any) -> float | None:
    f = _num(v)
    return None if f is None else f / 1000.0


def _int(v: Any) -> int | None:
    f = _num(v)
    return None if f is None else int(f)


def strip_hash_header(text: str) -> str:
    """``text`` without its leading ``#`` lines (a fixture's source header)."""
    lines = text.splitlines()
    while lines and lines[0].startswith("#"):
        lines.pop(0)
    return "\n".join(lines)


def parse_vllm_bench_result(json_text: str) -> BenchRow | None:
    """The row of one ``vllm bench serve --save-result`` JSON; ``None`` when it is not one."""
    try:
        d = json.loads(strip_hash_header(json_text or ""))
    except (ValueError, TypeError):
        return None
    if not isinstance(d, dict) or not any(k in d for k in ("output_throughput", "completed", "p50_ttft_ms")):
        return None
    duration = _num(d.get("duration"))
    total_in = _int(d.get("total_input_tokens"))
    prompt_tps = total_in / duration if total_in is not None and duration else None
    conc = _int(d.get("max_concurrency"))
    return BenchRow(
        concurrency=conc, requests=_int(d.get("completed")), prompt_tokens_per_s=prompt_tps,
        generation_tokens_per_s=_num(d.get("output_throughput")),
        ttft_p50_s=_ms(d.get("p50_ttft_ms", d.get("median_ttft_ms"))), ttft_p95_s=_ms(d.get("p95_ttft_ms")),
        itl_p50_s=_ms(d.get("p50_itl_ms", d.get("median_itl_ms"))), tool=VLLM_BENCH,
        itl_p95_s=_ms(d.get("p95_itl_ms")), ttft_mean_s=_ms(d.get("mean_ttft_ms")), itl_mean_s=_ms(d.get("mean_itl_ms")),
        failed=_int(d.get("failed")), duration_s=duration, input_tokens=total_in,
        output_tokens=_int(d.get("total_output_tokens")))


_LINE = re.compile(r"^\s*([A-Za-z][^:]*?):\s+(-?[0-9.]+|inf|nan)\s*$")
_RESULT_HEAD = re.compile(r"^=+ ?Serving Benchmark Result ?=+\s*$")
_NS_CONC = re.compile(r"\bmax_concurrency=(\d+|None)")


def parse_vllm_bench_stdout(text: str) -> list[BenchRow]:
    """The rows of ``vllm bench serve``'s printed results (one per result block; the fallback when the
    JSON cannot be read). The concurrency is the block's ``Maximum request concurrency`` line, else the
    ``Namespace(... max_concurrency=N ...)`` line before it, else ``None``."""
    rows: list[BenchRow] = []
    block: dict[str, float] | None = None
    ns_conc: int | None = None
    for raw in (text or "").splitlines():
        line = raw.rstrip()
        m = _NS_CONC.search(line)
        if m and line.startswith("Namespace("):
            ns_conc = int(m.group(1)) if m.group(1).isdigit() else None
        if _RESULT_HEAD.match(line):
            if block is not None:
                rows.append(_stdout_row(block, ns_conc))
            block = {}
            continue
        if block is None:
            continue
        if re.fullmatch(r"=+", line.strip()):
            rows.append(_stdout_row(block, ns_conc))
            block = None
            continue
        lm = _LINE.match(line)
        if lm:
            try:
                block[lm.group(1).strip()] = float(lm.group(2))
            except ValueError:
                continue
    if block:
        rows.append(_stdout_row(block, ns_conc))
    return rows


def _stdout_row(b: dict[str, float], ns_conc: int | None) -> BenchRow:
    def ms(*names: str) -> float | None:
        for n in names:
            if n in b and math.isfinite(b[n]):
                return b[n] / 1000.0
        return None

    duration = b.get("Benchmark duration (s)")
    total_in = b.get("Total input tokens")
    conc = b.get("Maximum request concurrency")
    return BenchRow(
        concurrency=int(conc) if conc is not None else ns_conc,
        requests=int(b["Successful requests"]) if "Successful requests" in b else None,
        prompt_tokens_per_s=total_in / duration if total_in is not None and duration else None,
        generation_tokens_per_s=b.get("Output token throughput (tok/s)"),
        ttft_p50_s=ms("P50 TTFT (ms)", "Median TTFT (ms)"), ttft_p95_s=ms("P95 TTFT (ms)"),
        itl_p50_s=ms("P50 ITL (ms)", "Median ITL (ms)"), tool=VLLM_BENCH, itl_p95_s=ms("P95 ITL (ms)"),
        ttft_mean_s=ms("Mean TTFT (ms)"), itl_mean_s=ms("Mean ITL (ms)"),
        failed=int(b["Failed requests"]) if "Failed requests" in b else None, duration_s=duration,
        input_tokens=int(total_in) if total_in is not None else None,
        output_tokens=int(b["Total generated tokens"]) if "Total generated tokens" in b else None)


# ---- llama-benchy ---------------------------------------------------------------------------------

_TEST = re.compile(r"^(pp|tg)(\d+)(?:\s*@\s*d(\d+))?(?:\s*\(c(\d+)\))?$")
_MEAN = re.compile(r"^\s*(-?[0-9.]+)(?:\s*±\s*(-?[0-9.]+))?\s*$")
_BATCH = re.compile(r"^\s*Run \d+/\d+ \(batch size (\d+)\)")


def _mean(cell: str) -> float | None:
    m = _MEAN.match(cell or "")
    if not m:
        return None
    try:
        f = float(m.group(1))
    except ValueError:
        return None
    return f if math.isfinite(f) else None


def parse_llama_benchy(text: str) -> list[BenchRow]:
    """The rows of ``llama-benchy --format md``: one per concurrency (and depth, where it has several),
    prompt tok/s from the ``pp`` row's ``t/s (total)``, generation tok/s from the ``tg`` row's, the mean
    TTFT from the ``pp`` row's ``ttfr (ms)``. No percentiles: those fields stay ``None``. ``requests``
    is the requests its runs sent (the ``Run i/K (batch size C)`` lines), ``None`` when not printed."""
    header: list[str] | None = None
    found: dict[tuple[int, int], dict[str, Any]] = {}
    sent: dict[int, int] = {}
    for raw in (text or "").splitlines():
        bm = _BATCH.match(raw)
        if bm:
            c = int(bm.group(1))
            sent[c] = sent.get(c, 0) + c
            continue
        line = raw.strip()
        if not (line.startswith("|") and line.endswith("|")):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if "test" in cells and any(c.startswith("t/s") for c in cells):
            header = cells
            continue
        if header is None or len(cells) != len(header) or all(set(c) <= set(":- ") for c in cells):
            continue
        row = dict(zip(header, cells, strict=True))
        tm = _TEST.match(row.get("test", ""))
        if not tm:
            continue
        kind, depth, conc = tm.group(1), int(tm.group(3) or 0), int(tm.group(4) or 1)
        slot = found.setdefault((conc, depth), {})
        total = _mean(row.get("t/s (total)", row.get("t/s", "")))
        if kind == "pp":
            slot["pp"] = total
            ttfr = _mean(row.get("ttfr (ms)", ""))
            slot["ttft"] = ttfr / 1000.0 if ttfr is not None else None
        else:
            slot["tg"] = total
            req = _mean(row.get("t/s (req)", ""))
            slot["itl"] = 1.0 / req if req else None
    rows = []
    for (conc, _depth), s in sorted(found.items()):
        rows.append(BenchRow(concurrency=conc, requests=sent.get(conc), prompt_tokens_per_s=s.get("pp"),
                             generation_tokens_per_s=s.get("tg"), ttft_p50_s=None, ttft_p95_s=None,
                             itl_p50_s=None, tool="llama-benchy", ttft_mean_s=s.get("ttft"),
                             itl_mean_s=s.get("itl")))
    return rows


# ---- the commands, and what they print ------------------------------------------------------------

def result_filename(stamp: str, concurrency: int) -> str:
    return f"bench-{stamp}-c{concurrency}.json"


def bench_commands(engine_port: int, served_name: str, tokenizer: str | None, container: str | None,
                   concurrencies: Sequence[int], requests: int, input_len: int, output_len: int, tool: str,
                   *, key_file: str | None = None, stamp: str | None = None,
                   time_limit_s: int = DEFAULT_TIME_LIMIT_S) -> list:
    """The commands that benchmark one engine on the head, in order (a list of
    :class:`~sparkconsole.remote.RemoteCommand`): with ``tool=VLLM_BENCH`` one ``vllm bench serve`` per
    concurrency in the engine's ``container`` (each prints its stdout, then the JSON it saved, in
    sections :func:`rows_from_outputs` reads); with ``"llama-benchy"`` one ``uvx llama-benchy`` (the
    pinned :data:`~sparkconsole.remote.LLAMA_BENCHY_VERSION`) for every concurrency. ``requests`` is per concurrency (at least the concurrency itself); each command
    is bounded by ``time_limit_s``. ``key_file``: the head's API key file, for an engine that wants one
    (its value is read by the head's shell, never in the text)."""
    from sparkconsole import remote as R

    concs = _check_concurrencies(concurrencies)
    if tool not in TOOLS:
        raise ValidationError(f"not a benchmark tool: {tool!r} (choose {', '.join(TOOLS)})")
    stamp = stamp or new_stamp()
    if tool == VLLM_BENCH:
        if container is None:
            raise ValidationError("vllm bench serve runs in the engine's container: this engine has none")
        return [R.vllm_bench_serve(container, engine_port, served_name, tokenizer or served_name,
                                   concurrency=c, num_prompts=max(requests, c), input_len=input_len,
                                   output_len=output_len, result_dir=RESULT_DIR,
                                   result_filename=result_filename(stamp, c), time_limit_s=time_limit_s,
                                   key_file=key_file)
                for c in concs]
    runs = max(1, min(10, requests // max(concs)))
    # llama-benchy takes a key only as --api-key: read from the key file by the head's shell (never in
    # this text), but on its command line on the head while it runs (remote.llama_benchy says so)
    return [R.llama_benchy(engine_port, served_name, concs, input_len, output_len, runs=runs,
                           tokenizer=tokenizer, time_limit_s=time_limit_s, key_file=key_file)]


def _check_concurrencies(concurrencies: Sequence[int]) -> list[int]:
    concs = list(concurrencies)
    if not concs or any(isinstance(c, bool) or not isinstance(c, int) or not 1 <= c <= 1024 for c in concs):
        raise ValidationError(f"concurrencies must be whole numbers from 1 to 1024: {concs!r}")
    return concs


def rows_from_outputs(tool: str, texts: Iterable[str]) -> list[BenchRow]:
    """The rows of what :func:`bench_commands`' commands printed, one text per command: for vLLM the
    saved JSON (section ``result``), else the printed results (section ``bench``, or the whole text);
    for llama-benchy its table. Rows without a concurrency take none; nothing here raises."""
    from sparkconsole.probe.script import split_tick
    from sparkconsole.remote import SECTION_MARK

    rows: list[BenchRow] = []
    for text in texts:
        text = text or ""
        if tool == "llama-benchy":
            rows += parse_llama_benchy(text)
            continue
        secs = split_tick(text.splitlines(), mark=SECTION_MARK) if SECTION_MARK in text else {}
        res, out = secs.get("result"), secs.get("bench")
        row = parse_vllm_bench_result(res.text) if res is not None else None
        if row is None:
            row = parse_vllm_bench_result(text)
        if row is not None:
            rows.append(row)
            continue
        rows += parse_vllm_bench_stdout(out.text if out is not None else text)
    return rows


def section_rc(text: str, name: str) -> int | None:
    """The exit code a sectioned command's section ``name`` reported (``None``: not there)."""
    from sparkconsole.probe.script import split_tick
    from sparkconsole.remote import SECTION_MARK

    sec = split_tick((text or "").splitlines(), mark=SECTION_MARK).get(name)
    return getattr(sec, "rc", None) if sec is not None else None


def section_text(text: str, name: str) -> str:
    from sparkconsole.probe.script import split_tick
    from sparkconsole.remote import SECTION_MARK

    sec = split_tick((text or "").splitlines(), mark=SECTION_MARK).get(name)
    return sec.text if sec is not None else ""


# ---- choosing the engine ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    """An engine to benchmark: the discovered engine, the model it loaded (the tokenizer vLLM's bench
    needs: the served name is often not a Hub id), and whether it serves chat at all."""

    engine: Any  # sparkconsole.serving.discover.Engine
    model_path: str | None
    pooling: bool


def targets(stdout: str, node: str = "") -> list[Target]:
    """The engines of :func:`sparkconsole.remote.engine_cmdlines`' output with what bench needs (read
    by discovery itself: :attr:`~sparkconsole.serving.discover.Engine.model_path` and ``pooling``)."""
    from sparkconsole.serving.discover import discover

    return [Target(e, e.model_path, e.pooling) for e in discover(stdout, node=node)]


def pick_target(found: Sequence[Target], port: int | None = None, model: str | None = None) -> Target:
    """The engine to benchmark: the one on ``port`` (or serving ``model``), else the first one that
    serves chat. A one-line :class:`UserError` when there is none."""
    if port is not None:
        for t in found:
            if t.engine.port == port:
                return t
        raise UserError(f"no engine on port {port} on the head (found: {_listing(found)})", exit_code=1)
    if model is not None:
        for t in found:
            if t.engine.model == model:
                return t
        raise UserError(f"no engine serves {model!r} on the head (found: {_listing(found)})", exit_code=1)
    for t in found:
        if not t.pooling:
            return t
    raise UserError(f"no engine that serves chat on the head (found: {_listing(found)}); pass --port",
                    exit_code=1)


def _listing(found: Sequence[Target]) -> str:
    return ", ".join(f"{t.engine.model or '?'}:{t.engine.port}" for t in found) or "none"


# ---- a run, kept per deployment ----------------------------------------------------------------------

def new_stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def deployment_key(cluster: str, node: str, model: str | None, port: int) -> str:
    """What runs are kept under: the cluster, the head, the served model and its port (a deployment's
    endpoint). Two runs of one key compare side by side."""
    return f"{cluster}/{node}/{model or '?'}:{port}"


@dataclass
class BenchRun:
    """One benchmark of one engine: what ran, with which settings, and its rows."""

    id: str
    key: str
    created: str
    tool: str
    cluster: str
    node: str
    model: str | None
    port: int
    settings: dict[str, Any] = field(default_factory=dict)
    rows: list[BenchRow] = field(default_factory=list)
    engine_max_concurrency: float | None = None  # the engine's own figure at its context (its log)
    deployment: str | None = None
    plan_max_concurrency: float | None = None  # the planner's figure, from the deployment that served it

    @classmethod
    def new(cls, cluster: str, node: str, model: str | None, port: int, tool: str, rows: list[BenchRow],
            settings: dict[str, Any], *, run_id: str | None = None, **figures: Any) -> BenchRun:
        """A run made now, kept under its endpoint's key (``figures``: the concurrency figures and the
        deployment it belongs to): ``sparkconsole bench`` and the wizard's step make theirs the same way."""
        from datetime import UTC, datetime

        return cls(id=run_id or new_stamp(), key=deployment_key(cluster, node, model, port),
                   created=datetime.now(UTC).isoformat(timespec="seconds"), tool=tool, cluster=cluster, node=node,
                   model=model, port=port, settings=settings, rows=rows, **figures)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rows"] = [r.to_dict() for r in self.rows]
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchRun:
        try:
            return cls(id=str(data["id"]), key=str(data["key"]), created=str(data.get("created") or ""),
                       tool=str(data.get("tool") or ""), cluster=str(data.get("cluster") or ""),
                       node=str(data.get("node") or ""), model=data.get("model"), port=int(data.get("port") or 0),
                       settings=dict(data.get("settings") or {}),
                       rows=[BenchRow.from_dict(r) for r in data.get("rows") or []],
                       engine_max_concurrency=_num(data.get("engine_max_concurrency")),
                       deployment=data.get("deployment"),
                       plan_max_concurrency=_num(data.get("plan_max_concurrency")))
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"benchmark run is not readable: {exc}") from exc


def bench_root() -> Path:
    from sparkconsole.config import state_dir

    return state_dir() / "bench"


def _key_dir(key: str, root: Path | None) -> Path:
    from sparkconsole.durable import file_name_for

    return (root if root is not None else bench_root()) / file_name_for(key)


def save_run(run: BenchRun, root: str | os.PathLike[str] | None = None) -> Path:
    """Write ``run`` as ``<root>/<key>/<id>.json`` (mode 0600), atomically: a temporary file, every
    byte or an error, ``fsync``, ``rename``."""
    from sparkconsole.durable import replace_file
    from sparkconsole.journal import redact

    d = _key_dir(run.key, Path(root) if root is not None else None)
    d.mkdir(parents=True, exist_ok=True)
    target = d / f"{run.id}.json"
    data = redact(json.dumps(run.to_dict(), indent=1, sort_keys=True)).encode()
    try:
        return replace_file(target, data)
    except OSError as exc:
        raise UserError(f"the benchmark could not be saved ({exc.strerror or exc})", exit_code=1) from None


def load_runs(key: str, root: str | os.PathLike[str] | None = None) -> list[BenchRun]:
    """Every readable run kept under ``key``, oldest first (an unreadable file is passed over)."""
    d = _key_dir(key, Path(root) if root is not None else None)
    runs = []
    for path in d.glob("*.json") if d.is_dir() else []:
        try:
            runs.append(BenchRun.from_dict(json.loads(path.read_text())))
        except (OSError, ValueError, UserError):
            continue
    runs.sort(key=lambda r: (r.created, r.id))
    return runs


# ---- two runs side by side --------------------------------------------------------------------------

COMPARED = ("prompt_tokens_per_s", "generation_tokens_per_s", "ttft_p50_s", "ttft_p95_s", "itl_p50_s")


def compare_runs(old: BenchRun | Sequence[BenchRow], new: BenchRun | Sequence[BenchRow]) -> list[dict[str, Any]]:
    """Rows of old vs new by concurrency (every concurrency either has, in order): per compared field
    ``{"old", "new", "change_pct"}`` (``change_pct`` ``None`` where either is unknown or old is 0)."""
    o = old.rows if isinstance(old, BenchRun) else list(old)
    n = new.rows if isinstance(new, BenchRun) else list(new)
    by_o = {r.concurrency: r for r in o}
    by_n = {r.concurrency: r for r in n}
    concs = sorted({*by_o, *by_n}, key=lambda c: (c is None, c or 0))
    out = []
    for c in concs:
        a, b = by_o.get(c), by_n.get(c)
        row: dict[str, Any] = {"concurrency": c}
        for f in COMPARED:
            va = getattr(a, f) if a is not None else None
            vb = getattr(b, f) if b is not None else None
            pct = (vb - va) / va * 100.0 if va and vb is not None else None
            row[f] = {"old": va, "new": vb, "change_pct": pct}
        out.append(row)
    return out
