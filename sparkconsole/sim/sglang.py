"""What a container's Python prints that is not vLLM's server log: the engine check and SGLang.

* :func:`engine_check`: ``docker run --rm --entrypoint python3 IMAGE -c PROGRAM`` where PROGRAM
  imports vllm / transformers / sglang / torch in try blocks and asks vLLM's ``ModelRegistry``
  about architectures. The sim cannot run Python, so it reads the module names (in the order the
  program imports them) and the architecture names (``...For...`` identifiers) from the program
  text and answers from the image catalogue: ``vllm 0.17.0``, ``sglang -`` when not importable,
  ``arch NAME yes|no`` (``-`` in an image without vLLM, whose registry cannot be imported).
* :func:`sglang_launch`: ``python3 -m sglang.launch_server --model-path X --tp 2 --nnodes 2
  --node-rank R --dist-init-addr IP:PORT``. Across nodes the ranks meet at the rendezvous address,
  both log ``CustomAllreduce is disabled because this process group spans across nodes.`` and
  then nothing more (the story's NCCL stall: no readiness, no HTTP port). A lone rank waits at
  ``Init torch distributed begin.``.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING

from sparkconsole.sim.model import Container, Image, LogLine, image_archs

if TYPE_CHECKING:
    from sparkconsole.sim.model import SimCluster

MODULES = ("vllm", "transformers", "sglang", "torch")


def engine_check(img: Image, program: str) -> str:
    order: list[tuple[int, str]] = []
    for m in re.finditer(r"\b(?:from\s+([\w.]+)\s+import|import\s+([\w., ]+))", program):
        names = [m.group(1)] if m.group(1) else [n.strip().split(" ")[0] for n in m.group(2).split(",")]
        for k, n in enumerate(names):
            top = n.split(".")[0]
            if top in MODULES:
                order.append((m.start() + k, top))
    for m in re.finditer(r"""['"](vllm|transformers|sglang|torch)['"]""", program):  # importlib.import_module(m)
        order.append((m.start(), m.group(1)))
    order.sort()
    seen: list[str] = []
    for _pos, mod in order:
        if mod not in seen:
            seen.append(mod)
    versions = {"vllm": img.vllm_version, "transformers": img.transformers, "torch": img.torch,
                "sglang": img.sglang_version}
    lines = [f"{mod} {versions[mod] or '-'}" for mod in seen]
    archs = []
    for name in re.findall(r"\b([A-Z][A-Za-z0-9_]*For(?:CausalLM|ConditionalGeneration|SequenceClassification|"
                           r"MaskedLM|Embedding))\b", program):
        if name not in archs:
            archs.append(name)
    # the program asks vLLM's registry, and SGLang's when there is no vLLM (if it imports it)
    asks_sglang = "sglang.srt.models.registry" in program
    known = image_archs(img) if img.vllm_version or (img.sglang_version and asks_sglang) else None
    lines += [f"arch {a} {'-' if known is None else 'yes' if a in known else 'no'}" for a in archs]
    return "".join(ln + "\n" for ln in lines)


def _opt(argv: list[str], name: str, default: str) -> str:
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return default


def _stamp(cluster: SimCluster, t: float, rank: int | None = None) -> str:
    s = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(cluster.clock.epoch(t)))
    return f"[{s}{'' if rank is None else f' TP{rank}'}]"


def sglang_launch(cluster: SimCluster, ct: Container, argv: list[str], t: float) -> None:
    model = _opt(argv, "--model-path", _opt(argv, "--model", ""))
    tp = int(_opt(argv, "--tp", _opt(argv, "--tp-size", "1")))
    nnodes = int(_opt(argv, "--nnodes", "1"))
    rank = int(_opt(argv, "--node-rank", "0"))
    addr = _opt(argv, "--dist-init-addr", "")
    port = int(_opt(argv, "--port", "30000"))
    host = _opt(argv, "--host", "127.0.0.1")
    ct.host_rss = int(3.1 * 1024**3)
    ct.log.append(LogLine(t + 6.0, f"{_stamp(cluster, t + 6.0)} server_args=ServerArgs(model_path='{model}', "
                          f"tokenizer_path='{model}', tokenizer_mode='auto', load_format='auto', trust_remote_code=False, "
                          f"host='{host}', port={port}, tp_size={tp}, nnodes={nnodes}, node_rank={rank}, "
                          f"dist_init_addr='{addr}', mem_fraction_static=0.7, ...)"))
    local_rank = rank * max(1, tp // max(nnodes, 1))
    ct.log.append(LogLine(t + 9.5, f"{_stamp(cluster, t + 9.5, local_rank)} Init torch distributed begin."))
    if nnodes <= 1:
        ct.log.append(LogLine(t + 14.0, f"{_stamp(cluster, t + 14.0, 0)} Init torch distributed ends. "
                              "mem usage=0.00 GB"))
        ct.log.append(LogLine(t + 15.0, f"{_stamp(cluster, t + 15.0, 0)} Load weight begin. avail mem=112.31 GB"))
        return
    # the rendezvous: once every rank is there, each logs the custom-allreduce line, then nothing
    rdv: dict[str, list[tuple[Container, int, float]]] = getattr(cluster, "sglang_rendezvous", {})
    cluster.sglang_rendezvous = rdv  # type: ignore[attr-defined]
    group = rdv.setdefault(addr, [])
    group.append((ct, local_rank, t))
    if len(group) >= nnodes:
        t_all = max(x[2] for x in group) + 11.0
        for c, r, _t0 in group:
            c.log.append(LogLine(t_all, f"{_stamp(cluster, t_all, r)} sglang is using nccl==2.27.7"))
            c.log.append(LogLine(t_all + 2.4, f"{_stamp(cluster, t_all + 2.4, r)} CustomAllreduce is disabled "
                                 "because this process group spans across nodes."))
