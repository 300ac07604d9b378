"""KV cache and per-request state, the way vLLM's V1 engine sizes them.

Sources (vLLM): ``v1/kv_cache_interface.py`` (page sizes, ``max_memory_usage_bytes``),
``model_executor/layers/mamba/mamba_utils.py`` (GDN / Mamba2 state shapes),
``model_executor/models/config.py`` (hybrid attention block size, ``mamba_ssm_dtype``),
``v1/core/kv_cache_utils.py`` (KV-cache groups, ``get_num_blocks``,
``get_max_concurrency_for_kv_cache_config``, the "GPU KV cache size" print).

- Full attention, per token per rank: ``2 x layers x max(1, kv_heads // tp) x head_dim x bytes``
  (K and V; heads replicated once TP exceeds them). MLA keeps one latent of
  ``kv_lora_rank + qk_rope_head_dim`` per token and layer, the same on every rank.
- KV dtype ``auto`` follows the checkpoint: the model dtype (bf16) unless the config carries a
  KV-cache quantisation scheme; ``fp8`` is one byte.
- Linear-attention state per request and layer: conv ``(K - 1 + S) x conv_dim / tp`` in the model
  dtype plus temporal ``v_heads / tp x v_dim x k_dim`` (GDN) or ``heads / tp x head_dim x
  d_state`` (Mamba2) in ``mamba_ssm_dtype`` (else the model dtype).
- Hybrid models: the attention block is the smallest multiple of 16 tokens whose page (one layer)
  holds one state page; the state page is padded up to it. Layers of each kind are cut into
  groups of ``group_size`` (the smaller count, or the larger when the counts are within 1.5x),
  short groups padded with padding layers; MTP draft layers join the attention layers. One pool:
  ``num_blocks = available // (page x group_size)``; a request at ``max_model_len`` takes
  ``cdiv(len, block)`` blocks in each attention group and ``2 + S`` (prefix-caching "align"
  mode) or ``1 + S`` in each state group.
- Dense models: block 16, one group of all layers.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkconsole.planner.spec import Geometry

ALIGN = 16
DENSE_BLOCK = 16
_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "fp8": 1}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class KVLayout:
    kv_dtype: str
    attn_layers: int                 # full-attention layers incl. MTP draft layers
    state_layers: int                # linear-attention / mamba layers
    attn_bytes_per_token_layer: int  # one layer, one rank
    kv_bytes_per_token: int          # all attention layers, one rank
    state_bytes_per_request: int     # all state layers, one copy, unpadded, one rank
    state_page_bytes: int            # one state layer, unpadded
    block_size: int                  # tokens per attention block
    page_bytes: int                  # one layer's page (attention page; state page padded to it)
    group_size: int
    attn_groups: int
    state_groups: int
    padding_layers: int
    state_blocks_per_request: int    # per state group: 1 or 2 ("align"), + speculative tokens
    notes: tuple[str, ...] = ()

    @property
    def num_groups(self) -> int:
        return self.attn_groups + self.state_groups

    @property
    def bytes_per_block(self) -> int:
        """What one block id costs across the pool: one page in every layer of a group."""
        return self.page_bytes * self.group_size

    def blocks_per_request(self, max_model_len: int) -> int:
        return (self.attn_groups * cdiv(max_model_len, self.block_size)
                + self.state_groups * self.state_blocks_per_request)

    def longest_len(self, num_blocks: int) -> int:
        """The longest ``max_model_len`` one request can have with ``num_blocks`` blocks."""
        spare = num_blocks - self.state_groups * self.state_blocks_per_request
        if spare <= 0 or self.attn_groups == 0:
            return 0
        return (spare // self.attn_groups) * self.block_size


@dataclass(frozen=True)
class Capacity:
    available_bytes: int
    num_blocks: int
    blocks_per_request: int
    max_concurrency: float
    kv_cache_tokens: int       # new print: int(max_concurrency x max_model_len)
    kv_cache_tokens_old: int   # old print: num_blocks // groups x block


def kv_dtype_for(geo: Geometry, kv_cache_dtype: str) -> str:
    if kv_cache_dtype == "auto":
        return "fp8" if geo.kv_cache_fp8 else geo.dtype
    if kv_cache_dtype.startswith("fp8"):
        return "fp8"
    if kv_cache_dtype in _BYTES:
        return kv_cache_dtype
    raise ValueError(kv_cache_dtype)


def state_page_bytes(geo: Geometry, tp: int, num_spec: int) -> int:
    conv_b = geo.dtype_bytes
    ssm_b = _BYTES.get(geo.mamba_ssm_dtype or geo.dtype, 2)
    if geo.linear is not None:
        la = geo.linear
        conv = (la.conv_kernel - 1 + num_spec) * (la.conv_dim // tp) * conv_b
        temporal = (la.v_heads // tp) * la.v_dim * la.k_dim * ssm_b
        return conv + temporal
    if geo.mamba is not None:
        m = geo.mamba
        conv = (m.conv_kernel - 1 + num_spec) * (m.conv_dim // tp) * conv_b
        temporal = (m.n_heads // tp) * m.head_dim * m.d_state * ssm_b
        return conv + temporal
    return 0


def kv_layout(geo: Geometry, tp: int = 1, kv_cache_dtype: str = "auto", prefix_caching: bool = True,
              num_spec: int = 0, mtp_loaded: bool = False) -> KVLayout:
    dtype = kv_dtype_for(geo, kv_cache_dtype)
    b = _BYTES[dtype]
    notes: list[str] = []
    if geo.mla is not None:
        per_layer = (geo.mla.kv_lora_rank + geo.mla.qk_rope_head_dim) * b
    else:
        per_layer = 2 * max(1, geo.num_kv_heads // tp) * geo.head_dim * b
    draft = geo.mtp_layers if mtp_loaded else 0
    attn = geo.n_full + draft
    kv_tok = attn * per_layer
    n_state = geo.n_linear
    if not n_state:
        block = DENSE_BLOCK
        return KVLayout(dtype, attn, 0, per_layer, kv_tok, 0, 0, block, block * per_layer,
                        max(1, attn), 1 if attn else 0, 0, 0, 0, tuple(notes))
    page_state = state_page_bytes(geo, tp, num_spec)
    state_req = page_state * n_state
    sb = (2 if prefix_caching else 1) + num_spec
    if attn == 0:
        return KVLayout(dtype, 0, n_state, 0, 0, state_req, page_state, 0, page_state, n_state, 0, 1, 0,
                        sb, tuple(notes))
    block = ALIGN * cdiv(page_state, ALIGN * per_layer)
    page = block * per_layer
    lo, hi = min(attn, n_state), max(attn, n_state)
    gs = hi if hi < 1.5 * lo else lo
    ga, gm = cdiv(attn, gs), cdiv(n_state, gs)
    padding = ga * gs - attn + gm * gs - n_state
    if padding:
        notes.append(f"{padding} padding layers added to fill {ga + gm} KV-cache groups of {gs}")
    return KVLayout(dtype, attn, n_state, per_layer, kv_tok, state_req, page_state, block, page, gs,
                    ga, gm, padding, sb, tuple(notes))


def capacity(layout: KVLayout, available_bytes: int, max_model_len: int) -> Capacity:
    avail = max(0, int(available_bytes))
    num_blocks = avail // layout.bytes_per_block if layout.bytes_per_block else 0
    per_req = layout.blocks_per_request(max_model_len)
    conc = num_blocks / per_req if per_req else 0.0
    old = (num_blocks // layout.num_groups) * layout.block_size if layout.num_groups else 0
    return Capacity(avail, num_blocks, per_req, conc, int(conc * max_model_len), old)
