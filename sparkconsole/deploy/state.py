"""A deployment's memory: written after every command, so a killed console resumes where it was.

One JSON file per deployment under ``state_dir()/deployments/<id>.json`` (mode 0600), replaced
atomically (write a temporary file, ``fsync``, ``rename``) so a ``kill -9`` mid-write leaves the
previous version whole. The folder is private (:func:`~sparkconsole.durable.private_dir`: 0700, the
user's own, written by nobody else) and no record in it is followed through a symbolic link: a
``--resume`` acts on what the state names, so a state someone else could plant is refused. It holds the options, the answers, what recon read, each step's state,
the detached jobs (node, pid, files), the containers this deployment started (by id, so teardown
touches nothing else), the memory-guard watchers it armed and the services it stopped (so teardown
can offer them back). Secrets are never in it: the wizard never reads a token, and every string passes :func:`journal.redact`
on the way out for good measure.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sparkconsole.config import state_dir
from sparkconsole.deploy.deployment_plan import DeploymentPlan
from sparkconsole.durable import file_name_for, private_dir, read_private, replace_file, why
from sparkconsole.errors import UserError
from sparkconsole.journal import redact
from sparkconsole.remote import JobFiles

SCHEMA = 1


@dataclass
class Job:
    """A detached job on a node: found again by its files after a disconnect (``pid_file`` names the
    process by pid, boot id and start time: :class:`~sparkconsole.remote.JobFiles`)."""

    node: str
    pid: int
    log: str
    rc: str
    what: str
    started: float = 0.0  # wall time (Unix) it was started, for the journal's duration
    pid_file: str = ""

    @property
    def files(self) -> JobFiles:
        # a state saved before identity files: the pid file beside the exit-code file
        return JobFiles(self.log, self.rc, self.pid_file or self.rc.removesuffix(".rc") + ".pid")


@dataclass
class Started:
    """Something this deployment started: only these are touched by teardown."""

    node: str
    kind: str  # container
    name: str
    id: str = ""


@dataclass
class Guard:
    """A memory-guard watcher this deployment armed on a node (the guard step): teardown removes it and
    every file it had (:func:`~sparkconsole.remote.memory_guard_remove`). ``targets``: the containers it
    stops, so that a step run again after the flow went back arms it anew when they changed."""

    node: str
    job_dir: str
    pid: int = 0
    targets: list[str] = field(default_factory=list)


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
    guards: list[Guard] = field(default_factory=list)
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

    def nodes(self) -> set[str]:
        """Every node this state names (what it started, stopped, runs as jobs): each must be in the
        inventory it is run with."""
        return ({s.node for s in self.started} | {s.node for s in self.stopped}
                | {j.node for j in self.jobs.values()} | {g.node for g in self.guards})

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
                guards=[Guard(**g) for g in data.get("guards") or []],
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
        self._base = None if root is not None else state_dir()  # the state folder: private too

    def path(self, ident: str) -> Path:
        return self.root / f"{_checked_id(ident)}.json"

    def check(self) -> Path:
        """The folder made private (0700) or refused in one line (another user's, or one others may
        write): before a deployment is opened, so nothing is sent to a node from a folder that is not
        the user's own."""
        if self._base is not None:
            private_dir(self._base)
        return private_dir(self.root, "deployments folder")

    def save(self, st: DeploymentState) -> Path:
        """Write ``st`` whole (or raise :class:`StateNotSaved`, the last good file kept), then point
        this cluster's ``latest`` at it. Neither file is ever followed through a symbolic link: one
        found where ``latest`` should be is refused (after the state itself was saved)."""
        self.check()
        target = self.path(st.id)
        data = json.dumps(st.to_json(), indent=1, sort_keys=True).encode()
        try:
            replace_file(target, data)  # every byte or an error: a short write never replaces a good state
        except OSError as exc:
            kept = f"the last saved one is kept at {target}" if target.exists() else "none was saved before"
            raise StateNotSaved(f"the deployment state could not be saved ({why(exc)}): {kept}; "
                                "free some disk and --resume") from None
        latest = self._latest_file(st.cluster)
        if latest.is_symlink():
            raise StateNotSaved(f"the deployment state was saved at {target}, but {latest} is a symbolic link "
                                "(refused: the state folder's files are never followed elsewhere); remove it, "
                                "then --resume")
        try:
            replace_file(latest, (st.id + "\n").encode())
        except OSError as exc:
            raise StateNotSaved(f"the deployment state was saved at {target}, but {latest} could not be written "
                                f"({why(exc)}); free some disk and --resume {st.id}") from None
        return target

    def _latest_file(self, cluster: str) -> Path:
        """``latest`` is kept per cluster: a ``--resume`` or ``--teardown`` without an id on one cluster
        must never pick a deployment made on another (issue 23, item 4)."""
        return self.root / f"latest.{file_name_for(cluster)}"

    def saved(self) -> Iterator[DeploymentState]:
        """Every deployment saved here that can be read (an unreadable file is passed over)."""
        for path in self.root.glob("*.json"):
            try:  # a symbolic link is passed over like an unreadable file: never followed
                yield DeploymentState.from_json(json.loads(read_private(path)))
            except (OSError, ValueError, UserError):
                continue

    def load(self, ident: str | None = None, *, cluster: str | None = None) -> DeploymentState:
        """A saved deployment; ``None``: the latest one on ``cluster``. With ``cluster``, a deployment
        made on another cluster is refused (its containers, jobs and stopped services are another
        cluster's names: acting on them here would remove what this deployment never started)."""
        for folder in (self._base, self.root):  # a state another user could have written is never acted on
            if folder is not None and folder.exists():
                private_dir(folder, "state folder" if folder == self._base else "deployments folder")
        if ident is None:
            if cluster is None:
                raise UserError("which cluster's latest deployment? (internal: load(None) needs a cluster)")
            latest = self._latest_file(cluster)
            try:
                ident = read_private(latest, 4096).strip()
            except FileNotFoundError:
                raise UserError(f"no deployment to resume on cluster {cluster!r}: none was started from this "
                                "machine") from None
            except OSError as exc:
                raise UserError(f"cannot read {latest}: {why(exc)}") from None
        path = self.path(ident)
        try:
            data = json.loads(read_private(path))
        except FileNotFoundError:
            raise UserError(f"no deployment {ident!r} in {self.root}") from None
        except OSError as exc:
            raise UserError(f"cannot read deployment {ident!r} ({path}): {why(exc)}") from None
        except ValueError as exc:
            raise UserError(f"deployment {ident!r}: state file is not JSON ({exc})") from None
        st = DeploymentState.from_json(data)
        if cluster is not None and st.cluster != cluster:
            raise UserError(f"deployment {st.id} was made on cluster {st.cluster!r}, not on {cluster!r}: "
                            f"run it with that cluster's inventory (--config)")
        return st


_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def _checked_id(ident: str) -> str:
    """A deployment id as a file name: ``--resume ../x`` or a planted ``latest`` never names a file
    outside the folder."""
    if not _ID.fullmatch(ident):
        raise UserError(f"not a deployment id: {ident!r}")
    return ident
