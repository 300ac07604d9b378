"""A real Docker engine for tests: make sure ``dockerd`` answers, build a tiny busybox image,
start containers that print lines over time, and remove every container the tests made.

No registry is reachable here, so the image is ``docker import``-ed from a rootfs holding the
static ``/usr/bin/busybox`` and a few applet symlinks (see the lab notes §4). Every container is
named ``sctest-...`` so cleanup can find it, and every container runs ``sh`` with a TERM trap, so
``docker stop`` / ``docker restart`` take a fraction of a second instead of the 10 s grace.

A test module defines its fixture with ``yield from docker_lab_fixture(tmp_path)`` (a
:class:`DockerLab` whose containers are removed afterwards).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

DOCKER = shutil.which("docker") or "/usr/local/bin/docker"
IMAGE = "sparkconsole-test/busybox:1"
PREFIX = "sctest-"
BUSYBOX_CANDIDATES = ("/usr/bin/busybox", "/bin/busybox")
APPLETS = (
    "sh", "echo", "printf", "sleep", "cat", "seq", "date", "ls", "true", "false", "kill",
    "hostname", "head", "tail", "wc", "env", "test", "[", "expr", "yes",
)
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
VLLM_LOG = FIXTURES / "real" / "vllm-logs" / "02-dgx-spark-nemotron-hybrid-nv2601-ready.log"


def docker(*args: str, check: bool = True, timeout: float = 60.0, input: bytes | None = None) -> str:
    """Run the docker client; return stdout (raises with stderr on failure when ``check``)."""
    proc = subprocess.run(
        [DOCKER, *args], capture_output=True, timeout=timeout, input=input,
        stdin=None if input is not None else subprocess.DEVNULL,
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)} failed ({proc.returncode}): {proc.stderr.decode(errors='replace')}")
    return proc.stdout.decode(errors="replace")


def docker_ok() -> bool:
    try:
        return subprocess.run([DOCKER, "info"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def ensure_dockerd(timeout: float = 60.0) -> None:
    """Return when ``docker info`` answers; start ``dockerd`` in the background if it does not."""
    if docker_ok():
        return
    dockerd = shutil.which("dockerd") or "/usr/sbin/dockerd"
    log = Path(tempfile.gettempdir()) / "sparkconsole-dockerd.log"
    with open(log, "ab") as out:
        subprocess.Popen(
            ["nohup", dockerd], stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if docker_ok():
            return
        time.sleep(0.3)
    raise RuntimeError(f"dockerd did not answer within {timeout} s; see {log}")


def ensure_image(tag: str = IMAGE) -> str:
    """``tag`` exists (imported once from a busybox rootfs); returns it."""
    if subprocess.run([DOCKER, "image", "inspect", tag], capture_output=True).returncode == 0:
        return tag
    busybox = next((p for p in BUSYBOX_CANDIDATES if os.path.isfile(p)), None)
    if busybox is None:
        raise RuntimeError("no static busybox found (apt-get install busybox-static)")
    with tempfile.TemporaryDirectory(prefix="sctest-rootfs-") as tmp:
        root = Path(tmp)
        (root / "bin").mkdir()
        (root / "tmp").mkdir()
        shutil.copy2(busybox, root / "bin" / "busybox")
        for applet in APPLETS:
            (root / "bin" / applet).symlink_to("busybox")
        tar = subprocess.run(["tar", "-C", str(root), "-c", "."], capture_output=True, check=True).stdout
        docker("import", "-c", "ENV PATH=/bin", "-", tag, input=tar)
    return tag


def container_state(name: str) -> str | None:
    """``running``/``exited``/... or ``None`` when there is no such container."""
    proc = subprocess.run(
        [DOCKER, "inspect", "-f", "{{.State.Status}}", name], capture_output=True, text=True, timeout=30
    )
    return proc.stdout.strip() if proc.returncode == 0 else None


def ps_names(all_: bool = False) -> set[str]:
    """Names in ``docker ps`` (``-a`` when ``all_``)."""
    args = ["ps", "--format", "{{.Names}}"] + (["-a"] if all_ else [])
    return {n for n in docker(*args).split() if n}


def wait_state(name: str, state: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if container_state(name) == state:
            return
        time.sleep(0.05)
    raise AssertionError(f"container {name} is {container_state(name)!r}, not {state!r} after {timeout} s")


def ticker_script(interval: float = 0.1, prefix: str = "tick") -> str:
    """sh: print ``<prefix> N`` forever, every ``interval`` s; exit at once on TERM."""
    return f"trap 'exit 0' TERM; i=0; while true; do i=$((i+1)); echo \"{prefix} $i\"; sleep {interval}; done"


def replay_script(path_in_container: str = "/lines.txt", interval: float = 0.05) -> str:
    """sh: print the file's lines one by one (every ``interval`` s), then stay up quietly."""
    return (
        "trap 'exit 0' TERM; "
        f"while IFS= read -r l; do printf '%s\\n' \"$l\"; sleep {interval}; done < {path_in_container}; "
        "while true; do sleep 0.2; done"
    )


