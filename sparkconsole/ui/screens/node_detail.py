"""One node in full: links, containers, GPU processes, disk and versions."""

from __future__ import annotations

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.coordinate import Coordinate
from textual.widgets import DataTable, Footer, Header, Input, Static

from sparkconsole.probe.samples import NodeSample
from sparkconsole.probe.state import NodeState
from sparkconsole.services import Service, services_from_containers
from sparkconsole.ui.keymap import DETAIL_BINDINGS
from sparkconsole.ui.messages import ActionFinished, OpenEngines, OpenLogs, ServiceActionRequested
from sparkconsole.ui.render import DASH, fmt, gib, node_str, node_text, thin_scrollbars
from sparkconsole.ui.screens.live import LiveScreen
from sparkconsole.ui.widgets.node_card import card_renderable


def _cpu(value: float | None) -> str:
    return fmt(value, " %", 1)


def sync_table(table: DataTable, rows: list[tuple[str, tuple]]) -> None:
    """Show ``rows`` (key, cells) in ``table`` without clearing it when it need not be: the same
    keys in the same order update the cells that changed, so the cursor and the scroll stay. When
    the rows themselves change, the table is rebuilt and the cursor goes back to its row's key.

    Every ``str`` cell becomes plain Text here, the one way into the node's tables: a DataTable
    parses a ``str`` cell as markup, and the cells are the node's words (a process named
    ``in [/root/.cache/x]`` raised MarkupError and ended the app; one holding ESC reached the
    terminal)."""
    rows = [(key, tuple(node_text(c) if isinstance(c, str) else c for c in cells)) for key, cells in rows]
    current = [row_key.value for row_key in table.rows]
    if current == [key for key, _ in rows]:
        for r, (_, cells) in enumerate(rows):
            old = table.get_row_at(r)
            for c, value in enumerate(cells):
                if str(old[c]) != str(value) or type(old[c]) is not type(value) or (
                        isinstance(value, Text) and value.style != old[c].style):
                    table.update_cell_at(Coordinate(r, c), value)
        return
    selected = current[table.cursor_row] if 0 <= table.cursor_row < len(current) else None
    scroll = table.scroll_offset
    table.clear()
    for key, cells in rows:
        table.add_row(*cells, key=key)
    keys = [key for key, _ in rows]
    if selected in keys:
        table.move_cursor(row=keys.index(selected), scroll=False)
    table.scroll_to(scroll.x, scroll.y, animate=False, immediate=True)


def gpu_reading(state: NodeState | None) -> str:
    """How the probe reads the GPU (docs/watching.md): streaming from its long-lived readers, or one
    ``nvidia-smi`` per tick where they are not available; restarts counted."""
    readers = state.readers if state is not None else {}
    if not readers:
        return DASH
    kinds = {r.state for r in readers.values()}
    how = "one nvidia-smi per tick" if kinds == {"oneshot"} else (
        "streaming, partly one-shot" if "oneshot" in kinds else "streaming (nvidia-smi -lms)")
    restarts = sum(r.restarts for r in readers.values())
    return how + (f" · restarted {restarts}×" if restarts else "")


class _CardAt:
    """The node's card built at the width Rich gives it (the box's content width): the memory bar
    and the sparklines follow the box instead of wrapping in a narrow one."""

    def __init__(self, state: NodeState, role: str, now: float, alerts: list) -> None:
        self.args = (state, role, now, alerts)

    def __rich_console__(self, console, options):
        yield card_renderable(*self.args, options.max_width)


class DetailTable(DataTable):
    """A table of the detail that pages the whole detail, not itself: its rows are few (each table
    shows at most 14), and the card above them must be reachable from the keyboard. PageUp/PageDown
    page the detail, Home/End go to its top/bottom (and the first/last row), Up on the first row
    scrolls the detail up."""

    def _detail(self) -> VerticalScroll:
        return self.screen.query_one("#detail", VerticalScroll)

    def action_page_up(self) -> None:
        self._detail().scroll_page_up(animate=False)

    def action_page_down(self) -> None:
        self._detail().scroll_page_down(animate=False)

    def action_scroll_home(self) -> None:
        if self.row_count:
            self.move_cursor(row=0, scroll=False)
        self._detail().scroll_home(animate=False)

    def action_scroll_end(self) -> None:
        if self.row_count:
            self.move_cursor(row=self.row_count - 1, scroll=False)
        self._detail().scroll_end(animate=False)

    def action_cursor_up(self) -> None:
        if self.cursor_row <= 0:
            self._detail().scroll_page_up(animate=False)
            return
        super().action_cursor_up()


