"""The KV budget per node, GB10 rules, and the fits / does-not-fit judgement.

vLLM (``v1/worker/gpu_worker.py::determine_available_memory``) gives the KV cache what is left of
``gpu_memory_utilization x total memory`` after the weights, the activation peak of a profiling
forward pass, non-torch allocations and (newer builds) CUDA-graph memory::

    kv = gmu x node_memory - weights - activation_peak - non_torch - cuda_graphs

The three overheads are only known after a real start, so they are estimated here, each stated in
the plan's reasons so an operator can replace them with the measured figures (vLLM prints them on
its "Free memory on device ... Actual usage is ..." line):

- **activation peak**: 4.0 GiB at ``--max-num-batched-tokens`` 8192, scaled linearly with the
  batched tokens. 4 GiB is the research note's fallback for the 122B hybrid; the one GB10
  measurement of the token dependence (DeepSeek-V4-Flash: 5.30 GiB at 8224 tokens, 1.39 GiB at
  2048) is close to linear, and hidden size did not predict the H100 figures (4.8-7.4 GiB) well
  enough to scale by it.
- **non-torch**: 1.0 GiB (CUDA context, cuBLAS/Triton workspaces; GB10 can count JIT heap here),
  plus 0.5 GiB of NCCL buffers when TP > 1 (0.55 GiB measured for TP=2 in the llm-d table).
- **CUDA graphs**: 0.5 GiB (vLLM >= 0.21 profiles and subtracts them; 1.34 GiB was seen for a 35B
  model on H100, 0.5 GiB is the research's Spark estimate).

``--kv-cache-gib`` skips all of this and takes the KV budget as given, like vLLM's
``--kv-cache-memory``. GB10 practice: gmu 0.80-0.85; above 0.85 the host starts to swap (warned),
above 0.90 it freezes or vLLM refuses to start (refused unless forced). On unified memory the page
cache competes with vLLM: drop it before launching.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sparkconsole.errors import UserError
from sparkconsole.planner import overheads as ov

DEFAULT_NODE_MEMORY_GIB = 121.69     # what vLLM reports as total on a GB10 (DGX OS, recent)
DEFAULT_GMU = 0.85
GMU_WARN = 0.85
GMU_REFUSE = 0.90
ACTIVATION_REF_GIB = 4.0
ACTIVATION_REF_TOKENS = 8192
NON_TORCH_GIB = 1.0
NCCL_GIB = 0.5
CUDA_GRAPH_GIB = 0.5
DROP_CACHES = "sync; echo 3 | sudo tee /proc/sys/vm/drop_caches"

# The gmu the field runs at a context length, on GB10 (issue 36): a long context leaves room for a long
# prompt's activations and the page cache only when vLLM takes less of the node.
#   0.85 at 65,536: TechPreacher's qwen/launch-qwen-122b.sh (Qwen3.5-122B-A10B-FP8, 2 Sparks, TP=2)
#   0.70 at 262,144: spark-arena's recipe-registry qwen3.5-122b-a10b-fp8-vllm.yaml and eugr's
#                    recipes/qwen3.5-122b-fp8.yaml (the same model and layout)
# A length between two measured points takes the lower figure (the next longer context's): no recipe
# in the field runs one, and the lower is the side a host survives.
FIELD_GMU: tuple[tuple[int, float, str], ...] = (
    (65_536, 0.85, "TechPreacher's launch-qwen-122b.sh"),
    (262_144, 0.70, "spark-arena's and eugr's Qwen3.5-122B recipes"),
)


@dataclass(frozen=True)
class Overheads:
    activation_gib: float
    non_torch_gib: float
    cuda_graph_gib: float
    note: str

    @property
    def total_gib(self) -> float:
        return self.activation_gib + self.non_torch_gib + self.cuda_graph_gib


def estimate_overheads(tp: int, max_num_batched_tokens: int = ACTIVATION_REF_TOKENS,
                       activation_gib: float | None = None, non_torch_gib: float | None = None,
                       cuda_graph_gib: float | None = None, vllm_version: str | None = None) -> Overheads:
    """The per-node overheads vLLM subtracts before the KV cache, estimated by version
    (planner/overheads.py); CUDA graphs count only where that version subtracts them."""
    rules = ov.rules_for(vllm_version)
    parts = []
    if activation_gib is None:
        activation_gib = ov.activation_gib(max_num_batched_tokens)
        parts.append(f"activation peak {activation_gib:.2f} GiB (estimate at {max_num_batched_tokens:,} "
                     "batched tokens: 4 GiB at 8,192, linear below, square root above)")
    else:
        parts.append(f"activation peak {activation_gib:.2f} GiB (given)")
    if non_torch_gib is None:
        non_torch_gib = NON_TORCH_GIB + (NCCL_GIB if tp > 1 else 0.0)
        parts.append(f"non-torch {non_torch_gib:.2f} GiB (estimate: 1 GiB"
                     + (" + 0.5 GiB NCCL buffers for TP>1)" if tp > 1 else ")"))
    else:
        parts.append(f"non-torch {non_torch_gib:.2f} GiB (given)")
    if not rules.graphs_in_budget:
        cuda_graph_gib = 0.0
        parts.append("CUDA graphs not in the budget (this version captures them after the KV cache)")
    elif cuda_graph_gib is None:
        cuda_graph_gib = CUDA_GRAPH_GIB
        parts.append(f"CUDA graphs {cuda_graph_gib:.2f} GiB (estimate)")
    else:
        parts.append(f"CUDA graphs {cuda_graph_gib:.2f} GiB (given)")
    note = (f"overheads per node ({rules.note}): " + ", ".join(parts)
            + "; replace with the figures vLLM logs after a first start (--from-log)")
    return Overheads(activation_gib, non_torch_gib, cuda_graph_gib, note)


def field_gmu(max_model_len: int | None) -> tuple[float, str]:
    """The gmu the field runs at ``max_model_len`` tokens (:data:`FIELD_GMU`) and where that figure
    comes from; the longest measured context's figure for anything longer, DEFAULT_GMU for an
    unknown length."""
    if not max_model_len:
        return DEFAULT_GMU, "GB10 practice"
    for tokens, gmu, source in FIELD_GMU:
        if max_model_len <= tokens:
            return gmu, f"{source}: {gmu:g} at {tokens:,} tokens"
    tokens, gmu, source = FIELD_GMU[-1]
    return gmu, f"{source}: {gmu:g} at {tokens:,} tokens"


def check_gmu(gmu: float, force: bool = False, max_model_len: int | None = None) -> list[str]:
    """GB10 rules for ``--gpu-memory-utilization``: warnings, or a UserError when refused."""
    if not math.isfinite(gmu) or gmu <= 0 or gmu > 1:
        raise UserError(f"--gpu-memory-utilization must be in (0, 1], got {gmu}")
    if gmu > GMU_REFUSE and not force:
        raise UserError(
            f"--gpu-memory-utilization {gmu} is above {GMU_REFUSE}: on a GB10 the host swaps or freezes "
            "and vLLM usually refuses to start (unified memory); use 0.80-0.85, or --force")
    warnings = []
    if gmu > GMU_WARN:
        warnings.append(
            f"gpu_memory_utilization {gmu} is above {GMU_WARN}: on GB10 unified memory the OS and page "
            "cache need the rest; the host may swap and stall requests (0.80-0.85 is safe practice)")
    field, source = field_gmu(max_model_len)
    if max_model_len and gmu > field and gmu <= GMU_WARN:
        warnings.append(
            f"gpu_memory_utilization {gmu:g} at --max-model-len {max_model_len:,}: the field runs {field:g} at this "
            f"length ({source}); a full-length prompt's prefill needs the rest of the node")
    return warnings


@dataclass(frozen=True)
class Budget:
    node_memory_gib: float
    gmu: float
    weights_gib: float
    overheads: Overheads
    kv_gib: float                 # signed: negative means weights + overheads do not fit
    given: bool                   # --kv-cache-gib

    @property
    def requested_gib(self) -> float:
        return self.gmu * self.node_memory_gib

    def describe(self) -> str:
        if self.given:
            return (f"KV budget {self.kv_gib:.2f} GiB per node as given (--kv-cache-gib); weights "
                    f"{self.weights_gib:.2f} + KV = {self.weights_gib + self.kv_gib:.2f} of "
                    f"{self.node_memory_gib:.2f} GiB node memory")
        o = self.overheads
        return (f"budget per node: {self.gmu:g} x {self.node_memory_gib:.2f} GiB = {self.requested_gib:.2f} "
                f"GiB - weights {self.weights_gib:.2f} - activation {o.activation_gib:.2f} - non-torch "
                f"{o.non_torch_gib:.2f} - CUDA graphs {o.cuda_graph_gib:.2f} = {self.kv_gib:.2f} GiB "
                "for KV cache and state")


def kv_budget(node_memory_gib: float, gmu: float, weights_gib: float, overheads: Overheads,
              kv_cache_gib: float | None = None) -> Budget:
    if kv_cache_gib is not None:
        return Budget(node_memory_gib, gmu, weights_gib, overheads, kv_cache_gib, True)
    kv = gmu * node_memory_gib - weights_gib - overheads.total_gib
    return Budget(node_memory_gib, gmu, weights_gib, overheads, kv, False)


def fits(budget: Budget, num_blocks: int, blocks_per_request: int) -> bool:
    """Weights, overheads and one request of ``max_model_len`` fit (see the plan contract)."""
    one_request = blocks_per_request > 0 and num_blocks >= blocks_per_request
    if budget.given:
        return one_request and budget.weights_gib + budget.kv_gib <= budget.node_memory_gib
    return budget.kv_gib > 0 and one_request


def gb10_notes() -> list[str]:
    return [
        "GB10 unified memory: the page cache shares the pool (a first weight load fills it, and some "
        f"vLLM builds count only MemFree); drop it right before launch: {DROP_CACHES}",
    ]
