"""SGLang: ``python -m sglang.launch_server --model-path …`` (or ``sglang serve``), its metrics and its
multi-node start (``--nnodes N --node-rank R --dist-init-addr HEAD:PORT`` on every node: SGLang's
server arguments). SGLang listens on 127.0.0.1:30000 unless told otherwise (ServerArgs), takes an
API key only as ``--api-key`` (argv, visible to ``ps``), and has no Ray path.
"""

from __future__ import annotations

from collections.abc import Sequence

from sparkconsole.logs import sglang as sglang_log
from sparkconsole.logs.report import LogReport
from sparkconsole.serving.engines.base import Executor, MetricNames, NodeLaunch, ServeSpec
from sparkconsole.serving.engines.vllm import _python_module

#: the static memory fraction validated on Spark (field reports: --mem-fraction-static 0.70)
MEM_FRACTION_STATIC = "0.70"


class Sglang:
    name = "sglang"
    label = "SGLang"
    default_port = 30000
    default_host = "127.0.0.1"
    metrics_path = "/metrics"
    version_module = "sglang"
    entrypoint = "python3"
    scripts = ("sglang",)
    executors: tuple[Executor, ...] = ("single", "native")
    rendezvous_port = 20000
    rendezvous_what = ""  # what listens there, said before the port
    api_key_env = None
    launch_env: tuple[tuple[str, str], ...] = ()
    #: a stall the field reports for it (why, in words), offered as a way back to the default engine
    known_hang: str | None = ("SGLang's two-node NCCL start on GB10 stalls after 'CustomAllreduce is disabled'; vLLM over Ray "
                                "worked in the same setup")
    #: it takes ``--reasoning-parser`` (vLLM; the console's SGLang start never passed one)
    takes_reasoning_parser = False
    canary = False
    keyless_paths = None  # not read from its source: verify says so
    bench_tool: str | None = None
    #: its own flags for a recipe's neutral fields, beyond the long ones every engine shares
    recipe_flags: dict[str, str] = {}
    image_repos = ("sglang",)
    failure_kinds = sglang_log.FAILURE_KINDS
    metrics = MetricNames(
        scalars={
            "requests_running": ("sglang:num_running_reqs", "sglang:num_requests_running"),
            "requests_waiting": ("sglang:num_queue_reqs", "sglang:num_requests_waiting"),
            "kv_cache_usage": ("sglang:token_usage",),
            "gen_throughput": ("sglang:gen_throughput",),
            "prompt_tokens": ("sglang:prompt_tokens_total",),
            "generation_tokens": ("sglang:generation_tokens_total",),
        },
        histograms={
            "ttft": ("sglang:time_to_first_token_seconds",),
            "itl": ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
            "e2e": ("sglang:e2e_request_latency_seconds",),
            # 0.3.5 called the time a request waited in the queue ``waiting_request_latency_seconds``
            "queue_time": ("sglang:queue_time_seconds", "sglang:waiting_request_latency_seconds"),
        },
        # SGLang 0.3 labelled the model ``name``; everything since ``model_name``
        model_labels=("model_name", "name"),
        rate_gauge="gen_throughput",
    )

    def recognise(self, argv: Sequence[str]) -> tuple[list[str], str | None] | None:
        base = argv[0].rsplit("/", 1)[-1] if argv else ""
        if base == "sglang" and list(argv[1:2]) == ["serve"]:
            return list(argv[2:]), None
        if base.startswith("python"):
            mod, rest = _python_module(argv)
            if mod == "sglang.launch_server":
                return rest, None
        return None

    def served_model(self, opts: dict[str, str], positional: str | None) -> str | None:
        return opts.get("served-model-name") or opts.get("model-path") or opts.get("model") or positional

    def log_tracker(self) -> sglang_log.SglangLogTracker:
        return sglang_log.SglangLogTracker()

    def advise(self, report: LogReport) -> str | None:
        return sglang_log.advise(report)

    def launches(self, spec: ServeSpec, executor: Executor, nodes: Sequence[tuple[str, str]]) -> list[NodeLaunch]:
        if executor == "ray":
            raise ValueError("SGLang has no Ray path")
        head_ip = nodes[0][1]
        out = []
        for rank, (node, ip) in reversed(list(enumerate(nodes))):
            args = ["-m", "sglang.launch_server", "--model-path", spec.model, "--tp", str(spec.tp),
                    "--nnodes", str(len(nodes)), "--node-rank", str(rank),
                    "--dist-init-addr", f"{head_ip}:{self.rendezvous_port}",
                    "--host", spec.host, "--port", str(spec.port)]
            if "--mem-fraction-static" not in spec.extra_args:
                # the planner's gmu is vLLM's arithmetic: SGLang keeps the fraction validated on Spark
                args += ["--mem-fraction-static", MEM_FRACTION_STATIC]
            out.append(NodeLaunch(rank, self.entrypoint, (*args, *spec.extra_args), env=(("SGLANG_HOST_IP", ip),),
                                  summary=f"start SGLang rank {rank} on {node}"))
        return out


SGLANG = Sglang()
