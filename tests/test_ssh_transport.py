"""SshTransport and `sparkconsole trust` against a REAL OpenSSH sshd (tests/lab/sshd.py).

Nothing here is mocked: every test talks to an sshd the lab started on loopback (or, for the
jump host tests, inside a network namespace where the target is only reachable via the jump).
"""

from __future__ import annotations

import asyncio
import io
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkconsole.cli import main
from sparkconsole.config import NodeConfig
from sparkconsole.errors import HostKeyError, TransportError
from sparkconsole.transport import make_transport
from sparkconsole.transport.hostkeys import add_known_host, host_key_from, key_status, recorded_keys
from sparkconsole.transport.ssh import SshTransport
from tests.lab.sshd import JumpPair, LabSshd, keygen, known_hosts_entry
from tests.proc_support import wait_until


def fingerprint_of(pub: Path) -> str:
    out = subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True, check=True).stdout
    return out.split()[1]  # "256 SHA256:... comment (ED25519)"


@pytest.fixture
async def transport(sshd: LabSshd):
    t = SshTransport(sshd.node_config("node-a"), connect_timeout=5)
    yield t
    await t.close()


# ---- what only SSH has (run, stream, timeouts, the probe: tests/test_transport_contract.py) --------


@pytest.mark.sshd
async def test_commands_run_as_the_configured_user_on_the_node(transport: SshTransport, sshd: LabSshd) -> None:
    r = await transport.run("whoami; echo $SSH_CONNECTION")
    user, conn = r.stdout.splitlines()
    assert r.ok and user == "root" and conn.endswith(f" {sshd.port}")
    assert transport.connected


# ---- one connection -------------------------------------------------------------------------


@pytest.mark.sshd
async def test_one_connection_is_reused(transport: SshTransport, sshd: LabSshd) -> None:
    for i in range(4):
        assert (await transport.run(f"echo {i}")).stdout == f"{i}\n"
    async for _ in transport.stream("echo a; echo b"):
        pass
    proc = await transport.open_process("cat")
    await proc.write_line("ping")
    assert await proc.read_line() == "ping"
    await proc.close()
    assert sshd.accepted_logins() == 1
    assert transport.connections_made == 1


@pytest.mark.sshd
async def test_concurrent_runs_share_the_connection(transport: SshTransport, sshd: LabSshd, tmp_path) -> None:
    """Fourteen runs at once on one connection: each marks its start in a folder and waits until ten
    have started. Run one at a time, the first would wait alone until its guard ends and say 1; run
    side by side (up to ten channels at once), every one of them sees at least ten."""
    await transport.connect()
    room = tmp_path / "started"
    room.mkdir()
    wait = (f"touch {room}/$i; n=0; while [ $(ls {room} | wc -l) -lt 10 ] && [ $n -lt 1200 ]; "
            "do sleep 0.05; n=$((n+1)); done; echo $i $(ls " + str(room) + " | wc -l)")
    results = await asyncio.gather(*(transport.run(f"i={i}; {wait}", timeout=120) for i in range(14)))
    seen = [r.stdout.split() for r in results]
    assert [int(s[0]) for s in seen] == list(range(14)), seen
    assert all(int(s[1]) >= 10 for s in seen), f"runs were serialised: {seen}"
    assert sshd.accepted_logins() == 1


# ---- reconnecting -------------------------------------------------------------------------


def test_backoff_delays_grow_with_jitter_and_cap() -> None:
    t = SshTransport(NodeConfig(name="n", host="127.0.0.1"), backoff_base=0.5, backoff_factor=2, backoff_max=8)
    it = t.backoff_delays()
    delays = [next(it) for _ in range(10)]
    caps = [0.5, 1, 2, 4, 8, 8, 8, 8, 8, 8]
    for d, cap in zip(delays, caps, strict=True):
        assert cap / 2 <= d <= cap
    samples = {round(next(t.backoff_delays()), 6) for _ in range(20)}
    assert len(samples) > 1  # jittered


@pytest.mark.sshd
async def test_reconnect_after_sshd_restart(sshd: LabSshd) -> None:
    t = SshTransport(sshd.node_config("node-r"), connect_timeout=3, backoff_base=0.05, backoff_max=0.2)
    try:
        assert (await t.run("echo one")).stdout == "one\n"
        sshd.stop()  # the node goes away: listener and session processes killed
        assert await wait_until(lambda: not t.connected, 60), "lost connection not noticed"
        with pytest.raises(TransportError, match="node-r"):
            await t.run("echo two", timeout=5)
        sshd.start()  # same port, same host key
        # calls fail at once while the transport backs off (0.2 s at most), then it reconnects
        deadline = time.monotonic() + 60  # a guard against a hang, not a bound on speed
        while True:
            try:
                r = await t.run("echo three", timeout=30)
                break
            except TransportError as exc:
                assert "next attempt in" in str(exc) and time.monotonic() < deadline, exc
                await asyncio.sleep(0.05)
        assert r.stdout == "three\n"
        assert t.connections_made == 2
        assert sshd.accepted_logins() == 2
    finally:
        await t.close()


