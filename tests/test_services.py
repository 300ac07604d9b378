"""Service actions against a REAL Docker engine through the REAL SSH transport (OpenSSH sshd)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from sparkconsole.errors import ReadOnlyError, TransportError, ValidationError
from sparkconsole.journal import Journal, read_journal
from sparkconsole.probe.samples import Container
from sparkconsole.remote import RemoteCommand, systemctl_show
from sparkconsole.services import (
    Debouncer,
    Service,
    ServiceController,
    parse_systemctl_show,
    services_from_containers,
)
from sparkconsole.transport.base import CommandResult
from sparkconsole.transport.ssh import SshTransport
from tests.lab.docker import DockerLab, container_state, docker_lab_fixture, ps_names, wait_state


@pytest.fixture
async def transport(sshd) -> AsyncIterator[SshTransport]:
    t = SshTransport(sshd.node_config("spark-01"))
    try:
        yield t
    finally:
        await t.close()


@pytest.fixture
def docker_lab(tmp_path: Path) -> Iterator[DockerLab]:
    yield from docker_lab_fixture(tmp_path)


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    return Journal(tmp_path / "state" / "journal.jsonl")


@pytest.mark.docker
@pytest.mark.sshd
async def test_stop_start_restart_a_container_through_ssh(
    transport: SshTransport, journal: Journal, docker_lab: DockerLab
) -> None:
    name = docker_lab.ticker("svc")
    wait_state(name, "running")
    ctl = ServiceController("spark-01", transport, journal=journal)
    svc = Service(name=name, kind="container", state="running")

    stop = ctl.plan("stop", svc)
    assert stop.mutating and stop.shell() == f"docker stop {name}"
    res = await ctl.execute(stop)
    assert res.ok, res.message
    assert res.exit_code == 0 and "docker stop" in res.message and "spark-01" in res.message
    assert name not in ps_names()  # gone from `docker ps`
    assert container_state(name) == "exited"

    res = await ctl.execute(ctl.plan("start", Service(name=name, kind="container", state="exited")))
    assert res.ok, res.message
    assert name in ps_names()
    started_at = container_state(name)
    assert started_at == "running"

    res = await ctl.execute(ctl.plan("restart", svc))
    assert res.ok, res.message
    assert name in ps_names()

    entries = read_journal(journal.path)
    assert [e.command for e in entries] == [f"docker stop {name}", f"docker start {name}", f"docker restart {name}"]
    assert all(e.exit_code == 0 and e.node == "spark-01" and e.duration_s is not None for e in entries)
    assert entries[0].summary == f"docker stop {name}"


@pytest.mark.docker
@pytest.mark.sshd
async def test_remove_only_an_exited_container(
    transport: SshTransport, journal: Journal, docker_lab: DockerLab
) -> None:
    name = docker_lab.ticker("rm")
    wait_state(name, "running")
    ctl = ServiceController("spark-01", transport, journal=journal)
    with pytest.raises(ValidationError, match="only an exited or created container"):
        ctl.plan("remove", Service(name=name, kind="container", state="running"))
    assert "remove" not in Service(name=name, kind="container", state="running").actions
    await ctl.execute(ctl.plan("stop", Service(name=name, kind="container", state="running")))
    cmd = ctl.plan("remove", Service(name=name, kind="container", state="exited"))
    assert cmd.shell() == f"docker rm {name}"
    res = await ctl.execute(cmd)
    assert res.ok, res.message
    assert container_state(name) is None
    assert [e.command for e in read_journal(journal.path)][-1] == f"docker rm {name}"


@pytest.mark.docker
@pytest.mark.sshd
async def test_a_failing_command_is_journaled_with_its_exit_code(
    transport: SshTransport, journal: Journal, docker_lab: DockerLab
) -> None:
    ctl = ServiceController("spark-01", transport, journal=journal)
    cmd = ctl.plan("stop", "sctest-no-such-container-4711")
    res = await ctl.execute(cmd)
    assert not res.ok and res.exit_code not in (0, None)
    assert res.severity == "error"
    assert "No such container" in res.message and "failed" in res.message
    (entry,) = read_journal(journal.path)
    assert entry.exit_code == res.exit_code
    assert entry.command == "docker stop sctest-no-such-container-4711"
    assert entry.error and "No such container" in entry.error


@pytest.mark.docker
@pytest.mark.sshd
async def test_read_only_refuses_and_runs_nothing(
    transport: SshTransport, journal: Journal, docker_lab: DockerLab, sshd
) -> None:
    name = docker_lab.ticker("ro")
    wait_state(name, "running")
    ctl = ServiceController("spark-01", transport, read_only=True, journal=journal)
    cmd = ctl.plan("stop", Service(name=name, kind="container", state="running"))
    reason = ctl.refusal(cmd)
    assert reason and "read-only" in reason and "spark-01" in reason and name in reason
    logins = sshd.accepted_logins()
    with pytest.raises(ReadOnlyError, match="read-only"):
        await ctl.execute(cmd)
    assert container_state(name) == "running"  # nothing ran
    assert sshd.accepted_logins() == logins  # not even a connection was opened
    assert not journal.path.exists()  # nothing journaled as run
    # read-only commands are never refused
    assert ctl.refusal(systemctl_show(["ollama"])) is None


class _TimeoutTransport:
    node = "spark-02"

    async def run(self, cmd, timeout: float = 30.0, input=None) -> CommandResult:
        raise TransportError(f"spark-02: timed out after {timeout:g} s: {cmd}")


async def test_timeouts_are_journaled_without_exit_code(journal: Journal) -> None:
    ctl = ServiceController("spark-02", _TimeoutTransport(), journal=journal, timeout=1.5)  # type: ignore[arg-type]
    res = await ctl.execute(ctl.plan("restart", "ollama", kind="unit"))
    assert not res.ok and res.exit_code is None and "timed out" in res.message
    (entry,) = read_journal(journal.path)
    assert entry.exit_code is None and entry.command == "sudo -n systemctl restart ollama"
    assert "timed out after 1.5 s" in (entry.error or "")


def test_plan_units_and_bad_input() -> None:
    ctl = ServiceController("n", _TimeoutTransport(), journal=Journal("/nonexistent/j"))  # type: ignore[arg-type]
    cmd = ctl.plan("stop", Service(name="ollama", kind="unit", state="active"))
    assert isinstance(cmd, RemoteCommand) and cmd.mutating
    assert cmd.shell() == "sudo -n systemctl stop ollama"
    with pytest.raises(ValidationError, match="cannot be removed"):
        ctl.plan("remove", Service(name="ollama", kind="unit"))
    with pytest.raises(ValidationError, match="unknown action"):
        ctl.plan("kill", "vllm")
    with pytest.raises(ValidationError):
        ctl.plan("stop", "vllm; rm -rf /")


def test_service_lists() -> None:
    text = (
        "Id=ollama.service\nLoadState=loaded\nActiveState=active\nSubState=running\n\n"
        "Id=nope.service\nLoadState=not-found\nActiveState=inactive\nSubState=dead\n\n"
    )
    units = parse_systemctl_show(text, ["ollama", "nope", "docker"])
    assert [(u.name, u.state, u.detail, u.loaded) for u in units] == [
        ("ollama", "active", "running", True),
        ("nope", "inactive", "dead", False),
        ("docker", None, None, None),
    ]
    assert units[0].actions == ("stop", "restart") and units[1].actions == ()
    assert parse_systemctl_show("garbage\x00\n", ["a"])[0].state is None
    assert systemctl_show(["ollama", "docker"]).shell() == (
        "systemctl show --no-pager -p Id,LoadState,ActiveState,SubState -- ollama docker"
    )
    cs = services_from_containers([
        Container(id="abc", name="vllm", image="vllm/vllm-openai", state="running", status="Up 2 hours"),
        Container(id="def", name="old", image="x", state="exited", status="Exited (0)"),
        Container(id=None, name="bad name!", image=None, state=None, status=None),
    ])
    assert [(c.name, c.actions) for c in cs] == [
        ("vllm", ("stop", "restart")),
        ("old", ("start", "restart", "remove")),
    ]


@pytest.mark.sshd
async def test_list_services_through_ssh(transport: SshTransport, journal: Journal) -> None:
    # This machine has no systemd: the unit states are unknown, with the reason, never a crash.
    ctl = ServiceController("spark-01", transport, journal=journal)
    services = await ctl.list_services(
        [Container(id="1", name="vllm", image="i", state="running", status="Up")], ["ollama"]
    )
    assert [s.name for s in services] == ["vllm", "ollama"]
    unit = services[1]
    assert unit.kind == "unit"
    assert unit.state is not None or unit.reason  # known, or unknown with a reason
    assert not journal.path.exists()  # reads are not journaled


def test_debouncer_per_key_and_destructive() -> None:
    now = [100.0]
    d = Debouncer(default_s=0.05, destructive_s=0.3, clock=lambda: now[0])
    assert d.allow("stop:spark-01:vllm")
    now[0] += 0.1
    assert not d.allow("stop:spark-01:vllm")  # destructive: 300 ms
    assert d.allow("stop:spark-01:other")  # another key is independent
    assert d.allow("down")
    now[0] += 0.06
    assert d.allow("down")  # 50 ms for plain keys
    now[0] += 0.25
    assert d.allow("stop:spark-01:vllm")  # 0.41 s after the first accepted press
    assert d.interval("remove") == 0.3 and d.interval("start") == 0.05
    d2 = Debouncer(intervals={"start": 1.0}, clock=lambda: now[0])
    assert d2.allow("start") and not d2.allow("start")
    d2.reset("start")
    assert d2.allow("start")
