"""The deployment's commands, typed through the real SSH transport at the demo cluster.

One table of (node, command) -> what the real tool answers (exit code and a check of its output,
read with the project's own parsers where there is one), then the scripts a wizard sends
(variables, ``$(...)``, ``&&``/``||``, a detached job found again from a second connection) and
the weight, image and engine steps of the two-node Qwen3.5-122B story. The clock is manual: a
command that takes sim time (a download, a copy) runs while the test advances the clock.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable

import asyncssh
import pytest

from sparkconsole.logs.vllm import parse_vllm_log
from sparkconsole.probe import parsers as P
from sparkconsole.sim import SimClock, start_demo_cluster
from sparkconsole.sim.model import MODELS, make_node, model_dir, repo_files, repo_revision, roce_gid
from tests.proc_support import wait_until

HEAD, WORKER = "spark-1a32", "spark-5be3"
# the fast-link IPv4s: IPv4 link-local (169.254.x.y) under the default layout, NVIDIA's earlier
# netplan; the permissive twin keeps the two-subnet addresses
HEAD_IP = make_node(0, HEAD, True).fast_ip
WORKER_IP = make_node(1, WORKER, False, taken={HEAD_IP}).fast_ip
OLD_WORKER_IP = "192.168.200.13"
QWEN = "Qwen/Qwen3.5-122B-A10B-FP8"
QDIR = model_dir(QWEN, "/root")  # the permissive twin's (root) HF cache
HOME = "/home/nvidia"  # a stock node's login user (tests/test_sim_stock.py)
HF = f"{HOME}/.cache/huggingface"
PASSWORD_REQUIRED = "sudo: a password is required\n"  # sudo -n without a rule (sudo.ws)
DROP_RULE = ("/usr/bin/tee", "/proc/sys/vm/drop_caches")  # sparkrun's NOPASSWD rule


def _connect(node):
    return asyncssh.connect(node.host, port=node.port, username=node.user, client_keys=[node.identity],
                            known_hosts=node.known_hosts)


async def ssh(demo, node: str, cmd: str, step: float = 0.5, limit: float = 20_000.0,
              conn: asyncssh.SSHClientConnection | None = None) -> asyncssh.SSHCompletedProcess:
    """Run ``cmd`` on ``node`` over SSH, advancing the manual clock until it answers."""
    async def go(c: asyncssh.SSHClientConnection) -> asyncssh.SSHCompletedProcess:
        task = asyncio.ensure_future(c.run(cmd, check=False))
        waited = 0.0
        while not task.done():
            await asyncio.sleep(0.002)
            if task.done():
                break
            demo.clock.advance(step)
            waited += step
            if waited > limit:
                task.cancel()
                raise AssertionError(f"{cmd!r} did not finish within {limit} sim seconds")
        return task.result()

    if conn is not None:
        return await go(conn)
    async with _connect(demo.config.node(node)) as c:
        return await go(c)


Check = Callable[[str, str], object]

# (node, command, exit code, check(stdout, stderr)) -- formats of the real tools
TABLE: list[tuple[str, str, int, Check]] = [
    (HEAD, "nvidia-smi", 0, lambda o, e: P.parse_nvidia_smi_table(o).driver_version == "580.126.09"),
    (HEAD, "nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader", 0,
     lambda o, e: o.startswith("NVIDIA GB10, 580.126.09, ")),
    (HEAD, "cat /proc/meminfo", 0, lambda o, e: P.parse_meminfo(o).mem_total_bytes == 125_511_932 * 1024),
    (HEAD, f"df -B1 -P {HF}", 0, lambda o, e: P.parse_df(o).total_bytes is not None),
    (HEAD, "df -B1 -P /nope", 1, lambda o, e: e == "df: /nope: No such file or directory\n"),
    (HEAD, "docker info --format '{{.Driver}}'", 0, lambda o, e: o == "overlayfs\n"),
    (HEAD, "docker images --digests --format '{{json .}}'", 0,
     lambda o, e: all(set(json.loads(ln)) == {"Containers", "CreatedAt", "CreatedSince", "Digest", "ID",
                                              "Repository", "SharedSize", "Size", "Tag", "UniqueSize",
                                              "VirtualSize"} and json.loads(ln)["Digest"].startswith("sha256:")
                      for ln in o.splitlines()) and "lmsysorg/sglang" in o),
    (HEAD, "docker ps -a --format '{{json .}}'", 0,
     lambda o, e: {c.name for c in P.parse_docker_ps(o)} == {"vllm-glm", "embeddings", "reranker"}),
    (HEAD, "docker stats --no-stream --format '{{json .}}'", 0, lambda o, e: len(P.parse_docker_stats(o)) == 3),
    (HEAD, "nvidia-smi --query-compute-apps=pid,process_name,used_gpu_memory --format=csv", 0,
     lambda o, e: o.startswith("pid, process_name, used_gpu_memory [MiB]\n")),
    (HEAD, "ibdev2netdev", 0, lambda o, e: [x.state for x in P.parse_ibdev2netdev(o)].count("up") == 2),
    (HEAD, "ip -j addr", 0, lambda o, e: any(i.name == "enp1s0f1np1" for i in P.parse_ip_addr_json(o))),
    # the empty GID entries' types read EINVAL: grep says nothing of them (2>/dev/null) and exits 2
    (HEAD, "grep -H . /sys/class/infiniband/*/ports/1/gids/* /sys/class/infiniband/*/ports/1/gid_attrs/types/* "
           "2>/dev/null", 2,
     lambda o, e: f"/sys/class/infiniband/rocep1s0f1/ports/1/gids/3:{roce_gid(HEAD_IP)}" in o
     and "/sys/class/infiniband/rocep1s0f1/ports/1/gid_attrs/types/3:RoCE v2" in o
     and "gid_attrs/types/0:IB/RoCE v1" in o and e == ""),
    (HEAD, 'echo "$HOME"', 0, lambda o, e: o == f"{HOME}\n"),
    (HEAD, 'echo "${HF_HOME:-}"', 0, lambda o, e: o == "\n"),
    (HEAD, "curl -sS -o /dev/null -w '%{http_code}\\n' --max-time 5 https://huggingface.co/api/models/" + QWEN, 0,
     lambda o, e: o == "200\n"),
    (WORKER, "curl -sS -o /dev/null -w '%{http_code}\\n' --max-time 5 https://huggingface.co/api/models/" + QWEN, 6,
     lambda o, e: o == "000\n" and e == "curl: (6) Could not resolve host: huggingface.co\n"),
    (HEAD, "ss -ltnp", 0,
     lambda o, e: o.startswith("State  Recv-Q Send-Q") and re.search(r':8000 .*users:\(\("vllm",pid=\d+,fd=\d+\)\)', o)
     and ":8001 " in o and ":8002 " in o),
    (HEAD, f"test -s {HF}/token && echo yes || echo no", 0, lambda o, e: o == "yes\n"),
    (WORKER, f"test -s {HF}/token && echo yes || echo no", 0, lambda o, e: o == "no\n"),
    (HEAD, "hf auth whoami", 127, lambda o, e: e == "sh: 1: hf: not found\n"),  # not on a stock host
    (WORKER, "command -v hf", 1, lambda o, e: o == e == ""),
    (HEAD, f"ssh -o BatchMode=yes -o ConnectTimeout=5 nvidia@{WORKER_IP} true", 0, lambda o, e: o == e == ""),
    (WORKER, f"ssh -o BatchMode=yes -o ConnectTimeout=5 {HEAD_IP} hostname", 0, lambda o, e: o == HEAD + "\n"),
    (HEAD, f"ssh -o BatchMode=yes root@{WORKER_IP} true", 255,
     lambda o, e: e == f"root@{WORKER_IP}: Permission denied (publickey).\r\n"),
    (HEAD, "docker image inspect -f '{{.Id}}' vllm/vllm-openai:v0.17.0", 0,
     lambda o, e: re.fullmatch(r"sha256:[0-9a-f]{64}\n", o)),
    (WORKER, "docker image inspect -f '{{.Id}}' vllm/vllm-openai:v0.17.0", 1,
     lambda o, e: e == "Error: No such image: vllm/vllm-openai:v0.17.0\n"),
    (HEAD, f"ping -c 3 -W 2 -M do -s 1472 {WORKER_IP}", 0,
     lambda o, e: o.startswith(f"PING {WORKER_IP} ({WORKER_IP}) 1472(1500) bytes of data.\n1480 bytes from")
     and "3 packets transmitted, 3 received, 0% packet loss" in o and "rtt min/avg/max/mdev = " in o),
    (HEAD, f"ping -c 3 -W 2 -M do -s 8972 {WORKER_IP}", 1,
     lambda o, e: o.count("ping: local error: message too long, mtu=1500\n") == 3
     and "3 packets transmitted, 0 received, +3 errors, 100% packet loss" in o),
    (HEAD, "cat /sys/class/net/enp1s0f1np1/mtu", 0, lambda o, e: o == "1500\n"),
    (HEAD, "frobnicate --now", 127, lambda o, e: e == "sh: 1: frobnicate: not found\n"),
    (HEAD, "docker run -d --ulimit memlock=-1 --shm-size 16g --device /dev/infiniband --security-opt x nope:1", 125,
     lambda o, e: "docker.io" in e or "Unable to find image 'nope:1'" in e),
    (HEAD, "docker run --bogus img", 125, lambda o, e: e.startswith("unknown flag: --bogus")),
    (HEAD, "docker run --rm --entrypoint python3 vllm/vllm-openai:v0.17.0 -c 'import vllm\nimport transformers\n"
           "import torch\ntry:\n import sglang\nexcept ImportError: pass\nfrom vllm.model_executor.models import "
           "ModelRegistry\nfor a in [\"Qwen3_5MoeForConditionalGeneration\"]: print(a)'", 0,
     lambda o, e: o == "Qwen3_5MoeForConditionalGeneration\n" and e == ""),  # the image runs the program as given
    (HEAD, "docker run --rm --entrypoint python3 vllm/vllm-openai:v0.14.1 -c 'import vllm; "
           "print(vllm.__version__)'", 0, lambda o, e: o == "0.14.1\n"),
    (HEAD, "docker run --rm --entrypoint python3 lmsysorg/sglang:v0.5.9-cu130 -c 'import sglang, vllm'", 1,
     lambda o, e: o == "" and e.endswith("ModuleNotFoundError: No module named 'vllm'\n")),
    (HEAD, "docker run --rm --entrypoint python3 lmsysorg/sglang:v0.5.9-cu130 -c 'import importlib\n"
           "for m in (\"vllm\", \"transformers\", \"torch\", \"sglang\"):\n"
           "    try: print(m, importlib.import_module(m).__version__)\n    except ImportError: print(m, \"-\")'", 0,
     lambda o, e: o == "vllm -\ntransformers 4.57.1\ntorch 2.9.1+cu130\nsglang 0.5.9\n"),
    (HEAD, "sudo -n sh -c 'sync; echo 3 > /proc/sys/vm/drop_caches'", 1, lambda o, e: e == PASSWORD_REQUIRED),
    (HEAD, "sudo -n systemctl stop ollama", 1, lambda o, e: o == "" and e == PASSWORD_REQUIRED),
    (HEAD, "curl -sf http://127.0.0.1:8000/health", 0, lambda o, e: o == ""),
    (HEAD, "curl -s http://127.0.0.1:8000/v1/models", 0,
     lambda o, e: json.loads(o)["data"][0]["id"] == "glm-4.7-flash"),
    (HEAD, "curl -s -X POST http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' "
           "-d '{\"model\": \"glm-4.7-flash\", \"messages\": [{\"role\": \"user\", \"content\": \"12*17\"}]}'", 0,
     lambda o, e: json.loads(o)["usage"]["completion_tokens"] > 0),
    (HEAD, "curl -sf http://127.0.0.1:8999/health", 7, lambda o, e: o == e == ""),
]


async def test_every_command_of_the_contract_answers_in_the_real_format():
    async with start_demo_cluster(clock=SimClock.frozen()) as demo:
        bad = []
        async with _connect(demo.config.node(HEAD)) as head, _connect(demo.config.node(WORKER)) as worker:
            for node, cmd, rc, check in TABLE:
                r = await ssh(demo, node, cmd, conn=head if node == HEAD else worker)
                ok = r.exit_status == rc and check(r.stdout, r.stderr)
                if not ok:
                    bad.append(f"{node}: {cmd!r} -> rc {r.exit_status}\n  out {r.stdout!r}\n  err {r.stderr!r}")
        assert not bad, "\n".join(bad)


async def test_the_token_never_shows_outside_cat_of_its_file():
    async with start_demo_cluster(clock=SimClock.frozen()) as demo:
        token = demo.sim.nodes[HEAD].hf_token
        assert token and token.startswith("hf_")
        seen = []
        async with _connect(demo.config.node(HEAD)) as c:
            for cmd in ("hf auth whoami", "env", "set", f"ls -la {HF}", f"find {HF} -maxdepth 1",
                        f"du -sb {HF}", f"wc -c {HF}/token", "ps -ef", f"grep -c hf_ {HF}/token"):
                r = await ssh(demo, HEAD, cmd, conn=c)
                seen.append(r.stdout + r.stderr)
            assert (await ssh(demo, HEAD, f"cat {HF}/token", conn=c)).stdout == token
        assert not [s for s in seen if token in s]


async def test_scripts_with_variables_substitutions_chains_heredocs_and_loops():
    script = f"""D={HF}/sparkconsole/d3f9a1
