"""How an engine's container ended, from ``docker inspect`` and the engine's own log.

While the serve step follows a start, the containers it started for the engine can die without the
log saying why: the kernel's OOM killer, ``docker kill``, earlyoom or systemd-oomd send SIGKILL and
the log just stops. ``docker inspect -f '{{.Name}} {{json .State}}'`` (:func:`sparkconsole.remote.
docker_state`) says what happened; :func:`parse_states` reads it and :func:`classify` turns a dead
container, with the log tracker's report (what the engine was doing), into a :class:`ContainerDeath`
with the kind, the words and the advice the serve step's failure decision shows.

Kinds: ``oom`` (exit 137 with ``OOMKilled``: the kernel's OOM killer), ``killed`` (137 without it:
SIGKILL from outside the engine), ``segfault`` (139), ``removed`` (no such container any more), else
the log's own classification (``oom``, ``nccl``, ``ray``, ``unsupported_architecture``, ``other``)
or ``exited`` (the process ended and the log says nothing). Pure functions: no Textual, no I/O.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

SIGNALS = {1: "SIGHUP", 2: "SIGINT", 3: "SIGQUIT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL",
           11: "SIGSEGV", 13: "SIGPIPE", 15: "SIGTERM"}
_MISSING = re.compile(r"(?:No such object|No such container): (\S+)")
GO_ZERO_TIME = "0001-01-01T00:00:00Z"
# the kinds only the container's state can tell (the log just stops); the others are the log's own
CONTAINER_KINDS = ("oom", "killed", "segfault", "removed")


@dataclass(frozen=True)
class ContainerState:
    """One container's ``State`` as docker reports it (``missing``: docker knows no such container)."""

    name: str
    status: str = ""  # created | running | paused | restarting | removing | exited | dead
    running: bool = False
    exit_code: int = 0
    oom_killed: bool = False
    error: str = ""
    started_at: str = ""
    finished_at: str = ""
    pid: int = 0
    missing: bool = False

    @property
    def dead(self) -> bool:
        """It no longer runs and will not by itself (``restarting`` and ``created`` are not dead)."""
        return self.missing or self.status in ("exited", "dead") or (
            not self.running and self.status not in ("created", "restarting", "running", "paused", ""))

    @property
    def signal(self) -> str | None:
        """The signal that ended the main process (exit code 128 + N), e.g. ``SIGKILL``."""
        n = self.exit_code - 128
        return SIGNALS.get(n, f"signal {n}") if 128 < self.exit_code < 160 else None


def parse_state_line(line: str) -> ContainerState | None:
    """``/NAME {"Status":…}`` (one line of :func:`sparkconsole.remote.docker_state`); None when it is not one."""
    name, sep, rest = line.strip().partition(" ")
    if not sep or not rest.startswith("{"):
        return None
    try:
        st: Any = json.loads(rest)
    except ValueError:
        return None
    if not isinstance(st, dict):
        return None

    def num(key: str) -> int:
        v = st.get(key)
        return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0

    return ContainerState(
        name=name.lstrip("/"), status=str(st.get("Status") or ""), running=st.get("Running") is True,
        exit_code=num("ExitCode"), oom_killed=st.get("OOMKilled") is True, error=str(st.get("Error") or ""),
        started_at=str(st.get("StartedAt") or ""),
        finished_at="" if st.get("FinishedAt") in (None, GO_ZERO_TIME) else str(st.get("FinishedAt")),
        pid=num("Pid"))


def parse_states(stdout: str, stderr: str, names: list[str] | tuple[str, ...] = ()) -> dict[str, ContainerState]:
    """Every container the output speaks of, by name: the state lines from stdout, and a
    ``missing`` state for each ``No such object: NAME`` on stderr. A name asked for that appears in
    neither (docker itself did not answer) is left out: unknown is not dead."""
    out: dict[str, ContainerState] = {}
    for line in stdout.splitlines():
        st = parse_state_line(line)
        if st is not None:
            out[st.name] = st
    for m in _MISSING.finditer(stderr):
        name = m.group(1)
        if name not in out and (not names or name in names):
            out[name] = ContainerState(name=name, missing=True)
    return out


@dataclass(frozen=True)
class ContainerDeath:
    """A dead engine container, said in words: ``kind``, what ended it and when in the start."""

    kind: str  # oom | killed | segfault | removed | exited | a log kind (nccl, ray, oom, other, ...)
    node: str
    container: str
    exit_code: int | None
    oom_killed: bool
    during: str  # "while loading weights, shard 12 of 48", "after ready", ...
    what: str  # one line: "spark-1a32: sparkconsole-ray-1a2b was killed by the kernel's OOM killer ..."
    advice: str
    finished_at: str = ""
    log_line: str = ""  # the log's own failure line, when it has one

    @property
    def failure_line(self) -> str:
        return self.what

    @property
    def failure_kind(self) -> str:
        return self.kind


