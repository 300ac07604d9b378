"""What a simulated ``vllm serve`` prints, and when: version-specific log scripts.

Every line is built from the format strings of the real vLLM release the image carries (see
``../shared/research/vllm-log-phases.md`` and ``tests/fixtures/real/vllm-logs/``):

* the command line as the image's release parses it (:func:`parse_serve_args`): exactly the options
  its ``vllm serve`` has (``data/vllm_serve_flags.json``, read from each release's own parser), with
  vLLM's ``FlexibleArgumentParser`` rewrites and argparse's rules; anything else is argparse's ``usage:
  vllm ...`` / ``vllm: error: unrecognized arguments: ...`` and exit 2;
* the envelope ``(APIServer pid=1) INFO 03-27 17:45:01 [api_server.py:1351] ...``, engine lines
  under ``(EngineCore_DP0 pid=N)``, Ray workers under ``(EngineCore_DP0 pid=N) (RayWorkerWrapper
  pid=M, ip=A.B.C.D)`` (``ip=`` only on another node);
* 0.14.x: ``vLLM API server version 0.14.1`` and ``non-default args: {...}``; 0.17.x: the ASCII
  banner with ``version`` and ``model`` rows;
* the shard bar ``Loading safetensors checkpoint shards:  40% Completed | 16/40 [00:52<01:18,
  3.27s/it]`` (tqdm ``{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<
  {remaining}, {rate_fmt}]``, final bar printed twice), ``Loading weights took %.2f seconds``,
  ``Model loading took %s GiB memory and %.6f seconds``, ``Available KV cache memory: %s GiB``,
  ``GPU KV cache size: %s tokens``, ``Maximum concurrency for %s tokens per request: %.2fx``,
  CUDA-graph capture bars, ``Starting vLLM API server 0 on http://0.0.0.0:8000``, uvicorn's
  ``INFO:     Application startup complete.``;
* failures: a Qwen3.5 model on the 0.14 image fails in config validation with the registry's
  ``Model architectures [...] are not supported for now. Supported architectures: ...``; the
  start-up check ``ValueError: Free memory on device cuda:0 (F/121.69 GiB) on startup is less
  than desired GPU memory utilization (U, R GiB)...`` (vLLM compares against what CUDA reports
  free: MemFree, so a full page cache trips it — drop the caches); weights that do not fit what
  is available die in loading with ``torch.OutOfMemoryError: CUDA out of memory. Tried to
  allocate ...`` at the exact moment the loaded weights reach what was free; TP>1 without a Ray
  cluster holding enough GPUs waits for a placement group (``Waiting for creating a placement
  group of specs for N seconds``) and gives up after 1800 s; a taken port fails with
  ``OSError: [Errno 98] Address already in use``;
* pipeline parallelism over Ray (``--pipeline-parallel-size P``/``-pp P`` with TP=T): world size
  T×P, a placement group of T×P GPUs (one per Spark, else the wait above), rank ``p*T + t`` logs
  ``... PP rank p, PCP rank 0, TP rank t, EP rank t``; each stage holds its share of the decoder
  layers (vLLM's ``get_pp_indices``: :func:`pp_partition`), the first also the embeddings and
  vision tower, the last the lm_head, at 1/T per rank (:func:`stage_weights_gib`); ``Model loading
  took`` is the first rank's figure; the KV blocks are unified to the smallest rank's; single-stream
  decode a little below TP=2 (:data:`DECODE_TOK_S_PP`). Native multi-node (below) is TP only;
* native multi-node (``--nnodes N --node-rank R --master-addr A --master-port P``, no Ray, as vLLM
  >= 0.11 runs it): a ``--headless`` rank logs ``Launching vLLM (vX) headless multiproc executor,
  with head node address A:P ...`` and its ``(Worker_TP1 pid=N)`` waits at the rendezvous for as
  long as it takes (:func:`plan_headless`); the head (rank 0) hosts the TCPStore at A:P and forms
  the group with the ranks that reach it over the fast link within 600 s (a rank starting after
  the head re-plans it: :func:`rank_joined`), else ``torch.distributed.DistStoreError: Timed out
  after 601 seconds waiting for clients. 1/2 clients joined.``; then the same load as the Ray
  TP=2 run, each rank's worker lines (``(Worker_TP0 pid=N)`` on the head, ``(Worker_TP1 pid=M)``
  on the worker) in its own container's log (``EngineRun.peer_lines``) and its memory on its own
  node. Stopping the worker's container: the head hangs on NCCL and dies by the watchdog
  (:func:`worker_lost`); stopping the head: the worker hangs the same way (:func:`head_stopped`).
* vLLM >= 0.17 over Ray copies the driver's ``VLLM_``/``LMCACHE_``/``NCCL_``/``UCX_``/``HF_``/
  ``HUGGING_FACE_`` variables onto every worker (PR #34383; logged as ``ray_env.py`` logs it, with
  ``To exclude env vars from copying, add them to $VLLM_CONFIG_ROOT/ray_non_carry_over_env_vars.json``),
  except vLLM's worker-specific ones and the names that file lists (:class:`DriverEnv`): a worker
  whose effective ``NCCL_IB_GID_INDEX`` is not its node's RoCE v2 IPv4 GID, or whose ``NCCL_IB_HCA``
  names a device without an IPv4 GID, fails NCCL's first collective with ``NCCL WARN Call to
  ibv_modify_qp failed with 22 Invalid argument, on dev D:1, curr state INIT, next state RTR`` and
  ``RuntimeError: NCCL error: unhandled system error`` (tests/fixtures/real/dgx-os/
  nccl-wrong-gid-index.txt);
* on a node without internet and without ``HF_HUB_OFFLINE=1`` huggingface_hub first waits out its
  retries (``... thrown while requesting HEAD https://huggingface.co/...``, ``Retrying in Ns [Retry
  k/5].``): the API server for the model's config, each rank for the checkpoint's index;
* chat completions take prefill plus ``completion_tokens / rate`` of sim time
  (:data:`DECODE_TOK_S`, :func:`chat_seconds`).

:func:`plan_serve` turns one ``vllm serve`` command into an :class:`~sparkconsole.sim.model.
EngineRun`: its timed lines, the memory curves of its processes on every node it spans, and
when it becomes ready or fails. The plan is made once, from the cluster as it is when the
command starts (a node joining Ray later does not rescue an engine already waiting), phase by
phase in :class:`~sparkconsole.sim.serve_plan.ServePlan`.
"""

from __future__ import annotations

import functools
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from sparkconsole.sim.model import (
    MODELS,
    Curve,
    EngineRun,
    LogLine,
    ModelSpec,
    SimCluster,
    SimNode,
    _hash01,
    stable_hex,
    stable_int,
)

# ---- serve arguments ---------------------------------------------------------------------------


@dataclass
class ServeArgs:
    model: str
    host: str = "0.0.0.0"
    port: int = 8000
    tp: int = 1
    pp: int = 1
    gmu: float = 0.9
    max_model_len: int | None = None
    served_name: str | None = None
    reasoning_parser: str | None = None
    backend: str | None = None
    enforce_eager: bool = False
    load_format: str | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_cache_dtype: str | None = None
    enable_prefix_caching: bool | None = None
    trust_remote_code: bool = False
    runner: str | None = None
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29501
    headless: bool = False
    extra: dict[str, object] = field(default_factory=dict)


class ServeArgError(ValueError):
    pass


@dataclass
class DriverEnv:
    """The environment a ``vllm serve`` process runs with (its container's, plus ``docker exec -e``)
    and what it read from ``$VLLM_CONFIG_ROOT/ray_non_carry_over_env_vars.json`` in that container
    (``bad_file``: the file did not parse; vLLM warns and copies everything)."""

    env: dict[str, str]
    non_carry: frozenset[str] = frozenset()
    config_file: str = "/root/.config/vllm/ray_non_carry_over_env_vars.json"
    bad_file: bool = False


