"""vLLM: ``vllm serve MODEL …`` (or its OpenAI server module), its metrics, its multi-node starts.

Multi-node: vLLM's own ``mp`` backend starts one process per node (``--nnodes N --node-rank R
--master-addr A --master-port P``, ``--headless`` on the workers: vLLM's docs, "Multi-node
deployment without Ray"); with Ray, one ``vllm serve … --distributed-executor-backend ray`` on the
head of a running Ray cluster. The API key comes from ``VLLM_API_KEY`` (vllm/entrypoints/openai/
api_server.py), so it never needs to be on a command line.
"""

from __future__ import annotations

from collections.abc import Sequence

from sparkconsole.logs import vllm as vllm_log
from sparkconsole.logs.report import LogReport
from sparkconsole.serving.engines.base import Executor, MetricNames, NodeLaunch, ServeSpec, positional

# the modules a ``python -m`` start of the server names (the CLI's own module takes ``serve`` first)
_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server")
_CLI_MODULE = "vllm.entrypoints.cli.main"


class Vllm:
    name = "vllm"
    label = "vLLM"
    default_port = 8000  # ``--port``'s default; no ``--host`` listens on every address
    default_host = "0.0.0.0"
    metrics_path = "/metrics"
    version_module = "vllm"
    entrypoint = "vllm"
    scripts = ("vllm",)
    executors: tuple[Executor, ...] = ("single", "native", "ray")
    rendezvous_port = 29501
    rendezvous_what = "torch's TCPStore, "  # what listens there, said before the port
    api_key_env = "VLLM_API_KEY"
    #: the start may compile kernels for long (vLLM's own 600 s would end it); VLLM_CONFIG_ROOT's
    #: default in a root container, where vllm/ray/ray_env.py reads ray_non_carry_over_env_vars.json
    config_root = "/root/.config/vllm"
    launch_env: tuple[tuple[str, str], ...] = (("VLLM_ENGINE_READY_TIMEOUT_S", "3600"), ("VLLM_CONFIG_ROOT", config_root))
    #: a stall the field reports for it (why, in words), offered as a way back to the default engine
    known_hang: str | None = None
    #: it takes ``--reasoning-parser`` (vLLM; the console's SGLang start never passed one)
    takes_reasoning_parser = True
    canary = True
    # What vLLM's API key guards. Its check (the ``authentication`` middleware of
    # vllm/entrypoints/openai/api_server.py; the AuthenticationMiddleware of
    # vllm/entrypoints/openai/server_utils.py in later releases) passes on, without looking at the key,
    # an OPTIONS request and every request whose path (after the root path) does not start with ``/v1``.
    # So with a key, what vLLM serves outside /v1 still answers anyone who reaches its port: paths that
    # run the model (the same work as /v1, on bodies of anyone's choosing); paths that use its tokenizer
    # or tell its state (/metrics names the served model and its load); and, in the releases that have
    # it, one that rescales an elastic expert-parallel engine.
    keyless_paths = (("/invocations", "/pooling", "/classify", "/score", "/rerank", "/v2/rerank"),
                     ("/tokenize", "/detokenize", "/health", "/ping", "/load", "/version", "/metrics"),
                     ("/scale_elastic_ep",))
    bench_tool: str | None = "vllm"  # `vllm bench serve`, in its own image
    #: its own flags for a recipe's neutral fields, beyond the long ones every engine shares
    recipe_flags: dict[str, str] = {}
    image_repos = ("vllm-openai",)
    failure_kinds = vllm_log.FAILURE_KINDS
    metrics = MetricNames(
        scalars={
            "requests_running": ("vllm:num_requests_running",),
            "requests_waiting": ("vllm:num_requests_waiting",),
            "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
            "prompt_tokens": ("vllm:prompt_tokens_total",),
            "generation_tokens": ("vllm:generation_tokens_total",),
            "preemptions": ("vllm:num_preemptions_total",),
            "prefix_cache_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
            "prefix_cache_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
        },
        histograms={
            "ttft": ("vllm:time_to_first_token_seconds",),
            "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
            "e2e": ("vllm:e2e_request_latency_seconds",),
            "queue_time": ("vllm:request_queue_time_seconds",),
        },
    )

    def recognise(self, argv: Sequence[str]) -> tuple[list[str], str | None] | None:
        base = argv[0].rsplit("/", 1)[-1] if argv else ""
        if base == "vllm" and list(argv[1:2]) == ["serve"]:
            return list(argv[2:]), positional(argv[2:])
        if base.startswith("python"):
            mod, rest = _python_module(argv)
            if mod in _MODULES:
                return rest, None
            if mod == _CLI_MODULE and rest[:1] == ["serve"]:
                return rest[1:], positional(rest[1:])
        return None

    def served_model(self, opts: dict[str, str], positional: str | None) -> str | None:
        return opts.get("served-model-name") or opts.get("model") or positional

    def log_tracker(self) -> vllm_log.VllmLogTracker:
        return vllm_log.VllmLogTracker()

    def advise(self, report: LogReport) -> str | None:
        return vllm_log.advise(report)

    def serve_args(self, spec: ServeSpec) -> list[str]:
        """``vllm serve``'s arguments for ``spec``: the model, the plan's numbers, then the extra flags."""
        args = [spec.model, "--tensor-parallel-size", str(spec.tp)]
        if spec.pp > 1:
            args += ["--pipeline-parallel-size", str(spec.pp)]
        if spec.gpu_memory_utilization is not None:
            args += ["--gpu-memory-utilization", str(spec.gpu_memory_utilization)]
        if spec.max_model_len is not None:
            args += ["--max-model-len", str(spec.max_model_len)]
        args += ["--served-model-name", spec.served_name, "--host", spec.host, "--port", str(spec.port)]
        if spec.kv_cache_dtype == "fp8":
            args += ["--kv-cache-dtype", "fp8"]
        return [*args, *spec.extra_args]

    def launches(self, spec: ServeSpec, executor: Executor, nodes: Sequence[tuple[str, str]]) -> list[NodeLaunch]:
        head_name, head_ip = nodes[0]
        if executor == "single":
            return [NodeLaunch(0, self.entrypoint, ("serve", *self.serve_args(spec)),
                               summary=f"start vLLM (TP={spec.tp}) on {head_name}")]
        if executor == "ray":
            return [NodeLaunch(0, self.entrypoint,
                               ("serve", *self.serve_args(spec), "--distributed-executor-backend", "ray"),
                               summary=f"start vLLM over Ray on {head_name}")]
        out = []
        for rank, (node, _ip) in reversed(list(enumerate(nodes))):
            args = [*self.serve_args(spec), "--distributed-executor-backend", "mp", "--nnodes", str(len(nodes)),
                    "--node-rank", str(rank), "--master-addr", head_ip, "--master-port", str(self.rendezvous_port)]
            if rank:
                args.append("--headless")
            out.append(NodeLaunch(rank, self.entrypoint, ("serve", *args), summary=f"start vLLM rank {rank} on {node}"))
        return out


_PY_OPTS_WITH_VALUE = {"-W", "-X"}


def _python_module(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """``python [opts] -m MODULE ARGS…`` → ``(MODULE, ARGS)``; ``(None, [])`` otherwise."""
    j = 1
    while j < len(argv) and argv[j].startswith("-") and argv[j] != "-m":
        j += 2 if argv[j] in _PY_OPTS_WITH_VALUE else 1
    if j + 1 < len(argv) and argv[j] == "-m":
        return argv[j + 1], list(argv[j + 2:])
    return None, []


VLLM = Vllm()
