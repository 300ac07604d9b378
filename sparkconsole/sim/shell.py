"""The command emulator: what a simulated Spark's shell does with the command an exec channel sends.

The command line is split with :mod:`shlex` (``;``, ``&&``, ``||``, ``|``, ``&`` and the
redirections ``>``, ``>>``, ``<``, ``2>&1``, ``2>/dev/null`` are understood; no ``$(...)``, loops or
variables other than ``$HOME``), and the prefixes ``sudo [-n]``, ``timeout [-k N] N``, ``env K=V``,
``K=V``, ``nohup`` and ``sh|bash -c STRING`` are peeled off. An unknown command fails like dash:
``sh: 1: foo: not found`` on stderr, exit 127.

What it answers (read-only): ``hostname``, ``uname``, ``nproc``, ``cat``/``grep``/``head``/``tail``/
``wc`` over a few virtual files (``/proc/meminfo``, ``/proc/uptime``, ``/proc/loadavg``,
``/sys/class/infiniband/*/ports/*/{state,rate,phys_state}``, ``/sys/class/net/*/...``),
``free [-b|-h]``, ``df [-B1 -P|-h]``, ``lscpu``, ``nvidia-smi`` (table, ``-L``,
``--query-gpu=...``, ``--query-compute-apps=...``, ``--format=csv[,noheader][,nounits]``),
``ibdev2netdev``, ``ip -j addr``, ``ip addr [show IF]``, ``ip -br link``, ``ethtool IF``,
``ping -c N IP``, ``docker ps|stats|images|version|logs [--tail N] [-f] [-t]``, ``ray status``,
``systemctl is-active|status``, ``journalctl -u UNIT [-n N] [-f]``, ``command -v``, ``which``,
``curl`` to a local vLLM server (``/health``, ``/v1/models``, ``/v1/chat/completions``).

The deploy commands it supports (the whole mutating surface, kept small on purpose):

=================================================================  ==========================================
command                                                            effect
=================================================================  ==========================================
``docker stop|start|restart|rm [-f] NAME``                          container lifecycle (memory freed on stop)
``sudo -n sh -c 'sync; echo 3 > /proc/sys/vm/drop_caches'``        page cache emptied
``sudo -n systemctl stop|start|restart UNIT``                      unit state
``hf download REPO`` (``huggingface-cli download``)                 internet download, head only (tqdm bars)
``rsync -a --info=progress2 SRC_MODEL_DIR IP:DEST_DIR/``           copy weights to the node owning IP
``docker save IMAGE | ssh IP docker load``                         copy an image to the node owning IP
``docker pull IMAGE``                                              head only (internet)
``docker run -d --name N [opts] IMAGE [CMD...]``                   CMD: ``vllm serve MODEL ...``,
                                                                   ``ray start --block ...``, anything else
``docker exec [-d] NAME vllm serve MODEL ...``                     a vLLM server inside a running container
``docker exec NAME ray status|start|stop ...``                     Ray inside the container
``ray start --head --node-ip-address=IP [--port=6379]``            start a Ray head on this node
``ray start --address=IP:6379 [--node-ip-address=IP]``             join it (needs the fast link)
``ray stop``                                                       leave / stop the Ray cluster
``ssh [opts] [USER@]HOST CMD``                                     run CMD on the node owning HOST
=================================================================  ==========================================

``vllm serve`` flags honoured: ``--tensor-parallel-size/-tp``, ``--gpu-memory-utilization``,
``--max-model-len``, ``--port``, ``--host``, ``--served-model-name``, ``--reasoning-parser``,
``--distributed-executor-backend``, ``--enforce-eager``, ``--load-format``, ``--kv-cache-dtype``;
others are accepted and shown in ``non-default args``. Ray is modelled on the host as well as in
containers (a simplification: both see the same cluster), so the probe's ``ray status`` sees it.
"""

from __future__ import annotations

import asyncio
import fnmatch
import re
import shlex
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from sparkconsole.sim import formats as F
from sparkconsole.sim import vllm_logs
from sparkconsole.sim.model import (
    FAST_LINK_RSYNC_BPS,
    IMAGE_COPY_BPS,
    IMAGES,
    INTERNET_BPS,
    LAN_RSYNC_BPS,
    MODELS,
    CacheRamp,
    Container,
    LogLine,
    RayCluster,
    RayMember,
    SimCluster,
    SimNode,
    Transfer,
    model_dir,
    stable_hex,
    stable_int,
)

Writer = Callable[[str], None]

KNOWN_TOOLS = {
    "hostname": "/usr/bin/hostname", "uname": "/usr/bin/uname", "nproc": "/usr/bin/nproc", "cat": "/usr/bin/cat",
    "grep": "/usr/bin/grep", "head": "/usr/bin/head", "tail": "/usr/bin/tail", "wc": "/usr/bin/wc",
    "echo": "/usr/bin/echo", "sleep": "/usr/bin/sleep", "timeout": "/usr/bin/timeout", "free": "/usr/bin/free",
    "df": "/usr/bin/df", "lscpu": "/usr/bin/lscpu", "nvidia-smi": "/usr/bin/nvidia-smi",
    "ibdev2netdev": "/usr/bin/ibdev2netdev", "ip": "/usr/sbin/ip", "ethtool": "/usr/sbin/ethtool",
    "ping": "/usr/bin/ping", "docker": "/usr/bin/docker", "ray": "/usr/local/bin/ray", "hf": "/usr/local/bin/hf",
    "huggingface-cli": "/usr/local/bin/huggingface-cli", "rsync": "/usr/bin/rsync", "ssh": "/usr/bin/ssh",
    "curl": "/usr/bin/curl", "systemctl": "/usr/bin/systemctl", "journalctl": "/usr/bin/journalctl",
    "sync": "/usr/bin/sync", "sh": "/usr/bin/sh", "bash": "/usr/bin/bash", "sudo": "/usr/bin/sudo",
    "env": "/usr/bin/env", "true": "/usr/bin/true", "false": "/usr/bin/false", "ls": "/usr/bin/ls",
    "du": "/usr/bin/du", "nohup": "/usr/bin/nohup", "uptime": "/usr/bin/uptime", "printf": "/usr/bin/printf",
}

LSCPU = """Architecture:                            aarch64
CPU op-mode(s):                          64-bit
Byte Order:                              Little Endian
CPU(s):                                  20
On-line CPU(s) list:                     0-19
Vendor ID:                               ARM
Model name:                              Cortex-X925
Model:                                   1
Thread(s) per core:                      1
Core(s) per socket:                      10
Socket(s):                               1
Stepping:                                r0p1
Frequency boost:                         disabled
CPU(s) scaling MHz:                      100%
CPU max MHz:                             3900.0000
CPU min MHz:                             1378.0000
BogoMIPS:                                2000.00
Model name:                              Cortex-A725
Model:                                   1
Thread(s) per core:                      1
Core(s) per socket:                      10
Socket(s):                               1
Stepping:                                r0p1
CPU(s) scaling MHz:                      100%
"""

UNITS_DEFAULT = {"docker": "active", "ssh": "active", "nvidia-persistenced": "active",
                 "nvidia-dgx-dashboard": "active", "ollama": "inactive"}


@dataclass
class IO:
    out: Writer
    err: Writer
    stdin: str | None = None


class Capture:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def __call__(self, s: str) -> None:
        self.parts.append(s)

    def text(self) -> str:
        return "".join(self.parts)