NARROW = 110  # below this width the card and the facts stand one above the other


class NodeDetailScreen(LiveScreen):
    """Everything about one node. ``/`` filters the containers; Esc goes back."""

    BINDINGS = DETAIL_BINDINGS
    HELP = ("One node in full. Pick a service in the table: l follows its log, s stops, S starts, "
            "R restarts (each asks first). e shows the engines the node serves (the selected service's "
            "first). / filters, Esc returns to the overview.")

    def __init__(self, node: str) -> None:
        super().__init__(name=f"node:{node}")
        self.node = node
        self.filter_text = ""
        self.units: list[Service] = []  # configured systemd units, read on open and after actions

    def compose(self) -> ComposeResult:
        yield Header()
        with VerticalScroll(id="detail"):
            with Horizontal(id="detail-top"):
                yield Static(id="detail-card")
                yield Static(id="detail-info")
            yield Static("ConnectX-7 links", classes="section-title")
            yield DetailTable(id="links-table", cursor_type="row", zebra_stripes=True)
            yield Static("Services  (l logs · s stop · S start · R restart · D remove)", classes="section-title")
            yield Input(placeholder="filter services (name or image)…", id="container-filter")
            yield DetailTable(id="containers-table", cursor_type="row", zebra_stripes=True)
            yield Static("GPU processes", classes="section-title")
            yield DetailTable(id="gpu-procs-table", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        self.title = f"sparkconsole — {node_str(self.node)}"  # the header shows it as is: cleaned here
        self.query_one("#links-table", DataTable).add_columns("RDMA device", "port", "netdev", "state", "rate",
                                                              "IPv4", "MTU", "carrier")
        self.query_one("#containers-table", DataTable).add_columns("name", "kind", "image", "state", "status",
                                                                   "CPU", "memory")
        self.query_one("#gpu-procs-table", DataTable).add_columns("pid", "process", "GPU memory")
        self.query_one("#container-filter", Input).display = False
        thin_scrollbars(self.query_one("#detail", VerticalScroll))
        self._layout(self.size.width)
        self.mark_ready()
        # focused without scrolling to it: the detail opens at its top, on the node's card
        self.query_one("#containers-table", DataTable).focus(scroll_visible=False)
        if self.sc.config.services:
            self.load_units()

    def on_resize(self, event) -> None:
        self._layout(event.size.width)

    def _layout(self, width: int) -> None:
        self.set_class(width < NARROW, "-narrow")

    @work(exclusive=True, group="detail-units", exit_on_error=False)
    async def load_units(self) -> None:
        controller = self.sc.controller(self.node)
        self.units = await controller.unit_states(self.sc.config.services)
        self._fill_containers(self.sc.node_state(self.node).sample)

    def draw_node(self, name: str) -> None:
        if name == self.node:
            self.draw()

    def draw(self) -> None:
        app = self.sc
        state: NodeState = app.node_state(self.node)
        role = app.config.node(self.node).role
        alerts = [a for a in app.alerts() if a.node == self.node]
        self.query_one("#detail-card", Static).update(_CardAt(state, role, app.clock(), alerts))
        sample = state.sample
        self.query_one("#detail-info", Static).update(self._info(sample, state))
        self._fill_links(sample)
        self._fill_containers(sample)
        self._fill_procs(sample)

    def _info(self, sample: NodeSample | None, state: NodeState | None = None) -> Text:
        text = Text()
        if sample is None:
            return text
        host = sample.host
        disk = sample.disk
        rows = [
            ("hostname", host.hostname or DASH),
            ("kernel", host.kernel or DASH),
            ("arch", host.arch or DASH),
            ("CPUs", fmt(host.cpu_count)),
            ("load", fmt(host.load1, "", 2)),
            ("uptime", DASH if host.uptime_s is None else f"{host.uptime_s / 3600:.1f} h"),
            ("driver", sample.driver_version or DASH),
            ("CUDA", sample.cuda_version or DASH),
            ("Docker", host.docker_version or DASH),
            ("disk /", DASH if disk is None else f"{gib(disk.used_bytes, 0)} / {gib(disk.total_bytes, 0)} GiB used"),
            ("Ray", DASH if sample.ray is None else
             f"{sample.ray.active_nodes} nodes · GPU {fmt(sample.ray.gpus_used, '', 1)}/{fmt(sample.ray.gpus_total, '', 1)}"),
            ("probe", fmt(sample.probe_ms, " ms", 1)),
            ("GPU read", gpu_reading(state)),
        ]
        for key, value in rows:
            text.append(f"{key:<9}", style="dim")
            text.append(f"{node_str(value)}\n")
        if sample.unknown:
            text.append("\nnot read\n", style="bold")
            said: set[str] = set()
            for key, reason in sample.unknown.items():
                if reason in said:  # the table and the query often give the same reason
                    continue
                said.add(reason)
                text.append(f"{node_str(key)}: ", style="dim")
                text.append(f"{node_str(reason)}\n")
        return text

    def _fill_links(self, sample: NodeSample | None) -> None:
        rows = []
        for link in sample.links if sample else ():
            state = node_text(link.state or DASH, "green" if link.state == "up" else "red")
            rows.append((f"{link.rdma_device}:{link.port}", (
                link.rdma_device, fmt(link.port), link.netdev or DASH, state, fmt(link.rate_gbps, " Gb/s"),
                ", ".join(link.ipv4) or DASH, fmt(link.mtu),
                DASH if link.carrier is None else ("yes" if link.carrier else "no"))))
        sync_table(self.query_one("#links-table", DataTable), rows)

    def services(self) -> list[Service]:
        sample = self.sc.node_state(self.node).sample
        return [*services_from_containers(sample.containers if sample else ()), *self.units]

    def _fill_containers(self, sample: NodeSample | None) -> None:
        needle = self.filter_text.lower()
        stats = {c.name: c for c in (sample.containers if sample else ())}
        rows: list[tuple[str, tuple]] = []
        for svc in self.services():
            if needle and needle not in svc.name.lower() and needle not in (svc.image or "").lower():
                continue
            style = {"running": "green", "active": "green", "restarting": "dark_orange", "exited": "dim",
                     "failed": "red"}.get(svc.state or "", "")
            c = stats.get(svc.name) if svc.kind == "container" else None
            rows.append((f"{svc.kind}:{svc.name}", (
                svc.name, svc.kind, svc.image or DASH, node_text(svc.state or DASH, style),
                svc.detail or svc.reason or DASH, _cpu(c.cpu_pct if c else None),
                DASH if c is None or c.mem_used_bytes is None else f"{gib(c.mem_used_bytes)} GiB")))
        sync_table(self.query_one("#containers-table", DataTable), rows)

    def selected_service(self) -> Service | None:
        table = self.query_one("#containers-table", DataTable)
        if table.row_count == 0:
            return None
        try:
            key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        except Exception:
            return None
        return next((s for s in self.services() if f"{s.kind}:{s.name}" == key), None)

    def action_service(self, action: str) -> None:
        svc = self.selected_service()
        if svc is None:
            self.notify("no service selected", severity="warning")
            return
        self.post_message(ServiceActionRequested(self.node, svc, action))

    def action_logs(self) -> None:
        svc = self.selected_service()
        if svc is None:
            self.notify("no service selected", severity="warning")
            return
        self.post_message(OpenLogs(self.node, svc))

    def action_engines(self) -> None:
        svc = self.selected_service()
        self.post_message(OpenEngines(self.node, svc.name if svc is not None and svc.kind == "container" else None))

    def on_action_finished(self, message: ActionFinished) -> None:
        """A service changed: read the systemd units again (the containers come with the next poll)."""
        if message.node == self.node and self.sc.config.services:
            self.load_units()

    def _fill_procs(self, sample: NodeSample | None) -> None:
        rows = [(f"{p.pid}:{p.name}", (fmt(p.pid), p.name or DASH, fmt(p.memory_mib, " MiB")))
                for p in (sample.gpu_processes if sample else ())]
        sync_table(self.query_one("#gpu-procs-table", DataTable), rows)

    def action_back(self) -> None:
        box = self.query_one("#container-filter", Input)
        if box.has_focus:
            box.display = False
            self.query_one("#containers-table", DataTable).focus()
            return
        self.app.pop_screen()

    def action_filter(self) -> None:
        box = self.query_one("#container-filter", Input)
        box.display = True
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "container-filter":
            self.query_one("#containers-table", DataTable).focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "container-filter":
            self.filter_text = event.value
            self._fill_containers(self.sc.node_state(self.node).sample)