mkdir -p "$D" && cd "$D" || exit 9
n=0
for f in a b c; do
  echo "$f $((n + 1))" >> list.txt
  n=$((n+1))
done
if [ "$(wc -l < list.txt)" -eq 3 ] && [ -f list.txt ]; then echo "three $n"; elif true; then echo no; else :; fi
cat <<EOF > note.txt
home=$HOME id=${{ID:-none}} $(hostname)
EOF
cat <<'EOF' >> note.txt
literal $HOME
EOF
i=0; while [ $i -lt 2 ]; do i=$((i+1)); done; echo "i=$i"
false || echo "rc=$?"
X=1 sh -c 'echo "x=$X"'
export Y=2; sh -c 'echo "y=$Y"'
ls "$D" | wc -l
test -d /nope || echo nodir 1>&2
echo done; exit 3
"""
    async with start_demo_cluster(clock=SimClock.frozen()) as demo:
        r = await ssh(demo, HEAD, f"sh -c '{script.replace(chr(39), chr(39) + chr(92) + chr(39) + chr(39))}'")
        assert r.exit_status == 3
        assert r.stdout == "three 3\ni=2\nrc=1\nx=1\ny=2\n2\ndone\n", r.stdout
        assert r.stderr == "nodir\n"
        note = await ssh(demo, HEAD, f"cat {HF}/sparkconsole/d3f9a1/note.txt")
        assert note.stdout == f"home={HOME} id=none {HEAD}\nliteral $HOME\n"
        # the same script fed on stdin to `sh`
        r = await ssh(demo, HEAD, "printf 'echo a\\necho b\\n' | sh")
        assert r.stdout == "a\nb\n"
        r = await ssh(demo, HEAD, "if then")
        assert r.exit_status == 2 and r.stderr == 'sh: 1: Syntax error: "then" unexpected\n'


async def test_a_detached_job_outlives_its_channel_and_is_found_checked_and_killed_later():
    job = f"{HF}/../sparkconsole/d3f9a1"
    start = (f"mkdir -p {job} && setsid nohup sh -c 'sleep 30; echo slept > {job}/s.log 2>&1; "
             f"echo $? > {job}/s.rc' > /dev/null 2>&1 < /dev/null & echo $!")
    check = (f"sh -c 'if [ -f {job}/s.rc ]; then echo \"rc $(cat {job}/s.rc)\"; elif kill -0 PID 2>/dev/null; "
             f"then echo running; else echo lost; fi; tail -c 4096 {job}/s.log'")
    async with start_demo_cluster(clock=SimClock.frozen()) as demo:
        async with _connect(demo.config.node(HEAD)) as c:
            r = await c.run(start, check=False)  # returns at once: the job runs on
        pid = int(r.stdout)
        assert r.exit_status == 0
        async with _connect(demo.config.node(HEAD)) as c2:  # a second connection finds it
            pg = await c2.run("pgrep -f 'sleep 30'", check=False)
            # as on Linux: the `sh -c '...sleep 30...'` wrapper ($!) and its `sleep 30` child
            assert pg.exit_status == 0 and pg.stdout.split()[0] == str(pid) and len(pg.stdout.split()) == 2
            assert (await c2.run(check.replace("PID", str(pid)), check=False)).stdout.startswith("running")
            assert str(pid) in (await c2.run("ps -ef", check=False)).stdout
            await ssh(demo, HEAD, "sleep 31", conn=c2)
            out = (await c2.run(check.replace("PID", str(pid)), check=False)).stdout
            assert out == "rc 0\nslept\n"
            assert (await c2.run(f"kill -0 {pid}", check=False)).exit_status == 1
        # a second job, killed: the rc file never comes
        async with _connect(demo.config.node(HEAD)) as c3:
            pid2 = int((await c3.run(start.replace("s.log", "k.log").replace("s.rc", "k.rc"), check=False)).stdout)
            kr = await c3.run(f"kill -TERM -- -{pid2}", check=False)  # the job's process group
            assert kr.exit_status == 0
            assert await wait_until(lambda: pid2 not in demo.sim.proc_table(HEAD).procs), "the job survived"
            demo.clock.advance(40)
            out = (await c3.run(check.replace("PID", str(pid2)).replace("s.", "k."), check=False)).stdout
            assert out.startswith("lost")
            r = await c3.run(f"kill {pid2}", check=False)
            assert r.exit_status == 1 and r.stderr == "sh: 1: kill: No such process\n"


async def test_redirected_output_grows_while_the_job_runs():
    async with start_demo_cluster(clock=SimClock.frozen()) as demo, _connect(demo.config.node(HEAD)) as c:
        await c.run("sh -c 'i=0; while [ $i -lt 5 ]; do i=$((i+1)); echo line$i; sleep 10; done' "
                    "> /tmp/g.log 2>&1 &", check=False)
        sizes = []
        for _ in range(3):
            sizes.append(int((await c.run("wc -c /tmp/g.log", check=False)).stdout.split()[0]))
            demo.clock.advance(10)
            await asyncio.sleep(0.02)
        assert sizes == sorted(sizes) and sizes[0] < sizes[-1]
        assert (await c.run("tail -c +7 /tmp/g.log", check=False)).stdout.startswith("line2\n")
        assert (await c.run("tail -n 1 /tmp/g.log", check=False)).stdout.startswith("line")
        assert (await c.run("head -n 1 /tmp/g.log", check=False)).stdout == "line1\n"


async def test_weights_download_copy_with_and_without_dereferencing_and_verify():
    """hf download on the head (killed and resumed), rsync without -L leaves broken links, with -L
    the sizes match the Hub's tree; sha256sum and du agree. On the permissive twin: hf on the host,
    rsync to root@ (a stock node downloads in a container and copies to its login user)."""
    async with start_demo_cluster(scenario="permissive", clock=SimClock.frozen()) as demo:
        sim = demo.sim
        job = "/root/.cache/sparkconsole/d3f9a1"
        start = (f"mkdir -p {job} && setsid nohup sh -c 'hf download {QWEN} > {job}/dl.log 2>&1; "
                 f"echo $? > {job}/dl.rc' > /dev/null 2>&1 < /dev/null & echo $!")
        async with _connect(demo.config.node(HEAD)) as c:
            pid = int((await c.run(start, check=False)).stdout)
            for _ in range(40):  # 400 s: about a third of the 125 GB
                demo.clock.advance(10)
                await asyncio.sleep(0.005)
            have = sim.model_bytes(HEAD, QWEN)
            assert 0 < have < MODELS[QWEN].disk_bytes
            assert "Fetching 52 files" in (await c.run(f"tail -c 300 {job}/dl.log", check=False)).stdout
            await c.run(f"kill -TERM -- -{pid}", check=False)
            assert await wait_until(lambda: pid not in sim.proc_table(HEAD).procs), "the download survived"
            done_blobs = (await c.run(f"find {QDIR}/blobs -type f -printf '%f\\n'", check=False)).stdout.split()
            partial = [b for b in done_blobs if b.endswith(".incomplete")]
            assert len(partial) == 1
        r = await ssh(demo, HEAD, f"hf download {QWEN}", step=10)
        assert r.exit_status == 0 and r.stdout == f"{QDIR}/snapshots/{repo_revision(QWEN)}\n"
        assert sim.has_model(HEAD, QWEN)
        # the Hub's tree (the wizard's reference for sizes and sha256)
        tree = json.loads((await ssh(demo, HEAD, f"curl -sS --max-time 20 'https://huggingface.co/api/models/{QWEN}"
                                                 "/tree/main?recursive=true'")).stdout)
        assert len(tree) == 52 and sum(f["size"] for f in tree) == MODELS[QWEN].disk_bytes
        shards = [f for f in tree if f["path"].endswith(".safetensors")]
        assert len(shards) == 40 and all(f["lfs"]["oid"] and f["lfs"]["size"] == f["size"] for f in shards)
        assert "lfs" not in next(f for f in tree if f["path"] == "config.json")

        # without -L: the snapshot links arrive as links to blobs that were not sent
        dest = f"root@{OLD_WORKER_IP}:{QDIR}/"
        await ssh(demo, WORKER, f"mkdir -p {QDIR}")
        r = await ssh(demo, HEAD, f"rsync -a --partial --exclude blobs/ --info=progress2 -e 'ssh -o BatchMode=yes' "
                                  f"{QDIR}/ {dest}")
        assert r.exit_status == 0
        broken = (await ssh(demo, WORKER, f"find {QDIR} -xtype l")).stdout.splitlines()
        assert len(broken) == 52 and not sim.has_model(WORKER, QWEN)
        links = (await ssh(demo, WORKER, f"find {QDIR} -type l -printf '%P %l\\n'")).stdout.splitlines()
        assert all(re.fullmatch(r"snapshots/[0-9a-f]{40}/\S+ \.\./\.\./blobs/[0-9a-f]{64}", ln) for ln in links)
        await ssh(demo, WORKER, f"rm -rf {QDIR}/snapshots && mkdir -p {QDIR}")

        # with -L: the files themselves, progress2 lines as rsync 3.2 prints them
        r = await ssh(demo, HEAD, f"rsync -a --partial -L --exclude blobs/ --info=progress2 -e 'ssh -o BatchMode=yes' "
                                  f"{QDIR}/ {dest}", step=5)
        assert r.exit_status == 0, r.stderr
        recs = [x for x in r.stdout.replace("\r", "\n").splitlines() if x.strip()]
        rx = re.compile(r"^\s*([\d,]+)\s+(\d+)%\s+(\S+/s)\s+(\d+:\d\d:\d\d)(?:\s+\(xfr#(\d+), to-chk=(\d+)/(\d+)\))?$")
        assert recs and all(rx.match(x) for x in recs), recs[:3]
        assert rx.match(recs[-1]).group(2) == "100"
        assert sim.has_model(WORKER, QWEN)
        assert (await ssh(demo, WORKER, f"find {QDIR} -xtype l")).stdout == ""
        sizes = dict(ln.split(" ", 1)[::-1] for ln in
                     (await ssh(demo, WORKER, f"find -L {QDIR}/snapshots -type f -printf '%s %P\\n'")).stdout.splitlines())
        rev = repo_revision(QWEN)
        assert {p.split("/", 1)[1] if p.startswith(rev) else p: int(s) for p, s in sizes.items()} == {
            f["path"]: f["size"] for f in tree}
        one = repo_files(MODELS[QWEN])[0]
        r = await ssh(demo, WORKER, f"sha256sum {QDIR}/snapshots/{rev}/{one.path}")
        assert r.stdout == f"{one.sha256}  {QDIR}/snapshots/{rev}/{one.path}\n"
        du = int((await ssh(demo, WORKER, f"du -sb {QDIR}")).stdout.split("\t")[0])
        assert du >= MODELS[QWEN].disk_bytes


@pytest.mark.parametrize("partial", [True, False])
async def test_a_cut_rsync_resumes_only_with_partial(partial):
    async with start_demo_cluster(scenario="healthy", clock=SimClock.frozen()) as demo:
        src = f"{HOME}/big"
        demo.sim.fs(HEAD).mkdir(src)
        demo.sim.fs(HEAD).put_blob(f"{src}/shard", 8_200_000_000, "ab" * 32)
        opt = "--partial " if partial else ""
        async with _connect(demo.config.node(HEAD)) as c:
            task = asyncio.ensure_future(c.run(f"rsync -a {opt}{src}/ nvidia@{WORKER_IP}:big/", check=False))
            for _ in range(5):
                await asyncio.sleep(0.005)
                demo.clock.advance(1.0)
            assert any(p.argv[:1] == ["rsync"] for p in demo.sim.proc_table(HEAD).procs.values())
            task.cancel()
        # the connection is gone: the session's rsync gets SIGHUP
        assert await wait_until(
            lambda: not any(p.argv[:1] == ["rsync"] for p in demo.sim.proc_table(HEAD).procs.values())
        ), "rsync survived the hang-up"
        kept = demo.sim.fs(WORKER).lookup(f"{HOME}/big/shard", follow=False)
        if partial:
            assert kept is not None and 0 < kept.nbytes() < 8_200_000_000
        else:
            assert kept is None
            assert [n for n in demo.sim.fs(WORKER).listdir(f"{HOME}/big") if n.startswith(".shard.")] == []


async def test_image_copy_engine_check_ray_and_tp2_serve_with_a_progressive_log():
    async with start_demo_cluster(scenario="healthy", clock=SimClock.frozen()) as demo:
        img = "vllm/vllm-openai:v0.17.0"
        rid = "d3f9a1"
        r = await ssh(demo, HEAD, f"docker save vllm/vllm-openai:v0.17.0 | ssh -o BatchMode=yes nvidia@{WORKER_IP} "
                                  "docker load", step=5)
        assert r.exit_status == 0 and r.stdout == "Loaded image: vllm/vllm-openai:v0.17.0\n"
        # Docker's containerd store: the loaded image has another ID over the same layers (moby#48401)
        fmt = "{{.Id}} {{json .RootFS.Layers}}"
        ids = {n: (await ssh(demo, n, f"docker image inspect -f '{fmt}' {img}")).stdout.split(" ", 1)
               for n in (HEAD, WORKER)}
        assert ids[HEAD][1] == ids[WORKER][1] and ids[HEAD][0] != ids[WORKER][0]
        # each node's own RoCE v2 IPv4 GID index (the tables differ), kept on the worker: vLLM >= 0.17
        # copies the head's NCCL_ variables to the Ray workers unless ray_non_carry_over_env_vars.json
        # names them
        gid = {n: demo.sim.nodes[n].gid_v2_ipv4(demo.sim.nodes[n].iface("enp1s0f1np1")) for n in (HEAD, WORKER)}
        common = (f"--network host --ipc host --gpus all --device /dev/infiniband --ulimit memlock=-1 --shm-size 16g "
                  f"-e NCCL_SOCKET_IFNAME=enp1s0f1np1 -e NCCL_IB_HCA=rocep1s0f1 -e HF_HUB_OFFLINE=1 "
                  f"-v {HF}:/root/.cache/huggingface --entrypoint ray {img} start --block")
        r = await ssh(demo, HEAD, f"docker run -d --name sparkconsole-ray-{rid} -e VLLM_HOST_IP={HEAD_IP} "
                                  f"-e NCCL_IB_GID_INDEX={gid[HEAD]} {common} "
                                  f"--head --node-ip-address={HEAD_IP} --port=6379")
        assert r.exit_status == 0, r.stderr
        # sim time moves while a command runs (``step`` per 2 ms of wall time): in fine steps here, and
        # over one kept connection, so how busy the machine is cannot skip the moment before the join
        async with _connect(demo.config.node(HEAD)) as head:
            r = await ssh(demo, WORKER, f"docker run -d --name sparkconsole-ray-{rid} -e VLLM_HOST_IP={WORKER_IP} "
                                        f"-e NCCL_IB_GID_INDEX={gid[WORKER]} {common} --address={HEAD_IP}:6379 "
                                        f"--node-ip-address={WORKER_IP}",
                          step=0.002)
            assert r.exit_status == 0, r.stderr
            started_at = demo.clock.now()
            seen = []
            for _ in range(40):
                r = await ssh(demo, HEAD, f"docker exec sparkconsole-ray-{rid} ray status", step=0.002, conn=head)
                seen.append((demo.clock.now() - started_at,
                             P.parse_ray_status(r.stdout).active_nodes if r.exit_status == 0 else None))
                if seen[-1][1] == 2:
                    break
                demo.clock.advance(0.5)
        nodes = [n for _t, n in seen]
        assert 1 in nodes and nodes[-1] == 2, seen  # the worker joins a few seconds after its start
        assert P.parse_ray_status(r.stdout).gpus_total == 2
        assert (await ssh(demo, HEAD, f"docker inspect -f '{{{{.State.Status}}}}' sparkconsole-ray-{rid}")).stdout == \
            "running\n"
        assert ":6379 " in (await ssh(demo, HEAD, "ss -ltnp")).stdout
        log = f"{HF}/sparkconsole/{rid}/serve.log"  # on the node; the container writes it through its mount
        await ssh(demo, HEAD, f"mkdir -p {HF}/sparkconsole/{rid}")
        assert (gid[HEAD], gid[WORKER]) == (3, 5)  # the worker's extra IPv6 address moves its index
        for node in (HEAD, WORKER):  # the image copy filled the page cache: vLLM checks free memory
            demo.sim.nodes[node].sudo_rules.append(DROP_RULE)  # sparkrun's rule: the one sudo a stock node allows
            r = await ssh(demo, node, "sync; echo 3 | sudo -n /usr/bin/tee /proc/sys/vm/drop_caches")
            assert r.exit_status == 0, r.stderr
        # before the serve, in the head's container: keep each worker's own GID index (vLLM >= 0.17)
        r = await ssh(demo, HEAD, f"docker exec sparkconsole-ray-{rid} sh -c 'mkdir -p /root/.config/vllm && printf "
                                  "\"%s\\n\" \"$1\" > /root/.config/vllm/ray_non_carry_over_env_vars.json' sh "
                                  "'[\"NCCL_IB_GID_INDEX\"]'")
        assert r.exit_status == 0, r.stderr
        r = await ssh(demo, HEAD, f"docker exec -d -e VLLM_ENGINE_READY_TIMEOUT_S=3600 sparkconsole-ray-{rid} sh -c "
                                  f"'exec vllm serve {QWEN} --tensor-parallel-size 2 --distributed-executor-backend "
                                  "ray --gpu-memory-utilization 0.85 --max-model-len 65536 --reasoning-parser qwen3 "
                                  f"--served-model-name qwen35 --host 0.0.0.0 --port 8000 > "
                                  f"/root/.cache/huggingface/sparkconsole/{rid}/serve.log 2>&1'")
        assert r.exit_status == 0 and r.stdout == ""
        offset, states = 1, []
        text = ""
        for _ in range(400):
            chunk = (await ssh(demo, HEAD, f"tail -c +{offset} {log}")).stdout
            offset += len(chunk.encode())
            text += chunk
            states.append(parse_vllm_log(text).state)
            if states[-1] in ("ready", "failed"):
                break
            demo.clock.advance(3)
        assert "loading" in states and states[-1] == "ready", text[-2000:]
        assert (await ssh(demo, HEAD, "curl -sf http://127.0.0.1:8000/health")).exit_status == 0
        body = json.loads((await ssh(demo, HEAD, "curl -s http://127.0.0.1:8000/v1/models")).stdout)
        assert body["data"][0]["id"] == "qwen35"
        r = await ssh(demo, HEAD, "curl -s -X POST http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: "
                                  "application/json' -d '{\"model\": \"qwen35\", \"messages\": [{\"role\": \"user\", "
                                  "\"content\": \"hi\"}]}'")
        assert json.loads(r.stdout)["usage"]["completion_tokens"] > 0
        r = await ssh(demo, HEAD, f"docker rm -f sparkconsole-ray-{rid}")
        assert r.stdout == f"sparkconsole-ray-{rid}\n"


async def test_sglang_across_two_nodes_stalls_after_custom_allreduce():
    async with start_demo_cluster(clock=SimClock.frozen()) as demo:
        img = "lmsysorg/sglang:v0.5.9-cu130"
        await ssh(demo, HEAD, f"docker save {img} | ssh {WORKER_IP} docker load", step=10)
        for rank, node in enumerate((HEAD, WORKER)):
            r = await ssh(demo, node, f"docker run -d --name sg --network host {img} python3 -m sglang.launch_server "
                                      f"--model-path {QWEN} --tp 2 --nnodes 2 --node-rank {rank} --dist-init-addr "
                                      f"{HEAD_IP}:20000 --host 0.0.0.0 --port 30000")
            assert r.exit_status == 0, r.stderr
        demo.clock.advance(600)
        for node in (HEAD, WORKER):
            out = (await ssh(demo, node, "docker logs sg")).stdout
            assert out.rstrip().endswith("CustomAllreduce is disabled because this process group spans across nodes.")
        assert (await ssh(demo, HEAD, "curl -sf http://127.0.0.1:30000/health")).exit_status == 7


async def test_mtu_and_gid_index_are_node_data():
    types = "/sys/class/infiniband/rocep1s0f1/ports/1/gid_attrs/types"
    async with start_demo_cluster(clock=SimClock.frozen()) as demo:
        demo.sim.nodes[HEAD].mtu["enp1s0f1np1"] = 9000
        r = await ssh(demo, HEAD, f"ping -c 3 -W 2 -M do -s 8972 {WORKER_IP}")
        assert r.exit_status == 1 and "3 packets transmitted, 0 received, 100% packet loss" in r.stdout
        assert (await ssh(demo, HEAD, "cat /sys/class/net/enp1s0f1np1/mtu")).stdout == "9000\n"
        # the worker's extra IPv6 address puts its IPv4 RoCE v2 GID at 5; the head's is at 3 and its
        # entry 5 is empty: the kernel answers EINVAL for its type
        assert (await ssh(demo, WORKER, f"cat {types}/5")).stdout == "RoCE v2\n"
        r = await ssh(demo, HEAD, f"cat {types}/5")
        assert r.exit_status == 1 and r.stderr == f"cat: {types}/5: Invalid argument\n"
        demo.sim.nodes[HEAD].gid_v2_index = 5  # a test can pin the index
        assert (await ssh(demo, HEAD, f"cat {types}/5")).stdout == "RoCE v2\n"
        r = await ssh(demo, WORKER, f"cat {types}/7")
        assert r.exit_status == 1


async def test_a_lost_node_stops_its_processes():
    async with start_demo_cluster(clock=SimClock.frozen()) as demo:
        async with _connect(demo.config.node(WORKER)) as c:
            await c.run("setsid nohup sleep 1000 > /dev/null 2>&1 < /dev/null &", check=False)
        table = demo.sim.proc_table(WORKER)
        assert any(p.argv[:2] == ["sleep", "1000"] for p in table.procs.values())
        demo.sim.mark_lost(WORKER)
        assert await wait_until(lambda: not table.procs), table.procs


def test_sixty_four_nodes_have_their_own_names_addresses_and_macs():
    from sparkconsole.sim import build

    c = build(nodes=64, clock=SimClock.frozen())
    names = list(c.nodes)
    assert len(set(names)) == 64 and all(re.fullmatch(r"spark-[0-9a-f]{4}", n) for n in names)
    ips = [n.fast_ip for n in c.nodes.values()]  # IPv4 link-local, a conflict re-picked as IPv4LL does
    assert len(set(ips)) == 64 and ips[0] == HEAD_IP and all(ip.startswith("169.254.") for ip in ips)
    c.layout = "two-subnet"
    ips = [n.fast_ip for n in c.nodes.values()]
    assert len(set(ips)) == 64 and ips[0] == "192.168.200.12" and ips[-1] == "192.168.200.75"
    macs = [i.mac for n in c.nodes.values() for i in n.ifaces if i.kind != "loopback"]
    assert len(set(macs)) == len(macs) and all(re.fullmatch(r"([0-9a-f]{2}:){5}[0-9a-f]{2}", m) for m in macs)
    assert [n.role for n in c.nodes.values()].count("head") == 1


async def test_the_demo_inventory_is_a_config_the_console_loads(tmp_path):
    from sparkconsole.config import load_config

    async with start_demo_cluster(nodes=3, clock=SimClock.frozen()) as demo:
        path = demo.write_inventory(tmp_path / "cluster.toml")
        cfg = load_config(path)
        assert [n.name for n in cfg.nodes] == [n.name for n in demo.config.nodes]
        assert [(n.port, n.role, n.identity, n.known_hosts) for n in cfg.nodes] == [
            (n.port, n.role, n.identity, n.known_hosts) for n in demo.config.nodes]
        async with _connect(cfg.node(WORKER)) as c:  # the file is enough to reach a node
            assert (await c.run("hostname", check=False)).stdout == WORKER + "\n"


@pytest.mark.parametrize("scenario", ["story", "prefill-squeeze", "bad-kernel", "new-keys"])
def test_every_computed_file_lies_where_the_vfs_looks_for_them(scenario: str) -> None:
    """The VFS renders the computed files only for a path under its VIRTUAL_ROOTS (a walk through a
    home folder must not render the node): so every computed file must lie there, or it would vanish."""
    from sparkconsole.sim import build
    from sparkconsole.sim.vfs import VIRTUAL_ROOTS

    c = build(scenario, clock=SimClock.frozen())
    for node in c.nodes:
        files = c.virtual_files(c, node)
        assert files
        stray = [p for p in files if not any(p.startswith(r + "/") for r in VIRTUAL_ROOTS)]
        assert not stray, stray
        fs = c.fs(node) if hasattr(c, "fs") else None
        if fs is not None:
            assert fs.read_text("/proc/meminfo").startswith("MemTotal:")
            assert "meminfo" in fs.listdir("/proc") and fs.lookup("/home/nobody/x") is None
