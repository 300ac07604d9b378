"""The rehearsal: read the real cluster without changing it, build its twin, run the whole flow there.

Two walks, both through :func:`~sparkconsole.deploy.opening.open_deployment` and
:func:`~sparkconsole.deploy.session.run_flow`, the very path a real deployment takes:

1. **The read-only walk** (:func:`read_cluster`) on the operator's cluster: ``read_only`` (the
   transports refuse any change) and ``plan_only`` (each step's ``send`` is only rehearsed), with
   the recommended answers or the given ones. Recon and every probe the flow makes go out; nothing
   that changes a node does, and nothing is journaled or saved. What a read-only walk cannot check
   (running an image's own Python) is kept as ``not_checked``. Its result is a :class:`Twin`.
2. **The twin walk** (:func:`rehearse_on_twin`): the twin built as a simulated cluster
   (:func:`sparkconsole.sim.twin.build_twin`) behind the demo's SSH servers, its clock fast, and
   the whole flow run there with the same answers: its decisions, every change each node receives,
   the failures met and what they led to, and how long each step took in the twin's time.

:class:`Rehearsal` holds what the operator reads (:func:`format_report`) and what ``--json`` gives:
the twin walk's events as a real run emits them (``decision``, ``step``, a ``planned`` event per
change with its node, command and ``mutating``), then the estimates and what the twin invented.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sparkconsole.config import ClusterConfig
from sparkconsole.deploy.decisions import ScriptedAnswers
from sparkconsole.deploy.events import CommandEvent, DecisionEvent, Event, NoteEvent, ResultEvent, StepEvent
from sparkconsole.deploy.flow import Options
from sparkconsole.deploy.runner import Settings, StepFailed
from sparkconsole.deploy.twin import HubFileFacts, Twin
from sparkconsole.remote import RemoteCommand

TWIN_SPEED = 1000.0  # the fastest the twin runs: a half-hour deployment in a few seconds
TWIN_WALL_S = 10.0  # what a twin walk aims to take when its copies are long enough to allow it


def twin_speed(twin: Twin) -> float:
    """How fast the twin's clock runs: its copies' bytes over the rates read, in about
    ``TWIN_WALL_S``, between 1 and ``TWIN_SPEED``. The console itself runs at wall speed beside the
    twin, so at N times its few milliseconds between two commands are N times longer in the twin:
    harmless beside a 20-minute download, but at x1000 a small model's download ends before the
    console has started the copy that should run beside it (the lab's tiny model: the copy's passes
    five seconds apart never happen, and its estimate is half the real one). A cluster with little to
    move is rehearsed at wall speed, where the twin's order of events is the real one."""
    from sparkconsole.sim.model import FAST_LINK_RSYNC_BPS, INTERNET_BPS

    size = sum(f.size for f in twin.hub_files)
    work = 0.0
    if not all(twin.weights.values()):
        if not any(twin.weights.values()):
            work += size / float(twin.measured.get("hub_download") or INTERNET_BPS)
        work += size / float(twin.measured.get("fast_link_copy") or FAST_LINK_RSYNC_BPS)
    return min(TWIN_SPEED, max(1.0, work / TWIN_WALL_S))


@dataclass
class Planned:
    """One change a step sends to a node (what the operator will be asked to confirm)."""

    step: str
    node: str
    command: str
    summary: str
    mutating: bool

    def to_json(self) -> dict[str, Any]:
        return {"event": "planned", "step": self.step, "node": self.node, "command": self.command,
                "summary": self.summary, "mutating": self.mutating}


@dataclass
class StepRun:
    """One step of the twin walk: its outcome and how long it took in the twin's time."""

    step: str
    state: str = "pending"
    note: str = ""
    started: float | None = None
    ended: float | None = None
    decisions: list[DecisionEvent] = field(default_factory=list)
    planned: list[Planned] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    seconds: float | None = None  # the estimate: the time its nodes were busy for it (estimate_runs)


