"""The serve step's calibration: what the node's own vLLM start measured, as plan notes.

After a first start (ready) or a failed one, the wizard reads the engine's log through
:mod:`sparkconsole.planner.calibrate` and says, in plain lines, what vLLM loaded and allocated
against what the plan estimated, and the longest ``--max-model-len`` the measured KV budget holds
(the figure the "shorter context" answer uses instead of halving). No Textual here.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkconsole.errors import UserError
from sparkconsole.planner.calibrate import calibrate, read_log
from sparkconsole.planner.plan import PlanOptions
from sparkconsole.planner.spec import ModelSpec


@dataclass(frozen=True)
class ServeCalibration:
    lines: tuple[str, ...]
    longest_len: int | None     # the longest max_model_len the measured KV budget holds


def from_log(spec: ModelSpec, log_text: str, options: PlanOptions) -> ServeCalibration | None:
    """None when the log has no memory figures yet (or the model cannot be planned)."""
    lg = read_log(log_text)
    try:
        cal = calibrate(spec, lg, options)
    except (UserError, ValueError):
        return None
    lines = [f"{name}: plan {plan}, log {log}" for name, plan, log in cal.rows()]
    lines += cal.notes
    c = cal.calibrated
    longest = c.layout.longest_len(c.capacity.num_blocks) if c.capacity.num_blocks else None
    if longest:
        longest = min(longest, spec.geometry.max_position)
        lines.append(f"the measured KV budget holds one request of up to {longest:,} tokens")
    return ServeCalibration(tuple(lines), longest or None)
