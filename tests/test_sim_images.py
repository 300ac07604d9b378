"""The simulator's images and containers are as strict as real Docker and vLLM.

Every check goes through the sim's shell (the commands the console or a person types), on a manual
clock: the image's Python runs only real programs (a typo is CPython's SyntaxError, a missing module
its ModuleNotFoundError), images carry their CUDA build, commands, entrypoint, labels and layers,
``docker run`` refuses an executable the image lacks, NGC images start through NVIDIA's entrypoint,
``hf download`` runs in a container onto the bind-mounted cache, containers have their own files,
the image store decides whether ``docker save | docker load`` keeps the ID, vLLM >= 0.17 copies the
head's environment onto the Ray workers (a wrong GID index then fails NCCL), and an offline node
without ``HF_HUB_OFFLINE=1`` waits for the Hub.
"""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from sparkconsole.deploy.engines import engine_program, parse_engine_output
from sparkconsole.logs.vllm import parse_vllm_log
from sparkconsole.sim import SCENARIOS, Shell, SimClock, build
from sparkconsole.sim.model import (
    IMAGE_NEW,
    IMAGE_NEW_CU130,
    IMAGE_NGC,
    IMAGE_OLD,
    IMAGE_SGLANG,
    IMAGES,
)
from sparkconsole.sim.serve_plan import ipv4_v2_gids
from tests.conftest import real_fixture
from tests.test_sim_model import settle
from tests.test_sim_model import sh as sim_sh

HEAD, WORKER = "spark-1a32", "spark-5be3"
QWEN = "Qwen/Qwen3.5-122B-A10B-FP8"
EMBED = "Qwen/Qwen3-Embedding-0.6B"
V17, V14, NGC, CU130, SGL = IMAGE_NEW.ref, IMAGE_OLD.ref, IMAGE_NGC.ref, IMAGE_NEW_CU130.ref, IMAGE_SGLANG.ref
CTR_HF = "/root/.cache/huggingface"
JSON_FILE = "/root/.config/vllm/ray_non_carry_over_env_vars.json"


def cluster(scenario: str = "story"):
    return build(scenario, clock=SimClock.frozen())


async def sh(c, node: str, cmd: str, step: float = 5.0, limit: float = 20_000.0) -> tuple[str, str, int]:
    """test_sim_model's ``sh`` with room for a whole model's download and load."""
    return await sim_sh(c, node, cmd, step, limit)


def host_hf(c, node: str) -> str:
    """The login user's HF cache on the node (what the console mounts at /root/.cache/huggingface)."""
    return c.login(node).hf_home


def py(image: str, program: str, gpus: bool = False) -> str:
    quoted = "'" + program.replace("'", "'\"'\"'") + "'"
    return f"docker run --rm {'--gpus all ' if gpus else ''}--entrypoint python3 {image} -c {quoted}"


# ---- 1. the image's Python runs only what it understands ---------------------------------------------


@pytest.mark.parametrize(("image", "vllm", "ray", "cuda", "sglang"), [
    (V14, "0.14.1", "2.53.0", "12.9", None),
    (V17, "0.17.0", "2.54.0", "12.9", None),
    (NGC, "0.20.1", None, "13.0", None),
    (SGL, None, None, "13.0", "0.5.9"),
])
async def test_the_console_engine_program_is_evaluated_against_the_image(image, vllm, ray, cuda, sglang):
    c = cluster("ngc-image" if image == NGC else "story")
    before = len(c.containers)
    archs = ("Qwen3_5MoeForConditionalGeneration", "Glm4MoeLiteForCausalLM", "NoSuchForCausalLM")
    out, err, rc = await sh(c, HEAD, py(image, engine_program(archs)))
    assert rc == 0 and err == "", err
    f = parse_engine_output(image, out, rc)
    assert f.versions["vllm"] == vllm and f.versions["ray"] == ray and f.versions["sglang"] == sglang
    assert f.cuda == cuda
    assert f.device is None and f.cuda_archs == ()  # no --gpus: torch sees no GPU, get_arch_list() is []
    assert f.has("ray") is (ray is not None) and f.has("hf") is True and f.has("vllm") is (vllm is not None)
    assert f.knows("NoSuchForCausalLM") is False and f.knows("Glm4MoeLiteForCausalLM") is True
    assert f.knows("Qwen3_5MoeForConditionalGeneration") is (image != V14)
    out_gpu, _e, rc = await sh(c, HEAD, py(image, engine_program(archs), gpus=True))
    g = parse_engine_output(image, out_gpu, rc)
    assert g.device == "12.1" and "sm_120" in g.cuda_archs and g.gpu_verdict() is None
    assert len(c.containers) == before  # --rm: nothing left behind