def during(report: Any) -> str:
    """What the engine was doing when its log stopped, from the tracker's report."""
    if report is None or getattr(report, "state", "unknown") == "unknown":
        return "before the engine logged anything"
    state = report.state
    phase = getattr(report, "phase", None) or ""
    if state == "ready" or phase == "ready":
        return "after ready (it was serving)"
    done, total = getattr(report, "shards_done", None), getattr(report, "shards_total", None)
    if phase == "loading weights" or (state == "loading" and phase in ("", "loading weights")):
        if total:
            return f"while loading weights, shard {done or 0} of {total}"
        return "while loading weights"
    if state == "starting":
        return f"while starting ({phase})" if phase and phase != "starting" else "while starting, before the weights"
    if phase:
        where = f"while {phase}"
        if total and (done or 0) >= total:
            where += f", after all {total} weight shards loaded"
        return where
    return f"while {state}"


def _plan_words(plan: dict[str, Any] | None) -> str:
    if not plan:
        return ""
    bits = []
    if plan.get("weights_gib") is not None:
        bits.append(f"{float(plan['weights_gib']):.1f} GiB of weights per node")
    if plan.get("need_gib") is not None:
        bits.append(f"{float(plan['need_gib']):.1f} GiB free needed at launch")
    if plan.get("gmu") is not None:
        bits.append(f"gpu-memory-utilization {plan['gmu']}")
    if plan.get("max_model_len"):
        bits.append(f"max-model-len {plan['max_model_len']}")
    if plan.get("tp"):
        bits.append(f"TP={plan['tp']}")
    return ("the plan: " + ", ".join(bits)) if bits else ""


def classify(node: str, st: ContainerState, report: Any = None,
             plan: dict[str, Any] | None = None) -> ContainerDeath | None:
    """A dead container as a failed start (None while it runs, is created or restarting).

    ``report`` is the log tracker's :class:`~sparkconsole.logs.vllm.VllmLogReport` (what the engine
    was doing, and its own failure if it logged one); ``plan`` the plan's figures for the words
    (``weights_gib``, ``need_gib``, ``gmu``, ``max_model_len``, ``tp``)."""
    if not st.dead:
        return None
    when = during(report)
    log_kind = getattr(report, "failure_kind", None) if getattr(report, "state", "") == "failed" else None
    log_line = (getattr(report, "failure_line", None) or "") if log_kind else ""
    log_advice = (getattr(report, "advice", None) or "") if log_kind else ""
    finished = f" at {st.finished_at}" if st.finished_at else ""
    pw = _plan_words(plan)
    who = f"{node}: container {st.name}"
    if st.missing:
        return ContainerDeath(
            "removed", node, st.name, None, False, when,
            f"{who} is gone (docker inspect: no such object) {when}",
            "Someone or something removed the container (`docker rm -f`, a cleanup script, another deployment's "
            "teardown). Nothing in the engine failed: start again, and check `docker events` / the node's shell "
            "history for who removed it.", "", log_line)
    if st.exit_code == 137 and st.oom_killed:
        return ContainerDeath(
            "oom", node, st.name, 137, True, when,
            f"{who} was killed by the kernel's OOM killer {when} (exit 137, OOMKilled true{finished})",
            "The node ran out of memory: on a DGX Spark the GPU shares the 128 GB with the OS, the page cache and "
            "every other container. " + (f"Check {pw}; " if pw else "") + "drop the page cache before the start, "
            "stop the other models on the node, or go back to the plan for a layout with less per node (more "
            "nodes, a shorter --max-model-len, a lower --gpu-memory-utilization). `journalctl -k | grep -i oom` "
            "shows the kernel's report.", st.finished_at, log_line)
    if st.exit_code == 137:
        return ContainerDeath(
            "killed", node, st.name, 137, False, when,
            f"{who} was killed with SIGKILL from outside the engine {when} (exit 137, OOMKilled false{finished})",
            "Something sent SIGKILL: `docker kill`, earlyoom or systemd-oomd (they kill under memory pressure "
            "without the kernel's OOM flag). To tell: `journalctl -k | grep -i oom` or `dmesg -T | grep -i "
            "killed` (the kernel's OOM killer), `journalctl -u earlyoom -u systemd-oomd --since -1h` (a "
            "userspace killer), `journalctl -u docker | grep -i kill` or the shell history (a person). If memory "
            "pressure was the cause, free memory first; otherwise start again.", st.finished_at, log_line)
    if st.exit_code == 139:
        return ContainerDeath(
            "segfault", node, st.name, 139, st.oom_killed, when,
            f"{who} crashed with a segmentation fault {when} (exit 139, SIGSEGV{finished})",
            "The engine's process crashed in native code: often an image whose kernels were not built for the "
            "GB10 (sm_121) or a driver / CUDA mismatch. Read the last lines of the log, check `dmesg` for the "
            "faulting library, and try an image built for DGX Spark.", st.finished_at, log_line)
    sig = st.signal
    if log_kind:
        return ContainerDeath(
            str(log_kind), node, st.name, st.exit_code, st.oom_killed, when,
            f"{who} exited with code {st.exit_code} {when}: {log_line[:200]}", log_advice, st.finished_at,
            log_line)
    how = f"ended by {sig}" if sig else f"exited with code {st.exit_code}"
    err = f"; docker: {st.error}" if st.error else ""
    return ContainerDeath(
        "exited", node, st.name, st.exit_code, st.oom_killed, when,
        f"{who} {how} {when}, and its log names no cause{finished}{err}",
        "The engine's process ended without a recognised error in its log: read the whole log "
        "(`docker logs` of the container, or the serve log) and `docker inspect` of the container.",
        st.finished_at, log_line)

