"""The console's state folder is private, and what is written there is never lost.

A state folder where another user can plant a symbolic link would have the console truncate or
overwrite a file of the user's (the cluster's lock, the ``latest`` pointer), and one where another
user may write could hand ``--resume`` a deployment to act on: such links and folders are refused,
in one line, and the files they point at stay as they were. A full disk while the lock, the state
or the journal is written is one line too; a change already sent keeps its record (the state,
with the change's key, is saved before the journal is written, each whatever the other did).
"""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sparkconsole.config import ClusterConfig, NodeConfig
from sparkconsole.deploy.decisions import ScriptedAnswers
from sparkconsole.deploy.opening import ClusterLock, lock_name
from sparkconsole.deploy.runner import Runner
from sparkconsole.deploy.state import DeploymentState, StateStore
from sparkconsole.durable import NotPrivate
from sparkconsole.errors import UserError
from sparkconsole.journal import Journal, read_journal
from sparkconsole.remote import command
from sparkconsole.transport.base import CommandResult

ROOT = Path(__file__).resolve().parents[1]
DEPLOYMENT = "20261201-212233-ab12"
PRECIOUS = "the user's own file: never truncated, never overwritten\n"


def _one_line(err: UserError) -> str:
    assert "\n" not in err.message and err.message, err.message
    return err.message


# ---- symbolic links are refused, what they point at untouched -------------------------------------

def test_a_symlinked_lock_file_is_refused_and_its_victim_untouched(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text(PRECIOUS)
    locks = tmp_path / "locks"
    locks.mkdir()
    (locks / lock_name("demo")).symlink_to(victim)
    lock = ClusterLock("demo", DEPLOYMENT, directory=locks)
    with pytest.raises(UserError) as refused:
        lock.acquire()
    assert refused.value.exit_code == 1 and not lock.held
    assert "symbolic link" in _one_line(refused.value) and str(locks / lock_name("demo")) in refused.value.message
    assert victim.read_text() == PRECIOUS


def test_a_hard_link_in_the_lock_folder_is_refused_too(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text(PRECIOUS)
    locks = tmp_path / "locks"
    locks.mkdir()
    os.link(victim, locks / lock_name("demo"))
    with pytest.raises(UserError, match="not a regular file of this user's with one name"):
        ClusterLock("demo", DEPLOYMENT, directory=locks).acquire()
    assert victim.read_text() == PRECIOUS


def test_a_symlinked_latest_pointer_is_refused_its_victim_untouched_and_the_state_kept(tmp_path):
    victim = tmp_path / "victim2"
    victim.write_text(PRECIOUS)
    store = StateStore(tmp_path / "deployments")
    store.root.mkdir()
    (store.root / "latest.demo").symlink_to(victim)
    st = DeploymentState(id=DEPLOYMENT, model="Qwen/Qwen3-0.6B", cluster="demo", done_commands=["pull"])
    with pytest.raises(UserError) as refused:
        store.save(st)
    assert refused.value.exit_code == 1
    assert "latest.demo is a symbolic link" in _one_line(refused.value)
    assert victim.read_text() == PRECIOUS
    assert store.load(DEPLOYMENT).done_commands == ["pull"]  # the state itself was saved whole
    with pytest.raises(UserError, match="symbolic link") as not_read:  # and never read through the link
        store.load(cluster="demo")
    _one_line(not_read.value)


def test_a_symlinked_journal_is_refused_and_its_victim_untouched(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text(PRECIOUS)
    (tmp_path / "journal.jsonl").symlink_to(victim)
    with pytest.raises(UserError) as refused:
        Journal(tmp_path / "journal.jsonl").record(node="a", command="docker stop x", exit_code=0, duration_s=0.1)
    assert refused.value.exit_code == 1 and "symbolic link" in _one_line(refused.value)
    assert victim.read_text() == PRECIOUS


def test_a_state_file_or_id_that_leads_out_of_the_folder_is_never_read(tmp_path):
    store = StateStore(tmp_path / "deployments")
    store.save(DeploymentState(id=DEPLOYMENT, model="Qwen/Qwen3-0.6B", cluster="demo"))
    outside = tmp_path / "planted.json"
    outside.write_text(store.path(DEPLOYMENT).read_text().replace(DEPLOYMENT, "20261201-000000-evil"))
    (store.root / "20261201-000000-evil.json").symlink_to(outside)
    assert [s.id for s in store.saved()] == [DEPLOYMENT]  # the planted link is passed over
    with pytest.raises(UserError, match="symbolic link"):
        store.load("20261201-000000-evil")
    with pytest.raises(UserError, match="not a deployment id"):
        store.load("../planted")


# ---- the folder: made private, a shared one refused ----------------------------------------------

def test_the_state_folder_is_made_private(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "state"))
    StateStore().save(DeploymentState(id=DEPLOYMENT, model="Qwen/Qwen3-0.6B", cluster="demo"))
    Journal().record(node="a", command="docker stop x", exit_code=0, duration_s=0.1)
    with ClusterLock("demo", DEPLOYMENT):
        pass
    for folder in ("state", "state/deployments", "state/locks"):
        assert stat.S_IMODE((tmp_path / folder).stat().st_mode) == 0o700, folder
    for record in ("state/journal.jsonl", f"state/deployments/{DEPLOYMENT}.json", "state/deployments/latest.demo",
                   f"state/locks/{lock_name('demo')}"):
        assert stat.S_IMODE((tmp_path / record).stat().st_mode) == 0o600, record


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777])
def test_a_folder_others_may_write_is_refused_in_one_line_and_nothing_written(tmp_path, monkeypatch, mode):
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(mode)
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(state))
    for write in (lambda: StateStore().save(DeploymentState(id=DEPLOYMENT, model="m/x", cluster="demo")),
                  lambda: Journal().record(node="a", command="docker stop x", exit_code=0, duration_s=0.1),
                  lambda: ClusterLock("demo", DEPLOYMENT).acquire(),
                  lambda: StateStore().load(DEPLOYMENT)):
        with pytest.raises(NotPrivate) as refused:
            write()
        assert refused.value.exit_code == 2
        assert _one_line(refused.value) == (f"the state folder {state} can be written by other users (mode {mode:o}): "
                                            f"refused; make it private (chmod 700 {state}) or set "
                                            "SPARKCONSOLE_STATE_DIR to a folder of your own")
    assert list(state.iterdir()) == []