async def test_real_world_programs_typos_and_missing_modules():
    c = cluster()
    assert await sh(c, HEAD, "docker run --rm --entrypoint python3 vllm/vllm-openai:v0.17.0 -c "
                             "\"import vllm; print(vllm.__version__)\"") == ("0.17.0\n", "", 0)
    out, err, rc = await sh(c, HEAD, py(V17, "import vllm; print(vllm.__version__"))
    assert (out, rc) == ("", 1)
    assert err == ('  File "<string>", line 1\n    import vllm; print(vllm.__version__\n'
                   "                      ^\nSyntaxError: '(' was never closed\n")
    out, err, rc = await sh(c, HEAD, py(V17, "import vllm\nimport sglang"))
    assert rc == 1 and err == ('Traceback (most recent call last):\n  File "<string>", line 2, in <module>\n'
                               "ModuleNotFoundError: No module named 'sglang'\n")
    out, err, rc = await sh(c, HEAD, py(V17, "try:\n    import sglang\nexcept Exception as e:\n    print('no', e)"))
    assert (out, rc) == ("no No module named 'sglang'\n", 0)
    out, err, rc = await sh(c, HEAD, py(V17, "prnt('x')"))
    assert rc == 1 and err.endswith("NameError: name 'prnt' is not defined. Did you mean: 'print'?\n")
    out, err, rc = await sh(c, HEAD, py(V17, "import torch; print(torch.cuda.is_availble())"))
    assert rc == 1 and "AttributeError: module 'torch.cuda' has no attribute 'is_availble'. Did you mean: " \
                      "'is_available'?" in err
    out, err, rc = await sh(c, HEAD, py(V17, "import torch\nprint(torch.version.cuda, torch.__version__)\n"
                                        "print('%d.%d' % torch.cuda.get_device_capability())"))
    assert out == "12.9 2.10.0+cu129\n" and rc == 1 and "RuntimeError: Found no NVIDIA driver" in err
    out, err, rc = await sh(c, HEAD, py(CU130, "import torch, shutil\nprint(torch.version.cuda, shutil.which('ray'),"
                                        " shutil.which('nope'))\nfor a in ('x', 'y'):\n    if a in {'y'}:\n"
                                        "        print(' '.join([a, a.upper()]))"))
    assert (out, rc) == ("13.0 /usr/local/bin/ray None\ny Y\n", 0)
    assert "Unable to find image 'vllm/vllm-openai:v0.17.0-cu130' locally" in err  # pulled first (head: internet)
    out, err, rc = await sh(c, HEAD, py(V17, "from vllm.model_executor.models import ModelRegistry\n"
                                        "print('Qwen3_5MoeForConditionalGeneration' in set(ModelRegistry."
                                        "get_supported_archs()))"))
    assert (out, rc) == ("True\n", 0)
    out, err, rc = await sh(c, HEAD, py(V17, "import subprocess; subprocess.run(['ls'])"))
    assert rc == 1 and err.startswith("sparksim: python3 -c:")  # not modelled: no made-up answer


