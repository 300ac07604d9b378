"""Shared test helpers: the real fixtures copied from real machines."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["tests.lab.fixtures", "tests.lab.lab_fixtures"]

# A pytest-xdist worker sets COLUMNS=80 and LINES=24 for its own output; Textual takes them as the
# terminal's size, so every console a test starts in a 160x48 tmux pane would draw itself at 80x24.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)

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


def pytest_report_header(config) -> list[str]:
    """The versions the suite ran with, and where they differ from uv.lock (scripts/test --latest)."""
    import re
    import tomllib
    from importlib import metadata

    lock = tomllib.loads((Path(__file__).parents[1] / "uv.lock").read_text(encoding="utf-8"))
    locked = {p["name"]: p["version"] for p in lock["package"] if "version" in p}
    installed = {re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower(): d.version for d in metadata.distributions()}
    key = ("textual", "asyncssh", "cryptography", "huggingface-hub", "ray", "pytest")
    lines = ["versions: " + ", ".join(f"{n} {installed.get(n, 'missing')}" for n in key)]
    drift = [f"{n} {installed[n]} (lock {v})" for n, v in sorted(locked.items())
             if n in installed and installed[n] != v and n != "sparkconsole"]
    lines.append("differs from uv.lock: " + ", ".join(drift) if drift else
                 "installed packages: as uv.lock pins them")
    return lines


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


# ---- lab markers --------------------------------------------------------------------------------
# A test that needs a real sshd, Docker engine or network namespace carries the marker declared in
# pyproject.toml (so `-m "not docker"` and the like select truthfully), and a test that needs none
# carries none. What a test needs is read from the fixtures it asks for and the lab helpers its
# body calls (a fixture that starts a lab only for one of its params says so with that param's
# marks, which are trusted); a mismatch stops the collection with the list of offenders.

_LAB_FIXTURES = {"sshd": {"sshd"}, "sshd_pair": {"sshd", "netns"}, "docker_lab": {"docker"},
                 "lab_hosts": {"sshd", "netns", "docker"}, "lab_cli": {"sshd", "netns", "docker"}}
_LAB_CALLS = {"LabSshd(": {"sshd"}, "start_jump_pair(": {"sshd", "netns"}, "docker_lab_fixture(": {"docker"},
              "Lab.create(": {"sshd", "netns", "docker"}}
_LAB_MARKERS = {"sshd", "docker", "netns"}


def _lab_needs(item) -> set[str]:
    import inspect

    needs: set[str] = set()
    for name in getattr(item, "fixturenames", ()):
        needs |= _LAB_FIXTURES.get(name, set())
    fn = getattr(item, "function", None)
    if fn is not None:
        try:
            source = inspect.getsource(fn)
        except (OSError, TypeError):
            source = ""
        for call, what in _LAB_CALLS.items():
            if call in source:
                needs |= what
    return needs


def pytest_collection_modifyitems(config, items) -> None:
    wrong = []
    for item in items:
        needs = _lab_needs(item)
        marked = {m.name for m in item.iter_markers()} & _LAB_MARKERS
        callspec = getattr(item, "callspec", None)
        by_param = {m.name for m in getattr(callspec, "marks", ())} & _LAB_MARKERS
        if not needs <= marked or not marked - by_param <= needs:
            wrong.append(f"{item.nodeid}: needs {sorted(needs) or 'no lab'}, marked {sorted(marked) or 'none'}")
    if wrong:
        raise pytest.UsageError("lab markers do not match what the tests need:\n  " + "\n  ".join(wrong))
