"""System tools: ``hostname``, ``uname``, ``nproc``, ``lscpu``, ``uptime``, ``sleep`` (sim time),
``which``, ``free``, ``nvidia-smi``, ``systemctl``, ``journalctl``, ``date``, ``id``, and the
process tools ``ps`` (``-ef``, ``aux``, ``-p PID -o ...``), ``pgrep [-f] [-a] PATTERN`` and
``pkill [-SIG] [-f] PATTERN`` over the node's process table.
"""

from __future__ import annotations

import re
import time

from sparkconsole.sim import formats as F
from sparkconsole.sim.model import ROOT
from sparkconsole.sim.procs import SIGNALS, Process
from sparkconsole.sim.sh.interp import IO
from sparkconsole.sim.tools.common import KNOWN_TOOLS, LSCPU, UNITS_DEFAULT, _opt_val


class SysTools:
    """Mixin: the system tools of a node's shell."""

    def which(self, name: str) -> str | None:
        """Where ``name`` is installed on this node (None: not installed, e.g. ``hf`` on a stock host)."""
        base = name.rsplit("/", 1)[-1]
        if self.absent(base):  # type: ignore[attr-defined]
            return None
        if name in KNOWN_TOOLS:
            return KNOWN_TOOLS[name]
        return name if name.startswith("/") and base in KNOWN_TOOLS else None

    async def c_hostname(self, argv: list[str], io: IO) -> int:
        if "-I" in argv:
            io.out(" ".join(ip for ip in self.node.ips() if not ip.startswith("127.")) + " \n")
        else:
            io.out(self.node_name + "\n")
        return 0

    async def c_uname(self, argv: list[str], io: IO) -> int:
        flags = "".join(a.lstrip("-") for a in argv[1:] if a.startswith("-"))
        io.out(F.kernel_uname(self.node_name, flags, self.cluster))
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
        if len(argv) < 2:
            io.err("sleep: missing operand\nTry 'sleep --help' for more information.\n")
            return 1
        total = 0.0
        for a in argv[1:]:
            m = re.fullmatch(r"(\d+(?:\.\d*)?|\.\d+)([smhd]?)", a)
            if not m:
                io.err(f"sleep: invalid time interval '{a}'\nTry 'sleep --help' for more information.\n")
                return 1
            total += float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
        await self.clock.sleep(total)
        return 0
    async def c_which(self, argv: list[str], io: IO) -> int:
        rc = 0
        for a in argv[1:]:
            path = self.which(a)
            if path is not None:
                io.out(path + "\n")
            else:
                rc = 1
        return rc
    async def c_free(self, argv: list[str], io: IO) -> int:
        io.out(F.free_b(self.cluster, self.node_name, self.now(), human="-h" in argv))
        return 0
    async def c_nvidia_smi(self, argv: list[str], io: IO) -> int:
        """``nvidia-smi`` (the table), ``-L``, ``--query-gpu=``/``--query-compute-apps=`` with
        ``--format=csv[,noheader][,nounits]``, and loop mode: ``-l [SEC]``/``--loop=SEC`` or
        ``-lms MS``/``--loop-ms=MS`` sample again every interval of *sim* time until the process is
        killed (its channel closes). Looping, a query prints its header once, then each sample's rows
        (none for a compute-apps sample without processes); the table prints whole every time."""
        fmt = next((a.split("=", 1)[1] for a in argv if a.startswith("--format=")), None)
        header = not (fmt and "noheader" in fmt)
        units = not (fmt and "nounits" in fmt)
        loop = _smi_loop(argv)
        if isinstance(loop, str):
            io.err(loop)
            return 2
        kind, fields = "table", []  # the first --query-*= option decides, as before
        for a in argv[1:]:
            if a.startswith(("--query-gpu=", "--query-compute-apps=")):
                kind, _, wanted = a[2:].partition("=")
                fields = wanted.split(",")
                break
        if kind == "query-gpu" and (not fmt or "csv" not in fmt):
            io.err('"--format=" switch is missing. Please try again.\n')
            return 2
        if kind == "table" and "-L" in argv:
            io.out(F.nvidia_smi_L(self.cluster, self.node_name))
            return 0

        def sample(t: float, head: bool) -> tuple[str, int]:
            if kind == "query-gpu":
                return F.query_gpu(self.cluster, self.node_name, t, fields, head, units)
            if kind == "query-compute-apps":
                return F.query_compute_apps(self.cluster, self.node_name, t, fields, head, units)
            return F.nvidia_smi(self.cluster, self.node_name, t), 0

        text, rc = sample(self.now(), header)
        if rc != 0:
            io.err(text)
            return rc
        io.out(text)
        if loop is None:
            return 0
        while True:  # as the real tool: sleep between queries, until Ctrl+C / SIGHUP / kill
            await self.clock.sleep(loop)
            text, _ = sample(self.now(), False)
            if text:
                io.out(text)

    # ---- systemd -----------------------------------------------------------------------------

    @property
    def units(self) -> dict[str, str]:
        return self.cluster.units.setdefault(self.node_name, dict(UNITS_DEFAULT))

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
        n = int(_opt_val(argv, "-n", "10"))
        if "-k" in argv or "--dmesg" in argv:  # the kernel's messages (the OOM killer's reports)
            lines = [ln for ln in self.node.kmsg if ln.t <= self.now()]
            if not lines:
                io.out("-- No entries --\n")
            for ln in lines if "-n" not in argv else lines[-n:]:
                stamp = time.strftime("%b %d %H:%M:%S", time.gmtime(self.clock.epoch(ln.t)))
                io.out(f"{stamp} {self.node_name} kernel: {ln.text}\n")
            return 0
        unit = _opt_val(argv, "-u", "")
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

    async def c_dmesg(self, argv: list[str], io: IO) -> int:
        """``dmesg [-T]``: the kernel's messages, stamped with seconds since boot (``-T``: the date)."""
        for ln in [ln for ln in self.node.kmsg if ln.t <= self.now()]:
            if "-T" in argv or "--ctime" in argv:
                stamp = time.strftime("%a %b %e %H:%M:%S %Y", time.gmtime(self.clock.epoch(ln.t)))
            else:
                stamp = f"{self.node.boot_uptime + ln.t:12.6f}"
            io.out(f"[{stamp}] {ln.text}\n")
        return 0

    async def c_sync(self, argv: list[str], io: IO) -> int:
        return 0

    async def c_date(self, argv: list[str], io: IO) -> int:
        e = self.clock.epoch(self.clock.node_now())
        fmt = next((a[1:] for a in argv[1:] if a.startswith("+")), None)
        if fmt is None:
            io.out(time.strftime("%a %b %e %H:%M:%S UTC %Y", time.gmtime(e)) + "\n")
        else:
            io.out(time.strftime(fmt.replace("%N", f"{int((e % 1) * 1e9):09d}"), time.gmtime(e)) + "\n")
        return 0

    async def c_id(self, argv: list[str], io: IO) -> int:
        """coreutils ``id [USER]`` for the user this shell runs as (the node's login user, root under
        sudo): ``-u``/``-g``/``-G`` (ids), with ``-n`` their names (``id -un`` is how recon reads the
        login user); flags may be joined (``-un``). Output as a real Spark's
        (tests/fixtures/real/dgx-os/stock-spark-id-ip.txt)."""
        flags = "".join(a[1:] for a in argv[1:] if a.startswith("-") and len(a) > 1)
        names = [a for a in argv[1:] if not a.startswith("-")]
        acct = self.account  # type: ignore[attr-defined]
        if names:
            login = self.cluster.login(self.node_name)
            found = {"root": ROOT, "0": ROOT, login.user: login}.get(names[0])
            if found is None:
                io.err(f"id: \u2018{names[0]}\u2019: no such user\n")
                return 1
            acct = found
        which = next((f for f in "ugG" if f in flags), None)
        if which is None:
            groups = ",".join(f"{gid}({name})" for gid, name in acct.groups)
            io.out(f"uid={acct.uid}({acct.user}) gid={acct.gid}({acct.groups[0][1]}) groups={groups}\n")
        elif which == "u":
            io.out((acct.user if "n" in flags else str(acct.uid)) + "\n")
        elif which == "g":
            io.out((acct.groups[0][1] if "n" in flags else str(acct.gid)) + "\n")
        else:
            io.out(" ".join(name if "n" in flags else str(gid) for gid, name in acct.groups) + "\n")
        return 0

    async def c_whoami(self, argv: list[str], io: IO) -> int:
        io.out(self.account.user + "\n")  # type: ignore[attr-defined]
        return 0

    async def c_true(self, argv: list[str], io: IO) -> int:
        """``/usr/bin/true`` (the builtin's twin), for what execs it: ``sudo -n true``, ``env true``."""
        return 0

    async def c_false(self, argv: list[str], io: IO) -> int:
        return 1

    # ---- processes ---------------------------------------------------------------------------

    def _ps_rows(self) -> list[Process]:
        return sorted(self.procs.procs.values(), key=lambda p: p.pid)

    def _etime(self, p: Process) -> str:
        s = int(max(0.0, self.now() - p.started))
        d, rem = divmod(s, 86400)
        h, rem = divmod(rem, 3600)
        m, sec = divmod(rem, 60)
        return (f"{d}-" if d else "") + (f"{h:02d}:" if h or d else "") + f"{m:02d}:{sec:02d}"

    async def c_ps(self, argv: list[str], io: IO) -> int:
        args = argv[1:]
        rows = self._ps_rows()
        pids = _opt_val(args, "-p", None) or _opt_val(args, "--pid", None)
        if pids is not None:
            want = {int(x) for x in re.split(r"[,\s]+", pids) if x.isdigit()}
            rows = [p for p in rows if p.pid in want]
        fmt = _opt_val(args, "-o", None)
        start = time.strftime("%H:%M", time.gmtime(self.clock.epoch()))
        if fmt is not None:
            cols = [c.split("=")[0] for c in fmt.split(",")]
            heads = {"pid": "    PID", "ppid": "   PPID", "pgid": "   PGID", "sid": "    SID", "etime": "    ELAPSED",
                     "etimes": "ELAPSED", "args": "COMMAND", "cmd": "CMD", "comm": "COMMAND", "stat": "STAT",
                     "user": "USER"}
            blank_head = all(c.endswith("=") for c in fmt.split(","))
            if not blank_head:
                io.out(" ".join(heads.get(c, c.upper()) for c in cols) + "\n")
            for p in rows:
                vals = {"pid": f"{p.pid:>7}", "ppid": f"{p.ppid:>7}", "pgid": f"{p.pgid:>7}", "sid": f"{p.sid:>7}",
                        "etime": f"{self._etime(p):>11}", "etimes": f"{int(self.now() - p.started):>7}",
                        "args": p.cmdline, "cmd": p.cmdline, "comm": p.argv[0][:15], "stat": "S", "user": "root"}
                io.out(" ".join(vals.get(c, "-") for c in cols) + "\n")
            return 0 if rows else 1
        if "aux" in args or "-aux" in args:
            io.out("USER         PID %CPU %MEM    VSZ   RSS TTY      STAT START   TIME COMMAND\n")
            for p in rows:
                io.out(f"root     {p.pid:>7}  0.0  0.0  10424  4096 ?        S    {start}   0:00 {p.cmdline}\n")
            return 0
        if "-ef" in args or ("-e" in args and "-f" in args):
            io.out("UID          PID    PPID  C STIME TTY          TIME CMD\n")
            for p in rows:
                io.out(f"root     {p.pid:>7} {p.ppid:>7}  0 {start} ?        00:00:00 {p.cmdline}\n")
            return 0
        io.out("    PID TTY          TIME CMD\n")
        for p in rows:
            if io.proc is not None and p.sid == io.proc.sid:
                io.out(f"{p.pid:>7} ?        00:00:00 {p.argv[0][:15]}\n")
        return 0

    def _pmatch(self, argv: list[str], io: IO, tool: str) -> tuple[list[Process], set[str], int | None] | int:
        opts: set[str] = set()
        sig: int | None = None
        pats: list[str] = []
        for a in argv[1:]:
            if a.startswith("-") and len(a) > 1 and not pats:
                name = a[1:].upper().removeprefix("SIG")
                if tool == "pkill" and (name in SIGNALS or name.isdigit()):
                    sig = int(name) if name.isdigit() else SIGNALS[name]
                else:
                    opts.update(a[1:])
            else:
                pats.append(a)
        if len(pats) != 1:
            io.err(f"{tool}: no matching criteria specified\nTry `{tool} --help' for more information.\n"
                   if not pats else f"{tool}: only one pattern can be provided\n"
                   f"Try `{tool} --help' for more information.\n")
            return 2
        try:
            rx = re.compile(pats[0])
        except re.error:
            io.err(f"{tool}: invalid regular expression\n")
            return 2
        me = io.proc.pid if io.proc else -1
        full = "f" in opts

        def hit(p: Process) -> bool:
            text = p.cmdline if full else p.argv[0].rsplit("/", 1)[-1][:15]
            return p.pid != me and bool(rx.search(text))

        return self.procs.matching(hit), opts, sig

    async def c_pgrep(self, argv: list[str], io: IO) -> int:
        r = self._pmatch(argv, io, "pgrep")
        if isinstance(r, int):
            return r
        found, opts, _sig = r
        for p in found:
            io.out(f"{p.pid} {p.cmdline}\n" if "a" in opts else
                   f"{p.pid} {p.argv[0]}\n" if "l" in opts else f"{p.pid}\n")
        return 0 if found else 1

    async def c_pkill(self, argv: list[str], io: IO) -> int:
        r = self._pmatch(argv, io, "pkill")
        if isinstance(r, int):
            return r
        found, _opts, sig = r
        for p in found:
            self.procs.signal(p.pid, sig if sig is not None else SIGNALS["TERM"])
        return 0 if found else 1


SMI_LOOP_DEFAULT_S = 5.0  # ``nvidia-smi -l`` without a value (nvidia-smi(1))
_SMI_BAD_ARGS = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"


def _smi_loop(argv: list[str]) -> float | str | None:
    """The loop interval in seconds of ``nvidia-smi`` options ``-l [SEC]``, ``--loop=SEC``,
    ``-lms MS``, ``--loop-ms=MS`` (None: no loop; a str: the error to print)."""
    args = argv[1:]
    for i, a in enumerate(args):
        nxt = args[i + 1] if i + 1 < len(args) else None
        if a in ("-l", "--loop", "-lms", "--loop-ms"):
            raw = nxt if nxt is not None and re.fullmatch(r"\d+", nxt) else None
        elif a.startswith(("--loop=", "--loop-ms=")):
            raw = a.split("=", 1)[1]
        else:
            continue
        ms = a.startswith(("-lms", "--loop-ms"))
        if raw is None:
            if ms:
                return _SMI_BAD_ARGS
            return SMI_LOOP_DEFAULT_S
        if not re.fullmatch(r"\d+", raw) or int(raw) <= 0:
            return _SMI_BAD_ARGS
        return int(raw) / 1000 if ms else float(raw)
    return None
