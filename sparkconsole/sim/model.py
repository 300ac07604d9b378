"""The state of a simulated DGX Spark cluster, as a function of simulated time.

Nothing here renders text (that is :mod:`sparkconsole.sim.formats`) or parses commands (that is
:mod:`sparkconsole.sim.shell`). The model keeps *events with start times* and derives every
number from them at the moment it is asked, so the same sim time always gives the same answer:

* memory: a node's used memory is the OS baseline plus the memory curves of the processes that
  hold it (:class:`Holder`: a vLLM engine's weights load along a time ramp, then its KV cache is
  allocated); the page cache grows with file reads and writes (:class:`CacheRamp`: downloads,
  copies, weight loading) and is reset by ``drop_caches``; it is always capped by the room left,
  so ``MemAvailable`` is never above ``MemTotal`` and never negative;
* GPU utilisation, temperature, power and clocks follow the engines' activity plus a seeded,
  deterministic pseudo-noise (:func:`noise`), so two snapshots at the same sim time are equal;
* containers (:class:`Container`) carry their vLLM engine run (:class:`EngineRun`, planned once
  when it starts: its log lines with their times, its memory curve, when it is ready or fails);
* transfers (:class:`Transfer`: ``hf download``, ``rsync``, ``docker save | docker load``) move
  bytes at a modelled bandwidth; the weights a node holds are what the finished transfers left;
* Ray (:class:`RayCluster`): which nodes have joined which head.

Hardware facts (see ``tests/fixtures/real/gb10``): NVIDIA GB10, driver 580.126.09, CUDA 13.0,
MemTotal 125,511,932 kB (119.70 GiB; vLLM sees 121.69 GiB through CUDA), 20 Arm cores (10
Cortex-X925 + 10 Cortex-A725), 3.7T NVMe, ConnectX-7 as four RoCE "twins"; the cable is in
port 1 so ``rocep1s0f1``/``enp1s0f1np1`` and ``roceP2p1s0f1``/``enP2p1s0f1np1`` are Up at
200 Gb/s; ``enP7s7`` is the 10G management LAN. Their addresses follow ``SimCluster.layout``
(:func:`make_node`): NVIDIA's earlier netplan (one IPv4 link-local 169.254.x.y/16 on
``enp1s0f1np1``, fe80 only on ``enP2p1s0f1np1``; tests/fixtures/real/dgx-os/stock-spark-id-ip.txt)
or two subnets (192.168.200.x/24 and 192.168.201.x/24); the RoCE GID tables follow the addresses
(:meth:`SimNode.gid_table`).
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import math
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from sparkconsole.sim.clock import SimClock, Waited
from sparkconsole.sim.procs import ProcTable
from sparkconsole.sim.vfs import VFS, FsError

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
GB = 1000**3
MB = 1000**2

# ---- hardware constants ----------------------------------------------------------------------

MEM_TOTAL_KB = 125_511_932  # 119.70 GiB (real Sparks: 125,411,392-125,489,732 kB)
MEM_TOTAL = MEM_TOTAL_KB * KIB
CUDA_TOTAL_GIB = 121.69  # what vLLM reports for a GB10 (cudaMemGetInfo total)
SWAP_TOTAL = 16 * GIB
OS_BASE = int(4.35 * GIB)  # kernel, slab, services, desktop: "used" on an idle Spark
PAGE_CACHE_BASE = int(1.95 * GIB)
PAGE_CACHE_FLOOR = int(0.45 * GIB)  # what survives drop_caches (mapped/dirty pages)
MIN_FREE = int(0.20 * GIB)
DISK_TOTAL = 3_966_420_828_160  # df -h: 3.7T
DISK_OS_USED = 212 * GB
CPUS = 20
DRIVER = "580.126.09"
CUDA = "13.0"
KERNEL = "6.14.0-1015-nvidia"
DOCKER_VERSION = "29.2.1"
GPU_NAME = "NVIDIA GB10"
GPU_BUS_ID = "0000000F:01:00.0"
CLOCK_MAX_SM = 3003

# bandwidths, bytes per second of sim time
INTERNET_BPS = 112 * MB  # hf download / docker pull on the head (~900 Mbit/s)
FAST_LINK_RSYNC_BPS = 820 * MB  # rsync over ssh on the ConnectX-7 link (ssh-bound, not 200G)
LAN_RSYNC_BPS = 270 * MB  # the same over the 10G management LAN (what you get on the wrong IP)
PEER_SSH_S = 0.15  # one ssh connection from node to node (key exchange and auth over the fast link)
IMAGE_COPY_BPS = 380 * MB  # docker save | ssh docker load (load unpacks: slower than rsync)
WEIGHT_READ_S_PER_SHARD = 3.27  # safetensors shard read on the NVMe (the real Spark log rate)


def hf_hub(home: str) -> str:
    """The HF hub cache under a home directory (``$HOME/.cache/huggingface/hub``, huggingface_hub's
    default): the login user's on a stock node, ``/root``'s in a container or on the permissive twin."""
    return f"{home.rstrip('/')}/.cache/huggingface/hub"


def model_dir(repo: str, home: str) -> str:
    """``repo``'s folder in the HF cache of ``home`` (``SimCluster.model_dir`` gives a node's)."""
    owner, name = repo.split("/", 1)
    return f"{hf_hub(home)}/models--{owner}--{name}"


@dataclass(frozen=True)
class Account:
    """A user as ``id`` and ``/etc/passwd`` say it: who a node's SSH sessions run as
    (:meth:`SimCluster.login`), or root under ``sudo``. ``groups``: (gid, name), primary first."""

    user: str
    uid: int
    gid: int
    groups: tuple[tuple[int, str], ...]
    home: str

    @property
    def root(self) -> bool:
        return self.uid == 0

    def in_group(self, name: str) -> bool:
        return any(g == name for _gid, g in self.groups)

    @property
    def hf_home(self) -> str:
        return f"{self.home.rstrip('/')}/.cache/huggingface"


ROOT = Account("root", 0, 0, ((0, "root"),), "/root")
# A stock DGX OS login's supplementary groups, as a real Spark's ``id`` prints them
# (tests/fixtures/real/dgx-os/stock-spark-id-ip.txt): the first-boot user is an Ubuntu admin (adm,
# sudo, ...) and in ``docker`` (988 there); the password is asked by sudo [dgx-spark-playbooks].
STOCK_GROUPS = ((4, "adm"), (27, "sudo"), (29, "audio"), (30, "dip"), (46, "plugdev"), (100, "users"),
                (122, "lpadmin"), (988, "docker"))


# ---- deterministic noise -----------------------------------------------------------------------

def _hash01(*parts: Any) -> float:
    h = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2**64


def noise(seed: int, key: str, t: float, period: float = 1.0) -> float:
    """Smooth pseudo-noise in [-1, 1]: a value per ``period`` seconds, linearly interpolated."""
    k = math.floor(t / period)
    frac = t / period - k
    a = _hash01(seed, key, k) * 2 - 1
    b = _hash01(seed, key, k + 1) * 2 - 1
    return a + (b - a) * frac


def stable_hex(n: int, *parts: Any) -> str:
    out = ""
    i = 0
    while len(out) < n:
        out += hashlib.sha256(repr((i, *parts)).encode()).hexdigest()
        i += 1
    return out[:n]


def stable_int(lo: int, hi: int, *parts: Any) -> int:
    return lo + int(_hash01(*parts) * (hi - lo))


# ---- catalogue ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Image:
    """One image of the catalogue, with what ``docker image inspect`` and its own Python would tell.

    Facts [../shared/research/real-dgx-os.md "Images"]: ``vllm/vllm-openai``'s final stage is
    ``ENTRYPOINT ["vllm", "serve"]`` with no CMD; up to vLLM 0.19 the plain ``vX`` tags are CUDA 12.9
    builds (their torch has sm_120 kernels, so they run on GB10's sm_121) and ``-cu130`` tags CUDA 13;
    NGC ``nvcr.io/nvidia/vllm`` images start ``/opt/nvidia/nvidia_entrypoint.sh`` with the command as
    its arguments, carry the label ``com.nvidia.vllm.version`` and, from 26.05, no Ray (neither the
    module nor the ``ray`` CLI). The upstream images have huggingface_hub's ``hf`` on PATH. Package
    versions other than vLLM's are illustrative (torch's ``+cuXYZ`` suffix as its wheels print it)."""

    ref: str  # "vllm/vllm-openai:v0.17.0"
    vllm_version: str  # what its log says ("" when the image has no vLLM)
    size_bytes: int
    created: str  # docker images CREATED (a date)
    knows_qwen35: bool
    entrypoint: tuple[str, ...] = ("vllm", "serve")  # the image's own ENTRYPOINT (() : none, null)
    transformers: str = "4.57.1"
    torch: str = "2.9.0"
    sglang_version: str = ""  # "" when sglang is not importable
    ray: str = ""  # ray's version ("" when the image has no Ray: no module, no CLI)
    cuda: str = "12.9"  # torch.version.cuda
    cuda_archs: tuple[str, ...] = ("sm_80", "sm_90", "sm_100", "sm_120")  # torch.cuda.get_arch_list()
    commands: tuple[tuple[str, str], ...] = ()  # name -> path of the image's own commands on PATH
    cmd: tuple[str, ...] | None = None  # CMD (None: not set, ``null`` in docker image inspect)
    labels: tuple[tuple[str, str], ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # ENV
    layer_count: int = 9

    @property
    def repo(self) -> str:
        return self.ref.rsplit(":", 1)[0]

    @property
    def tag(self) -> str:
        return self.ref.rsplit(":", 1)[1]

    @property
    def id(self) -> str:
        """The ID on the node that pulled it (overlay2 keeps it across ``docker save | load``; the
        containerd store does not: :meth:`SimCluster.image_id`)."""
        return stable_hex(64, "image", self.ref)

    @property
    def layers(self) -> tuple[str, ...]:
        """``RootFS.Layers``: the layers' diff IDs, the same wherever the image is stored."""
        return tuple("sha256:" + stable_hex(64, "layer", self.ref, k) for k in range(self.layer_count))

    def which(self, name: str) -> str | None:
        """Where the image's ``name`` command is (``shutil.which``), None when it has none."""
        return dict(self.commands).get(name)