# vLLM >= 0.17 (PR #34383) copies, from the driver to every Ray worker, each variable with one of these
# prefixes (plus PYTHONHASHSEED and vLLM's registered ones), except vLLM's worker-specific set and the
# names in ray_non_carry_over_env_vars.json [vllm/ray/ray_env.py, vllm/v1/executor/ray_executor.py]
RAY_COPY_PREFIXES = ("HF_", "HUGGING_FACE_", "LMCACHE_", "NCCL_", "UCX_", "VLLM_")
RAY_COPY_EXTRA = frozenset({"PYTHONHASHSEED", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"})
RAY_WORKER_SPECIFIC = frozenset({"VLLM_HOST_IP", "VLLM_HOST_PORT", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES",
                                 "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"})


def version_at_least(version: str, major: int, minor: int) -> bool:
    m = re.match(r"(\d+)\.(\d+)", version)
    return bool(m) and (int(m.group(1)), int(m.group(2))) >= (major, minor)


def ray_copied(driver: DriverEnv, version: str) -> dict[str, str]:
    """What the driver's Ray executor copies onto every worker: nothing before vLLM 0.17."""
    if not version_at_least(version, 0, 17):
        return {}
    skip = RAY_WORKER_SPECIFIC | driver.non_carry
    return {k: v for k, v in driver.env.items()
            if (k.startswith(RAY_COPY_PREFIXES) or k in RAY_COPY_EXTRA) and k not in skip}


# the options ServeArgs keeps by name, by their argparse ``dest``; every other known option goes to ``extra``
_VALUE_DESTS = {
    "host": "host", "port": "port", "tensor_parallel_size": "tp", "pipeline_parallel_size": "pp",
    "gpu_memory_utilization": "gmu", "max_model_len": "max_model_len", "served_model_name": "served_name",
    "reasoning_parser": "reasoning_parser", "distributed_executor_backend": "backend",
    "load_format": "load_format", "max_num_seqs": "max_num_seqs", "max_num_batched_tokens": "max_num_batched_tokens",
    "kv_cache_dtype": "kv_cache_dtype", "runner": "runner", "task": "runner", "nnodes": "nnodes",
    "node_rank": "node_rank", "master_addr": "master_addr", "master_port": "master_port",
}
_INT_ATTRS = ("port", "tp", "pp", "max_model_len", "max_num_seqs", "max_num_batched_tokens", "nnodes", "node_rank",
              "master_port")
_BOOL_DESTS = ("enforce_eager", "trust_remote_code", "enable_prefix_caching", "headless")

# The options of each release's ``vllm serve`` parser, as vLLM itself builds it (vllm/entrypoints/cli/main.py:
# main -> serve.py subparser_init -> openai/cli_args.py make_arg_parser -> FrontendArgs/EngineArgs.add_cli_args):
# the file's "source" names the release wheels and the files read.
SERVE_FLAGS_PATH = Path(__file__).with_name("data") / "vllm_serve_flags.json"


@functools.cache
def serve_flag_data() -> dict:
    return json.loads(SERVE_FLAGS_PATH.read_text())


def _vtuple(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version)[:3])


def serve_parser_version(version: str) -> str:
    """The release of the data whose parser stands for ``version``'s: the same release, else the newest
    one at or below it, else the oldest; "" (not known) takes the newest."""
    known = sorted(serve_flag_data()["versions"], key=_vtuple)
    if version in known:
        return version
    if not version or not _vtuple(version):
        return known[-1]
    below = [k for k in known if _vtuple(k) <= _vtuple(version)]
    return below[-1] if below else known[0]


@functools.cache
def serve_options(version: str) -> dict[str, dict]:
    """Option string -> its action (``options``, ``dest``, ``action``, ``nargs``, ``type``), in the order
    vLLM adds them (argparse lists ambiguous matches in that order)."""
    rel = serve_flag_data()["versions"][serve_parser_version(version)]
    return {o: a for a in rel["actions"] for o in a["options"]}


_NEG_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


def _flexible_argv(argv: list[str]) -> list[str]:
    """What vLLM's ``FlexibleArgumentParser.parse_args`` hands argparse for ``vllm serve ARGV``
    [vllm/utils/argparse_utils.py]: ``--model M`` moved to the front as the positional, ``_`` -> ``-`` in
    an option's name (before any ``.`` and ``=``), ``-O3``/``-O 3`` -> ``--optimization-level 3``, and
    dotted options (``--compilation-config.mode 3``, ``--x.list+ a,b``) merged into one JSON value each,
    appended at the end. (``--config FILE`` is not read: the YAML's options are not seen.)"""
    args = list(argv)
    idx = next((i for i, a in enumerate(args) if a == "--model" or a.startswith("--model=")), None)
    if idx is not None and (args[idx] != "--model" or idx + 1 < len(args)):
        model, rest = (args[idx + 1], idx + 2) if args[idx] == "--model" else (args[idx][8:], idx + 1)
        args = [model, *args[:idx], *args[rest:]]
    out: list[str] = []
    for i, a in enumerate(args):
        if a.startswith("--help="):
            out.append("--help")
        elif a.startswith("--"):
            key, eq, value = a.partition("=")
            name, dot, rest = key[2:].partition(".")
            out.append("--" + name.replace("_", "-") + dot + rest + eq + value)
        elif a.startswith("-O") and a != "-O":
            out += ["--optimization-level", a[3:] if a[2] == "=" else a[2:]]
        elif a == "-O" and i + 1 < len(args) and args[i + 1] in {"0", "1", "2", "3"}:
            out.append("--optimization-level")
        else:
            out.append(a)
    drop: set[int] = set()
    dicts: dict[str, dict] = {}
    for i, a in enumerate(out):
        if i in drop or not a.startswith("-") or "." not in a:
            continue
        if "=" in a:
            a, value_str = a.split("=", 1)
            if "." not in a:
                continue
        elif i + 1 < len(out):
            value_str = out[i + 1]
            drop.add(i + 1)
        else:
            continue
        if a.endswith("+"):
            a, value_str = a[:-1], json.dumps(value_str.split(","))
        key, *keys = a.split(".")
        try:
            value: object = json.loads(value_str)
        except ValueError:
            value = value_str
        for k in reversed(keys):
            value = {k: value}
        _merge(dicts.setdefault(key, {}), value)  # type: ignore[arg-type]
        drop.add(i)
    out = [a for i, a in enumerate(out) if i not in drop]
    for key, value in dicts.items():
        out += [key, json.dumps(value)]
    return out


def _merge(into: dict, update: dict) -> None:
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        elif isinstance(v, list) and isinstance(into.get(k), list):
            into[k] += v
        else:
            into[k] = v


def _serve_error(rel: dict, message: str) -> ServeArgError:
    """argparse's ``error`` of the ``serve`` subparser: its usage, then ``vllm serve: error: ...`` (exit 2)."""
    return ServeArgError(f"{rel['serve_usage']}\n{rel['serve_prog']}: error: {message}")


def _parse_optional(tok: str, opts: dict[str, dict], rel: dict) -> tuple[str | None, str | None] | None:
    """argparse's ``_parse_optional`` (Python 3.12): ``(option, explicit argument)`` for a known option (an
    unambiguous prefix of a ``--`` option included, as ``allow_abbrev`` is on), ``(None, None)`` for an
    unknown one, None for a positional."""
    if not tok or tok[0] != "-":
        return None
    if tok in opts:
        return tok, None
    if len(tok) == 1:
        return None
    name, sep, explicit = tok.partition("=")
    if sep and name in opts:
        return name, explicit
    matches: list[tuple[str, str | None]] = []
    if tok[1] == "-":
        if rel.get("allow_abbrev", True):
            prefix, sep, explicit = tok.partition("=")
            matches = [(o, explicit if sep else None) for o in opts if o.startswith(prefix)]
    else:
        for o in opts:
            if o == tok[:2]:
                matches.append((o, tok[2:]))
            elif o.startswith(tok):
                matches.append((o, None))
    if len(matches) > 1:
        raise _serve_error(rel, f"ambiguous option: {tok} could match {', '.join(o for o, _ in matches)}")
    if matches:
        return matches[0]
    if _NEG_NUMBER.match(tok) or " " in tok:
        return None
    return None, None


def _convert(action: dict, value: str, rel: dict) -> object:
    """A value as the action's ``type`` makes it (ints and floats; anything else stays a string)."""
    kind = action.get("type", "")
    inner = action.get("of", kind) if kind == "_optional_type" else kind
    if kind == "_optional_type" and value in ("", "None"):
        return None
    try:
        if inner in ("int", "human_readable_int", "human_readable_int_or_auto"):
            m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value.strip())
            if m and inner != "int":
                mult = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}.get(m.group(2))
                return int(float(m.group(1)) * mult) if mult else int(m.group(1)) * 2 ** (
                    10 * " KMGT".index(m.group(2)))
            if inner == "human_readable_int_or_auto" and value.strip().lower() in ("-1", "auto"):
                return -1
            return int(value)
        if inner == "float":
            return float(value)
    except ValueError:
        raise _serve_error(rel, f"argument {'/'.join(action['options'])}: invalid {kind} value: "
                                f"{value!r}") from None
    return value


