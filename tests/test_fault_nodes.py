"""Faults on the nodes the console watches (issue 14, part 3), against REAL OpenSSH sshds on
loopback (tests/lab/sshd.py) and the real poller (one long-lived probe per node):

- sshd killed mid-poll (the listener and every session it forked, as a node going away): the node
  is down within two ticks, back within two ticks of sshd's restart, and the other node's samples
  never stop; the Textual console stays responsive meanwhile (a key opens and closes a screen);
- one host slow to answer (its sshd and the probe behind it SIGSTOPped: the TCP connection stays
  open, nothing answers): its tick times out (stale, "no answer in time"), the other node's
  samples keep coming at their rate, and it is up again within two ticks of answering.

Bounds are in ticks; the seconds measured are printed (the README quotes them).
"""

from __future__ import annotations

import contextlib
import signal
import time

import psutil
import pytest

from sparkconsole.config import ClusterConfig
from sparkconsole.probe.poller import NodePoller
from sparkconsole.probe.state import NodeStatus
from sparkconsole.transport.ssh import SshTransport
from tests.lab.sshd import LabSshd
from tests.test_quiet_nodes import Ticker, reconnected, wait_for

pytestmark = pytest.mark.sshd


def _started(*servers: LabSshd) -> tuple[LabSshd, ...]:
    for s in servers:
        s.start()
    return servers


def _ticks_until(ticker: Ticker, since: float, pred) -> int:
    """How many ticks ended after ``since`` up to and including the first one where ``pred`` held."""
    n = 0
    for _start, end, status, reason in ticker.ticks:
        if end < since:
            continue
        n += 1
        if pred(status, reason):
            return n
    raise AssertionError("never")


async def test_sshd_killed_mid_poll_down_within_two_ticks_back_within_two_other_node_unaffected(tmp_path):
    a, b = _started(LabSshd(tmp_path / "a", alias="node-a"), LabSshd(tmp_path / "b", alias="node-b"))
    # the console's own settings: a tick every 2 s, the transport's default timeouts and backoff
    pa = NodePoller(a.node_config("a"), SshTransport(a.node_config("a")), interval=2.0)
    pb = NodePoller(b.node_config("b"), SshTransport(b.node_config("b")), interval=2.0)
    ta, tb = Ticker(pa), Ticker(pb)
    ta.start()
    tb.start()
    try:
        await wait_for(lambda: pa.state.status is NodeStatus.UP and pb.state.status is NodeStatus.UP, 60)
        await wait_for(lambda: len(ta.ticks) >= 2, 60)
        killed_at = time.monotonic()
        b_before = len(tb.ticks)
        a.stop()  # SIGKILL: the listener and the sessions (the probe's shell among them)
        down_s = await wait_for(lambda: pa.state.status is NodeStatus.DOWN, 60)
        down_ticks = _ticks_until(ta, killed_at, lambda s, r: s is NodeStatus.DOWN)
        assert down_ticks <= 2, f"down after {down_ticks} ticks ({down_s:.1f} s)"
        assert f"{a.host}:{a.port}" in pa.state.reason or "connection" in pa.state.reason.lower(), pa.state.reason
        # B ticks twice more while A stays down (refused connects, the backoff growing): held up
        # behind A's dead connection, B would not (the guard would end the test)
        b_mark = len(tb.ticks)
        await wait_for(lambda: len(tb.ticks) >= b_mark + 2, 120)
        assert pa.state.status is NodeStatus.DOWN
        restarted_at = time.monotonic()
        a.start()
        # back at the first connection attempt after the restart (the backoff's wait is capped at
        # 4 s, two ticks), and up on the first tick that starts on the new connection
        attempts, back_ticks = await reconnected(pa.transport, ta)
        back_s = time.monotonic() - restarted_at
        assert attempts <= 1, f"{attempts} connection attempts after sshd was back"
        assert back_ticks <= 1, f"up only {back_ticks} ticks after the connection came back ({back_s:.1f} s)"
        outage = time.monotonic() - killed_at
        b_during = [t for t in tb.ticks[b_before:] if t[1] <= time.monotonic()]
        assert all(t[2] is NodeStatus.UP for t in b_during)
        assert len(b_during) >= 2
        print(f"\nsshd killed: down after {down_s:.1f} s = {down_ticks} tick(s), back {back_s:.1f} s after restart ({back_ticks} tick(s) on the new connection); the other node: {len(b_during)} "
              f"samples in the {outage:.1f} s outage, all up")
    finally:
        await _stop_all((ta, tb), (pa, pb), (a, b))


async def _stop_all(tickers: tuple[Ticker, ...], pollers: tuple[NodePoller, ...],
                    servers: tuple[LabSshd, ...]) -> None:
    """Tickers first (no poll in flight), then the pollers' connections, then the sshds."""
    for ticker in tickers:
        await ticker.stop()
    for poller in pollers:
        await poller.close()
    for server in servers:
        server.stop()


def _sshd_tree(server: LabSshd) -> list[psutil.Process]:
    assert server._proc is not None
    parent = psutil.Process(server._proc.pid)
    return [parent, *parent.children(recursive=True)]


@contextlib.contextmanager
def _frozen(procs: list[psutil.Process]):
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGCONT)


