"""The console against a hostile node for a bounded time: its memory, its keys, the other nodes' rate,
the journal.

    .venv/bin/python benchmarks/soak.py [--seconds 300] [--baseline 60] [--interval 1] [--json]

1. A demo cluster of 3 simulated Sparks (scenario ``hostile``, :mod:`sparkconsole.sim.hostile`) runs in
   its own process, so the console's memory is its own. Two nodes are ordinary; the third runs
   ``vllm-flood``, which turns hostile when told: its log writes one line that never ends (no newline,
   ``--line-span`` seconds at 256 KiB/s), then 5,000 lines a second; its ``/metrics`` becomes a 1 GB page
   of 2,000,000 series, made as it is sent and never held.
2. The real console (``SparkConsoleApp`` on that cluster's inventory, over its SSH servers) runs headless
   in this process (Textual's ``run_test``, ``--size``, 200x60 as ``ui_cost.py``), polling every
   ``--interval`` seconds. For ``--baseline`` seconds nothing is hostile; then the flood starts and lasts
   ``--seconds``. The flood's log screen is open for the first ``--log-open`` share of it (three quarters:
   the endless line and the flood through the follower, the screen and the engine's log reader), then
   closed with ``Esc``; the overview for the rest.
3. Throughout, every ``--key-every`` seconds a key round: the light key of the screen on top (``s`` on the
   overview, ``m`` on the log: a few milliseconds of work of their own), ``?`` (the help opens) and
   ``Esc`` (it closes). Each is timed from the key to the first frame the console composes of its effect,
   in wall time and in the event loop's own CPU time (what the console did before the key took effect,
   whatever else the machine ran). Every second the process's RSS (and its high-water mark, ``VmHWM``, at
   the end); every probe tick of every node; every second a journal entry written through
   :class:`sparkconsole.journal.Journal`; every ``--action-every`` seconds a confirmed action through
   the console itself (restart ``embeddings``, the confirmation answered with ``y``, on the hostile node
   and an ordinary one in turn), which the console journals.
4. Judged: the console keeps running; peak RSS under 300 MB; every key within 200 ms; each ordinary
   node's tick rate under the flood at least 90 % of its own rate in the baseline, every tick answered;
   every journal entry read back whole and unchanged, every confirmed action journaled, no line of the
   journal unreadable; the hostile load reached the console (its page refused as too large, log lines
   read). One JSON object (``--json``) or a summary; the exit status is 1 when any figure fails, 2 when
   the soak could not start.

The product carries no hooks: the timing wraps Textual's frame (``Screen._on_timer_update``) and action
runner (``App.run_action``), the poll (``NodePoller.poll_once``) and the log screen's line intake from
outside, as ``benchmarks/ui_console.py`` does. ``--profile FILE`` writes a cProfile of the hostile phase.
The cluster's own process runs with ``--serve-sim`` (internal). The numbers of a real run are in
docs/security.md ("A hostile node for five minutes").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RSS_CAP_MB = 300.0  # the console's resident memory, at its peak
KEY_CAP_MS = 200.0  # a key to its effect on the screen
RATE_KEPT = 0.90  # an ordinary node's tick rate under the flood, of its rate without it
NODES = 3
FLOOD = "vllm-flood"
MB = 1e6
# the light key of each screen the soak visits, and the action its binding runs
LIGHT_KEYS = {"OverviewScreen": ("s", "sort(1)"), "LogScreen": ("m", "marker")}


# ---- the hostile cluster, in its own process --------------------------------------------------------


async def serve_sim(work: Path, line_span: float) -> None:
    """Run the ``hostile`` cluster; its inventory goes to ``work/cluster.toml``. A line ``hostile`` on
    stdin starts the flood now (answered ``hostile <sim time>``); stdin's end stops the cluster."""
    from sparkconsole.sim import SimClock, build, start_cluster
    from sparkconsole.sim.hostile import Hostile

    hostile = Hostile(t0=math.inf, line_span=line_span)  # ordinary until told
    sim = build("hostile", nodes=NODES, clock=SimClock(), hostile=hostile)
    demo = await start_cluster(sim, workdir=work / "sim")
    try:
        tmp = work / "cluster.toml.tmp"
        demo.write_inventory(tmp)
        tmp.replace(work / "cluster.toml")
        print("ready", flush=True)
        while line := await asyncio.to_thread(sys.stdin.readline):
            if line.strip() == "hostile":
                hostile.t0 = sim.clock.now()
                print(f"hostile {hostile.t0:.3f}", flush=True)
    finally:
        await demo.stop()