def parse_serve_args(argv: list[str], version: str = "") -> ServeArgs:
    """``vllm serve MODEL [flags]`` (argv after ``serve``) as vLLM ``version``'s parser takes it: the options
    it knows (:func:`serve_options`), ``--max_model_len`` as ``--max-model-len``, ``--flag=value``, unambiguous
    abbreviations, the short aliases; anything else ends it as argparse does (``usage: vllm ...`` then
    ``vllm: error: unrecognized arguments: ...``, exit 2)."""
    rel = serve_flag_data()["versions"][serve_parser_version(version)]
    opts = serve_options(version)
    toks = _flexible_argv(argv)
    dash = toks.index("--") if "--" in toks else len(toks)
    kinds = [_parse_optional(t, opts, rel) if i < dash else None for i, t in enumerate(toks)]
    model: str | None = None
    extras: list[str] = []
    found: list[tuple[dict, str, object]] = []
    i = 0
    while i < len(toks):
        tok, kind = toks[i], kinds[i]
        i += 1
        if i - 1 == dash:
            continue
        if kind is None:
            if model is None:
                model = tok
            else:
                extras.append(tok)
            continue
        opt, explicit = kind
        if opt is None:
            extras.append(tok)
            continue
        action = opts[opt]
        nargs, name = action["nargs"], "/".join(action["options"])
        if explicit is not None:
            if nargs == 0:
                raise _serve_error(rel, f"argument {name}: ignored explicit argument '{explicit}'")
            values = [explicit]
        else:
            avail = 0
            while i + avail < len(toks) and kinds[i + avail] is None and i + avail != dash:
                avail += 1
            take = nargs if isinstance(nargs, int) else min(1, avail) if nargs == "?" else avail
            if isinstance(nargs, int) and nargs > avail:
                raise _serve_error(rel, f"argument {name}: expected one argument" if nargs == 1 else
                                   f"argument {name}: expected {nargs} arguments")
            if nargs == "+" and not avail:
                raise _serve_error(rel, f"argument {name}: expected at least one argument")
            values = toks[i:i + take]
            i += take
        if nargs == 0:  # --x / --no-x (argparse.BooleanOptionalAction), a store_true/false/const
            found.append((action, opt, not opt.startswith("--no-") if action["action"] == "booleanoptional"
                          else action.get("value", True)))
        elif nargs in (1, "?"):
            found.append((action, opt, _convert(action, values[0], rel) if values else None))
        else:
            found.append((action, opt, [_convert(action, v, rel) for v in values]))
    if extras:
        raise ServeArgError(f"{rel['top_usage']}\nvllm: error: unrecognized arguments: {' '.join(extras)}")
    if model is None:
        model = next((v for a, _o, v in found if a["dest"] == "model" and isinstance(v, str)), None)
    if model is None:  # real vLLM serves ModelConfig's default, Qwen/Qwen3-0.6B: not modelled, refused
        raise _serve_error(rel, "the following arguments are required: model_tag")
    args = ServeArgs(model=model)
    for action, _opt, value in found:
        dest = action["dest"]
        attr = _VALUE_DESTS.get(dest)
        if attr is not None:
            if isinstance(value, list):  # nargs "+" (--served-model-name A B): the first names it
                value = value[0]
            if attr in _INT_ATTRS and value is not None and not isinstance(value, int):
                value = _convert({**action, "type": "int"}, str(value), rel)
            elif attr == "gmu":
                value = float(value)  # type: ignore[arg-type]
            setattr(args, attr, value)
        elif dest in _BOOL_DESTS:
            setattr(args, dest, bool(value))
        elif dest not in ("model", "help"):
            args.extra[dest] = value
    if not 0 < args.gmu <= 1:
        raise ServeArgError(f"vllm serve: error: gpu_memory_utilization must be in (0, 1], got {args.gmu}")
    if not 0 <= args.node_rank < max(1, args.nnodes):
        raise ServeArgError(f"vllm serve: error: node_rank ({args.node_rank}) must be less than nnodes "
                            f"({args.nnodes})")
    return args


# ---- formatting helpers ------------------------------------------------------------------------


def stamp(cluster: SimCluster, t: float) -> str:
    return time.strftime("%m-%d %H:%M:%S", time.gmtime(cluster.clock.epoch(t)))


def fmt_interval(s: float) -> str:
    s = int(s)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h:d}:{m:02d}:{sec:02d}" if h else f"{m:02d}:{sec:02d}"


def shard_bar(desc: str, n: int, total: int, elapsed: float) -> str:
    pct = 100.0 * n / total if total else 100.0
    if n == 0:
        return f"{desc}: {pct:3.0f}% Completed | {n}/{total} [00:00<?, ?it/s]"
    per = elapsed / n
    rate = f"{per:5.2f}s/it" if per >= 1 else f"{1 / per:5.2f}it/s"
    return f"{desc}: {pct:3.0f}% Completed | {n}/{total} [{fmt_interval(elapsed)}<{fmt_interval(per * (total - n))}, {rate}]"


def tqdm_bar(desc: str, n: int, total: int, elapsed: float) -> str:
    frac = n / total if total else 1.0
    full = int(frac * 10)
    bar = "█" * full + ("" if full == 10 else " " * (10 - full))
    rate = n / elapsed if elapsed > 0 else 0.0
    r = f"{rate:5.2f}it/s" if rate >= 1 or rate == 0 else f"{1 / rate:5.2f}s/it"
    return f"{desc}: {100 * frac:3.0f}%|{bar}| {n}/{total} [{fmt_interval(elapsed)}<00:00, {r}]"


def gib(x: float) -> str:
    """vLLM 0.14+ ``format_gib``: round to 2 decimals, printed as a float."""
    return str(round(x, 2))


