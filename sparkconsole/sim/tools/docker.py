"""Docker: ``ps``, ``stats``, ``images [--digests]``, ``image inspect [-f]``, ``info [-f]``, ``version``,
``logs [-f] [-t] [--tail N] [--since T]`` (incremental: a follow wake-up reads only the new
window), ``stop``/``start``/``restart``/``kill [-s SIG]``/``rm [-f]``, ``run`` (every option of a vLLM/Ray/SGLang
launch parsed as docker does: value options never taken for the image; the image's own
entrypoint unless ``--entrypoint``), ``exec [-d] [-e K=V] CONTAINER CMD`` (``vllm serve``, the
api_server module, ``python3 -c`` and ``ray`` run *in* the container, with the container's
environment plus ``-e``), ``inspect [-f TEMPLATE]`` (the ``State`` object as a real engine returns
it: ``Status``, ``OOMKilled``, ``ExitCode``, times), ``pull`` (internet only) and ``save | ssh HOST
docker load``.

Strict like the real thing:

* the executable must be in the image (:func:`sparkconsole.sim.container.has_command`): ``docker run
  --entrypoint ray`` on NGC 26.05 fails with the OCI runtime's ``exec: "ray": executable file not
  found in $PATH`` (exit 127), ``docker exec`` with its ``OCI runtime exec failed`` line, and ``sh -c
  'ray ...'`` in such an image with ``sh: 1: ray: not found``. NGC images run
  ``/opt/nvidia/nvidia_entrypoint.sh`` with the command as its arguments (banner, then ``exec "$@"``:
  ``docker run NGC MODEL ...`` fails with bash's ``exec: MODEL: not found``, exit 127);
* a container has its own files (:class:`sparkconsole.sim.container.ContainerFS`): only its ``-v``
  binds reach the node's; what ``docker exec C sh -c '... > /root/.config/...'`` writes stays in C and
  goes with it; ``--gpus`` decides whether torch sees the GPU in it;
* a command that is not a server (``hf download``, ``python3 -c``, ``sh -c``, ``cat`` ...) runs as a
  process in the container: attached (no ``-d``) its output streams as it comes and ``--rm`` removes
  the container once it exits; detached its output is the container's log;
* images: ``docker info`` tells the store (containerd's ``overlayfs`` or ``overlay2``); under the
  containerd store an image that came by ``docker save | docker load`` has another ID than on the
  node it was saved on while ``.RootFS.Layers`` stay the same (:meth:`SimCluster.image_id`);
  ``image inspect -f`` knows ``.Id``, ``json .RootFS.Layers``, ``json .Config.Entrypoint``/``Cmd``/
  ``Labels`` and ``index .Config.Labels "KEY"``.

What a container runs: ``vllm serve`` / ``python3 -m vllm.entrypoints.openai.api_server``: the
engine run of :mod:`sparkconsole.sim.vllm_logs` (``--nnodes`` with ``--headless``/``--node-rank`` > 0:
a rank that waits for its head, whose run then writes this container's lines), given its
environment and its ``ray_non_carry_over_env_vars.json`` (vLLM >= 0.17 copies the driver's env to
Ray workers); ``ray start``: a Ray member; ``python3 -m sglang.launch_server``:
:mod:`sparkconsole.sim.sglang`; ``python3 -c PROGRAM``: the program, evaluated by
:mod:`sparkconsole.sim.pyexec` against the image.
"""

from __future__ import annotations

import asyncio
import calendar
import json
import math
import re
import time

from sparkconsole.sim import formats as F
from sparkconsole.sim import hostile as sim_hostile
from sparkconsole.sim import miniature as sim_miniature
from sparkconsole.sim import vllm_logs
from sparkconsole.sim.container import (
    IMAGE_TOOLS,
    NGC_ENTRYPOINT,
    container_env,
    container_fs,
    gpu_visible,
    has_command,
    image_commands,
    through_binds,
)
from sparkconsole.sim.model import (
    DOCKER_VERSION,
    IMAGES,
    MODELS,
    ROOT,
    CacheRamp,
    Container,
    LogLine,
    Transfer,
    image_digest,
    repo_revision,
    stable_hex,
    stable_int,
)
from sparkconsole.sim.sglang import engine_check, sglang_launch
from sparkconsole.sim.sh.interp import IO
from sparkconsole.sim.tools.common import (
    _ADJ,
    _NAMES,
    _go_template,
    _norm_image,
    _opt_val,
    _ssh_target,
    _ssh_user,
)
from sparkconsole.sim.vfs import FsError

# What the docker CLI says to a user outside the ``docker`` group (the socket is root:docker 0660).
# Docker 29's wording (29.2.1, as on the Spark capture: chrisjbawden/cockpit-dockermanager#37); up to
# 28 it was "permission denied while trying to connect to the Docker daemon socket at
# unix:///var/run/docker.sock: Get ...: dial unix /var/run/docker.sock: connect: permission denied".
DOCKER_SOCKET_DENIED = "permission denied while trying to connect to the docker API at unix:///var/run/docker.sock\n"
CONTAINER_HF_HOME = "/root/.cache/huggingface"  # containers run as root: huggingface_hub's default cache

RUN_VALUE_OPTS = {
    "--name", "-e", "--env", "--env-file", "-v", "--volume", "--network", "--net", "--gpus", "--ipc", "--shm-size",
    "--ulimit", "--device", "--cap-add", "--cap-drop", "-p", "--publish", "--entrypoint", "--runtime", "-w",
    "--workdir", "--restart", "--label", "-l", "--pid", "-m", "--memory", "-u", "--user", "--log-opt",
    "--log-driver", "--hostname", "-h", "--security-opt", "--mount", "--add-host", "--cpus", "--cpuset-cpus",
    "--platform", "--pull", "--stop-signal", "--stop-timeout", "--health-cmd", "--uts", "--group-add", "--sysctl",
    "--tmpfs", "--volumes-from", "--dns", "--memory-swap", "--cidfile", "-a", "--attach", "--label-file",
    "--network-alias", "--ip", "--expose", "--userns", "--cgroupns", "--device-cgroup-rule",
}
RUN_BOOL_OPTS = {"-d", "--detach", "--rm", "-i", "--interactive", "-t", "--tty", "--privileged", "--init", "-P",
                 "--publish-all", "--read-only", "--no-healthcheck", "--sig-proxy", "-q", "--quiet"}


def _drop(_s: str) -> None:
    return None


def _oci_missing(exe: str) -> str:
    """``docker run``'s error when the image has no such executable (exit 127; the fragment
    ``"ray": executable file not found`` of tests/fixtures/real/dgx-os/ray-not-found.txt)."""
    why = f"stat {exe}: no such file or directory" if exe.startswith("/") else "executable file not found in $PATH"
    return ("docker: Error response from daemon: failed to create task for container: failed to create shim "
            "task: OCI runtime create failed: runc create failed: unable to start container process: error "
            f'during container init: exec: "{exe}": {why}: unknown\n\n'
            "Run 'docker run --help' for more information\n")


def _oci_exec_missing(exe: str) -> str:
    """``docker exec``'s error for an executable the container does not have (exit 127)."""
    why = f"stat {exe}: no such file or directory" if exe.startswith("/") else "executable file not found in $PATH"
    return f'OCI runtime exec failed: exec failed: unable to start container process: exec: "{exe}": {why}: unknown\n'


# NVIDIA's /opt/nvidia/nvidia_entrypoint.sh ends in ``exec "$@"``; the line number bash reports for a
# missing command is the script's (not published for 26.05: an assumed value)
NGC_EXEC_LINE = 67


def _ngc_banner(img, gpu: bool) -> list[str]:
    """What NVIDIA's entrypoint prints before it execs the command (the NGC containers' banner)."""
    release = img.tag.split("-")[0] if img is not None else ""
    lines = ["", "==========", "== vLLM ==", "==========", "",
             f"NVIDIA Release {release} (build {stable_int(10**8, 2 * 10**8, 'ngc', release)})",
             f"vLLM Version {img.vllm_version if img is not None else ''}",
             "Container image Copyright (c) 2026, NVIDIA CORPORATION & AFFILIATES. All rights reserved.", "",
             "Various files include modifications (c) NVIDIA CORPORATION & AFFILIATES.  All rights reserved.", "",
             "GOVERNING TERMS: The software and materials are governed by the NVIDIA Software License Agreement",
             "(found at https://www.nvidia.com/en-us/agreements/enterprise-software/nvidia-software-license-agreement/)",
             "and the Product-Specific Terms for NVIDIA AI Products",
             "(found at https://www.nvidia.com/en-us/agreements/enterprise-software/product-specific-terms-for-ai-products/).",
             ""]
    if not gpu:
        lines += ["WARNING: The NVIDIA Driver was not detected.  GPU functionality will not be available.",
                  "   Use the NVIDIA Container Toolkit to start this container with GPU support; see",
                  "   https://docs.nvidia.com/datacenter/cloud-native/ .", ""]
    return lines


