"""Issue 23 item 12: `sparkconsole trust` fetches the key over the route the connection takes.

Before, trust resolved HostName and Port from the ssh config and dialled them directly: a node
behind a jump host (ProxyJump, ProxyCommand, the inventory's ``jump``) gave no key or another
machine's, and a ``HostKeyAlias`` was ignored, so the key was recorded under a name the transport
never looks up. Every test here runs real OpenSSH sshds (tests/lab/sshd.py) and ends with the
transport connecting on the recorded key, which is what trust is for.
"""

from __future__ import annotations

import asyncio
import shlex
from pathlib import Path

import pytest

from sparkconsole.cli import main
from sparkconsole.config import ClusterConfig, NodeConfig
from sparkconsole.errors import HostKeyError
from sparkconsole.transport import node_transport
from sparkconsole.transport.ssh import SshTransport
from tests.lab.sshd import JumpPair, LabSshd, known_hosts_entry, public_key_line


def _connects(node: NodeConfig, config: ClusterConfig | None = None) -> str:
    """``echo in`` over a fresh transport for ``node`` (through the inventory's jump with ``config``)."""
    async def go() -> str:
        t = (node_transport(config, node, connect_timeout=5, auto_reconnect=False) if config else
             SshTransport(node, connect_timeout=5, auto_reconnect=False))
        try:
            return (await t.run("echo in")).stdout
        finally:
            await t.close()

    return asyncio.run(go())


def _key_line(name: str, pub: Path) -> str:
    kind, b64 = public_key_line(pub)
    return f"{name} {kind} {b64}\n"


def _suggested(message: str) -> list[str]:
    """The ``sparkconsole trust …`` command a HostKeyError tells the operator to run, as ``main``'s
    arguments."""
    line = message.split("then run: ", 1)[1]
    args = shlex.split(line)
    assert args[:2] == ["sparkconsole", "trust"]
    return args[1:]


@pytest.mark.netns
@pytest.mark.sshd
def test_trust_takes_the_proxyjump_and_records_the_targets_key_not_a_decoys(
        sshd_pair: JumpPair, tmp_path: Path, capsys) -> None:
    """The target listens on its namespace's loopback; here, on the same address and port, a decoy
    sshd answers. Dialled directly (the old way), trust met the decoy and recorded its key."""
    jump, target = sshd_pair.jump, sshd_pair.target
    decoy = LabSshd(tmp_path / "decoy", alias="decoy", port=target.port)
    decoy.start()
    try:
        kh = tmp_path / "known_hosts"
        kh.write_text(known_hosts_entry(jump.host, jump.port, jump.host_pub))  # the jump host is trusted
        rc = main(["trust", target.alias, "--ssh-config", str(sshd_pair.ssh_config), "--known-hosts", str(kh),
                   "--yes"])
        out = capsys.readouterr().out
        assert rc == 0, out
        assert public_key_line(decoy.host_pub)[1] not in kh.read_text()
        name = f"[127.0.0.1]:{target.port}"
        assert kh.read_text().splitlines()[-1] == _key_line(name, target.host_pub).strip()
        assert decoy.count("Connection from") == 0  # nothing was dialled directly
        assert f"via {jump.alias}" in out
    finally:
        decoy.stop()
    node = NodeConfig(name="behind", host=target.alias, ssh_config=str(sshd_pair.ssh_config), known_hosts=str(kh))
    assert _connects(node) == "in\n"


@pytest.mark.sshd
def test_trust_records_under_the_host_key_alias_the_transport_checks(sshd: LabSshd, tmp_path: Path,
                                                                           capsys) -> None:
    kh = tmp_path / "known_hosts"
    cfg = tmp_path / "ssh_config"
    cfg.write_text(sshd.ssh_config.read_text().replace(f"UserKnownHostsFile {sshd.known_hosts}",
                                                       f"UserKnownHostsFile {kh}") + "  HostKeyAlias spark-a-key\n")
    node = NodeConfig(name="aliased", host=sshd.alias, ssh_config=str(cfg))
    with pytest.raises(HostKeyError) as unknown:
        _connects(node)
    assert "unknown host key for spark-a-key:" in unknown.value.message
    # the command the error names records the key where and as the transport looks for it
    assert main([*_suggested(unknown.value.message), "--yes"]) == 0
    assert "host:        spark-a-key  (alias lab-node)" in capsys.readouterr().out
    assert kh.read_text() == _key_line("spark-a-key", sshd.host_pub)  # OpenSSH's form: the alias alone
    assert _connects(node) == "in\n"


@pytest.mark.sshd
def test_trust_takes_the_proxycommand(sshd: LabSshd, tmp_path: Path, capsys) -> None:
    """The node's HostName resolves nowhere: only the ProxyCommand (OpenSSH's ``ssh -W`` through the
    lab's sshd) reaches it. Before, trust tried to resolve the name and failed."""
    kh = tmp_path / "known_hosts"
    cfg = tmp_path / "ssh_config"
    cfg.write_text(
        "Host behind-proxy\n"
        "  HostName behind-proxy.invalid\n"
        "  User root\n"
        f"  IdentityFile {sshd.user_key}\n"
        "  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {kh}\n"
        f"  ProxyCommand ssh -F {sshd.ssh_config} -o BatchMode=yes -W 127.0.0.1:{sshd.port} {sshd.alias}\n")
    assert main(["trust", "behind-proxy", "--ssh-config", str(cfg), "--yes"]) == 0
    out = capsys.readouterr().out
    assert "via ssh -F" in out and f"known_hosts: {kh}" in out  # the config's file, not ~/.ssh's
    assert kh.read_text() == _key_line("behind-proxy.invalid", sshd.host_pub)
    assert _connects(NodeConfig(name="proxied", host="behind-proxy", ssh_config=str(cfg))) == "in\n"


@pytest.mark.netns
@pytest.mark.sshd
def test_the_key_error_of_a_node_behind_an_inventory_jump_names_a_trust_that_works(
        sshd_pair: JumpPair, tmp_path: Path) -> None:
    """``jump = "gateway"`` (another node of the inventory): the error's trust command goes through
    the gateway too (``--jump user@host:port``, the key that logs in there), and records the key
    the worker's connection then accepts."""
    jump, target = sshd_pair.jump, sshd_pair.target
    kh = tmp_path / "known_hosts"
    kh.write_text(known_hosts_entry(jump.host, jump.port, jump.host_pub))  # one file, the gateway's key in it
    gateway = jump.node_config("gateway", ssh_config=None, known_hosts=str(kh))
    worker = target.node_config("worker", jump="gateway", ssh_config=None, known_hosts=str(kh))
    config = ClusterConfig(nodes=(gateway, worker), name="lab")

    with pytest.raises(HostKeyError) as unknown:
        _connects(worker, config)
    args = _suggested(unknown.value.message)
    assert args[args.index("--jump") + 1] == f"root@{jump.host}:{jump.port}"
    assert main([*args, "--yes"]) == 0
    assert kh.read_text().splitlines()[-1] == _key_line(f"[127.0.0.1]:{target.port}", target.host_pub).strip()
    assert _connects(worker, config) == "in\n"
