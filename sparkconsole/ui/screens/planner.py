"""The planner panel: will a model fit, on one Spark (TP=1) or on N (TP=N), side by side.

Push it from anywhere (the deployment wizard uses it too)::

    app.push_screen(PlannerScreen("Qwen/Qwen3.5-122B-A10B-FP8"))

The form holds the model id, ``--max-model-len``, ``gpu_memory_utilization``, the KV-cache dtype
and N (default: the number of nodes in the app's cluster, else 2). The table is
:func:`sparkconsole.planner.plan.compare_tp` for TP=1 and TP=N; below it, each column's verdict in
plain words, the cheapest way out first when it does not fit.

Node memory: the smallest live ``MemTotal`` when the app has samples (``app.states()``, read
defensively), else the given ``node_memory_gib``, else the contract default (121.69 GiB). The
line under the form says which. The computation (spec resolution may reach the Hugging Face Hub)
runs in a thread worker with ``exit_on_error=False``; any error is one line in the panel.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any

from rich.table import Table
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Label, Select, Static
from textual.worker import Worker, WorkerState

from sparkconsole.errors import UserError
from sparkconsole.planner import budget as bud
from sparkconsole.planner.live import LiveMemory, memory_from_states
from sparkconsole.planner.plan import PlanOptions, compare_tp, plan


def app_live_memory(app: object) -> LiveMemory | None:
    """The app's live samples as node memory (the smallest MemTotal), when it has any (read
    defensively: a screen pushed on a bare app has none)."""
    states_fn = getattr(app, "states", None)
    if not callable(states_fn):
        return None
    try:
        states = list(states_fn() or [])
    except Exception:
        return None
    if not states:
        return None
    live = memory_from_states(states)
    return live if live.gib is not None else None


DEFAULT_MODEL = "Qwen/Qwen3.5-122B-A10B-FP8"
MIB = float(1 << 20)

PLANNER_BINDINGS: list[Binding] = [
    Binding("escape", "back", "Back", id="planner.back", tooltip="Close the planner and go back."),
    Binding("ctrl+r", "recompute", "Recompute", id="planner.recompute",
            tooltip="Plan again with the values in the form (Enter in a field does the same)."),
]

# (row label, formatter of one compare_tp row)
_ROWS: list[tuple[str, Any]] = [
    ("weights / node", lambda r: f"{r['weights_gib_per_node']:.2f} GiB"),
    ("KV budget / node", lambda r: f"{r['kv_cache_gib_per_node']:.2f} GiB"),
    ("KV bytes / token", lambda r: f"{r['kv_bytes_per_token_per_node']:,} B"),
    ("state / request", lambda r: (f"{r['state_bytes_per_request_per_node'] / MIB:.1f} MiB"
                                   if r["state_bytes_per_request_per_node"] else "—")),
    ("block size", lambda r: f"{r['block_size_tokens']:,} tokens"),
    ("num blocks", lambda r: f"{r['num_blocks']:,} ({r['blocks_per_request']:,} per request)"),
    ("max concurrency", lambda r: f"{r['max_concurrency']:.2f}x at {r['max_model_len']:,} tokens"),
    ("KV tokens", lambda r: f"{r['kv_cache_tokens']:,}"),
]


@dataclass
class PlannerResult:
    """What one computation produced (the tests and the wizard read it)."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    ways_out: dict[int, list[str]] = field(default_factory=dict)
    memory_gib: float = bud.DEFAULT_NODE_MEMORY_GIB
    memory_source: str = ""
    error: str | None = None


def fits_text(fits: bool | None) -> Text:
    if fits is True:
        return Text("✔ fits", style="bold green")
    if fits is False:
        return Text("✖ does not fit", style="bold red")
    return Text("✖ error", style="bold red")


