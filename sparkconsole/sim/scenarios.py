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
permissive ``story`` on the old, lenient twin: root login, ``sudo`` that asks nothing, ``hf`` on the
           host, both RoCE twins addressed (what the simulator was before issue 22).
two-subnet ``story`` with the July 2026 playbook's addressing: both twins of the cabled port get an
           IPv4 address, in two subnets.
overlay2   ``story`` with Docker's overlay2 image store (the real capture) instead of containerd's.
ngc-image  ``story``, but the head's new image is NVIDIA's ``nvcr.io/nvidia/vllm:26.05-py3``
           (vLLM 0.20.1, no Ray, entrypoint ``/opt/nvidia/nvidia_entrypoint.sh``).
gb10-ray   ``story``, and NVIDIA's ``nvcr.io/nvidia/vllm:26.03-py3`` (vLLM 0.17.1 built for sm_121, with
           Ray) already on every node, as an operator who runs the Ray path keeps it.
bad-kernel ``story`` on kernel 7.0.0-1019-nvidia (``uname -r``), which breaks RoCE memory
           registration (ibv_reg_mr_iova2: ENOMEM); recon stops on it.
new-keys   ``story`` on nodes that never ssh'd to each other over the fast link: no peer's host key is
           in ``~/.ssh/known_hosts``, and ssh between the nodes checks it as OpenSSH does ("Host key
           verification failed.", exit 255) until one is added. The other scenarios model nodes whose
           known_hosts already hold their peers' keys.
prefill-   ``story``; ``SQUEEZE_AT`` sim seconds in (60 s) a long prompt reaches ``vllm-glm`` and its
squeeze    prefill grows the EngineCore's memory over ``SQUEEZE_SPAN`` seconds (120 s) until the head
           would be 2 GiB past empty: ``MemAvailable`` falls to zero and ``/proc/pressure/memory``
           climbs, unless the engine is stopped first (``docker stop`` frees it). The first engine
           started on the head while the demo runs that takes a 128K prompt (a deployment's, not
           its canary) meets the same prompt ``SQUEEZE_SERVED_AT`` seconds (10 min) after it is
           ready: once the wizard has verified it.
hostile    ``story``, and the last node also runs ``vllm-flood`` (an engine on port 8000) that turns
           hostile ``HOSTILE_AT`` sim seconds in (60 s): its log writes one line without a newline
           for 30 s (7.5 MiB), then 5,000 lines a second, and its ``/metrics`` is a 1 GB page of
           2,000,000 series, sent chunked (:mod:`sparkconsole.sim.hostile`). The console keeps a
           bounded part of each; ``benchmarks/soak.py`` holds it to its figures.
========== =====================================================================================

Every scenario but ``permissive`` behaves like stock DGX OS (../docs/dgx-os.md): a non-root login
user in the ``docker`` group, ``sudo`` that needs a password, no ``hf`` on the host, NVIDIA's
earlier netplan, RoCE v2 GID indexes that differ between the nodes, Docker's containerd store.

Nodes beyond the second (``--nodes N``) are workers like ``spark-5be3``.
"""

from __future__ import annotations

from sparkconsole.sim import formats, vllm_logs
from sparkconsole.sim.clock import SimClock
from sparkconsole.sim.hostile import Hostile
from sparkconsole.sim.model import (
    GIB,
    IMAGE_NEW,
    IMAGE_NGC,
    IMAGE_NGC_2603,
    IMAGE_OLD,
    IMAGE_SGLANG,
    Container,
    EngineRun,
    SimCluster,
    stable_hex,
)

SCENARIOS = ("story", "healthy", "link-down", "node-lost", "old-image", "permissive", "two-subnet", "overlay2",
             "ngc-image", "gb10-ray", "bad-kernel", "new-keys", "prefill-squeeze", "hostile")
SQUEEZE_AT = 60.0  # prefill-squeeze: when the long prompt arrives (sim seconds)
SQUEEZE_SPAN = 120.0  # and how long its prefill takes to eat what the head has left, and 2 GiB more
SQUEEZE_PROMPT = 131_072  # its length in tokens (the field's 128K prefill)
SQUEEZE_SERVED_AT = 600.0  # an engine started while the demo runs: how long after it is ready the prompt comes
HOSTILE_AT = 60.0  # hostile: when the last node's vllm-flood turns hostile (sim seconds)
FLOOD = "vllm-flood"  # hostile: the engine container that does
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
                   mounts=cluster.login(node).hf_home,  # -v ~/.cache/huggingface:/root/.cache/huggingface
                   binds=((cluster.login(node).hf_home, "/root/.cache/huggingface"),))
    args = vllm_logs.parse_serve_args(argv, version=IMAGE_OLD.vllm_version)
    ct.engine = vllm_logs.plan_serve(cluster, cluster.node(node), name, IMAGE_OLD.vllm_version, args, t0,
                                     pid_api=1, activity=activity)
    ct.host_rss = int((2.4 if model == GLM else 1.3) * GIB)
    cluster.add_container(ct)
    return ct


def _prefill_squeeze(cluster: SimCluster, node: str, engine: EngineRun, t0: float, span: float,
                     unseen: float = 0.0) -> None:
    """``engine`` starts prefilling a long prompt at ``t0``: its EngineCore's unified memory grows
    linearly for ``span`` seconds by what the node has available at ``t0`` and 2 GiB more (the
    field's 128K prefill: activations and KV blocks the pool was not sized for). ``unseen``: what the
    engine holds at ``t0`` that the node's figures do not count yet (a run planned before its
    container carries it). The holder's curve ends when the container stops, so a stop before
    ``t0 + span`` gives the memory back."""
    core = next(h for h in engine.holders if h.node == node and h.gpu)
    need = max(0.0, cluster.memory(node, t0).available - unseen) + 2 * GIB
    v0 = core.bytes_at(t0)
    core.curve.points = [p for p in core.curve.points if p[0] < t0] + [(t0, v0), (t0 + span, v0 + need)]


class _SqueezeNewEngine:
    """prefill-squeeze for an engine started while the demo runs: the first ``vllm serve`` on ``head``
    that comes to serve and takes the long prompt (``--max-model-len`` of at least
    :data:`SQUEEZE_PROMPT` tokens: a deployment's engine, not its short-context canary) meets it
    :data:`SQUEEZE_SERVED_AT` seconds after it is ready (once the wizard's verify is long done: the
    prompt is a user's, not the wizard's). Planned again (a native rank that joined late) it is the
    same engine; any later one (a service started again at teardown) is left alone."""

    def __init__(self, head: str) -> None:
        self.head = head
        self.engine: tuple[str, float] | None = None  # (container, start) of the engine it came to

    def __call__(self, cluster: SimCluster, node: str, container: str, run: EngineRun) -> None:
        if (node != self.head or run.ready_at is None or run.max_model_len < SQUEEZE_PROMPT
                or self.engine not in (None, (container, run.started))):
            return
        self.engine = (container, run.started)
        t0 = run.ready_at + SQUEEZE_SERVED_AT
        own = sum(h.bytes_at(t0) for h in run.holders if h.node == node)
        _prefill_squeeze(cluster, node, run, t0, SQUEEZE_SPAN, unseen=own)


def _engines_see_lost_node(cluster: SimCluster, node: str, t: float) -> None:
    for _c, e in cluster.all_engines():
        vllm_logs.worker_lost(cluster, e, node, t)


def wire(c: SimCluster) -> SimCluster:
    """Connect the model to its renderers: virtual files, and engines told of a lost node
    (the model imports neither, so it stays free of text)."""
    if c.virtual_files is None:
        c.virtual_files = lambda cl, node: formats.sysfs_files(cl, node, cl.now())
    if c.virtual_file is None:
        c.virtual_file = lambda cl, node, path: formats.virtual_file(cl, node, path, cl.now())
    if _engines_see_lost_node not in c.lost_listeners:
        c.lost_listeners.append(_engines_see_lost_node)
    return c


def build(scenario: str = "story", nodes: int = 2, clock: SimClock | None = None, seed: int = 1234,
          lost_after: float = 20.0, hostile: Hostile | None = None) -> SimCluster:
    """The cluster of ``scenario``. ``hostile``: for the ``hostile`` scenario, what its last node's
    ``vllm-flood`` does and from when (default: :class:`~sparkconsole.sim.hostile.Hostile` from
    :data:`HOSTILE_AT`; ``benchmarks/soak.py`` sets its own)."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}: choose one of {', '.join(SCENARIOS)}")
    clock = clock or SimClock()
    c = SimCluster(clock, n_nodes=nodes, seed=seed)
    wire(c)
    c.scenario = scenario
    c.permissive = scenario == "permissive"
    c.layout = "two-subnet" if scenario in ("permissive", "two-subnet") else "netplan-ll"
    c.image_store = "overlay2" if scenario in ("permissive", "overlay2") else "containerd"
    names = list(c.nodes)
    for i, name in enumerate(names):
        n = c.nodes[name]
        if scenario == "old-image":
            n.images = {IMAGE_OLD.ref: IMAGE_OLD}
        elif scenario == "healthy" or i == 0:
            n.images = {IMAGE_OLD.ref: IMAGE_OLD, IMAGE_NEW.ref: IMAGE_NEW}
            if scenario == "story":
                n.images[IMAGE_SGLANG.ref] = IMAGE_SGLANG
            if scenario == "ngc-image":  # the head's new image is NVIDIA's (vLLM 0.20.1, no Ray)
                n.images = {IMAGE_OLD.ref: IMAGE_OLD, IMAGE_NGC.ref: IMAGE_NGC, IMAGE_SGLANG.ref: IMAGE_SGLANG}
        else:
            n.images = {IMAGE_OLD.ref: IMAGE_OLD}
        if scenario == "gb10-ray":
            n.images[IMAGE_NGC_2603.ref] = IMAGE_NGC_2603
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
        glm = _service(c, head, "vllm-glm", GLM,
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
        if scenario == "prefill-squeeze":
            assert glm.engine is not None
            _prefill_squeeze(c, head, glm.engine, SQUEEZE_AT, SQUEEZE_SPAN)
            c.engine_listeners.append(_SqueezeNewEngine(head))
        if scenario == "hostile":
            flood = _service(c, names[-1], FLOOD, EMBED,
                             [EMBED, "--served-model-name", "flood", "--gpu-memory-utilization", "0.05",
                              "--runner", "pooling"], -88_300.0, activity=0.1)
            flood.hostile = hostile if hostile is not None else Hostile(t0=HOSTILE_AT)
    return c
