"""What vLLM subtracts from ``gpu_memory_utilization x total`` before the KV cache, by version.

``v1/worker/gpu_worker.py::determine_available_memory`` (V1) takes::

    available_kv = requested - weights - activation_peak - non_torch [- cuda_graphs]

| vLLM | CUDA graphs in the budget | what the log prints | source |
|---|---|---|---|
| < 0.11 | no (captured after the KV cache, out of the headroom left by gmu) | "Model loading took", "Available KV cache memory" (0.6-0.9: "Memory profiling results" / "the rest of the memory reserved for KV Cache") | gpu_worker.py of those tags |
| 0.11 - 0.18 | estimated ("Estimated CUDA graph memory: X GiB total") but not subtracted unless ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1`` | as above; 0.18 prints "In v0.19, CUDA graph memory profiling will be enabled by default" (real log 25) | gpu_model_runner.py ``profile_cudagraph_memory`` |
| >= 0.19 | subtracted (spark-vllm-docker#396: "makes 0.80 effectively 0.758") | the one-line summary "Actual usage is W GiB for weight, A GiB for peak activation, N GiB for non-torch memory, and G GiB for CUDAGraph memory" (vllm#50722) | gpu_worker.py |

The activation peak is what ``profile_run`` measures: one dummy forward of
``max_num_batched_tokens`` tokens (chunked prefill). It is not linear in the token count past the
usual 8K: the logits and the sampler are sized by ``max_num_seqs`` rather than by tokens, and MoE
kernels chunk their workspace. The estimate here is 4 GiB at 8,192 tokens, linear below (GB10
DeepSeek-V4-Flash: 5.30 GiB at 8,224 tokens, 1.39 GiB at 2,048) and growing with the square root
above (an estimate, replace it with the logged figure: at 65,536 tokens it gives 11.3 GiB where the
old linear rule gave 32 GiB).

Non-torch: 1.0 GiB (CUDA context, cuBLAS / Triton workspaces) + 0.5 GiB NCCL buffers for TP > 1.
Pipeline parallel, 0.14.0 - 0.16.0 only: ``v1/core/kv_cache_utils.py::get_kv_cache_configs`` checks
ONE request of ``max_model_len`` against the KV groups of the WHOLE model (every stage's layers) and
the smallest worker's KV memory, and refuses to start when it does not fit ("To serve at least one
request with the models's max seq len ... KV cache is needed, which is larger than the available KV
cache memory"), although each stage holds only its own layers. Introduced with ``--max-model-len auto``
(vllm#29431, first released in 0.14.0), reported as vllm#32105 / #34076, fixed by #33698 (first released
in 0.17.0; 0.16.0 still has it): per worker, over that worker's own layers, from 0.17 on (the code of
the 0.13.0 .. 0.17.0 wheels on PyPI, compared).

CUDA graphs: 0.5 GiB on a GB10 (1.0 GiB logged for a 4B hybrid at 51+35 graphs, real log 02;
1.62 GiB estimated in real log 25; 1.34 GiB for a 35B on H100 in vllm#50722).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

NEWEST = "0.20"
ACTIVATION_REF_GIB = 4.0
ACTIVATION_REF_TOKENS = 8192
NON_TORCH_GIB = 1.0
NCCL_GIB = 0.5
CUDA_GRAPH_GIB = 0.5


@dataclass(frozen=True)
class VersionRules:
    """How one vLLM version books its overheads."""

    version: str
    graphs_in_budget: bool
    new_kv_print: bool     # "GPU KV cache size" = int(concurrency x max_model_len) (0.20+) vs blocks x block
    note: str
    pp_whole_model_kv_check: bool = False  # 0.14-0.16: a PP start checks the whole model's KV per stage


def parse_version(text: str | None) -> tuple[int, int] | None:
    """``0.13.0+faa43dbf.nv26.01`` -> (0, 13); None when it does not start with a version."""
    if not text:
        return None
    m = re.match(r"\s*v?(\d+)\.(\d+)", str(text))
    return (int(m.group(1)), int(m.group(2))) if m else None


def rules_for(version: str | None) -> VersionRules:
    """The rules of ``version`` (else the newest known), with a note that names the version."""
    v = parse_version(version)
    assumed = version is None or v is None
    label = NEWEST if assumed else f"{v[0]}.{v[1]}"
    vv = parse_version(label) or (0, 20)
    graphs = vv >= (0, 19)
    new_print = vv >= (0, 20)
    note = (f"vLLM {label}{' (assumed: the newest known; give --vllm-version)' if assumed else ''}: CUDA-graph "
            f"memory {'is' if graphs else 'is not'} subtracted from the KV budget; 'GPU KV cache size' "
            f"{'= concurrency x max_model_len' if new_print else '= blocks / groups x block size'}")
    return VersionRules(label, graphs, new_print, note, pp_whole_model_kv_check=(0, 14) <= vv < (0, 17))


def activation_gib(max_num_batched_tokens: int) -> float:
    """The activation-peak estimate (module doc): linear to 8,192 tokens, square root above."""
    t = max(1, int(max_num_batched_tokens))
    if t <= ACTIVATION_REF_TOKENS:
        return ACTIVATION_REF_GIB * t / ACTIVATION_REF_TOKENS
    return ACTIVATION_REF_GIB * math.sqrt(t / ACTIVATION_REF_TOKENS)
