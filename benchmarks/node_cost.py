"""What watching costs the node: the console's own probe script, fed the console's own request lines.

Issue 25 starts from a measurement: on a real GPU machine today's probe costs the node tens of ms of
CPU per tick, almost all of it the two ``nvidia-smi`` processes every tick starts. This script
measures that on whatever machine it runs on (the node itself: run it there, or on a GPU machine
lent for the purpose), side by side in one run:

* ``probe``: the probe script (:func:`sparkconsole.probe.script.probe_script`) under ``sh``, asked
  for ``--ticks`` ticks with the sections each tick asks for (:func:`sections_for_tick`, the serving
  poll's sections not included), one tick every ``--interval`` seconds;
* per section: the same, one section at a time, so the table says where the cost is.

Per tick: CPU seconds of the probe and everything it started (``RUSAGE_CHILDREN`` once the probe
has exited: the shell and the commands it waited for), processes started (``/proc/stat``'s
``processes`` counter: every fork on the machine, so run it on an otherwise idle one), and the wall
time of the answer (median and p90).

    .venv/bin/python benchmarks/node_cost.py [--ticks 60] [--interval 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sparkconsole.probe.script import MARK, SECTIONS, probe_script, sections_for_tick  # noqa: E402


def forks() -> int | None:
    """The machine's fork count since boot (``processes`` in ``/proc/stat``)."""
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("processes "):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_probe(requests: list[str], interval: float) -> dict:
    """The probe under ``sh`` answering ``requests``, one every ``interval`` s; its cost per tick."""
    cpu0, forks0 = children_cpu(), forks()
    proc = subprocess.Popen(["sh", "-c", probe_script()], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, bufsize=1)
    assert proc.stdin is not None and proc.stdout is not None
    walls: list[float] = []
    for req in requests:
        started = time.monotonic()
        proc.stdin.write(req + "\n")
        proc.stdin.flush()
        for line in proc.stdout:
            if line.startswith(f"{MARK} end"):
                break
        walls.append(time.monotonic() - started)
        time.sleep(max(0.0, interval - walls[-1]))
    proc.stdin.close()
    proc.wait(30)
    cpu, forks1 = children_cpu() - cpu0, forks()
    n = len(requests)
    return {
        "ticks": n,
        "cpu_ms_per_tick": 1000 * cpu / n,
        "processes_per_tick": None if forks0 is None or forks1 is None else (forks1 - forks0 - 1) / n,
        "wall_ms_median": 1000 * statistics.median(walls),
        "wall_ms_p90": 1000 * sorted(walls)[int(0.9 * (n - 1))],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ticks", type=int, default=60)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--per-section-ticks", type=int, default=10)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.ticks < 1 or args.interval < 0 or args.per_section_ticks < 1:
        print("node_cost: --ticks and --per-section-ticks must be at least 1, --interval not negative",
              file=sys.stderr)
        return 2
    # the console's own cadence: tick 0 asks everything, the others what is due
    rows = {"probe (the console's ticks)": run_probe([" ".join(sections_for_tick(t)) for t in range(args.ticks)],
                                                    args.interval)}
    for sec in SECTIONS:
        rows[sec.name] = run_probe([sec.name] * args.per_section_ticks, min(args.interval, 0.2))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0

    def f(v, d=1):
        return "—" if v is None else f"{v:.{d}f}"

    print("| what | ticks | CPU ms per tick (probe and children) | processes per tick | wall ms (median · p90) |")
    print("|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['ticks']} | {f(r['cpu_ms_per_tick'])} | {f(r['processes_per_tick'])} | "
              f"{f(r['wall_ms_median'])} · {f(r['wall_ms_p90'])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
