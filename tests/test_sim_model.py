"""The simulated cluster's model and command emulator, on a manual clock (no SSH, no sleeping).

The sim's output is read back with the same parsers the console uses, so the sim and real
hardware are held to one contract.
"""

from __future__ import annotations

import asyncio
import re

import pytest

from sparkconsole.logs.vllm import parse_vllm_log
from sparkconsole.probe import parsers as P
from sparkconsole.probe.script import SECTION_BY_NAME, SECTIONS, section_shell
from sparkconsole.sim import SCENARIOS, Shell, SimClock, build
from sparkconsole.sim.model import GIB, MEM_TOTAL, MODELS, Curve, Holder, make_node

HEAD, WORKER = "spark-1a32", "spark-5be3"
# the fast-link IPv4s of the default layout (NVIDIA's earlier netplan: IPv4 link-local, 169.254.x.y);
# the permissive twin keeps the two-subnet 192.168.200.12 / .13
HEAD_IP = make_node(0, HEAD, True).fast_ip
WORKER_IP = make_node(1, WORKER, False, taken={HEAD_IP}).fast_ip
QWEN = "Qwen/Qwen3.5-122B-A10B-FP8"
QDIR = "/root/.cache/huggingface/hub/models--Qwen--Qwen3.5-122B-A10B-FP8"  # the permissive twin's (root) cache
HF = "/home/nvidia/.cache/huggingface"  # a stock node's: the login user's
# how a stock node drops its page cache: sparkrun's NOPASSWD rule for exactly this tee [sparkrun scripts]
DROP = "sync; echo 3 | sudo -n /usr/bin/tee /proc/sys/vm/drop_caches > /dev/null"
DROP_RULE = ("/usr/bin/tee", "/proc/sys/vm/drop_caches")


def cluster(scenario: str = "story", nodes: int = 2):
    """The scenario on a manual clock; every node carries sparkrun's drop-caches sudo rule (stock nodes
    have no other password-less sudo: tests/test_sim_stock.py)."""
    c = build(scenario, nodes=nodes, clock=SimClock.frozen())
    for n in c.nodes.values():
        n.sudo_rules.append(DROP_RULE)
    return c


async def settle(task: asyncio.Future, hops: int = 40) -> None:
    """Let the shell's processes run everything due at this sim time (each process is a task:
    a command takes a few event-loop turns to finish)."""
    for _ in range(hops):
        if task.done():
            return
        await asyncio.sleep(0)


async def sh(c, node: str, cmd: str, step: float = 5.0, limit: float = 5000.0) -> tuple[str, str, int]:
    """Run ``cmd``, advancing the manual clock in ``step``s until it finishes."""
    task = asyncio.ensure_future(Shell(c, node).capture(cmd))
    waited = 0.0
    await settle(task)
    while not task.done():
        c.clock.advance(step)
        waited += step
        await settle(task)
        if waited > limit:
            task.cancel()
            raise AssertionError(f"{cmd!r} did not finish within {limit} sim seconds")
    return task.result()


def assert_memory_sane(c, t: float | None = None) -> None:
    for name in c.nodes:
        m = c.memory(name, t)
        assert 0 <= m.free <= m.total == MEM_TOTAL
        assert 0 <= m.available <= m.total
        assert m.cached >= 0 and m.buffers >= 0
        assert m.free + m.cached + m.buffers <= m.total


# ---- formats through the real parsers ----------------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIOS)
async def test_every_probe_section_answers_and_parses(scenario):
    c = cluster(scenario)
    for node in c.nodes:
        for sec in SECTIONS:
            _out, err, rc = await Shell(c, node).capture(section_shell(sec.name))  # the arm the probe runs
            assert rc == 0 or (sec.name == "ray-status" and rc == 1), (node, sec.name, rc, err)
        shell = Shell(c, node)
        mem = P.parse_meminfo((await shell.capture("cat /proc/meminfo"))[0])
        assert mem.mem_total_bytes == MEM_TOTAL
        assert 119.6 < mem.mem_total_bytes / GIB < 119.8
        table = P.parse_nvidia_smi_table((await shell.capture("nvidia-smi"))[0])
        assert table.driver_version == "580.126.09" and table.cuda_version == "13.0"
        assert table.gpus[0].name == "NVIDIA GB10"
        assert table.gpus[0].memory_used_mib is None and table.gpus[0].power_limit_w is None
        csv = P.parse_nvidia_smi_csv((await shell.capture(SECTION_BY_NAME["gpu"].shell()))[0])
        gpus = P.gpus_from_query(csv)
        assert gpus[0].memory_total_mib is None and gpus[0].temperature_c is not None
        df = P.parse_df((await shell.capture("df -B1 -P /"))[0])
        assert df.total_bytes and 3.6 < df.total_bytes / 1024**4 < 3.7


async def test_nvidia_smi_table_has_the_gb10_shape(real):
    c = cluster("healthy")
    sim = (await Shell(c, HEAD).capture("nvidia-smi"))[0].splitlines()
    fix = real("gb10/nvidia-smi_gb10_idle_desktop.txt").splitlines()
    # every fixed line is identical, the GPU row has the same column layout
    for i in (1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 13, 14, 15, 16, 17):
        assert sim[i] == fix[i], i
    assert len(sim[9]) == len(fix[9]) and "Not Supported" in sim[9] and "/  N/A" in sim[9]
    # a compute process row is as wide as the fixture's process rows
    story = cluster("story")
    rows = [ln for ln in (await Shell(story, HEAD).capture("nvidia-smi"))[0].splitlines() if "VLLM::" in ln]
    assert rows and all(len(r) == len(fix[18]) for r in rows)
    parsed = P.parse_nvidia_smi_table("\n".join((await Shell(story, HEAD).capture("nvidia-smi"))[0].splitlines()))
    assert {p.name for p in parsed.processes} == {"VLLM::EngineCore"}
    assert all(p.memory_mib and p.memory_mib > 1000 for p in parsed.processes)


async def test_query_formats_match_the_gb10_fixtures(real):
    c = cluster()
    out = (await Shell(c, HEAD).capture("nvidia-smi --query-compute-apps=pid,process_name,used_gpu_memory "
                                        "--format=csv"))[0]
    assert out.splitlines()[0] == real("gb10/nvidia-smi_query-compute-apps_vllm_gb10.txt").splitlines()[0]
    assert re.match(r"^\d+, VLLM::EngineCore, \d+ MiB$", out.splitlines()[1])
    procs = P.processes_from_query(P.parse_nvidia_smi_csv(out))
    assert sum(p.memory_mib for p in procs) > 90_000  # GLM at gmu 0.70 + two small services
    gpu = (await Shell(c, HEAD).capture("nvidia-smi --query-gpu=name,memory.total,memory.free,memory.used,"
                                        "temperature.gpu,power.draw --format=csv"))[0]
    assert gpu.splitlines()[0].startswith("name, memory.total [MiB], memory.free [MiB], memory.used [MiB]")
    assert re.match(r"^NVIDIA GB10, \[N/A\], \[N/A\], \[N/A\], \d+, \d+\.\d\d W$", gpu.splitlines()[1])


