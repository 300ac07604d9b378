"""Issue 23 item 11: the search for what to stop is bounded, and runs off the event loop.

Before, ``freeing.choose`` scored every subset of the running services, size by size, on the event
loop (twice: the plan step and the free-memory step): 20 containers took 2 s, each more doubling it.
These tests count the work (subsets drawn, sets scored), never time it."""

from __future__ import annotations

import asyncio
import itertools
import random
import threading

import pytest

from sparkconsole.deploy import freeing
from sparkconsole.deploy.recon import Holder, NodeFacts

GIB = 1 << 30
_COMBINATIONS = itertools.combinations  # the reference's own, never the counted one
SUBSETS = 50_000  # subsets a search may draw one by one: C(18, 9), what the old search met at 18 services


def _reference(f: NodeFacts, need: int) -> tuple[str, ...]:
    """The old exhaustive search, kept as the specification of the answer where it could answer."""
    avail = int(f.mem_available or 0)
    held = freeing.service_bytes(f)
    names, cpu = sorted(held), freeing.busy(f)
    for k in range(1, len(names) + 1):
        fits = [c for c in _COMBINATIONS(names, k) if avail + sum(held[n] for n in c) >= need]
        if fits:
            return min(fits, key=lambda c: (sum(round(held[n] / GIB) for n in c), sum(cpu.get(n, 0.0) for n in c), c))
    return tuple(names)


def _node(sizes: list[int], cpu: list[float], available: int) -> NodeFacts:
    holders = [Holder("container", f"svc-{i:02d}", b) for i, b in enumerate(sizes)]
    return NodeFacts("spark-a", mem_available=available, holders=holders,
                     containers=[{"name": f"svc-{i:02d}", "cpu": c} for i, c in enumerate(cpu)])


