"""The local journal: one JSON line per command that changed (or tried to change) a node.

Every mutating command the console sends is appended to ``state_dir()/journal.jsonl`` (or a path
given): the time (ISO 8601, UTC), the node, the exact shell text, the plain-words summary, the exit
code (``None`` when the command never finished: a timeout, a lost connection), how long it took
and, for failures, a short error text. Nothing secret is ever written: values of environment
variables that hold secrets (``HF_TOKEN``, ``*_API_KEY``, ``*PASSWORD``…), ``--api-key``-style flags,
Hugging Face tokens (``hf_...``) and ``Authorization:`` values are replaced by ``***`` before the
line is built; ordinary arguments that only contain such a word are kept. Entries the deployment
wizard writes also name the deployment and the step.

The file is append-only: each entry is one ``write`` of one line to a file opened with
``O_APPEND`` (mode 0600), so concurrent writers never interleave inside a line. Reading skips
lines that are not valid entries (a torn last line after a crash) instead of failing. The file is
never followed through a symbolic link and its folder is private
(:func:`~sparkconsole.durable.private_dir`); a write that fails (a full disk) is
:class:`JournalNotWritten`, one line, for the caller to say after it kept what it must keep.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sparkconsole.config import state_dir
from sparkconsole.durable import open_private, private_dir, read_private, why, write_all
from sparkconsole.errors import UserError

JOURNAL_FILE = "journal.jsonl"
REDACTED = "***"

# Secrets only: the Hugging Face token variables, API keys and passwords by their usual names, hf_
# tokens anywhere, ``--api-key``/``--hf-token`` values and ``Authorization:`` headers. Ordinary
# arguments that merely contain a word like TOKEN or KEY (``--max-num-batched-tokens 8192``,
# ``--tokenizer X``, ``MONKEY=1``, ``NUM_KEYS=3``) are left as they are.
_SECRET_PARTS = {"TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASS"}
_KEY_OWNERS = {"API", "SECRET", "ACCESS", "PRIVATE", "AUTH", "SIGNING", "ENCRYPTION"}


def is_secret_name(name: str) -> bool:
    """An environment variable that holds a secret, by its words: ``HF_TOKEN``, ``*_PASSWORD``,
    ``AWS_SECRET_ACCESS_KEY``, ``WANDB_API_KEY``; not ``MAX_NUM_BATCHED_TOKENS``, ``NUM_KEYS``."""
    parts = name.upper().split("_")
    if any(p in _SECRET_PARTS for p in parts):
        return True
    return any(p == "KEY" and i > 0 and parts[i - 1] in _KEY_OWNERS for i, p in enumerate(parts))


# 'NAME=value with spaces' as shlex.quote writes an env assignment that needed quoting
_ENV_QUOTED = re.compile(r"'([A-Za-z_][A-Za-z0-9_]*)=[^']*'")
# NAME=value, NAME="value", NAME='value'
_ENV_PLAIN = re.compile(r"(?<![A-Za-z0-9_.-])([A-Za-z_][A-Za-z0-9_]*)=(\"[^\"]*\"|'[^']*'|[^\s'\";|&]+)")
_FLAG = re.compile(
    r"(--(?:api-key|hf-token|token|password|secret|auth-token|access-token))(=|\s+)(?:\"[^\"]*\"|'[^']*'|[^\s'\";|&]+)",
    re.IGNORECASE,
)
_HF_TOKEN = re.compile(r"\bhf_[A-Za-z0-9]{8,}\b")
_BEARER = re.compile(r"(Authorization:\s*(?:Bearer|Basic|Token)?\s*)[A-Za-z0-9._~+/=-]+", re.IGNORECASE)
_BEARER_BARE = re.compile(r"(Bearer\s+)[A-Za-z0-9._~+/=-]+")


def redact(text: str) -> str:
    """``text`` with every secret value replaced by ``***`` (and nothing else touched)."""
    if not text:
        return text
    text = _ENV_QUOTED.sub(lambda m: f"'{m.group(1)}={REDACTED}'" if is_secret_name(m.group(1)) else m.group(0),
                           text)
    text = _ENV_PLAIN.sub(lambda m: f"{m.group(1)}={REDACTED}" if is_secret_name(m.group(1)) else m.group(0),
                          text)
    text = _FLAG.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
    text = _HF_TOKEN.sub("hf_" + REDACTED, text)
    text = _BEARER.sub(lambda m: m.group(1) + REDACTED, text)
    text = _BEARER_BARE.sub(lambda m: m.group(1) + REDACTED, text)
    return text


def default_journal_path() -> Path:
    return state_dir() / JOURNAL_FILE


@dataclass(frozen=True)
class JournalEntry:
    """One journaled command. ``exit_code`` is ``None`` when it never finished."""

    time: str  # ISO 8601 UTC, e.g. 2026-11-29T23:13:05.123456+00:00
    node: str
    command: str  # the exact shell text sent (redacted)
    summary: str
    exit_code: int | None
    duration_s: float | None
    error: str | None = None  # why it failed, in words (stderr tail, timeout, refusal)
    deployment: str | None = None  # the deployment this command belongs to (the wizard's)
    step: str | None = None  # the wizard step that sent it

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def to_json(self) -> str:
        data = {k: v for k, v in asdict(self).items() if v is not None or k not in ("deployment", "step")}
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JournalEntry:
        exit_code = data.get("exit_code")
        duration = data.get("duration_s")
        return cls(
            time=str(data["time"]),
            node=str(data["node"]),
            command=str(data["command"]),
            summary=str(data.get("summary") or ""),
            exit_code=int(exit_code) if isinstance(exit_code, int) else None,
            duration_s=float(duration) if isinstance(duration, int | float) else None,
            error=str(data["error"]) if data.get("error") is not None else None,
            deployment=str(data["deployment"]) if data.get("deployment") else None,
            step=str(data["step"]) if data.get("step") else None,
        )


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


class JournalNotWritten(UserError):
    """The journal could not take an entry (a full disk, a symbolic link where it should be)."""

    exit_code = 1


class Journal:
    """Append-only journal file. ``path=None``: ``state_dir()/journal.jsonl``."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else default_journal_path()
        self._base = state_dir() if path is None else None  # the state folder: made private

    def record(
        self,
        *,
        node: str,
        command: str,
        summary: str = "",
        exit_code: int | None,
        duration_s: float | None,
        error: str | None = None,
        when: datetime | None = None,
        deployment: str | None = None,
        step: str | None = None,
    ) -> JournalEntry:
        """Append one entry (secrets redacted) and return it; :class:`JournalNotWritten` when the
        file cannot take it (nothing half-written: one ``write`` of one line, or none)."""
        stamp = when.astimezone(UTC).isoformat(timespec="microseconds") if when else _now_iso()
        entry = JournalEntry(
            time=stamp,
            node=node,
            command=redact(command),
            summary=redact(summary),
            exit_code=exit_code,
            duration_s=None if duration_s is None else round(float(duration_s), 3),
            error=None if error is None else redact(error.strip())[:500],
            deployment=deployment,
            step=step,
        )
        if self._base is not None:
            private_dir(self._base)
        private_dir(self.path.parent, "journal's folder")
        data = (entry.to_json() + "\n").encode("utf-8")
        try:
            fd = open_private(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            try:
                write_all(fd, data)  # a short append would run this entry into the next one
            finally:
                os.close(fd)
        except OSError as exc:
            raise JournalNotWritten(f"the journal {self.path} could not be written ({why(exc)})") from None
        return entry

    def __iter__(self) -> Iterator[JournalEntry]:
        return iter(read_journal(self.path))

    def read(self) -> list[JournalEntry]:
        return read_journal(self.path)


def read_journal(path: str | os.PathLike[str] | None = None) -> list[JournalEntry]:
    """Every readable entry, oldest first (a missing file is an empty journal)."""
    p = Path(path) if path is not None else default_journal_path()
    try:
        text = read_private(p)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise UserError(f"cannot read the journal {p}: {why(exc)}", exit_code=1) from None
    out: list[JournalEntry] = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            data = json.loads(line)
            if not isinstance(data, dict):
                continue
            out.append(JournalEntry.from_dict(data))
        except (ValueError, KeyError, TypeError):
            continue
    return out
