"""The canary's miniature on a simulated Spark: its writer, run by an image's ``python3 -``, and the
model folder it leaves, served by the simulated vLLM.

The real writer is a stdlib program piped into the image's Python; this node cannot run Python, so it
recognises that program by its protocol (the ``::miniature::`` event lines it prints, the writer's
``make_miniature``) and does what it does to the files: reads ``SRC/config.json``, refuses a
``model_type`` it has no family for (one line, exit 2), writes a shrunk ``config.json``, the
safetensors shards and the tokenizer files into ``OUT``, printing one event line per phase. The
figures are the real writer's, measured (``tests/fixtures/miniature/miniature_gpu_report.json``,
written on an H100 by ``benchmarks/miniature_gpu.py``): nothing here runs the product's code.

The served side (:func:`local_model`) reads a model folder as vLLM does: ``config.json`` for the
architecture, the layer kinds and the quantization, the safetensors files for the weights' size.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sparkconsole.sim.model import MODELS, ModelSpec
from sparkconsole.sim.vfs import FsError

EVENT_PREFIX = "::miniature::"  # the writer's event lines (the protocol between it and the console)


def is_writer(program: str) -> bool:
    """Whether ``program`` is the canary's miniature writer (by its protocol, not its bytes)."""
    return EVENT_PREFIX in program and "def make_miniature" in program


@dataclass(frozen=True)
class Family:
    """What the real writer makes of one model family (its measured output)."""

    model_type: str
    tensors: int
    shard_bytes: tuple[int, ...]  # each file's size
    fp8: bool
    config: dict[str, object]  # the shrunk config's keys the simulated vLLM reads


# the architectures the real writer has families for (its FAMILIES: qwen3_5_moe, qwen3, qwen3_moe)
_BY_ARCH = {
    # 4,698 tensors, 435,540,840 bytes in 2 shards (the H100 report; the split between the two is this
    # twin's, under the writer's shard limit); layer 0 Gated DeltaNet, layer 1 full attention, FP8 128x128
    # blocks kept
    "Qwen3_5MoeForConditionalGeneration": Family(
        "qwen3_5_moe", 4698, (268_433_112, 167_107_728), True,
        {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
         "text_config": {"num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"],
                         "hidden_size": 256, "num_experts": 256, "num_experts_per_tok": 8,
                         "max_position_embeddings": 262144},
         "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128],
                                 "activation_scheme": "dynamic"}}),
    # 25 tensors, 166,858,240 bytes, one file (the H100 report)
    "Qwen3ForCausalLM": Family(
        "qwen3", 25, (166_858_240,), False,
        {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": 2,
         "hidden_size": 256, "max_position_embeddings": 40960}),
}
_TYPES = ("qwen3", "qwen3_5_moe", "qwen3_moe")
_ARCH_TYPE = {"Glm4MoeLiteForCausalLM": "glm4_moe_lite", "Qwen3MoeForCausalLM": "qwen3_moe",
              "LlamaForCausalLM": "llama"}
SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "vocab.json", "merges.txt",
              "special_tokens_map.json", "chat_template.jinja")
WRITE_BPS = 220e6  # the H100 run wrote 435.5 MB in ~2 s


def _repo_of(src: str) -> str | None:
    """``…/hub/models--OWNER--NAME/snapshots/REV`` → ``OWNER/NAME``: the cache's own layout."""
    for part in src.split("/"):
        if part.startswith("models--") and part.count("--") >= 2:
            owner, _, name = part[len("models--"):].partition("--")
            return f"{owner}/{name}"
    return None


