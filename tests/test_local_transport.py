"""LocalTransport against this machine: real processes, the real /proc/meminfo, the real probe."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from pathlib import Path

import psutil
import pytest

from sparkconsole.config import NodeConfig
from sparkconsole.errors import TransportError
from sparkconsole.probe.script import MARK, probe_command, split_tick
from sparkconsole.remote import RemoteCommand
from sparkconsole.transport import make_transport
from sparkconsole.transport.base import LongProcess, Transport
from sparkconsole.transport.local import LocalTransport


def processes_with(marker: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if marker in " ".join(p.info["cmdline"] or []):
                found.append(p)
        except psutil.Error:
            pass
    return found


async def wait_until(pred, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        await asyncio.sleep(0.05)
    return pred()


@pytest.fixture
def local() -> LocalTransport:
    t = make_transport(NodeConfig(name="here", host="localhost"), local=True)
    assert isinstance(t, LocalTransport) and isinstance(t, Transport)
    return t


async def test_run(local: LocalTransport) -> None:
    r = await local.run("echo out; echo err >&2; exit 4")
    assert (r.exit_status, r.stdout, r.stderr) == (4, "out\n", "err\n")
    assert (await local.run("wc -l", input="a\nb\n")).stdout.strip() == "2"
    assert (await local.run("cat; echo eof")).stdout == "eof\n"  # stdin is at EOF without input
    cmd = RemoteCommand(("printf", "%s", "$HOME `x` 'q'"), env=(("A", "1"),))
    assert (await local.run(cmd)).stdout == "$HOME `x` 'q'"
    r = await local.run("kill -9 $$")
    assert r.exit_status is None  # killed by a signal


async def test_timeout_kills_the_whole_tree(local: LocalTransport) -> None:
    marker = f"ltmo{uuid.uuid4().hex[:10]}"
    with pytest.raises(TransportError, match=r"here: timed out after 0\.5 s"):
        await local.run(f"M={marker}; sleep 30 & sleep 30; echo $M", timeout=0.5)
    assert await wait_until(lambda: not processes_with(marker)), "children survived the timeout"


async def test_stream_lines_as_they_come_and_aclose(local: LocalTransport) -> None:
    start = time.monotonic()
    seen = []
    async for line in local.stream("for i in 1 2 3 4; do echo o$i; echo e$i >&2; sleep 0.2; done"):
        seen.append((time.monotonic() - start, line))
    end = time.monotonic() - start
    assert [s for _, s in seen] == [f"{k}{i}" for i in range(1, 5) for k in ("o", "e")]
    assert seen[0][0] < end - 0.4
    marker = f"lstr{uuid.uuid4().hex[:10]}"
    gen = local.stream(f"M={marker}; echo start; while :; do sleep 0.2; done")
    assert await gen.__anext__() == "start"
    assert processes_with(marker)
    await gen.aclose()
    assert await wait_until(lambda: not processes_with(marker))


async def read_tick(proc: LongProcess) -> list[str]:
    lines = []
    async with asyncio.timeout(15):
        while (line := await proc.read_line()) is not None:
            lines.append(line)
            if line.startswith(f"{MARK} end "):
                return lines
    raise AssertionError(f"probe ended early: {lines}")


async def test_probe_with_the_real_meminfo(local: LocalTransport) -> None:
    proc = await local.open_process(probe_command())
    try:
        await proc.write_line("meminfo hostname nproc")
        sections = split_tick(await read_tick(proc))
        text = sections["meminfo"].text
        real = Path("/proc/meminfo").read_text()
        want = re.search(r"^MemTotal:\s+(\d+) kB", real, re.M)
        got = re.search(r"^MemTotal:\s+(\d+) kB", text, re.M)
        assert want and got and got.group(1) == want.group(1)
        assert sections["meminfo"].rc == 0
        assert int(sections["nproc"].text) >= 1
        await proc.write_line("uptime")
        assert split_tick(await read_tick(proc))["uptime"].rc == 0
    finally:
        await proc.close()
    assert proc.is_closing
    with pytest.raises(TransportError):
        await proc.write_line("meminfo")


def test_every_runtime_dependency_is_imported_by_the_package():
    """A dependency declared for the console is one its code uses (issue 11 item 16: psutil and
    tomlkit were declared and never imported)."""
    import re
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    deps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    names = [re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].replace("-", "_").lower() for d in deps]
    assert names, "no runtime dependencies read"
    source = "\n".join(p.read_text(encoding="utf-8") for p in (root / "sparkconsole").rglob("*.py"))
    unused = [n for n in names if not re.search(rf"^\s*(?:import|from)\s+{n}\b", source, re.M)]
    assert unused == []
