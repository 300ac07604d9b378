"""pytest fixtures for the two-host lab (:mod:`tests.lab.hosts`).

``lab_hosts`` builds the lab once per session (namespaces, sshd and dockerd per host, the fast
link, the Hub stand-in, the Ray image on host A) and removes every piece afterwards, checking
that nothing is left. ``lab_cli`` runs ``sparkconsole`` against it as a person would, with its
own config, state and cache directories (one deployment history for the whole session).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.lab.hosts import MODEL_ID, Lab, leftovers


@pytest.fixture(scope="session")
def lab_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    lab = Lab.create(tmp_path_factory.mktemp("lab") / "lab")
    try:
        yield lab
    finally:
        problems = lab.down()
        left = leftovers(lab)
        assert not problems and not left, f"the lab left {problems + left}"


@dataclass
class LabCli:
    lab: Lab
    home: Path

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "HF_", "SPARKCONSOLE_"))}
        env.update(XDG_CONFIG_HOME=str(self.home / "config"), XDG_STATE_HOME=str(self.home / "state"),
                   XDG_CACHE_HOME=str(self.home / "cache"), HF_HOME=str(self.home / "hf"), NO_COLOR="1")
        env.update(extra)
        return env

    def run(self, *args: str, timeout: float = 240.0, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", "import sys; from sparkconsole.cli import main; sys.exit(main())",
                               *args], capture_output=True, text=True, timeout=timeout, env=self.env(**env),
                              stdin=subprocess.DEVNULL)

    def deploy(self, *args: str, until: str = "cluster", timeout: float = 240.0) -> subprocess.CompletedProcess[str]:
        """``sparkconsole deploy --config LAB --model M --image I ... --until STEP --yes --answer …``."""
        answers = [a for x in self.lab.answers() for a in ("--answer", x)]
        return self.run("deploy", "--config", str(self.lab.config_path), "--model", MODEL_ID, "--image",
                        self.lab.image, "--gpu-memory-utilization", "0.3", "--until", until, "--yes", *answers,
                        *args, timeout=timeout)

    def state_dir(self) -> Path:
        return self.home / "state" / "sparkconsole"


@pytest.fixture(scope="module")
def lab_cli(lab_hosts: Lab, tmp_path_factory: pytest.TempPathFactory) -> LabCli:
    """The laptop side; the planner has read the lab model from the Hub stand-in once (its spec
    cache is what the wizard plans with)."""
    cli = LabCli(lab_hosts, tmp_path_factory.mktemp("laptop"))
    got = cli.run("plan", MODEL_ID, "--nodes", "2", "--json", HF_ENDPOINT=lab_hosts.hub_url)
    assert got.returncode == 0, got.stderr
    return cli
