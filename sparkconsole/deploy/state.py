"""A deployment's memory: written after every command, so a killed console resumes where it was.

One JSON file per deployment under ``state_dir()/deployments/<id>.json`` (mode 0600), replaced
atomically (write a temporary file, ``fsync``, ``rename``) so a ``kill -9`` mid-write leaves the
previous version whole. It holds the options, the answers, what recon read, each step's state,
the detached jobs (node, pid, files), the containers this deployment started (by id, so teardown
touches nothing else) and the services it stopped (so teardown can offer them back). Secrets are
never in it: the wizard never reads a token, and every string passes :func:`journal.redact`
on the way out for good measure.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sparkconsole.config import state_dir
from sparkconsole.deploy.deployment_plan import DeploymentPlan
from sparkconsole.durable import write_all
from sparkconsole.errors import UserError
from sparkconsole.journal import redact

SCHEMA = 1


@dataclass
class Job:
    """A detached job on a node: found again by its pid and its files after a disconnect."""

    node: str
    pid: int
    log: str
    rc: str
    what: str
    started: float = 0.0  # wall time (Unix) it was started, for the journal's duration


@dataclass
class Started:
    """Something this deployment started: only these are touched by teardown."""

    node: str
    kind: str  # container
    name: str
    id: str = ""


@dataclass
class Stopped:
    """A service this deployment stopped to free memory: teardown offers to start it again."""

    node: str
    kind: str  # container | unit
    name: str


@dataclass
class DeploymentState:
    id: str
    model: str
    options: dict[str, Any] = field(default_factory=dict)
    created: str = ""
    answers: dict[str, str] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)  # what recon read: {"nodes": {name: NodeFacts}}
    plan: DeploymentPlan = field(default_factory=DeploymentPlan)  # what the steps decided and measured
    steps: dict[str, str] = field(default_factory=dict)
    jobs: dict[str, Job] = field(default_factory=dict)
    started: list[Started] = field(default_factory=list)
    stopped: list[Stopped] = field(default_factory=list)
    done_commands: list[str] = field(default_factory=list)  # keys of mutating commands that finished ok
    endpoint: str | None = None
    result: str | None = None  # served | failed | stopped | torn-down
    cluster: str = ""
    schema: int = SCHEMA

    # ---- building -------------------------------------------------------------------------

    @classmethod
    def new(cls, model: str, options: dict[str, Any], cluster: str) -> DeploymentState:
        stamp = datetime.now(UTC)
        ident = stamp.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)
        return cls(id=ident, model=model, options=dict(options), created=stamp.isoformat(timespec="seconds"),
                   cluster=cluster)

    @property
    def short_id(self) -> str:
        """The part used in node-side names (container names, job folders)."""
        return self.id.replace("-", "")[-8:]

    # ---- persistence ----------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return _redacted(asdict(self))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DeploymentState:
        try:
            facts = dict(data.get("facts") or {})
            # a state written before the plan was typed kept its fields among the facts
            fields = {f.name for f in dataclasses.fields(DeploymentPlan)}
            legacy = {k: facts.pop(k) for k in list(facts) if k in fields}
            st = cls(
                id=str(data["id"]), model=str(data["model"]), options=dict(data.get("options") or {}),
                created=str(data.get("created") or ""), answers=dict(data.get("answers") or {}),
                facts=facts, plan=DeploymentPlan.from_json({**legacy, **dict(data.get("plan") or {})}),
                steps=dict(data.get("steps") or {}),
                jobs={k: Job(**v) for k, v in (data.get("jobs") or {}).items()},
                started=[Started(**s) for s in data.get("started") or []],
                stopped=[Stopped(**s) for s in data.get("stopped") or []],
                done_commands=list(data.get("done_commands") or []),
                endpoint=data.get("endpoint"), result=data.get("result"), cluster=str(data.get("cluster") or ""),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"deployment state is not readable: {exc}") from exc
        return st


def _redacted(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: _redacted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_redacted(v) for v in value]
    return value


class StateNotSaved(UserError):
    """The state could not be written whole (a full disk): the last good file stays as it was."""

    exit_code = 1


class StateStore:
    """Where deployment states live; ``root=None``: ``state_dir()/deployments``."""

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = Path(root) if root is not None else state_dir() / "deployments"

    def path(self, ident: str) -> Path:
        return self.root / f"{ident}.json"

    def save(self, st: DeploymentState) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        target = self.path(st.id)
        data = json.dumps(st.to_json(), indent=1, sort_keys=True).encode()
        fd, tmp = tempfile.mkstemp(prefix=f".{st.id}.", dir=self.root)
        try:
            try:
                os.fchmod(fd, 0o600)
                write_all(fd, data)  # every byte or an error: a short write never replaces a good state
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            Path(tmp).unlink(missing_ok=True)
            kept = f"the last saved one is kept at {target}" if target.exists() else "none was saved before"
            raise StateNotSaved(f"the deployment state could not be saved ({exc.strerror or exc}): {kept}; "
                                "free some disk and --resume") from None
        os.replace(tmp, target)
        (self.root / "latest").write_text(st.id + "\n")
        return target

    def saved(self) -> Iterator[DeploymentState]:
        """Every deployment saved here that can be read (an unreadable file is passed over)."""
        for path in self.root.glob("*.json"):
            try:
                yield DeploymentState.from_json(json.loads(path.read_text()))
            except (OSError, ValueError, UserError):
                continue

    def load(self, ident: str | None = None) -> DeploymentState:
        """A saved deployment; ``None``: the latest one."""
        if ident is None:
            try:
                ident = (self.root / "latest").read_text().strip()
            except FileNotFoundError:
                raise UserError("no deployment to resume: none was started from this machine") from None
        try:
            data = json.loads(self.path(ident).read_text())
        except FileNotFoundError:
            raise UserError(f"no deployment {ident!r} in {self.root}") from None
        except ValueError as exc:
            raise UserError(f"deployment {ident!r}: state file is not JSON ({exc})") from None
        return DeploymentState.from_json(data)
