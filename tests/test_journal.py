"""The local journal: append-only JSON lines, exit codes, never a secret."""

from __future__ import annotations

import json
import os
import stat
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sparkconsole.journal import Journal, default_journal_path, read_journal, redact
from sparkconsole.remote import RemoteCommand, docker_action


def test_entries_are_appended_with_time_node_command_exit_code(tmp_path: Path) -> None:
    j = Journal(tmp_path / "deep" / "journal.jsonl")
    cmd = docker_action("stop", "vllm")
    before = datetime.now(UTC).replace(microsecond=0)  # the journal keeps whole seconds at most
    e1 = j.record(node="spark-01", command=cmd.shell(), summary=cmd.summary, exit_code=0, duration_s=0.4321)
    e2 = j.record(node="spark-02", command="docker stop gone", exit_code=1, duration_s=0.1,
                  error="Error response from daemon: No such container: gone")
    e3 = j.record(node="spark-02", command="docker restart x", exit_code=None, duration_s=30.0, error="timed out")
    entries = read_journal(j.path)
    assert entries == [e1, e2, e3] == j.read() == list(j)
    assert entries[0].command == "docker stop vllm" and entries[0].summary == "docker stop vllm"
    assert entries[0].duration_s == 0.432 and entries[0].ok
    assert entries[1].exit_code == 1 and not entries[1].ok and "No such container" in (entries[1].error or "")
    assert entries[2].exit_code is None
    t = datetime.fromisoformat(entries[0].time)
    assert t.tzinfo is not None and t.utcoffset().total_seconds() == 0
    assert before <= t <= datetime.now(UTC)  # the time of the record, in UTC
    lines = j.path.read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(line)["node"] for line in lines)
    assert stat.S_IMODE(os.stat(j.path).st_mode) == 0o600


def test_secrets_never_reach_the_file(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j.jsonl")
    cmd = RemoteCommand(
        ("docker", "run", "-e", "HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz123", "--api-key", "sk-live-123",
         "img", "--hf-token=hf_ZZZZZZZZZZZZZZZZ", "--password", "hunter2"),
        mutating=True,
        env=(("WANDB_API_KEY", "abc def"), ("AWS_SECRET_ACCESS_KEY", "s3cr3t"), ("NCCL_SOCKET_IFNAME", "enp1s0f1np1")),
    )
    j.record(node="n", command=cmd.shell(), summary="run with token hf_abcdefghijklmnop", exit_code=0,
             duration_s=1, error="curl -H 'Authorization: Bearer eyJhbGciOi.xyz' failed; MY_PASSWORD=pw1")
    raw = j.path.read_text()
    for secret in ("hf_abcdefghijklmnopqrstuvwxyz123", "sk-live-123", "hf_ZZZZ", "hunter2", "abc def", "s3cr3t",
                   "eyJhbGciOi", "pw1", "hf_abcdefghijklmnop"):
        assert secret not in raw, secret
    (entry,) = read_journal(j.path)
    assert "HF_TOKEN=***" in entry.command and "--api-key ***" in entry.command
    assert "'WANDB_API_KEY=***'" in entry.command and "AWS_SECRET_ACCESS_KEY=***" in entry.command
    assert "NCCL_SOCKET_IFNAME=enp1s0f1np1" in entry.command  # not a secret: kept
    assert "--password ***" in entry.command and "--hf-token=***" in entry.command
    assert redact("") == "" and redact("docker stop vllm") == "docker stop vllm"


def test_reading_skips_torn_lines_and_missing_files(tmp_path: Path) -> None:
    assert read_journal(tmp_path / "none.jsonl") == []
    j = Journal(tmp_path / "j.jsonl")
    j.record(node="a", command="docker stop a", exit_code=0, duration_s=0.1)
    with open(j.path, "a") as f:
        f.write('{"time": "x", "node"\n\n[1,2]\n')
    j.record(node="b", command="docker stop b", exit_code=0, duration_s=0.1)
    assert [e.node for e in read_journal(j.path)] == ["a", "b"]


def test_default_path_is_in_the_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKCONSOLE_STATE_DIR", str(tmp_path / "st"))
    assert default_journal_path() == tmp_path / "st" / "journal.jsonl"
    Journal().record(node="n", command="true", exit_code=0, duration_s=0)
    assert len(read_journal()) == 1


def test_ordinary_arguments_are_not_redacted() -> None:
    """Only secrets go: words that merely contain TOKEN or KEY stay as typed (issue 11, item 6)."""
    kept = ["vllm serve m --max-num-batched-tokens 8192 --tokenizer Qwen/Qwen3-8B",
            "MONKEY=1 NUM_KEYS=3 MAX_NUM_BATCHED_TOKENS=4096 KEYBOARD=us run",
            "docker run -e NCCL_IB_HCA=rocep1s0f1 -e VLLM_HOST_IP=192.168.200.12 img",
            "grep -c tokens log.txt --key-file=/etc/x"]
    for text in kept:
        assert redact(text) == text
    gone = {"HF_TOKEN=hf_abcdefghij1234 x": "HF_TOKEN=***", "HUGGING_FACE_HUB_TOKEN=abc": "HUGGING_FACE_HUB_TOKEN=***",
            "x --api-key sk-1": "--api-key ***", "-H 'Authorization: Bearer abc.def'": "Authorization: Bearer ***",
            "token hf_ABCDEFGHIJKL": "hf_***"}
    for text, want in gone.items():
        assert want in redact(text)