class PlannerScreen(Screen[None]):
    """TP=1 vs TP=N for one model, with the reasons and the cheapest way out."""

    HELP = ("Will this model fit? Edit the model id, context length, gpu_memory_utilization, KV-cache "
            "dtype or N and press Enter (or ctrl+r): TP=1 and TP=N are planned with vLLM's own "
            "arithmetic, side by side. Node memory is the smallest live node's MemTotal when the "
            "console has samples, else 121.69 GiB. Esc goes back.")

    BINDINGS = PLANNER_BINDINGS

    DEFAULT_CSS = """
    PlannerScreen { layout: vertical; }
    PlannerScreen #planner-form { height: auto; padding: 0 1; }
    PlannerScreen .planner-field { width: auto; height: auto; margin-right: 2; }
    PlannerScreen .planner-field Label { color: $text-muted; }
    PlannerScreen #planner-model { width: 46; }
    PlannerScreen #planner-mml { width: 16; }
    PlannerScreen #planner-gmu { width: 10; }
    PlannerScreen #planner-kv { width: 14; }
    PlannerScreen #planner-tp { width: 8; }
    PlannerScreen #planner-memory { padding: 0 1; color: $text-muted; height: 1; }
    PlannerScreen #planner-status { padding: 0 1; height: 1; }
    PlannerScreen #planner-status.error { color: $error; text-style: bold; }
    PlannerScreen #planner-table { height: auto; max-height: 13; margin: 0 1; }
    PlannerScreen #planner-reasons { height: 1fr; padding: 0 1; }
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        tp: int | None = None,
        node_memory_gib: float | None = None,
        offline: bool | None = None,
        name: str | None = None,
        id: str | None = None,
    ) -> None:
        super().__init__(name=name, id=id)
        self.initial_model = model or DEFAULT_MODEL
        self.initial_tp = tp
        self.node_memory_gib = node_memory_gib
        self.offline = offline
        self.result: PlannerResult | None = None
        self.computing = False
        self.generation = 0  # bumps per computation; only the newest one is shown

    # ---- layout ------------------------------------------------------------------------------

    def _default_tp(self) -> int:
        if self.initial_tp:
            return self.initial_tp
        config = getattr(self.app, "config", None)
        nodes = getattr(config, "nodes", None)
        try:
            n = len(nodes) if nodes is not None else 0
        except TypeError:
            n = 0
        return n if n >= 2 else 2

    def compose(self) -> ComposeResult:
        with Horizontal(id="planner-form"):
            with Vertical(classes="planner-field"):
                yield Label("model (repo id, dir or config.json)")
                yield Input(self.initial_model, id="planner-model", compact=True)
            with Vertical(classes="planner-field"):
                yield Label("max model len")
                yield Input("", placeholder="config's", id="planner-mml", type="integer", compact=True)
            with Vertical(classes="planner-field"):
                yield Label("gmu")
                yield Input(f"{bud.DEFAULT_GMU:g}", id="planner-gmu", type="number", compact=True)
            with Vertical(classes="planner-field"):
                yield Label("KV dtype")
                yield Select([("auto", "auto"), ("fp8", "fp8")], value="auto", allow_blank=False,
                             id="planner-kv", compact=True)
            with Vertical(classes="planner-field"):
                yield Label("TP=N")
                yield Input(str(self._default_tp()), id="planner-tp", type="integer", compact=True)
        yield Static(id="planner-memory")
        yield Static(id="planner-status")
        table: DataTable[Any] = DataTable(id="planner-table", show_cursor=False, zebra_stripes=True)
        yield table
        with VerticalScroll(id="planner-reasons"):
            yield Static(id="planner-reasons-text")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#planner-model", Input).focus()
        self.recompute()

    # ---- inputs --------------------------------------------------------------------------------

    def _value(self, widget_id: str) -> str:
        return self.query_one(f"#{widget_id}", Input).value.strip()

    def read_form(self) -> tuple[str, int, PlanOptions]:
        """(model, N, options) from the form; a UserError names the bad field."""
        model = self._value("planner-model")
        if not model:
            raise UserError("give a model id (a Hugging Face repo id, a model directory or a config.json)")
        mml_text = self._value("planner-mml").replace(",", "").replace("_", "")
        mml: int | None = None
        if mml_text:
            try:
                mml = int(mml_text)
            except ValueError:
                raise UserError(f"max model len must be a whole number, got {mml_text!r}") from None
            if mml < 1:
                raise UserError(f"max model len must be at least 1, got {mml}")
        gmu_text = self._value("planner-gmu") or f"{bud.DEFAULT_GMU:g}"
        try:
            gmu = float(gmu_text)
        except ValueError:
            raise UserError(f"gmu must be a number such as 0.85, got {gmu_text!r}") from None
        if not math.isfinite(gmu) or not 0 < gmu <= 1:
            raise UserError(f"gmu must be in (0, 1], got {gmu_text}")
        tp_text = self._value("planner-tp") or str(self._default_tp())
        try:
            n = int(tp_text)
        except ValueError:
            raise UserError(f"TP=N must be a whole number, got {tp_text!r}") from None
        if not 1 <= n <= 64:
            raise UserError(f"TP=N must be between 1 and 64, got {n}")
        kv = self.query_one("#planner-kv", Select).value
        kv_dtype = kv if isinstance(kv, str) else "auto"
        options = PlanOptions(tp=n, nodes=n, gpu_memory_utilization=gmu, max_model_len=mml,
                              kv_cache_dtype=kv_dtype)
        return model, n, options

    def live_memory(self) -> LiveMemory | None:
        return app_live_memory(self.app)

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.recompute()

    @on(Select.Changed, "#planner-kv")
    def _kv_changed(self, event: Select.Changed) -> None:
        event.stop()
        if self.is_mounted and self.result is not None:
            self.recompute()

    def action_recompute(self) -> None:
        self.recompute()

    def action_back(self) -> None:
        self.workers.cancel_group(self, "planner")
        self.dismiss(None)

    # ---- computing -----------------------------------------------------------------------------

    def recompute(self) -> None:
        """Read the form and plan in a worker; a bad form is one line, nothing is started."""
        try:
            model, n, options = self.read_form()
        except UserError as exc:
            self.generation += 1  # a plan still running for the old form must not overwrite this
            self._show_error(exc.message)
            return
        live = None if self.node_memory_gib is not None else self.live_memory()
        if self.node_memory_gib is not None:
            options = dataclasses.replace(options, node_memory_gib=self.node_memory_gib)
            source = f"{self.node_memory_gib:.2f} GiB (given)"
        elif live is not None:
            options = dataclasses.replace(options, node_memory_gib=live.gib,
                                          node_memory_notes=tuple(live.notes(options.gpu_memory_utilization)))
            source = live.source
        else:
            source = f"{bud.DEFAULT_NODE_MEMORY_GIB:.2f} GiB (default: no live node samples)"
        self.generation += 1
        self.computing = True
        self._set_status(Text(f"planning {model} for TP=1 and TP={n}…", style="italic"), error=False)
        self.query_one("#planner-memory", Static).update(Text(f"node memory: {source}"))
        self._compute(model, n, options, source, self.generation)

    @work(thread=True, exclusive=True, exit_on_error=False, group="planner", description="plan a model")
    def _compute(self, model: str, n: int, options: PlanOptions, source: str, generation: int) -> tuple[
            int, PlannerResult]:
        from sparkconsole.planner.spec import load_spec

        mem = options.node_memory_gib if options.node_memory_gib is not None else bud.DEFAULT_NODE_MEMORY_GIB
        result = PlannerResult(memory_gib=mem, memory_source=source)
        offline = self.offline
        if offline is None:
            offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
        try:
            spec = load_spec(model, offline=offline)
            tps = (1, n) if n > 1 else (1, 2)
            result.rows = compare_tp(spec, options, tps=tps)
            for row in result.rows:
                if row.get("fits") is False:
                    full = plan(spec, dataclasses.replace(options, tp=row["tp"], nodes=row["tp"]))
                    result.ways_out[row["tp"]] = list(full.ways_out)
        except UserError as exc:
            result.error = exc.message
        except Exception as exc:  # a bug or an odd file: one line in the panel, never a crash
            text = str(exc).strip().splitlines()
            result.error = f"planning failed: {exc.__class__.__name__}" + (f": {text[0]}" if text else "")
        return generation, result

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        worker = event.worker
        if worker.group != "planner":
            return
        event.stop()
        if event.state is WorkerState.SUCCESS:
            generation, result = worker.result  # type: ignore[misc]
            if generation == self.generation:
                self.computing = False
                self.show(result)
        elif event.state is WorkerState.ERROR:
            self.computing = False
            err = worker.error
            text = str(err).strip().splitlines()
            self._show_error(f"planning failed: {err.__class__.__name__}" + (f": {text[0]}" if text else ""))

    # ---- showing -------------------------------------------------------------------------------

    def _set_status(self, text: Text | str, *, error: bool) -> None:
        status = self.query_one("#planner-status", Static)
        status.set_class(error, "error")
        status.update(text)

    def _show_error(self, message: str) -> None:
        line = " ".join(message.split())
        self.result = PlannerResult(error=line)
        self.computing = False
        self._set_status(Text(f"✖ {line}"), error=True)
        self.query_one("#planner-table", DataTable).clear(columns=True)
        self.query_one("#planner-reasons-text", Static).update("")

    @property
    def error_text(self) -> str | None:
        return None if self.result is None else self.result.error

    def show(self, result: PlannerResult) -> None:
        if result.error is not None:
            self._show_error(result.error)
            return
        self.result = result
        rows = result.rows
        errors = [r for r in rows if r.get("error")]
        if errors and len(errors) == len(rows):
            self._show_error(errors[0]["error"])
            return
        model = next((r["model"] for r in rows if not r.get("error")), "")
        self._set_status(Text.assemble(("planned ", "dim"), (model, "bold"),
                                       (f" with {result.memory_gib:.2f} GiB per node", "dim")), error=False)
        table = self.query_one("#planner-table", DataTable)
        table.clear(columns=True)
        table.add_column("", key="what")
        for r in rows:
            table.add_column(f"TP={r['tp']} ({r['nodes']} node{'s' if r['nodes'] != 1 else ''})", key=f"tp{r['tp']}")
        for label, fmt in _ROWS:
            cells: list[Any] = [Text(label, style="bold")]
            for r in rows:
                cells.append("—" if r.get("error") else fmt(r))
            table.add_row(*cells, key=label)
        table.add_row(Text("fits", style="bold"), *(fits_text(r.get("fits")) for r in rows), key="fits")
        self.query_one("#planner-reasons-text", Static).update(self.reasons_text(result))

    def reason_lines(self, result: PlannerResult) -> list[tuple[str, str, str]]:
        """(marker, text, style) per line: each column's verdict in plain words, the cheapest way out
        first when it does not fit; reasons every column shares are listed once at the end."""
        lines: list[tuple[str, str, str]] = []
        ok = [r for r in result.rows if not r.get("error")]
        shared = set(ok[0]["reasons"][1:]) if len(ok) > 1 else set()
        for r in ok[1:]:
            shared &= set(r["reasons"][1:])
        for r in result.rows:
            head = f"TP={r['tp']}"
            if r.get("error"):
                lines.append((head, f"✖ {r['error']}", "red"))
                continue
            lines.append((head, f"{'✔' if r['fits'] else '✖'} {r['headline']}",
                          "bold green" if r["fits"] else "bold red"))
            for i, w in enumerate(result.ways_out.get(r["tp"], [])):
                lines.append(("  →", ("cheapest way out: " if i == 0 else "or ") + w, "yellow"))
            for reason in r["reasons"][1:]:
                if not reason.startswith("way out:") and reason not in shared:
                    lines.append(("  •", reason, ""))
        if shared:
            lines.append(("both" if len(ok) == 2 else "all", "", ""))
            lines += [("  •", reason, "dim") for reason in ok[0]["reasons"][1:] if reason in shared]
        return lines

    def reasons_text(self, result: PlannerResult) -> Table:
        grid = Table.grid(padding=(0, 1))
        grid.add_column(no_wrap=True)
        grid.add_column(ratio=1)
        for marker, text, style in self.reason_lines(result):
            mstyle = "bold yellow" if marker.strip() == "→" else ("bold" if not marker.startswith(" ") else "")
            grid.add_row(Text(marker, style=mstyle), Text(text, style=style))
        return grid

    @property
    def reasons_plain(self) -> str:
        """The reasons panel as plain text (one line per entry)."""
        if self.result is None or self.result.error is not None:
            return ""
        return "\n".join(f"{m} {t}" for m, t, _ in self.reason_lines(self.result))
