"""Writing records that must survive: every byte or an error, never a silently short file.

``os.write`` may write fewer bytes than asked (a nearly full disk, a signal); code that ignores the
count it returns leaves a truncated file that looks whole until it is read (issue 23: a 20 KB
deployment state became 8,192 bytes, was fsynced and renamed over the good one). Here a short write
is continued, and a write that makes no progress is an error.

The folders these records live in are private (:func:`private_dir`): made mode 0700, and one that
another user owns or may write is refused, since whoever may write there may swap a record for a
symbolic link to a file of the user's (the next write would truncate it) or plant a deployment for
``--resume`` to act on. The files are opened without following a symbolic link
(:func:`open_private`, ``O_NOFOLLOW``) and must be the user's own regular files.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
import tempfile
from pathlib import Path

from sparkconsole.errors import UserError

#: the most of a record file :func:`read_private` brings back: far above any state, lock or journal
#: this console writes, and a bound on a file that grew by other hands
READ_LIMIT = 64 << 20


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` or raise ``OSError`` (``ENOSPC`` when the disk takes no more)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[n:]


def replace_file(target: Path, data: bytes, mode: int = 0o600) -> Path:
    """``target`` replaced whole by ``data``: written to a temporary file beside it (its own name, so
    two writers never share one), fsynced, then renamed over it; on any error the temporary file is
    removed, ``target`` is as it was, and the ``OSError`` is raised for the caller to say in words."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        try:
            os.fchmod(fd, mode)
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def file_name_for(name: str) -> str:
    """A file name for ``name`` (a cluster's): the name itself when it is a safe file name, else a safe
    form of it plus a short hash, so two names that differ only in odd characters never share a file
    (a lock, a ``latest`` pointer)."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name).strip(".") or "cluster"
    if safe != name:
        safe += "-" + hashlib.sha1(name.encode()).hexdigest()[:8]
    return safe


class NotPrivate(UserError):
    """A state folder another user owns or may write, or a record that is not the user's own regular
    file (a symbolic link, a hard link, a folder): refused in one line, never followed."""


def private_dir(path: Path, what: str = "state folder") -> Path:
    """``path`` as a folder only this user may change: made mode 0700 when missing (its parents as
    the umask says), and refused (:class:`NotPrivate`, exit 2) when another user owns it or the
    group or others may write it. A folder that others may only read is kept as it is (its records
    are mode 0600). ``OSError`` (a full disk, a read-only file system) becomes one line too."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        st = os.stat(path)
    except OSError as exc:
        raise UserError(f"cannot make the {what} {path}: {exc.strerror or exc}", exit_code=1) from None
    if not stat.S_ISDIR(st.st_mode):
        raise NotPrivate(f"the {what} {path} is not a folder: refused")
    if st.st_uid != os.getuid():
        raise NotPrivate(f"the {what} {path} belongs to another user (uid {st.st_uid}): refused; set "
                         "SPARKCONSOLE_STATE_DIR to a folder of your own")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise NotPrivate(f"the {what} {path} can be written by other users (mode {stat.S_IMODE(st.st_mode):o}): "
                         f"refused; make it private (chmod 700 {path}) or set SPARKCONSOLE_STATE_DIR to a "
                         "folder of your own")
    return path


def open_private(path: Path, flags: int, mode: int = 0o600) -> int:
    """``os.open(path, flags | O_NOFOLLOW)``, kept only when it is this user's own regular file with
    one name: a symbolic link raises ``OSError(ELOOP)``; a hard link, another user's file or a
    folder ``OSError(EPERM)``. Callers say the error in words (:func:`why`)."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_nlink != 1:
            raise OSError(errno.EPERM, "not a regular file of this user's with one name", str(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_private(path: Path, limit: int = READ_LIMIT) -> str:
    """The text of ``path`` (:func:`open_private`, at most ``limit`` bytes); ``OSError`` as it comes."""
    fd = open_private(path, os.O_RDONLY)
    try:
        chunks: list[bytes] = []
        got = 0
        while got < limit and (chunk := os.read(fd, min(1 << 20, limit - got))):
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks).decode("utf-8", "replace")
    finally:
        os.close(fd)


def why(exc: OSError) -> str:
    """An ``OSError`` of the functions above in words: a symbolic link and a stranger's file say what
    they are, the rest is ``strerror`` (``No space left on device``)."""
    if exc.errno == errno.ELOOP:
        return "it is a symbolic link (refused: a record is never followed elsewhere)"
    if exc.errno == errno.EPERM and exc.strerror and "regular file" in exc.strerror:
        return "it is not a regular file of this user's with one name (refused)"
    return exc.strerror or str(exc)
