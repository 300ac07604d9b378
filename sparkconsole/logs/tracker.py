"""The machinery every engine's log tracker shares: feeding lines, a merged log's nodes, the cached
report (:class:`LineTracker`), and for an engine read by a handful of rules, the state machine of a
start (:class:`PhaseTracker`).

vLLM's tracker (:mod:`sparkconsole.logs.vllm`) reads a log with many shapes (hard wraps, glued
progress bars, Ray's process tags) and keeps its own per-line reading on :class:`LineTracker`.
SGLang's and llama.cpp's logs are plainer: one record per line behind a header, so their trackers
(:mod:`sparkconsole.logs.sglang`, :mod:`sparkconsole.logs.llama_cpp`) only say what a message means
(:meth:`PhaseTracker._read`); undoing the line's wrapping (:mod:`sparkconsole.logs.envelope`), the
phases, the failure bookkeeping and the report are here, once.

Pure Python; a line costs time linear in its length (lines are cut at
:data:`~sparkconsole.logs.envelope.MAX_LINE`), and a tracker keeps a bounded state whatever it reads.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from sparkconsole.logs.envelope import MAX_LINE, prefix_end, strip_ansi
from sparkconsole.logs.report import (
    PHASE_FAILED,
    PHASE_LOADING,
    PHASE_ORDER,
    PHASE_READY,
    PHASE_STARTING,
    LogReport,
    worst_report,
)


class LineTracker:
    """The plumbing of a tracker that reads one physical line at a time: feeding lines and text,
    a merged log's nodes (each node's lines go to a tracker of its own, and the report is the worst
    of them: :func:`worst_report`), and the report built once per change.

    A subclass reads a line in :meth:`_feed_physical` (counting it in ``_line_no`` and clearing
    ``_cached``), builds its report in :meth:`_build`, and keeps ``_failed`` true once its run failed
    (the merged view orders the nodes by when they failed). It takes no constructor arguments: a
    merged log makes one per node."""

    label = ""
    _phase: str | None  # the timeline's current phase, kept by the subclass (None before the first)
    _events: list[tuple[str, int]]  # (phase, line number) each time it moved
    _seen: bool  # a line of the engine was read
    _level: int  # 0 starting, 1 loading, 2 ready

    def __init__(self) -> None:
        self._line_no = 0
        self._failed = False
        self._cached: LogReport | None = None
        self._nodes: dict[str, LineTracker] = {}  # source -> that node's own tracker
        self._fail_order: list[str] = []  # sources in the order they first failed

    def _state_and_phase(self) -> tuple[str, str | None]:
        """The report's state and phase: ``unknown`` until a line of the engine was read (``_seen``),
        ``failed`` once its run failed, else by ``_level`` (0 starting, 1 loading, 2 ready); the phase
        as the timeline has it, else the state's own."""
        if not self._seen:
            return "unknown", None
        state = "failed" if self._failed else ("starting", "loading", "ready")[self._level]
        return state, self._phase or (PHASE_STARTING if state == "starting" else PHASE_LOADING)

    def _enter_phase(self, phase: str) -> None:
        """Move the timeline forward (phases never go back; ``failed`` ends it). A subclass keeps
        ``_phase`` (the current one, None before the first) and ``_events`` ((phase, line) pairs)."""
        if self._failed and phase != PHASE_FAILED:
            return
        if self._phase == phase:
            return
        if self._phase is not None and PHASE_ORDER[phase] < PHASE_ORDER[self._phase]:
            return
        self._phase = phase
        self._events.append((phase, self._line_no))

    # -- what a subclass provides --------------------------------------------------------------
    def _feed_physical(self, physical: str) -> None:
        raise NotImplementedError

    def _build(self) -> LogReport:
        raise NotImplementedError

    # -- public --------------------------------------------------------------------------------
    def feed(self, line: str, source: str = "") -> None:
        """One physical line (a trailing newline is fine; embedded newlines are split).

        ``source`` names the node of a merged log: each node's lines go to a tracker of its own
        (ranks on different nodes must not be read as one run), and :attr:`report` is then
        the worst of them (:func:`worst_report`); :attr:`node_reports` has each one."""
        if source:
            tracker = self._nodes.get(source)
            if tracker is None:
                tracker = self._nodes[source] = type(self)()
            tracker.feed(line)
            if tracker._failed and source not in self._fail_order:
                self._fail_order.append(source)
            self._cached = None
            return
        if not isinstance(line, str):
            line = str(line)
        if line.endswith("\n"):
            line = line[:-1]
        if "\n" in line:
            for part in line.split("\n"):
                self._feed_physical(part)
        else:
            self._feed_physical(line)

    def feed_text(self, text: str) -> None:
        """Several whole lines; a last line without a newline is taken as complete."""
        if not text:
            return
        if text.endswith("\n"):
            text = text[:-1]
        for part in text.split("\n"):
            self._feed_physical(part)

    def feed_lines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.feed(line)

    @property
    def report(self) -> LogReport:
        if self._cached is None:
            self._cached = worst_report(self.node_reports, self._fail_order) if self._nodes else self._build()
        return self._cached

    @property
    def node_reports(self) -> dict[str, LogReport]:
        """Each node's own report, in the order the nodes were first seen (``{}`` for a log
        fed without ``source``; lines fed without one beside named nodes are listed as ``""``)."""
        out = {node: tracker.report for node, tracker in self._nodes.items()}
        if out and self._line_no:
            out[""] = self._build()
        return out