async def test_links_ports_and_addresses():
    c = cluster()
    shell = Shell(c, HEAD)
    links = P.parse_ibdev2netdev((await shell.capture("ibdev2netdev"))[0])
    up = {link.rdma_device: link.state for link in links}
    assert up == {"rocep1s0f0": "down", "rocep1s0f1": "up", "roceP2p1s0f0": "down", "roceP2p1s0f1": "up"}
    ports = P.parse_ib_ports((await shell.capture(SECTION_BY_NAME["ib-ports"].shell()))[0])
    by = {p.rdma_device: p for p in ports}
    assert by["rocep1s0f1"].state == "ACTIVE" and by["rocep1s0f1"].rate_gbps == 200
    assert by["rocep1s0f0"].state == "DOWN"
    ifs = {i.name: i for i in P.parse_ip_addr_json((await shell.capture("ip -j addr"))[0])}
    # NVIDIA's earlier netplan: one IPv4 link-local on enp1s0f1np1, none on its enP2 twin
    assert ifs["enp1s0f1np1"].ipv4 == (f"{HEAD_IP}/16",) and ifs["enp1s0f1np1"].carrier is True
    assert HEAD_IP.startswith("169.254.") and c.node(HEAD).fast_ip == HEAD_IP
    assert ifs["enP2p1s0f1np1"].ipv4 == () and ifs["enP2p1s0f1np1"].carrier is True
    assert ifs["enp1s0f0np0"].carrier is False and ifs["enp1s0f0np0"].operstate == "DOWN"
    assert {"lo", "enP7s7", "docker0"} <= set(ifs)
    w = {i.name: i for i in P.parse_ip_addr_json((await Shell(c, WORKER).capture("ip -j addr"))[0])}
    assert w["enp1s0f1np1"].ipv4 == (f"{WORKER_IP}/16",) and WORKER_IP != HEAD_IP
    text = P.parse_ip_addr((await shell.capture("ip addr show enp1s0f1np1"))[0])
    assert text[0].ipv4 == (f"{HEAD_IP}/16",)


async def test_link_down_scenario_shows_down_everywhere():
    c = cluster("link-down")
    for node in c.nodes:
        links = P.parse_ibdev2netdev((await Shell(c, node).capture("ibdev2netdev"))[0])
        assert all(link.state == "down" for link in links)
        ifs = {i.name: i for i in P.parse_ip_addr_json((await Shell(c, node).capture("ip -j addr"))[0])}
        assert ifs["enp1s0f1np1"].carrier is False
        assert "NO-CARRIER" in (await Shell(c, node).capture("ip -br link"))[0]
    out, err, rc = await sh(c, HEAD, f"ping -c 2 {WORKER_IP}")
    assert rc == 1 and "100% packet loss" in out
    out, err, rc = await sh(c, HEAD, f"rsync -a --info=progress2 {HF}/hub/models--Qwen--"
                                     f"Qwen3-Embedding-0.6B {WORKER_IP}:{HF}/hub/")
    assert rc == 255 and "No route to host" in err


async def test_docker_formats_parse():
    c = cluster()
    shell = Shell(c, HEAD)
    cts = P.parse_docker_ps((await shell.capture("docker ps -a --format '{{json .}}'"))[0])
    assert {(x.name, x.state) for x in cts} == {("vllm-glm", "running"), ("embeddings", "running"),
                                               ("reranker", "running")}
    assert all(x.image == "vllm/vllm-openai:v0.14.1" and x.status.startswith("Up ") for x in cts)
    stats = (await shell.capture("docker stats --no-stream --format '{{json .}}'"))[0]
    assert len(stats.splitlines()) == 3 and '"MemUsage"' in stats
    assert (await shell.capture("docker version --format '{{.Server.Version}}'"))[0] == "29.2.1\n"
    w = P.parse_docker_ps((await Shell(c, WORKER).capture("docker ps -a --format '{{json .}}'"))[0])
    assert [x.name for x in w] == ["embeddings"]


async def test_unknown_commands_fail_like_a_shell():
    c = cluster()
    out, err, rc = await Shell(c, HEAD).capture("frobnicate --now")
    assert (out, err, rc) == ("", "sh: 1: frobnicate: not found\n", 127)
    out, err, rc = await Shell(c, HEAD).capture("timeout -k 1 8 env LC_ALL=C hostname 2>&1")
    assert (out, rc) == ("spark-1a32\n", 0)
    out, _, rc = await Shell(c, HEAD).capture("true && hostname; false || echo fallback | wc -l")
    assert out == "spark-1a32\n1\n" and rc == 0


async def test_same_seed_same_time_same_output():
    a, b = cluster(), cluster()
    for c in (a, b):
        c.clock.advance(123.4)
    for sec in SECTIONS:
        if sec.name in ("docker-stats",):
            continue
        assert (await Shell(a, HEAD).capture(sec.shell())) == (await Shell(b, HEAD).capture(sec.shell()))


# ---- memory ------------------------------------------------------------------------------------


async def test_drop_caches_frees_page_cache_and_memory_stays_sane():
    c = cluster("permissive")  # hf on the host: a stock node has none
    assert_memory_sane(c)
    await sh(c, HEAD, "docker stop vllm-glm embeddings reranker")
    before = P.parse_meminfo((await Shell(c, HEAD).capture("cat /proc/meminfo"))[0])
    _, _, rc = await sh(c, HEAD, f"hf download {QWEN}", step=60)
    assert rc == 0
    mid = P.parse_meminfo((await Shell(c, HEAD).capture("cat /proc/meminfo"))[0])
    assert mid.cached_bytes > before.cached_bytes + 50 * GIB  # the download went through the page cache
    assert mid.mem_available_bytes <= mid.mem_total_bytes
    _, _, rc = await sh(c, HEAD, DROP)
    assert rc == 0
    after = P.parse_meminfo((await Shell(c, HEAD).capture("cat /proc/meminfo"))[0])
    assert after.cached_bytes < 1 * GIB and after.mem_free_bytes > mid.mem_free_bytes + 50 * GIB
    assert_memory_sane(c)


async def test_stopping_a_container_frees_its_memory():
    c = cluster()
    before = c.memory(HEAD).available
    await sh(c, HEAD, "docker stop vllm-glm")
    after = c.memory(HEAD).available
    assert after - before > 80 * GIB
    cts = P.parse_docker_ps((await Shell(c, HEAD).capture("docker ps -a --format '{{json .}}'"))[0])
    assert next(x for x in cts if x.name == "vllm-glm").state == "exited"


