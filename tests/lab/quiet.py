"""Make a lab sshd go quiet: its packets are dropped (no FIN, no RST), as a node that hangs or
loses its link looks to a client. ``iptables -I INPUT -p tcp --dport PORT -j DROP`` (root)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator

IPTABLES = shutil.which("iptables")


def can_drop() -> bool:
    """Whether this machine lets the tests drop packets (root and a working iptables)."""
    if IPTABLES is None:
        return False
    return subprocess.run([IPTABLES, "-S", "INPUT"], capture_output=True).returncode == 0


class Dropper:
    """Drops every TCP packet sent to ``port`` while :attr:`active` (an INPUT rule of its own)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.active = False

    def _rule(self, op: str) -> None:
        assert IPTABLES is not None
        subprocess.run([IPTABLES, op, "INPUT", "-p", "tcp", "--dport", str(self.port), "-j", "DROP"],
                       check=True, capture_output=True)

    def drop(self) -> None:
        if not self.active:
            self._rule("-I")
            self.active = True

    def answer(self) -> None:
        if self.active:
            self._rule("-D")
            self.active = False


@contextlib.contextmanager
def dropping(port: int) -> Iterator[Dropper]:
    """A :class:`Dropper` for ``port`` whose rule is always removed afterwards."""
    d = Dropper(port)
    try:
        yield d
    finally:
        d.answer()