class ShellExit(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


class Shell:
    """One node's shell. ``run`` executes a command line; output goes to the writers as it comes."""

    def __init__(self, cluster: SimCluster, node: str) -> None:
        self.cluster = cluster
        self.node_name = node
        self._jobs: set[asyncio.Future[int]] = set()
        if not hasattr(cluster, "units"):
            cluster.units = {}  # type: ignore[attr-defined]
        cluster.units.setdefault(node, dict(UNITS_DEFAULT))  # type: ignore[attr-defined]

    @property
    def node(self) -> SimNode:
        return self.cluster.node(self.node_name)

    @property
    def clock(self):
        return self.cluster.clock

    def now(self) -> float:
        return self.cluster.now()

    # ---- public ------------------------------------------------------------------------------

    async def run(self, cmdline: str, out: Writer, err: Writer, stdin: str | None = None) -> int:
        try:
            return await self._run_list(cmdline, IO(out, err, stdin))
        except ShellExit as e:
            return e.code

    async def capture(self, cmdline: str, stdin: str | None = None) -> tuple[str, str, int]:
        o, e = Capture(), Capture()
        rc = await self.run(cmdline, o, e, stdin)
        return o.text(), e.text(), rc

    # ---- parsing -----------------------------------------------------------------------------

    @staticmethod
    def tokenize(cmdline: str) -> list[str]:
        lex = shlex.shlex(cmdline, posix=True, punctuation_chars=";&|<>")
        lex.whitespace_split = True
        lex.commenters = ""
        return list(lex)

    async def _run_list(self, cmdline: str, io: IO) -> int:
        try:
            toks = self.tokenize(cmdline)
        except ValueError as exc:
            io.err(f"sh: 1: Syntax error: {exc}\n")
            return 2
        rc = 0
        seq: list[tuple[list[str], str]] = []
        cur: list[str] = []
        for tok in toks:
            if tok in (";", "&&", "||", "&"):
                seq.append((cur, tok))
                cur = []
            elif tok == ";;":
                seq.append((cur, ";"))
                cur = []
            else:
                cur.append(tok)
        if cur:
            seq.append((cur, ";"))
        skip_next = False
        prev_op = ";"
        for words, op in seq:
            if not words:
                prev_op = op
                continue
            if skip_next:
                skip_next = False
            elif (prev_op == "&&" and rc != 0) or (prev_op == "||" and rc == 0):
                pass
            elif op == "&":
                job = asyncio.ensure_future(self._run_pipeline(words, IO(lambda s: None, lambda s: None, None)))
                self._jobs.add(job)
                job.add_done_callback(self._jobs.discard)
                rc = 0
            else:
                rc = await self._run_pipeline(words, io)
            prev_op = op
        return rc

    async def _run_pipeline(self, words: list[str], io: IO) -> int:
        stages: list[list[str]] = [[]]
        for w in words:
            if w == "|":
                stages.append([])
            else:
                stages[-1].append(w)
        if any(not s for s in stages):
            io.err("sh: 1: Syntax error: \"|\" unexpected\n")
            return 2
        if len(stages) == 2 and self._strip(stages[0])[:2] == ["docker", "save"]:
            right = self._strip(stages[1])
            if right and right[0] == "ssh":
                return await self._image_copy(self._strip(stages[0]), right, io)
        data = io.stdin
        rc = 0
        for i, stage in enumerate(stages):
            last = i == len(stages) - 1
            if last:
                rc = await self._run_simple(stage, IO(io.out, io.err, data))
            else:
                cap = Capture()
                rc = await self._run_simple(stage, IO(cap, io.err, data))
                data = cap.text()
        return rc

    def _strip(self, words: list[str]) -> list[str]:
        """Peel prefixes (sudo, timeout, env, VAR=, nohup) and redirections off a simple command."""
        argv, _ = self._redirs(words)
        return self._peel(argv)

    @staticmethod
    def _peel(argv: list[str]) -> list[str]:
        while argv:
            a = argv[0]
            if a == "sudo":
                argv = argv[1:]
                while argv and argv[0].startswith("-"):
                    argv = argv[1:] if argv[0] not in ("-u",) else argv[2:]
            elif a == "timeout":
                argv = argv[1:]
                while argv and argv[0].startswith("-"):
                    argv = argv[2:] if argv[0] in ("-k", "-s") else argv[1:]
                argv = argv[1:]  # the duration
            elif a == "env":
                argv = argv[1:]
                while argv and ("=" in argv[0] or argv[0].startswith("-")):
                    argv = argv[1:]
            elif a == "nohup" or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", a):
                argv = argv[1:]
            else:
                break
        return argv

    @staticmethod
    def _redirs(words: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
        argv: list[str] = []
        red: list[tuple[str, str]] = []
        i = 0
        while i < len(words):
            w = words[i]
            nxt = words[i + 1] if i + 1 < len(words) else None
            if w in (">", ">>", "<", ">&") and nxt is not None:
                fd = "1"
                if argv and argv[-1] in ("1", "2") and i > 0:
                    fd = argv.pop()
                red.append((fd + w, nxt))
                i += 2
                continue
            if w == "&" and nxt == ">":  # &> file (bash)
                red.append(("&>", words[i + 2] if i + 2 < len(words) else "/dev/null"))
                i += 3
                continue
            argv.append(w)
            i += 1
        return argv, red

    async def _run_simple(self, words: list[str], io: IO) -> int:
        argv, red = self._redirs(words)
        out, err, stdin = io.out, io.err, io.stdin
        sink: list[tuple[str, Capture, bool]] = []
        for op, target in red:
            if op in ("2>&", "1>&") or op.endswith(">&"):
                if op.startswith("2") and target == "1":
                    err = out
                elif op.startswith("1") and target == "2":
                    out = err
            elif op.endswith("<"):
                content = self._read_file(target)
                if content is None:
                    io.err(f"sh: 1: cannot open {target}: No such file\n")
                    return 2
                stdin = content
            else:
                cap = Capture()
                if op.startswith("2"):
                    err = cap
                elif op == "&>":
                    out = err = cap
                else:
                    out = cap
                sink.append((target, cap, ">>" in op))
        argv = [self._expand_home(a) for a in argv]
        argv = self._glob(argv)
        rc = await self._dispatch(argv, IO(out, err, stdin))
        for target, cap, append in sink:
            rc2 = self._write_file(target, cap.text(), append, io.err)
            if rc2:
                rc = rc2
        return rc

    @staticmethod
    def _expand_home(a: str) -> str:
        a = a.replace("$HOME", "/root")
        if a == "~" or a.startswith("~/"):
            return "/root" + a[1:]
        return a

    def _glob(self, argv: list[str]) -> list[str]:
        out: list[str] = []
        files = None
        for a in argv:
            if a.startswith("/") and any(ch in a for ch in "*?["):
                if files is None:
                    files = sorted(F.sysfs_files(self.cluster, self.node_name, self.now()))
                segs = a.split("/")
                hits = [f for f in files if len(f.split("/")) == len(segs)
                        and all(fnmatch.fnmatchcase(x, p) for x, p in zip(f.split("/"), segs, strict=True))]
                out.extend(hits or [a])
            else:
                out.append(a)
        return out

    def _read_file(self, path: str) -> str | None:
        files = F.sysfs_files(self.cluster, self.node_name, self.now())
        return files.get(path)

    def _write_file(self, path: str, text: str, append: bool, err: Writer) -> int:
        if path == "/dev/null":
            return 0
        if path == "/proc/sys/vm/drop_caches":
            if text.strip() in ("1", "3"):
                self.cluster.drop_caches(self.node_name)
            return 0
        if path.startswith(("/proc/", "/sys/")):
            err(f"sh: 1: cannot create {path}: Permission denied\n")
            return 2
        files = self.node.files
        files[path] = (files.get(path, "") if append else "") + text
        return 0

    # ---- dispatch ----------------------------------------------------------------------------

    async def _dispatch(self, argv: list[str], io: IO) -> int:
        argv = self._peel(argv)
        if not argv:
            return 0
        name = argv[0]
        if name in ("sh", "bash", "/bin/sh", "/bin/bash") and len(argv) >= 3 and argv[1] in ("-c", "-lc"):
            return await self._run_list(argv[2], io)
        handler: Callable[[list[str], IO], Awaitable[int]] | None = getattr(
            self, "c_" + name.replace("-", "_").replace("/", "_"), None)
        if handler is None or name.startswith("_"):
            io.err(f"sh: 1: {name}: not found\n")
            return 127
        return await handler(argv, io)

    # ---- simple tools ------------------------------------------------------------------------

    async def c_true(self, argv: list[str], io: IO) -> int:
        return 0

    async def c_false(self, argv: list[str], io: IO) -> int:
        return 1

    async def c_exit(self, argv: list[str], io: IO) -> int:
        raise ShellExit(int(argv[1]) if len(argv) > 1 and argv[1].isdigit() else 0)

    async def c_sync(self, argv: list[str], io: IO) -> int:
        return 0

    async def c_echo(self, argv: list[str], io: IO) -> int:
        args = argv[1:]
        nl = True
        if args and args[0] == "-n":
            nl, args = False, args[1:]
        io.out(" ".join(args) + ("\n" if nl else ""))
        return 0

    async def c_printf(self, argv: list[str], io: IO) -> int:
        if len(argv) < 2:
            return 1
        fmt = argv[1].replace("\\n", "\n").replace("\\t", "\t")
        try:
            io.out(fmt.replace("%s", "{}").format(*argv[2:]) if "%s" in fmt else fmt)
        except IndexError:
            io.out(fmt)
        return 0

    async def c_hostname(self, argv: list[str], io: IO) -> int:
        if "-I" in argv:
            io.out(" ".join(ip for ip in self.node.ips() if not ip.startswith("127.")) + " \n")
        else:
            io.out(self.node_name + "\n")
        return 0

    async def c_uname(self, argv: list[str], io: IO) -> int:
        flags = "".join(a.lstrip("-") for a in argv[1:] if a.startswith("-"))
        io.out(F.kernel_uname(self.node_name, flags))
        return 0

    async def c_nproc(self, argv: list[str], io: IO) -> int:
        io.out("20\n")
        return 0

    async def c_lscpu(self, argv: list[str], io: IO) -> int:
        io.out(LSCPU)
        return 0

    async def c_uptime(self, argv: list[str], io: IO) -> int:
        a, b, c = self.cluster.load_avg(self.node_name)
        up = self.cluster.uptime(self.node_name)
        clock = time.strftime("%H:%M:%S", time.gmtime(self.clock.epoch()))
        d, rem = divmod(int(up), 86400)
        io.out(f" {clock} up {d} day{'s' if d != 1 else ''}, {rem // 3600}:{rem % 3600 // 60:02d},  2 users,  "
               f"load average: {a:.2f}, {b:.2f}, {c:.2f}\n")
        return 0

    async def c_sleep(self, argv: list[str], io: IO) -> int:
        try:
            secs = float(argv[1].rstrip("s"))
        except (IndexError, ValueError):
            io.err("sleep: invalid time interval\n")
            return 1
        await self.clock.sleep(secs)
        return 0

    async def c_command(self, argv: list[str], io: IO) -> int:
        if len(argv) >= 3 and argv[1] == "-v":
            path = KNOWN_TOOLS.get(argv[2])
            if path:
                io.out(path + "\n")
                return 0
            return 1
        return await self._dispatch(argv[1:], io)

    async def c_which(self, argv: list[str], io: IO) -> int:
        rc = 0
        for a in argv[1:]:
            if a in KNOWN_TOOLS:
                io.out(KNOWN_TOOLS[a] + "\n")
            else:
                rc = 1
        return rc

    async def c_cat(self, argv: list[str], io: IO) -> int:
        files = F.sysfs_files(self.cluster, self.node_name, self.now())
        rc = 0
        if len(argv) == 1:
            io.out(io.stdin or "")
            return 0
        for p in argv[1:]:
            if p in files:
                io.out(files[p])
            else:
                io.err(f"cat: {p}: No such file or directory\n")
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
            files = F.sysfs_files(self.cluster, self.node_name, self.now())
            for p in paths:
                if p in files:
                    sources.append((p, files[p]))
                else:
                    io.err(f"grep: {p}: No such file or directory\n")
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

    async def c_head(self, argv: list[str], io: IO) -> int:
        n = _count_arg(argv, 10)
        lines = (io.stdin or "").splitlines(keepends=True)
        io.out("".join(lines[:n]))
        return 0

    async def c_tail(self, argv: list[str], io: IO) -> int:
        n = _count_arg(argv, 10)
        lines = (io.stdin or "").splitlines(keepends=True)
        io.out("".join(lines[-n:] if n else []))
        return 0

    async def c_wc(self, argv: list[str], io: IO) -> int:
        text = io.stdin or ""
        if "-l" in argv:
            io.out(f"{text.count(chr(10))}\n")
        else:
            io.out(f"{text.count(chr(10)):>7} {len(text.split()):>7} {len(text.encode()):>7}\n")
        return 0

    async def c_ls(self, argv: list[str], io: IO) -> int:
        paths = [a for a in argv[1:] if not a.startswith("-")] or ["/root"]
        rc = 0
        for p in paths:
            p = p.rstrip("/")
            if p.endswith("/.cache/huggingface/hub"):
                repos = [r for r in MODELS if self.cluster.model_bytes(self.node_name, r) > 0]
                io.out("".join(model_dir(r).rsplit("/", 1)[1] + "\n" for r in repos))
            elif p in ("/root", "/root/.cache", "/root/.cache/huggingface"):
                io.out({"/root": ".cache\n", "/root/.cache": "huggingface\n", "/root/.cache/huggingface": "hub\n"}[p])
            else:
                io.err(f"ls: cannot access '{p}': No such file or directory\n")
                rc = 2
        return rc

    async def c_du(self, argv: list[str], io: IO) -> int:
        paths = [a for a in argv[1:] if not a.startswith("-")]
        rc = 0
        for p in paths:
            repo = _repo_of_path(p)
            b = self.cluster.model_bytes(self.node_name, repo) if repo else 0
            if not b:
                io.err(f"du: cannot access '{p}': No such file or directory\n")
                rc = 1
                continue
            if "-sh" in argv or "-h" in argv or "-hs" in argv:
                io.out(f"{b / 1024**3:.0f}G\t{p}\n")
            else:
                io.out(f"{b // 1024}\t{p}\n")
        return rc

    async def c_free(self, argv: list[str], io: IO) -> int:
        io.out(F.free_b(self.cluster, self.node_name, self.now(), human="-h" in argv))
        return 0

    async def c_df(self, argv: list[str], io: IO) -> int:
        if "-h" in argv:
            io.out(F.df_h(self.cluster, self.node_name, self.now()))
        else:
            io.out(F.df(self.cluster, self.node_name, self.now()))
        return 0

    # ---- GPU, links --------------------------------------------------------------------------

    async def c_nvidia_smi(self, argv: list[str], io: IO) -> int:
        t = self.now()
        fmt = next((a.split("=", 1)[1] for a in argv if a.startswith("--format=")), None)
        header = not (fmt and "noheader" in fmt)
        units = not (fmt and "nounits" in fmt)
        for a in argv[1:]:
            if a.startswith("--query-gpu="):
                if not fmt or "csv" not in fmt:
                    io.err('"--format=" switch is missing. Please try again.\n')
                    return 2
                text, rc = F.query_gpu(self.cluster, self.node_name, t, a.split("=", 1)[1].split(","), header, units)
                (io.out if rc == 0 else io.err)(text)
                return rc
            if a.startswith("--query-compute-apps="):
                text, rc = F.query_compute_apps(self.cluster, self.node_name, t, a.split("=", 1)[1].split(","),
                                                header, units)
                (io.out if rc == 0 else io.err)(text)
                return rc
        if "-L" in argv:
            io.out(F.nvidia_smi_L(self.cluster, self.node_name))
            return 0
        io.out(F.nvidia_smi(self.cluster, self.node_name, t))
        return 0

    async def c_ibdev2netdev(self, argv: list[str], io: IO) -> int:
        io.out(F.ibdev2netdev(self.cluster, self.node_name))
        return 0

    async def c_ip(self, argv: list[str], io: IO) -> int:
        args = argv[1:]
        js = "-j" in args or "-json" in args
        br = "-br" in args or "-brief" in args
        args = [a for a in args if not a.startswith("-")]
        obj = args[0] if args else ""
        if obj in ("a", "addr", "address"):
            if js:
                io.out(F.ip_j_addr(self.cluster, self.node_name))
                return 0
            only = None
            if len(args) >= 3 and args[1] in ("show", "s", "dev"):
                only = args[-1]
            text, rc = F.ip_addr(self.cluster, self.node_name, only)
            (io.out if rc == 0 else io.err)(text)
            return rc
        if obj in ("l", "link"):
            if br:
                io.out(F.ip_br_link(self.cluster, self.node_name))
                return 0
            text, rc = F.ip_addr(self.cluster, self.node_name, args[-1] if len(args) >= 3 else None)
            io.out("".join(ln + "\n" for ln in text.splitlines() if not ln.startswith(("    inet", "       valid"))))
            return rc
        io.err(f'Object "{obj}" is unknown, try "ip help".\n')
        return 255

    async def c_ethtool(self, argv: list[str], io: IO) -> int:
        ifs = [a for a in argv[1:] if not a.startswith("-")]
        if not ifs:
            io.err("ethtool: bad command line argument(s)\n")
            return 1
        text, rc = F.ethtool(self.cluster, self.node_name, ifs[0])
        (io.out if rc == 0 else io.err)(text)
        return rc

    async def c_ping(self, argv: list[str], io: IO) -> int:
        count = _opt_val(argv, "-c", "4")
        target = [a for a in argv[1:] if not a.startswith("-") and a != count][-1:]
        if not target:
            io.err("ping: usage error: Destination address required\n")
            return 1
        ip = target[0]
        n = int(count)
        dst = self.cluster.reachable(self.node, ip) if ip not in self.node.ips() else self.node
        io.out(f"PING {ip} ({ip}) 56(84) bytes of data.\n")
        ok = 0
        for k in range(n):
            await self.clock.sleep(1.0 if k else 0.0)
            if dst is not None:
                fast = ip in (dst.fast_ip, dst.fast_ip2)
                ms = (0.112 if fast else 0.286) + 0.02 * k % 0.05
                io.out(f"64 bytes from {ip}: icmp_seq={k + 1} ttl=64 time={ms:.3f} ms\n")
                ok += 1
        loss = 100 - ok * 100 // max(n, 1)
        io.out(f"\n--- {ip} ping statistics ---\n{n} packets transmitted, {ok} received, {loss}% packet loss, "
               f"time {max(0, n - 1) * 1000 + 3}ms\n")
        if ok:
            io.out("rtt min/avg/max/mdev = 0.104/0.121/0.152/0.014 ms\n")
            return 0
        return 1

    # ---- systemd -----------------------------------------------------------------------------

    @property
    def units(self) -> dict[str, str]:
        return self.cluster.units[self.node_name]  # type: ignore[attr-defined]

    async def c_systemctl(self, argv: list[str], io: IO) -> int:
        if "show" in argv[1:2]:
            return self._systemctl_show(argv[2:], io)
        args = [a for a in argv[1:] if not a.startswith("-")]
        if len(args) < 2:
            io.err("Too few arguments.\n")
            return 1
        action, unit = args[0], args[1].removesuffix(".service")
        if unit not in self.units:
            if action in ("is-active",):
                io.out("inactive\n")
                return 3
            io.err(f"Failed to {action} {unit}.service: Unit {unit}.service not found.\n")
            return 5
        if action == "is-active":
            io.out(self.units[unit] + "\n")
            return 0 if self.units[unit] == "active" else 3
        if action in ("stop", "start", "restart"):
            self.units[unit] = "inactive" if action == "stop" else "active"
            return 0
        if action == "status":
            st = self.units[unit]
            io.out(f"● {unit}.service\n     Loaded: loaded (/usr/lib/systemd/system/{unit}.service; enabled; preset: "
                   f"enabled)\n     Active: {st} ({'running' if st == 'active' else 'dead'})\n")
            return 0 if st == "active" else 3
        io.err(f"Unknown command verb '{action}'.\n")
        return 1

    def _systemctl_show(self, rest: list[str], io: IO) -> int:
        """``systemctl show [--no-pager] -p A,B [--] UNIT...``: KEY=value blocks, a blank line apart."""
        props: list[str] = []
        units: list[str] = []
        it = iter(rest)
        for arg in it:
            if arg in ("-p", "--property"):
                props += next(it, "").split(",")
            elif arg.startswith("--property="):
                props += arg.split("=", 1)[1].split(",")
            elif arg == "--" or arg.startswith("-"):
                continue
            else:
                units.append(arg)
        blocks = []
        for unit in units:
            name = unit if "." in unit else f"{unit}.service"
            state = self.units.get(unit.removesuffix(".service"))
            values = {
                "Id": name,
                "LoadState": "loaded" if state is not None else "not-found",
                "ActiveState": state or "inactive",
                "SubState": "running" if state == "active" else "dead",
            }
            # systemd prints the properties in its own order, whatever the order asked for
            blocks.append("".join(f"{k}={values[k]}\n" for k in ("Id", "LoadState", "ActiveState", "SubState")
                                  if not props or k in props))
        io.out("\n".join(blocks))
        return 0

    async def c_journalctl(self, argv: list[str], io: IO) -> int:
        unit = _opt_val(argv, "-u", "")
        n = int(_opt_val(argv, "-n", "10"))
        unit = unit.removesuffix(".service")
        stamp = time.strftime("%b %d %H:%M:%S", time.gmtime(self.clock.epoch()))
        lines = [f"{stamp} {self.node_name} systemd[1]: Started {unit}.service."] if unit in self.units else []
        if not lines:
            io.out("-- No entries --\n")
        for ln in lines[-n:]:
            io.out(ln + "\n")
        if "-f" in argv:
            while True:
                await self.clock.sleep(3600)
        return 0

    # ---- docker ------------------------------------------------------------------------------

    async def c_docker(self, argv: list[str], io: IO) -> int:
        if len(argv) < 2:
            io.err("Usage:  docker [OPTIONS] COMMAND\n")
            return 1
        sub = argv[1]
        if sub == "container" and len(argv) > 2:
            argv = [argv[0], *argv[2:]]
            sub = argv[1]
        handler = getattr(self, "d_" + sub.replace("-", "_"), None)
        if handler is None:
            io.err(f"docker: unknown command: docker {sub}\n\nRun 'docker --help' for more information\n")
            return 1
        return await handler(argv[2:], io)

    async def d_version(self, args: list[str], io: IO) -> int:
        if "--format" in args or any(a.startswith("--format=") for a in args):
            io.out("29.2.1\n")
        else:
            io.out("Client: Docker Engine - Community\n Version:           29.2.1\n\nServer: Docker Engine - Community\n"
                   " Engine:\n  Version:          29.2.1\n")
        return 0

    async def d_ps(self, args: list[str], io: IO) -> int:
        t = self.now()
        all_ = "-a" in args or "--all" in args
        fmt = _opt_val(args, "--format", None)
        if fmt and fmt.strip() == "{{json .}}":
            io.out(F.docker_ps_json(self.cluster, self.node_name, t, all_))
        elif fmt:
            io.out(_go_template(fmt, F.docker_ps_json(self.cluster, self.node_name, t, all_)))
        else:
            io.out(F.docker_ps_table(self.cluster, self.node_name, t, all_))
        return 0

    async def d_stats(self, args: list[str], io: IO) -> int:
        io.out(F.docker_stats_json(self.cluster, self.node_name, self.now()))
        return 0

    async def d_images(self, args: list[str], io: IO) -> int:
        fmt = _opt_val(args, "--format", None)
        io.out(F.docker_images(self.cluster, self.node_name, self.now(), bool(fmt and "json" in fmt)))
        return 0

    async def d_image(self, args: list[str], io: IO) -> int:
        if args[:1] == ["ls"]:
            return await self.d_images(args[1:], io)
        if args[:1] == ["inspect"] and len(args) > 1:
            img = self.cluster.images_on(self.node_name).get(_norm_image(args[-1]))
            if img is None:
                io.err(f"Error response from daemon: No such image: {args[-1]}\n")
                return 1
            fmt = _opt_val(args, "--format", None)
            io.out(f"sha256:{img.id}\n" if fmt else f'[{{"Id": "sha256:{img.id}", "RepoTags": ["{img.ref}"]}}]\n')
            return 0
        io.err("docker: 'image' needs a subcommand\n")
        return 1

    def _container(self, name: str, io: IO) -> Container | None:
        c = self.cluster.container(self.node_name, name)
        if c is None:
            io.err(f"Error response from daemon: No such container: {name}\n")
        return c

    async def d_logs(self, args: list[str], io: IO) -> int:
        tail = _opt_val(args, "--tail", None) or _opt_val(args, "-n", None)
        follow = "-f" in args or "--follow" in args
        stamps = "-t" in args or "--timestamps" in args
        names = [a for a in args if not a.startswith("-") and a != tail]
        if not names:
            io.err('"docker logs" requires exactly 1 argument.\n')
            return 1
        ct = self._container(names[-1], io)
        if ct is None:
            return 1
        t = self.now()
        lines = ct.log_lines(t)
        if tail not in (None, "all"):
            n = int(tail)
            lines = lines[-n:] if n > 0 else []
        for ln in lines:
            io.out(self._fmt_log(ln, stamps))
        if not follow:
            return 0
        last = t
        while True:
            if not ct.running(last) and ct.state(last) != "created":
                return 0
            nxt = self._next_log_time(ct, last)
            wait = 1.0 if nxt is None else max(0.05, min(nxt - last, 5.0))
            await self.clock.sleep(wait)
            now = self.now()
            end = now
            if not ct.running(now):
                info = ct.exit_info(now)
                end = info[1] if info else now
            for ln in ct.log_lines(end):
                if last < ln.t <= end:
                    io.out(self._fmt_log(ln, stamps))
            last = now
            if not ct.running(now):
                return 0
            if self.cluster.container(self.node_name, ct.name) is not ct:
                return 0

    def _next_log_time(self, ct: Container, after: float) -> float | None:
        cand = [ln.t for ln in ct.log if ln.t > after]
        if ct.engine is not None:
            cand += [ln.t for ln in ct.engine.lines if ln.t > after]
            if ct.engine.failed_at is not None and ct.engine.failed_at > after:
                cand.append(ct.engine.failed_at)
        return min(cand) if cand else None

    def _fmt_log(self, ln: LogLine, stamps: bool) -> str:
        if stamps:
            e = self.clock.epoch(ln.t)
            frac = int((e % 1) * 1e9)
            return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(e)) + f".{frac:09d}Z {ln.text}\n"
        return ln.text + "\n"

    async def _each_container(self, args: list[str], io: IO, act) -> int:
        """``docker stop|start|restart A B…``: ``act`` each named container, echo its name;
        exit 1 (like docker) when any name is unknown."""
        rc = 0
        for name in [a for a in args if not a.startswith("-")]:
            ct = self._container(name, io)
            if ct is None:
                rc = 1
                continue
            await act(ct)
            io.out(name + "\n")
        return rc

    async def d_stop(self, args: list[str], io: IO) -> int:
        async def stop(ct: Container) -> None:
            await self.clock.sleep(0.4)
            self._stop(ct, self.now(), 0)

        return await self._each_container(args, io, stop)

    def _stop(self, ct: Container, t: float, code: int) -> None:
        if ct.running(t):
            ct.stopped = t
            ct.exit_code = code
            if ct.engine is not None:
                ct.engine.stop(t)
            self._ray_leave_container(ct, t)

    def _ray_leave_container(self, ct: Container, t: float) -> None:
        ray = self.cluster.ray
        if ray is None:
            return
        m = ray.members.get(ct.node)
        if m is not None and m.container == ct.name:
            del ray.members[ct.node]
            if m.head:
                self.cluster.ray = None

    async def d_start(self, args: list[str], io: IO) -> int:
        async def start(ct: Container) -> None:
            if not ct.running(self.now()):
                self._restart(ct, self.now() + 0.5)

        return await self._each_container(args, io, start)

    async def d_restart(self, args: list[str], io: IO) -> int:
        async def restart(ct: Container) -> None:
            self._stop(ct, self.now(), 0)
            await self.clock.sleep(0.5)
            self._restart(ct, self.now())

        return await self._each_container(args, io, restart)

    def _restart(self, ct: Container, t: float) -> None:
        ct.restarts += 1
        old_lines = ct.log_lines(t)
        ct.log = old_lines
        ct.engine = None
        ct.started = t
        ct.stopped = None
        ct.exit_code = None
        self._launch(ct, t)

    async def d_rm(self, args: list[str], io: IO) -> int:
        force = "-f" in args or "--force" in args
        rc = 0
        for name in [a for a in args if not a.startswith("-")]:
            ct = self._container(name, io)
            if ct is None:
                rc = 1
                continue
            if ct.running(self.now()):
                if not force:
                    io.err(f"Error response from daemon: cannot remove container \"/{ct.name}\": container is "
                           "running: stop the container before removing or force remove\n")
                    rc = 1
                    continue
                self._stop(ct, self.now(), 137)
            self.cluster.remove_container(ct)
            io.out(name + "\n")
        return rc

    async def d_run(self, args: list[str], io: IO) -> int:
        detach = False
        name = None
        env: list[tuple[str, str]] = []
        mounts: list[str] = []
        network = "bridge"
        rm = False
        i = 0
        value_opts = {"--name", "-e", "--env", "-v", "--volume", "--network", "--net", "--gpus", "--ipc",
                      "--shm-size", "--ulimit", "--device", "--cap-add", "-p", "--publish", "--entrypoint",
                      "--runtime", "-w", "--workdir", "--restart", "--label", "-l", "--pid", "--memory", "-u",
                      "--user", "--env-file", "--log-opt", "--hostname", "-h"}
        while i < len(args) and args[i].startswith("-"):
            a = args[i]
            key, _, val = a.partition("=")
            if key in value_opts and not val:
                val = args[i + 1] if i + 1 < len(args) else ""
                i += 1
            if key in ("-d", "--detach"):
                detach = True
            elif key in ("-it", "-ti", "-i", "-t", "--privileged", "--init"):
                pass
            elif key == "--rm":
                rm = True
            elif key == "--name":
                name = val
            elif key in ("-e", "--env"):
                k, _, v = val.partition("=")
                env.append((k, v))
            elif key in ("-v", "--volume"):
                mounts.append(val.split(":")[0])
            elif key in ("--network", "--net"):
                network = val
            elif len(key) > 2 and key[1] != "-" and set(key[1:]) <= set("dit"):
                detach = detach or "d" in key
            i += 1
        if i >= len(args):
            io.err('"docker run" requires at least 1 argument.\n')
            return 125
        image = _norm_image(args[i])
        cmd = args[i + 1:]
        img = self.cluster.images_on(self.node_name).get(image)
        if img is None:
            if not self.node.internet:
                io.err(f"Unable to find image '{args[i]}' locally\ndocker: Error response from daemon: Get "
                       "\"https://registry-1.docker.io/v2/\": dial tcp: lookup registry-1.docker.io on "
                       "127.0.0.53:53: server misbehaving\n\nRun 'docker run --help' for more information\n")
                return 125
            io.err(f"Unable to find image '{args[i]}' locally\n")
            rc = await self.d_pull([image], IO(io.err, io.err))
            if rc:
                return 125
        if name is None:
            name = f"{_ADJ[stable_int(0, len(_ADJ), self.now(), 'a')]}_{_NAMES[stable_int(0, len(_NAMES), self.now(), 'n')]}"
        if self.cluster.container(self.node_name, name) is not None:
            cid = self.cluster.container(self.node_name, name).id  # type: ignore[union-attr]
            io.err(f'docker: Error response from daemon: Conflict. The container name "/{name}" is already in use '
                   f'by container "{cid}". You have to remove (or rename) that container to be able to reuse that '
                   "name.\n\nRun 'docker run --help' for more information\n")
            return 125
        t = self.now()
        ct = Container(id=stable_hex(64, self.node_name, name, t), name=name, image=args[i],
                       argv=tuple(cmd), node=self.node_name, created=t, started=t + 0.6, env=tuple(env),
                       network=network, mounts=",".join(mounts))
        self.cluster.add_container(ct)
        await self.clock.sleep(0.6)
        err = self._launch(ct, ct.started or t)
        if err:
            io.err(err)
            ct.stopped = ct.started
            ct.exit_code = 127
            return 127
        if detach:
            io.out(ct.id + "\n")
            return 0
        # attached: stream its log until it exits
        rc = await self.d_logs(["-f", ct.name], io)
        info = ct.exit_info(self.now())
        if rm:
            self.cluster.remove_container(ct)
        return info[0] if info else rc

    def _launch(self, ct: Container, t: float) -> str | None:
        """Start what the container's command says. Returns an error text for a missing binary."""
        cmd = list(ct.argv)
        img = IMAGES.get(_norm_image(ct.image))
        ct.host_rss = 300 * 1024**2
        if not cmd:
            cmd = ["vllm", "serve"] if img else ["sh"]
        if cmd[:2] in (["bash", "-c"], ["sh", "-c"]) and len(cmd) > 2:
            cmd = self.tokenize(cmd[2])
        if cmd[:2] == ["vllm", "serve"] and img is not None:
            ct.kind = "vllm"
            return self._start_engine(ct, cmd[2:], t, img.vllm_version, pid_api=1)
        if cmd[:2] == ["ray", "start"]:
            ct.kind = "ray"
            ct.host_rss = 640 * 1024**2
            err, text = self._ray_start(cmd[2:], t, container=ct.name)
            ct.log.append(LogLine(t + 2.5, (err or text).rstrip("\n")))
            if err:
                ct.stopped = t + 2.6
                ct.exit_code = 1
            return None
        if cmd and cmd[0] not in ("sleep", "sh", "bash", "tail", "vllm", "ray", "python3", "python"):
            return (f"docker: Error response from daemon: failed to create task for container: failed to create shim "
                    f"task: OCI runtime create failed: runc create failed: unable to start container process: error "
                    f'during container init: exec: "{cmd[0]}": executable file not found in $PATH: unknown\n')
        return None

    def _start_engine(self, ct: Container, serve_argv: list[str], t: float, version: str, pid_api: int) -> str | None:
        try:
            args = vllm_logs.parse_serve_args(serve_argv)
        except vllm_logs.ServeArgError as exc:
            ct.log.append(LogLine(t + 3.0, str(exc)))
            ct.stopped = t + 3.1
            ct.exit_code = 2
            return None
        repo = args.model
        if repo in MODELS and not self.cluster.has_model(self.node_name, repo, t) and not self.node.internet:
            ct.log.append(LogLine(t + 4.0, f"(APIServer pid={pid_api}) OSError: We couldn't connect to "
                                  "'https://huggingface.co' to load the files, and couldn't find them in the cached "
                                  f"files.\nCheck your internet connection or see how to run the library in offline "
                                  "mode at 'https://huggingface.co/docs/transformers/installation#offline-mode'."))
            ct.stopped = t + 4.1
            ct.exit_code = 1
            return None
        ct.engine = vllm_logs.plan_serve(self.cluster, self.node, ct.name, version, args, t, pid_api=pid_api)
        ct.host_rss = int(2.4 * 1024**3)
        return None

    async def d_exec(self, args: list[str], io: IO) -> int:
        detach = False
        i = 0
        while i < len(args) and args[i].startswith("-"):
            if args[i] in ("-e", "--env", "-w", "--workdir", "-u", "--user"):
                i += 1
            elif "d" in args[i] and not args[i].startswith("--"):
                detach = True
            i += 1
        if i >= len(args):
            io.err('"docker exec" requires at least 2 arguments.\n')
            return 1
        ct = self._container(args[i], io)
        if ct is None:
            return 1
        if not ct.running(self.now()):
            io.err(f"Error response from daemon: container {ct.id} is not running\n")
            return 1
        cmd = args[i + 1:]
        if cmd[:2] in (["bash", "-c"], ["sh", "-c"], ["/bin/bash", "-c"]) and len(cmd) > 2:
            cmd = self._peel(self.tokenize(cmd[2]))
        if not cmd:
            return 0
        img = IMAGES.get(_norm_image(ct.image))
        if cmd[:2] == ["vllm", "serve"]:
            if img is None:
                io.err('OCI runtime exec failed: exec failed: unable to start container process: exec: "vllm": '
                       "executable file not found in $PATH: unknown\n")
                return 126
            sub = Container(id=stable_hex(64, ct.id, "exec", self.now()), name=f"{ct.name}#exec", image=ct.image,
                            argv=tuple(cmd), node=self.node_name, created=self.now(), started=self.now())
            pid = stable_int(300, 9000, ct.name, self.now(), "execpid")
            err = self._start_engine(sub, cmd[2:], self.now(), img.vllm_version, pid_api=pid)
            if err:
                io.err(err)
                return 1
            sub.kind = "vllm"
            # the engine belongs to the container: it dies with it
            sub.network = "exec"
            self.cluster.add_container(sub)
            if detach:
                return 0
            rc = await self._follow_exec(sub, ct, io)
            return rc
        if cmd[0] == "ray":
            if img is None:
                io.err('OCI runtime exec failed: exec failed: unable to start container process: exec: "ray": '
                       "executable file not found in $PATH: unknown\n")
                return 126
            return await self.c_ray(cmd, io, container=ct.name)
        return await self._dispatch(cmd, io)

    async def _follow_exec(self, sub: Container, parent: Container, io: IO) -> int:
        last = -1e18
        while True:
            now = self.now()
            if not parent.running(now) and sub.running(now):
                sub.stopped = parent.stopped
                if sub.engine:
                    sub.engine.stop(parent.stopped or now)
            for ln in sub.log_lines(now):
                if ln.t > last:
                    io.out(ln.text + "\n")
            last = now
            if not sub.running(now):
                info = sub.exit_info(now)
                return info[0] if info else 0
            nxt = self._next_log_time(sub, now)
            await self.clock.sleep(1.0 if nxt is None else max(0.05, min(nxt - now, 5.0)))

    async def d_pull(self, args: list[str], io: IO) -> int:
        refs = [a for a in args if not a.startswith("-")]
        if not refs:
            io.err('"docker pull" requires exactly 1 argument.\n')
            return 1
        ref = _norm_image(refs[0])
        if not self.node.internet:
            io.err('Error response from daemon: Get "https://registry-1.docker.io/v2/": dial tcp: lookup '
                   "registry-1.docker.io on 127.0.0.53:53: server misbehaving\n")
            return 1
        img = IMAGES.get(ref)
        repo, tag = ref.rsplit(":", 1)
        if img is None:
            io.err(f"Error response from daemon: pull access denied for {repo}, repository does not exist or may "
                   "require 'docker login': denied: requested access to the resource is denied\n")
            return 1
        if ref in self.cluster.images_on(self.node_name):
            io.out(f"{tag}: Pulling from {repo}\nDigest: {F.image_digest(ref)}\nStatus: Image is up to date for "
                   f"{ref}\ndocker.io/{ref}\n")
            return 0
        io.out(f"{tag}: Pulling from {repo}\n")
        layers = [stable_hex(12, ref, k) for k in range(9)]
        for lay in layers:
            io.out(f"{lay}: Pulling fs layer\n")
        tr = Transfer("image", ref, None, self.node_name, self.now(), img.size_bytes, INTERNET_BPS)
        self.cluster.transfers.append(tr)
        for k, lay in enumerate(layers):
            await self.clock.sleep((tr.t1 - tr.t0) / len(layers))
            io.out(f"{lay}: Download complete\n")
            if k == len(layers) - 1:
                for lay2 in layers:
                    io.out(f"{lay2}: Pull complete\n")
        io.out(f"Digest: {F.image_digest(ref)}\nStatus: Downloaded newer image for {ref}\ndocker.io/{ref}\n")
        return 0

    async def d_save(self, args: list[str], io: IO) -> int:
        io.err("cowardly refusing to save to a terminal. Use the -o flag or redirect\n")
        return 1

    async def d_load(self, args: list[str], io: IO) -> int:
        io.err("requested load from stdin, but stdin is empty\n")
        return 1

    async def d_inspect(self, args: list[str], io: IO) -> int:
        names = [a for a in args if not a.startswith("-") and "{{" not in a]
        for n in names:
            ct = self._container(n, io)
            if ct is None:
                return 1
            io.out(f'[{{"Id": "{ct.id}", "Name": "/{ct.name}", "State": {{"Status": "{ct.state(self.now())}"}}, '
                   f'"Config": {{"Image": "{ct.image}"}}}}]\n')
        return 0

    async def _image_copy(self, left: list[str], right: list[str], io: IO) -> int:
        refs = [a for a in left[2:] if not a.startswith("-")]
        if not refs:
            io.err('"docker save" requires at least 1 argument.\n')
            return 1
        ref = _norm_image(refs[0])
        img = self.cluster.images_on(self.node_name).get(ref)
        host, cmd = _ssh_target(right[1:])
        if img is None:
            io.err("Error response from daemon: reference does not exist\nrequested load from stdin, but stdin is empty\n")
            return 1
        dst = self._resolve(host)
        if dst is None or cmd[:2] != ["docker", "load"]:
            if dst is None:
                io.err(f"ssh: connect to host {host} port 22: No route to host\n")
                return 255
            io.err("only `docker save IMAGE | ssh HOST docker load` is supported\n")
            return 2
        rate = IMAGE_COPY_BPS
        tr = Transfer("image", ref, self.node_name, dst.name, self.now(), img.size_bytes, rate)
        self.cluster.transfers.append(tr)
        self.cluster.cache_ramps.append(CacheRamp(dst.name, tr.t0, tr.t1, img.size_bytes))
        await self.clock.sleep(tr.t1 - tr.t0)
        io.out(f"Loaded image: {ref}\n")
        return 0

    # ---- ssh ---------------------------------------------------------------------------------

    def _resolve(self, host: str) -> SimNode | None:
        host = host.split("@")[-1]
        if host in self.cluster.nodes:
            n = self.cluster.nodes[host]
            return None if n.lost(self.now()) else n
        if host in self.node.ips() or host in ("localhost", self.node_name):
            return self.node
        return self.cluster.reachable(self.node, host)

    async def c_ssh(self, argv: list[str], io: IO) -> int:
        host, cmd = _ssh_target(argv[1:])
        if host is None:
            io.err("usage: ssh [-46AaCfGgKkMNnqsTtVvXxYy] destination [command [argument ...]]\n")
            return 255
        dst = self._resolve(host)
        if dst is None:
            h = host.split("@")[-1]
            n = self.cluster.node_by_ip(h) or self.cluster.nodes.get(h)
            if n is not None and n.lost(self.now()):
                await self.clock.sleep(10.0)
                io.err(f"ssh: connect to host {h} port 22: Connection timed out\n")
            else:
                io.err(f"ssh: connect to host {h} port 22: No route to host\n")
            return 255
        if not cmd:
            io.err("Pseudo-terminal will not be allocated because stdin is not a terminal.\n")
            return 0
        return await Shell(self.cluster, dst.name).run(" ".join(shlex.quote(c) for c in cmd) if len(cmd) > 1
                                                       else cmd[0], io.out, io.err, io.stdin)

    # ---- ray ---------------------------------------------------------------------------------

    async def c_ray(self, argv: list[str], io: IO, container: str | None = None) -> int:
        sub = argv[1] if len(argv) > 1 else ""
        if sub == "status":
            addr = _opt_val(argv, "--address", None)
            members = self.cluster.ray_members()
            here = any(m.node == self.node_name for m in members)
            if self.cluster.ray is None or (not here and addr is None):
                io.err("ConnectionError: Could not find any running Ray instance. Please specify the one to connect "
                       "to by setting `--address` flag or `RAY_ADDRESS` environment variable.\n")
                return 1
            if addr is not None and addr != self.cluster.ray.address:
                io.err("ConnectionError: ray client connection timeout\n")
                return 1
            await self.clock.sleep(0.8)
            io.out(F.ray_status(self.cluster, self.now()))
            return 0
        if sub == "start":
            err, text = self._ray_start(argv[2:], self.now(), container=container)
            if err:
                io.err(err)
                return 1
            io.out(text)
            if "--block" in argv:
                while True:
                    await self.clock.sleep(3600)
            return 0
        if sub == "stop":
            ray = self.cluster.ray
            n = 0
            if ray is not None and self.node_name in ray.members:
                m = ray.members.pop(self.node_name)
                n = 7 if m.head else 4
                if m.head:
                    self.cluster.ray = None
            io.out(f"Stopped all {n} Ray processes.\n" if n else "Did not find any active Ray processes.\n")
            return 0
        io.err(f"Usage: ray [OPTIONS] COMMAND [ARGS]...\nTry 'ray --help' for help.\n\nError: No such command '{sub}'.\n")
        return 2

    def _ray_start(self, args: list[str], t: float, container: str | None) -> tuple[str | None, str]:
        head = "--head" in args
        ip = _opt_val(args, "--node-ip-address", None) or self.node.lan_ip
        port = _opt_val(args, "--port", "6379")
        ray = self.cluster.ray
        if ray is not None and self.node_name in ray.members:
            return ("ConnectionError: Ray is trying to start at " + ip + ":" + port + ", but is already running at "
                    + ray.address + ". Please specify a different port using the `--port` flag of `ray start` "
                    "command.\n", "")
        nid = stable_hex(56, "raynode", self.node_name, t)
        if head:
            addr = f"{ip}:{port}"
            self.cluster.ray = RayCluster(addr)
            self.cluster.ray.members[self.node_name] = RayMember(self.node_name, nid, ip, t + 2.0, True, container)
            return None, (
                "Usage stats collection is disabled.\n\nLocal node IP: " + ip + "\n\n"
                "--------------------\nRay runtime started.\n--------------------\n\nNext steps\n"
                "  To add another node to this Ray cluster, run\n"
                f"    ray start --address='{addr}'\n\n"
                "  To connect to this Ray cluster:\n    import ray\n    ray.init()\n\n"
                "  To terminate the Ray runtime, run\n    ray stop\n\n"
                "  To view the status of the cluster, use\n    ray status\n")
        addr = _opt_val(args, "--address", None)
        if addr is None:
            return ("ValueError: `--address` is required to join a cluster, or `--head` to start one.\n", "")
        addr = addr.strip("'\"")
        host = addr.split(":")[0]
        target = self.cluster.reachable(self.node, host)
        if ray is None or ray.address != addr or target is None:
            return (f"ConnectionError: Unable to connect to GCS (ray head) at {addr}. Check that (1) Ray with "
                    "matching version started successfully at the specified address, (2) this node can reach the "
                    "specified address, and (3) there is no firewall setting preventing access.\n", "")
        ray.members[self.node_name] = RayMember(self.node_name, nid, ip, t + 2.0, False, container)
        return None, ("Local node IP: " + ip + "\n\n--------------------\nRay runtime started.\n--------------------\n\n"
                      "To terminate the Ray runtime, run\n  ray stop\n")

    # ---- downloads and copies ----------------------------------------------------------------

    async def c_hf(self, argv: list[str], io: IO) -> int:
        if len(argv) < 3 or argv[1] != "download":
            if argv[1:2] == ["auth"] and argv[2:3] == ["whoami"]:
                io.out("sparkops\n")
                return 0
            io.err("usage: hf <command> [<args>]\n")
            return 2
        repo = argv[2]
        spec = MODELS.get(repo)
        if not self.node.internet:
            await self.clock.sleep(5.2)
            io.err(_hf_offline_error(repo))
            return 1
        if spec is None:
            io.err(f"huggingface_hub.errors.RepositoryNotFoundError: 401 Client Error. (Request ID: Root="
                   f"1-{stable_hex(8, repo)}-{stable_hex(24, repo, 'r')})\n\nRepository Not Found for url: "
                   f"https://huggingface.co/api/models/{repo}/revision/main.\n")
            return 1
        have = self.cluster.model_bytes(self.node_name, repo)
        t0 = self.now()
        remaining = spec.disk_bytes - have
        tr = Transfer("download", repo, None, self.node_name, t0 - have / INTERNET_BPS, spec.disk_bytes, INTERNET_BPS)
        if remaining > 0:
            self.cluster.transfers.append(tr)
            self.cluster.cache_ramps.append(CacheRamp(self.node_name, t0, tr.t1, remaining))
        files = spec.files
        done_files = int(files * have / spec.disk_bytes) if spec.disk_bytes else files
        start = t0
        while True:
            now = self.now()
            frac = min(1.0, tr.done_bytes(now) / spec.disk_bytes)
            n = min(files, int(frac * files)) if frac < 1 else files
            io.out("\r" + vllm_logs.tqdm_bar(f"Fetching {files} files", n, files, max(0.001, now - start))
                   .replace("<00:00", "<" + vllm_logs.fmt_interval(max(0, tr.t1 - now))))
            if frac >= 1:
                break
            del done_files
            done_files = n
            await self.clock.sleep(min(2.0, max(0.05, tr.t1 - now)))
        rev = stable_hex(40, repo, "rev")
        io.out(f"\n{model_dir(repo)}/snapshots/{rev}\n")
        return 0

    c_huggingface_cli = c_hf

    async def c_rsync(self, argv: list[str], io: IO) -> int:
        args = [a for a in argv[1:] if not a.startswith("-")]
        if len(args) < 2:
            io.err("rsync: usage: rsync [OPTION]... SRC [SRC]... [USER@]HOST:DEST\n")
            return 1
        src, dest = args[0], args[-1]
        if ":" not in dest:
            io.err("sparksim: only copies to another node (HOST:DEST) are modelled\n")
            return 1
        host = dest.split(":", 1)[0]
        repo = _repo_of_path(src)
        if repo is None or not self.cluster.has_model(self.node_name, repo):
            io.err(f'rsync: [sender] change_dir "{src}" failed: No such file or directory (2)\n'
                   "rsync error: some files/attrs were not transferred (see previous errors) (code 23) at "
                   "main.c(1338) [sender=3.2.7]\n")
            return 23
        dst = self._resolve(host)
        if dst is None:
            h = host.split("@")[-1]
            io.err(f"ssh: connect to host {h} port 22: No route to host\r\nrsync: connection unexpectedly closed "
                   "(0 bytes received so far) [sender]\nrsync error: unexplained error (code 255) at io.c(232) "
                   "[sender=3.2.7]\n")
            return 255
        spec = MODELS[repo]
        fast = host.split("@")[-1] in (dst.fast_ip, dst.fast_ip2)
        rate = FAST_LINK_RSYNC_BPS if fast else LAN_RSYNC_BPS
        have = self.cluster.model_bytes(dst.name, repo)
        total = spec.disk_bytes
        todo = total - have
        t0 = self.now()
        tr = Transfer("rsync", repo, self.node_name, dst.name, t0 - have / rate, total, rate)
        self.cluster.transfers.append(tr)
        self.cluster.cache_ramps.append(CacheRamp(dst.name, t0, tr.t1, todo))
        self.cluster.cache_ramps.append(CacheRamp(self.node_name, t0, tr.t1, todo))
        files = spec.files + 6
        while True:
            now = self.now()
            moved = tr.done_bytes(now) - have
            el = max(0.0, now - t0)
            frac = moved / todo if todo > 0 else 1.0
            speed = (moved / el) if el > 0 else 0.0
            if frac >= 1 or todo <= 0:
                io.out(f"{_progress2(total, 100, speed if todo > 0 else 0.0, el)} "
                       f"(xfr#{files if todo > 0 else 0}, to-chk=0/{files})\n")
                break
            left = (todo - moved) / rate
            k = int(frac * files)
            extra = f" (xfr#{k}, to-chk={files - k}/{files})" if k else ""
            io.out(f"{_progress2(int(moved), int(100 * frac), speed, left)}{extra}\r")
            await self.clock.sleep(min(1.0, max(0.05, tr.t1 - now)))
        return 0

    # ---- curl --------------------------------------------------------------------------------

    async def c_curl(self, argv: list[str], io: IO) -> int:
        silent = any(a.startswith("-") and not a.startswith("--") and "s" in a for a in argv[1:]) or "--silent" in argv
        show_err = any(a.startswith("-") and not a.startswith("--") and "S" in a for a in argv[1:])
        fail = any(a.startswith("-") and not a.startswith("--") and "f" in a for a in argv[1:]) or "--fail" in argv
        data = _opt_val(argv, "-d", None) or _opt_val(argv, "--data", None) or _opt_val(argv, "--data-raw", None)
        method = _opt_val(argv, "-X", None) or ("POST" if data is not None else "GET")
        urls = [a for a in argv[1:] if a.startswith("http")]
        if not urls:
            io.err("curl: no URL specified!\n")
            return 2
        m = re.match(r"https?://([^/:]+)(?::(\d+))?(/[^?]*)?", urls[0])
        if not m:
            io.err("curl: (3) URL rejected: Malformed input to a URL function\n")
            return 3
        host, port, path = m.group(1), int(m.group(2) or 80), m.group(3) or "/"
        node = self.node if host in ("localhost", "127.0.0.1", "0.0.0.0") else self._resolve(host)
        run = self.cluster.engine_on_port(node.name, port, self.now()) if node else None
        if run is None:
            if not silent or show_err:
                io.err(f"curl: (7) Failed to connect to {host} port {port} after 0 ms: Couldn't connect to server\n")
            return 7
        if (path.startswith("/v1/") and method == "POST" and run.hung_at is not None and self.now() >= run.hung_at
                and run.failed_at is not None):
            # a TP worker is lost: the request waits on the hung collective until the engine dies
            await self.clock.sleep(max(0.0, run.failed_at - self.now()))
            if not silent or show_err:
                io.err("curl: (52) Empty reply from server\n")
            return 52
        created = int(self.clock.epoch())
        status = "200 OK"
        if path == "/health":
            body = ""
        elif path == "/v1/models":
            body = vllm_logs.models_json(run, created)
        elif path == "/version":
            body = '{"version":"' + run.version + '"}'
        elif path == "/v1/chat/completions" and method == "POST":
            body, ok = vllm_logs.chat_json(run, data or "", created)
            status = "200 OK" if ok else "400 Bad Request"
        else:
            body = '{"detail":"Not Found"}'
            status = "404 Not Found"
        self._access_log(node.name if node else self.node_name, run, path, method, status)
        if fail and not status.startswith("200"):
            if not silent or show_err:
                io.err(f"curl: (22) The requested URL returned error: {status.split()[0]}\n")
            return 22
        io.out(body)
        return 0

    def _access_log(self, node: str, run, path: str, method: str, status: str) -> None:
        for c in self.cluster.containers_on(node):
            if c.engine is run:
                c.log.append(LogLine(self.now(), vllm_logs.access_line(run, path, method, status)))


# ---- helpers -----------------------------------------------------------------------------------

_ADJ = ["bold", "eager", "festive", "gifted", "jolly", "keen", "nifty", "quirky", "serene", "zen"]
_NAMES = ["babbage", "curie", "darwin", "euclid", "hopper", "lovelace", "noether", "turing", "wright", "yalow"]


def _bre(p: str) -> str:
    """A POSIX basic regex (grep without -E) to Python: \\| and \\( are operators, + and ? literal."""
    out = []
    i = 0
    while i < len(p):
        ch = p[i]
        if ch == "\\" and i + 1 < len(p):
            nxt = p[i + 1]
            out.append(nxt if nxt in "|(){}+?" else "\\" + nxt)
            i += 2
            continue
        out.append("\\" + ch if ch in "|(){}+?" else ch)
        i += 1
    return "".join(out)


def _go_template(fmt: str, json_lines: str) -> str:
    """``docker ps --format`` with ``{{.Field}}`` placeholders (and a ``table`` header)."""
    import json

    table = fmt.startswith("table")
    body = fmt[5:].lstrip() if table else fmt
    body = body.replace("\\t", "\t").replace("\\n", "\n")
    fields = re.findall(r"{{\s*\.(\w+)\s*}}", body)
    rows = [json.loads(ln) for ln in json_lines.splitlines() if ln.strip()]
    out = []
    if table:
        heads = {"ID": "CONTAINER ID", "Names": "NAMES", "Image": "IMAGE", "Status": "STATUS", "State": "STATE",
                 "Ports": "PORTS", "Command": "COMMAND", "RunningFor": "CREATED", "CreatedAt": "CREATED AT"}
        out.append(re.sub(r"{{\s*\.(\w+)\s*}}", lambda m: heads.get(m.group(1), m.group(1).upper()), body))
    for r in rows:
        out.append(re.sub(r"{{\s*\.(\w+)\s*}}", lambda m, r=r: str(r.get(m.group(1), "")), body))
    del fields
    return "".join(line + "\n" for line in out)


def _count_arg(argv: list[str], default: int) -> int:
    for i, a in enumerate(argv[1:], 1):
        if a == "-n" and i + 1 < len(argv):
            try:
                return int(argv[i + 1].lstrip("+"))
            except ValueError:
                return default
        if re.match(r"^-\d+$", a):
            return int(a[1:])
        if a.startswith("-n") and a[2:].isdigit():
            return int(a[2:])
    return default


def _opt_val(argv: list[str], name: str, default):
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "=") and name.startswith("--"):
            return a.split("=", 1)[1]
    return default


