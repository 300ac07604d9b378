"""Writing records that must survive: every byte or an error, never a silently short file.

``os.write`` may write fewer bytes than asked (a nearly full disk, a signal); code that ignores the
count it returns leaves a truncated file that looks whole until it is read (issue 23: a 20 KB
deployment state became 8,192 bytes, was fsynced and renamed over the good one). Here a short write
is continued, and a write that makes no progress is an error.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import tempfile
from pathlib import Path


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
