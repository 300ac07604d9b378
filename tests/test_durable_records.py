"""Records that must survive a short write or a full disk (issue 23, item 3): the deployment state
and the journal are written whole or not at all; a failed save keeps the last good state and says
so in one line."""

from __future__ import annotations

import errno
import json
import os

import pytest

from sparkconsole.deploy.state import DeploymentState, StateNotSaved, StateStore
from sparkconsole.journal import Journal, read_journal


def _short_writes(monkeypatch: pytest.MonkeyPatch, cap: int, fail_after: int | None = None) -> list[int]:
    """``os.write`` that writes at most ``cap`` bytes a call, as a nearly full disk or a signal can,
    and (``fail_after``) then raises ENOSPC; returns the sizes it wrote."""
    real = os.write
    wrote: list[int] = []

    def write(fd: int, data) -> int:
        if fail_after is not None and sum(wrote) >= fail_after:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = real(fd, bytes(data[:cap]))
        wrote.append(n)
        return n

    monkeypatch.setattr(os, "write", write)
    return wrote


def _big_state() -> DeploymentState:
    st = DeploymentState.new("Qwen/Qwen3.5-122B-A10B-FP8", {"engine": "vllm"}, "sparks")
    st.facts["nodes"] = {f"spark-{i}": {"note": "x" * 2000} for i in range(10)}  # about 20 KB, as reported
    return st


def test_a_short_write_is_continued_and_the_state_reads_back_whole(tmp_path, monkeypatch):
    """Before: the count os.write returns was ignored: 8,192 bytes of 20 KB, fsynced and renamed
    over the good file; the next load said "not JSON"."""
    store = StateStore(tmp_path)
    st = _big_state()
    wrote = _short_writes(monkeypatch, cap=8192)
    path = store.save(st)
    latest = tmp_path / "latest.sparks"  # the cluster's latest pointer is written the same way
    assert len(wrote) > 1 and sum(wrote) == path.stat().st_size + latest.stat().st_size
    assert path.stat().st_size > 16_000 and latest.read_text() == st.id + "\n"
    assert store.load(st.id).facts == st.facts


def test_a_full_disk_keeps_the_last_good_state_and_says_so(tmp_path, monkeypatch):
    store = StateStore(tmp_path)
    st = _big_state()
    good = store.save(st).read_bytes()
    st.steps["weights"] = "done"
    _short_writes(monkeypatch, cap=8192, fail_after=8192)
    with pytest.raises(StateNotSaved) as failed:
        store.save(st)
    assert "No space left on device" in failed.value.message and "kept at" in failed.value.message
    assert failed.value.exit_code == 1 and "\n" not in failed.value.message
    assert store.path(st.id).read_bytes() == good  # untouched, still whole
    assert json.loads(good)["id"] == st.id
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left behind


def test_a_journal_entry_written_in_pieces_stays_one_line(tmp_path, monkeypatch):
    journal = Journal(tmp_path / "journal.jsonl")
    _short_writes(monkeypatch, cap=16)
    journal.record(node="spark-a", command="docker stop vllm-glm", summary="stop", exit_code=0, duration_s=1.0)
    journal.record(node="spark-b", command="docker stop embeddings", summary="stop", exit_code=0, duration_s=1.0)
    assert [e.command for e in read_journal(tmp_path / "journal.jsonl")] == ["docker stop vllm-glm",
                                                                             "docker stop embeddings"]