async def test_gpus_decide_what_torch_sees_in_run_and_exec():
    c = cluster()
    prog = "import torch; print(torch.cuda.is_available(), torch.cuda.device_count(), torch.cuda.get_arch_list())"
    assert (await sh(c, HEAD, py(V17, prog)))[0] == "False 0 []\n"
    assert (await sh(c, HEAD, py(V17, prog, gpus=True)))[0] == "True 1 ['sm_80', 'sm_90', 'sm_100', 'sm_120']\n"
    await sh(c, HEAD, f"docker run -d --name g --gpus all --entrypoint sleep {V17} infinity")
    out, _e, rc = await sh(c, HEAD, f"docker exec g python3 -c \"{prog}\"")
    assert out.startswith("True 1 ") and rc == 0
    assert (await sh(c, HEAD, "docker exec g nvidia-smi -L"))[2] == 0
    await sh(c, HEAD, f"docker run -d --name n --entrypoint sleep {V17} infinity")
    out, err, rc = await sh(c, HEAD, "docker exec n nvidia-smi -L")
    assert rc == 127 and '"nvidia-smi": executable file not found in $PATH' in err


# ---- 2. the images carry what a real image carries --------------------------------------------------


def test_the_catalogue_facts():
    assert IMAGE_NEW.cuda == IMAGE_OLD.cuda == "12.9" and "sm_120" in IMAGE_NEW.cuda_archs
    assert IMAGE_NEW_CU130.ref == "vllm/vllm-openai:v0.17.0-cu130" and IMAGE_NEW_CU130.cuda == "13.0"
    assert IMAGE_NEW_CU130.vllm_version == "0.17.0" and IMAGE_NEW_CU130.ray and IMAGE_NEW_CU130.which("ray")
    assert IMAGE_NEW_CU130.entrypoint == ("vllm", "serve")
    assert IMAGE_NGC.vllm_version == "0.20.1" and IMAGE_NGC.cuda == "13.0" and IMAGE_NGC.ray == ""
    assert IMAGE_NGC.which("ray") is None and IMAGE_NGC.which("hf") == "/usr/local/bin/hf"
    assert IMAGE_NGC.entrypoint == ("/opt/nvidia/nvidia_entrypoint.sh",)
    assert dict(IMAGE_NGC.labels)["com.nvidia.vllm.version"] == "0.20.1"
    for img in IMAGES.values():
        assert img.which("hf") and len(set(img.layers)) == len(img.layers) == img.layer_count
        assert all(re.fullmatch(r"sha256:[0-9a-f]{64}", lay) for lay in img.layers)
        assert img.layers == IMAGES[img.ref].layers  # stable
    for scenario in SCENARIOS:  # the cu130 tag is in the catalogue, on no node
        c = build(scenario, clock=SimClock.frozen())
        assert all(CU130 not in n.images for n in c.nodes.values())


def test_the_ngc_image_scenario_replaces_the_heads_new_image():
    c = cluster("ngc-image")
    assert NGC in c.nodes[HEAD].images and V17 not in c.nodes[HEAD].images and V14 in c.nodes[HEAD].images
    assert list(c.nodes[WORKER].images) == [V14]


async def test_image_inspect_templates():
    c = cluster("ngc-image")
    out, _e, rc = await sh(c, HEAD, f"docker image inspect -f '{{{{json .Config.Entrypoint}}}} {{{{json .Config.Cmd}}}}"
                                    f" {{{{index .Config.Labels \"com.nvidia.vllm.version\"}}}}' {NGC}")
    assert (out, rc) == ('["/opt/nvidia/nvidia_entrypoint.sh"] null 0.20.1\n', 0)
    out, _e, _rc = await sh(c, HEAD, f"docker image inspect -f '{{{{json .Config.Entrypoint}}}}|"
                                     f"{{{{index .Config.Labels \"com.nvidia.vllm.version\"}}}}|' {V14}")
    assert out == '["vllm","serve"]||\n'
    out, _e, _rc = await sh(c, HEAD, f"docker image inspect -f '{{{{json .Config.Labels}}}}' {NGC}")
    assert json.loads(out)["com.nvidia.vllm.version"] == "0.20.1"
    out, _e, _rc = await sh(c, HEAD, f"docker image inspect -f '{{{{.Id}}}} {{{{json .RootFS.Layers}}}}' {V14}")
    iid, layers = out.split(" ", 1)
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", iid) and json.loads(layers) == list(IMAGE_OLD.layers)
    doc = json.loads((await sh(c, HEAD, f"docker image inspect {NGC}"))[0])
    assert doc[0]["Config"]["Entrypoint"] == ["/opt/nvidia/nvidia_entrypoint.sh"] and doc[0]["Config"]["Cmd"] is None
    assert doc[0]["RootFS"]["Layers"] == list(IMAGE_NGC.layers)


