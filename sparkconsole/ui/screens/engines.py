"""The engine view: every engine one node serves (vLLM, SGLang), one panel each (issue 24).

Opened with ``e`` from the node's detail and ``E`` from a log screen (the container's own engine is
focused). Each panel shows what the serving poll read from the engine's ``/metrics``: model, kind,
version, where it runs, whether it answers; running and waiting requests; the KV cache; prompt and
generation tok/s with the generation sparkline; TTFT and ITL p50/p95 over one and five minutes;
queue time; end-to-end p50; prefix-cache hits; preemptions; and the engine's alerts.

It redraws when the app says the node changed (:class:`~sparkconsole.ui.messages.NodeUpdated`), and
a panel only when its engine was read again (:func:`~sparkconsole.ui.widgets.serving.engine_key`).
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Grid, VerticalScroll
from textual.widgets import Footer, Header, Static

from sparkconsole.probe.alerts import Alert
from sparkconsole.probe.state import NodeStatus
from sparkconsole.services import Service
from sparkconsole.serving.watch import EngineWatch
from sparkconsole.ui.keymap import ENGINE_BINDINGS
from sparkconsole.ui.messages import OpenLogs
from sparkconsole.ui.render import node_str, thin_scrollbars
from sparkconsole.ui.screens.live import LiveScreen
from sparkconsole.ui.widgets.lines import RenderedLines
from sparkconsole.ui.widgets.node_card import renderable_text
from sparkconsole.ui.widgets.serving import (
    SIDE_BY_SIDE_AT,
    engine_key,
    engine_panel,
    kind_name,
    short_model,
)

# the screen's width from which the panels go two by two: each still wide enough for its figures
# beside its latencies (a border and padding of 4, the grid's padding and gutter of 3)
TWO_COLUMNS_AT = 2 * (SIDE_BY_SIDE_AT + 4) + 3


def engine_alerts_for(alerts: list[Alert], node: str, port: int) -> list[Alert]:
    return [a for a in alerts if a.node == node and a.kind.startswith("engine-") and a.subject == str(port)]


class EnginePanel(RenderedLines, can_focus=True):
    """One engine, drawn through the line API; drawn again only when its engine was read again."""

    def __init__(self, node: str, port: int) -> None:
        super().__init__(id=f"engine-{port}", classes="engine-panel")
        self.node = node
        self.port = port
        self.watch: EngineWatch | None = None
        self.alerts: list[Alert] = []
        self._key: tuple | None = None
        self.draws = 0

    def show(self, watch: EngineWatch, alerts: list[Alert]) -> None:
        key = (engine_key(watch), tuple((a.severity, a.text) for a in alerts))
        if key == self._key:
            return
        self._key = key
        self.draws += 1
        self.watch, self.alerts = watch, alerts
        f = watch.figures()
        kind = kind_name(f.kind)
        # a str title is markup: the model's name is the node's words, so Text
        self.border_title = Text(f"{short_model(f.model) or kind} :{f.port}")
        self.border_subtitle = Text("answering" if f.answering else ("silent" if watch.silent else "not read"))
        self.set_class(watch.silent, "-silent")
        self.show_renderable(_PanelAt(self))

    def plain_text(self, width: int = 100) -> str:
        if self.watch is None:
            return ""
        return renderable_text(engine_panel(self.watch, self.alerts, width), width)


class _PanelAt:
    """The panel's renderable at the width Rich renders it (the panel's content width)."""

    def __init__(self, panel: EnginePanel) -> None:
        self.panel = panel

    def __rich_console__(self, console, options):
        p = self.panel
        assert p.watch is not None
        yield engine_panel(p.watch, p.alerts, options.max_width)


class EngineScreen(LiveScreen):
    """The engines of one node. ``where`` names the engine to focus (a container, a host pid)."""

    BINDINGS = ENGINE_BINDINGS
    HELP = ("The engines this node serves, one panel each, read from their /metrics every few polls: "
            "requests, KV cache, tok/s, latency percentiles over 1 and 5 minutes, prefix-cache hits, "
            "preemptions. j/k move between engines, l follows the focused engine's log, Esc goes back.")

    def __init__(self, node: str, where: str | None = None) -> None:
        super().__init__(name=f"engines:{node}")
        self.node = node
        self.where = where
        self._focused_once = False
        self._title_key: tuple | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="engines-title")
        with VerticalScroll(id="engines-scroll"):
            yield Grid(id="engines-grid")
        yield Footer()

    def on_mount(self) -> None:
        self.title = f"sparkconsole — {self.node} — engines"
        thin_scrollbars(self.query_one("#engines-scroll", VerticalScroll))
        self._columns(self.size.width)
        self.mark_ready()

    def on_resize(self, event) -> None:
        self._columns(event.size.width)

    def _columns(self, width: int) -> None:
        grid = self.query_one("#engines-grid", Grid)
        panels = len(self.panels())
        grid.styles.grid_size_columns = 2 if width >= TWO_COLUMNS_AT and panels > 1 else 1

    def panels(self) -> list[EnginePanel]:
        return list(self.query(EnginePanel))

    def panel(self, port: int) -> EnginePanel | None:
        return next((p for p in self.panels() if p.port == port), None)

    # ---- drawing ---------------------------------------------------------------------------------

    def draw_node(self, name: str) -> None:
        if name == self.node:
            self.draw()

    def draw(self) -> None:
        app = self.sc
        state = app.node_state(self.node)
        engines = dict(sorted(state.engines.items()))
        self._title(state.status, len(engines))
        grid = self.query_one("#engines-grid", Grid)
        have = {p.port: p for p in self.panels()}
        if list(have) != list(engines):
            for port, p in have.items():
                if port not in engines:
                    p.remove()
            kept = sorted(port for port in have if port in engines)
            for port in engines:
                if port in have:
                    continue
                after = next((have[k] for k in kept if k > port), None)
                grid.mount(EnginePanel(self.node, port), before=after)
            self._columns(self.size.width)
            self.call_after_refresh(self.refresh_all)  # new panels draw once laid out
        alerts = app.alerts()
        for port, watch in engines.items():
            p = have.get(port) or self.panel(port)
            if p is not None and p.is_attached:
                p.show(watch, engine_alerts_for(alerts, self.node, port))
        if not self._focused_once and engines:
            target = next((p for p in self.panels() if p.is_attached and p.port in engines
                           and engines[p.port].engine.where == self.where), None)
            target = target or next((p for p in self.panels() if p.is_attached), None)
            if target is not None:
                self._focused_once = True
                target.focus()
                self.call_after_refresh(target.scroll_visible, animate=False)

    def _title(self, status: NodeStatus, count: int) -> None:
        app = self.sc
        serving = app.serving
        key = (status, count, serving)
        if key == self._title_key:
            return
        self._title_key = key
        text = Text()
        text.append(node_str(self.node), style="bold cyan")
        if not serving:
            text.append(" · the serving poll is off (--no-serving): no engines are looked for", style="dim")
        elif count:
            text.append(f" · {count} engine{'' if count == 1 else 's'} · /metrics read every few polls "
                        "· — is a figure not read yet", style="dim")
        else:
            text.append(" · no engine found: vLLM and SGLang servers are found by their command line",
                        style="dim")
        if status is not NodeStatus.UP:
            text.append(f" · node {status.value}", style="dark_orange")
        self.query_one("#engines-title", Static).update(text)

    def title_text(self) -> str:
        return str(self.query_one("#engines-title", Static).render())

    # ---- keys --------------------------------------------------------------------------------------

    def action_back(self) -> None:
        self.app.pop_screen()

    def action_move(self, step: int) -> None:
        panels = [p for p in self.panels() if p.is_attached]
        if not panels:
            return
        focused = self.focused
        i = panels.index(focused) if isinstance(focused, EnginePanel) and focused in panels else -step
        target = panels[(i + step) % len(panels)]
        target.focus()
        target.scroll_visible(animate=False)

    def action_logs(self) -> None:
        focused = self.focused
        if not isinstance(focused, EnginePanel) or focused.watch is None:
            self.notify("no engine focused", severity="warning")
            return
        engine = focused.watch.engine
        if engine.on_host:
            self.notify(f"{engine.kind} on :{engine.port} runs on the host (pid {node_str(engine.where)}): no container log",
                        severity="warning")
            return
        self.post_message(OpenLogs(self.node, Service(name=engine.where, kind="container", state="running",
                                                      image=engine.image)))