# the commands the images bring (huggingface_hub's ``hf`` and its older ``huggingface-cli``; Ray's CLI)
_PY_CMDS = (("python3", "/usr/bin/python3"), ("python", "/usr/bin/python"), ("pip", "/usr/local/bin/pip"),
            ("hf", "/usr/local/bin/hf"), ("huggingface-cli", "/usr/local/bin/huggingface-cli"))
_VLLM_CMDS = (("vllm", "/usr/local/bin/vllm"), *_PY_CMDS)
_RAY_CMDS = (("ray", "/usr/local/bin/ray"),)
PY_CMDS, VLLM_CMDS, RAY_CMDS = _PY_CMDS, _VLLM_CMDS, _RAY_CMDS  # for images made elsewhere (a twin's)
_CUDA_ENV = (("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
             ("NVIDIA_VISIBLE_DEVICES", "all"), ("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"))
_UBUNTU_LABELS = (("org.opencontainers.image.ref.name", "ubuntu"), ("org.opencontainers.image.version", "22.04"))
_CU130_ARCHS = ("sm_80", "sm_90", "sm_100", "sm_110", "sm_120")

# Ray in the images (Ray's token authentication exists from 2.52 and is on by default from 2.61, docs.ray.io;
# sim/tools/ray.py): vLLM 0.17.0's image carries Ray 2.54 [../shared/research/engines-gb10.md "Ray, or vLLM's
# native multi-node"], so it has the feature and leaves it off unless RAY_AUTH_MODE=token; v0.14.1's 2.53.0 is
# illustrative (between the two, as its release date is); NGC 26.05 has no Ray. No image here has Ray >= 2.61.
IMAGE_OLD = Image("vllm/vllm-openai:v0.14.1", "0.14.1", int(19.7 * GB), "2026-01-24", False,
                  torch="2.9.1+cu129", ray="2.53.0", commands=(*_VLLM_CMDS, *_RAY_CMDS), labels=_UBUNTU_LABELS,
                  env=_CUDA_ENV)
IMAGE_NEW = Image("vllm/vllm-openai:v0.17.0", "0.17.0", int(21.4 * GB), "2026-03-07", True,
                  torch="2.10.0+cu129", ray="2.54.0", commands=(*_VLLM_CMDS, *_RAY_CMDS), labels=_UBUNTU_LABELS,
                  env=_CUDA_ENV)
IMAGE_NEW_CU130 = Image("vllm/vllm-openai:v0.17.0-cu130", "0.17.0", int(22.1 * GB), "2026-03-07", True,
                        torch="2.10.0+cu130", ray="2.54.0", cuda="13.0", cuda_archs=_CU130_ARCHS,
                        commands=(*_VLLM_CMDS, *_RAY_CMDS), labels=_UBUNTU_LABELS, env=_CUDA_ENV)
# NVIDIA's build: vLLM 0.20.1 (NGC release notes: 26.05 -> 0.20.1), no Ray [real-dgx-os.md "Images"]
IMAGE_NGC = Image("nvcr.io/nvidia/vllm:26.05-py3", "0.20.1", int(23.9 * GB), "2026-05-21", True,
                  entrypoint=("/opt/nvidia/nvidia_entrypoint.sh",), torch="2.11.0a0", cuda="13.0",
                  cuda_archs=(*_CU130_ARCHS, "sm_121", "compute_121"), commands=_VLLM_CMDS,
                  labels=(("com.nvidia.vllm.version", "0.20.1"), ("com.nvidia.build.id", "2026052101"),
                          ("com.nvidia.cuda.version", "13.0"), *_UBUNTU_LABELS[:1],
                          ("org.opencontainers.image.version", "24.04")),
                  env=(*_CUDA_ENV, ("NVIDIA_PRODUCT_NAME", "vLLM"), ("VLLM_VERSION", "0.20.1")))
# NVIDIA's build of vLLM 0.17.1 (NGC release notes: 26.03 -> 0.17.1), still with Ray (from 26.05 none), built
# for CUDA 13 with sm_121 [research: engines-gb10.md "Images and kernels"]; its Ray version is illustrative
# (between vLLM 0.17.0's 2.54 and token-by-default 2.61)
IMAGE_NGC_2603 = Image("nvcr.io/nvidia/vllm:26.03-py3", "0.17.1", int(23.1 * GB), "2026-03-24", True,
                       entrypoint=("/opt/nvidia/nvidia_entrypoint.sh",), torch="2.10.0a0", cuda="13.0", ray="2.54.0",
                       cuda_archs=(*_CU130_ARCHS, "sm_121", "compute_121"), commands=(*_VLLM_CMDS, *_RAY_CMDS),
                       labels=(("com.nvidia.vllm.version", "0.17.1"), ("com.nvidia.build.id", "2026032401"),
                               ("com.nvidia.cuda.version", "13.0"), *_UBUNTU_LABELS[:1],
                               ("org.opencontainers.image.version", "24.04")),
                       env=(*_CUDA_ENV, ("NVIDIA_PRODUCT_NAME", "vLLM"), ("VLLM_VERSION", "0.17.1")))
IMAGE_SGLANG = Image("lmsysorg/sglang:v0.5.9-cu130", "", int(32.6 * GB), "2026-03-02", True, entrypoint=(),
                     transformers="4.57.1", torch="2.9.1+cu130", sglang_version="0.5.9", cuda="13.0",
                     cuda_archs=_CU130_ARCHS, commands=_PY_CMDS, cmd=("/bin/bash",), labels=_UBUNTU_LABELS,
                     env=_CUDA_ENV)
IMAGES = {i.ref: i for i in (IMAGE_OLD, IMAGE_NEW, IMAGE_NEW_CU130, IMAGE_NGC, IMAGE_NGC_2603, IMAGE_SGLANG)}

# what ``ModelRegistry.get_supported_archs()`` of each image knows, among the ones a check asks about
ARCHS_COMMON = frozenset({"Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Glm4MoeLiteForCausalLM", "LlamaForCausalLM",
                          "Qwen2ForCausalLM", "Qwen3VLMoeForConditionalGeneration", "Glm4MoeForCausalLM"})
ARCHS_NEW = frozenset({"Qwen3_5MoeForConditionalGeneration", "Qwen3_5ForConditionalGeneration",
                       "Qwen3NextForCausalLM"})


# a twin's model outside the catalogue (sim/twin.py): its config.json as the Hub serves it, and its
# architecture, taken as known to every vLLM image (whether one registers it is not read: invented)
HUB_CONFIGS: dict[str, dict[str, Any]] = {}
TWIN_ARCHS: set[str] = set()


def image_archs(img: Image) -> frozenset[str]:
    extra = frozenset(TWIN_ARCHS) if img.vllm_version else frozenset()
    return (ARCHS_COMMON | ARCHS_NEW if img.knows_qwen35 else ARCHS_COMMON | {"Qwen3NextForCausalLM"}) | extra


def image_digest(ref: str) -> str:
    """The registry digest (``RepoDigests``) of an image of the catalogue: stable per reference."""
    return "sha256:" + stable_hex(64, "digest", ref)


@dataclass(frozen=True)
class ModelSpec:
    repo: str
    architecture: str
    disk_bytes: int  # the checkpoint on disk (what hf download / rsync move)
    files: int  # files in the repo (hf download "Fetching N files")
    shards: int  # safetensors shards (the loader's bar total)
    weights_gib_tp1: float  # "Model loading took X GiB" at TP=1 (halved per node at TP=2)
    overhead_gib: float  # activation peak + non-torch + graphs: gmu budget minus weights minus KV
    # "GPU KV cache size: N tokens" per GiB of KV cache at TP=1, for a model the planner has no config
    # of (a bundled one's KV figures come from the planner's arithmetic: :func:`planner_spec`)
    kv_tokens_per_gib: float
    max_model_len: int
    needs_new_vllm: bool = False  # Qwen3.5: vLLM >= 0.16
    task: str = "generate"  # generate | embed | score
    hybrid: bool = False  # linear-attention / mamba layers (vLLM prints the block-size lines)
    # pipeline parallelism: the decoder layers split over the stages (vLLM's ``get_pp_indices``), the
    # first stage also holds the embeddings and the vision tower, the last the lm_head (GiB at TP=1,
    # part of ``weights_gib_tp1``; 0 layers: an even split of everything)
    layers: int = 0
    embed_gib: float = 0.0
    vision_gib: float = 0.0
    lm_head_gib: float = 0.0
    # FP8 with 128x128 weight blocks (``quantization_config.weight_block_size``): vLLM runs its CUTLASS
    # block-FP8 GEMM, which upstream builds lack for GB10's sm_121 (sim/serve_plan.py)
    fp8_block: bool = False


@dataclass(frozen=True)
class RepoFile:
    """One file of a model repository on the Hub (the tree API's entry)."""

    path: str
    size: int
    sha256: str  # the LFS oid (a blob's name in the HF cache)
    git_oid: str  # the git blob id (the tree API's "oid")
    lfs: bool


_SMALL_FILES = {  # name -> size in bytes (Qwen3.5-122B-A10B-FP8 as published)
    ".gitattributes": 1_570, "LICENSE": 11_343, "README.md": 13_882, "config.json": 5_287,
    "generation_config.json": 214, "merges.txt": 1_671_853, "model.safetensors.index.json": 3_408_822,
    "preprocessor_config.json": 390, "tokenizer.json": 12_807_982, "tokenizer_config.json": 15_004,
    "video_preprocessor_config.json": 385, "vocab.json": 2_776_833,
}


def repo_files(spec: ModelSpec) -> list[RepoFile]:
    """The repository's files: the small ones plus ``shards`` safetensors shards, summing to
    ``disk_bytes``, each with a stable sha256 (so a copy can be verified against the Hub's tree)."""
    return _repo_files(spec.repo, spec.files, spec.shards, spec.disk_bytes)


_FILES_CACHE: dict[str, list[RepoFile]] = {}


def _repo_files(repo: str, n_files: int, shards: int, total: int) -> list[RepoFile]:
    if repo in _FILES_CACHE:
        return _FILES_CACHE[repo]
    small_names = list(_SMALL_FILES)[: max(0, n_files - shards)]
    out: list[RepoFile] = []
    for name in small_names:
        size = _SMALL_FILES[name]
        lfs = name in ("tokenizer.json",)
        out.append(RepoFile(name, size, stable_hex(64, repo, name, "sha"), stable_hex(40, repo, name, "git"), lfs))
    rest = total - sum(f.size for f in out)
    weights = [1.0 + 0.04 * (_hash01(repo, "shard", k) - 0.5) for k in range(shards)]
    if shards > 1:
        weights[-1] *= 0.55  # the last shard is the short one
    scale = rest / sum(weights)
    sizes = [int(w * scale) for w in weights]
    sizes[0] += rest - sum(sizes)
    for k, size in enumerate(sizes):
        name = f"model-{k + 1:05d}-of-{shards:05d}.safetensors" if shards > 1 else "model.safetensors"
        out.append(RepoFile(name, size, stable_hex(64, repo, name, "sha"), stable_hex(40, repo, name, "git"), True))
    out.sort(key=lambda f: f.path)
    _FILES_CACHE[repo] = out
    return out


def set_repo_files(repo: str, files: list[RepoFile]) -> None:
    """The files of a repository as read from the Hub (a twin's model): what :func:`repo_files` gives."""
    _FILES_CACHE[repo] = sorted(files, key=lambda f: f.path)


def repo_revision(repo: str) -> str:
    return stable_hex(40, repo, "rev")


MODELS: dict[str, ModelSpec] = {
    m.repo: m
    for m in (
        ModelSpec("Qwen/Qwen3.5-122B-A10B-FP8", "Qwen3_5MoeForConditionalGeneration", int(125.2 * GB), 52, 40,
                  116.62, 11.33, 10_896.0, 262_144, needs_new_vllm=True, hybrid=True,
                  # 48 layers; bf16 embed/lm_head 248,320 x 3,072 (1.42 GiB each); ViT ~0.85 GiB
                  layers=48, embed_gib=1.42, vision_gib=0.85, lm_head_gib=1.42, fp8_block=True),
        ModelSpec("GadflyII/GLM-4.7-Flash-NVFP4", "Glm4MoeLiteForCausalLM", int(19.9 * GB), 12, 4,
                  17.86, 4.2, 19_500.0, 202_752, layers=47, embed_gib=0.59, lm_head_gib=0.59),
        ModelSpec("Qwen/Qwen3-Embedding-0.6B", "Qwen3ForCausalLM", int(1.19 * GB), 11, 1,
                  1.12, 0.8, 9_320.0, 32_768, task="embed"),
        ModelSpec("Qwen/Qwen3-Reranker-0.6B", "Qwen3ForCausalLM", int(1.19 * GB), 11, 1,
                  1.12, 0.8, 9_320.0, 40_960, task="score"),
    )
}


def planner_spec(repo: str) -> Any:
    """The planner's spec of ``repo`` when the planner bundles its config (the simulated engine then
    logs the planner's own KV arithmetic: block size, blocks, concurrency), else None. Offline."""
    return _planner_spec(repo)


@functools.lru_cache(maxsize=16)
def _planner_spec(repo: str) -> Any:
    from sparkconsole.planner.spec import is_bundled, load_bundled

    try:
        return load_bundled(repo) if is_bundled(repo) else None
    except Exception:  # a broken bundled config must not stop the simulator
        return None


# ---- memory curves -----------------------------------------------------------------------------

@dataclass
class Curve:
    """Piecewise-linear bytes over time: 0 before the first point, the last value after it."""

    points: list[tuple[float, float]] = field(default_factory=list)
    end: float | None = None  # freed at this time (process exit / container stop)

    def value(self, t: float) -> float:
        if not self.points or t < self.points[0][0]:
            return 0.0
        if self.end is not None and t >= self.end:
            return 0.0
        prev_t, prev_v = self.points[0]
        for pt, pv in self.points[1:]:
            if t < pt:
                if pt == prev_t:
                    return pv
                return prev_v + (pv - prev_v) * (t - prev_t) / (pt - prev_t)
            prev_t, prev_v = pt, pv
        return prev_v


@dataclass
class Holder:
    """A process holding unified memory on a node (it shows in ``--query-compute-apps``)."""

    node: str
    pid: int
    name: str  # "VLLM::EngineCore", "ray::RayWorkerWrapper"
    curve: Curve
    container: str | None = None
    gpu: bool = True  # a GPU (CUDA) allocation, listed by nvidia-smi

    def bytes_at(self, t: float) -> float:
        return self.curve.value(t)


@dataclass
class CacheRamp:
    """Page-cache growth: ``nbytes`` read or written between ``t0`` and ``t1`` on a node. A ramp read
    by a process (``reader``: a vLLM rank loading its shards) stops growing when that process ends:
    a load killed at shard 9 of 40 leaves 9 shards in the page cache, not 40."""

    node: str
    t0: float
    t1: float
    nbytes: float
    reader: Curve | None = None
    path: str = ""  # the folder of the files read or written (host path): what `dd iflag=nocache` evicts

    @property
    def stop(self) -> float:
        end = self.reader.end if self.reader is not None else None
        return self.t1 if end is None else min(self.t1, end)


@dataclass(kw_only=True)
class WorkSpan(Waited):
    """Something a node worked on for the console, with its own time (clock.Waited): one command it
    ran over SSH (``exec``) or a detached job (``job``: ``setsid nohup sh -c JOB &``, remote.detached)."""

    kind: str
    node: str


# ---- containers and engines --------------------------------------------------------------------

@dataclass
class LogLine:
    t: float
    text: str


@dataclass
class EngineRun:
    """One ``vllm serve`` run, planned when it starts (see :mod:`sparkconsole.sim.vllm_logs`)."""

    model: str
    served_name: str
    version: str
    port: int
    tp: int
    started: float
    lines: list[LogLine]
    holders: list[Holder]
    pp: int = 1  # --pipeline-parallel-size (Ray): world size tp * pp, one rank per node of ``nodes``
    ready_at: float | None = None
    failed_at: float | None = None
    failure: str | None = None  # oom | oom_startup | unsupported_architecture | ray | port
    reasoning_parser: str | None = None
    max_model_len: int = 0
    activity: float = 0.0  # 0..1: steady traffic once ready (story engines serve requests)
    nodes: tuple[str, ...] = ()
    stopped_at: float | None = None
    periodic: bool = False  # emits access-log / metrics lines while active
    pid_api: int = 1
    epoch0: float = 0.0  # unix time of sim time 0 (for the dates in periodic lines)
    free_at_load: dict[str, float] = field(default_factory=dict)  # MemAvailable per node at load start
    pid_core: int = 0  # the EngineCore_DP0 process
    rank_pids: tuple[int, ...] = ()  # the Ray workers' pids, one per TP rank (same order as ``nodes``)
    nccl_at: float | None = None  # TP>1: when the NCCL process group was up (collectives from then on)
    hung_at: float | None = None  # a TP worker was lost: nothing progresses after this (NCCL hangs)
    # renders the access-log / metrics lines of traffic slot k (set by the planner: the model renders no text)
    render_traffic: Callable[[EngineRun, int, float], list[LogLine]] | None = None
    # native multi-node (``--nnodes``, no Ray): the headless ranks' own lines, per node, that their
    # containers' ``docker logs`` show; when each headless rank's process exits (absent: still running)
    peer_lines: dict[str, list[LogLine]] = field(default_factory=dict)
    peer_end: dict[str, float] = field(default_factory=dict)
    peer_containers: dict[str, str] = field(default_factory=dict)  # node -> the headless rank's container
    rendezvous: tuple[str, int] | None = None  # native: the TCPStore (master-addr, master-port) it hosts
    rendezvous_at: float | None = None  # native: when rank 0 starts waiting for the other ranks
    serve_args: Any = None  # native: the head's parsed arguments (planned again when a rank joins late)
    host: str = "0.0.0.0"  # --host: where the API server listens (127.0.0.1: this node's own clients only)
    # --api-key, else VLLM_API_KEY of its environment: /v1 then wants ``Authorization: Bearer KEY``
    api_key: str | None = None
    # what /metrics reports (sparkconsole.sim.vllm_metrics): the "GPU KV cache size" its log prints and
    # the attention block size, for the KV usage; the figures themselves, per run (a restart starts at 0)
    kv_cache_tokens: int = 0
    kv_block_size: int = 16
    max_num_seqs: int = 0  # --max-num-seqs, else vLLM's default (0: unknown, vllm_metrics takes 1024)
    metrics: Any = None

    @property
    def world(self) -> int:
        return self.tp * self.pp

    @property
    def native(self) -> bool:
        return self.rendezvous is not None

    def is_ready(self, t: float) -> bool:
        return (
            self.ready_at is not None and t >= self.ready_at
            and (self.stopped_at is None or t < self.stopped_at)
        )

    def ended(self, t: float) -> bool:
        return (self.failed_at is not None and t >= self.failed_at) or (
            self.stopped_at is not None and t >= self.stopped_at
        )

    def stop(self, t: float) -> None:
        if self.stopped_at is None or self.stopped_at > t:
            self.stopped_at = t
        for h in self.holders:
            if h.curve.end is None or h.curve.end > t:
                h.curve.end = t


@dataclass
class HeadlessRank:
    """A ``vllm serve --headless --node-rank R`` (R > 0): its workers wait at the head's TCPStore."""

    master_addr: str
    master_port: int
    nnodes: int
    node_rank: int
    tp: int
    model: str
    pid: int  # the Worker_TP<rank> process
    waiting_at: float  # when its worker process reaches the rendezvous
    run: EngineRun | None = None  # the head's run it joined


@dataclass
class Container:
    id: str
    name: str
    image: str
    argv: tuple[str, ...]
    node: str
    created: float
    started: float | None
    kind: str = "generic"  # vllm | ray | generic
    stopped: float | None = None
    exit_code: int | None = None
    engine: EngineRun | None = None
    log: list[LogLine] = field(default_factory=list)  # lines not from an engine (banner, ray)
    env: tuple[tuple[str, str], ...] = ()
    host_rss: int = 0  # CPU-side memory of the container's processes
    network: str = "host"
    mounts: str = ""
    # ``-v HOST:CTR`` bind mounts, (host path, container path): a container's files are its node's,
    # seen through these (``/root/.cache/huggingface`` in the container is the login user's cache)
    binds: tuple[tuple[str, str], ...] = ()
    restarts: int = 0
    headless: HeadlessRank | None = None  # a native multi-node vLLM rank > 0
    oom_killed: bool = False  # its process was ended by the kernel's OOM killer (docker's State.OOMKilled)
    gpus: bool = False  # started with ``--gpus`` (or the CDI device): torch sees the node's GPU in it
    # the container's own files (a VFS made on first use by the docker tools): everything outside its
    # bind mounts, gone with the container (``docker rm``)
    rootfs: Any = None
    user: str = ""  # ``--user UID:GID`` ("" : the image's, root)
    main_pid: int | None = None  # a container whose command runs as a shell process: that process
    # a twin's container (sim/twin.py): the CPU its node's docker stats read (percent of one core, on
    # top of the idle wobble), and the TCP ports its processes listen on: (address, port, process name)
    cpu_pct: float = 0.0
    listens: tuple[tuple[str, int, str], ...] = ()
    # the ``hostile`` scenario's engine (sim/hostile.py's Hostile): an endless log and a 1 GB /metrics page
    hostile: Any = None

    @property
    def host_pid(self) -> int:
        """The pid its serving process has on the host (ss -p, /proc/PID/cgroup)."""
        return stable_int(2000, 90000, self.id, "hostpid")

    def _member_end(self) -> float | None:
        h = self.headless
        if h is None or h.run is None:
            return None
        return h.run.peer_end.get(self.node)

    def running(self, t: float) -> bool:
        if self.started is None or t < self.started:
            return False
        if self.stopped is not None and t >= self.stopped:
            return False
        end = self._member_end()
        if end is not None and t >= end:
            return False
        return not (self.engine is not None and self.engine.failed_at is not None and t >= self.engine.failed_at)

    def state(self, t: float) -> str:
        if self.started is None or t < self.started:
            return "created"
        return "running" if self.running(t) else "exited"

    def exit_info(self, t: float) -> tuple[int, float] | None:
        """(exit code, time) once it has exited."""
        if self.running(t) or self.started is None:
            return None
        if self.stopped is not None and t >= self.stopped:
            return (self.exit_code if self.exit_code is not None else 0, self.stopped)
        if self.engine is not None and self.engine.failed_at is not None:
            return (1, self.engine.failed_at)
        end = self._member_end()
        if end is not None:
            return (1, end)
        return (0, self.started)

    def log_lines(self, t: float) -> list[LogLine]:
        return self.log_between(-math.inf, t)

    def log_between(self, lo: float, hi: float) -> list[LogLine]:
        """The lines logged in ``(lo, hi]``: what ``docker logs -f`` adds at one wake-up, and
        ``--since`` (the cost is the lines in the window, not the whole log)."""
        lines = [ln for ln in self.log if lo < ln.t <= hi]
        if self.engine is not None:
            end = hi
            if self.stopped is not None:
                end = min(end, self.stopped)
            lines += [ln for ln in self.engine.lines if lo < ln.t <= end]
            since = max(self.started or 0.0, lo)
            lines += [ln for ln in periodic_lines(self.engine, since, end) if ln.t > lo]
        h = self.headless
        if h is not None and h.run is not None:
            end = hi if self.stopped is None else min(hi, self.stopped)
            lines += [ln for ln in h.run.peer_lines.get(self.node, ()) if lo < ln.t <= end]
        lines.sort(key=lambda ln: ln.t)
        return lines


def periodic_lines(run: EngineRun, since: float, until: float, limit: int | None = None) -> list[LogLine]:
    """The access-log and metrics lines an engine prints while it serves traffic (10 s slots)."""
    if not run.periodic or run.ready_at is None or run.activity <= 0:
        return []
    start = max(run.ready_at, since)
    end = until if run.stopped_at is None else min(until, run.stopped_at)
    if run.hung_at is not None:
        end = min(end, run.hung_at)  # a lost TP worker: requests hang, no more stats lines
    if end <= start:
        return []
    if run.render_traffic is None:
        return []
    out: list[LogLine] = []
    k_hi = math.floor((end - run.ready_at) / 10.0)
    k_lo = max(1, math.floor((start - run.ready_at) / 10.0))
    k = k_hi
    while k >= k_lo:
        slot_t = run.ready_at + 10.0 * k
        if _hash01("slot", run.model, run.started, k) < run.activity:
            out.extend(run.render_traffic(run, k, slot_t))
            if limit is not None and len(out) >= limit:
                break
        k -= 1
    out.sort(key=lambda ln: ln.t)
    return [ln for ln in out if start <= ln.t <= end]


# ---- transfers ---------------------------------------------------------------------------------

@dataclass
class Transfer:
    """Bytes moving at a rate: ``kind`` is download | rsync | image."""

    kind: str
    what: str  # model repo or image ref
    src: str | None  # node name (None: the internet)
    dst: str
    t0: float
    nbytes: int
    rate: float
    failed_at: float | None = None
    cancelled_at: float | None = None

    @property
    def t1(self) -> float:
        return self.t0 + self.nbytes / self.rate

    def done_bytes(self, t: float) -> float:
        end = self.cancelled_at if self.cancelled_at is not None else math.inf
        tt = min(t, end, self.t1)
        return max(0.0, min(self.nbytes, (tt - self.t0) * self.rate))

    def complete(self, t: float) -> bool:
        return self.cancelled_at is None and self.failed_at is None and t >= self.t1


# ---- ray ---------------------------------------------------------------------------------------

@dataclass
class RayMember:
    node: str
    node_id: str
    ip: str
    since: float
    head: bool
    container: str | None = None
    dashboard_host: str = "127.0.0.1"  # `ray start --dashboard-host` (Ray's default: localhost)
    cpus: float = float(CPUS)
    gpus: float = 1.0
    memory_gib: float = 110.88
    object_store_gib: float = 9.73


@dataclass
class RayCluster:
    address: str  # "192.168.200.12:6379"
    members: dict[str, RayMember] = field(default_factory=dict)
    token: str | None = None  # the head's token when it runs in token mode (sim/tools/ray.py); None: no auth


# ---- nodes -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Iface:
    name: str
    ifindex: int
    mac: str
    mtu: int
    kind: str  # loopback | ether | wifi | bridge | cx7
    ipv4: tuple[str, ...] = ()  # "192.168.200.12/24"
    # IPv6 addresses beyond the kernel's EUI-64 fe80 (which SimNode.ipv6 adds with a carrier): "fd…/64"
    ipv6: tuple[str, ...] = ()
    rdma: str | None = None  # the RoCE device of a CX-7 twin
    port1: bool = False  # a twin of the cabled physical port
    dynamic: bool = False  # DHCP address


@dataclass
class SimNode:
    name: str
    index: int  # 0 = head
    role: str
    internet: bool
    fast_ip: str  # the IPv4 on enp1s0f1np1 (169.254.x.y under netplan-ll, 192.168.200.N under two-subnet)
    fast_ip2: str  # the IPv4 on enP2p1s0f1np1: "" under netplan-ll (that twin has fe80 only)
    lan_ip: str  # on enP7s7
    ifaces: tuple[Iface, ...]
    images: dict[str, Image] = field(default_factory=dict)
    models: dict[str, int] = field(default_factory=dict)  # repo -> bytes on disk at t=0
    port1_up: bool = True
    lost_at: float | None = None
    boot_uptime: float = 0.0  # uptime at sim t=0 (after a reboot: minus the sim time it rebooted at)
    boots: int = 0  # reboots so far: the boot id changes with each
    drop_times: list[float] = field(default_factory=list)
    evictions: list[tuple[float, str]] = field(default_factory=list)  # (t, file) dropped by dd iflag=nocache
    files: dict[str, str] = field(default_factory=dict)  # extra read-only virtual files (tests)
    pid_counter: int = 0
    mtu: dict[str, int] = field(default_factory=dict)  # interface -> MTU where not the default
    # None: each RDMA device's GID table follows its netdev's addresses (gid_table); a number pins the
    # RoCE v2 ::ffff:IPv4 entry of every twin with an IPv4 at that index (tests; >= 3)
    gid_v2_index: int | None = None
    hf_token: str | None = None  # written to ~/.cache/huggingface/token on nodes logged in to the Hub
    kmsg: list[LogLine] = field(default_factory=list)  # the kernel's log (OOM kills): journalctl -k, dmesg
    # the login user on a stock node (SimCluster.login; the permissive twin logs in as root). NVIDIA's
    # playbooks only ask that every node has the same user and suggest ``nvidia`` [dgx-spark-playbooks
    # connect-two-sparks]
    user: str = "nvidia"
    docker_group: bool = True  # in the ``docker`` group (False: docker's permission-denied error)
    # sudoers NOPASSWD rules, each a full argv (("/usr/bin/tee", "/proc/sys/vm/drop_caches") as
    # sparkrun installs it [sparkrun scripts]; ("ALL",): anything). Empty on a stock node: sudo asks
    # for a password (``sudo -n``: "a password is required", sudo.ws).
    sudo_rules: list[tuple[str, ...]] = field(default_factory=list)
    # a twin of a real node (sim/twin.py): the login account as that node's ``id`` said it (None: the
    # stock first-boot user above), and the host tools its recon found or missed (absent: the stock rule)
    account: Account | None = None
    tools: dict[str, bool] = field(default_factory=dict)
    listens: list[tuple[str, int, str, int]] = field(default_factory=list)  # (address, port, process, pid)
    disk_extra: int = 0  # bytes in use beyond the OS, the images and the files modelled (a twin's)

    def mtu_of(self, iface: Iface) -> int:
        return self.mtu.get(iface.name, iface.mtu)

    @property
    def gpu_uuid(self) -> str:
        h = stable_hex(32, "gpu", self.name)
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"

    def link_up(self, iface: Iface) -> bool:
        return iface.kind == "cx7" and iface.port1 and self.port1_up

    def carrier(self, iface: Iface) -> bool:
        """LOWER_UP: a cabled CX-7 twin whose port is up, the LAN port and lo (not the idle Wi-Fi or
        docker0 without containers, both NO-CARRIER on the real capture)."""
        return self.link_up(iface) if iface.kind == "cx7" else iface.kind in ("loopback", "ether")

    def ipv6(self, iface: Iface) -> list[str]:
        """The IPv6 addresses ``ip addr`` lists on ``iface`` ("addr/plen"), global before link-local
        as the kernel keeps them: the configured ones, then the kernel's EUI-64 fe80 (RFC 4291 app. A),
        which an interface gets once it has a carrier (the capture's DOWN ports have no address)."""
        if iface.kind == "loopback":
            return ["::1/128"]
        out = sorted(iface.ipv6, key=lambda a: ipaddress.ip_interface(a).ip.is_link_local)
        if self.carrier(iface):
            out.append(f"{link_local6(iface.mac)}/64")
        return out

    def gid_table(self, iface: Iface) -> dict[int, tuple[str, str]]:
        """Port 1's RoCE GID table of ``iface``'s RDMA device: index -> (GID, type); absent indexes
        are empty. As the kernel's roce_gid_mgmt fills it (drivers/infiniband/core/roce_gid_mgmt.c,
        cache.c): 0 and 1 hold the default GID, the MAC's EUI-64 fe80, as "IB/RoCE v1" and "RoCE v2",
        whatever the link; each further address of the netdev adds a v1/v2 pair in the first free
        slots, in the order the addresses came: a configured IPv6 one at once, the IPv4 one later
        (IPv4LL claims it after its ARP probes), so an extra IPv6 address moves the IPv4 RoCE v2 entry
        from 3 to 5 (docs/dgx-os.md section 4; tests/fixtures/real/dgx-os/gid-table-rocep1s0f1.txt
        has 0/1 fe80 and 2/3 IPv4). An fe80 equal to the default GID adds nothing (the kernel finds it
        there); a twin without IPv4 has the default pair only. ``gid_v2_index`` pins the IPv4 pair."""
        return dict(_gid_table(iface, self.gid_v2_index)) if iface.rdma else {}

    def gid_v2_ipv4(self, iface: Iface) -> int | None:
        """The index of ``iface``'s RoCE v2 IPv4-mapped GID (what NCCL_IB_GID_INDEX must name), or None."""
        return next((k for k, (g, typ) in sorted(self.gid_table(iface).items())
                     if typ == GID_V2 and g.startswith(IPV4_MAPPED)), None)

    def iface(self, name: str) -> Iface | None:
        return next((i for i in self.ifaces if i.name == name), None)

    def ips(self) -> list[str]:
        return [a.split("/")[0] for i in self.ifaces for a in i.ipv4]

    def lost(self, t: float) -> bool:
        return self.lost_at is not None and t >= self.lost_at

    def next_pid(self, lo: int = 1000) -> int:
        self.pid_counter += 1
        return stable_int(lo, 400_000, self.name, "pid", self.pid_counter)


def _macs(base: str, n: int) -> list[str]:
    head, last = base.rsplit(":", 1)
    return [f"{head}:{int(last, 16) + i:02x}" for i in range(n)]


# ---- the fast link's addresses (docs/dgx-os.md section 4, "The RoCE GID index is per device and per node")

# netplan-ll: NVIDIA's earlier netplan (cx7-netplan.yaml: ``link-local: [ipv4]`` on enp1s0f0np0 and
# enp1s0f1np1 only), so the cabled enp1s0f1np1 has one 169.254.x.y/16 and its enP2 twin fe80 only
# (tests/fixtures/real/dgx-os/stock-spark-id-ip.txt); two-subnet: the July 2026 playbook and NVIDIA
# Sync's Cluster Assistant, a static IPv4 on both twins in two subnets.
LAYOUTS = ("netplan-ll", "two-subnet")
GID_V1, GID_V2 = "IB/RoCE v1", "RoCE v2"  # gid_attrs/types/N as the kernel names them
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"  # an empty GID entry (sysfs prints zeros)
IPV4_MAPPED = "0000:0000:0000:0000:0000:ffff:"  # an IPv4 address's GID: ::ffff:a.b.c.d


def link_local6(mac: str) -> str:
    """The EUI-64 link-local address of a MAC (RFC 4291 app. A: flip the U/L bit, ff:fe in the
    middle): 4c:bb:47:2f:91:13 -> fe80::4ebb:47ff:fe2f:9113, as the real capture shows it."""
    b = [int(x, 16) for x in mac.split(":")]
    b[0] ^= 0x02
    iid = int.from_bytes(bytes([*b[:3], 0xFF, 0xFE, *b[3:]]), "big")
    return str(ipaddress.IPv6Address((0xFE80 << 112) | iid))


def link_local4(name: str, taken: set[str] | frozenset[str] = frozenset()) -> str:
    """An IPv4 link-local address for host ``name``: 169.254.1.0-169.254.254.255 (RFC 3927 2.1),
    stable per host (systemd-networkd seeds its IPv4LL pick from the machine, networkd-ipv4ll.c);
    one another node holds is a conflict the ARP probe finds, and the next pick is taken."""
    salt = 0
    while True:
        v = stable_int(0x0100, 0xFF00, name, "ipv4ll", salt)
        ip = f"169.254.{v >> 8}.{v & 0xFF}"
        if ip not in taken:
            return ip
        salt += 1


def ula6(mac: str) -> str:
    """A unique-local address (RFC 4193: fd + a 40-bit global ID, subnet 1) with the MAC's EUI-64
    interface ID: the extra IPv6 address some nodes carry on the fast link."""
    prefix = int("fd" + stable_hex(10, "ula"), 16) << 80 | 1 << 64
    return str(ipaddress.IPv6Address(prefix | (int(ipaddress.IPv6Address(link_local6(mac))) & (1 << 64) - 1)))


def roce_gid(addr: str) -> str:
    """An address as its RoCE GID reads in sysfs (the kernel's %pI6: 8 groups of 4 hex digits): an
    IPv6 address as it is, an IPv4 one mapped (::ffff:10.100.184.1 -> …:ffff:0a64:b801)."""
    a = ipaddress.ip_interface(addr).ip
    return (ipaddress.IPv6Address(f"::ffff:{a}") if a.version == 4 else a).exploded


@functools.lru_cache(maxsize=4096)
def _gid_table(iface: Iface, pin: int | None) -> tuple[tuple[int, tuple[str, str]], ...]:
    """:meth:`SimNode.gid_table`, kept per (interface, pin): sysfs is read path by path."""
    default = roce_gid(link_local6(iface.mac))
    table = {0: (default, GID_V1), 1: (default, GID_V2)}
    v4 = [roce_gid(a) for a in iface.ipv4]
    if pin is not None and v4:
        if pin < 3:
            raise ValueError(f"gid_v2_index {pin}: 0 and 1 hold the default GID")
        table[pin - 1], table[pin] = (v4[0], GID_V1), (v4[0], GID_V2)
        v4 = v4[1:]
    k = 2
    for g in dict.fromkeys([roce_gid(a) for a in iface.ipv6] + v4):
        if g == default:
            continue
        for typ in (GID_V1, GID_V2):
            while k in table:
                k += 1
            table[k] = (g, typ)
    return tuple(sorted(table.items()))


def make_node(index: int, name: str, internet: bool, port1_up: bool = True, layout: str = "netplan-ll",
              taken: set[str] | frozenset[str] = frozenset()) -> SimNode:
    """Node ``index`` addressed as ``layout`` says (``taken``: link-local IPv4s other nodes hold).
    Under netplan-ll the workers' enp1s0f1np1 also carries a ULA /64, so their IPv4 RoCE v2 GID sits
    at 5 and the head's at 3 (field reports: 3 on one node, 5 on its peer with an extra IPv6 address;
    docs/dgx-os.md section 4)."""
    host = 12 + index
    lan_ip = f"10.42.0.{41 + index}"
    mb = f"4c:bb:47:{0x2f + index // 7:02x}:{(0x91 + 0x10 * index) % 256:02x}"
    m = _macs(mb + ":11", 7)
    f1b = _macs(mb + ":17", 1)[0]
    if layout == "two-subnet":
        fast_ip, fast_ip2 = f"192.168.200.{host}", f"192.168.201.{host}"
        f1v4, f1v6, f1bv4 = (f"{fast_ip}/24",), (), (f"{fast_ip2}/24",)
    elif layout == "netplan-ll":
        fast_ip, fast_ip2 = link_local4(name, taken), ""
        f1v4, f1v6, f1bv4 = (f"{fast_ip}/16",), ((f"{ula6(m[2])}/64",) if index else ()), ()
    else:
        raise ValueError(f"unknown layout {layout!r}: choose one of {', '.join(LAYOUTS)}")
    ifaces = (
        Iface("lo", 1, "00:00:00:00:00:00", 65536, "loopback", ("127.0.0.1/8",)),
        Iface("enP7s7", 2, m[0], 1500, "ether", (f"{lan_ip}/24",), dynamic=True),
        Iface("enp1s0f0np0", 3, m[1], 1500, "cx7", rdma="rocep1s0f0"),
        Iface("enp1s0f1np1", 4, m[2], 1500, "cx7", f1v4, f1v6, rdma="rocep1s0f1", port1=True),
        Iface("enP2p1s0f0np0", 5, _macs(mb + ":16", 1)[0], 1500, "cx7", rdma="roceP2p1s0f0"),
        Iface("enP2p1s0f1np1", 6, f1b, 1500, "cx7", f1bv4, rdma="roceP2p1s0f1", port1=True),
        Iface("wlP9s9", 7, f"58:02:05:f5:{0xfb - index:02x}:8c", 1500, "wifi"),
        Iface("docker0", 8, f"aa:ac:e4:c1:{0x87 + index:02x}:bd", 1500, "bridge", ("172.17.0.1/16",)),
    )
    return SimNode(
        name=name, index=index, role="head" if index == 0 else "worker", internet=internet,
        fast_ip=fast_ip, fast_ip2=fast_ip2, lan_ip=lan_ip, ifaces=ifaces, port1_up=port1_up,
        boot_uptime=93_784.21 + 3_611.7 * index,
    )


def address_nodes(nodes: Iterable[SimNode], layout: str) -> None:
    """Re-address every node's ConnectX-7 twins as ``layout`` says (no two link-local IPv4s alike)."""
    taken: set[str] = set()
    for n in nodes:
        fresh = make_node(n.index, n.name, n.internet, layout=layout, taken=taken)
        n.ifaces, n.fast_ip, n.fast_ip2 = fresh.ifaces, fresh.fast_ip, fresh.fast_ip2
        taken.add(fresh.fast_ip)


DEFAULT_NAMES = ("spark-1a32", "spark-5be3")


def node_names(n: int) -> list[str]:
    """``spark-XXXX`` as DGX OS names a Spark (the last hex digits of its serial), unique."""
    names = list(DEFAULT_NAMES[:n])
    salt = 0
    while len(names) < n:
        name = f"spark-{stable_hex(4, 'node', len(names), salt)}"
        if name in names:
            salt += 1
            continue
        names.append(name)
    return names


# ---- the cluster -------------------------------------------------------------------------------

@dataclass
class MemSnapshot:
    total: int
    free: int
    available: int
    cached: int
    buffers: int
    used_apps: int  # held by processes (GPU allocations + container RSS)
    gpu_holders: list[tuple[Holder, int]]
    swap_total: int = SWAP_TOTAL
    swap_free: int = SWAP_TOTAL - 928 * MIB


class SimCluster:
    """N Sparks, their containers, transfers and Ray cluster, all driven by one clock."""

    def __init__(self, clock: SimClock, n_nodes: int = 2, seed: int = 1234) -> None:
        if n_nodes < 1:
            raise ValueError("a cluster needs at least one node")
        self.clock = clock
        self.seed = seed
        self.nodes: dict[str, SimNode] = {}
        for i, name in enumerate(node_names(n_nodes)):
            self.nodes[name] = make_node(i, name, internet=(i == 0))
        self.containers: list[Container] = []
        self.holders: list[Holder] = []
        self.cache_ramps: list[CacheRamp] = []
        self.transfers: list[Transfer] = []
        self.work_spans: list[WorkSpan] = []  # kept only when record_work (a rehearsal): a demo runs for hours
        self.record_work = False
        self.ray: RayCluster | None = None
        self.scenario = "story"
        self.filesystems: dict[str, VFS] = {}
        self.proc_tables: dict[str, ProcTable] = {}
        # computes a node's virtual /proc, /sys and /etc files (set by the renderers' owner: the shell)
        self.virtual_files: Callable[[SimCluster, str], dict[str, str]] | None = None
        # one of them rendered alone (node, path), None where it is not one of those: what a watcher
        # reads every tick (/proc/meminfo, /proc/pressure/memory) costs one file, not the node's all
        self.virtual_file: Callable[[SimCluster, str, str], str | None] | None = None
        # told when a node is lost (the engine planner uses it: TP engines spanning the node hang)
        self.lost_listeners: list[Callable[[SimCluster, str, float], None]] = []
        # told of each ``vllm serve`` run once planned (node, container, run): a scenario's event that
        # comes to an engine started while the demo runs (prefill-squeeze's long prompt)
        self.engine_listeners: list[Callable[[SimCluster, str, str, EngineRun], None]] = []
        self.units: dict[str, dict[str, str]] = {}
        # How stock the nodes are (scenarios.py sets them; the default is stock DGX OS, issue 22):
        # permissive: today's old twin (root login, sudo that asks nothing, hf on the host);
        # layout: "netplan-ll" (NVIDIA's earlier netplan: one link-local IPv4 per twin pair) or
        # "two-subnet" (the July 2026 playbook / NVIDIA Sync: both twins addressed, two subnets);
        # image_store: "containerd" (Docker 29's default store) or "overlay2" (the real capture).
        self.permissive = False
        self.layout = "netplan-ll"
        self.image_store = "containerd"
        # bytes per second of sim time from the Hub and over the fast link (rsync over ssh): the
        # defaults are a Spark pair's; a twin takes what its rehearsal measured (sim/twin.py)
        self.internet_bps = float(INTERNET_BPS)
        self.fast_bps = float(FAST_LINK_RSYNC_BPS)
        self.image_bps = float(IMAGE_COPY_BPS)
        # the fixed costs a copy pays before its first byte: one ssh connection between the nodes
        # (every rsync pass, image copy and `ssh PEER`), and the host's `hf` starting (Python's
        # imports); a twin takes what its rehearsal timed on the nodes
        self.peer_ssh_s = PEER_SSH_S
        self.hf_start_s = 0.0

    def login(self, node: str) -> Account:
        """Who ``node``'s SSH sessions run as: on a stock node the first-boot user (``nvidia``, uid
        1000, in ``sudo`` and ``docker``: tests/fixtures/real/dgx-os/stock-spark-id-ip.txt); on the
        permissive twin root, as the simulator was before. Everything that needs the user or its
        home (the shell's ``$HOME``, ``id``, the HF cache, ssh between nodes) asks here."""
        n = self.nodes[node]
        if n.account is not None:
            return n.account
        if self.permissive:
            return ROOT
        groups = tuple(g for g in STOCK_GROUPS if n.docker_group or g[1] != "docker")
        return Account(n.user, 1000, 1000, ((1000, n.user), *groups), f"/home/{n.user}")

    def model_dir(self, node: str, repo: str) -> str:
        """``repo``'s folder in the HF cache of ``node``'s login user."""
        return model_dir(repo, self.login(node).home)

    def fs(self, node: str) -> VFS:
        """The node's file system (made on first use, with the login user's HF cache in place)."""
        v = self.filesystems.get(node)
        if v is None:
            v = VFS(self.now, lambda: self.virtual_files(self, node) if self.virtual_files else {},
                    lambda path: self.virtual_file(self, node, path) if self.virtual_file else None)
            acct = self.login(node)
            v.mkdir(hf_hub(acct.home), parents=True)
            v.mkdir(f"{acct.home}/.cache/sparkconsole", parents=True)
            v.mkdir(f"{acct.home}/.ssh", parents=True)
            if getattr(self, "scenario", "") != "new-keys":
                # nodes set up as NVIDIA's playbook does (ssh between them once, keys accepted): each knows
                # its peers' host keys at their fast-link addresses; the new-keys scenario knows none
                from sparkconsole.sim.formats import ssh_host_key

                peers = [(ip, ssh_host_key(self, p)) for p, n in self.nodes.items() if p != node
                         for ip in (n.fast_ip, n.fast_ip2) if ip]
                if peers:
                    v.write_text(f"{acct.home}/.ssh/known_hosts",
                                 "".join(f"{ip} {' '.join(key.split()[:2])}\n" for ip, key in peers))
            tok = self.nodes[node].hf_token
            if tok:
                v.write_text(f"{acct.hf_home}/token", tok)
                v.write_text(f"{acct.hf_home}/stored_tokens", f"[sparkops]\nhf_token = {tok}\n\n")
            self.filesystems[node] = v
        return v

    def proc_table(self, node: str) -> ProcTable:
        """The node's processes (they outlive the SSH channel that started them)."""
        t = self.proc_tables.get(node)
        if t is None:
            t = ProcTable(node, self.now, first_pid=48_211 + 1_733 * self.nodes[node].index)
            self.proc_tables[node] = t
        return t

    def seed_model(self, node: str, repo: str) -> None:
        """Put a whole model in the node's HF cache (blobs, refs/main, snapshot links)."""
        spec = MODELS[repo]
        fs = self.fs(node)
        base = self.model_dir(node, repo)
        rev = repo_revision(repo)
        for d in ("blobs", "refs", f"snapshots/{rev}"):
            fs.mkdir(f"{base}/{d}", parents=True)
        fs.write_text(f"{base}/refs/main", rev)
        for f in repo_files(spec):
            fs.put_blob(f"{base}/blobs/{f.sha256}", f.size, f.sha256)
            link = f"{base}/snapshots/{rev}/{f.path}"
            if fs.lookup(link, follow=False) is None:
                fs.symlink(f"../../blobs/{f.sha256}", link)
        self.nodes[node].models[repo] = spec.disk_bytes

    # -- basics --
    def now(self) -> float:
        return self.clock.now()

    @property
    def head(self) -> SimNode:
        return next(iter(self.nodes.values()))

    def node(self, name: str) -> SimNode:
        return self.nodes[name]

    def node_by_ip(self, ip: str) -> SimNode | None:
        for n in self.nodes.values():
            if ip in n.ips() and not ip.startswith(("127.", "172.17.")):
                return n
        return None

    def reachable(self, src: SimNode, ip: str, t: float | None = None) -> SimNode | None:
        """The node at ``ip`` if ``src`` can reach it now (fast link up, node not lost)."""
        t = self.now() if t is None else t
        dst = self.node_by_ip(ip)
        if dst is None or dst.lost(t):
            return None
        if ip in (dst.fast_ip, dst.fast_ip2) and not (src.port1_up and dst.port1_up):
            return None
        return dst

    @property
    def layout(self) -> str:
        """How the fast link is addressed (:data:`LAYOUTS`); setting it re-addresses every node."""
        return self._layout

    @layout.setter
    def layout(self, value: str) -> None:
        if value not in LAYOUTS:
            raise ValueError(f"unknown layout {value!r}: choose one of {', '.join(LAYOUTS)}")
        self._layout = value
        address_nodes(self.nodes.values(), value)

    # -- containers --
    def containers_on(self, node: str) -> list[Container]:
        return [c for c in self.containers if c.node == node]

    def container(self, node: str, name_or_id: str) -> Container | None:
        for c in reversed(self.containers):
            if c.node == node and (c.name == name_or_id or (len(name_or_id) >= 4 and c.id.startswith(name_or_id))):
                return c
        return None

    def add_container(self, c: Container) -> Container:
        self.containers.append(c)
        return c

    def remove_container(self, c: Container) -> None:
        self.containers.remove(c)

    def engines_on(self, node: str) -> list[EngineRun]:
        return [c.engine for c in self.containers if c.engine is not None and c.node == node]

    def all_engines(self) -> list[tuple[Container, EngineRun]]:
        return [(c, c.engine) for c in self.containers if c.engine is not None]

    def engine_on_port(self, node: str, port: int, t: float) -> EngineRun | None:
        for c in self.containers:
            e = c.engine
            if c.node == node and e is not None and e.port == port and c.running(t) and e.is_ready(t):
                return e
        return None

    def port_taken(self, node: str, port: int, t: float) -> bool:
        for c in self.containers:
            e = c.engine
            if c.node == node and e is not None and e.port == port and c.running(t) and not e.ended(t):
                return True
        return False

    # -- memory --
    def _holders_on(self, node: str) -> list[Holder]:
        out = [h for h in self.holders if h.node == node]
        for c in self.containers:
            if c.engine is not None:
                out.extend(h for h in c.engine.holders if h.node == node)
        return out

    def apps_bytes(self, node: str, t: float, exclude: EngineRun | None = None) -> float:
        total = 0.0
        for h in self._holders_on(node):
            if exclude is not None and h in exclude.holders:
                continue
            total += h.bytes_at(t)
        for c in self.containers:
            if c.node == node and c.running(t):
                total += c.host_rss
        return total

    def cache_bytes_raw(self, node: str, t: float) -> float:
        n = self.nodes[node]
        last_drop = max((d for d in n.drop_times if d <= t), default=None)
        base = PAGE_CACHE_BASE if last_drop is None else PAGE_CACHE_FLOOR
        total = float(base)
        for r in self.cache_ramps:
            if r.node != node or r.t0 > t:
                continue
            lo = r.t0 if last_drop is None else max(r.t0, last_drop)
            if r.path and n.evictions:
                # a file of the ramp's folder evicted: the ramp's pages counted from then on (one
                # ramp stands for a whole model's files; the wizard evicts them all at once)
                inside = r.path.rstrip("/") + "/"
                lo = max([lo, *(te for te, f in n.evictions if te <= t and f.startswith(inside))])
            hi = min(t, r.stop)
            if hi <= lo:
                continue
            span = max(r.t1 - r.t0, 1e-9)
            total += r.nbytes * (hi - lo) / span
        return total

    def memory(self, node: str, t: float | None = None) -> MemSnapshot:
        t = self.now() if t is None else t
        os_used = OS_BASE + int(0.04 * GIB * noise(self.seed, node + "os", t, 7.0))
        apps = int(self.apps_bytes(node, t))
        used = min(MEM_TOTAL - MIN_FREE, os_used + apps)
        room = max(0, MEM_TOTAL - MIN_FREE - used)
        cache_total = int(min(self.cache_bytes_raw(node, t), room))
        buffers = min(cache_total, int(0.012 * cache_total) + 38 * MIB)
        cached = cache_total - buffers
        free = max(0, MEM_TOTAL - used - cache_total)
        reclaim = max(0, cache_total - min(cache_total // 2, 300 * MIB))
        available = max(0, min(MEM_TOTAL, free + reclaim))
        gpu = [(h, int(h.bytes_at(t))) for h in self._holders_on(node) if h.gpu and h.bytes_at(t) > 0]
        return MemSnapshot(MEM_TOTAL, free, available, cached, buffers, apps, gpu)

    def mark_lost(self, node: str, t: float | None = None) -> None:
        """``node`` stops answering at ``t`` (default now); TP engines spanning it hang on NCCL and die
        when the collective's timeout runs out (see :func:`sparkconsole.sim.vllm_logs.worker_lost`)."""
        t = self.now() if t is None else t
        n = self.nodes[node]
        self.proc_table(node).kill_all()  # a lost node runs nothing any more
        if n.lost_at is not None and n.lost_at <= t:
            return
        n.lost_at = t
        for listener in list(self.lost_listeners):
            listener(self, node, t)

    def reboot(self, node: str, next_pid: int | None = None) -> None:
        """``node`` restarts now: every process ends, the boot id changes, uptime starts at 0 and pids
        count up from the start again (``next_pid``: the first pid handed out, so a test can make a
        stranger take a job's pid, as happens after a real reboot). Files on disk stay."""
        n = self.nodes[node]
        table = self.proc_table(node)
        table.kill_all()
        table.procs.clear()  # a reboot leaves no process behind, not even one still unwinding
        table.restart_pids(next_pid)
        n.boots += 1
        n.boot_uptime = -self.now()

    def boot_id(self, node: str) -> str:
        """``/proc/sys/kernel/random/boot_id``: a random UUID the kernel makes at each boot."""
        n = self.nodes[node]
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"sparkconsole-sim/{n.name}/{n.index}/boot/{n.boots}"))

    def evict(self, node: str, path: str, t: float | None = None) -> None:
        """``dd if=PATH iflag=nocache count=0``: the file's pages leave the page cache (no root needed)."""
        self.nodes[node].evictions.append((self.now() if t is None else t, path))

    def drop_caches(self, node: str, t: float | None = None) -> None:
        self.nodes[node].drop_times.append(self.now() if t is None else t)

    # -- disk / models / images --
    def model_bytes(self, node: str, repo: str, t: float | None = None) -> int:
        """Bytes of ``repo`` in the node's HF cache now (whole and partial blobs)."""
        fs = self.fs(node)
        base = self.model_dir(node, repo) + "/blobs"
        try:
            names = fs.listdir(base)
        except FsError:
            return 0
        total = 0
        for n in names:
            ent = fs.lookup(f"{base}/{n}", follow=False)
            if ent is not None and ent.kind == "file":
                total += ent.nbytes()
        return total

    def model_files_ok(self, node: str, repo: str, path: str | None = None) -> list[str]:
        """The repo's files missing or short under ``path`` (default: its HF cache snapshot)."""
        spec = MODELS[repo]
        fs = self.fs(node)
        base = path or f"{self.model_dir(node, repo)}/snapshots/{repo_revision(repo)}"
        bad = []
        for f in repo_files(spec):
            ent = fs.lookup(f"{base}/{f.path}", follow=True)
            if ent is None or ent.kind != "file" or ent.nbytes() != f.size:
                bad.append(f.path)
        return bad

    def has_model(self, node: str, repo: str, t: float | None = None) -> bool:
        if repo not in MODELS:
            return False
        return not self.model_files_ok(node, repo)

    def images_on(self, node: str, t: float | None = None) -> dict[str, Image]:
        t = self.now() if t is None else t
        out = dict(self.nodes[node].images)
        for tr in self.transfers:
            if tr.dst == node and tr.kind == "image" and tr.complete(t):
                out[tr.what] = IMAGES[tr.what]
        return out

    def image_id(self, node: str, img: Image, t: float | None = None) -> str:
        """``img``'s ID on ``node`` (``docker images``' IMAGE ID, ``.Id``). Docker's overlay2 store
        names an image by its config's digest, the same on every node; the containerd image store
        (Docker 29's default) by what it stored, so an image that came by ``docker save | docker
        load`` gets another ID than on the node it was saved on, over the same layers
        (``RootFS.Layers``) [moby#48401, moby#47674, docker/cli#6670]."""
        if self.image_store != "containerd":
            return img.id
        t = self.now() if t is None else t
        came = [tr for tr in self.transfers if tr.kind == "image" and tr.dst == node and tr.what == img.ref
                and tr.complete(t)]
        if came and came[-1].src is not None:  # the name now points at what the load stored
            return stable_hex(64, "image", img.ref, "loaded")
        return img.id

    def disk_used(self, node: str, t: float | None = None) -> int:
        t = self.now() if t is None else t
        used = DISK_OS_USED + self.nodes[node].disk_extra + sum(i.size_bytes for i in self.images_on(node, t).values())
        fs = self.filesystems.get(node)
        if fs is not None:
            used += sum(e.nbytes() for p, e in fs.entries.items() if e.kind == "file")
        return used

    # -- gpu telemetry --
    def engine_activity(self, c: Container, node: str, t: float) -> float:
        """0..1: how busy one container's engine keeps the GPU of ``node``."""
        e = c.engine
        if e is None or not c.running(t) or node not in (e.nodes or (c.node,)):
            return 0.0
        if e.is_ready(t):
            if e.activity > 0:
                k = math.floor((t - e.ready_at) / 10.0) if e.ready_at is not None else 0
                if _hash01("slot", e.model, e.started, k) < e.activity:
                    return 0.55 + 0.35 * (noise(self.seed, node + e.model, t, 2.0) + 1) / 2
            return 0.0
        return 0.0 if e.ended(t) else 0.25  # loading / profiling / compiling

    def gpu_activity(self, node: str, t: float) -> float:
        """0..1: how busy the GPU is (loading, profiling, capturing graphs, serving)."""
        act = sum(self.engine_activity(c, node, t) for c in self.containers)
        return max(0.0, min(1.0, act))

    def gpu_util(self, node: str, t: float | None = None) -> int:
        t = self.now() if t is None else t
        if self.gpu_activity(node, t) <= 0:
            return 0
        return round(100 * self.gpu_activity(node, t))

    def _smoothed_activity(self, node: str, t: float) -> float:
        samples = [self.gpu_activity(node, t - d) for d in (0, 5, 15, 30, 60, 90)]
        return sum(samples) / len(samples)

    def gpu_temp(self, node: str, t: float | None = None) -> int:
        t = self.now() if t is None else t
        a = self._smoothed_activity(node, t)
        return round(40 + 31 * a + 1.2 * noise(self.seed, node + "temp", t, 9.0))

    def gpu_power(self, node: str, t: float | None = None) -> float:
        t = self.now() if t is None else t
        a = self.gpu_activity(node, t)
        base = 3.7 + 0.5 * (noise(self.seed, node + "pw", t, 3.0) + 1) / 2
        return round(base + 48.0 * a, 2)

    def gpu_clock(self, node: str, t: float | None = None) -> int:
        t = self.now() if t is None else t
        a = self.gpu_activity(node, t)
        if a <= 0:
            return 208
        return int(2405 + 80 * noise(self.seed, node + "clk", t, 2.0))

    def pstate(self, node: str, t: float | None = None) -> str:
        t = self.now() if t is None else t
        return "P0" if self.gpu_activity(node, t) > 0 else "P8"

    def load_avg(self, node: str, t: float | None = None) -> tuple[float, float, float]:
        t = self.now() if t is None else t
        n = 0.3 + 0.2 * noise(self.seed, node + "load", t, 5.0)
        busy = sum(1 for c in self.containers if c.node == node and c.running(t))
        act = self.gpu_activity(node, t)
        one = max(0.0, n + 0.6 * busy + 3.0 * act)
        return (round(one, 2), round(one * 0.9 + 0.1, 2), round(one * 0.8 + 0.15, 2))

    def uptime(self, node: str, t: float | None = None) -> float:
        t = self.now() if t is None else t
        return self.nodes[node].boot_uptime + t

    # -- ray --
    def ray_members(self, t: float | None = None) -> list[RayMember]:
        t = self.now() if t is None else t
        if self.ray is None:
            return []
        out = []
        for m in self.ray.members.values():
            if m.since > t or self.nodes[m.node].lost(t):
                continue
            if m.container is not None:
                c = self.container(m.node, m.container)
                if c is None or not c.running(t):
                    continue
            out.append(m)
        return out

    def ray_gpus_used(self, t: float | None = None) -> float:
        t = self.now() if t is None else t
        used = 0.0
        for _c, e in self.all_engines():
            if e.tp * e.pp > 1 and not e.ended(t) and e.started <= t and len(e.nodes) > 1:
                used += e.tp * e.pp
        return used

    # -- snapshot of everything (tests) --
    def summary(self, t: float | None = None) -> dict[str, Any]:
        t = self.now() if t is None else t
        out: dict[str, Any] = {}
        for name in self.nodes:
            m = self.memory(name, t)
            out[name] = {
                "mem_total": m.total, "mem_available": m.available, "mem_free": m.free,
                "cached": m.cached, "gpu_util": self.gpu_util(name, t),
                "containers": [(c.name, c.state(t)) for c in self.containers_on(name)],
            }
        return out