SUPPORTED_ARCHS_014 = [
    "AfmoeForCausalLM", "ApertusForCausalLM", "AquilaModel", "AquilaForCausalLM", "ArceeForCausalLM",
    "ArcticForCausalLM", "BaiChuanForCausalLM", "BaichuanForCausalLM", "BailingMoeForCausalLM",
    "BailingMoeV2ForCausalLM", "BambaForCausalLM", "BloomForCausalLM", "ChatGLMModel",
    "ChatGLMForConditionalGeneration", "CohereForCausalLM", "Cohere2ForCausalLM", "CwmForCausalLM",
    "DbrxForCausalLM", "DeciLMForCausalLM", "DeepseekForCausalLM", "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "Dots1ForCausalLM", "Ernie4_5ForCausalLM",
    "Ernie4_5_MoeForCausalLM", "ExaoneForCausalLM", "Exaone4ForCausalLM", "FalconForCausalLM",
    "Fairseq2LlamaForCausalLM", "GemmaForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM",
    "Gemma3nForCausalLM", "GlmForCausalLM", "Glm4ForCausalLM", "Glm4MoeForCausalLM",
    "Glm4MoeLiteForCausalLM", "GptOssForCausalLM", "GPT2LMHeadModel", "GPTBigCodeForCausalLM",
    "GPTJForCausalLM", "GPTNeoXForCausalLM", "GraniteForCausalLM", "GraniteMoeForCausalLM",
    "GraniteMoeHybridForCausalLM", "GraniteMoeSharedForCausalLM", "GritLM", "Grok1ModelForCausalLM",
    "HunYuanMoEV1ForCausalLM", "HunYuanDenseV1ForCausalLM", "HCXVisionForCausalLM",
    "InternLMForCausalLM", "InternLM2ForCausalLM", "InternLM2VEForCausalLM", "InternLM3ForCausalLM",
    "JAISLMHeadModel", "JambaForCausalLM", "KimiLinearForCausalLM", "Lfm2ForCausalLM",
    "Lfm2MoeForCausalLM", "LlamaForCausalLM", "Llama4ForCausalLM", "LLaMAForCausalLM",
    "LongcatFlashForCausalLM", "MambaForCausalLM", "Mamba2ForCausalLM", "MiniCPMForCausalLM",
    "MiniCPM3ForCausalLM", "MiniMaxForCausalLM", "MiniMaxText01ForCausalLM", "MiniMaxM1ForCausalLM",
    "MiniMaxM2ForCausalLM", "MistralForCausalLM", "MixtralForCausalLM", "MotifForCausalLM",
    "MptForCausalLM", "MPTForCausalLM", "NemotronForCausalLM", "NemotronHForCausalLM",
    "OlmoForCausalLM", "Olmo2ForCausalLM", "Olmo3ForCausalLM", "OlmoeForCausalLM", "OPTForCausalLM",
    "OrionForCausalLM", "OuroForCausalLM", "PanguEmbeddedForCausalLM", "PanguUltraMoEForCausalLM",
    "PersimmonForCausalLM", "PhiForCausalLM", "Phi3ForCausalLM", "PhiMoEForCausalLM",
    "Plamo2ForCausalLM", "QWenLMHeadModel", "Qwen2ForCausalLM", "Qwen2MoeForCausalLM",
    "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Qwen3NextForCausalLM", "RWForCausalLM",
    "SeedOssForCausalLM", "Step3TextForCausalLM", "StableLMEpochForCausalLM", "StableLmForCausalLM",
    "Starcoder2ForCausalLM", "SolarForCausalLM", "TeleChat2ForCausalLM", "TeleFLMForCausalLM",
    "XverseForCausalLM", "Zamba2ForCausalLM", "BertModel", "Gemma2Model", "Gemma3TextModel",
    "GPT2ForSequenceClassification", "LlamaModel", "MistralModel", "Qwen2Model", "Qwen3Model",
    "RobertaModel", "XLMRobertaModel", "Qwen2VLForConditionalGeneration",
    "Qwen2_5_VLForConditionalGeneration", "Qwen2_5OmniModel", "Qwen3VLForConditionalGeneration",
    "Qwen3VLMoeForConditionalGeneration", "Qwen3OmniMoeForConditionalGeneration",
    "Llama4ForConditionalGeneration", "Gemma3ForConditionalGeneration", "MllamaForConditionalGeneration",
]


# ---- the plan ----------------------------------------------------------------------------------


class ErrLine(LogLine):
    """A line the process wrote to stderr: ``docker logs`` gives it on stderr (an engine run to a file
    with ``> LOG 2>&1`` has both in the file, in the order written)."""


# The envelope vLLM puts before every line of a process (``(APIServer pid=1) ``, a Ray worker's two).
_ENVELOPE = re.compile(r"(?:\([A-Za-z_0-9]+ pid=\d+(?:, ip=[0-9.]+)?\) )*")
# uvicorn's own logger (``INFO:     Started server process [1]``): its default handler is stderr
# (uvicorn's access log, ``INFO:     127.0.0.1:… - "POST …"``, goes to stdout).
_UVICORN = re.compile(r"(?:INFO|WARNING|ERROR|DEBUG|CRITICAL):\s{2,}(?![0-9.]+:\d+ - \")\S")
# tqdm's bars (the checkpoint shards, CUDA graph capture): tqdm writes to stderr
_TQDM = re.compile(r"[^|]*: *\d+%(?: Completed )?\|")


def on_stderr(text: str) -> bool:
    """Whether a real ``vllm serve`` writes this line to stderr: uvicorn's start-up and shutdown lines
    and tqdm's progress bars do; vLLM's own logger writes to stdout."""
    body = text[_ENVELOPE.match(text).end():]  # type: ignore[union-attr]  # the pattern matches "" at least
    return bool(_UVICORN.match(body) or _TQDM.match(body))


class _Script:
    def __init__(self, cluster: SimCluster, t0: float) -> None:
        self.cluster = cluster
        self.t0 = t0
        self.lines: list[LogLine] = []

    def raw(self, dt: float, text: str) -> None:
        self.lines.append((ErrLine if on_stderr(text) else LogLine)(self.t0 + dt, text))

    def log(self, dt: float, prefix: str, level: str, src: str, msg: str) -> None:
        self.raw(dt, f"{prefix}{level} {stamp(self.cluster, self.t0 + dt)} [{src}] {msg}")

    def traceback(self, dt: float, prefix: str, frames: list[tuple[str, int, str, str]], exc: str,
                  level_src: str | None = None) -> None:
        """A Python traceback; ``level_src`` logs it frame by frame at ERROR (EngineCore style)."""
        body = ["Traceback (most recent call last):"]
        for path, line, func, code in frames:
            body.append(f'  File "{path}", line {line}, in {func}')
            body.append(f"    {code}")
        body.extend(exc.split("\n"))
        for b in body:
            if level_src:
                self.log(dt, prefix, "ERROR", level_src, b)
            else:
                self.raw(dt, f"{prefix}{b}")


PY = "/usr/local/lib/python3.12/dist-packages"

# ---- native multi-node (--nnodes/--node-rank/--master-addr, no Ray): the multiproc executor -------

WORKERPROC_FAILED = ("Exception: WorkerProc initialization failed due to an exception in a background process. "
                     "See stack trace for root cause.")
_WORKER_FRAMES = [
    (f"{PY}/vllm/v1/executor/multiproc_executor.py", 743, "worker_main", "worker = WorkerProc(*args, **kwargs)"),
    (f"{PY}/vllm/v1/executor/multiproc_executor.py", 569, "__init__", "self.worker.init_device()"),
    (f"{PY}/vllm/v1/worker/worker_base.py", 326, "init_device", "self.worker.init_device()  # type: ignore"),
]
_RENDEZVOUS_FRAMES = [
    (f"{PY}/vllm/v1/worker/gpu_worker.py", 230, "init_device", "init_worker_distributed_environment("),
    (f"{PY}/vllm/v1/worker/gpu_worker.py", 887, "init_worker_distributed_environment",
     "init_distributed_environment("),
    (f"{PY}/vllm/distributed/parallel_state.py", 1231, "init_distributed_environment",
     "torch.distributed.init_process_group("),
    ("/usr/local/lib/python3.12/dist-packages/torch/distributed/rendezvous.py", 198, "_create_c10d_store",
     "return TCPStore("),
]
_MP_FRAMES = [
    (f"{PY}/vllm/v1/executor/abstract.py", 101, "__init__", "self._init_executor()"),
    (f"{PY}/vllm/v1/executor/multiproc_executor.py", 172, "_init_executor",
     "self.workers = WorkerProc.wait_for_ready(unready_workers)"),
    (f"{PY}/vllm/v1/executor/multiproc_executor.py", 683, "wait_for_ready", "raise e from None"),
]
HEADLESS_WAIT_S = 7.5  # `vllm serve --headless` start to its workers waiting at the rendezvous
RENDEZVOUS_TIMEOUT_S = 601.0


def _joined_ranks(cluster: SimCluster, head: SimNode, args: ServeArgs, t_rdv: float) -> dict[int, tuple]:
    """The headless ranks that reach the head's TCPStore within its timeout: rank -> (container,
    when it joined). A rank joins over the fast link to ``--master-addr`` (down link: never)."""
    out: dict[int, tuple] = {}
    for c in cluster.containers:
        h = c.headless
        if (h is None or h.run is not None or c.node == head.name or h.nnodes != args.nnodes or h.tp != args.tp
                or (h.master_addr, h.master_port) != (args.master_addr, args.master_port)):
            continue
        at = max(t_rdv, h.waiting_at)
        if at - t_rdv > RENDEZVOUS_TIMEOUT_S - 1.0 or not c.running(at):
            continue
        if cluster.reachable(cluster.node(c.node), args.master_addr, at) is not head:
            continue
        if h.node_rank not in out or out[h.node_rank][1] > at:
            out[h.node_rank] = (c, at)
    return out


