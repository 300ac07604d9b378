"""``rsync`` between nodes (``[USER@]HOST:DEST`` over ``-e ssh``) or within one node.

What a weight copy depends on is kept: ``-a`` copies symlinks *as links* (so a snapshot
directory's ``-> ../../blobs/...`` links arrive broken when ``blobs/`` is excluded or not sent:
the real pitfall), ``-L``/``--copy-links`` sends what they point to, ``--copy-unsafe-links`` only
for links leaving the tree; ``--exclude PATTERN``; the quick check skips files of the same size
(``--size-only``: size only); a file is written as ``.NAME.XXXXXX`` and renamed when whole;
killed midway, ``--partial`` keeps the cut file under its name and a rerun sends only the rest,
without it the temporary file is deleted. ``--info=progress2`` prints rsync 3.2's whole-transfer
line (``  1,234,567  12%  820.00MB/s    0:02:15 (xfr#3, to-chk=45/52)``, ``\\r`` between updates).
Bytes move at the fast link's rsync-over-ssh rate (or the LAN's, to a LAN address).
"""

from __future__ import annotations

import fnmatch
import posixpath
import re

from sparkconsole.sim.model import LAN_RSYNC_BPS, CacheRamp, stable_hex
from sparkconsole.sim.sh.interp import IO
from sparkconsole.sim.tools.common import _opt_val, _progress2, _ssh_user
from sparkconsole.sim.vfs import VFS, FsError, Inode

STEP_S = 1.0
VERSION = "3.2.7"


TCP_GIVES_UP_S = 924.6  # Linux's default tcp_retries2=15: an established connection's writes time out


class _LinkLost(Exception):
    def __init__(self, host: str) -> None:
        super().__init__(host)
        self.host = host


def _keepalive_s(rsh: str) -> float:
    """How long ``-e 'ssh -o ServerAliveInterval=N -o ServerAliveCountMax=M'`` takes to give up
    on a dead link (N x M seconds; M defaults to 3, as in ssh_config(5)); without a keepalive,
    ssh waits for TCP to give up."""
    opts = dict(re.findall(r"-o\s*(\w+)=(\d+)", rsh))
    interval = int(opts.get("ServerAliveInterval", 0))
    return interval * int(opts.get("ServerAliveCountMax", 3)) if interval else TCP_GIVES_UP_S


def _remote_spec(arg: str) -> tuple[str, str] | None:
    """``(USER@HOST, PATH)`` of rsync's remote-shell spec ``[USER@]HOST:PATH``, else None (a local
    path), as rsync's own ``parse_hostspec`` (options.c) reads it: the host ends at the first ``:``,
    and a ``/`` before any ``:`` makes the argument a local path; an IPv6 host is written in
    brackets, right after the ``@`` ("Note that IPv6 addresses must be enclosed in brackets",
    rsync(1)), which are not part of the host; a bare one is split at its first colon, as real
    rsync does (``fe80::1:/x`` is host ``fe80`` and the daemon syntax ``HOST::MODULE``)."""
    host_start, user = 0, ""
    i = 0
    while i < len(arg):
        ch = arg[i]
        if ch == "/":
            return None
        if ch == ":":
            return user + arg[host_start:i], arg[i + 1:]
        if ch == "@":
            user, host_start = arg[:i + 1], i + 1
        elif ch == "[":
            end = arg.find("]", i)
            if i != host_start or end < 0 or "/" in arg[i:end] or end == i + 1 or arg[end + 1:end + 2] != ":":
                return None
            return user + arg[i + 1:end], arg[end + 2:]
        i += 1
    return None