class SimProcess:
    """The cluster's process: started, told when to turn hostile, stopped."""

    def __init__(self, work: Path, line_span: float) -> None:
        self.work = work
        self.line_span = line_span
        self.proc: asyncio.subprocess.Process | None = None

    async def launch(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-W", "ignore", str(Path(__file__).resolve()), "--serve-sim", str(self.work),
            "--line-span", str(self.line_span), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "SPARKCONSOLE_STATE_DIR": str(self.work / "sim-state")}, cwd=str(ROOT))

    async def ready(self, timeout: float = 120.0) -> Path:
        """The cluster's inventory, once it answers."""
        assert self.proc is not None and self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if line.strip() != b"ready":
            raise SetupFailed(f"the hostile cluster did not start (exit {await self.proc.wait()})")
        return self.work / "cluster.toml"

    async def turn_hostile(self) -> None:
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(b"hostile\n")
        await self.proc.stdin.drain()
        line = await asyncio.wait_for(self.proc.stdout.readline(), 30)
        if not line.startswith(b"hostile "):
            raise SetupFailed(f"the hostile cluster did not answer: {line!r}")

    def cpu_s(self) -> float | None:
        import psutil

        if self.proc is None:
            return None
        with contextlib.suppress(psutil.Error):
            t = psutil.Process(self.proc.pid).cpu_times()
            return t.user + t.system
        return None

    async def stop(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 20)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


# ---- what is measured, from outside the product ------------------------------------------------------


