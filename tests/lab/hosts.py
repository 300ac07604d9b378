"""The two-host lab: two "DGX Sparks" on one machine, with real sshd, Docker, rsync and Ray.

Each host is a network namespace plus its own PID, UTS and mount namespaces (the recipes are in
``../shared/design/lab-notes.md``):

- PID 1 of the host is its OpenSSH ``sshd`` (port 22, its own host key, log under the lab dir);
  killing it ends everything the host ran (sessions, detached jobs, Docker, containers).
- One logs in as a user who is not root, as on stock DGX OS (:func:`ensure_login_user`:
  ``sparkops``, made on this machine if absent; the namespaces share its ``/etc/passwd``): in the
  ``docker`` group (each host's dockerd socket belongs to it) and the ``sudo`` group, with a
  password set and no NOPASSWD rule, so ``sudo -n`` fails as on a real Spark. Root has no
  ``authorized_keys``: nobody logs in as root.
- The host's own ``/run`` is a fresh tmpfs, and two directories of the lab are bound over the real
  ones: the user's home (``/home/sparkops``: ``~/.ssh``, ``~/.cache/huggingface``, ``~/.local/bin/hf``)
  and root's ``/root``. Each host has its own, as real machines do, and nothing of the machine's
  own ``/root``, ``/home/sparkops`` or ``/run`` is touched.
- Its own ``dockerd`` (``--data-root`` in the lab dir, no bridge, no iptables, ``--group docker``)
  runs inside the host's namespaces (``nsenter``, not ``ip netns exec``: that one remounts ``/sys``
  and hides the cgroup mounts dockerd needs), so ``docker`` on the host talks to it, ``--network host``
  containers live in the host's network namespace, and bind mounts resolve in the host's files.
- The fast link is a veth pair named like the ConnectX-7 netdev a Spark uses
  (``enp1s0f1np1``: names are per network namespace, so both ends carry it), MTU 9000, its own
  /24. The laptop (this namespace) reaches each host's sshd over a management link (``enP7s7``
  inside, like a Spark's 10 GbE port): host A's is a bridge that also carries the Hub stand-in,
  host B's is a link of its own that leads nowhere else. B reaches no Hub: only the fast link
  and the laptop.
- A stand-in for the Hugging Face Hub (:func:`serve_hub`, an HTTP server in the machine's
  namespace on the bridge address) serves a small model repo through the API ``huggingface_hub``
  and the wizard use; every host has ``HF_ENDPOINT`` pointing at it and ``hf`` on its PATH, but
  only A has a route to it.
- A container image holding Python and Ray (:func:`ray_image_tar`: a root filesystem built here
  from this interpreter, its shared libraries and Ray's installed distribution, ``docker import``-ed)
  is loaded on host A only. It also carries a stub ``vllm`` package that only answers the
  wizard's engine check (its version and the architectures its registry lists): there is no GPU
  here, so nothing can serve, and the lab's runs stop after the ``cluster`` step.

:class:`Lab` builds all of it (``up``), reports it (``status``) and removes every piece
(``down``: processes, namespaces, links, bridge, cgroups, the lab dir), also after a failed
``up``. ``python -m tests.lab.hosts hub ...`` is the Hub stand-in's process.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.metadata as md
import ipaddress
import json
import os
import pwd
import random
import re
import secrets
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURE_REPO = REPO_ROOT / "tests" / "fixtures" / "lab" / "tiny-qwen3"
MODEL_ID = "sclab/tiny-qwen3"
FAST_IF = "enp1s0f1np1"  # the ConnectX-7 twin a Spark's QSFP cable uses
MGMT_IF = "enP7s7"  # a Spark's onboard 10 GbE port
FAST_MTU = 9000
HUB_PORT = 8088
SSHD = "/usr/sbin/sshd"
DOCKERD = shutil.which("dockerd") or "/usr/sbin/dockerd"
DOCKER = shutil.which("docker") or "/usr/local/bin/docker"
SSH_KEYGEN = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"
SSH = shutil.which("ssh") or "/usr/bin/ssh"
CACHE_DIR = Path(os.environ.get("SPARKCONSOLE_LAB_CACHE", "/var/tmp/sparkconsole-lab"))
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
STUB_VLLM_VERSION = "0.0.0+lab.stub"
# the login user of every lab host (stock DGX OS: a user made at first boot, never root)
LOGIN_USER = os.environ.get("SPARKCONSOLE_LAB_USER", "sparkops")
LOGIN_HOME = f"/home/{LOGIN_USER}"
DOCKER_GROUP = "docker"  # Docker's own packages make it; the user is in it, as on DGX OS
PASSWORD_FILE = CACHE_DIR / f"{LOGIN_USER}.password"  # root-only (0600): its sudo password


def _run(argv: list[str], check: bool = True, timeout: float = 60.0, **kw: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()[-1500:]}")
    return proc


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _run(["ip", *args], check=check)


def _keygen(path: Path, comment: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    for p in (path, Path(f"{path}.pub")):
        p.unlink(missing_ok=True)
    _run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
    path.chmod(0o600)
    return path


def _pub(path: Path) -> str:
    return Path(f"{path}.pub").read_text().strip()


def _host_pub(host_key: Path) -> str:
    kind, b64 = _pub(host_key).split()[:2]
    return f"{kind} {b64}"


# ---- the login user -------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoginUser:
    name: str
    uid: int
    gid: int
    home: str
    groups: tuple[str, ...]


def _ensure_sudo() -> None:
    """``sudo`` on this machine (the lab's hosts share its files): ``apt-get install`` if absent."""
    if shutil.which("sudo", path=DEFAULT_PATH):
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    _run(["apt-get", "update", "-qq"], timeout=300, env=env)
    _run(["apt-get", "install", "-y", "-qq", "sudo"], timeout=600, env=env)


def _groups_of(name: str) -> tuple[str, ...]:
    return tuple(_run(["id", "-nG", name]).stdout.split())


def ensure_login_user(name: str = LOGIN_USER) -> LoginUser:
    """The lab hosts' login user on this machine, made or mended (idempotent; the lab's ``down``
    leaves it, like the packages): home ``/home/NAME``, shell bash, in the ``docker`` and ``sudo``
    groups, a random password (kept in :data:`PASSWORD_FILE`, root-only) so that ``sudo`` asks for
    it (Debian's ``%sudo ALL=(ALL:ALL) ALL``; no NOPASSWD rule is written) and sshd does not take
    the account for a locked one."""
    if os.geteuid() != 0:
        raise RuntimeError("the lab needs root (it makes namespaces and its login user)")
    _ensure_sudo()
    home = f"/home/{name}"
    if _run(["getent", "group", DOCKER_GROUP], check=False).returncode != 0:
        _run(["groupadd", "--system", DOCKER_GROUP], check=False)  # exit 9: another lab made it just now
    want_groups = [g for g in (DOCKER_GROUP, "sudo") if _run(["getent", "group", g], check=False).returncode == 0]
    if _run(["getent", "passwd", name], check=False).returncode != 0:
        made = _run(["useradd", "--create-home", "--home-dir", home, "--shell", "/bin/bash", "--user-group",
                     "--groups", ",".join(want_groups), "--comment", "sparkconsole lab login user", name],
                    check=False)
        if made.returncode not in (0, 9):  # 9: made by another lab in the meantime
            raise RuntimeError(f"useradd {name} failed ({made.returncode}): {made.stderr.strip()}")
    pw = pwd.getpwnam(name)
    if pw.pw_dir != home:
        raise RuntimeError(f"the lab's login user {name} exists with home {pw.pw_dir}, not {home}: "
                           f"`userdel {name}` (or set SPARKCONSOLE_LAB_USER to another name)")
    if pw.pw_uid == 0:
        raise RuntimeError(f"the lab's login user {name} has uid 0")
    missing = [g for g in want_groups if g not in _groups_of(name)]
    if missing:
        _run(["usermod", "--append", "--groups", ",".join(missing), name])
    os.makedirs(home, exist_ok=True)  # the mount point of each host's own home
    # `passwd -S`: "NAME P …" usable password, "L" locked (useradd's "!"), "NP" none
    status = _run(["passwd", "--status", name]).stdout.split()
    if len(status) < 2 or status[1] != "P":
        secret = secrets.token_urlsafe(12)
        PASSWORD_FILE.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(PASSWORD_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secret + "\n")
        _run(["chpasswd"], input=f"{name}:{secret}\n")
    return LoginUser(name, pw.pw_uid, pw.pw_gid, home, _groups_of(name))


def _chown_tree(top: Path, uid: int, gid: int) -> None:
    os.chown(top, uid, gid, follow_symlinks=False)
    for p in top.rglob("*"):
        os.chown(p, uid, gid, follow_symlinks=False)


# ---- the small model repo the Hub stand-in serves ---------------------------------------------


def _safetensors(config: dict[str, Any], seed: int = 14) -> bytes:
    """A real safetensors file (header + bf16 data) with the tensor names and shapes of a Qwen3
    decoder of ``config``'s size; the data is deterministic noise (so its sha256 is stable)."""
    h, n, inter, vocab = (config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"],
                          config["vocab_size"])
    heads, kv, hd = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab, h))]
    for i in range(n):
        p = f"model.layers.{i}."
        shapes += [(p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,)),
                   (p + "self_attn.q_proj.weight", (heads * hd, h)), (p + "self_attn.k_proj.weight", (kv * hd, h)),
                   (p + "self_attn.v_proj.weight", (kv * hd, h)), (p + "self_attn.o_proj.weight", (h, heads * hd)),
                   (p + "self_attn.q_norm.weight", (hd,)), (p + "self_attn.k_norm.weight", (hd,)),
                   (p + "mlp.gate_proj.weight", (inter, h)), (p + "mlp.up_proj.weight", (inter, h)),
                   (p + "mlp.down_proj.weight", (h, inter))]
    shapes += [("model.norm.weight", (h,)), ("lm_head.weight", (vocab, h))]
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    off = 0
    for name, shape in shapes:
        size = 2
        for s in shape:
            size *= s
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + size]}
        off += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + random.Random(seed).randbytes(off)


