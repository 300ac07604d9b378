"""``sparkconsole bench``: benchmark a served engine with the tools people publish results from.

On the head (or ``--node``), against the engine found there (``--port`` picks one; else the first that
serves chat): ``vllm bench serve`` in the engine's container when it has one (its ``--save-result`` JSON
is read back), else ``uvx llama-benchy`` where the head has uvx. A few concurrencies, bounded in
requests (per concurrency) and in time (``timeout`` on the node). The commands are printed before they
run and need ``--yes`` (or a ``y`` on a terminal): they load a served endpoint. Results are kept per
deployment under the console's state directory, and the previous run of the same engine is shown
beside the new one. ``--json`` prints one object whose ``rows`` carry, per concurrency, ``concurrency``,
``requests``, ``prompt_tokens_per_s``, ``generation_tokens_per_s``, ``ttft_p50_s``, ``ttft_p95_s``,
``itl_p50_s`` and ``tool``.

Exit 0 when rows were measured; 1 when nothing could be measured (no engine, no tool, the tool failed,
not confirmed); 2 for bad input; 3 when the node cannot be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from sparkconsole.cli import add_cluster_args
from sparkconsole.commands._cluster import open_cluster
from sparkconsole.errors import UserError, ValidationError

DEMO_SPEED = 100.0  # the demo cluster's clock runs this much faster than the wall during a benchmark
DEFAULT_CONCURRENCY = "1,4,8"


def add_parser(subs: argparse._SubParsersAction) -> None:
    from sparkconsole.sim.scenarios import SCENARIOS

    p = subs.add_parser(
        "bench", help="benchmark the served engine (vllm bench serve / llama-benchy) at a few concurrencies",
        description="Benchmark an engine served on the head with vllm bench serve (in its container) or "
        "llama-benchy (through uvx): prompt and generation tok/s, TTFT and ITL per concurrency, kept per "
        "deployment and compared with the previous run.")
    add_cluster_args(p)
    p.add_argument("--node", metavar="NODE", help="the node that serves the engine (default: the head)")
    p.add_argument("--port", type=int, metavar="P", help="the engine's port (default: the first engine that serves chat)")
    p.add_argument("--concurrency", default=DEFAULT_CONCURRENCY, metavar="C,C,…",
                   help=f"concurrencies to measure (default {DEFAULT_CONCURRENCY})")
    p.add_argument("--requests", type=int, default=16, metavar="N",
                   help="requests per concurrency (at least the concurrency; default 16)")
    p.add_argument("--input-len", type=int, default=1024, metavar="N", help="prompt tokens per request (default 1024)")
    p.add_argument("--output-len", type=int, default=128, metavar="N", help="generated tokens per request (default 128)")
    p.add_argument("--tool", choices=("auto", "vllm", "llama-benchy"), default="auto",
                   help="auto: vllm bench serve in the engine's container, else llama-benchy through uvx")
    p.add_argument("--time-limit", type=int, default=600, metavar="S",
                   help="seconds each benchmark command may run on the node (default 600)")
    p.add_argument("--json", action="store_true", help="print one JSON object (the commands go to stderr)")
    p.add_argument("--yes", action="store_true", help="run the benchmark without asking")
    p.add_argument("--scenario", default="story", choices=SCENARIOS, help="with --demo: the starting state")
    p.add_argument("--nodes", type=int, default=2, metavar="N", help="with --demo: how many Sparks (default 2)")
    p.add_argument("--speed", type=float, default=DEMO_SPEED, metavar="X",
                   help=f"with --demo: simulated seconds per real second (default {DEMO_SPEED:g})")
    p.set_defaults(func=run)


def parse_concurrencies(text: str) -> list[int]:
    """``"1,4,8"`` → ``[1, 4, 8]`` (order kept, repeats dropped); a one-line error otherwise."""
    out: list[int] = []
    for part in (text or "").split(","):
        part = part.strip()
        if not part.isdigit() or not 1 <= int(part) <= 1024:
            raise UserError(f"--concurrency takes whole numbers from 1 to 1024, comma-separated: {text!r}")
        if int(part) not in out:
            out.append(int(part))
    if not out or len(out) > 16:
        raise UserError("--concurrency takes from 1 to 16 values")
    return out


def _check(args: argparse.Namespace) -> list[int]:
    concs = parse_concurrencies(args.concurrency)
    if not 1 <= args.requests <= 10_000:
        raise UserError("--requests must be between 1 and 10000")
    if not 1 <= args.input_len <= 1_000_000 or not 1 <= args.output_len <= 1_000_000:
        raise UserError("--input-len and --output-len must be between 1 and 1000000")
    if not 10 <= args.time_limit <= 86_400:
        raise UserError("--time-limit must be between 10 and 86400 seconds")
    if args.port is not None and not 0 < args.port < 65536:
        raise UserError(f"--port must be a port number: {args.port}")
    if not 0 < args.speed <= 1000:
        raise UserError("--speed must be > 0 and at most 1000")
    if not 1 <= args.nodes <= 16:
        raise UserError("--nodes must be between 1 and 16")
    return concs


def run(args: argparse.Namespace) -> int:
    concs = _check(args)
    try:
        out = asyncio.run(_bench(args, concs))
    except ValidationError as exc:
        raise UserError(str(exc)) from None
    except KeyboardInterrupt:
        print("sparkconsole: interrupted: a benchmark still running on the node ends at its time limit",
              file=sys.stderr)
        return 130
    _print(args, out)
    return 0


async def _bench(args: argparse.Namespace, concs: list[int]) -> dict[str, Any]:
    from sparkconsole import remote as R
    from sparkconsole.serving import bench as B
    from sparkconsole.transport import node_transport

    async with open_cluster(args, demo_speed=args.speed) as config:
        node = config.node(args.node) if args.node else config.head
        if node is None:
            raise UserError("the cluster has no nodes")
        transport = node_transport(config, node)
        try:
            await transport.connect()
            return await _on_node(args, concs, config, node, transport, R, B)
        finally:
            await transport.close()


async def _on_node(args, concs, config, node, t, R, B) -> dict[str, Any]:
    from sparkconsole.journal import Journal
    from sparkconsole.logs.follow import display_lines

    found = B.targets((await t.run(R.engine_cmdlines(), timeout=30)).stdout, node=node.name)
    target = B.pick_target(found, port=args.port)
    eng = target.engine
    if eng.model is None:
        raise UserError(f"the engine on port {eng.port} names no model: nothing to send requests to", exit_code=1)
    # an engine that wants a key answers /v1 without one with 401: then the head's key file is used
    status = (await t.run(R.http_status(f"http://127.0.0.1:{eng.port}/v1/models"), timeout=20)).stdout.strip()
    key_file = None
    if status == "401":
        home = (await t.run(R.home_dir(), timeout=20)).stdout.strip() or "/root"
        key_file = R.api_key_path(home)
    tool = args.tool
    if tool == "auto":
        if eng.engine.bench_tool == B.VLLM_BENCH and not eng.on_host:
            tool = B.VLLM_BENCH
        elif (await t.run(R.uvx_available(), timeout=20)).ok:
            tool = "llama-benchy"
        else:
            raise UserError(f"no benchmark tool for the engine on port {eng.port}: it is not vLLM in a container "
                            "(vllm bench serve) and the node has no uvx (llama-benchy)", exit_code=1)
    if tool == B.VLLM_BENCH and eng.on_host:
        raise UserError(f"the engine on port {eng.port} runs on the host, not in a container: --tool llama-benchy",
                        exit_code=1)
    tokenizer = target.model_path or eng.model
    if tool == "llama-benchy":
        try:
            tokenizer = R.validate_model_id(tokenizer)
        except ValidationError:
            tokenizer = None  # a local path: llama-benchy falls back to its own tokenizer
    stamp = B.new_stamp()
    cmds = B.bench_commands(eng.port, eng.model, tokenizer, None if eng.on_host else eng.where, concs,
                            args.requests, args.input_len, args.output_len, tool, key_file=key_file, stamp=stamp,
                            time_limit_s=args.time_limit)
    shown = sys.stderr if args.json else sys.stdout
    print(f"bench: {display_lines(eng.model, ' ')} on {node.name}:{eng.port} with {B.TOOL_NAMES[tool]} "
          f"(concurrency {', '.join(map(str, concs))}; {args.requests} requests each; {args.input_len} prompt / "
          f"{args.output_len} generated tokens; at most {args.time_limit} s per command)", file=shown)
    for cmd in cmds:
        print(f"    {node.name} $ {display_lines(cmd.shell())}", file=shown)
    if config.read_only or getattr(args, "read_only", False):
        raise UserError("read-only: a benchmark puts load on a served engine; it is refused", exit_code=1)
    await _confirm(args, len(cmds))
    journal = Journal()
    outputs = []
    for cmd in cmds:
        began = time.monotonic()
        res = await t.run(cmd, timeout=args.time_limit + 120)
        journal.record(node=node.name, command=cmd.shell(), summary=cmd.summary, exit_code=res.exit_status,
                       duration_s=time.monotonic() - began, step="bench")
        outputs.append(res.stdout + res.stderr)
        if tool == B.VLLM_BENCH and B.section_rc(res.stdout, "bench") not in (0, None):
            raise UserError(f"vllm bench serve failed (exit {B.section_rc(res.stdout, 'bench')}): "
                            f"{_last_line(B.section_text(res.stdout, 'bench'))}", exit_code=1)
        if tool == "llama-benchy" and not res.ok:
            raise UserError(f"llama-benchy failed (exit {res.exit_status}): {_last_line(res.stderr or res.stdout)}",
                            exit_code=1)
    rows = B.rows_from_outputs(tool, outputs)
    if not rows:
        raise UserError(f"{B.TOOL_NAMES[tool]} printed no result: {_last_line(outputs[-1] if outputs else '')}",
                        exit_code=1)
    if tool == B.VLLM_BENCH:  # a row without its concurrency (an older JSON): the command's, in order
        rows = [r if r.concurrency is not None or i >= len(concs) else B.BenchRow(**{**r.to_dict(), "concurrency": concs[i]})
                for i, r in enumerate(rows)]
    engine_conc = await _engine_concurrency(t, eng, R)
    dep_id, plan_conc = _deployment(config.name, eng.port)
    bench_run = B.BenchRun.new(config.name, node.name, eng.model, eng.port, tool, rows,
                               {"concurrency": concs, "requests": args.requests, "input_len": args.input_len,
                                "output_len": args.output_len, "time_limit_s": args.time_limit},
                               run_id=stamp, engine_max_concurrency=engine_conc, deployment=dep_id,
                               plan_max_concurrency=plan_conc)
    earlier = B.load_runs(bench_run.key)
    saved = B.save_run(bench_run)
    previous = earlier[-1] if earlier else None
    return {"run": bench_run, "saved": str(saved), "previous": previous, "engine": eng, "where": eng.where}


async def _confirm(args: argparse.Namespace, n: int) -> None:
    if args.yes:
        return
    if not sys.stdin.isatty():
        raise UserError(f"bench: {n} command(s) would load the engine; pass --yes to run them", exit_code=1)
    reply = await asyncio.to_thread(input, f"  run these {n} command(s)? [y/N] ")
    if reply.strip().lower() not in ("y", "yes"):
        raise UserError("not run", exit_code=1)


async def _engine_concurrency(t, eng, R) -> float | None:
    """The engine's own concurrency figure at its context (``Maximum concurrency for N tokens per
    request``: what ``sparkconsole plan`` predicts), from the head of its container's log."""
    if eng.on_host:
        return None
    from sparkconsole.logs.vllm import parse_vllm_log

    try:
        res = await t.run(R.docker_log_head(eng.where), timeout=30)
    except Exception:  # a figure beside the table: never the reason a benchmark fails
        return None
    return parse_vllm_log(res.stdout).max_concurrency


