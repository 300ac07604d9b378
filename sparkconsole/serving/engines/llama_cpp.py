"""llama.cpp's ``llama-server``: one node, a GGUF model (``-m FILE`` or ``-hf REPO[:QUANT]``), an
OpenAI-compatible API on port 8080 of 127.0.0.1 by default (tools/server/README.md: ``--host``
127.0.0.1, ``--port`` 8080), Prometheus figures on ``/metrics`` only with ``--metrics``, named
``llamacpp:…`` (tools/server/server.cpp). It proves the protocol's shape: a third engine that is
not Python and spans one node.
"""

from __future__ import annotations

from collections.abc import Sequence

from sparkconsole.logs import llama_cpp as llama_cpp_log
from sparkconsole.logs.report import LogReport
from sparkconsole.serving.engines.base import Executor, MetricNames, NodeLaunch, ServeSpec


class LlamaCpp:
    name = "llama-cpp"
    label = "llama.cpp"
    default_port = 8080
    default_host = "127.0.0.1"
    metrics_path = "/metrics"
    version_module = None
    entrypoint = "llama-server"
    scripts = ("llama-server",)
    executors: tuple[Executor, ...] = ("single",)
    rendezvous_port = None
    rendezvous_what = ""  # what listens there, said before the port
    api_key_env = "LLAMA_API_KEY"
    launch_env: tuple[tuple[str, str], ...] = ()
    #: a stall the field reports for it (why, in words), offered as a way back to the default engine
    known_hang: str | None = None
    #: it takes ``--reasoning-parser`` (vLLM; the console's SGLang start never passed one)
    takes_reasoning_parser = False
    canary = False
    keyless_paths = None  # not read from its source: verify says so
    bench_tool: str | None = None
    #: its own flags for a recipe's neutral fields, beyond the long ones every engine shares
    recipe_flags: dict[str, str] = {"-c": "max_model_len", "-m": "model", "-hf": "model", "--hf-repo": "model"}
    image_repos = ("llama.cpp", "dgx-spark-llama-cpp")
    failure_kinds = llama_cpp_log.FAILURE_KINDS
    metrics = MetricNames(
        scalars={
            "requests_running": ("llamacpp:requests_processing",),
            "requests_waiting": ("llamacpp:requests_deferred",),
            "kv_cache_usage": ("llamacpp:kv_cache_usage_ratio",),
            "prompt_tokens": ("llamacpp:prompt_tokens_total",),
            "generation_tokens": ("llamacpp:tokens_predicted_total",),
        },
    )

    def recognise(self, argv: Sequence[str]) -> tuple[list[str], str | None] | None:
        base = argv[0].rsplit("/", 1)[-1] if argv else ""
        return (list(argv[1:]), None) if base == "llama-server" else None

    def served_model(self, opts: dict[str, str], positional: str | None) -> str | None:
        return opts.get("alias") or opts.get("hf-repo") or opts.get("hf") or opts.get("model") or positional

    def log_tracker(self) -> llama_cpp_log.LlamaCppLogTracker:
        return llama_cpp_log.LlamaCppLogTracker()

    def advise(self, report: LogReport) -> str | None:
        return llama_cpp_log.advise(report)

    def launches(self, spec: ServeSpec, executor: Executor, nodes: Sequence[tuple[str, str]]) -> list[NodeLaunch]:
        if executor != "single" or len(nodes) != 1 or spec.tp != 1:
            raise ValueError("llama.cpp's server runs on one node")
        args = ["-hf", spec.model, "--alias", spec.served_name, "--host", spec.host, "--port", str(spec.port),
                "-ngl", "999", "--metrics", "--jinja"]
        if spec.max_model_len:
            args += ["--ctx-size", str(spec.max_model_len)]
        return [NodeLaunch(0, self.entrypoint, (*args, *spec.extra_args),
                           summary=f"start llama-server on {nodes[0][0]}")]


LLAMA_CPP = LlamaCpp()
