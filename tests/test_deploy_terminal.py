"""``sparkconsole deploy`` on a terminal asks each open decision there, as it asks before commands;
a script (no terminal) stops at the decision and names the ``--answer`` it needs."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run_on_a_terminal(state: Path, args: list[str], replies: list[tuple[str, str]],
                       limit_s: float = 240.0) -> tuple[int, str]:
    """Run the CLI with its stdin and stdout on a pseudo-terminal; each ``(prompt, reply)`` is typed once
    ``prompt`` has appeared after the previous reply. The exit status and everything printed."""
    leader, follower = pty.openpty()
    env = dict(os.environ, SPARKCONSOLE_STATE_DIR=str(state), TERM="dumb")
    env.pop("SPARKCONSOLE_CONFIG", None)
    proc = subprocess.Popen([sys.executable, "-m", "sparkconsole.cli", *args], cwd=ROOT, env=env,
                            stdin=follower, stdout=follower, stderr=follower, close_fds=True)
    os.close(follower)
    out, seen_upto, pending = b"", 0, list(replies)
    deadline = time.monotonic() + limit_s  # only stops a hang
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:  # the follower side closed: the process ended
                    break
                if not chunk:
                    break
                out += chunk
            if pending and pending[0][0].encode() in out[seen_upto:]:
                seen_upto = out.index(pending[0][0].encode(), seen_upto) + len(pending[0][0])
                os.write(leader, pending.pop(0)[1].encode() + b"\n")
            if proc.poll() is not None and not ready:
                break
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(leader)
    return rc, out.decode("utf-8", "replace").replace("\r\n", "\n")


def test_a_terminal_is_asked_each_decision_enter_takes_the_recommendation(tmp_path: Path) -> None:
    # plan.layout: a wrong reply is said and asked again, then Enter takes the recommended layout;
    # plan.text-only: its first option by number
    rc, text = _run_on_a_terminal(tmp_path / "state", ["deploy", "--demo", "--speed", "200", "--until", "plan"],
                                  [("answer [Enter: tp2]", "tp9"), ("answer [Enter: tp2]", ""),
                                   ("? plan.text-only", ""), ("answer [Enter:", "1")])
    assert rc == 0, text
    assert "? plan.layout: Single-node OOM risk" in text and "(recommended)" in text
    assert "'tp9' is not one of" in text
    assert "→ tp2 (operator; recommended: tp2)" in text
    first = text.split("? plan.text-only", 1)[1].split("1. ", 1)[1].split(":", 1)[0]
    assert f"→ {first} (operator;" in text
    assert "stopped after plan, as asked" in text


def test_a_script_without_a_terminal_stops_at_the_decision_and_names_the_answer(tmp_path: Path) -> None:
    env = dict(os.environ, SPARKCONSOLE_STATE_DIR=str(tmp_path / "state"))
    r = subprocess.run([sys.executable, "-m", "sparkconsole.cli", "deploy", "--demo", "--speed", "200", "--until",
                        "plan"], cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 1, r.stderr
    assert "decision plan.layout needs an answer: --answer plan.layout=tp2 (recommended) or --auto" in r.stdout
