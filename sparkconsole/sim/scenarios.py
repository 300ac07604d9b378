"""Starting points for the simulated cluster.

========== =====================================================================================
scenario   state at sim time 0
========== =====================================================================================
story      (default) the head ``spark-1a32`` runs GLM-4.7-Flash-NVFP4 in vLLM 0.14 (``vllm-glm``,
           gmu 0.70: ~70% of memory, light steady traffic), ``embeddings`` (Qwen3-Embedding-0.6B) and
           ``reranker`` (Qwen3-Reranker-0.6B); the worker ``spark-5be3`` runs ``embeddings``.
           Images: the head has ``vllm/vllm-openai:v0.14.1`` and ``v0.17.0``, the worker only
           ``v0.14.1`` (copy it with ``docker save | ssh docker load``). The 122B weights are on
           neither node (``hf download`` on the head, then ``rsync`` over the fast link).
healthy    idle nodes, nothing running; both images and the 122B weights on every node.
link-down  ``story``, but the port-1 twins are Down (NO-CARRIER) on both nodes.
node-lost  ``story``; the last node stops answering ``lost_after`` sim seconds in (default 20 s).
           A TP=2 engine spanning it hangs on NCCL and dies with PyTorch's watchdog timeout 600 s
           later (``SimCluster.mark_lost`` / ``DemoCluster.lose`` do the same at run time).
old-image  ``story``, but only the 0.14 image exists on every node (Qwen3.5 needs >= 0.16).
========== =====================================================================================

Nodes beyond the second (``--nodes N``) are workers like ``spark-5be3``.
"""

from __future__ import annotations

from sparkconsole.sim import formats, vllm_logs
from sparkconsole.sim.clock import SimClock
from sparkconsole.sim.model import (
    GIB,
    IMAGE_NEW,
    IMAGE_OLD,
    IMAGE_SGLANG,
    Container,
    SimCluster,
    stable_hex,
)

SCENARIOS = ("story", "healthy", "link-down", "node-lost", "old-image")
QWEN = "Qwen/Qwen3.5-122B-A10B-FP8"
GLM = "GadflyII/GLM-4.7-Flash-NVFP4"
EMBED = "Qwen/Qwen3-Embedding-0.6B"
RERANK = "Qwen/Qwen3-Reranker-0.6B"


def _service(cluster: SimCluster, node: str, name: str, model: str, argv: list[str], t0: float,
             activity: float) -> Container:
    image = IMAGE_OLD.ref
    cluster.drop_caches(node, t0 - 5.0)  # the start script drops the caches first (vLLM checks MemFree)
    ct = Container(id=stable_hex(64, node, name, t0), name=name, image=image, argv=("vllm", "serve", *argv),
                   node=node, created=t0 - 2.0, started=t0, kind="vllm",
                   mounts="/root/.cache/huggingface")
    args = vllm_logs.parse_serve_args(argv)
    ct.engine = vllm_logs.plan_serve(cluster, cluster.node(node), name, IMAGE_OLD.vllm_version, args, t0,
                                     pid_api=1, activity=activity)
    ct.host_rss = int((2.4 if model == GLM else 1.3) * GIB)
    cluster.add_container(ct)
    return ct


def _engines_see_lost_node(cluster: SimCluster, node: str, t: float) -> None:
    for _c, e in cluster.all_engines():
        vllm_logs.worker_lost(cluster, e, node, t)


def wire(c: SimCluster) -> SimCluster:
    """Connect the model to its renderers: virtual files, and engines told of a lost node
    (the model imports neither, so it stays free of text)."""
    if c.virtual_files is None:
        c.virtual_files = lambda cl, node: formats.sysfs_files(cl, node, cl.now())
    if _engines_see_lost_node not in c.lost_listeners:
        c.lost_listeners.append(_engines_see_lost_node)
    return c


def build(scenario: str = "story", nodes: int = 2, clock: SimClock | None = None, seed: int = 1234,
          lost_after: float = 20.0) -> SimCluster:
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}: choose one of {', '.join(SCENARIOS)}")
    clock = clock or SimClock()
    c = SimCluster(clock, n_nodes=nodes, seed=seed)
    wire(c)
    c.scenario = scenario
    names = list(c.nodes)
    for i, name in enumerate(names):
        n = c.nodes[name]
        if scenario == "old-image":
            n.images = {IMAGE_OLD.ref: IMAGE_OLD}
        elif scenario == "healthy" or i == 0:
            n.images = {IMAGE_OLD.ref: IMAGE_OLD, IMAGE_NEW.ref: IMAGE_NEW}
            if scenario == "story":
                n.images[IMAGE_SGLANG.ref] = IMAGE_SGLANG
        else:
            n.images = {IMAGE_OLD.ref: IMAGE_OLD}
        if n.internet:
            n.hf_token = "hf_" + stable_hex(34, "token", seed, name)
        repos = [EMBED] + ([GLM, RERANK] if i == 0 else []) + ([QWEN] if scenario == "healthy" else [])
        for repo in repos:
            c.seed_model(name, repo)
        if scenario == "link-down":
            n.port1_up = False
    if scenario == "node-lost" and len(names) > 1:
        c.nodes[names[-1]].lost_at = lost_after
    if scenario != "healthy":
        head = names[0]
        # started about a day ago, in this order, so each one's memory check saw the others
        _service(c, head, "vllm-glm", GLM,
                 [GLM, "--served-model-name", "glm-4.7-flash", "--gpu-memory-utilization", "0.70",
                  "--max-model-len", "131072", "--enable-auto-tool-choice", "--tool-call-parser", "glm47",
                  "--reasoning-parser", "glm45"], -93_050.0, activity=0.45)
        _service(c, head, "embeddings", EMBED,
                 [EMBED, "--port", "8001", "--gpu-memory-utilization", "0.05", "--runner", "pooling"],
                 -92_700.0, activity=0.12)
        _service(c, head, "reranker", RERANK,
                 [RERANK, "--port", "8002", "--gpu-memory-utilization", "0.05", "--max-model-len", "8192",
                  "--runner", "pooling"],
                 -92_500.0, activity=0.08)
        for w in names[1:]:
            _service(c, w, "embeddings", EMBED,
                     [EMBED, "--port", "8001", "--gpu-memory-utilization", "0.05", "--runner", "pooling"],
                     -88_400.0, activity=0.1)
    return c
