"""What the memory guard's node-side watcher costs a node: CPU seconds per wall second.

Runs the watcher exactly as the console builds it (:func:`sparkconsole.remote.memory_guard_watch`,
started by ``sh -c`` as the detached job would run it) against the machine's real ``/proc/meminfo``
and ``/proc/pressure/memory`` for ``--seconds``, with nothing to stop, then disarms it (removes its
arm file: it ends at its next tick) and reads the CPU its whole process tree used
(``getrusage(RUSAGE_CHILDREN)``: every process it started, waited for). Prints one JSON object.

    python3 benchmarks/guard_cost.py --seconds 60 [--interval 2]

Stdlib only, so it runs on any node with a Python 3 (the GPU machine of the device tool has no
Docker: the watcher's targets are empty, as they are between an arm and the engine's start).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparkconsole.remote import GuardFiles, memory_guard_watch


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--interval", type=int, default=2)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        files = GuardFiles.under(d)
        Path(files.arm).touch()
        cmd = memory_guard_watch(platform.node().split(".")[0][:63] or "node", files, [],
                                 warn_floor_bytes=4 << 30, hard_floor_bytes=2 << 30, full_act_pct=10.0,
                                 stall_ticks=3, interval_s=args.interval)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        proc = subprocess.Popen(["sh", "-c", cmd.shell()], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(args.seconds)
        state = Path(files.state).read_text(errors="replace").strip() if os.path.exists(files.state) else ""
        os.unlink(files.arm)  # disarmed: it ends at its next tick
        try:
            proc.wait(timeout=args.interval + 10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        wall = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(json.dumps({
        "machine": f"{platform.node()} {platform.machine()} {platform.release()}",
        "cpus": os.cpu_count(), "seconds": round(wall, 2), "interval_s": args.interval,
        "cpu_s": round(cpu, 4), "cpu_ms_per_s": round(1000 * cpu / wall, 3),
        "psi": os.path.exists("/proc/pressure/memory"), "last_state": state[:300],
        "exit": proc.returncode, "stderr": (proc.stderr.read().decode(errors="replace") if proc.stderr else "")[:300],
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