def _registry_host(ref: str) -> str:
    first = ref.split("/", 1)[0]
    return first if "/" in ref and ("." in first or ":" in first) else "registry-1.docker.io"


# A line the container wrote to stderr: ``docker logs`` (and an attached ``docker run``) give it on
# stderr; the engine's own stderr lines (uvicorn, tqdm) are made by vllm_logs as the same class.
ErrLine = vllm_logs.ErrLine


class _LogSink:
    """A container process's output kept as its log lines (``docker logs``), split at newlines."""

    def __init__(self, ct: Container, now, cls: type[LogLine] = LogLine) -> None:
        self.ct = ct
        self.now = now
        self.cls = cls
        self.buf = ""

    def __call__(self, s: str) -> None:
        self.buf += s
        while "\n" in self.buf:
            line, self.buf = self.buf.split("\n", 1)
            self.ct.log.append(self.cls(self.now(), line))

    def flush(self) -> None:
        if self.buf:
            self.ct.log.append(self.cls(self.now(), self.buf))
            self.buf = ""


def _serve_argv(cmd: list[str]) -> list[str] | None:
    """The ``vllm serve`` arguments of a container command (``vllm serve MODEL ...`` or the
    api_server module with ``--model MODEL``), else None."""
    if cmd[:2] == ["vllm", "serve"]:
        return list(cmd[2:])
    if cmd[:1] in (["python3"], ["python"]) and cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]:
        rest = list(cmd[3:])
        model = None
        out: list[str] = []
        i = 0
        while i < len(rest):
            if rest[i] == "--model" and i + 1 < len(rest):
                model = rest[i + 1]
                i += 2
                continue
            if rest[i].startswith("--model="):
                model = rest[i].split("=", 1)[1]
                i += 1
                continue
            out.append(rest[i])
            i += 1
        return ([model] if model else []) + out
    return None


GO_ZERO_TIME = "0001-01-01T00:00:00Z"


def _rfc3339nano(epoch: float) -> str:
    """Go's ``time.RFC3339Nano`` in UTC, as docker prints times: trailing zeros of the fraction dropped."""
    whole = int(epoch)
    frac = f"{min(999_999_999, round((epoch - whole) * 1e9)):09d}".rstrip("0")
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + (f".{frac}" if frac else "") + "Z"


class GoMap(dict):
    """A Go map in a template (``.Config.Labels``): printed ``map[k:v …]``, keys sorted."""


class GoNil:
    """A nil slice or map (``.Config.Cmd`` of an image without CMD): ``json`` writes ``null``, the
    plain text is Go's empty value (``[]``, ``map[]``)."""

    def __init__(self, text: str = "[]") -> None:
        self.text = text


def _go_text(val: object) -> str:
    """A value as Go's template prints it without ``json``: a struct as ``{v1 v2 …}``, a slice as
    ``[a b]``, a map as ``map[k:v]``, bools lower case."""
    if isinstance(val, bool):
        return "true" if val else "false"
    if isinstance(val, GoNil):
        return val.text
    if isinstance(val, GoMap):
        return "map[" + " ".join(f"{k}:{_go_text(v)}" for k, v in sorted(val.items())) + "]"
    if isinstance(val, dict):
        return "{" + " ".join(_go_text(v) for v in val.values()) + "}"
    if isinstance(val, (list, tuple)):
        return "[" + " ".join(_go_text(v) for v in val) + "]"
    if val is None:
        return "<nil>"
    return str(val)


def _go_json(val: object) -> str:
    def plain(v: object) -> object:
        if isinstance(v, GoNil):
            return None
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        return v

    return json.dumps(plain(val), separators=(",", ":"), ensure_ascii=False)


def _go_fields(fmt: str, fields: dict[str, object]) -> str:
    """A Go template of ``{{.A.B}}`` / ``{{json .A}}`` / ``{{index .A "key"}}`` placeholders over flat
    dotted fields (a dict value is a struct: ``json`` writes it compact, in its fields' order, as
    docker's template does; a :class:`GoMap` is a map, whose missing key ``index`` gives as "")."""
    def sub(m: re.Match[str]) -> str:
        key = m.group(2)
        val = fields.get(key, "<no value>")
        if m.group(1):
            return _go_json(val)
        return _go_text(val)

    def index(m: re.Match[str]) -> str:
        val = fields.get(m.group(1))
        if isinstance(val, GoNil):
            return ""
        if not isinstance(val, dict):
            return "<no value>"
        return _go_text(val.get(m.group(2), ""))

    out = re.sub(r'{{\s*index\s+\.([\w.]+)\s+"([^"]*)"\s*}}', index, fmt)
    return re.sub(r"{{\s*(json\s+)?\.([\w.]+)\s*}}", sub, out).replace("\\n", "\n").replace("\\t", "\t")


def _since(value: str, epoch0: float, now_epoch: float) -> float | None:
    """``docker logs --since``: a duration (``10m``, ``1h30m``, ``45s``), a unix time or an RFC 3339
    date; returns the sim time it names, None when docker would refuse the value."""
    m = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?", value)
    if m and any(m.groups()):
        secs = sum(float(g or 0) * k for g, k in zip(m.groups(), (3600, 60, 1), strict=True))
        return now_epoch - secs - epoch0
    if re.fullmatch(r"\d+(?:\.\d+)?", value):
        return float(value) - epoch0
    m = re.fullmatch(r"(\d{4}-\d\d-\d\d)(?:T(\d\d:\d\d(?::\d\d)?)(\.\d+)?)?(Z)?", value)
    if m:
        hms = m.group(2) or "00:00:00"
        if hms.count(":") == 1:
            hms += ":00"
        ts = calendar.timegm(time.strptime(f"{m.group(1)} {hms}", "%Y-%m-%d %H:%M:%S")) + float(m.group(3) or 0)
        return ts - epoch0
    return None


_SIGNALS = {"HUP": 1, "INT": 2, "QUIT": 3, "ABRT": 6, "KILL": 9, "USR1": 10, "SEGV": 11, "USR2": 12, "TERM": 15}


def _signal_number(sig: str) -> int | None:
    s = sig.upper().removeprefix("SIG")
    if s.isdigit():
        return int(s) if 0 < int(s) < 65 else None
    return _SIGNALS.get(s)


def stop_container(cluster, ct: Container, t: float, code: int, oom_killed: bool = False) -> bool:
    """End a running container's processes at ``t`` with exit ``code`` (``docker stop``/``kill``/``rm
    -f``, or the kernel): its engine stops (its lines end, its memory is freed), a native head's
    ranks hang then die, a headless rank's head sees a lost worker, a Ray member leaves. False when
    it was not running."""
    if not ct.running(t):
        return False
    ct.stopped = t
    ct.exit_code = code
    ct.oom_killed = oom_killed
    if ct.main_pid is not None:  # a command run as a process (hf download ...): it ends with its container
        cluster.proc_table(ct.node).signal(ct.main_pid, 9)
    if ct.engine is not None and ct.engine.native:
        vllm_logs.head_stopped(cluster, ct.engine, t)  # the headless ranks hang, then die
    elif ct.engine is not None:
        ct.engine.stop(t)
    if ct.headless is not None and ct.headless.run is not None:
        vllm_logs.peer_stopped(cluster, ct.headless.run, ct.node, t)
    for sub in cluster.containers:  # an engine `docker exec`ed in it (vLLM over Ray in the head's container)
        if sub.node == ct.node and sub.name == f"{ct.name}#exec" and sub.running(t):
            sub.stopped, sub.exit_code = t, code
            if sub.engine is not None:
                sub.engine.stop(t)
    for h in cluster.holders:  # a process of a twin's container (sim/twin.py): it ends with it
        if h.node == ct.node and h.container == ct.name and (h.curve.end is None or h.curve.end > t):
            h.curve.end = t
    _ray_leave_container(cluster, ct)
    return True


