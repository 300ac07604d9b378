"""Every read from a node is bounded before the console keeps it: a hostile ``/metrics`` page (millions
of series, a chunked page that never ends, invented figures), an endless ``docker ps``, a command whose
stdout never stops, a probe answer of a flood of lines. Each test states the bound it checks; memory is
measured with ``tracemalloc`` on the step that holds the data, never with wall time.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import shutil
import threading
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkconsole.config import NodeConfig
from sparkconsole.probe import poller as poller_mod
from sparkconsole.probe.poller import NodePoller
from sparkconsole.probe.script import (
    LIST_MAX_BYTES,
    MARK,
    TICK_MAX_LINES,
    cut_text,
    metrics_section,
    probe_command,
    split_pages,
    split_tick,
)
from sparkconsole.probe.state import NodeStatus
from sparkconsole.remote import METRICS_PAGE_MAX_BYTES, PAGE_MARK, metrics_probe
from sparkconsole.serving.discover import Engine
from sparkconsole.serving.metrics import (
    GAUGE_BOUNDS,
    INLINE_PAGE_LINES,
    MAX_PAGE_LINES,
    page_refusal,
    parse_metrics,
)
from sparkconsole.serving.watch import EngineWatch
from sparkconsole.transport.base import cut_marker
from sparkconsole.transport.local import LocalTransport

ENGINE = Engine(node="n1", kind="vllm", where="vllm-glm", image="vllm/vllm-openai:v0.17.0", model="glm",
                port=8000, host="0.0.0.0")
LABELS = 'engine="0",model_name="glm"'
SERIES = 2_000_000
MiB = 1024 * 1024


def _page(running: str = "3", prompt: str = "1200", generation: str = "300") -> str:
    return (f"vllm:num_requests_running{{{LABELS}}} {running}\n"
            f"vllm:num_requests_waiting{{{LABELS}}} 0\n"
            f"vllm:kv_cache_usage_perc{{{LABELS}}} 0.25\n"
            f"vllm:prompt_tokens_total{{{LABELS}}} {prompt}\n"
            f"vllm:generation_tokens_total{{{LABELS}}} {generation}\n")


def _huge_page() -> str:
    """Two million series of a name the console reads (what the node's grep lets through)."""
    return "".join(f'vllm:num_requests_running{{engine="{i}",model_name="glm"}} 1\n' for i in range(SERIES))


@contextlib.contextmanager
def _chunked_server(lines: int) -> Iterator[int]:
    """An engine whose ``/metrics`` is ``lines`` series sent chunked (no Content-Length: curl's
    ``--max-filesize`` cannot refuse it up front), on 127.0.0.1; its port."""
    chunk = b"".join(b'vllm:num_requests_running{engine="%d",model_name="glm"} 1\n' % i for i in range(1000))

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for _ in range(lines // 1000):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.write(b"0\r\n\r\n")
            except OSError:
                pass  # the reader stopped reading: what a bound is for

        def log_message(self, *args) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()


# ---- the page: too large is dropped whole, and said ---------------------------------------------

def test_a_two_million_series_page_is_dropped_whole_and_said_without_holding_it_again():
    text = _huge_page()
    w = EngineWatch(ENGINE)
    w.record(0.0, _page(), 0)  # it answered before
    tracemalloc.start()
    try:
        w.record(6.0, text, 0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # the page is counted, never copied nor parsed: a parse of it held 581 MB, its hash a copy of 80 MB
    assert peak < MiB, peak
    f = w.figures()
    assert not f.answering and f.read_at == 0.0  # the last good page's figures, said to be old
    assert f.reason == f"metrics page too large ({len(text)} bytes, {SERIES + 1} series), not read"
    assert w.failures == 1 and len(w.pages) == 1  # the page before stays the last one read
    assert parse_metrics(text) == []  # the parser refuses it the same way


def test_a_page_just_inside_the_bounds_is_read_and_one_past_them_is_not():
    line = f"vllm:num_requests_running{{{LABELS}}} 1\n"
    inside = line * (MAX_PAGE_LINES - 1)
    assert page_refusal(inside) is None and parse_metrics(inside)[0].requests_running == 1
    over = line * (MAX_PAGE_LINES + 1)
    assert page_refusal(over) is not None and "series" in page_refusal(over)
    # curl's own refusal of a page whose Content-Length passed --max-filesize
    assert "too large" in page_refusal("curl: (63) Maximum file size exceeded\n")


@pytest.mark.skipif(not shutil.which("curl"), reason="needs curl (scripts/test installs it)")
async def test_the_nodes_read_of_a_chunked_page_is_cut_at_the_bound_and_the_console_says_so():
    """The read the probe runs (one curl, grep, ``head -c``) on a page with no Content-Length: what
    crosses is the bound, not the page; the engine is "too large, not read", the other one is read."""
    t = LocalTransport("n1")
    with _chunked_server(SERIES) as big, _chunked_server(2000) as small:
        res = await t.run(metrics_probe(big, small), timeout=30)
    assert len(res.stdout.encode()) <= 2 * METRICS_PAGE_MAX_BYTES + 4096
    name = metrics_section(big, small)
    pages = split_pages(split_tick([f"{MARK} section {name}", *res.stdout.splitlines(),
                                    f"{MARK} rc {name} {res.exit_status}"])[name])
    w = EngineWatch(ENGINE)
    w.record(0.0, pages[big].text, pages[big].rc)
    assert not w.figures().answering and w.reason.startswith("metrics page too large (")
    assert w.reason.endswith("not read")


# ---- figures no engine can have: refused, not shown ----------------------------------------------

def test_a_negative_counter_and_an_absurd_gauge_are_refused_not_shown():
    (e,) = parse_metrics(_page(running="336229", prompt="-5"))
    assert e.requests_running is None and e.prompt_tokens is None
    assert "negative" in e.invalid["prompt_tokens"] and "336229" in e.invalid["requests_running"]
    assert e.generation_tokens == 300 and e.kv_cache_usage == 0.25  # the rest of the page is read
    w = EngineWatch(ENGINE)
    w.record(0.0, _page(prompt="100"), 0)
    w.record(6.0, _page(running="336229", prompt="-5"), 0)
    f = w.figures()
    assert f.answering and f.requests_running is None and f.prompt_tokens_per_s is None
    assert set(f.invalid) == {"requests_running", "prompt_tokens"}
    assert GAUGE_BOUNDS["requests_running"] < 336229
    (ok,) = parse_metrics(_page(running=str(int(GAUGE_BOUNDS["requests_running"]))))
    assert ok.requests_running == GAUGE_BOUNDS["requests_running"] and not ok.invalid


def test_a_data_parallel_rank_with_a_negative_counter_makes_the_engines_figure_unknown():
    rank = 'engine="1",model_name="glm"'
    text = _page() + f"vllm:generation_tokens_total{{{rank}}} -40\n"
    w = EngineWatch(ENGINE)
    w.record(0.0, text, 0)
    f = w.figures()
    assert "generation_tokens" in f.invalid  # not 300 (rank 0 alone) shown as the engine's total


# ---- a big page is parsed off the event loop --------------------------------------------------------

async def test_a_big_page_is_parsed_in_a_worker_thread(monkeypatch):
    calls: list[object] = []
    real = asyncio.to_thread

    async def spy(fn, *args, **kwargs):
        calls.append(fn)
        return await real(fn, *args, **kwargs)

    monkeypatch.setattr(poller_mod.asyncio, "to_thread", spy)
    p = NodePoller(NodeConfig("n1", "localhost"), LocalTransport("n1"), serving=True)
    p.state.engines[8000] = EngineWatch(ENGINE)
    lines = "".join(f'vllm:num_requests_running{{engine="{i}",model_name="glm"}} 1\n'
                    for i in range(INLINE_PAGE_LINES + 10))
    name = metrics_section(8000)
    await p._serving_read(split_tick([f"{MARK} section {name}", *lines.splitlines(),
                                      f"{PAGE_MARK} http://127.0.0.1:8000/metrics 200",
                                      f"{MARK} rc {name} 0"]), 0.0)
    assert calls == [parse_metrics]
    assert p.state.engines[8000].figures().requests_running == INLINE_PAGE_LINES + 10


# ---- the transport: a command's output never grows without limit ----------------------------------

async def test_a_never_ending_stdout_keeps_at_most_max_bytes_through_the_local_transport():
    t = LocalTransport("n1")
    tracemalloc.start()
    try:
        res = await t.run("yes sparkconsole", timeout=60, max_bytes=256 * 1024)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert res.truncated and res.exit_status is None and not res.ok
    assert res.stdout.endswith(cut_marker(256 * 1024))
    assert len(res.stdout.encode()) == 256 * 1024 + len(cut_marker(256 * 1024).encode())
    # a few copies of the bound (the read buffer, its bytes, the decoded text, the result's text with
    # the marker), never what the command printed: `yes` writes gigabytes in the time this takes
    assert peak < 8 * 256 * 1024, peak
    # stderr too, and a command within the bound is whole
    res = await t.run("yes err >&2", timeout=60, max_bytes=1000)
    assert res.truncated and res.stderr.endswith(cut_marker(1000)) and res.stdout == ""
    res = await t.run("printf 'abc'", max_bytes=3)
    assert (res.stdout, res.truncated, res.exit_status) == ("abc", False, 0)


@pytest.mark.sshd
async def test_a_never_ending_stdout_keeps_at_most_max_bytes_through_ssh(sshd):
    from sparkconsole.transport import make_transport

    t = make_transport(sshd.node_config("node-a"), connect_timeout=5)
    try:
        res = await t.run("yes sparkconsole", timeout=60, max_bytes=256 * 1024)
        assert res.truncated and res.exit_status is None
        assert len(res.stdout.encode()) == 256 * 1024 + len(cut_marker(256 * 1024).encode())
        assert (await t.run("echo ok", max_bytes=3)).stdout == "ok\n"
    finally:
        await t.close()


# ---- the probe: each section cut on the node, the whole answer bounded in the console ---------------

async def test_an_endless_docker_ps_is_cut_on_the_node_and_not_read(tmp_path: Path, monkeypatch):
    docker = tmp_path / "docker"
    docker.write_text("#!/bin/sh\nyes '{\"ID\":\"0123456789ab\",\"Names\":\"x\",\"State\":\"running\"}'"
                      f" | head -c {LIST_MAX_BYTES + 2 * MiB}\n")
    docker.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{Path('/usr/bin')}:{Path('/bin')}")
    t = LocalTransport("n1")
    proc = await t.open_process(probe_command())
    try:
        await proc.write_line("docker-ps uptime")
        lines: list[str] = []
        while (line := await proc.read_line()) is not None and not line.startswith(f"{MARK} end"):
            lines.append(line)
    finally:
        await proc.close()
    assert sum(len(ln) + 1 for ln in lines) <= LIST_MAX_BYTES + 4096
    secs = split_tick(lines)
    ps = secs["docker-ps"]
    assert (ps.cut, ps.rc, ps.text) == (LIST_MAX_BYTES, 141, cut_text(LIST_MAX_BYTES))
    assert secs["uptime"].rc == 0 and secs["uptime"].text  # the next section is read as before


class _Flood:
    """A probe process that answers every request with ``n`` lines in one section."""

    def __init__(self, n: int) -> None:
        self.n, self.queue, self.is_closing = n, [], False

    async def write_line(self, line: str) -> None:
        self.queue += [f"{MARK} begin 1", f"{MARK} section uptime", *("x" for _ in range(self.n)),
                       f"{MARK} rc uptime 0", f"{MARK} end 1"]

    async def read_line(self) -> str | None:
        return self.queue.pop(0) if self.queue else None

    async def close(self) -> None:
        self.is_closing = True


class _FloodTransport:
    node, connected, last_error = "n1", True, None

    def __init__(self, proc: _Flood) -> None:
        self.proc = proc

    async def open_process(self, cmd) -> _Flood:
        return self.proc

    async def close(self) -> None:
        pass


async def test_a_flood_of_lines_in_the_probes_answer_is_dropped_and_the_tick_says_why():
    flood = _Flood(TICK_MAX_LINES + 5)
    p = NodePoller(NodeConfig("n1", "localhost"), _FloodTransport(flood), serving=False)  # type: ignore[arg-type]
    p.patience = 30.0
    state = await p.poll_once()
    assert state.status is not NodeStatus.UP and state.sample is None
    assert f"{TICK_MAX_LINES} lines" in state.reason and "not read" in state.reason
    assert flood.queue == []  # read to its end: the next request starts in step
