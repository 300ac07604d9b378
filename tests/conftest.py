"""Shared test helpers: the real fixtures copied from real machines."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["tests.lab.fixtures"]

FIXTURES = Path(__file__).parent / "fixtures"
REAL = FIXTURES / "real"


def strip_fixture_header(text: str) -> str:
    """Drop the ``# source:``/``# what:``/``# machine:``/``# when:``/``# rc:``/``# vllm:`` lines
    that the fixture collectors added; real output never has them."""
    keep = []
    for line in text.splitlines():
        if line.startswith(("# source:", "# what:", "# machine:", "# when:", "# rc:", "# vllm:")):
            continue
        keep.append(line)
    return "\n".join(keep) + "\n"


def real_fixture(rel: str) -> str:
    return strip_fixture_header((REAL / rel).read_text(encoding="utf-8"))


@pytest.fixture
def real():
    return real_fixture
