"""The simulated ``nvidia-smi`` in loop mode (``-l SEC``, ``--loop=SEC``, ``-lms MS``, ``--loop-ms=MS``),
as the console's long-lived GPU readers use it, and the node's process-start counter.

The formats are the real tool's (driver 580.159.04, captured on an H200): a query prints its
header once, then one row per GPU (``--query-gpu``) or per GPU process (``--query-compute-apps``,
nothing at all for a sample without processes) every interval; ``-l`` alone prints the whole table
every interval. The clock is manual: every sample is due at a sim time, and the tests advance the
clock one interval at a time and wait (in event-loop turns, not wall time) for the row it brings.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time

import asyncssh
import pytest

from sparkconsole.sim import Shell, SimClock, build, start_demo_cluster
from sparkconsole.sim.clock import DEFAULT_EPOCH
from sparkconsole.sim.formats import smi_timestamp
from sparkconsole.sim.shell import Capture
from tests.conftest import real_fixture
from tests.proc_support import wait_until

HEAD, WORKER = "spark-1a32", "spark-5be3"
GPU_Q = "--query-gpu=index,timestamp,utilization.gpu,memory.used,power.draw"
APPS_Q = "--query-compute-apps=timestamp,pid,process_name,used_gpu_memory"
GPU_HEAD = "index, timestamp, utilization.gpu [%], memory.used [MiB], power.draw [W]"
APPS_HEAD = "timestamp, pid, process_name, used_gpu_memory [MiB]"
STAMP = r"\d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2}\.\d{3}"
START = time.strftime("%Y/%m/%d %H:%M:%S", time.gmtime(DEFAULT_EPOCH)) + ".000"  # sim time 0


async def turns(pred, hops: int = 200) -> bool:
    """Let the node's tasks run (event-loop turns at a standing sim time) until ``pred`` holds."""
    for _ in range(hops):
        if pred():
            return True
        await asyncio.sleep(0)
    return bool(pred())


class Loop:
    """``cmd`` running in a node's shell as a task; its output as it comes."""

    def __init__(self, c, node: str, cmd: str) -> None:
        self.c, self.out, self.err = c, Capture(), Capture()
        self.task = asyncio.ensure_future(Shell(c, node).run(cmd, self.out, self.err))

    def lines(self) -> list[str]:
        return self.out.text().splitlines()

    async def ready(self) -> None:
        """Wait until the tool took its first sample and sleeps on the clock (the manual clock
        holds its sleeper), so that the next :meth:`step` brings the next sample."""
        assert await turns(lambda: bool(smi_procs(self.c)) and any(not f.done() for _, f in self.c.clock._waiters))

    async def step(self, seconds: float, want_lines: int) -> None:
        """Advance the clock ``seconds`` and wait until the output holds ``want_lines`` lines."""
        self.c.clock.advance(seconds)
        assert await turns(lambda: len(self.lines()) >= want_lines), (self.c.clock.now(), self.lines())
        assert len(self.lines()) == want_lines, self.lines()

    async def stop(self) -> None:
        self.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self.task


def smi_procs(c, node: str = HEAD) -> list:
    return [p for p in c.proc_table(node).procs.values() if p.argv and p.argv[0] == "nvidia-smi"]


# ---- the timestamp field --------------------------------------------------------------------------


async def test_timestamp_field_in_one_shot_queries_reads_the_sim_clock() -> None:
    c = build("story", clock=SimClock.frozen())
    c.clock.advance(12.345)
    o, e, rc = await Shell(c, HEAD).capture(f"nvidia-smi {GPU_Q} --format=csv,noheader")
    assert rc == 0 and e == ""
    (row,) = o.splitlines()
    idx, stamp, util, mem, power = row.split(", ")
    assert idx == "0" and stamp == smi_timestamp(c, 12.345)
    assert stamp == time.strftime("%Y/%m/%d %H:%M:%S", time.gmtime(DEFAULT_EPOCH + 12)) + ".345"
    assert util.endswith(" %") and mem == "[N/A]" and power.endswith(" W")
    # the same wall clock as the table's date line
    table, _, _ = await Shell(c, HEAD).capture("nvidia-smi")
    assert table.splitlines()[0].strip() == time.strftime("%a %b %d %H:%M:%S %Y", time.gmtime(DEFAULT_EPOCH + 12))
    o, _, rc = await Shell(c, HEAD).capture(f"nvidia-smi {APPS_Q} --format=csv")
    lines = o.splitlines()
    assert rc == 0 and lines[0] == APPS_HEAD and len(lines) == 4  # the head's three engines
    assert {ln.split(", ")[0] for ln in lines[1:]} == {smi_timestamp(c, 12.345)}


# ---- --query-gpu in a loop ------------------------------------------------------------------------


