"""Nodes that go quiet (packets dropped, no refusal) and the poller's view of them.

Against a REAL OpenSSH sshd (tests/lab/sshd.py) whose port is silenced with an iptables DROP
rule (tests/lab/quiet.py): stale at the first missed tick, down within 10 s of silence with the
SSH-level reason naming host and port, up again within two ticks of answering; connection
attempts run their full connect timeout whatever the tick's budget; a failed tick leaves a gap
in the history.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable

import pytest

from sparkconsole.config import NodeConfig
from sparkconsole.probe.poller import NodePoller
from sparkconsole.probe.state import NodeState, NodeStatus
from sparkconsole.transport.ssh import SshTransport
from tests.lab.quiet import can_drop, dropping
from tests.lab.sshd import LabSshd

needs_drop = pytest.mark.skipif(not can_drop(), reason="needs root and iptables to drop packets")


class Ticker:
    """Polls like the console does: the next tick is armed ``interval`` after the last ends."""

    def __init__(self, poller: NodePoller) -> None:
        self.poller = poller
        self.ticks: list[tuple[float, float, NodeStatus, str]] = []  # (start, end, status, reason)
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            start = time.monotonic()
            state = await self.poller.poll_once()
            self.ticks.append((start, time.monotonic(), state.status, state.reason))
            await asyncio.sleep(self.poller.interval)

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def first(self, pred: Callable[[NodeStatus, str], bool], after: float) -> tuple[float, float, NodeStatus, str]:
        return next(t for t in self.ticks if t[0] >= after and pred(t[2], t[3]))


async def reconnected(transport: SshTransport, ticker: Ticker, timeout: float = 60) -> tuple[int, int]:
    """Wait for the transport's next connection and the poller's next UP; returns (connection
    attempts made meanwhile, ticks that *started* after the connection was made before one ended UP).

    Counting polls, not seconds, keeps the bound a property of the poller: a loaded machine
    stretches the connect and the probe's start, never the number of ticks it takes once the
    node answers. (0 ticks: the tick in flight when the connection came already ended UP.)"""
    attempts, made = transport.attempts_made, transport.connections_made
    await wait_for(lambda: transport.connections_made > made, timeout, step=0.01)
    connected_at = time.monotonic()
    attempts = transport.attempts_made - attempts
    await wait_for(lambda: ticker.ticks and ticker.ticks[-1][1] >= connected_at
                   and any(t[2] is NodeStatus.UP for t in ticker.ticks if t[1] >= connected_at), timeout)
    after = [t for t in ticker.ticks if t[1] >= connected_at]
    up = next(i for i, t in enumerate(after) if t[2] is NodeStatus.UP)
    return attempts, len([t for t in after[: up + 1] if t[0] >= connected_at])


async def wait_for(pred: Callable[[], bool], timeout: float, step: float = 0.05) -> float:
    """Seconds until ``pred()`` held; fails the test at ``timeout``."""
    start = time.monotonic()
    while not pred():
        assert time.monotonic() - start < timeout, "condition not met in time"
        await asyncio.sleep(step)
    return time.monotonic() - start


@pytest.mark.sshd
@needs_drop
async def test_a_quiet_node_is_stale_at_once_down_by_keepalive_within_three_ticks_and_back_within_two(sshd: LabSshd) -> None:
    """The console's defaults (2 s interval, SshTransport's own timeouts) against dropped packets."""
    poller = NodePoller(sshd.node_config("quiet"), SshTransport(sshd.node_config("quiet")), interval=2.0)
    state: NodeState = poller.state
    ticker = Ticker(poller)
    ticker.start()
    where = f"{sshd.host}:{sshd.port}"
    try:
        await wait_for(lambda: state.status is NodeStatus.UP, 60)
        with dropping(sshd.port) as rule:
            await wait_for(lambda: len(ticker.ticks) >= 2 and ticker.ticks[-1][2] is NodeStatus.UP, 60)
            silent_at = time.monotonic()
            rule.drop()
            first_tick = len(ticker.ticks)
            stale_s = await wait_for(lambda: state.status is not NodeStatus.UP, 60)
            assert state.status is NodeStatus.STALE, state.reason
            # the first tick that started after the drop is the one that went stale
            assert ticker.ticks[first_tick][2] is NodeStatus.STALE
            down_s = stale_s + await wait_for(lambda: state.status is NodeStatus.DOWN, 60)
            # down by the transport's own word (the keepalive, ~6 s of silence), not by counting missed
            # ticks: at most three ticks ended between the silence and "down", however slow they ran
            down_ticks = len([t for t in ticker.ticks if t[1] >= silent_at and t[2] is not NodeStatus.DOWN]) + 1
            assert down_ticks <= 3, f"down after {down_ticks} ticks ({down_s:.1f} s) of silence"
            assert where in state.reason and ("keepalive" in state.reason or "timed out connecting" in state.reason)
            # stay silent past a connect timeout: attempts pile up in SYN backoff; fresh ones go beside
            await wait_for(lambda: "timed out connecting" in state.reason, 60)
            assert where in state.reason
            answered_at = time.monotonic()
            rule.answer()
            # the attempts stuck in SYN backoff (or a fresh one beside them) get through; the node is
            # up at the latest on the first tick that starts on the new connection
            _attempts, ticks = await reconnected(poller.transport, ticker)
            back_s = time.monotonic() - answered_at
        assert ticks <= 1, f"up only {ticks} ticks after the connection came back ({back_s:.1f} s)"
        assert state.history.values("mem_used_gib")[-1] is not None
        print(f"\nquiet node: stale {stale_s:.1f} s, down {down_s:.1f} s = {down_ticks} tick(s) after silence "
              f"(at {silent_at:.0f}); back {back_s:.1f} s after answering ({ticks} tick(s) on the new connection)")
    finally:
        await ticker.stop()
        await poller.close()


def silent_listener() -> socket.socket:
    """A TCP port that completes the handshake and then never says a word (no SSH banner)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    return s


