"""What watching costs the node: the console's own probe script, fed the console's own request lines.

Issue 25 starts from a measurement: on a real GPU machine the probe of before cost the node tens of
ms of CPU per tick, almost all of it the two ``nvidia-smi`` processes every tick started. This
script measures it on the node it is given, side by side in one run:

* ``before``: the probe with one-shot GPU sections (``probe_script(readers=False)``: a ``timeout``
  and an ``nvidia-smi`` per GPU section per tick);
* ``readers``: the probe as the console runs it now, long-lived ``nvidia-smi … -lms N`` readers
  beside the shell (:mod:`sparkconsole.probe.script`);

each for the console's ticks (:func:`sections_for_tick`, the serving poll's sections not included)
and for the GPU-and-memory tick alone (what every tick asks), one tick every ``--interval`` seconds.

Measured on the node, by a small ``sh`` wrapper around the probe (the same text locally and through
``--host``): CPU of the probe and everything it started (the shell's ``times`` once the probe has
ended, readers included: they are its children), processes started (``/proc/stat``'s ``processes``
counter: every fork and thread on the machine, so run it on an otherwise idle node; the lower
bound is the probe's own), the wall time of each answer, and the age of the readers' newest GPU
sample at each tick (the ``readers`` section).

    .venv/bin/python benchmarks/node_cost.py [--ticks 60] [--interval 1] [--warmup 5] [--host [USER@]HOST] [--json]

``--host`` runs it through ``ssh`` (BatchMode, the user's own config and known_hosts: host keys are
verified) on a node that has ``sh``; nothing is installed there.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sparkconsole.probe.script import (  # noqa: E402
    MARK,
    READERS_SECTION,
    parse_readers,
    probe_script,
    reader_interval_ms,
    sections_for_tick,
)

COST = "::nodecost::"
# Around the probe, on the node: the fork counter before and after, and the CPU of the probe's whole
# tree (``times``: the shell's children, waited for) once it has ended
WRAPPER = """forks() { while read -r k v _; do [ "$k" = processes ] && echo "$v"; done </proc/stat; }
f0=$(forks)
sh -c "$1"
f1=$(forks)
echo "{cost} forks $f0 $f1"
echo "{cost} times"
times
""".replace("{cost}", COST)


def _seconds(word: str) -> float:
    """``1m2.500s`` -> 62.5 (the shell's ``times``)."""
    m, _, s = word.rstrip("s").partition("m")
    return 60 * float(m) + float(s)


def run_probe(script: str, requests: list[str], interval: float, host: str | None) -> dict:
    """The probe under ``sh`` on the node answering ``requests``, one every ``interval`` s."""
    if host:
        argv = ["ssh", "-o", "BatchMode=yes", host, "sh -c " + shlex.quote(WRAPPER) + " sh " + shlex.quote(script)]
    else:
        argv = ["sh", "-c", WRAPPER, "sh", script]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, bufsize=1)
    assert proc.stdin is not None and proc.stdout is not None
    walls: list[float] = []
    ages: list[int] = []
    for req in requests:
        started = time.monotonic()
        proc.stdin.write(req + "\n")
        proc.stdin.flush()
        lines: list[str] = []
        for line in proc.stdout:
            if line.startswith(f"{MARK} end"):
                break
            lines.append(line)
        walls.append(time.monotonic() - started)
        text = "".join(lines)
        if f"section {READERS_SECTION}\n" in text:
            body = text.split(f"section {READERS_SECTION}\n", 1)[1].split(MARK, 1)[0]
            ages += [r.age_ms for r in parse_readers(body).values() if r.age_ms is not None and r.name == "gpu"]
        time.sleep(max(0.0, interval - walls[-1]))
    proc.stdin.close()
    tail = proc.stdout.read()
    proc.wait(60)
    forks0 = forks1 = None
    cpu = None
    lines = tail.splitlines()
    for i, line in enumerate(lines):
        words = line.split()
        if line.startswith(COST) and words[1:2] == ["forks"] and len(words) == 4:
            forks0, forks1 = int(words[2]), int(words[3])
        if line.startswith(COST) and words[1:2] == ["times"] and i + 2 < len(lines):
            children = lines[i + 2].split()  # ``times``: the shell's own line, then its children's
            cpu = _seconds(children[0]) + _seconds(children[1])
    n = len(requests)
    return {
        "ticks": n,
        "cpu_ms_per_tick": None if cpu is None else 1000 * cpu / n,
        "forks_per_tick": None if forks0 is None or forks1 is None else (forks1 - forks0) / n,
        "wall_ms_median": 1000 * statistics.median(walls),
        "wall_ms_p90": 1000 * sorted(walls)[int(0.9 * (n - 1))],
        "gpu_age_ms_max": max(ages) if ages else None,
        "gpu_age_ms_median": statistics.median(ages) if ages else None,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ticks", type=int, default=60)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--host", default=None, help="[USER@]HOST: measure on that node through ssh")
    p.add_argument("--warmup", type=int, default=5, help="ticks counted as the start (run again alone and taken off)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.ticks < 2 or args.interval <= 0 or not 1 <= args.warmup < args.ticks:
        print("node_cost: --ticks must be at least 2, --interval positive, --warmup between 1 and --ticks - 1",
              file=sys.stderr)
        return 2
    iv = reader_interval_ms(args.interval)
    console = [" ".join(sections_for_tick(t)) for t in range(args.ticks)]
    gpu_tick = ["uptime meminfo gpu gpu-apps"] * args.ticks
    plans = {
        "console's ticks, before (one-shot GPU sections)": (probe_script(readers=False), console),
        "console's ticks, readers": (probe_script(interval_ms=iv), [r + " " + READERS_SECTION for r in console]),
        "GPU + memory tick, before": (probe_script(readers=False), gpu_tick),
        "GPU + memory tick, readers": (probe_script(interval_ms=iv), [r + " " + READERS_SECTION for r in gpu_tick]),
    }
    rows = {}
    for name, (script, requests) in plans.items():
        whole = run_probe(script, requests, args.interval, args.host)
        # the steady state: the same run cut short after the start (the first tick's one-shot
        # queries, the readers' own start), the difference over the ticks after it
        start = run_probe(script, requests[:args.warmup], args.interval, args.host)
        n = len(requests) - args.warmup
        for key in ("cpu_ms_per_tick", "forks_per_tick"):
            a, b = whole[key], start[key]
            whole["steady_" + key] = None if a is None or b is None else (a * len(requests) - b * args.warmup) / n
        rows[name] = whole
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0

    def f(v, d=1):
        return "—" if v is None else f"{v:.{d}f}"

    print(f"node: {args.host or 'this machine'}; one tick every {args.interval:g} s; readers sample every {iv} ms")
    print(f"(steady: after the first {args.warmup} ticks, measured as the whole run less a run of those alone)")
    print("| what | ticks | CPU ms per tick (probe and children): all · steady | forks per tick (machine): all · "
          "steady | wall ms (median · p90) | GPU sample age ms (median · max) |")
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['ticks']} | {f(r['cpu_ms_per_tick'])} · {f(r['steady_cpu_ms_per_tick'])} | "
              f"{f(r['forks_per_tick'])} · {f(r['steady_forks_per_tick'])} | "
              f"{f(r['wall_ms_median'])} · {f(r['wall_ms_p90'])} | {f(r['gpu_age_ms_median'], 0)} · "
              f"{f(r['gpu_age_ms_max'], 0)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
