"""`sparkconsole plan MODEL [options] [--json]`: will this model fit, on one Spark or on several?

Exit 0 when it fits, 1 when it does not, 2 on bad input (a hostile or unknown model id, a broken
config, options vLLM would refuse), 3 when a node of the named cluster cannot be reached (its memory
is what the plan is about: a guess in its place would be a plan for another machine). The JSON keys are the contract in ARCHITECTURE.md.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import sys

from sparkconsole.cli import add_cluster_args
from sparkconsole.planner import budget as bud
from sparkconsole.planner.live import LiveMemory, probe_node_memory
from sparkconsole.planner.overheads import rules_for
from sparkconsole.planner.plan import PlanOptions, PlanResult, plan
from sparkconsole.planner.spec import load_spec


def _whole(minimum: int, what: str):
    """An argparse type: a whole number of at least ``minimum``."""

    def check(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"{what}: {text}")
        return v

    return check


_pos_int = _whole(1, "must be at least 1")
_nonneg_int = _whole(0, "must not be negative")


def _number(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"must be a finite, non-negative number: {text}")
    return v


def add_parser(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser(
        "plan", help="will a model fit: weights, KV cache and concurrency per node, vLLM's arithmetic",
        description="Plan a vLLM deployment on DGX Spark nodes. MODEL is a Hugging Face repo id, a "
        "local model directory, or a config.json path. Exit 0 fits, 1 does not fit, 2 bad input, "
        "3 a node of the cluster unreachable.")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("--tp", type=_pos_int, help="tensor-parallel size (default: --nodes, else 1)")
    p.add_argument("--nodes", type=_pos_int, help="Sparks (one GPU each; default: TP x PP)")
    p.add_argument("--pp", type=_pos_int, default=1,
                   help="pipeline stages, for when TP cannot divide the model (default 1)")
    p.add_argument("--gpu-memory-utilization", type=_number, default=bud.DEFAULT_GMU, metavar="FRACTION",
                   help="fraction of node memory vLLM may use (default 0.85; warned above 0.85, refused "
                   "above 0.90 without --force)")
    p.add_argument("--max-model-len", type=_pos_int, metavar="TOKENS", help="default: the config's")
    p.add_argument("--kv-cache-dtype", choices=("auto", "fp8"), default="auto")
    p.add_argument("--kv-cache-gib", type=_number, metavar="GIB",
                   help="take the KV budget per node as given (like vLLM's --kv-cache-memory)")
    p.add_argument("--node-memory-gib", type=_number, metavar="GIB",
                   help=f"memory per node (default: the smallest live node's MemTotal when --config, --host, "
                   f"--local or --demo names a cluster, else {bud.DEFAULT_NODE_MEMORY_GIB})")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                   help="vLLM's default is on (linear-attention state then booked twice per request)")
    p.add_argument("--num-speculative-tokens", type=_nonneg_int, default=0, metavar="N",
                   help="MTP speculative decoding: loads the config's MTP layers as draft layers")
    p.add_argument("--language-model-only", action="store_true", help="skip the vision tower")
    g = p.add_argument_group("overhead estimates (replace with measured values)")
    g.add_argument("--max-num-batched-tokens", type=_pos_int, default=bud.ACTIVATION_REF_TOKENS, metavar="N")
    g.add_argument("--activation-gib", type=_number, metavar="GIB")
    g.add_argument("--non-torch-gib", type=_number, metavar="GIB")
    g.add_argument("--cuda-graph-gib", type=_number, metavar="GIB")
    p.add_argument("--vllm-version", metavar="VERSION",
                   help="the vLLM whose overhead rules to use (default: the newest known; with --from-log, "
                   "the logged one)")
    p.add_argument("--from-log", metavar="FILE",
                   help="calibrate from a vLLM start's log (FILE, or - for stdin): planner vs log side by side, "
                   "and --max-model-len / --gpu-memory-utilization / --tp re-planned from the measured figures")
    p.add_argument("--force", action="store_true", help="allow --gpu-memory-utilization above 0.90")
    p.add_argument("--offline", action="store_true", help="never contact the Hugging Face Hub")
    p.add_argument("--json", action="store_true", help="print one JSON object (the stable contract)")
    add_cluster_args(p)
    p.add_argument("--probe-timeout", type=_number, default=20.0, metavar="SECONDS",
                   help="with a cluster: seconds to wait for each node's memory (default 20)")
    p.set_defaults(func=run)


_CLUSTER_FLAGS = ("config", "host", "local", "demo")


def wants_live_memory(args: argparse.Namespace) -> bool:
    """Node memory comes from the live nodes when a cluster is configured (named on the command
    line, or found by the usual config search) and --node-memory-gib was not given."""
    if args.node_memory_gib is not None:
        return False
    if any(getattr(args, k, None) for k in _CLUSTER_FLAGS):
        return True
    from sparkconsole.config import config_search

    try:
        return config_search(None) is not None
    except Exception:
        return False


async def _live_memory(args: argparse.Namespace) -> LiveMemory:
    from sparkconsole.commands._cluster import open_cluster

    async with open_cluster(args) as config:
        return await probe_node_memory(config, timeout=args.probe_timeout or 20.0)


def require_reachable(live: LiveMemory) -> LiveMemory:
    """Every node of the cluster read, else one line and exit 3 (like every command that cannot reach
    a node): the plan is for those nodes, and --node-memory-gib plans without them."""
    from sparkconsole.errors import TransportError

    gone = live.unreachable
    if not gone:
        return live
    first = gone[0]
    from sparkconsole.logs.follow import display_text

    why = display_text(" ".join(str(first.error or "MemTotal was not read").split())[:300])
    said = why if why.startswith(f"{first.node}:") else f"{first.node}: {why}"
    more = f" (and {len(gone) - 1} more node(s))" if len(gone) > 1 else ""
    raise TransportError(f"{said}{more}; the plan needs its memory (give --node-memory-gib to plan "
                         "without the nodes)")


def _options(args: argparse.Namespace, live: LiveMemory | None = None) -> PlanOptions:
    node_mem = args.node_memory_gib
    notes: tuple[str, ...] = ()
    if node_mem is None and live is not None:
        node_mem = live.gib  # None: nothing read, the default stays (the notes say why)
        notes = tuple(live.notes(args.gpu_memory_utilization))
    return PlanOptions(
        tp=args.tp, nodes=args.nodes, pp=args.pp, gpu_memory_utilization=args.gpu_memory_utilization,
        max_model_len=args.max_model_len, kv_cache_dtype=args.kv_cache_dtype, kv_cache_gib=args.kv_cache_gib,
        node_memory_gib=node_mem, enable_prefix_caching=args.enable_prefix_caching,
        num_speculative_tokens=args.num_speculative_tokens, language_model_only=args.language_model_only,
        max_num_batched_tokens=args.max_num_batched_tokens, activation_gib=args.activation_gib,
        non_torch_gib=args.non_torch_gib, cuda_graph_gib=args.cuda_graph_gib, force=args.force,
        node_memory_notes=notes, vllm_version=getattr(args, "vllm_version", None),
    )


def render_text(r: PlanResult, source: str) -> str:
    """A readable table (rich when available, else plain text)."""
    lay, cap = r.layout, r.capacity
    rows = [
        ("model", f"{r.model}  ({source})"),
        ("nodes / TP", f"{r.nodes} / {r.tp}"),
        ("max model len", f"{r.max_model_len:,} tokens"),
        ("node memory", f"{r.budget.node_memory_gib:.2f} GiB"),
        ("weights per node", f"{r.weights_gib_per_node:.2f} GiB"),
        ("KV budget per node", f"{r.kv_cache_gib_per_node:.2f} GiB"),
        ("KV per token per node", f"{lay.kv_bytes_per_token:,} B ({lay.kv_dtype})"),
        ("state per request per node", f"{lay.state_bytes_per_request:,} B" if lay.state_layers else "-"),
        ("block size", f"{lay.block_size:,} tokens"),
        ("KV-cache groups", f"{lay.num_groups} x {lay.group_size} layers"),
        ("blocks", f"{cap.num_blocks:,} ({cap.blocks_per_request:,} per request)"),
        ("max concurrency", f"{cap.max_concurrency:.2f}x"),
        ("KV cache size", f"{cap.kv_cache_tokens:,} tokens" + (
            "" if r.kv_cache_tokens_printed == cap.kv_cache_tokens else
            f" (vLLM {rules_for(r.vllm_version).version} prints {r.kv_cache_tokens_printed:,})")),
        ("verdict", "FITS" if r.fits else "DOES NOT FIT"),
    ]
    try:
        import io

        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover - rich comes with textual
        width = max(len(k) for k, _ in rows)
        lines = [f"{k:<{width}}  {v}" for k, v in rows] + [""] + [f"- {x}" for x in r.reasons]
        return "\n".join(lines) + "\n"
    from rich.text import Text

    table = Table(title=Text(f"sparkconsole plan: {r.model}"), show_header=False)  # a name is text, not markup
    table.add_column(style="bold")
    table.add_column()
    for k, v in rows:
        style = ("green" if r.fits else "red") if k == "verdict" else None
        table.add_row(k, v, style=style)
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=sys.stdout.isatty(), width=120)
    console.print(table)
    return buf.getvalue() + "".join(f"- {x}\n" for x in r.reasons)


def _read_log_arg(path: str) -> str:
    from sparkconsole.errors import UserError

    try:
        if path == "-":
            return sys.stdin.read()
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError as exc:
        raise UserError(f"{path}: cannot read the log ({exc.strerror or exc.__class__.__name__})") from None
    if "\x00" in text:
        raise UserError(f"{path}: not a text log")
    return text


def render_calibration(cal) -> str:
    """Planner against log, then the calibrated and re-planned verdicts."""
    from sparkconsole.logs.follow import display_lines
    from sparkconsole.planner.calibrate import summary_lines

    # the lines quote what the log said (its model name, its figures): a log is a node's text
    return display_lines("\n".join(summary_lines(cal))) + "\n" + render_text(cal.replan or cal.calibrated, "calibrated from the log")


def _run_from_log(args: argparse.Namespace, spec) -> int:
    from sparkconsole.planner.calibrate import calibrate, read_log

    logged = read_log(_read_log_arg(args.from_log))
    change = {"max_model_len": args.max_model_len, "tp": args.tp}
    if args.gpu_memory_utilization != bud.DEFAULT_GMU:
        change["gpu_memory_utilization"] = args.gpu_memory_utilization
    change = {k: v for k, v in change.items() if v is not None}
    if logged.tp and change.get("tp") == logged.tp and len(change) == 1:
        change = {}
    opts = _options(args, None)
    base = opts if not change.get("tp") else dataclasses.replace(opts, tp=None, nodes=None)
    cal = calibrate(spec, logged, base, change)
    final = cal.replan or cal.calibrated
    if args.json:
        doc = final.to_json()
        doc["calibration"] = cal.to_json()
        print(json.dumps(doc, indent=2))
    else:
        sys.stdout.write(render_calibration(cal))
    return 0 if final.fits else 1


def run(args: argparse.Namespace) -> int:
    spec = load_spec(args.model, offline=args.offline)
    if getattr(args, "from_log", None):
        return _run_from_log(args, spec)
    live = require_reachable(asyncio.run(_live_memory(args))) if wants_live_memory(args) else None
    result = plan(spec, _options(args, live))
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        sys.stdout.write(render_text(result, spec.source))
    return 0 if result.fits else 1
