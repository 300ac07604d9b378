"""The Textual application: screens, the per-node polling loop, the command palette.

Polling follows Dolphie: one exclusive worker per node (group ``poll:<node>``); when it ends,
the next poll is armed with ``set_timer``, so polls never overlap and a slow or dead node only
delays itself. Every worker failure lands in :meth:`on_worker_state_changed`. The data layer
(:mod:`sparkconsole.probe`) keeps the samples and history, so screens can come and go.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from rich.text import Text
from textual import work
from textual.app import App, SystemCommand
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.content import Content
from textual.markup import escape
from textual.screen import ModalScreen, Screen
from textual.timer import Timer
from textual.worker import Worker, WorkerState

from sparkconsole.config import ClusterConfig, NodeConfig, state_dir
from sparkconsole.errors import UserError
from sparkconsole.journal import Journal
from sparkconsole.logs.follow import (
    LogFollower,
    display_fields,
    display_lines,
    display_text,
    docker_follow,
    journal_follow,
    merge_by_time,
)
from sparkconsole.probe.alerts import Alert, cluster_alerts
from sparkconsole.probe.poller import ClusterPoller
from sparkconsole.probe.state import NodeState, NodeStatus
from sparkconsole.remote import docker_log_head
from sparkconsole.services import Debouncer, Service, ServiceController
from sparkconsole.transport.base import Transport
from sparkconsole.ui.keymap import APP_BINDINGS
from sparkconsole.ui.messages import (
    ActionFinished,
    AgesTicked,
    DeploymentRequested,
    NodeUpdated,
    OpenEngines,
    OpenLogs,
    OpenNode,
    RehearsalRequested,
    ServiceActionRequested,
)
from sparkconsole.ui.screens.confirm import ConfirmScreen
from sparkconsole.ui.screens.help import HelpScreen
from sparkconsole.ui.screens.logs import LogScreen, log_engine
from sparkconsole.ui.screens.node_detail import NodeDetailScreen
from sparkconsole.ui.screens.overview import OverviewScreen
from sparkconsole.ui.screens.quit import QuitScreen

if TYPE_CHECKING:
    from sparkconsole.deploy.runner import Settings
    from sparkconsole.serving.engines import EngineKind

INTERVALS = (0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0)
DEPLOY_SIM_POLL_S = 0.1  # a deployment's job polls on a simulated cluster (its clock runs fast)
STRIP_STYLE = {"up": "green", "stale": "dark_orange", "down": "red"}


def condensed_strip(states: list[NodeState], width: int) -> Text:
    """``● 61 up  ◐ 2 stale  ✖ 1 down: spark-7 spark-19 …``: counts, then who is not up."""
    text = Text()
    counts: dict[NodeStatus, int] = {}
    for state in states:
        counts[state.status] = counts.get(state.status, 0) + 1
    for status in (NodeStatus.UP, NodeStatus.CONNECTING, NodeStatus.STALE, NodeStatus.DOWN):
        if counts.get(status):
            text.append(f" {status.glyph} {counts[status]} {status.value} ",
                        style=STRIP_STYLE.get(status.value, "yellow"))
    trouble = [s for s in states if s.status in (NodeStatus.STALE, NodeStatus.DOWN)]
    if trouble:
        text.append(" ·", style="dim")
    for i, state in enumerate(trouble):
        word = Text(f" {display_text(state.name)}", style=STRIP_STYLE.get(state.status.value, "yellow"))
        more = Text(f" +{len(trouble) - i} more", style="dim")
        if text.cell_len + word.cell_len + (more.cell_len if i < len(trouble) - 1 else 0) > width:
            text.append_text(more)
            break
        text.append_text(word)
    text.truncate(max(width, 0), overflow="ellipsis")
    return text


@dataclass(frozen=True)
class DemoOptions:
    """Run the built-in simulated cluster inside the app's event loop."""

    nodes: int = 2
    scenario: str = "story"
    speed: float = 1.0
    # a deployment runs the sim this much faster (``sparkconsole deploy --demo``'s pace): the story's
    # ~50 simulated minutes in under two; the overview runs at ``speed`` again when it ends
    deploy_speed: float = 40.0
    sim_clock: Any = None  # a sparkconsole.sim clock for tests (manual time)
    read_only: bool = False
    twin: Any = None  # a sparkconsole.deploy.twin.Twin: the cluster is that twin, not a scenario


def _docker_verb(action: str) -> str:
    return "rm" if action == "remove" else action