def _norm_image(ref: str) -> str:
    ref = ref.removeprefix("docker.io/")
    if ":" not in ref.rsplit("/", 1)[-1]:
        ref += ":latest"
    return ref


def _ssh_target(args: list[str]) -> tuple[str | None, list[str]]:
    i = 0
    while i < len(args) and args[i].startswith("-"):
        if args[i] in ("-o", "-p", "-i", "-l", "-F", "-J", "-c", "-b", "-L", "-R", "-W"):
            i += 1
        i += 1
    if i >= len(args):
        return None, []
    return args[i], args[i + 1:]


def _repo_of_path(p: str) -> str | None:
    m = re.search(r"models--([^/]+?)--([^/]+)", p)
    if not m:
        return None
    repo = f"{m.group(1)}/{m.group(2)}"
    return repo if repo in MODELS else None


def _rate(bps: float) -> str:
    if bps <= 0:
        return "0.00kB/s"
    for unit, size in (("GB/s", 1024**3), ("MB/s", 1024**2), ("kB/s", 1024)):
        if bps >= size or unit == "kB/s":
            return f"{bps / size:.2f}{unit}"
    return "0.00kB/s"


def _progress2(nbytes: int, pct: int, bps: float, secs: float) -> str:
    s = int(secs)
    return f"{nbytes:>15,} {pct:>3}% {_rate(bps):>11} {s // 3600:>4}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _hf_offline_error(repo: str) -> str:
    return (
        "Traceback (most recent call last):\n"
        '  File "/usr/local/lib/python3.12/dist-packages/urllib3/connection.py", line 198, in _new_conn\n'
        "    sock = connection.create_connection(\n"
        "socket.gaierror: [Errno -3] Temporary failure in name resolution\n\n"
        "The above exception was the direct cause of the following exception:\n\n"
        "requests.exceptions.ConnectionError: (MaxRetryError(\"HTTPSConnectionPool(host='huggingface.co', port=443): "
        f"Max retries exceeded with url: /api/models/{repo}/revision/main (Caused by NameResolutionError("
        "\\\"<urllib3.connection.HTTPSConnection object at 0xffff8c2b5e50>: Failed to resolve 'huggingface.co' "
        "([Errno -3] Temporary failure in name resolution)\\\"))\"), '(Request ID: "
        f"{stable_hex(8, repo)}-{stable_hex(4, repo, 1)}-{stable_hex(4, repo, 2)}-{stable_hex(12, repo, 3)})')\n"
    )
