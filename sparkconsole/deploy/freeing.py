"""What must stop so the plan fits: the smallest set of running services, per node.

vLLM refuses to start when free memory is below ``gpu_memory_utilization × total``; on a Spark the
services already running hold that memory (an older model, embeddings, a reranker). For each node
the wizard looks for the fewest running containers whose memory brings ``MemAvailable`` up to the
need (page cache counts as available: the ``caches`` step drops it before launch); between sets of
the same size it keeps the most memory in use (stops no more than needed), then stops the least
busy one (CPU share from ``docker stats``). The old services keep serving until right before launch.

The search is bounded (issue 23 item 11): it tried every subset, size by size, on the event loop, and
a node with 20 containers took 2 s, each more doubling it (the TUI and its SSH keepalives froze). Now
the fewest count is read off the largest holders (no set of k can free more than the k largest, so
the first k whose largest fit is the fewest: exact, n log n). Among the sets of that size, a greedy
set is improved by single swaps until none helps, then a branch-and-bound search that visits at most
:data:`BRANCH_BUDGET` branches looks for a better one; where it finishes (nearly always, up to 40-80
containers) the answer is the exact one (``Choice.exact``), and where it does not but there are at
most :data:`EXACT_LIMIT` sets of that size (every node the old search could answer), they are all
scored: the old search's answer, always, where it had one. Every set scored is checked to fit, so
the answer always fits, and the work is bounded: :data:`MAX_PASSES` passes of k·(n-k) swaps, the
budget, and the limit. Async callers run it off the loop (:func:`choose_all`).
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sparkconsole.deploy.recon import NodeFacts

GIB = float(1 << 30)
# sets of the fewest size scored one by one at most: C(18, 9) = 48,620 covers every node of up to 18
# services (the old exhaustive search's answer, unchanged); beyond it the swap search answers
EXACT_LIMIT = 50_000
MAX_PASSES = 64  # improving swap passes at most (each strictly improves: it ends long before, in practice)
MAX_DEPTH = 400  # the branch search recurses once per container: no deeper than Python's stack allows
BRANCH_BUDGET = 50_000  # branches the bounded search may visit after the swaps, at most


@dataclass(frozen=True)
class Choice:
    node: str
    need: int  # bytes that must be available at launch
    available: int  # now
    stop: tuple[str, ...]  # container names, unit:NAME, pid:N (service_bytes)
    frees: int
    enough: bool
    # how the set was found: every set of its size scored (exact), or the bounded swap search; and
    # how many candidate sets were scored (the work, which tests bound instead of timing it)
    exact: bool = field(default=True, compare=False)
    examined: int = field(default=0, compare=False)

    @property
    def after(self) -> int:
        return self.available + self.frees


def service_bytes(f: NodeFacts) -> dict[str, int]:
    """What can be stopped to free memory, by the name a :class:`~sparkconsole.deploy.deployment_plan.Stop`
    carries: running containers (their name), systemd units holding GPU memory (``unit:NAME``) and
    host GPU processes outside both (``pid:N``). Containers were all the wizard offered before, so
    a model served by a unit or started by hand was never offered and the plan stayed short."""
    out = container_bytes(f)
    for h in f.holders:
        if h.kind != "process":
            continue
        if h.detail.startswith("unit "):
            key = "unit:" + h.detail.split(" ", 1)[1]
        elif h.detail.startswith("pid "):
            key = "pid:" + h.detail.split(" ", 1)[1]
        else:
            continue
        out[key] = out.get(key, 0) + h.bytes
    return out


def needs_sudo(name: str) -> bool:
    """Stopping a systemd unit needs root (``sudo -n systemctl stop``)."""
    return name.startswith("unit:")


def container_bytes(f: NodeFacts) -> dict[str, int]:
    """Memory each running container holds: its processes (docker stats) plus the GPU memory of
    the processes attributed to it."""
    out: dict[str, int] = {}
    for h in f.holders:
        if h.kind == "container" and h.running:
            out[h.name] = out.get(h.name, 0) + h.bytes
    for h in f.holders:
        if h.kind == "process" and h.detail.startswith("container "):
            name = h.detail.split(" ", 1)[1]
            if name in out:
                out[name] += h.bytes
    return out


CPU_STEP = 5.0  # busy-ness counts in steps of this many percent of a core


def busy(f: NodeFacts) -> dict[str, float]:
    """Each service's CPU share in steps of :data:`CPU_STEP` percent: an idle service reads anywhere
    between 0.4 % and 1.5 % from one second to the next (two idle services swap places between
    reads), so such a difference must not decide; the name does then, and the same cluster gets the
    same answer every time (its twin too: a rehearsal and the real run recommend the same set). A
    service that serves (tens of percent) still counts as busier than an idle one."""
    return {c["name"]: CPU_STEP * round(float(c.get("cpu") or 0.0) / CPU_STEP) for c in f.containers if c.get("name")}


def choose(f: NodeFacts, need: int, keep: frozenset[str] = frozenset()) -> Choice:
    """The fewest services to stop on ``f``'s node so ``need`` bytes are available (see the module
    docstring for the order between sets of that size and the bound on the work)."""
    avail = int(f.mem_available or 0)
    # a unit is a candidate only where sudo may stop it; the others stay in the "stop every" option
    held = {n: b for n, b in service_bytes(f).items() if n not in keep and (not needs_sudo(n) or f.can_sudo())}
    if avail >= need:
        return Choice(f.node, need, avail, (), 0, True)
    names = sorted(held)
    deficit = need - avail
    k = fewest(held.values(), deficit)
    if k is None:
        return Choice(f.node, need, avail, tuple(names), sum(held.values()), False)
    cpu = busy(f)
    start, swaps = _swap_search(names, k, held, cpu, deficit)
    best, visited, exact = _bounded_search(names, k, held, cpu, deficit, start, BRANCH_BUDGET)
    examined = swaps + visited
    if not exact and math.comb(len(names), k) <= EXACT_LIMIT:  # few enough to score them all
        best, examined, exact = _every_set(names, k, held, cpu, deficit), examined + math.comb(len(names), k), True
    return Choice(f.node, need, avail, best, sum(held[n] for n in best), True, exact=exact, examined=examined)


def fewest(sizes: Iterable[int], deficit: int) -> int | None:
    """The fewest of ``sizes`` whose sum reaches ``deficit`` (None: all of them do not): no k of
    them sum to more than the k largest, so the first k whose largest reach it is the fewest."""
    total = 0
    for k, b in enumerate(sorted(sizes, reverse=True), 1):
        total += b
        if total >= deficit:
            return k
    return None


def _key(chosen: Iterable[str], held: Mapping[str, int], cpu: Mapping[str, float]) -> tuple[int, float, tuple[str, ...]]:
    """The order between sets of one size: the least memory (each service's in whole GiB: a few MiB,
    which move between reads, do not decide; rounded per service, not per set, so two services of
    the same size tie whatever the others hold), then the least busy, then by name (the same answer
    on every run)."""
    c = tuple(sorted(chosen))
    return sum(_gib(held[n]) for n in c), sum(cpu.get(n, 0.0) for n in c), c


def _gib(b: float) -> int:
    return round(b / GIB)


def _every_set(names: list[str], k: int, held: Mapping[str, int], cpu: Mapping[str, float],
               deficit: int) -> tuple[str, ...]:
    fits = (c for c in itertools.combinations(names, k) if sum(held[n] for n in c) >= deficit)
    return min(fits, key=lambda c: _key(c, held, cpu))


def _seeds(names: list[str], k: int, held: Mapping[str, int], deficit: int) -> list[list[str]]:
    """Two sets of ``k`` that fit: the ``k`` largest, and the smallest one slot by slot that still
    lets the largest of the rest fill the other slots (both fit by construction: the largest left
    always qualifies)."""
    largest = sorted(names, key=lambda n: (-held[n], n))
    picked: list[str] = []
    total = 0
    for slot in range(k):
        rest = k - slot - 1
        left = [x for x in largest if x not in picked]
        top = left[:rest + 1]
        for n in sorted(left, key=lambda x: (held[x], x)):
            others = sum(held[x] for x in top) - held[n] if n in top else sum(held[x] for x in top[:rest])
            if total + held[n] + others >= deficit:
                picked.append(n)
                total += held[n]
                break
    return [largest[:k], picked]


def _swap_search(names: list[str], k: int, held: Mapping[str, int], cpu: Mapping[str, float],
                 deficit: int) -> tuple[tuple[str, ...], int]:
    """Best-improvement single swaps from the better seed; every candidate is checked to fit."""
    examined = 0
    current: tuple[str, ...] = ()
    best_key: tuple[int, float, tuple[str, ...]] | None = None
    for seed in _seeds(names, k, held, deficit):
        examined += 1
        key = _key(seed, held, cpu)
        if best_key is None or key < best_key:
            current, best_key = key[2], key
    assert best_key is not None
    for _ in range(MAX_PASSES):
        chosen = set(current)
        total = sum(held[n] for n in current)
        step: tuple[int, float, tuple[str, ...]] | None = None
        for out in current:
            for inn in names:
                if inn in chosen or total - held[out] + held[inn] < deficit:
                    continue
                examined += 1
                key = _key((chosen - {out}) | {inn}, held, cpu)
                if key < best_key and (step is None or key < step):
                    step = key
        if step is None:
            break
        best_key, current = step, step[2]
    return current, examined


class _Spent(Exception):
    """The branch-and-bound search used its budget."""


def _bounded_search(names: list[str], k: int, held: Mapping[str, int], cpu: Mapping[str, float], deficit: int,
                    start: tuple[str, ...], budget: int) -> tuple[tuple[str, ...], int, bool]:
    """Branch and bound over the sets of ``k`` from ``start`` (a set that fits), visiting at most
    ``budget`` branches: (the best set found, branches visited, whether the search finished, i.e.
    the set is the best of all). A branch is cut when even the largest of the rest cannot make it
    fit, or when even the smallest and least busy of the rest cannot beat the best set so far."""
    items = sorted(names, key=lambda n: (-held[n], n))
    size = [held[n] for n in items]
    load = [cpu.get(n, 0.0) for n in items]
    n = len(items)
    pre = [0]
    for b in size:
        pre.append(pre[-1] + b)
    qpre = [0]  # the same in the key's whole GiB (sizes descend, so their rounded values do too)
    for b in size:
        qpre.append(qpre[-1] + _gib(b))
    # the least CPU any m of items[i:] add: the sorted loads of each suffix, summed
    calm = []
    for i in range(n + 1):
        acc = [0.0]
        for x in sorted(load[i:]):
            acc.append(acc[-1] + x)
        calm.append(acc)
    best = _key(start, held, cpu)
    if n > MAX_DEPTH:  # one frame per container: the swaps' answer stands
        return best[2], 0, False
    visited = 0
    chosen: list[int] = []

    def walk(i: int, total: int, busy_sum: float, qtotal: int = 0) -> None:
        nonlocal best, visited
        visited += 1
        if visited > budget:
            raise _Spent
        m = k - len(chosen)
        if m == 0:
            key = _key((items[j] for j in chosen), held, cpu)
            if key < best:
                best = key
            return
        if n - i < m or total + pre[i + m] - pre[i] < deficit:
            return  # the m largest left do not make it fit
        # the least the key's memory can be: the m smallest left, or what still has to be freed less
        # half a GiB per service (a service's whole GiB is at least its size less half a GiB)
        low_gib = qtotal + max(qpre[n] - qpre[n - m], math.ceil((deficit - total) / GIB - 0.5 * m))
        low_cpu = busy_sum + calm[i][m]
        if low_gib > best[0] or (low_gib == best[0] and low_cpu > best[1] + 1e-9):
            return
        chosen.append(i)
        walk(i + 1, total + size[i], busy_sum + load[i], qtotal + _gib(size[i]))
        chosen.pop()
        walk(i + 1, total, busy_sum, qtotal)

    try:
        walk(0, 0, 0.0)
    except _Spent:
        return best[2], visited, False
    return best[2], visited, True


async def choose_all(facts: Mapping[str, NodeFacts], need: Mapping[str, int],
                     nodes: Iterable[str]) -> dict[str, Choice]:
    """:func:`choose` for each node, in one worker thread: the event loop (the TUI, every SSH
    keepalive) keeps running while it searches."""
    todo = [(n, facts[n], int(need.get(n, 0))) for n in nodes]
    return await asyncio.to_thread(lambda: {n: choose(f, want) for n, f, want in todo})