class NodeCommands(Provider):
    """Palette entries: jump to a node, the overview, pause, refresh. The console's own commands are
    the palette's first list too (:meth:`discover`, before anything is typed), ahead of Textual's."""

    async def discover(self) -> Hits:
        app = cast("SparkConsoleApp", self.app)
        for name, callback, help_text in self._entries(app, discovery=True):
            yield DiscoveryHit(Content(display_text(name)), callback, help=_as_markup(display_text(help_text)))

    async def search(self, query: str) -> Hits:
        app = cast("SparkConsoleApp", self.app)
        matcher = self.matcher(query)
        for name, callback, help_text in self._entries(app):
            # the entries name the nodes' containers, and the palette parses a prompt and its help as
            # markup: cleaned; a prompt markup would change is shown plain (not highlighted), a help
            # that escaping cannot keep as written is left out
            name, help_text = display_text(name), display_text(help_text)
            score = matcher.match(name)
            if score > 0:
                prompt = matcher.highlight(name) if _as_markup(name) == name else Content(name)
                yield Hit(score, prompt, callback, help=_as_markup(help_text))

    @staticmethod
    def _entries(app: SparkConsoleApp, *, discovery: bool = False) -> list[tuple[str, Callable[[], Any], str]]:
        """(prompt, callback, help) of every entry; ``discovery``: the screens and the nodes only (a
        cluster's every container would bury them)."""
        entries: list[tuple[str, Callable[[], Any], str]] = [
            ("Overview", app.action_overview, "Back to every node at a glance"),
            ("Pause / resume polling", app.action_toggle_pause, "Stop or restart the probes"),
            ("Refresh now", app.action_refresh_now, "Poll every node now"),
            ("Memory planner", app.action_planner, "Will a model fit on one Spark or on N? (key m)"),
            ("Deploy a model (wizard)", app.action_wizard,
             "Every step of a deployment, its decisions, and the nodes' memory live (key w)"),
        ]
        for i, node in enumerate(app.config.nodes, start=1):
            entries.append((f"Go to node {node.name}", partial(app.open_node, i), f"{node.role} · key {i}"))
            if discovery:
                continue
            if app.node_state(node.name).engines:
                entries.append((f"Engines on {node.name}", partial(app.open_engines, node.name),
                                "what each engine serves: KV cache, tok/s, latency percentiles (key e on the detail)"))
            sample = app.node_state(node.name).sample
            for c in sample.containers if sample else ():
                if not c.name:
                    continue
                svc = Service(name=c.name, kind="container", state=c.state, image=c.image)
                entries.append((f"Tail log of {c.name} on {node.name}", partial(app.open_logs, node.name, svc),
                                f"docker logs -f {c.name}"))
                for action in svc.actions:
                    entries.append((f"{action.capitalize()} {c.name} on {node.name}",
                                    partial(app.run_service_action, node.name, svc, action),
                                    f"docker {_docker_verb(action)} {c.name} (asks first)"))
        shared: dict[str, list[str]] = {}
        for node in app.config.nodes:
            sample = app.node_state(node.name).sample
            for c in sample.containers if sample else ():
                if c.name:
                    shared.setdefault(c.name, []).append(node.name)
        for container, nodes in shared.items():
            if len(nodes) > 1 and not discovery:
                entries.append((f"Merged log of {container} on {', '.join(nodes)}",
                                partial(app.open_merged_logs, container, nodes), "interleaved by time"))
        return entries


def _as_markup(text: str) -> str | None:
    """Markup that shows exactly ``text``: itself, or escaped, or None where Textual's escape cannot
    say it (it leaves ``[$x]``, a variable, and doubles backslashes only before a tag)."""
    for markup in (text, escape(text)):
        try:
            if Content.from_markup(markup).plain == text:
                return markup
        except Exception:  # MarkupError and its kin: not this way
            continue
    return None