def _ballast(c, node: str, nbytes: float) -> None:
    c.holders.append(Holder(node, 4242, "python3", Curve([(c.now(), nbytes)]), gpu=False))


@pytest.mark.parametrize("margin_gib", [-0.6, 0.6])
async def test_oom_exactly_when_weights_exceed_what_is_free(margin_gib):
    """Loading dies with a CUDA OOM iff the weights exceed MemAvailable when loading starts."""
    c = cluster("healthy")
    glm = "GadflyII/GLM-4.7-Flash-NVFP4"
    c.seed_model(HEAD, glm)
    w = MODELS[glm].weights_gib_tp1 * GIB
    # leave free = weights + margin
    _ballast(c, HEAD, c.memory(HEAD).available - (w + margin_gib * GIB))
    await sh(c, HEAD, DROP)
    _, err, rc = await sh(c, HEAD, f"docker run -d --name t vllm/vllm-openai:v0.17.0 {glm} "
                                   "--gpu-memory-utilization 0.1 --max-model-len 4096")
    assert rc == 0, err
    ct = c.container(HEAD, "t")
    run = ct.engine
    free = run.free_at_load[HEAD]
    assert abs(free - (w + margin_gib * GIB)) < 0.35 * GIB
    log, _, _ = await sh(c, HEAD, "docker logs -f t 2>&1", step=2.0)  # tqdm's bars are on stderr
    report = parse_vllm_log(log)
    if w > free:
        assert "torch.OutOfMemoryError: CUDA out of memory" in log
        assert report.state == "failed" and report.failure_kind == "oom"
        assert report.shards_done is not None and report.shards_done < report.shards_total
    else:
        assert "torch.OutOfMemoryError" not in log
        assert "Loading weights took" in log and report.shards_done == report.shards_total
    assert_memory_sane(c)
    assert_memory_sane(c, c.now() - 30)


# ---- the deployment story ----------------------------------------------------------------------


async def test_worker_has_no_internet_and_head_downloads():
    c = cluster("permissive")  # hf on the host: a stock node has none
    _, err, rc = await sh(c, WORKER, f"hf download {QWEN}")
    assert rc == 1 and "Temporary failure in name resolution" in err and "huggingface.co" in err
    _, err, rc = await sh(c, WORKER, "docker pull vllm/vllm-openai:v0.17.0")
    assert rc == 1 and "registry-1.docker.io" in err
    out, err, rc = await sh(c, HEAD, f"hf download {QWEN}", step=30)
    assert rc == 0
    bars = err.rstrip("\n").split("\r")  # tqdm writes to stderr, the snapshot path to stdout
    assert re.match(r"Fetching 52 files: 100%\|█{10}\| 52/52 \[\d\d:\d\d<00:00", bars[-1])
    assert out.rstrip().endswith(tuple("0123456789abcdef")) and out.startswith(f"{QDIR}/snapshots/")
    assert c.has_model(HEAD, QWEN) and not c.has_model(WORKER, QWEN)


async def test_old_image_cannot_serve_qwen35():
    c = cluster("old-image")
    c.seed_model(HEAD, QWEN)
    imgs = (await Shell(c, HEAD).capture("docker images"))[0]
    assert "v0.14.1" in imgs and "v0.17.0" not in imgs
    await sh(c, HEAD, "docker stop vllm-glm")
    await sh(c, HEAD, f"docker run -d --name q vllm/vllm-openai:v0.14.1 {QWEN}")
    log, _, _ = await sh(c, HEAD, "docker logs -f q")
    assert "vLLM API server version 0.14.1" in log
    assert ("Model architectures ['Qwen3_5MoeForConditionalGeneration'] are not supported for now. "
            "Supported architectures:") in log
    report = parse_vllm_log(log)
    assert report.state == "failed" and report.vllm_version == "0.14.1"
    # vLLM 0.14 raises the registry's ValueError inside ModelConfig's pydantic validation: the wrapper
    # line comes first, the classified cause wins
    assert report.failure_kind == "unsupported_architecture"
    assert report.unsupported_architectures == ("Qwen3_5MoeForConditionalGeneration",)


