"""What a container is made of, besides its processes: its image's commands, its environment and
its own files.

* :func:`image_commands`: the commands on the container's PATH: the base system's (``sh``, ``cat``,
  ``mkdir`` … every image has them), the image's own (:attr:`~sparkconsole.sim.model.Image.commands`:
  ``vllm``, ``ray``, ``hf``, ``python3`` … as the image carries them: NGC 26.05 has no ``ray``), and
  ``nvidia-smi`` only when the container was given the GPU (the NVIDIA container toolkit mounts it
  in with ``--gpus``).
* :func:`container_env`: the environment of the container's processes: the image's ``ENV``, ``HOME``
  and ``HOSTNAME``, then ``docker run -e`` (``docker exec -e`` adds to it per process).
* :class:`ContainerFS`: the container's view of files. A path under a ``-v HOST:CTR`` bind mount is the
  node's file at the mapped path (``/root/.cache/huggingface`` in the container is the login user's
  cache on the node); every other path is the container's own (a :class:`~sparkconsole.sim.vfs.VFS`
  per container, made on first use, gone with the container), so ``docker exec C sh -c 'mkdir -p
  /root/.config/vllm && … > /root/.config/vllm/ray_non_carry_over_env_vars.json'`` writes into C, not
  into the node. ``/proc`` and ``/sys`` read as the node's (a ``--network host`` container sees the
  node's interfaces and RDMA devices).
* :func:`python_context`: what ``python3 -c`` in the image sees (:mod:`sparkconsole.sim.pyexec`).
"""

from __future__ import annotations

import posixpath
from typing import TYPE_CHECKING, Any

from sparkconsole.sim.model import Container, Image, image_archs
from sparkconsole.sim.pyexec import PyContext
from sparkconsole.sim.vfs import VFS, FsError

if TYPE_CHECKING:
    from sparkconsole.sim.model import SimCluster

# the base system of every image (Ubuntu): on PATH in /usr/bin (usrmerge: /bin is /usr/bin)
BASE_COMMANDS = {name: f"/usr/bin/{name}" for name in (
    "sh", "bash", "dash", "cat", "echo", "printf", "ls", "mkdir", "rm", "rmdir", "cp", "mv", "ln", "touch", "test",
    "[", "true", "false", "sleep", "tail", "head", "wc", "grep", "find", "du", "df", "env", "id", "whoami",
    "hostname", "uname", "date", "readlink", "basename", "dirname", "sha256sum", "sort", "tee", "chmod", "chown",
    "ps", "kill", "nproc", "free", "timeout", "nohup", "setsid", "sync", "xargs", "sed", "awk", "cut", "tr")}
# the commands that depend on the image (and the GPU): absent unless the image (or --gpus) brings them
IMAGE_TOOLS = frozenset({"vllm", "ray", "hf", "huggingface-cli", "python3", "python", "pip", "nvidia-smi"})
NGC_ENTRYPOINT = "/opt/nvidia/nvidia_entrypoint.sh"
# packages every image has besides the modelled ones (transformers and vLLM/SGLang pull them in):
# importable, but the simulator does not model what is inside them
COMMON_PACKAGES = ("numpy", "safetensors", "tokenizers", "huggingface_hub", "requests", "yaml", "regex", "tqdm",
                   "packaging", "filelock", "psutil", "pydantic", "fastapi", "uvicorn", "aiohttp", "jinja2",
                   "sentencepiece", "einops", "triton", "PIL")


def image_commands(img: Image | None, gpu: bool) -> dict[str, str]:
    out = dict(BASE_COMMANDS)
    if img is not None:
        out.update(dict(img.commands))
    if gpu:
        out["nvidia-smi"] = "/usr/bin/nvidia-smi"
    return out


def has_command(img: Image | None, gpu: bool, name: str) -> bool:
    """Whether ``name`` (a command or an absolute path) can be executed in the container."""
    cmds = image_commands(img, gpu)
    if "/" not in name:
        return name in cmds
    if name in cmds.values() or (img is not None and img.entrypoint[:1] == (name,)):
        return True
    return posixpath.basename(name) in BASE_COMMANDS and posixpath.dirname(name) in ("/bin", "/usr/bin")


