"""The fast link's fabric checks: node-to-node trust without blind acceptance (each peer's host key
read over the console's verified connection, shown, added after a yes), MTU fixes printed rather
than sent with sudo, and kernels known to break RoCE stopped at recon."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkconsole.deploy.events import StepEvent
from sparkconsole.deploy.recon import NodeFacts, known_bad, known_bad_on
from sparkconsole.remote import (
    add_known_hosts,
    host_key_fingerprint,
    known_hosts_entry,
    parse_host_key,
    read_host_key,
)
from sparkconsole.sim import Shell, SimClock, build
from sparkconsole.transport.hostkeys import host_key_from
from tests.deploy_support import demo_flow

ROOT = Path(__file__).resolve().parents[1]
HEAD, WORKER = "spark-1a32", "spark-5be3"


def _deploy(tmp_path: Path, *args: str, timeout: float = 240) -> tuple[int, list[dict], str]:
    env = dict(os.environ, SPARKCONSOLE_STATE_DIR=str(tmp_path / "state"))
    env.pop("SPARKCONSOLE_CONFIG", None)
    r = subprocess.run([sys.executable, "-m", "sparkconsole.cli", "deploy", *args], cwd=ROOT, env=env,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    events = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    return r.returncode, events, r.stdout + r.stderr


async def _sh(c, node: str, cmd: str, step: float = 1.0, limit: float = 120.0) -> tuple[str, str, int]:
    """Run ``cmd`` in the simulator, advancing its manual clock until it ends."""
    task = asyncio.ensure_future(Shell(c, node).capture(cmd))
    waited = 0.0
    for _ in range(40):
        await asyncio.sleep(0)
    while not task.done():
        c.clock.advance(step)
        waited += step
        for _ in range(40):
            if task.done():
                break
            await asyncio.sleep(0)
        assert waited <= limit, f"{cmd!r} did not finish"
    return task.result()


# ---- the host key, read and checked -------------------------------------------------------------

def test_fingerprint_is_the_one_ssh_prints() -> None:
    """The fingerprint shown for a key is OpenSSH's (asyncssh computes it independently here)."""
    c = build("new-keys", clock=SimClock.frozen())
    from sparkconsole.sim.formats import ssh_host_key

    line = ssh_host_key(c, WORKER)
    kind, blob = parse_host_key(line) or ("", "")
    assert kind == "ssh-ed25519"
    assert host_key_fingerprint(blob) == host_key_from(line).fingerprint


@pytest.mark.parametrize("text", ["", "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQ root@x", "ssh-ed25519 !!!! root@x",
                                  # an ed25519 label on a blob that names another type
                                  "ssh-ed25519 AAAAB3NzaC1yc2EAAAADAQABAAABAQDdeadbeefdeadbeef root@x",
                                  "\x1b]0;evil\x07ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI"])
def test_a_key_that_is_not_one_is_refused(text: str) -> None:
    assert parse_host_key(text) is None


def test_known_hosts_entry_names_the_port_as_openssh_does() -> None:
    blob = "AAAAC3NzaC1lZDI1NTE5AAAAIGn8m0F0bV1rNq1fC2Ujd8f8oR0fjbOV4W8k5qL0c9mJ"
    assert known_hosts_entry("192.168.200.13", None, "ssh-ed25519", blob).startswith("192.168.200.13 ssh-ed25519 ")
    assert known_hosts_entry("192.168.200.13", 2222, "ssh-ed25519", blob).startswith("[192.168.200.13]:2222 ")
    with pytest.raises(Exception, match="not"):
        known_hosts_entry("a;b", None, "ssh-ed25519", blob)
    with pytest.raises(Exception, match="not an ed25519"):
        known_hosts_entry("10.0.0.1", None, "ssh-ed25519", "AAAA'; rm -rf ~")


async def test_sim_ssh_checks_known_hosts_as_openssh_does() -> None:
    """new-keys: ssh between the nodes fails with OpenSSH's words until the peer's key, read from
    the peer itself, is in known_hosts; a different key under the same name still fails."""
    c = build("new-keys", clock=SimClock.frozen())
    ip = c.nodes[WORKER].fast_ip
    ssh = f"ssh -o BatchMode=yes -o ConnectTimeout=5 nvidia@{ip} hostname"
    assert await _sh(c, HEAD, ssh) == ("", "Host key verification failed.\r\n", 255)
    out, _, rc = await _sh(c, WORKER, read_host_key().shell())
    key = parse_host_key(out)
    assert rc == 0 and key is not None
    other = parse_host_key((await _sh(c, HEAD, read_host_key().shell()))[0])  # the head's own key
    assert other is not None and other != key
    _, err, rc = await _sh(c, HEAD, add_known_hosts([known_hosts_entry(ip, None, *other)]).shell())
    assert rc == 0, err
    _, err, rc = await _sh(c, HEAD, ssh)
    assert rc == 255 and "REMOTE HOST IDENTIFICATION HAS CHANGED" in err and err.endswith("Host key verification failed.\r\n")
    for _ in range(2):  # added once, however often it runs
        _, err, rc = await _sh(c, HEAD, add_known_hosts([known_hosts_entry(ip, None, *key)]).shell())
        assert rc == 0, err
    assert await _sh(c, HEAD, ssh) == (WORKER + "\n", "", 0)
    text, _, _ = await _sh(c, HEAD, "cat ~/.ssh/known_hosts")
    assert text.count(f"{ip} {key[0]} {key[1]}") == 1
    # the worker still does not know the head: trust is per direction
    assert (await _sh(c, WORKER, f"ssh -o BatchMode=yes {c.nodes[HEAD].fast_ip} true"))[2] == 255