async def test_the_whole_story_tp1_ooms_tp2_serves():
    c = cluster("permissive")  # the old twin's story: hf on the host, root everywhere
    await sh(c, HEAD, f"hf download {QWEN}", step=60)
    out, _, rc = await sh(c, HEAD, f"rsync -a --info=progress2 {QDIR} 192.168.200.13:/root/.cache/huggingface/hub/",
                          step=10)
    assert rc == 0 and c.has_model(WORKER, QWEN)
    rx = re.compile(r"^\s*([\d,]+)\s+(\d+)%\s+(\S+/s)\s+(\d+:\d\d:\d\d)(?:\s+\(xfr#(\d+), to-chk=(\d+)/(\d+)\))?")
    recs = [rx.match(x) for x in out.replace("\r", "\n").splitlines() if x.strip()]
    assert recs and all(recs) and recs[-1].group(2) == "100" and recs[-1].group(6) == "0"
    out, _, rc = await sh(c, HEAD, "docker save vllm/vllm-openai:v0.17.0 | ssh 192.168.200.13 docker load")
    assert rc == 0 and out == "Loaded image: vllm/vllm-openai:v0.17.0\n"
    await sh(c, HEAD, "docker stop vllm-glm embeddings reranker")
    await sh(c, WORKER, "docker stop embeddings")
    await sh(c, HEAD, DROP)
    await sh(c, WORKER, DROP)

    # TP=1: the 116.6 GiB of weights do not fit one Spark
    await sh(c, HEAD, f"docker run -d --name tp1 --gpus all --network host vllm/vllm-openai:v0.17.0 "
                      f"{QWEN} --gpu-memory-utilization 0.85 --max-model-len 65536")
    log, _, _ = await sh(c, HEAD, "docker logs -f tp1 2>&1", step=2)  # tqdm's bars are on stderr
    rep = parse_vllm_log(log)
    assert rep.state == "failed" and rep.failure_kind == "oom" and rep.shards_total == 40
    assert rep.vllm_version == "0.17.0"
    assert c.memory(HEAD).available > 100 * GIB  # the dead engine gave its memory back
    await sh(c, HEAD, "docker rm tp1")
    await sh(c, HEAD, DROP)

    # TP=2 across both nodes over Ray
    img = "vllm/vllm-openai:v0.17.0"
    # HF_HUB_OFFLINE=1: the weights are local; without it the worker (no internet) first waits out the Hub
    _, err, rc = await sh(c, HEAD, f"docker run -d --name ray-head --network host -e HF_HUB_OFFLINE=1 --entrypoint ray "
                                   f"{img} start --block --head --node-ip-address=192.168.200.12 --port=6379")
    assert rc == 0, err
    _, err, rc = await sh(c, WORKER, f"docker run -d --name ray-worker --network host -e HF_HUB_OFFLINE=1 --entrypoint ray "
                                     f"{img} start --block --address=192.168.200.12:6379 --node-ip-address=192.168.200.13")
    assert rc == 0, err
    ray = P.parse_ray_status((await sh(c, HEAD, "docker exec ray-head ray status"))[0])
    assert (ray.active_nodes, ray.gpus_total, ray.gpus_used) == (2, 2, 0)
    _, err, rc = await sh(c, HEAD, f"docker exec -d ray-head vllm serve {QWEN} --tensor-parallel-size 2 "
                                   "--gpu-memory-utilization 0.85 --max-model-len 65536 --reasoning-parser qwen3 "
                                   "--served-model-name qwen35")
    assert rc == 0, err
    run = next(x.engine for x in c.containers if x.engine and x.engine.tp == 2)
    assert run.failure is None and run.ready_at is not None
    # half-way through loading: the bar, and memory growing on both nodes
    c.clock.advance(run.started + 80 - c.now())
    partial = "\n".join(ln.text for ln in run.lines if ln.t <= c.now())
    rep = parse_vllm_log(partial)
    assert rep.state == "loading" and 0 < rep.shards_done < 40
    for node in (HEAD, WORKER):
        apps = P.processes_from_query(P.parse_nvidia_smi_csv((await Shell(c, node).capture(
            "nvidia-smi --query-compute-apps=pid,process_name,used_gpu_memory --format=csv"))[0]))
        assert [p.name for p in apps] == ["ray::RayWorkerWrapper"]
        assert 5_000 < apps[0].memory_mib < 58.31 * 1024
    c.clock.advance(run.ready_at + 1 - c.now())
    log = "\n".join(ln.text for ln in run.lines)
    rep = parse_vllm_log(log)
    assert rep.state == "ready" and rep.failure_kind is None
    assert (rep.shards_done, rep.shards_total, rep.model_load_gib, rep.port) == (40, 40, 58.31, 8000)
    assert rep.kv_cache_gib == 33.8 and rep.kv_cache_tokens and rep.max_concurrency
    assert "Loading safetensors checkpoint shards:  40% Completed | 16/40 [" in log
    assert re.search(r"^\(APIServer pid=\d+\) INFO:     Application startup complete\.$", log, re.M)
    assert "(RayWorkerWrapper pid=" in log and "ip=192.168.200.13)" in log
    ray = P.parse_ray_status((await sh(c, HEAD, "ray status"))[0])
    assert ray.gpus_used == 2
    models, _, rc = await sh(c, HEAD, "curl -s http://localhost:8000/v1/models")
    assert rc == 0 and '"id":"qwen35"' in models and '"max_model_len":65536' in models
    body = '{"model": "qwen35", "messages": [{"role": "user", "content": "What is 12*17?"}]}'
    ans, _, rc = await sh(c, HEAD, f"curl -s http://localhost:8000/v1/chat/completions -H "
                                   f"'Content-Type: application/json' -d '{body}'")
    import json

    msg = json.loads(ans)["choices"][0]["message"]
    assert "204" in msg["content"] and msg["reasoning_content"] and "</think>" not in msg["content"]
    for node in (HEAD, WORKER):
        m = c.memory(node)
        assert m.available < 25 * GIB  # ~97 GiB held per node
    assert_memory_sane(c)


async def test_tp2_without_ray_waits_for_a_placement_group_or_refuses():
    c = cluster("healthy")
    await sh(c, HEAD, "docker run -d --name ray-head --network host --entrypoint ray vllm/vllm-openai:v0.17.0 start --block "
                      f"--head --node-ip-address={HEAD_IP} --port=6379")
    await sh(c, HEAD, f"docker exec -d ray-head vllm serve {QWEN} -tp 2 --gpu-memory-utilization 0.85")
    run = next(x.engine for x in c.containers if x.engine and x.engine.tp == 2)
    c.clock.advance(120)
    log = "\n".join(ln.text for ln in run.lines if ln.t <= c.now())
    assert "Waiting for creating a placement group of specs for 10 seconds" in log
    assert parse_vllm_log(log).state in ("starting", "loading")
    assert run.failure == "ray"


async def test_docker_logs_tail_and_timestamps():
    c = cluster()
    out, _, rc = await Shell(c, HEAD).capture("docker logs --tail 5 -t vllm-glm")
    lines = out.splitlines()
    assert rc == 0 and len(lines) == 5
    assert all(re.match(r"^2026-03-2\dT\d\d:\d\d:\d\d\.\d{9}Z \(APIServer pid=1\) ", ln) for ln in lines)
    full = (await Shell(c, HEAD).capture("docker logs vllm-glm 2>&1"))[0]  # uvicorn's lines are on stderr
    rep = parse_vllm_log(full)
    assert rep.state == "ready" and rep.vllm_version == "0.14.1" and rep.port == 8000


async def _tp2_ready(c):
    """Ray across both nodes and a TP=2 Qwen3.5 engine, on the ``healthy`` cluster (weights and images
    everywhere); returns (container, run) once it is ready."""
    img = "vllm/vllm-openai:v0.17.0"
    await sh(c, HEAD, f"docker run -d --name ray-head --network host --entrypoint ray {img} start --block --head "
                      f"--node-ip-address={HEAD_IP} --port=6379")
    await sh(c, WORKER, f"docker run -d --name ray-worker --network host --entrypoint ray {img} start --block "
                        f"--address={HEAD_IP}:6379 --node-ip-address={WORKER_IP}")
    _, err, rc = await sh(c, HEAD, f"docker exec -d ray-head vllm serve {QWEN} --tensor-parallel-size 2 "
                                   "--gpu-memory-utilization 0.85 --max-model-len 65536 --served-model-name qwen35 "
                                   "--distributed-executor-backend ray")
    assert rc == 0, err
    ct = next(x for x in c.containers if x.engine and x.engine.tp == 2)
    run = ct.engine
    assert run.ready_at is not None and run.nodes == (HEAD, WORKER)
    c.clock.advance(run.ready_at + 1 - c.now())
    return ct, run


NCCL_WATCHDOG = re.compile(
    rf"^\(EngineCore_DP0 pid=\d+\) \(RayWorkerWrapper pid=(?P<pid>\d+), ip={re.escape(WORKER_IP)}\) "
    r"\[rank1\]:\[E\d{3,4} \d\d:\d\d:\d\d\.\d{9} ProcessGroupNCCL\.cpp:\d+\] \[Rank 1\] Watchdog caught collective "
    r"operation timeout: WorkNCCL\(SeqNum=\d+, OpType=ALLREDUCE, NumelIn=\d+, NumelOut=\d+, "
    r"Timeout\(ms\)=600000\) ran for (?P<ms>600\d{3}) milliseconds before timing out\.$", re.M)