class _Budget:
    """``itertools.combinations`` that counts the subsets drawn and stops past a budget (the old search
    draws about 10^9 on the 40-container node; it must fail here, not run for hours)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.drawn = limit, 0

    def __call__(self, pool, r):
        for c in _COMBINATIONS(pool, r):
            self.drawn += 1
            if self.drawn > self.limit:
                raise AssertionError(f"more than {self.limit:,} subsets drawn: the search is not bounded")
            yield c


def test_forty_containers_fewest_that_fit_with_bounded_work(monkeypatch):
    budget = _Budget(SUBSETS)
    # 40 services of 1..40 GiB (a few MiB over, as docker stats reads them), some busier than others
    sizes = [i * GIB + 3 * (1 << 20) for i in range(1, 41)]
    cpu = [float(i % 7) for i in range(40)]
    f = _node(sizes, cpu, available=4 * GIB)
    need = 4 * GIB + 330 * GIB  # the 9 largest free 324 GiB: 10 services are the fewest
    with monkeypatch.context() as m:
        m.setattr(itertools, "combinations", budget)
        c = freeing.choose(f, need)
    assert c.enough and len(c.stop) == 10
    assert c.after >= need and c.frees == sum(sizes[int(n[4:])] for n in c.stop)
    # the least memory any 10 can free is 330 GiB (whole GiB sums reach every value from 55 to 355)
    assert round(c.frees / GIB) == 330
    # the work: swap passes and the branch budget, polynomial in 40, never the 847,660,528 sets of 10
    n, k = 40, 10
    assert 0 < c.examined <= 2 + freeing.MAX_PASSES * k * (n - k) + freeing.BRANCH_BUDGET + freeing.EXACT_LIMIT
    assert budget.drawn <= SUBSETS

    # where the old search could answer (up to 18 services), the same answer as the old search gave
    rng = random.Random(23)
    for _ in range(150):
        count = rng.randint(1, 14)
        sizes = [rng.randint(1, 40) * GIB // 2 + rng.randint(0, GIB // 8) for _ in range(count)]
        cpu = [rng.choice([0.0, 0.5, 1.0, 3.0]) for _ in range(count)]
        f = _node(sizes, cpu, available=rng.randint(0, 8) * GIB)
        need = f.mem_available + int(rng.uniform(0.1, 1.1) * sum(sizes))
        got = freeing.choose(f, need)
        assert got.stop == _reference(f, need)
        assert got.enough == (f.mem_available + sum(sizes) >= need)


def test_the_bounded_search_finds_the_exact_answer_beyond_the_enumeration():
    """Beyond EXACT_LIMIT sets of the fewest size the branch-and-bound search still lands on the
    exact answer where it finishes, on the same order of sets: compared against the old search on
    nodes small enough to enumerate, with the enumeration switched off."""
    rng = random.Random(11)
    finished = 0
    for _ in range(60):
        count = rng.randint(10, 16)
        sizes = [rng.randint(1, 40) * GIB // 2 + rng.randint(0, GIB // 8) for _ in range(count)]
        cpu = [rng.choice([0.0, 1.0, 2.0, 5.0]) for _ in range(count)]
        f = _node(sizes, cpu, available=0)
        need = int(rng.uniform(0.3, 0.8) * sum(sizes))
        want = _reference(f, need)
        held, busy = freeing.service_bytes(f), freeing.busy(f)
        start, _ = freeing._swap_search(sorted(held), len(want), held, busy, need)
        assert sum(held[x] for x in start) >= need  # the swaps' answer fits on its own
        best, visited, exact = freeing._bounded_search(sorted(held), len(want), held, busy, need, start,
                                                       freeing.BRANCH_BUDGET)
        assert sum(held[x] for x in best) >= need and visited <= freeing.BRANCH_BUDGET
        if exact:
            finished += 1
            assert best == want
    assert finished == 60


async def test_the_free_memory_decision_searches_once_per_node_while_the_loop_runs(monkeypatch):
    """The free-memory step's search runs in a worker thread (once per node), and the event loop
    keeps turning while it does: the search waits for the loop to tick, which it could not do if the
    search held the loop."""
    from sparkconsole.deploy.steps import FreeMemory
    from tests.test_dgx_os import _stock

    ollama = [Holder("container", "ollama", 40 * GIB), Holder("container", "embed", 9 * GIB)]
    flow, _ = _stock(**{"spark-a": {"holders": ollama}, "spark-b": {"holders": list(ollama)}})
    facts = {n: flow.fact(n) for n in flow.nodes}

    async def recon(nodes):
        return facts

    monkeypatch.setattr(flow, "recon", recon)
    flow.update(need={"spark-a": 130 * GIB, "spark-b": 105 * GIB})
    loop_thread = threading.get_ident()
    ticks = 0
    ticked = threading.Event()

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0)
            ticks += 1
            if ticks >= 20:
                ticked.set()

    calls: list[str] = []
    real = freeing.choose

    def search(f, need, keep=frozenset()):
        assert threading.get_ident() != loop_thread, "the search ran on the event loop"
        assert ticked.wait(30), "the event loop did not turn while the search ran"
        calls.append(f.node)
        return real(f, need, keep)

    monkeypatch.setattr(freeing, "choose", search)
    tick = asyncio.create_task(ticker())
    try:
        await FreeMemory(flow).decide()
    finally:
        tick.cancel()
    assert sorted(calls) == ["spark-a", "spark-b"]  # once per node, for the one decision
    # 30 GiB short on spark-a: ollama (40) alone; 5 GiB short on spark-b: embed (9) alone
    assert [(s.node, s.name) for s in flow.plan.stops] == [("spark-a", "ollama"), ("spark-b", "embed")]


@pytest.mark.parametrize("count", [25, 30])
def test_a_node_with_many_idle_services_is_answered(count, monkeypatch):
    """Every service equally idle and of one size: ties everywhere, the worst case for the branch
    search; the answer still fits, is of the fewest, and the subsets drawn stay within the budget."""
    budget = _Budget(SUBSETS)
    monkeypatch.setattr(itertools, "combinations", budget)
    f = _node([2 * GIB] * count, [0.0] * count, available=0)
    c = freeing.choose(f, 2 * GIB * (count // 2) + 1)
    assert c.enough and len(c.stop) == count // 2 + 1 and c.frees == 2 * GIB * (count // 2 + 1)
    assert c.examined <= 2 + freeing.MAX_PASSES * count * count + freeing.BRANCH_BUDGET + freeing.EXACT_LIMIT