def model_files() -> dict[str, bytes]:
    """The repo's files: the fixture's small files as they are, plus the generated weights."""
    files = {p.relative_to(FIXTURE_REPO).as_posix(): p.read_bytes()
             for p in sorted(FIXTURE_REPO.rglob("*")) if p.is_file()}
    files["model.safetensors"] = _safetensors(json.loads(files["config.json"]))
    return files


def _git_blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _is_lfs(path: str) -> bool:
    return path.endswith((".safetensors", ".bin", ".pt"))


class HubRepo:
    """One model repo as the Hub describes it: commit, siblings, tree, and files by name."""

    def __init__(self, repo_id: str, files: dict[str, bytes]) -> None:
        self.repo_id = repo_id
        self.files = files
        self.commit = hashlib.sha1(b"".join(k.encode() + hashlib.sha256(v).digest()
                                            for k, v in sorted(files.items()))).hexdigest()

    def tree(self) -> list[dict[str, Any]]:
        out = []
        for path, data in sorted(self.files.items()):
            item: dict[str, Any] = {"type": "file", "oid": _git_blob_oid(data), "size": len(data), "path": path}
            if _is_lfs(path):
                item["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            out.append(item)
        return out

    def info(self) -> dict[str, Any]:
        return {"_id": hashlib.md5(self.repo_id.encode()).hexdigest()[:24], "id": self.repo_id,
                "modelId": self.repo_id, "sha": self.commit, "private": False, "gated": False,
                "disabled": False, "downloads": 0, "likes": 0, "tags": ["safetensors", "qwen3"],
                "library_name": "transformers", "lastModified": "2026-11-30T00:00:00.000Z",
                "createdAt": "2026-11-30T00:00:00.000Z",
                "siblings": [{"rfilename": p} for p in sorted(self.files)]}


def serve_hub(repo: HubRepo, host: str, port: int, log: Path | None = None) -> ThreadingHTTPServer:
    """The Hub stand-in: ``/api/models/R[/revision/REV]``, ``/api/models/R/tree/REV``, and
    ``/R/resolve/REV/FILE`` (HEAD and GET, byte ranges, ``X-Repo-Commit``, ETags, LFS headers)."""
    prefix_api = f"/api/models/{repo.repo_id}"
    prefix_file = f"/{repo.repo_id}/resolve/"
    logf = open(log, "a", buffering=1) if log else None  # noqa: SIM115 - closed with the process

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *args: Any) -> None:
            if logf:
                logf.write(f"{time.strftime('%H:%M:%S')} {self.address_string()} {fmt % args}\n")

        def _send(self, code: int, body: bytes, headers: dict[str, str], with_body: bool) -> None:
            self.send_response(code)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if with_body:
                self.wfile.write(body)

        def _json(self, obj: Any, with_body: bool) -> None:
            self._send(200, json.dumps(obj).encode(), {"Content-Type": "application/json"}, with_body)

        def _missing(self, with_body: bool, code: str = "RepoNotFound") -> None:
            body = json.dumps({"error": f"{code}: {self.path}"}).encode()
            self._send(404, body, {"Content-Type": "application/json", "X-Error-Code": code}, with_body)

        def _handle(self, with_body: bool) -> None:
            path = self.path.split("?", 1)[0]
            if path in (prefix_api, f"{prefix_api}/revision/main", f"{prefix_api}/revision/{repo.commit}"):
                return self._json(repo.info(), with_body)
            m = re.fullmatch(re.escape(prefix_api) + r"/tree/([^/]+)(?:/(.*))?", path)
            if m and m.group(1) in ("main", repo.commit):
                under = (m.group(2) or "").strip("/")
                items = [t for t in repo.tree() if not under or t["path"].startswith(under + "/")]
                return self._json(items, with_body)
            if path.startswith(prefix_file):
                rev, _, name = path[len(prefix_file):].partition("/")
                data = repo.files.get(name)
                if rev not in ("main", repo.commit) or data is None:
                    return self._missing(with_body, "EntryNotFound")
                headers = {"X-Repo-Commit": repo.commit, "Accept-Ranges": "bytes",
                           "Content-Type": "application/octet-stream",
                           "ETag": f'"{_git_blob_oid(data)}"'}
                if _is_lfs(name):
                    sha = hashlib.sha256(data).hexdigest()
                    headers.update({"X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(len(data)), "ETag": f'"{sha}"'})
                rng = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
                if rng:
                    a = int(rng.group(1))
                    b = min(int(rng.group(2)) if rng.group(2) else len(data) - 1, len(data) - 1)
                    headers["Content-Range"] = f"bytes {a}-{b}/{len(data)}"
                    return self._send(206, data[a:b + 1], headers, with_body)
                return self._send(200, data, headers, with_body)
            return self._missing(with_body)

        def do_GET(self) -> None:
            self._handle(True)

        def do_HEAD(self) -> None:
            self._handle(False)

    return ThreadingHTTPServer((host, port), Handler)


# ---- the Ray image ------------------------------------------------------------------------------

_STDLIB_SKIP = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "site-packages",
                "__pycache__", "pydoc_data", "unittest"}
_RAY_SKIP = ("ray/jars/", "ray/rllib/", "ray/tune/", "ray/train/", "ray/serve/", "ray/data/")
_BUSYBOX_APPLETS = ("sh", "ls", "cat", "ps", "sleep", "hostname", "ip", "env", "uname", "head", "tail", "grep",
                    "echo", "true", "false", "kill", "mkdir", "rm", "df", "free", "id", "which")


def _dist_closure(name: str) -> list[md.Distribution]:
    """``name``'s installed distribution and every one it requires (no extras), once each."""
    seen: dict[str, md.Distribution] = {}
    todo = [name]
    while todo:
        want = re.split(r"[ ;<>=!~\[(]", todo.pop().strip(), maxsplit=1)[0]
        key = want.lower().replace("_", "-")
        if key in seen:
            continue
        try:
            dist = md.distribution(want)
        except md.PackageNotFoundError:
            continue
        seen[key] = dist
        for req in dist.requires or []:
            if "extra ==" in req:
                continue
            marker = req.split(";", 1)[1] if ";" in req else ""
            if ("darwin" in marker and "!=" not in marker) or ("win32" in marker and "!=" not in marker):
                continue
            todo.append(req)
    return list(seen.values())



def _is_elf(p: Path) -> bool:
    try:
        with open(p, "rb") as fh:
            return fh.read(4) == b"\x7fELF"
    except OSError:
        return False


def ray_image_tag() -> str:
    return f"sparkconsole-lab/ray:{md.version('ray')}"


def _stub_vllm(site: Path, architectures: list[str]) -> None:
    pkg = site / "vllm"
    (pkg / "model_executor" / "models").mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        '"""A lab stand-in: answers the wizard\'s engine check only. It cannot serve (no GPU here)."""\n'
        f"__version__ = {STUB_VLLM_VERSION!r}\n")
    (pkg / "model_executor" / "__init__.py").write_text("")
    (pkg / "model_executor" / "models" / "__init__.py").write_text(
        "class ModelRegistry:\n"
        "    @staticmethod\n"
        "    def get_supported_archs():\n"
        f"        return {architectures!r}\n")


