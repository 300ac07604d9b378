"""Calibration from a running engine's log: the planner against what this vLLM start measured.

Opened with ``c`` on a followed vLLM log (:class:`~sparkconsole.ui.screens.logs.LogScreen`). It
reads the log as it stands (model, TP, ``--max-model-len``, gmu, "Model loading took", "Available
KV cache memory", the KV tokens and concurrency), shows the planner's estimate beside each logged
figure, and re-plans another ``--max-model-len``, ``--gpu-memory-utilization`` or TP from the
measured figures — the same arithmetic and words as ``sparkconsole plan MODEL --from-log FILE``
(:func:`sparkconsole.planner.calibrate.summary_lines`).

The model's config may have to come from the Hub (cached after the first time), so the work runs
in a thread worker (``exit_on_error=False``); any failure is one line in the dialog.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, Static
from textual.worker import Worker, WorkerState

from sparkconsole.errors import UserError
from sparkconsole.logs.follow import display_lines, display_text
from sparkconsole.planner.calibrate import Calibration, Logged, calibrate, read_log, summary_lines
from sparkconsole.planner.plan import PlanOptions
from sparkconsole.planner.spec import load_spec

CALIBRATION_BINDINGS: list[Binding] = [
    Binding("escape", "close", "Close", id="calibration.close", tooltip="Close the calibration."),
    Binding("ctrl+r", "replan", "Re-plan", id="calibration.replan",
            tooltip="Re-plan with the values in the fields (Enter in a field does the same)."),
]

# field id, the change key, the parser of its text, the logged value shown as its placeholder
_FIELDS: tuple[tuple[str, str, Any], ...] = (
    ("cal-mml", "max_model_len", int),
    ("cal-gmu", "gpu_memory_utilization", float),
    ("cal-tp", "tp", int),
)


def parse_change(values: dict[str, str]) -> dict[str, Any]:
    """The fields' texts as a re-plan request; an empty field asks nothing. A value that is not a
    number is a :class:`UserError` naming the field (one line in the dialog)."""
    change: dict[str, Any] = {}
    for _fid, key, kind in _FIELDS:
        text = values.get(key, "").strip().replace(",", "").replace("_", "")
        if not text:
            continue
        try:
            value = kind(text)
        except ValueError:
            raise UserError(f"{key.replace('_', '-')}: {text!r} is not a number") from None
        if value <= 0 or (key == "gpu_memory_utilization" and value > 1):
            raise UserError(f"{key.replace('_', '-')}: {text} is out of range")
        change[key] = value
    return change


class CalibrationScreen(ModalScreen[None]):
    """Planner against one vLLM start's log, and a re-plan from its measured figures."""

    HELP = ("The planner's estimate beside what this vLLM start logged, and a re-plan from the measured "
            "figures: type another max-model-len, gpu-memory-utilization or TP and press Enter.")
    BINDINGS = CALIBRATION_BINDINGS

    def __init__(self, node: str, log_text: str, node_memory_gib: float | None = None) -> None:
        super().__init__()
        self.node = node
        self.logged: Logged = read_log(log_text)
        self.node_memory_gib = node_memory_gib
        self.calibration: Calibration | None = None
        self.error: str | None = None

    def compose(self) -> ComposeResult:
        lg = self.logged
        with Vertical(id="cal-box"):
            # the model and the version are read from the node's log: plain Text, cleaned, never markup
            yield Label(Text(display_text(f"Calibration · {self.node} · {lg.model or 'model not logged yet'} · "
                                          f"vLLM {lg.vllm_version or '?'}")), id="cal-title")
            yield Static("reading the model's config…", id="cal-body")
            with Horizontal(id="cal-fields"):
                for fid, key, _kind in _FIELDS:
                    logged = getattr(lg, key)  # the start's own setting, shown as the field's placeholder
                    yield Label(key.replace("_", "-").replace("gpu-memory-utilization", "gmu"), classes="cal-label")
                    yield Input(placeholder=f"{logged:g}" if isinstance(logged, float) else
                                (f"{logged:,}" if logged else ""), id=fid, classes="cal-field")
            yield Static("Enter: re-plan from the measured figures · Esc: close", id="cal-hint")

    def on_mount(self) -> None:
        self.query_one("#cal-mml", Input).focus()
        self.recompute()

    def values(self) -> dict[str, str]:
        return {key: self.query_one(f"#{fid}", Input).value for fid, key, _k in _FIELDS}

    def recompute(self) -> None:
        try:
            change = parse_change(self.values())
        except UserError as exc:
            self._show_error(str(exc))
            return
        self._compute(change)

    @work(thread=True, exclusive=True, exit_on_error=False, group="calibration")
    def _compute(self, change: dict[str, Any]) -> Calibration:
        lg = self.logged
        if not lg.model:
            raise UserError("the log does not name the model yet (vLLM prints it in its first lines)")
        # the demo's simulated nodes run models nobody fetches: bundled or cached specs only there
        spec = load_spec(lg.model, offline=getattr(self.app, "demo", None) is not None)
        base = PlanOptions(node_memory_gib=self.node_memory_gib, vllm_version=lg.vllm_version)
        if lg.tp and change.get("tp") == lg.tp and len(change) == 1:
            change = {}
        return calibrate(spec, lg, base, change)

    @on(Worker.StateChanged)
    def _worker_changed(self, event: Worker.StateChanged) -> None:
        if event.worker.group != "calibration":
            return
        event.stop()
        if event.state == WorkerState.SUCCESS:
            self.calibration = event.worker.result
            self.error = None
            self._show(self.calibration)
        elif event.state == WorkerState.ERROR:
            exc = event.worker.error
            self._show_error(str(exc) if isinstance(exc, UserError)
                             else f"cannot calibrate: {exc.__class__.__name__}: {exc}")

    def _show(self, cal: Calibration | None) -> None:
        if cal is None:
            return
        final = cal.replan or cal.calibrated
        lines = summary_lines(cal)
        lines += [f"- {x}" for x in final.reasons[1:]]
        body = self.query_one("#cal-body", Static)
        body.update(Text(display_lines("\n".join(lines))))  # they quote the log's model and figures
        body.set_class(not final.fits, "-no-fit")

    def _show_error(self, text: str) -> None:
        self.error = text.splitlines()[0] if text else "error"
        self.query_one("#cal-body", Static).update(Text(display_text(f"✗ {self.error}")))

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.recompute()

    def action_replan(self) -> None:
        self.recompute()

    def action_close(self) -> None:
        self.dismiss(None)
