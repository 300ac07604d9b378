"""The console ``kill -9``ed mid-copy and resumed, on the two-host lab (issue 14, part 3).

A real ``sparkconsole deploy --until weights`` runs against the lab (:mod:`tests.lab.hosts`) with
host A's end of the fast link held to a few Mbit/s (``tc … tbf``), so the copy of the model's
weights to B is slow enough to cut. Once part of ``model.safetensors`` has landed on B, the
console is ``kill -9``ed and so is the copy job's whole process group on A (as an OOM kill or a
reboot of A would: a detached job otherwise outlives the console, and ``--resume`` would only
re-attach to it). The link's rate is restored and ``deploy --resume`` runs.

What is checked on the hosts themselves: B kept the cut file (``rsync --partial``), the resume
starts the lost copy again and sends fewer bytes over the fast link than the file holds (A's
kernel counters), every file on B has the Hub's sha256, and the journal holds no finished command
twice. The hosts are left as found: the model's files are removed where they were not before.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.lab.hosts import (
    FAST_IF,
    LOGIN_HOME,
    MODEL_ID,
    Lab,
    LabHost,
    fast_link_bytes,
    fast_link_limited,
    model_files,
)

pytestmark = [pytest.mark.netns, pytest.mark.sshd, pytest.mark.docker, pytest.mark.timeout(600)]

HUB = f"{LOGIN_HOME}/.cache/huggingface/hub"  # the login user's cache
MODEL_DIR = f"{HUB}/models--sclab--tiny-qwen3"
LOCKS = f"{HUB}/.locks/models--sclab--tiny-qwen3"
BIG = "model.safetensors"
DOWNLOAD = f"download {MODEL_ID} from the Hub"  # the download job's summary (its journaled end)
RATE = "4mbit"  # ~500 kB/s: the ~15 MB file takes ~30 s to cross, time enough to cut it


def _say(proc) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-2000:]}"


def _deploy_argv(cli, *extra: str, until: str) -> list[str]:
    lab: Lab = cli.lab
    answers = [a for x in lab.answers() for a in ("--answer", x)]
    return [sys.executable, "-c", "import sys; from sparkconsole.cli import main; sys.exit(main())",
            "deploy", "--config", str(lab.config_path), "--model", MODEL_ID, "--image", lab.image,
            "--gpu-memory-utilization", "0.3", "--until", until, "--yes", *answers, *extra]


def _state(cli) -> dict | None:
    files = sorted((cli.state_dir() / "deployments").glob("*.json"), key=lambda p: p.stat().st_mtime)
    if not files:
        return None
    try:
        return json.loads(files[-1].read_text())
    except ValueError:  # caught mid-write
        return None


def _journal(cli) -> list[dict]:
    path = cli.state_dir() / "journal.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _big_files_on(host: LabHost) -> dict[str, int]:
    """The big file on ``host`` by name (the final name and rsync's ``.NAME.XXXXXX`` temp) → bytes."""
    got = host.run("find", MODEL_DIR, "-name", f"*{BIG}*", "-type", "f", "-printf", "%s %f\\n", check=False)
    return {ln.split()[1]: int(ln.split()[0]) for ln in got.stdout.splitlines() if ln.strip()}


def _has(host: LabHost, path: str) -> bool:
    return host.run("test", "-e", path, check=False).returncode == 0


def _rsyncs(host: LabHost) -> list[str]:
    return host.run("pgrep", "-x", "rsync", check=False).stdout.split()


def _wait(what: str, cond, timeout: float, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def test_killed_mid_copy_resumes_the_cut_file_with_partial(lab_cli, tmp_path: Path):
    lab: Lab = lab_cli.lab
    a, b = lab.a, lab.b
    files = model_files()
    size = len(files[BIG])
    want = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    # the model on neither host: A downloads it, B gets it over the fast link
    had = {h.name: _has(h, MODEL_DIR) for h in lab.hosts}
    for h in lab.hosts:
        h.run("rm", "-rf", MODEL_DIR, LOCKS)
    out = tmp_path / "first-run.out"
    console = None
    job_dir = ""
    try:
        t0 = time.monotonic()
        with fast_link_limited(a, RATE), open(out, "w") as fh:
            console = subprocess.Popen(_deploy_argv(lab_cli, until="weights"), env=lab_cli.env(), stdout=fh,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

            def cut_enough() -> dict | None:
                if console.poll() is not None:
                    raise AssertionError(f"the console ended before the cut:\n{out.read_text()[-4000:]}")
                st = _state(lab_cli)
                if not st or "weights-copy-lab-b" not in st.get("jobs", {}):
                    return None
                # the download has ended (and the console journaled it): only the copy is cut
                if not any(e["command"].startswith("(detached job") and DOWNLOAD in e["command"]
                           for e in _journal(lab_cli)):
                    return None
                part = sum(n for name, n in _big_files_on(b).items() if name != BIG)
                return st if size // 4 <= part < size else None

            state = _wait(f"a quarter of {BIG} on {b.name}", cut_enough, timeout=180)
            job = state["jobs"]["weights-copy-lab-b"]
            job_dir = str(Path(job["log"]).parent)  # this deployment's job folder on A
            assert _rsyncs(a), "no rsync runs on A at the cut"
            # the console dies; then A kills the copy job and everything it started (OOM, reboot)
            console.kill()
            console.wait(timeout=30)
            a.run("kill", "-KILL", "--", f"-{int(job['pid'])}")
            _wait("the rsyncs to end on both hosts", lambda: not _rsyncs(a) and not _rsyncs(b), timeout=60)
            cut_at = time.monotonic() - t0
        assert "tbf" not in a.run("tc", "qdisc", "show", "dev", FAST_IF).stdout  # the link's rate is back
        first = out.read_text()
        assert "rsync -a --partial -L" in first, first[-4000:]
        assert not _has(a, job["rc"]), "the killed copy job left an exit code"

        # B kept the cut file under its own name (--partial), no rsync temp file beside it
        on_b = _big_files_on(b)
        assert set(on_b) == {BIG}, on_b
        partial = on_b[BIG]
        assert size // 4 <= partial < size, (partial, size)

        # the resume, at the link's full rate, counted by A's kernel on the fast link
        tx0, _ = fast_link_bytes(a)
        t1 = time.monotonic()
        got = lab_cli.run(*_deploy_argv(lab_cli, "--resume", until="weights")[3:], timeout=300)
        took = time.monotonic() - t1
        tx1, _ = fast_link_bytes(a)
        sent = tx1 - tx0
        assert got.returncode == 0, _say(got)
        assert "ok: stopped after weights, as asked (--until)" in got.stdout, _say(got)
        assert "the job started before is gone without an exit code; starting it again" in got.stdout, _say(got)

        # B's files are the Hub's, byte for byte
        (rev,) = b.run("ls", f"{MODEL_DIR}/snapshots").stdout.split()
        sums = b.run("sha256sum", *(f"{MODEL_DIR}/snapshots/{rev}/{n}" for n in want)).stdout
        assert {Path(ln.split()[1]).name: ln.split()[0] for ln in sums.splitlines()} == want

        # the resumed copy sent the rest, not the file again: fewer bytes than the file, and not
        # much more than what was missing (ssh, rsync's file list and block sums on top)
        assert sent < size, (sent, size)
        assert sent < (size - partial) + 1_000_000, (sent, size, partial)

        # the journal: no finished command twice
        entries = _journal(lab_cli)
        done = Counter((e["node"], e["command"]) for e in entries if e.get("exit_code") == 0)
        assert [k for k, n in done.items() if n > 1] == []
        starts = [e for e in entries if not e["command"].startswith("(detached job")]
        ends = [e for e in entries if e["command"].startswith("(detached job")]
        assert sum("hf download" in e["command"] for e in starts) == 1
        assert [e["exit_code"] for e in ends if DOWNLOAD in e["command"]] == [0]  # ended once, journaled once
        # each node's model folder made once, by the login user: the source's before its download (docker
        # would make a missing mounted cache folder as root), the target's before its copy
        assert [e["node"] for e in starts if e["command"] == f"mkdir -p {MODEL_DIR}"] == ["lab-a", "lab-b"]
        copies = [e for e in starts if "rsync -a --partial -L" in e["command"]]
        # the first copy ran beside the download; the one started again on resume is one rsync
        assert [("until [ -f" in e["command"], e["exit_code"]) for e in copies] == [(True, 0), (False, 0)]
        # the killed copy never ended on its own (no end journaled); the one started again ended once
        assert [e["exit_code"] for e in ends if ") copy " in e["command"]] == [0]
        assert len(ends) == 2, ends

        print(f"\nkill -9 mid-copy on the lab: {BIG} {size:,} B; cut after {cut_at:.1f} s at {RATE} with "
              f"{partial:,} B ({partial / size:.0%}) on {b.name}; --resume sent {sent:,} B over the fast link "
              f"({sent / size:.0%} of the file, {sent - (size - partial):+,} B over the missing "
              f"{size - partial:,} B) in {took:.1f} s; B's {len(want)} files match sha256; journal: hf download 1, "
              f"mkdir 1, copy started 2 (the lost one again), no finished command twice")
    finally:
        if console is not None and console.poll() is None:
            console.kill()
            console.wait(timeout=30)
        for h in lab.hosts:
            if not had[h.name]:
                h.run("rm", "-rf", MODEL_DIR, LOCKS, check=False)
        if job_dir.startswith(f"{LOGIN_HOME}/.cache/sparkconsole/"):
            a.run("rm", "-rf", job_dir, check=False)
