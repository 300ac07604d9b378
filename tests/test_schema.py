"""The files the console reads are checked before a value in them is trusted (sparkconsole.schema).

A twin file is a stranger's file: ``"mem_total": "lots"`` ended the demo with a TypeError,
``10**400`` with an OverflowError, 100,000 nested ``[`` with a RecursionError, a 300-node twin
started 300 SSH servers past the 64-node cap, and its node names went to the terminal unchecked.
An inventory key spelt wrong (``read_ony = true``) was ignored, and the cluster was not read-only.
Each is now one line on stderr and exit 2, naming the file and the key.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from sparkconsole import config as cfg
from sparkconsole import schema as S
from sparkconsole.deploy import twin as T
from sparkconsole.deploy.flow import DEFAULT_MODEL
from sparkconsole.deploy.recon import Holder, ImageFacts, LinkFacts, Listener, NodeFacts
from sparkconsole.errors import ConfigError


def _facts(node: str) -> NodeFacts:
    """A node as recon reads it, every kind of field filled."""
    return NodeFacts(
        node=node, gpu="NVIDIA GB10", driver="580.95.05", cuda="13.0", mem_total=128 << 30,
        mem_available=100 << 30, page_cache=2 << 30, user="jhunt", uid=1001, gid=1001,
        groups=["jhunt", "docker"], sudo="none", tools={"hf": False, "rsync": True}, home="/home/jhunt",
        disk_free=900 << 30, disk_mount="/", docker="28.3.3", storage_driver="overlayfs", image_store="containerd",
        images=[ImageFacts("ollama/ollama:latest", "sha256:" + "a" * 64, size="3.2GB")],
        containers=[{"name": "ollama", "image": "ollama/ollama:latest", "state": "running", "status": "Up 3 days",
                     "mem": 900 << 20, "cpu": 4.2}],
        holders=[Holder("process", "/usr/bin/ollama", 6 << 30, detail="container ollama")],
        links=[LinkFacts("rocep1s0f1", "enp1s0f1np1", True, 1, ["192.168.200.12/24"], mtu=9000, gid_v2_index=3)],
        hub=True, token=True, listeners=[Listener(11434, "0.0.0.0", "ollama", 4242, container="ollama")],
        read_at=1_774_700_000.0)


def good_twin() -> dict:
    twin = T.Twin("lab", DEFAULT_MODEL, 1_774_700_000.0, [_facts("gx10-a"), _facts("gx10-b")],
                  weights={"gx10-a": True, "gx10-b": False},
                  hub_files=[T.HubFileFacts("config.json", 1234, None)],
                  measured={"hub_download": 1.2e8, "hf_start_s": None}, not_checked=["the engine check"],
                  model_config={"architectures": ["Qwen3ForCausalLM"], "text_config": {"num_hidden_layers": 48}})
    return json.loads(T.dumps(twin))


def test_a_twin_as_the_rehearsal_writes_it_reads_back(tmp_path):
    p = tmp_path / "twin.json"
    p.write_text(json.dumps(good_twin()))
    twin = T.load(p)
    assert [n.node for n in twin.nodes] == ["gx10-a", "gx10-b"]
    assert twin.nodes[0].links[0].gid_v2_index == 3 and twin.nodes[0].containers[0]["cpu"] == 4.2
    # a cluster given with --host is named by its hosts, IPv6 addresses too
    data = good_twin()
    data["nodes"][1]["node"] = "fe80::1%enp1s0"
    data["nodes"][0]["user"] = "jhunt@corp.example"
    p.write_text(json.dumps(data))
    assert [n.node for n in T.load(p).nodes] == ["gx10-a", "fe80::1%enp1s0"]


def _with(path: tuple, value) -> dict:
    data = good_twin()
    *head, last = path
    node = data
    for key in head:
        node = node[key]
    node[last] = value
    return data


HUGE = "1" + "0" * 400  # 10**400: a JSON integer float() overflows on
BAD_TWINS = {
    "string-for-number": (json.dumps(_with(("nodes", 0, "mem_total"), "lots")), "nodes[0].mem_total"),
    "huge-number": (json.dumps(_with(("nodes", 1, "containers", 0, "mem"), 7)).replace('"mem": 7', f'"mem": {HUGE}'),
                    "nodes[1].containers[0].mem"),
    "deep-nesting": (json.dumps(_with(("model_config",), {"x": 1})).replace('{"x": 1}', '{"x": ' + "[" * 100_000 + "]"
                                                                             * 100_000 + "}"), "nests deeper than"),
    "300-nodes": (json.dumps({**good_twin(), "nodes": [_facts(f"n{i}").to_json() for i in range(300)]}),
                  "'nodes' has 300 items"),
    "bad-name": (json.dumps(_with(("nodes", 0, "node"), "ev\x1b]0;PWNED\x07il")), "nodes[0].node"),
    "nan": (json.dumps(_with(("read_at",), math.nan)), "NaN"),
}


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([sys.executable, "-m", "sparkconsole.cli", *args], capture_output=True, text=True,
                              timeout=120, cwd=cwd, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:  # the demo started on the file instead of refusing it
        pytest.fail(f"{args}: still running after {exc.timeout} s")


@pytest.mark.parametrize("case", sorted(BAD_TWINS))
def test_a_bad_twin_value_is_one_line_and_exit_2(tmp_path, case):
    text, words = BAD_TWINS[case]
    p = tmp_path / "twin.json"
    p.write_text(text)
    out = _cli("demo", "--serve", "--twin", str(p), cwd=tmp_path)
    err = out.stderr.strip()
    assert out.returncode == 2, err[-2000:]
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert str(p) in err and words in err
    assert "\x1b" not in err and "listen" not in out.stdout


def test_deploy_on_a_bad_twin_refuses_it_before_anything_starts(tmp_path):
    p = tmp_path / "twin.json"
    p.write_text(BAD_TWINS["string-for-number"][0])
    out = _cli("deploy", "--demo", "--twin", str(p), "--until", "recon", "--yes", cwd=tmp_path)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "key 'nodes[0].mem_total' must be a whole number" in out.stderr and '"lots"' in out.stderr


@pytest.mark.parametrize(("change", "words"), [
    (lambda d: d["nodes"][0].update(mem_totl=1), "unknown key 'nodes[0].mem_totl' (did you mean 'mem_total'?)"),
    (lambda d: d["nodes"][0]["links"][0].update(up="yes"), "key 'nodes[0].links[0].up' must be true or false"),
    (lambda d: d["nodes"][0].update(uid=-1), "key 'nodes[0].uid' must be a whole number from 0 to 4294967295"),
    (lambda d: d["nodes"][0].update(mem_total=True), "not true"),
    (lambda d: d["weights"].update({"bad name": True}), "key 'weights' has a key that must be a node name"),
    (lambda d: d["hub_files"].append({"path": "../../etc/passwd", "size": 1}), "key 'hub_files[1].path'"),
    (lambda d: d.update(cluster="lab\x1b]0;x\x07"), "key 'cluster' must be a name of at most 128 printable"),
    (lambda d: d["model_config"].update(x="a" * 70_000), "key 'model_config.x' is longer than 65536 characters"),
])
def test_each_twin_field_is_checked(tmp_path, change, words):
    data = good_twin()
    change(data)
    p = tmp_path / "twin.json"
    p.write_text(json.dumps(data))
    with pytest.raises(T.TwinError) as exc:
        T.load(p)
    assert words in exc.value.message and "\n" not in exc.value.message and exc.value.exit_code == 2


def test_a_twin_file_is_capped_before_it_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(T, "MAX_TWIN_BYTES", 1024)
    p = tmp_path / "twin.json"
    p.write_text(json.dumps(good_twin()))
    with pytest.raises(T.TwinError, match="is larger than 1 KiB"):
        T.load(p)


# ---- the inventory --------------------------------------------------------------------------

INVENTORY = """\
[cluster]
name = "sparks"
read_ony = true