def vllm_lines(path: Path = VLLM_LOG) -> list[str]:
    """The real vLLM log's lines (the collectors' ``# ...`` header and the echoed command dropped)."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith(("# source:", "# what:", "# machine:", "# when:", "# rc:", "# vllm:")):
            continue
        if "$ docker logs" in line:  # the shell prompt the collector copied
            continue
        out.append(line)
    return out


class DockerLab:
    """Creates ``sctest-`` containers and removes them in :meth:`cleanup`."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.created: list[str] = []
        ensure_dockerd()
        self.image = ensure_image()

    def name(self, what: str) -> str:
        return f"{PREFIX}{what}-{uuid.uuid4().hex[:8]}"

    def run(self, what: str, script: str, *, volumes: dict[str, str] | None = None) -> str:
        """``docker run -d`` a container running ``sh -c script``; returns its name."""
        name = self.name(what)
        args = ["run", "-d", "--name", name]
        for host, inside in (volumes or {}).items():
            args += ["-v", f"{host}:{inside}:ro"]
        args += [self.image, "sh", "-c", script]
        self.created.append(name)
        docker(*args)
        return name

    def ticker(self, what: str = "ticker", interval: float = 0.1, prefix: str = "tick") -> str:
        return self.run(what, ticker_script(interval, prefix))

    def vllm(self, what: str = "vllm", lines: list[str] | None = None, interval: float = 0.05) -> str:
        """A container printing real vLLM lines over time (shards 0/2, 1/2, 2/2 ... startup complete)."""
        src = self.workdir / f"{what}-{uuid.uuid4().hex[:6]}.txt"
        src.parent.mkdir(parents=True, exist_ok=True)
        src.write_text("\n".join(lines if lines is not None else vllm_lines()) + "\n", encoding="utf-8")
        return self.run(what, replay_script("/lines.txt", interval), volumes={str(src): "/lines.txt"})

    def created_only(self, what: str = "created") -> str:
        """A container that was created but never started (state ``created``)."""
        name = self.name(what)
        self.created.append(name)
        docker("create", "--name", name, self.image, "sh", "-c", ticker_script())
        return name

    def logs(self, name: str, timestamps: bool = True) -> list[str]:
        args = ["logs"] + (["-t"] if timestamps else []) + [name]
        proc = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=30)
        return [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln]

    def cleanup(self) -> None:
        if self.created:
            subprocess.run([DOCKER, "rm", "-f", *self.created], capture_output=True, timeout=60)
            self.created.clear()


def remove_all_test_containers() -> None:
    """Remove every ``sctest-`` container (left over from a crashed run)."""
    names = [n for n in ps_names(all_=True) if n.startswith(PREFIX)]
    if names:
        subprocess.run([DOCKER, "rm", "-f", *names], capture_output=True, timeout=60)


def docker_lab_fixture(tmp_path: Path) -> Iterator[DockerLab]:
    """The body of a ``docker_lab`` fixture: ``yield from docker_lab_fixture(tmp_path)``."""
    lab = DockerLab(tmp_path / "docker")
    try:
        yield lab
    finally:
        with contextlib.suppress(Exception):
            lab.cleanup()


def shell_join(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)
