"""Benchmark tools (issue 24, item 4): ``vllm bench serve`` in a vLLM container and ``uvx llama-benchy``
on a host, answering in their real output formats (``tests/fixtures/real/metrics/vllm-0.20.1-bench-serve-*``
and ``llama-benchy-0.3.7-*``) with figures from the sim's own timing model.

Every request they send is a chat completion registered with the engine through
:func:`sparkconsole.sim.vllm_metrics.chat_started` at the sim time it starts, and the command waits the
sim time the request takes (as ``curl`` does for one completion), so ``/metrics`` moves while a
benchmark runs and the figures the tool prints are the ones the engine counted: TTFT is a request's
``first - t0``, its inter-token latency ``1 / rate``, the run's duration from its first start to its
last end. Requests at concurrency C run C at a time (a new one starts as one ends); the engine's own
scheduler (:mod:`sparkconsole.sim.vllm_metrics`: batch limit, KV blocks, preemption, decode slowing
as the batch grows) decides when each one's tokens come, so the command re-reads each request's end
after every wait and takes its inter-token latency from the request's own timeline.

``vllm bench serve``: its ``--save-result`` JSON goes to ``--result-dir/--result-filename`` in the
container's files (the keys of the real file, in its order); stdout is the run's lines and its result
block (``"{:<40} {:<10}"`` rows, the section rulers), percentiles from ``--metric-percentiles`` (default
99) for ``--percentile-metrics`` (default ttft,tpot,itl). The key comes from ``OPENAI_API_KEY`` (what
its openai backends send as ``Authorization: Bearer``); a wrong or missing one fails the initial test
request, as does a model name the engine does not serve or a port nothing listens on (exit 1).

``llama-benchy`` (0.3.7): warm-up, coherence test, latency, then per concurrency ``--runs`` batches of C
requests of ``--pp`` prompt and ``--tg`` generated tokens, then its markdown table (``mean ± std``; the
sim's requests are alike, so every std is 0). Its key is ``--api-key``. Only hosts that have ``uvx``
run it: a stock DGX OS host has none (``HOST_ABSENT``); other ``uvx`` tools are not modelled.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime

from sparkconsole.sim import vllm_logs, vllm_metrics
from sparkconsole.sim.sh.interp import IO
from sparkconsole.sim.vfs import FsError

BENCHY_VERSION = "0.3.7"
_BAR = "=" * 50


def _percentile(values: list[float], p: float) -> float:
    """numpy's default (linear) percentile, as vLLM's bench computes them."""
    if not values:
        return 0.0
    s = sorted(values)
    k = (len(s) - 1) * p / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _std(values: list[float]) -> float:
    if not values:
        return 0.0
    m = sum(values) / len(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / len(values))


def _opts(args: list[str], multi: frozenset[str] = frozenset()) -> tuple[dict[str, object], set[str]]:
    """``--name value`` / ``--name=value`` options (``multi``: every value up to the next option), flags."""
    out: dict[str, object] = {}
    flags: set[str] = set()
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--"):
            name, eq, val = a[2:].partition("=")
            name = name.replace("_", "-")
            if eq:
                out[name] = [val] if name in multi else val
            elif name in multi:
                vals = []
                while i + 1 < len(args) and not args[i + 1].startswith("--"):
                    vals.append(args[i + 1])
                    i += 1
                out[name] = vals
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                out[name] = args[i + 1]
                i += 1
            else:
                flags.add(name)
        i += 1
    return out, flags


class BenchTools:
    """Mixin: ``vllm bench serve`` (reached from ``DockerTools.c_vllm`` in a container) and ``uvx``."""

    async def _requests(self, run, n: int, concurrency: int, prompt: int, completion: int, tag: str,
                        port: int) -> tuple[list, int, float, float]:
        """Send ``n`` requests ``concurrency`` at a time; (finished requests, failed, start, end) in sim time."""
        done: list = []
        failed = 0
        flight: list = []
        sent = 0
        start = self.now()
        while sent < n or flight:
            now = self.now()
            alive = self.cluster.engine_on_port(self.node_name, port, now) is run
            while alive and sent < n and len(flight) < concurrency:
                flight.append(vllm_metrics.chat_started(run, now, prompt, completion, completion,
                                                        f"{tag}-{sent}"))
                sent += 1
            if not alive:
                for r in flight:
                    vllm_metrics.chat_aborted(run, r, now)
                failed += len(flight) + (n - sent)
                return done, failed, start, now
            nxt = min(r.end for r in flight)
            await self.clock.sleep(max(0.0, nxt - now))
            now = self.now()
            for r in [r for r in flight if r.end <= now + 1e-9]:
                flight.remove(r)
                if self.cluster.engine_on_port(self.node_name, port, now) is run:
                    done.append(r)
                    self._access_log(self.node_name, run, "/v1/chat/completions", "POST", "200 OK")
                else:
                    failed += 1
        return done, failed, start, self.now()

    def _engine_for(self, url: str):
        """(run, port) of the engine a base URL names on this node's loopback, or (None, port)."""
        rest = url.split("://", 1)[-1]
        hostport = rest.split("/", 1)[0]
        host, _, port_s = hostport.partition(":")
        try:
            port = int(port_s or 80)
        except ValueError:
            return None, 0
        if host not in ("127.0.0.1", "localhost", "0.0.0.0"):
            node = self._resolve(host)
            if node is None:
                return None, port
            run = self.cluster.engine_on_port(node.name, port, self.now())
            return (None if run is None or run.host.startswith("127.") else run), port
        return self.cluster.engine_on_port(self.node_name, port, self.now()), port

    # ---- vllm bench serve ----------------------------------------------------------------------

    async def vllm_bench_serve(self, args: list[str], io: IO) -> int:
        o, flags = _opts(args)

        def opt(name: str, default: str) -> str:
            v = o.get(name)
            return v if isinstance(v, str) else default

        try:
            input_len = int(opt("random-input-len", "1024"))
            output_len = int(opt("random-output-len", "128"))
            num = int(opt("num-prompts", "1000"))
            mc = o.get("max-concurrency")
            conc = int(mc) if isinstance(mc, str) else None
        except ValueError as exc:
            io.err(f"vllm bench serve: error: argument: invalid int value: {exc}\n")
            return 2
        base = opt("base-url", "") or f"http://{opt('host', '127.0.0.1')}:{opt('port', '8000')}"
        model = opt("model", "")
        pcts = [float(p) for p in opt("metric-percentiles", "99").split(",") if p.strip()]
        metrics = [m.strip() for m in opt("percentile-metrics", "ttft,tpot,itl").split(",") if m.strip()]
        io.out(f"INFO {self._stamp()} [utils.py:90] Sampling input_len from [{input_len}, {input_len}] and "
               f"output_len from [{output_len}, {output_len}]\n")
        io.out("Starting initial single prompt test run...\n")
        run, port = self._engine_for(base)
        err = None
        if run is None:
            err = f"Cannot connect to host {base.split('://', 1)[-1].split('/')[0]} ssl:default [Connect call failed]"
        elif model and model != run.served_name:
            err = f"The model `{model}` does not exist."
        elif run.api_key and io.env.get("OPENAI_API_KEY") != run.api_key:
            err = "Unauthorized"
        if err is not None:
            await self.clock.sleep(0.05)
            io.err("Traceback (most recent call last):\n  ...\nValueError: Initial test run failed - Please make sure "
                   f"benchmark arguments are correctly specified. Error: {err}\n")
            return 1
        tag = f"bench-{self.now():.3f}"
        _test, failed, _s, _e = await self._requests(run, 1, 1, input_len, output_len, tag + "-test", port)
        if failed:
            io.err("ValueError: Initial test run failed - Please make sure benchmark arguments are correctly "
                   "specified. Error: Server disconnected\n")
            return 1
        io.out("Starting main benchmark run...\n")
        io.out("Traffic request rate: inf\nBurstiness factor: 1.0 (Poisson process)\n")
        io.out(f"Maximum request concurrency: {conc}\n")
        done, failed, start, end = await self._requests(run, num, conc or num, input_len, output_len, tag, port)
        duration = max(end - start, 1e-9)
        ttfts = [r.first - r.t0 for r in done]
        tpots = [(r.end - r.first) / (r.completion - 1) for r in done if r.completion > 1]
        itls = [v for r in done for v, n in _itl(r) for _ in range(int(n))]
        e2els = [r.end - r.t0 for r in done]
        total_in = sum(r.prompt for r in done)
        total_out = sum(r.completion for r in done)
        peak_conc = min(conc or num, num) if done else 0
        peak_out = float(math.floor(peak_conc / min(tpots))) if done and tpots and min(tpots) > 0 else 0.0
        result: dict[str, object] = {
            "date": datetime.fromtimestamp(self.clock.epoch(), UTC).strftime("%Y%m%d-%H%M%S"),
            "endpoint_type": opt("backend", "openai"), "backend": opt("backend", "openai"), "label": None,
            "model_id": model or run.served_name, "tokenizer_id": opt("tokenizer", model or run.served_name),
            "num_prompts": num, "request_rate": "inf", "burstiness": 1.0, "max_concurrency": conc,
            "duration": duration, "completed": len(done), "failed": failed, "total_input_tokens": total_in,
            "total_output_tokens": total_out, "request_throughput": len(done) / duration, "request_goodput": None,
            "output_throughput": total_out / duration, "total_token_throughput": (total_in + total_out) / duration,
            "max_output_tokens_per_s": peak_out, "max_concurrent_requests": peak_conc, "rtfx": 0.0}
        series = {"ttft": ttfts, "tpot": tpots, "itl": itls, "e2el": e2els}
        for m in metrics:
            vals = [v * 1000.0 for v in series.get(m, [])]
            result[f"mean_{m}_ms"] = sum(vals) / len(vals) if vals else 0.0
            result[f"median_{m}_ms"] = _percentile(vals, 50)
            result[f"std_{m}_ms"] = _std(vals)
            for p in pcts:
                result[f"p{p:g}_{m}_ms"] = _percentile(vals, p)
        io.out("tip: install termplotlib and gnuplot to plot the metrics\n")
        io.out(self._result_block(result, metrics, pcts))
        if "save-result" in flags:
            d = opt("result-dir", ".")
            name = opt("result-filename", f"openai-infqps-concurrency{conc}-{model}.json")
            try:
                self.fs.mkdir(d, parents=True, cwd=self.cwd)
                self.fs.write_text(f"{d.rstrip('/')}/{name}", json.dumps(result), self.cwd)
            except FsError as exc:
                io.err(f"OSError: {exc}\n")
                return 1
        return 0

    def _stamp(self) -> str:
        return datetime.fromtimestamp(self.clock.epoch(), UTC).strftime("%m-%d %H:%M:%S")

    @staticmethod
    def _result_block(r: dict[str, object], metrics: list[str], pcts: list[float]) -> str:
        lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")]

        def row(label: str, value: object, fmt: str = "") -> None:
            lines.append(("{:<40} {:<10" + fmt + "}").format(label, value))

        row("Successful requests:", r["completed"])
        row("Failed requests:", r["failed"])
        if r["max_concurrency"] is not None:
            row("Maximum request concurrency:", r["max_concurrency"])
        row("Benchmark duration (s):", r["duration"], ".2f")
        row("Total input tokens:", r["total_input_tokens"])
        row("Total generated tokens:", r["total_output_tokens"])
        row("Request throughput (req/s):", r["request_throughput"], ".2f")
        row("Output token throughput (tok/s):", r["output_throughput"], ".2f")
        row("Peak output token throughput (tok/s):", r["max_output_tokens_per_s"], ".2f")
        row("Peak concurrent requests:", float(r["max_concurrent_requests"]), ".2f")  # type: ignore[arg-type]
        row("Total token throughput (tok/s):", r["total_token_throughput"], ".2f")
        heads = {"ttft": ("Time to First Token", "TTFT"), "tpot": ("Time per Output Token (excl. 1st token)", "TPOT"),
                 "itl": ("Inter-token Latency", "ITL"), "e2el": ("End-to-end Latency", "E2EL")}
        for m in metrics:
            if m not in heads:
                continue
            title, short = heads[m]
            lines.append("{s:{c}^{n}}".format(s=title, n=50, c="-"))
            row(f"Mean {short} (ms):", r[f"mean_{m}_ms"], ".2f")
            row(f"Median {short} (ms):", r[f"median_{m}_ms"], ".2f")
            for p in pcts:
                row(f"P{p:g} {short} (ms):", r[f"p{p:g}_{m}_ms"], ".2f")
        lines.append(_BAR)
        return "\n".join(lines) + "\n"

    # ---- uvx llama-benchy ----------------------------------------------------------------------

    async def c_uvx(self, argv: list[str], io: IO) -> int:
        args = argv[1:]
        while args and args[0].startswith("-"):  # uvx's own options (``--from X``, ``-q``)
            args = args[2:] if args[0] in ("--from", "--with", "-p", "--python") else args[1:]
        if not args or args[0].split("@", 1)[0] != "llama-benchy":
            io.err(f"{self.err_prefix()}uvx: not found\n")  # other tools: not modelled (as before uvx was)
            return 127
        return await self._llama_benchy(args[1:], io)

    async def _llama_benchy(self, args: list[str], io: IO) -> int:
        o, _flags = _opts(args, multi=frozenset({"pp", "tg", "depth", "concurrency"}))

        def ints(name: str, default: list[int]) -> list[int]:
            v = o.get(name)
            return [int(x) for x in v] if isinstance(v, list) and v else default

        try:
            pps, tgs = ints("pp", [2048]), ints("tg", [32])
            concs, depths = ints("concurrency", [1]), ints("depth", [0])
            runs = int(o["runs"]) if isinstance(o.get("runs"), str) else 3
        except ValueError as exc:
            io.err(f"llama-benchy: error: argument: invalid int value: {exc}\n")
            return 2
        base = o.get("base-url") if isinstance(o.get("base-url"), str) else "http://localhost:8000/v1"
        model = o.get("model") if isinstance(o.get("model"), str) else ""
        mode = o.get("latency-mode") if isinstance(o.get("latency-mode"), str) else "api"
        when = datetime.fromtimestamp(self.clock.epoch(), UTC).strftime("%Y-%m-%d %H:%M:%S")
        io.out(f"llama-benchy ({BENCHY_VERSION})\nDate: {when}\nBenchmarking model: {model} at {base}\n"
               f"Concurrency levels: {concs}\n")
        run, port = self._engine_for(str(base))
        key = o.get("api-key")
        if run is None or (model and model != run.served_name) or (run.api_key and key != run.api_key):
            await self.clock.sleep(0.05)
            why = ("Connection refused" if run is None else "401 Unauthorized" if run.api_key and key != run.api_key
                   else f"404 The model `{model}` does not exist.")
            io.out("Warming up...\n")
            io.err(f"Error: warmup request failed: {why}\n")
            return 1
        tag = f"benchy-{self.now():.3f}"
        io.out("Warming up...\n")
        await self._requests(run, 1, 1, 16, 8, tag + "-warm", port)
        io.out("\nRunning coherence test...\n")
        await self._requests(run, 1, 1, 32, 32, tag + "-coherence", port)
        io.out("Coherence test PASSED.\n")
        io.out(f"Measuring latency using mode: {mode}...\n")
        rate = run_rate(run)
        latency_ms = (vllm_logs.FIRST_TOKEN_S + 1.0 / rate) * 1000.0
        io.out(f"Average latency ({mode}): {latency_ms:.2f} ms\n")
        table: list[list[str]] = []
        for pp in pps:
            for tg in tgs:
                for depth in depths:
                    for c in concs:
                        io.out(f"Running test: pp={pp}, tg={tg}, depth={depth}, concurrency={c}\n")
                        done_all = []
                        for k in range(runs):
                            io.out(f"  Run {k + 1}/{runs} (batch size {c})...\n")
                            done, _f, _s, _e = await self._requests(run, c, c, pp + depth, tg, f"{tag}-{c}-{k}", port)
                            done_all += done
                        table += _benchy_rows(model, pp, tg, depth, c, done_all, latency_ms, len(concs) > 1)
        io.out("Printing results in MD format:\n\n\n\n")
        io.out(_md_table(table) + "\n")
        io.out(f"llama-benchy ({BENCHY_VERSION})\ndate: {when} | latency mode: {mode}\n")
        return 0