# ---- 3. docker run strictness -------------------------------------------------------------------------


async def test_an_executable_the_image_lacks_is_docker_s_oci_error():
    fragments = [ln for ln in real_fixture("dgx-os/ray-not-found.txt").splitlines() if ln]
    c = cluster("ngc-image")
    out, err, rc = await sh(c, HEAD, f"docker run -d --name r --network host --entrypoint ray {NGC} start --block --head")
    assert rc == 127 and out == "" and fragments[1] in err
    assert err.startswith("docker: Error response from daemon:") and "OCI runtime create failed" in err
    out, err, rc = await sh(c, HEAD, f"docker run --rm {NGC} sh -c 'ray start --head'")
    assert rc == 127 and err.rstrip().endswith(fragments[0]) and "sh: 1: ray: not found" in err
    await sh(c, HEAD, f"docker run -d --name k --entrypoint sleep {NGC} infinity")
    out, err, rc = await sh(c, HEAD, "docker exec k ray status")
    assert rc == 127 and err == ('OCI runtime exec failed: exec failed: unable to start container process: exec: '
                                 '"ray": executable file not found in $PATH: unknown\n')
    out, err, rc = await sh(c, HEAD, "docker exec k sh -c 'command -v ray || echo none; command -v hf vllm'")
    assert out == "none\n/usr/local/bin/hf\n/usr/local/bin/vllm\n"
    out, err, rc = await sh(c, HEAD, f"docker run --rm --entrypoint ray {V14} status")  # the upstream image has it
    assert '"ray": executable file not found' not in err


async def test_ngc_images_start_through_nvidia_s_entrypoint():
    c = cluster("ngc-image")
    out, err, rc = await sh(c, HEAD, f"docker run --rm --gpus all {NGC} {QWEN} --tensor-parallel-size 2")
    assert rc == 127 and "== vLLM ==" in out and "NVIDIA Release 26.05" in out
    assert re.fullmatch(rf"/opt/nvidia/nvidia_entrypoint\.sh: line \d+: exec: {re.escape(QWEN)}: not found\n", err)
    assert "NVIDIA Driver was not detected" not in out  # --gpus: the toolkit gave it the driver
    hf = host_hf(c, HEAD)
    out, err, rc = await sh(c, HEAD, f"docker run -d --name ngc --network host --gpus all -v {hf}:{CTR_HF} {NGC} "
                                     f"vllm serve {EMBED} --port 8011 --gpu-memory-utilization 0.05")
    assert rc == 0, err
    c.clock.advance(30)
    log = (await sh(c, HEAD, "docker logs ngc 2>&1"))[0]
    assert "== vLLM ==" in log and "version 0.20.1" in log
    ps = (await sh(c, HEAD, "docker ps --format '{{.Names}} {{.Command}}'"))[0]
    assert 'ngc "/opt/nvidia/nvidia_e' in ps  # its command is NVIDIA's entrypoint


async def test_hf_download_in_a_container_fills_the_bind_mounted_host_cache():
    c = cluster()
    hf = host_hf(c, HEAD)
    assert (await sh(c, HEAD, f"hf download {QWEN}"))[2] == 127  # stock DGX OS: no hf on the host
    cmd = (f"docker run --rm --gpus all --user 1000:1000 -e HF_HOME={CTR_HF} -v {hf}:{CTR_HF} --entrypoint hf "
           f"{V17} download {QWEN}")
    out, err, rc = await sh(c, HEAD, cmd, step=20.0)
    assert rc == 0, err
    assert re.fullmatch(rf"{CTR_HF}/hub/models--Qwen--Qwen3\.5-122B-A10B-FP8/snapshots/[0-9a-f]{{40}}\n", out)
    assert "Fetching 52 files: 100%" in err
    assert c.has_model(HEAD, QWEN)  # in the login user's cache on the node
    assert (await sh(c, HEAD, f"ls {hf}/hub/models--Qwen--Qwen3.5-122B-A10B-FP8/snapshots/*/config.json"))[2] == 0
    assert not [ct for ct in c.containers_on(HEAD) if ct.image == V17]  # --rm
    # the worker has no internet: huggingface_hub's name-resolution error, and the container is gone too
    out, err, rc = await sh(c, WORKER, f"docker run --rm -v {host_hf(c, WORKER)}:{CTR_HF} --entrypoint hf {V14} "
                                       f"download {QWEN}")
    assert rc == 1 and "Failed to resolve 'huggingface.co'" in err
    assert not [ct for ct in c.containers_on(WORKER) if ct.image == V14 and ct.name != "embeddings"]


