"""File tools over the node's file system: ``cat``, ``grep``, ``head``, ``tail`` (``-n``, ``-c
[+]N``, ``-f``/``-F`` following a growing file), ``wc``, ``ls``, ``mkdir``, ``rm``, ``touch``,
``ln -s``, ``mv``, ``tee [-a]``, ``readlink``, ``basename``/``dirname``, ``find`` (``-L``, ``-type``,
``-xtype``, ``-name``, ``-maxdepth``, ``-printf``), ``sha256sum`` (sim time at about 1.5 GB/s;
``-c``), ``du`` (``-s``, ``-b``, ``-h``, ``-L``) and ``df`` (``-B1 -P``, ``-h``; a missing path
fails as real ``df`` does). Messages and exit codes are GNU coreutils / findutils'.
"""

from __future__ import annotations

import asyncio
import hashlib
import posixpath
import re

from sparkconsole.sim import formats as F
from sparkconsole.sim.sh.interp import IO
from sparkconsole.sim.tools.common import _bre
from sparkconsole.sim.vfs import FsError, Inode, node_path

SHA_BPS = 1.5e9  # sha256sum over NVMe, bytes per second


def _why(exc: FsError) -> str:
    return exc.reason


def _split_opts(args: list[str], with_value: tuple[str, ...] = ()) -> tuple[dict[str, str], list[str]]:
    """GNU-style options: ``-n 5``, ``-n5``, ``--lines=5``, clustered flags; ``--`` ends them."""
    opts: dict[str, str] = {}
    rest: list[str] = []
    it = iter(range(len(args)))
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            rest.extend(args[i + 1:])
            break
        if a.startswith("--") and len(a) > 2:
            k, eq, v = a.partition("=")
            if not eq and k in with_value and i + 1 < len(args):
                v = args[i + 1]
                i += 1
            opts[k] = v
        elif a.startswith("-") and len(a) > 1 and not re.fullmatch(r"-\d+", a):
            j = 1
            while j < len(a):
                flag = "-" + a[j]
                if flag in with_value:
                    v = a[j + 1:]
                    if not v and i + 1 < len(args):
                        v = args[i + 1]
                        i += 1
                    opts[flag] = v
                    break
                opts[flag] = ""
                j += 1
        elif re.fullmatch(r"-\d+", a):
            opts["-n"] = a[1:]
        else:
            rest.append(a)
        i += 1
    del it
    return opts, rest


def _human(b: float) -> str:
    for unit in ("", "K", "M", "G", "T"):
        if b < 1024 or unit == "T":
            if unit == "":
                return str(int(b))
            return f"{b:.1f}{unit}" if b < 10 else f"{-(-b // 1):.0f}{unit}"
        b /= 1024
    return str(b)