@pytest.mark.parametrize("how", ["marked-lost", "lost-at-planned"])
async def test_tp2_worker_lost_ends_in_the_nccl_watchdog_timeout(how):
    c = cluster("healthy")
    if how == "lost-at-planned":
        # like the node-lost scenario: the worker's lost_at is known before the engine starts
        c.nodes[WORKER].lost_at = 900.0
    ct, run = await _tp2_ready(c)
    assert run.ready_at < 900.0
    c.clock.advance(900.0 - c.now())
    if how == "marked-lost":
        c.mark_lost(WORKER)
    assert c.nodes[WORKER].lost(c.now()) and run.hung_at == 900.0
    assert ct.running(c.now()) and run.failure == "nccl"

    async def head_log() -> str:
        out, _, rc = await sh(c, HEAD, f"docker logs '{ct.name}' 2>&1")  # the engine exec'd in ray-head
        assert rc == 0
        return out

    # the collective hangs: nothing for ten minutes (no stats lines either), the engine still "up";
    # a request waits on the hung engine until it dies
    chat = asyncio.ensure_future(Shell(c, HEAD).capture(
        "curl -sS http://localhost:8000/v1/chat/completions -H 'Content-Type: application/json' "
        "-d '{\"model\": \"qwen35\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}'"))
    for _ in range(3):
        await asyncio.sleep(0)
    c.clock.advance(599.0)
    for _ in range(3):
        await asyncio.sleep(0)
    assert not chat.done()
    log = await head_log()
    assert "Watchdog" not in log and parse_vllm_log(log).state == "ready"
    assert not [ln for ln in ct.log_lines(c.now()) if 900.0 < ln.t <= c.now()]
    assert ct.running(c.now())

    # after the NCCL timeout in sim time: PyTorch's watchdog, relayed by Ray from the lost rank
    c.clock.advance(10.0)
    log = await head_log()
    await settle(chat)
    assert chat.done() and chat.result()[2] == 52
    m = NCCL_WATCHDOG.search(log)
    assert m, log[-3000:]
    assert int(m["pid"]) == run.rank_pids[1]
    watchdog_t = next(ln.t for ln in run.lines if "Watchdog caught" in ln.text)
    assert 900.0 + 600.0 < watchdog_t < 900.0 + 602.0
    assert "[rank0]:[E" in log  # the surviving rank times out on the same collective
    assert "EngineCore encountered a fatal error." in log and "EngineDeadError" in log
    assert "Finished server process" in log
    rep = parse_vllm_log(log)
    assert rep.state == "failed" and rep.failure_kind == "nccl"
    assert rep.failure_node_ip == WORKER_IP
    assert "Watchdog caught collective operation timeout" in rep.failure_line
    # the engine is gone: its memory is back on the head, the port is closed, Ray has no GPUs in use
    assert not ct.running(c.now())
    assert c.memory(HEAD).available > 100 * GIB
    _, _, rc = await sh(c, HEAD, "curl -s http://localhost:8000/health")
    assert rc == 7
    assert_memory_sane(c)


async def test_tp2_worker_lost_before_nccl_is_up_times_out_in_the_rendezvous():
    c = cluster("healthy")
    img = "vllm/vllm-openai:v0.17.0"
    await sh(c, HEAD, f"docker run -d --name ray-head --network host --entrypoint ray {img} start --block --head "
                      f"--node-ip-address={HEAD_IP} --port=6379")
    await sh(c, WORKER, f"docker run -d --name ray-worker --network host --entrypoint ray {img} start --block "
                        f"--address={HEAD_IP}:6379 --node-ip-address={WORKER_IP}")
    await sh(c, HEAD, f"docker exec -d ray-head vllm serve {QWEN} -tp 2 --gpu-memory-utilization 0.85")
    run = next(x.engine for x in c.containers if x.engine and x.engine.tp == 2)
    assert run.nccl_at is not None and run.nccl_at > c.now()
    c.mark_lost(WORKER, run.started + 1.0)
    c.clock.advance(run.started + 1.0 + 610.0 - c.now())
    log = "\n".join(ln.text for ln in run.lines if ln.t <= c.now())
    assert "DistStoreError: Timed out after 601 seconds waiting for clients. 1/2 clients joined." in log
    assert "vLLM is using nccl" not in log and "Loading safetensors" not in log
    rep = parse_vllm_log(log)
    assert rep.state == "failed" and rep.failure_kind == "nccl"


async def test_tp1_engines_do_not_care_about_a_lost_peer():
    c = cluster()
    c.mark_lost(WORKER, 10.0)
    c.clock.advance(700.0)
    for ct in c.containers_on(HEAD):
        assert ct.running(c.now()) and ct.engine.failure is None and ct.engine.hung_at is None


async def test_systemctl_show_speaks_systemds_format():
    from sparkconsole.remote import systemctl_show
    from sparkconsole.services import parse_systemctl_show

    c = cluster()
    out, _, rc = await Shell(c, HEAD).capture(systemctl_show(["ollama", "nvidia-dgx-dashboard", "nope"]).shell())
    assert rc == 0
    assert out.split("\n\n")[0] == "Id=ollama.service\nLoadState=loaded\nActiveState=inactive\nSubState=dead"
    units = {u.name: u for u in parse_systemctl_show(out, ["ollama", "nvidia-dgx-dashboard", "nope"])}
    assert units["nvidia-dgx-dashboard"].state == "active" and units["nvidia-dgx-dashboard"].detail == "running"
    assert units["nope"].loaded is False


# ---- vLLM native multi-node (no Ray): --nnodes/--node-rank/--master-addr, --headless on rank > 0 ------

IMG17 = "vllm/vllm-openai:v0.17.0"
SERVED = "qwen3.5-122b-a10b-fp8"


def native_run(rank: int) -> str:
    """The wizard's launch on node ``rank`` (image entrypoint ``vllm serve``)."""
    return (f"docker run -d --name sparkconsole-vllm-{rank} --network host --ipc host --gpus all "
            "--device /dev/infiniband --ulimit memlock=-1 --shm-size 16g -e NCCL_SOCKET_IFNAME=enp1s0f1np1 "
            # an upstream build on GB10 starts only with the field's workaround: Triton's block-FP8 GEMM
            # instead of CUTLASS's, which has no sm_121 kernel (vllm#43367)
            "-e VLLM_DISABLED_KERNELS=CutlassFp8BlockScaledMMKernel "
            f"-v {HF}:/root/.cache/huggingface {IMG17} {QWEN} --tensor-parallel-size 2 "
            f"--gpu-memory-utilization 0.85 --max-model-len 262144 --served-model-name {SERVED} --host 0.0.0.0 "
            "--port 8000 --reasoning-parser qwen3 --distributed-executor-backend mp --nnodes 2 "
            f"--node-rank {rank} --master-addr {HEAD_IP} --master-port 29501" + (" --headless" if rank else ""))