class RsyncTools:
    """Mixin: ``rsync``."""

    async def c_rsync(self, argv: list[str], io: IO) -> int:
        args = argv[1:]
        flags: set[str] = set()
        rsh = "ssh"
        excludes: list[str] = []
        paths: list[str] = []
        i = 0
        while i < len(args):
            a = args[i]
            if a in ("-e", "--rsh", "--exclude", "--include", "--info", "--partial-dir", "--bwlimit"):
                if a == "--exclude" and i + 1 < len(args):
                    excludes.append(args[i + 1])
                if a in ("-e", "--rsh") and i + 1 < len(args):
                    rsh = args[i + 1]
                i += 2
                continue
            if a.startswith("--"):
                k, _, v = a.partition("=")
                if k == "--exclude":
                    excludes.append(v)
                elif k == "--info":
                    flags.add("progress2" if "progress2" in v else "info")
                else:
                    flags.add(k)
            elif a.startswith("-") and len(a) > 1:
                for ch in a[1:]:
                    if ch == "e":
                        i += 1  # the -e value follows
                        rsh = args[i] if i < len(args) else rsh
                        break
                    flags.add("-" + ch)
            else:
                paths.append(a)
            i += 1
        if len(paths) < 2:
            io.err(f"rsync  version {VERSION}  protocol version 31\nusage: rsync [OPTION]... SRC [SRC]... DEST\n"
                   "rsync error: syntax or usage error (code 1) at main.c(1795) [client=3.2.7]\n")
            return 1
        recursive = "-a" in flags or "-r" in flags or "--recursive" in flags or "--archive" in flags
        links = "-a" in flags or "-l" in flags or "--links" in flags or "--archive" in flags
        deref = "-L" in flags or "--copy-links" in flags
        unsafe = "--copy-unsafe-links" in flags
        partial = "--partial" in flags or "-P" in flags
        size_only = "--size-only" in flags
        progress2 = "progress2" in flags
        src, dest = paths[0], paths[-1]
        host = None
        remote = _remote_spec(dest)
        if remote is not None:
            host, dest = remote
            if dest.startswith(":"):  # HOST::MODULE: the rsync daemon, not modelled
                io.err(f"rsync: failed to connect to {host.split('@')[-1]}: Connection refused (111)\n"
                       f"rsync error: error in socket IO (code 10) at clientserver.c(139) [sender={VERSION}]\n")
                return 10
        dst_node = self.node if host is None else self._resolve(host)  # type: ignore[attr-defined]
        if dst_node is None:
            h = (host or "").split("@")[-1]
            port = _opt_val(rsh.split()[1:], "-p", "22")  # the remote shell's own port (-e 'ssh -p N')
            await self.clock.sleep(3.0)
            io.err(f"ssh: connect to host {h} port {port}: No route to host\r\nrsync: connection unexpectedly closed "
                   "(0 bytes received so far) [sender]\nrsync error: unexplained error (code 255) at io.c(232) "
                   f"[sender={VERSION}]\n")
            return 255
        dest_home = self.cwd
        if host is not None:  # over ssh: the far side's sshd decides who logs in (-e 'ssh -l USER' too)
            user, h = _ssh_user(rsh.split()[1:], host)
            refused = self.ssh_refusal(dst_node, user, h)  # type: ignore[attr-defined]
            if refused is not None:
                await self.clock.sleep(0.2)
                io.err(f"{refused}rsync: connection unexpectedly closed (0 bytes received so far) [sender]\n"
                       f"rsync error: unexplained error (code 255) at io.c(232) [sender={VERSION}]\n")
                return 255
            who = user or self.account.user  # type: ignore[attr-defined]
            dest_home = "/root" if who == "root" else self.cluster.login(dst_node.name).home
        sfs: VFS = self.fs
        dfs: VFS = self.cluster.fs(dst_node.name)
        src_top = sfs.norm(src, self.cwd)
        if sfs.lookup(src_top, True) is None:
            io.err(f'rsync: [sender] change_dir "{src_top}" failed: No such file or directory (2)\n'
                   f"rsync error: some files/attrs were not transferred (see previous errors) (code 23) at "
                   f"main.c(1338) [sender={VERSION}]\n")
            return 23
        dest_top = dfs.norm(dest or ".", dest_home)  # HOST:relative is under the far user's home
        src_is_dir = (sfs.lookup(src_top, True) or Inode("file")).kind == "dir"
        if src_is_dir and not src.endswith("/"):
            dest_top = posixpath.join(dest_top, posixpath.basename(src_top))
        if src_is_dir and not recursive:
            io.out(f"skipping directory {src}\n")
            return 0
        try:
            if dfs.lookup(dest_top, True) is None:
                dfs.mkdir(dest_top, parents=False)
        except FsError as exc:
            io.err(f'rsync: [Receiver] mkdir "{dest_top}" failed: {exc.reason} (2)\n'
                   f"rsync error: error in file IO (code 11) at main.c(791) [Receiver={VERSION}]\n")
            return 11

        # the file list, as the sender builds it
        plan: list[tuple[str, str, Inode]] = []  # (relative path, kind to create, source entry)
        errors: list[str] = []
        entries = list(sfs.walk(src_top, follow=False)) if src_is_dir else [(src_top, sfs.lookup(src_top, True))]
        skip_dirs: list[str] = []
        for path, ent in entries:
            assert ent is not None
            rel = path[len(src_top):].lstrip("/") if src_is_dir else posixpath.basename(src_top)
            if not rel:
                continue
            if any(rel == d or rel.startswith(d + "/") for d in skip_dirs):
                continue
            base = posixpath.basename(rel)
            if any(_excluded(rel, base, ent, pat) for pat in excludes):
                if ent.kind == "dir":
                    skip_dirs.append(rel)
                continue
            if ent.kind == "link":
                target_abs = sfs.norm(ent.target, posixpath.dirname(path))
                outside = not (target_abs + "/").startswith(src_top.rstrip("/") + "/")
                if deref or (unsafe and outside):
                    real = sfs.lookup(path, True)
                    if real is None:
                        errors.append(f'symlink has no referent: "{path}"')
                        continue
                    plan.append((rel, real.kind, real))
                elif links:
                    plan.append((rel, "link", ent))
                else:
                    io.out(f'skipping non-regular file "{rel}"\n')
                continue
            plan.append((rel, ent.kind, ent))
        files = [p for p in plan if p[1] == "file"]
        total = sum(e.nbytes() for _r, _k, e in files)
        fast = host is not None and host.split("@")[-1] in (dst_node.fast_ip, dst_node.fast_ip2)
        rate = self.cluster.fast_bps if fast or host is None else LAN_RSYNC_BPS
        await self.clock.sleep(0.3 if host is None else self.cluster.peer_ssh_s + 0.15)  # the file lists (+ ssh)

        # transfers
        todo: list[tuple[str, Inode, int]] = []  # (rel, source entry, bytes already there)
        for rel, kind, ent in plan:
            dpath = posixpath.join(dest_top, rel)
            if kind == "dir":
                if dfs.lookup(dpath, False) is None:
                    dfs.mkdir(dpath, parents=True)
                continue
            if kind == "link":
                have = dfs.lookup(dpath, False)
                if have is not None and have.kind == "link" and have.target == ent.target:
                    continue
                if have is not None:
                    dfs.remove(dpath, recursive=True)
                dfs.symlink(ent.target, dpath)
                continue
            have = dfs.lookup(dpath, False)
            if have is not None and have.kind == "file" and have.nbytes() == ent.nbytes() and (
                    size_only or have.sha256 == ent.sha256 or (ent.size is None and have.text == ent.text)):
                continue
            basis = have.nbytes() if have is not None and have.kind == "file" and partial else 0
            todo.append((rel, ent, basis))
        n_files = len(plan)
        sent_before = total - sum(e.nbytes() for _r, e, _b in todo)
        t0 = self.now()
        wire = sum(e.nbytes() - b for _r, e, b in todo)
        ramps = [CacheRamp(self.node_name, t0, t0 + wire / rate, wire, path=src_top)]
        if dst_node.name != self.node_name:
            ramps.append(CacheRamp(dst_node.name, t0, t0 + wire / rate, wire, path=dest_top))
        self.cluster.cache_ramps.extend(ramps)
        moved = 0
        xfr = 0

        def line(done: bool = False) -> str:
            el = max(1e-6, self.now() - t0)
            got = sent_before + moved
            pct = int(100 * got / total) if total else 100
            speed = moved / el if moved else 0.0
            when = el if done else (wire - moved) / rate
            chk = f" (xfr#{xfr}, to-chk={n_files - (n_files if done else _checked(plan, todo, xfr))}/{n_files})" \
                if xfr else ""
            return f"{_progress2(got, pct, speed, when)}{chk}"

        dead_after = _keepalive_s(rsh)
        try:
            for rel, ent, basis in todo:
                dpath = posixpath.join(dest_top, rel)
                tmp = posixpath.join(posixpath.dirname(dpath), f".{posixpath.basename(dpath)}."
                                     f"{stable_hex(6, dpath, self.now())}")
                if ent.size is None:
                    dfs.write_text(tmp, ent.text)
                    dent = dfs.lookup(tmp, False)
                else:
                    dent = dfs.put_blob(tmp, basis, None)
                assert dent is not None
                try:
                    got = basis
                    size = ent.nbytes()
                    while got < size:
                        if host is not None and self._resolve(host) is None:  # type: ignore[attr-defined]
                            # the link went dead mid-file: ssh notices when its keepalive goes
                            # unanswered (or TCP gives up), and the pass ends with the cut file
                            await self.clock.sleep(dead_after)
                            if self._resolve(host) is None:  # type: ignore[attr-defined]
                                raise _LinkLost(host.split("@")[-1])
                        step = min(STEP_S, (size - got) / rate)
                        before = self.now()
                        await self.clock.sleep(step)
                        n = min(size - got, max(1, int((self.now() - before) * rate)))
                        got += n
                        moved += n
                        if dent.size is not None:
                            dent.size = got
                        if progress2 and step >= STEP_S - 1e-9:
                            io.out(line() + "\r")
                except BaseException:
                    if partial and dent.size is not None:
                        dfs.rename(tmp, dpath)  # --partial: the cut file stays, a rerun resumes it
                    else:
                        dfs.remove(tmp)
                    raise
                dent.sha256 = ent.sha256
                if dfs.lookup(dpath, False) is not None:
                    dfs.remove(dpath, recursive=True)
                dfs.rename(tmp, dpath)
                xfr += 1
                if progress2:
                    io.out(line() + "\r")
        except _LinkLost as lost:
            io.err(f"Timeout, server {lost.host} not responding.\r\nrsync: connection unexpectedly closed "
                   f"({moved // 1000} bytes received so far) [sender]\nrsync error: unexplained error (code 255) "
                   f"at io.c(232) [sender={VERSION}]\n")
            return 255
        finally:
            if moved < wire:
                for r in ramps:
                    r.t1 = max(r.t0 + 1e-6, self.now())
                    r.nbytes = moved
        if progress2:
            io.out(line(done=True) + "\n")
        if errors:
            for e in errors:
                io.err(f"{e}\n")
            io.err("rsync error: some files/attrs were not transferred (see previous errors) (code 23) at "
                   f"main.c(1338) [sender={VERSION}]\n")
            return 23
        return 0


def _checked(plan: list, todo: list, xfr: int) -> int:
    """How many file-list entries rsync has gone through after ``xfr`` transfers (progress2's to-chk)."""
    if not todo:
        return len(plan)
    rels = [r for r, _e, _b in todo]
    last = rels[min(xfr, len(rels)) - 1]
    return next((k + 1 for k, p in enumerate(plan) if p[0] == last), len(plan))


def _excluded(rel: str, base: str, ent: Inode, pat: str) -> bool:
    dir_only = pat.endswith("/")
    p = pat.rstrip("/")
    if dir_only and ent.kind != "dir":
        return False
    if p.startswith("/"):
        return fnmatch.fnmatchcase(rel, p.lstrip("/"))
    if "/" in p:
        return fnmatch.fnmatchcase(rel, p) or fnmatch.fnmatchcase(rel, "*/" + p)
    return fnmatch.fnmatchcase(base, p)
