"""A new user's first run: a fresh clone's ``./scripts/demo`` until both demo nodes show data.

Clones the repository's HEAD into a temporary folder, hides every cache a developer's machine has
(a fresh uv cache, pip's cache off, no uv on PATH, no ``.venv`` or ``.tools``), starts
``./scripts/demo`` in a tmux window of 120×40 and reads the screen every 0.1 s until both nodes'
rows say ``up`` with their unified memory, as a person would see it. Prints each set-up phase's
own line (what the user reads) and the seconds to data; removes the clone and the cache.

    .venv/bin/python benchmarks/first_run.py [--runs 1] [--json]

Downloads count: the packages come from the package index as they would for a user (uv's cache
starts empty).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROW = re.compile(r"spark-[0-9a-f]{4} +up +.*\b\d+/\d+ GiB")
LIMIT_S = 120.0


def one_run() -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="first-run-") as tmp:
        clone = Path(tmp) / "sparkconsole"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        path = ":".join(p for p in os.environ.get("PATH", "").split(":")
                        if p and not (Path(p) / "uv").exists())
        env = {"UV_CACHE_DIR": f"{tmp}/uv-cache", "PIP_NO_CACHE_DIR": "1", "PATH": path}
        session = f"first-run-{os.getpid()}"
        exports = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
        log = Path(tmp) / "screen.log"
        # the window waits for a key, so that everything it prints is logged (tmux pipe-pane)
        subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "120", "-y", "40",
                        "bash -c " + shlex.quote(f"read _; cd {shlex.quote(str(clone))} && exec env {exports} ./scripts/demo")],
                       check=True)
        subprocess.run(["tmux", "pipe-pane", "-t", session, f"cat >> {log}"], check=True)
        start = time.monotonic()
        subprocess.run(["tmux", "send-keys", "-t", session, "Enter"], check=True)
        try:
            seconds = None
            screen = ""
            while time.monotonic() - start < LIMIT_S:
                screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True,
                                        text=True).stdout
                if len(ROW.findall(screen)) >= 2:
                    seconds = time.monotonic() - start
                    break
                time.sleep(0.1)
        finally:
            subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
        text = log.read_text(errors="replace") if log.exists() else ""
        phases = [m.group(0).strip() for m in re.finditer(r"scripts/demo: [^\r\n\x1b]*", text)]
        return {"seconds_to_data": seconds, "phases": phases, "screen_tail": screen.splitlines()[:6]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not shutil.which("tmux"):
        print("first_run: needs tmux")
        return 2
    runs = [one_run() for _ in range(args.runs)]
    if args.json:
        print(json.dumps(runs, indent=2))
        return 0
    for i, run in enumerate(runs, 1):
        took = run["seconds_to_data"]
        print(f"run {i}: both nodes show data after "
              + (f"{took:.1f} s" if isinstance(took, float) else f"more than {LIMIT_S:.0f} s (never)"))
        for line in run["phases"]:  # type: ignore[union-attr]
            print(f"  {line}")
    return 0 if all(r["seconds_to_data"] is not None for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
