"""The start of one simulated ``vllm serve``, phase by phase: :class:`ServePlan`.

:func:`sparkconsole.sim.vllm_logs.plan_serve` builds a :class:`ServePlan` and runs it. The plan
is a class, not one function, because a vLLM start is a sequence of phases (argument checks,
engine configuration, Ray placement or the native rendezvous, the start-up memory check, weight
loading shard by shard, torch.compile, KV cache profiling, CUDA-graph capture, the API server)
that all write to the same log script and advance the same clock, and each of them can kill the
engine. The shared state (the cluster, the command's arguments, the :class:`~sparkconsole.sim.
vllm_logs._Script`, the running sim time ``t``, the ranks and the nodes they run on) lives on the
instance; each phase is one method, and :meth:`ServePlan.plan` calls them in vLLM's order.

A phase that kills the engine calls :meth:`ServePlan.fail` (through :meth:`~ServePlan.
engine_failed` or :meth:`~ServePlan.rank_failed`), which records the failure on the
:class:`~sparkconsole.sim.model.EngineRun` and raises :class:`_Ended`: nothing after that point is
planned, exactly as the real engine prints nothing more once it has died.

The formats, timings and failure modes are documented in :mod:`sparkconsole.sim.vllm_logs`.
"""

from __future__ import annotations

import time
from typing import Any, NoReturn

from sparkconsole.sim.model import (
    CUDA_TOTAL_GIB,
    GIB,
    MEM_TOTAL,
    MIB,
    MODELS,
    Curve,
    EngineRun,
    Holder,
    ModelSpec,
    RayMember,
    SimCluster,
    SimNode,
    _hash01,
    planner_spec,
    stable_hex,
    stable_int,
)
from sparkconsole.sim.vllm_logs import (
    _MP_FRAMES,
    _RENDEZVOUS_FRAMES,
    _WORKER_FRAMES,
    PY,
    RAY_COPY_PREFIXES,
    SUPPORTED_ARCHS_014,
    WORKERPROC_FAILED,
    DriverEnv,
    ServeArgs,
    _joined_ranks,
    _nondefault,
    _prefix,
    _ramp,
    _ray_container,
    _Script,
    gib,
    ray_copied,
    shard_bar,
    stage_weights_gib,
    tqdm_bar,
    traffic_lines,
    version_at_least,
)

Frame = tuple[str, int, str, str]  # a traceback frame: (path, line, function, code)

# the API server's own frames, under every start-up traceback it prints
_CLI_FRAMES: list[Frame] = [
    ("/usr/local/bin/vllm", 10, "<module>", "sys.exit(main())"),
    (f"{PY}/vllm/entrypoints/cli/main.py", 73, "main", "args.dispatch_function(args)"),
    (f"{PY}/vllm/entrypoints/cli/serve.py", 60, "cmd", "uvloop.run(run_server(args))"),
]
# the engine core's frames, above whatever failed while it started
_ENGINE_FRAMES: list[Frame] = [
    (f"{PY}/vllm/v1/engine/core.py", 846, "run_engine_core", "engine_core = EngineCoreProc(*args, **kwargs)"),
    (f"{PY}/vllm/v1/engine/core.py", 606, "__init__", "super().__init__("),
    (f"{PY}/vllm/v1/engine/core.py", 102, "__init__", "self.model_executor = executor_class(vllm_config)"),
]
# the profile run down to vLLM's CUTLASS op (vllm/v1/worker/gpu_worker.py determine_available_memory ->
# gpu_model_runner.profile_run -> the FP8 linear -> _custom_ops.cutlass_scaled_mm -> torch.ops._C)
_FP8_GEMM_FRAMES: list[Frame] = [
    (f"{PY}/vllm/v1/worker/gpu_worker.py", 296, "determine_available_memory", "self.model_runner.profile_run()"),
    (f"{PY}/vllm/v1/worker/gpu_model_runner.py", 4201, "profile_run", "hidden_states, last_hidden_states = "
     "self._dummy_run("),
    (f"{PY}/vllm/model_executor/layers/quantization/fp8.py", 612, "apply",
     "return self.w8a8_block_fp8_linear.apply("),
    (f"{PY}/vllm/_custom_ops.py", 871, "cutlass_scaled_mm",
     "torch.ops._C.cutlass_scaled_mm(out, a, b, scale_a, scale_b, bias)"),
    ("/usr/local/lib/python3.12/dist-packages/torch/_ops.py", 1255, "__call__",
     "return self._op(*args, **kwargs)"),
]
_PARALLEL_CONFIG_FRAMES: list[Frame] = [(f"{PY}/vllm/config/parallel.py", 612, "__post_init__", "raise ValueError(")]
_ROUTES = [("/openapi.json", "GET, HEAD"), ("/docs", "GET, HEAD"), ("/health", "GET"), ("/load", "GET"),
           ("/v1/models", "GET"), ("/version", "GET"), ("/v1/chat/completions", "POST"),
           ("/v1/completions", "POST"), ("/v1/embeddings", "POST"), ("/pooling", "POST"),
           ("/score", "POST"), ("/v1/score", "POST"), ("/rerank", "POST"), ("/v1/rerank", "POST"),
           ("/metrics", "GET")]


HUB_RETRIES = 5  # huggingface_hub's http_backoff: 5 retries, waits 1, 2, 4, 8, 8 s (max_wait 8)
HUB_RESOLVE_S = 5.0  # each failed request: the resolver's timeout on a node without a route out (as hf.py)
NCCL_SYSTEM_ERROR = "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)"


def _offline(env: dict[str, str], *names: str) -> bool:
    """huggingface_hub's ``_is_true``: 1/ON/YES/TRUE, any case."""
    return any(env.get(n, "").upper() in ("1", "ON", "YES", "TRUE") for n in names)


def ipv4_v2_gids(cluster: SimCluster, node: SimNode, dev: str) -> set[int]:
    """The GID indexes of ``dev`` on ``node`` that hold a RoCE v2 IPv4-mapped GID (what
    ``NCCL_IB_GID_INDEX`` must name there), from the node's own table (``SimNode.gid_table``, what
    ``/sys/class/infiniband/DEV/ports/1/gids/N`` and ``gid_attrs/types/N`` show)."""
    iface = next((i for i in node.ifaces if i.rdma == dev), None)
    if iface is None:
        return set()
    table = getattr(node, "gid_table", None)
    if callable(table):
        return {k for k, (gid, typ) in table(iface).items()
                if typ == "RoCE v2" and gid.startswith("0000:0000:0000:0000:0000:ffff:")}
    files = cluster.virtual_files(cluster, node.name) if cluster.virtual_files is not None else {}
    base = f"/sys/class/infiniband/{dev}/ports/1"
    return {k for k in range(256) if str(files.get(f"{base}/gid_attrs/types/{k}", "")).strip() == "RoCE v2"
            and str(files.get(f"{base}/gids/{k}", "")).startswith("0000:0000:0000:0000:0000:ffff:")}