[[nodes]]
name = "spark-1a32"
host = "spark-1a32"
"""
SPELT = INVENTORY.replace("read_ony", "read_only")


def test_a_misspelt_inventory_key_is_exit_2_naming_file_line_and_the_close_key(tmp_path):
    p = tmp_path / "sparks.toml"
    p.write_text(INVENTORY)
    out = _cli("snapshot", "--config", str(p), cwd=tmp_path)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert f"{p}:3: unknown key 'read_ony' in [cluster] (did you mean 'read_only'?)" in out.stderr


@pytest.mark.parametrize(("text", "words"), [
    (SPELT.replace('host = "spark-1a32"', 'hots = "spark-1a32"'),
     "sparks.toml:7: unknown key 'hots' in [[nodes]] (did you mean 'host'?)"),
    (SPELT.replace("[cluster]", "[clustr]"),
     "sparks.toml:1: unknown key 'clustr' in the file"),
    (SPELT.replace("[cluster]", "[clustr]"), "(did you mean 'cluster'?)"),
    ("colour = 1\n" + SPELT, "sparks.toml:1: unknown key 'colour' in the file"),
    (INVENTORY.replace("read_ony = true", 'services = ["ollama"]\ncolour = "red"'),
     "sparks.toml:4: unknown key 'colour' in [cluster]"),
    (SPELT.replace('name = "sparks"', 'name = "a\\u001b]0;x\\u0007"'),
     "sparks.toml:2: key 'name' must be a string of at most 64 printable characters"),
    (INVENTORY.replace("read_ony = true", "x = " + "[" * 5000 + "]" * 5000), "nested too deeply"),
    (SPELT.replace('name = "spark-1a32"', 'name = "spark[/bold]x"'),
     "sparks.toml:6: key 'name' must be a short name"),
    ("".join(f'[[nodes]]\nname = "n{i}"\n' for i in range(65)), "65 [[nodes]] tables; the console watches at most 64"),
])
def test_inventory_mistakes_are_one_line_naming_file_line_and_key(text, words):
    with pytest.raises(ConfigError) as exc:
        cfg.parse_config(text, "sparks.toml")
    assert words in exc.value.message and "\n" not in exc.value.message


def test_an_inventory_is_capped_before_it_is_read(tmp_path):
    p = tmp_path / "sparks.toml"
    p.write_text(SPELT + "#" * (cfg.MAX_CONFIG_BYTES + 1))
    with pytest.raises(ConfigError, match="is larger than 1 MiB"):
        cfg.load_config(p)


def test_the_spelt_key_still_makes_the_cluster_read_only():
    c = cfg.parse_config(SPELT, "sparks.toml")
    assert c.read_only is True and len(cfg.parse_config(
        "".join(f'[[nodes]]\nname = "n{i}"\n' for i in range(64)), "sparks.toml").nodes) == 64


# ---- the schema itself ------------------------------------------------------------------------

def test_numbers_are_checked_by_kind_and_range():
    spec = S.Record({"n": S.Int(0, 10, required=True), "x": S.Num(0, 1)})
    S.check({"n": 3, "x": 0.5}, spec, "f")
    for data, words in [({"n": "3"}, "not \"3\""), ({"n": True}, "not true"), ({"n": 11}, "not 11"),
                        ({"n": 3.0}, "not 3.0"), ({"n": 10**400}, "more than 30 digits"),
                        ({"n": 1, "x": math.inf}, "key 'x' must be a number from 0 to 1"), ({}, "key 'n' is missing")]:
        with pytest.raises(S.SchemaError) as exc:
            S.check(data, spec, "f")
        assert words in exc.value.message and exc.value.message.startswith("f: ")


def test_depth_is_counted_outside_strings_only():
    assert not S.json_depth_exceeds('{"a": "[[[[[[[[[[", "b": [1, {"c": "\\"[[[["}]}', 3)
    assert S.json_depth_exceeds('{"a": [[[1]]]}', 3)
    assert S.load_json('{"a": ["]]]]"]}', "f", max_depth=2) == {"a": ["]]]]"]}
    with pytest.raises(S.SchemaError, match="f: nests deeper than 8 levels"):
        S.load_json("[" * 100_000, "f", max_depth=8)


def test_close_keys_are_suggested_and_far_ones_are_not():
    assert S.did_you_mean("read_ony", ["name", "read_only"]) == " (did you mean 'read_only'?)"
    assert S.did_you_mean("colour", ["name", "read_only"]) == ""


def test_what_the_twin_reads_inside_free_form_text_cannot_crash_the_simulator():
    """model_config is any JSON and a container's status any text: the simulator reads numbers in
    them, and a number it cannot use is one line (a TwinError), never a ValueError or an overflow."""
    from sparkconsole.sim.twin import build_twin, docker_size, up_seconds

    twin = T.Twin("lab", "sclab/never-read", 0.0, [_facts("gx10-a")], hub_files=[T.HubFileFacts("config.json", 1)],
                  model_config={"architectures": ["XForCausalLM"], "num_hidden_layers": "lots"})
    with pytest.raises(T.TwinError, match="key 'num_hidden_layers' must be a whole number"):
        build_twin(twin)
    twin.model_config = {"architectures": {"0": "X"}}
    with pytest.raises(T.TwinError, match="architectures must be a list"):
        build_twin(twin)
    assert up_seconds("Up " + "9" * 400 + " hours") is None and up_seconds("Up 25 hours") == 25 * 3600
    assert docker_size("1.2.3GB") == docker_size(None) and docker_size("21.4GB") == 21_400_000_000
