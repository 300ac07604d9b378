"""What a container's Python prints that is not vLLM's server log: the engine check and SGLang.

* :func:`engine_check`: ``docker run --rm [--gpus all] --entrypoint python3 IMAGE -c PROGRAM``
  (the console's :func:`sparkconsole.deploy.engines.engine_program`, or any other program): the
  program is compiled and evaluated by :mod:`sparkconsole.sim.pyexec` against what the image
  carries (:func:`sparkconsole.sim.container.python_context`): module versions, its commands, torch's
  CUDA build and arch list, the GPU when the container was given one, vLLM's and SGLang's model
  registries. A syntax error, a missing module or a name the image lacks fails as CPython would.
* :func:`sglang_launch`: ``python3 -m sglang.launch_server --model-path X --tp 2 --nnodes 2
  --node-rank R --dist-init-addr IP:PORT``. Across nodes the ranks meet at the rendezvous address,
  both log ``CustomAllreduce is disabled because this process group spans across nodes.`` and
  then nothing more (the story's NCCL stall: no readiness, no HTTP port). A lone rank waits at
  ``Init torch distributed begin.``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from sparkconsole.sim.model import Container, Image, LogLine
from sparkconsole.sim.pyexec import run_program

if TYPE_CHECKING:
    from sparkconsole.sim.model import SimCluster


def engine_check(img: Image, program: str, gpu: bool = False, env: dict[str, str] | None = None,
                 argv: list[str] | None = None) -> tuple[str, str, int]:
    """``python3 -c program`` in ``img`` (``gpu``: the container was run with ``--gpus``):
    (stdout, stderr, exit status)."""
    from sparkconsole.sim.container import python_context

    return run_program(program, python_context(img, gpu, env, argv))


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
