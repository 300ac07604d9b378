"""pytest fixtures for the lab: ``sshd`` (one real sshd) and ``sshd_pair`` (jump + target)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lab.sshd import JumpPair, LabSshd, start_jump_pair


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[LabSshd]:
    """A real OpenSSH sshd on 127.0.0.1, an ephemeral port, throwaway keys; stopped afterwards."""
    server = LabSshd(tmp_path / "sshd", alias="lab-node")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def sshd_pair(tmp_path: Path) -> Iterator[JumpPair]:
    """A jump sshd and a target sshd that only the jump can reach (a network namespace)."""
    pair = start_jump_pair(tmp_path / "pair")
    try:
        yield pair
    finally:
        pair.stop()
