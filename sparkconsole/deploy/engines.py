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

MODULES = ("vllm", "transformers", "torch", "sglang")


def engine_program(architectures: tuple[str, ...]) -> str:
    """The Python the image runs: one line per fact, nothing else (so any Python 3 can run it)."""
    for a in architectures:
        if not re.fullmatch(r"[A-Za-z0-9_]{1,128}", a):
            raise ValueError(f"not an architecture name: {a!r}")
    lines = ["import importlib"]
    lines.append(f"for m in {MODULES!r}:")
    lines.append("    try:")
    lines.append("        print(m, importlib.import_module(m).__version__)")
    lines.append("    except Exception:")
    lines.append("        print(m, '-')")
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
    """What one image said: module versions (None: not importable) and architecture support."""

    image: str
    versions: dict[str, str | None] = field(default_factory=dict)
    archs: dict[str, bool | None] = field(default_factory=dict)
    error: str = ""

    @property
    def vllm(self) -> str | None:
        return self.versions.get("vllm")

    def knows(self, arch: str) -> bool | None:
        return self.archs.get(arch)


def parse_engine_output(image: str, text: str, rc: int | None) -> EngineFacts:
    f = EngineFacts(image=image)
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in MODULES:
            f.versions[parts[0]] = None if parts[1] == "-" else parts[1]
        elif len(parts) == 3 and parts[0] == "arch":
            f.archs[parts[1]] = {"yes": True, "no": False}.get(parts[2])
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
    engine: str  # vllm | sglang
    version: str
    archs: tuple[str, ...]
    note: str

    def __post_init__(self) -> None:
        validate_image(self.ref)


QWEN35 = ("Qwen3_5MoeForConditionalGeneration", "Qwen3_5ForConditionalGeneration")
# Newest first. The vLLM >= 0.16 builds know Qwen3.5; NVIDIA's 26.03 container logs vLLM 0.17.1.
KNOWN_IMAGES: tuple[KnownImage, ...] = (
    KnownImage("vllm/vllm-openai:v0.17.0", "vllm", "0.17.0", QWEN35,
               "upstream vLLM 0.17.0 with sm_121 (GB10); loads Qwen3.5-122B-A10B-FP8 at TP=2"),
    KnownImage("nvcr.io/nvidia/vllm:26.03-py3", "vllm", "0.17.1", QWEN35,
               "NVIDIA's GB10 build (vLLM 0.17.1); has Ray"),
    KnownImage("lmsysorg/sglang:v0.5.9-cu130", "sglang", "0.5.9", QWEN35,
               "experimental on Spark: validated at --mem-fraction-static 0.70; two-node NCCL start may hang"),
)


def known(ref: str) -> KnownImage | None:
    return next((k for k in KNOWN_IMAGES if k.ref == ref), None)


def version_tuple(v: str | None) -> tuple[int, ...]:
    if not v:
        return ()
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])
