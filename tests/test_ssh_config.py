"""Issue 23 item 13: the ssh config is parsed once, off the event loop, against a REAL sshd.

asyncssh runs a config's ``Match exec`` command while it parses the file. Before, the transport
parsed it on the event loop at every connection attempt (and asyncssh parsed it again), so a
``Match exec "sleep 1"`` froze the UI for a second per connect and per retry. Here the ``Match
exec`` command writes a line per parse into a file, and waits for the event loop to show it is
turning (a task on the loop re-creates a file the command removed); nothing is timed.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from sparkconsole.config import NodeConfig
from sparkconsole.errors import TransportError
from sparkconsole.transport.ssh import SshTransport
from tests.lab.sshd import LabSshd


def _counting_config(sshd: LabSshd, tmp_path: Path) -> tuple[Path, Path, Path]:
    """The lab's ssh config plus a ``Match exec`` that logs each parse and whether the event loop
    turned while it ran (it waits up to 3 s for the loop's task to re-create ``go``)."""
    parses, go, cfg = tmp_path / "parses", tmp_path / "go", tmp_path / "ssh_config"
    probe = tmp_path / "probe.sh"  # a file: asyncssh splits a Match line at '='
    probe.write_text(f"echo parse >> {parses}; rm -f {go}; i=0\n"
                     f"while [ ! -e {go} ] && [ $i -lt 60 ]; do sleep 0.05; i=$((i+1)); done\n"
                     f"if [ -e {go} ]; then echo loop-ran >> {parses}; else echo loop-stuck >> {parses}; fi\n")
    cfg.write_text(sshd.ssh_config.read_text() + f'Match exec "sh {probe}"\n  ServerAliveCountMax 2\n')
    return cfg, parses, go


@contextlib.asynccontextmanager
async def _loop_signal(go: Path):
    """A task on the event loop that keeps re-creating ``go``: it can only while the loop turns."""
    async def tick() -> None:
        while True:
            go.touch()
            await asyncio.sleep(0.01)

    task = asyncio.create_task(tick())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.mark.sshd
async def test_match_exec_runs_once_off_the_loop_over_connects_and_retries(sshd: LabSshd, tmp_path: Path) -> None:
    cfg, parses, go = _counting_config(sshd, tmp_path)
    node = NodeConfig(name="matched", host=sshd.alias, ssh_config=str(cfg))
    async with _loop_signal(go):
        t = SshTransport(node, connect_timeout=5, backoff_base=0.05, backoff_max=0.1)
        try:
            assert (await t.run("echo one")).stdout == "one\n"
            sshd.restart()  # the node drops every session: the next run dials again
            assert (await t.run("echo two")).stdout == "two\n"
            sshd.stop()  # a failed attempt, then a retry that gets through
            t._drop()
            with pytest.raises(TransportError):
                await t.connect()
            sshd.start()
            await t.connect()
            assert (await t.run("echo three")).stdout == "three\n"
            assert t.attempts_made >= 3 and t.connections_made >= 3
        finally:
            await t.close()
        # another transport for the same host in the same run: the parse is reused
        other = SshTransport(node, connect_timeout=5)
        try:
            assert (await other.run("echo four")).stdout == "four\n"
        finally:
            await other.close()
        assert parses.read_text().split() == ["parse", "loop-ran"]

        # the file changes: it is read again (once), the next connect honouring the new text
        cfg.write_text(cfg.read_text() + "# edited\n")
        again = SshTransport(node, connect_timeout=5)
        try:
            assert (await again.run("echo five")).stdout == "five\n"
            assert (await again.run("echo six")).stdout == "six\n"
        finally:
            await again.close()
    assert parses.read_text().split() == ["parse", "loop-ran", "parse", "loop-ran"]