@pytest.mark.parametrize("opt", ["-lms 200", "--loop-ms=200"])
async def test_query_gpu_lms_prints_the_header_once_then_a_row_per_interval(opt: str) -> None:
    c = build("story", clock=SimClock.frozen())
    run = Loop(c, HEAD, f"nvidia-smi {GPU_Q} --format=csv {opt}")
    await run.ready()
    assert await turns(lambda: len(run.lines()) == 2)  # the first sample at once
    n = 10
    for k in range(1, n + 1):  # streamed: each interval of sim time brings its row, no more
        await run.step(0.2, 2 + k)
    assert not run.task.done() and run.err.text() == ""
    lines = run.lines()
    assert lines[0] == GPU_HEAD and lines.count(GPU_HEAD) == 1
    rows = [ln.split(", ") for ln in lines[1:]]
    assert len(rows) == n + 1
    assert rows[0][1] == START
    for k, (idx, stamp, util, mem, power) in enumerate(rows):
        t = round(0.2 * k, 6)
        assert idx == "0" and stamp == smi_timestamp(c, t)
        assert re.fullmatch(STAMP, stamp)
        # sampled at each interval: the values of that sim time
        assert util == f"{c.gpu_util(HEAD, t)} %" and power == f"{c.gpu_power(HEAD, t):.2f} W"
        assert mem == "[N/A]"  # unified memory: the Spark's GPU reports no memory.used
    await run.stop()
    assert await turns(lambda: not smi_procs(c))  # SIGHUP: the process is gone


async def test_query_gpu_noheader_loop_has_no_header_and_l_counts_seconds() -> None:
    c = build("healthy", clock=SimClock.frozen())
    run = Loop(c, HEAD, f"nvidia-smi {GPU_Q} --format=csv,noheader -l 2")
    await run.ready()
    assert await turns(lambda: len(run.lines()) == 1)
    await run.step(1.0, 1)  # half an interval: nothing new
    await run.step(1.0, 2)
    for k in range(3, 6):
        await run.step(2.0, k)
    assert all(not ln.startswith("index") for ln in run.lines())
    assert [ln.split(", ")[1][-12:] for ln in run.lines()] == [
        smi_timestamp(c, t)[-12:] for t in (0, 2, 4, 6, 8)]
    await run.stop()


async def test_the_loop_follows_the_load_as_it_moves() -> None:
    # the healthy head is idle; an engine started during the loop shows in the later samples
    c = build("healthy", clock=SimClock.frozen())
    run = Loop(c, HEAD, f"nvidia-smi {APPS_Q} --format=csv,noheader -l 5")
    await run.ready()
    assert run.out.text() == ""
    started = asyncio.ensure_future(Shell(c, HEAD).capture(
        "docker run -d --name q --network host vllm/vllm-openai:v0.17.0 Qwen/Qwen3-Embedding-0.6B "
        "--gpu-memory-utilization 0.05"))
    waited = 0.0
    while not (started.done() and run.lines()):
        assert waited < 300, "the engine never held GPU memory"
        c.clock.advance(5.0)
        waited += 5.0
        await turns(lambda: started.done() and bool(run.lines()), hops=50)
    assert started.result()[2] == 0
    rows = [ln.split(", ") for ln in run.lines()]
    assert len(rows) == 1 and rows[0][0] == smi_timestamp(c, waited)  # this interval's sample, not a backlog
    (holder, used), = c.memory(HEAD, waited).gpu_holders
    assert rows[0][1:] == [str(holder.pid), holder.name, f"{used // 2**20} MiB"]
    await run.stop()


# ---- --query-compute-apps in a loop ---------------------------------------------------------------


async def test_compute_apps_loop_prints_every_process_each_interval_with_one_stamp() -> None:
    c = build("story", clock=SimClock.frozen())  # the head runs three engines
    pids = sorted(str(h.pid) for h, _ in c.memory(HEAD, 0).gpu_holders)
    assert len(pids) == 3
    run = Loop(c, HEAD, f"nvidia-smi {APPS_Q} --format=csv -lms 500")
    await run.ready()
    assert await turns(lambda: len(run.lines()) == 4)
    for k in range(1, 4):
        await run.step(0.5, 1 + 3 * (k + 1))
    lines = run.lines()
    assert lines[0] == APPS_HEAD and lines.count(APPS_HEAD) == 1
    rows = [ln.split(", ") for ln in lines[1:]]
    for k in range(4):
        sample = rows[3 * k:3 * k + 3]
        assert {r[0] for r in sample} == {smi_timestamp(c, 0.5 * k)}  # one stamp per sample
        assert sorted(r[1] for r in sample) == pids
        assert all(re.fullmatch(r"\d+ MiB", r[3]) for r in sample)
    await run.stop()