def nccl_ib_problem(cluster: SimCluster, node: SimNode, env: dict[str, str]) -> str | None:
    """The RDMA device whose queue pair a rank with ``env`` cannot bring up on ``node`` (None: all
    fine): ``NCCL_IB_GID_INDEX`` not a RoCE v2 IPv4 GID of a device NCCL uses, or ``NCCL_IB_HCA``
    naming a device without an IPv4 GID (an enP2 twin without an address). NCCL uses the active
    devices ``NCCL_IB_HCA`` selects (prefix match; ``=`` exact, ``^`` excludes), all active ones
    when unset, and picks a GID by itself when ``NCCL_IB_GID_INDEX`` is unset [NCCL env docs;
    ../shared/research/real-dgx-os.md "The ConnectX-7 ports and their GIDs"]."""
    if env.get("NCCL_IB_DISABLE", "0").strip() == "1":
        return None
    active = [i.rdma for i in node.ifaces if i.rdma and node.link_up(i)]
    spec = env.get("NCCL_IB_HCA", "").strip()
    if spec:
        exact = spec.startswith("=") or spec.startswith("^=")
        exclude = spec.startswith("^")
        names = [x.split(":")[0] for x in spec.lstrip("^=").split(",") if x]
        hit = [d for d in active if any(d == x if exact else d.startswith(x) for x in names)]
        used = [d for d in active if d not in hit] if exclude else hit
    else:
        used = active
    gid = env.get("NCCL_IB_GID_INDEX", "").strip()
    for d in used:
        v2 = ipv4_v2_gids(cluster, node, d)
        if not v2 and spec and not spec.startswith("^"):
            return d
        if gid and (not gid.isdigit() or int(gid) not in v2):
            return d
    return None


def _world_too_big(size: int) -> str:
    """vLLM's ``ParallelConfig`` refusal of more ranks than this node has GPUs (one on a Spark)."""
    return (f"ValueError: World size ({size}) is larger than the number of available GPUs (1) in this "
            "node. If this is intentional and you are using:\n- ray, set '--distributed-executor-backend "
            "ray'.\n- multiprocessing, set up '--nnodes' and '--node-rank' on every node.")


class _Ended(Exception):
    """The engine died in the current phase (its failure is recorded on the run): the plan stops."""


