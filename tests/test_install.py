"""The install a new user gets: exactly the locked set, and a quiet stderr.

A fresh environment is made from ``uv.lock`` with the same uv ``scripts/_setup`` installs (it is
what ``scripts/demo`` and ``scripts/test`` run), so a dependency release that starts printing to
stderr fails here first, whatever this machine's own ``.venv`` or pip cache hold. Every
subcommand's bad input must then be one line on stderr and a non-zero exit; ``--help`` prints
nothing on stderr. A dependency that warns at import time (an ``asyncssh`` shim that warns as
asyncssh 2.24 with cryptography 51 does, then loads the real one) stays silent, unless ``-v`` or
``PYTHONWARNINGS`` asks for warnings.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import pytest

from sparkconsole.dependency_warnings import is_dependency_deprecation, silence_dependency_deprecations

ROOT = Path(__file__).resolve().parent.parent

# (arguments, exit code): each subcommand's bad input, argparse's and the command's own
BAD_INPUT = [
    (["nosuch"], 2),
    (["--bogus"], 2),
    (["tui", "--bogus"], 2),
    (["tui", "--config", "/nonexistent/sparks.toml"], 2),
    (["demo", "--scenario", "nope"], 2),
    (["demo", "--twin", "/nonexistent/twin.json"], 2),
    (["deploy", "--tp", "x"], 2),
    (["deploy", "--config", "/nonexistent/sparks.toml"], 2),
    (["bench", "--bogus"], 2),
    (["bench", "--config", "/nonexistent/sparks.toml"], 2),
    (["snapshot", "--config", "/nonexistent/sparks.toml"], 2),
    (["parse", "nope", "-"], 2),
    (["parse", "vllm-log", "/nonexistent/log"], 2),
    (["plan", "../etc/passwd"], 2),
    (["trust"], 2),
]
SUBCOMMANDS = ("tui", "demo", "deploy", "bench", "snapshot", "parse", "plan", "trust")


def _uv() -> str:
    """The uv scripts/_setup installs (.tools/bin/uv), or one on PATH."""
    local = ROOT / ".tools" / "bin" / "uv"
    found = str(local) if local.exists() else shutil.which("uv")
    assert found, "no uv: run scripts/test, which installs the pinned uv into .tools/"
    return found


@pytest.fixture(scope="module")
def fresh_env(tmp_path_factory) -> Path:
    """A new environment holding exactly the locked set of the console (no test extras)."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("UV_PROJECT_ENVIRONMENT", "VIRTUAL_ENV")}
    env["UV_PROJECT_ENVIRONMENT"] = str(venv)
    env.setdefault("UV_SYSTEM_CERTS", "1")  # as scripts/_setup sets it: the system's certificate store
    done = subprocess.run([_uv(), "sync", "--locked", "--quiet"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return venv


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "PYTHONPATH")}
    env.update(extra)
    return env


def _run(exe: Path | str, args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(exe), *args], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          env=_clean_env(**env), timeout=120)


def test_the_fresh_environment_holds_exactly_the_locked_versions(fresh_env: Path) -> None:
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    locked = {p["name"]: p["version"] for p in lock["package"] if "version" in p}
    listed = subprocess.run([_uv(), "pip", "list", "--format=freeze", "--python", str(fresh_env / "bin" / "python")],
                            capture_output=True, text=True, timeout=120, check=True).stdout
    installed = dict(line.split("==", 1) for line in listed.splitlines() if "==" in line)
    norm = {re.sub(r"[-_.]+", "-", k).lower(): v for k, v in installed.items()}
    assert norm.pop("sparkconsole") == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert {"textual", "asyncssh", "cryptography"} <= set(norm)
    for name, version in norm.items():
        assert locked.get(name) == version, f"{name} {version} is not the locked {locked.get(name)}"


def test_help_prints_nothing_on_stderr_in_a_fresh_environment(fresh_env: Path) -> None:
    exe = fresh_env / "bin" / "sparkconsole"
    for args in (["--help"], ["--version"], *([name, "--help"] for name in SUBCOMMANDS)):
        done = _run(exe, args)
        assert done.returncode == 0, (args, done.stderr)
        assert done.stderr == "", (args, done.stderr)