async def _native_ready(c):
    """Workers first, the head last; returns the head's container and run once ready."""
    _, err, rc = await sh(c, WORKER, native_run(1))
    assert rc == 0, err
    _, err, rc = await sh(c, HEAD, native_run(0))
    assert rc == 0, err
    head = c.container(HEAD, "sparkconsole-vllm-0")
    run = head.engine
    assert run is not None and run.ready_at is not None, run and run.failure
    c.clock.advance(run.ready_at + 1 - c.now())
    return head, run


async def test_native_tp2_across_two_nodes_is_ready_and_serves():
    c = cluster("healthy")
    head, run = await _native_ready(c)
    worker = c.container(WORKER, "sparkconsole-vllm-1")
    assert run.nodes == (HEAD, WORKER) and worker.headless.run is run
    assert head.running(c.now()) and worker.running(c.now())

    hlog = (await sh(c, HEAD, "docker logs sparkconsole-vllm-0 2>&1"))[0]
    wlog = (await sh(c, WORKER, "docker logs sparkconsole-vllm-1 2>&1"))[0]
    rep = parse_vllm_log(hlog)
    assert rep.state == "ready" and rep.port == 8000 and rep.vllm_version == "0.17.0"
    assert "World size" not in hlog
    assert re.search(r"^\(Worker_TP0 pid=\d+\) INFO .* world_size=2 rank=0 local_rank=0 "
                     rf"distributed_init_method=tcp://{re.escape(HEAD_IP)}:29501 backend=nccl$", hlog, re.M)
    assert "Loading safetensors checkpoint shards: 100% Completed | 40/40" in hlog
    # the worker's own lines are in the worker container's log, prefixed as the multiproc executor does
    assert f"Launching vLLM (v0.17.0) headless multiproc executor, with head node address {HEAD_IP}:29501" in wlog
    assert re.search(r"^\(Worker_TP1 pid=\d+\) INFO .* world_size=2 rank=1 ", wlog, re.M)
    assert re.search(r"^\(Worker_TP1 pid=\d+\) INFO .* Model loading took 58\.31 GiB memory", wlog, re.M)
    assert "Worker_TP1" not in hlog and "Application startup complete" not in wlog
    assert parse_vllm_log(wlog).state == "loading"

    # same memory on both nodes as the Ray TP=2 run; the worker's in its own container
    ray = cluster("healthy")
    _, ray_run = await _tp2_ready(ray)
    for node in (HEAD, WORKER):
        assert c.memory(node).gpu_holders and len(c.memory(node).gpu_holders) == 1
        nat = c.memory(node).gpu_holders[0][1]
        ref = ray.memory(node, ray_run.ready_at + 1).gpu_holders[0][1]
        assert abs(nat - ref) < 0.01 * GIB
    wh = c.memory(WORKER).gpu_holders[0][0]
    assert wh.name == "VLLM::Worker_TP1" and wh.container == "sparkconsole-vllm-1"

    out, _, rc = await sh(c, HEAD, "curl -sf http://localhost:8000/v1/models")
    assert rc == 0 and f'"id":"{SERVED}"' in out
    out, _, rc = await sh(c, WORKER, f"curl -s http://{HEAD_IP}:8000/health -w '%{{http_code}}'")
    assert rc == 0 and out == "200"
    out, _, rc = await sh(c, HEAD, "curl -s http://localhost:8000/v1/chat/completions -H 'Content-Type: "
                                   "application/json' -d '{\"model\": \"" + SERVED + "\", \"messages\": "
                                   "[{\"role\": \"user\", \"content\": \"12*17\"}], \"max_tokens\": 500}'",
                          step=0.5)
    assert rc == 0 and "204" in out


async def test_native_head_without_worker_dies_with_diststoreerror():
    c = cluster("healthy")
    _, err, rc = await sh(c, HEAD, native_run(0))
    assert rc == 0, err
    head = c.container(HEAD, "sparkconsole-vllm-0")
    run = head.engine
    assert run.ready_at is None and run.rendezvous_at is not None
    # waiting in the rendezvous: up, nothing new, for ten minutes
    c.clock.advance(run.rendezvous_at + 590 - c.now())
    assert head.running(c.now())
    log = (await sh(c, HEAD, "docker logs sparkconsole-vllm-0 2>&1"))[0]
    assert "DistStoreError" not in log and "World size" not in log
    c.clock.advance(20)
    assert not head.running(c.now())
    log = (await sh(c, HEAD, "docker logs sparkconsole-vllm-0 2>&1"))[0]
    assert re.search(r"^\(Worker_TP0 pid=\d+\) ERROR .*torch\.distributed\.DistStoreError: Timed out after 601 "
                     r"seconds waiting for clients\. 1/2 clients joined\.$", log, re.M)
    assert abs(run.failed_at - (run.rendezvous_at + 601)) < 2
    rep = parse_vllm_log(log)
    assert rep.state == "failed" and "DistStoreError" in (rep.failure_line or "")
    out, _, _ = await sh(c, HEAD, "docker ps -a --format '{{.Names}} {{.Status}}'")
    assert "sparkconsole-vllm-0 Exited (1)" in out


async def test_native_worker_waits_for_a_head_that_never_comes_and_a_late_one_joins():
    c = cluster("healthy")
    await sh(c, WORKER, native_run(1))
    worker = c.container(WORKER, "sparkconsole-vllm-1")
    c.clock.advance(3000)
    assert worker.running(c.now()) and worker.headless.run is None
    log = (await sh(c, WORKER, "docker logs sparkconsole-vllm-1"))[0]
    assert log.rstrip().endswith("backend=nccl") and "Error" not in log
    # a head started late still finds it waiting
    await sh(c, HEAD, native_run(0))
    run = c.container(HEAD, "sparkconsole-vllm-0").engine
    assert run.ready_at is not None and worker.headless.run is run


async def test_native_head_started_first_takes_a_worker_joining_within_the_timeout():
    c = cluster("healthy")
    await sh(c, HEAD, native_run(0))
    c.clock.advance(120)
    await sh(c, WORKER, native_run(1))
    head = c.container(HEAD, "sparkconsole-vllm-0")
    assert head.engine.ready_at is not None and head.engine.failure is None
    assert head.engine.nodes == (HEAD, WORKER)


