"""A hostile engine: a container log and a ``/metrics`` page that know no bounds (scenario ``hostile``).

The console must keep a bounded part of whatever a node sends (docs/security.md, "Reads from the node
are bounded"); this is the node that tests it, in the demo and in ``benchmarks/soak.py``. From sim time
``t0`` on, the engine container that carries a :class:`Hostile`:

* writes one line that never seems to end: ``line_rate`` bytes a second with no newline for
  ``line_span`` seconds, then the newline, then ``lines_per_s`` lines a second for as long as it runs.
  Docker's json-file driver keeps a line longer than 16 KiB as 16 KiB partial records (moby's log
  copier; its 16K limit is discussed in moby/moby#34855), ``docker logs`` gives them back joined and,
  with ``-t``, puts each record's timestamp in front of it, in the middle of the line
  (docker/cli#4941, moby/moby#37681): :func:`docker_logs` does the same. A record becomes readable
  when it is complete, so the line grows in steps of :data:`RECORD_BYTES`;
* answers ``GET /metrics`` with a page of ``series`` series (``page_bytes`` bytes in all) of a name the
  console reads, sent chunked (no Content-Length, so ``curl --max-filesize`` cannot refuse it before the
  transfer): :meth:`Hostile.page` makes it as it is sent and never holds it.

Everything is a function of sim time: no record is stored. A ``docker logs -f`` wake-up makes only the
records of its window, ``--tail N`` only the last N, and a read that writes into ``head -c N`` stops
once ``head`` has its bytes (the shell marks the pipe closed: :class:`sparkconsole.sim.sh.interp.Capture`),
as ``docker logs`` stops on SIGPIPE. Before ``t0`` the container is an ordinary engine.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparkconsole.sim.vllm_logs import ErrLine

if TYPE_CHECKING:
    from sparkconsole.sim.model import Container

RECORD_BYTES = 16 * 1024  # docker's log copier: a line longer than this is kept as partial records
CHUNK_CHARS = 64 * 1024  # what one write carries (the shell's pipe and the SSH channel take it in pieces)
FOLLOW_S = 0.05  # how often (sim seconds) ``docker logs -f`` looks for new records, as the sim's own does
# The endless line's text: printable, with a terminal escape and markup-looking text in it (a node's
# text is data, never markup or terminal control: docs/security.md)
_FILL = "endless line, no newline yet \x1b[7m[bold]never markup[/bold]\x1b[0m "
_FILL_BLOCK = _FILL * (CHUNK_CHARS // len(_FILL) + 2)


def _stamp_cache() -> Any:
    """``docker logs -t``'s timestamp of sim time ``t`` (``epoch``: unix time of sim time 0), as
    :meth:`sparkconsole.sim.tools.docker.DockerTools._fmt_log` prints it; the date part cached per
    second (thousands of records a second share it)."""
    last: list[Any] = [None, ""]

    def stamp(epoch: float) -> str:
        whole = int(epoch)
        if last[0] != whole:
            last[0], last[1] = whole, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
        return f"{last[1]}.{int((epoch % 1) * 1e9):09d}Z "

    return stamp


@dataclass
class Hostile:
    """What makes a container hostile, from sim time ``t0`` (see the module's docstring)."""

    t0: float
    line_span: float = 30.0  # seconds the endless line grows
    line_rate: int = 256 * 1024  # its bytes a second: 7.5 MiB in all by default, past every bound the console has
    lines_per_s: int = 5000  # then this many lines a second, for ever
    series: int = 2_000_000  # the /metrics page: this many series ...
    page_bytes: int = 1_000_000_000  # ... and this many bytes (1 GB), every line the same length

    # ---- the log ----------------------------------------------------------------------------

    @property
    def t1(self) -> float:
        """When the endless line ends (its newline) and the flood of lines begins."""
        return self.t0 + self.line_span

    @property
    def line_bytes(self) -> int:
        return int(self.line_span * self.line_rate)

    @property
    def full_records(self) -> int:
        """The endless line's complete 16 KiB records (its end, the rest and the newline, is one more)."""
        return self.line_bytes // RECORD_BYTES

    def _line_records(self, t: float) -> int:
        """Records of the endless line written by sim time ``t`` (its final one included from ``t1``)."""
        if t < self.t0:
            return 0
        if t >= self.t1:
            return self.full_records + 1
        return min(self.full_records, int((t - self.t0) * self.line_rate) // RECORD_BYTES)

    def _flood_lines(self, t: float) -> int:
        """Lines of the flood written by sim time ``t``."""
        return 0 if t < self.t1 else math.floor((t - self.t1) * self.lines_per_s)

    def _line_record(self, j: int) -> tuple[float, str, bool]:
        """The endless line's record ``j``: (its time, its text, partial?)."""
        if j < self.full_records:
            start = j * RECORD_BYTES
            return self.t0 + (j + 1) * RECORD_BYTES / self.line_rate, _fill(start, start + RECORD_BYTES), True
        start = self.full_records * RECORD_BYTES
        return self.t1, _fill(start, self.line_bytes), False

    def _flood_line(self, k: int) -> tuple[float, str]:
        t = self.t1 + (k + 1) / self.lines_per_s
        return t, (f"{k:010d} flood GET /v1/completions 200 \x1b[2J[red]not markup[/red] "
                   "abcdefghijklmnopqrstuvwxyz0123456789")

    def records(self, ct: Container, lo: float, hi: float, tail: int | None, stamp, epoch0: float) -> Iterator[
            tuple[bool, str]]:
        """What ``docker logs`` writes for the records in ``(lo, hi]`` (the last ``tail`` of them when
        given), oldest first, as (stderr?, text) pieces of at most about :data:`CHUNK_CHARS`. The
        container's own lines count up to ``t0``; from then on the hostile writer owns its output."""
        if ct.stopped is not None:
            hi = min(hi, ct.stopped)
        own = ct.log_between(lo, min(hi, self.t0)) if lo < self.t0 else []
        j0, j1 = self._line_records(lo), self._line_records(hi)
        k0, k1 = self._flood_lines(lo), self._flood_lines(hi)
        if tail is not None:
            keep = max(0, tail)
            k0 = max(k0, k1 - keep)
            keep -= k1 - k0
            j0 = max(j0, j1 - keep)
            keep -= j1 - j0
            own = own[max(0, len(own) - keep):] if keep > 0 else []

        def fmt(t: float, text: str, partial: bool) -> str:
            return (stamp(epoch0 + t) if stamp else "") + text + ("" if partial else "\n")

        for ln in own:
            yield isinstance(ln, ErrLine), fmt(ln.t, ln.text, False)
        for j in range(j0, j1):
            yield False, fmt(*self._line_record(j))
        buf: list[str] = []
        size = 0
        for k in range(k0, k1):
            t, text = self._flood_line(k)
            piece = fmt(t, text, False)
            buf.append(piece)
            size += len(piece)
            if size >= CHUNK_CHARS:
                yield False, "".join(buf)
                buf, size = [], 0
        if buf:
            yield False, "".join(buf)

    # ---- the /metrics page ------------------------------------------------------------------

    def page(self, served_name: str) -> Iterator[str]:
        """The page, in pieces of about :data:`CHUNK_CHARS`, made as it is read: ``series`` lines of
        ``vllm:num_requests_running`` (a name the console reads, so the node's filter lets every one
        through), each ``page_bytes / series`` bytes long."""
        width = self.page_bytes // self.series
        head = 'vllm:num_requests_running{engine="'
        tail = f'",model_name="{served_name}",pad="'
        pad = width - len(head) - 10 - len(tail) - len('"} 1\n')
        if pad < 0:
            raise ValueError(f"{self.page_bytes} bytes cannot hold {self.series} series")
        fill = "x" * pad
        per = max(1, CHUNK_CHARS // width)
        for start in range(0, self.series, per):
            yield "".join(f'{head}{i:010d}{tail}{fill}"}} 1\n' for i in range(start, min(start + per, self.series)))


def _fill(a: int, b: int) -> str:
    """Bytes ``a`` to ``b`` of the endless line."""
    out: list[str] = []
    while a < b:
        off = a % len(_FILL)
        n = min(b - a, len(_FILL_BLOCK) - off)
        out.append(_FILL_BLOCK[off:off + n])
        a += n
    return "".join(out)


def hostile_page(cluster: Any, node: str, run: Any, t: float) -> Iterator[str] | None:
    """The page ``run``'s ``/metrics`` sends at sim time ``t`` when its container is hostile by then,
    else None (the engine's own page)."""
    for c in cluster.containers_on(node):
        if c.engine is run and c.hostile is not None and t >= c.hostile.t0:
            return c.hostile.page(run.served_name)
    return None


async def docker_logs(tool: Any, ct: Container, lo: float, tail: int | None, follow: bool, stamps: bool,
                      io: Any) -> int:
    """``docker logs [-f] [-t] [--tail N] [--since T]`` of a hostile container (``tool``: the node's
    docker tools, for the clock). Stops when the reader is gone: a pipe whose reader has what it wants
    (``io.out.closed``) or, following, a container that stopped."""
    stamp = _stamp_cache() if stamps else None
    epoch0 = tool.clock.epoch(0.0)
    hostile: Hostile = ct.hostile

    def write(lo_: float, hi_: float, tail_: int | None) -> bool:
        for err, text in hostile.records(ct, lo_, hi_, tail_, stamp, epoch0):
            (io.err if err else io.out)(text)
            if getattr(io.out, "closed", False):
                return False
        return True

    last = tool.now()
    if not write(lo, last, tail) or not follow:
        return 0
    while True:
        if not ct.running(last):
            return 0
        await tool.clock.sleep(FOLLOW_S)
        now = tool.now()
        if not write(last, now, None):
            return 0
        last = now
        if tool.cluster.container(tool.node_name, ct.name) is not ct:
            return 0


__all__ = ["FOLLOW_S", "RECORD_BYTES", "Hostile", "docker_logs", "hostile_page"]
