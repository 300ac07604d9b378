"""The memory guard's policy from data, the PSI probe section, and the node-side watcher."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sparkconsole import remote
from sparkconsole.errors import ValidationError
from sparkconsole.probe import memory_guard as mg
from sparkconsole.probe import parsers as P
from sparkconsole.probe.script import SECTION_BY_NAME, sections_for_tick
from sparkconsole.sim.model import SimCluster

GIB = mg.GIB
SPARK_TOTAL = 128_526_168 * 1024  # MemTotal of a DGX Spark (tests/fixtures/real/gb10)

# /proc/pressure/memory as a kernel prints it (Documentation/accounting/psi.rst)
CALM = "some avg10=0.00 avg60=0.00 avg300=0.00 total=1032\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=734\n"


def psi(some: float, full: float) -> str:
    return f"some avg10={some:.2f} avg60=1.00 avg300=0.50 total=99999\nfull avg10={full:.2f} avg60=0.70 avg300=0.30 total=55555\n"


def reading(avail_gib: float, text: str = CALM, swap_total: int = 0, swap_free: int = 0) -> mg.Reading:
    return mg.Reading(SPARK_TOTAL, round(avail_gib * GIB), swap_total, swap_free, mg.parse_pressure(text))


# -- floors ---------------------------------------------------------------------------------------

def test_floors_from_total() -> None:
    warn, hard = mg.floors(SPARK_TOTAL)
    assert warn == max(4 * GIB, round(SPARK_TOTAL * 0.03))  # 3 % of 122.6 GiB is 3.7 GiB: 4 GiB wins
    assert warn == 4 * GIB and hard == 2 * GIB
    big = 1024 * GIB
    assert mg.floors(big) == (round(big * 0.03), round(big * 0.015))


def test_floors_per_cluster_and_hard_never_above_warn() -> None:
    assert mg.floors(SPARK_TOTAL, mg.GuardConfig(warn_floor_bytes=8 * GIB)) == (8 * GIB, 2 * GIB)
    assert mg.floors(SPARK_TOTAL, mg.GuardConfig(hard_floor_bytes=6 * GIB)) == (6 * GIB, 6 * GIB)
    with pytest.raises(ValueError):
        mg.GuardConfig(stall_ticks=0)
    with pytest.raises(ValueError):
        mg.GuardConfig(full_act_pct=0)


# -- PSI ------------------------------------------------------------------------------------------

def test_parse_pressure() -> None:
    p = mg.parse_pressure(psi(31.5, 12.25))
    assert p is not None and (p.some_avg10, p.full_avg10, p.some_total_us, p.full_total_us) == (31.5, 12.25, 99999, 55555)
    only_some = mg.parse_pressure("some avg10=1.50 avg60=0.00 avg300=0.00 total=7\n")
    assert only_some is not None and only_some.full_avg10 is None
    for bad in ("", "cat: /proc/pressure/memory: No such file or directory", "some avg10=x", "\x1b[2J"):
        assert mg.parse_pressure(bad) is None


def test_psi_section_is_read_by_the_shell_every_tick() -> None:
    sec = SECTION_BY_NAME["psi"]
    assert sec.how == "read" and sec.every == 1 and sec.optional
    assert sec.arm() == "rd /proc/pressure/memory"  # a builtin loop: no process per tick
    assert all("psi" in sections_for_tick(t) for t in range(5))
    reasons: dict[str, str] = {}
    assert P.parse_psi("sh: 1: cannot open /proc/pressure/memory: No such file", reasons) is None
    assert "psi" in reasons
    assert P.parse_psi(CALM).full_avg10 == 0.0


# -- one tick -------------------------------------------------------------------------------------

def test_plenty_is_ok() -> None:
    state, d = mg.step(mg.GuardState(), reading(40))
    assert d.level == "ok" and d.cause == "" and state.stall_ticks == 0


def test_below_warning_floor_warns() -> None:
    _, d = mg.step(mg.GuardState(), reading(3.5))
    assert d.level == "warn" and "warning floor" in d.cause
    assert any("3.5 GiB" in r and "4.0 GiB" in r for r in d.reasons)


def test_below_hard_floor_acts_at_once() -> None:
    _, d = mg.step(mg.GuardState(), reading(1.5))
    assert d.level == "act" and "hard floor" in d.cause and d.hard_floor_bytes == 2 * GIB


def test_full_pressure_acts_only_after_n_ticks() -> None:
    cfg = mg.GuardConfig(stall_ticks=3)
    state = mg.GuardState()
    levels = []
    for _ in range(3):
        state, d = mg.step(state, reading(20, psi(40, 25)), cfg)
        levels.append(d.level)
    assert levels == ["warn", "warn", "act"]
    assert d.cause == "memory pressure stalled the node" and any("3 ticks" in r for r in d.reasons)


def test_one_calm_tick_resets_the_count() -> None:
    cfg = mg.GuardConfig(stall_ticks=2)
    state, _ = mg.step(mg.GuardState(), reading(20, psi(40, 25)), cfg)
    state, d = mg.step(state, reading(20, CALM), cfg)
    assert state.stall_ticks == 0 and d.level == "ok"
    state, d = mg.step(state, reading(20, psi(40, 25)), cfg)
    assert d.level == "warn" and state.stall_ticks == 1


def test_some_pressure_and_swap_warn() -> None:
    _, d = mg.step(mg.GuardState(), reading(20, psi(35, 2)))
    assert d.level == "warn" and "waiting" in d.cause
    _, d = mg.step(mg.GuardState(), reading(20, CALM, swap_total=16 * GIB, swap_free=4 * GIB))
    assert d.level == "warn" and "swap" in d.cause and any("12.0 GiB of 16.0 GiB" in r for r in d.reasons)


def test_no_psi_still_guards_the_floor() -> None:
    r = mg.Reading(SPARK_TOTAL, 1 * GIB, pressure=None)
    _, d = mg.step(mg.GuardState(), r)
    assert d.level == "act"


# -- what to stop ---------------------------------------------------------------------------------

def test_stop_order() -> None:
    C = mg.Candidate
    cands = [
        C("old-engine", "engine", True, 100.0), C("bench-1", "bench", True, 300.0),
        C("new-engine", "engine", True, 200.0), C("their-vllm", "engine", False, 400.0),
        C("jupyter", "service", False, 50.0, expendable=True), C("bench-0", "bench", True, 250.0),
    ]
    assert [c.name for c in mg.stop_order(cands)] == ["new-engine", "old-engine", "bench-1", "bench-0", "jupyter"]
    assert mg.stop_order([C("their-vllm", "engine", False, 1.0)]) == ()


# -- why, in words --------------------------------------------------------------------------------

def test_why_words_biggest_first_with_the_prompt() -> None:
    h = mg.Holders(weights_bytes=60 * GIB, kv_cache_bytes=36 * GIB, cuda_graphs_bytes=int(1.7 * GIB),
                   gpu_processes=((4242, "python3", 9 * GIB),), page_cache_bytes=12 * GIB,
                   prompt_tokens=131072, max_model_len=262144)
    lines = mg.why_words(h, cause="memory pressure stalled the node")
    assert lines[0] == "memory pressure stalled the node"
    assert lines[1].startswith("held: model weights 60.0 GiB, KV cache 36.0 GiB, page cache 12.0 GiB, another GPU process python3")
    assert "131072-token prompt of 262144" in lines[2]
    assert "not known" in mg.why_words(mg.Holders())[0]


def test_prefill_advice() -> None:
    # 100 GiB committed on a 122.6 GiB node, 4 GiB floor: 18.6 GiB of room at 1 MiB a token
    fits, advice = mg.prefill_advice(total_bytes=SPARK_TOTAL, committed_bytes=100 * GIB, max_model_len=131072,
                                     max_batched_tokens=None, bytes_per_token=1 << 20)
    room = SPARK_TOTAL - 100 * GIB - 4 * GIB
    assert fits == room // (1 << 20)
    assert any(f"--max-num-batched-tokens {fits}" in a for a in advice)
    assert any("--max-model-len" in a for a in advice)
    fits2, ok = mg.prefill_advice(total_bytes=SPARK_TOTAL, committed_bytes=100 * GIB, max_model_len=131072,
                                  max_batched_tokens=8192, bytes_per_token=1 << 20)
    assert fits2 == fits and ok == ()


# -- the node-side watcher, run for real against a fake /proc ---------------------------------------


MEMINFO = """MemTotal:       128526168 kB
MemFree:         {free} kB
MemAvailable:    {avail} kB
Buffers:           10240 kB
Cached:          2048000 kB
SwapCached:            0 kB
SwapTotal:      16777212 kB
SwapFree:       16000000 kB
Zswap:                 0 kB
"""


def fake_node(tmp: Path, avail_kib: int, pressure: str = CALM) -> dict[str, str]:
    (tmp / "meminfo").write_text(MEMINFO.format(free=avail_kib // 2, avail=avail_kib))
    (tmp / "pressure").write_text(pressure)
    docker = tmp / "docker"
    docker.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp / 'docker.log'}\n")
    docker.chmod(0o755)
    return {"meminfo": str(tmp / "meminfo"), "pressure": str(tmp / "pressure"), "docker": str(docker)}


def wait_for(cond: Callable[[], object], what: str, deadline_s: float = 20.0) -> object:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def read(p: str) -> str:
    try:
        return Path(p).read_text()
    except FileNotFoundError:
        return ""


def arm(tmp: Path, targets: list[str], *, stall: int = 2, **paths: str) -> remote.GuardFiles:
    jobs = str(tmp / "jobs")
    files = remote.GuardFiles.under(jobs)
    warn, hard = mg.floors(SPARK_TOTAL)
    watch = remote.memory_guard_watch("spark-a", files, targets, warn_floor_bytes=warn, hard_floor_bytes=hard,
                                      full_act_pct=10.0, stall_ticks=stall, interval_s=1, **paths)
    res = subprocess.run(["sh", "-c", remote.memory_guard_arm(jobs, files, watch).shell()],
                         capture_output=True, text=True, timeout=10)
    assert res.returncode == 0 and res.stdout.strip().isdigit(), res.stderr
    return files


needs_setsid = pytest.mark.skipif(shutil.which("setsid") is None, reason="setsid(1) not on this machine")


@needs_setsid
def test_watcher_stops_targets_in_order_below_the_hard_floor(tmp_path: Path) -> None:
    paths = fake_node(tmp_path, avail_kib=1024 * 1024)  # 1 GiB available: under the 2 GiB hard floor
    files = arm(tmp_path, ["engine-new", "bench-1"], stall=1, **paths)
    wait_for(lambda: read(files.job.rc).strip() == "0", "the watcher to end after stopping both")
    assert read(str(tmp_path / "docker.log")).splitlines() == ["stop -t 10 engine-new", "stop -t 10 bench-1"]
    reason = read(files.reason)
    assert reason.count("\n") == 1 and reason.startswith("acted node=spark-a cause=floor avail_kib=1048576 ")
    assert f"hard_kib={2 * GIB // 1024}" in reason and "stopped=engine-new,bench-1 rc=0" in reason
    assert not Path(files.state + ".fifo").exists()
    def status_of() -> mg.GuardStatus | None:
        return mg.parse_guard_status(subprocess.run(["sh", "-c", remote.memory_guard_status(files).shell()],
                                                    capture_output=True, text=True, timeout=10).stdout)
    status = wait_for(lambda: (st := status_of()) is not None and not st.running and st, "the job to be gone")
    assert isinstance(status, mg.GuardStatus) and status.armed and status.level == "acted" and status.event
    ev = status.event
    assert (ev.node, ev.stopped, ev.available_bytes, ev.hard_floor_bytes) == (
        "spark-a", ("engine-new", "bench-1"), GIB, 2 * GIB)
    assert ev.words() == ("spark-a: the memory guard stopped engine-new, bench-1: available memory below the hard "
                          "floor; MemAvailable 1.0 GiB, hard floor 2.0 GiB; pressure full 0.0% some 0.0% (avg10)")


@needs_setsid
def test_watcher_acts_on_sustained_pressure_only(tmp_path: Path) -> None:
    paths = fake_node(tmp_path, avail_kib=40 * 1024 * 1024, pressure=psi(45.5, 25.25))
    files = arm(tmp_path, ["engine-new"], stall=2, **paths)
    wait_for(lambda: "stall=1/2" in read(files.state), "a first high-pressure tick to warn")
    assert read(str(tmp_path / "docker.log")) == ""  # one tick is not enough
    wait_for(lambda: read(files.reason), "the watcher to act")
    reason = read(files.reason)
    assert "cause=pressure" in reason and "full_x100=2525" in reason and "some_x100=4550" in reason
    assert read(str(tmp_path / "docker.log")).splitlines() == ["stop -t 10 engine-new"]
    status = mg.parse_guard_status(subprocess.run(["sh", "-c", remote.memory_guard_status(files).shell()],
                                                  capture_output=True, text=True, timeout=10).stdout)
    assert status is not None and status.event is not None
    assert status.event.cause == "memory pressure stalled the node" and status.event.full_avg10 == 25.25


@needs_setsid
def test_disarm_then_remove_leaves_nothing(tmp_path: Path) -> None:
    paths = fake_node(tmp_path, avail_kib=40 * 1024 * 1024)
    files = arm(tmp_path, ["engine-new"], **paths)
    wait_for(lambda: read(files.state).startswith("ok node=spark-a"), "a calm tick")
    subprocess.run(["sh", "-c", remote.memory_guard_disarm(files).shell()], check=True, timeout=10)
    pid = int(read(files.job.pid).split()[0])
    wait_for(lambda: not Path(f"/proc/{pid}").exists() or "Z" in read(f"/proc/{pid}/stat").split()[2:3],
             "the watcher to end")
    subprocess.run(["sh", "-c", remote.memory_guard_remove(files).shell()], check=True, timeout=10)
    assert os.listdir(tmp_path / "jobs") == []
    assert read(str(tmp_path / "docker.log")) == ""


@pytest.mark.skipif(shutil.which("dash") is None, reason="dash not on this machine")
def test_watcher_under_plain_sh_uses_sleep(tmp_path: Path) -> None:
    """Where there is no bash the same script runs in sh (dash): the wait is ``sleep``."""
    paths = fake_node(tmp_path, avail_kib=1024 * 1024)
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    files = remote.GuardFiles.under(str(jobs))
    Path(files.arm).touch()
    watch = remote.memory_guard_watch("spark-a", files, ["engine-new"], warn_floor_bytes=4 * GIB,
                                      hard_floor_bytes=2 * GIB, full_act_pct=10.0, stall_ticks=1, interval_s=1, **paths)
    script, args = watch.argv[4], watch.argv[5:]
    res = subprocess.run(["dash", "-c", script, "sparkguard", *args], capture_output=True, text=True, timeout=15)
    assert res.returncode == 0, res.stderr
    assert "cause=floor" in read(files.reason) and read(str(tmp_path / "docker.log")) == "stop -t 10 engine-new\n"


def test_watch_command_refuses_bad_targets() -> None:
    files = remote.GuardFiles.under("/tmp/x")
    kw = {"warn_floor_bytes": 4 * GIB, "hard_floor_bytes": 2 * GIB, "full_act_pct": 10.0, "stall_ticks": 3}
    for bad in (["a;rm -rf /"], ["pid:1"], ["pid:abc"], ["-x"]):
        with pytest.raises(ValidationError):
            remote.memory_guard_watch("spark-a", files, bad, **kw)
    with pytest.raises(ValidationError):
        remote.memory_guard_watch("spark a", files, ["e"], **kw)
    cmd = remote.memory_guard_watch("spark-a", files, ["vllm-x", "pid:4242"], **kw)
    assert cmd.mutating and cmd.argv[:2] == ("sh", "-c") and cmd.argv[-2:] == ("vllm-x", "pid:4242")
    assert "vllm-x" in cmd.summary


def test_kernel_log_read_names_its_source() -> None:
    text = remote.kernel_log_read().shell()
    assert "journalctl -k" in text and "dmesg" in text and "dmesg_restrict" in text and "sudo" not in text
    with pytest.raises(ValidationError):
        remote.kernel_log_read(lines=0)


# -- the twin's /proc/pressure/memory -----------------------------------------------------------------

def test_twin_pressure_file_parses_and_rises_as_memory_runs_out() -> None:
    from types import SimpleNamespace

    from sparkconsole.sim import formats, scenarios
    from sparkconsole.sim.clock import SimClock

    c = scenarios.build("healthy", clock=SimClock.frozen())
    node = next(iter(c.nodes))
    calm = mg.parse_pressure(c.virtual_files(c, node)["/proc/pressure/memory"])
    assert calm is not None and calm.full_avg10 == 0.0 and calm.some_total_us > 0

    def twin(avail_share: float) -> mg.Pressure:
        mem = SimpleNamespace(total=SPARK_TOTAL, available=round(SPARK_TOTAL * avail_share))
        fake = SimpleNamespace(memory=lambda n, t: mem, uptime=lambda n, t: 1000.0)
        p = mg.parse_pressure(formats.pressure_memory(fake, node, 0.0))
        assert p is not None
        return p

    fulls = [twin(s).full_avg10 for s in (0.5, 0.09, 0.05, 0.01)]
    assert fulls[0] == 0.0 and fulls == sorted(fulls) and fulls[-1] > mg.FULL_ACT_PCT


# -- the prefill squeeze on the twin ----------------------------------------------------------------

def _twin_reading(c: SimCluster, node: str) -> mg.Reading:
    files = c.virtual_files(c, node)
    mem = P.parse_meminfo(files["/proc/meminfo"])
    return mg.Reading(mem.mem_total_bytes, mem.mem_available_bytes, mem.swap_total_bytes or 0,
                      mem.swap_free_bytes or 0, mg.parse_pressure(files["/proc/pressure/memory"]))


async def test_the_guard_stops_the_squeeze_before_memavailable_reaches_zero() -> None:
    from sparkconsole.sim import Shell, SimClock, build
    from sparkconsole.sim.scenarios import SQUEEZE_AT, SQUEEZE_SPAN

    c = build("prefill-squeeze", clock=SimClock.frozen())
    head = next(iter(c.nodes))
    tick = 2.0
    state, decision, t = mg.GuardState(), None, 0.0
    warned_at = None
    while t < SQUEEZE_AT + SQUEEZE_SPAN + 20:  # the policy, one tick each 2 sim seconds, on the twin's files
        r = _twin_reading(c, head)
        assert r.available_bytes > 0, f"MemAvailable reached zero at sim {t:.0f}s before the guard acted"
        state, decision = mg.step(state, r)
        if decision.level == "warn" and warned_at is None:
            warned_at = t
        if decision.level == "act":
            break
        c.clock.advance(tick)
        t += tick
    assert decision is not None and decision.level == "act", "the squeeze never made the guard act"
    assert SQUEEZE_AT < t < SQUEEZE_AT + SQUEEZE_SPAN
    assert warned_at is not None and warned_at < t  # it warned first
    # what the watcher would do: stop the engine the console started; the twin gives the memory back
    task = asyncio.ensure_future(Shell(c, head).capture("docker stop vllm-glm"))
    for _ in range(200):  # docker stop's grace runs in sim time: advance it until the stop is done
        for _ in range(40):
            await asyncio.sleep(0)
        if task.done():
            break
        c.clock.advance(1.0)
    _out, err, rc = task.result()
    assert rc == 0, err
    c.clock.advance(2)
    after = _twin_reading(c, head)
    assert after.available_bytes > mg.floors(after.total_bytes)[0]
    # left alone (the same twin, never stopped) the squeeze takes the node to its last reserve (the
    # twin keeps the kernel's min_free pages, as a real kernel does) with every task stalled
    c2 = build("prefill-squeeze", clock=SimClock.frozen())
    c2.clock.advance(SQUEEZE_AT + SQUEEZE_SPAN)
    left = _twin_reading(c2, head)
    assert left.available_bytes < mg.HARD_FLOOR_MIN // 8
    assert left.pressure is not None and left.pressure.full_avg10 > 5 * mg.FULL_ACT_PCT


@pytest.mark.parametrize("text", ["", "guard", "guard armed running\nstate \x1b[2J ok avail_kib=99999999999999999999999",
                                  "guard armed running\nreason acted cause=nonsense stopped=x"])
def test_guard_status_from_hostile_text(text: str) -> None:
    st = mg.parse_guard_status(text)
    assert st is None or (st.event is None and st.available_bytes is None)
