"""Recipes in the three community formats read into one typed Recipe (sparkconsole.recipes).

The real files under tests/fixtures/recipes/real/ are copied verbatim from public registries
(each names its repository, path and commit on its first line); the bundled recipes are the same
deployment written in each format, so they must read to the same facts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkconsole.cli import main
from sparkconsole.recipes import (
    RecipeError,
    bundled_recipes,
    detect_format,
    find_recipe,
    load_catalogue,
    load_recipe,
    parse_recipe_text,
    user_recipe_dir,
)
from sparkconsole.recipes.bounded import MAX_DEPTH, MAX_FILE_BYTES

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "recipes"
REAL = FIX / "real"
MODEL = "Qwen/Qwen3.5-122B-A10B-FP8"
FIELD_FLAGS = ("--enable-prefix-caching", "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder",
               "--reasoning-parser", "qwen3")


def one_line_error(call, *args, **kwargs) -> str:
    with pytest.raises(RecipeError) as info:
        call(*args, **kwargs)
    msg = info.value.message
    assert "\n" not in msg and "Traceback" not in msg
    assert info.value.exit_code == 2
    return msg


# ---- the bundled catalogue -------------------------------------------------------------------

def test_bundled_recipes_read_to_the_same_facts_in_every_format():
    recipes = {r.format: r for r in bundled_recipes()}
    assert set(recipes) == {"sparkrun", "eugr-v1", "spark-pulse-v2"}
    facts = {(r.model, r.engine, r.image, r.tp, r.pp, r.min_nodes, r.gpu_memory_utilization, r.max_model_len,
              r.port, r.host, r.serve_args, r.distributed, r.mods) for r in recipes.values()}
    assert facts == {(MODEL, "vllm", "nvcr.io/nvidia/vllm:26.05-py3", 2, 1, 2, 0.7, 262144, 8000, "0.0.0.0",
                      ("--max-num-batched-tokens", "8192", *FIELD_FLAGS), "native", ())}
    for r in recipes.values():
        assert r.origin == "bundled"
        assert r.cannot_run_here(2) is None
        assert r.provenance.vllm_version == "0.20.1" and r.provenance.cuda == "13"
        assert r.provenance.source and r.provenance.source.startswith("https://github.com/")
        assert r.provenance.measured[0].tok_s == 31.5 and r.provenance.measured[0].concurrency == 1
        assert r.command[:3] == ("vllm", "serve", MODEL)


def test_the_sparkrun_bundled_recipe_is_named_by_its_file_stem():
    r = find_recipe("qwen3.5-122b-a10b-fp8-tp2-ngc")
    assert r.format == "sparkrun" and r.path == "bundled/qwen3.5-122b-a10b-fp8-tp2-ngc.yaml"
    assert [m.concurrency for m in r.provenance.measured] == [1, 2, 4]


# ---- real registry files ---------------------------------------------------------------------

@pytest.mark.parametrize("name, fmt, image, gmu", [
    ("sparkrun-qwen3.5-122b-a10b-fp8-vllm.yaml", "sparkrun", "ghcr.io/spark-arena/dgx-vllm-eugr-nightly:latest", 0.7),
    ("eugr-qwen3.5-122b-fp8.yaml", "eugr-v1", "vllm-thor", 0.7),
    ("spark-pulse-qwen3.5-122b-fp8.yaml", "spark-pulse-v2", "vllm-node", 0.8),
])
def test_real_registry_files_parse(name, fmt, image, gmu):
    path = REAL / name
    assert path.read_text().startswith("# source: ")
    r = load_recipe(path)
    assert (r.format, r.model, r.engine, r.image) == (fmt, MODEL, "vllm", image)
    assert (r.tp, r.pp, r.min_nodes, r.max_model_len, r.gpu_memory_utilization) == (2, 1, 2, 262144, gmu)
    assert r.mods == ("mods/fix-qwen3.5-chat-template",)
    assert r.distributed == "native"  # eugr and Spark Pulse drop the Ray flag; sparkrun's file has none
    for flag in ("--enable-auto-tool-choice", "--chat-template", "unsloth.jinja"):
        assert flag in r.serve_args
    assert "--distributed-executor-backend" not in r.serve_args and "-tp" not in r.serve_args
    assert r.cannot_run_here(2) == "needs mod mods/fix-qwen3.5-chat-template, and the console applies no mods"


def test_real_eugr_file_renders_its_ray_flag_away_but_keeps_it_when_asked():
    text = (REAL / "eugr-qwen3.5-122b-fp8.yaml").read_text()
    assert "--distributed-executor-backend ray" in text
    asked = parse_recipe_text(text, "x", overrides={"distributed_executor_backend": "ray"})
    assert asked.distributed == "ray"


# ---- format detection ------------------------------------------------------------------------

@pytest.mark.parametrize("data, fmt", [
    ({"recipe_version": "1", "name": "x", "command": "c"}, "eugr-v1"),
    ({"recipe_version": 1, "model": "m"}, "eugr-v1"),
    ({"recipe_version": "2", "name": "x", "model": "m", "params": {}}, "spark-pulse-v2"),
    ({"name": "x", "model": "m", "engines": {"vllm": {}}}, "spark-pulse-v2"),
    ({"recipe_version": "2", "model": "m", "runtime": "vllm", "command": "c"}, "sparkrun"),
    ({"name": "x", "command": "c", "min_nodes": 2}, "sparkrun"),
    ({"name": "x", "container": "c", "command": "vllm serve m"}, "eugr-v1"),
    ({"model": "m", "container": "c"}, "sparkrun"),
])
def test_detect_format_rule(data, fmt):
    assert detect_format(data) == fmt


def test_an_unknown_recipe_version_is_one_line_naming_the_key():
    msg = one_line_error(load_recipe, FIX / "bad" / "unknown-version.yaml")
    assert msg.startswith(str(FIX / "bad" / "unknown-version.yaml") + ": key 'recipe_version' ")


# ---- placeholders ----------------------------------------------------------------------------

def test_sparkrun_placeholders_fill_from_overrides_then_defaults_and_repeat_until_stable():
    r = load_recipe(FIX / "sparkrun-placeholders.yaml", overrides={"port": 9100},
                    environ={"HOME": "/home/spark"})
    assert r.port == 9100  # the override beats defaults.port 9000
    assert r.tp == 2 and r.min_nodes == 2
    i = r.serve_args.index("--served-model-name")
    assert r.serve_args[i + 1] == "org/some-model-v1"  # {served} → {base} → {model}-{tag}
    j = r.serve_args.index("--unknown-flag")
    assert r.serve_args[j + 1] == "{not_a_default}"  # an unknown placeholder stays as written
    assert r.distributed == "ray" and "--distributed-executor-backend" not in r.serve_args
    assert r.env == {"HF_TOKEN_FILE": "/home/spark/.hf", "KEEP": "${NOT_SET_ANYWHERE}"}
    assert r.host == "0.0.0.0"  # not in defaults: the runtime default fills {host}


def test_sparkrun_placeholders_that_grow_without_end_are_one_line():
    text = "model: m\ncontainer: c\ndefaults:\n  a: '{a}{a}'\ncommand: vllm serve {model} --x {a}\n"
    msg = one_line_error(parse_recipe_text, text, "loop", "r/loop.yaml")
    assert msg.startswith("r/loop.yaml: key 'command' ")


def test_sparkrun_without_command_builds_flags_from_defaults():
    text = ("model: org/m\ncontainer: c\nruntime: sglang\ndefaults:\n  tensor_parallel: 2\n"
            "  gpu_memory_utilization: 0.6\n  max_model_len: 4096\n  trust_remote_code: true\n")
    r = parse_recipe_text(text, "gen")
    assert (r.engine, r.tp, r.gpu_memory_utilization, r.max_model_len) == ("sglang", 2, 0.6, 4096)
    assert r.serve_args == ("--trust-remote-code",) and r.model == "org/m"


def test_eugr_braces_are_literal_and_solo_forces_tp_1():
    r = load_recipe(FIX / "eugr-braces.yaml")
    assert r.format == "eugr-v1" and r.title == "Braces"
    assert r.tp == 1 and r.max_nodes == 1 and r.min_nodes == 1 and r.distributed == "single"
    i = r.serve_args.index("--speculative-config")
    assert json.loads(r.serve_args[i + 1]) == {"method": "mtp", "num_speculative_tokens": 2}
    assert "--distributed-executor-backend" not in r.serve_args and r.gpu_memory_utilization == 0.5


def test_eugr_missing_key_is_an_error_naming_the_placeholder():
    msg = one_line_error(load_recipe, FIX / "bad" / "missing-key.yaml")
    assert "key 'command'" in msg and "{max_model_len}" in msg


def test_eugr_format_attribute_access_and_huge_width_are_refused():
    base = "recipe_version: '1'\nname: n\ncontainer: c\nmodel: m\ndefaults:\n  port: 8000\ncommand: "
    assert "plain name" in one_line_error(parse_recipe_text, base + "vllm serve m {port.__class__}", "a")
    assert "width" in one_line_error(parse_recipe_text, base + "vllm serve m {port:>999999999}", "b")


def test_spark_pulse_params_become_engine_flags_and_args_fill_params():
    text = """recipe_version: "2"
