"""Helpers for tests that run ``sparkconsole`` as a user does: the installed entry point, ``demo
--serve`` as a separate process read line by line, and a detached tmux for the full-screen console.

Shared by tests/test_demo_e2e.py and tests/test_getting_started.py, so the way a test finds the
command, waits on what ``demo --serve`` prints, stops it and drives a terminal is written once.
"""

from __future__ import annotations

import itertools
import os
import queue
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SSH = "/usr/bin/ssh"
TMUX = shutil.which("tmux")
# How long a wait on a condition may last before the test gives up: a guard against a hang, never a
# bound on speed (a loaded machine starts Python and a Textual app many times slower than an idle one)
GUARD_S = 120.0
# one node's line in what `demo --serve` prints: "  spark-1a32: ssh -i KEY -p PORT ... nvidia@127.0.0.1"
SSH_LINE = re.compile(r"^\s*(?P<node>spark-[0-9a-z]+): (?P<cmd>ssh .*)$")
_socket_seq = itertools.count()


def sparkconsole_exe() -> str:
    """The ``sparkconsole`` entry point of the Python running the tests (else the one on PATH)."""
    exe = Path(sys.executable).parent / "sparkconsole"
    if exe.exists():
        return str(exe)
    found = shutil.which("sparkconsole")
    if found is None:
        pytest.skip("the sparkconsole entry point is not installed")
    return found


def read_until(proc: subprocess.Popen, lines: queue.Queue[str | None], done: Callable[[list[str]], bool],
               what: str, timeout: float = GUARD_S) -> list[str]:
    """The lines ``proc`` printed (from :func:`tests.proc_support.line_reader`), newline stripped, up to
    the first point where ``done(lines so far)`` holds; fails naming ``what`` when the process ends or
    the guard passes first."""
    printed: list[str] = []
    deadline = time.monotonic() + timeout
    while not done(printed):
        left = deadline - time.monotonic()
        assert left > 0, f"{what}: not printed within {timeout:g} s: {printed!r}"
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            continue
        if line is None:
            err = proc.stderr.read() if proc.stderr else ""
            raise AssertionError(f"{what}: the process ended first: {printed!r} / {err!r}")
        printed.append(line.rstrip("\n"))
    return printed


def stop_demo(proc: subprocess.Popen, sig: int) -> str:
    """Stop ``demo --serve`` with ``sig`` (killed if it does not end within the guard); what it wrote on stderr."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        proc.wait(timeout=GUARD_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    err = proc.stderr.read()
    proc.stderr.close()
    proc.stdout.close()
    return err


class Tmux:
    """A tmux server of its own (``-L sctest-<pid>-<n>``) with one 160x48 session, read back with
    ``capture-pane`` and driven with ``send-keys``; :meth:`kill` ends it and removes its socket."""

    def __init__(self, env: dict[str, str]) -> None:
        self.socket = f"sctest-{os.getpid()}-{next(_socket_seq)}"
        self.env = env

    def tmux(self, *args: str, check: bool = True) -> str:
        assert TMUX is not None
        r = subprocess.run([TMUX, "-u", "-L", self.socket, *args], env=self.env, capture_output=True,
                           text=True, timeout=10, stdin=subprocess.DEVNULL)
        if check and r.returncode != 0:
            raise AssertionError(f"tmux {' '.join(args)}: {r.stderr}")
        return r.stdout

    def start(self, command: str, cwd: Path = ROOT) -> None:
        self.tmux("-f", "/dev/null", "new-session", "-d", "-x", "160", "-y", "48", "-c", str(cwd), command)

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", check=False)

    def send(self, *keys: str) -> None:
        self.tmux("send-keys", *keys)

    def wait_for(self, *needles: str, timeout: float = GUARD_S) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if all(n in screen for n in needles):
                return screen
            time.sleep(0.25)
        missing = [n for n in needles if n not in screen]
        raise AssertionError(f"not on screen after {timeout:g} s: {missing}\n{screen}")

    def kill(self) -> None:
        self.tmux("kill-server", check=False)
        # tmux leaves its socket file behind; it is ours (a name no one else uses), so remove it
        base = Path(self.env.get("TMUX_TMPDIR") or "/tmp") / f"tmux-{os.getuid()}" / self.socket
        base.unlink(missing_ok=True)


def wait_exit(exit_file: Path, screen: str, timeout: float = GUARD_S) -> str:
    """The ``EXIT=N`` line a command run in tmux wrote to ``exit_file`` when it ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if exit_file.exists() and exit_file.read_text().strip():
            return exit_file.read_text().strip()
        time.sleep(0.1)
    raise AssertionError(f"the console did not exit within {timeout:g} s\n{screen}")
