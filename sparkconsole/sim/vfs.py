"""A node's file system: directories, text files that grow as they are written, opaque big files
and symlinks, over the virtual ``/proc``, ``/sys`` and ``/etc`` files the renderers compute.

Why a file system at all: a deployment is told by its files. A detached job's log is tailed while
it grows (``tail -c +OFFSET``), a download leaves ``blobs/`` plus ``snapshots/`` symlinks, an
``rsync`` without ``-L`` leaves broken links, a killed copy leaves a short file that a rerun
resumes. Each of those is a file-system state the wizard must read back, so the sim keeps one.

Weights are *opaque* files: a size and (once complete) a sha256, no content; text files keep
their text. Paths are absolute and normalised; symlinks are resolved component by component
(at most 40 hops, like Linux). The virtual files (``/proc/meminfo`` ...) are read-only and
computed at each read by the ``virtual`` callback; a real file at the same path wins.
"""

from __future__ import annotations

import contextlib
import contextvars
import fnmatch
import posixpath
from collections.abc import Callable, Iterator
from dataclasses import dataclass


class FsError(Exception):
    """A failed file operation; ``str`` is the strerror text (``No such file or directory``)."""

    def __init__(self, reason: str, path: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.path = path


ENOENT = "No such file or directory"
ENOTDIR = "Not a directory"
EISDIR = "Is a directory"
EEXIST = "File exists"
ELOOP = "Too many levels of symbolic links"
ENOTEMPTY = "Directory not empty"
EACCES = "Permission denied"
EINVAL = "Invalid argument"


class Unreadable(str):
    """A virtual file that exists (``ls``, globs list it) but whose read fails with this strerror:
    sysfs answers ``gid_attrs/types/N`` of an empty GID entry with EINVAL (the kernel keeps EINVAL
    there for user space that expects it, linux-rdma "RDMA/core: Change rdma_get_gid_attr returned
    error code", 2020), so ``cat`` fails and ``grep -H .`` prints nothing for it."""


@dataclass
class Inode:
    """One file-system entry. ``kind``: ``file``, ``dir`` or ``link``."""

    kind: str
    text: str = ""
    size: int | None = None  # an opaque file's size (bytes); None for a text file
    sha256: str | None = None  # an opaque file's digest when it is whole
    target: str = ""  # a link's target, as written
    mtime: float = 0.0
    blen: int = 0  # a text file's length in bytes (kept, so appends stay cheap)
    virtual: bool = False
    error: str = ""  # a virtual file whose read fails (:class:`Unreadable`): the strerror

    def nbytes(self) -> int:
        if self.kind == "dir":
            return 4096
        if self.kind == "link":
            return len(self.target.encode())
        return self.size if self.size is not None else self.blen

    def read_bytes(self) -> bytes:
        return self.text.encode()


# Each node's computed files as one probe request holds them (VFS.held), by VFS id; per task
_HELD: contextvars.ContextVar[dict[int, tuple[dict[str, str], set[str]]] | None] = contextvars.ContextVar(
    "sparkconsole_vfs_held", default=None)


def _held_now() -> dict[int, tuple[dict[str, str], set[str]]]:
    return _HELD.get() or {}


#: Where a node's computed files live (``formats.sysfs_files``: the kernel's /proc and /sys, and the
#: few /etc files a release names). A path elsewhere is looked up among the written files alone, so a
#: walk through a home folder never renders the node's /proc (each rendering is the whole model).
VIRTUAL_ROOTS = ("/proc", "/sys", "/etc")


def _may_be_virtual(real: str) -> bool:
    return any(real == r or real.startswith(r + "/") for r in VIRTUAL_ROOTS)


class VFS:
    """The files of one node. ``now`` gives sim time (mtimes); ``virtual`` the computed files."""

    def __init__(self, now: Callable[[], float], virtual: Callable[[], dict[str, str]] | None = None,
                 one: Callable[[str], str | None] | None = None) -> None:
        self.now = now
        self._compute = virtual or (lambda: {})
        # one computed file rendered alone (None: not one that can be): a read of /proc/meminfo every two
        # seconds need not render every file of the node
        self._one = one or (lambda _path: None)
        self.entries: dict[str, Inode] = {"/": Inode("dir")}
        self.listeners: list[Callable[[str], None]] = []  # called with a path after each write
        for d in ("/root", "/tmp", "/dev", "/etc", "/usr/bin", "/var/log", "/proc", "/sys"):
            self.mkdir(d, parents=True)

    def virtual(self) -> dict[str, str]:
        """The computed files (``/proc``, ``/sys``) as they are now, or, inside :meth:`held`, as they
        were when it began."""
        held = _held_now().get(id(self))
        return held[0] if held is not None else self._compute()

    def _held_dirs(self) -> set[str] | None:
        held = _held_now().get(id(self))
        return held[1] if held is not None else None

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """The computed files read once and kept for the block, for this task and the processes it
        starts only (a context variable): one probe request reads them as one snapshot (each is
        rendered from the model, so a request that reads fifty of them would render the node fifty
        times), while every other session on the node keeps seeing them as they are (a job started
        meanwhile has its /proc/PID)."""
        if id(self) in _held_now():
            yield
            return
        files = self._compute()
        token = _HELD.set({**_held_now(), id(self): (files, self._virtual_dirs(files))})
        try:
            yield
        finally:
            _HELD.reset(token)

    # ---- paths -------------------------------------------------------------------------------

    @staticmethod
    def norm(path: str, cwd: str = "/") -> str:
        if not path.startswith("/"):
            path = posixpath.join(cwd, path)
        out = posixpath.normpath(path)
        return "/" + out.lstrip("/") if out != "/" else "/"

    def resolve(self, path: str, follow: bool = True, cwd: str = "/") -> str:
        """``path`` with every symlink in it resolved (the last one only when ``follow``)."""
        path = self.norm(path, cwd)
        hops = 0
        parts = [p for p in path.split("/") if p]
        cur = "/"
        i = 0
        while i < len(parts):
            nxt = posixpath.join(cur, parts[i])
            ent = self.entries.get(nxt)
            last = i == len(parts) - 1
            if ent is not None and ent.kind == "link" and (follow or not last):
                hops += 1
                if hops > 40:
                    raise FsError(ELOOP, path)
                tgt = self.norm(ent.target, cur)
                rest = parts[i + 1:]
                parts = [p for p in tgt.split("/") if p] + rest
                cur = "/"
                i = 0
                continue
            cur = nxt
            i += 1
        return cur

    # ---- lookups -----------------------------------------------------------------------------

    def _virtual_dirs(self, files: dict[str, str]) -> set[str]:
        dirs: set[str] = set()
        for p in files:
            d = posixpath.dirname(p)
            while d not in dirs and d != "/":
                dirs.add(d)
                d = posixpath.dirname(d)
        return dirs

    def lookup(self, path: str, follow: bool = True, cwd: str = "/") -> Inode | None:
        try:
            real = self.resolve(path, follow, cwd)
        except FsError:
            return None
        ent = self.entries.get(real)
        if ent is not None:
            return ent
        if not _may_be_virtual(real):
            return None
        alone = self._one(real) if id(self) not in _held_now() else None
        files = self.virtual() if alone is None else {real: alone}
        if real in files:
            text = files[real]
            if isinstance(text, Unreadable):
                return Inode("file", virtual=True, error=str(text))
            return Inode("file", text=text, blen=len(text.encode()), virtual=True)
        dirs = self._held_dirs()
        if real in (dirs if dirs is not None else self._virtual_dirs(files)):
            return Inode("dir", virtual=True)
        return None

    def exists(self, path: str, cwd: str = "/") -> bool:
        return self.lookup(path, True, cwd) is not None

    def get_file(self, path: str, cwd: str = "/") -> Inode:
        ent = self.lookup(path, True, cwd)
        if ent is None:
            raise FsError(ENOENT, path)
        if ent.kind == "dir":
            raise FsError(EISDIR, path)
        return ent

    def read_text(self, path: str, cwd: str = "/") -> str:
        ent = self.get_file(path, cwd)
        if ent.error:
            raise FsError(ent.error, path)
        if ent.size is not None:
            return ""  # opaque (binary) content is not kept
        return ent.text

    def listdir(self, path: str, cwd: str = "/") -> list[str]:
        real = self.resolve(path, True, cwd)
        ent = self.lookup(real)
        if ent is None:
            raise FsError(ENOENT, path)
        if ent.kind != "dir":
            raise FsError(ENOTDIR, path)
        prefix = real.rstrip("/") + "/"
        names = {p[len(prefix):].split("/", 1)[0] for p in self.entries if p.startswith(prefix) and p != real}
        if _may_be_virtual(real):
            names |= {p[len(prefix):].split("/", 1)[0] for p in self.virtual() if p.startswith(prefix)}
        return sorted(n for n in names if n)

    def walk(self, top: str, follow: bool = False, cwd: str = "/") -> Iterator[tuple[str, Inode]]:
        """Every entry under ``top`` (``top`` first), depth first, names sorted; ``follow``
        descends through links to directories (``find -L``)."""
        top = self.norm(top, cwd)
        ent = self.lookup(top, True) if follow else self.lookup(top, False)
        if ent is None:
            raise FsError(ENOENT, top)
        seen: set[str] = set()

        def rec(path: str, ent: Inode) -> Iterator[tuple[str, Inode]]:
            yield path, ent
            target = ent
            if ent.kind == "link" and follow:
                target = self.lookup(path, True) or ent
            if target.kind != "dir":
                return
            real = self.resolve(path, True)
            if real in seen:
                return
            seen.add(real)
            for name in self.listdir(path):
                child = posixpath.join(path, name)
                cent = self.lookup(child, False)
                if cent is None:
                    continue
                if follow and cent.kind == "link":
                    resolved = self.lookup(child, True)
                    if resolved is not None:
                        yield from rec(child, resolved if resolved.kind != "dir" else cent)
                        continue
                yield from rec(child, cent)

        yield from rec(top, ent)

    # ---- changes -----------------------------------------------------------------------------

    def _parent_dir(self, real: str, path: str) -> None:
        parent = posixpath.dirname(real)
        pent = self.lookup(parent)
        if pent is None:
            raise FsError(ENOENT, path)
        if pent.kind != "dir":
            raise FsError(ENOTDIR, path)

    def mkdir(self, path: str, parents: bool = False, cwd: str = "/") -> None:
        real = self.resolve(path, True, cwd)
        ent = self.lookup(real)
        if ent is not None:
            if ent.kind == "dir" and parents:
                return
            raise FsError(EEXIST, path)
        if parents:
            parent = posixpath.dirname(real)
            if parent != real:
                self.mkdir(parent, parents=True)
        self._parent_dir(real, path)
        self.entries[real] = Inode("dir", mtime=self.now())

    def _writable(self, path: str, cwd: str) -> str:
        real = self.resolve(path, True, cwd)
        if real.startswith(("/proc/", "/sys/")):
            raise FsError(EACCES, path)
        ent = self.entries.get(real)
        if ent is not None and ent.kind == "dir":
            raise FsError(EISDIR, path)
        self._parent_dir(real, path)
        return real

    def open_write(self, path: str, append: bool = False, cwd: str = "/") -> str:
        """Create or truncate (``>``) or open for appending (``>>``); returns the real path."""
        real = self._writable(path, cwd)
        ent = self.entries.get(real)
        if ent is None or not append or ent.size is not None:
            self.entries[real] = Inode("file", mtime=self.now())
        self._notify(real)
        return real

    def append(self, real: str, text: str) -> None:
        """Append to a file opened with :meth:`open_write` (the data is visible at once)."""
        ent = self.entries.get(real)
        if ent is None or ent.kind != "file":  # removed while written: the data goes nowhere
            return
        if ent.size is not None:
            ent.size += len(text.encode())
        else:
            ent.text += text
            ent.blen += len(text.encode())
        ent.mtime = self.now()
        self._notify(real)

    def write_text(self, path: str, text: str, cwd: str = "/") -> None:
        real = self.open_write(path, False, cwd)
        self.append(real, text)

    def put_blob(self, path: str, size: int, sha256: str | None) -> Inode:
        """An opaque file of ``size`` bytes (its digest when it is whole)."""
        real = self._writable(path, "/")
        ent = Inode("file", size=size, sha256=sha256, mtime=self.now())
        self.entries[real] = ent
        self._notify(real)
        return ent

    def symlink(self, target: str, path: str, cwd: str = "/") -> None:
        real = self.resolve(path, False, cwd)
        if real in self.entries:
            raise FsError(EEXIST, path)
        self._parent_dir(real, path)
        self.entries[real] = Inode("link", target=target, mtime=self.now())

    def remove(self, path: str, recursive: bool = False, cwd: str = "/") -> None:
        real = self.resolve(path, False, cwd)
        ent = self.entries.get(real)
        if ent is None:
            raise FsError(ENOENT, path)
        if ent.kind == "dir":
            prefix = real.rstrip("/") + "/"
            kids = [p for p in self.entries if p.startswith(prefix)]
            if kids and not recursive:
                raise FsError(ENOTEMPTY, path)
            if not recursive:
                raise FsError(EISDIR, path)
            for p in kids:
                del self.entries[p]
        del self.entries[real]

    def rename(self, src: str, dst: str) -> None:
        s, d = self.resolve(src, False), self.resolve(dst, False)
        ent = self.entries.pop(s)
        self.entries[d] = ent

    def _notify(self, real: str) -> None:
        for cb in list(self.listeners):
            cb(real)

    # ---- globbing ----------------------------------------------------------------------------

    def glob(self, pattern: str, cwd: str = "/") -> list[str]:
        """Pathname expansion as ``sh`` does it: sorted matches, hidden names only by a leading dot."""
        absolute = pattern.startswith("/")
        segs = [s for s in pattern.split("/") if s]
        bases = ["/" if absolute else cwd]
        for seg in segs:
            nxt = []
            magic = any(ch in seg for ch in "*?[")
            for b in bases:
                if not magic:
                    cand = posixpath.join(b, seg)
                    if self.lookup(cand, False) is not None or self.lookup(cand) is not None:
                        nxt.append(cand)
                    continue
                try:
                    names = self.listdir(b)
                except FsError:
                    continue
                for n in names:
                    if n.startswith(".") and not seg.startswith("."):
                        continue
                    if fnmatch.fnmatchcase(n, seg):
                        nxt.append(posixpath.join(b, n))
            bases = nxt
        if not absolute:
            prefix = cwd.rstrip("/") + "/"
            bases = [b[len(prefix):] if b.startswith(prefix) else b for b in bases]
        return sorted(bases)


def node_path(fs: object, path: str, cwd: str = "/") -> str:
    """The node's path for ``path`` as seen through ``fs`` (a node's own VFS or a container's
    :class:`~sparkconsole.sim.container.ContainerFS`): what a page-cache ramp and an eviction name, so a file written in a
    container through its bind mount and evicted on the host are the same file; "" for a path in a
    container's own files (no node path)."""
    route = getattr(fs, "route", None)
    if route is not None:
        _vfs, p, bind = route(path, cwd)
        return p if bind is not None else ""
    return VFS.norm(path, cwd)