class Probe:
    """Wraps (once, for the run) the frame, the poll, the key bindings' actions and the log screen's intake,
    and samples the RSS."""

    def __init__(self) -> None:
        self.ticks: list[tuple[str, float, bool, str]] = []  # (node, end monotonic, answered: UP, reason)
        self.actions: list[tuple[str, float]] = []  # (binding action, perf_counter once it ran)
        self.frames: dict[int, tuple[float, float]] = {}  # id(screen) -> (perf_counter, thread_time) of its last frame
        self.frame_event: asyncio.Event | None = None
        self.log_lines = 0
        self.log_longest = 0
        self.rss: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def install(self) -> None:
        from textual.app import App
        from textual.screen import Screen

        from sparkconsole.probe.poller import NodePoller
        from sparkconsole.probe.state import NodeStatus
        from sparkconsole.ui.screens.logs import LogScreen

        probe = self
        frame = Screen._on_timer_update

        def timed_frame(screen: Screen) -> None:
            frame(screen)
            if screen.is_current:
                probe.frames[id(screen)] = (time.perf_counter(), time.thread_time())
                if probe.frame_event is not None:
                    probe.frame_event.set()

        Screen._on_timer_update = timed_frame  # type: ignore[method-assign]
        poll = NodePoller.poll_once

        async def counted_poll(poller: NodePoller):
            state = await poll(poller)
            probe.ticks.append((poller.node.name, time.monotonic(), state.status is NodeStatus.UP, state.reason))
            return state

        NodePoller.poll_once = counted_poll  # type: ignore[method-assign]
        run_action = App.run_action

        async def timed_action(app: App, action, default_namespace=None) -> bool:
            result = await run_action(app, action, default_namespace)
            probe.actions.append((str(action), time.perf_counter()))
            return result

        App.run_action = timed_action  # type: ignore[method-assign]
        add = LogScreen._add_lines

        def counted_lines(screen: LogScreen, events) -> None:
            probe.log_lines += len(events)
            probe.log_longest = max([probe.log_longest, *(len(e.text) for e in events)])
            add(screen, events)

        LogScreen._add_lines = counted_lines  # type: ignore[method-assign]

    def start_rss(self, period: float = 1.0) -> None:
        import psutil

        me = psutil.Process()

        def sample() -> None:
            while True:
                self.rss.append((time.monotonic(), me.memory_info().rss))
                if self._stop.wait(period):
                    return

        self._thread = threading.Thread(target=sample, name="rss", daemon=True)
        self._thread.start()

    def stop_rss(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


def vm_hwm() -> int | None:
    """The process's peak resident memory (``VmHWM``, bytes): every spike between two samples in it."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


# ---- the run ----------------------------------------------------------------------------------------


class ConsoleEnded(Exception):
    """The console stopped running (it raised): the run stops measuring."""


class SetupFailed(Exception):
    """The soak could not start (the cluster, the console's first connections): nothing was measured."""


def _why_ended(exc: BaseException) -> str:
    """The exception in one line, with the innermost frame of the product it came from."""
    import traceback

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/sparkconsole/" in f.filename]
    where = f" at {Path(frames[-1].filename).relative_to(ROOT)}:{frames[-1].lineno} ({frames[-1].name})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"



class Soak:
    def __init__(self, args: argparse.Namespace, work: Path, probe: Probe) -> None:
        self.args = args
        self.work = work
        self.probe = probe
        self.keys: list[dict[str, Any]] = []  # {phase, screen, key, wall_ms, cpu_ms}
        self.keys_lost: list[dict[str, Any]] = []  # keys whose effect never came
        self.hostile_node = ""
        self.written: list[Any] = []  # the JournalEntry of every entry written through the API
        self.actions: list[tuple[str, str]] = []  # (node, command) of every confirmed console action
        self.action_errors: list[str] = []
        self.phase = "start"
        self.windows: dict[str, tuple[float, float]] = {}
        self.onset_wall: float | None = None
        self.page_reasons: set[str] = set()
        self.log_dropped = 0
        cols, _x, rows = args.size.partition("x")
        self.size = (int(cols), int(rows))
        self.crash: str | None = None  # the console ended by itself: why, and where
        self.sim_cpu: dict[str, float | None] = {}  # the cluster process's CPU, % of a core, per phase
        self.console_cpu: dict[str, float] = {}  # this process's, the same way

    async def press(self, app, key: str, char: str | None, kind: str, *, screen: Callable[[Any], bool] | None = None,
                    action: str | None = None, timeout: float = 60.0) -> None:
        """``key`` as the terminal sends it, timed to its effect on the screen: the first frame the
        console composes of a screen ``screen`` accepts, or, for a key that changes its own screen,
        the first frame after its binding's ``action`` has run."""
        from textual import events

        probe = self.probe
        assert probe.frame_event is not None
        where = type(app.screen).__name__
        t0, c0 = time.perf_counter(), time.thread_time()
        app._driver.send_message(events.Key(key, char))
        end = t0 + timeout
        while True:
            if not app.is_running:
                raise ConsoleEnded
            probe.frame_event.clear()
            scr = app.screen
            seen = probe.frames.get(id(scr))
            if action is not None:
                ran = next((at for name, at in reversed(probe.actions) if at > t0 and name == action), None)
                ok = ran is not None and seen is not None and seen[0] > ran
            else:
                ok = screen is not None and screen(scr) and seen is not None and seen[0] > t0
            if ok:
                assert seen is not None
                self.keys.append({"phase": self.phase, "screen": where, "kind": kind,
                                  "wall_ms": 1000 * (seen[0] - t0), "cpu_ms": 1000 * (seen[1] - c0)})
                return
            left = end - time.perf_counter()
            if left <= 0:  # never took effect: counted apart, and a failure
                self.keys_lost.append({"phase": self.phase, "screen": where, "kind": kind})
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(probe.frame_event.wait(), min(left, 1.0))

    async def key_round(self, app) -> None:
        """A light key of the screen on top (``s`` on the overview: the next sort column; ``m`` on the log:
        a marker line), then ``?`` (the help opens over it) and ``Esc`` (it closes)."""
        from sparkconsole.ui.screens.help import HelpScreen

        name = type(app.screen).__name__
        if name not in LIGHT_KEYS:
            return
        key, action = LIGHT_KEYS[name]
        await self.press(app, key, key, "light", action=action)
        under = app.screen
        await self.press(app, "question_mark", "?", "help opens", screen=lambda s: isinstance(s, HelpScreen))
        if isinstance(app.screen, HelpScreen):
            await self.press(app, "escape", "\x1b", "help closes", screen=lambda s: s is under)

    async def confirmed_action(self, app, node: str) -> None:
        """Restart ``embeddings`` on ``node`` the way the operator does: the console plans it, asks, the
        answer is ``y``; the console runs it and journals it."""
        from sparkconsole.services import Service

        svc = Service(name="embeddings", kind="container", state="running", image="vllm/vllm-openai:v0.14.1")
        command = app.controller(node).plan("restart", svc).shell()
        app.run_service_action(node, svc, "restart")
        loop = asyncio.get_running_loop()
        end = loop.time() + 60
        while type(app.screen).__name__ != "ConfirmScreen":
            if not app.is_running:
                raise ConsoleEnded
            if loop.time() > end:
                self.action_errors.append(f"{node}: the confirmation did not open")
                return
            await asyncio.sleep(0.02)
        confirm = app.screen
        await self.press(app, "y", "y", "confirm", screen=lambda s: s is not confirm)
        while any(w.group == "service-action" and not w.is_finished for w in app.workers):
            if not app.is_running:
                raise ConsoleEnded
            if loop.time() > end + 120:
                self.action_errors.append(f"{node}: the restart did not finish")
                return
            await asyncio.sleep(0.1)
        self.actions.append((node, command))

    async def journal_entries(self, app, stop: asyncio.Event) -> None:
        i = 0
        while not stop.is_set():
            i += 1
            self.written.append(app.journal.record(
                node="soak", command=f"true  # soak entry {i}", summary=f"soak entry {i} ({self.phase})",
                exit_code=0, duration_s=0.001))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)

    async def drive(self, app, phase: str, seconds: float, nodes_for_actions: list[str],
                    at_end: Callable[[], Awaitable[None]] | None = None, at: float | None = None) -> None:
        """``seconds`` of keys and confirmed actions; ``at_end`` runs once ``at`` seconds have passed."""
        self.phase = phase
        loop = asyncio.get_running_loop()
        start = loop.time()
        end = start + seconds
        next_key = start + self.args.key_every / 2
        next_action = start + min(self.args.action_every / 2, max(seconds / 3, 0.5))
        action_i = 0
        while loop.time() < end:
            if not app.is_running:
                raise ConsoleEnded
            now = loop.time()
            if at_end is not None and at is not None and now - start >= at:
                await at_end()
                at_end = None
            if now >= next_action and nodes_for_actions:
                await self.confirmed_action(app, nodes_for_actions[action_i % len(nodes_for_actions)])
                action_i += 1
                next_action += self.args.action_every
            elif now >= next_key:
                await self.key_round(app)
                next_key += self.args.key_every
            for w in app.node_state(self.hostile_node).engines.values():  # what the console said of the page
                if w.reason:
                    self.page_reasons.add(w.reason)
            await asyncio.sleep(min(0.1, max(0.0, end - loop.time())))
        if at_end is not None:
            await at_end()

    @contextlib.contextmanager
    def window(self, phase: str, sim: SimProcess, profile: Path | None = None):
        """One phase: its span, the console's CPU and the cluster's over it (``profile``: the event
        loop's cProfile over it, written there)."""
        prof = None
        if profile is not None:
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        t, cpu, sim_cpu = time.monotonic(), time.process_time(), sim.cpu_s()
        try:
            yield
        finally:
            if prof is not None:
                prof.disable()
                prof.dump_stats(str(profile))
            end = time.monotonic()
            self.windows[phase] = (t, end)
            self.console_cpu[phase] = round(100 * (time.process_time() - cpu) / (end - t), 1)
            self.sim_cpu[phase] = None if sim_cpu is None else round(100 * (_delta(sim_cpu, sim.cpu_s()) or 0)
                                                                     / (end - t), 1)

    async def run(self) -> dict[str, Any]:
        args = self.args
        sim = SimProcess(self.work, args.line_span)
        await sim.launch()  # the cluster starts in its process while this one loads the console
        self.probe.install()
        from sparkconsole.config import load_config
        from sparkconsole.journal import Journal
        from sparkconsole.probe.state import NodeStatus
        from sparkconsole.services import Service
        from sparkconsole.ui.app import SparkConsoleApp
        from sparkconsole.ui.screens.logs import LogScreen

        inventory = await sim.ready()
        config = load_config(inventory)
        hostile_node = self.hostile_node = config.nodes[-1].name
        ordinary = [n.name for n in config.nodes[:-1]]
        app = SparkConsoleApp(config, interval=args.interval, remember_theme=False,
                              journal=Journal(self.work / "journal.jsonl"))
        probe = self.probe
        stop_journal = asyncio.Event()
        loop = asyncio.get_running_loop()
        rss_ready = rss_end = 0
        try:
            async with app.run_test(headless=True, size=self.size) as _pilot:
                probe.frame_event = asyncio.Event()
                end = loop.time() + 120
                while app.poller is None or not all(
                        app.node_state(n.name).status is NodeStatus.UP for n in config.nodes):
                    if loop.time() > end:
                        raise SetupFailed("the console did not reach every node: " + "; ".join(
                            f"{n.name}: {app.node_state(n.name).reason}" for n in config.nodes))
                    await asyncio.sleep(0.1)
                rss_ready = rss_end = app_rss()
                journal_task = asyncio.ensure_future(self.journal_entries(app, stop_journal))
                try:
                    with self.window("baseline", sim):
                        await self.drive(app, "baseline", args.baseline, [ordinary[-1], hostile_node])
                    await sim.turn_hostile()
                    self.onset_wall = time.time()
                    with self.window("hostile", sim, profile=args.profile):
                        svc = Service(name=FLOOD, kind="container", state="running",
                                      image="vllm/vllm-openai:v0.14.1")
                        if args.log_open > 0:
                            app.open_logs(hostile_node, svc)

                        async def close_log() -> None:  # Esc, as the operator leaves it
                            if isinstance(app.screen, LogScreen):
                                self.log_dropped += app.screen.lines_dropped
                                await self.press(app, "escape", "\x1b", "log closes",
                                                 screen=lambda s: not isinstance(s, LogScreen))

                        # a share of 1: open to the end, closed with the console
                        await self.drive(app, "hostile", args.seconds, [hostile_node, ordinary[-1]],
                                         at_end=close_log if args.log_open < 1 else None,
                                         at=args.log_open * args.seconds)
                        self.log_dropped += sum(s.lines_dropped for s in app.screen_stack if isinstance(s, LogScreen))
                except ConsoleEnded:
                    pass  # run_test says why as it closes
                stop_journal.set()
                await journal_task
                rss_end = app_rss()
                app.exit()
        except SetupFailed:
            raise
        except Exception as exc:  # the console ended on its own: the figures so far, and why
            self.crash = _why_ended(exc)
            rss_end = app_rss()
        finally:
            stop_journal.set()
            await sim.stop()
        return self.figures(config, hostile_node, ordinary, rss_ready, rss_end)

    def figures(self, config, hostile_node: str, ordinary: list[str], rss_ready: int, rss_end: int) -> dict[str, Any]:
        from sparkconsole.journal import read_journal

        args = self.args
        probe = self.probe
        hwm = vm_hwm()
        samples = [r for _t, r in probe.rss]
        t_first = probe.rss[0][0] if probe.rss else 0.0
        timeline = [[round(t - t_first), round(r / MB)] for i, (t, r) in enumerate(probe.rss) if i % 10 == 0]
        phases = {f"{name}_from_s": round(a - t_first) for name, (a, _b) in self.windows.items()}
        rss = {"at_start_mb": rss_ready / MB, "at_end_mb": rss_end / MB, "every_10_s_mb": timeline, **phases,
               "max_sampled_mb": max(samples) / MB if samples else None,
               "peak_mb": (hwm if hwm is not None else max(samples)) / MB, "samples": len(samples),
               "limit_mb": RSS_CAP_MB}
        # keys
        walls = [k["wall_ms"] for k in self.keys]
        cpus = [k["cpu_ms"] for k in self.keys]

        def stats(xs: list[float]) -> dict[str, float | None]:
            if not xs:
                return {"p50": None, "p90": None, "p99": None, "max": None}
            s = sorted(xs)
            return {"p50": statistics.median(s), "p90": s[int(0.9 * (len(s) - 1))], "p99": s[int(0.99 * (len(s) - 1))],
                    "max": s[-1]}

        groups: dict[str, dict[str, Any]] = {}
        for phase in ("baseline", "hostile"):
            for where, kind in sorted({(k["screen"], k["kind"]) for k in self.keys if k["phase"] == phase}):
                sel = [k for k in self.keys if (k["phase"], k["screen"], k["kind"]) == (phase, where, kind)]
                groups[f"{phase} · {where} · {kind}"] = {
                    "count": len(sel), "wall_ms": stats([k["wall_ms"] for k in sel]),
                    "loop_cpu_ms": stats([k["cpu_ms"] for k in sel])}
        light = [k["cpu_ms"] for k in self.keys if k["kind"] == "light"]
        keys = {"count": len(walls), "never_answered": len(self.keys_lost), "wall_ms": stats(walls),
                "loop_cpu_ms": stats(cpus), "light_loop_cpu_ms": stats(light), "by_phase_screen_kind": groups,
                "over_limit": sum(1 for w in walls if w > KEY_CAP_MS), "limit_ms": KEY_CAP_MS}
        # the ordinary nodes' rate
        rate: dict[str, Any] = {}
        for node in [*ordinary, hostile_node]:
            row: dict[str, Any] = {}
            for phase, (a, b) in self.windows.items():
                ticks = [t for t in probe.ticks if t[0] == node and a <= t[1] < b]
                row[f"{phase}_ticks"] = len(ticks)
                row[f"{phase}_per_s"] = len(ticks) / (b - a) if b > a else None
                row[f"{phase}_not_answered"] = sum(1 for t in ticks if not t[2])
                row[f"{phase}_why_not"] = sorted({t[3] for t in ticks if not t[2]})[:3]
            base, hot = row.get("baseline_per_s"), row.get("hostile_per_s")
            row["kept"] = hot / base if base and hot is not None else None
            rate[node] = row
        # the journal
        path = self.work / "journal.jsonl"
        raw = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
        unreadable = 0
        for line in raw:
            try:
                if not isinstance(json.loads(line), dict):
                    unreadable += 1
            except ValueError:
                unreadable += 1
        back = read_journal(path)
        missing = [e for e in self.written if e not in back]
        journaled = [(n, c) for n, c in self.actions
                     if any(e.node == n and e.command == c and e.exit_code == 0 for e in back)]
        actions_in_journal = sum(1 for e in back if e.node != "soak")
        journal = {"api_entries_written": len(self.written), "api_entries_missing_or_changed": len(missing),
                   "console_actions_confirmed": len(self.actions), "console_actions_journaled": len(journaled),
                   "console_entries": actions_in_journal, "lines": len(raw), "unreadable_lines": unreadable,
                   "action_errors": self.action_errors}
        hostile = {"node": hostile_node, "container": FLOOD, "line_span_s": args.line_span,
                   "line_bytes": int(args.line_span * 256 * 1024), "lines_per_s": 5000, "page_bytes": 1_000_000_000,
                   "page_series": 2_000_000, "page_reasons": sorted(self.page_reasons),
                   "log_lines_read_by_screen": probe.log_lines, "log_lines_dropped": self.log_dropped,
                   "log_longest_line_chars": probe.log_longest,
                   "cluster_cpu_pct": self.sim_cpu}
        ok_rss = rss["peak_mb"] < RSS_CAP_MB
        ok_keys = bool(walls) and max(walls) <= KEY_CAP_MS and not self.keys_lost
        ok_rate = all(rate[n]["kept"] is not None and rate[n]["kept"] >= RATE_KEPT
                      and rate[n]["hostile_not_answered"] == 0 for n in ordinary)
        ok_journal = (not missing and unreadable == 0 and len(journaled) == len(self.actions) and bool(self.written)
                      and not self.action_errors)
        ok_load = (any(r.startswith("metrics page too large") for r in self.page_reasons) and probe.log_lines > 0)
        checks = {
            "console": {"pass": self.crash is None, "what": "the console kept running"
                        + ("" if self.crash is None else f": it ended with {self.crash}")},
            "rss": {"pass": ok_rss, "what": f"peak RSS {rss['peak_mb']:.0f} MB < {RSS_CAP_MB:.0f} MB"},
            "keys": {"pass": ok_keys, "what": f"every key within {KEY_CAP_MS:.0f} ms: {len(walls)} keys, "
                                              f"max {max(walls) if walls else float('nan'):.0f} ms, "
                                              f"{keys['over_limit']} over, {len(self.keys_lost)} never answered"},
            "rate": {"pass": ok_rate, "what": "ordinary nodes' ticks under the flood, of their baseline rate: "
                                              + ", ".join(f"{n} {_pct(rate[n]['kept'])}" for n in ordinary)
                                              + f" (at least {RATE_KEPT:.0%}, every tick answered)"},
            "journal": {"pass": ok_journal, "what": f"{len(self.written) - len(missing)}/{len(self.written)} entries and "
                                                    f"{len(journaled)}/{len(self.actions)} confirmed actions read back, "
                                                    f"{unreadable} unreadable lines"},
            "load": {"pass": ok_load, "what": "the hostile load reached the console: "
                                              + ("; ".join(sorted(self.page_reasons)) or "no page reason")
                                              + f"; {probe.log_lines} log lines read"},
        }
        return {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "machine": machine(),
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "seconds": args.seconds, "baseline_s": args.baseline, "interval_s": args.interval,
            "hostile": hostile, "console_cpu_pct": self.console_cpu, "rss": rss, "keys": keys, "rate": rate, "journal": journal,
            "checks": checks, "pass": all(c["pass"] for c in checks.values()),
        }


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(b - a, 2)


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.0%}"