def container_env(cluster: SimCluster, ct: Container, img: Image | None) -> dict[str, str]:
    """The environment of ``ct``'s processes (``docker exec -e`` adds to it)."""
    env = dict(img.env) if img is not None else {}
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    env["HOSTNAME"] = ct.node if ct.network == "host" else ct.id[:12]
    env["HOME"] = "/root"
    env.update(dict(ct.env))
    return env


def gpu_visible(opts: list[tuple[str, str]]) -> bool:
    """``--gpus all`` / ``--gpus 1`` / ``--gpus device=0`` / ``--device nvidia.com/gpu=all`` (CDI):
    the node's one GPU is visible in the container (``--gpus 0`` gives none)."""
    for key, val in opts:
        v = val.strip("'\"")
        if key == "--gpus" and v not in ("0", ""):
            return True
        if key == "--device" and v.startswith("nvidia.com/gpu="):
            return True
    return False


def through_binds(binds, path: str) -> tuple[str, tuple[str, str]] | None:
    """The node's path for a container's ``path`` through the longest ``-v HOST:CTR`` bind that
    holds it, with that bind; None when no bind holds it (the path is the container's own)."""
    p = VFS.norm(path)
    for h, c in sorted(((VFS.norm(h), VFS.norm(c)) for h, c in binds), key=lambda b: -len(b[1])):
        moved = ContainerFS._move(p, c, h)
        if moved is not None:
            return VFS.norm(moved), (h, c)
    return None


class ContainerFS:
    """A container's files: its bind mounts onto the node's :class:`VFS`, the rest its own."""

    def __init__(self, node_fs: VFS, rootfs: VFS, binds: tuple[tuple[str, str], ...] | list[tuple[str, str]]):
        self.node_fs = node_fs
        self.rootfs = rootfs
        self.binds = sorted(((VFS.norm(h), VFS.norm(c)) for h, c in binds), key=lambda b: -len(b[1]))
        self.entries = rootfs.entries
        self.listeners = rootfs.listeners
        self.now = rootfs.now
        self.virtual = rootfs.virtual

    norm = staticmethod(VFS.norm)

    def __getattr__(self, name: str) -> Any:  # anything else a tool asks of a VFS: the container's own
        return getattr(self.rootfs, name)

    @staticmethod
    def _move(path: str, frm: str, to: str) -> str | None:
        if path == frm:
            return to
        prefix = frm.rstrip("/") + "/"
        if path.startswith(prefix):
            return to.rstrip("/") + "/" + path[len(prefix):]
        return None

    def route(self, path: str, cwd: str = "/") -> tuple[VFS, str, tuple[str, str] | None]:
        """(the file system holding ``path``, its path there, the bind it goes through)."""
        p = VFS.norm(path, cwd)
        hit = through_binds(self.binds, p)
        if hit is not None:
            return self.node_fs, hit[0], hit[1]
        return self.rootfs, p, None

    def _back(self, path: str, bind: tuple[str, str] | None) -> str:
        if bind is None:
            return path
        moved = self._move(path, bind[0], bind[1])
        return VFS.norm(moved) if moved is not None else path

    def resolve(self, path: str, follow: bool = True, cwd: str = "/") -> str:
        fs, p, b = self.route(path, cwd)
        return self._back(fs.resolve(p, follow), b)

    def lookup(self, path: str, follow: bool = True, cwd: str = "/") -> Any:
        fs, p, _b = self.route(path, cwd)
        return fs.lookup(p, follow)

    def listdir(self, path: str, cwd: str = "/") -> list[str]:
        fs, p, _b = self.route(path, cwd)
        return fs.listdir(p)

    def mkdir(self, path: str, parents: bool = False, cwd: str = "/") -> None:
        fs, p, _b = self.route(path, cwd)
        fs.mkdir(p, parents)

    def open_write(self, path: str, append: bool = False, cwd: str = "/") -> str:
        fs, p, _b = self.route(path, cwd)
        fs.open_write(p, append)
        return VFS.norm(path, cwd)  # the container's path: ``append`` routes it again

    def append(self, path: str, text: str) -> None:
        fs, p, _b = self.route(path)
        try:
            real = fs.resolve(p)
        except FsError:
            return
        fs.append(real, text)

    def write_text(self, path: str, text: str, cwd: str = "/") -> None:
        fs, p, _b = self.route(path, cwd)
        fs.write_text(p, text)

    def put_blob(self, path: str, size: int, sha256: str | None) -> Any:
        fs, p, _b = self.route(path)
        return fs.put_blob(p, size, sha256)

    def symlink(self, target: str, path: str, cwd: str = "/") -> None:
        fs, p, _b = self.route(path, cwd)
        fs.symlink(target, p)

    def remove(self, path: str, recursive: bool = False, cwd: str = "/") -> None:
        fs, p, _b = self.route(path, cwd)
        fs.remove(p, recursive)

    def rename(self, src: str, dst: str) -> None:
        fs1, p1, _b1 = self.route(src)
        fs2, p2, _b2 = self.route(dst)
        if fs1 is not fs2:
            raise FsError("Invalid cross-device link", src)
        fs1.rename(p1, p2)

    # the rest only goes through lookup / listdir / resolve, so they work across the mounts
    exists = VFS.exists
    get_file = VFS.get_file
    read_text = VFS.read_text
    walk = VFS.walk
    glob = VFS.glob