@dataclass
class Rehearsal:
    twin: Twin
    invented: list[str]
    steps: list[StepRun]
    result: ResultEvent
    events: list[dict[str, Any]]  # the twin walk's events as JSON, in order (``planned`` among them)
    wall_s: float = 0.0

    @property
    def decisions(self) -> list[DecisionEvent]:
        return [d for s in self.steps for d in s.decisions]

    @property
    def changes(self) -> list[Planned]:
        return [p for s in self.steps for p in s.planned if p.mutating]

    @property
    def total_s(self) -> float:
        return sum(s.seconds or 0.0 for s in self.steps)

    def critical_path(self, top: int = 3) -> list[StepRun]:
        """The steps that take the longest (they run one after another: the flow is sequential)."""
        return sorted((s for s in self.steps if s.seconds), key=lambda s: -(s.seconds or 0.0))[:top]

    def estimates(self) -> dict[str, Any]:
        per_step: dict[str, float] = {}
        for s in self.steps:  # a step the flow came back to: its runs added up
            per_step[s.step] = per_step.get(s.step, 0.0) + (s.seconds or 0.0)
        return {"total_s": round(self.total_s, 1),
                "steps": {k: round(v, 1) for k, v in per_step.items()},
                "critical_path": [s.step for s in self.critical_path()],
                "rates": rates_used(self.twin),
                "fixed_s": {k: self.twin.measured.get(k) for k in ("command_s", "peer_ssh_s", "hf_start_s")}}

    def answers(self) -> dict[str, str]:
        """Each decision's answer, the last one where the flow came back to it (``--answers-from``)."""
        return {d.id: d.answer for d in self.decisions if d.answer is not None}

    def to_json(self) -> dict[str, Any]:
        return {"event": "rehearsal", "cluster": self.twin.cluster, "model": self.twin.model,
                "ok": self.result.ok, "message": self.result.message, "estimates": self.estimates(),
                "answers": self.answers(), "invented": list(self.invented),
                "not_checked": list(self.twin.not_checked), "wall_s": round(self.wall_s, 2)}


DEFAULT_COMMAND_S = 0.5  # one command's round trip where the read-only walk measured none


def work_intervals(sim: Any, command_s: float,
                   beside: Sequence[tuple[float, float]] = ()) -> list[tuple[float, float]]:
    """When the twin's nodes were busy with what takes the time of a deployment: each transfer
    (an image's copy or pull) from its start to its end, each stretch of files written or read (a
    download, a copy's receiving end, a load of the weights: the page cache's ramps), each engine
    from its start to ready (or to its failure), each detached job for the time it asked to wait
    (its starts, transfers and the pauses between a streamed copy's passes), and each command the
    console sent for the time the node worked on it plus one round trip (``command_s``, measured on
    the real cluster: in-process SSH has none). A poll sent while a job runs overlaps the job, so it
    adds nothing; two nodes answering at once count once. A job started within one of the ``beside``
    windows (a step whose jobs run beside the deployment: the memory guard's watcher) is nobody's
    work: it runs, and waits, for as long as the engine does."""
    out = [(r.t0, r.stop) for r in sim.cache_ramps]
    for tr in sim.transfers:
        end = min(x for x in (tr.t1, tr.cancelled_at, tr.failed_at) if x is not None)
        out.append((tr.t0, end))
    for _ct, e in sim.all_engines():
        end = next((x for x in (e.ready_at, e.failed_at, e.stopped_at) if x is not None), None)
        if end is not None:
            out.append((e.started, end))
    out.extend((w.t0, w.t1 + (command_s if w.kind == "exec" else 0.0)) for w in sim.work_spans
               if w.kind != "job" or not any(lo <= w.t0 <= hi for lo, hi in beside))
    return out


def estimate_runs(runs: Sequence[StepRun], work: Sequence[tuple[float, float]]) -> None:
    """Each run's estimate: the time the twin's nodes were busy inside the run's window (the union
    of ``work``: what the step waited for). The twin's clock is not used as it is: the console runs
    at wall speed beside it, so its computing between commands would read as N times longer."""
    for run in runs:
        if run.started is None or run.ended is None:
            continue
        lo, hi = run.started, run.ended
        spans = sorted((max(a, lo), min(b, hi)) for a, b in work if a < hi and b > lo)
        busy, edge = 0.0, lo
        for a, b in spans:
            a = max(a, edge)
            if b > a:
                busy += b - a
                edge = b
        run.seconds = busy