def ray_image_tar(cache: Path = CACHE_DIR) -> Path:
    """A root filesystem with this Python, Ray and its dependencies (copied from this
    environment), their shared libraries, busybox, and the stub ``vllm``, as a tar for
    ``docker import``; built once and kept in ``cache``."""
    ray_version = md.version("ray")
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    archs = json.loads((FIXTURE_REPO / "config.json").read_text())["architectures"]
    key = hashlib.sha256(f"{ray_version} {sys.version} {archs} v2".encode()).hexdigest()[:10]
    tar_path = cache / f"ray-{ray_version}-py{py}-{key}.tar"
    if tar_path.exists():
        return tar_path
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sclab-rootfs-", dir=cache) as tmp:
        root = Path(tmp) / "root"
        prefix = Path(sys.base_prefix).resolve()
        lib = root / "usr/local/lib" / f"python{py}"
        site = lib / "site-packages"
        # the interpreter and its standard library
        exe = Path(os.path.realpath(sys.executable))
        (root / "usr/local/bin").mkdir(parents=True)
        shutil.copy2(exe, root / f"usr/local/bin/python{py}")
        for name in ("python3", "python"):
            (root / "usr/local/bin" / name).symlink_to(f"python{py}")
        stdlib = prefix / "lib" / f"python{py}"
        shutil.copytree(stdlib, lib, symlinks=True,
                        ignore=lambda d, names: [n for n in names if n in _STDLIB_SKIP or n.startswith("config-")])
        for so in (prefix / "lib").glob(f"libpython{py}*.so*"):
            shutil.copy2(so, root / "usr/local/lib" / so.name)
        # Ray and what it requires, file by file from their RECORDs
        site.mkdir(parents=True)
        for dist in _dist_closure("ray"):
            for f in dist.files or []:
                rel = f.as_posix()
                if rel.startswith("..") or rel.startswith(_RAY_SKIP) or "__pycache__" in rel:
                    continue
                src = Path(str(dist.locate_file(f)))
                if src.is_file():
                    dst = site / rel
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(src, dst)
        _stub_vllm(site, archs)
        (root / "usr/local/bin/ray").write_text(
            f"#!/usr/local/bin/python{py}\nimport sys\nfrom ray.scripts.scripts import main\nsys.exit(main())\n")
        (root / "usr/local/bin/ray").chmod(0o755)
        # the shared libraries every ELF file asks for, at the same paths
        elves = [p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and _is_elf(p)]
        env = dict(os.environ, LD_LIBRARY_PATH=str(prefix / "lib"))
        libs = set()
        for i in range(0, len(elves), 200):
            proc = subprocess.run(["ldd", *map(str, elves[i:i + 200])], capture_output=True, text=True, env=env)
            for line in proc.stdout.splitlines():
                m = re.search(r"=>\s+(/\S+)|^\s*(/\S+)\s+\(", line)
                if m:
                    libs.add(m.group(1) or m.group(2))
        for libpath in sorted(libs):
            if libpath.startswith(str(prefix)):
                continue  # libpython: copied above
            dst = root / libpath.lstrip("/")
            dst.parent.mkdir(parents=True, exist_ok=True)
            if not dst.exists():
                shutil.copy2(os.path.realpath(libpath), dst)
        # busybox for a shell and the usual tools; /etc for getpass and friends
        (root / "bin").mkdir(exist_ok=True)
        shutil.copy2("/bin/busybox", root / "bin/busybox")
        for a in _BUSYBOX_APPLETS:
            (root / "bin" / a).symlink_to("busybox")
        (root / "etc").mkdir(exist_ok=True)
        (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")
        (root / "etc/group").write_text("root:x:0:\nnogroup:x:65534:\n")
        (root / "etc/ld.so.conf").write_text("/usr/local/lib\n/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n")
        _run(["ldconfig", "-r", str(root)])
        for d in ("tmp", "root", "dev/shm", "proc", "sys"):
            (root / d).mkdir(parents=True, exist_ok=True)
        (root / "tmp").chmod(0o1777)
        part = tar_path.with_suffix(".part")
        _run(["tar", "-C", str(root), "-cf", str(part), "."], timeout=600)
        part.replace(tar_path)
    return tar_path


# ---- the lab ------------------------------------------------------------------------------------


@dataclass
class LabHost:
    name: str  # the node name in the cluster config and its hostname
    netns: str
    dir: str
    fast_ip: str
    mgmt_ip: str  # where the laptop (this namespace) reaches its sshd
    unshare_pid: int = 0
    init_pid: int = 0  # the host's PID 1 (its sshd) as the machine sees it
    dockerd_pid: int = 0  # the nsenter that runs dockerd
    cgroup_parent: str = ""
    user: str = LOGIN_USER  # who logs in (ssh), and whose home is ``user_home`` on the host
    user_home: str = LOGIN_HOME

    @property
    def home(self) -> Path:
        """The login user's home on this host (bound over ``user_home`` there), as this machine sees it."""
        return Path(self.dir) / "home"

    @property
    def root_home(self) -> Path:
        """Root's home on this host (bound over ``/root`` there)."""
        return Path(self.dir) / "root"

    @property
    def hf_cache(self) -> Path:
        return self.home / ".cache" / "huggingface"

    def enter(self) -> list[str]:
        """The argv prefix that runs a command on this host (all its namespaces)."""
        return ["nsenter", "--target", str(self.init_pid), "--net", "--mount", "--pid", "--uts", "--"]

    def run(self, *argv: str, check: bool = True, timeout: float = 120.0,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on the host with root's environment (PATH, HOME=/root)."""
        env = {"PATH": DEFAULT_PATH, "HOME": "/root", "LC_ALL": "C"}
        return _run([*self.enter(), *argv], check=check, timeout=timeout, env=env, input=input)

    def sh(self, script: str, check: bool = True, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        return self.run("sh", "-c", script, check=check, timeout=timeout)

    def run_as_user(self, *argv: str, check: bool = True, timeout: float = 120.0,
                    input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on the host as its login user (uid, gid, groups; HOME, USER, PATH)."""
        pw = pwd.getpwnam(self.user)
        env = {"PATH": f"{self.user_home}/.local/bin:{DEFAULT_PATH}", "HOME": self.user_home, "USER": self.user,
               "LOGNAME": self.user, "LC_ALL": "C"}
        return _run([*self.enter(), "setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups",
                     "--", *argv], check=check, timeout=timeout, env=env, input=input, cwd="/")

    def docker(self, *args: str, check: bool = True, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        return self.run(DOCKER, *args, check=check, timeout=timeout)


@dataclass
class Lab:
    """Two hosts, ``a`` (head, reaches the Hub) and ``b`` (worker, fast link only)."""

    workdir: str
    tag: str = ""
    subnet: int = 0  # the management /24 is 10.79.<subnet>.0
    hosts: list[LabHost] = field(default_factory=list)
    bridge: str = ""
    mgmt_veth: str = ""
    mgmt_b: str = ""
    hub_pid: int = 0
    hub_url: str = ""
    image: str = ""
    image_id: str = ""
    cgroup_dirs: list[str] = field(default_factory=list)
    user: str = LOGIN_USER  # every host's login user (:func:`ensure_login_user`)

    # ---- names and files ----------------------------------------------------------------------
    @property
    def dir(self) -> Path:
        return Path(self.workdir)

    @property
    def a(self) -> LabHost:
        return self.hosts[0]

    @property
    def b(self) -> LabHost:
        return self.hosts[1]

    @property
    def key(self) -> Path:
        return self.dir / "laptop" / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.dir / "laptop" / "known_hosts"

    @property
    def config_path(self) -> Path:
        return self.dir / "cluster.toml"

    @property
    def state_path(self) -> Path:
        return self.dir / "lab.json"

    def host(self, name: str) -> LabHost:
        return next(h for h in self.hosts if h.name == name)

    def save(self) -> None:
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(self.state_path)

    @classmethod
    def load(cls, workdir: str | Path) -> Lab:
        data = json.loads((Path(workdir) / "lab.json").read_text())
        data["hosts"] = [LabHost(**h) for h in data["hosts"]]
        return cls(**data)

    # ---- up -----------------------------------------------------------------------------------
    @classmethod
    def create(cls, workdir: str | Path, tag: str | None = None, with_image: bool = True) -> Lab:
        """Build the whole lab (``down()`` is run on any failure, then the error raised);
        ``with_image=False`` leaves the Ray image out (a lab for the cleanup tests)."""
        workdir = Path(workdir).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        if not tag:  # two labs of one test process (a session's lab and one a test builds) must not meet
            free = [d for d in range(10) if not os.path.exists(f"/run/netns/sc{os.getpid() % 1000:03d}{d}a")]
            tag = f"{os.getpid() % 1000:03d}{random.choice(free or list(range(10)))}"
        if not re.fullmatch(r"[a-z0-9]{1,5}", tag):
            raise ValueError(f"lab tag must be 1-5 of [a-z0-9]: {tag!r}")
        with _host_wide_lock():  # two labs at once (pytest-xdist workers): one makes its user and picks
            # its subnet only once the other's addresses exist
            user = ensure_login_user()
            lab = cls(workdir=str(workdir), tag=tag, subnet=_free_subnet(), user=user.name)
            lab.bridge, lab.mgmt_veth, lab.mgmt_b = f"sc{tag}br", f"sc{tag}m", f"sc{tag}mb"
            fast = f"192.168.{lab.subnet}."
            lab.hosts = [
                LabHost("lab-a", f"sc{tag}a", str(workdir / "hosts" / "a"), fast + "1", f"10.79.{lab.subnet}.1",
                        cgroup_parent=f"sc{tag}a", user=user.name, user_home=user.home),
                LabHost("lab-b", f"sc{tag}b", str(workdir / "hosts" / "b"), fast + "2", f"10.80.{lab.subnet}.2",
                        cgroup_parent=f"sc{tag}b", user=user.name, user_home=user.home),
            ]
            lab.hub_url = f"http://10.79.{lab.subnet}.254:{HUB_PORT}"
            lab.save()
            try:
                lab._links()
            except BaseException:
                lab.down()
                raise
        try:
            lab._keys_and_homes(user)
            for h in lab.hosts:
                lab._start_host(h)
            lab._start_hub()
            for h in lab.hosts:
                lab._start_dockerd(h)
            for h in lab.hosts:
                lab._check_login(h)
            if with_image:
                lab._load_image()
            lab._write_config()
        except BaseException:
            lab.down()
            raise
        return lab

    def _links(self) -> None:
        a, b = self.a, self.b
        for h in self.hosts:
            _ip("netns", "add", h.netns)
            self.save()
            _ip("-n", h.netns, "link", "set", "lo", "up")
        # the fast link: one veth pair, both ends renamed to the ConnectX-7 name inside their host
        ta, tb = f"sc{self.tag}fa", f"sc{self.tag}fb"
        _ip("link", "add", ta, "type", "veth", "peer", "name", tb)
        for h, end in ((a, ta), (b, tb)):
            _ip("link", "set", end, "netns", h.netns)
            _ip("-n", h.netns, "link", "set", end, "name", FAST_IF)
            _ip("-n", h.netns, "link", "set", FAST_IF, "mtu", str(FAST_MTU), "up")
            _ip("-n", h.netns, "addr", "add", f"{h.fast_ip}/24", "dev", FAST_IF)
        # management: a bridge here with host A and the Hub stand-in on it; host B has its own
        # link to this namespace (the laptop reaches it) that leads nowhere else
        _ip("link", "add", self.bridge, "type", "bridge")
        self.save()
        _ip("addr", "add", f"10.79.{self.subnet}.254/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        _ip("link", "add", self.mgmt_veth, "type", "veth", "peer", "name", f"sc{self.tag}n")
        _ip("link", "set", self.mgmt_veth, "master", self.bridge, "up")
        _ip("link", "set", f"sc{self.tag}n", "netns", a.netns)
        _ip("-n", a.netns, "link", "set", f"sc{self.tag}n", "name", MGMT_IF)
        _ip("-n", a.netns, "addr", "add", f"{a.mgmt_ip}/24", "dev", MGMT_IF)
        _ip("-n", a.netns, "link", "set", MGMT_IF, "up")
        _ip("link", "add", self.mgmt_b, "type", "veth", "peer", "name", f"sc{self.tag}o")
        self.save()
        _ip("addr", "add", f"10.80.{self.subnet}.254/24", "dev", self.mgmt_b)
        _ip("link", "set", self.mgmt_b, "up")
        _ip("link", "set", f"sc{self.tag}o", "netns", b.netns)
        _ip("-n", b.netns, "link", "set", f"sc{self.tag}o", "name", MGMT_IF)
        _ip("-n", b.netns, "addr", "add", f"{b.mgmt_ip}/24", "dev", MGMT_IF)
        _ip("-n", b.netns, "link", "set", MGMT_IF, "up")

    def _keys_and_homes(self, user: LoginUser) -> None:
        """Per host: its sshd's host key; the login user's home (owned by the user, mode 0750)
        with ``~/.ssh`` (its own node key, the laptop's and the other hosts' keys authorized, the
        other hosts' host keys known at their fast-link addresses, as on Sparks set up for each
        other), ``~/.local/bin/hf`` and ``/etc/skel``'s files; root's home, empty (no
        ``authorized_keys``: no root login)."""
        laptop = _keygen(self.key, "sparkconsole-lab-laptop")
        hf = Path(sys.executable).parent / "hf"
        if not hf.exists():
            raise RuntimeError(f"no `hf` next to {sys.executable}: install huggingface_hub there")
        node_keys = {}
        for h in self.hosts:
            d = Path(h.dir)
            (d / "sshd").mkdir(parents=True, exist_ok=True)
            _keygen(d / "sshd" / "ssh_host_ed25519_key", f"host-{h.name}")
            h.root_home.mkdir(parents=True, exist_ok=True)
            h.root_home.chmod(0o700)
            h.home.mkdir(parents=True, exist_ok=True)
            if Path("/etc/skel").is_dir():  # what useradd puts in a new home (.bashrc, .profile)
                shutil.copytree("/etc/skel", h.home, symlinks=True, dirs_exist_ok=True)
            ssh = h.home / ".ssh"
            ssh.mkdir(exist_ok=True)
            h.home.chmod(0o750)
            ssh.chmod(0o700)
            node_keys[h.name] = _keygen(ssh / "id_ed25519", f"{user.name}@{h.name}")
            (d / "docker").mkdir(exist_ok=True)
            local_bin = h.home / ".local" / "bin"
            local_bin.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                (local_bin / "hf").unlink()
            (local_bin / "hf").symlink_to(hf)
        for h in self.hosts:
            ssh = h.home / ".ssh"
            auth = [_pub(laptop)] + [_pub(k) for n, k in node_keys.items() if n != h.name]
            (ssh / "authorized_keys").write_text("\n".join(auth) + "\n")
            (ssh / "authorized_keys").chmod(0o600)
            # each host knows the other's key at its fast-link address (set up like real Sparks)
            others = [f"{o.fast_ip} {_host_pub(Path(o.dir) / 'sshd' / 'ssh_host_ed25519_key')}"
                      for o in self.hosts if o is not h]
            (ssh / "known_hosts").write_text("\n".join(others) + "\n")
            _chown_tree(h.home, user.uid, user.gid)
            self._sshd_config(h)
        entries = []
        for h in self.hosts:
            pub = _host_pub(Path(h.dir) / "sshd" / "ssh_host_ed25519_key")
            entries.append(f"{h.mgmt_ip} {pub}")
        self.known_hosts.write_text("\n".join(entries) + "\n")

    def _sshd_config(self, h: LabHost) -> None:
        d = Path(h.dir) / "sshd"
        env = [f"PATH={h.user_home}/.local/bin:{DEFAULT_PATH}", f"HF_ENDPOINT={self.hub_url}",
               "HF_HUB_DISABLE_TELEMETRY=1", "HF_HUB_DISABLE_PROGRESS_BARS=0"]
        (d / "sshd_config").write_text(f"""Port 22
ListenAddress 0.0.0.0
HostKey {d / 'ssh_host_ed25519_key'}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
AllowTcpForwarding yes
MaxSessions 32
MaxStartups 64
Subsystem sftp internal-sftp
SetEnv {' '.join(env)}
LogLevel VERBOSE
""")

    def _start_host(self, h: LabHost) -> None:
        """The host's namespaces with sshd as PID 1: own hostname, /run, /root, user's home, /proc."""
        d = Path(h.dir)
        log = d / "sshd" / "sshd.log"
        log.touch()
        # this interpreter and its venv (``hf`` runs on them, as the login user) may live under the
        # real /root (pyenv): keep them visible there, and root's home passable (0711) to reach them
        keep = ""
        for prefix in sorted({Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve()}):
            if not prefix.is_relative_to("/root"):
                # elsewhere (a clone in `mktemp -d`, mode 0700): the user needs to pass through each
                # folder above the interpreter to run it (search only, never read: o+x)
                for up in [prefix, *prefix.parents]:
                    mode = up.stat().st_mode
                    if not mode & 0o001:
                        up.chmod((mode & 0o7777) | 0o001)
                continue
            if prefix.is_relative_to("/root"):
                inside = h.root_home / prefix.relative_to("/root")
                inside.mkdir(parents=True, exist_ok=True)
                for up in [inside, *inside.parents]:
                    if up == h.root_home:
                        break
                    up.chmod(0o755)
                h.root_home.chmod(0o711)
                keep += f" && mount --bind {shlex.quote(str(prefix))} {shlex.quote(str(inside))}"
        script = (f"hostname {shlex.quote(h.name)} && mount -t tmpfs -o mode=0755 tmpfs /run && mkdir -m 0755 /run/sshd"
                  f"{keep} && mount --rbind {shlex.quote(str(h.root_home))} /root"
                  f" && mount --bind {shlex.quote(str(h.home))} {shlex.quote(h.user_home)}"
                  f" && exec {SSHD} -D -f {shlex.quote(str(d / 'sshd' / 'sshd_config'))} -E {shlex.quote(str(log))}")
        proc = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{h.netns}", "unshare", "--uts", "--pid", "--mount", "--fork",
             "--mount-proc", "--propagation", "private", "sh", "-c", script],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(d / "host.log", "ab"),  # noqa: SIM115
            start_new_session=True)
        h.unshare_pid = proc.pid
        self.save()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{h.name}: the host did not start: {(d / 'host.log').read_text()[-800:]}"
                                   f"{log.read_text()[-800:]}")
            if not h.init_pid:
                h.init_pid = _child_of(proc.pid)
                if h.init_pid:
                    self.save()
            if h.init_pid and "Server listening on 0.0.0.0 port 22" in log.read_text():
                return
            time.sleep(0.05)
        raise RuntimeError(f"{h.name}: sshd did not listen within 15 s: {log.read_text()[-800:]}")

    def _start_hub(self) -> None:
        log = self.dir / "hub.log"
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.lab.hosts", "hub", "--host", f"10.79.{self.subnet}.254",
             "--port", str(HUB_PORT), "--log", str(log)],
            cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=open(self.dir / "hub.err", "ab"),  # noqa: SIM115
            start_new_session=True, text=True)
        self.hub_pid = proc.pid
        self.save()
        line = proc.stdout.readline() if proc.stdout else ""
        if not line.startswith("ready"):
            raise RuntimeError(f"the Hub stand-in did not start: {(self.dir / 'hub.err').read_text()[-800:]}")

    def _start_dockerd(self, h: LabHost) -> None:
        d = Path(h.dir)
        proc = subprocess.Popen(
            [*h.enter(), DOCKERD, "--data-root", str(d / "docker"), "--bridge=none", "--iptables=false",
             "--ip-masq=false", f"--cgroup-parent=/{h.cgroup_parent}", "--userland-proxy=false",
             f"--group={DOCKER_GROUP}"],
            stdin=subprocess.DEVNULL, stdout=open(d / "dockerd.log", "ab"), stderr=subprocess.STDOUT,  # noqa: SIM115
            start_new_session=True, env={"PATH": DEFAULT_PATH, "HOME": "/root"})
        h.dockerd_pid = proc.pid
        self.save()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{h.name}: dockerd exited: {(d / 'dockerd.log').read_text()[-1500:]}")
            if h.docker("info", "--format", "{{.ServerVersion}}", check=False, timeout=20).returncode == 0:
                return
            time.sleep(0.3)
        raise RuntimeError(f"{h.name}: dockerd did not answer within 60 s")

    def ssh_argv(self, h: LabHost, *command: str) -> list[str]:
        """``ssh`` from the laptop to ``h`` as its login user, with the lab's key and known_hosts."""
        return [SSH, "-F", "/dev/null", "-i", str(self.key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "StrictHostKeyChecking=yes",
                "-o", "ConnectTimeout=10", f"{h.user}@{h.mgmt_ip}", *command]

    def _check_login(self, h: LabHost) -> None:
        """The login as a person (and the console) meets it: over ssh, the user (not root), its own
        home, in the docker group and reaching the host's own engine, ``hf`` on the PATH, and a
        ``sudo`` that wants a password."""
        script = ('id -un; echo "$HOME"; test -O "$HOME" && echo owns-home; id -Gn; command -v hf; '
                  "docker info --format 'docker {{.ServerVersion}} {{.Name}}' 2>&1; "
                  "if sudo -n true 2>/dev/null; then echo sudo-without-password; else echo sudo-asks; fi")
        got = _run(self.ssh_argv(h, script), check=False, timeout=60, env={"PATH": DEFAULT_PATH})
        lines = got.stdout.splitlines()
        want = [h.user, h.user_home, "owns-home"]
        ok = (got.returncode == 0 and lines[:3] == want and len(lines) == 7
              and DOCKER_GROUP in lines[3].split() and lines[4] == f"{h.user_home}/.local/bin/hf"
              and lines[5].startswith("docker ") and lines[5].endswith(f" {h.name}") and lines[6] == "sudo-asks")
        if not ok:
            raise RuntimeError(f"{h.name}: the login as {h.user} is not as set up (exit {got.returncode}): "
                               f"{lines} {got.stderr.strip()[-800:]}")

    def _load_image(self) -> None:
        tar = ray_image_tar()
        self.image = ray_image_tag()
        with open(tar, "rb") as fh:
            proc = subprocess.run([*self.a.enter(), DOCKER, "import", "-c", "ENV PATH=/usr/local/bin:/bin",
                                   "-c", "WORKDIR /root", "-", self.image], stdin=fh, capture_output=True,
                                  text=True, timeout=600, env={"PATH": DEFAULT_PATH, "HOME": "/root"})
        if proc.returncode != 0:
            raise RuntimeError(f"docker import on {self.a.name} failed: {proc.stderr[-800:]}")
        self.image_id = self.a.docker("image", "inspect", "-f", "{{.Id}}", self.image).stdout.strip()
        self.save()

    def _write_config(self) -> None:
        a, b = self.a, self.b
        common = f'user = "{self.user}"\nidentity = "{self.key}"\nknown_hosts = "{self.known_hosts}"\n'
        self.config_path.write_text(
            f'[cluster]\nname = "lab-{self.tag}"\n\n'
            f'[[nodes]]\nname = "{a.name}"\nhost = "{a.mgmt_ip}"\nport = 22\nrole = "head"\n'
            f'fast_link = "{FAST_IF}"\n{common}\n'
            f'[[nodes]]\nname = "{b.name}"\nhost = "{b.mgmt_ip}"\nport = 22\nrole = "worker"\n'
            f'fast_link = "{FAST_IF}"\n{common}')

    # ---- what a person or a test asks --------------------------------------------------------
    def commands(self) -> list[str]:
        return [f"sparkconsole --config {self.config_path}",
                f"sparkconsole deploy --config {self.config_path} --model {MODEL_ID} --image {self.image} "
                f"--gpu-memory-utilization 0.3 --until cluster --yes "
                + " ".join(f"--answer {a}" for a in self.answers()),
                f"sparkconsole deploy --config {self.config_path} --teardown --yes"]

    def answers(self) -> list[str]:
        """The decisions of a lab run, answered ahead: TP=2 over both hosts (the tiny model would
        fit one), the lab image, stop nothing, free the page cache (sudo wants a password, so the
        HF cache's files are evicted by the login user with dd), start whatever is free (no vLLM runs
        here), Ray."""
        return [*ANSWERS, f"engine.image={self.image or ray_image_tag()}"]

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"workdir": self.workdir, "hub": self.hub_url, "image": self.image, "user": self.user,
                               "hosts": {}}
        for h in self.hosts:
            alive = _alive(h.init_pid)
            info: dict[str, Any] = {"netns": h.netns, "fast_ip": h.fast_ip, "mgmt_ip": h.mgmt_ip, "up": alive}
            if alive:
                link = h.run("ip", "-j", "addr", "show", FAST_IF, check=False)
                with contextlib.suppress(ValueError, IndexError, KeyError):
                    j = json.loads(link.stdout)[0]
                    info["fast_link"] = f"{j['ifname']} {j['operstate']} mtu {j['mtu']}"
                ps = h.docker("ps", "--format", "{{.Names}}", check=False, timeout=20)
                info["containers"] = ps.stdout.split() if ps.returncode == 0 else f"docker: {ps.stderr.strip()}"
                im = h.docker("images", "--format", "{{.Repository}}:{{.Tag}}", check=False, timeout=20)
                info["images"] = im.stdout.split() if im.returncode == 0 else []
            out["hosts"][h.name] = info
        return out

    # ---- down ---------------------------------------------------------------------------------
    def down(self, remove_dir: bool = True) -> list[str]:
        """Remove every piece; returns what could not be removed (empty when all went)."""
        problems: list[str] = []
        _kill(self.hub_pid, "tests.lab.hosts")
        for h in self.hosts:
            # PID 1 of the host: its death ends every process of the host (Docker and containers too)
            _kill(h.init_pid, str(Path(h.dir) / "sshd" / "sshd_config"), sig=signal.SIGKILL)
            _kill(h.unshare_pid, "unshare", sig=signal.SIGKILL)
            _kill(h.dockerd_pid, "nsenter", sig=signal.SIGKILL)
        for h in self.hosts:
            for p in (h.init_pid, h.unshare_pid, h.dockerd_pid):
                if p and not _wait_gone(p, 10):
                    problems.append(f"{h.name}: process {p} still there")
            for top in Path("/sys/fs/cgroup").glob(f"*/{h.cgroup_parent}") if h.cgroup_parent else []:
                for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                    with contextlib.suppress(OSError):
                        d.rmdir()
                try:
                    top.rmdir()
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    problems.append(f"cgroup {top}: {exc}")
            if _run(["ip", "netns", "list"], check=False).stdout.split().count(h.netns):
                r = _ip("netns", "del", h.netns, check=False)
                if r.returncode != 0:
                    problems.append(f"netns {h.netns}: {r.stderr.strip()}")
        for link in (self.mgmt_veth, self.mgmt_b, self.bridge, f"sc{self.tag}fa", f"sc{self.tag}fb"):
            if link and _ip("link", "show", link, check=False).returncode == 0:
                r = _ip("link", "del", link, check=False)
                # a veth whose peer went with a deleted namespace goes by itself, after a moment: gone
                # between the show and the del is gone, not a leftover (seen on a loaded machine)
                if r.returncode != 0 and "Cannot find device" not in r.stderr:
                    problems.append(f"link {link}: {r.stderr.strip()}")
        if remove_dir and not problems:
            shutil.rmtree(self.workdir, ignore_errors=True)
        return problems


# caches.drop: the login user's sudo wants a password (stock DGX OS), so the wizard offers to go on
# without dropping the page cache or to stop and add the narrow rule; the lab goes on
ANSWERS = ("plan.layout=tp2", "free-memory.stop=none", "caches.drop=yes", "caches.fit=go-on", "cluster.executor=ray")


@contextlib.contextmanager
def _host_wide_lock() -> Iterator[None]:
    """This machine's one lock for what every lab shares: the login user and the choice of subnets."""
    import fcntl

    os.makedirs("/run/lock", exist_ok=True)
    fd = os.open("/run/lock/sparkconsole-lab.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _free_subnet() -> int:
    used = _run(["ip", "-4", "addr"], check=False).stdout + _run(["ip", "-4", "route"], check=False).stdout
    for _ in range(200):
        k = random.randrange(100, 250)
        if f"10.79.{k}." not in used and f"10.80.{k}." not in used and f"192.168.{k}." not in used:
            return k
    raise RuntimeError("no free 10.79.x.0/24 for the lab's management bridge")


def _child_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            kids = fh.read().split()
    except OSError:
        return 0
    return int(kids[0]) if kids else 0


def _alive(pid: int) -> bool:
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _kill(pid: int, must_contain: str, sig: int = signal.SIGTERM) -> None:
    """Signal ``pid`` only if it is still the process the lab started (its command line says so)."""
    if not pid:
        return
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return
    if must_contain in cmdline:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def fast_link_bytes(host: LabHost) -> tuple[int, int]:
    """The bytes the host's kernel counted on its end of the fast link: ``(tx, rx)``."""
    link = json.loads(host.run("ip", "-s", "-j", "link", "show", FAST_IF).stdout)[0]
    return int(link["stats64"]["tx"]["bytes"]), int(link["stats64"]["rx"]["bytes"])


@contextlib.contextmanager
def fast_link_limited(host: LabHost, rate: str, burst: str = "64kb") -> Iterator[None]:
    """What ``host`` sends over the fast link is held to ``rate`` (``tc qdisc … tbf``, e.g.
    ``"4mbit"``) inside the block; the link's own qdisc is back afterwards, also on an error."""
    if not re.fullmatch(r"\d+(?:\.\d+)?[kmg]?bit", rate) or not re.fullmatch(r"\d+[kmg]?b?", burst):
        raise ValueError(f"not a tc rate/burst: {rate!r} {burst!r}")
    host.run("tc", "qdisc", "add", "dev", FAST_IF, "root", "tbf", "rate", rate, "burst", burst, "latency", "400ms")
    try:
        yield
    finally:
        host.run("tc", "qdisc", "del", "dev", FAST_IF, "root", check=False)


def leftovers(lab: Lab) -> list[str]:
    """What of ``lab`` is still on the machine (for the tests that check cleanup)."""
    out = []
    names = _run(["ip", "netns", "list"], check=False).stdout
    links = _run(["ip", "-o", "link"], check=False).stdout
    for h in lab.hosts:
        if re.search(rf"^{re.escape(h.netns)}\b", names, re.M):
            out.append(f"netns {h.netns}")
        for p in (h.init_pid, h.unshare_pid, h.dockerd_pid):
            if _alive(p):
                out.append(f"process {p}")
        out += [f"cgroup {p}" for p in Path("/sys/fs/cgroup").glob(f"*/{h.cgroup_parent}")]
    for link in (lab.bridge, lab.mgmt_veth, lab.mgmt_b):
        if re.search(rf"^\d+: {re.escape(link)}[@:]", links, re.M):
            out.append(f"link {link}")
    if _alive(lab.hub_pid):
        out.append(f"hub {lab.hub_pid}")
    return out


def hub_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.lab.hosts hub")
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, default=HUB_PORT)
    ap.add_argument("--log")
    args = ap.parse_args(argv)
    ipaddress.ip_address(args.host)
    server = serve_hub(HubRepo(MODEL_ID, model_files()), args.host, args.port, Path(args.log) if args.log else None)
    print("ready", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


def lab_main(argv: list[str]) -> int:
    """``scripts/lab up|down|status [--dir DIR]``: the lab for a person."""
    ap = argparse.ArgumentParser(prog="scripts/lab", description="the two-host lab (tests/lab/hosts.py)")
    ap.add_argument("action", choices=("up", "down", "status"))
    ap.add_argument("--dir", default=os.environ.get("SPARKCONSOLE_LAB_DIR", "/tmp/sparkconsole-lab"),
                    help="where the lab keeps its hosts' files (default %(default)s)")
    args = ap.parse_args(argv)
    workdir = Path(args.dir)
    have = (workdir / "lab.json").exists()
    if args.action == "up":
        if have:
            print(f"a lab is already up in {workdir} (scripts/lab down first)", file=sys.stderr)
            return 1
        t0 = time.monotonic()
        lab = Lab.create(workdir, tag="lab")
        print(f"lab up in {time.monotonic() - t0:.1f} s: {lab.a.name} {lab.a.mgmt_ip} (Hub at {lab.hub_url}), "
              f"{lab.b.name} {lab.b.mgmt_ip}; fast link {FAST_IF} {lab.a.fast_ip} <-> {lab.b.fast_ip}, MTU {FAST_MTU}; "
              f"{lab.image} on {lab.a.name}")
        print("the planner reads the lab model once from the Hub stand-in:")
        print(f"  HF_ENDPOINT={lab.hub_url} sparkconsole plan {MODEL_ID} --nodes 2")
        print("then:")
        for line in lab.commands():
            print(f"  {line}")
        print(f"a shell on a host: ssh -i {lab.key} -o UserKnownHostsFile={lab.known_hosts} {lab.user}@{lab.a.mgmt_ip}")
        where = (f"is in {PASSWORD_FILE} (root-only)" if PASSWORD_FILE.exists()
                 else f"was set before the lab kept it ({PASSWORD_FILE} is gone)")
        print(f"{lab.user} is in the {DOCKER_GROUP} and sudo groups; its sudo password {where}")
        return 0
    if not have:
        print(f"no lab in {workdir}", file=sys.stderr)
        return 0 if args.action == "down" else 1
    lab = Lab.load(workdir)
    if args.action == "status":
        print(json.dumps(lab.status(), indent=2))
        return 0
    problems = lab.down()
    for p in problems + leftovers(lab):
        print(f"left: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["hub"]:
        sys.exit(hub_main(sys.argv[2:]))
    sys.exit(lab_main(sys.argv[1:]))


__all__ = [
    "ANSWERS",
    "DOCKER_GROUP",
    "FAST_IF",
    "LOGIN_HOME",
    "LOGIN_USER",
    "MODEL_ID",
    "PASSWORD_FILE",
    "HubRepo",
    "Lab",
    "LabHost",
    "LoginUser",
    "ensure_login_user",
    "fast_link_bytes",
    "fast_link_limited",
    "leftovers",
    "model_files",
    "ray_image_tag",
    "ray_image_tar",
    "serve_hub",
]