def rootfs(cluster: SimCluster, ct: Container, img: Image | None) -> VFS:
    """``ct``'s own files, made on first use: the image's commands and, for every bind mount, the
    mount point (so ``ls`` of its parent shows it)."""
    if ct.rootfs is not None:
        return ct.rootfs
    node = ct.node
    fs = VFS(cluster.now, lambda: cluster.virtual_files(cluster, node) if cluster.virtual_files else {})
    fs.mkdir("/root/.cache", parents=True)
    fs.mkdir("/usr/local/bin", parents=True)
    fs.mkdir("/workspace", parents=True)
    for name, path in image_commands(img, ct.gpus).items():
        if fs.lookup(path) is None:
            fs.mkdir(posixpath.dirname(path), parents=True)
            fs.write_text(path, f"#!/bin/sh\n# {name}\n" if name in IMAGE_TOOLS else "")
    if img is not None and img.entrypoint[:1] == (NGC_ENTRYPOINT,):
        fs.mkdir(posixpath.dirname(NGC_ENTRYPOINT), parents=True)
        fs.write_text(NGC_ENTRYPOINT, "#!/bin/bash\n# NVIDIA's container entrypoint: banner, then exec \"$@\"\n")
    for _h, c in ct.binds:
        try:
            fs.mkdir(c, parents=True)
        except FsError:
            pass
    ct.rootfs = fs
    return fs


def container_fs(cluster: SimCluster, ct: Container, img: Image | None) -> ContainerFS:
    return ContainerFS(cluster.fs(ct.node), rootfs(cluster, ct, img), ct.binds)


def python_context(img: Image, gpu: bool = False, env: dict[str, str] | None = None,
                   argv: list[str] | None = None) -> PyContext:
    """What the image's ``python3`` sees: its packages, commands, torch's CUDA build and the GPU."""
    from sparkconsole.sim.vllm_logs import SUPPORTED_ARCHS_014

    packages = {name: v for name, v in (("vllm", img.vllm_version), ("transformers", img.transformers),
                                        ("torch", img.torch), ("sglang", img.sglang_version), ("ray", img.ray)) if v}
    for p in COMMON_PACKAGES:
        packages.setdefault(p, "")
    known = sorted(image_archs(img))
    vllm_archs = tuple(dict.fromkeys([*SUPPORTED_ARCHS_014, *known])) if img.vllm_version else ()
    if vllm_archs and not img.knows_qwen35:
        vllm_archs = tuple(a for a in vllm_archs if not a.startswith("Qwen3_5"))
    return PyContext(packages=packages, commands=image_commands(img, gpu), cuda=img.cuda,
                     cuda_archs=img.cuda_archs, gpu=(12, 1) if gpu else None, vllm_archs=vllm_archs,
                     sglang_archs=tuple(known) if img.sglang_version else (), env=dict(env or {}),
                     argv=["-c", *(argv or [])])