async def run_writer(shell, argv: list[str], io) -> int:
    """``python3 - SRC OUT [...]`` with the writer on stdin, in a container."""
    args = [a for a in argv[2:] if not a.startswith("--")]
    if len(args) < 2:
        io.err("usage: miniature_writer [-h] [--hidden HIDDEN] [--moe MOE] [--shared SHARED] [--dense DENSE] "
               "[--shard-mb SHARD_MB] [--seed SEED] src out\nminiature_writer: error: the following arguments are "
               "required: src, out\n")
        return 2
    src, out = (a.rstrip("/") for a in args[:2])
    fs = shell.fs
    await shell.clock.sleep(0.4)  # the image's Python starting
    if fs.lookup(f"{src}/config.json") is None:
        io.err(f"miniature: error: no config.json at {src}/config.json\n")
        return 2
    try:  # the config's own architecture (a --local-dir download), else the cache folder's repository
        cfg = json.loads(fs.read_text(f"{src}/config.json"))
        arch = str(cfg["architectures"][0])
    except (FsError, ValueError, KeyError, IndexError, TypeError):
        spec = MODELS.get(_repo_of(src) or "")
        arch = spec.architecture if spec else "LlamaForCausalLM"
    fam = _BY_ARCH.get(arch)
    if fam is None:
        io.err(f"miniature: error: unknown model_type {_ARCH_TYPE.get(arch, 'llama')!r}: the miniature writer "
               f"knows {', '.join(_TYPES)}\n")
        return 2
    total = sum(fam.shard_bytes)

    def emit(phase: str, **data: object) -> None:
        io.out(f"{EVENT_PREFIX} {phase} {json.dumps(data, sort_keys=True)}\n")

    emit("config", model_type=fam.model_type, architecture=arch, quantization="fp8" if fam.fp8 else None,
         source=src, layers=2)
    emit("plan", tensors=fam.tensors, bytes=total, files=len(fam.shard_bytes),
         fp8_tensors=(fam.tensors - 50) // 2 if fam.fp8 else 0)
    try:
        fs.mkdir(out, parents=True)
        fs.write_text(f"{out}/config.json", json.dumps(fam.config, indent=2) + "\n")
        names = (["model.safetensors"] if len(fam.shard_bytes) == 1 else
                 [f"model-{i + 1:05d}-of-{len(fam.shard_bytes):05d}.safetensors" for i in range(len(fam.shard_bytes))])
        for name, size in zip(names, fam.shard_bytes, strict=True):
            await shell.clock.sleep(size / WRITE_BPS)
            fs.put_blob(f"{out}/{name}", size, None)
            emit("written", file=name, tensors=fam.tensors // len(names), bytes=size)
        if len(names) > 1:
            fs.write_text(f"{out}/model.safetensors.index.json", json.dumps({"metadata": {"total_size": total}}) + "\n")
        copied = []
        for side in SIDE_FILES:
            ent = fs.lookup(f"{src}/{side}")
            if ent is not None:
                fs.put_blob(f"{out}/{side}", ent.nbytes(), None)
                copied.append(side)
    except FsError as exc:
        io.err(f"miniature: error: [Errno 13] Permission denied: {exc}\n")
        return 2
    emit("copied", files=copied)
    emit("done", dir=out, tensors=fam.tensors, bytes=total, files=names, seconds=round(total / WRITE_BPS, 3))
    return 0


def local_model(fs, path: str) -> ModelSpec | None:
    """A model folder on disk as vLLM reads it (``vllm serve /path``): None when it holds no
    ``config.json`` the simulated vLLM can read."""
    try:
        cfg = json.loads(fs.read_text(f"{path.rstrip('/')}/config.json"))
    except (FsError, ValueError):
        return None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("architectures"), list) or not cfg["architectures"]:
        return None
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    size = 0
    shards = 0
    for name in fs.listdir(path):
        if name.endswith(".safetensors"):
            ent = fs.lookup(f"{path.rstrip('/')}/{name}")
            size += ent.nbytes() if ent is not None else 0
            shards += 1
    q = cfg.get("quantization_config") if isinstance(cfg.get("quantization_config"), dict) else {}
    hybrid = "linear_attention" in (text.get("layer_types") or [])
    arch = str(cfg["architectures"][0])
    return ModelSpec(path, arch, size, shards + 4, max(1, shards), round(size / 2**30 * 1.02, 2),
                     # activations, non-torch memory and CUDA graphs of a two-layer model (GiB)
                     1.1, 480_000.0, int(text.get("max_position_embeddings") or 32768),
                     needs_new_vllm=arch.startswith("Qwen3_5"), hybrid=hybrid,
                     layers=int(text.get("num_hidden_layers") or 2),
                     fp8_block=q.get("quant_method") == "fp8" and bool(q.get("weight_block_size")))
