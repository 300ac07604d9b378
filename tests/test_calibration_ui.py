"""Calibration in the console (issue 13, item 3): ``c`` on a followed vLLM log sets the planner
beside what that start logged and re-plans from the measured figures.

The log is the demo Spark's own TP=2 start of Qwen/Qwen3.5-122B-A10B-FP8 on vLLM 0.17 (the sim
prints vLLM's lines with the planner's arithmetic, tests/test_planner_sim.py): 1,408 blocks,
"GPU KV cache size: 737,792 tokens", 37.05x at 65,536 tokens. The followed view holds only the
last lines, as a log opened on an engine that has served for a while does; the start is read
from the node (``docker logs NAME | head``), which is what the screen's ``start_reader`` does.
"""

from __future__ import annotations

import time

import pytest
from textual.widgets import Input, Static

from sparkconsole.errors import UserError
from sparkconsole.ui.screens.calibration import CalibrationScreen, parse_change
from sparkconsole.ui.screens.logs import LogScreen, report_lines
from tests.test_logs_ui import FakeFollower, until
from tests.test_planner_sim import _tp2_log
from tests.ui_support import Host

MML = 65_536


def _body(app) -> str:
    return str(app.screen.query_one("#cal-body", Static).render())


async def _open(log: str, tail: int = 5, reader=True):
    follower = FakeFollower()
    reads: list[float] = []

    async def start() -> str:
        reads.append(time.monotonic())
        return log

    host = Host(lambda: LogScreen("spark-1a32", "vllm", lambda: follower, start_reader=start if reader else None))
    return host, follower, reads, log.splitlines()[-tail:]


async def test_c_on_a_followed_vllm_log_shows_planner_beside_log_and_reproduces_the_kv_figures() -> None:
    log = await _tp2_log(MML)
    host, follower, reads, last = await _open(log)
    async with host.run_test(size=(130, 45)) as pilot:
        follower.lines(last)  # only the tail: no memory figure in view
        await until(pilot, lambda: len(host.screen.buffer) >= len(last))
        # the start read once on mount tells the panel what the tail cannot: version, load, KV
        await until(pilot, lambda: host.screen.tracker.report.vllm_version is not None)
        panel = report_lines(host.screen.tracker.report)
        assert panel["head"].startswith("vLLM 0.17.0") and panel["head"].endswith("READY")
        assert "737,792 tokens" in panel["facts"]
        await pilot.press("c")
        await until(pilot, lambda: isinstance(host.screen, CalibrationScreen))
        await until(pilot, lambda: "planner" in _body(host))
        body = _body(host)
        assert reads, "the start of the log was read from the node"
        assert "Qwen/Qwen3.5-122B-A10B-FP8" in str(host.screen.query_one("#cal-title", Static).render())
        row = next(x for x in body.splitlines() if x.startswith("GPU KV cache size"))
        assert row.split()[-2:] == ["737,792", "tokens"]  # the logged figure
        conc = next(x for x in body.splitlines() if x.startswith("max concurrency"))
        assert conc.split()[-1] == "37.05x"
        assert "reproduced exactly: kv_cache_tokens yes, max_concurrency yes" in body
        assert "calibrated (the logged start): fits" in body

        # a re-plan from the measured figures: four times the context on the same blocks
        host.screen.query_one("#cal-mml", Input).value = "262144"
        host.screen.query_one("#cal-mml", Input).focus()
        await pilot.press("enter")
        await until(pilot, lambda: "re-planned:" in _body(host))
        cal = host.screen.calibration
        assert cal is not None and cal.replan is not None
        assert cal.replan.max_model_len == 262_144
        assert cal.replan.capacity.num_blocks == 1_408  # the measured budget, not a new estimate
        assert f"{cal.replan.capacity.max_concurrency:.2f}" == "10.67"  # 1,408 / (126 + 6)
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(host.screen, LogScreen))


async def test_a_log_without_memory_figures_is_one_line_and_bad_input_is_named() -> None:
    lines = ["INFO 03-01 10:00:00 [api_server.py:1] vLLM API server version 0.17.0",
             "INFO 03-01 10:00:01 [utils.py:1] non-default args: {'model': 'Qwen/Qwen3.5-122B-A10B-FP8'}"]
    host, follower, _reads, _last = await _open("\n".join(lines), reader=False)
    async with host.run_test(size=(130, 45)) as pilot:
        follower.lines(lines)
        await until(pilot, lambda: len(host.screen.buffer) >= 2)
        await pilot.press("c")
        await until(pilot, lambda: isinstance(host.screen, CalibrationScreen))
        await until(pilot, lambda: _body(host).startswith("✗"))
        assert "no vLLM memory figures" in _body(host) and len(_body(host).splitlines()) == 1
        host.screen.query_one("#cal-gmu", Input).value = "lots"
        host.screen.recompute()
        await pilot.pause()
        assert _body(host) == "✗ gpu-memory-utilization: 'lots' is not a number"


def test_parse_change_reads_the_fields_as_the_cli_flags() -> None:
    assert parse_change({"max_model_len": "131,072", "gpu_memory_utilization": "0.8", "tp": ""}) == {
        "max_model_len": 131_072, "gpu_memory_utilization": 0.8}
    assert parse_change({}) == {}
    for bad in ({"tp": "0"}, {"gpu_memory_utilization": "1.5"}, {"max_model_len": "-4"}):
        with pytest.raises(UserError, match="out of range") as got:
            parse_change(bad)
        assert "\n" not in str(got.value)


async def test_the_start_reader_reads_a_running_engines_first_lines_on_the_demo_spark() -> None:
    """What ``start_reader`` sends (``docker logs NAME 2>&1 | head -n N``), on the demo head whose
    GLM engine started a day ago: its first lines, version and memory figures included."""
    from sparkconsole.planner.calibrate import read_log
    from sparkconsole.remote import docker_log_head
    from sparkconsole.sim import Shell, SimClock, build

    c = build("story", nodes=2, clock=SimClock.frozen())
    head = next(iter(c.nodes))
    out, err, rc = await Shell(c, head).capture(docker_log_head("vllm-glm", lines=400).shell())
    assert rc == 0, err
    lines = out.splitlines()
    assert 0 < len(lines) <= 400
    lg = read_log(out)
    assert lg.vllm_version and lg.vllm_version.startswith("0.14") and lg.model == "GadflyII/GLM-4.7-Flash-NVFP4"
    assert lg.weights_gib is not None and lg.kv_gib is not None and lg.kv_tokens is not None