async def test_the_container_reads_the_token_of_the_mounted_cache_and_stops_with_docker_stop():
    c = cluster()
    hf = host_hf(c, HEAD)
    out, err, rc = await sh(c, HEAD, f"docker run --rm -v {hf}:{CTR_HF} --entrypoint hf {V17} auth whoami")
    assert rc == 0 and out.startswith("\x1b[1muser: \x1b[0m sparkops\n"), err  # the node's token, mounted
    out, _e, rc = await sh(c, HEAD, f"docker run --rm --entrypoint hf {V17} auth whoami")
    assert (out, rc) == ("Not logged in\n", 0)  # no mount: the container has no token of its own
    _o, err, rc = await sh(c, HEAD, f"docker run -d --name dl -v {hf}:{CTR_HF} --entrypoint hf {V17} download {QWEN}")
    assert rc == 0, err
    for _ in range(30):  # a minute of download, in the process's own steps
        c.clock.advance(2)
        for _ in range(20):
            await asyncio.sleep(0)
    assert 0 < c.model_bytes(HEAD, QWEN) < 20 * 10**9
    assert any(p.argv[:2] == ["hf", "download"] for p in c.proc_table(HEAD).procs.values())
    await sh(c, HEAD, "docker stop dl")
    assert not any(p.argv[:2] == ["hf", "download"] for p in c.proc_table(HEAD).procs.values())
    assert (await sh(c, HEAD, "docker inspect -f '{{.State.Status}}' dl"))[0] == "exited\n"


async def test_exec_runs_with_the_containers_environment_not_the_callers():
    c = cluster()
    await sh(c, HEAD, f"docker run -d --name e -e NCCL_IB_GID_INDEX=3 --entrypoint sleep {V17} infinity")
    out, _e, rc = await sh(c, HEAD, "FOO=host docker exec -e VLLM_X=1 e sh -c 'echo $HOME $NCCL_IB_GID_INDEX "
                                    "$VLLM_X ${FOO:-unset} $NVIDIA_VISIBLE_DEVICES'")
    assert (out, rc) == ("/root 3 1 unset all\n", 0)


async def test_the_consoles_download_form_and_signals_passed_on_by_the_client():
    c = cluster()
    hf = host_hf(c, HEAD)
    # remote.hf_download_in_image: the cache at /hf, as the login user
    cmd = f"docker run --rm --name dl --user 1000:1000 -v {hf}:/hf -e HF_HOME=/hf --entrypoint hf {V17} download {EMBED}"
    out, err, rc = await sh(c, HEAD, cmd.replace(EMBED, QWEN), step=20.0)
    assert rc == 0 and out.startswith("/hf/hub/models--Qwen--Qwen3.5-122B-A10B-FP8/snapshots/"), err
    assert c.has_model(HEAD, QWEN) and c.container(HEAD, "dl") is None
    table = c.proc_table(HEAD)

    def procs(*argv: str) -> list:
        return [p for p in table.procs.values() if p.argv[:len(argv)] == list(argv)]

    for sig, survives in ((15, False), (9, True)):
        c2 = cluster()
        table = c2.proc_table(HEAD)
        task = asyncio.ensure_future(Shell(c2, HEAD).capture(cmd.replace(EMBED, QWEN).replace(hf, host_hf(c2, HEAD))))
        for _ in range(10):
            c2.clock.advance(2)
            await settle(task)
        (client,) = procs("docker", "run")
        assert procs("hf", "download") and c2.container(HEAD, "dl") is not None
        table.signal(client.pid, sig)  # --sig-proxy: the client passes TERM on; a KILL it cannot
        for _ in range(3):
            c2.clock.advance(2)
            await settle(task)
        assert task.done()
        assert bool(procs("hf", "download")) is survives
        assert (c2.container(HEAD, "dl") is not None) is survives
        assert 0 < c2.model_bytes(HEAD, QWEN) < 20 * 10**9


