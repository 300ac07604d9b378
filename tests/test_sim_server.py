"""The simulated cluster through real SSH: asyncssh and OpenSSH clients, the probe protocol,
the console's own transport and poller, streaming, and a node that stops answering."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import asyncssh
import pytest

from sparkconsole.probe import parsers as P
from sparkconsole.probe.poller import snapshot_cluster
from sparkconsole.probe.script import MARK, SECTIONS, probe_command, sections_for_tick, split_tick
from sparkconsole.probe.state import NodeStatus
from sparkconsole.sim import SCENARIOS, SimClock, start_demo_cluster
from tests.proc_support import wait_until

HEAD, WORKER = "spark-1a32", "spark-5be3"


def _connect(node, **kw):
    return asyncssh.connect(node.host, port=node.port, username=node.user, client_keys=[node.identity],
                            known_hosts=node.known_hosts, **kw)


async def _tick(proc, names: str, seq: int, timeout: float = 10.0) -> list[str]:
    proc.stdin.write(names + "\n")
    lines = []
    while True:
        line = await asyncio.wait_for(proc.stdout.readline(), timeout)
        assert line, "probe channel closed"
        lines.append(line.rstrip("\n"))
        if line.startswith(f"{MARK} end {seq}"):
            return lines


async def test_probe_over_ssh_frames_every_section():
    async with start_demo_cluster(clock=SimClock.frozen()) as demo:
        node = demo.config.node(HEAD)
        assert node.host == "127.0.0.1" and node.port and node.identity and node.known_hosts
        async with _connect(node) as conn:  # verifies the host key against the demo's known_hosts
            proc = await conn.create_process(probe_command())
            names = " ".join(sections_for_tick(0))
            lines = await _tick(proc, names, 1)
            assert lines[0] == f"{MARK} begin 1" and lines[-1] == f"{MARK} end 1"
            secs = split_tick(lines[1:-1])
            assert list(secs) == list(sections_for_tick(0))
            assert all(s.rc == 0 for n, s in secs.items() if n != "ray-status")
            assert secs["ray-status"].rc == 1
            assert secs["hostname"].text == HEAD
            mem = P.parse_meminfo(secs["meminfo"].text)
            assert mem.mem_total_bytes and mem.mem_available_bytes <= mem.mem_total_bytes
            assert {x.state for x in P.parse_ibdev2netdev(secs["ibdev2netdev"].text)} == {"up", "down"}
            # a second tick on the same channel, with an unknown section
            lines = await _tick(proc, "meminfo bogus", 2)
            secs = split_tick(lines[1:-1])
            assert secs["bogus"].rc == 1 and secs["meminfo"].rc == 0
            proc.stdin.write_eof()
            await asyncio.wait_for(proc.wait(), 5)


async def test_wrong_host_key_is_refused():
    async with start_demo_cluster(clock=SimClock.frozen()) as demo:
        a, b = demo.config.node(HEAD), demo.config.node(WORKER)
        other_key = next(line for line in Path(b.known_hosts).read_text().splitlines() if f"]:{b.port} " in line)
        bad = asyncssh.import_known_hosts(f"[127.0.0.1]:{a.port} " + other_key.split(" ", 1)[1] + "\n")
        with pytest.raises(asyncssh.HostKeyNotVerifiable):
            async with asyncssh.connect(a.host, port=a.port, username=a.user, client_keys=[a.identity],
                                        known_hosts=bad):
                pass


_NEVER_KNOWN = {"nvidia-smi.gpu0.memory", "nvidia-smi.gpu0.power_limit_w", "gpu.memory", "ray"}


@pytest.mark.parametrize("scenario", SCENARIOS)
async def test_every_scenario_starts_answers_and_every_section_parses_on_every_node(scenario):
    async with start_demo_cluster(scenario=scenario, clock=SimClock.frozen()) as demo:
        for node in demo.config.nodes:
            async with _connect(node) as conn:
                r = await conn.run("hostname; ibdev2netdev", check=False, timeout=10)
                assert r.exit_status == 0 and r.stdout.splitlines()[0] == node.name
                links = P.parse_ibdev2netdev(r.stdout)
                want = "down" if scenario == "link-down" else "up"
                assert {x.state for x in links if x.rdma_device.endswith("f1")} == {want}
                r = await conn.run("no-such-tool", check=False, timeout=10)
                assert (r.exit_status, r.stderr) == (127, "sh: 1: no-such-tool: not found\n")
        # and every section of the probe, through the console's poller, parses on every node
        states = await snapshot_cluster(demo.config, timeout=15)
        assert {st.name for st in states} == {n.name for n in demo.config.nodes}
        for st in states:
            assert st.status is NodeStatus.UP and st.sample is not None, (st.name, st.reason)
            assert set(st.sample.sections) == {sec.name for sec in SECTIONS}
            # only what a GB10 never reports, and Ray where none runs
            assert set(st.sample.unknown) <= _NEVER_KNOWN, (st.name, dict(st.sample.unknown))


async def test_console_transport_and_poller_read_the_sim():
    from sparkconsole.probe.poller import snapshot_cluster

    async with start_demo_cluster(clock=SimClock.frozen()) as demo:
        states = await snapshot_cluster(demo.config, timeout=15)
        by = {s.name: s for s in states}
        for name in (HEAD, WORKER):
            s = by[name].sample
            assert s is not None and s.host.hostname == name and s.gpus[0].name == "NVIDIA GB10"
            assert s.memory.total_bytes and s.memory.available_bytes <= s.memory.total_bytes
            assert [link.netdev for link in s.links if link.state == "up"]
        head = by[HEAD].sample
        assert {c.name for c in head.containers} == {"vllm-glm", "embeddings", "reranker"}
        assert head.memory.used_bytes / head.memory.total_bytes > 0.8


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no OpenSSH client")
async def test_openssh_client_speaks_to_the_sim():
    async with start_demo_cluster(clock=SimClock.frozen()) as demo:
        node = demo.config.node(WORKER)
        cmd = ["ssh", "-F", "/dev/null", "-i", node.identity, "-p", str(node.port), "-o",
               f"UserKnownHostsFile={node.known_hosts}", "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
               "-o", "IdentitiesOnly=yes", f"{node.user}@{node.host}", "nvidia-smi -L; docker ps --format '{{.Names}}'"]
        proc = await asyncio.create_subprocess_exec(*cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                    stdin=subprocess.DEVNULL)
        out, err = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 0, err.decode()
        assert out.decode().startswith("GPU 0: NVIDIA GB10 (UUID: GPU-") and "embeddings" in out.decode()
        assert "ssh" in " ".join(demo.ssh_commands()) and str(node.port) in " ".join(demo.ssh_commands())


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no OpenSSH client")
async def test_a_script_piped_to_ssh_sh_runs_line_by_line_and_docker_templates_render():
    """`printf 'echo a\necho b' | ssh NODE sh` runs two commands (issue 9's first complaint printed
    `a echo b`), and `docker images --format` renders its Go template."""
    async with start_demo_cluster(clock=SimClock.frozen()) as demo:
        node = demo.config.node(WORKER)
        base = ["ssh", "-F", "/dev/null", "-i", node.identity, "-p", str(node.port), "-o",
                f"UserKnownHostsFile={node.known_hosts}", "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
                "-o", "IdentitiesOnly=yes", f"{node.user}@{node.host}"]
        proc = await asyncio.create_subprocess_exec(*base, "sh", stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                    stdin=subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(b'echo a\necho b\nls /nope || echo "fallback $?"\n'), 30)
        assert proc.returncode == 0, err.decode()
        assert out.decode() == "a\nb\nfallback 2\n"
        assert "ls: cannot access '/nope': No such file or directory" in err.decode()
        proc = await asyncio.create_subprocess_exec(
            *base, "docker images --digests --format '{{.Repository}}:{{.Tag}} {{.Digest}}'",
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        out, _ = await asyncio.wait_for(proc.communicate(), 30)
        (line,) = out.decode().splitlines()
        assert line.startswith("vllm/vllm-openai:v0.14.1 sha256:") and len(line.split()[1]) == 71


async def test_docker_logs_follow_streams_as_sim_time_passes_and_stops_when_closed():
    clock = SimClock.frozen()
    async with start_demo_cluster(scenario="healthy", clock=clock) as demo:
        sim = demo.sim
        async with _connect(demo.config.node(HEAD)) as conn:
            run = asyncio.ensure_future(conn.run("docker run -d --name q --network host vllm/vllm-openai:v0.17.0 "
                                                 "Qwen/Qwen3.5-122B-A10B-FP8 -tp 1 "
                                                 "--gpu-memory-utilization 0.85", check=False, timeout=10))
            for _ in range(50):
                await asyncio.sleep(0.02)
                clock.advance(0.1)
                if run.done():
                    break
            assert (await run).exit_status == 0
            proc = await conn.create_process("docker logs -f --tail 0 q 2>&1")  # tqdm's bars are on stderr
            got: list[str] = []
            for _ in range(80):
                clock.advance(2.0)
                try:
                    while True:
                        got.append(await asyncio.wait_for(proc.stdout.readline(), 0.05))
                except TimeoutError:
                    pass
                if any("Loading safetensors checkpoint shards" in ln for ln in got):
                    break
            assert any("Starting to load model" in ln for ln in got)
            assert any("Loading safetensors checkpoint shards" in ln for ln in got)
            proc.close()
            await asyncio.wait_for(proc.wait_closed(), 5)
        assert sim.container(HEAD, "q").running(sim.now())


async def test_node_lost_stops_answering():
    clock = SimClock.frozen()
    async with start_demo_cluster(scenario="node-lost", clock=clock) as demo:
        worker = demo.config.node(WORKER)
        async with _connect(worker) as conn:
            proc = await conn.create_process(probe_command())
            assert (await _tick(proc, "hostname", 1))[2] == WORKER
            clock.advance(25.0)
            assert await wait_until(lambda: demo.servers[WORKER].frozen), "the worker was not lost"
            proc.stdin.write("hostname\n")
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(proc.stdout.readline(), 1.0)
            with pytest.raises((TimeoutError, asyncssh.Error, OSError)):
                async with _connect(worker, connect_timeout=1.5, login_timeout=1.5):
                    pass
            conn.abort()
        # the head still answers
        async with _connect(demo.config.node(HEAD)) as conn:
            task = asyncio.ensure_future(conn.run(f"ssh {demo.sim.nodes[WORKER].fast_ip} hostname", check=False, timeout=5))
            while not task.done():
                await asyncio.sleep(0.05)
                clock.advance(2.0)
            r = await task
            assert r.exit_status == 255 and "Connection timed out" in r.stderr


async def test_the_lost_node_is_not_up_after_its_delay_and_the_head_still_is():
    # node-lost: one poll of each node through the console's poller once the loss is due
    from sparkconsole.probe.poller import snapshot_cluster
    from sparkconsole.probe.state import NodeStatus

    clock = SimClock.frozen()
    async with start_demo_cluster(scenario="node-lost", clock=clock) as demo:
        clock.advance(30)
        assert await wait_until(lambda: demo.servers[WORKER].frozen), "the worker was not lost"
        states = {s.name: s for s in await snapshot_cluster(demo.config, timeout=5)}
        assert states[HEAD].status is NodeStatus.UP
        assert states[WORKER].status is not NodeStatus.UP


async def test_losing_a_node_at_run_time_freezes_it_and_the_model_agrees():
    clock = SimClock.frozen()
    async with start_demo_cluster(clock=clock) as demo:
        clock.advance(30.0)
        assert demo.sim.nodes[WORKER].lost_at is None
        await demo.lose(WORKER)
        assert demo.sim.nodes[WORKER].lost_at == 30.0 and demo.servers[WORKER].frozen
        with pytest.raises((TimeoutError, asyncssh.Error, OSError)):
            async with _connect(demo.config.node(WORKER), connect_timeout=1.5, login_timeout=1.5):
                pass
        async with _connect(demo.config.node(HEAD)) as conn:
            r = await conn.run("hostname", check=True, timeout=5)
            assert r.stdout.strip() == HEAD
