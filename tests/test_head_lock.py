"""The cluster's lock on its head (:mod:`sparkconsole.deploy.head_lock`), on the demo cluster over
real SSH: two wizards with two state folders (two laptops, as far as the local lock can tell) on
one cluster, the second refused naming the first; a stale lock (no refresh, or its pid gone on this
laptop) reported and taken over; a holder whose lock was taken over stops; plan-only and read-only
runs take none; and the same through ``sparkconsole deploy`` in two processes.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from sparkconsole.deploy.decisions import ScriptedAnswers
from sparkconsole.deploy.flow import Options
from sparkconsole.deploy.head_lock import REFRESH_EVERY_S, STALE_AFTER_S
from sparkconsole.deploy.opening import open_deployment
from sparkconsole.deploy.runner import Settings
from sparkconsole.deploy.state import DeploymentState, StateStore
from sparkconsole.errors import ReadOnlyError, UserError
from sparkconsole.journal import Journal, read_journal
from sparkconsole.remote import HEAD_LOCK_DIR
from sparkconsole.sim import start_demo_cluster
from tests.proc_support import line_reader
from tests.test_deploy_session import GUARD_S, ROOT, _a_gone_pid, _cli, _env, served_demo

HOME = "/home/nvidia"  # the story's head logs in as a stock Spark's user (tests/test_sim_stock.py)
LOCK = f"{HOME}/{HEAD_LOCK_DIR}"
SPEED = 200.0  # node seconds per wall second: a refresh every REFRESH_EVERY_S / SPEED wall seconds
OTHER = "20260101-000000-dead"  # a deployment another console holds the cluster for


@asynccontextmanager
async def opened(demo: Any, folder: Path, **kwargs: Any):
    """A deployment session on the demo with its own state folder (another laptop, as far as the
    local lock knows): its store, its locks, its journal."""
    state = DeploymentState.new(Options().model, Options().to_json(), demo.config.name)
    async with open_deployment(demo.config, Options(), state, answer=ScriptedAnswers({}, auto=True),
                               emit=kwargs.pop("emit", lambda e: None), store=StateStore(folder / "deployments"),
                               locks=folder / "locks", journal=Journal(folder / "journal.jsonl"),
                               settings=Settings(poll_s=0.05, speed=SPEED), **kwargs) as session:
        yield session


def head_fs(demo: Any):
    return demo.sim.fs(demo.config.head.name)


def head_record(demo: Any) -> dict | None:
    fs = head_fs(demo)
    if not fs.exists(f"{LOCK}/holder.json"):
        return None
    return json.loads(fs.read_text(f"{LOCK}/holder.json"))


def plant(demo: Any, holder: dict, beat_age_s: float) -> None:
    """A lock on the head as another console would have left it: its record, and its beat that old
    by the head's own clock."""
    fs = head_fs(demo)
    fs.mkdir(LOCK, parents=True)
    fs.write_text(f"{LOCK}/holder.json", json.dumps(holder, sort_keys=True) + "\n")
    now = int(demo.clock.epoch(demo.clock.node_now()))
    fs.write_text(f"{LOCK}/beat", f"{now - int(beat_age_s)}\n")


def lock_entries(folder: Path) -> list[tuple[str, int | None, str]]:
    return [(e.summary.split(" (", 1)[0], e.exit_code, e.deployment or "")
            for e in read_journal(folder / "journal.jsonl") if e.step == "lock"]


TAKE = "take the cluster's lock on this head while the wizard runs"
TAKE_OVER = "take over the cluster's stale lock on this head"
RELEASE = "release the cluster's lock on this head"


async def test_a_second_wizard_with_another_state_folder_is_refused_naming_the_first(tmp_path):
    async with start_demo_cluster(speed=SPEED) as demo:
        head = demo.config.head.name
        async with opened(demo, tmp_path / "a") as first:
            assert first.head_lock is not None and first.head_lock.held
            record = head_record(demo)
            assert record is not None and record["deployment"] == first.state.id and record["pid"] == os.getpid()
            with pytest.raises(UserError) as refused:
                async with opened(demo, tmp_path / "b"):
                    raise AssertionError("not reached")  # pragma: no cover
            err = refused.value
            assert err.exit_code == 1 and "\n" not in err.message
            assert err.message.startswith(f"another deployment wizard holds cluster 'demo-story' (its lock on the "
                                          f"head {head}): pid {os.getpid()} on {socket.gethostname()}, deployment "
                                          f"{first.state.id}, since "), err.message
            assert err.message.endswith("ago; wait for it or stop it"), err.message
            assert head_record(demo) == record  # the first's lock untouched
            # the refused one saved no deployment, and journaled its one try (exit 1)
            assert not list((tmp_path / "b" / "deployments").glob("*.json"))
            ((summary, rc, refused_id),) = lock_entries(tmp_path / "b")
            assert (summary, rc) == (TAKE, 1) and refused_id not in {first.state.id, ""}
            beat = head_fs(demo).read_text(f"{LOCK}/beat")
            deadline = time.monotonic() + GUARD_S
            while head_fs(demo).read_text(f"{LOCK}/beat") == beat:  # the holder refreshes its lock
                assert time.monotonic() < deadline, "waited for the first's refresh"
                await asyncio.sleep(0.05)
        assert not head_fs(demo).exists(LOCK)  # released at the session's end
        # the take and the release journaled; the refreshes between them (every minute) are not
        assert [(s, rc) for s, rc, _ in lock_entries(tmp_path / "a")] == [(TAKE, 0), (RELEASE, 0)]
        async with opened(demo, tmp_path / "b") as third:  # free again: the other folder's wizard goes
            assert third.head_lock is not None and third.head_lock.held


