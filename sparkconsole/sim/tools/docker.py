"""Docker: ``ps``, ``stats``, ``images [--digests]``, ``image inspect``, ``info``, ``version``,
``logs [-f] [-t] [--tail N] [--since T]`` (incremental: a follow wake-up reads only the new
window), ``stop``/``start``/``restart``/``kill [-s SIG]``/``rm [-f]``, ``run`` (every option of a vLLM/Ray/SGLang
launch parsed as docker does: value options never taken for the image; the image's own
entrypoint unless ``--entrypoint``), ``exec [-d] [-e K=V] CONTAINER CMD`` (``vllm serve``, the
api_server module, ``python3 -c`` and ``ray`` run *in* the container; a ``sh -c '... > FILE'``
writes through the bind mount, here the node's own file system), ``inspect [-f TEMPLATE]`` (the
``State`` object as a real engine returns it: ``Status``, ``OOMKilled``, ``ExitCode``, times),
``pull`` (internet only) and ``save | ssh HOST docker load``.

What a container runs: ``vllm serve`` / ``python3 -m vllm.entrypoints.openai.api_server``: the
engine run of :mod:`sparkconsole.sim.vllm_logs` (``--nnodes`` with ``--headless``/``--node-rank`` > 0:
a rank that waits for its head, whose run then writes this container's lines); ``ray start``: a Ray member; ``python3 -m
sglang.launch_server``: :mod:`sparkconsole.sim.sglang`; ``python3 -c PROGRAM``: the engine check
(:func:`sparkconsole.sim.sglang.engine_check` answers from the image catalogue).
"""

from __future__ import annotations

import asyncio
import calendar
import json
import math
import re
import time

from sparkconsole.sim import formats as F
from sparkconsole.sim import vllm_logs
from sparkconsole.sim.model import (
    DOCKER_VERSION,
    IMAGE_COPY_BPS,
    IMAGES,
    INTERNET_BPS,
    MODELS,
    CacheRamp,
    Container,
    LogLine,
    Transfer,
    image_digest,
    stable_hex,
    stable_int,
)
from sparkconsole.sim.sglang import engine_check, sglang_launch
from sparkconsole.sim.sh.interp import IO
from sparkconsole.sim.tools.common import _ADJ, _NAMES, _go_template, _norm_image, _opt_val, _ssh_target

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
    return ("docker: Error response from daemon: failed to create task for container: failed to create shim "
            "task: OCI runtime create failed: runc create failed: unable to start container process: error "
            f'during container init: exec: "{exe}": executable file not found in $PATH: unknown\n\n'
            "Run 'docker run --help' for more information\n")


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


def _go_text(val: object) -> str:
    """A value as Go's template prints it without ``json``: a struct as ``{v1 v2 …}``, bools lower case."""
    if isinstance(val, bool):
        return "true" if val else "false"
    if isinstance(val, dict):
        return "{" + " ".join(_go_text(v) for v in val.values()) + "}"
    return str(val)