@pytest.mark.netns
@pytest.mark.sshd
async def test_keepalive_notices_a_silent_network_drop(sshd_pair: JumpPair) -> None:
    jump = sshd_pair.jump
    t = SshTransport(jump.node_config("jump-k"), keepalive=0.3, keepalive_count_max=2,
                     connect_timeout=2, backoff_base=0.1, backoff_max=0.3)
    try:
        assert (await t.run("echo up")).ok
        # unplug the cable: no FIN, no RST; packets just vanish
        subprocess.run(["ip", "-n", sshd_pair.netns, "link", "set", sshd_pair.veth_ns, "down"], check=True)
        assert await wait_until(lambda: not t.connected, 5), "keepalive did not notice the dead link"
        with pytest.raises(TransportError, match="jump-k"):
            await t.run("echo down", timeout=3)
        subprocess.run(["ip", "-n", sshd_pair.netns, "link", "set", sshd_pair.veth_ns, "up"], check=True)
        assert await wait_until(lambda: t.connected, 8), "did not reconnect by itself"
        assert (await t.run("echo back")).stdout == "back\n"
        assert t.connections_made == 2
    finally:
        await t.close()


# ---- host keys ------------------------------------------------------------------------------


@pytest.mark.sshd
async def test_unknown_host_key_is_rejected_with_its_fingerprint(sshd: LabSshd, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    t = SshTransport(sshd.node_config("node-u", known_hosts=str(empty)), connect_timeout=5)
    with pytest.raises(HostKeyError) as info:
        await t.run("true")
    fp = fingerprint_of(sshd.host_pub)
    msg = info.value.message
    assert fp in msg and f"[127.0.0.1]:{sshd.port}" in msg and "node-u" in msg and "unknown" in msg
    assert info.value.fingerprint == fp
    assert "sparkconsole trust" in msg and "\n" not in msg
    assert sshd.accepted_logins() == 0
    assert empty.read_text() == ""  # nothing was recorded
    with pytest.raises(HostKeyError, match=re.escape(fp)):  # and it stays a key error, not retried
        await t.run("true")
    # a missing known_hosts file trusts nothing either
    t2 = SshTransport(sshd.node_config("node-u2", known_hosts=str(tmp_path / "nope")), connect_timeout=5)
    with pytest.raises(HostKeyError, match=re.escape(fp)):
        await t2.connect()
    await t.close()
    await t2.close()


@pytest.mark.sshd
async def test_changed_host_key_is_rejected(sshd: LabSshd, tmp_path: Path) -> None:
    other = keygen(tmp_path / "other_host_key")
    kh = tmp_path / "known_hosts"
    kh.write_text(known_hosts_entry(sshd.host, sshd.port, other.with_suffix(".pub")))
    before = kh.read_text()
    t = SshTransport(sshd.node_config("node-c", known_hosts=str(kh)), connect_timeout=5)
    with pytest.raises(HostKeyError) as info:
        await t.connect()
    msg = info.value.message
    assert "CHANGED" in msg and "man-in-the-middle" in msg and fingerprint_of(sshd.host_pub) in msg
    assert kh.read_text() == before
    assert sshd.accepted_logins() == 0
    await t.close()


# ---- reaching the node ----------------------------------------------------------------------


@pytest.mark.sshd
async def test_ssh_config_alias_resolution(sshd: LabSshd) -> None:
    # only the alias: HostName, Port, User, IdentityFile and UserKnownHostsFile come from the file
    node = NodeConfig(name="aliased", host=sshd.alias, ssh_config=str(sshd.ssh_config))
    t = make_transport(node)
    try:
        r = await t.run("whoami; echo $SSH_CONNECTION")
        user, conn = r.stdout.split("\n")[:2]
        assert user == "root" and conn.split()[2:] == ["127.0.0.1", str(sshd.port)]
    finally:
        await t.close()


@pytest.mark.sshd
async def test_errors_name_the_node(sshd: LabSshd, tmp_path: Path) -> None:
    stranger = keygen(tmp_path / "stranger")
    t = SshTransport(sshd.node_config("node-auth", identity=str(stranger), ssh_config=None), connect_timeout=5)
    with pytest.raises(TransportError, match=r"^node-auth: authentication failed for root at 127\.0\.0\.1:\d+"):
        await t.connect()
    await t.close()

    dead_port = sshd.port
    sshd.stop()
    t = SshTransport(sshd.node_config("node-off"), connect_timeout=5)
    with pytest.raises(TransportError, match=rf"^node-off: connection refused by 127\.0\.0\.1:{dead_port}$"):
        await t.connect()
    # while backing off, calls fail at once instead of hammering the node
    start = time.monotonic()
    with pytest.raises(TransportError, match=r"node-off: not connected .*next attempt in"):
        await t.run("true")
    assert time.monotonic() - start < 0.2
    await t.close()

    t = SshTransport(NodeConfig(name="node-dns", host="no-such-host.invalid", known_hosts=str(sshd.known_hosts)),
                     connect_timeout=5)
    with pytest.raises(TransportError, match=r"^node-dns: cannot resolve host name 'no-such-host\.invalid'"):
        await t.connect()
    await t.close()


@pytest.mark.netns
@pytest.mark.sshd
async def test_proxyjump_via_node_jump(sshd_pair: JumpPair) -> None:
    jump, target = sshd_pair.jump, sshd_pair.target
    # the target really is unreachable without the jump host
    direct = SshTransport(target.node_config("target-direct"), connect_timeout=3)
    with pytest.raises(TransportError, match="connection refused"):
        await direct.connect()
    await direct.close()

    t = SshTransport(target.node_config("target", jump=jump.alias), connect_timeout=5)
    try:
        r = await t.run("echo $SSH_CONNECTION")
        assert r.ok and r.stdout.split()[2:] == ["127.0.0.1", str(target.port)]
        assert (await t.run("echo again")).ok
    finally:
        await t.close()
    assert target.accepted_logins() == 1
    assert jump.accepted_logins() == 1
    # a jump given as user@host:port works too (no alias needed)
    t = SshTransport(target.node_config("target2", jump=f"root@{jump.host}:{jump.port}"), connect_timeout=5)
    try:
        assert (await t.run("echo hop")).stdout == "hop\n"
    finally:
        await t.close()


@pytest.mark.netns
@pytest.mark.sshd
async def test_proxyjump_from_ssh_config(sshd_pair: JumpPair) -> None:
    node = NodeConfig(name="cfg-target", host=sshd_pair.target.alias, ssh_config=str(sshd_pair.ssh_config))
    t = SshTransport(node, connect_timeout=5)
    try:
        r = await t.run("echo $SSH_CONNECTION")
        assert r.stdout.split()[2:] == ["127.0.0.1", str(sshd_pair.target.port)]
    finally:
        await t.close()
    assert sshd_pair.jump.accepted_logins() == 1


@pytest.mark.netns
@pytest.mark.sshd
async def test_jump_host_key_is_verified_too(sshd_pair: JumpPair, tmp_path: Path) -> None:
    jump, target = sshd_pair.jump, sshd_pair.target
    only_target = tmp_path / "known_hosts"
    only_target.write_text(known_hosts_entry(target.host, target.port, target.host_pub))
    t = SshTransport(target.node_config("target", jump=jump.alias, known_hosts=str(only_target)), connect_timeout=5)
    with pytest.raises(HostKeyError) as info:
        await t.connect()
    assert f"[{jump.host}]:{jump.port}" in info.value.message
    assert info.value.fingerprint == fingerprint_of(jump.host_pub)
    assert jump.accepted_logins() == 0
    await t.close()


# ---- sparkconsole trust -----------------------------------------------------------------------


def trust(sshd: LabSshd, kh: Path, *extra: str) -> int:
    return main(["trust", sshd.host, "--port", str(sshd.port), "--known-hosts", str(kh), *extra])


@pytest.mark.sshd
def test_trust_yes_records_the_key(sshd: LabSshd, tmp_path: Path, capsys) -> None:
    kh = tmp_path / "ssh" / "known_hosts"
    assert trust(sshd, kh, "--yes") == 0
    out = capsys.readouterr().out
    fp = fingerprint_of(sshd.host_pub)
    assert fp in out and "ssh-ed25519" in out and f"[127.0.0.1]:{sshd.port}" in out
    kind, b64 = sshd.host_pub.read_text().split()[:2]
    assert kh.read_text() == f"[127.0.0.1]:{sshd.port} {kind} {b64}\n"
    assert kh.stat().st_mode & 0o777 == 0o600
    # the transport now accepts the key
    t = SshTransport(sshd.node_config("trusted", known_hosts=str(kh)), connect_timeout=5)

    async def go() -> str:
        try:
            return (await t.run("echo trusted")).stdout
        finally:
            await t.close()

    assert asyncio.run(go()) == "trusted\n"
    # asking again: already trusted, nothing written
    assert trust(sshd, kh) == 0
    assert "already trusted" in capsys.readouterr().out
    assert kh.read_text().count("\n") == 1


@pytest.mark.sshd
def test_trust_answer_y_and_n_on_stdin(sshd: LabSshd, tmp_path: Path, capsys, monkeypatch) -> None:
    kh = tmp_path / "known_hosts"
    monkeypatch.setattr(sys, "stdin", io.StringIO("n\n"))
    assert trust(sshd, kh) == 1
    out = capsys.readouterr().out
    assert "Trust this key? [y/N]" in out and "Not trusted" in out
    assert not kh.exists()
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # no answer at all: refuse
    assert trust(sshd, kh) == 1
    assert "not interactive" in capsys.readouterr().err
    assert not kh.exists()
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    assert trust(sshd, kh) == 0
    assert key_status(kh, sshd.host, sshd.port, host_key_from(sshd.host_pub.read_text())) == "trusted"


@pytest.mark.sshd
def test_trust_refuses_a_changed_key(sshd: LabSshd, tmp_path: Path, capsys) -> None:
    other = keygen(tmp_path / "other_host_key")
    kh = tmp_path / "known_hosts"
    kh.write_text("# mine\n" + known_hosts_entry(sshd.host, sshd.port, other.with_suffix(".pub")))
    before = kh.read_text()
    assert trust(sshd, kh, "--yes") == 1
    captured = capsys.readouterr()
    assert "WARNING" in captured.err and "man-in-the-middle" in captured.err
    assert kh.read_text() == before


def test_trust_unreachable_host(tmp_path: Path, capsys) -> None:
    from tests.lab.sshd import free_port

    assert main(["trust", "127.0.0.1", "--port", str(free_port()), "--known-hosts", str(tmp_path / "k"), "--yes"]) == 3
    assert "cannot fetch the host key" in capsys.readouterr().err


def test_known_hosts_format_and_hashed_entries(tmp_path: Path) -> None:
    line = keygen(tmp_path / "host_key").with_suffix(".pub").read_text()
    kh = tmp_path / "known_hosts"
    assert add_known_host(kh, "spark-1", 22, line).startswith("spark-1 ssh-ed25519 AAAA")
    assert add_known_host(kh, "10.0.0.2", 2222, line).startswith("[10.0.0.2]:2222 ssh-ed25519 ")
    add_known_host(kh, "10.0.0.2", 2222, line)  # same key again: no duplicate
    assert len(kh.read_text().splitlines()) == 2
    other = keygen(tmp_path / "k2").with_suffix(".pub").read_text()
    with pytest.raises(TransportError, match="different host key"):
        add_known_host(kh, "spark-1", 22, other)
    # OpenSSH's hashed form (HashKnownHosts yes) is understood
    subprocess.run(["ssh-keygen", "-H", "-f", str(kh)], check=True, capture_output=True)
    assert "spark-1" not in kh.read_text()
    key = host_key_from(line)
    assert key_status(kh, "spark-1", 22, key) == "trusted"
    assert key_status(kh, "10.0.0.2", 2222, key) == "trusted"
    assert key_status(kh, "10.0.0.2", 22, key) == "unknown"
    assert key_status(kh, "spark-1", 22, host_key_from(other)) == "changed"
    assert len(recorded_keys(kh, "spark-1", 22)[0]) == 1


@pytest.mark.sshd
async def test_user_known_hosts_none_does_not_turn_checking_off(
    sshd: LabSshd, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.ssh/known_hosts either
    cfg = tmp_path / "ssh_config"
    cfg.write_text(
        sshd.ssh_config.read_text().replace(f"UserKnownHostsFile {sshd.known_hosts}", "UserKnownHostsFile none")
        + "  StrictHostKeyChecking no\n"
    )
    t = SshTransport(NodeConfig(name="careless", host=sshd.alias, ssh_config=str(cfg)), connect_timeout=5)
    with pytest.raises(HostKeyError, match=re.escape(fingerprint_of(sshd.host_pub))):
        await t.connect()
    await t.close()
    assert sshd.accepted_logins() == 0


@pytest.mark.netns
@pytest.mark.sshd
async def test_a_jump_that_names_another_node_of_the_inventory(sshd_pair: JumpPair) -> None:
    """``jump = "gateway"`` where gateway is a node of the inventory (not a host name, not an ssh
    alias): the worker is reached through that node's host, port, user, key and known_hosts."""
    from sparkconsole.config import ClusterConfig
    from sparkconsole.transport import node_transport

    jump, target = sshd_pair.jump, sshd_pair.target
    gateway = jump.node_config("gateway", ssh_config=None)
    worker = target.node_config("worker", jump="gateway")
    config = ClusterConfig(nodes=(gateway, worker), name="lab")
    t = node_transport(config, worker, connect_timeout=5)
    try:
        r = await t.run("echo $SSH_CONNECTION")
        assert r.ok and r.stdout.split()[2:] == ["127.0.0.1", str(target.port)]
    finally:
        await t.close()
    assert jump.accepted_logins() == 1 and target.accepted_logins() == 1