def plan_headless(cluster: SimCluster, node: SimNode, container, version: str, args: ServeArgs,
                  t0: float) -> tuple[list[LogLine], int | None]:
    """A ``vllm serve --headless --node-rank R`` rank: its lines up to the rendezvous, where its
    worker waits (for as long as it takes) for the head at ``--master-addr:--master-port``; the
    head's plan (:func:`plan_serve`) writes what follows into ``EngineRun.peer_lines``. Returns
    (lines, exit code if it stops at once)."""
    from sparkconsole.sim.model import HeadlessRank

    sc = _Script(cluster, t0)
    spec = MODELS.get(args.model)
    if spec is not None and spec.needs_new_vllm and version.startswith("0.14"):
        sc.raw(4.8, "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n  Value "
               f"error, Model architectures ['{spec.architecture}'] are not supported for now.")
        return sc.lines, 1
    sc.log(4.2, "", "INFO", "serve.py:229", f"Launching vLLM (v{version}) headless multiproc executor, with head "
           f"node address {args.master_addr}:{args.master_port} for torch.distributed process group.")
    sc.log(4.4, "", "WARNING", "multiproc_executor.py:869", "Reducing Torch parallelism from 20 threads to 1 to "
           "avoid unnecessary CPU contention. Set OMP_NUM_THREADS in the external environment to tune this value "
           "as needed.")
    pid = stable_int(200, 3000, node.name, t0, "mpwrk")
    rank = args.node_rank * max(1, args.tp // max(1, args.nnodes))
    sc.log(HEADLESS_WAIT_S, f"(Worker_TP{rank} pid={pid}) ", "INFO", "parallel_state.py:1245",
           f"world_size={args.tp} rank={rank} local_rank=0 distributed_init_method=tcp://{args.master_addr}:"
           f"{args.master_port} backend=nccl")
    container.headless = HeadlessRank(args.master_addr, args.master_port, args.nnodes, args.node_rank, args.tp,
                                      args.model, pid, t0 + HEADLESS_WAIT_S)
    return sc.lines, None


def rank_joined(cluster: SimCluster, container) -> bool:
    """A headless rank started after its head: a head still waiting at the rendezvous (planned to
    time out) is planned again from its start, now with this rank joining. True if one was."""
    h = container.headless
    if h is None:
        return False
    for c in cluster.containers:
        run = c.engine
        if (run is None or not run.native or run.rendezvous != (h.master_addr, h.master_port)
                or run.nccl_at is not None or run.failure != "rendezvous" or run.stopped_at is not None
                or run.rendezvous_at is None or run.failed_at is None or run.failed_at <= h.waiting_at):
            continue
        c.engine = None  # the old plan holds the head's port: re-plan without it
        c.engine = plan_serve(cluster, cluster.node(c.node), c.name, run.version, run.serve_args, run.started,
                              pid_api=run.pid_api, activity=run.activity)
        c.engine.api_key = c.engine.api_key or run.api_key  # the same process: the key of its environment
        return True
    return False


def head_stopped(cluster: SimCluster, run: EngineRun, t: float) -> None:
    """The head of a native multi-node run is stopped at ``t``: its side ends now; each headless
    rank, joined in the NCCL group, hangs on the next collective until PyTorch's watchdog takes
    it down (``NCCL_TIMEOUT_MS``); a rank still in the rendezvous loses the store at once."""
    for h in run.holders:
        if h.node == run.nodes[0] and (h.curve.end is None or h.curve.end > t):
            h.curve.end = t
    if run.stopped_at is None or run.stopped_at > t:
        run.stopped_at = t
    for rank, node in enumerate(run.nodes[1:], 1):
        lines = run.peer_lines.get(node)
        if lines is None or (run.peer_end.get(node) is not None and run.peer_end[node] <= t):
            continue
        lines[:] = [ln for ln in lines if ln.t <= t]
        sc = _Script(cluster, 0.0)
        pfx = f"(Worker_TP{rank} pid={run.rank_pids[rank]}) "
        if run.nccl_at is None or t < run.nccl_at:
            end = t + 0.3
            sc.log(end - 0.1, pfx, "ERROR", "multiproc_executor.py:772", "WorkerProc failed to start.")
            sc.traceback(end - 0.1, pfx, [*_WORKER_FRAMES, *_RENDEZVOUS_FRAMES],
                         "torch.distributed.DistNetworkError: failed to recv, got 0 bytes",
                         level_src="multiproc_executor.py:772")
        else:
            end = _watchdog(cluster, sc, run, [rank], t, lambda r: f"(Worker_TP{r} pid={run.rank_pids[r]}) ")
            sc.log(end, "", "ERROR", "multiproc_executor.py:671", "Worker proc VllmWorker-0 died unexpectedly, "
                   "shutting down executor.")
            end += 0.4
        lines.extend(sc.lines)
        run.peer_end[node] = end
        for h in run.holders:
            if h.node == node and (h.curve.end is None or h.curve.end > end):
                h.curve.end = end


def peer_stopped(cluster: SimCluster, run: EngineRun, node: str, t: float) -> None:
    """A headless rank's container is stopped at ``t``: its process ends now (its memory freed);
    the head sees a lost TP worker (:func:`worker_lost`)."""
    if node not in run.peer_lines or (run.peer_end.get(node) is not None and run.peer_end[node] <= t):
        return
    run.peer_end[node] = t
    for h in run.holders:
        if h.node == node and (h.curve.end is None or h.curve.end > t):
            h.curve.end = t
    worker_lost(cluster, run, node, t)


def _nondefault(args: ServeArgs, spec_max: int) -> str:
    d: dict[str, object] = {"model_tag": args.model}
    d["host"] = args.host
    if args.port != 8000:
        d["port"] = args.port
    d["model"] = args.model
    if args.trust_remote_code:
        d["trust_remote_code"] = True
    if args.max_model_len:
        d["max_model_len"] = args.max_model_len
    if args.served_name:
        d["served_model_name"] = [args.served_name]
    if args.load_format:
        d["load_format"] = args.load_format
    if args.backend:
        d["distributed_executor_backend"] = args.backend
    if args.pp != 1:  # EngineArgs' order: pipeline before tensor
        d["pipeline_parallel_size"] = args.pp
    if args.tp != 1:
        d["tensor_parallel_size"] = args.tp
    if args.gmu != 0.9:
        d["gpu_memory_utilization"] = args.gmu
    if args.kv_cache_dtype:
        d["kv_cache_dtype"] = args.kv_cache_dtype
    if args.enable_prefix_caching is not None:
        d["enable_prefix_caching"] = args.enable_prefix_caching
    if args.max_num_seqs:
        d["max_num_seqs"] = args.max_num_seqs
    if args.max_num_batched_tokens:
        d["max_num_batched_tokens"] = args.max_num_batched_tokens
    if args.reasoning_parser:
        d["reasoning_parser"] = args.reasoning_parser
    if args.enforce_eager:
        d["enforce_eager"] = True
    if args.headless:
        d["headless"] = True
    if args.nnodes != 1:
        d["nnodes"] = args.nnodes
    if args.node_rank:
        d["node_rank"] = args.node_rank
    if args.master_addr != "127.0.0.1":
        d["master_addr"] = args.master_addr
    if args.master_port != 29501:
        d["master_port"] = args.master_port
    for k, v in args.extra.items():
        d[k] = v
    return repr(d)


def plan_serve(
    cluster: SimCluster,
    node: SimNode,
    container: str,
    version: str,
    args: ServeArgs,
    t0: float,
    pid_api: int = 1,
    activity: float = 0.0,
    driver_env: DriverEnv | None = None,
    spec: ModelSpec | None = None,
    kernels_fail: bool = False,
) -> EngineRun:
    """Plan one ``vllm serve`` run started at sim time ``t0`` in ``container`` on ``node``
    (``driver_env``: its process's environment; None for the scenarios' long-running services,
    whose start is history: no Hub wait, nothing copied to Ray workers).

    A TP worker's node that is already due to be lost (``lost_at`` set, as in the ``node-lost``
    scenario) is applied to the plan at once: see :func:`worker_lost`; then the cluster's
    ``engine_listeners`` are told of the run (a scenario's event that comes to it)."""
    from sparkconsole.sim.serve_plan import ServePlan  # it builds on this module's formats and frames

    run = ServePlan(cluster, node, container, version, args, t0, pid_api, activity, driver_env=driver_env,
                    spec=spec, kernels_fail=kernels_fail).plan()
    run.host = args.host
    # vllm/entrypoints/openai/api_server.py: `if token := args.api_key or envs.VLLM_API_KEY:` installs
    # the key check on /v1 (the flag first, then the environment; an empty value is no key)
    flag = args.extra.get("api_key")
    if isinstance(flag, list):  # nargs "+" in the releases whose --api-key takes several keys: the first
        flag = next((k for k in flag if k), None)
    run.api_key = (flag if isinstance(flag, str) and flag else None) or (
        driver_env.env.get("VLLM_API_KEY") if driver_env is not None else None) or None
    losses = sorted((cluster.node(n).lost_at, n) for n in run.nodes[1:] if cluster.node(n).lost_at is not None)
    if losses:
        lost_at, name = losses[0]
        worker_lost(cluster, run, name, max(lost_at, t0))
    for listener in list(cluster.engine_listeners):
        listener(cluster, node.name, container, run)
    return run


# ---- a TP worker's node is lost -----------------------------------------------------------------

NCCL_TIMEOUT_MS = 600_000  # torch.distributed's default for NCCL process groups (10 minutes)


def _glog(cluster: SimCluster, t: float, level: str = "E") -> str:
    """c10's glog-style stamp as PyTorch prints it: ``E219 08:58:32.606233339`` (month unpadded)."""
    e = cluster.clock.epoch(t)
    tm = time.gmtime(e)
    nanos = int((e % 1.0) * 1e9) // 1000 * 1000 + stable_int(0, 1000, "ns", round(t, 6))
    return f"{level}{tm.tm_mon}{tm.tm_mday:02d} {tm.tm_hour:02d}:{tm.tm_min:02d}:{tm.tm_sec:02d}.{nanos:09d}"


def worker_lost(cluster: SimCluster, run: EngineRun, node: str, t_lost: float) -> bool:
    """Re-plan a TP>1 engine whose worker on ``node`` is lost at ``t_lost``; True if it changed.

    Nothing the engine had planned after ``t_lost`` happens (its lines are dropped, it never
    becomes ready if it was not yet). Once the NCCL group is up, the next collective (an
    ALLREDUCE) never completes: after ``NCCL_TIMEOUT_MS`` of sim time each rank's watchdog logs
    PyTorch's ``Watchdog caught collective operation timeout: WorkNCCL(...) ran for N milliseconds
    before timing out.`` (as in ``tests/fixtures/real/vllm-logs/18-...``; the lost rank's lines
    come first, relayed by Ray with its ``ip=``), takes its process down, the engine core dies with
    Ray's ``ActorDiedError`` and the API server with ``EngineDeadError``. A worker lost before the
    group is up leaves rank 0 waiting in the rendezvous: ``DistStoreError: Timed out after 601
    seconds waiting for clients. 1/2 clients joined.`` The driver's own node is not handled (its
    log is on that node, which no longer answers)."""
    if run.world < 2 or node not in run.nodes[1:] or t_lost < run.started or run.ended(t_lost):
        return False
    if run.hung_at is not None and run.hung_at <= t_lost:
        return False
    if not run.rank_pids or len(run.rank_pids) != len(run.nodes):
        return False
    run.lines[:] = [ln for ln in run.lines if ln.t <= t_lost]
    if run.ready_at is not None and run.ready_at > t_lost:
        run.ready_at = None
    run.hung_at = t_lost
    run.failed_at = None
    run.failure = None
    sc = _Script(cluster, 0.0)
    api = f"(APIServer pid={run.pid_api}) "
    core = f"(EngineCore_DP0 pid={run.pid_core}) "
    driver = cluster.node(run.nodes[0])

    def wrapper(rank: int) -> str:
        n = cluster.node(run.nodes[rank])
        pid = run.rank_pids[rank]
        return core + (f"(RayWorkerWrapper pid={pid}) " if n is driver else f"(RayWorkerWrapper pid={pid}, "
                                                                             f"ip={n.fast_ip}) ")

    lost_rank = run.nodes.index(node)
    if run.native:
        end = _native_worker_lost(cluster, sc, run, node, lost_rank, t_lost)
    elif run.nccl_at is None or t_lost < run.nccl_at:
        # the rendezvous: rank 0 hosts the TCPStore and waits for the lost rank to join
        t_fail = max(t_lost, run.started) + 601.0
        sc.log(t_fail - 0.2, wrapper(0), "ERROR", "worker_base.py:620", "Error executing method 'init_device'. "
               "This might cause deadlock in distributed execution.")
        sc.log(t_fail, core, "ERROR", "core.py:866", "EngineCore failed to start.")
        sc.traceback(t_fail, core, [
            (f"{PY}/vllm/v1/engine/core.py", 846, "run_engine_core", "engine_core = EngineCoreProc(*args, **kwargs)"),
            (f"{PY}/vllm/v1/executor/ray_executor.py", 109, "_init_executor", "self._init_workers_ray(placement_group)"),
            (f"{PY}/ray/_private/worker.py", 2962, "get", "values, debugger_breakpoint = worker.get_objects("),
        ], f"ray.exceptions.RayTaskError(DistStoreError): ray::RayWorkerWrapper.execute_method() "
           f"(pid={run.rank_pids[0]}, ip={driver.fast_ip}, actor_id={stable_hex(32, 'actor', run.started)})\n"
           "torch.distributed.DistStoreError: Timed out after 601 seconds waiting for clients. "
           f"{run.world - 1}/{run.world} clients joined.", level_src="core.py:866")
        sc.raw(t_fail + 0.4, f"{api}RuntimeError: Engine core initialization failed. See root cause above. "
               "Failed core proc(s): {}")
        end = t_fail + 0.6
    else:
        order = [lost_rank] + [r for r in range(run.world) if r != lost_rank]
        t_fail = _watchdog(cluster, sc, run, order, t_lost, wrapper)
        lost = cluster.node(node)
        actor = stable_hex(32, "actor", run.started, node)
        t_dead = t_fail + 2.4
        sc.log(t_dead, core, "ERROR", "core.py:933", "EngineCore encountered a fatal error.")
        sc.traceback(t_dead, core, [
            (f"{PY}/vllm/v1/engine/core.py", 924, "run_engine_core", "engine_core.run_busy_loop()"),
            (f"{PY}/vllm/v1/engine/core.py", 951, "run_busy_loop", "self._process_engine_step()"),
            (f"{PY}/vllm/v1/engine/core.py", 984, "_process_engine_step",
             "outputs, model_executed = self.step_fn()"),
            (f"{PY}/vllm/v1/executor/ray_executor.py", 412, "execute_model", "return refs[0].get()"),
        ], "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.\n"
           "\tclass_name: RayWorkerWrapper\n"
           f"\tactor_id: {actor}\n"
           f"\tpid: {run.rank_pids[lost_rank]}\n"
           f"\tip: {lost.fast_ip}\n"
           "The actor is dead because its node has died. Node Id: "
           f"{stable_hex(56, 'raynode', node)}", level_src="core.py:933")
        sc.log(t_dead + 0.1, api, "ERROR", "async_llm.py:525", "AsyncLLM output_handler failed.")
        sc.traceback(t_dead + 0.1, api, [
            (f"{PY}/vllm/v1/engine/async_llm.py", 477, "output_handler",
             "outputs = await engine_core.get_output_async()"),
            (f"{PY}/vllm/v1/engine/core_client.py", 894, "get_output_async", "raise self._format_exception(outputs) "
             "from None"),
        ], "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) "
           "for the root cause.", level_src="async_llm.py:525")
        sc.log(t_dead + 0.3, core, "INFO", "ray_executor.py:121", "Shutting down Ray distributed executor. If you see "
               "error log from logging.cc regarding SIGTERM received, please ignore because this is the expected "
               "termination process in Ray.")
        for i, text in enumerate(("Shutting down", "Waiting for application shutdown.",
                                  "Application shutdown complete.", f"Finished server process [{run.pid_api}]")):
            sc.raw(t_dead + 0.5 + 0.01 * i, f"{api}INFO:     {text}")
        end = t_dead + 0.6
    run.lines.extend(sc.lines)
    run.failed_at = end
    run.failure = "nccl"
    for h in run.holders:
        if h.curve.end is None or h.curve.end > end:
            h.curve.end = end
    return True


def _native_worker_lost(cluster: SimCluster, sc: _Script, run: EngineRun, node: str, lost_rank: int,
                        t_lost: float) -> float:
    """:func:`worker_lost` for a native multi-node run: the head's own worker (``Worker_TP0``)
    times out; its executor shuts down. Returns when the head's processes are gone."""
    api = f"(APIServer pid={run.pid_api}) "
    core = f"(EngineCore_DP0 pid={run.pid_core}) "

    def w(rank: int) -> str:
        return f"(Worker_TP{rank} pid={run.rank_pids[rank]}) "

    lines = run.peer_lines.get(node)
    if lines is not None:
        lines[:] = [ln for ln in lines if ln.t <= t_lost]
    if run.peer_end.get(node) is None or run.peer_end[node] > t_lost:
        run.peer_end[node] = t_lost
    if run.nccl_at is None or t_lost < run.nccl_at:
        t_fail = max(t_lost, run.rendezvous_at or run.started) + RENDEZVOUS_TIMEOUT_S
        sc.log(t_fail, w(0), "ERROR", "multiproc_executor.py:772", "WorkerProc failed to start.")
        sc.traceback(t_fail, w(0), [*_WORKER_FRAMES, *_RENDEZVOUS_FRAMES],
                     "torch.distributed.DistStoreError: Timed out after 601 seconds waiting for clients. "
                     f"{run.tp - 1}/{run.tp} clients joined.", level_src="multiproc_executor.py:772")
        sc.log(t_fail + 0.3, core, "ERROR", "core.py:866", "EngineCore failed to start.")
        sc.traceback(t_fail + 0.3, core, _MP_FRAMES, WORKERPROC_FAILED, level_src="core.py:866")
        sc.raw(t_fail + 0.7, f"{api}RuntimeError: Engine core initialization failed. See root cause above. "
               "Failed core proc(s): {}")
        return t_fail + 0.9
    t_fail = _watchdog(cluster, sc, run, [r for r in range(run.tp) if r != lost_rank], t_lost, w)
    t_dead = t_fail + 0.8
    sc.log(t_dead, core, "ERROR", "multiproc_executor.py:671", "Worker proc VllmWorker-0 died unexpectedly, "
           "shutting down executor.")
    sc.log(t_dead + 0.1, core, "ERROR", "core.py:933", "EngineCore encountered a fatal error.")
    sc.traceback(t_dead + 0.1, core, [
        (f"{PY}/vllm/v1/engine/core.py", 924, "run_engine_core", "engine_core.run_busy_loop()"),
        (f"{PY}/vllm/v1/engine/core.py", 951, "run_busy_loop", "self._process_engine_step()"),
        (f"{PY}/vllm/v1/engine/core.py", 984, "_process_engine_step", "outputs, model_executed = self.step_fn()"),
        (f"{PY}/vllm/v1/executor/multiproc_executor.py", 338, "collective_rpc",
         "raise RuntimeError(f\"Worker failed with error '{result}', please check the\""),
    ], "RuntimeError: Worker failed with error 'NCCL communicator was aborted on rank 0.', please check the stack "
       "trace above for the root cause", level_src="core.py:933")
    sc.log(t_dead + 0.2, api, "ERROR", "async_llm.py:525", "AsyncLLM output_handler failed.")
    sc.traceback(t_dead + 0.2, api, [
        (f"{PY}/vllm/v1/engine/async_llm.py", 477, "output_handler", "outputs = await engine_core.get_output_async()"),
        (f"{PY}/vllm/v1/engine/core_client.py", 894, "get_output_async", "raise self._format_exception(outputs) "
         "from None"),
    ], "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the "
       "root cause.", level_src="async_llm.py:525")
    for i, text in enumerate(("Shutting down", "Waiting for application shutdown.", "Application shutdown complete.",
                              f"Finished server process [{run.pid_api}]")):
        sc.raw(t_dead + 0.5 + 0.01 * i, f"{api}INFO:     {text}")
    return t_dead + 0.6


def _watchdog(cluster: SimCluster, sc: _Script, run: EngineRun, ranks: list[int], t_lost: float,
              prefix) -> float:
    """PyTorch's NCCL watchdog on ``ranks`` (in that order) for the collective that hung at
    ``t_lost``; returns when it fired."""
    t_op = t_lost + 0.05 + 1.5 * _hash01("op", run.started, t_lost)
    ran_ms = NCCL_TIMEOUT_MS + stable_int(5, 95, "ran", run.started, t_lost)
    t_fail = t_op + ran_ms / 1000.0
    busy = max(0.0, t_lost - (run.nccl_at or t_lost))
    seq = 31 + stable_int(0, 20, "seq", run.started) + int(busy * 3.0)
    numel = 3072 * stable_int(1, 64, "numel", run.started, t_lost)
    work = (f"WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn={numel}, NumelOut={numel}, "
            f"Timeout(ms)={NCCL_TIMEOUT_MS}) ran for {ran_ms} milliseconds before timing out.")
    for k, rank in enumerate(ranks):
        dt = t_fail + 0.001 * k
        pg = f"[PG ID 2 PG GUID 3 Rank {rank}]"
        msgs = [
            f"ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught collective operation timeout: {work}",
            f"ProcessGroupNCCL.cpp:1785] {pg} Exception (either an error or timeout) detected by watchdog at "
            f"work: {seq}, last enqueued NCCL work: {seq + 27}, last completed NCCL work: {seq - 1}.",
            f"ProcessGroupNCCL.cpp:1834] {pg} Timeout at NCCL work: {seq}, last enqueued NCCL work: {seq + 27}, "
            f"last completed NCCL work: {seq - 1}.",
            f"ProcessGroupNCCL.cpp:630] [Rank {rank}] Some NCCL operations have failed or timed out. Due to the "
            "asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete "
            "data.",
            f"ProcessGroupNCCL.cpp:636] [Rank {rank}] To avoid data inconsistency, we are taking the entire "
            "process down.",
        ]
        for j, msg in enumerate(msgs):
            stamp_t = dt + 0.000021 * j + 0.0000007 * (j * j)
            sc.raw(dt, f"{prefix(rank)}[rank{rank}]:[{_glog(cluster, stamp_t)} {msg}")
    return t_fail


def pp_partition(layers: int, pp: int) -> list[int]:
    """vLLM's ``get_pp_indices`` (no ``VLLM_PP_LAYER_PARTITION``): the decoder layers per stage, an
    uneven remainder going to the stages before the last."""
    parts = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        parts[-i] += 1
    return parts


def stage_weights_gib(spec: ModelSpec | None, tp: int, pp: int, stage: int) -> float:
    """What one rank of pipeline stage ``stage`` loads (GiB): 1/TP of the stage's decoder layers,
    plus the embeddings and vision tower on the first stage and the lm_head on the last."""
    total = spec.weights_gib_tp1 if spec else 8.0
    if pp <= 1:
        return total / tp
    if spec is None or spec.layers <= 0:
        return total / pp / tp
    first = spec.embed_gib + spec.vision_gib
    decoder = total - first - spec.lm_head_gib
    w = decoder * pp_partition(spec.layers, pp)[stage] / spec.layers
    if stage == 0:
        w += first
    if stage == pp - 1:
        w += spec.lm_head_gib
    return w / tp


def _prefix(core: str, n: SimNode, driver: SimNode, pid: int, tp: int) -> str:
    if tp == 1:
        return core
    if n is driver:
        return core + f"(RayWorkerWrapper pid={pid}) "
    return core + f"(RayWorkerWrapper pid={pid}, ip={n.fast_ip}) "


def _ray_container(cluster: SimCluster, node: str) -> str | None:
    if cluster.ray is None:
        return None
    m = cluster.ray.members.get(node)
    return m.container if m else None


def _ramp(node: str, t0: float, t1: float, nbytes: float, reader: Curve | None = None, path: str = ""):
    from sparkconsole.sim.model import CacheRamp

    return CacheRamp(node, t0, max(t1, t0 + 1e-3), nbytes, reader, path)


# ---- traffic (periodic lines once ready) -------------------------------------------------------


def traffic_lines(run: EngineRun, k: int, slot_t: float) -> list[LogLine]:
    """One active 10-second slot: an access-log line and the engine's stats line."""
    from sparkconsole.sim.model import _hash01 as h

    api = f"(APIServer pid={run.pid_api}) "
    port = 30000 + int(h(run.model, k, "port") * 30000)
    spec = MODELS.get(run.model)
    task = spec.task if spec else "generate"
    path = {"generate": "/v1/chat/completions", "embed": "/v1/embeddings", "score": "/v1/rerank"}[task]
    out = [LogLine(slot_t - 3.0 + 2.0 * h(run.model, k, "a"),
                   f'{api}INFO:     127.0.0.1:{port} - "POST {path} HTTP/1.1" 200 OK')]
    prompt, gen, kvu, hit = traffic_slot(run, k)
    ts = time.strftime("%m-%d %H:%M:%S", time.gmtime(run.epoch0 + slot_t))
    out.append(LogLine(slot_t, f"{api}INFO {ts} [loggers.py:257] Engine 000: Avg prompt throughput: {prompt:.1f} "
                               f"tokens/s, Avg generation throughput: {gen:.1f} tokens/s, Running: 1 reqs, "
                               f"Waiting: 0 reqs, GPU KV cache usage: {kvu:.1f}%, Prefix cache hit rate: {hit:.1f}%"))
    return out


def traffic_slot(run: EngineRun, k: int) -> tuple[float, float, float, float]:
    """Background slot k's figures (prompt and generation tokens/s, KV usage %, prefix hit %): one
    function for the stats line and ``/metrics`` (:mod:`sparkconsole.sim.vllm_metrics`), so they agree."""
    from sparkconsole.sim.model import _hash01 as h

    spec = MODELS.get(run.model)
    task = spec.task if spec else "generate"
    prompt = 200 + 900 * h(run.model, k, "p")
    gen = (25 + 30 * h(run.model, k, "g")) if task == "generate" else 0.0
    return prompt, gen, 0.4 + 3.0 * h(run.model, k, "kv"), 20 + 60 * h(run.model, k, "hit")


def access_line(run: EngineRun, path: str, method: str = "GET", status: str = "200 OK") -> str:
    return f'(APIServer pid={run.pid_api}) INFO:     127.0.0.1:{stable_int(30000, 60000, path, run.started)} - ' \
           f'"{method} {path} HTTP/1.1" {status}'


# ---- the OpenAI-compatible API ----------------------------------------------------------------


def models_json(run: EngineRun, created: int) -> str:
    mid = f"modelperm-{stable_hex(16, run.model, created)}"
    return json.dumps({"object": "list", "data": [{
        "id": run.served_name, "object": "model", "created": created, "owned_by": "vllm", "root": run.model,
        "parent": None, "max_model_len": run.max_model_len,
        "permission": [{"id": mid, "object": "model_permission", "created": created, "allow_create_engine": False,
                        "allow_sampling": True, "allow_logprobs": True, "allow_search_indices": False,
                        "allow_view": True, "allow_fine_tuning": False, "organization": "*", "group": None,
                        "is_blocking": False}]}]}, separators=(",", ":"))


# single-stream decode rates (tokens/s, one request) by model and TP size: the 122B FP8 at TP=2 as
# measured on two Sparks (bjk110 vllm-spark: c=1 31.5 tok/s, TTFT 1,989 ms); others plausible
DECODE_TOK_S: dict[str, dict[int, float]] = {
    "Qwen/Qwen3.5-122B-A10B-FP8": {2: 31.5, 1: 29.0},
    "GadflyII/GLM-4.7-Flash-NVFP4": {1: 48.0, 2: 52.0},
}
# pipeline parallelism: one request walks the stages one after the other (a hop over the link per
# stage), so single-stream decode is a little slower than TP=2: (tp, pp) -> tokens/s
DECODE_TOK_S_PP: dict[str, dict[tuple[int, int], float]] = {
    "Qwen/Qwen3.5-122B-A10B-FP8": {(1, 2): 26.5, (1, 3): 24.0, (1, 4): 22.0, (2, 2): 27.5},
}
PP_HOP_FACTOR = 0.9  # per extra stage, for a (tp, pp) not in the table
PREFILL_TOK_S = 1500.0  # prompt tokens/s (prefill), after a fixed scheduling latency
FIRST_TOKEN_S = 0.12


def decode_rate(run: EngineRun) -> float:
    if run.pp > 1:
        pp_rate = DECODE_TOK_S_PP.get(run.model, {}).get((run.tp, run.pp))
        if pp_rate:
            return pp_rate
        return _tp_rate(run) * PP_HOP_FACTOR ** (run.pp - 1)
    return _tp_rate(run)


def _tp_rate(run: EngineRun) -> float:
    rates = DECODE_TOK_S.get(run.model)
    if not rates:
        return 40.0
    return rates.get(run.tp) or rates[min(rates, key=lambda k: abs(k - run.tp))]


def chat_seconds(run: EngineRun, answer: str) -> float:
    """How long a chat completion takes in sim time: the prompt (prefill), then the completion's
    tokens one after the other at :func:`decode_rate` (so a client timing it sees that rate)."""
    try:
        usage = json.loads(answer).get("usage") or {}
    except (json.JSONDecodeError, AttributeError):
        return 0.0
    ptoks = int(usage.get("prompt_tokens") or 0)
    ctoks = int(usage.get("completion_tokens") or 0)
    return FIRST_TOKEN_S + ptoks / PREFILL_TOK_S + ctoks / decode_rate(run)


def chat_json(run: EngineRun, body: str, created: int) -> tuple[str, bool]:
    """The answer to ``POST /v1/chat/completions``; (json, ok)."""
    import re

    try:
        req = json.loads(body or "{}")
    except json.JSONDecodeError as exc:
        return json.dumps({"error": {"message": f"Expecting value: line 1 column {exc.colno} (char {exc.pos})",
                                     "type": "BadRequestError", "param": None, "code": 400}}), False
    model = req.get("model", run.served_name)
    if model != run.served_name:
        return json.dumps({"error": {"message": f"The model `{model}` does not exist.", "type": "NotFoundError",
                                     "param": "model", "code": 404}}), False
    msgs = req.get("messages") or []
    prompt = " ".join(str(m.get("content", "")) for m in msgs if isinstance(m, dict))
    m = re.search(r"(\d+)\s*[*x×]\s*(\d+)", prompt)
    if m:
        a, b = int(m.group(1)), int(m.group(2))
        reasoning = (f"The user asks for {a} × {b}. {a} × {b} = {a} × {b // 10 * 10} + {a} × {b % 10} = "
                     f"{a * (b // 10 * 10)} + {a * (b % 10)} = {a * b}.")
        answer = f"{a} × {b} = **{a * b}**"
    else:
        reasoning = "The user wants a short reply. I'll answer briefly and plainly."
        answer = "Hello! I'm running on two DGX Sparks. How can I help?"
    if run.reasoning_parser:
        content, rc = "\n\n" + answer, reasoning
    else:
        content, rc = reasoning + "\n</think>\n\n" + answer, None
    ptoks = 12 + len(prompt.split()) * 2
    ctoks = len((reasoning + answer).split()) * 2
    msg: dict[str, object] = {"role": "assistant", "content": content, "refusal": None, "annotations": None,
                              "audio": None, "function_call": None, "tool_calls": [], "reasoning_content": rc}
    return json.dumps({
        "id": f"chatcmpl-{stable_hex(32, prompt, created)}", "object": "chat.completion", "created": created,
        "model": model, "choices": [{"index": 0, "message": msg, "logprobs": None, "finish_reason": "stop",
                                     "stop_reason": None}],
        "service_tier": None, "system_fingerprint": None,
        "usage": {"prompt_tokens": ptoks, "total_tokens": ptoks + ctoks, "completion_tokens": ctoks,
                  "prompt_tokens_details": None},
        "prompt_logprobs": None, "kv_transfer_params": None}, separators=(",", ":")), True