@pytest.mark.parametrize(("args", "code"), BAD_INPUT, ids=[" ".join(a) for a, _ in BAD_INPUT])
def test_every_bad_input_is_one_line_in_a_fresh_environment(fresh_env: Path, args: list[str], code: int) -> None:
    done = _run(fresh_env / "bin" / "sparkconsole", args)
    assert done.returncode == code, (done.returncode, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("sparkconsole"), lines
    assert "Traceback" not in done.stderr


def _noisy_asyncssh(where: Path) -> Path:
    """A shim ``asyncssh`` that warns at import as asyncssh 2.24 with cryptography 51 does (a
    UserWarning subclass named …DeprecationWarning) plus a plain DeprecationWarning, then stands
    the real asyncssh in its place."""
    pkg = where / "asyncssh"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "import importlib, sys, warnings\n"
        "class CryptographyDeprecationWarning(UserWarning):\n    pass\n"
        "warnings.warn('DSA is deprecated (injected)', CryptographyDeprecationWarning, stacklevel=1)\n"
        "warnings.warn('an old API (injected)', DeprecationWarning, stacklevel=1)\n"
        f"sys.path.remove({str(where)!r})\n"
        "del sys.modules['asyncssh']\n"
        "sys.modules['asyncssh'] = importlib.import_module('asyncssh')\n")
    return where


def test_a_dependency_warning_at_import_stays_silent_unless_asked_for(tmp_path: Path) -> None:
    shim = _noisy_asyncssh(tmp_path / "shim")
    cmd = [sys.executable, "-m", "sparkconsole.cli"]

    def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cmd, *args], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120,
                              env={**_clean_env(**env), "PYTHONPATH": f"{shim}{os.pathsep}{ROOT}"})

    # the shim is really imported by the console (it warns when warnings are asked for) ...
    loud = run("-v", "--help")
    assert loud.returncode == 0
    assert "DSA is deprecated (injected)" in loud.stderr
    assert "an old API (injected)" in loud.stderr
    assert "DSA is deprecated (injected)" in run("--help", PYTHONWARNINGS="default").stderr
    # ... and silent otherwise: --help, and bad input stays one line
    assert run("--help").stderr == ""
    bad = run("plan", "../x")
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1, bad.stderr


def test_only_other_packages_deprecations_are_dropped() -> None:
    class CryptographyDeprecationWarning(UserWarning):
        pass

    ours = str(ROOT / "sparkconsole" / "cli.py")
    theirs = "/usr/lib/python3/site-packages/asyncssh/crypto/dsa.py"
    assert is_dependency_deprecation(CryptographyDeprecationWarning, theirs)
    assert is_dependency_deprecation(DeprecationWarning, theirs)
    assert is_dependency_deprecation(PendingDeprecationWarning, theirs)
    assert not is_dependency_deprecation(DeprecationWarning, ours)  # our own still show
    assert not is_dependency_deprecation(UserWarning, theirs)  # other kinds of warning still show
    assert not is_dependency_deprecation(RuntimeWarning, theirs)


def test_the_filter_drops_theirs_and_passes_the_rest(monkeypatch, capsys) -> None:
    monkeypatch.delenv("PYTHONWARNINGS", raising=False)
    monkeypatch.setattr(sys, "warnoptions", [])
    seen: list[str] = []
    monkeypatch.setattr(warnings, "showwarning", lambda message, *a, **k: seen.append(str(message)))
    assert silence_dependency_deprecations(verbose=False)
    assert not silence_dependency_deprecations(verbose=False)  # installed once
    theirs = "/site-packages/cryptography/utils.py"
    warnings.showwarning(DeprecationWarning("theirs"), DeprecationWarning, theirs, 1)
    warnings.showwarning(UserWarning("a user warning"), UserWarning, theirs, 1)
    warnings.showwarning(DeprecationWarning("ours"), DeprecationWarning, str(ROOT / "sparkconsole" / "x.py"), 1)
    assert seen == ["a user warning", "ours"]


def test_asking_for_warnings_installs_no_filter(monkeypatch) -> None:
    monkeypatch.setattr(sys, "warnoptions", [])
    monkeypatch.setenv("PYTHONWARNINGS", "default")
    before = warnings.showwarning
    assert not silence_dependency_deprecations(verbose=False)
    assert warnings.showwarning is before