async def test_compute_apps_loop_without_processes_prints_only_the_header() -> None:
    c = build("healthy", clock=SimClock.frozen())  # nothing holds the GPU
    assert not c.memory(HEAD, 0).gpu_holders
    run = Loop(c, HEAD, f"nvidia-smi {APPS_Q} --format=csv -lms 500")
    await run.ready()
    assert await turns(lambda: len(run.lines()) == 1)
    for _ in range(6):
        await run.step(0.5, 1)
    assert run.lines() == [APPS_HEAD] and not run.task.done()
    await run.stop()
    run = Loop(c, HEAD, f"nvidia-smi {APPS_Q} --format=csv,noheader -lms 500")
    await run.ready()
    for _ in range(3):
        await run.step(0.5, 0)
    assert run.out.text() == "" and not run.task.done()
    await run.stop()


# ---- the table in a loop --------------------------------------------------------------------------


async def test_plain_l_prints_the_whole_table_every_interval() -> None:
    c = build("story", clock=SimClock.frozen())
    one, _, _ = await Shell(c, HEAD).capture("nvidia-smi")
    per = len(one.splitlines())
    run = Loop(c, HEAD, "nvidia-smi -l 1")
    await run.ready()
    assert await turns(lambda: len(run.lines()) == per)
    for k in range(2, 5):
        await run.step(1.0, per * k)
    dates = [ln.strip() for ln in run.lines() if re.fullmatch(r"\w{3} \w{3} \d{2} \d{2}:\d{2}:\d{2} \d{4}\s*", ln)]
    assert dates == [time.strftime("%a %b %d %H:%M:%S %Y", time.gmtime(DEFAULT_EPOCH + s)) for s in range(4)]
    assert run.out.text().count("| NVIDIA-SMI ") == 4
    await run.stop()


async def test_l_without_a_value_loops_every_five_seconds_and_bad_values_are_refused() -> None:
    c = build("healthy", clock=SimClock.frozen())
    run = Loop(c, HEAD, f"nvidia-smi {GPU_Q} --format=csv,noheader -l")
    await run.ready()
    assert await turns(lambda: len(run.lines()) == 1)
    await run.step(4.0, 1)
    await run.step(1.0, 2)
    await run.stop()
    for bad in ("-lms", "-lms 0", "--loop=x", "--loop-ms="):
        o, e, rc = await Shell(c, HEAD).capture(f"nvidia-smi {GPU_Q} --format=csv {bad}")
        assert (rc, o) == (2, ""), bad
        assert e.startswith("Invalid combination of input arguments"), bad


async def test_without_a_loop_option_nvidia_smi_answers_once() -> None:
    c = build("story", clock=SimClock.frozen())
    task = asyncio.ensure_future(Shell(c, HEAD).capture(f"nvidia-smi {GPU_Q} --format=csv"))
    assert await turns(task.done)  # no sim time needed
    o, e, rc = task.result()
    assert rc == 0 and e == "" and len(o.splitlines()) == 2


# ---- stopping -------------------------------------------------------------------------------------


async def test_the_loop_stops_when_its_task_is_cancelled() -> None:
    c = build("story", clock=SimClock.frozen())
    run = Loop(c, HEAD, f"nvidia-smi {GPU_Q} --format=csv -lms 200")
    await run.ready()
    await run.step(0.2, 3)
    assert len(smi_procs(c)) == 1  # the sh -c execs nvidia-smi: one process, named so
    await run.stop()
    assert await turns(lambda: not smi_procs(c))
    before = run.out.text()
    for _ in range(5):
        c.clock.advance(0.2)
        await turns(lambda: False, hops=10)
    assert run.out.text() == before


async def test_the_loop_is_killed_by_pid_like_any_process() -> None:
    c = build("story", clock=SimClock.frozen())
    run = Loop(c, HEAD, f"nvidia-smi {GPU_Q} --format=csv,noheader -lms 200")
    await run.ready()
    await run.step(0.2, 2)
    (p,) = smi_procs(c)
    _, e, rc = await Shell(c, HEAD).capture(f"kill {p.pid}")
    assert rc == 0, e
    assert await turns(run.task.done)
    assert run.task.result() == 143 and not smi_procs(c)