async def test_rm_and_attached_runs_in_general():
    c = cluster()
    out, err, rc = await sh(c, HEAD, f"docker run --rm --entrypoint sh {V17} -c 'echo hi; echo oops >&2; exit 3'")
    assert (out, err, rc) == ("hi\n", "oops\n", 3)
    assert not [ct for ct in c.containers_on(HEAD) if ct.image == V17]
    out, err, rc = await sh(c, HEAD, f"docker run --name keep --entrypoint sh {V17} -c 'echo kept; exit 4'")
    assert (out, rc) == ("kept\n", 4)
    assert (await sh(c, HEAD, "docker inspect -f '{{.State.Status}} {{.State.ExitCode}}' keep"))[0] == "exited 4\n"
    assert (await sh(c, HEAD, "docker logs keep"))[0] == "kept\n"
    out, _e, rc = await sh(c, HEAD, f"docker run -d --rm --name bg --entrypoint sh {V17} -c 'sleep 5; echo done'")
    assert rc == 0 and c.container(HEAD, "bg") is not None
    c.clock.advance(10)
    await sh(c, HEAD, "true")
    assert c.container(HEAD, "bg") is None  # detached --rm: removed when its process exits


# ---- 4. the image store -------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", ["story", "overlay2"])
async def test_docker_info_tells_the_image_store(scenario):
    c = cluster(scenario)
    real = real_fixture("dgx-os/stock-spark-docker-info.txt")
    driver = (await sh(c, HEAD, "docker info --format '{{.Driver}}'"))[0]
    both = (await sh(c, HEAD, "docker info --format '{{.Driver}} {{json .DriverStatus}}'"))[0]
    text = (await sh(c, HEAD, "docker info"))[0]
    if scenario == "overlay2":
        block = real[real.index(" Storage Driver:"):real.index(" Logging Driver:")]
        assert block in text  # the real capture's Storage Driver block, verbatim
        status = [ln.strip().split(": ", 1) for ln in block.splitlines()[1:]]
        assert driver == "overlay2\n" and both == f"overlay2 {json.dumps(status, separators=(',', ':'))}\n"
        assert both == ('overlay2 [["Backing Filesystem","extfs"],["Supports d_type","true"],["Using metacopy",'
                        '"false"],["Native Overlay Diff","true"],["userxattr","false"]]\n')
    else:
        assert driver == "overlayfs\n" and both == 'overlayfs [["driver-type","io.containerd.snapshotter.v1"]]\n'
        assert " Storage Driver: overlayfs\n  driver-type: io.containerd.snapshotter.v1\n" in text
    for line in (" Server Version: 29.2.1", " Runtimes: io.containerd.runc.v2 runc", " Default Runtime: runc",
                 " CDI spec directories:"):
        assert line in real and line in text


@pytest.mark.parametrize(("scenario", "same_id"), [("story", False), ("overlay2", True)])
async def test_save_load_keeps_the_layers_and_the_id_only_under_overlay2(scenario, same_id):
    c = cluster(scenario)
    ip = c.nodes[WORKER].fast_ip
    out, err, rc = await sh(c, HEAD, f"docker save {V17} | ssh -o BatchMode=yes {ip} docker load", step=10)
    assert (out, rc) == (f"Loaded image: {V17}\n", 0), err
    fmt = "docker image inspect -f '{{.Id}} {{json .RootFS.Layers}}' " + V17
    (h_id, h_layers), (w_id, w_layers) = [(await sh(c, n, fmt))[0].split(" ", 1) for n in (HEAD, WORKER)]
    assert h_layers == w_layers
    assert (h_id == w_id) is same_id
    listed = (await sh(c, WORKER, "docker images --format '{{.Repository}}:{{.Tag}} {{.ID}}'"))[0]
    assert f"{V17} {w_id[7:19]}" in listed