def _ray_leave_container(cluster, ct: Container) -> None:
    ray = cluster.ray
    if ray is None:
        return
    m = ray.members.get(ct.node)
    if m is not None and m.container == ct.name:
        del ray.members[ct.node]
        if m.head:
            cluster.ray = None


def kernel_oom_kill(cluster, node: str, name: str, t: float | None = None) -> Container:
    """The fault: the kernel's OOM killer ends container ``name`` on ``node`` (its biggest process,
    the engine), as on a node whose memory ran out while the weights loaded: exit 137, docker's
    ``OOMKilled`` true, the log stops, and the kernel's report lands in ``journalctl -k`` / ``dmesg``."""
    t = cluster.now() if t is None else t
    ct = cluster.container(node, name)
    if ct is None or not ct.running(t):
        raise ValueError(f"{node}: no running container {name}")
    sim_node = cluster.node(node)
    pid = stable_int(2000, 90000, ct.id, "oompid")
    rss_kb = max(ct.host_rss, 1) // 1024
    anon_kb = int(cluster.apps_bytes(node, t) // 1024)  # what the node's processes held when memory ran out
    sim_node.kmsg.append(LogLine(t, f"oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=docker-{ct.id}"
                                    f".scope,mems_allowed=0,global_oom,task_memcg=/system.slice/docker-{ct.id}.scope,"
                                    f"task=python3,pid={pid},uid=0"))
    sim_node.kmsg.append(LogLine(t, f"Out of memory: Killed process {pid} (python3) total-vm:{anon_kb + 41943040}kB, "
                                    f"anon-rss:{anon_kb}kB, file-rss:{rss_kb}kB, shmem-rss:0kB, UID:0 "
                                    f"pgtables:{max(1, anon_kb // 512)}kB oom_score_adj:0"))
    stop_container(cluster, ct, t, 137, oom_killed=True)
    return ct


class DockerTools:
    """Mixin: the ``docker`` CLI (and, in a ``docker exec`` shell, the container's ``vllm``/``python3``)."""

    container: Container | None = None
    image = None

    @property
    def fs(self):  # type: ignore[override]
        """The node's files; in a container, its own files plus its bind mounts onto the node's
        (:class:`sparkconsole.sim.container.ContainerFS`)."""
        ct = self.container
        if ct is None:
            return super().fs  # type: ignore[misc]
        return container_fs(self.cluster, ct, IMAGES.get(_norm_image(ct.image)))  # type: ignore[attr-defined]

    def absent(self, name: str) -> bool:
        """In a container, a command the image does not have (``sh: 1: ray: not found``)."""
        ct = self.container
        if ct is None:
            return super().absent(name)  # type: ignore[misc]
        return name in IMAGE_TOOLS and not has_command(IMAGES.get(_norm_image(ct.image)), ct.gpus, name)

    # ---- docker ------------------------------------------------------------------------------

    def docker_denied(self, account) -> bool:
        """Whether ``account`` cannot reach the docker socket (not root, not in ``docker``). A stock
        login is in the group (real capture: 988(docker)); the playbook's fix when it is not is
        ``sudo usermod -aG docker $USER`` [dgx-spark-playbooks]. ``SimNode.docker_group`` drops it."""
        return not account.root and not account.in_group("docker")

    async def c_docker(self, argv: list[str], io: IO) -> int:
        if len(argv) < 2:
            io.err("Usage:  docker [OPTIONS] COMMAND\n")
            return 1
        if self.docker_denied(self.account):  # type: ignore[attr-defined]
            io.err(DOCKER_SOCKET_DENIED)
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

    async def d_top(self, args: list[str], io: IO) -> int:
        """``docker top NAME [ps OPTIONS]``: the container's processes as the host's ``ps`` prints them
        (host pids), its main process first, then what was ``docker exec``ed in it and still runs (an
        engine started that way: the ``NAME#exec`` record). With ``-eo pid,args`` (what the serving
        poll asks) the columns are ``PID COMMAND``; docker itself refuses options without a pid column
        ("Couldn't find PID field in ps output"). Other ps formats: ``UID PID PPID C STIME TTY TIME CMD``."""
        if not args:
            io.err('"docker top" requires at least 1 argument.\n')
            return 1
        name, opts = args[0], args[1:]
        t = self.now()
        ct = self.cluster.container(self.node_name, name)
        if ct is None:
            io.err(f"Error response from daemon: No such container: {name}\n")
            return 1
        if not ct.running(t):
            io.err(f"Error response from daemon: container {ct.id} is not running\n")
            return 1
        procs = [(ct.main_pid or stable_int(2000, 90000, ct.id, "mainpid"), " ".join(ct.argv))]
        for sub in self.cluster.containers:
            if sub.node == ct.node and sub.name == f"{ct.name}#exec" and sub.running(t):
                procs.append((stable_int(2000, 90000, sub.id, "execpid"), " ".join(sub.argv)))
        fmt = " ".join(opts)
        if opts and "pid" not in fmt:
            io.err("Error response from daemon: Couldn't find PID field in ps output\n")
            return 1
        if "pid,args" in fmt or "pid,cmd" in fmt:
            io.out(f"{'PID':<20}{'COMMAND'}\n" + "".join(f"{pid:<20}{cmd}\n" for pid, cmd in procs))
        else:
            head = ("UID", "PID", "PPID", "C", "STIME", "TTY", "TIME", "CMD")
            io.out("".join(f"{h:<20}" for h in head[:-1]) + head[-1] + "\n"
                   + "".join(f"{'root':<20}{pid:<20}{'1':<20}{'0':<20}{'Dec01':<20}{'?':<20}{'00:00:01':<20}{cmd}\n"
                             for pid, cmd in procs))
        return 0

    async def d_stats(self, args: list[str], io: IO) -> int:
        io.out(F.docker_stats_json(self.cluster, self.node_name, self.now()))
        return 0

    async def d_images(self, args: list[str], io: IO) -> int:
        fmt = _opt_val(args, "--format", None)
        digests = "--digests" in args
        if fmt and fmt.strip() != "{{json .}}":  # a Go template: {{.Repository}}:{{.Tag}} {{.Digest}}
            io.out(_go_template(fmt, F.docker_images(self.cluster, self.node_name, self.now(), True, digests=True)))
            return 0
        io.out(F.docker_images(self.cluster, self.node_name, self.now(), bool(fmt), digests=digests))
        return 0

    def _store(self) -> tuple[str, list[list[str]]]:
        """The image store's ``Driver`` and ``DriverStatus``: the containerd store (``overlayfs``,
        Docker 29's default on other vendors' GB10 boxes: sparkrun#152) or overlay2, as on the Spark
        capture (tests/fixtures/real/dgx-os/stock-spark-docker-info.txt)."""
        if self.cluster.image_store == "overlay2":
            return "overlay2", [["Backing Filesystem", "extfs"], ["Supports d_type", "true"],
                                ["Using metacopy", "false"], ["Native Overlay Diff", "true"], ["userxattr", "false"]]
        return "overlayfs", [["driver-type", "io.containerd.snapshotter.v1"]]

    async def d_info(self, args: list[str], io: IO) -> int:
        fmt = _opt_val(args, "--format", None) or _opt_val(args, "-f", None)
        t = self.now()
        cts = self.cluster.containers_on(self.node_name)
        running = sum(1 for c in cts if c.running(t))
        driver, status = self._store()
        if fmt is not None:
            io.out(_go_fields(fmt, {"Driver": driver, "DriverStatus": status, "ServerVersion": DOCKER_VERSION,
                                    "NCPU": 20, "OperatingSystem": "Ubuntu 24.04.3 LTS", "Architecture": "aarch64",
                                    "DockerRootDir": "/var/lib/docker", "Containers": len(cts),
                                    "ContainersRunning": running, "ContainersStopped": len(cts) - running,
                                    "Images": len(self.cluster.images_on(self.node_name, t)), "DefaultRuntime": "runc",
                                    "CDISpecDirs": ["/etc/cdi", "/var/run/cdi"], "Name": self.node_name}) + "\n")
            return 0
        # the layout of the real capture (stock-spark-docker-info.txt): runc only, GPUs through CDI
        store = "".join(f"  {k}: {v}\n" for k, v in status)
        io.out(f"Client: Docker Engine - Community\n Version:    {DOCKER_VERSION}\n Context:    default\n"
               " Debug Mode: false\n Plugins:\n  buildx: Docker Buildx (Docker Inc.)\n    Version:  v0.31.1\n"
               "    Path:     /usr/libexec/docker/cli-plugins/docker-buildx\n  compose: Docker Compose (Docker Inc.)\n"
               "    Version:  v5.0.2\n    Path:     /usr/libexec/docker/cli-plugins/docker-compose\n\n"
               f"Server:\n Containers: {len(cts)}\n  Running: {running}\n  Paused: 0\n  Stopped: {len(cts) - running}\n"
               f" Images: {len(self.cluster.images_on(self.node_name, t))}\n Server Version: {DOCKER_VERSION}\n"
               f" Storage Driver: {driver}\n{store} Logging Driver: json-file\n Cgroup Driver: systemd\n"
               " Cgroup Version: 2\n Plugins:\n  Volume: local\n  Network: bridge host ipvlan macvlan null overlay\n"
               "  Log: awslogs fluentd gcplogs gelf journald json-file local splunk syslog\n CDI spec directories:\n"
               "  /etc/cdi\n  /var/run/cdi\n Swarm: inactive\n Runtimes: io.containerd.runc.v2 runc\n"
               " Default Runtime: runc\n Init Binary: docker-init\n"
               " containerd version: dea7da592f5d1d2b7755e3a161be07f43fad8f75\n"
               f" Kernel Version: 6.14.0-1015-nvidia\n Operating System: Ubuntu 24.04.3 LTS\n OSType: linux\n"
               f" Architecture: aarch64\n CPUs: 20\n Total Memory: 119.7GiB\n Name: {self.node_name}\n"
               " Docker Root Dir: /var/lib/docker\n")
        return 0

    def _image_fields(self, img) -> dict[str, object]:
        """``docker image inspect``'s fields of ``img`` on this node (flat, dotted, for templates)."""
        iid = "sha256:" + self.cluster.image_id(self.node_name, img)
        return {"Id": iid, "RepoTags": [img.ref], "RepoDigests": [f"{img.repo}@{image_digest(img.ref)}"],
                "Created": f"{img.created}T10:12:44Z", "Size": img.size_bytes, "Architecture": "arm64", "Os": "linux",
                "Config.Entrypoint": list(img.entrypoint) if img.entrypoint else GoNil(),
                "Config.Cmd": list(img.cmd) if img.cmd else GoNil(),
                "Config.Env": [f"{k}={v}" for k, v in img.env],
                "Config.Labels": GoMap(img.labels) if img.labels else GoNil("map[]"),
                "Config.WorkingDir": "", "RootFS.Type": "layers", "RootFS.Layers": list(img.layers)}

    async def d_image(self, args: list[str], io: IO) -> int:
        if args[:1] == ["ls"]:
            return await self.d_images(args[1:], io)
        if args[:1] == ["inspect"] and len(args) > 1:
            fmt = _opt_val(args, "--format", None) or _opt_val(args, "-f", None)
            names = [a for a in args[1:] if not a.startswith("-") and a != fmt]
            rc = 0
            out = []
            for name in names:
                img = self.cluster.images_on(self.node_name).get(_norm_image(name))
                if img is None:
                    io.err(f"Error: No such image: {name}\n")
                    rc = 1
                    continue
                f = self._image_fields(img)
                if fmt:
                    io.out(_go_fields(fmt, f) + "\n")
                    continue
                config = {k.split(".", 1)[1]: v for k, v in f.items() if k.startswith("Config.")}
                out.append({"Id": f["Id"], "RepoTags": f["RepoTags"], "RepoDigests": f["RepoDigests"],
                            "Created": f["Created"], "Config": config, "Architecture": "arm64", "Os": "linux",
                            "Size": img.size_bytes, "RootFS": {"Type": "layers", "Layers": f["RootFS.Layers"]}})
            if not fmt:
                io.out(json.dumps(json.loads(_go_json(out)), indent=4) + "\n")
            return rc
        io.err("docker: 'image' needs a subcommand\n")
        return 1

    def _container(self, name: str, io: IO) -> Container | None:
        c = self.cluster.container(self.node_name, name)
        if c is None:
            io.err(f"Error response from daemon: No such container: {name}\n")
        return c

    async def d_logs(self, args: list[str], io: IO) -> int:
        tail = _opt_val(args, "--tail", None) or _opt_val(args, "-n", None)
        since = _opt_val(args, "--since", None)
        follow = "-f" in args or "--follow" in args
        stamps = "-t" in args or "--timestamps" in args
        names = [a for a in args if not a.startswith("-") and a not in (tail, since)]
        if not names:
            io.err('"docker logs" requires exactly 1 argument.\n')
            return 1
        ct = self._container(names[-1], io)
        if ct is None:
            return 1
        t = self.now()
        lo = -math.inf
        if since is not None:
            lo = _since(since, self.clock.epoch(0.0), self.clock.epoch(t))
            if lo is None:
                io.err(f'invalid value for "since": failed to parse value as time or duration: "{since}"\n')
                return 1
        if ct.hostile is not None:  # records made as they are read, never held (sim/hostile.py)
            return await sim_hostile.docker_logs(self, ct, lo, None if tail in (None, "all") else int(tail),
                                                 follow, stamps, io)
        lines = ct.log_between(lo, t)
        if tail not in (None, "all"):
            n = int(tail)
            lines = lines[-n:] if n > 0 else []
        for ln in lines:
            (io.err if isinstance(ln, ErrLine) else io.out)(self._fmt_log(ln, stamps))
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
            for ln in ct.log_between(last, end):
                (io.err if isinstance(ln, ErrLine) else io.out)(self._fmt_log(ln, stamps))
            last = max(last, end)
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
        run = ct.headless.run if ct.headless is not None else None
        if run is not None:
            cand += [ln.t for ln in run.peer_lines.get(ct.node, ()) if ln.t > after]
            end = run.peer_end.get(ct.node)
            if end is not None and end > after:
                cand.append(end)
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
        """``docker stop [-t|--time SECONDS] [-s|--signal SIGNAL] NAME…``: the option values are not
        names (the memory guard's watcher sends ``docker stop -t 10 NAME``); an engine here ends on
        SIGTERM well within the grace."""
        async def stop(ct: Container) -> None:
            await self.clock.sleep(0.4)
            self._stop(ct, self.now(), 0)

        valued = {"-t", "--time", "-s", "--signal"}
        names = [a for i, a in enumerate(args) if a not in valued and (i == 0 or args[i - 1] not in valued)]
        return await self._each_container(names, io, stop)

    def _stop(self, ct: Container, t: float, code: int) -> None:
        stop_container(self.cluster, ct, t, code)

    async def d_kill(self, args: list[str], io: IO) -> int:
        """``docker kill [-s SIGNAL] NAME…``: SIGKILL by default (exit 137, ``OOMKilled`` false); the
        container's processes end at once, its log stops, its memory is freed."""
        sig = _opt_val(args, "--signal", None) or _opt_val(args, "-s", None) or "KILL"
        num = _signal_number(sig)
        if num is None:
            io.err(f"Error response from daemon: Invalid signal: {sig}\n")
            return 1
        rc = 0
        for name in [a for a in args if not a.startswith("-") and a != sig]:
            ct = self.cluster.container(self.node_name, name)
            if ct is None:
                io.err(f"Error response from daemon: Cannot kill container: {name}: No such container: {name}\n")
                rc = 1
                continue
            if not ct.running(self.now()):
                io.err(f"Error response from daemon: Cannot kill container: {name}: Container {ct.id} is not "
                       "running\n")
                rc = 1
                continue
            stop_container(self.cluster, ct, self.now(), 128 + num)
            io.out(name + "\n")
        return rc

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
        ct.headless = None
        ct.started = t
        ct.stopped = None
        ct.exit_code = None
        ct.oom_killed = False
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
        detach = rm = False
        sig_proxy = True
        name = entrypoint = None
        env: list[tuple[str, str]] = []
        mounts: list[str] = []
        binds: list[tuple[str, str]] = []
        devices: list[tuple[str, str]] = []  # --gpus / --device: what reaches the GPU
        user = ""
        network = "bridge"
        i = 0
        while i < len(args) and args[i].startswith("-") and args[i] != "-":
            a = args[i]
            key, eq, val = a.partition("=") if a.startswith("--") else (a, "", "")
            if key.startswith("--"):
                if key in RUN_VALUE_OPTS:
                    if not eq:
                        if i + 1 >= len(args):
                            io.err(f"flag needs an argument: {key}\nSee 'docker run --help'.\n")
                            return 125
                        val = args[i + 1]
                        i += 1
                elif key not in RUN_BOOL_OPTS:
                    io.err(f"unknown flag: {key}\nSee 'docker run --help'.\n")
                    return 125
            else:  # short flags, clustered: -dit, -e K=V, -eK=V
                j = 1
                key = ""
                while j < len(a):
                    f = "-" + a[j]
                    if f in RUN_VALUE_OPTS:
                        key = f
                        val = a[j + 1:]
                        if not val:
                            if i + 1 >= len(args):
                                io.err(f"flag needs an argument: '{a[j]}' in {a}\nSee 'docker run --help'.\n")
                                return 125
                            val = args[i + 1]
                            i += 1
                        break
                    if f not in RUN_BOOL_OPTS:
                        io.err(f"unknown shorthand flag: '{a[j]}' in {a}\nSee 'docker run --help'.\n")
                        return 125
                    detach = detach or f == "-d"
                    rm = rm or f == "--rm"
                    j += 1
            if key in ("-d", "--detach"):
                detach = val not in ("false", "0") if eq else True
            elif key == "--rm":
                rm = val not in ("false", "0") if eq else True
            elif key == "--sig-proxy":
                sig_proxy = val not in ("false", "0") if eq else True
            elif key == "--name":
                name = val
            elif key in ("-e", "--env"):
                # `-e NAME` takes NAME from the client's environment; unset there, it is not set at all
                k, has, v = val.partition("=")
                if has or k in io.env:
                    env.append((k, v if has else io.env[k]))
            elif key in ("-v", "--volume"):
                mounts.append(val.split(":")[0])
                src, _, rest = val.partition(":")
                if src.startswith("/"):  # HOST:CTR[:OPTS] is a bind mount (a bare name is a named volume)
                    binds.append((src, rest.split(":")[0] or src))
            elif key == "--mount":  # type=bind,source=/a,target=/b[,readonly]
                kv = dict(p.partition("=")[::2] for p in val.split(","))
                src, dst = kv.get("source") or kv.get("src") or "", kv.get("target") or kv.get("dst") or ""
                if kv.get("type", "volume") == "bind" and src.startswith("/") and dst:
                    mounts.append(src)
                    binds.append((src, dst))
            elif key in ("--gpus", "--device"):
                devices.append((key, val))
            elif key in ("-u", "--user"):
                user = val
            elif key in ("--network", "--net"):
                network = val
            elif key == "--entrypoint":
                entrypoint = val
            i += 1
        if i >= len(args):
            io.err('docker: \'docker run\' requires at least 1 argument\n\nUsage:  docker run [OPTIONS] IMAGE '
                   "[COMMAND] [ARG...]\n\nSee 'docker run --help' for more information\n")
            return 125
        image = _norm_image(args[i])
        user_cmd = args[i + 1:]
        img = self.cluster.images_on(self.node_name).get(image)
        if img is None:
            if not self.node.internet:
                reg = _registry_host(image)
                io.err(f"Unable to find image '{args[i]}' locally\ndocker: Error response from daemon: Get "
                       f"\"https://{reg}/v2/\": dial tcp: lookup {reg} on "
                       "127.0.0.53:53: server misbehaving\n\nRun 'docker run --help' for more information\n")
                return 125
            io.err(f"Unable to find image '{args[i]}' locally\n")
            rc = await self.d_pull([image], IO(io.err, io.err))
            if rc:
                return 125
            img = self.cluster.images_on(self.node_name).get(image)
        if name is None:
            name = f"{_ADJ[stable_int(0, len(_ADJ), self.now(), 'a')]}_{_NAMES[stable_int(0, len(_NAMES), self.now(), 'n')]}"
        if self.cluster.container(self.node_name, name) is not None:
            cid = self.cluster.container(self.node_name, name).id  # type: ignore[union-attr]
            io.err(f'docker: Error response from daemon: Conflict. The container name "/{name}" is already in use '
                   f'by container "{cid}". You have to remove (or rename) that container to be able to reuse that '
                   "name.\n\nRun 'docker run --help' for more information\n")
            return 125
        if entrypoint is not None:  # --entrypoint replaces the image's ENTRYPOINT and drops its CMD
            cmd = ([entrypoint] if entrypoint else []) + user_cmd
        else:
            default = list(img.cmd or ()) if img is not None else ["bash"]
            cmd = list(img.entrypoint if img is not None else ()) + (user_cmd or default)
        if not cmd:
            io.err("docker: Error response from daemon: no command specified\n\nRun 'docker run --help' for more "
                   "information\n")
            return 125
        node_fs = self.cluster.fs(self.node_name)
        for h, _c in binds:  # docker creates a missing bind source on the node (as root)
            if node_fs.lookup(h) is None:
                node_fs.mkdir(h, parents=True)
        t = self.now()
        ct = Container(id=stable_hex(64, self.node_name, name, t), name=name, image=args[i],
                       argv=tuple(cmd), node=self.node_name, created=t, started=t + 0.6, env=tuple(env),
                       network=network, mounts=",".join(mounts), binds=tuple(binds), gpus=gpu_visible(devices),
                       user=user)
        self.cluster.add_container(ct)
        await self.clock.sleep(0.6)
        plan = self._plan(ct, ct.started or t)
        if isinstance(plan, str):  # the OCI runtime could not start it: docker run says so, exit 127
            io.err(plan)
            ct.stopped = ct.started
            ct.exit_code = 127
            if rm:
                self.cluster.remove_container(ct)
            return 127
        if isinstance(plan, list):  # a command the container runs as a process (hf download, python3 -c ...)
            if detach:
                self._spawn_in_container(ct, plan, rm)
                io.out(ct.id + "\n")
                return 0
            return await self._run_in_container(ct, plan, io.out, io.err, io.stdin, rm,
                                                client=io.proc if sig_proxy else None)
        if detach:
            io.out(ct.id + "\n")
            return 0
        rc = await self.d_logs(["-f", ct.name], io)  # attached: its output until it exits
        info = ct.exit_info(self.now())
        if rm and ct in self.cluster.containers:
            self.cluster.remove_container(ct)
        return info[0] if info else rc

    # ---- what a container runs ---------------------------------------------------------------

    def _launch(self, ct: Container, t: float) -> str | None:
        """Start what the container's command says (``docker start``/``restart``: detached). Returns
        the OCI runtime's error text for an executable the image does not have."""
        plan = self._plan(ct, t)
        if isinstance(plan, list):
            self._spawn_in_container(ct, plan, False)
            return None
        return plan

    def _plan(self, ct: Container, t: float) -> str | list[str] | None:
        """What starting ``ct`` does: an error text (the executable is not in the image: Docker's OCI
        error), None (a planned run: a vLLM engine, a Ray member, SGLang, a sleeper, or an exit already
        logged), or the command line to run as a process in the container (its shell's tools:
        ``hf download``, ``python3 -c``, ``sh -c '...'``, ``cat`` ...)."""
        cmd = list(ct.argv)
        img = IMAGES.get(_norm_image(ct.image))
        ct.host_rss = 300 * 1024**2
        if not cmd:
            return _oci_missing("")
        if not has_command(img, ct.gpus, cmd[0]):
            return _oci_missing(cmd[0])
        if cmd[0] == NGC_ENTRYPOINT:  # NVIDIA's entrypoint: its banner, then ``exec "$@"`` (bash if none)
            for k, line in enumerate(_ngc_banner(img, ct.gpus)):
                ct.log.append(LogLine(t + 0.1 + k * 1e-4, line))
            cmd = cmd[1:] or ["/bin/bash"]
            if not has_command(img, ct.gpus, cmd[0]):  # bash's exec of a missing command: 127
                ct.log.append(ErrLine(t + 0.3, f"{NGC_ENTRYPOINT}: line {NGC_EXEC_LINE}: exec: {cmd[0]}: not found"))
                ct.stopped, ct.exit_code = t + 0.35, 127
                return None
            t += 0.3
        if cmd[:2] in (["bash", "-c"], ["sh", "-c"], ["/bin/bash", "-c"], ["/bin/sh", "-c"]) and len(cmd) > 2:
            inner = self.peel(self.tokenize(cmd[2]))
            if inner[:1] in (["vllm"], ["ray"]) or inner[:3] in (["python3", "-m", "vllm.entrypoints.openai.api_server"],
                                                              ["python3", "-m", "sglang.launch_server"]):
                if not has_command(img, ct.gpus, inner[0]):  # sh's own error: "sh: 1: ray: not found"
                    ct.log.append(ErrLine(t + 0.1, f"{cmd[0].rsplit('/', 1)[-1]}: 1: {inner[0]}: not found"))
                    ct.stopped, ct.exit_code = t + 0.15, 127
                    return None
                cmd = inner
        serve = _serve_argv(cmd)
        if serve is not None and img is not None:
            if not img.vllm_version:
                ct.log.append(ErrLine(t + 0.4, "/usr/bin/python3: Error while finding module specification for "
                                      "'vllm.entrypoints.openai.api_server' (ModuleNotFoundError: No module named "
                                      "'vllm')"))
                ct.stopped, ct.exit_code = t + 0.5, 1
                return None
            ct.kind = "vllm"
            if serve[:2] == ["vllm", "serve"]:  # `IMAGE vllm serve X` on an image whose entrypoint is `vllm serve`
                ct.log.append(LogLine(t + 3.0, "usage: vllm serve [model_tag] [options]\nvllm serve: error: "
                                      f"unrecognized arguments: {' '.join(serve[1:])}"))
                ct.stopped, ct.exit_code = t + 3.1, 2
                return None
            env = container_env(self.cluster, ct, img)
            return self._start_engine(ct, serve, t, img.vllm_version, pid_api=1,
                                      driver=self._driver_env(env, container_fs(self.cluster, ct, img)))
        if cmd[:2] == ["ray", "start"]:
            ct.kind = "ray"
            ct.host_rss = 640 * 1024**2
            err, text = self._ray_start(cmd[2:], t, container=ct.name)
            ct.log.append(LogLine(t + 2.5, (err or text).rstrip("\n")))
            if err:
                ct.stopped = t + 2.6
                ct.exit_code = 1
            elif "--block" not in cmd:
                ct.stopped = t + 2.7  # `ray start` returns: the container's main process is done
                ct.exit_code = 0
            return None
        if cmd[:1] in (["python3"], ["python"]) and cmd[1:3] == ["-m", "sglang.launch_server"]:
            if img is None or not img.sglang_version:
                ct.log.append(ErrLine(t + 0.4, "/usr/bin/python3: Error while finding module specification for "
                                      "'sglang.launch_server' (ModuleNotFoundError: No module named 'sglang')"))
                ct.stopped, ct.exit_code = t + 0.5, 1
                return None
            sglang_launch(self.cluster, ct, cmd[3:], t)
            ct.kind = "sglang"
            return None
        base = cmd[0].rsplit("/", 1)[-1]
        if base in ("sleep", "tail") or (base in ("bash", "sh") and len(cmd) == 1):
            return None  # a keep-alive: runs until stopped
        return cmd

    def _container_shell(self, ct: Container, env: dict[str, str]):
        """A shell in ``ct``: its files, its commands, root, the container's environment."""
        sub = self.fork()
        sub.container = ct
        sub.image = IMAGES.get(_norm_image(ct.image))
        sub.cwd = "/"
        sub.account = ROOT  # the images run as root, whoever called docker
        sub.vars, sub.exported = dict(env), set(env)
        sub.which = sub.container_which  # command -v / type: the image's PATH, not the node's
        return sub

    async def _run_in_container(self, ct: Container, cmd: list[str], out, err, stdin: str | None = None,
                                rm: bool = False, client=None) -> int:
        """``cmd`` as ``ct``'s main process, attached (``docker run`` without ``-d``): its output as it
        comes, also kept for ``docker logs``; the container exits with it. The process is the
        container's, not the client's: the client passes on the signals it gets (``--sig-proxy``,
        on by default: TERM, HUP, INT …; a KILL cannot be passed on and leaves the container
        running), and ``--rm`` removes the container when its process has ended."""
        attached = [True]

        def o(x: str) -> None:
            if attached[0]:
                out(x)

        def e(x: str) -> None:
            if attached[0]:
                err(x)

        task = self._spawn_in_container(ct, cmd, rm, o, e, stdin)
        try:
            await asyncio.wait({task})  # our own cancellation does not cancel the container's process
        except asyncio.CancelledError:
            attached[0] = False
            sig = getattr(client, "killed_by", None)
            if sig not in (None, 9) and ct.main_pid is not None:
                self.procs.signal(ct.main_pid, sig)
            raise
        return task.result() if not task.cancelled() and task.exception() is None else (ct.exit_code or 137)

    def _spawn_in_container(self, ct: Container, cmd: list[str], rm: bool, out=None, err=None,
                            stdin: str | None = None) -> asyncio.Task[int]:
        """``cmd`` as ``ct``'s main process (a child of the container's shim, not of the docker client):
        its output is the container's log (and goes to ``out``/``err`` too when attached)."""
        env = container_env(self.cluster, ct, IMAGES.get(_norm_image(ct.image)))
        sub = self._container_shell(ct, env)
        keep, keep_err = _LogSink(ct, self.now), _LogSink(ct, self.now, ErrLine)

        def o(x: str) -> None:
            keep(x)
            if out is not None:
                out(x)

        def e(x: str) -> None:
            keep_err(x)
            if err is not None:
                err(x)

        p = self.procs.spawn(cmd, parent=None, bg=True)

        async def main() -> int:
            try:
                rc = await sub.exec_argv(cmd, IO(o, e, stdin or "", env, p))
                if ct.running(self.now()):
                    ct.stopped, ct.exit_code = self.now(), rc
                return rc
            finally:
                keep.flush()
                keep_err.flush()
                if ct.running(self.now()):  # killed: ``docker stop``/``kill`` already set how it ended
                    ct.stopped, ct.exit_code = self.now(), 137
                if rm and ct in self.cluster.containers:  # --rm: gone once its process has ended
                    self.cluster.remove_container(ct)

        ct.main_pid = p.pid
        return self.procs.start(p, main(), on_its_own=True)

    def container_which(self, name: str) -> str | None:
        """``command -v NAME`` in a container: where the image has it."""
        ct = self.container
        img = IMAGES.get(_norm_image(ct.image)) if ct is not None else None
        cmds = image_commands(img, bool(ct and ct.gpus))
        if "/" in name:
            return name if has_command(img, bool(ct and ct.gpus), name) else None
        return cmds.get(name)

    def _driver_env(self, env: dict[str, str], fs) -> vllm_logs.DriverEnv:
        """The environment a ``vllm serve`` runs with, and its ``ray_non_carry_over_env_vars.json``:
        ``$VLLM_CONFIG_ROOT`` (default ``${XDG_CONFIG_HOME:-~/.config}/vllm``: ``/root/.config/vllm`` in a
        root container), read once when ``vllm.ray.ray_env`` is imported [vllm/ray/ray_env.py]."""
        home = env.get("HOME") or "/root"
        root = env.get("VLLM_CONFIG_ROOT") or f"{env.get('XDG_CONFIG_HOME') or home + '/.config'}/vllm"
        path = f"{root.rstrip('/')}/ray_non_carry_over_env_vars.json"
        try:
            text = fs.read_text(path)
        except FsError:
            return vllm_logs.DriverEnv(dict(env), frozenset(), path)
        try:
            names = json.loads(text)
            listed = frozenset(str(n) for n in names) if isinstance(names, (list, dict, str)) else frozenset()
        except ValueError:  # vLLM warns and copies everything
            return vllm_logs.DriverEnv(dict(env), frozenset(), path, bad_file=True)
        return vllm_logs.DriverEnv(dict(env), listed, path)

    def _start_engine(self, ct: Container, serve_argv: list[str], t: float, version: str, pid_api: int,
                      driver: vllm_logs.DriverEnv | None = None) -> str | None:
        try:
            args = vllm_logs.parse_serve_args(serve_argv, version=version)
        except vllm_logs.ServeArgError as exc:
            ct.log.append(LogLine(t + 3.0, str(exc)))
            ct.stopped = t + 3.1
            ct.exit_code = 2
            return None
        repo = args.model
        img = IMAGES.get(_norm_image(ct.image))
        # a model folder (the canary's miniature): read as vLLM reads it, through the container's mounts
        local = sim_miniature.local_model(container_fs(self.cluster, ct, img), repo) if repo.startswith("/") else None
        spec = local or MODELS.get(repo)
        # an upstream build on GB10 (every simulated node's GPU, sm_121): its CUTLASS block-FP8 GEMM has no
        # sm_121 kernel (sim/serve_plan.py); a build with sm_121 targets (NGC's) has
        kernels_fail = bool(spec is not None and spec.fp8_block and ct.gpus and img is not None
                            and "sm_121" not in img.cuda_archs
                            # the field's workaround: the Triton block-FP8 kernel instead (vllm#43367)
                            and "CutlassFp8BlockScaledMMKernel" not in
                            (driver.env.get("VLLM_DISABLED_KERNELS", "") if driver is not None else ""))
        if repo in MODELS and not self.sees_model(ct, repo) and not self.node.internet:
            ct.log.append(LogLine(t + 4.0, f"(APIServer pid={pid_api}) OSError: We couldn't connect to "
                                  "'https://huggingface.co' to load the files, and couldn't find them in the cached "
                                  f"files.\nCheck your internet connection or see how to run the library in offline "
                                  "mode at 'https://huggingface.co/docs/transformers/installation#offline-mode'."))
            ct.stopped = t + 4.1
            ct.exit_code = 1
            return None
        if args.nnodes > 1 and (args.headless or args.node_rank > 0):
            # a native multi-node rank > 0: its workers wait for the head (rank 0) at the rendezvous
            lines, code = vllm_logs.plan_headless(self.cluster, self.node, ct, version, args, t)
            ct.log.extend(lines)
            if code is not None:
                ct.stopped, ct.exit_code = lines[-1].t + 0.1, code
                return None
            ct.host_rss = int(1.6 * 1024**3)
            vllm_logs.rank_joined(self.cluster, ct)
            return None
        ct.engine = vllm_logs.plan_serve(self.cluster, self.node, ct.name, version, args, t, pid_api=pid_api,
                                         driver_env=driver, spec=local, kernels_fail=kernels_fail)
        ct.host_rss = int(2.4 * 1024**3)
        return None

    def sees_model(self, ct: Container, repo: str) -> bool:
        """Whether ``repo``'s files are whole in the container's HF cache (``$HF_HOME`` of the container,
        else root's ``/root/.cache/huggingface``), read through its bind mounts: ``-v
        /home/nvidia/.cache/huggingface:/root/.cache/huggingface`` shows the login user's cache there;
        without a bind over it the container has no weights of its own (a path outside every bind is
        the node's own: the permissive twin's root cache)."""
        hf_home = dict(ct.env).get("HF_HOME") or CONTAINER_HF_HOME
        owner, name = repo.split("/", 1)
        snap = f"{hf_home}/hub/models--{owner}--{name}/snapshots/{repo_revision(repo)}"
        hit = through_binds(ct.binds, snap)
        host = hit[0] if hit is not None else snap
        return not self.cluster.model_files_ok(self.node_name, repo, path=host)

    async def d_exec(self, args: list[str], io: IO) -> int:
        detach = False
        extra: dict[str, str] = {}
        i = 0
        while i < len(args) and args[i].startswith("-"):
            a = args[i]
            key, eq, val = a.partition("=")
            if key in ("-e", "--env", "-w", "--workdir", "-u", "--user", "--env-file"):
                if not eq:
                    val = args[i + 1] if i + 1 < len(args) else ""
                    i += 1
                if key in ("-e", "--env"):
                    k, has, v = val.partition("=")
                    if has or k in io.env:  # `-e NAME`: the client's NAME, if it has one
                        extra[k] = v if has else io.env[k]
            elif key in ("-d", "--detach") or (not a.startswith("--") and set(a[1:]) <= set("dit")):
                detach = detach or "d" in a
            elif key not in ("-i", "-t", "-it", "--interactive", "--tty", "--privileged"):
                io.err(f"unknown flag: {key}\nSee 'docker exec --help'.\n")
                return 125
            i += 1
        if i + 1 >= len(args):
            io.err('docker: \'docker exec\' requires at least 2 arguments\n\nUsage:  docker exec [OPTIONS] '
                   "CONTAINER COMMAND [ARG...]\n\nSee 'docker exec --help' for more information\n")
            return 1
        ct = self._container(args[i], io)
        if ct is None:
            return 1
        if not ct.running(self.now()):
            io.err(f"Error response from daemon: container {ct.id} is not running\n")
            return 1
        cmd = args[i + 1:]
        img = IMAGES.get(_norm_image(ct.image))
        if not has_command(img, ct.gpus, cmd[0]):  # the runtime cannot exec it: no shell says "not found"
            io.err(_oci_exec_missing(cmd[0]))
            return 127
        # the container's environment (image ENV, docker run -e) plus this exec's -e, never the caller's
        env = {**container_env(self.cluster, ct, img), **extra}
        sub = self._container_shell(ct, env)
        run_io = IO(io.out, io.err, io.stdin, env, io.proc)
        if detach:
            p = self.procs.spawn(cmd, parent=None, bg=True)  # a child of the container's shim, not of ours
            self.procs.start(p, sub.exec_argv(cmd, IO(_drop, _drop, "", env, p)), on_its_own=True)
            return 0
        return await sub.external(cmd, run_io)

    # ---- in a container (docker exec): vllm, python3 -----------------------------------------

    async def c_vllm(self, argv: list[str], io: IO) -> int:
        img = getattr(self, "image", None)
        if getattr(self, "container", None) is None or img is None or not img.vllm_version:
            io.err(f"{self.err_prefix()}vllm: not found\n")
            return 127
        if argv[1:2] in (["--version"], ["-v"]):
            await self.clock.sleep(1.5)
            io.out(img.vllm_version + "\n")
            return 0
        if argv[1:3] == ["bench", "serve"]:  # the benchmark (sparkconsole.sim.tools.bench)
            return await self.vllm_bench_serve(argv[3:], io)  # type: ignore[attr-defined]
        serve = _serve_argv(argv)
        if serve is None:
            io.err("usage: vllm [-h] [-v] {chat,complete,serve,bench,collect-env,run-batch} ...\n")
            return 2
        return await self._exec_engine(serve, img, io)

    async def c_python3(self, argv: list[str], io: IO) -> int:
        img = getattr(self, "image", None)
        if getattr(self, "container", None) is None or img is None:
            io.err(f"{self.err_prefix()}python3: not found\n")
            return 127
        serve = _serve_argv(argv)
        if serve is not None:
            if not img.vllm_version:
                io.err("/usr/bin/python3: Error while finding module specification for 'vllm.entrypoints.openai."
                       "api_server' (ModuleNotFoundError: No module named 'vllm')\n")
                return 1
            return await self._exec_engine(serve, img, io)
        if argv[1:2] in (["-V"], ["--version"]):
            io.out("Python 3.12.3\n")
            return 0
        if argv[1:2] == ["-c"] and len(argv) == 2:
            io.err("Argument expected for the -c option\nusage: python3 [option] ... [-c cmd | -m mod | file | -] "
                   "[arg] ...\nTry `python -h' for more information.\n")
            return 2
        if argv[1:2] == ["-"] and sim_miniature.is_writer(io.stdin or ""):  # the canary's writer, on stdin
            return await sim_miniature.run_writer(self, argv, io)
        program = argv[2] if argv[1:2] == ["-c"] else (io.stdin or "") if argv[1:] in ([], ["-"]) else None
        if program is not None:  # the program runs in the image's Python (sparkconsole.sim.pyexec)
            await self.clock.sleep(2.2)
            ct = self.container
            out, err, rc = engine_check(img, program, gpu=bool(ct and ct.gpus), env=dict(io.env), argv=argv[3:])
            io.out(out)
            io.err(err)
            return rc
        io.err(f"python3: can't open file '{argv[1] if len(argv) > 1 else ''}': [Errno 2] No such file or "
               "directory\n")
        return 2

    c_python = c_python3

    async def _exec_engine(self, serve: list[str], img, io: IO) -> int:
        parent: Container = self.container
        now = self.now()
        sub = Container(id=stable_hex(64, parent.id, "exec", now), name=f"{parent.name}#exec", image=parent.image,
                        argv=tuple(["vllm", "serve", *serve]), node=self.node_name, created=now, started=now,
                        network="exec", binds=parent.binds)
        pid = stable_int(300, 9000, parent.name, now, "execpid")
        # the serve runs with this exec's environment and reads its config root in this container
        self._start_engine(sub, serve, now, img.vllm_version, pid_api=pid,
                           driver=self._driver_env(dict(io.env), self.fs))
        sub.kind = "vllm"
        self.cluster.add_container(sub)
        last = now - 1e-9
        try:
            while True:
                now = self.now()
                if not parent.running(now) and sub.running(now):
                    sub.stopped = parent.stopped if parent.stopped is not None else now
                    if sub.engine:
                        sub.engine.stop(sub.stopped)
                for ln in sub.log_between(last, now):  # `> LOG 2>&1` merges them, in the order written
                    (io.err if isinstance(ln, ErrLine) else io.out)(ln.text + "\n")
                last = now
                if not sub.running(now):
                    info = sub.exit_info(now)
                    return info[0] if info else 0
                nxt = self._next_log_time(sub, now)
                await self.clock.sleep(1.0 if nxt is None else max(0.05, min(nxt - now, 5.0)))
        except asyncio.CancelledError:
            t = self.now()
            if sub.running(t):  # the process was killed: its engine goes with it
                sub.stopped, sub.exit_code = t, 143
                if sub.engine is not None:
                    sub.engine.stop(t)
            raise

    async def d_pull(self, args: list[str], io: IO) -> int:
        refs = [a for a in args if not a.startswith("-")]
        if not refs:
            io.err('"docker pull" requires exactly 1 argument.\n')
            return 1
        ref = _norm_image(refs[0])
        reg = _registry_host(ref)
        if not self.node.internet:
            io.err(f'Error response from daemon: Get "https://{reg}/v2/": dial tcp: lookup '
                   f"{reg} on 127.0.0.53:53: server misbehaving\n")
            return 1
        img = IMAGES.get(ref)
        repo, tag = ref.rsplit(":", 1)
        full = ref if reg != "registry-1.docker.io" else f"docker.io/{ref}"
        short = repo.split("/", 1)[1] if reg != "registry-1.docker.io" else repo
        if img is None:
            io.err(f"Error response from daemon: pull access denied for {repo}, repository does not exist or may "
                   "require 'docker login': denied: requested access to the resource is denied\n")
            return 1
        if ref in self.cluster.images_on(self.node_name):
            io.out(f"{tag}: Pulling from {short}\nDigest: {image_digest(ref)}\nStatus: Image is up to date for "
                   f"{ref}\n{full}\n")
            return 0
        io.out(f"{tag}: Pulling from {short}\n")
        layers = [lay[7:19] for lay in img.layers]
        for lay in layers:
            io.out(f"{lay}: Pulling fs layer\n")
        tr = Transfer("image", ref, None, self.node_name, self.now(), img.size_bytes, self.cluster.internet_bps)
        self.cluster.transfers.append(tr)
        for k, lay in enumerate(layers):
            try:
                await self.clock.sleep((tr.t1 - tr.t0) / len(layers))
            except asyncio.CancelledError:
                tr.cancelled_at = self.now()
                raise
            io.out(f"{lay}: Download complete\n")
            if k == len(layers) - 1:
                for lay2 in layers:
                    io.out(f"{lay2}: Pull complete\n")
        io.out(f"Digest: {image_digest(ref)}\nStatus: Downloaded newer image for {ref}\n{full}\n")
        return 0

    async def d_save(self, args: list[str], io: IO) -> int:
        io.err("cowardly refusing to save to a terminal. Use the -o flag or redirect\n")
        return 1

    async def d_load(self, args: list[str], io: IO) -> int:
        io.err("requested load from stdin, but stdin is empty\n")
        return 1

    async def d_inspect(self, args: list[str], io: IO) -> int:
        fmt = _opt_val(args, "--format", None) or _opt_val(args, "-f", None)
        names = [a for a in args if not a.startswith("-") and a != fmt]
        rc = found = 0
        t = self.now()
        for n in names:
            ct = self.cluster.container(self.node_name, n)
            if ct is None:
                img = self.cluster.images_on(self.node_name).get(_norm_image(n))
                if img is not None:
                    rc = max(rc, await self.d_image(["inspect", *(["-f", fmt] if fmt else []), n], io))
                    found += 1
                    continue
                io.err(f"Error: No such object: {n}\n")
                rc = 1
                continue
            st = self._state_json(ct, t)
            fields: dict[str, object] = {
                "Id": ct.id, "Name": "/" + ct.name, "State": st, "Config.Image": ct.image,
                "Image": "sha256:" + (self.cluster.image_id(self.node_name, IMAGES[_norm_image(ct.image)])
                                      if _norm_image(ct.image) in IMAGES else ""),
                "HostConfig.NetworkMode": ct.network,
                # what the container's process runs: the daemon splits ENTRYPOINT + CMD into the
                # executable (``Path``) and the rest (``Args``, ``[]`` when none), as the Engine API's
                # ContainerInspectResponse gives them; ``ct.argv`` is that vector already
                "Path": ct.argv[0] if ct.argv else "", "Args": list(ct.argv[1:])}
            fields.update({f"State.{k}": v for k, v in st.items()})
            found += 1
            if fmt:
                io.out(_go_fields(fmt, fields) + "\n")
            else:
                io.out(json.dumps([{"Id": ct.id, "Path": fields["Path"], "Args": fields["Args"],
                                    "Name": "/" + ct.name, "State": st,
                                    "Config": {"Image": ct.image, "Env": [f"{k}={v}" for k, v in ct.env]},
                                    "HostConfig": {"NetworkMode": ct.network}}], indent=4) + "\n")
        if fmt and not found:
            io.out("\n")  # the client prints its (empty) template buffer when no name was found
        return rc

    def _state_json(self, ct: Container, t: float) -> dict[str, object]:
        """A container's ``State`` as the engine's API returns it, fields in docker's order
        (``tests/fixtures/docker/docker_inspect_state_20.10.txt``)."""
        info = ct.exit_info(t)
        state = ct.state(t)
        running = state == "running"
        started = _rfc3339nano(self.clock.epoch(ct.started)) if ct.started is not None and state != "created" \
            else GO_ZERO_TIME
        finished = _rfc3339nano(self.clock.epoch(info[1])) if info and state == "exited" else GO_ZERO_TIME
        return {"Status": state, "Running": running, "Paused": False, "Restarting": False,
                "OOMKilled": bool(ct.oom_killed and not running), "Dead": False,
                "Pid": stable_int(1000, 99999, ct.id, ct.started, "pid") if running else 0,
                "ExitCode": info[0] if info else 0, "Error": "", "StartedAt": started, "FinishedAt": finished}

    async def image_copy(self, left: list[str], right: list[str], io: IO) -> int:
        """``docker save IMAGE | ssh [opts] HOST docker load``: the image moves at ``IMAGE_COPY_BPS``; the
        far side prints ``Loaded image: IMAGE``; killed midway, nothing is loaded."""
        refs = [a for a in left[2:] if not a.startswith("-")]
        if not refs:
            io.err('docker: \'docker save\' requires at least 1 argument\n')
            return 1
        if self.docker_denied(self.account):  # type: ignore[attr-defined]
            io.err(DOCKER_SOCKET_DENIED + "requested load from stdin, but stdin is empty\n")
            return 1
        ref = _norm_image(refs[0])
        img = self.cluster.images_on(self.node_name).get(ref)
        host, cmd = _ssh_target(right[1:])
        if img is None:
            io.err("Error response from daemon: reference does not exist\n"
                   "requested load from stdin, but stdin is empty\n")
            return 1
        dst = self._resolve(host or "")
        if dst is None:
            await self.clock.sleep(3.0)
            io.err(f"ssh: connect to host {(host or '').split('@')[-1]} port 22: No route to host\r\n")
            return 255
        user, h = _ssh_user(right[1:], host or "")
        refused = self.ssh_refusal(dst, user, h)  # type: ignore[attr-defined]
        if refused is not None:
            io.err(refused)
            return 255
        if self.docker_denied(self.cluster.login(dst.name)):  # the far side's docker load, as its login user
            io.err(DOCKER_SOCKET_DENIED)
            return 1
        if self.peel(self.tokenize(" ".join(cmd)))[:2] != ["docker", "load"]:  # ssh joins, the far shell splits
            io.err("sparksim: only `docker save IMAGE | ssh HOST docker load` is modelled\n")
            return 2
        await self.clock.sleep(self.cluster.peer_ssh_s)
        tr = Transfer("image", ref, self.node_name, dst.name, self.now(), img.size_bytes, self.cluster.image_bps)
        self.cluster.transfers.append(tr)
        ramp = CacheRamp(dst.name, tr.t0, tr.t1, img.size_bytes)
        self.cluster.cache_ramps.append(ramp)
        try:
            await self.clock.sleep(tr.t1 - tr.t0)
        except asyncio.CancelledError:
            tr.cancelled_at = self.now()
            ramp.t1, ramp.nbytes = max(ramp.t0 + 1e-6, self.now()), tr.done_bytes(self.now())
            raise
        io.out(f"Loaded image: {ref}\n")
        return 0