async def test_native_link_down_no_join():
    c = cluster("healthy")
    c.nodes[WORKER].port1_up = False
    await sh(c, WORKER, native_run(1))
    await sh(c, HEAD, native_run(0))
    run = c.container(HEAD, "sparkconsole-vllm-0").engine
    assert run.ready_at is None and run.failure == "rendezvous"
    assert c.container(WORKER, "sparkconsole-vllm-1").headless.run is None


@pytest.mark.parametrize("which", ["worker", "head"])
async def test_native_stopping_either_side_ends_the_engine(which):
    c = cluster("healthy")
    head, run = await _native_ready(c)
    worker = c.container(WORKER, "sparkconsole-vllm-1")
    t_stop = c.now() + 5
    c.clock.advance(5)
    if which == "worker":
        _, _, rc = await sh(c, WORKER, "docker stop sparkconsole-vllm-1")
        assert rc == 0 and not worker.running(c.now())
        assert not c.memory(WORKER).gpu_holders  # its memory is freed
        assert head.running(c.now()) and run.hung_at is not None  # the head hangs on the collective...
        c.clock.advance(620)
        assert not head.running(c.now())  # ... and dies when NCCL's watchdog fires
        log = (await sh(c, HEAD, "docker logs sparkconsole-vllm-0 2>&1"))[0]
        assert re.search(r"^\(Worker_TP0 pid=\d+\) \[rank0\]:\[E.* Watchdog caught collective operation timeout",
                         log, re.M)
        assert "EngineDeadError" in log and parse_vllm_log(log).state == "failed"
        assert not c.memory(HEAD).gpu_holders
    else:
        _, _, rc = await sh(c, HEAD, "docker stop sparkconsole-vllm-0")
        assert rc == 0 and not head.running(c.now())
        assert not c.memory(HEAD).gpu_holders
        out, _, rc = await sh(c, HEAD, "curl -s http://localhost:8000/health")
        assert rc == 7
        assert worker.running(c.now()) and c.memory(WORKER).gpu_holders  # the worker hangs...
        c.clock.advance(620)
        assert not worker.running(c.now()) and not c.memory(WORKER).gpu_holders  # ... then dies
        log = (await sh(c, WORKER, "docker logs sparkconsole-vllm-1 2>&1"))[0]
        assert re.search(r"^\(Worker_TP1 pid=\d+\) \[rank1\]:\[E.* Watchdog caught collective operation timeout",
                         log, re.M)
        assert parse_vllm_log(log).state == "failed"
        out, _, _ = await sh(c, WORKER, "docker ps -a --format '{{.Names}} {{.Status}}'")
        assert "sparkconsole-vllm-1 Exited (1)" in out
    assert t_stop > run.ready_at


async def test_native_tp1_entrypoint_form_still_ooms_the_122b():
    c = cluster("healthy")
    cmd = (f"docker run -d --name sparkconsole-vllm-x --network host --gpus all {IMG17} {QWEN} "
           "--gpu-memory-utilization 0.85 --max-model-len 262144 --port 8000")
    _, err, rc = await sh(c, HEAD, cmd)
    assert rc == 0, err
    run = c.container(HEAD, "sparkconsole-vllm-x").engine
    assert run.tp == 1 and not run.native and run.failure in ("oom", "oom_startup")


# ---- a chat completion takes decode time -------------------------------------------------------

async def test_chat_takes_prefill_plus_tokens_at_the_decode_rate():
    c = cluster("healthy")
    await _native_ready(c)
    chat = ("curl -s http://localhost:8000/v1/chat/completions -H 'Content-Type: application/json' -d "
            "'{\"model\": \"" + SERVED + "\", \"messages\": [{\"role\": \"user\", \"content\": \"12*17\"}]}'")
    t0 = c.now()
    out, _, rc = await sh(c, HEAD, chat, step=0.05)
    took = c.now() - t0
    assert rc == 0
    import json as _json
    usage = _json.loads(out)["usage"]
    expect = 0.12 + usage["prompt_tokens"] / 1500.0 + usage["completion_tokens"] / 31.5
    assert abs(took - expect) < 0.1, (took, expect)
    tok_s = usage["completion_tokens"] / took
    assert 25.0 < tok_s < 31.5
    # /health and /v1/models answer at once
    t0 = c.now()
    await sh(c, HEAD, "curl -s http://localhost:8000/health; curl -s http://localhost:8000/v1/models", step=0.05)
    assert c.now() - t0 < 0.01
    # a --max-time shorter than the answer times out
    _, _, rc = await sh(c, HEAD, chat.replace("curl -s", "curl -s -m 0.5"), step=0.05)
    assert rc == 28


# ---- pipeline parallelism over Ray (TP x PP ranks, one per Spark) ------------------------------

THIRD = "spark-a687"  # list(c.nodes)[2] of a 3-node cluster: 192.168.200.14 on the permissive twin
IMG17 = "vllm/vllm-openai:v0.17.0"
RID = "c0ffee"
RAY_COMMON = (f"--network host --ipc host --gpus all --device /dev/infiniband --ulimit memlock=-1 --shm-size 16g "
              f"-v $HOME/.cache/huggingface:/root/.cache/huggingface --entrypoint ray {IMG17} start --block")


async def _ray_of(c, nodes: list[str]) -> None:
    """The deployment wizard's Ray cluster: a head on the first node, workers on the others."""
    ips = {n: c.node(n).fast_ip for n in c.nodes}
    head_ip = ips[nodes[0]]
    _, err, rc = await sh(c, nodes[0], f"docker run -d --name sparkconsole-ray-{RID} -e VLLM_HOST_IP={head_ip} "
                                       f"{RAY_COMMON} --head --node-ip-address={head_ip} --port=6379")
    assert rc == 0, err
    for n in nodes[1:]:
        _, err, rc = await sh(c, n, f"docker run -d --name sparkconsole-ray-{RID} -e VLLM_HOST_IP={ips[n]} "
                                    f"{RAY_COMMON} --address={head_ip}:6379 --node-ip-address={ips[n]}")
        assert rc == 0, err
    c.clock.advance(10)
    ray = P.parse_ray_status((await sh(c, nodes[0], f"docker exec sparkconsole-ray-{RID} ray status"))[0])
    assert (ray.active_nodes, ray.gpus_total) == (len(nodes), len(nodes))


