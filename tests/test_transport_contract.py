"""One contract, two transports: what every caller may rely on from SshTransport (against a REAL
OpenSSH sshd, tests/lab/sshd.py) and LocalTransport (real processes on this machine).

Each test runs once per transport: run (stdout, stderr, exit codes, input, quoting), stream (lines
as they come, stopping it ends the command), a timed-out run kills the command's whole process tree
(a silent one too, with a child in a session of its own) and raises the same ``CommandTimeout``,
several MB of output arrive whole, and the probe as a long-lived process.
What only one transport has (one kept connection, reconnects, host keys, jump hosts) is tested in
tests/test_ssh_transport.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
import uuid
from pathlib import Path

import pytest

from sparkconsole.config import NodeConfig
from sparkconsole.errors import TransportError
from sparkconsole.probe.script import MARK, probe_command, split_tick
from sparkconsole.remote import RemoteCommand
from sparkconsole.transport import make_transport
from sparkconsole.transport.base import CommandTimeout, LongProcess, Transport
from sparkconsole.transport.local import LocalTransport
from sparkconsole.transport.ssh import SshTransport
from tests.proc_support import processes_with, wait_until


@pytest.fixture(params=[pytest.param("ssh", marks=pytest.mark.sshd), "local"])
async def transport(request):
    if request.param == "ssh":
        sshd = request.getfixturevalue("sshd")
        t: Transport = make_transport(sshd.node_config("node-a"), connect_timeout=5)
        assert isinstance(t, SshTransport)
    else:
        t = make_transport(NodeConfig(name="node-a", host="localhost"), local=True)
        assert isinstance(t, LocalTransport)
    assert isinstance(t, Transport)
    try:
        yield t
    finally:
        await t.close()


# ---- run ------------------------------------------------------------------------------------


async def test_run_gives_stdout_stderr_and_exit_codes(transport: Transport) -> None:
    r = await transport.run("echo out; echo err >&2; exit 3")
    assert (r.exit_status, r.stdout, r.stderr, r.ok) == (3, "out\n", "err\n", False)
    assert r.command == "echo out; echo err >&2; exit 3"
    r = await transport.run("true")
    assert (r.exit_status, r.stdout, r.stderr, r.ok) == (0, "", "", True)
    assert (await transport.run("exit 255")).exit_status == 255
    r = await transport.run("echo before; kill -9 $$")
    assert r.exit_status is None and not r.ok  # killed by a signal: no exit code
    assert r.stdout == "before\n"
    assert r.duration_s >= 0


async def test_run_with_input_and_quoting(transport: Transport) -> None:
    assert (await transport.run("wc -l; cat >/dev/null", input="a\nb\nc\n")).stdout.strip() == "3"
    # without input, stdin is at EOF at once: a command reading it does not hang
    assert (await transport.run("cat; echo done", timeout=5)).stdout == "done\n"
    nasty = "it's \"quoted\" $HOME `id` ; rm -rf / && \\ end"
    cmd = RemoteCommand(("sh", "-c", 'printf "%s|%s" "$V" "$1"', "sh", "arg with 'quote'"), env=(("V", nasty),))
    r = await transport.run(cmd)
    assert r.ok, r.stderr
    assert r.stdout == f"{nasty}|arg with 'quote'"
    assert r.command == cmd.shell()


# ---- timeouts -----------------------------------------------------------------------------


async def test_timeout_kills_the_quiet_tree_and_says_so(transport: Transport) -> None:
    """A command that writes nothing (no SIGPIPE to end it), with children, one of them in a
    session of its own (``setsid``): a timed-out run kills them all, and ``CommandTimeout`` says so."""
    tag = f"{uuid.uuid4().int % 10**6:06d}"
    sleeps = [f"300.{tag}{i}" for i in range(3)]
    cmd = f"sleep {sleeps[0]} & setsid sleep {sleeps[1]} & sleep {sleeps[2]}; wait"
    start = time.monotonic()
    with pytest.raises(CommandTimeout, match=r"^node-a: timed out after 0\.8 s: .*; killed on the node") as err:
        await transport.run(cmd, timeout=0.8)
    assert time.monotonic() - start < 5
    # how many the last sweep found depends on what the group kill reached first; none may survive
    assert err.value.killed and (err.value.processes or 0) >= 1
    assert isinstance(err.value, TransportError)
    assert await wait_until(lambda: not any(processes_with(s) for s in sleeps), 5), "the tree survived"
    assert (await transport.run("echo still-here")).stdout == "still-here\n"


async def test_timeout_kills_a_chatty_command_too(transport: Transport) -> None:
    marker = f"tmo{uuid.uuid4().hex[:10]}"
    with pytest.raises(CommandTimeout, match=r"node-a: timed out after 0\.5 s") as err:
        await transport.run(f"M={marker}; while :; do echo $M; sleep 0.05; done", timeout=0.5)
    assert err.value.killed
    assert await wait_until(lambda: not processes_with(marker), 5), "the command survived"


# ---- stream -------------------------------------------------------------------------------


async def test_stream_yields_lines_as_they_come(transport: Transport) -> None:
    start = time.monotonic()
    seen: list[tuple[float, str]] = []
    async for line in transport.stream("for i in 1 2 3 4 5; do echo out$i; echo err$i >&2; sleep 0.2; done"):
        seen.append((time.monotonic() - start, line))
    end = time.monotonic() - start
    assert [line for _, line in seen] == [f"{k}{i}" for i in range(1, 6) for k in ("out", "err")]
    first = seen[0][0]
    assert first < end - 0.6, f"first line at {first:.2f}s, command ended at {end:.2f}s"
    assert seen[-1][0] - first >= 0.6  # spread out in time, not delivered in one batch


async def test_stopping_a_stream_kills_the_command(transport: Transport) -> None:
    marker = f"strm{uuid.uuid4().hex[:10]}"
    # silent between lines: only stopping the stream can end it
    gen = transport.stream(f"M={marker}; echo start; while :; do sleep 0.2; done")
    assert await gen.__anext__() == "start"
    assert processes_with(marker)
    await gen.aclose()
    assert await wait_until(lambda: not processes_with(marker), 5), "the command survived aclose()"
    assert (await transport.run("echo ok")).ok


# ---- large output -------------------------------------------------------------------------


def _seq(first: int, last: int) -> str:
    return "".join(f"{i}\n" for i in range(first, last + 1))


async def test_large_output_arrives_whole(transport: Transport) -> None:
    # ~4.8 MB on stdout and ~1.3 MB on stderr at the same time, then one 2 MB line without a newline
    r = await transport.run("seq 1 700000; seq 1 200000 >&2", timeout=60)
    want = _seq(1, 700000)
    assert len(r.stdout) == len(want) > 4_500_000
    assert r.stdout == want and r.stderr == _seq(1, 200000) and r.ok
    r = await transport.run("head -c 2000000 /dev/zero | tr '\\0' x", timeout=60)
    assert r.stdout == "x" * 2_000_000
    # several MB in
    blob = "".join(f"{i:08d}\n" for i in range(400000))
    r = await transport.run("sha256sum", input=blob, timeout=60)
    assert r.stdout.split()[0] == hashlib.sha256(blob.encode()).hexdigest()
    # and as a stream: every line, in order
    lines = [line async for line in transport.stream("seq 1 300000")]
    assert lines == [str(i) for i in range(1, 300001)]


# ---- the probe as a long-lived process ----------------------------------------------------


async def read_tick(proc: LongProcess, timeout: float = 15.0) -> list[str]:
    lines: list[str] = []
    async with asyncio.timeout(timeout):
        while (line := await proc.read_line()) is not None:
            lines.append(line)
            if line.startswith(f"{MARK} end "):
                return lines
    raise AssertionError(f"probe ended early: {lines}")


async def test_probe_as_a_long_process_reads_the_real_meminfo(transport: Transport) -> None:
    proc = await transport.open_process(probe_command())
    assert isinstance(proc, LongProcess)
    try:
        await proc.write_line("meminfo hostname nproc")
        sections = split_tick(await read_tick(proc))
        assert sections["meminfo"].rc == 0
        want = re.search(r"^MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M)
        got = re.search(r"^MemTotal:\s+(\d+) kB", sections["meminfo"].text, re.M)
        assert want and got and got.group(1) == want.group(1)  # this box's own /proc/meminfo
        assert sections["hostname"].text.strip()
        assert int(sections["nproc"].text) >= 1
        # later ticks ride the same process: fast
        t0 = time.monotonic()
        for _ in range(5):
            await proc.write_line("meminfo")
            assert "MemAvailable:" in split_tick(await read_tick(proc))["meminfo"].text
        assert (time.monotonic() - t0) / 5 < 0.5
        await proc.write_line("no-such-section")
        assert split_tick(await read_tick(proc))["no-such-section"].rc != 0
    finally:
        await proc.close()
    assert proc.is_closing
    with pytest.raises(TransportError):
        await proc.write_line("meminfo")


async def test_a_process_ends_when_its_stdin_closes(transport: Transport) -> None:
    proc = await transport.open_process("exec sh -c 'while IFS= read -r l; do echo got:$l; done; echo bye'")
    await proc.write_line("x")
    assert await proc.read_line() == "got:x"
    await proc.close()
    assert proc.is_closing
    with pytest.raises(TransportError):
        await proc.write_line("y")