def rates_used(twin: Twin) -> dict[str, dict[str, Any]]:
    """The transfer rates behind the estimates: measured where the twin measured them, else the
    twin's defaults (marked so)."""
    from sparkconsole.sim.model import FAST_LINK_RSYNC_BPS, IMAGE_COPY_BPS, INTERNET_BPS

    defaults = {"hub_download": INTERNET_BPS, "fast_link_copy": FAST_LINK_RSYNC_BPS, "image_copy": IMAGE_COPY_BPS}
    # the image copy is not measured: what costs most there is `docker load` unpacking on the far
    # side, and a load is a change (the figure is a Spark pair's)
    out = {}
    for name, bps in defaults.items():
        got = twin.measured.get(name)
        out[name] = {"bytes_per_s": got if got is not None else bps, "measured": got is not None}
    return out


class _Collect:
    """The events of one walk, as step runs in the order they ran (a step the flow came back to
    runs again), with the clock at each."""

    def __init__(self, now: Callable[[], float], forward: Callable[[Event], None] | None = None) -> None:
        self.now = now
        self.forward = forward
        self.runs: list[StepRun] = []
        self.events: list[dict[str, Any]] = []
        self.notes: list[NoteEvent] = []
        self.commands: list[tuple[int, CommandEvent]] = []  # (step run's index, the answered command)

    def step(self, step: str) -> StepRun:
        """The latest run of ``step`` (a new one when it has not run yet)."""
        for run in reversed(self.runs):
            if run.step == step:
                return run
        self.runs.append(StepRun(step))
        return self.runs[-1]

    @property
    def current(self) -> StepRun | None:
        return self.runs[-1] if self.runs else None

    def __call__(self, e: Event) -> None:
        if self.forward is not None:
            self.forward(e)
        if isinstance(e, CommandEvent):
            if e.rc is not None:
                self.commands.append((len(self.runs) - 1, e))
            if e.rc not in (None, 0) and e.mutating:
                self.step(e.step).failures.append(f"{e.node}: {e.summary or e.command.splitlines()[0]} → exit {e.rc}")
            return  # the planned events say what was sent; a read's text stays out of the report
        data = e.to_json()
        self.events.append(data)
        if isinstance(e, StepEvent):
            if e.state == "running":
                self.runs.append(StepRun(e.step, started=self.now()))
            s = self.step(e.step)
            if e.state in ("done", "skipped", "failed", "waiting"):
                s.ended = self.now()
            s.state, s.note = e.state, e.note
            if e.state == "failed":
                s.failures.append(e.note)
        elif isinstance(e, DecisionEvent) and e.answer is not None and self.current is not None:
            self.current.decisions.append(e)
        elif isinstance(e, NoteEvent):
            self.notes.append(e)
            if e.level == "error" and self.current is not None:
                self.current.failures.append(e.text)

    def plan(self, step: str, title: str, commands: Sequence[tuple[str, RemoteCommand]]) -> None:
        for node, cmd in commands:
            p = Planned(step, node, cmd.shell(), cmd.summary, cmd.mutating)
            self.step(step).planned.append(p)
            self.events.append(p.to_json())


