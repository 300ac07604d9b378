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


@pytest.fixture(autouse=True)
def _isolated_user_dirs(tmp_path_factory, monkeypatch):
    """Keep the developer's own cluster config, journal and theme out of every test."""
    home = tmp_path_factory.mktemp("xdg")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(home / "state"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / "cache"))
    monkeypatch.delenv("SPARKCONSOLE_CONFIG", raising=False)


@pytest.fixture
def real():
    return real_fixture
