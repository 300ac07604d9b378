"""Property tests: the planner's verdicts are monotone in the resources it is given, and odd
configs end in a clear UserError, never a traceback."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkconsole.errors import UserError
from sparkconsole.planner.plan import PlanOptions, plan
from sparkconsole.planner.spec import SPECS_DIR, load_spec, spec_from_config

MODELS = ["Qwen/Qwen3.5-122B-A10B-FP8", "Qwen/Qwen3.5-35B-A3B", "Qwen/Qwen3-Next-80B-A3B-Instruct-FP8",
          "Qwen/Qwen3-8B", "Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-235B-A22B-FP8", "deepseek-ai/DeepSeek-V3"]
SPECS = {m: load_spec(m) for m in MODELS}
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _valid_tps(spec) -> list[int]:
    out = []
    for tp in (1, 2, 4, 8):
        try:
            plan(spec, PlanOptions(tp=tp, kv_cache_gib=1.0, max_model_len=16))
            out.append(tp)
        except UserError:
            pass
    return out


TPS = {m: _valid_tps(s) for m, s in SPECS.items()}


@st.composite
def scenarios(draw):
    model = draw(st.sampled_from(MODELS))
    spec = SPECS[model]
    opts = PlanOptions(
        tp=draw(st.sampled_from(TPS[model])),
        gpu_memory_utilization=draw(st.sampled_from([0.5, 0.7, 0.8, 0.85])),
        max_model_len=draw(st.integers(1, spec.geometry.max_position)),
        kv_cache_dtype=draw(st.sampled_from(["auto", "fp8"])),
        node_memory_gib=draw(st.floats(8, 1024)),
        enable_prefix_caching=draw(st.booleans()),
        num_speculative_tokens=draw(st.sampled_from([0, 0, 1, 3])),
        kv_cache_gib=draw(st.none() | st.floats(0.01, 200)),
    )
    return spec, opts


def _same_or_better(a, b) -> None:
    """``b`` (more resources) fits whenever ``a`` does, with at least its concurrency."""
    if a.fits:
        assert b.fits
    assert b.capacity.max_concurrency >= a.capacity.max_concurrency - 1e-9


@SETTINGS
@given(scenarios(), st.floats(1.0, 4.0))
def test_more_node_memory_never_fits_worse(sc, factor):
    spec, o = sc
    a = plan(spec, o)
    b = plan(spec, dataclasses.replace(o, node_memory_gib=o.node_memory_gib * factor))
    _same_or_better(a, b)
    assert b.capacity.num_blocks >= a.capacity.num_blocks


@SETTINGS
@given(scenarios())
def test_more_nodes_never_fit_worse(sc):
    spec, o = sc
    bigger = [t for t in TPS[spec.model] if t > o.tp]
    if not bigger:
        return
    a = plan(spec, o)
    b = plan(spec, dataclasses.replace(o, tp=bigger[0]))
    assert b.weights_gib_per_node < a.weights_gib_per_node
    if a.fits:
        assert b.fits


@SETTINGS
@given(scenarios(), st.floats(0.0, 1.0))
def test_shorter_max_model_len_never_fits_worse(sc, shrink):
    spec, o = sc
    a = plan(spec, o)
    b = plan(spec, dataclasses.replace(o, max_model_len=max(1, int(o.max_model_len * shrink))))
    if a.fits:
        assert b.fits
    assert b.capacity.blocks_per_request <= a.capacity.blocks_per_request


@SETTINGS
@given(scenarios())
def test_fp8_kv_never_fits_worse(sc):
    spec, o = sc
    a = plan(spec, dataclasses.replace(o, kv_cache_dtype="auto"))
    b = plan(spec, dataclasses.replace(o, kv_cache_dtype="fp8"))
    _same_or_better(a, b)
    assert b.layout.kv_bytes_per_token <= a.layout.kv_bytes_per_token


@SETTINGS
@given(scenarios(), st.sampled_from([0.5, 0.7, 0.8, 0.85]))
def test_higher_gmu_never_fits_worse(sc, gmu):
    spec, o = sc
    o = dataclasses.replace(o, kv_cache_gib=None)
    lo, hi = sorted([o.gpu_memory_utilization, gmu])
    _same_or_better(plan(spec, dataclasses.replace(o, gpu_memory_utilization=lo)),
                    plan(spec, dataclasses.replace(o, gpu_memory_utilization=hi)))


@SETTINGS
@given(scenarios())
def test_json_contract_shape(sc):
    spec, o = sc
    j = plan(spec, o).to_json()
    assert isinstance(j["fits"], bool) and j["reasons"] and all(isinstance(r, str) for r in j["reasons"])
    assert j["num_blocks"] >= 0 and j["kv_cache_tokens"] >= 0
    json.dumps(j, allow_nan=False)


# ------------------------------------------------------------------ odd configs

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=8,
)
BASES = {f.name: json.loads(f.read_text()) for f in sorted(SPECS_DIR.glob("*.config.json"))}


@st.composite
def mutated_configs(draw):
    cfg = copy.deepcopy(BASES[draw(st.sampled_from(sorted(BASES)))])
    for _ in range(draw(st.integers(1, 4))):
        nested = isinstance(cfg.get("text_config"), dict)
        target = cfg["text_config"] if nested and draw(st.booleans()) else cfg
        keys = sorted(target)
        action = draw(st.sampled_from(["replace", "delete", "zero", "huge"]))
        key = draw(st.sampled_from(keys)) if keys else "hidden_size"
        if action == "delete":
            target.pop(key, None)
        elif action == "zero":
            target[key] = 0
        elif action == "huge":
            target[key] = draw(st.sampled_from([10**30, 2**63, 1e308, -1]))
        else:
            target[key] = draw(JSON_VALUES)
    return cfg


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_configs(), st.sampled_from([1, 2]))
def test_odd_configs_are_user_errors_or_plans(cfg, tp):
    try:
        spec = spec_from_config(json.loads(json.dumps(cfg)), "odd", "test")
        r = plan(spec, PlanOptions(tp=tp, max_model_len=min(4096, spec.geometry.max_position)))
        json.dumps(r.to_json(), allow_nan=False)
    except UserError as exc:
        assert "\n" not in exc.message


@settings(max_examples=100, deadline=None)
@given(JSON_VALUES)
def test_any_json_document_is_a_user_error_or_a_spec(doc):
    try:
        spec_from_config(doc, "odd", "test")
    except UserError as exc:
        assert exc.message


@pytest.mark.parametrize("cfg", [
    {"hidden_size": 64, "num_hidden_layers": 0, "num_attention_heads": 4, "vocab_size": 8},
    {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 2**80},
    {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 8, "head_dim": -1},
    {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 8,
     "intermediate_size": 64, "max_position_embeddings": float("inf")},
    {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 8,
     "num_experts": 4},  # MoE without any intermediate size
])
def test_specific_odd_configs(cfg):
    with pytest.raises(UserError):
        spec_from_config(cfg, "odd", "test")