def _deployment(cluster: str, port: int) -> tuple[str | None, float | None]:
    """The latest deployment made on this cluster when its endpoint (``http://HOST:PORT/v1``) is this
    port: its id and the planner's concurrency figure it was served with."""
    from urllib.parse import urlsplit

    from sparkconsole.deploy.state import StateStore

    try:
        st = StateStore().load(None, cluster=cluster)
        served = urlsplit(st.endpoint or "").port
    except (UserError, ValueError):
        return None, None
    if served != port:
        return None, None
    return st.id, st.plan.max_concurrency


def _last_line(text: str) -> str:
    from sparkconsole.journal import redact
    from sparkconsole.logs.follow import display_lines

    lines = [ln for ln in (text or "").splitlines() if ln.strip() and not ln.startswith("::sparkdeploy::")]
    return display_lines(redact(lines[-1].strip()), " ")[:300] if lines else "(no output)"


# ---- output ------------------------------------------------------------------------------------------

def _f(v: float | None, unit: str = "", scale: float = 1.0, digits: int = 1) -> str:
    return "—" if v is None else f"{v * scale:.{digits}f}{unit}"


def _print(args: argparse.Namespace, out: dict[str, Any]) -> None:
    from sparkconsole.logs.follow import display_lines
    from sparkconsole.serving import bench as B

    r: B.BenchRun = out["run"]
    prev: B.BenchRun | None = out["previous"]
    if args.json:
        data = {"rows": [row.json_row() for row in r.rows], "tool": r.tool, "run": r.id, "node": r.node,
                "model": r.model, "port": r.port, "settings": r.settings,
                "engine_max_concurrency": r.engine_max_concurrency, "plan_max_concurrency": r.plan_max_concurrency,
                "deployment": r.deployment, "saved": out["saved"],
                "previous": None if prev is None else {"run": prev.id, "created": prev.created, "tool": prev.tool,
                                                       "rows": [row.json_row() for row in prev.rows]},
                "comparison": None if prev is None else B.compare_runs(prev, r)}
        json.dump(data, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return
    print()
    print(f"{'conc':>5} {'reqs':>5} {'prompt tok/s':>13} {'gen tok/s':>10} {'TTFT p50':>9} {'TTFT p95':>9} "
          f"{'ITL p50':>8}  tool")
    for row in r.rows:
        ttft50 = row.ttft_p50_s if row.ttft_p50_s is not None else None
        mean_note = " (means)" if row.ttft_p50_s is None and row.ttft_mean_s is not None else ""
        print(f"{row.concurrency if row.concurrency is not None else '?':>5} "
              f"{row.requests if row.requests is not None else '—':>5} {_f(row.prompt_tokens_per_s):>13} "
              f"{_f(row.generation_tokens_per_s):>10} "
              f"{_f(ttft50 if ttft50 is not None else row.ttft_mean_s, ' s', digits=3):>9} "
              f"{_f(row.ttft_p95_s, ' s', digits=3):>9} "
              f"{_f(row.itl_p50_s if row.itl_p50_s is not None else row.itl_mean_s, ' ms', 1000.0):>8}  "
              f"{B.TOOL_NAMES.get(row.tool, row.tool)}{mean_note}")
    if r.engine_max_concurrency is not None:
        print(f"the engine's own concurrency figure at its full context: {r.engine_max_concurrency:g} requests "
              "(its log's 'Maximum concurrency'; `sparkconsole plan` predicts it)")
    elif r.plan_max_concurrency is None:
        print("the engine's concurrency figure: not read (no container log with vLLM's 'Maximum concurrency' line)")
    if r.plan_max_concurrency is not None:
        print(f"the plan's concurrency figure (deployment {r.deployment}): {r.plan_max_concurrency:.1f} requests of "
              "its whole context at once")
    if prev is not None:
        print(f"\ncompared with the previous run {prev.id} ({prev.created}, {B.TOOL_NAMES.get(prev.tool, prev.tool)}):")
        print(f"{'conc':>5} {'gen tok/s before → now':>26} {'prompt tok/s before → now':>28} {'TTFT p50 before → now':>26}")
        for c in B.compare_runs(prev, r):
            g, p, tt = c["generation_tokens_per_s"], c["prompt_tokens_per_s"], c["ttft_p50_s"]
            print(f"{c['concurrency'] if c['concurrency'] is not None else '?':>5} "
                  f"{_f(g['old']) + ' → ' + _f(g['new']) + _pct(g['change_pct']):>26} "
                  f"{_f(p['old']) + ' → ' + _f(p['new']) + _pct(p['change_pct']):>28} "
                  f"{_f(tt['old'], ' s', digits=3) + ' → ' + _f(tt['new'], ' s', digits=3):>26}")
    print(f"\nkept: {display_lines(out['saved'], ' ')}")


def _pct(v: float | None) -> str:
    return "" if v is None else f" ({v:+.0f}%)"
