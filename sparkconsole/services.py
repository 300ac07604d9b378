"""Services on a node: Docker containers and systemd units, and the actions on them.

:class:`ServiceController` is the one path a stop / start / restart / remove takes:

1. ``plan(action, service)`` builds the exact :class:`~sparkconsole.remote.RemoteCommand`
   (in :mod:`sparkconsole.remote`), so the UI can show it in the confirmation dialog;
2. ``refusal(cmd)`` says, in words, why it would be refused (read-only) — the UI shows that instead
   of the dialog;
3. ``await execute(cmd)`` refuses read-only (:class:`~sparkconsole.errors.ReadOnlyError`, nothing
   sent, nothing journaled as run), runs the command through ``transport.run``, journals it with
   its exit code (also failures, timeouts and lost connections) and returns an
   :class:`ActionResult` whose ``message`` is ready for a notification.

:class:`Debouncer` keeps a key from firing twice within a minimum interval (longer for the
destructive ones), with an injectable clock. No Textual here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from sparkconsole.errors import ReadOnlyError, TransportError, ValidationError
from sparkconsole.journal import Journal
from sparkconsole.probe.samples import Container
from sparkconsole.remote import (
    RemoteCommand,
    docker_action,
    systemctl_action,
    systemctl_show,
    validate_container,
    validate_unit,
)
from sparkconsole.transport.base import Transport

Action = Literal["stop", "start", "restart", "remove"]
ACTIONS: tuple[str, ...] = ("stop", "start", "restart", "remove")
DESTRUCTIVE: frozenset[str] = frozenset({"stop", "restart", "remove"})
# a container can be removed only when nothing runs in it
REMOVABLE_STATES: frozenset[str] = frozenset({"exited", "created", "dead"})
ServiceKind = Literal["container", "unit"]


@dataclass(frozen=True)
class Service:
    """One controllable thing on a node. ``state`` is ``None`` when it was not read."""

    name: str
    kind: ServiceKind
    state: str | None = None  # container: running/exited/...; unit: active/inactive/failed/...
    detail: str | None = None  # container: "Up 3 minutes"; unit: sub-state "running"/"dead"
    image: str | None = None
    loaded: bool | None = None  # units: False when systemd does not know the unit
    reason: str | None = None  # why the state is unknown

    @property
    def running(self) -> bool:
        if self.kind == "container":
            return self.state in {"running", "restarting", "paused"}
        return self.state in {"active", "activating", "reloading", "deactivating"}

    @property
    def actions(self) -> tuple[str, ...]:
        """The actions that make sense now (all but ``remove`` when the state is unknown)."""
        if self.kind == "unit":
            if self.loaded is False:
                return ()
            return ("stop", "restart") if self.running else ("start", "restart")
        if self.state is None:
            return ("stop", "start", "restart")
        if self.running:
            return ("stop", "restart")
        if self.state in REMOVABLE_STATES:
            return ("start", "restart", "remove")
        return ("start", "restart")

    @property
    def label(self) -> str:
        return f"{self.kind} {self.name}"


@dataclass(frozen=True)
class ActionResult:
    """What one executed action gave: ``message`` is the notification text."""

    node: str
    command: RemoteCommand
    ok: bool
    exit_code: int | None
    stdout: str
    stderr: str
    duration_s: float | None
    message: str

    @property
    def severity(self) -> Literal["information", "error"]:
        return "information" if self.ok else "error"


class Debouncer:
    """At most one accepted press per key per interval; destructive keys wait longer.

    ``allow(key)`` is True when ``key`` was not accepted within its interval; a rejected press
    does not restart the interval (so holding a key down fires at the interval's pace).
    A key like ``"stop:spark-01:vllm"`` uses the interval of its first part (``"stop"``).
    """

    def __init__(
        self,
        *,
        default_s: float = 0.05,
        destructive_s: float = 0.3,
        destructive: Iterable[str] = DESTRUCTIVE,
        intervals: Mapping[str, float] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.default_s = default_s
        self.destructive_s = destructive_s
        self.destructive = frozenset(destructive)
        self.intervals = dict(intervals or {})
        self.clock = clock
        self._last: dict[str, float] = {}

    def interval(self, key: str) -> float:
        base = key.split(":", 1)[0]
        for k in (key, base):
            if k in self.intervals:
                return self.intervals[k]
        return self.destructive_s if base in self.destructive else self.default_s

    def allow(self, key: str) -> bool:
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval(key):
            return False
        self._last[key] = now
        return True

    def reset(self, key: str | None = None) -> None:
        if key is None:
            self._last.clear()
        else:
            self._last.pop(key, None)


def parse_systemctl_show(text: str, units: Iterable[str] = ()) -> list[Service]:
    """Services from ``systemctl show -p Id,LoadState,ActiveState,SubState U...`` output.

    Blocks come in the order the units were asked for; a unit with no block (or a garbled one)
    is returned with ``state=None``. Never raises.
    """
    blocks: list[dict[str, str]] = []
    cur: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            if cur:
                blocks.append(cur)
                cur = {}
            continue
        key, sep, value = line.partition("=")
        if sep and key in {"Id", "LoadState", "ActiveState", "SubState", "Names"}:
            cur[key] = value
    if cur:
        blocks.append(cur)
    asked = list(units)
    out: list[Service] = []
    for i, block in enumerate(blocks):
        name = asked[i] if i < len(asked) else block.get("Id", f"unit-{i}")
        load = block.get("LoadState")
        out.append(
            Service(
                name=name,
                kind="unit",
                state=block.get("ActiveState") or None,
                detail=block.get("SubState") or None,
                loaded=None if load is None else load not in {"not-found", "masked", "bad-setting", "error"},
                reason=f"unit {load}" if load in {"not-found", "masked", "bad-setting", "error"} else None,
            )
        )
    for name in asked[len(blocks):]:
        out.append(Service(name=name, kind="unit", reason="no state in the systemctl output"))
    return out


def services_from_containers(containers: Iterable[Container]) -> list[Service]:
    """Container services from a probe sample's containers (invalid names are left out)."""
    out: list[Service] = []
    for c in containers:
        name = c.name or c.id
        if not name:
            continue
        try:
            validate_container(name)
        except ValidationError:
            continue
        out.append(Service(name=name, kind="container", state=c.state, detail=c.status, image=c.image))
    return out


def _tail(text: str, lines: int = 3) -> str:
    kept = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return " / ".join(kept[-lines:])


class ServiceController:
    """Plans, checks and runs the service actions of one node."""

    def __init__(
        self,
        node_name: str,
        transport: Transport,
        *,
        read_only: bool = False,
        journal: Journal | None = None,
        timeout: float = 60.0,
    ) -> None:
        self.node = node_name
        self.transport = transport
        self.read_only = read_only
        self.journal = journal if journal is not None else Journal()
        self.timeout = timeout

    # ---- what would run ---------------------------------------------------------------------

    def plan(self, action: str, service: Service | str, kind: ServiceKind | None = None) -> RemoteCommand:
        """The exact command for ``action`` on ``service`` (a :class:`Service`, or a name + kind).

        Raises :class:`~sparkconsole.errors.ValidationError` for an unknown action, a bad name, a
        unit ``remove``, or ``remove`` of a container that is not exited/created/dead.
        """
        if isinstance(service, str):
            service = Service(name=service, kind=kind or "container")
        if action not in ACTIONS:
            raise ValidationError(f"unknown action {action!r} (one of {', '.join(ACTIONS)})")
        if service.kind == "container":
            if action == "remove":
                if service.state not in REMOVABLE_STATES:
                    state = service.state or "unknown"
                    raise ValidationError(
                        f"{self.node}: container {service.name} is {state}; only an exited or created "
                        "container can be removed (stop it first)"
                    )
                return docker_action("rm", service.name)
            return docker_action(action, service.name)
        if action == "remove":
            raise ValidationError(f"{self.node}: systemd unit {service.name} cannot be removed from here")
        return systemctl_action(action, service.name)

    def refusal(self, cmd: RemoteCommand | None = None) -> str | None:
        """Why ``cmd`` would be refused, in words; ``None`` when it may run."""
        if self.read_only and (cmd is None or cmd.mutating):
            what = cmd.summary if cmd is not None and cmd.summary else "changes"
            return (
                f"read-only mode: {what} on {self.node} refused "
                "(started with --read-only or read_only = true in the cluster config)"
            )
        return None

    # ---- running ----------------------------------------------------------------------------

    async def execute(self, cmd: RemoteCommand) -> ActionResult:
        """Run ``cmd`` on the node. Raises ReadOnlyError (nothing sent) when read-only."""
        reason = self.refusal(cmd)
        if reason is not None:
            raise ReadOnlyError(reason)
        text = cmd.shell()
        what = cmd.summary or text
        start = time.monotonic()
        try:
            result = await self.transport.run(cmd, timeout=self.timeout)
        except TransportError as exc:
            duration = time.monotonic() - start
            if cmd.mutating:
                self.journal.record(
                    node=self.node, command=text, summary=cmd.summary, exit_code=None,
                    duration_s=duration, error=exc.message,
                )
            return ActionResult(
                node=self.node, command=cmd, ok=False, exit_code=None, stdout="", stderr="",
                duration_s=duration, message=f"{self.node}: {what} failed: {exc.message}",
            )
        error = None
        if result.ok:
            message = f"{self.node}: {what} done ({result.duration_s:.1f} s)"
        else:
            code = "killed" if result.exit_status is None else f"exit {result.exit_status}"
            error = _tail(result.stderr) or _tail(result.stdout) or code
            message = f"{self.node}: {what} failed ({code}): {error}"
        if cmd.mutating:
            self.journal.record(
                node=self.node, command=text, summary=cmd.summary, exit_code=result.exit_status,
                duration_s=result.duration_s, error=error,
            )
        return ActionResult(
            node=self.node, command=cmd, ok=result.ok, exit_code=result.exit_status,
            stdout=result.stdout, stderr=result.stderr, duration_s=result.duration_s, message=message,
        )

    # ---- listing ----------------------------------------------------------------------------

    async def unit_states(self, units: Iterable[str]) -> list[Service]:
        """The configured units' states with one ``systemctl show`` (unknown when it fails)."""
        names = [validate_unit(u) for u in units]
        if not names:
            return []
        try:
            result = await self.transport.run(systemctl_show(names), timeout=15.0)
        except TransportError as exc:
            return [Service(name=n, kind="unit", reason=exc.message) for n in names]
        if not result.ok and not result.stdout.strip():
            why = _tail(result.stderr, 1) or f"systemctl exit {result.exit_status}"
            return [Service(name=n, kind="unit", reason=why) for n in names]
        return parse_systemctl_show(result.stdout, names)

    async def list_services(
        self, containers: Iterable[Container] = (), units: Iterable[str] = ()
    ) -> list[Service]:
        """Containers (from the latest probe sample) then the configured units."""
        return [*services_from_containers(containers), *await self.unit_states(units)]