async def test_a_lock_not_refreshed_for_long_is_reported_and_taken_over(tmp_path):
    notes: list[str] = []
    async with start_demo_cluster(speed=SPEED) as demo:
        head = demo.config.head.name
        fresh = {"host": "other-laptop", "pid": 4242, "deployment": OTHER, "since": "2026-01-01T00:00:00+00:00",
                 "token": "0123456789abcdef"}
        plant(demo, fresh, beat_age_s=REFRESH_EVERY_S)  # a holder at work: refused
        with pytest.raises(UserError, match=f"pid 4242 on other-laptop, deployment {OTHER}, since 2026-01-01 "
                                            r"00:00:00 UTC, refreshed \d+ s ago; wait for it or stop it$"):
            async with opened(demo, tmp_path / "a", on_note=notes.append):
                raise AssertionError("not reached")  # pragma: no cover
        assert notes == [] and head_record(demo) == fresh
        plant(demo, fresh, beat_age_s=STALE_AFTER_S + 3000)  # its console gone an hour ago
        async with opened(demo, tmp_path / "a", on_note=notes.append) as session:
            assert len(notes) == 1, notes
            assert notes[0].startswith(f"took over the stale lock of cluster 'demo-story' on its head {head} "
                                       f"(~/{HEAD_LOCK_DIR}): it was pid 4242 on other-laptop, deployment {OTHER}, "
                                       "since 2026-01-01 00:00:00 UTC; it was not refreshed for "), notes[0]
            record = head_record(demo)
            assert record is not None and record["deployment"] == session.state.id
            assert record["host"] == socket.gethostname() and record["token"] != fresh["token"]
        assert not head_fs(demo).exists(LOCK)
        takes = [(s, rc) for s, rc, _ in lock_entries(tmp_path / "a")]
        assert takes == [(TAKE, 1), (TAKE, 1), (TAKE_OVER, 0), (RELEASE, 0)]  # every try journaled


async def test_a_lock_whose_pid_is_gone_on_this_laptop_is_taken_over_at_once(tmp_path):
    notes: list[str] = []
    gone = _a_gone_pid()
    async with start_demo_cluster(speed=SPEED) as demo:
        plant(demo, {"host": socket.gethostname(), "pid": gone, "deployment": OTHER,
                     "since": "2026-01-01T00:00:00+00:00", "token": "feedfacefeedface"}, beat_age_s=1)
        async with opened(demo, tmp_path / "a", on_note=notes.append) as session:
            assert session.head_lock is not None and session.head_lock.held
        assert len(notes) == 1 and f"it was pid {gone} on {socket.gethostname()}, deployment {OTHER}" in notes[0]
        assert notes[0].endswith(f"its pid {gone} is gone on this laptop ({socket.gethostname()})"), notes[0]


async def test_a_holder_whose_lock_was_taken_over_stops_and_leaves_the_new_holder_its_lock(tmp_path):
    notes: list[str] = []
    async with start_demo_cluster(speed=SPEED) as demo:
        async with opened(demo, tmp_path / "a", on_note=notes.append) as session:
            usurper = {"host": "other-laptop", "pid": 7, "deployment": OTHER, "since": "2026-01-01T00:00:00+00:00",
                       "token": "abababababababab"}
            plant(demo, usurper, beat_age_s=0)  # another console judged this one gone and took it
            start = demo.clock.now()
            deadline = time.monotonic() + GUARD_S
            while not session.runner.cancelled:  # the next refresh finds it
                assert time.monotonic() < deadline, "waited for the refresh to find the lock taken"
                await asyncio.sleep(0.05)
            assert demo.clock.now() - start <= 3 * REFRESH_EVERY_S  # within a refresh or so, in node time
            assert "was taken over by another console" in session.runner.stop_reason
            assert any(f"was taken over (pid 7 on other-laptop, deployment {OTHER}" in n for n in notes), notes
        assert head_record(demo) == usurper  # its lock is left to it: no release is even sent
        assert [s for s, _rc, _d in lock_entries(tmp_path / "a")] == [TAKE]