# ---- 5. containers have their own files ----------------------------------------------------------------


async def test_exec_writes_into_the_container_not_the_node():
    c = cluster()
    hf = host_hf(c, HEAD)
    await sh(c, HEAD, f"docker run -d --name ct --network host -v {hf}:{CTR_HF} --entrypoint sleep {V17} infinity")
    write = ("docker exec ct sh -c 'mkdir -p /root/.config/vllm && printf \"%s\\n\" \"$1\" > "
             f"{JSON_FILE}' sh '[\"NCCL_IB_GID_INDEX\"]'")
    assert await sh(c, HEAD, write) == ("", "", 0)
    assert await sh(c, HEAD, f"docker exec ct cat {JSON_FILE}") == ('["NCCL_IB_GID_INDEX"]\n', "", 0)
    assert c.fs(HEAD).lookup(JSON_FILE) is None and (await sh(c, HEAD, f"cat {JSON_FILE}"))[2] == 1
    # a bind-mounted path is the node's file
    assert (await sh(c, HEAD, f"docker exec ct sh -c 'echo x > {CTR_HF}/note.txt'"))[2] == 0
    assert c.fs(HEAD).read_text(f"{hf}/note.txt") == "x\n"
    assert "note.txt" in (await sh(c, HEAD, f"docker exec ct ls {CTR_HF}"))[0]
    # gone with the container
    await sh(c, HEAD, "docker rm -f ct")
    await sh(c, HEAD, f"docker run -d --name ct --entrypoint sleep {V17} infinity")
    _out, err, rc = await sh(c, HEAD, f"docker exec ct cat {JSON_FILE}")
    assert rc == 1 and "No such file or directory" in err


# ---- 6. vLLM >= 0.17 over Ray: the head's environment wins ----------------------------------------------


def _gid(c, node: str) -> int:
    """The RoCE v2 IPv4 GID index of the node's cabled twin, from its own table."""
    (idx,) = ipv4_v2_gids(c, c.nodes[node], "rocep1s0f1")
    return idx


async def _ray_serve(c, image: str, *, exclude: bool = False, hca: str = "rocep1s0f1", model: str = QWEN,
                     head_env: str = "", worker_env: str = "", limit: int = 400) -> str:
    """Ray head and worker containers, each with its own node's GID index, then the serve in the head's
    container; returns the serve's log once it is ready or failed."""
    hf = {n: host_hf(c, n) for n in (HEAD, WORKER)}
    ip = {n: c.nodes[n].fast_ip for n in (HEAD, WORKER)}
    for n, extra, tail in ((HEAD, head_env, f"--head --node-ip-address={ip[HEAD]} --port=6379"),
                           (WORKER, worker_env, f"--address={ip[HEAD]}:6379 --node-ip-address={ip[WORKER]}")):
        _out, err, rc = await sh(c, n, f"docker run -d --name ray --network host --ipc host --gpus all --device "
                                      f"/dev/infiniband -e VLLM_HOST_IP={ip[n]} -e NCCL_IB_HCA={hca} "
                                      f"-e NCCL_IB_GID_INDEX={_gid(c, n)} -e NCCL_SOCKET_IFNAME=enp1s0f1np1 {extra} "
                                      f"-v {hf[n]}:{CTR_HF} --entrypoint ray {image} start --block {tail}")
        assert rc == 0, err
    c.clock.advance(10)
    if exclude:
        await sh(c, HEAD, "docker exec ray sh -c 'mkdir -p /root/.config/vllm && printf \"%s\\n\" \"$1\" > "
                          f"{JSON_FILE}' sh '[\"NCCL_IB_GID_INDEX\"]'")
    _out, err, rc = await sh(c, HEAD, f"docker exec -d ray sh -c 'exec vllm serve {model} --tensor-parallel-size 2 "
                                     "--distributed-executor-backend ray --gpu-memory-utilization 0.85 "
                                     f"--max-model-len 65536 > {CTR_HF}/serve.log 2>&1'")
    assert rc == 0, err
    text = ""
    for _ in range(limit):
        c.clock.advance(5)
        for _ in range(20):  # let the serve's process write what is due
            await asyncio.sleep(0)
        text = c.fs(HEAD).read_text(f"{hf[HEAD]}/serve.log")
        if parse_vllm_log(text).state in ("ready", "failed"):
            break
    return text