async def read_cluster(config: ClusterConfig, options: Options, presets: dict[str, str], *,
                       journal: Any = None, emit: Callable[[Event], None] | None = None,
                       transport_factory: Any = None) -> Twin:
    """The read-only walk on the real cluster: every read the flow makes, no change, no state
    saved, nothing journaled (a journal given is only there to prove it stays empty)."""
    from sparkconsole.deploy.opening import open_deployment
    from sparkconsole.deploy.session import run_flow
    from sparkconsole.deploy.state import DeploymentState, StateStore

    async def refuse(step: str, commands: Sequence[tuple[str, RemoteCommand]]) -> bool:
        return False  # never reached: plan-only sends nothing

    col = _Collect(time.time, emit)
    state = DeploymentState.new(options.model, options.to_json(), config.name)
    with tempfile.TemporaryDirectory(prefix="sparkconsole-rehearse-") as tmp:
        async with open_deployment(
                replace(config, read_only=True), options, state, answer=ScriptedAnswers(dict(presets), auto=True),
                emit=col, confirm=refuse, settings=Settings(), journal=journal, store=StateStore(Path(tmp)),
                read_only=True, plan_only=True, lock=False, transport_factory=transport_factory) as session:
            await run_flow(session.flow, on_plan=col.plan)
            flow = session.flow
            hub_bps = await _measure_hub(flow)
            link = await _measure_link(flow)
            hf_s = await _measure_hf(flow)
            facts = [flow.facts[n.name] for n in config.nodes if n.name in flow.facts]
            plan = flow.plan
            verdicts = flow.step("weights").verdicts  # type: ignore[attr-defined]
            try:
                model_config = dict(flow.spec.config)
            except StepFailed:  # no spec read (no route to the Hub): the twin then knows catalogue models only
                model_config = {}
    not_checked = [n.text for n in col.notes if n.text.startswith("not checked")]
    took = sorted(e.duration_s for _i, e in col.commands if e.duration_s is not None)
    return Twin(cluster=config.name, model=options.model, read_at=time.time(), nodes=facts,
                weights={n: v.complete for n, v in verdicts.items()} or {k: bool(v) for k, v in plan.weights_ok.items()},
                hub_files=[HubFileFacts(f.path, f.size, f.sha256) for f in plan.hub_files], model_config=model_config,
                not_checked=list(dict.fromkeys(not_checked)),
                measured={"command_s": round(took[len(took) // 2], 3) if took else None, "hub_download": hub_bps,
                          "fast_link_copy": link[1], "peer_ssh_s": link[0], "hf_start_s": hf_s})


async def _measure_hub(flow: Any) -> float | None:
    """The Hub's rate as the node that will download sees it: a bounded ranged read of the model's
    largest file to /dev/null (:func:`remote.hub_read_rate`), read-only. None where no node reaches
    the Hub or the read said too little."""
    from sparkconsole.remote import hub_read_rate, parse_read_rate

    online = _copy_source(flow)
    files = sorted(flow.plan.hub_files, key=lambda f: -f.size)
    if online is None or not files:
        return None
    res = await flow.runner.read(online, hub_read_rate(flow.options.model, files[0].path))
    rate = parse_read_rate(res.stdout) if res.ok else None
    return None if rate is None else round(rate)


def _copy_source(flow: Any) -> str | None:
    """The node the copies start from: the one that downloads (it reaches the Hub)."""
    return next((n for n in flow.nodes if n in flow.facts and flow.facts[n].hub), None)


async def _measure_link(flow: Any) -> tuple[float | None, float | None]:
    """One ssh connection's seconds and the fast link's rate as a copy sees it, from the copying node
    to the first other node, timed there (:func:`remote.peer_link_rate`: zeros streamed to ``wc -c``,
    nothing written); (None, None) where the nodes cannot ssh to each other yet (the network step
    says so) or there is one node."""
    from sparkconsole.deploy.weights import peer_port
    from sparkconsole.remote import parse_link_rate, peer_link_rate

    src = _copy_source(flow)
    dst = next((n for n in flow.nodes if n != src and n in flow.facts), None)
    if src is None or dst is None:
        return None, None
    try:
        cmd = peer_link_rate(flow.user_at(dst), port=peer_port(flow, dst))
    except StepFailed:
        return None, None
    res = await flow.runner.read(src, cmd, timeout=60)
    got = parse_link_rate(res.stdout) if res.ok else None
    if got is None:
        return None, None
    return round(got[0], 3), (None if got[1] is None else round(got[1]))


async def _measure_hf(flow: Any) -> float | None:
    """How long the host's ``hf`` takes to start on the downloading node (:func:`remote.hf_start_time`);
    None where it has no ``hf`` (a stock Spark: the download then runs in the image)."""
    from sparkconsole.remote import hf_start_time, parse_span

    src = _copy_source(flow)
    if src is None or flow.facts[src].tools.get("hf") is not True:
        return None
    res = await flow.runner.read(src, hf_start_time(), timeout=60)
    span = parse_span(res.stdout) if res.ok else None
    return None if span is None else round(span, 3)


async def rehearse_on_twin(twin: Twin, options: Options, presets: dict[str, str], *, until: str | None = None,
                           speed: float | None = None, emit: Callable[[Event], None] | None = None) -> Rehearsal:
    """The whole flow on the twin, fast (``speed``: :func:`twin_speed`), with the recommended answers
    (or ``presets``)."""
    from sparkconsole.deploy.opening import open_deployment
    from sparkconsole.deploy.session import run_flow
    from sparkconsole.deploy.state import DeploymentState, StateStore
    from sparkconsole.journal import Journal
    from sparkconsole.sim.clock import SimClock
    from sparkconsole.sim.server import start_cluster
    from sparkconsole.sim.twin import build_twin

    async def yes(step: str, commands: Sequence[tuple[str, RemoteCommand]]) -> bool:
        return True

    speed = twin_speed(twin) if speed is None else speed
    sim = build_twin(twin, SimClock(speed=speed), image=options.image)
    sim.record_work = True
    wall0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sparkconsole-twin-") as tmp:
        demo = await start_cluster(sim, workdir=Path(tmp) / "cluster")
        try:
            col = _Collect(sim.now, emit)
            config = demo.config
            state = DeploymentState.new(options.model, options.to_json(), config.name)
            async with open_deployment(
                    config, options, state, answer=ScriptedAnswers(dict(presets), auto=True), emit=col, confirm=yes,
                    settings=Settings(poll_s=0.5, speed=speed), journal=Journal(Path(tmp) / "journal.jsonl"),
                    store=StateStore(Path(tmp) / "deployments"), lock=False) as session:
                outcome = await run_flow(session.flow, until=until, on_plan=col.plan)
                beside = {s.id for s in session.flow.steps if s.jobs_run_beside}
        finally:
            await demo.stop()
    col.events.append(outcome.result.to_json())
    command_s = twin.measured.get("command_s") or DEFAULT_COMMAND_S
    windows = [(r.started, r.ended) for r in col.runs if r.step in beside and r.started is not None
               and r.ended is not None]
    estimate_runs(col.runs, work_intervals(sim, command_s, windows))
    invented = list(sim.invented) + _rates_invented(twin)
    if twin.measured.get("command_s") is None:
        invented.append(f"one command's round trip: {DEFAULT_COMMAND_S} s (not measured)")
    return Rehearsal(twin=twin, invented=invented, steps=col.runs,
                     result=outcome.result, events=col.events, wall_s=time.monotonic() - wall0)


async def rehearse_cluster(config: ClusterConfig, options: Options, presets: dict[str, str], *, journal: Any,
                           until: str | None = None, twin_out: str | Path | None = None,
                           transport_factory: Any = None,
                           say: Callable[[str], None] = lambda text: None) -> tuple[Rehearsal, Path, Path]:
    """The whole rehearsal, as ``deploy --rehearse`` and the wizard's ``R`` run it: the read-only
    walk, the twin written (``twin_out``, else ``state_dir()/twins/<cluster>-<time>.json``), the twin
    walk, its report written beside the twin. ``say`` hears the stages in words."""
    from datetime import UTC, datetime

    from sparkconsole.config import state_dir
    from sparkconsole.deploy.twin import save
    from sparkconsole.durable import file_name_for

    say(f"reading {config.name} ({', '.join(n.name for n in config.nodes)}) without changing anything …")
    twin = await read_cluster(config, options, presets, journal=journal, transport_factory=transport_factory)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    path = save(twin, twin_out or state_dir() / "twins" / f"{file_name_for(config.name)}-{stamp}.json")
    say(f"twin written: {path} (no secret in it: attach it to a bug report as it is)")
    say("rehearsing the whole deployment on the twin …")
    r = await rehearse_on_twin(twin, options, presets, until=until)
    return r, path, save_report(r, path.with_name(path.stem + ".rehearsal.json"))


def _rates_invented(twin: Twin) -> list[str]:
    from sparkconsole.sim.model import PEER_SSH_S

    out = [f"{name.replace('_', ' ')}: {r['bytes_per_s'] / 1e6:.0f} MB/s, the twin's default (not measured)"
           for name, r in rates_used(twin).items() if not r["measured"]]
    if twin.measured.get("peer_ssh_s") is None:
        out.append(f"one ssh connection between the nodes: {PEER_SSH_S} s, the twin's default (not measured: "
                   "the nodes did not let one ssh to the other)")
    if twin.measured.get("hf_start_s") is None:
        out.append("hf's start: not counted (no hf on the downloading host to time; the download's container "
                   "start is not read either)")
    return out


def duration_words(s: float | None) -> str:
    """Seconds as a person reads them: ``42 s``, ``3 min 07 s``, ``1 h 02 min``; ``—`` for none."""
    if s is None:
        return "—"
    if s < 60:
        return f"{s:.0f} s"
    m, sec = divmod(round(s), 60)
    return f"{m // 60} h {m % 60:02d} min" if m >= 60 else f"{m} min {sec:02d} s"


LONG = 96  # a command longer than this is shown by its start and its summary in the plain report


def format_report(r: Rehearsal) -> list[str]:
    """The rehearsal in words, step by step (plain text; node text is cleaned by the caller)."""
    lines = [f"rehearsal of {r.twin.model} on a twin of {r.twin.cluster} "
             f"({', '.join(n.node for n in r.twin.nodes)}): {r.result.message}",
             f"  estimated {duration_words(r.total_s)} in all; the twin ran it in {r.wall_s:.1f} s"]
    for s in r.steps:
        mark = {"done": "✓", "skipped": "·", "failed": "✗", "waiting": "?"}.get(s.state, " ")
        if s.state == "failed" and s.note.startswith("back to"):
            mark = "↺"  # the flow went back to an earlier step: a detour, not the end
        lines.append(f"{mark} {s.step:<12} {duration_words(s.seconds):>12}  {s.note}".rstrip())
        for d in s.decisions:
            lines.append(f"    ? {d.id}: {d.title}")
            lines.append(f"      → {d.answer} (recommended: {d.recommended}) — {d.why}")
        by_node: dict[str, list[Planned]] = {}
        for p in s.planned:
            if p.mutating:
                by_node.setdefault(p.node, []).append(p)
        for node, cmds in by_node.items():
            for p in cmds:  # a long one (a detached job's script) by its start and what it does; --json has it whole
                first = p.command.splitlines()[0] if p.command else ""
                if len(first) > LONG or "\n" in p.command:
                    first = first[:LONG].rstrip() + f" … ({p.summary or 'more'})"
                lines.append(f"    {node} $ {first}")
        for f in s.failures:
            lines.append(f"    ! {f}")
    crit = r.critical_path()
    if crit:
        lines.append("critical path: " + ", ".join(f"{s.step} {duration_words(s.seconds)}" for s in crit))
    if r.twin.not_checked:
        lines.append("not checked without a change (the real run checks them):")
        lines += [f"  - {x}" for x in r.twin.not_checked]
    if r.invented:
        lines.append("invented by the twin (no way to read them):")
        lines += [f"  - {x}" for x in r.invented]
    return lines


def save_report(r: Rehearsal, path: str | Path) -> Path:
    """The rehearsal's summary (:meth:`Rehearsal.to_json`, its events too) as one JSON file, whole."""
    import json

    from sparkconsole.deploy.twin import check_no_secret, write_json_file

    text = json.dumps({**r.to_json(), "events": r.events}, indent=1) + "\n"
    check_no_secret(text)
    return write_json_file(Path(path).expanduser(), text, "the rehearsal's report")


def load_report(path: str | Path) -> dict[str, Any]:
    """A rehearsal's report as :func:`save_report` wrote it; a bad file is one line, exit 2."""
    import json

    from sparkconsole.errors import UserError

    p = Path(path).expanduser()
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise UserError(f"{p}: no such rehearsal report") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UserError(f"{p}: not a rehearsal report ({exc.__class__.__name__})") from None
    answers = data.get("answers") if isinstance(data, dict) and data.get("event") == "rehearsal" else None
    if not isinstance(answers, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in answers.items()):
        raise UserError(f"{p}: not a rehearsal report (no \"answers\")")
    if not isinstance(data.get("cluster"), str) or not isinstance(data.get("model"), str):
        raise UserError(f"{p}: not a rehearsal report (no cluster or model)")
    return data


def load_answers(path: str | Path) -> dict[str, str]:
    """The answers a rehearsal's report gives (``--answers-from``); a bad file is one line, exit 2."""
    return dict(load_report(path)["answers"])