def _go_fields(fmt: str, fields: dict[str, object]) -> str:
    """A Go template of ``{{.A.B}}`` / ``{{json .A}}`` placeholders over flat dotted fields (a dict
    value is a struct: ``json`` writes it compact, in its fields' order, as docker's template does)."""
    def sub(m: re.Match[str]) -> str:
        key = m.group(2)
        val = fields.get(key, "<no value>")
        if m.group(1):
            return json.dumps(val, separators=(",", ":"), ensure_ascii=False)
        return _go_text(val)
    return re.sub(r"{{\s*(json\s+)?\.([\w.]+)\s*}}", sub, fmt).replace("\\n", "\n").replace("\\t", "\t")


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
        digests = "--digests" in args
        if fmt and fmt.strip() != "{{json .}}":  # a Go template: {{.Repository}}:{{.Tag}} {{.Digest}}
            io.out(_go_template(fmt, F.docker_images(self.cluster, self.node_name, self.now(), True, digests=True)))
            return 0
        io.out(F.docker_images(self.cluster, self.node_name, self.now(), bool(fmt), digests=digests))
        return 0

    async def d_info(self, args: list[str], io: IO) -> int:
        fmt = _opt_val(args, "--format", None) or _opt_val(args, "-f", None)
        if fmt is not None:
            io.out(_go_fields(fmt, {"Driver": "overlayfs", "ServerVersion": DOCKER_VERSION, "NCPU": "20",
                                    "OperatingSystem": "Ubuntu 24.04.3 LTS", "Architecture": "aarch64",
                                    "DockerRootDir": "/var/lib/docker"}) + "\n")
            return 0
        io.out(f"Client: Docker Engine - Community\n Version:    {DOCKER_VERSION}\n Context:    default\n\n"
               f"Server:\n Containers: {len(self.cluster.containers_on(self.node_name))}\n"
               f" Server Version: {DOCKER_VERSION}\n Storage Driver: overlayfs\n  driver-type: io.containerd."
               "snapshotter.v1\n Cgroup Driver: systemd\n Runtimes: io.containerd.runc.v2 nvidia runc\n"
               " Default Runtime: runc\n Architecture: aarch64\n CPUs: 20\n Docker Root Dir: /var/lib/docker\n")
        return 0

    async def d_image(self, args: list[str], io: IO) -> int:
        if args[:1] == ["ls"]:
            return await self.d_images(args[1:], io)
        if args[:1] == ["inspect"] and len(args) > 1:
            fmt = _opt_val(args, "--format", None) or _opt_val(args, "-f", None)
            names = [a for a in args[1:] if not a.startswith("-") and a != fmt]
            rc = 0
            for name in names:
                img = self.cluster.images_on(self.node_name).get(_norm_image(name))
                if img is None:
                    io.err(f"Error: No such image: {name}\n")
                    rc = 1
                    continue
                fields = {"Id": f"sha256:{img.id}", "RepoTags": f"[{img.ref}]", "Size": str(img.size_bytes),
                          "RepoDigests": f"[{img.repo}@{image_digest(img.ref)}]", "Created": f"{img.created}T10:12:44Z",
                          "Architecture": "arm64", "Os": "linux"}
                io.out(_go_fields(fmt, fields) + "\n" if fmt else json.dumps(
                    [{"Id": fields["Id"], "RepoTags": [img.ref], "RepoDigests": [f"{img.repo}@{image_digest(img.ref)}"],
                      "Created": fields["Created"], "Size": img.size_bytes, "Architecture": "arm64", "Os": "linux"}],
                    indent=4) + "\n")
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
        lines = ct.log_between(lo, t)
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
            for ln in ct.log_between(last, end):
                io.out(self._fmt_log(ln, stamps))
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
        async def stop(ct: Container) -> None:
            await self.clock.sleep(0.4)
            self._stop(ct, self.now(), 0)

        return await self._each_container(args, io, stop)

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
        name = entrypoint = None
        env: list[tuple[str, str]] = []
        mounts: list[str] = []
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
                    j += 1
            if key in ("-d", "--detach"):
                detach = val not in ("false", "0") if eq else True
            elif key == "--rm":
                rm = True
            elif key == "--name":
                name = val
            elif key in ("-e", "--env"):
                k, has, v = val.partition("=")
                env.append((k, v if has else io.env.get(k, "")))
            elif key in ("-v", "--volume"):
                mounts.append(val.split(":")[0])
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
                io.err(f"Unable to find image '{args[i]}' locally\ndocker: Error response from daemon: Get "
                       "\"https://registry-1.docker.io/v2/\": dial tcp: lookup registry-1.docker.io on "
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
        if entrypoint is not None:
            cmd = ([entrypoint] if entrypoint else []) + user_cmd
        else:
            cmd = list(img.entrypoint if img is not None else ()) + (user_cmd or ([] if img and img.entrypoint
                                                                                   else ["bash"]))
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
            if rm:
                self.cluster.remove_container(ct)
            return 127
        if detach:
            io.out(ct.id + "\n")
            return 0
        rc = await self.d_logs(["-f", ct.name], io)  # attached: its output until it exits
        info = ct.exit_info(self.now())
        if rm and ct in self.cluster.containers:
            self.cluster.remove_container(ct)
        return info[0] if info else rc

    def _launch(self, ct: Container, t: float) -> str | None:
        """Start what the container's command says. Returns an error text for a missing binary."""
        cmd = list(ct.argv)
        img = IMAGES.get(_norm_image(ct.image))
        ct.host_rss = 300 * 1024**2
        if cmd[:2] in (["bash", "-c"], ["sh", "-c"]) and len(cmd) > 2:
            inner = self.peel(self.tokenize(cmd[2]))
            if inner[:1] in (["vllm"], ["python3"], ["python"], ["ray"]):
                cmd = inner
        serve = _serve_argv(cmd)
        if serve is not None and img is not None:
            if not img.vllm_version:
                return _oci_missing("vllm" if cmd[0] == "vllm" else cmd[0])
            ct.kind = "vllm"
            if serve[:2] == ["vllm", "serve"]:  # `IMAGE vllm serve X` on an image whose entrypoint is `vllm serve`
                ct.log.append(LogLine(t + 3.0, "usage: vllm serve [model_tag] [options]\nvllm serve: error: "
                                      f"unrecognized arguments: {' '.join(serve[1:])}"))
                ct.stopped, ct.exit_code = t + 3.1, 2
                return None
            return self._start_engine(ct, serve, t, img.vllm_version, pid_api=1)
        if cmd[:2] == ["ray", "start"]:
            if img is None or not img.vllm_version:
                return _oci_missing("ray")
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
        if cmd[:1] in (["python3"], ["python"]):
            if cmd[1:3] == ["-m", "sglang.launch_server"]:
                if img is None or not img.sglang_version:
                    ct.log.append(LogLine(t + 0.4, "/usr/bin/python3: Error while finding module specification for "
                                          "'sglang.launch_server' (ModuleNotFoundError: No module named 'sglang')"))
                    ct.stopped, ct.exit_code = t + 0.5, 1
                    return None
                sglang_launch(self.cluster, ct, cmd[3:], t)
                ct.kind = "sglang"
                return None
            if cmd[1:2] == ["-c"] and len(cmd) > 2:
                text = engine_check(img, cmd[2]) if img is not None else ""
                ct.log.append(LogLine(t + 2.2, text.rstrip("\n")))
                ct.stopped, ct.exit_code = t + 2.3, 0
                return None
        if not cmd or cmd[0] not in ("sleep", "sh", "bash", "tail", "vllm", "ray", "python3", "python", "true",
                                     "nvidia-smi", "cat", "echo"):
            return _oci_missing(cmd[0] if cmd else "")
        if cmd[0] in ("true", "echo", "cat", "nvidia-smi"):
            ct.stopped, ct.exit_code = t + 0.2, 0
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
        ct.engine = vllm_logs.plan_serve(self.cluster, self.node, ct.name, version, args, t, pid_api=pid_api)
        ct.host_rss = int(2.4 * 1024**3)
        return None

    async def d_exec(self, args: list[str], io: IO) -> int:
        detach = False
        env = dict(io.env)
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
                    env[k] = v if has else io.env.get(k, "")
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
        sub = self.fork()
        sub.container = ct
        sub.image = img
        sub.cwd = "/"
        run_io = IO(io.out, io.err, io.stdin, env, io.proc)
        if detach:
            p = self.procs.spawn(cmd, parent=None, bg=True)  # a child of the container's shim, not of ours
            self.procs.start(p, sub.exec_argv(cmd, IO(_drop, _drop, "", env, p)))
            return 0
        rc = await sub.external(cmd, run_io)
        if rc == 127:
            return 127
        return rc

    # ---- in a container (docker exec): vllm, python3 -----------------------------------------

    async def c_vllm(self, argv: list[str], io: IO) -> int:
        img = getattr(self, "image", None)
        if getattr(self, "container", None) is None or img is None or not img.vllm_version:
            io.err(f"{self.err_prefix()}vllm: not found\n")
            return 127
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
        if argv[1:2] == ["-c"] and len(argv) > 2:
            await self.clock.sleep(2.2)
            io.out(engine_check(img, argv[2]))
            return 0
        io.err(f"python3: can't open file '{argv[1] if len(argv) > 1 else ''}': [Errno 2] No such file or "
               "directory\n")
        return 2

    c_python = c_python3

    async def _exec_engine(self, serve: list[str], img, io: IO) -> int:
        parent: Container = self.container
        now = self.now()
        sub = Container(id=stable_hex(64, parent.id, "exec", now), name=f"{parent.name}#exec", image=parent.image,
                        argv=tuple(["vllm", "serve", *serve]), node=self.node_name, created=now, started=now,
                        network="exec")
        pid = stable_int(300, 9000, parent.name, now, "execpid")
        self._start_engine(sub, serve, now, img.vllm_version, pid_api=pid)
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
                for ln in sub.log_between(last, now):
                    io.out(ln.text + "\n")
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
            io.out(f"{tag}: Pulling from {repo}\nDigest: {image_digest(ref)}\nStatus: Image is up to date for "
                   f"{ref}\ndocker.io/{ref}\n")
            return 0
        io.out(f"{tag}: Pulling from {repo}\n")
        layers = [stable_hex(12, ref, k) for k in range(9)]
        for lay in layers:
            io.out(f"{lay}: Pulling fs layer\n")
        tr = Transfer("image", ref, None, self.node_name, self.now(), img.size_bytes, INTERNET_BPS)
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
        io.out(f"Digest: {image_digest(ref)}\nStatus: Downloaded newer image for {ref}\ndocker.io/{ref}\n")
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
                "Image": "sha256:" + (IMAGES[_norm_image(ct.image)].id if _norm_image(ct.image) in IMAGES else ""),
                "HostConfig.NetworkMode": ct.network}
            fields.update({f"State.{k}": v for k, v in st.items()})
            found += 1
            if fmt:
                io.out(_go_fields(fmt, fields) + "\n")
            else:
                io.out(json.dumps([{"Id": ct.id, "Name": "/" + ct.name, "State": st,
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
        if self.peel(self.tokenize(" ".join(cmd)))[:2] != ["docker", "load"]:  # ssh joins, the far shell splits
            io.err("sparksim: only `docker save IMAGE | ssh HOST docker load` is modelled\n")
            return 2
        tr = Transfer("image", ref, self.node_name, dst.name, self.now(), img.size_bytes, IMAGE_COPY_BPS)
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