class PhaseTracker(LineTracker):
    """A start read one message at a time: ``starting`` until weights load, ``loading`` until the
    server says it is ready, ``failed`` once a failure is read; ``unknown`` while no line of the
    engine was read.

    A subclass sets :attr:`header` (the engine's own record header, if it has one) and reads each
    message in :meth:`_read`, calling the helpers below; :meth:`_advise` gives the words for a
    failure. The first root cause wins: a later symptom does not replace it, but a classified cause
    (``oom``, ``nccl``) replaces an ``other`` (an exception the rules could not name), as a chained
    exception names the real cause after its wrapper."""

    #: the engine's record header (see :func:`~sparkconsole.logs.envelope.prefix_end`), or None
    header: re.Pattern[str] | None = None

    def __init__(self) -> None:
        super().__init__()
        self._restarts = 0
        self._reset_run()

    def _reset_run(self) -> None:
        self._seen = False  # a line of this engine was read
        self._level = 0  # 0 starting, 1 loading, 2 ready
        self._failed = False
        self._kind: str | None = None
        self._kind_locked = False  # a specific root cause was read
        self._failure_line: str | None = None
        self._failure_line_no: int | None = None
        self._phase: str | None = None
        self._events: list[tuple[str, int]] = []
        self._v: dict[str, Any] = {}  # report fields read from lines, by name

    # -- what a subclass provides --------------------------------------------------------------
    def _read(self, msg: str) -> None:
        """One message, its prefixes and header gone (indentation kept: a traceback's frames)."""
        raise NotImplementedError

    def _advise(self, report: LogReport) -> str | None:
        """The next step for a failed start, in plain words."""
        return None

    # -- per line ------------------------------------------------------------------------------
    def _feed_physical(self, physical: str) -> None:
        self._line_no += 1
        self._cached = None
        if len(physical) > MAX_LINE:
            physical = physical[:MAX_LINE]
        for part in physical.split("\r"):  # a progress bar's updates: each its own record
            if not part.strip():
                continue
            part = strip_ansi(part)
            msg = part[prefix_end(part, self.header)[0]:]
            if msg.strip():
                self._read(msg)

    # -- the state of the start ----------------------------------------------------------------
    def _launch(self) -> None:
        """A line that starts the server: after loading had begun (or failed) it is a new run of a
        restarting container, which gets a fresh report."""
        if self._level >= 1 or self._failed:
            self._restarts += 1
            self._reset_run()
        self._seen = True

    def _to_loading(self) -> None:
        self._seen = True
        if self._level < 1:
            self._level = 1

    def _to_ready(self) -> None:
        """The server answers: ``ready``, unless the run already failed."""
        self._seen = True
        if not self._failed:
            self._level = 2
            self._enter_phase(PHASE_READY)

    def _fail(self, kind: str, text: str, *, specific: bool) -> None:
        """A failure: ``specific`` when ``text`` names its cause (an exception, a signature), not when
        it is a symptom (a process reporting that another one died)."""
        self._seen = True
        if self._kind_locked and not (self._kind == "other" and kind != "other"):
            return
        first = not self._failed
        self._failed = True
        if specific or first:
            self._kind = kind
            self._failure_line = text
            self._failure_line_no = self._line_no
        if specific:
            self._kind_locked = True
        self._enter_phase(PHASE_FAILED)

    @property
    def _ready(self) -> bool:
        return self._level >= 2

    # -- report --------------------------------------------------------------------------------
    def _build(self) -> LogReport:
        state, phase = self._state_and_phase()
        report = LogReport(
            state=state,  # type: ignore[arg-type]
            failure_kind=self._kind if self._failed else None,  # type: ignore[arg-type]
            phase=phase,
            failure_line=self._failure_line if self._failed else None,
            failure_line_no=self._failure_line_no if self._failed else None,
            phase_events=tuple(self._events),
            restarts=self._restarts,
            lines=self._line_no,
            **self._v,
        )
        if not self._failed:
            return report
        advice = self._advise(report)
        return report if advice is None else replace(report, advice=advice)


__all__ = ["LineTracker", "PhaseTracker"]
