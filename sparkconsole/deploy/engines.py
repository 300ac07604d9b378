"""Engines and images: what an image's own Python says it can serve, and the images known to work.

Before 119 GB move, the wizard runs the image's Python once (``docker run --rm --entrypoint
python3 IMAGE -c PROGRAM``) and reads its vLLM / transformers / torch / SGLang versions and whether
vLLM's model registry knows the model's architecture. The story's vLLM 0.14 image does not know
``Qwen3_5MoeForConditionalGeneration`` (it arrived in 0.16; deploy-failures.md §7), 0.17 does.

:data:`KNOWN_IMAGES` is the bundled list of images known to run on GB10, with the version each
carries and the architectures it was seen to serve; the operator can name any other image.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sparkconsole.remote import validate_image
from sparkconsole.serving.engines import SGLANG, VLLM, EngineKind, for_image

# ``fastsafetensors``: vLLM's ``--load-format fastsafetensors`` needs it in the image (one operator's load
# went from 9 minutes to 2; mmap loading died at 73-97 % under page-cache pressure: engines-gb10.md)
MODULES = ("vllm", "transformers", "torch", "sglang", "ray", "fastsafetensors")
CLIS = ("hf", "ray", "vllm")  # the image's commands the flow may name as an entrypoint


def engine_program(architectures: tuple[str, ...]) -> str:
    """The Python the image runs: one line per fact, nothing else (so any Python 3 can run it).

    Besides the module versions and the registry's verdict it prints what only a GPU run shows:
    ``cuda`` (``torch.version.cuda``: a CUDA 12 build of vLLM fails on GB10 with "no kernel image
    is available", vllm#30855), ``device`` (the GPU's compute capability, 12.1 on GB10) and
    ``archs`` (``torch.cuda.get_arch_list()``, empty without a GPU), and which of :data:`CLIS`
    the image has on its PATH (NGC 26.05 has no ``ray``; ``hf`` downloads where the host has none)."""
    for a in architectures:
        if not re.fullmatch(r"[A-Za-z0-9_]{1,128}", a):
            raise ValueError(f"not an architecture name: {a!r}")
    lines = ["import importlib, shutil"]
    lines.append(f"for m in {MODULES!r}:")
    lines.append("    try:")
    lines.append("        print(m, importlib.import_module(m).__version__)")
    lines.append("    except Exception:")
    lines.append("        print(m, '-')")
    lines.append(f"for c in {CLIS!r}:")
    lines.append("    print('cli', c, shutil.which(c) or '-')")
    lines.append("try:")
    lines.append("    import torch")
    lines.append("    print('cuda', torch.version.cuda or '-')")
    lines.append("    if torch.cuda.is_available():")
    lines.append("        print('device', '%d.%d' % torch.cuda.get_device_capability())")
    lines.append("    print('archs', ' '.join(torch.cuda.get_arch_list()) or '-')")
    lines.append("except Exception:")
    lines.append("    print('cuda', '-')")
    lines.append("known = None")
    lines.append("try:")
    lines.append("    from vllm.model_executor.models import ModelRegistry")
    lines.append("    known = set(ModelRegistry.get_supported_archs())")
    lines.append("except Exception:")
    lines.append("    try:")
    lines.append("        from sglang.srt.models.registry import ModelRegistry")
    lines.append("        known = set(ModelRegistry.get_supported_archs())")
    lines.append("    except Exception:")
    lines.append("        pass")
    lines.append(f"for a in {tuple(architectures)!r}:")
    lines.append("    print('arch', a, '-' if known is None else ('yes' if a in known else 'no'))")
    return "\n".join(lines) + "\n"


@dataclass
class EngineFacts:
    """What one image said: module versions (None: not importable), its commands, its CUDA build
    and the GPU it ran on, and architecture support."""

    image: str
    versions: dict[str, str | None] = field(default_factory=dict)
    archs: dict[str, bool | None] = field(default_factory=dict)
    error: str = ""
    clis: dict[str, str | None] = field(default_factory=dict)  # command -> its path in the image, None: absent
    cuda: str | None = None  # torch.version.cuda
    device: str | None = None  # the GPU's compute capability ("12.1"), None when no GPU was given
    cuda_archs: tuple[str, ...] = ()  # torch.cuda.get_arch_list()
    # True: what the image's name says (:func:`expected_facts`), its own Python not run (read-only,
    # plan-only, or not yet): a guess the decision may go by, never a verification
    expected: bool = False

    def to_json(self) -> dict:
        """What the plan keeps of it (``engine_checks[image]``, read by the cluster and weights steps)."""
        out: dict = {"versions": self.versions, "archs": self.archs, "error": self.error, "clis": self.clis,
                     "cuda": self.cuda, "device": self.device, "cuda_archs": list(self.cuda_archs)}
        if self.expected:
            out["expected"] = True
        return out

    @classmethod
    def from_json(cls, image: str, d: dict) -> EngineFacts:
        return cls(image=image, versions=dict(d.get("versions") or {}), archs=dict(d.get("archs") or {}),
                   error=str(d.get("error") or ""), clis=dict(d.get("clis") or {}), cuda=d.get("cuda"),
                   device=d.get("device"), cuda_archs=tuple(d.get("cuda_archs") or ()),
                   expected=bool(d.get("expected")))

    @property
    def vllm(self) -> str | None:
        return self.versions.get("vllm")

    def knows(self, arch: str) -> bool | None:
        return self.archs.get(arch)

    def has(self, cli: str) -> bool | None:
        """The image has ``cli`` on its PATH (None: not asked, an older check)."""
        if cli not in self.clis:
            return None
        return self.clis[cli] is not None

    def gpu_verdict(self) -> str | None:
        """Why this build cannot run kernels on the GPU it ran on, or None when it can (or no GPU
        was given). A cubin built for sm_XY runs on sm_XZ with Z >= Y (same major); PTX
        (``compute_XY``) is compiled for any newer GPU. So GB10 (12.1) needs sm_120/sm_121 or PTX
        of 12.x or older in ``get_arch_list()``; a CUDA 12.8 torch without them fails with "no
        kernel image is available for execution on the device" (vllm#30855)."""
        if not self.device or not self.cuda_archs:
            return None
        major, minor = (int(x) for x in self.device.split(".")[:2])
        for a in self.cuda_archs:
            m = re.fullmatch(r"(sm|compute)_(\d+)(\d)[a-z]?", a)
            if not m:
                continue
            amaj, amin = int(m.group(2)), int(m.group(3))
            if (m.group(1) == "sm" and amaj == major and amin <= minor) or \
                    (m.group(1) == "compute" and (amaj, amin) <= (major, minor)):
                return None
        return (f"its torch (CUDA {self.cuda or '?'}) has no kernels for this GPU (sm_{major}{minor}): built for "
                f"{' '.join(self.cuda_archs)}; a Blackwell build (a -cu130 tag, an NGC image) has them")


def parse_engine_output(image: str, text: str, rc: int | None) -> EngineFacts:
    f = EngineFacts(image=image)
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in MODULES:
            f.versions[parts[0]] = None if parts[1] == "-" else parts[1]
        elif len(parts) == 3 and parts[0] == "arch":
            f.archs[parts[1]] = {"yes": True, "no": False}.get(parts[2])
        elif len(parts) == 3 and parts[0] == "cli" and parts[1] in CLIS:
            f.clis[parts[1]] = None if parts[2] == "-" else parts[2]
        elif len(parts) == 2 and parts[0] == "cuda":
            f.cuda = None if parts[1] == "-" else parts[1]
        elif len(parts) == 2 and parts[0] == "device" and re.fullmatch(r"\d+\.\d+", parts[1]):
            f.device = parts[1]
        elif len(parts) >= 2 and parts[0] == "archs":
            f.cuda_archs = () if parts[1:] == ["-"] else tuple(parts[1:])
    if rc != 0 or not f.versions:
        f.error = (text.strip().splitlines() or [f"exit {rc}"])[-1][:300]
    return f


# NGC's vLLM containers (nvcr.io/nvidia/vllm:YY.MM-py3) and the vLLM each release ships, from NVIDIA's
# release notes: the tag is the container's release, not vLLM's version (26.03 is vLLM 0.17.1).
NGC_VLLM_RELEASES = {"25.10": "0.10.2", "26.01": "0.11.1", "26.03": "0.17.1", "26.05": "0.20.1"}


def version_from_ref(ref: str) -> str | None:
    """The vLLM version an image's name says without starting it, or None when it says none.

    An NGC vLLM tag is a release (``26.05-py3`` → 0.20.1, by :data:`NGC_VLLM_RELEASES`); another
    image's tag counts only when the repository is a vLLM one and the tag looks like a vLLM version
    (``v0.19.1-cu130``): ``sparkconsole-lab/ray:2.60.0`` is Ray's version, not vLLM 2.60."""
    repo, _, tag = ref.rpartition(":")
    if not repo or "/" in tag:
        return None
    if repo.endswith("nvcr.io/nvidia/vllm"):
        return NGC_VLLM_RELEASES.get(re.sub(r"-py3$", "", tag))
    if "vllm" not in repo.rsplit("/", 1)[-1]:
        return None
    m = re.match(r"v?(0\.\d+(?:\.\d+)?)(?:$|[-+.])", tag)
    return m.group(1) if m else None


@dataclass(frozen=True)
class KnownImage:
    ref: str
    engine: EngineKind
    version: str
    archs: tuple[str, ...]
    note: str
    ray: bool | None = None  # the image has Ray (None: not known)

    def __post_init__(self) -> None:
        validate_image(self.ref)


QWEN35 = ("Qwen3_5MoeForConditionalGeneration", "Qwen3_5ForConditionalGeneration")
# Newest first; Blackwell (CUDA 13) builds only: up to vLLM 0.19 the plain vllm/vllm-openai tags are
# CUDA 12.9 builds and vLLM's recipe for Blackwell names the -cu130 tags (from 0.20 the plain tag is CUDA
# 13); NVIDIA's playbooks use NGC images. A CUDA 12.8 build failed on GB10 with "no kernel image is
# available" (vllm#30855). The vLLM >= 0.16 builds know Qwen3.5.
KNOWN_IMAGES: tuple[KnownImage, ...] = (
    KnownImage("nvcr.io/nvidia/vllm:26.05-py3", VLLM, "0.20.1", QWEN35,
               "NVIDIA's GB10 build (vLLM 0.20.1, CUDA 13); no Ray: vLLM's native multi-node", ray=False),
    KnownImage("nvcr.io/nvidia/vllm:26.03-py3", VLLM, "0.17.1", QWEN35,
               "NVIDIA's GB10 build (vLLM 0.17.1, CUDA 13); has Ray", ray=True),
    KnownImage("vllm/vllm-openai:v0.17.0-cu130", VLLM, "0.17.0", QWEN35,
               "upstream vLLM 0.17.0, CUDA 13 build (Blackwell); has Ray; loads Qwen3.5-122B-A10B-FP8 at TP=2",
               ray=True),
    KnownImage("lmsysorg/sglang:v0.5.9-cu130", SGLANG, "0.5.9", QWEN35,
               "experimental on Spark: validated at --mem-fraction-static 0.70; two-node NCCL start may hang"),
)


# Why an upstream vLLM image is never recommended on a GB10 (sm_121), in the field's words: vLLM's own
# kernels (CUTLASS block-FP8 GEMM, MoE, attention) are compiled apart from torch's, and upstream builds
# lack the 12.1a targets. Block-FP8 GEMM returns "Error Internal" from cutlass_gemm_caller.cuh
# (vllm#43367; vllm#40758 with Qwen3.6-35B-A3B-FP8), and a stock cu130 nightly ran Qwen3.5-35B-A3B-FP8
# at 13.3 tok/s against 48.6 once rebuilt with native SM121 kernels (NVIDIA developer forum, "DGX Spark:
# 13 -> 49 tok/s ... Native SM121 Kernel Build Guide"). torch's arch list (sm_120) says nothing of them.
UPSTREAM_ON_GB10 = ("an upstream vLLM build: its own kernels lack GB10's sm_121 targets (block-FP8 GEMM fails "
                    "with 'Error Internal', vllm#43367, #40758; 13 tok/s where a native SM121 build ran 49)")
# registries whose vLLM images are built for GB10: NVIDIA's NGC images ship vLLM built for CUDA 13 and
# Blackwell incl. GB10 (NVIDIA's DGX Spark playbooks run them)
GB10_REGISTRIES = ("nvcr.io/nvidia/vllm",)
UPSTREAM_REPOS = ("vllm/vllm-openai", "docker.io/vllm/vllm-openai")


def is_gb10(gpu_name: str | None) -> bool:
    """A GB10 (DGX Spark) by the GPU's name as nvidia-smi prints it ("NVIDIA GB10")."""
    return bool(gpu_name) and "GB10" in str(gpu_name).upper()


def gb10_build(ref: str) -> bool | None:
    """Whether an image carries vLLM's kernels for GB10: True for NVIDIA's NGC vLLM images, False for
    an upstream ``vllm/vllm-openai`` tag (:data:`UPSTREAM_ON_GB10`), None when its name does not say
    (a community build: its recipe or its canary tells)."""
    repo = ref.rpartition(":")[0] if ":" in ref.rsplit("/", 1)[-1] else ref
    if repo in GB10_REGISTRIES:
        return True
    if repo in UPSTREAM_REPOS:
        return False
    return None


# what an engine says when its build lacks kernels for the GPU: CUTLASS's status string for the block-FP8
# GEMM on sm_121 (cutlass_gemm_caller.cuh, "RuntimeError: Error Internal": vllm#40758, vllm#43367) and
# CUDA's own for a binary with no code for the device
KERNEL_FAILURES = ("Error Internal", "no kernel image is available")


def is_kernel_failure(line: str) -> bool:
    """Whether an engine's error line says its build has no working kernels for this GPU."""
    return any(k in line for k in KERNEL_FAILURES)


def known(ref: str) -> KnownImage | None:
    return next((k for k in KNOWN_IMAGES if k.ref == ref), None)


# The vLLM release that first registers an architecture (vLLM's registry only grows): an image's
# version, read from its name, then says yes or no without running it. Qwen3.5 arrived in 0.16
# (deploy-failures.md §7: the story's 0.14 image refuses it).
ARCH_SINCE_VLLM = {"Qwen3_5MoeForConditionalGeneration": "0.16", "Qwen3_5ForConditionalGeneration": "0.16"}


def expected_facts(ref: str, architectures: tuple[str, ...] | list[str]) -> EngineFacts:
    """What an image's name says it can do, without running it (``expected``): the version from a
    known image or its tag (:func:`version_from_ref`), the architectures a known image was seen to
    serve or that its vLLM version registers (:data:`ARCH_SINCE_VLLM`), Ray as the known list says.
    ``hf`` is expected in any vLLM or SGLang image: both depend on huggingface_hub, whose CLI is
    ``hf`` (the sim's images and the captured ones have it). Used where running the image is not
    allowed (read-only, plan-only) or has not happened yet; the engine step's own check replaces it."""
    k = known(ref)
    engine = k.engine if k is not None else (for_image(ref) or VLLM)
    sglang = engine is SGLANG
    f = EngineFacts(image=ref, expected=True)
    version = k.version if k is not None else None if sglang else version_from_ref(ref)
    f.versions[engine.version_module or engine.name] = version
    for a in architectures:
        if k is not None and a in k.archs:
            f.archs[a] = True
        elif not sglang and version and a in ARCH_SINCE_VLLM:
            f.archs[a] = version_tuple(version) >= version_tuple(ARCH_SINCE_VLLM[a])
        else:
            f.archs[a] = None
    f.clis["hf"] = "hf"
    if engine.entrypoint in CLIS:
        f.clis[engine.entrypoint] = engine.entrypoint
    if k is not None and k.ray is not None:
        f.clis["ray"] = "ray" if k.ray else None
    return f


def version_tuple(v: str | None) -> tuple[int, ...]:
    if not v:
        return ()
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])