def test_a_folder_of_another_user_is_refused(tmp_path, monkeypatch):
    (tmp_path / "deployments").mkdir(mode=0o700)
    owner = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: owner + 4242)  # the folder is now someone else's, as we see it
    with pytest.raises(NotPrivate) as refused:
        StateStore(tmp_path / "deployments").save(DeploymentState(id=DEPLOYMENT, model="m/x", cluster="demo"))
    assert _one_line(refused.value) == (f"the deployments folder {tmp_path / 'deployments'} belongs to another user "
                                        f"(uid {owner}): refused; set SPARKCONSOLE_STATE_DIR to a folder of your own")


def test_the_cli_refuses_a_shared_state_folder_in_one_line(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o777)
    env = {**os.environ, "SPARKCONSOLE_STATE_DIR": str(state), "HF_HUB_OFFLINE": "1"}
    env.pop("SPARKCONSOLE_CONFIG", None)
    res = subprocess.run([sys.executable, "-m", "sparkconsole.cli", "deploy", "--resume", DEPLOYMENT], cwd=ROOT,
                         env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert res.stderr.strip() == (f"sparkconsole: error: the state folder {state} can be written by other users "
                                  f"(mode 777): refused; make it private (chmod 700 {state}) or set "
                                  "SPARKCONSOLE_STATE_DIR to a folder of your own")


# ---- a full disk: one line, nothing lost -------------------------------------------------------

def _no_space(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_while_the_lock_is_written_is_one_line_and_leaves_no_lock(tmp_path, monkeypatch):
    lock = ClusterLock("demo", DEPLOYMENT, directory=tmp_path)
    with monkeypatch.context() as m:
        m.setattr(os, "write", _no_space)
        with pytest.raises(UserError) as refused:
            lock.acquire()
    assert refused.value.exit_code == 1 and not lock.held
    assert _one_line(refused.value) == (f"cannot write the lock of cluster 'demo' ({tmp_path / lock_name('demo')}): "
                                        "No space left on device; free some disk and run again")
    with ClusterLock("demo", "20261202-080000-ef56", directory=tmp_path) as again:  # nothing held it
        assert again.held


def test_a_full_disk_while_the_state_or_the_journal_is_written_is_one_line(tmp_path, monkeypatch):
    store = StateStore(tmp_path / "deployments")
    st = DeploymentState(id=DEPLOYMENT, model="m/x", cluster="demo", done_commands=["one"])
    store.save(st)
    st.done_commands.append("two")
    journal = Journal(tmp_path / "journal.jsonl")
    journal.record(node="a", command="docker stop x", exit_code=0, duration_s=0.1)
    with monkeypatch.context() as m:
        m.setattr(os, "write", _no_space)
        with pytest.raises(UserError) as state_refused:
            store.save(st)
        with pytest.raises(UserError) as journal_refused:
            journal.record(node="a", command="docker start x", exit_code=0, duration_s=0.1)
    assert "No space left on device" in _one_line(state_refused.value)
    assert _one_line(journal_refused.value) == (f"the journal {tmp_path / 'journal.jsonl'} could not be written "
                                                "(No space left on device)")
    assert store.load(DEPLOYMENT).done_commands == ["one"]  # the last good state, whole
    assert [e.command for e in read_journal(journal.path)] == ["docker stop x"]  # no torn line


# ---- a change already sent keeps its record whatever fails after ----------------------------------

@dataclass
class OkTransport:
    """A node that does what it is told: each command sent is noted."""

    sent: list[str] = field(default_factory=list)

    async def run(self, cmd, timeout: float = 30.0, input: str | None = None) -> CommandResult:
        self.sent.append(cmd.shell())
        return CommandResult(cmd.shell(), 0, "", "", 0.01)

    async def close(self) -> None:
        pass


CONFIG = ClusterConfig(nodes=(NodeConfig("spark-a", "127.0.0.1", role="head"),), name="demo")
PULL = command("docker", "pull", "vllm/vllm-openai:v0.11.0", mutating=True, summary="pull the engine's image")


def _runner(tmp_path: Path, state: DeploymentState, node: OkTransport) -> Runner:
    return Runner(config=CONFIG, state=state, transports={"spark-a": node}, answer=ScriptedAnswers({}, auto=True),
                  emit=lambda e: None, store=StateStore(tmp_path / "deployments"),
                  journal=Journal(tmp_path / "journal.jsonl"))


async def test_a_journal_that_fails_after_a_sent_change_keeps_the_change_saved(tmp_path, monkeypatch):
    node = OkTransport()
    state = DeploymentState(id=DEPLOYMENT, model="m/x", cluster="demo")
    runner = _runner(tmp_path, state, node)
    runner.step = "image"
    with monkeypatch.context() as m:
        m.setattr("sparkconsole.journal.write_all", _no_space)
        with pytest.raises(UserError) as refused:
            await runner.change("spark-a", PULL, key="image.pull")
    assert node.sent == [PULL.shell()]  # it was sent
    assert refused.value.exit_code == 1
    assert _one_line(refused.value) == (f"the journal {tmp_path / 'journal.jsonl'} could not be written (No space "
                                        "left on device): it missed pull the engine's image on spark-a (exit 0); "
                                        "the deployment's state was saved; free some disk, then --resume")
    saved = StateStore(tmp_path / "deployments").load(DEPLOYMENT)
    assert saved.done_commands == ["image.pull"]
    resumed = _runner(tmp_path, saved, node)  # --resume: the finished change is not sent again
    assert (await resumed.change("spark-a", PULL, key="image.pull")).ok
    assert node.sent == [PULL.shell()]


async def test_a_state_that_cannot_be_saved_after_a_sent_change_still_has_it_journaled(tmp_path, monkeypatch):
    node = OkTransport()
    runner = _runner(tmp_path, DeploymentState(id=DEPLOYMENT, model="m/x", cluster="demo"), node)
    runner.step = "image"
    with monkeypatch.context() as m:
        m.setattr("sparkconsole.deploy.state.replace_file", _no_space)
        with pytest.raises(UserError) as refused:
            await runner.change("spark-a", PULL, key="image.pull")
    assert refused.value.exit_code == 1
    assert _one_line(refused.value).startswith("the deployment state could not be saved (No space left on device)")
    (entry,) = read_journal(tmp_path / "journal.jsonl")
    assert (entry.command, entry.exit_code, entry.deployment, entry.step) == (PULL.shell(), 0, DEPLOYMENT, "image")
