"""The cluster inventory: TOML parsing, search order, errors that name file, line and key."""

from __future__ import annotations

import pytest

from sparkconsole import config as cfg
from sparkconsole.cli import main
from sparkconsole.errors import ConfigError

GOOD = """\
[cluster]
name = "sparks"
services = ["ollama", "nvidia-dgx-dashboard"]

[[nodes]]
name = "spark-1a32"
host = "spark-1a32"
user = "nvidia"
role = "head"
fast_link = "enp1s0f1np1"

[[nodes]]
name = "spark-5be3"
host = "192.168.200.13"
port = 2222
role = "worker"
jump = "spark-1a32"

[keymap]
"app.quit" = "ctrl+q"
"""


def test_parse_good_config():
    c = cfg.parse_config(GOOD, "cluster.toml")
    assert [n.name for n in c.nodes] == ["spark-1a32", "spark-5be3"]
    assert c.head.name == "spark-1a32"
    worker = c.node("spark-5be3")
    assert (worker.port, worker.jump, worker.role) == (2222, "spark-1a32", "worker")
    assert c.nodes[0].fast_link == "enp1s0f1np1"
    assert c.services == ("ollama", "nvidia-dgx-dashboard")
    assert c.keymap["app.quit"] == "ctrl+q"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GOOD.replace("port = 2222", "port = 99999"), "cluster.toml:15: key 'port'"),
        (GOOD.replace('role = "worker"', 'role = "boss"'), "cluster.toml:16: key 'role'"),
        (GOOD.replace('host = "192.168.200.13"', 'host = "a;rm -rf /"'), "cluster.toml:14: key 'host'"),
        (GOOD.replace('fast_link = "enp1s0f1np1"', 'fast_link = "enp1s0f1np1-far-too-long"'), "key 'fast_link'"),
        (GOOD.replace('user = "nvidia"', 'colour = "red"'), "unknown key 'colour'"),
        ("[cluster]\nname = 'x'\n", "key 'nodes' missing"),
        ("[[nodes]\nname=", "not valid TOML"),
        (GOOD.replace('name = "spark-5be3"', 'name = "spark-1a32"'), "listed twice"),
    ],
)
def test_bad_config_names_file_line_and_key(text, expected):
    with pytest.raises(ConfigError) as err:
        cfg.parse_config(text, "cluster.toml")
    assert expected in err.value.message
    assert "\n" not in err.value.message


def test_search_order(tmp_path, monkeypatch):
    explicit = tmp_path / "explicit.toml"
    explicit.write_text(GOOD)
    env_file = tmp_path / "env.toml"
    env_file.write_text(GOOD)
    user_dir = tmp_path / "user"
    monkeypatch.setattr(cfg, "default_config_path", lambda: user_dir / "cluster.toml")
    monkeypatch.delenv(cfg.ENV_CONFIG, raising=False)
    assert cfg.config_search(None) is None
    user_dir.mkdir()
    (user_dir / "cluster.toml").write_text(GOOD)
    assert cfg.config_search(None) == user_dir / "cluster.toml"
    monkeypatch.setenv(cfg.ENV_CONFIG, str(env_file))
    assert cfg.config_search(None) == env_file
    assert cfg.config_search(explicit) == explicit
    with pytest.raises(ConfigError, match="no such config file"):
        cfg.config_search(tmp_path / "missing.toml")


def test_adhoc_hosts():
    c = cfg.adhoc_cluster(["nvidia@spark-a:2222", "spark-b"])
    assert c.nodes[0].user == "nvidia" and c.nodes[0].port == 2222 and c.nodes[0].role == "head"
    assert c.nodes[1].role == "worker"
    with pytest.raises(ConfigError):
        cfg.adhoc_cluster(["spark-a", "spark-a"])
    with pytest.raises(ConfigError):
        cfg.adhoc_cluster(["spark-a:notaport"])


def test_cli_bad_config_is_one_line_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text(GOOD.replace("port = 2222", 'port = "ssh"'))
    rc = main(["snapshot", "--config", str(bad), "--json"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and "bad.toml:15: key 'port'" in err
    assert "Traceback" not in err


def test_cli_no_cluster_configured(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cfg, "default_config_path", lambda: tmp_path / "none.toml")
    monkeypatch.delenv(cfg.ENV_CONFIG, raising=False)
    assert main(["snapshot"]) == 2
    assert "no cluster configured" in capsys.readouterr().err