async def test_connect_attempts_outlive_a_short_tick_and_back_off() -> None:
    """A tick budget shorter than the SSH connect timeout must not cancel the attempt: it runs to
    its timeout, says so with host and port, and counts; the poller never skips the backoff."""
    with silent_listener() as listener:
        port = listener.getsockname()[1]
        node = NodeConfig(name="mute", host="127.0.0.1", port=port, user="root")
        transport = SshTransport(node, connect_timeout=1.0, backoff_base=0.4, backoff_max=0.8, beside_after=5.0)
        poller = NodePoller(node, transport, interval=0.2, tick_timeout=0.3)
        try:
            ticks = 0
            while transport._failures < 2:  # two attempts ran to their timeout (the test's guard: 300 s)
                await poller.poll_once()
                ticks += 1
                await asyncio.sleep(poller.interval)
            state = poller.state
            assert state.status is NodeStatus.DOWN
            assert f"timed out connecting to 127.0.0.1:{port} after 1 s" in state.reason
            # each tick gave up after 0.3 s, yet each attempt ran its full second, one at a time and
            # after its backoff: several ticks per attempt, never an attempt per tick
            assert transport.attempts_made <= transport._failures + 1 < ticks, (transport.attempts_made, ticks)
        finally:
            await poller.close()


@pytest.mark.sshd
async def test_a_failed_tick_leaves_a_gap_in_the_history(sshd: LabSshd) -> None:
    transport = SshTransport(sshd.node_config("gap"), connect_timeout=2, backoff_base=0.05, backoff_max=0.1)
    poller = NodePoller(sshd.node_config("gap"), transport, interval=0.5)
    poller.patience = 60.0  # the test sets the pace: a tick waits for its answer, however busy the machine
    try:
        assert (await poller.poll_once()).status is NodeStatus.UP
        sshd.stop()
        await wait_for(lambda: not transport.connected, 60)
        assert (await poller.poll_once()).status is NodeStatus.DOWN
        sshd.start()
        await wait_for(lambda: transport.connected, 60)
        assert (await poller.poll_once()).status is NodeStatus.UP
        used = poller.state.history.values("mem_used_gib")
        assert len(used) == 3 and used[0] is not None and used[1] is None and used[2] is not None
    finally:
        await poller.close()
