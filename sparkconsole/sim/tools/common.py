"""What the tool families share: argument helpers, the table of installed tools, name lists.

Each tool family (:mod:`.sys`, :mod:`.files`, :mod:`.net`, :mod:`.docker`, :mod:`.ray`,
:mod:`.hf`, :mod:`.rsync`) is a mixin of ``c_NAME`` methods the interpreter finds by name; a
method gets ``argv`` (``argv[0]`` is the tool's name) and an :class:`~sparkconsole.sim.sh.interp.IO`
and returns the exit code, writing as the real tool does.
"""

from __future__ import annotations

import json
import re

from sparkconsole.sim.model import MODELS, stable_hex

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
    "mkdir": "/usr/bin/mkdir", "rm": "/usr/bin/rm", "find": "/usr/bin/find", "sha256sum": "/usr/bin/sha256sum",
    "setsid": "/usr/bin/setsid", "kill": "/usr/bin/kill", "ps": "/usr/bin/ps", "pgrep": "/usr/bin/pgrep",
    "pkill": "/usr/bin/pkill", "ss": "/usr/bin/ss", "touch": "/usr/bin/touch", "ln": "/usr/bin/ln",
    "readlink": "/usr/bin/readlink", "mv": "/usr/bin/mv", "date": "/usr/bin/date", "id": "/usr/bin/id",
    "test": "/usr/bin/test", "[": "/usr/bin/[", "basename": "/usr/bin/basename", "dirname": "/usr/bin/dirname",
    "whoami": "/usr/bin/whoami", "rmdir": "/usr/bin/rmdir", "ibv_devinfo": "/usr/bin/ibv_devinfo",
    "dmesg": "/usr/bin/dmesg", "tee": "/usr/bin/tee", "which": "/usr/bin/which", "dd": "/usr/bin/dd",
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


def _ssh_user(args: list[str], target: str) -> tuple[str | None, str]:
    """(user, host) of an ssh destination: ``USER@HOST``, else ``-l USER`` among the options, else
    no user (ssh then logs in as the local user)."""
    if "@" in target:
        user, _, host = target.rpartition("@")
        return user, host
    return _opt_val(args, "-l", None), target


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
