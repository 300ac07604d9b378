"""What choosing the services to stop costs, by the number of services on a node (issue 23 item 11).

Two searches over the same nodes, side by side:

- exhaustive (the old ``freeing.choose``, kept here as the baseline): every subset, size by size,
  until a size has one that fits; then the best of that size;
- bounded (sparkconsole): the fewest count read off the largest services, every set of that size
  scored while there are at most ``EXACT_LIMIT`` of them, else swaps from a greedy set and a
  branch-and-bound search with a fixed budget.

Each node: N containers of 0.5-20 GiB (docker stats' few MiB on top), idle or busy, and a plan that
needs half of what they hold, or most of it (85 %: the fewest count is large, the old search's
worst case, scoring every smaller size first). The exhaustive search runs only up to ``--exhaustive-max``
services (it doubles per service); both answers are checked to fit, and where both ran, to be the
same set. Printed: seconds per decision, the ratio, and the sets each scored.

Run from the repository root::

    .venv/bin/python benchmarks/free_search.py [--sizes 12,16,18,20,25,30,40,80] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sparkconsole.deploy import freeing  # noqa: E402
from sparkconsole.deploy.recon import Holder, NodeFacts  # noqa: E402

GIB = 1 << 30


def exhaustive(f: NodeFacts, need: int) -> tuple[tuple[str, ...], int]:
    """The old search: (its answer, the subsets it scored)."""
    avail = int(f.mem_available or 0)
    held = freeing.service_bytes(f)
    names, cpu = sorted(held), freeing.busy(f)
    scored = 0
    for k in range(1, len(names) + 1):
        fits = []
        for c in itertools.combinations(names, k):
            scored += 1
            if avail + sum(held[n] for n in c) >= need:
                fits.append(c)
        if fits:
            return min(fits, key=lambda c: (round(sum(held[n] for n in c) / GIB), sum(cpu.get(n, 0.0) for n in c),
                                            c)), scored
    return tuple(names), scored


def node(n: int, rng: random.Random, share: float) -> tuple[NodeFacts, int]:
    holders = [Holder("container", f"svc-{i:03d}", rng.randint(1, 40) * GIB // 2 + rng.randint(0, 8 << 20))
               for i in range(n)]
    cpu = [{"name": h.name, "cpu": rng.choice([0.0, 0.0, 0.3, 1.5, 7.0])} for h in holders]
    f = NodeFacts("spark", mem_available=4 * GIB, holders=holders, containers=cpu)
    return f, 4 * GIB + int(share * sum(h.bytes for h in holders))


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="12,16,18,20,25,30,40,80", help="services per node, comma-separated")
    ap.add_argument("--nodes", type=int, default=3, help="random nodes per size (the median is reported)")
    ap.add_argument("--exhaustive-max", type=int, default=20, help="largest node the old search is run on")
    ap.add_argument("--shares", default="0.5,0.85", help="what the plan needs, as shares of what the services hold")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rng = random.Random(23)
    rows = []
    for share, n in itertools.product((float(x) for x in args.shares.split(",")),
                                      [int(x) for x in args.sizes.split(",")]):
        new_s, old_s, new_sets, old_sets, exact = [], [], [], [], []
        for _ in range(args.nodes):
            f, need = node(n, rng, share)
            dt, c = timed(lambda f=f, need=need: freeing.choose(f, need))
            assert c.enough and c.after >= need, "the bounded answer must fit"
            new_s.append(dt)
            new_sets.append(c.examined)
            exact.append(c.exact)
            if n <= args.exhaustive_max:
                dt, (stop, scored) = timed(lambda f=f, need=need: exhaustive(f, need))
                assert stop == c.stop or not c.exact, "where both are exact, the same answer"
                old_s.append(dt)
                old_sets.append(scored)
        rows.append({"need": share, "services": n, "bounded_s": statistics.median(new_s), "bounded_sets": max(new_sets),
                     "exact": sum(exact), "of": len(exact),
                     "exhaustive_s": statistics.median(old_s) if old_s else None,
                     "exhaustive_sets": max(old_sets) if old_sets else None})
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'need':>5} {'services':>8} {'exhaustive s':>13} {'bounded s':>10} {'ratio':>8} {'sets (old)':>11} "
          f"{'sets (new)':>11} {'exact':>6}")
    for r in rows:
        old = f"{r['exhaustive_s']:.4f}" if r["exhaustive_s"] is not None else "-"
        ratio = f"{r['exhaustive_s'] / max(r['bounded_s'], 1e-9):.0f}x" if r["exhaustive_s"] is not None else "-"
        print(f"{r['need']:>5.2f} {r['services']:>8} {old:>13} {r['bounded_s']:>10.4f} {ratio:>8} "
              f"{r['exhaustive_sets'] if r['exhaustive_sets'] is not None else '-':>11} {r['bounded_sets']:>11} "
              f"{r['exact']}/{r['of']:>3}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
