"""The README's first command for real: ``sparkconsole demo`` as a user runs it.

* ``demo --serve`` as a subprocess, reached with ``/usr/bin/ssh`` exactly as it says (host key
  checked against the known_hosts file it printed), then stopped with Ctrl-C (SIGINT);
* ``demo`` (and ``demo --scenario link-down``) inside a detached tmux of 160x48, read back with
  ``tmux capture-pane`` and driven with ``tmux send-keys``;
* bad arguments: one line on stderr, exit 2.

Every tmux server here has its own socket (``-L sctest-<pid>-<n>``) and is killed in a ``finally``.
"""

from __future__ import annotations

import itertools
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.proc_support import line_reader

ROOT = Path(__file__).resolve().parents[1]
SSH = "/usr/bin/ssh"
TMUX = shutil.which("tmux")
# How long a wait on a condition may last before the test gives up: a guard against a hang, never a
# bound on speed (a loaded machine starts Python and a Textual app many times slower than an idle one)
GUARD_S = 120.0
_socket_seq = itertools.count()


def _sparkconsole() -> str:
    exe = Path(sys.executable).parent / "sparkconsole"
    if exe.exists():
        return str(exe)
    found = shutil.which("sparkconsole")
    if found is None:
        pytest.skip("the sparkconsole entry point is not installed")
    return found


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["SPARKCONSOLE_STATE_DIR"] = str(tmp_path / "state")
    env.setdefault("LANG", "C.UTF-8")
    env.pop("TMUX", None)  # never attach to a tmux this test runs inside
    return env


# --- demo --serve + OpenSSH --------------------------------------------------------------------


def _stop(proc: subprocess.Popen, sig: int) -> str:
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


SSH_LINE = re.compile(r"^\s*(?P<node>spark-[0-9a-z]+): (?P<cmd>ssh .*)$")


@pytest.mark.skipif(not os.access(SSH, os.X_OK), reason="no OpenSSH client at /usr/bin/ssh")
def test_demo_serve_is_reachable_with_the_printed_openssh_command_and_stops_on_ctrl_c(tmp_path):
    proc = subprocess.Popen([_sparkconsole(), "demo", "--serve"], cwd=ROOT, env=_env(tmp_path),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        lines = line_reader(proc.stdout)
        printed: list[str] = []
        deadline = time.monotonic() + GUARD_S
        while not any(s.startswith("Try:") for s in printed):
            left = deadline - time.monotonic()
            assert left > 0, f"demo --serve printed no ssh commands in {GUARD_S:g} s: {printed!r}"
            try:
                line = lines.get(timeout=left)
            except queue.Empty:
                continue
            assert line is not None, f"demo --serve exited early: {printed!r} / {proc.stderr.read()!r}"
            printed.append(line.rstrip("\n"))
        commands = {m["node"]: m["cmd"] for s in printed if (m := SSH_LINE.match(s))}
        assert list(commands) == ["spark-1a32", "spark-5be3"], printed

        for node, cmd in commands.items():
            argv = shlex.split(cmd)
            assert argv[0] == "ssh"
            assert not any("StrictHostKeyChecking" in a for a in argv), "the printed command must verify host keys"
            opts = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "-o"]
            known = [o.split("=", 1)[1] for o in opts if o.startswith("UserKnownHostsFile=")]
            assert len(known) == 1, cmd
            port = argv[argv.index("-p") + 1]
            entries = Path(known[0]).read_text().splitlines()
            assert any(e.startswith(f"[127.0.0.1]:{port} ssh-ed25519 ") for e in entries), entries

            # exactly the printed command, plus the remote command; no controlling terminal, so an
            # unknown or mismatching host key could not be accepted interactively either
            r = subprocess.run([SSH, *argv[1:], "nvidia-smi"], stdin=subprocess.DEVNULL, capture_output=True,
                               text=True, timeout=GUARD_S, start_new_session=True)
            assert r.returncode == 0, (node, r.stderr)
            assert "Permanently added" not in r.stderr and "Host key verification failed" not in r.stderr
            out = r.stdout
            assert "NVIDIA-SMI 580." in out and "CUDA Version: 13.0" in out, out
            assert re.search(r"\|\s+0\s+NVIDIA GB10\s+On\s+\|", out), out
            assert "Not Supported" in out, out  # GB10: unified memory, no Memory-Usage figure
            assert "VLLM::EngineCore" in out, out  # the story: vLLM services on both nodes
        workdir = Path(known[0]).parent
    finally:
        err = _stop(proc, signal.SIGINT)
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    assert not workdir.exists(), "the demo's key and known_hosts should go with it"


# --- demo in tmux ------------------------------------------------------------------------------


class Tmux:
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

    def start(self, command: str) -> None:
        self.tmux("-f", "/dev/null", "new-session", "-d", "-x", "160", "-y", "48", "-c", str(ROOT), command)

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