class SparkConsoleApp(App[int]):
    """sparkconsole's main window."""

    CSS_PATH = "sparkconsole.tcss"
    TITLE = "sparkconsole"
    BINDINGS = APP_BINDINGS
    COMMANDS = App.COMMANDS | {NodeCommands}

    def __init__(
        self,
        config: ClusterConfig | None = None,
        *,
        demo: DemoOptions | None = None,
        interval: float = 2.0,
        clock: Callable[[], float] = time.time,
        transport_factory: Callable[[NodeConfig], Transport] | None = None,
        remember_theme: bool = True,
        journal: Journal | None = None,
        autopoll: bool = True,
        serving: bool = True,
    ) -> None:
        super().__init__()
        if config is None and demo is None:
            raise ValueError("a cluster config or demo options are needed")
        self.demo = demo
        self.config: ClusterConfig = config or _placeholder_config(demo)  # replaced once the demo runs
        self.interval = interval
        self.clock = clock
        self.transport_factory = transport_factory
        self.remember_theme = remember_theme
        self.autopoll = autopoll  # tests drive the polls themselves for reproducible screens
        self.serving = serving  # the serving poll: find the nodes' engines, read their /metrics
        self.paused = False
        self.poller: ClusterPoller | None = None
        self._alerts_memo: tuple[tuple, list[Alert]] | None = None
        self._poll_timers: dict[str, Timer] = {}
        self._poll_started: dict[str, float] = {}  # monotonic start of the poll in flight, per node
        self._watchdog_cancelled: set[str] = set()
        self._stack = contextlib.AsyncExitStack()
        self.demo_cluster: Any = None
        self.startup_error: str | None = None
        self.journal = journal or Journal()
        self.debouncer = Debouncer()
        self._controllers: dict[str, ServiceController] = {}
        self.events: deque[tuple[float, str, str]] = deque(maxlen=200)  # (time, severity, text)
        self._last_status: dict[str, NodeStatus] = {}
        self._last_alerts: set[tuple[str, str, str]] = set()  # Alert.key: kind, node, subject

    # ---- life cycle ---------------------------------------------------------------------------

    async def on_mount(self) -> None:
        self._load_theme()
        if self.config.keymap:
            self.set_keymap(dict(self.config.keymap))
        if self.demo is not None:
            from sparkconsole.sim import start_demo_cluster

            kwargs: dict[str, Any] = {"nodes": self.demo.nodes, "scenario": self.demo.scenario,
                                      "speed": self.demo.speed, "read_only": self.demo.read_only,
                                      "twin": self.demo.twin}
            if self.demo.sim_clock is not None:
                kwargs["clock"] = self.demo.sim_clock
            try:
                self.demo_cluster = await self._stack.enter_async_context(start_demo_cluster(**kwargs))
            except Exception as exc:  # a bad scenario, no free port...: one line, not a traceback
                self.startup_error = f"the demo cluster did not start: {exc}"
                self.exit(return_code=2)
                return
            self.config = self.demo_cluster.config
            if self.demo.read_only:
                self.config = replace(self.config, read_only=True)
        self.sub_title = self._subtitle()
        self.poller = ClusterPoller(self.config, interval=self.interval, transport_factory=self.transport_factory,
                                    clock=self.clock, serving=self.serving)
        for p in self.poller.pollers.values():
            p.tick_timeout = max(5.0, 3 * self.interval)
        await self.push_screen(OverviewScreen())
        if self.autopoll:
            for name in self.poller.pollers:
                self.poll_node(name)
        self.set_interval(1.0, self._tick_ages)

    async def on_unmount(self) -> None:
        if self.poller is not None:
            with contextlib.suppress(Exception):
                await self.poller.close()
        with contextlib.suppress(Exception):
            await self._stack.aclose()

    def _subtitle(self) -> str:
        mode = " · READ-ONLY" if self.config.read_only else ""
        demo = (f" · twin of {self.demo.twin.cluster}" if self.demo and self.demo.twin is not None
                else f" · demo: {self.demo.scenario}" if self.demo else "")
        count = len(self.config.nodes)
        return f"{self.config.name} · {count} node{'' if count == 1 else 's'}{demo}{mode}"

    # ---- polling --------------------------------------------------------------------------------

    async def _poll(self, name: str, force: bool = False) -> str:
        assert self.poller is not None
        if force or not self.paused:
            await self.poller.pollers[name].poll_once()
        return name

    def poll_node(self, name: str, force: bool = False) -> None:
        """Start one poll of ``name`` unless one is running (its end arms the next). ``force`` polls
        even while paused (``r``, the refresh after a service action): decided now, not when the
        worker runs."""
        group = f"poll:{name}"
        if any(w.group == group and w.state in (WorkerState.PENDING, WorkerState.RUNNING) for w in self.workers):
            return
        timer = self._poll_timers.pop(name, None)
        if timer is not None:
            timer.stop()
        self._poll_started[name] = time.monotonic()
        self.run_worker(self._poll(name, force), name=group, group=group, exit_on_error=False,
                        description=f"poll {name}")

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """The one place poll workers end (show the result, then arm the next poll), and where
        every other worker's failure reaches the user (screens forward theirs here)."""
        worker = event.worker
        if not worker.group.startswith("poll:"):
            if event.state is WorkerState.ERROR:
                self.worker_failed(worker)
            return
        name = worker.group.split(":", 1)[1]
        if event.state in (WorkerState.SUCCESS, WorkerState.ERROR, WorkerState.CANCELLED):
            self._poll_started.pop(name, None)
        if event.state is WorkerState.CANCELLED:
            if name not in self._watchdog_cancelled:
                return  # the app is closing
            self._watchdog_cancelled.discard(name)
        if event.state is WorkerState.ERROR and self.poller is not None:
            state = self.poller.pollers[name].state
            state.status = NodeStatus.DOWN if state.sample is None else NodeStatus.STALE
            state.reason = f"internal error while polling: {worker.error}"
        if event.state in (WorkerState.SUCCESS, WorkerState.ERROR, WorkerState.CANCELLED):
            self._note_changes(name)
            self._show_node(name)
            if self.is_running and self.autopoll:
                self._poll_timers[name] = self.set_timer(self.interval, partial(self.poll_node, name))

    WORKER_WHAT = {
        "wizard": "the deployment run ended",
        "service-action": "a service action failed",
        "detail-units": "reading the systemd units failed",
        "log-follow": "following the log failed",
    }

    def worker_failed(self, worker: Worker) -> None:
        """The one handler for a worker that raised (not one that stopped at a step: that is its
        result): a notification and a line in the events strip, never silence."""
        error = worker.error
        text = error.message if isinstance(error, UserError) else f"{type(error).__name__}: {error}"
        what = self.WORKER_WHAT.get(worker.group, worker.description or worker.name or "a background task failed")
        title = worker.group or "error"
        self.notify(f"{what}: {text}", title=title, severity="error", timeout=10)
        self.add_event("critical", f"{title}: {what}: {text}")

    def add_event(self, severity: str, text: str) -> None:
        """One line in the events strip. The text often carries a node's words (a reason, a
        service action's stderr, a worker's error): cleaned here, on one line, once for the strip."""
        self.events.append((self.clock(), severity, display_lines(text, " ")))

    def notify(self, message: str, *, title: str = "", severity: Any = "information",
               timeout: float | None = None, markup: bool = True) -> None:
        """Textual's toast, always plain text, cleaned: messages here carry a node's words (a
        service action's result, a worker's error, the wizard's notes) and Textual would parse
        them as markup (``in [/root/.cache/x]`` raises MarkupError and ends the app) and pass
        their escape sequences to the terminal. ``markup`` is ignored: a screen's ``notify``
        passes Textual's default (True) for every message, and no toast here means markup."""
        super().notify(display_lines(message), title=display_text(title), severity=severity, timeout=timeout,
                       markup=False)

    def _note_changes(self, name: str, alerts: list[Alert] | None = None) -> None:
        """Record status transitions and new alerts in the events list."""
        if self.poller is None:
            return
        state = self.poller.pollers[name].state
        before = self._last_status.get(name)
        # The first connection is not news, however long it takes: a node still connecting has no
        # status yet, and its first settled one is an event only when it is bad (down at start).
        # So the strip says the same on a fast laptop and a busy one.
        if state.status is not NodeStatus.CONNECTING or before is not None:
            if state.status is not before and not (before is None and state.status is NodeStatus.UP):
                severity = {"up": "info", "stale": "warning", "down": "critical"}.get(state.status.value, "info")
                self.add_event(severity, f"{name}: {state.status.value}" + ("" if state.status is NodeStatus.UP
                                                                               else f" — {state.reason}"))
            self._last_status[name] = state.status
        for note in state.take_notes():
            self.add_event("warning", f"{name}: {note}")
        # an alert is one event while it lasts: its identity is kind + node + subject, not its
        # text, which carries live numbers (MemAvailable 7.3 GiB, 7.2 GiB, ...)
        current = {a.key: a for a in (self.alerts() if alerts is None else alerts)
                   if a.node in (name, "cluster") and a.kind not in ("stale", "down")}
        for key in sorted(current.keys() - self._last_alerts):
            alert = current[key]
            self.add_event("warning", f"alert {alert.node}: {alert.text}")
        self._last_alerts = {k for k in self._last_alerts if k[1] not in (name, "cluster")} | current.keys()

    def _watching_screens(self) -> list[Screen]:
        """The screen on top, and the one under it while a modal (a question, a confirmation) is
        open: its node panels keep moving behind the modal."""
        stack = self.screen_stack
        if not stack:
            return []
        shown = [stack[-1]]
        if isinstance(stack[-1], ModalScreen) and len(stack) > 1:
            shown.append(stack[-2])
        return shown

    def _show_node(self, name: str) -> None:
        for screen in self._watching_screens():
            screen.post_message(NodeUpdated(name))

    def _tick_ages(self) -> None:
        if self.poller is None:
            return
        now = time.monotonic()
        for name, p in self.poller.pollers.items():
            started = self._poll_started.get(name)
            if started is not None and now - started > p.tick_timeout + 10.0:
                # a poll that outlived its own time budget is stuck somewhere: cancel it, say so,
                # and let its end arm a fresh one
                p.state.status = NodeStatus.STALE if p.state.sample is not None else NodeStatus.DOWN
                p.state.reason = f"probe stuck for {now - started:.0f} s; restarting it"
                self._watchdog_cancelled.add(name)
                self._poll_started.pop(name, None)
                for w in self.workers:
                    if w.group == f"poll:{name}" and not w.is_finished:
                        w.cancel()
            p.refresh_staleness()
        alerts = self.alerts()  # once per tick for every node, not once per node
        for name in self.poller.pollers:
            self._note_changes(name, alerts)
        for screen in self._watching_screens():
            screen.post_message(AgesTicked())

    # ---- data for the screens ------------------------------------------------------------------

    def node_state(self, name: str) -> NodeState:
        if self.poller is None:
            return NodeState(name)
        return self.poller.pollers[name].state

    def states(self) -> list[NodeState]:
        return [] if self.poller is None else self.poller.states

    def alerts(self) -> list[Alert]:
        """The cluster's alerts, as every screen shows them: their texts carry the nodes' words (a
        container's name, a reason, a driver version), so they are cleaned here, where the UI
        takes them, on one line each (:func:`~sparkconsole.logs.follow.display_fields`: a copy
        only when needed)."""
        states = self.states()
        # every node's update and every screen's pass asks; the answer changes only with a state (the
        # samples themselves are in the key: held, so a new one is never taken for the old)
        key = tuple((st.sample, st.status, st.reason, st.failures, tuple(w.reads for w in st.engines.values()))
                    for st in states)
        if self._alerts_memo is not None and self._alerts_memo[0] == key:
            return list(self._alerts_memo[1])
        alerts = [display_fields(a, " ") for a in cluster_alerts(states)]
        self._alerts_memo = (key, alerts)
        return list(alerts)

    def status_strip(self, width: int | None = None) -> Text:
        """Every node with its number and status, then the polling state. When that does not fit in
        ``width`` cells, the nodes condense to counts per status and the names of those not up
        (as many as fit): the strip is one line at any cluster size."""
        tail = Text()
        tail.append("   polling ", style="dim")
        tail.append("paused" if self.paused else f"every {self.interval:g} s", style="bold" if self.paused else "")
        if self.config.read_only:
            tail.append("   READ-ONLY", style="bold red")
        text = Text()
        for i, state in enumerate(self.states(), start=1):
            text.append(f" {i} ", style="reverse")
            text.append(f" {state.status.glyph} {display_text(state.name)} ",  # a node word: cleaned
                        style=STRIP_STYLE.get(state.status.value, "yellow"))
        if width is None or text.cell_len + tail.cell_len <= width:
            return text + tail
        return condensed_strip(self.states(), width - tail.cell_len) + tail

    # ---- actions ---------------------------------------------------------------------------------

    def deployment_running(self) -> bool:
        """A deployment or a teardown runs in this console (the wizard's worker)."""
        return any(w.group == "wizard" and not w.is_finished for w in self.workers)

    async def action_quit(self) -> None:
        """``q``: leave at once, unless a deployment runs: then ask first (its detached work goes on
        on the nodes, the run itself stops with the console)."""
        if not self.deployment_running():
            self.exit()
            return
        if any(isinstance(s, QuitScreen) for s in self.screen_stack):
            return
        self.push_screen(QuitScreen("a deployment"), lambda yes: self.exit() if yes else None)

    def action_help_quit(self) -> None:
        """Ctrl+C (a copy in a text field) says how to quit, in words: Textual's own hint is markup
        that some toasts show as written."""
        keys = [key for key, b in self.active_bindings.items() if b.binding.action in ("quit", "app.quit")]
        if keys:
            shown = " or ".join(dict.fromkeys("Ctrl+" + k[5:].upper() if k.startswith("ctrl+")
                                              else k for k in keys))
            self.notify(f"Press {shown} to quit sparkconsole", title="Do you want to quit?", markup=False)

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            return
        self.push_screen(HelpScreen(self.screen))

    def action_toggle_pause(self) -> None:
        self.paused = not self.paused
        self.notify("polling paused" if self.paused else "polling resumed", timeout=2)
        self._tick_ages()

    def action_refresh_now(self) -> None:
        if self.poller is None:
            return
        for name in self.poller.pollers:
            self.poller.pollers[name].containers_changed()  # a refresh reads the containers too
            self.poll_node(name, force=True)

    def _set_interval(self, value: float) -> None:
        self.interval = value
        if self.poller is not None:
            self.poller.interval = value
            for p in self.poller.pollers.values():
                p.interval = value
                p.tick_timeout = max(5.0, 3 * value)
        self.notify(f"polling every {value:g} s", timeout=2)
        self._tick_ages()

    def action_faster(self) -> None:
        smaller = [i for i in INTERVALS if i < self.interval]
        if smaller:
            self._set_interval(smaller[-1])

    def action_slower(self) -> None:
        larger = [i for i in INTERVALS if i > self.interval]
        if larger:
            self._set_interval(larger[0])

    def open_node(self, index: int) -> None:
        if 1 <= index <= len(self.config.nodes):
            self.open_node_by_name(self.config.nodes[index - 1].name)

    def action_open_node(self, index: int) -> None:
        self.open_node(index)

    def open_node_by_name(self, name: str) -> None:
        while isinstance(self.screen, NodeDetailScreen | HelpScreen):
            self.pop_screen()
        self.push_screen(NodeDetailScreen(name))

    # ---- services and logs -------------------------------------------------------------------

    def controller(self, node: str) -> ServiceController:
        """The node's service controller, on the node's one transport (shared with the probe)."""
        if node not in self._controllers:
            assert self.poller is not None
            self._controllers[node] = ServiceController(
                node, self.poller.pollers[node].transport, read_only=self.config.read_only, journal=self.journal
            )
        return self._controllers[node]

    def run_service_action(self, node: str, service: Service, action: str) -> None:
        """Plan, show, confirm, run and journal one action (debounced; refused read-only)."""
        if not self.debouncer.allow(f"{action}:{node}:{service.name}"):
            return
        self._service_action(node, service, action)

    @work(exit_on_error=False, group="service-action", description="service action")
    async def _service_action(self, node: str, service: Service, action: str) -> None:
        controller = self.controller(node)
        try:
            cmd = controller.plan(action, service)
        except UserError as exc:
            self.notify(exc.message, severity="warning")
            return
        refusal = controller.refusal(cmd)
        if refusal:
            self.notify(refusal, title="read-only", severity="warning")
            return
        if not await self.push_screen_wait(ConfirmScreen(node, service.name, cmd, action=action)):
            self.notify(f"{action} {service.name}: cancelled", timeout=2)
            return
        result = await controller.execute(cmd)
        if self.poller is not None and node in self.poller.pollers:
            self.poller.pollers[node].containers_changed(ticks=4)  # watch it come up or go
        self.notify(result.message, severity=result.severity, title=node)
        self.add_event("info" if result.ok else "critical", result.message)
        self.action_refresh_now()
        for screen in self._watching_screens():
            screen.post_message(ActionFinished(node, result.ok, result.message))

    def on_open_node(self, message: OpenNode) -> None:
        self.open_node_by_name(message.node)

    def on_open_logs(self, message: OpenLogs) -> None:
        self.open_logs(message.node, message.service)

    def on_open_engines(self, message: OpenEngines) -> None:
        self.open_engines(message.node, message.where)

    def open_engines(self, node: str, where: str | None = None) -> None:
        """The engine view of ``node``, focused on the engine ``where`` runs. A merged log names several
        nodes ("a + b"): the first that runs an engine in ``where``. Opened from a log screen that an
        engine view opened, it goes back to that view rather than stacking another."""
        from sparkconsole.ui.screens.engines import EngineScreen

        if self.poller is None:
            return
        names = [n for n in node.split(" + ") if n in self.poller.pollers]
        if not names:
            self.notify(f"no node called {node}", severity="warning")
            return
        node = next((n for n in names if any(w.engine.where == where for w in self.node_state(n).engines.values())),
                    names[0])
        stack = self.screen_stack
        if len(stack) > 1 and isinstance(stack[-2], EngineScreen) and stack[-2].node == node:
            self.pop_screen()
            return
        if isinstance(self.screen, EngineScreen) and self.screen.node == node:
            return
        self.push_screen(EngineScreen(node, where))

    def on_service_action_requested(self, message: ServiceActionRequested) -> None:
        self.run_service_action(message.node, message.service, message.action)

    def open_logs(self, node: str, service: Service) -> None:
        assert self.poller is not None
        transport = self.poller.pollers[node].transport
        command = docker_follow(service.name) if service.kind == "container" else journal_follow(service.name)
        start = None
        engine = self._log_engine(service.name, [node], service.image) if service.kind == "container" else None
        if engine is not None:
            async def start() -> str:  # the engine's first lines: its settings and memory figures
                res = await transport.run(docker_log_head(service.name), timeout=30)
                return res.stdout
        self.push_screen(LogScreen(node, service.name, lambda: LogFollower(transport, command),
                                   tracker=engine.log_tracker if engine is not None else None, start_reader=start))

    def open_merged_logs(self, container: str, nodes: list[str]) -> None:
        """One deployment's logs on several nodes (head and workers), interleaved by time."""
        assert self.poller is not None
        transports = {n: self.poller.pollers[n].transport for n in nodes}

        def factory():
            return merge_by_time([LogFollower(t, docker_follow(container), source=n) for n, t in transports.items()])

        engine = self._log_engine(container, nodes)
        self.push_screen(LogScreen(" + ".join(nodes), container, factory,
                                   tracker=engine.log_tracker if engine is not None else None))

    def _log_engine(self, container: str, nodes: list[str], image: str | None = None) -> EngineKind | None:
        """The engine whose log ``container``'s is on ``nodes``: the one the probe found running in it,
        else the one its image names (the image the nodes' samples list, unless given)."""
        states = [self.node_state(n) for n in nodes]
        running = next((w.engine.engine for st in states for w in st.engines.values() if w.engine.where == container),
                       None)
        if image is None:
            image = next((c.image for st in states for c in (st.sample.containers if st.sample else ())
                          if c.name == container and c.image), None)
        return log_engine(image, running)

    def action_planner(self) -> None:
        from sparkconsole.ui.screens.planner import PlannerScreen

        if not isinstance(self.screen, PlannerScreen):
            self.push_screen(PlannerScreen())

    def action_wizard(self) -> None:
        """The deployment wizard. One screen, kept installed: leaving it (Esc) and coming back shows the
        same run, which goes on meanwhile."""
        from sparkconsole.ui.screens.wizard import WizardScreen

        if not self.is_screen_installed("wizard"):
            self.install_screen(WizardScreen(), "wizard")
        if self.get_screen("wizard") in self.screen_stack:
            return  # under a help or a decision: those close first
        self.push_screen("wizard")

    # ---- deployments (the wizard asks, the session opener wires) ---------------------------------

    def deployment_settings(self) -> Settings:
        """How a deployment paces itself on this cluster: on a simulated one the runner's clock must
        be the sim's, or every timeout is off by its speed (the demo run inside the console, or a
        running demo reached by --config, whose inventory says its ``time_scale``)."""
        from sparkconsole.deploy.runner import Settings

        if self.demo is not None:
            return Settings(poll_s=DEPLOY_SIM_POLL_S, speed=self.demo_speed())
        scale = float(self.config.time_scale)
        return Settings(poll_s=DEPLOY_SIM_POLL_S, speed=scale) if scale != 1.0 else Settings()

    def demo_speed(self) -> float:
        """Simulated seconds per wall second of the demo's clock now (1 outside a demo)."""
        if self.demo is None:
            return 1.0
        clock = self.demo_cluster.clock if self.demo_cluster is not None else None
        return float(clock.speed) if clock is not None else float(self.demo.speed)

    def _demo_pace(self, deploying: bool) -> None:
        """The demo's clock at the deployment's pace while one runs, at the overview's after. A test's
        manual clock is left alone (it moves only when told)."""
        clock = self.demo_cluster.clock if self.demo is not None and self.demo_cluster is not None else None
        if clock is None or clock.manual:
            return
        clock.set_speed(max(self.demo.speed, self.demo.deploy_speed) if deploying else self.demo.speed)

    @property
    def private_cluster(self) -> bool:
        """The cluster runs inside this console (the demo): no other process can reach it, so no
        earlier deployment of it exists and it takes no cluster lock."""
        return self.demo is not None

    def on_deployment_requested(self, request: DeploymentRequested) -> None:
        """A deployment runs as a worker of the app (group ``wizard``, exclusive), not of the screen, so
        it goes on when the operator leaves the wizard; its failures end in :meth:`worker_failed`."""
        what = "teardown" if request.teardown else "deployment"
        self.run_worker(self._deployment(request), group="wizard", exclusive=True, exit_on_error=False,
                        description=f"{what} {request.state.id}")

    async def _deployment(self, request: DeploymentRequested) -> None:
        """Open the deployment as ``sparkconsole deploy`` does (lock, transports, runner, flow), walk
        it, say the end. Read-only consoles plan and show every step: nothing that changes a node is
        sent, and planning takes no lock."""
        from sparkconsole.deploy.opening import open_deployment
        from sparkconsole.deploy.session import run_flow, run_teardown
        from sparkconsole.deploy.state import StateStore

        read_only = bool(self.config.read_only)
        self._demo_pace(True)
        request.on_state(True, "")
        try:
            async with open_deployment(
                    self.config, request.options, request.state, answer=request.answer, emit=request.emit,
                    confirm=request.confirm, settings=self.deployment_settings(), journal=self.journal,
                    store=StateStore(), read_only=read_only, plan_only=read_only,
                    transport_factory=self.transport_factory, lock=not self.private_cluster,
                    on_note=lambda text: self.notify(text, title="wizard", severity="warning", timeout=8)) as session:
                if request.teardown:
                    outcome = await run_teardown(session.flow)
                else:
                    outcome = await run_flow(session.flow, until=request.until, on_plan=request.on_plan)
            request.emit(outcome.result)
        except Exception as exc:
            request.on_state(False, exc.message if isinstance(exc, UserError) else f"{type(exc).__name__}: {exc}")
            raise  # worker_failed says it
        else:
            request.on_state(False, "")
        finally:
            self._demo_pace(False)

    def on_rehearsal_requested(self, request: RehearsalRequested) -> None:
        """The rehearsal runs as a worker of the app (group ``rehearsal``); its failures end in
        :meth:`worker_failed`, like every other worker's."""
        self.run_worker(self._rehearsal(request), group="rehearsal", exclusive=True, exit_on_error=False,
                        description="rehearsal")

    async def _rehearsal(self, request: RehearsalRequested) -> None:
        """Read the nodes without changing them, write the twin, run the flow on it, show the report
        (:mod:`sparkconsole.deploy.rehearsal`, as ``sparkconsole deploy --rehearse`` does)."""
        from sparkconsole.deploy.rehearsal import format_report, rehearse_cluster
        from sparkconsole.ui.screens.rehearsal import RehearsalScreen

        self.notify("reading the nodes without changing anything, then the whole deployment on their twin …",
                    title="rehearsal", timeout=6)
        r, path, report = await rehearse_cluster(self.config, request.options, {}, journal=self.journal,
                                                 transport_factory=self.transport_factory)
        self.push_screen(RehearsalScreen(format_report(r), str(path), str(report)))

    def action_overview(self) -> None:
        while len(self.screen_stack) > 2:
            self.pop_screen()

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Help", "Show the keys for this screen", self.action_help)

    # ---- theme, remembered between runs ---------------------------------------------------------

    def _theme_file(self):
        return state_dir() / "ui.json"

    def _load_theme(self) -> None:
        if not self.remember_theme:
            return
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            theme = json.loads(self._theme_file().read_text())["theme"]
            if theme in self.available_themes:
                self.theme = theme
        self.theme_changed_signal.subscribe(self, self._save_theme)

    def _save_theme(self, theme: Any) -> None:
        with contextlib.suppress(OSError):
            path = self._theme_file()
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"theme": theme.name}))


def _placeholder_config(demo: DemoOptions | None) -> ClusterConfig:
    n = demo.nodes if demo else 1
    names = ["spark-1a32", "spark-5be3"] + [f"spark-{i}" for i in range(3, n + 1)]
    nodes = tuple(NodeConfig(name=names[i], host="127.0.0.1", role="head" if i == 0 else "worker") for i in range(n))
    return ClusterConfig(nodes=nodes, name="demo")


def run_console(config: ClusterConfig | None = None, *, demo: DemoOptions | None = None,
                interval: float = 2.0, serving: bool = True) -> int:
    """Run the console until the user quits; returns the exit code. ``serving=False`` turns the
    serving poll off (no engine discovery, no /metrics reads)."""
    app = SparkConsoleApp(config, demo=demo, interval=interval, serving=serving)
    result = app.run()
    if app.startup_error:
        from sparkconsole.errors import UserError

        raise UserError(app.startup_error)
    if app.return_code:
        return app.return_code
    return int(result or 0)
