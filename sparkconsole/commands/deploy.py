"""``sparkconsole deploy``: the deployment wizard without the console, for scripts and terminals.

Walks the same flow as the console's wizard (``w``). Decisions are answered by ``--answer ID=VALUE``,
by the recommendation under ``--auto``, by the operator on a terminal, or else (a script) the run
stops at the decision (exit 1) and says which answer it needs. Commands that change a node are printed before they run; without ``--auto`` or
``--yes`` they are asked for on a terminal and refused elsewhere.

Exit 0 only when the model served and the test completion came back (or ``--until`` / ``--plan-only``
/ ``--teardown`` finished); 1 when a decision or a step ended it (an unreachable node included: recon
names it); 2 for bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from sparkconsole.cli import add_cluster_args
from sparkconsole.commands._cluster import open_cluster
from sparkconsole.errors import UserError
from sparkconsole.remote import RemoteCommand, validate_image, validate_model_id

DEMO_SPEED = 40.0  # the demo cluster runs its clock this much faster than the wall for a deployment


def add_parser(subs: argparse._SubParsersAction) -> None:
    from sparkconsole.deploy.flow import DEFAULT_MODEL
    from sparkconsole.deploy.steps import STEP_IDS
    from sparkconsole.sim.scenarios import SCENARIOS

    p = subs.add_parser(
        "deploy", help="deploy one model across the nodes, step by step, with its decisions",
        description="Deploy one large model across DGX Sparks: recon, plan, engine, network, weights, images, "
        "free-memory, caches, cluster, serve, verify, then a benchmark if you want one. Resumable (--resume), repeatable (finished steps are "
        "skipped), and --teardown removes exactly what it started.")
    add_cluster_args(p)
    p.add_argument("--scenario", default="story", choices=SCENARIOS, help="with --demo: the starting state")
    p.add_argument("--nodes", type=int, default=2, metavar="N", help="with --demo: how many Sparks (default 2)")
    p.add_argument("--speed", type=float, default=DEMO_SPEED, metavar="X",
                   help=f"with --demo: simulated seconds per real second (default {DEMO_SPEED:g})")
    p.add_argument("--recipe", metavar="NAME|FILE",
                   help="plan from a recipe (sparkrun, eugr v1 or Spark Pulse v2; `sparkconsole recipes` lists them): "
                   "its model, engine, image, TP, gpu-memory-utilization, max-model-len and flags, where the options "
                   "here say nothing")
    p.add_argument("--model", default=None, help=f"Hugging Face repo id (default {DEFAULT_MODEL})")
    p.add_argument("--engine", choices=("vllm", "sglang"), default=None, help="default vllm")
    p.add_argument("--executor", choices=("ray", "native"), default=None,
                   help="how the nodes join (default: asked, Ray recommended)")
    p.add_argument("--image", help="the engine image to use (else the wizard checks what is there)")
    p.add_argument("--tp", type=int, help="tensor-parallel size (default: the plan's recommendation)")
    p.add_argument("--max-model-len", type=int, metavar="L")
    p.add_argument("--gpu-memory-utilization", type=float, metavar="G", dest="gmu",
                   help="the share of each node's memory the engine may take (default: what the plan finds free, "
                   "at most 0.85); the free-memory step frees what this needs")
    p.add_argument("--plan-only", action="store_true",
                   help="read the nodes, decide with the recommendations, print every step's commands; change nothing")
    p.add_argument("--auto", action="store_true", help="take every recommended answer and run without asking")
    p.add_argument("--yes", action="store_true", help="run the commands without asking (decisions still need answers)")
    p.add_argument("--answer", action="append", metavar="ID=VALUE", help="answer a decision ahead (repeatable)")
    p.add_argument("--until", choices=STEP_IDS, metavar="STEP", help="stop after this step (exit 0 when reached)")
    p.add_argument("--resume", nargs="?", const="", metavar="ID",
                   help="continue a deployment (the latest when no ID): finished steps are not run again")
    p.add_argument("--teardown", nargs="?", const="", metavar="ID",
                   help="remove what a deployment started (the latest when no ID) and offer its stopped services back")
    p.add_argument("--rehearse", action="store_true",
                   help="read the cluster without changing it, build its twin, run the whole deployment on the "
                   "twin and report the decisions, every node's commands, the failures and how long it will take")
    p.add_argument("--twin-out", metavar="FILE", help="with --rehearse: where to write the twin file "
                   "(default: the state folder's twins/)")
    p.add_argument("--answers-from", metavar="REPORT", help="take the decisions' answers from a rehearsal's "
                   "report (*.rehearsal.json); --answer still wins")
    p.add_argument("--compare-rehearsal", metavar="REPORT", help="after the real run: where it differed from the "
                   "rehearsal's report (decisions, step outcomes, changes, time per step)")
    p.add_argument("--twin", metavar="FILE", help="with --demo: the simulated cluster is this twin file "
                   "(written by --rehearse), not a scenario")
    p.add_argument("--json", action="store_true", help="one JSON object per event, one per line")
    p.add_argument("-v", "--verbose", action="store_true", help="also print the engine's log lines")
    p.set_defaults(func=run)


# ---- printing ---------------------------------------------------------------------------------


class Printer:
    """Events as plain lines (or JSON lines): what happens, in the order it happens.

    Node text is data: the events carry the nodes' words (a failed command's stderr, printed even
    without ``-v``; notes; engine lines; a decision's measurements) and none of it may act on the
    operator's terminal (an OSC 52 sets the clipboard, CSI 2J clears the screen). Plain lines
    print each event's text cleaned by :func:`~sparkconsole.logs.follow.display_text` (through
    ``display_fields``, line by line); JSON lines keep the exact text, escaped: ``json.dumps``
    writes U+0000-U+001F (ESC included) as ``\\u001b``, and ``json_safe`` does the same for DEL,
    the C1 controls and lone surrogates, which ``ensure_ascii=False`` would leave raw."""

    def __init__(self, as_json: bool, verbose: bool, out=None) -> None:
        self.json = as_json
        self.verbose = verbose
        self.out = out or sys.stdout
        self._progress: dict[tuple[str, str, str], int] = {}

    def __call__(self, event: Any) -> None:
        from sparkconsole.logs.follow import display_fields, json_safe

        if self.json:
            self.out.write(json_safe(json.dumps(event.to_json(), ensure_ascii=False)) + "\n")
            self.out.flush()
            return
        line = self._plain(display_fields(event))
        if line is not None:
            self.out.write(line + "\n")
            self.out.flush()

    def _plain(self, e: Any) -> str | None:
        kind = e.kind
        if kind == "step":
            mark = {"running": "▶", "done": "✓", "skipped": "·", "failed": "✗", "waiting": "?"}.get(e.state, " ")
            return f"{mark} {e.step:<12} {e.state}" + (f": {e.note}" if e.note else "")
        if kind == "command":
            if e.rc is None:
                return f"    {e.node} $ {_one_line(e.command)}"
            if not e.mutating and (e.rc == 0 or not self.verbose):
                return None  # a read that answers no is an answer (the step says what it means)
            out = f"    {e.node}   → exit {e.rc}" + (f" ({e.duration_s:.1f} s)" if e.duration_s else "")
            if e.rc != 0 and e.output:
                out += "\n" + "\n".join("      " + ln for ln in e.output.splitlines())
            if not e.mutating:
                out = f"    {e.node} $ {_one_line(e.command)}\n" + out
            return out
        if kind == "decision":
            if e.answer is None:
                return None  # asked: printed once answered, with the answer
            lines = [f"  ? {e.id}: {e.title}"]
            lines += [f"      {m}" for m in e.measured if m]
            lines += [f"      - {o['value']}: {o['label']}" + (" (experimental)" if o.get("experimental") else "")
                      for o in e.options]
            lines.append(f"    → {e.answer} ({e.by}; recommended: {e.recommended}) — {e.why}")
            return "\n".join(lines)
        if kind in ("note", "canary"):  # a canary event is a note with its phase (for --json)
            who = f"{e.node}: " if e.node else ""
            return f"    {'!' if e.level != 'info' else '·'} {who}{e.text}"
        if kind == "progress":
            key = (e.step, e.node, e.label)
            pct = -1 if e.fraction is None else int(e.fraction * 10)
            if self._progress.get(key) == pct:
                return None
            self._progress[key] = pct
            frac = "" if e.fraction is None else f"{e.fraction * 100:3.0f}% "
            return f"    ~ {e.node} {e.label} {frac}{e.detail}"
        if kind == "output":
            return f"      | {e.text}" if self.verbose else None
        if kind == "result":
            tail = (f" — {e.endpoint}" + (f", model {e.model}" if e.model else "")) if e.endpoint else ""
            tps = f" ({e.tokens_per_s} tok/s)" if e.tokens_per_s else ""
            return f"{'served' if e.ok and e.endpoint else 'ok' if e.ok else 'stopped'}: {e.message}{tail}{tps}"
        return None

    def plan(self, step: str, title: str, commands: Sequence[tuple[str, RemoteCommand]]) -> None:
        from sparkconsole.logs.follow import display_lines, display_text

        if self.json:  # ensure_ascii (the default): every control character is a \u escape
            for node, cmd in commands:
                self.out.write(json.dumps({"event": "planned", "step": step, "node": node, "command": cmd.shell(),
                                           "mutating": cmd.mutating}) + "\n")
            return
        self.out.write(f"  {step}: {display_text(title)}\n")
        for node, cmd in commands:  # a command can quote a node's words (a container's, a unit's name)
            self.out.write(f"    {display_text(node)} $ {display_lines(cmd.shell())}\n")
        if not commands:
            self.out.write("    (nothing to run)\n")


def _one_line(command: str) -> str:
    """A multi-line command (the image probe's Python) shown by its first line; JSON keeps it whole."""
    first, _, rest = command.partition("\n")
    return first + (f" … ({rest.count(chr(10)) + 1} more lines)" if rest else "")


# ---- running ----------------------------------------------------------------------------------


def _check(args: argparse.Namespace) -> None:
    validate_model_id(args.model)
    if args.image:
        validate_image(args.image)
    if args.tp is not None and not 1 <= args.tp <= 64:
        raise UserError("--tp must be between 1 and 64")
    if getattr(args, "gmu", None) is not None and not 0.05 <= args.gmu <= 0.95:
        raise UserError("--gpu-memory-utilization must be between 0.05 and 0.95")
    if args.max_model_len is not None and args.max_model_len < 256:
        raise UserError("--max-model-len must be at least 256")
    if not 1 <= args.nodes <= 64:
        raise UserError("--nodes must be between 1 and 64")
    if not 0 < args.speed <= 1000:
        raise UserError("--speed must be > 0 and at most 1000")
    if args.resume is not None and args.teardown is not None:
        raise UserError("choose one of --resume and --teardown")
    if args.plan_only and (args.resume is not None or args.teardown is not None):
        raise UserError("--plan-only starts nothing: it cannot be combined with --resume or --teardown")
    if args.rehearse and (args.resume is not None or args.teardown is not None or args.plan_only):
        raise UserError("--rehearse changes nothing: it cannot be combined with --resume, --teardown or --plan-only")
    if args.twin_out and not args.rehearse:
        raise UserError("--twin-out goes with --rehearse")
    if args.twin and not getattr(args, "demo", False):
        raise UserError("--twin opens a twin file as the demo's cluster: add --demo")


def _recipe(args: argparse.Namespace):
    """``--recipe``: the recipe, read before anything is opened (a bad file is one line, exit 2);
    None without one. The model and engine defaults are filled either way."""
    from sparkconsole.deploy.flow import DEFAULT_MODEL

    recipe = None
    if getattr(args, "recipe", None):
        from sparkconsole.recipes import find_recipe, user_recipe_dir

        recipe = find_recipe(args.recipe, user_recipe_dir(args.config))
        if recipe.engine not in ("vllm", "sglang"):
            raise UserError(f"recipe {recipe.name}: the wizard deploys vLLM or SGLang across the nodes, not "
                            f"{recipe.engine}")
        if getattr(args, "demo", False):
            reason = recipe.cannot_run_here(args.nodes)
            if reason:
                raise UserError(f"recipe {recipe.name} cannot run here: {reason}")
    else:
        args.model = args.model or DEFAULT_MODEL
        args.engine = args.engine or "vllm"
    args.recipe_obj = recipe
    if recipe is not None:
        args.model = args.model or recipe.model
    return recipe


def run(args: argparse.Namespace) -> int:
    _recipe(args)
    _check(args)
    from sparkconsole.deploy.decisions import parse_answers

    presets = parse_answers(args.answer)
    if args.answers_from:
        from sparkconsole.deploy.rehearsal import load_answers

        presets = {**load_answers(args.answers_from), **presets}
    printer = Printer(args.json, args.verbose)
    if args.compare_rehearsal:
        return _compare(args)
    if args.twin:
        from sparkconsole.deploy.twin import load

        args.twin = load(args.twin)  # a bad file is one line (exit 2) before anything starts
    if args.rehearse:
        try:
            return asyncio.run(_rehearse(args, presets))
        except KeyboardInterrupt:
            print("sparkconsole: interrupted: nothing was changed on the nodes", file=sys.stderr)
            return 130
    try:
        outcome = asyncio.run(_deploy(args, presets, printer))
    except KeyboardInterrupt:
        print("sparkconsole: interrupted: what finished is recorded; `sparkconsole deploy --resume` continues "
              "(jobs on the nodes keep running)", file=sys.stderr)
        return 130
    return 0 if outcome.ok else 1


async def _deploy(args: argparse.Namespace, presets: dict[str, str], printer: Printer):
    """Open the deployment as the console's wizard does (:func:`~sparkconsole.deploy.opening.open_deployment`:
    the cluster's lock, the transports, the runner, the flow) and walk it, or tear it down."""
    from sparkconsole.deploy.decisions import ScriptedAnswers
    from sparkconsole.deploy.flow import Options
    from sparkconsole.deploy.opening import find_earlier, open_deployment
    from sparkconsole.deploy.runner import Settings
    from sparkconsole.deploy.session import run_flow, run_teardown
    from sparkconsole.deploy.state import DeploymentState, StateStore
    from sparkconsole.journal import Journal

    store = StateStore()
    earlier_id = (args.resume or args.teardown) or None
    if earlier_id is not None:
        store.load(earlier_id)  # a missing or broken state is said before any cluster is opened
    options = _options(args)
    state = None
    demo = bool(getattr(args, "demo", False))  # a cluster simulated in this process: no one else reaches it
    async with open_cluster(args, demo_speed=args.speed) as config:
        speed = args.speed if demo else config.time_scale
        if args.resume is not None or args.teardown is not None:
            # only a deployment made on this cluster (its latest when no id): another cluster's state
            # names containers and services this one may also run (issue 23, item 4)
            state = store.load(earlier_id, cluster=config.name)
            options = Options.from_json(state.options)
        else:
            earlier = None if demo else find_earlier(store, config.name, options.model)
            if earlier is not None and not args.json:
                print(f"note: deployment {earlier.id} ({earlier.result or 'unfinished'}) of this model exists on "
                      f"this cluster: `--resume {earlier.id}` continues it, `--teardown {earlier.id}` removes it")
            recipe = getattr(args, "recipe_obj", None)
            if recipe is not None and not demo:
                reason = recipe.cannot_run_here(len(config.nodes))
                if reason:
                    raise UserError(f"recipe {recipe.name} cannot run here: {reason}")
            state = DeploymentState.new(options.model, options.to_json(), config.name)
            if options.gmu is not None:
                state.plan.gmu_override = options.gmu  # the plan takes it as given (--gpu-memory-utilization, a recipe)
        if not args.json and speed != 1.0:
            print(f"simulated cluster: its time runs x{speed:g} faster than the wall clock (waits and rates follow)")
        async with open_deployment(
                config, options, state, answer=ScriptedAnswers(presets, auto=args.auto or args.plan_only,
                                                                ask=_ask(args)),
                emit=printer, confirm=_confirm(args, printer),
                settings=Settings(poll_s=0.5 if speed > 1 else 2.0, speed=speed), journal=Journal(), store=store,
                read_only=config.read_only or bool(getattr(args, "read_only", False)), plan_only=args.plan_only,
                lock=not demo) as session:
            if not args.json and not args.plan_only:
                print(f"deployment {state.id}: {options.model} on {', '.join(n.name for n in config.nodes)}")
            if args.teardown is not None:
                outcome = await run_teardown(session.flow)
            else:
                outcome = await run_flow(session.flow, until=args.until,
                                         on_plan=printer.plan if args.plan_only else None)
            printer(outcome.result)
            return outcome


async def _rehearse(args: argparse.Namespace, presets: dict[str, str]) -> int:
    """``--rehearse``: the read-only walk on the cluster, its twin written, the whole flow on the
    twin, the report (:mod:`sparkconsole.deploy.rehearsal`). Exit 0 when the twin served (or reached
    ``--until``), 1 when the rehearsal met a failure it could not get past."""
    from sparkconsole.deploy.rehearsal import format_report, rehearse_cluster
    from sparkconsole.journal import Journal
    from sparkconsole.logs.follow import display_text, json_safe

    say = (lambda text: None) if args.json else (lambda text: print(display_text(text), flush=True))
    async with open_cluster(args, demo_speed=args.speed) as config:
        r, path, report = await rehearse_cluster(config, _options(args), presets, journal=Journal(), until=args.until,
                                                 twin_out=args.twin_out, say=say)
    if args.json:
        for data in r.events:
            print(json_safe(json.dumps(data, ensure_ascii=False)))
        print(json_safe(json.dumps({**r.to_json(), "twin": str(path)}, ensure_ascii=False)))
    else:
        for line in format_report(r):
            print(display_text(line))
    say(f"report written: {report}; the real run takes its answers with: sparkconsole deploy "
        f"{_cluster_flags(args)}--answers-from {report}")
    return 0 if r.result.ok else 1


def _options(args: argparse.Namespace):
    """The deployment's options from the command line (a real run and a rehearsal alike)."""
    from sparkconsole.deploy.flow import Options

    given = {"model": args.model, "engine": args.engine, "executor": args.executor, "image": args.image,
             "tp": args.tp, "max_model_len": args.max_model_len, "gmu": getattr(args, "gmu", None)}
    recipe = getattr(args, "recipe_obj", None)
    if recipe is not None:
        return Options.from_recipe(recipe, **given)
    return Options(**given)


def _compare(args: argparse.Namespace) -> int:
    """``--compare-rehearsal REPORT``: the newest deployment of the report's cluster and model (or
    ``--resume ID``'s) against the report. Exit 0 when the rehearsal foresaw it, 1 when it differed."""
    from sparkconsole.deploy.compare import compare, format_comparison
    from sparkconsole.deploy.rehearsal import load_report
    from sparkconsole.deploy.state import StateStore
    from sparkconsole.journal import read_journal
    from sparkconsole.logs.follow import display_text

    report = load_report(args.compare_rehearsal)
    store = StateStore()
    if args.resume:
        state = store.load(args.resume)
    else:
        mine = [st for st in store.saved() if st.cluster == report["cluster"] and st.model == report["model"]]
        if not mine:
            raise UserError(f"no deployment of {report['model']} on {report['cluster']} to compare with: run it first",
                            exit_code=1)
        state = max(mine, key=lambda st: st.id)
    c = compare(report, state, read_journal())
    if args.json:
        print(json.dumps(c.to_json()))
    else:
        for line in format_comparison(c):
            print(display_text(line))
    return 0 if c.agrees else 1


def _cluster_flags(args: argparse.Namespace) -> str:
    if getattr(args, "config", None):
        return f"--config {args.config} "
    if getattr(args, "demo", False):
        return "--demo "
    return "".join(f"--host {h} " for h in getattr(args, "host", None) or [])


def _ask(args: argparse.Namespace):
    """The operator at a terminal answers each open decision (Enter: the recommended option; a number
    or an option's value); None for a script (no terminal, ``--json``), which stops at the decision
    and says which ``--answer`` it needs."""
    if args.json or args.plan_only or not sys.stdin.isatty():
        return None
    from sparkconsole.deploy.decisions import DecisionStop
    from sparkconsole.logs.follow import display_text

    async def ask(d) -> str:
        print(f"  ? {d.id}: {display_text(d.title)}")
        for m in d.measured:
            print(f"      {display_text(m)}")
        for i, o in enumerate(d.options, 1):
            mark = "  (recommended)" if o.value == d.recommended else ""
            print(f"    {i}. {o.value}: {display_text(o.label)}{mark}")
        for _ in range(3):
            try:
                reply = (await asyncio.to_thread(input, f"  answer [Enter: {d.recommended}] ")).strip()
            except EOFError:
                raise DecisionStop(d) from None
            if not reply:
                return d.recommended
            if reply.isdigit() and 1 <= int(reply) <= len(d.options):
                return d.options[int(reply) - 1].value
            if d.option(reply) is not None or d.free_text:
                return reply
            print(f"  {display_text(reply)!r} is not one of 1-{len(d.options)} or "
                  + ", ".join(o.value for o in d.options))
        raise DecisionStop(d)

    return ask


def _confirm(args: argparse.Namespace, printer: Printer):
    async def confirm(step: str, commands: Sequence[tuple[str, RemoteCommand]]) -> bool:
        if args.auto or args.yes:
            return True
        if not sys.stdin.isatty():
            raise UserError(f"{step}: {len(commands)} command(s) would change the nodes; pass --auto or --yes to "
                            "run them, or use the console's wizard (w)", exit_code=1)
        from sparkconsole.logs.follow import display_lines

        for node, cmd in commands:  # a command can quote a node's words (a container's, a unit's name)
            print(f"    {node} $ {display_lines(cmd.shell())}")
        reply = await asyncio.to_thread(input, f"  run these {len(commands)} command(s)? [y/N] ")
        return reply.strip().lower() in ("y", "yes")

    return confirm


__all__ = ["Printer", "add_parser", "replace", "run"]