@contextmanager
def demo_in_tmux(tmp_path: Path, *args: str) -> Iterator[tuple[Tmux, Path]]:
    if TMUX is None:
        pytest.skip("tmux is not installed")
    env = _env(tmp_path)
    exit_file = tmp_path / "exit"
    demo = " ".join(shlex.quote(a) for a in [_sparkconsole(), "demo", *args])
    inner = (f"SPARKCONSOLE_STATE_DIR={shlex.quote(env['SPARKCONSOLE_STATE_DIR'])} {demo}; "
             f"echo EXIT=$? > {shlex.quote(str(exit_file))}")
    t = Tmux(env)
    try:
        t.start(f"sh -c {shlex.quote(inner)}")
        yield t, exit_file
    finally:
        t.kill()


def _wait_exit(exit_file: Path, screen: str, timeout: float = GUARD_S) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if exit_file.exists() and exit_file.read_text().strip():
            return exit_file.read_text().strip()
        time.sleep(0.1)
    raise AssertionError(f"the console did not exit within {timeout:g} s\n{screen}")


def _twins(screen: str) -> list[str]:
    """The ``ConnectX-7 ...`` summaries on screen (one per node card, side by side)."""
    return re.findall(r"ConnectX-7\s+(\d/\d twins up)", screen)


def test_demo_in_tmux_shows_both_sparks_help_and_quits_cleanly(tmp_path):
    with demo_in_tmux(tmp_path) as (t, exit_file):
        screen = t.wait_for("spark-1a32", "spark-5be3", "NVIDIA GB10", "Unified memory", "GiB",
                            "ConnectX-7")
        screen = t.wait_for("2/4 twins up")
        assert _twins(screen) == ["2/4 twins up", "2/4 twins up"], screen
        assert "Traceback" not in screen
        t.send("?")
        help_screen = t.wait_for("─ Help ─", "Esc closes")  # the modal, not the footer's "? Help"
        assert "app.quit" in help_screen, help_screen
        t.send("Escape")
        deadline = time.monotonic() + GUARD_S
        while "─ Help ─" in t.screen():
            assert time.monotonic() < deadline, "Escape did not close the help"
            time.sleep(0.1)
        t.send("q")
        assert _wait_exit(exit_file, t.screen()) == "EXIT=0"


def test_demo_link_down_in_tmux_shows_no_twin_up_and_the_alert(tmp_path):
    with demo_in_tmux(tmp_path, "--scenario", "link-down") as (t, exit_file):
        screen = t.wait_for("spark-1a32", "spark-5be3", "0/4 twins up", "ConnectX-7 link down")
        assert "2/4 twins up" not in screen, screen
        assert "link-down" in screen, screen
        t.send("q")
        assert _wait_exit(exit_file, t.screen()) == "EXIT=0"


# --- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "says"), [
    (["--scenario", "bogus"], "bogus"),
    (["--nodes", "0"], "--nodes"),
    (["--speed", "-1"], "--speed"),
])
def test_demo_bad_arguments_are_one_line_and_exit_2(tmp_path, args, says):
    r = subprocess.run([_sparkconsole(), "demo", *args], cwd=ROOT, env=_env(tmp_path), capture_output=True,
                       text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert "error" in lines[0] and says in lines[0], lines[0]
    assert "Traceback" not in r.stderr


# --- demo --serve stopped by a signal -----------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_demo_serve_stopped_by_a_signal_removes_its_folder_and_key(tmp_path, sig):
    env = _env(tmp_path)
    env["TMPDIR"] = str(tmp_path / "tmp")
    (tmp_path / "tmp").mkdir()
    proc = subprocess.Popen([_sparkconsole(), "demo", "--serve"], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = line_reader(proc.stdout)
        workdir: Path | None = None
        deadline = time.monotonic() + GUARD_S
        while True:
            left = deadline - time.monotonic()
            assert left > 0, "demo --serve did not come up in 20 s"
            try:
                line = lines.get(timeout=left)
            except queue.Empty:
                continue
            assert line is not None, f"demo --serve exited early: {proc.stderr.read()!r}"
            if line.startswith("Files: "):
                workdir = Path(line.split()[1])
            if line.startswith("Try:"):
                break
        assert workdir is not None and workdir.parent == tmp_path / "tmp"
        assert (workdir / "id_ed25519").exists()
    finally:
        err = _stop(proc, sig)
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    assert not workdir.exists(), "the client's private key must go with the demo"
    assert list((tmp_path / "tmp").iterdir()) == []


def test_the_console_removes_the_demos_folder_when_its_terminal_goes_away(tmp_path):
    """Issue 11 item 15: closing the terminal (tmux killed: SIGHUP) must not leave the demo's folder,
    client private key included, behind."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    if TMUX is None:
        pytest.skip("tmux is not installed")
    env = _env(tmp_path)
    env["TMPDIR"] = str(tmp)
    t = Tmux(env)
    try:
        t.start(f"env TMPDIR={shlex.quote(str(tmp))} {shlex.quote(_sparkconsole())} demo")
        t.wait_for("spark-1a32", "spark-5be3", "Unified memory")
        folders = list(tmp.glob("sparkconsole-demo-*"))
        assert folders and (folders[0] / "id_ed25519").exists()
    finally:
        t.kill()
    deadline = time.monotonic() + GUARD_S
    while any(tmp.glob("sparkconsole-demo-*")):
        assert time.monotonic() < deadline, [str(p) for p in tmp.rglob("*")]
        time.sleep(0.1)
