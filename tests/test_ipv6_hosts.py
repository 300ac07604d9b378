"""Issue 23 item 14: IPv6 hosts, and the sshd port node-to-node.

Before, ``::1``, ``fe80::1%enp1s0`` and ``[v6]:port`` were refused as hosts, and the copies
between nodes (rsync, ``docker save | ssh … docker load``, the network step's ssh check) always
dialled port 22. The real-tools test runs the built commands with the real rsync and ssh against a
real sshd listening on ``::1`` on its own port.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from sparkconsole.config import ClusterConfig, NodeConfig, adhoc_cluster, parse_config
from sparkconsole.deploy.recon import Listener, NodeFacts
from sparkconsole.errors import ConfigError, ValidationError
from sparkconsole.remote import image_copy, rsync_dir, ssh_to, validate_host
from tests.lab.sshd import LabSshd, free_port


def test_ipv6_hosts_in_the_inventory_and_on_the_command_line():
    text = ('[[nodes]]\nname = "a"\nhost = "::1"\n'
            '[[nodes]]\nname = "b"\nhost = "fe80::1%enp1s0f1np1"\nport = 2222\n'
            '[[nodes]]\nname = "c"\nhost = "[2001:db8::1]:2200"\n')
    a, b, c = parse_config(text).nodes
    assert (a.host, a.port) == ("::1", None)
    assert (b.host, b.port) == ("fe80::1%enp1s0f1np1", 2222)
    assert (c.host, c.port) == ("2001:db8::1", 2200)
    with pytest.raises(ConfigError, match="port 2200, key 'port' says 22"):
        parse_config('[[nodes]]\nname = "c"\nhost = "[2001:db8::1]:2200"\nport = 22\n')
    with pytest.raises(ConfigError, match="an IPv6 host needs a name"):
        parse_config('[[nodes]]\nhost = "::1"\n')

    nodes = adhoc_cluster(["user@[::1]:2200", "fe80::1%enp1s0", "[2001:db8::1]:2222", "nvidia@spark-b:22"]).nodes
    assert [(n.user, n.host, n.port) for n in nodes] == [("user", "::1", 2200), (None, "fe80::1%enp1s0", None),
                                                        (None, "2001:db8::1", 2222), ("nvidia", "spark-b", 22)]
    # still strict: what is not an address or a name never reaches a command
    for bad in ("::1;reboot", "fe80::1%en p1", "fe80::1%", "[::1", "[::1]x", "1::2::3", "-oProxyCommand=x", "::1 "):
        with pytest.raises((ValidationError, ConfigError)):
            adhoc_cluster([bad])
    with pytest.raises(ConfigError, match="port must be a number"):
        adhoc_cluster(["[::1]:99999"])


def test_node_to_node_commands_carry_the_port_and_bracket_ipv6_for_rsync():
    peer = "nvidia@fe80::1%enp1s0f1np1"
    r = rsync_dir("/home/nvidia/.cache/huggingface/hub/models--a--b", peer,
                  "/home/nvidia/.cache/huggingface/hub/models--a--b", port=2222)
    argv = list(r.argv)
    assert argv[argv.index("-e") + 1].endswith(" -p 2222")  # rsync has no port for a remote shell
    assert argv[-1] == "nvidia@[fe80::1%enp1s0f1np1]:/home/nvidia/.cache/huggingface/hub/models--a--b/"
    assert ssh_to(peer, "true", port=2222).shell() == (
        "ssh -o BatchMode=yes -o ConnectTimeout=5 -p 2222 nvidia@fe80::1%enp1s0f1np1 true")
    assert image_copy("vllm/vllm-openai:v0.17.0", "nvidia@10.0.0.2", port=2200).shell() == (
        "docker save vllm/vllm-openai:v0.17.0 | ssh -o BatchMode=yes -o ConnectTimeout=5 -p 2200 "
        "nvidia@10.0.0.2 'docker load'")
    # port 22 (or none) is ssh's own default: the commands stay as they were
    assert "-p" not in ssh_to("nvidia@10.0.0.2", "true", port=22).argv
    assert rsync_dir("/a/b", "nvidia@10.0.0.2", "/a/b").argv[-1] == "nvidia@10.0.0.2:/a/b/"
    with pytest.raises(ValidationError):
        ssh_to("nvidia@10.0.0.2", "true", port=70000)


def test_the_peer_port_is_the_nodes_own_sshd_port():
    from sparkconsole.deploy.weights import peer_ssh_port

    listens = [Listener(2222, "0.0.0.0"), Listener(8000, "0.0.0.0")]
    assert peer_ssh_port(NodeFacts("b", listeners=listens), 2222) == 2222  # the node listens on it itself
    nat = [Listener(22, "0.0.0.0"), Listener(8000, "0.0.0.0")]
    assert peer_ssh_port(NodeFacts("b", listeners=nat), 2201) is None  # a forward on the way: its sshd is on 22
    named = [Listener(2022, "0.0.0.0", "sshd", 900)]
    assert peer_ssh_port(NodeFacts("b", listeners=named), 41234) == 2022  # root's ss names the sshd
    assert peer_ssh_port(NodeFacts("b"), 2222) == 2222  # listeners not read: the console's port
    assert peer_ssh_port(NodeFacts("b", listeners=listens), None) is None


async def test_the_copies_and_the_network_check_dial_the_peers_port():
    from sparkconsole.deploy.steps import Images, Network, Weights
    from tests.test_dgx_os import _stock

    layers = '["sha256:' + "1" * 64 + '"]\n'
    on_2222 = [Listener(22, "127.0.0.1"), Listener(2222, "0.0.0.0")]
    flow, log = _stock({"spark-a": [("RootFS.Layers", 0, layers, "")]},
                       **{"spark-a": {"listeners": on_2222}, "spark-b": {"listeners": on_2222}})
    flow.runner.config = ClusterConfig(nodes=(NodeConfig("spark-a", "spark-a.lan", port=2222, role="head"),
                                              NodeConfig("spark-b", "spark-b.lan", port=2222)), name="sparks")
    rsync = list(Weights(flow)._copy_cmd("spark-a", "spark-b", streamed=False).argv)
    assert rsync[rsync.index("-e") + 1].endswith(" -p 2222")
    planned = [c.shell() for _n, c in await flow.runner.rehearse(Images(flow).send)]
    # the copy runs as a detached job (its script quoted once more inside the job's sh -c)
    assert any("| ssh -o BatchMode=yes -o ConnectTimeout=5 -p 2222 nvidia@169.254.190.33 " in t
               for t in planned), planned
    await Network(flow).verify()
    checks = [t for n, t in log if t.startswith("ssh ")]
    assert checks and all(" -p 2222 nvidia@" in t for t in checks)


@pytest.mark.sshd
def test_the_built_commands_work_with_real_rsync_and_ssh_over_ipv6_on_another_port(tmp_path: Path):
    """A real sshd on ``::1`` on its own port: the rsync that :func:`rsync_dir` builds copies the
    directory, and :func:`ssh_to` runs a command there, both through the real tools. ``ssh`` is
    found on PATH as a wrapper that adds only ``-F`` (the lab's key and known_hosts): every option
    and the destination are the command's own."""
    server = LabSshd(tmp_path / "v6", alias="v6", listen="::1", port=free_port())
    server.start()
    try:
        cfg = tmp_path / "ssh_config"
        cfg.write_text(f"Host *\n  IdentityFile {server.user_key}\n  IdentitiesOnly yes\n"
                       f"  UserKnownHostsFile {server.known_hosts}\n  StrictHostKeyChecking yes\n")
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        wrapper = bin_dir / "ssh"
        wrapper.write_text(f'#!/bin/sh\nexec /usr/bin/ssh -F {cfg} "$@"\n')
        wrapper.chmod(0o755)
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
        src = tmp_path / "src" / "models--a--b"
        (src / "snapshots" / "r1").mkdir(parents=True)
        (src / "snapshots" / "r1" / "config.json").write_text('{"x": 1}\n')
        dest = tmp_path / "dest" / "models--a--b"
        dest.mkdir(parents=True)
        cmd = rsync_dir(str(src), "root@::1", str(dest), port=server.port)
        run = subprocess.run(["sh", "-c", cmd.shell()], env=env, capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        assert (dest / "snapshots" / "r1" / "config.json").read_text() == '{"x": 1}\n'
        check = ssh_to("root@::1", "cat", str(dest / "snapshots" / "r1" / "config.json"), port=server.port)
        run = subprocess.run(["sh", "-c", check.shell()], env=env, capture_output=True, text=True, timeout=60)
        assert (run.returncode, run.stdout) == (0, '{"x": 1}\n'), run.stderr
        assert server.accepted_logins() == 2
    finally:
        server.stop()
    assert validate_host("::1") == "::1"


async def test_the_simulators_rsync_reads_a_bracketed_host_as_rsync_does():
    """rsync(1): ``[USER@]HOST:DEST``, an IPv6 HOST in brackets (any host may be); the old sim split
    at the first colon, so ``nvidia@[fe80::9]:/x`` went to a host named ``nvidia@[fe80``."""
    from tests.test_sim_model import sh
    from tests.test_sim_stock import HF, RERANK, WORKER, cluster, peer

    c = cluster()
    src = c.model_dir("spark-1a32", RERANK)
    dest = f"nvidia@[{peer(c)}]:.cache/huggingface/hub/"
    _, err, rc = await sh(c, "spark-1a32", f"rsync -a -e 'ssh -o BatchMode=yes' {src} {dest}")
    assert (rc, err) == (0, "") and c.has_model(WORKER, RERANK)
    assert c.fs(WORKER).exists(f"{HF}/hub/models--Qwen--Qwen3-Reranker-0.6B/refs/main")
    _, err, rc = await sh(c, "spark-1a32", f"rsync -a -e 'ssh -p 2222' {src} nvidia@[fe80::9%enp1s0f1np1]:/tmp/x/")
    assert rc == 255 and err.startswith("ssh: connect to host fe80::9%enp1s0f1np1 port 2222: No route to host")