def test_plan_only_never_plans_sudo_nor_blind_trust(tmp_path: Path) -> None:
    """The demo's whole plan: no change runs sudo or turns host-key checking off; the network step
    plans each node's known_hosts with its peer's key at the peer's fast-link address (new-keys: nodes
    that never met over the fast link; the story's already know each other and are not asked)."""
    rc, events, said = _deploy(tmp_path, "--demo", "--scenario", "new-keys", "--plan-only", "--json")
    assert rc == 0, said[-2000:]
    planned = [e for e in events if e.get("event") == "planned"]
    sent = [e["command"] for e in events if e.get("event") == "command"] + [e["command"] for e in planned]
    assert planned and not [x for x in sent if "StrictHostKeyChecking=no" in x or "accept-new" in x]
    assert not [e["command"] for e in planned if "sudo" in e["command"].split()]
    trust = {e["node"]: e["command"] for e in planned if e["step"] == "network" and "known_hosts" in e["command"]}
    c = build("story", clock=SimClock.frozen())
    from sparkconsole.sim.formats import ssh_host_key

    assert set(trust) == {HEAD, WORKER}
    for src, dst in ((HEAD, WORKER), (WORKER, HEAD)):
        kind, blob = ssh_host_key(c, dst).split()[:2]
        assert f"{c.nodes[dst].fast_ip} {kind} {blob}" in trust[src]
    asked = [e for e in events if e.get("id") == "network.trust" and e.get("answer")]
    assert asked and any(host_key_fingerprint(ssh_host_key(c, WORKER).split()[1]) in m for m in asked[0]["measured"])


def test_new_keys_network_step_adds_the_keys_before_its_ssh(tmp_path: Path) -> None:
    rc, events, said = _deploy(tmp_path, "--demo", "--scenario", "new-keys", "--auto", "--until", "network", "--json")
    assert rc == 0, said[-2000:]
    cmds = [e for e in events if e.get("event") == "command" and e.get("step") == "network"]
    adds = [i for i, e in enumerate(cmds) if e.get("mutating") and "known_hosts" in e["command"] and e.get("rc") == 0]
    checks = [i for i, e in enumerate(cmds) if e["command"].startswith("ssh ") and e.get("rc") is not None]
    assert len(adds) == 2 and checks and all(e["rc"] == 0 for e in (cmds[i] for i in checks))
    assert max(adds) < min(checks)
    assert any(e.get("step") == "network" and e.get("state") == "done" for e in events)


def test_trust_refused_stops_with_the_line_to_add(tmp_path: Path) -> None:
    rc, _, said = _deploy(tmp_path, "--demo", "--scenario", "new-keys", "--auto", "--answer", "network.trust=stop",
                          "--until", "network")
    assert rc != 0
    assert "does not know" in said and "append to ~/.ssh/known_hosts" in said and "ssh-ed25519 AAAA" in said


# ---- MTU: printed, never sent with sudo -----------------------------------------------------------

async def test_mtu_mismatch_prints_the_fix_and_sends_no_sudo(tmp_path: Path) -> None:
    async with demo_flow(tmp_path, {}, speed=100.0) as run:
        run.demo.sim.nodes[WORKER].mtu["enp1s0f1np1"] = 9000  # jumbo on one end only, before recon reads it
        await asyncio.wait({run.task}, timeout=200)
        assert run.task.done()
        failed = [e for _t, e in run.events if isinstance(e, StepEvent) and e.state == "failed"]
    assert [e.step for e in failed] == ["network"], [e for _t, e in run.events[-5:]]
    assert "MTU differs" in failed[0].note and f"on {HEAD}: `sudo ip link set dev enp1s0f1np1 mtu 9000`" in failed[0].note
    assert not [t for _t, _n, t in run.sent if "ip link set" in t or (" sudo " in f" {t} " and "sudo -n true" not in t)]


# ---- known-bad kernels ---------------------------------------------------------------------------

def test_known_bad_list_has_sources_and_matches_only_its_release() -> None:
    entries = known_bad()
    assert entries and all(e.get("source") and e.get("what") and e.get("fix") for e in entries)
    bad = next(e["match"] for e in entries if e["kind"] == "kernel")
    got = known_bad_on(NodeFacts("n1", kernel=bad))
    assert got is not None and bad in got[0] and "n1" in got[0]
    assert known_bad_on(NodeFacts("n1", kernel="6.14.0-1015-nvidia")) is None
    assert known_bad_on(NodeFacts("n1")) is None  # not read is not bad


def test_bad_kernel_stops_at_recon_naming_it(tmp_path: Path) -> None:
    rc, _, said = _deploy(tmp_path, "--demo", "--scenario", "bad-kernel", "--auto")
    assert rc != 0
    stop = [x for x in said.splitlines() if x.startswith("stopped:")]
    assert len(stop) == 1 and stop[0].startswith("stopped: recon:") and "kernel 7.0.0-1019-nvidia" in stop[0]
    assert "Traceback" not in said