async def _serve_pp(c, tp: int, pp: int) -> tuple[object, str]:
    """The engine in the Ray head's container; returns its run and its log's path on the head."""
    log = f"/root/.cache/huggingface/sparkconsole/{RID}/serve.log"  # in the container: the mount
    await sh(c, HEAD, f"mkdir -p $HOME/.cache/huggingface/sparkconsole/{RID}")
    _, err, rc = await sh(c, HEAD, f"docker exec -d sparkconsole-ray-{RID} sh -c 'exec vllm serve {QWEN} "
                                   f"--tensor-parallel-size {tp} --pipeline-parallel-size {pp} "
                                   "--distributed-executor-backend ray --gpu-memory-utilization 0.85 "
                                   "--max-model-len 65536 --reasoning-parser qwen3 --served-model-name qwen35 "
                                   f"--host 0.0.0.0 --port 8000 > {log} 2>&1'")
    assert rc == 0, err
    run = next(x.engine for x in c.containers if x.engine and x.engine.pp == pp)
    return run, f"{c.login(HEAD).hf_home}/sparkconsole/{RID}/serve.log"


async def test_pp3_over_ray_on_three_nodes_splits_the_weights_by_stage_and_serves():
    c = cluster("permissive", nodes=3)  # hf on the host, weights copied to root@
    assert list(c.nodes)[2] == THIRD
    await sh(c, HEAD, f"hf download {QWEN}", step=60)
    for ip in ("192.168.200.13", "192.168.200.14"):
        _, _, rc = await sh(c, HEAD, f"rsync -a {QDIR} {ip}:/root/.cache/huggingface/hub/", step=10)
        assert rc == 0
        out, _, rc = await sh(c, HEAD, f"docker save {IMG17} | ssh {ip} docker load")
        assert rc == 0 and out == f"Loaded image: {IMG17}\n"
    assert c.has_model(WORKER, QWEN) and c.has_model(THIRD, QWEN)
    await sh(c, HEAD, "docker stop vllm-glm embeddings reranker")
    for n in (WORKER, THIRD):
        await sh(c, n, "docker stop embeddings")
    for n in (HEAD, WORKER, THIRD):
        await sh(c, n, DROP)
    await _ray_of(c, [HEAD, WORKER, THIRD])
    run, logpath = await _serve_pp(c, 1, 3)
    assert run.failure is None and run.ready_at is not None, "\n".join(ln.text for ln in run.lines)[-3000:]
    assert (run.tp, run.pp, run.world, run.nodes) == (1, 3, 3, (HEAD, WORKER, THIRD))
    log = "\n".join(ln.text for ln in run.lines)
    assert "tensor_parallel_size=1, pipeline_parallel_size=3," in log
    assert "'pipeline_parallel_size': 3" in log
    assert "tensor_parallel_size=1 is bigger than" not in log  # no TP spread warning: one rank per stage
    ranks = re.findall(r"^\(EngineCore_DP0 pid=\d+\) \(RayWorkerWrapper pid=\d+(?:, ip=(\S+))?\) INFO \S+ \S+ "
                       r"\[parallel_state\.py:1466\] rank (\d) in world size 3 is assigned as DP rank 0, PP rank (\d), "
                       r"PCP rank 0, TP rank 0, EP rank 0$", log, re.M)
    assert ranks == [("", "0", "0"), ("192.168.200.13", "1", "1"), ("192.168.200.14", "2", "2")]
    assert re.search(r"world_size=3 rank=2 local_rank=0 distributed_init_method=tcp://192\.168\.200\.12:", log)
    # weights by stage: a third of the decoder layers each, embeddings + ViT first, lm_head last
    third = MODELS[QWEN].weights_gib_tp1 / 3
    # when the weights are in: every node holds about a third of them
    t_loaded = next(ln.t for ln in run.lines if "Loading weights took" in ln.text)
    c.clock.advance(t_loaded - c.now())
    held = {}
    for node in (HEAD, WORKER, THIRD):
        apps = P.processes_from_query(P.parse_nvidia_smi_csv((await Shell(c, node).capture(
            "nvidia-smi --query-compute-apps=pid,process_name,used_gpu_memory --format=csv"))[0]))
        assert [p.name for p in apps] == ["ray::RayWorkerWrapper"]
        held[node] = apps[0].memory_mib / 1024
        assert 0.93 * third < held[node] < 1.05 * third, held
    assert held[HEAD] > held[THIRD] > held[WORKER]  # embeddings+ViT > lm_head > middle stage
    c.clock.advance(run.ready_at + 1 - c.now())
    rep = parse_vllm_log((await sh(c, HEAD, f"cat {logpath}"))[0])
    assert rep.state == "ready" and rep.failure_kind is None
    assert abs(rep.model_load_gib - held[HEAD]) < 0.5  # the first rank's figure (nvidia-smi adds a little)
    assert 0.93 * third < rep.model_load_gib < 1.05 * third
    assert rep.kv_cache_gib and rep.kv_cache_tokens and rep.max_concurrency and rep.port == 8000
    ray = P.parse_ray_status((await sh(c, HEAD, "ray status"))[0])
    assert ray.gpus_used == 3
    for node in (HEAD, WORKER, THIRD):  # weights + KV cache + graphs on every node of the span
        assert c.memory(node).available < 30 * GIB
    assert_memory_sane(c)
    models, _, rc = await sh(c, HEAD, "curl -s http://localhost:8000/v1/models")
    assert rc == 0 and '"id":"qwen35"' in models
    body = '{"model": "qwen35", "messages": [{"role": "user", "content": "What is 12*17?"}]}'
    t0 = c.now()
    ans, _, rc = await sh(c, HEAD, f"curl -s http://localhost:8000/v1/chat/completions -H "
                                   f"'Content-Type: application/json' -d '{body}'", step=0.05)
    import json

    out = json.loads(ans)
    assert rc == 0 and "204" in out["choices"][0]["message"]["content"]
    usage = out["usage"]
    assert abs((c.now() - t0) - (0.12 + usage["prompt_tokens"] / 1500.0 + usage["completion_tokens"] / 24.0)) < 0.1


async def test_pp3_with_two_ray_members_waits_for_the_placement_group_and_fails():
    c = cluster("healthy", nodes=3)  # images everywhere; Ray on two of the three nodes only
    await _ray_of(c, [HEAD, WORKER])
    run, _ = await _serve_pp(c, 1, 3)
    assert run.failure == "ray" and run.ready_at is None
    c.clock.advance(120)
    log = "\n".join(ln.text for ln in run.lines if ln.t <= c.now())
    assert "Waiting for creating a placement group of specs for 10 seconds. specs=[{'GPU': 1.0, " \
           f"'node:{HEAD_IP}': 0.001}}, {{'GPU': 1.0}}, {{'GPU': 1.0}}]." in log
    assert parse_vllm_log(log).state in ("starting", "loading")
    c.clock.advance(run.failed_at + 1 - c.now())
    log = "\n".join(ln.text for ln in run.lines)
    assert "ValueError: Cannot provide a placement group requiring 3 GPUs" in log
    assert parse_vllm_log(log).state == "failed"