async def test_a_host_slow_to_answer_times_out_and_the_other_keeps_its_rate(tmp_path):
    a, b = _started(LabSshd(tmp_path / "a", alias="node-a"), LabSshd(tmp_path / "b", alias="node-b"))
    interval = 1.0
    pa = NodePoller(a.node_config("a"), SshTransport(a.node_config("a"), keepalive=30), interval=interval)
    pb = NodePoller(b.node_config("b"), SshTransport(b.node_config("b")), interval=interval)
    ta, tb = Ticker(pa), Ticker(pb)
    ta.start()
    tb.start()
    try:
        await wait_for(lambda: pa.state.status is NodeStatus.UP and pb.state.status is NodeStatus.UP, 60)
        await wait_for(lambda: len(ta.ticks) >= 3 and len(tb.ticks) >= 3, 60)
        base = [t for t in tb.ticks[-3:]]
        b_rate_before = (len(base) - 1) / max(1e-6, base[-1][0] - base[0][0])
        with _frozen(_sshd_tree(a)):  # sshd and the probe's shell stop answering; TCP stays open
            frozen_at = time.monotonic()
            b_before = len(tb.ticks)
            stale_s = await wait_for(lambda: pa.state.status is not NodeStatus.UP, 60)
            assert pa.state.status in (NodeStatus.STALE, NodeStatus.DOWN)
            assert "no answer" in pa.state.reason or "timed out" in pa.state.reason, pa.state.reason
            stale_ticks = _ticks_until(ta, frozen_at, lambda s, r: s is not NodeStatus.UP)
            frozen_reason = pa.state.reason
            # while A is frozen, B goes on: three more samples of B, however long they take
            await wait_for(lambda: len(tb.ticks) >= b_before + 3, 120)
            a_during = len([t for t in ta.ticks if t[1] >= frozen_at])
            window = time.monotonic() - frozen_at
            b_during = tb.ticks[b_before:]
        assert stale_ticks <= 2
        assert all(t[2] is NodeStatus.UP for t in b_during)
        b_rate = len(b_during) / window
        # B's ticks never waited for A's: A (each tick waiting out its answer timeout) did not get more
        # ticks in than B did meanwhile
        assert a_during <= len(b_during), (a_during, len(b_during))
        answered_at = time.monotonic()
        back_s = await wait_for(lambda: pa.state.status is NodeStatus.UP, 60)
        back_ticks = _ticks_until(ta, answered_at, lambda s, r: s is NodeStatus.UP)
        assert back_ticks <= 2
        print(f"\nslow host (SIGSTOP): stale after {stale_s:.1f} s = {stale_ticks} tick(s) ('{frozen_reason}' "
              f"while frozen); the other node {len(b_during)} samples in {window:.1f} s ({b_rate:.2f}/s, "
              f"{b_rate_before:.2f}/s before); back {back_s:.1f} s = {back_ticks} tick(s) after SIGCONT")
    finally:
        await _stop_all((ta, tb), (pa, pb), (a, b))


async def test_the_console_stays_responsive_while_a_nodes_sshd_is_killed_and_restarted(tmp_path):
    """The Textual console on two real sshd nodes, polling on its own timers: killing one node's
    sshd marks its card down, the other stays up, and a key still opens and closes the help screen
    meanwhile (each within the pilot's wait, however the dead node's connects go)."""
    from sparkconsole.journal import Journal
    from sparkconsole.ui.app import SparkConsoleApp

    a, b = _started(LabSshd(tmp_path / "a", alias="node-a"), LabSshd(tmp_path / "b", alias="node-b"))
    config = ClusterConfig(nodes=(a.node_config("node-a", role="head"), b.node_config("node-b")), name="lab")
    app = SparkConsoleApp(config=config, interval=1.0, remember_theme=False,
                          journal=Journal(tmp_path / "journal.jsonl"))
    try:
        async with app.run_test(size=(160, 50)) as pilot:

            async def until(pred, timeout: float) -> float:
                start = time.monotonic()
                while not pred():
                    assert time.monotonic() - start < timeout, [(s.name, s.status, s.reason) for s in app.states()]
                    await pilot.pause(0.1)
                return time.monotonic() - start

            await until(lambda: len(app.states()) == 2 and all(s.status is NodeStatus.UP for s in app.states()), 20)
            a.stop()
            down_s = await until(lambda: app.states()[0].status is NodeStatus.DOWN, 10)
            keys = []
            for _ in range(3):  # the UI answers keys while the node is down
                screens = len(app.screen_stack)
                t = time.monotonic()
                await pilot.press("question_mark")
                await until(lambda n=screens: len(app.screen_stack) > n, 5)
                await pilot.press("escape")
                await until(lambda n=screens: len(app.screen_stack) == n, 5)
                keys.append(time.monotonic() - t)
            assert app.states()[1].status is NodeStatus.UP
            a.start()
            back_s = await until(lambda: app.states()[0].status is NodeStatus.UP, 10)
            print(f"\nconsole on real sshds: node down {down_s:.1f} s after its sshd was killed, help opened and "
                  f"closed in {max(keys) * 1000:.0f} ms at worst meanwhile, up {back_s:.1f} s after restart")
    finally:
        a.stop()
        b.stop()
