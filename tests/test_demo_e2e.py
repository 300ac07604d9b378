"""The README's first command for real: ``sparkconsole demo`` as a user runs it.

* ``demo --serve`` as a subprocess, reached with ``/usr/bin/ssh`` exactly as it says (host key
  checked against the known_hosts file it printed), then stopped with Ctrl-C (SIGINT);
* ``demo`` (and ``demo --scenario link-down``) inside a detached tmux of 160x48, read back with
  ``tmux capture-pane`` and driven with ``tmux send-keys``;
* bad arguments: one line on stderr, exit 2.

Every tmux server here has its own socket (``-L sctest-<pid>-<n>``) and is killed in a ``finally``.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.demo_support import GUARD_S, ROOT, SSH, SSH_LINE, TMUX, Tmux, read_until
from tests.demo_support import sparkconsole_exe as _sparkconsole
from tests.demo_support import stop_demo as _stop
from tests.demo_support import wait_exit as _wait_exit
from tests.proc_support import line_reader


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["SPARKCONSOLE_STATE_DIR"] = str(tmp_path / "state")
    env.setdefault("LANG", "C.UTF-8")
    env.pop("TMUX", None)  # never attach to a tmux this test runs inside
    return env


# --- demo --serve + OpenSSH --------------------------------------------------------------------


@pytest.mark.skipif(not os.access(SSH, os.X_OK), reason="no OpenSSH client at /usr/bin/ssh")
def test_demo_serve_is_reachable_with_the_printed_openssh_command_and_stops_on_ctrl_c(tmp_path):
    proc = subprocess.Popen([_sparkconsole(), "demo", "--serve"], cwd=ROOT, env=_env(tmp_path),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        printed = read_until(proc, line_reader(proc.stdout), lambda p: any(s.startswith("Try:") for s in p),
                             "demo --serve's ssh commands")
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
        printed = read_until(proc, line_reader(proc.stdout), lambda p: any(s.startswith("Try:") for s in p),
                             "demo --serve")
        workdir = next((Path(s.split()[1]) for s in printed if s.startswith("Files: ")), None)
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