def app_rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def machine() -> dict[str, Any]:
    from importlib import metadata

    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    versions = {}
    for pkg in ("textual", "asyncssh"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[pkg] = metadata.version(pkg)
    return {"cpu": model, "cores": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version(),
            "load_avg": [round(x, 2) for x in os.getloadavg()], **versions}


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x:.0f}"


def summary(f: dict[str, Any]) -> str:
    lines = [f"soak {f['date']}: {f['baseline_s']:g} s baseline, then {f['seconds']:g} s hostile "
             f"({f['machine']['cores']} cores, load {f['machine']['load_avg']})"]
    r, k = f["rss"], f["keys"]
    lines.append(f"  RSS MB: start {_ms(r['at_start_mb'])}, end {_ms(r['at_end_mb'])}, max sampled "
                 f"{_ms(r['max_sampled_mb'])}, peak (VmHWM) {_ms(r['peak_mb'])}; every 10 s: "
                 + " ".join(str(mb) for _t, mb in r["every_10_s_mb"]))
    w, c = k["wall_ms"], k["loop_cpu_ms"]
    lines.append(f"  keys: {k['count']}, wall ms p50 {_ms(w['p50'])} · p90 {_ms(w['p90'])} · p99 {_ms(w['p99'])} · max "
                 f"{_ms(w['max'])}; the loop's CPU ms p50 {_ms(c['p50'])} · max {_ms(c['max'])}")
    for where, g in k["by_phase_screen_kind"].items():
        w, c = g["wall_ms"], g["loop_cpu_ms"]
        lines.append(f"    {where}: {g['count']}, wall ms p50 {_ms(w['p50'])} · p90 {_ms(w['p90'])} · max {_ms(w['max'])}; "
                     f"the loop's CPU ms p50 {_ms(c['p50'])} · max {_ms(c['max'])}")
    for node, row in f["rate"].items():
        lines.append(f"  {node}: ticks/s {row.get('baseline_per_s') or 0:.2f} → {row.get('hostile_per_s') or 0:.2f} "
                     f"({_pct(row['kept'])}), not answered {row.get('baseline_not_answered')} → "
                     f"{row.get('hostile_not_answered')} {'; '.join(row.get('hostile_why_not') or [])}")
    h = f["hostile"]
    lines.append(f"  hostile: {h['log_lines_read_by_screen']} log lines read by the screen, {h['log_lines_dropped']} "
                 f"dropped, longest {h['log_longest_line_chars']} chars; page: {'; '.join(h['page_reasons'])}; "
                 f"CPU % of a core: console {f['console_cpu_pct']}, cluster {h['cluster_cpu_pct']}")
    for name, c in f["checks"].items():
        lines.append(f"  {'PASS' if c['pass'] else 'FAIL'} {name}: {c['what']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=300.0, help="how long the node is hostile (default 300)")
    p.add_argument("--baseline", type=float, default=60.0, help="seconds before, nothing hostile (default 60)")
    p.add_argument("--interval", type=float, default=1.0, help="the console's poll interval (default 1 s)")
    p.add_argument("--key-every", type=float, default=2.0, help="seconds between two ?/Esc pairs (default 2)")
    p.add_argument("--action-every", type=float, default=30.0,
                   help="seconds between two confirmed restarts (default 30)")
    p.add_argument("--line-span", type=float, default=30.0,
                   help="seconds the endless line grows before the flood of lines (default 30)")
    p.add_argument("--log-open", type=float, default=0.75, metavar="SHARE",
                   help="the share of the hostile phase the flood's log screen is open, from its start, then "
                        "closed with Esc (default 0.75; 1: open until the console exits)")
    p.add_argument("--size", default="200x60", help="the terminal's columns x rows (default 200x60, as ui_cost.py)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--profile", type=Path, metavar="FILE",
                   help="write a cProfile of the console over the hostile phase to FILE (pstats)")
    p.add_argument("--serve-sim", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_sim is not None:
        asyncio.run(serve_sim(args.serve_sim, args.line_span))
        return 0
    for name in ("seconds", "baseline", "interval", "key_every", "action_every", "line_span"):
        if not getattr(args, name) > 0:
            print(f"soak: --{name.replace('_', '-')} must be > 0", file=sys.stderr)
            return 2
    if not 0 <= args.log_open <= 1:
        print("soak: --log-open must be between 0 and 1", file=sys.stderr)
        return 2
    cols, x, rows = args.size.partition("x")
    if not (x and cols.isdigit() and rows.isdigit() and int(cols) >= 40 and int(rows) >= 12):
        print(f"soak: --size must be COLUMNSxROWS, at least 40x12 (not {args.size!r})", file=sys.stderr)
        return 2
    probe = Probe()
    with tempfile.TemporaryDirectory(prefix="sc-soak-") as tmp:
        os.environ["SPARKCONSOLE_STATE_DIR"] = str(Path(tmp) / "state")
        probe.start_rss()
        try:
            figures = asyncio.run(Soak(args, Path(tmp), probe).run())
        except (SetupFailed, OSError, TimeoutError) as exc:
            print(f"soak: {exc or type(exc).__name__}", file=sys.stderr)
            return 2
        finally:
            probe.stop_rss()
    print(json.dumps(figures, indent=2, default=str) if args.json else summary(figures))
    return 0 if figures["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