def _itl(r) -> list[tuple[float, float]]:
    """A request's inter-token latencies (seconds, how many), from the engine's own timeline."""
    if hasattr(r, "itl"):
        return r.itl(r.end)
    return [(1.0 / r.rate, max(0, r.completion - 1))]


def run_rate(run) -> float:
    return vllm_logs.decode_rate(run)


def _pm(values: list[float]) -> str:
    if not values:
        return ""
    m = sum(values) / len(values)
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return f"{m:.2f} ± {sd:.2f}"


def _benchy_rows(model: str, pp: int, tg: int, depth: int, c: int, done: list, latency_ms: float,
                 label_c: bool) -> list[list[str]]:
    """The ``ppN`` and ``tgM`` rows of one concurrency (each run a batch of ``c`` alike requests)."""
    suffix = (f" @ d{depth}" if depth else "") + (f" (c{c})" if label_c or c > 1 else "")
    ttfr = [(r.first - r.t0) * 1000.0 for r in done]
    ppt = [max(1e-6, t - latency_ms) for t in ttfr]
    pp_req = [(r.prompt - depth) / (p / 1000.0) for r, p in zip(done, ppt, strict=True)]
    pp_total = [c * v for v in pp_req]
    tg_req = [(r.completion - 1) / (r.end - r.first) if r.completion > 1 and r.end > r.first else r.rate for r in done]
    tg_total = [c * v for v in tg_req]
    return [[model, f"pp{pp}{suffix}", _pm(pp_total), _pm(pp_req), "", "", _pm(ttfr), _pm(ppt), _pm(ttfr)],
            [model, f"tg{tg}{suffix}", _pm(tg_total), _pm(tg_req), _pm(tg_total), _pm(tg_req), "", "", ""]]


_HEAD = ["model", "test", "t/s (total)", "t/s (req)", "peak t/s", "peak t/s (req)", "ttfr (ms)", "est_ppt (ms)",
         "e2e_ttft (ms)"]


def _md_table(rows: list[list[str]]) -> str:
    """The table as llama-benchy prints it (``tabulate``'s pipe format: the model left, numbers right)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(_HEAD)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths, strict=True))) + " |"

    rule = "|" + "|".join(":" + "-" * (w + 1) if i == 0 else "-" * (w + 1) + ":" for i, w in enumerate(widths)) + "|"
    return "\n".join([line(_HEAD), rule, *(line(r) for r in rows)]) + "\n"