class ServePlan:
    """One ``vllm serve`` started at sim time ``t0`` in ``container`` on ``node``: its log script,
    the memory its processes hold on every node it spans, and when it is ready or dies.

    Times passed to the phases are relative to ``t0`` (the script's ``dt``); ``t`` is where the
    start has got to. Build it and call :meth:`plan` once."""

    # set by the phases that compute them (configure, load_weights, profile_kv)
    mml: int
    kv_dtype: str
    prefix_caching: bool
    pspec: Any  # the planner's spec of the model (None: the catalogue's figures)
    nbt: int
    t_load: float
    lead: str
    w_ranks: list[float]
    kv_alloc: float

    def __init__(self, cluster: SimCluster, node: SimNode, container: str, version: str, args: ServeArgs,
                 t0: float, pid_api: int = 1, activity: float = 0.0, driver_env: DriverEnv | None = None,
                 spec: ModelSpec | None = None, kernels_fail: bool = False) -> None:
        self.cluster = cluster
        # the image's block-FP8 GEMM has no kernels for the node's GPU: its profile run fails
        self.kernels_fail = kernels_fail
        self.driver = driver_env  # the serve's environment (None: a scenario's service, history)
        # each rank's node -> the environment its worker runs with (after vLLM's Ray copy)
        self.rank_env: dict[str, dict[str, str]] = {node.name: dict(driver_env.env)} if driver_env else {}
        self.node = node
        self.container = container
        self.version = version
        self.args = args
        self.t0 = t0
        self.pid_api = pid_api
        self.activity = activity
        self.new = not version.startswith("0.14")  # 0.17.x: the ASCII banner, 8192 batched tokens
        self.sc = _Script(cluster, t0)  # the head's log (the container the command runs in)
        self.api = f"(APIServer pid={pid_api}) "
        self.pid_core = stable_int(150, 6000, node.name, container, t0, "core")
        self.core = f"(EngineCore_DP0 pid={self.pid_core}) "
        self.spec: ModelSpec | None = spec or MODELS.get(args.model)
        self.arch = self.spec.architecture if self.spec else "LlamaForCausalLM"
        self.served = args.served_name or args.model
        self.run = EngineRun(model=args.model, served_name=self.served, version=version, port=args.port,
                             tp=args.tp, pp=1 if args.nnodes > 1 else args.pp,
                             started=t0, lines=self.sc.lines, holders=[], reasoning_parser=args.reasoning_parser,
                             activity=activity, nodes=(node.name,), pid_api=pid_api,
                             epoch0=cluster.clock.epoch(0.0), pid_core=self.pid_core, render_traffic=traffic_lines)
        self.native = args.nnodes > 1  # --nnodes: the multiproc executor across nodes, no Ray
        self.world = self.run.world  # TP x PP over Ray (native multi-node: TP only)
        # rank by rank: the node and the pid of the process holding that rank's memory
        self.span_nodes: list[tuple[SimNode, int]] = [(node, self.pid_core)]
        # each node's log: natively a headless rank's own container, else everything in the head's
        self.scripts: dict[str, _Script] = {node.name: self.sc}
        self.t = 0.0

    def plan(self) -> EngineRun:
        """The phases of a vLLM start, in order, up to the first that kills the engine."""
        try:
            self.print_args()
            self.bind_port()
            self.hub_wait()
            self.check_model()
            self.configure()
            self.join_ranks()
            self.check_free_memory()
            self.load_weights()
            self.torch_compile()
            self.profile_kv()
            self.capture_graphs()
            self.serve()
        except _Ended:
            pass
        return self.run

    # ---- how the engine dies ----------------------------------------------------------------------

    def fail(self, dt: float, kind: str) -> NoReturn:
        """The engine is gone at ``dt``: its memory is freed, headless ranks shut down, the plan ends."""
        run = self.run
        run.failed_at = self.t0 + dt
        run.failure = kind
        for h in run.holders:
            if h.curve.end is None or h.curve.end > run.failed_at:
                h.curve.end = run.failed_at
        for n in run.peer_lines:  # the head's executor is gone: the headless ranks shut down
            run.peer_end.setdefault(n, run.failed_at + 0.5)
        raise _Ended

    def engine_failed(self, dt: float, frames: list[Frame], exc: str, kind: str,
                      prefix: str | None = None) -> NoReturn:
        """The engine core fails to start: its traceback (under ``prefix``, the core's by default),
        then the API server's ``RuntimeError``."""
        sc, api = self.sc, self.api
        prefix = self.core if prefix is None else prefix
        sc.log(dt, prefix, "ERROR", "core.py:866", "EngineCore failed to start.")
        sc.traceback(dt, prefix, [*_ENGINE_FRAMES, *frames], exc, level_src="core.py:866")
        sc.raw(dt + 0.4, f"{api}Traceback (most recent call last):")
        for fpath, ln, fn, code in _CLI_FRAMES:
            sc.raw(dt + 0.4, f'{api}  File "{fpath}", line {ln}, in {fn}')
            sc.raw(dt + 0.4, f"{api}    {code}")
        sc.raw(dt + 0.4, f"{api}RuntimeError: Engine core initialization failed. See root cause above. "
               f"Failed core proc(s): {{}}")
        self.fail(dt + 0.6, kind)

    def rank_failed(self, dt: float, n: SimNode, pid: int, rank: int, frames: list[Frame], exc: str,
                    kind: str) -> NoReturn:
        """A rank's worker fails: with Ray the engine core reports it; natively the rank's own
        worker process logs it (in its node's log) and the head's executor gives up."""
        if not self.native:
            self.engine_failed(dt, frames, exc, kind, _prefix(self.core, n, self.node, pid, self.world))
        p = f"(Worker_TP{rank} pid={pid}) "
        s_ = self.scripts.get(n.name, self.sc)
        s_.log(dt, p, "ERROR", "multiproc_executor.py:772", "WorkerProc failed to start.")
        s_.traceback(dt, p, [*_WORKER_FRAMES, *frames], exc, level_src="multiproc_executor.py:772")
        self.engine_failed(dt + 0.3, _MP_FRAMES, WORKERPROC_FAILED, kind)

    # ---- where a rank's lines go ------------------------------------------------------------------

    def rank_prefix(self, n: SimNode, pid: int, rank: int) -> str:
        """A rank's worker prefix: ``(Worker_TPr pid=N)`` natively, the Ray worker under the core."""
        return f"(Worker_TP{rank} pid={pid}) " if self.native else _prefix(self.core, n, self.node, pid, self.world)

    def log_on(self, n: SimNode, dt: float, pfx: str, level: str, src: str, msg: str) -> None:
        """A line in node ``n``'s log (a headless rank's own container natively, else the head's)."""
        self.scripts.get(n.name, self.sc).log(dt, pfx, level, src, msg)

    def rank_log(self, dt: float, level: str, src: str, msg: str) -> None:
        """A line every rank's worker prints: natively each in its own node's log."""
        self.sc.log(dt, self.lead, level, src, msg)
        if self.native:
            for rank, (n, pid) in enumerate(self.span_nodes[1:], 1):
                self.log_on(n, dt, self.rank_prefix(n, pid, rank), level, src, msg)

    # ---- P1: the API server, its arguments and the model config -----------------------------------

    def print_args(self) -> None:
        """The version (0.17.x: the ASCII banner) and the non-default arguments."""
        sc, api, args, version = self.sc, self.api, self.args, self.version
        if self.new:
            logo = [
                "",
                "       █     █     █▄   ▄█",
                f" ▄▄ ▄█ █     █     █ ▀▄▀ █  version {version}",
                f"  █▄█▀ █     █     █     █  model   {args.model}",
                "   ▀▀  ▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀",
                "",
            ]
            for row in logo:
                sc.log(0.0, api, "INFO", "utils.py:292", row)
            sc.log(0.0, api, "INFO", "utils.py:228", f"non-default args: {_nondefault(args, 0)}")
        else:
            sc.log(0.0, api, "INFO", "api_server.py:1351", f"vLLM API server version {version}")
            sc.log(0.0, api, "INFO", "utils.py:253", f"non-default args: {_nondefault(args, 0)}")

    def _hub_retries(self, sc: _Script, dt: float, prefix: str, url: str, method: str = "HEAD") -> float:
        """huggingface_hub asking the Hub on a node without internet: each request fails after the
        resolver's timeout and is retried with back-off, logged as huggingface_hub's ``http_backoff``
        logs it; then the library falls back to the local cache. Returns the time it took."""
        t = dt
        for k in range(1, HUB_RETRIES + 2):
            t += HUB_RESOLVE_S
            rid = stable_hex(32, url, self.t0, k)
            path = url.split("huggingface.co", 1)[1]
            sc.raw(t, f"{prefix}'(MaxRetryError(\"HTTPSConnectionPool(host='huggingface.co', port=443): Max retries "
                   f"exceeded with url: {path} (Caused by NameResolutionError(\\\"<urllib3.connection.HTTPSConnection "
                   "object at 0xffff8c2b5e50>: Failed to resolve 'huggingface.co' ([Errno -3] Temporary failure in "
                   f"name resolution)\\\"))\"), '(Request ID: {rid[:8]}-{rid[8:12]}-{rid[12:16]}-{rid[16:20]}-{rid[20:]})')' "
                   f"thrown while requesting {method} {url}")
            if k <= HUB_RETRIES:
                wait = min(8, 2 ** (k - 1))
                sc.raw(t, f"{prefix}Retrying in {wait}s [Retry {k}/{HUB_RETRIES}].")
                t += wait
        return t - dt

    def hub_wait(self) -> None:
        """The API server reads the model's config through huggingface_hub: on a node without internet
        and without ``HF_HUB_OFFLINE=1`` (or ``TRANSFORMERS_OFFLINE=1``) it first waits out the Hub's
        retries (sparkrun sets both once the weights are local: ../shared/research/real-dgx-os.md
        "Offline worker"); everything after starts that much later."""
        d, args = self.driver, self.args
        if d is None or self.node.internet or args.model.startswith(("/", ".")) or \
                _offline(d.env, "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
            return
        took = self._hub_retries(self.sc, 0.8, self.api, f"https://huggingface.co/{args.model}/resolve/main/config.json")
        self.t0 += took
        for sc in self.scripts.values():
            sc.t0 += took

    def check_model(self) -> None:
        """A model that needs a newer vLLM (Qwen3.5 on 0.14) fails the ``ModelConfig`` validation."""
        spec, args = self.spec, self.args
        if spec is None or not spec.needs_new_vllm or self.new:
            return
        archs = ", ".join(repr(a) for a in SUPPORTED_ARCHS_014)
        frames = [*_CLI_FRAMES,
                  (f"{PY}/vllm/entrypoints/openai/api_server.py", 1398, "run_server",
                   "await run_server_worker(listen_address, sock, args, **uvicorn_kwargs)"),
                  (f"{PY}/vllm/engine/arg_utils.py", 1152, "create_model_config", "return ModelConfig("),
                  (f"{PY}/pydantic/_internal/_dataclasses.py", 121, "__init__",
                   "s.__pydantic_validator__.validate_python(ArgsKwargs(args, kwargs), self_instance=s)")]
        inp = "ArgsKwargs((), {'model': '" + args.model + "', 'runner': 'auto', ...})"
        exc = ("pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
               f"  Value error, Model architectures ['{self.arch}'] are not supported for now. "
               f"Supported architectures: dict_keys([{archs}]) "
               f"[type=value_error, input_value={inp}, input_type=ArgsKwargs]\n"
               "    For further information visit https://errors.pydantic.dev/2.12/v/value_error")
        self.sc.traceback(4.8, self.api, frames, exc)
        self.fail(4.9, "unsupported_architecture")

    def bind_port(self) -> None:
        """The socket is bound before the engine starts: a taken port fails at once."""
        if not self.cluster.port_taken(self.node.name, self.args.port, self.t0):
            return
        frames = [*_CLI_FRAMES,
                  (f"{PY}/vllm/entrypoints/openai/api_server.py", 1384, "run_server",
                   "sock = setup_server(args)"),
                  (f"{PY}/vllm/entrypoints/openai/api_server.py", 1352, "setup_server",
                   "sock = create_server_socket(sock_addr)"),
                  (f"{PY}/vllm/entrypoints/openai/api_server.py", 1318, "create_server_socket",
                   "sock.bind(addr)")]
        self.sc.traceback(0.6, self.api, frames, "OSError: [Errno 98] Address already in use")
        self.fail(0.7, "port")

    def configure(self) -> None:
        """The resolved model config (max model len, a hybrid model's block size, chunked prefill)
        and the engine core's ``Initializing a V1 LLM engine`` line."""
        sc, api, args, spec, run = self.sc, self.api, self.args, self.spec, self.run
        mml = self.mml = args.max_model_len or (spec.max_model_len if spec else 32768)
        run.max_model_len = mml
        sc.log(5.1, api, "INFO", "model.py:541", f"Resolved architecture: {self.arch}")
        sc.log(5.1, api, "INFO", "model.py:1561", f"Using max model len {mml}")
        self.prefix_caching = args.enable_prefix_caching if args.enable_prefix_caching is not None else True
        self.kv_dtype = "fp8" if (args.kv_cache_dtype or "auto").startswith("fp8") else "auto"
        self.pspec = pspec = planner_spec(args.model)
        if spec is not None and spec.hybrid and pspec is not None:
            # the planner's hybrid layout (planner/kv.py): the smallest 16-token multiple whose attention
            # page holds one state page at this TP, the state page padded up to it
            from sparkconsole.planner.kv import kv_layout

            lay = kv_layout(pspec.geometry, args.tp, self.kv_dtype, self.prefix_caching)
            self.run.kv_block_size = lay.block_size
            pad = (lay.page_bytes - lay.state_page_bytes) / lay.state_page_bytes * 100
            sc.log(5.2, api, "INFO", "config.py:424", f"Setting attention block size to {lay.block_size} tokens "
                   "to ensure that attention page size is >= mamba page size.")
            sc.log(5.2, api, "INFO", "config.py:448", f"Padding mamba page size by {pad:.2f}% to ensure that mamba "
                   "page size and attention page size are exactly equal.")
        nbt = self.nbt = args.max_num_batched_tokens or (8192 if self.new else 2048)
        # the same branch of EngineArgs.get_batch_defaults (vllm/engine/arg_utils.py) sets both defaults
        run.max_num_seqs = args.max_num_seqs or (1024 if self.new else 256)
        sc.log(5.2, api, "INFO", "scheduler.py:231", f"Chunked prefill is enabled with max_num_batched_tokens={nbt}.")
        sc.log(9.4, self.core, "INFO", "core.py:93",
               f"Initializing a V1 LLM engine (v{self.version}) with config: model='{args.model}', "
               f"speculative_config=None, tokenizer='{args.model}', skip_tokenizer_init=False, tokenizer_mode=auto, "
               f"revision=None, trust_remote_code={args.trust_remote_code}, dtype=torch.bfloat16, "
               f"max_seq_len={mml}, download_dir=None, load_format={args.load_format or 'auto'}, "
               f"tensor_parallel_size={args.tp}, pipeline_parallel_size={run.pp}, data_parallel_size=1, "
               f"disable_custom_all_reduce=False, quantization="
               f"{'fp8' if 'FP8' in args.model else ('modelopt_fp4' if 'NVFP4' in args.model else None)}, "
               f"enforce_eager={args.enforce_eager}, kv_cache_dtype={args.kv_cache_dtype or 'auto'}, "
               f"device_config=cuda, seed=0, served_model_name={self.served}, enable_prefix_caching="
               f"{args.enable_prefix_caching if args.enable_prefix_caching is not None else True}, "
               f"enable_chunked_prefill=True")

    # ---- P2: the distributed set-up ---------------------------------------------------------------

    def join_ranks(self) -> None:
        """Form the process group (native rendezvous, Ray placement group, or a single rank), then
        each rank's ``rank r in world size w is assigned as ...`` line."""
        self.t = 11.0
        if self.native:
            self._rendezvous()
        elif self.world > 1:
            self._ray_group(self._ray_placement())
        else:
            self.sc.log(self.t, self.core, "INFO", "parallel_state.py:1245",
                        f"world_size=1 rank=0 local_rank=0 distributed_init_method=tcp://{self.node.lan_ip}:"
                        f"{stable_int(30000, 60000, self.t0)} backend=nccl")
        for rank, (n, pid) in enumerate(self.span_nodes):
            pfx = self.rank_prefix(n, pid, rank)
            # vLLM's rank layout (DP=1): rank = pp_rank * tp + tp_rank; EP spans DP x PCP x TP of a stage
            pp_rank, tp_rank = divmod(rank, self.args.tp) if self.run.pp > 1 else (0, rank)
            self.log_on(n, self.t + 0.2, pfx, "INFO", "parallel_state.py:1466",
                        f"rank {rank} in world size {self.world} is assigned as DP rank 0, PP rank {pp_rank}, "
                        f"PCP rank 0, TP rank {tp_rank}, EP rank {tp_rank}")

    def _rendezvous(self) -> None:
        """Native multi-node: rank 0 hosts the TCPStore at ``--master-addr:--master-port`` and waits
        for the headless ranks; torch gives up after 601 s."""
        cluster, sc, args, run, t0 = self.cluster, self.sc, self.args, self.run, self.t0
        local = args.tp // args.nnodes if args.tp % args.nnodes == 0 else args.tp
        if local > 1:
            self.engine_failed(self.t, _PARALLEL_CONFIG_FRAMES, _world_too_big(local), "ray")
        run.rendezvous = (args.master_addr, args.master_port)
        run.serve_args = args
        lead_pid = stable_int(200, 3000, self.node.name, t0, "mpwrk")
        w0 = f"(Worker_TP0 pid={lead_pid}) "
        sc.log(self.t, self.core, "WARNING", "multiproc_executor.py:869", "Reducing Torch parallelism from 20 "
               "threads to 1 to avoid unnecessary CPU contention. Set OMP_NUM_THREADS in the external environment "
               "to tune this value as needed.")
        self.t += 2.6
        sc.log(self.t, w0, "INFO", "parallel_state.py:1245",
               f"world_size={args.tp} rank=0 local_rank=0 distributed_init_method=tcp://{args.master_addr}:"
               f"{args.master_port} backend=nccl")
        run.rendezvous_at = t0 + self.t
        joined = _joined_ranks(cluster, self.node, args, t0 + self.t)
        if len(joined) < args.nnodes - 1:
            # rank 0 hosts the TCPStore and waits for the other ranks: torch gives up after 600 s
            t_fail = self.t + 601.0
            n_joined = 1 + len(joined)
            sc.log(t_fail, w0, "ERROR", "multiproc_executor.py:772", "WorkerProc failed to start.")
            sc.traceback(t_fail, w0, [*_WORKER_FRAMES, *_RENDEZVOUS_FRAMES],
                         "torch.distributed.DistStoreError: Timed out after 601 seconds waiting for clients. "
                         f"{n_joined}/{args.tp} clients joined.", level_src="multiproc_executor.py:772")
            self.engine_failed(t_fail + 0.3, _MP_FRAMES, WORKERPROC_FAILED, "rendezvous")
        self.t = max(at for _c, at in joined.values()) - t0 + 0.4
        self.span_nodes = [(self.node, lead_pid)]
        for rank in sorted(joined):
            c, _at = joined[rank]
            assert c.headless is not None
            n = cluster.node(c.node)
            self.span_nodes.append((n, c.headless.pid))
            if self.driver is not None:
                self.rank_env[n.name] = dict(c.env)
            self.scripts[n.name] = _Script(cluster, t0)
            run.peer_lines[n.name] = self.scripts[n.name].lines
            run.peer_containers[n.name] = c.name
            c.headless.run = run
        run.nodes = tuple(n.name for n, _ in self.span_nodes)
        run.rank_pids = tuple(pid for _, pid in self.span_nodes)
        for rank, (n, pid) in enumerate(self.span_nodes):
            self.scripts[n.name].log(self.t + 1.2, f"(Worker_TP{rank} pid={pid}) ", "INFO",
                                     "custom_all_reduce.py:154",
                                     "CustomAllreduce is disabled because this process group spans across nodes.")
        self.t += 1.5
        sc.log(self.t, w0, "INFO", "pynccl.py:111", "vLLM is using nccl==2.27.5")
        run.nccl_at = t0 + self.t

    def _ray_placement(self) -> list[RayMember]:
        """TP/PP over Ray: connect to the cluster and reserve one GPU per rank (a placement group);
        returns the Ray members the ranks run on, the driver's node first. Without enough free GPUs
        vLLM waits, then gives up after 1800 s."""
        cluster, sc, core, args, t0, world = self.cluster, self.sc, self.core, self.args, self.t0, self.world
        t = self.t
        members = cluster.ray_members(t0)
        here = [m for m in members if m.node == self.node.name]
        if not here:
            self.engine_failed(t, _PARALLEL_CONFIG_FRAMES, _world_too_big(world), "ray")
        assert cluster.ray is not None
        stampfull = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(cluster.clock.epoch(t0 + t)))
        ms = int(_hash01(t0, "ms") * 1000)
        sc.raw(t, f"{core}{stampfull},{ms:03d}\tINFO worker.py:1832 -- Connecting to existing Ray cluster at "
               f"address: {cluster.ray.address}...")
        sc.raw(t + 0.4, f"{core}{stampfull},{(ms + 412) % 1000:03d}\tINFO worker.py:2003 -- Connected to Ray "
               f"cluster. View the dashboard at 127.0.0.1:8265 ")
        sc.log(t + 0.6, core, "INFO", "ray_utils.py:345", "No current placement group found. Creating a new "
               "placement group.")
        free_gpus = sum(m.gpus for m in members) - cluster.ray_gpus_used(t0)
        if free_gpus < world:
            self._placement_timeout()
        if args.tp > 1:  # _verify_bundles: fewer bundles on a node than tensor_parallel_size
            sc.log(t + 0.7, core, "WARNING", "ray_utils.py:378",
                   f"tensor_parallel_size={args.tp} is bigger than a reserved number of GPUs (1 GPUs) in a node "
                   f"{here[0].node_id}. Tensor parallel workers can be spread out to 2+ nodes which can degrade "
                   "the performance unless you have fast interconnect across nodes, like Infiniband. To resolve "
                   f"this issue, make sure you have more than {args.tp} GPUs available at each node.")
        others = [m for m in members if m.node != self.node.name][: world - 1]
        return [here[0], *others]

    def _placement_timeout(self) -> NoReturn:
        """Not enough free GPUs in the Ray cluster: vLLM waits for the placement group (its wait
        lines doubling) and gives up after 1800 s. A node joining later does not rescue it."""
        sc, core, t, world = self.sc, self.core, self.t, self.world
        specs = [{"GPU": 1.0, f"node:{self.node.fast_ip}": 0.001}] + [{"GPU": 1.0}] * (world - 1)
        waited = 10
        while waited < 1800:
            sc.log(t + 0.6 + waited, core, "INFO", "ray_utils.py:234",
                   f"Waiting for creating a placement group of specs for {waited} seconds. specs={specs}. "
                   "Check `ray status` and `ray list nodes` to see if you have enough resources, and make "
                   "sure the IP addresses used by ray cluster are the same as VLLM_HOST_IP environment "
                   "variable specified in each node if you are running on a multi-node.")
            waited = waited * 2 + 10
        msg = (f"ValueError: Cannot provide a placement group requiring {world} GPUs (placement_group_specs="
               f"{specs}) within 1800 seconds. See `ray status` and `ray list nodes` to make sure the cluster "
               "has enough resources.")
        self.engine_failed(t + 1800.6, [(f"{PY}/vllm/v1/executor/ray_utils.py", 248,
                                         "_wait_until_pg_ready", "raise ValueError(")], msg, "ray")

    def _ray_worker(self, n: SimNode, pid: int) -> str:
        """A Ray worker's prefix under the engine core (``ip=`` only on another node)."""
        return self.core + (f"(RayWorkerWrapper pid={pid}) " if n is self.node
                            else f"(RayWorkerWrapper pid={pid}, ip={n.fast_ip}) ")

    def _ray_group(self, members: list[RayMember]) -> None:
        """The Ray workers, one per rank, join the NCCL group over the fast link (a link that is down:
        the rendezvous never completes)."""
        cluster, sc, core, t0, run = self.cluster, self.sc, self.core, self.t0, self.run
        ip_head = self.node.fast_ip
        self.span_nodes = []
        for m in members:
            n = cluster.node(m.node)
            self.span_nodes.append((n, stable_int(200, 3000, n.name, t0, "raywrk")))
        self._ray_env(members)
        span_nodes = self.span_nodes
        run.nodes = tuple(n.name for n, _ in span_nodes)
        run.rank_pids = tuple(pid for _, pid in span_nodes)
        self.t += 3.0
        for rank, (n, pid) in enumerate(span_nodes):
            sc.log(self.t, self._ray_worker(n, pid), "INFO", "parallel_state.py:1245",
                   f"world_size={self.world} rank={rank} local_rank=0 distributed_init_method=tcp://{ip_head}:"
                   f"{stable_int(30000, 60000, t0)} backend=nccl")
        for n, pid in span_nodes:
            sc.log(self.t + 1.2, self._ray_worker(n, pid), "INFO", "custom_all_reduce.py:154",
                   "CustomAllreduce is disabled because this process group spans across nodes.")
        self.t += 1.5
        if not all(n.port1_up for n, _ in span_nodes):
            # NCCL bootstrap over a link that is down: the rendezvous never completes
            pfx = core + f"(RayWorkerWrapper pid={span_nodes[1][1]}, ip={span_nodes[1][0].fast_ip}) "
            msg = ("torch.distributed.DistNetworkError: The client socket has timed out after 600000ms while "
                   f"trying to connect to ({ip_head}, {stable_int(30000, 60000, t0)}).")
            self.engine_failed(self.t + 600.0, [(f"{PY}/vllm/distributed/parallel_state.py", 1231,
                                                 "init_distributed_environment",
                                                 "torch.distributed.init_process_group(")], msg, "nccl", pfx)
        sc.log(self.t, core + f"(RayWorkerWrapper pid={span_nodes[0][1]}) ", "INFO", "pynccl.py:111",
               "vLLM is using nccl==2.27.5")
        self._nccl_queue_pairs()
        run.nccl_at = t0 + self.t

    def _ray_env(self, members: list[RayMember]) -> None:
        """What each Ray worker runs with: the environment of the Ray container on its node (its
        raylet's), over which vLLM >= 0.17 copies the driver's ``VLLM_``/``NCCL_``/``HF_``/... variables
        (PR #34383), except vLLM's worker-specific ones and those listed in the driver container's
        ``ray_non_carry_over_env_vars.json``. Logged as vLLM's ray_env.py logs it."""
        d = self.driver
        if d is None:
            return
        copied = ray_copied(d, self.version)
        if version_at_least(self.version, 0, 17):
            sc, core, t = self.sc, self.core, self.t + 0.9
            if d.bad_file:
                sc.log(t, core, "WARNING", "ray_env.py:25", f"Failed to parse {d.config_file}. Using an empty set "
                       "for non-carry-over env vars.")
            sc.log(t, core, "INFO", "ray_env.py:100", f"Env var prefixes to copy: {sorted(RAY_COPY_PREFIXES)}")
            sc.log(t, core, "INFO", "ray_env.py:101", "Copying the following environment variables to workers: "
                   f"{sorted(copied)}")
            if d.non_carry:
                shown = "{" + ", ".join(repr(x) for x in sorted(d.non_carry)) + "}"
                sc.log(t, core, "INFO", "ray_env.py:107", f"RAY_NON_CARRY_OVER_ENV_VARS from config: {shown}")
            sc.log(t, core, "INFO", "ray_env.py:111", f"To exclude env vars from copying, add them to {d.config_file}")
        for m in members:
            ct = self.cluster.container(m.node, m.container) if m.container else None
            own = dict(ct.env) if ct is not None else (dict(d.env) if m.node == self.node.name else {})
            self.rank_env[m.node] = {**own, **copied}

    def _nccl_queue_pairs(self) -> None:
        """NCCL connects the ranks' queue pairs on its first collective (pynccl's warm-up all-reduce):
        a rank whose ``NCCL_IB_GID_INDEX`` is not a RoCE v2 IPv4 GID of its node (the head's index
        copied onto a worker whose table differs), or whose ``NCCL_IB_HCA`` names a device without an
        IPv4 GID, fails the INIT->RTR transition (tests/fixtures/real/dgx-os/nccl-wrong-gid-index.txt)."""
        if self.driver is None:
            return
        for n, pid in self.span_nodes:
            dev = nccl_ib_problem(self.cluster, n, self.rank_env.get(n.name, {}))
            if dev is None:
                continue
            pfx = self._ray_worker(n, pid)
            self.sc.raw(self.t + 0.4, f"{pfx}{n.name}:{pid}:{pid + 61} [0] misc/ibvwrap.cc:262 NCCL WARN Call to "
                        f"ibv_modify_qp failed with 22 Invalid argument, on dev {dev}:1, curr state INIT, next state RTR")
            frames = [(f"{PY}/vllm/distributed/device_communicators/pynccl.py", 139, "__init__",
                       "self.all_reduce(data)"),
                      (f"{PY}/vllm/distributed/device_communicators/pynccl.py", 160, "all_reduce",
                       "self.nccl.ncclAllReduce("),
                      (f"{PY}/vllm/distributed/device_communicators/pynccl_wrapper.py", 365, "ncclAllReduce",
                       "self.NCCL_CHECK("),
                      (f"{PY}/vllm/distributed/device_communicators/pynccl_wrapper.py", 306, "NCCL_CHECK",
                       'raise RuntimeError(f"NCCL error: {error_str}")')]
            self.engine_failed(self.t + 0.6, frames, NCCL_SYSTEM_ERROR, "nccl", pfx)

    # ---- P3: the start-up memory check ------------------------------------------------------------

    def check_free_memory(self) -> None:
        """Every rank compares what CUDA calls free (MemFree: a full page cache trips it) with
        ``--gpu-memory-utilization`` of the device."""
        self.t += 0.6
        args = self.args
        requested = args.gmu * CUDA_TOTAL_GIB
        for rank, (n, pid) in enumerate(self.span_nodes):
            snap = self.cluster.memory(n.name, self.t0 + self.t)
            free_gib = snap.free / GIB
            if free_gib < requested:
                msg = (f"ValueError: Free memory on device cuda:0 ({free_gib:.2f}/{CUDA_TOTAL_GIB} GiB) on startup "
                       f"is less than desired GPU memory utilization ({args.gmu}, {requested:.2f} GiB). Decrease "
                       "GPU memory utilization or reduce GPU memory used by other processes.")
                self.rank_failed(self.t, n, pid, rank, [(f"{PY}/vllm/v1/worker/gpu_worker.py", 247, "init_device",
                                                         "self.requested_memory = request_memory(init_snapshot, "
                                                         "self.cache_config)"),
                                                        (f"{PY}/vllm/v1/worker/utils.py", 318, "request_memory",
                                                         "raise ValueError(")], msg, "oom_startup")

    # ---- P4: the weights --------------------------------------------------------------------------

    def load_weights(self) -> None:
        """Load the checkpoint shard by shard (the bar), each rank's memory growing with it; weights
        that do not fit what is available die at the exact moment they reach it."""
        args, spec, run, t0 = self.args, self.spec, self.run, self.t0
        t_load = self.t_load = self.t + 0.3
        self.lead = self.rank_prefix(self.span_nodes[0][0], self.span_nodes[0][1], 0)
        self.rank_log(t_load, "INFO", "gpu_model_runner.py:3764", f"Starting to load model {args.model}...")
        t_load += self._weights_hub_wait(t_load + 0.2)
        if "FP8" in args.model:
            self.rank_log(t_load + 0.4, "INFO", "fp8.py:190", "DeepGEMM is disabled because the platform does not "
                          "support it.")
            self.rank_log(t_load + 0.4, "INFO", "fp8.py:209", "Using Triton backend for FP8 MoE")
        self.rank_log(t_load + 1.1, "INFO", "cuda.py:381", "Using FLASHINFER attention backend out of potential "
                      "backends: ('FLASHINFER', 'FLASH_ATTN', 'TRITON_ATTN', 'FLEX_ATTENTION')")
        shards = spec.shards if spec else 4
        # each rank's share of the weights (GiB): 1/TP of its pipeline stage's
        self.w_ranks = w_ranks = [stage_weights_gib(spec, args.tp, run.pp, rank // args.tp if run.pp > 1 else 0)
                                  for rank in range(len(self.span_nodes))]
        from sparkconsole.sim.model import WEIGHT_READ_S_PER_SHARD

        per = [WEIGHT_READ_S_PER_SHARD * (0.9 + 0.2 * _hash01(args.model, t0, k)) for k in range(shards)]
        if spec is not None and spec.disk_bytes < 30 * 10**9:
            per = [p * 0.8 for p in per]
        t_bar = t_load + 1.6
        t_read = sum(per)
        # free memory (what MemAvailable shows, without this engine) when loading starts, per node
        free_at_load = {n.name: self.cluster.memory(n.name, t0 + t_bar).available for n, _ in self.span_nodes}
        run.free_at_load = free_at_load
        oom_node = None
        oom_frac = 1.0
        for rank, (n, _pid) in enumerate(self.span_nodes):
            f = free_at_load[n.name]
            wb = w_ranks[rank] * GIB
            if wb > f and f / wb < oom_frac:
                oom_node, oom_frac = n, max(0.0, f / wb)
        desc = "Loading safetensors checkpoint shards"
        if args.load_format == "fastsafetensors":
            desc = "Loading safetensors using Fastsafetensor loader"
        self.sc.raw(t_bar, shard_bar(desc, 0, shards, 0.0))
        t_stop = t_bar + t_read * oom_frac  # when the loaded weights reach what was free
        elapsed = 0.0
        for k in range(shards):
            elapsed += per[k]
            if t_bar + elapsed > t_stop:
                break
            self.sc.raw(t_bar + elapsed, shard_bar(desc, k + 1, shards, elapsed))
        self._hold_weights(t_bar, t_read, t_stop, oom_node, oom_frac)
        if oom_node is not None:
            self._oom_in_loading(oom_node, oom_frac, shards, t_stop)
        self.sc.raw(t_bar + t_read + 0.01, shard_bar(desc, shards, shards, t_read + 0.02))
        self.sc.raw(t_bar + t_read + 0.02, self.lead.rstrip() + " ")
        self.t = t_bar + t_read + 0.3
        self.rank_log(self.t, "INFO", "default_loader.py:291", f"Loading weights took {t_read + 0.31:.2f} seconds")
        took = self.t - t_load + 11.5
        self.t += 11.5
        self.rank_log(self.t, "INFO", "gpu_model_runner.py:3846",
                      f"Model loading took {gib(w_ranks[0])} GiB memory and {took:.6f} seconds")

    def _weights_hub_wait(self, dt: float) -> float:
        """Each rank's loader asks the Hub for the checkpoint's index first (vLLM's
        ``download_weights_from_hf``) unless ``HF_HUB_OFFLINE=1`` in its environment: a rank on a node
        without internet waits out the retries. The load goes on when the slowest rank has."""
        if self.driver is None or self.args.model.startswith(("/", ".")):
            return 0.0
        url = f"https://huggingface.co/{self.args.model}/resolve/main/model.safetensors.index.json"
        longest = 0.0
        for rank, (n, pid) in enumerate(self.span_nodes):
            if n.internet or _offline(self.rank_env.get(n.name, {}), "HF_HUB_OFFLINE"):
                continue
            pfx = self.rank_prefix(n, pid, rank)
            longest = max(longest, self._hub_retries(self.scripts.get(n.name, self.sc), dt, pfx, url))
        return longest

    def _hold_weights(self, t_bar: float, t_read: float, t_stop: float, oom_node: SimNode | None,
                      oom_frac: float) -> None:
        """Each rank's process holds its weights as they load (up to what was free if it dies),
        and reads the shards through its node's page cache."""
        cluster, run, t0, spec = self.cluster, self.run, self.t0, self.spec
        for rank, (n, pid) in enumerate(self.span_nodes):
            pts = [(t0 + t_bar, 0.0)]
            if oom_node is not None:
                pts.append((t0 + t_stop, self.w_ranks[rank] * GIB * oom_frac))
            else:
                pts.append((t0 + t_bar + t_read, self.w_ranks[rank] * GIB))
            if self.native:
                holder = Holder(n.name, pid, f"VLLM::Worker_TP{rank}", Curve(pts),
                                container=self.container if n is self.node else run.peer_containers[n.name])
            else:
                holder = Holder(n.name, pid, "VLLM::EngineCore" if self.world == 1 else "ray::RayWorkerWrapper",
                                Curve(pts),
                                container=self.container if n is self.node else _ray_container(cluster, n.name))
            run.holders.append(holder)
            cluster.cache_ramps.append(_ramp(n.name, t0 + t_bar, t0 + t_bar + t_read * oom_frac,
                                             (spec.disk_bytes if spec else 8 * 10**9) * oom_frac, holder.curve,
                                             cluster.model_dir(n.name, run.model)))

    def _oom_in_loading(self, oom_node: SimNode, oom_frac: float, shards: int, t_stop: float) -> NoReturn:
        """The rank whose weights outgrow what was free dies with PyTorch's ``CUDA out of memory``."""
        oom_rank = [nn.name for nn, _p in self.span_nodes].index(oom_node.name)
        pid = self.span_nodes[oom_rank][1]
        w_bytes = self.w_ranks[oom_rank] * GIB
        free_left = max(1.0, self.run.free_at_load[oom_node.name] - w_bytes * oom_frac + 180 * MIB)
        in_use = w_bytes * oom_frac + 0.62 * GIB
        alloc = w_bytes / shards
        msg = (f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {alloc / GIB:.2f} GiB. GPU 0 has a "
               f"total capacity of {MEM_TOTAL / GIB:.2f} GiB of which {free_left / MIB:.2f} MiB is free. "
               f"Including non-PyTorch memory, this process has {in_use / GIB:.2f} GiB memory in use. Of the "
               f"allocated memory {w_bytes * oom_frac / GIB:.2f} GiB is allocated by PyTorch, and 39.50 MiB is "
               "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
               "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
               "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")
        frames = [(f"{PY}/vllm/v1/worker/gpu_model_runner.py", 3771, "load_model",
                   "self.model = model_loader.load_model("),
                  (f"{PY}/vllm/model_executor/model_loader/base_loader.py", 56, "load_model",
                   "self.load_weights(model, model_config)"),
                  (f"{PY}/vllm/model_executor/layers/fused_moe/layer.py", 1402, "weight_loader",
                   "expert_data.copy_(loaded_weight)")]
        for h in self.run.holders:
            h.curve.end = self.t0 + t_stop + 1.0
        self.rank_failed(t_stop + 0.2, oom_node, pid, oom_rank, frames, msg, "oom")

    # ---- P5: torch.compile, KV cache profiling, CUDA graphs ---------------------------------------

    def torch_compile(self) -> None:
        """Dynamo and the graph compile (skipped with ``--enforce-eager``)."""
        if self.args.enforce_eager:
            return
        spec, t = self.spec, self.t
        h = stable_hex(10, self.args.model, "compile")
        for rank, (n, pid) in enumerate(self.span_nodes if self.native else self.span_nodes[:1]):
            self.log_on(n, t + 1.0, self.rank_prefix(n, pid, rank) if self.native else self.lead, "INFO",
                        "backends.py:643", f"Using cache directory: /root/.cache/vllm/torch_compile_cache/{h}/"
                        f"rank_{rank}_0/backbone for vLLM's torch.compile")
        dyn = 9.84 if spec and spec.disk_bytes > 50e9 else 2.11
        comp = 61.23 if spec and spec.disk_bytes > 50e9 else 18.4
        self.rank_log(t + 1.0 + dyn, "INFO", "backends.py:703", f"Dynamo bytecode transform time: {dyn:.2f} s")
        self.rank_log(t + 1.0 + dyn + comp, "INFO", "backends.py:278",
                      f"Compiling a graph for compile range (1, {self.nbt}) takes {comp:.2f} s")
        self.rank_log(t + 1.0 + dyn + comp, "INFO", "monitor.py:34",
                      f"torch.compile takes {dyn + comp:.2f} s in total")
        self.t += 2.0 + dyn + comp

    def profile_kv(self) -> None:
        """What is left for the KV cache on every rank (vLLM admits on the smallest), the cache's
        size in tokens and the concurrency at ``max_model_len``; none left, or too little for one
        request, kills the engine."""
        sc = self.sc
        overhead = self.spec.overhead_gib if self.spec else 2.0
        kv_ranks = [self.args.gmu * CUDA_TOTAL_GIB - w - overhead for w in self.w_ranks]
        self.t += 1.5
        t = self.t
        if self.kernels_fail:
            # the profile run's first FP8 linear: an upstream build's CUTLASS block-FP8 GEMM on GB10's
            # sm_121 returns kErrorInternal, which vLLM's CUTLASS_CHECK raises as the status string
            # ("cutlass_scaled_mm / cutlass_gemm_caller Error Internal" during the profile run: vllm#40758,
            # vllm#43367 on an aarch64 cu129 image)
            self.rank_failed(t, self.span_nodes[0][0], self.span_nodes[0][1], 0, _FP8_GEMM_FRAMES,
                             "RuntimeError: Error Internal", "kernels")
        if min(kv_ranks) <= 0:
            msg = ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
                   "when initializing the engine.")
            bad = kv_ranks.index(min(kv_ranks))
            self.rank_failed(t, self.span_nodes[bad][0], self.span_nodes[bad][1], bad,
                             [(f"{PY}/vllm/v1/engine/core.py", 214, "_initialize_kv_caches",
                               "kv_cache_configs = get_kv_cache_configs(")], msg, "oom")
        # every worker logs its own budget (a Ray worker on another node under its "(RayWorkerWrapper
        # pid=M, ip=A)" prefix); vLLM admits on the smallest
        for rank, (n, pid) in enumerate(self.span_nodes):
            self.log_on(n, t, self.rank_prefix(n, pid, rank) if (self.native or rank) else self.lead, "INFO",
                        "gpu_worker.py:436", f"Available KV cache memory: {gib(kv_ranks[rank])} GiB")
        # the workers' block counts are unified to the smallest (every rank allocates that many)
        kv_alloc = self.kv_alloc = min(kv_ranks)
        tokens, conc, short, need, est = self._kv_capacity(kv_ranks)
        mml = self.mml
        if short:
            msg = (f"ValueError: To serve at least one request with the models's max seq len ({mml}), ({gib(need)} "
                   f"GiB KV cache is needed, which is larger than the available KV cache memory ({gib(kv_alloc)} "
                   f"GiB). Based on the available memory, the estimated maximum model length is {est}. Try "
                   "increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.")
            self.engine_failed(t, [(f"{PY}/vllm/v1/core/kv_cache_utils.py", 686, "check_enough_kv_cache_memory",
                                    "raise ValueError(")], msg, "oom", self.lead)
        self.run.kv_cache_tokens = tokens  # what /metrics' KV usage is a share of
        sc.log(t, self.core if self.native else self.lead, "INFO", "kv_cache_utils.py:1319",
               f"GPU KV cache size: {tokens:,} tokens")
        sc.log(t, self.core if self.native else self.lead, "INFO", "kv_cache_utils.py:1324",
               f"Maximum concurrency for {mml:,} tokens per request: {conc:.2f}x")

    def _kv_capacity(self, kv_ranks: list[float]) -> tuple[int, float, bool, float, int]:
        """(tokens printed, max concurrency, too short for one request, GiB one request needs, the
        longest length that fits): the planner's own KV arithmetic when it knows the model, else
        tokens per GiB of the catalogue."""
        args, run, mml = self.args, self.run, self.mml
        pspec = self.pspec
        if pspec is not None:
            # the planner's own KV arithmetic (planner/plan.py vllm_kv) for this image's vLLM: blocks per
            # rank from its budget, the smallest for all, concurrency = blocks / blocks per request, and
            # "GPU KV cache size" = blocks // groups x block (< 0.20) or concurrency x max_model_len
            from sparkconsole.planner.plan import vllm_kv

            vk = vllm_kv(pspec, [int(k * GIB) for k in kv_ranks], mml, args.tp, run.pp, self.kv_dtype,
                         self.prefix_caching, vllm_version=self.version)
            if vk.layout.padding_layers:
                self.sc.log(self.t, self.core if self.native else self.lead, "WARNING", "kv_cache_utils.py:1033",
                            f"Add {vk.layout.padding_layers} padding layers, may waste at most "
                            f"{vk.layout.padding_layers / (vk.layout.num_groups * vk.layout.group_size) * 100:.2f}% "
                            "KV cache memory")
            return (vk.printed_tokens, vk.capacity.max_concurrency,
                    vk.capacity.num_blocks < vk.capacity.blocks_per_request,
                    vk.capacity.blocks_per_request * vk.layout.bytes_per_block / GIB,
                    vk.layout.longest_len(vk.capacity.num_blocks))
        # a stage caches only its own layers' KV (1/PP of them), each rank 1/TP of the heads
        tokens_per_gib = (self.spec.kv_tokens_per_gib if self.spec else 8000.0) * args.tp * run.pp
        if args.kv_cache_dtype == "fp8":
            tokens_per_gib *= 2
        tokens = int(self.kv_alloc * tokens_per_gib) // 16 * 16
        return tokens, tokens / mml, tokens < mml, mml / tokens_per_gib, tokens // 16 * 16

    def capture_graphs(self) -> None:
        """The KV cache allocated on every rank, then the CUDA graphs captured (1 GiB more; none
        with ``--enforce-eager``); the engine core's init is done."""
        args, run, t0 = self.args, self.run, self.t0
        graphs = 0.0 if args.enforce_eager else 1.0
        finals = [(w + self.kv_alloc + graphs + 0.87) * GIB for w in self.w_ranks]
        for hd, final in zip(run.holders, finals, strict=True):
            hd.curve.points.append((t0 + self.t, final - graphs * GIB))
        if not args.enforce_eager:
            t = self.t
            self.sc.raw(t + 4.6, tqdm_bar("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)", 51, 51, 4.6))
            self.sc.raw(t + 22.9, tqdm_bar("Capturing CUDA graphs (decode, FULL)", 35, 35, 18.3))
            self.rank_log(t + 23.3, "INFO", "gpu_model_runner.py:4587", "Graph capturing finished in 24 secs, took "
                          "1.00 GiB")
            for hd, final in zip(run.holders, finals, strict=True):
                hd.curve.points.append((t0 + t + 23.3, final))
            self.t += 23.3
        self.sc.log(self.t + 0.2, self.core, "INFO", "core.py:259",
                    f"init engine (profile, create kv cache, warmup model) took {self.t - self.t_load + 0.2:.2f} "
                    "seconds")
        self.t += 1.1

    # ---- P6: the API server -----------------------------------------------------------------------

    def serve(self) -> None:
        """The API server's routes and uvicorn's start-up: the engine is ready."""
        sc, api, args = self.sc, self.api, self.args
        task = self.spec.task if self.spec else "generate"
        sc.log(self.t, api, "INFO", "api_server.py:1044", f"Supported tasks: ['{task}']")
        if task == "generate":
            sc.log(self.t, api, "WARNING", "model.py:1488", "Default sampling parameters have been overridden by "
                   "the model's Hugging Face generation config recommended from the model creator. If this is not "
                   "intended, please relaunch vLLM instance with `--generation-config vllm`.")
            sc.log(self.t + 0.3, api, "INFO", "serving_chat.py:137", "Using default chat sampling params from "
                   "model: {'temperature': 0.6, 'top_k': 20, 'top_p': 0.95}")
        self.t += 0.9
        t = self.t
        sc.log(t, api, "INFO", "api_server.py:1428", f"Starting vLLM API server 0 on http://{args.host}:{args.port}")
        sc.log(t, api, "INFO", "launcher.py:38", "Available routes are:")
        for r, m in _ROUTES:
            sc.log(t, api, "INFO", "launcher.py:46", f"Route: {r}, Methods: {m}")
        sc.raw(t + 0.1, f"{api}INFO:     Started server process [{self.pid_api}]")
        sc.raw(t + 0.1, f"{api}INFO:     Waiting for application startup.")
        sc.raw(t + 0.2, f"{api}INFO:     Application startup complete.")
        self.run.ready_at = self.t0 + t + 0.2
        self.run.periodic = self.activity > 0
