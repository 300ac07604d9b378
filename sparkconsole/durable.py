"""Writing records that must survive: every byte or an error, never a silently short file.

``os.write`` may write fewer bytes than asked (a nearly full disk, a signal); code that ignores the
count it returns leaves a truncated file that looks whole until it is read (issue 23: a 20 KB
deployment state became 8,192 bytes, was fsynced and renamed over the good one). Here a short write
is continued, and a write that makes no progress is an error.
"""

from __future__ import annotations

import errno
import os


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` or raise ``OSError`` (``ENOSPC`` when the disk takes no more)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[n:]
