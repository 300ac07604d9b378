"""The wizard's own commands, for real, on the two-host lab (issue 14, part 2).

Every test runs ``sparkconsole deploy`` as a person would (``--config`` the lab's cluster file,
``--until`` a step, ``--yes``, the decisions answered ahead) against two hosts built of network
namespaces, OpenSSH sshd and a Docker engine each (:mod:`tests.lab.hosts`), and then looks at the
hosts themselves: their interfaces, the files in their Hugging Face caches and their sha256, the
images in their Docker engines, ``ray status`` inside the head's container, their sshd logs.
``serve`` needs a GPU, so the lab's runs stop after ``cluster``.

The tests share one lab and run in file order: the network's two failures first (each restores
the link), then the deployment, then its teardown.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path

import pytest

from tests.lab.hosts import (
    FAST_IF,
    FAST_MTU,
    LOGIN_HOME,
    LOGIN_USER,
    MODEL_ID,
    Lab,
    LabHost,
    leftovers,
    model_files,
)

pytestmark = [pytest.mark.netns, pytest.mark.sshd, pytest.mark.docker, pytest.mark.timeout(600)]

SNAP = f"{LOGIN_HOME}/.cache/huggingface/hub/models--sclab--tiny-qwen3/snapshots"  # the login user's cache


def _latest_state(cli) -> dict:
    files = sorted((cli.state_dir() / "deployments").glob("*.json"), key=lambda p: p.stat().st_mtime)
    assert files, "no deployment state was written"
    return json.loads(files[-1].read_text())


def _link(host: LabHost) -> dict:
    return json.loads(host.run("ip", "-j", "addr", "show", FAST_IF).stdout)[0]


def _wait_link(host: LabHost, up: bool, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (_link(host)["operstate"] == "UP") == up:
            return
        time.sleep(0.1)
    raise AssertionError(f"{host.name}: {FAST_IF} did not go {'up' if up else 'down'}")


def _say(proc) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-2000:]}"


def test_recon_reads_both_hosts_as_they_are(lab_cli):
    lab: Lab = lab_cli.lab
    got = lab_cli.deploy(until="recon")
    assert got.returncode == 0, _say(got)
    facts = _latest_state(lab_cli)["facts"]["nodes"]
    for h in lab.hosts:
        f, real = facts[h.name], _link(h)
        (link,) = [lk for lk in f["links"] if lk["netdev"] == FAST_IF]
        # what recon read is what the host's kernel says about its fast link
        assert link["up"] and real["operstate"] == "UP"
        assert link["mtu"] == real["mtu"] == FAST_MTU
        assert link["ipv4"] == [f"{h.fast_ip}/24"]
        assert [a["local"] for a in real["addr_info"] if a["family"] == "inet"] == [h.fast_ip]
        assert f["user"] == LOGIN_USER and f["home"] == LOGIN_HOME  # the login user, not root (DGX OS)
        assert f["docker"] == h.docker("version", "--format", "{{.Server.Version}}").stdout.strip()
        assert {i["ref"] for i in f["images"]} == set(h.docker("images", "--format", "{{.Repository}}:{{.Tag}}").stdout.split())
    # which host reaches the Hub: A (200 from the stand-in), B (no route: curl gives up at once)
    assert facts["lab-a"]["hub"] is True and facts["lab-a"]["hub_detail"] == "200"
    assert facts["lab-b"]["hub"] is False
    assert lab.b.sh(f"curl -sS -m 5 {lab.hub_url}/api/models/{MODEL_ID}", check=False).returncode != 0
    assert lab.image in {i["ref"] for i in facts["lab-a"]["images"]} and not facts["lab-b"]["images"]
    assert "fast link 192.168." in got.stdout and "(enp1s0f1np1 Up), Hub reachable" in got.stdout


def test_network_stops_with_the_exact_fix_when_one_end_has_mtu_1500(lab_cli):
    lab: Lab = lab_cli.lab
    lab.b.run("ip", "link", "set", "dev", FAST_IF, "mtu", "1500")
    try:
        assert _link(lab.b)["mtu"] == 1500
        # a jumbo don't-fragment ping from A really does not get through any more
        ping = lab.a.run("ping", "-c", "1", "-W", "2", "-M", "do", "-s", str(FAST_MTU - 28), lab.b.fast_ip,
                         check=False)
        assert ping.returncode != 0
        got = lab_cli.deploy("--answer", "network.mtu=stop", until="network")
        assert got.returncode == 1, _say(got)
        assert "the MTU differs between the ends of the fast link (lab-a 9000, lab-b 1500)" in got.stdout, _say(got)
        assert f"fix: on lab-b: `sudo ip link set dev {FAST_IF} mtu {FAST_MTU}`" in got.stdout, _say(got)
        assert _latest_state(lab_cli)["steps"]["network"] == "failed"
    finally:
        lab.b.run("ip", "link", "set", "dev", FAST_IF, "mtu", str(FAST_MTU))
    assert _link(lab.b)["mtu"] == FAST_MTU


def test_network_stops_with_the_exact_fix_when_the_fast_link_is_set_down(lab_cli):
    lab: Lab = lab_cli.lab
    lab.b.run("ip", "link", "set", "dev", FAST_IF, "down")
    try:
        _wait_link(lab.b, up=False)
        assert "NO-CARRIER" in _link(lab.a)["flags"]  # the other end sees no carrier
        assert lab.a.run("ping", "-c", "1", "-W", "1", lab.b.fast_ip, check=False).returncode != 0
        got = lab_cli.deploy(until="network")
        assert got.returncode == 1, _say(got)
        assert f"{FAST_IF} is set down on lab-b" in got.stdout, _say(got)
        assert f"fix: on lab-b: `sudo ip link set dev {FAST_IF} up`" in got.stdout, _say(got)
    finally:
        lab.b.run("ip", "link", "set", "dev", FAST_IF, "up")
    _wait_link(lab.b, up=True)
    _wait_link(lab.a, up=True)


def _sha256_on(host: LabHost, paths: list[str]) -> dict[str, str]:
    out = host.run("sha256sum", *paths).stdout
    return {line.split()[1]: line.split()[0] for line in out.splitlines()}


_REHEARSAL: dict[str, Path] = {}  # the rehearsal's report, for the comparison after the real run


def _journal_lines(lab_cli) -> int:
    path = lab_cli.state_dir() / "journal.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_a_rehearsal_reads_the_hosts_without_changing_them(lab_cli, tmp_path_factory):
    """Issue 26 on real hosts: the read-only walk, the twin written from it, the whole flow up to
    the cluster run on the twin; the hosts are as they were (no container, no file, no journal line)."""
    lab: Lab = lab_cli.lab
    journal = _journal_lines(lab_cli)
    twin = tmp_path_factory.mktemp("rehearsal") / "lab-twin.json"
    got = lab_cli.deploy("--rehearse", "--json", "--twin-out", str(twin), until="cluster")
    assert got.returncode == 0, _say(got)
    summary = json.loads(got.stdout.splitlines()[-1])
    assert summary["event"] == "rehearsal" and summary["ok"], summary
    assert summary["message"] == "stopped after cluster, as asked (--until)"
    assert any("the one chosen" in x for x in summary["invented"])  # the lab's image: assumed, said so
    # what decides a small copy's time, timed on the hosts without writing: ssh between them, the
    # link as ssh carries it, hf's start (the lab's hosts have hf)
    measured = json.loads(twin.read_text())["measured"]
    assert measured["peer_ssh_s"] > 0 and measured["fast_link_copy"] > 1e6 and measured["hf_start_s"] > 0, measured
    for h in lab.hosts:
        assert h.docker("ps", "-aq").stdout.strip() == ""
    assert lab.a.run("test", "-e", SNAP, check=False).returncode != 0  # nothing downloaded
    assert lab.b.docker("images", "-q").stdout.strip() == ""  # nothing copied
    assert _journal_lines(lab_cli) == journal
    _REHEARSAL["report"] = twin.with_name("lab-twin.rehearsal.json")


def test_the_wizard_deploys_up_to_the_cluster_on_the_two_hosts(lab_cli):
    lab: Lab = lab_cli.lab
    t0 = time.monotonic()
    got = lab_cli.deploy(until="cluster", timeout=420)
    took = time.monotonic() - t0
    assert got.returncode == 0, _say(got)
    assert "ok: stopped after cluster, as asked (--until)" in got.stdout
    for step in ("recon", "plan", "engine", "network", "weights", "images", "free-memory", "caches", "cluster"):
        assert re.search(rf"^✓ {re.escape(step)}\s+done", got.stdout, re.M), f"{step} not done:\n{got.stdout}"
    state = _latest_state(lab_cli)
    want = {name: hashlib.sha256(data).hexdigest() for name, data in model_files().items()}

    # network: A reached B's sshd over the fast link (the copy's ssh), and B reached A's
    assert re.search(rf"Accepted publickey for {LOGIN_USER} from {re.escape(lab.a.fast_ip)} ",
                     (Path(lab.b.dir) / "sshd" / "sshd.log").read_text())
    assert re.search(rf"Accepted publickey for {LOGIN_USER} from {re.escape(lab.b.fast_ip)} ",
                     (Path(lab.a.dir) / "sshd" / "sshd.log").read_text())

    # weights: downloaded on A (the HF cache's blobs and links), copied to B with the links
    # dereferenced (plain files, no blobs), every file's size and sha256 the Hub's
    (rev,) = lab.a.run("ls", SNAP).stdout.split()
    a_files = lab.a.run("find", f"{SNAP}/{rev}", "-mindepth", "1", "-printf", "%y %s %P\\n").stdout.split("\n")
    assert {ln.split()[2] for ln in a_files if ln.startswith("l ")} == set(want)
    b_listing = lab.b.run("find", f"{SNAP}/{rev}", "-mindepth", "1", "-printf", "%y %s %P\\n").stdout.split("\n")
    b_kinds = {ln.split()[2]: (ln.split()[0], int(ln.split()[1])) for ln in b_listing if ln.strip()}
    assert b_kinds == {name: ("f", len(data)) for name, data in model_files().items()}
    assert lab.b.run("ls", f"{LOGIN_HOME}/.cache/huggingface/hub/models--sclab--tiny-qwen3").stdout.split().count("blobs") == 0
    sums = _sha256_on(lab.b, [f"{SNAP}/{rev}/{n}" for n in want])
    assert {Path(p).name: s for p, s in sums.items()} == want
    assert "rsync -a --partial -L" in got.stdout

    # caches: sudo wants a password on both hosts, so the login user evicted the HF cache's files from the
    # page cache with the real GNU dd (posix_fadvise DONTNEED), exit 0 on each; nothing went through sudo
    evicted = re.findall(r"^\s+(lab-[ab]) \$ sync && for f in \S+/hub/\*/blobs/\*.*iflag=nocache", got.stdout, re.M)
    assert sorted(evicted) == ["lab-a", "lab-b"], got.stdout
    assert not re.search(r"\$ sudo ", got.stdout) and "root@" not in got.stdout

    # images: B now holds the image A had, with the same ID, loaded through docker save | ssh | docker load
    assert lab.b.docker("image", "inspect", "-f", "{{.Id}}", lab.image).stdout.strip() == lab.image_id
    assert f"docker save {lab.image} | ssh -o BatchMode=yes" in got.stdout

    # cluster: a Ray head on A and a worker on B, in containers, and `ray status` counts both
    name = next(s["name"] for s in state["started"] if s["node"] == "lab-a")
    assert {(s["node"], s["name"]) for s in state["started"]} == {("lab-a", name), ("lab-b", name)}
    for h in lab.hosts:
        assert h.docker("inspect", "-f", "{{.State.Status}}", name).stdout.strip() == "running"
    status = lab.a.docker("exec", name, "ray", "status").stdout
    assert len(re.findall(r"^\s*1 node_[0-9a-f]+", status, re.M)) == 2, status
    assert f"/{2 * os.cpu_count()}.0 CPU" in status, status
    # and a task pinned to each node runs there (B's answers come back over the fast link)
    program = (
        "import ray, socket\n"
        "from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as A\n"
        "ray.init(address='auto', logging_level='ERROR')\n"
        "@ray.remote(num_cpus=1)\n"
        "def where(): return socket.gethostname()\n"
        "nodes = sorted(n['NodeManagerAddress'] for n in ray.nodes() if n['Alive'])\n"
        "print(nodes, ray.get([where.options(scheduling_strategy=A(node_id=n['NodeID'], soft=False)).remote()"
        " for n in sorted(ray.nodes(), key=lambda n: n['NodeManagerAddress']) if n['Alive']]))\n"
    )
    ran = lab.a.docker("exec", name, "python3", "-c", program, timeout=120).stdout.strip().splitlines()[-1]
    assert ran == str([lab.a.fast_ip, lab.b.fast_ip]) + " " + str(["lab-a", "lab-b"]), ran
    print(f"deploy --until cluster on the lab: {took:.1f} s")


def test_the_real_run_is_what_the_rehearsal_foresaw(lab_cli):
    """The real ``--until cluster`` run above against the rehearsal's report: the same decisions,
    the same changes on the same hosts in the same order (the deployment's own ids made equal)."""
    from sparkconsole.deploy.compare import JOB_END, same_command

    report_path = _REHEARSAL.get("report")
    assert report_path is not None, "the rehearsal test did not run first"
    got = lab_cli.run("deploy", "--compare-rehearsal", str(report_path), "--json")
    cmp = json.loads(got.stdout)
    assert got.returncode == 0 and cmp["agrees"], _say(got)
    assert cmp["same_decisions"] >= 5 and cmp["unforeseen"] == [] and cmp["not_sent"] == []
    # the copy's time: the download and the streamed copy beside it (its passes five seconds apart),
    # foreseen from what the read-only walk timed; a loose bound here (the host may be loaded),
    # the 25 % is measured side by side in docs/rehearsal.md
    times = {t["step"]: t for t in cmp["times"]}
    weights = times["weights"]
    assert weights["real_s"] and 0.5 < weights["estimate_s"] / weights["real_s"] < 1.5, cmp["times"]
    report = json.loads(report_path.read_text())
    planned = [(e["step"], e["node"], same_command(e["command"])) for e in report["events"]
               if e["event"] == "planned" and e["mutating"]]
    state = _latest_state(lab_cli)
    lines = [json.loads(x) for x in (lab_cli.state_dir() / "journal.jsonl").read_text().splitlines()]
    # (the cluster's lock on the head is the session's housekeeping: a rehearsal takes none)
    sent = [(x["step"], x["node"], same_command(x["command"])) for x in lines
            if x.get("deployment") == state["id"] and not x["command"].startswith(JOB_END) and x["step"] != "lock"]
    assert sent == planned and len(sent) >= 8


def test_teardown_removes_exactly_what_the_deployment_started(lab_cli):
    lab: Lab = lab_cli.lab
    state = _latest_state(lab_cli)
    started = {(s["node"], s["name"]) for s in state["started"]}
    assert len(started) == 2, "the deployment test did not leave its Ray containers"
    # something on B that the deployment did not start
    lab.b.docker("run", "-d", "--name", "bystander", "--network", "host", lab.image, "sleep", "600")
    try:
        got = lab_cli.run("deploy", "--config", str(lab.config_path), "--teardown", "--yes")
        assert got.returncode == 0, _say(got)
        assert "ok: removed what this deployment started" in got.stdout
        for h in lab.hosts:
            names = set(h.docker("ps", "-a", "--format", "{{.Names}}").stdout.split())
            assert not names & {n for _, n in started}, names
            assert "raylet" not in h.run("ps", "-eo", "comm").stdout  # no Ray process left on the host
            assert h.docker("image", "inspect", "-f", "{{.Id}}", lab.image).stdout.strip() == lab.image_id
        assert lab.b.docker("inspect", "-f", "{{.State.Status}}", "bystander").stdout.strip() == "running"
        assert lab.b.run("ls", SNAP).returncode == 0  # the weights stay (teardown removes what it started)
        assert _latest_state(lab_cli)["result"] == "torn-down"
    finally:
        lab.b.docker("rm", "-f", "bystander", check=False)


def test_a_lab_that_fails_half_way_leaves_nothing_behind(tmp_path, monkeypatch):
    def no_docker(self, host):
        raise RuntimeError(f"{host.name}: dockerd refused (on purpose)")

    monkeypatch.setattr(Lab, "_start_dockerd", no_docker)
    holder: dict[str, Lab] = {}
    real_links = Lab._links

    def links(self):
        holder["lab"] = self
        real_links(self)

    monkeypatch.setattr(Lab, "_links", links)
    with pytest.raises(RuntimeError, match="on purpose"):
        Lab.create(tmp_path / "broken", with_image=False)
    lab = holder["lab"]
    assert lab.hosts[0].init_pid and lab.hub_pid  # it got as far as the hosts' sshd and the Hub
    assert leftovers(lab) == []
    assert not (tmp_path / "broken").exists()