async def test_plan_only_and_read_only_runs_take_no_lock_on_the_head(tmp_path):
    async with start_demo_cluster(speed=SPEED) as demo:
        async with opened(demo, tmp_path / "a", plan_only=True) as session:
            assert session.head_lock is None and session.lock is None
            assert not head_fs(demo).exists(LOCK)
        async with opened(demo, tmp_path / "b", read_only=True) as session:
            assert session.head_lock is None and session.lock is not None
            assert not head_fs(demo).exists(LOCK)
            with pytest.raises(ReadOnlyError):  # and nothing else may take it on their behalf
                from sparkconsole.remote import head_lock_take
                await session.runner.housekeeping(demo.config.head.name,
                                                  head_lock_take(json.dumps({"host": "x", "pid": 1}),
                                                                 session.state.id))
        assert lock_entries(tmp_path / "a") == [] and lock_entries(tmp_path / "b") == []


# ---- end to end: `sparkconsole deploy` twice at once, from two state folders ---------------------

@pytest.mark.timeout(400)
def test_two_deploys_from_two_state_folders_on_one_cluster_the_second_refused(tmp_path):
    with served_demo(tmp_path) as inventory:
        first = subprocess.Popen(_cli("deploy", "--config", inventory, "--auto", "--json"), cwd=ROOT,
                                 env=_env(tmp_path / "state-a"), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        try:
            lines = line_reader(first.stdout)  # read on: a full pipe would stall the first
            first_id = None
            deadline = time.monotonic() + GUARD_S
            while first_id is None:  # the first holds the head's lock once its take answered 0
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
                assert line is not None, first.stderr.read() if first.stderr else "the first ended"
                event = json.loads(line) if line.startswith("{") else {}
                if event.get("event") == "command" and event.get("step") == "lock" and event.get("rc") == 0:
                    first_id = re.search(r"deployment (\S+)\)$", event["summary"]).group(1)

            second = subprocess.run(_cli("deploy", "--config", inventory, "--auto", "--json"), cwd=ROOT,
                                    env=_env(tmp_path / "state-b"), stdin=subprocess.DEVNULL, capture_output=True,
                                    text=True, timeout=GUARD_S)
            assert first.poll() is None, "the first run must still be at work"
            assert second.returncode == 1, (second.stdout[-2000:], second.stderr[-2000:])
            err = second.stderr.strip()
            assert len(err.splitlines()) == 1 and "Traceback" not in second.stderr
            assert err.startswith("sparkconsole: error: another deployment wizard holds cluster 'demo-story' (its "
                                  "lock on the head "), err
            assert f"pid {first.pid} on {socket.gethostname()}, deployment {first_id}, since " in err
            events = [json.loads(x) for x in second.stdout.splitlines() if x.startswith("{")]
            sent = [e for e in events if e["event"] == "command" and e["mutating"]]
            assert {e["step"] for e in sent} == {"lock"}  # its one change: the try to take the lock
            assert not list((tmp_path / "state-b" / "deployments").glob("*.json"))  # nothing saved
        finally:
            if first.poll() is None:
                first.terminate()
            first.wait(timeout=GUARD_S)


def test_the_lock_commands_keep_to_their_words_under_sh(tmp_path):
    """The scripts under the system's ``sh`` (dash on Debian): what the simulated head answers above
    is what a real shell answers."""
    from sparkconsole.deploy.head_lock import LockAnswer
    from sparkconsole.remote import head_lock_refresh, head_lock_release, head_lock_take, head_lock_take_over

    def sh(cmd: Any) -> tuple[int, LockAnswer]:
        p = subprocess.run(["sh", "-c", cmd.shell()], env={"HOME": str(tmp_path), "PATH": os.environ["PATH"]},
                           capture_output=True, text=True, timeout=30)
        return p.returncode, LockAnswer.parse(p.stdout)

    a = json.dumps({"host": "lap'top", "pid": 1, "deployment": "d1", "token": "aa"})
    b = json.dumps({"host": "other", "pid": 2, "deployment": "d2", "token": "bb"})
    assert sh(head_lock_take(a, "d1")) == (0, LockAnswer("taken"))
    rc, held = sh(head_lock_take(b, "d2"))
    assert rc == 1 and held.word == "held" and held.record == a and held.beat and held.age_s is not None
    assert sh(head_lock_refresh(a, "d1"))[1].word == "kept"
    assert sh(head_lock_refresh(b, "d2"))[1].word == "lost"
    held = sh(head_lock_take(b, "d2"))[1]
    assert sh(head_lock_take_over(b, held.record, "1", "d2"))[1].word == "held"  # refreshed since: kept
    assert sh(head_lock_take_over(b, held.record, held.beat, "d2")) == (0, LockAnswer("taken"))
    assert sh(head_lock_release(a, "d1"))[1].word == "other"  # a lock taken over is left to its holder
    assert sh(head_lock_release(b, "d2")) == (0, LockAnswer("released"))
    assert not (tmp_path / HEAD_LOCK_DIR).exists() and sh(head_lock_take(a, "d1"))[1].word == "taken"