class FileTools:
    """Mixin: the file tools of a node's shell."""

    async def c_cat(self, argv: list[str], io: IO) -> int:
        _opts, paths = _split_opts(argv[1:])
        if not paths:
            io.out(io.stdin or "")
            return 0
        rc = 0
        for p in paths:
            if p == "-":
                io.out(io.stdin or "")
                continue
            try:
                io.out(self.fs.read_text(p, self.cwd))
            except FsError as exc:
                io.err(f"cat: {p}: {_why(exc)}\n")
                rc = 1
        return rc

    async def c_grep(self, argv: list[str], io: IO) -> int:
        opts: set[str] = set()
        args: list[str] = []
        for a in argv[1:]:
            if a.startswith("-") and len(a) > 1 and not args:
                opts.update(a[1:])
            else:
                args.append(a)
        if not args:
            io.err("Usage: grep [OPTION]... PATTERNS [FILE]...\n")
            return 2
        pat, paths = args[0], args[1:]
        flags = re.IGNORECASE if "i" in opts else 0
        try:
            rx = re.compile(pat if "E" in opts or "P" in opts else _bre(pat), flags)
        except re.error:
            rx = re.compile(re.escape(pat), flags)
        sources: list[tuple[str | None, str]] = []
        rc_err = False
        if paths:
            for p in paths:
                try:
                    sources.append((p, self.fs.read_text(p, self.cwd)))
                except FsError as exc:
                    if "s" not in opts:
                        io.err(f"grep: {p}: {_why(exc)}\n")
                    rc_err = True
        else:
            sources.append((None, io.stdin or ""))
        show_name = "H" in opts or (len(paths) > 1 and "h" not in opts)
        count = 0
        for name, text in sources:
            for line in text.splitlines():
                hit = bool(rx.search(line))
                if "v" in opts:
                    hit = not hit
                if hit:
                    count += 1
                    if "c" not in opts and "q" not in opts:
                        if "o" in opts:
                            m = rx.search(line)
                            line = m.group(0) if m else line
                        io.out(f"{name}:{line}\n" if show_name and name else line + "\n")
        if "c" in opts:
            io.out(f"{count}\n")
        if rc_err:
            return 2
        return 0 if count else 1

    def _inputs(self, tool: str, paths: list[str], io: IO) -> list[tuple[str, str | None]]:
        if not paths:
            return [("-", io.stdin or "")]
        out: list[tuple[str, str | None]] = []
        for p in paths:
            if p == "-":
                out.append((p, io.stdin or ""))
                continue
            try:
                out.append((p, self.fs.read_text(p, self.cwd)))
            except FsError as exc:
                io.err(f"{tool}: cannot open '{p}' for reading: {_why(exc)}\n")
                out.append((p, None))
        return out

    async def c_head(self, argv: list[str], io: IO) -> int:
        opts, paths = _split_opts(argv[1:], ("-n", "-c", "--lines", "--bytes"))
        nbytes = opts.get("-c") or opts.get("--bytes")
        if paths == ["/dev/zero"] and nbytes is not None and nbytes.isdigit():
            io.out("\0" * int(nbytes))  # NULs, as the device gives (piped to ssh: Interp._special_pipe)
            return 0
        rc = 0
        srcs = self._inputs("head", paths, io)
        for k, (name, text) in enumerate(srcs):
            if text is None:
                rc = 1
                continue
            if len(srcs) > 1:
                io.out(("\n" if k else "") + f"==> {name} <==\n")
            if "-c" in opts or "--bytes" in opts:
                n = int(opts.get("-c") or opts.get("--bytes") or "0")
                data = text.encode()
                io.out(data[:n].decode(errors="replace"))  # -c -N: all but the last N
            else:
                n = int(opts.get("-n") or opts.get("--lines") or "10")
                lines = text.splitlines(keepends=True)
                io.out("".join(lines[:n]))
        return rc

    async def c_tail(self, argv: list[str], io: IO) -> int:
        opts, paths = _split_opts(argv[1:], ("-n", "-c", "--lines", "--bytes", "-s", "--sleep-interval", "--pid"))
        follow = any(k in opts for k in ("-f", "-F", "--follow"))
        by_name = "-F" in opts or opts.get("--follow") == "name"
        nb = opts.get("-c", opts.get("--bytes"))
        nl = opts.get("-n", opts.get("--lines", "10"))

        def cut(text: str) -> str:
            if nb is not None:
                data = text.encode()
                if nb.startswith("+"):
                    return data[max(0, int(nb[1:] or "1") - 1):].decode(errors="replace")
                n = int(nb)
                return data[-n:].decode(errors="replace") if n else ""
            lines = text.splitlines(keepends=True)
            if nl.startswith("+"):
                return "".join(lines[max(0, int(nl[1:] or "1") - 1):])
            n = int(nl)
            return "".join(lines[-n:]) if n else ""

        if not paths:
            io.out(cut(io.stdin or ""))
            return 0
        rc = 0
        sizes: dict[str, int] = {}
        for k, p in enumerate(paths):
            if len(paths) > 1:
                io.out(("\n" if k else "") + f"==> {p} <==\n")
            try:
                text = self.fs.read_text(p, self.cwd)
            except FsError as exc:
                io.err(f"tail: cannot open '{p}' for reading: {_why(exc)}\n")
                rc = 1
                sizes[p] = -1
                continue
            io.out(cut(text))
            sizes[p] = len(text.encode())
        if not follow:
            return rc
        if rc and not by_name and all(v < 0 for v in sizes.values()):
            io.err("tail: no files remaining\n")
            return 1
        while True:
            await self.clock.sleep(0.5)
            for p in paths:
                ent = self.fs.lookup(p, True, self.cwd)
                if ent is None or ent.kind != "file":
                    if sizes.get(p, -1) >= 0 and by_name:
                        io.err(f"tail: '{p}' has become inaccessible: No such file or directory\n")
                        sizes[p] = -1
                    continue
                data = ent.read_bytes()
                old = sizes.get(p, -1)
                if old < 0:
                    if by_name:
                        io.err(f"tail: '{p}' has appeared;  following new file\n")
                    old = 0
                elif len(data) < old:
                    io.err(f"tail: {p}: file truncated\n")
                    old = 0
                if len(data) > old:
                    io.out(data[old:].decode(errors="replace"))
                sizes[p] = len(data)

    async def c_wc(self, argv: list[str], io: IO) -> int:
        opts, paths = _split_opts(argv[1:])
        which = [k for k in ("-l", "-w", "-c", "-m") if k in opts] or ["-l", "-w", "-c"]
        rc = 0
        rows: list[tuple[list[int], str]] = []
        regular = bool(paths)
        for p in paths or ["-"]:
            if p == "-":
                text: str | None = io.stdin or ""
                regular = False
                size = len(text) if text.isascii() else len(text.encode())
            else:
                try:
                    ent = self.fs.get_file(p, self.cwd)
                    text = ent.text if ent.size is None else None
                    size = ent.nbytes()
                except FsError as exc:
                    io.err(f"wc: {p}: {_why(exc)}\n")
                    rc = 1
                    continue
            rows.append(([_wc_count(k, text or "", size) for k in which], "" if p == "-" else p))
        if len(rows) > 1:
            rows.append(([sum(r[0][i] for r in rows) for i in range(len(which))], "total"))
        if len(which) == 1 and len(rows) == 1:
            width = 1
        elif regular:
            width = max(len(str(v)) for r in rows for v in r[0])
        else:
            width = 7
        for vals, name in rows:
            io.out(" ".join(f"{v:>{width}}" for v in vals) + (f" {name}" if name else "") + "\n")
        return rc

    async def c_ls(self, argv: list[str], io: IO) -> int:
        opts, paths = _split_opts(argv[1:])
        rc = 0
        long = "-l" in opts
        for p in paths or [self.cwd]:
            ent = self.fs.lookup(p, True, self.cwd)
            if ent is None:
                io.err(f"ls: cannot access '{p}': No such file or directory\n")
                rc = 2
                continue
            names = self.fs.listdir(p, self.cwd) if ent.kind == "dir" and "-d" not in opts else [p]
            if "-a" not in opts and "-A" not in opts:
                names = [n for n in names if not n.startswith(".")]
            if len(paths) > 1 and ent.kind == "dir":
                io.out(f"{p}:\n")
            for n in names:
                if not long:
                    io.out(n + "\n")
                    continue
                full = n if n.startswith("/") else posixpath.join(self.fs.norm(p, self.cwd), n)
                e = self.fs.lookup(full, False) or Inode("file")
                kind = {"dir": "d", "link": "l"}.get(e.kind, "-")
                perm = "rwxrwxrwx" if e.kind == "link" else ("rwxr-xr-x" if e.kind == "dir" else "rw-r--r--")
                tail = f" -> {e.target}" if e.kind == "link" else ""
                io.out(f"{kind}{perm} 1 root root {e.nbytes():>12} Mar 27 17:40 {n}{tail}\n")
        return rc

    async def c_mkdir(self, argv: list[str], io: IO) -> int:
        opts, paths = _split_opts(argv[1:], ("-m",))
        if not paths:
            io.err("mkdir: missing operand\nTry 'mkdir --help' for more information.\n")
            return 1
        rc = 0
        for p in paths:
            try:
                self.fs.mkdir(p, parents="-p" in opts or "--parents" in opts, cwd=self.cwd)
            except FsError as exc:
                io.err(f"mkdir: cannot create directory ‘{p}’: {_why(exc)}\n")
                rc = 1
        return rc

    async def c_rm(self, argv: list[str], io: IO) -> int:
        opts, paths = _split_opts(argv[1:])
        force = "-f" in opts or "--force" in opts
        rec = any(k in opts for k in ("-r", "-R", "--recursive"))
        if not paths and not force:
            io.err("rm: missing operand\nTry 'rm --help' for more information.\n")
            return 1
        rc = 0
        for p in paths:
            try:
                self.fs.remove(p, recursive=rec, cwd=self.cwd)
            except FsError as exc:
                if exc.reason == "No such file or directory" and force:
                    continue
                why = _why(exc)
                io.err(f"rm: cannot remove '{p}': {why}\n" if why != "Is a directory" else
                       f"rm: cannot remove '{p}': Is a directory\n")
                rc = 1
        return rc

    async def c_rmdir(self, argv: list[str], io: IO) -> int:
        rc = 0
        for p in argv[1:]:
            try:
                if self.fs.listdir(p, self.cwd):
                    raise FsError("Directory not empty", p)
                self.fs.remove(p, recursive=True, cwd=self.cwd)
            except FsError as exc:
                io.err(f"rmdir: failed to remove '{p}': {_why(exc)}\n")
                rc = 1
        return rc

    async def c_touch(self, argv: list[str], io: IO) -> int:
        _opts, paths = _split_opts(argv[1:])
        rc = 0
        for p in paths:
            if self.fs.lookup(p, True, self.cwd) is not None:
                continue
            try:
                self.fs.open_write(p, True, self.cwd)
            except FsError as exc:
                io.err(f"touch: cannot touch '{p}': {_why(exc)}\n")
                rc = 1
        return rc

    async def c_tee(self, argv: list[str], io: IO) -> int:
        """GNU ``tee [-a] FILE...``: stdin to stdout and to each file. ``/proc/sys/vm/drop_caches``
        (mode 0200, root) drops the node's page cache when root writes 1, 2 or 3 to it (``echo 3 |
        sudo -n /usr/bin/tee /proc/sys/vm/drop_caches``, sparkrun's rule); as the login user it is
        ``tee: FILE: Permission denied`` and exit 1, the copy to stdout still made."""
        opts, paths = _split_opts(argv[1:])
        append = "-a" in opts or "--append" in opts
        data = io.stdin or ""
        rc = 0
        for p in paths:
            if p == "/dev/null":
                continue
            if p in ("/dev/stdout", "/dev/stderr"):
                (io.err if p == "/dev/stderr" else io.out)(data)
                continue
            if self.fs.norm(p, self.cwd) == "/proc/sys/vm/drop_caches":
                if not self.account.root:  # type: ignore[attr-defined]
                    io.err(f"tee: {p}: Permission denied\n")
                    rc = 1
                elif data.strip() in ("1", "2", "3"):
                    self.cluster.drop_caches(self.node_name)
                continue
            try:
                real = self.fs.open_write(p, append, self.cwd)
            except FsError as exc:
                io.err(f"tee: {p}: {_why(exc)}\n")
                rc = 1
                continue
            self.fs.append(real, data)
        io.out(data)
        return rc

    async def c_dd(self, argv: list[str], io: IO) -> int:
        """GNU ``dd if=FILE iflag=nocache count=0 [status=none]``: the file's pages leave the page
        cache (coreutils: "when count=0 all cached data for the file"; posix_fadvise DONTNEED, open to
        anyone who may read the file). Copies are not modelled."""
        ops = dict(a.split("=", 1) for a in argv[1:] if "=" in a)
        src = ops.get("if")
        if src is None or "nocache" not in ops.get("iflag", "").split(",") or ops.get("count") != "0" \
                or any(k not in ("if", "iflag", "count", "status") for k in ops):
            io.err("sparksim: only `dd if=FILE iflag=nocache count=0 [status=none]` (evicting a file from "
                   "the page cache) is modelled\n")
            return 1
        path = self.fs.norm(src, self.cwd)
        node = self.fs.lookup(path, True)
        if node is None or node.kind != "file":
            io.err(f"dd: failed to open '{src}': "
                   f"{'No such file or directory' if node is None else 'Is a directory'}\n")
            return 1
        host = node_path(self.fs, path)
        if host:
            self.cluster.evict(self.node_name, host)
        if ops.get("status") != "none":
            io.err("0+0 records in\n0+0 records out\n0 bytes copied, 2.1e-05 s, 0.0 kB/s\n")
        return 0

    async def c_ln(self, argv: list[str], io: IO) -> int:
        opts, paths = _split_opts(argv[1:])
        if len(paths) != 2 or "-s" not in opts:
            io.err("ln: only 'ln -s TARGET LINK' is modelled\n")
            return 1
        target, link = paths
        if "-f" in opts:
            try:
                self.fs.remove(link, cwd=self.cwd)
            except FsError:
                pass
        try:
            self.fs.symlink(target, link, self.cwd)
        except FsError as exc:
            io.err(f"ln: failed to create symbolic link '{link}': {_why(exc)}\n")
            return 1
        return 0

    async def c_mv(self, argv: list[str], io: IO) -> int:
        _opts, paths = _split_opts(argv[1:])
        if len(paths) != 2:
            io.err("mv: missing destination file operand\n")
            return 1
        src, dst = paths
        if self.fs.lookup(src, False, self.cwd) is None:
            io.err(f"mv: cannot stat '{src}': No such file or directory\n")
            return 1
        d = self.fs.lookup(dst, True, self.cwd)
        if d is not None and d.kind == "dir":
            dst = posixpath.join(dst, posixpath.basename(src.rstrip("/")))
        self.fs.rename(self.fs.norm(src, self.cwd), self.fs.norm(dst, self.cwd))
        return 0

    async def c_readlink(self, argv: list[str], io: IO) -> int:
        opts, paths = _split_opts(argv[1:])
        rc = 0
        for p in paths:
            if "-f" in opts or "-e" in opts or "-m" in opts:
                real = self.fs.resolve(p, True, self.cwd)
                if "-e" in opts and self.fs.lookup(real) is None:
                    rc = 1
                    continue
                io.out(real + "\n")
                continue
            ent = self.fs.lookup(p, False, self.cwd)
            if ent is None or ent.kind != "link":
                rc = 1
                continue
            io.out(ent.target + "\n")
        return rc

    async def c_basename(self, argv: list[str], io: IO) -> int:
        if len(argv) < 2:
            io.err("basename: missing operand\n")
            return 1
        b = posixpath.basename(argv[1].rstrip("/")) or "/"
        if len(argv) > 2 and b.endswith(argv[2]) and b != argv[2]:
            b = b[: -len(argv[2])]
        io.out(b + "\n")
        return 0

    async def c_dirname(self, argv: list[str], io: IO) -> int:
        if len(argv) < 2:
            io.err("dirname: missing operand\n")
            return 1
        io.out((posixpath.dirname(argv[1].rstrip("/")) or ".") + "\n")
        return 0

    # ---- find --------------------------------------------------------------------------------

    async def c_find(self, argv: list[str], io: IO) -> int:
        args = argv[1:]
        follow = False
        while args and args[0] in ("-L", "-P", "-H"):
            follow = args.pop(0) == "-L"
        starts: list[str] = []
        while args and not args[0].startswith(("-", "(", "!")):
            starts.append(args.pop(0))
        starts = starts or ["."]
        preds: list[tuple[str, str]] = []
        maxdepth, mindepth = 10**9, 0
        printed = False
        i = 0
        while i < len(args):
            a = args[i]
            val = args[i + 1] if i + 1 < len(args) else None
            if a in ("-type", "-xtype", "-name", "-iname", "-path", "-printf", "-maxdepth", "-mindepth", "-size",
                     "-newer"):
                if val is None:
                    io.err(f"find: missing argument to `{a}'\n")
                    return 1
                if a == "-maxdepth":
                    maxdepth = int(val)
                elif a == "-mindepth":
                    mindepth = int(val)
                else:
                    preds.append((a, val))
                    printed = printed or a == "-printf"
                i += 2
                continue
            if a in ("-print", "-print0"):
                preds.append((a, ""))
                printed = True
            elif a in ("-empty", "-readable"):
                preds.append((a, ""))
            elif a not in ("-a", "-and"):
                io.err(f"find: unknown predicate `{a}'\n")
                return 1
            i += 1
        if not printed:
            preds.append(("-print", ""))
        rc = 0
        for start in starts:
            top = self.fs.norm(start, self.cwd)
            try:
                entries = list(self.fs.walk(top, follow=follow))
            except FsError:
                io.err(f"find: ‘{start}’: No such file or directory\n")
                rc = 1
                continue
            for path, ent in entries:
                rel = path[len(top):].lstrip("/")
                depth = 0 if not rel else rel.count("/") + 1
                if depth > maxdepth or depth < mindepth:
                    continue
                shown = start.rstrip("/") + ("/" + rel if rel else "") if start != "/" else path
                if start == "/" and not rel:
                    shown = "/"
                self._find_eval(path, shown, rel, ent, follow, preds, io)
        return rc

    def _find_eval(self, path: str, shown: str, rel: str, ent: Inode, follow: bool, preds: list[tuple[str, str]],
                   io: IO) -> None:
        letter = {"file": "f", "dir": "d", "link": "l"}
        for op, val in preds:
            if op == "-type":
                if letter[ent.kind] not in val.split(","):
                    return
            elif op == "-xtype":
                if ent.kind == "link" and not follow:
                    tgt = self.fs.lookup(path, True)
                    kind = "l" if tgt is None else letter[tgt.kind]
                elif follow and ent.kind == "link":
                    kind = "l"  # -L: a link still seen as a link is a broken one
                else:
                    kind = letter[ent.kind]
                if kind not in val.split(","):
                    return
            elif op in ("-name", "-iname"):
                import fnmatch

                base = posixpath.basename(path) or "/"
                ok = fnmatch.fnmatchcase(base.lower(), val.lower()) if op == "-iname" else fnmatch.fnmatchcase(
                    base, val)
                if not ok:
                    return
            elif op == "-path":
                import fnmatch

                if not fnmatch.fnmatchcase(shown, val):
                    return
            elif op == "-empty":
                if not ((ent.kind == "file" and ent.nbytes() == 0) or (
                        ent.kind == "dir" and not self.fs.listdir(path))):
                    return
            elif op == "-print":
                io.out(shown + "\n")
            elif op == "-print0":
                io.out(shown + "\0")
            elif op == "-printf":
                io.out(self._printf_find(val, path, shown, rel, ent))

    def _printf_find(self, fmt: str, path: str, shown: str, rel: str, ent: Inode) -> str:
        out: list[str] = []
        i = 0
        letter = {"file": "f", "dir": "d", "link": "l"}
        while i < len(fmt):
            ch = fmt[i]
            if ch == "\\" and i + 1 < len(fmt):
                out.append({"n": "\n", "t": "\t", "0": "\0", "\\": "\\"}.get(fmt[i + 1], fmt[i + 1]))
                i += 2
                continue
            if ch == "%" and i + 1 < len(fmt):
                m = re.match(r"%(-?\d*)([spPlfhyYkb%])", fmt[i:])
                if m:
                    c = m.group(2)
                    width = m.group(1)
                    tgt = self.fs.lookup(path, True) if ent.kind == "link" else ent
                    val = {
                        "s": str(ent.nbytes()), "p": shown, "P": rel, "f": posixpath.basename(path),
                        "h": posixpath.dirname(shown) or ".", "l": ent.target if ent.kind == "link" else "",
                        "y": letter[ent.kind], "Y": "N" if tgt is None else letter[tgt.kind],
                        "k": str(-(-ent.nbytes() // 1024)), "b": str(-(-ent.nbytes() // 512)), "%": "%",
                    }[c]
                    out.append(f"{val:{'<' if width.startswith('-') else '>'}{width.lstrip('-')}}" if width else val)
                    i += len(m.group(0))
                    continue
            out.append(ch)
            i += 1
        return "".join(out)

    # ---- checksums, sizes --------------------------------------------------------------------

    def _sha_of(self, p: str) -> tuple[str, int]:
        ent = self.fs.get_file(p, self.cwd)
        if ent.size is None:
            return hashlib.sha256(ent.read_bytes()).hexdigest(), ent.nbytes()
        if ent.sha256 is not None:
            return ent.sha256, ent.size
        real = self.fs.resolve(p, True, self.cwd)
        return hashlib.sha256(f"partial:{real}:{ent.size}".encode()).hexdigest(), ent.size

    async def c_sha256sum(self, argv: list[str], io: IO) -> int:
        opts, paths = _split_opts(argv[1:])
        if "-c" in opts or "--check" in opts:
            return await self._sha_check(paths, io, quiet="--quiet" in opts)
        rc = 0
        if not paths:
            io.out(hashlib.sha256((io.stdin or "").encode()).hexdigest() + "  -\n")
            return 0
        for p in paths:
            try:
                digest, size = self._sha_of(p)
            except FsError as exc:
                io.err(f"sha256sum: {p}: {_why(exc)}\n")
                rc = 1
                continue
            await self.clock.sleep(size / SHA_BPS)
            io.out(f"{digest}  {p}\n")
        return rc

    async def _sha_check(self, paths: list[str], io: IO, quiet: bool) -> int:
        bad = missing = 0
        for lst in paths or ["-"]:
            text = io.stdin or "" if lst == "-" else None
            if text is None:
                try:
                    text = self.fs.read_text(lst, self.cwd)
                except FsError as exc:
                    io.err(f"sha256sum: {lst}: {_why(exc)}\n")
                    return 1
            for line in text.splitlines():
                m = re.match(r"([0-9a-f]{64}) [ *](.+)$", line)
                if not m:
                    continue
                want, p = m.groups()
                try:
                    digest, size = self._sha_of(p)
                except FsError as exc:
                    io.err(f"sha256sum: {p}: {_why(exc)}\n")
                    io.out(f"{p}: FAILED open or read\n")
                    missing += 1
                    continue
                await self.clock.sleep(size / SHA_BPS)
                if digest == want:
                    if not quiet:
                        io.out(f"{p}: OK\n")
                else:
                    io.out(f"{p}: FAILED\n")
                    bad += 1
        if missing:
            io.err(f"sha256sum: WARNING: {missing} listed file{'s' if missing > 1 else ''} could not be read\n")
        if bad:
            io.err(f"sha256sum: WARNING: {bad} computed checksum{'s' if bad > 1 else ''} did NOT match\n")
        return 1 if bad or missing else 0

    async def c_du(self, argv: list[str], io: IO) -> int:
        opts, paths = _split_opts(argv[1:], ("-d", "--max-depth"))
        apparent = "-b" in opts or "--apparent-size" in opts or "--bytes" in opts
        human = "-h" in opts
        follow = "-L" in opts
        rc = 0
        for p in paths or ["."]:
            try:
                entries = list(self.fs.walk(self.fs.norm(p, self.cwd), follow=follow))
            except FsError:
                io.err(f"du: cannot access '{p}': No such file or directory\n")
                rc = 1
                continue
            seen: set[int] = set()
            total = 0
            for _path, ent in entries:
                if id(ent) in seen:
                    continue
                seen.add(id(ent))
                size = ent.nbytes()
                total += size if apparent else -(-size // 4096) * 4096
            if human:
                io.out(f"{_human(total)}\t{p}\n")
            elif "-b" in opts or "--bytes" in opts:
                io.out(f"{total}\t{p}\n")
            else:
                io.out(f"{-(-total // 1024)}\t{p}\n")
            await asyncio.sleep(0)
        return rc

    async def c_df(self, argv: list[str], io: IO) -> int:
        opts, paths = _split_opts(argv[1:], ("-B", "--block-size"))
        for p in paths:
            if self.fs.lookup(p, True, self.cwd) is None:
                io.err(f"df: {p}: No such file or directory\n")
                return 1
        if "-h" in opts:
            io.out(F.df_h(self.cluster, self.node_name, self.now()))
        else:
            io.out(F.df(self.cluster, self.node_name, self.now()))
        return 0


def _wc_count(flag: str, text: str, size: int) -> int:
    """One of ``wc``'s counts, computed only when asked: ``wc -c`` of a 128 MiB stream splits nothing."""
    if flag == "-l":
        return text.count("\n")
    if flag == "-w":
        return len(text.split())
    return size if flag == "-c" else len(text)