async def test_the_heads_gid_index_copied_to_the_worker_fails_nccl():
    c = cluster("healthy")
    assert _gid(c, HEAD) != _gid(c, WORKER)  # the nodes' tables differ (3 and 5)
    text = await _ray_serve(c, V17)
    r = parse_vllm_log(text)
    assert (r.state, r.failure_kind) == ("failed", "nccl")
    warn, err = [ln for ln in real_fixture("dgx-os/nccl-wrong-gid-index.txt").splitlines() if ln]
    assert warn in text and err in text
    assert re.search(r"\[ray_env\.py:\d+\] Copying the following environment variables to workers: \[.*"
                     r"'NCCL_IB_GID_INDEX'", text)
    assert "'VLLM_HOST_IP'" not in text.split("Copying the following")[1].splitlines()[0]  # worker-specific
    assert f"To exclude env vars from copying, add them to {JSON_FILE}" in text
    assert "Loading safetensors checkpoint shards" not in text  # it dies at distributed init


async def test_excluding_the_gid_index_keeps_each_nodes_own_and_serves():
    c = cluster("healthy")
    text = await _ray_serve(c, V17, exclude=True)
    assert parse_vllm_log(text).state == "ready", text[-2000:]
    assert "RAY_NON_CARRY_OVER_ENV_VARS from config: {'NCCL_IB_GID_INDEX'}" in text
    assert "ibv_modify_qp" not in text


async def test_vllm_before_0_17_copies_nothing():
    c = cluster("healthy")
    text = await _ray_serve(c, V14, model=EMBED)  # each node's own GID index stays: it serves
    assert "ray_env.py" not in text and "ibv_modify_qp" not in text
    assert parse_vllm_log(text).state == "ready", text[-1500:]


async def test_an_hca_without_an_ipv4_gid_fails_nccl():
    c = cluster("healthy")
    twin = "roceP2p1s0f1"
    if ipv4_v2_gids(c, c.nodes[HEAD], twin):
        pytest.skip("this layout gives the enP2 twin an address")
    text = await _ray_serve(c, V17, exclude=True, hca=f"rocep1s0f1,{twin}")
    assert parse_vllm_log(text).failure_kind == "nccl"
    assert f"on dev {twin}:1, curr state INIT, next state RTR" in text


# ---- 7. an offline node waits for the Hub without HF_HUB_OFFLINE=1 ---------------------------------------


async def test_an_offline_worker_waits_for_the_hub_unless_hf_hub_offline():
    took = {}
    for offline in (False, True):
        c = cluster("healthy")
        env = "-e HF_HUB_OFFLINE=1" if offline else ""
        text = await _ray_serve(c, V17, exclude=True, head_env=env)  # >= 0.17: HF_ is carried to the worker
        assert parse_vllm_log(text).state == "ready"
        run = next(ct.engine for ct in c.containers_on(HEAD) if ct.name == "ray#exec")
        took[offline] = run.ready_at - run.started
        retries = [ln for ln in text.splitlines() if "Retrying in" in ln]
        if offline:
            assert retries == [] and "huggingface.co" not in text
        else:
            assert [r.split("[Retry ")[1] for r in retries] == ["1/5].", "2/5].", "3/5].", "4/5].", "5/5]."]
            assert all(f"ip={c.nodes[WORKER].fast_ip}" in r for r in retries)  # the worker's rank, not the head
            assert ("Failed to resolve 'huggingface.co'" in text and "thrown while requesting HEAD https://"
                    f"huggingface.co/{QWEN}/resolve/main/model.safetensors.index.json" in text)
    assert took[False] - took[True] > 45  # ~10 s per retried request: resolver timeout plus back-off