async def test_the_loop_streams_over_ssh_and_stops_when_the_channel_closes() -> None:
    clock = SimClock.frozen()
    async with start_demo_cluster(clock=clock) as demo:
        node = demo.config.node(HEAD)
        async with asyncssh.connect(node.host, port=node.port, username=node.user, client_keys=[node.identity],
                                    known_hosts=node.known_hosts) as conn:
            proc = await conn.create_process(f"nvidia-smi {GPU_Q} --format=csv -lms 200")
            assert (await asyncio.wait_for(proc.stdout.readline(), 5)).rstrip("\n") == GPU_HEAD
            first = await asyncio.wait_for(proc.stdout.readline(), 5)
            assert first.split(", ")[1] == START
            for k in range(1, 4):  # each row arrives once its interval of sim time has passed
                clock.advance(0.2)
                row = await asyncio.wait_for(proc.stdout.readline(), 5)
                assert row.split(", ")[1] == smi_timestamp(demo.sim, round(0.2 * k, 6))
            assert len(smi_procs(demo.sim)) == 1
            proc.close()
            await asyncio.wait_for(proc.wait_closed(), 5)
            assert await wait_until(lambda: not smi_procs(demo.sim)), "nvidia-smi outlived its channel"


# ---- the process-start counter --------------------------------------------------------------------


async def started_by(c, node: str, line: str) -> int:
    """Processes ``line`` starts on ``node`` in a running shell (the shell's own process not counted:
    the difference to the same script with ``:`` in its place)."""
    table = c.proc_table(node)

    async def count(cmd: str) -> int:
        n = table.started
        await Shell(c, node).capture(f"{cmd}\n:", stdin="x\n")
        return table.started - n

    return await count(line) - await count(":")


async def test_started_counts_each_external_command_and_no_builtin() -> None:
    c = build("story", clock=SimClock.frozen())
    table = c.proc_table(HEAD)
    n = table.started
    await Shell(c, HEAD).capture("nvidia-smi -L")
    assert table.started == n + 1  # sh -c, which execs nvidia-smi
    assert await started_by(c, HEAD, "echo hi") == 0
    assert await started_by(c, HEAD, "read x") == 0
    assert await started_by(c, HEAD, "nvidia-smi -L") == 1
    assert await started_by(c, HEAD, "nvidia-smi -L; hostname") == 2
    assert await started_by(c, HEAD, "sleep 1 &") == 1  # a background job
    assert await started_by(c, HEAD, "setsid nohup sleep 1 &") == 1  # the job execs setsid, nohup, sleep
    n = table.started
    table.restart_pids()
    assert table.started == n  # a reboot's pid restart does not reset the count


async def test_started_counts_timeout_and_its_command() -> None:
    """coreutils' timeout forks its command: two processes, as the probe's count on a node says."""
    c = build("story", clock=SimClock.frozen())
    assert await started_by(c, HEAD, "timeout 5 nvidia-smi -L") == 2


# ---- against the real captures (tests/fixtures/real/h200/loop_*.txt) --------------------------------


def _real_lines(name: str) -> list[str]:
    """A capture's lines (those read line by line carry the arrival second first: dropped)."""
    return [re.sub(r"^\d+\.\d+ ", "", ln) for ln in real_fixture(f"h200/{name}").splitlines() if ln.strip()]


def _shape(line: str) -> str:
    """A line with its numbers and stamps blurred: what must agree between the sim and the real tool."""
    line = re.sub(STAMP, "STAMP", line)
    line = re.sub(r"\[N/A\]|\d+ MiB", "MEM", line)  # a Spark's unified memory: [N/A], an H200's: MiB
    line = re.sub(r", [^,]+, MEM$", ", NAME, MEM", line)  # a process's name
    return re.sub(r"\d+(\.\d+)?", "N", line)


@pytest.mark.parametrize("capture,scenario,query,interval", [
    ("loop_query_gpu_lms200.txt", "story", GPU_Q, 0.2),
    ("loop_query_apps_two_lms500.txt", "story", APPS_Q, 0.5),
    ("loop_query_apps_none_lms300.txt", "healthy", APPS_Q, 0.3),
])
async def test_loop_output_has_the_real_captures_shape(capture: str, scenario: str, query: str,
                                                       interval: float) -> None:
    real = _real_lines(capture)
    c = build(scenario, clock=SimClock.frozen())
    run = Loop(c, HEAD, f"nvidia-smi {query} --format=csv -lms {int(interval * 1000)}")
    await run.ready()
    for _ in range(3):
        c.clock.advance(interval)
        await turns(lambda: False, hops=20)
    sim = run.lines()
    await run.stop()
    assert sim[0] == real[0]  # the header, once
    assert {_shape(ln) for ln in sim[1:]} == {_shape(ln) for ln in real[1:]}
    for lines in (sim, real):  # the rows of one sample share its stamp; samples are an interval apart
        stamps = sorted({ln.split(", ")[1 if query == GPU_Q else 0] for ln in lines[1:]})
        ms = [int(s[-6:-4]) * 1000 + int(s[-3:]) for s in stamps]
        assert all(abs((b - a) - interval * 1000) <= 10 for a, b in itertools.pairwise(ms))
