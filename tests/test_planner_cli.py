"""`sparkconsole plan` end to end: the contract in ARCHITECTURE.md (keys, defaults, exit codes)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sparkconsole.cli import main
from sparkconsole.planner.plan import JSON_KEYS

Q122 = "Qwen/Qwen3.5-122B-A10B-FP8"


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _plan(capsys, *args: str) -> tuple[int, dict | str, str]:
    rc = main(["plan", *args])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if "--json" in args else out), err


def _cli() -> list[str]:
    exe = shutil.which("sparkconsole", path=str(Path(sys.executable).parent))
    return [exe] if exe else [sys.executable, "-m", "sparkconsole.cli"]


def test_headline_tp1_does_not_fit_real_process(tmp_path):
    env = {**os.environ, "SPARKCONSOLE_STATE_DIR": str(tmp_path / "s"), "HF_HUB_OFFLINE": "1"}
    p = subprocess.run([*_cli(), "plan", Q122, "--tp", "1", "--json"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert p.returncode == 1, p.stderr
    j = json.loads(p.stdout)
    assert tuple(j) == JSON_KEYS
    assert j["fits"] is False and j["tp"] == 1
    assert 115 <= j["weights_gib_per_node"] <= 117
    assert j["kv_bytes_per_token_per_node"] == 24_576


def test_headline_tp2_fits_real_process(tmp_path):
    env = {**os.environ, "SPARKCONSOLE_STATE_DIR": str(tmp_path / "s"), "HF_HUB_OFFLINE": "1"}
    p = subprocess.run([*_cli(), "plan", Q122, "--tp", "2", "--nodes", "2", "--json"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    assert j["fits"] is True and j["tp"] == 2
    assert 57.5 <= j["weights_gib_per_node"] <= 58.5
    assert j["kv_bytes_per_token_per_node"] == 12_288
    assert j["block_size_tokens"] == 2_096
    assert j["state_bytes_per_request_per_node"] == 36 * 2_134_016
    assert j["kv_cache_tokens"] == int(j["num_blocks"] / 132 * 262_144)


@pytest.mark.parametrize(("gmu", "gib", "blocks", "conc"), [("0.85", "39.88", 1_662, 12.59), ("0.80", "33.79", 1_408, 10.67)])
def test_research_table_via_kv_cache_gib(capsys, gmu, gib, blocks, conc):
    rc, j, _ = _plan(capsys, Q122, "--tp", "2", "--gpu-memory-utilization", gmu, "--max-model-len", "262144",
                     "--kv-cache-gib", gib, "--json")
    assert rc == 0
    assert j["num_blocks"] == blocks and j["max_concurrency"] == conc
    assert j["kv_cache_gib_per_node"] == float(gib)


def test_fp8_kv_row(capsys):
    rc, j, _ = _plan(capsys, Q122, "--tp", "2", "--kv-cache-dtype", "fp8", "--kv-cache-gib", "33.79", "--json")
    assert rc == 0
    assert (j["block_size_tokens"], j["num_blocks"], j["max_concurrency"]) == (4_176, 1_414, 20.49)
    assert j["kv_bytes_per_token_per_node"] == 6_144


def test_nodes_alone_sets_tp(capsys):
    rc, j, _ = _plan(capsys, Q122, "--nodes", "2", "--json")
    assert rc == 0 and j["tp"] == 2


def test_dense_qwen3_235b_tp4(capsys):
    rc, j, _ = _plan(capsys, "Qwen/Qwen3-235B-A22B", "--tp", "4", "--json")
    assert j["kv_bytes_per_token_per_node"] == 48_128
    assert j["block_size_tokens"] == 16 and j["state_bytes_per_request_per_node"] == 0
    assert rc == 1 and j["fits"] is False       # 235B BF16 is ~110 GiB per node at TP=4
    rc, j, _ = _plan(capsys, "Qwen/Qwen3-235B-A22B-FP8", "--tp", "4", "--json")
    assert rc == 0 and j["fits"] is True


def test_dense_qwen3_8b_one_spark(capsys):
    rc, j, _ = _plan(capsys, "Qwen/Qwen3-8B", "--json")
    assert rc == 0
    assert j["kv_bytes_per_token_per_node"] == 147_456 and j["block_size_tokens"] == 16
    assert j["num_blocks"] == int(j["kv_cache_gib_per_node"] * 2**30) // (16 * 147_456)


def test_speculative_decoding_loads_mtp(capsys):
    _, plain, _ = _plan(capsys, Q122, "--tp", "2", "--json")
    rc, spec, _ = _plan(capsys, Q122, "--tp", "2", "--num-speculative-tokens", "2", "--json")
    assert rc == 0
    assert spec["weights_gib_per_node"] > plain["weights_gib_per_node"] + 1
    assert spec["kv_bytes_per_token_per_node"] == 13 * 1_024


def test_no_prefix_caching_and_language_model_only(capsys):
    _, a, _ = _plan(capsys, Q122, "--tp", "2", "--json")
    _, b, _ = _plan(capsys, Q122, "--tp", "2", "--no-enable-prefix-caching", "--language-model-only", "--json")
    assert b["max_concurrency"] > a["max_concurrency"]
    assert b["weights_gib_per_node"] < a["weights_gib_per_node"]


def test_node_memory_override(capsys):
    rc, j, _ = _plan(capsys, Q122, "--tp", "1", "--node-memory-gib", "256", "--json")
    assert rc == 0 and j["fits"] is True


def test_text_output_is_a_table(capsys):
    rc, out, _ = _plan(capsys, Q122, "--tp", "1")
    assert rc == 1
    assert "DOES NOT FIT" in out and "weights per node" in out and "way out" in out


@pytest.mark.parametrize("args", [
    ["../x"], ["a/b;rm -rf"], ["$(x)/y"], ["a/b/c"], ["nobody/unknown"],
    [Q122, "--tp", "0"], [Q122, "--tp", "3"], [Q122, "--tp", "2", "--nodes", "4"],
    [Q122, "--gpu-memory-utilization", "0.95"], [Q122, "--gpu-memory-utilization", "nan"],
    [Q122, "--kv-cache-dtype", "int4"], [Q122, "--max-model-len", "99999999"],
    [Q122, "--num-speculative-tokens", "-1"], [Q122, "--kv-cache-gib", "-3"],
    ["/nonexistent/config.json"],
])
def test_bad_input_exits_2_with_one_line(capsys, args):
    try:
        rc = main(["plan", *args, "--json"])
    except SystemExit as exc:       # argparse usage errors
        rc = exc.code
    out, err = capsys.readouterr()
    assert rc == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_bad_input_exit_code_through_argparse():
    # argparse usage errors exit through SystemExit(2)
    with pytest.raises(SystemExit) as exc:
        main(["plan", Q122, "--tp", "zero"])
    assert exc.value.code == 2


def test_force_allows_high_gmu_with_warning(capsys):
    rc, j, _ = _plan(capsys, Q122, "--tp", "2", "--gpu-memory-utilization", "0.92", "--force", "--json")
    assert rc == 0 and any("above 0.85" in r for r in j["reasons"])


def test_broken_config_file_exit_2(tmp_path, capsys):
    p = tmp_path / "config.json"
    p.write_text("[]")
    rc = main(["plan", str(p), "--json"])
    _, err = capsys.readouterr()
    assert rc == 2 and "not a JSON object" in err