name: S
model: org/m
engine: sglang
params: {tensor_parallel: 2, gpu_memory_utilization: 0.5, max_model_len: 8192, port: 30000, chunk: 4096}
engines:
  sglang:
    image: scitrera/dgx-spark-sglang:0.5.9-t5
    env: {NCCL_IB_DISABLE: 0}
    args: ["--chunked-prefill-size {chunk}", --attention-backend triton]
"""
    r = parse_recipe_text(text, "s")
    assert r.command[:5] == ("python3", "-m", "sglang.launch_server", "--model-path", "org/m")
    assert "--tp" in r.command and "--mem-fraction-static" in r.command and "--context-length" in r.command
    assert (r.tp, r.gpu_memory_utilization, r.max_model_len, r.port) == (2, 0.5, 8192, 30000)
    assert r.serve_args == ("--chunked-prefill-size", "4096", "--attention-backend", "triton")
    assert r.env == {"NCCL_IB_DISABLE": "0"} and r.distributed == "native"


def test_spark_pulse_top_level_command_needs_an_engine():
    text = "recipe_version: '2'\nname: n\nmodel: m\nparams: {port: 1}\ncommand: vllm serve m --port {port}\n"
    assert "key 'engine'" in one_line_error(parse_recipe_text, text, "x")
    ok = parse_recipe_text(text + "engine: vllm\n", "x")
    assert ok.port == 1 and ok.engine == "vllm"


# ---- command forms and constraints -------------------------------------------------------------

@pytest.mark.parametrize("flag", ["--tensor-parallel-size 4", "-tp 4", "--tensor-parallel-size=4"])
def test_tp_is_read_in_every_form(flag):
    r = parse_recipe_text(f"model: m\ncontainer: c\ncommand: vllm serve m {flag} -pp 2 --max-model-len=1024\n", "t")
    assert (r.tp, r.pp, r.nodes, r.min_nodes, r.max_model_len) == (4, 2, 8, 8, 1024)
    assert r.serve_args == ()


def test_cluster_only_and_solo_only():
    eugr = "recipe_version: '1'\nname: n\ncontainer: c\nmodel: m\ncommand: vllm serve m\n"
    assert parse_recipe_text(eugr + "cluster_only: true\n", "c").min_nodes == 2
    assert "key 'solo_only'" in one_line_error(parse_recipe_text, eugr + "cluster_only: true\nsolo_only: true\n", "x")
    pulse = "recipe_version: '2'\nname: n\nmodel: m\nengines: {vllm: {image: i}}\n"
    r = parse_recipe_text(pulse + "constraints: {solo_only: true}\nparams: {tensor_parallel: 4}\n", "p")
    assert (r.tp, r.max_nodes) == (1, 1)
    assert parse_recipe_text(pulse + "constraints: {min_nodes: 3}\n", "p").min_nodes == 3
    msg = one_line_error(parse_recipe_text, pulse + "constraints: {nodes: 3}\n", "x")
    assert "key 'constraints.nodes'" in msg
    msg = one_line_error(parse_recipe_text, "model: m\ncontainer: c\nmax_nodes: 1\ncommand: vllm serve m -tp 2\n", "x")
    assert "key 'max_nodes'" in msg


def test_ray_is_detected_from_the_command_or_runtime():
    base = "model: m\ncontainer: c\n"
    assert parse_recipe_text(base + "command: vllm serve m -tp 2\n", "a").distributed == "native"
    assert parse_recipe_text(base + "command: vllm serve m -tp 2 --distributed-executor-backend=ray\n",
                             "b").distributed == "ray"
    assert parse_recipe_text(base + "runtime: vllm-ray\ncommand: vllm serve m -tp 2\n", "c").distributed == "ray"
    assert parse_recipe_text(base + "command: vllm serve m\n", "d").distributed == "single"


# ---- cannot_run_here ---------------------------------------------------------------------------

def test_cannot_run_here_names_each_reason_on_one_line():
    r = parse_recipe_text("model: m\ncontainer: c\nruntime: trtllm\nmods: [mods/a, mods/b]\n"
                          "command: trtllm-serve m --tp_size 2 -tp 2\n", "t")
    why = r.cannot_run_here(1)
    assert why is not None and "\n" not in why
    assert "engine 'trtllm'" in why and "mods/a (+1 more)" in why and "needs 2 Sparks" in why
    ok = parse_recipe_text("model: m\ncontainer: c\ncommand: vllm serve m -tp 2\n", "ok")
    assert ok.cannot_run_here(2) is None and ok.cannot_run_here(None) is None
    assert ok.cannot_run_here(1) == "needs 2 Sparks (tp 2 × pp 1), the cluster has 1"
    assert "no container image" in parse_recipe_text("model: m\ncommand: vllm serve m\n", "n").cannot_run_here(1)


# ---- bad files: one line naming file and key ---------------------------------------------------

def test_wrong_type_names_file_and_key():
    msg = one_line_error(load_recipe, FIX / "bad" / "wrong-type.yaml")
    assert msg == f"{FIX / 'bad' / 'wrong-type.yaml'}: key 'defaults.tensor_parallel' must be an integer"


@pytest.mark.parametrize("text, key", [
    ("model: m\ncontainer: c\ncommand: vllm serve m\nenv: {'BAD NAME': x}\n", "env.BAD NAME"),
    ("model: m\ncontainer: [c]\ncommand: vllm serve m\n", "container"),
    ("model: m\ncontainer: c\nmods: [1]\ncommand: vllm serve m\n", "mods"),
    ("recipe_version: '2'\nname: n\nmodel: m\nparams: {gpu_memory_utilization: 1.5}\n", "params.gpu_memory_utilization"),
    ("recipe_version: '2'\nname: n\nmodel: m\nparams: {port: 70000}\n", "params.port"),
    ("model: m\ncontainer: c\ncommand: vllm serve m --port abc\n", "command"),
    ("model: m\ncontainer: c\nmin_nodes: true\ncommand: vllm serve m\n", "min_nodes"),
    ("model: m\ncontainer: c\ncommand: vllm serve m\nmetadata: {measured: [{tok_s: fast}]}\n",
     "metadata.measured[0].tok_s"),
])
def test_bad_values_name_their_key(text, key):
    assert f"bad.yaml: key '{key}' " in one_line_error(parse_recipe_text, text, "bad", "bad.yaml")


def test_too_big_file(tmp_path):
    f = tmp_path / "big.yaml"
    f.write_text("model: m\n" + "# pad\n" * (MAX_FILE_BYTES // 6 + 10))
    assert "larger than 256 KiB" in one_line_error(load_recipe, f)


def test_too_deep_names_the_key(tmp_path):
    f = tmp_path / "deep.yaml"
    nested = "x: " + "{a: " * (MAX_DEPTH + 4) + "1" + "}" * (MAX_DEPTH + 4)
    f.write_text("model: m\nmetadata:\n  " + nested + "\n")
    msg = one_line_error(load_recipe, f)
    assert f"nests deeper than {MAX_DEPTH}" in msg and "key 'metadata.x.a.a" in msg


def test_very_deep_nesting_is_refused_before_it_is_built(tmp_path):
    f = tmp_path / "abyss.yaml"
    f.write_text("model: " + "[" * 100_000 + "]" * 100_000 + "\n")
    assert "nests deeper" in one_line_error(load_recipe, f)


def test_yaml_alias_bomb_is_one_line():
    msg = one_line_error(load_recipe, FIX / "bad" / "alias-bomb.yaml")
    assert "aliases" in msg


def test_alias_expansion_under_the_alias_count_is_caught_by_the_node_budget():
    lines = ["a0: &a0 [x, x, x]"] + [f"a{i}: &a{i} [*a{i-1}, *a{i-1}, *a{i-1}]" for i in range(1, 16)]
    msg = one_line_error(parse_recipe_text, "\n".join(lines) + "\nmodel: m\n", "b", "b.yaml")
    assert msg.startswith("b.yaml: ") and "values" in msg


def test_not_yaml_and_not_a_mapping_and_not_utf8(tmp_path):
    assert "is not valid YAML at line" in one_line_error(load_recipe, FIX / "bad" / "not-yaml.yaml")
    assert "must be a YAML mapping" in one_line_error(parse_recipe_text, "- a\n- b\n", "l", "l.yaml")
    assert one_line_error(parse_recipe_text, "", "e", "e.yaml") == "e.yaml: is empty"
    f = tmp_path / "bin.yaml"
    f.write_bytes(b"model: \xff\xfe\n")
    assert "not UTF-8" in one_line_error(load_recipe, f)
    assert "not a .yaml" in one_line_error(load_recipe, tmp_path / "x.txt")


def test_control_characters_never_reach_an_error_line():
    msg = one_line_error(parse_recipe_text, "model: m\ncontainer: c\ncommand: vllm serve m\nenv: {\"A\\e[2J\": x}\n",
                         "c", "c.yaml")
    assert "\x1b" not in msg and "key 'env.A" in msg


# ---- discovery ---------------------------------------------------------------------------------

def test_user_folder_is_beside_the_inventory_and_replaces_a_bundled_name(tmp_path, monkeypatch):
    inv = tmp_path / "cluster.toml"
    inv.write_text('[[nodes]]\nname = "a"\nhost = "10.0.0.1"\n')
    folder = user_recipe_dir(str(inv))
    assert folder == tmp_path / "recipes"
    folder.mkdir()
    (folder / "qwen3.5-122b-a10b-fp8-tp2-ngc.yaml").write_text("model: mine/m\ncontainer: c\ncommand: vllm serve m\n")
    (folder / "broken.yaml").write_text("model: [\n")
    cat = load_catalogue(folder, [REAL / "eugr-qwen3.5-122b-fp8.yaml"])
    mine = [r for r in cat.recipes if r.name == "qwen3.5-122b-a10b-fp8-tp2-ngc"]
    assert len(mine) == 1 and mine[0].model == "mine/m" and mine[0].origin == "user"
    assert cat.recipes[-1].origin == "file" and len(cat.errors) == 1 and "broken.yaml" in cat.errors[0]
    assert find_recipe("qwen3.5-122b-a10b-fp8-tp2-ngc", folder).model == "mine/m"  # broken neighbour ignored
    assert find_recipe("qwen3.5-122b-a10b-fp8-tp2-ngc-pulse", folder).format == "spark-pulse-v2"
    assert find_recipe(str(REAL / "eugr-qwen3.5-122b-fp8.yaml")).format == "eugr-v1"
    msg = one_line_error(find_recipe, "nope", folder)
    assert "no recipe named 'nope'" in msg and "qwen3.5-122b-a10b-fp8-tp2-ngc-eugr" in msg


# ---- the CLI -----------------------------------------------------------------------------------

def _cli(*args: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SPARKCONSOLE_CONFIG": "", **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "sparkconsole.cli", "recipes", *args], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=120)


def test_cli_json_lists_the_bundled_recipes(tmp_path):
    out = _cli("--json", "--nodes", "1", env_extra={"XDG_CONFIG_HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    names = {d["name"] for d in data}
    assert {"qwen3.5-122b-a10b-fp8-tp2-ngc", "qwen3.5-122b-a10b-fp8-tp2-ngc-eugr",
            "qwen3.5-122b-a10b-fp8-tp2-ngc-pulse"} <= names
    assert all(d["cannot_run_here"] == "needs 2 Sparks (tp 2 × pp 1), the cluster has 1" for d in data)
    assert all(d["serve_args"][-1] == "qwen3" for d in data)


def test_cli_bad_file_is_exit_2_with_exactly_one_stderr_line(tmp_path):
    out = _cli(str(FIX / "bad" / "wrong-type.yaml"), env_extra={"XDG_CONFIG_HOME": str(tmp_path)})
    assert out.returncode == 2
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and "key 'defaults.tensor_parallel' must be an integer" in lines[0]
    assert "Traceback" not in out.stderr and "qwen3.5-122b-a10b-fp8-tp2-ngc" in out.stdout


def test_cli_table_in_process(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKCONSOLE_CONFIG", "")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert main(["recipes", "--nodes", "2", str(REAL / "spark-pulse-qwen3.5-122b-fp8.yaml")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:6] == ["NAME", "FORMAT", "MODEL", "ENGINE", "NODES", "IMAGE"]
    pulse = next(line for line in out if line.startswith("spark-pulse-qwen3.5-122b-fp8"))
    assert "spark-pulse-v2" in pulse and "needs mod mods/fix-qwen3.5-chat-template" in pulse
    assert main(["recipes", "--nodes", "0"]) == 2
