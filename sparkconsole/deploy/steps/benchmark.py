"""Benchmark: after "served and verified", measure the endpoint with the tool the community publishes
results from, if the operator wants it now (a decision: skip or run).

It runs ``vllm bench serve`` in the engine's own container on the head (the image has it; its
tokenizer reaches the model's files there), against the head's loopback, at a few concurrencies
bounded in requests and time, and shows prompt and generation tok/s, TTFT and ITL per concurrency
beside the plan's concurrency figure. The run is kept with the others of the same endpoint
(:func:`sparkconsole.serving.bench.save_run`), so ``sparkconsole bench`` later compares with it.
A benchmark puts load on a served endpoint: its commands are shown, confirmed and journaled like a
change (``--plan-only`` lists them), and ``--auto`` recommends skipping it (run it before users
arrive, or later with ``sparkconsole bench``).
"""

from __future__ import annotations

from sparkconsole.deploy.decisions import Decision, Option
from sparkconsole.deploy.runner import StepFailed
from sparkconsole.deploy.steps.base import Step
from sparkconsole.serving.bench import (
    VLLM_BENCH,
    BenchRun,
    bench_commands,
    rows_from_outputs,
    save_run,
)

CONCURRENCIES = (1, 4, 8)
REQUESTS = 16  # per concurrency (at least the concurrency itself)
INPUT_LEN, OUTPUT_LEN = 512, 128
TIME_LIMIT_S = 600  # per concurrency: a hung engine costs ten minutes, not the session


class Benchmark(Step):
    id, title = "benchmark", "Benchmark the endpoint (optional)"
    decisions = ("benchmark.run",)

    def _concurrencies(self) -> list[int]:
        """1, 4 and 8 requests at once: a single user, a small team, a busy hour. The plan's own figure
        (how many requests of the *whole* context fit the KV cache) is shown beside the results, not
        used as a cap: these requests are 640 tokens, so many more of them fit."""
        return list(CONCURRENCIES)

    async def probe(self) -> str | None:
        flow = self.flow
        if self.runner.state.result != "served":
            return "the endpoint was not verified"
        if flow.engine_kind.bench_tool != VLLM_BENCH:
            return (f"{flow.engine_kind.label} serves: its image has no `vllm bench serve` "
                    "(run `sparkconsole bench --tool llama-benchy`)")
        return None

    async def decide(self) -> None:
        flow = self.flow
        concs = self._concurrencies()
        cap = flow.plan.max_concurrency
        measured = [f"endpoint {flow.served_name} on port {flow.options.port} of {flow.head}",
                    f"plan: {cap:.1f} requests of {flow.plan.max_model_len or 0:,} tokens fit the KV cache at once"
                    if cap is not None else "plan: no concurrency figure",
                    f"vllm bench serve at concurrency {', '.join(map(str, concs))}: {REQUESTS} requests each, "
                    f"{INPUT_LEN} tokens in, {OUTPUT_LEN} out, at most {TIME_LIMIT_S // 60} min each"]
        d = Decision("benchmark.run", self.id, "Benchmark the endpoint now?", tuple(measured), (
            Option("skip", "Skip", "the endpoint is ready; `sparkconsole bench` measures it whenever you like"),
            Option("run", "Run the benchmark", "prompt and generation tok/s, TTFT and ITL per concurrency, kept "
                   "to compare with later runs; it loads the engine for a few minutes"),
        ), "skip", "a benchmark puts load on the endpoint you just served: run it before users arrive")
        flow.update(benchmark=await self.runner.decide(d) == "run")

    def _commands(self, stamp: str):
        flow = self.flow
        key = flow.api_key_file if flow.plan.access == "api-key" else None
        container = flow.container("ray") if flow.executor == "ray" else flow.container(flow.engine_kind.name)
        return bench_commands(flow.options.port, flow.served_name, flow.options.model, container,
                              self._concurrencies(), REQUESTS, INPUT_LEN, OUTPUT_LEN, VLLM_BENCH, key_file=key,
                              stamp=stamp, time_limit_s=TIME_LIMIT_S)

    async def send(self) -> None:
        flow = self.flow
        if not flow.plan.benchmark:
            return
        stamp = self.runner.state.short_id + "-bench"
        outputs: list[str] = []
        for cmd in self._commands(stamp):
            res = await self.runner.change(flow.head, cmd, timeout=TIME_LIMIT_S + 60)
            if self.runner.rehearsing:
                continue
            outputs.append(res.stdout)
            if not res.ok:
                raise StepFailed(f"the benchmark stopped (exit {res.exit_status}): {(res.stderr or res.stdout)[-200:]}",
                                 "the endpoint still serves; run `sparkconsole bench` to try again")
        if self.runner.rehearsing:
            return
        rows = rows_from_outputs(VLLM_BENCH, outputs)
        if not rows:
            raise StepFailed("the benchmark printed no result", "run `sparkconsole bench` to see its output")
        cluster = self.runner.state.cluster or "cluster"
        run = BenchRun.new(cluster, flow.head, flow.served_name, flow.options.port, VLLM_BENCH, rows,
                           {"concurrency": self._concurrencies(), "requests": REQUESTS, "time_limit_s": TIME_LIMIT_S,
                            "input_len": INPUT_LEN, "output_len": OUTPUT_LEN},
                           deployment=self.runner.state.id, plan_max_concurrency=flow.plan.max_concurrency)
        save_run(run)
        for r in rows:
            self.runner.note(_row_line(r))
        cap = flow.plan.max_concurrency
        if cap is not None:
            self.runner.note(f"beside the plan: {cap:.1f} requests of the whole context "
                             f"({flow.plan.max_model_len or 0:,} tokens) fit the KV cache at once; "
                             "`sparkconsole bench` compares later runs with this one")


def _num(v: float | None, scale: float = 1.0, unit: str = "", digits: int = 1) -> str:
    return "—" if v is None else f"{v * scale:.{digits}f}{unit}"


def _row_line(r) -> str:
    """One concurrency's figures in one line of the wizard's notes."""
    return (f"concurrency {r.concurrency}: {_num(r.prompt_tokens_per_s, digits=0)} prompt tok/s, "
            f"{_num(r.generation_tokens_per_s)} generation tok/s, TTFT p50 {_num(r.ttft_p50_s, 1000, ' ms', 0)} "
            f"p95 {_num(r.ttft_p95_s, 1000, ' ms', 0)}, ITL p50 {_num(r.itl_p50_s, 1000, ' ms')} "
            f"({r.requests} requests, {r.tool})")
