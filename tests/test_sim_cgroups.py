"""The simulated node's cgroup v2 files of its running containers, as Docker's systemd cgroup driver
lays them out on a stock DGX OS node (``/sys/fs/cgroup/system.slice/docker-<full id>.scope``): what
the probe reads instead of running ``docker stats``. Read through the sim's shell, held against the
sim's own ``docker ps`` / ``docker stats`` and the real captures in tests/fixtures/real/cgroup-v2.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from sparkconsole.probe import parsers as P
from sparkconsole.sim import Shell, SimClock, build
from sparkconsole.sim import formats as F

HEAD, WORKER = "spark-1a32", "spark-5be3"
REAL = Path(__file__).parent / "fixtures" / "real" / "cgroup-v2"
SCOPES = "/sys/fs/cgroup/system.slice/docker-*.scope"
LIST = f'for d in {SCOPES}; do [ -r "$d/memory.current" ] && echo "$d"; done'
SCOPE_RE = re.compile(r"^/sys/fs/cgroup/system\.slice/docker-([0-9a-f]{64})\.scope$")


def cluster():
    return build("story", nodes=2, clock=SimClock.frozen())


async def sh(c, node: str, cmd: str, step: float = 5.0, limit: float = 600.0) -> tuple[str, str, int]:
    """Run ``cmd``, advancing the manual clock in ``step``s until it finishes."""
    task = asyncio.ensure_future(Shell(c, node).capture(cmd))
    waited = 0.0
    for _ in range(40):
        await asyncio.sleep(0)
    while not task.done():
        c.clock.advance(step)
        waited += step
        for _ in range(40):
            if task.done():
                break
            await asyncio.sleep(0)
        assert waited <= limit, f"{cmd!r} did not finish"
    return task.result()


def real_keys(name: str) -> list[str]:
    lines = (REAL / name).read_text().splitlines()
    return [ln.split()[0] for ln in lines if ln.strip() and not ln.startswith("#")]


async def scope_ids(c, node: str) -> list[str]:
    out = (await Shell(c, node).capture(LIST))[0]
    ids = []
    for line in out.splitlines():
        m = SCOPE_RE.match(line)
        assert m, line
        ids.append(m.group(1))
    return ids


async def ps_ids(c, node: str) -> set[str]:
    out = (await Shell(c, node).capture("docker ps --format '{{json .}}'"))[0]
    return {x.id for x in P.parse_docker_ps(out)}


async def read_scope(c, node: str, cid: str) -> tuple[int, dict[str, int], dict[str, int], str]:
    """(memory.current, memory.stat, cpu.stat, memory.max) read the way the probe reads them."""
    d = f"/sys/fs/cgroup/system.slice/docker-{cid}.scope"
    cmd = (f'd={d}; read -r v <"$d/memory.current"; echo "current $v"; '
           f'while read -r k v; do echo "mem $k $v"; done <"$d/memory.stat"; '
           f'while read -r k v; do echo "cpu $k $v"; done <"$d/cpu.stat"; '
           f'read -r v <"$d/memory.max"; echo "max $v"')
    out, err, rc = await Shell(c, node).capture(cmd)
    assert rc == 0 and not err, err
    current, mem, cpu, mx = -1, {}, {}, ""
    for line in out.splitlines():
        parts = line.split()
        if parts[0] == "current":
            current = int(parts[1])
        elif parts[0] == "mem":
            mem[parts[1]] = int(parts[2])
        elif parts[0] == "cpu":
            cpu[parts[1]] = int(parts[2])
        else:
            mx = parts[1]
    return current, mem, cpu, mx


async def stats(c, node: str) -> dict[str, tuple[float | None, int | None, int | None]]:
    """docker stats by short id."""
    out = (await Shell(c, node).capture("docker stats --no-stream --format '{{json .}}'"))[0]
    by_name = P.parse_docker_stats(out)
    ids = {}
    for line in out.splitlines():
        m = re.search(r'"ID":"([0-9a-f]{12})".*"Name":"([^"]+)"', line)
        if m:
            ids[m.group(1)] = by_name[m.group(2)]
    return ids


def printed_tolerance(b: int) -> float:
    """Half a unit of the last digit docker stats prints for ``b`` bytes (``1.67GiB``, ``512.3MiB``)."""
    for size in (F.GIB, F.MIB, F.KIB):
        if b >= size:
            return (0.005 if b / size < 100 else 0.05) * size + 1
    return 1


async def test_glob_lists_exactly_the_running_containers():
    c = cluster()
    for node in (HEAD, WORKER):
        ids = await scope_ids(c, node)
        assert ids and len(ids) == len(set(ids))
        assert {i[:12] for i in ids} == await ps_ids(c, node)
        running = {ct.id for ct in c.containers_on(node) if ct.network != "exec" and ct.running(c.now())}
        assert set(ids) == running


async def test_memory_current_less_inactive_file_is_docker_stats_used():
    c = cluster()
    c.clock.advance(37.3)
    st = await stats(c, HEAD)
    assert len(st) == 3
    for cid in await scope_ids(c, HEAD):
        current, mem, _, mx = await read_scope(c, HEAD, cid)
        assert mx == "max"
        used = current - mem["inactive_file"]
        ct = next(x for x in c.containers if x.id == cid)
        assert used == F.container_mem_used(c, ct, c.now())  # the one figure both renderers take
        _, stats_used, _ = st[cid[:12]]
        assert stats_used is not None and abs(used - stats_used) <= printed_tolerance(used)
        # a vLLM engine read its checkpoint: page cache the size of hundreds of MiB, charged to it
        assert mem["inactive_file"] >= 100 * F.MIB
        assert mem["anon"] + mem["file"] + mem["kernel"] + mem["percpu"] == current
        assert mem["file"] >= mem["inactive_file"] + mem["active_file"]
        assert mem["slab"] == mem["slab_reclaimable"] + mem["slab_unreclaimable"]
        assert all(v >= 0 for v in mem.values())


async def test_memory_and_cpu_stat_keys_are_the_real_kernels():
    c = cluster()
    cid = (await scope_ids(c, HEAD))[0]
    d = f"/sys/fs/cgroup/system.slice/docker-{cid}.scope"
    out = (await Shell(c, HEAD).capture(f"cat {d}/memory.stat"))[0]
    assert [ln.split()[0] for ln in out.splitlines()] == real_keys("memory.stat.txt")
    assert all(re.fullmatch(r"[a-z_]+ [0-9]+", ln) for ln in out.splitlines())
    out = (await Shell(c, HEAD).capture(f"cat {d}/cpu.stat"))[0]
    assert [ln.split()[0] for ln in out.splitlines()] == real_keys("cpu.stat.txt")
    _, _, cpu, _ = await read_scope(c, HEAD, cid)
    assert cpu["user_usec"] + cpu["system_usec"] == cpu["usage_usec"]


async def test_usage_usec_is_cumulative_and_its_rate_is_docker_cpuperc():
    c = cluster()
    glm = next(ct for ct in c.containers if ct.name == "vllm-glm")
    older: dict[str, int] = {}  # usage_usec 2 s ago
    prev: dict[str, int] = {}  # usage_usec 1 s ago
    prev_pct: dict[str, float] = {}
    rates: list[float] = []
    for _ in range(90):  # busy and idle traffic slots of the engines
        c.clock.advance(1.0)
        st = await stats(c, HEAD)
        now = {cid: (await read_scope(c, HEAD, cid))[2]["usage_usec"] for cid in await scope_ids(c, HEAD)}
        pct = {cid: st[cid[:12]][0] for cid in now}
        for cid, u in now.items():
            if cid in prev:
                assert u >= prev[cid]  # non-decreasing
                rate = (u - prev[cid]) / 1e6 * 100  # over 1 s; 100 % = one core
                assert abs(rate - pct[cid]) <= 0.02, (rate, pct[cid])
                if cid == glm.id:
                    rates.append(rate)
            if cid in older:  # over 2 s: the mean of the two 1 s readings
                two = (u - older[cid]) / 2e6 * 100
                assert abs(two - (pct[cid] + prev_pct[cid]) / 2) <= 0.02
        older, prev, prev_pct = prev, now, pct
    # the serving engine: near idle between requests, most of a core while it serves
    assert min(rates) < 2.0 and max(rates) > 50.0
    # cumulative since the container started (a day of serving: hours of CPU time)
    assert prev[glm.id] > 3600 * 1e6


async def test_a_stopped_container_loses_its_scope_and_a_started_one_gets_a_fresh_one():
    c = cluster()
    glm = next(ct for ct in c.containers if ct.name == "vllm-glm")
    assert glm.id in await scope_ids(c, HEAD)
    before = (await read_scope(c, HEAD, glm.id))[2]["usage_usec"]
    _, err, rc = await sh(c, HEAD, "docker stop vllm-glm")
    assert rc == 0, err
    ids = await scope_ids(c, HEAD)
    assert glm.id not in ids and {i[:12] for i in ids} == await ps_ids(c, HEAD)
    assert len(ids) == 2
    d = f"/sys/fs/cgroup/system.slice/docker-{glm.id}.scope"
    assert (await Shell(c, HEAD).capture(f'[ -r "{d}/memory.current" ] || echo gone'))[0] == "gone\n"
    _, err, rc = await sh(c, HEAD, "docker start vllm-glm")
    assert rc == 0, err
    c.clock.advance(3.0)
    assert glm.id in await scope_ids(c, HEAD)
    after = (await read_scope(c, HEAD, glm.id))[2]["usage_usec"]
    assert 0 < after < before and after < 60 * 1e6  # a new scope: counted from its start
