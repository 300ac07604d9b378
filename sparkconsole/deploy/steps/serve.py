"""Serve: start the engine, follow its log to ready; a failed or hung start becomes a decision."""

from __future__ import annotations

import asyncio
import calendar
import json
import re
import time
from typing import Any

from sparkconsole.deploy import engines, exits, netenv
from sparkconsole.deploy.calibrate import from_log as serve_calibration
from sparkconsole.deploy.decisions import Decision, Option
from sparkconsole.deploy.flow import GIB
from sparkconsole.deploy.runner import GoTo, StepFailed
from sparkconsole.deploy.state import Started
from sparkconsole.deploy.steps.base import Step
from sparkconsole.deploy.steps.cluster import DOCKER_OPTS, adopt_or_clear
from sparkconsole.deploy.steps.memory import drop_page_cache
from sparkconsole.logs.follow import cap_line, display_text
from sparkconsole.planner.budget import DEFAULT_GMU
from sparkconsole.planner.plan import PlanOptions
from sparkconsole.remote import (
    API_KEY_ENV,
    RemoteCommand,
    and_then,
    command,
    docker_logs,
    docker_rm_force,
    docker_run,
    docker_state,
    file_chunk,
    make_api_key,
    mkdir_p,
    serve_in_container,
    validate_path,
    with_key_from_file,
    write_in_container,
)
from sparkconsole.serving import engines as engine_kinds
from sparkconsole.serving.engines import ServeSpec

# vllm/ray/ray_env.py reads ray_non_carry_over_env_vars.json in VLLM_CONFIG_ROOT (the engine's own)
NON_CARRY_OVER = f"{engine_kinds.VLLM.config_root}/ray_non_carry_over_env_vars.json"

# ``docker logs -t``: each line after the time docker read it, RFC 3339 with nanoseconds
_STAMPED = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)(?: (.*))?")


def _stamp_ns(date: str, frac: str | None, zone: str) -> int:
    secs = calendar.timegm(time.strptime(date, "%Y-%m-%dT%H:%M:%S"))
    if zone != "Z":
        sign = 1 if zone[0] == "+" else -1
        secs -= sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    return secs * 1_000_000_000 + int((frac or "").ljust(9, "0"))


class DockerLogFollow:
    """A container's log followed by time: ``docker logs -t --since T``, its stdout and stderr lines
    merged by their timestamps, every line given once.

    vLLM logs to stdout, uvicorn and tqdm to stderr, and ``docker logs`` gives them back on two
    pipes, so an offset into ``stdout + stderr`` lands in the wrong stream as both grow (it lost
    "Starting vLLM API server" and repeated a torn stderr line), and reading the whole log every poll
    costs the whole log. Here each read asks only for what came after the newest line seen, less
    :attr:`OVERLAP_NS` (docker stamps each stream's line when its copier reads it, so a line of one
    stream may reach the log file just after a later-stamped one of the other); the lines of that
    overlap seen before are known by (time, stream, text) and counted, so none is given twice and
    none is skipped."""

    OVERLAP_NS = 1_000_000_000

    def __init__(self) -> None:
        self.newest: int | None = None  # ns since the epoch of the newest line seen
        self._seen: dict[tuple[int, int, str], int] = {}  # lines at or after newest - OVERLAP_NS

    def command(self, container: str, tail: int | None = None) -> RemoteCommand:
        since = None
        if self.newest is not None:
            t = max(0, self.newest - self.OVERLAP_NS)
            since = f"{t // 1_000_000_000}.{t % 1_000_000_000:09d}"
        return docker_logs(container, tail=tail, follow=False, timestamps=True, since=since)

    def feed(self, stdout: str, stderr: str) -> list[str]:
        """The new lines of one read, in the order docker stamped them (a tie: stdout's first)."""
        rows: list[tuple[int, int, int, str]] = []
        for stream, out in enumerate((stdout, stderr)):
            ts = 0
            for i, line in enumerate(out.split("\n")[:-1] if out.endswith("\n") else out.split("\n") if out else []):
                m = _STAMPED.fullmatch(line)
                if m is not None:
                    ts, line = _stamp_ns(m.group(1), m.group(2), m.group(3)), m.group(4) or ""
                rows.append((ts, stream, i, line))  # a line without a stamp keeps its stream's last time
        rows.sort()
        horizon = None if self.newest is None else self.newest - self.OVERLAP_NS
        counted: dict[tuple[int, int, str], int] = {}
        new: list[str] = []
        for ts, stream, _i, line in rows:
            if horizon is not None and ts < horizon:
                continue  # before the overlap: given by an earlier read
            key = (ts, stream, line)
            counted[key] = counted.get(key, 0) + 1
            if counted[key] <= self._seen.get(key, 0):
                continue  # in the overlap, given before
            self._seen[key] = counted[key]
            new.append(line)
        if rows:
            self.newest = max(self.newest or 0, rows[-1][0])
            keep = self.newest - self.OVERLAP_NS
            self._seen = {k: v for k, v in self._seen.items() if k[0] >= keep}
        return new


class FileLogFollow:
    """A growing log file (the Ray path's ``serve.log``) followed by byte offset. The node says where
    each read ends (:func:`~sparkconsole.remote.file_chunk`): the transport decodes what comes back
    (an invalid byte becomes U+FFFD, three bytes once encoded), so counting the text would move the
    offset by three per invalid byte and skip that much of the log. The node ends each read after a
    newline, so a line still being written (cut, perhaps, inside a UTF-8 sequence) comes whole with
    a later read, once; the last read (``final``) takes the file to its end.

    Each read also names the file (device and inode): a log made anew under the same name (a
    restart's ``>``, a rotation) is read from its start, even when it is already longer than what
    was read of the old one, which the size alone cannot tell. Where the node cannot say (no
    ``stat``), a file shorter than the offset is still taken as made anew. An unfinished line is
    kept to :data:`~sparkconsole.logs.follow.MAX_LINE_CHARS` (a line that never ends must not grow
    without bound)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offset = 0  # bytes of the file read so far
        self.pending = ""  # the unfinished last line
        self.identity: str | None = None  # device:inode of the file being read, once known

    def command(self, final: bool = False) -> RemoteCommand:
        return file_chunk(self.path, self.offset, whole_lines=not final, identity=True)

    def feed(self, stdout: str) -> list[str]:
        ident, _, rest = stdout.partition("\n")
        head, _, body = rest.partition("\n")
        try:
            end = int(head.strip())
        except ValueError:
            return []
        ident = ident.strip()
        known = ident not in ("", "-")
        if known and self.identity is not None and ident != self.identity and self.offset:
            # another file now: what this read took came from the old offset of the new file
            self.identity, self.offset, self.pending = ident, 0, ""
            return []
        if known:
            self.identity = ident
        if end < self.offset:  # shorter than what was read: made anew; read it from its start
            self.offset, self.pending = 0, ""
            return []
        self.offset = end
        *lines, pending = (self.pending + body).split("\n")
        self.pending = cap_line(pending)
        return lines

    def flush(self) -> list[str]:
        """The unfinished last line (one longer than a read), once nothing more will come."""
        out, self.pending = ([self.pending] if self.pending else []), ""
        return out


# `vllm serve --language-model-only` arrived in vLLM 0.17.0: the 0.14.1, 0.15.1 and 0.16.0 releases
# parsers refuse it (read from each release's own parser: sparkconsole/sim/data/vllm_serve_flags.json)
LANGUAGE_MODEL_ONLY_SINCE = (0, 17)


def _has_flag(args: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


class Serve(Step):
    id, title = "serve", "Start the engine and follow it to ready"
    decisions = ("serve.access", "serve.failure", "serve.hang")
    STATE_EVERY_POLLS = 3  # the engine's containers are read at least this often while the log moves

    def _spec(self) -> ServeSpec:
        """What to serve, in the engine's neutral terms: the plan's numbers and the extra flags."""
        flow = self.flow
        extra = list(flow.extra_args)
        parser = flow.options.reasoning_parser or ("qwen3" if "qwen3" in flow.options.model.lower() else None)
        if parser and flow.engine_kind.takes_reasoning_parser and not _has_flag(extra, "--reasoning-parser"):
            extra += ["--reasoning-parser", parser]
        if flow.plan.language_model_only and not _has_flag(extra, "--language-model-only") and \
                engines.version_tuple(flow.plan.vllm_version or "0.17") >= LANGUAGE_MODEL_ONLY_SINCE:
            extra.append("--language-model-only")  # the vision tower is not loaded (plan.text-only)
        if self._fast_loader() and not _has_flag(extra, "--load-format"):
            extra += ["--load-format", "fastsafetensors"]
        return ServeSpec(model=flow.options.model, served_name=flow.served_name, host=self._bind_host(),
                         port=int(flow.options.port), tp=int(flow.plan.tp or 1), pp=int(flow.plan.pp or 1),
                         gpu_memory_utilization=float(flow.plan.gmu or DEFAULT_GMU),
                         max_model_len=int(flow.plan.max_model_len or 65536),
                         kv_cache_dtype=flow.plan.kv_cache_dtype, extra_args=tuple(extra))

    def _fast_loader(self) -> bool:
        """The image's own Python imported ``fastsafetensors`` (the engine step's check, not its name):
        vLLM then loads with it (``--load-format fastsafetensors``), as the field's recipes do."""
        flow = self.flow
        check = (flow.plan.engine_checks or {}).get(flow.image) or {}
        return (flow.engine_kind is engine_kinds.VLLM and not check.get("expected")
                and bool((check.get("versions") or {}).get("fastsafetensors")))

    def _log(self) -> str:
        return f"{self.flow.fact(self.flow.head).hf_dir}/sparkconsole/{self.runner.state.short_id}/serve.log"

    async def decide(self) -> None:
        """Who may use the served endpoint. vLLM without ``--api-key``/``VLLM_API_KEY`` answers anyone
        who reaches its port (vllm/entrypoints/openai/api_server.py installs its check on /v1 only
        when a token is given), so the operator chooses: a key (recommended), 127.0.0.1 and an SSH
        tunnel, or open as before. SGLang is not offered the key: it takes one only as ``--api-key``,
        on its command line (``ps`` shows it to every user of the node) and in the server arguments it
        logs, which this console follows and prints."""
        flow = self.flow
        port, host = flow.options.port, self.runner.head.host
        kind = flow.engine_kind
        keyless = kind.api_key_env is None  # a key only on its command line (SGLang): not offered
        options = []
        if not keyless:
            options.append(Option(
                "api-key", "every interface, with an API key",
                f"{kind.label} answers /v1 only with the key (401 without it; /health and /metrics stay open); the key is "
                f"made on {flow.head} and stays there ({flow.api_key_file}, mode 600), given to {kind.label} in its "
                "environment: never in a command line, the journal, the state or this console's output"))
        options += [
            Option("local", "127.0.0.1 only, through an SSH tunnel",
                   f"nothing on the network reaches it: from {flow.head} itself, or from a laptop through "
                   f"`ssh -L {port}:localhost:{port}` to {flow.head} (verify prints the command)"),
            Option("open", "every interface, no key (as before)",
                   f"anyone who reaches {host}:{port} can use the model"),
        ]
        measured = (f"the engine's API: port {port} of {flow.head} ({host})",
                    f"{flow.engine} without a key answers anyone who reaches that port")
        if len(flow.nodes) > 1:
            ports = (f"{kind.label}'s rendezvous, port {kind.rendezvous_port}" if flow.executor == "native"
                     else "Ray's GCS, port 6379, and its other ports")
            measured += (f"whatever the answer, the nodes' own ports ({ports}) take no key: keep the cluster "
                         "on a trusted network",)
        why = (f"{kind.label}'s key would sit on its command line and in its logged arguments: 127.0.0.1 and a "
               "tunnel keep the endpoint private" if keyless else
               "reachable from the network by whoever has the key, and by no one else")
        d = Decision("serve.access", self.id, "Who may use the served endpoint", measured, tuple(options),
                     "local" if keyless else "api-key", why)
        flow.update(access=await self.runner.decide(d))

    def _bind_host(self) -> str:
        """Where the engine's API listens: 127.0.0.1 when the operator keeps it local, else every
        interface (``--host 0.0.0.0``: the laptop reaches the head by its LAN address)."""
        return "127.0.0.1" if self.flow.plan.access == "local" else "0.0.0.0"

    def _keyed(self) -> bool:
        """The engine starts with the head's API key (one that takes it from its environment: see :meth:`decide`)."""
        return self.flow.plan.access == "api-key" and self.flow.engine_kind.api_key_env is not None

    def _commands(self) -> list[tuple[str, RemoteCommand]]:
        """The engine's starts, by node, workers first; the one that serves the API (the head's) with
        the API key in its environment when the operator chose one (serve.access)."""
        return [(n, with_key_from_file(cmd, self.flow.api_key_file) if n == self.flow.head and self._keyed() else cmd)
                for n, cmd in self._launches()]

    def _launches(self) -> list[tuple[str, RemoteCommand]]:
        """The engine's starts as the layout makes them (no key yet), by node, workers first: what the
        engine's object says (:meth:`EngineKind.launches`), each in a container of its own named for
        the engine; over Ray, the one start is ``docker exec``ed in the Ray head's container."""
        flow = self.flow
        kind = flow.engine_kind
        executor = flow.executor
        nodes = flow.nodes if executor != "single" else [flow.head]
        launches = kind.launches(self._spec(), executor, [(n, flow.ip(n)) for n in nodes])
        if executor == "ray":
            (only,) = launches
            return [(flow.head, serve_in_container(flow.container("ray"), [only.entrypoint, *only.args],
                                                   "/root/.cache/huggingface/sparkconsole/"
                                                   f"{self.runner.state.short_id}/serve.log", env=list(kind.launch_env)))]
        cluster = len(self.runner.nodes) > 1
        out = []
        for launch in launches:
            n = nodes[launch.rank]
            # every launch names its entrypoint: only vllm/vllm-openai's own is `vllm serve`; NGC's is
            # /opt/nvidia/nvidia_entrypoint.sh, which would take the model id for a command to exec
            out.append((n, docker_run(flow.container(kind.name), flow.image, options=DOCKER_OPTS,
                                      entrypoint=launch.entrypoint, args=list(launch.args),
                                      env=[*(flow.env(n) if cluster else []), *kind.launch_env, *launch.env],
                                      mounts=[(flow.fact(n).hf_dir, "/root/.cache/huggingface")],
                                      summary=launch.summary)))
        return out

    def _runs(self) -> dict[str, str]:
        """The containers this step starts with ``docker run`` (one vLLM container on a single node,
        one per node natively and with SGLang), by node: none on the Ray path (vLLM runs in the Ray
        head's container, ``docker exec``)."""
        return {n: cmd.argv[cmd.argv.index("--name") + 1] for n, cmd in self._commands()
                if cmd.argv[:2] == ("docker", "run")}

    async def probe(self) -> str | None:
        # what send decides from (its rehearsal then reads nothing): each start's container, if any
        runs = self._runs()
        got = await self.runner.on_all(list(runs), lambda n: self.flow.inspect(n, runs[n]))
        self._run_states = dict(zip(runs, got, strict=True))
        if await self.flow.serving():
            for n, name in runs.items():  # a start whose result was lost still goes at teardown
                st = self._run_states.get(n)
                if st is not None and st.status == "running":
                    await adopt_or_clear(self.flow, n, name, st)
            return f"already serving {self.flow.served_name} on port {self.flow.options.port}"
        return None

    async def send(self) -> None:
        flow = self.flow
        if flow.executor == "ray":
            # the log made here, by the login user: the engine (root in its container) then writes into
            # a file the user owns (`>` keeps an existing file's owner), not a root-owned one in the
            # user's cache that only sudo could remove
            log_dir = f"{flow.fact(flow.head).hf_dir}/sparkconsole/{self.runner.state.short_id}"
            await self.runner.change(flow.head, and_then(mkdir_p(log_dir), command("touch", validate_path(self._log())),
                                                         summary=f"make the engine's log {self._log()}"),
                                     key="mkdir serve log")
            keep = netenv.not_carried([flow.env(n) for n in flow.nodes])
            # the API key stays on the head: copied, it would travel to every worker over Ray's own
            # channels (no authentication), and no worker serves the API
            keep += [API_KEY_ENV] if self._keyed() else []
            if keep:
                # vLLM >= 0.17 copies the driver's NCCL_*/UCX_*/VLLM_*/HF_* to every Ray worker (PR
                # #34383), over each worker's own values; names in this file are not copied. It is read
                # when `vllm serve` imports vllm.ray.ray_env, so it is written before the start.
                await self.runner.change(flow.head, write_in_container(
                    flow.container("ray"), NON_CARRY_OVER, json.dumps(keep),
                    summary=f"keep {', '.join(keep)} out of vLLM's Ray env carry-over"))
                # not keyed: a start again after a failure has a new Ray head container, without the file
        if self._keyed():  # before the start that reads it; an existing key is kept
            await self.runner.change(flow.head, make_api_key(flow.api_key_file))
        states = getattr(self, "_run_states", {})
        for n, cmd in self._commands():
            key = f"serve {n} {self.runner.state.steps.get('serve-attempt', '1')}"
            run = cmd.argv[:2] == ("docker", "run")
            name = cmd.argv[cmd.argv.index("--name") + 1] if run else ""
            if run and key not in self.runner.state.done_commands:
                # inspect first, as the cluster step does: a `docker run` whose result was lost (the
                # connection dropped after the container was made) left a container of this name that
                # nothing recorded; started again, it would fail on the name, on every --resume
                st = states[n] if n in states else await flow.inspect(n, name)
                if await adopt_or_clear(flow, n, name, st):
                    continue
            res = await self.runner.change(n, cmd, timeout=300, key=key)
            if not res.ok:
                raise StepFailed(f"{n}: the engine did not start: {res.stderr.strip()[-300:]}",
                                 "--resume: a container this start made is found by its name and adopted"
                                 if res.exit_status is None else "")
            ours = any(s.node == n and s.name == name for s in self.runner.state.started)
            if run and res.stdout.strip() and not ours:
                self.runner.state.started.append(Started(n, "container", name, res.stdout.strip()[:64]))
                self.runner.save()

    async def watch(self) -> None:
        await self._follow()

    async def _follow(self) -> None:
        flow = self.flow
        tracker = flow.engine_kind.log_tracker()  # this engine's reader: SGLang's log by SGLang's rules
        if tracker is None:
            raise StepFailed(f"the console does not read {flow.engine_kind.label}'s log: its start cannot be followed",
                             "start it by hand and watch its log")
        self._seen: list[str] = []
        last_change = time.monotonic()
        deadline = time.monotonic() + self.runner.settings.serve_timeout_s / self.runner.settings.speed
        in_container = flow.executor in ("native", "single")
        name = flow.container(flow.engine_kind.name)
        docker_follow, file_follow = DockerLogFollow(), FileLogFollow(self._log())
        polls = quiet = 0

        async def read_log(final: bool = False) -> bool:
            """The log's new lines, each once and whole, fed to the tracker and shown; whether any came."""
            nonlocal last_change
            if in_container:
                res = await self.runner.read(flow.head, docker_follow.command(name), quiet=True)
                lines = docker_follow.feed(res.stdout, res.stderr) if res.ok else []
            else:
                res = await self.runner.read(flow.head, file_follow.command(final), quiet=True)
                lines = file_follow.feed(res.stdout) if res.ok else []
                if final:
                    lines += file_follow.flush()
            if lines:
                last_change = time.monotonic()
                self._seen.append("".join(f"{line}\n" for line in lines))
                for line in lines:
                    for part in line.splitlines() or [line]:  # a progress bar's \r updates: one line each
                        tracker.feed(part)
                        if part.strip():
                            self.runner.emit_output(flow.head, part)
            return bool(lines)

        while True:
            moved = await read_log()
            polls += 1
            quiet = 0 if moved else quiet + 1
            rep = tracker.report
            if rep.shards_total:
                self.runner.progress(flow.head, "weights", rep.shard_fraction,
                                f"{rep.shards_done}/{rep.shards_total} shards")
            if rep.state == "ready":
                self.runner.note(f"ready: weights {rep.model_load_gib} GiB per node, KV cache {rep.kv_cache_gib} GiB "
                            f"({rep.kv_cache_tokens or '?'} tokens, {rep.max_concurrency or '?'}x concurrency)")
                self._calibrate()
                return
            if rep.state == "failed":
                self._calibrate()
                await self._failed(await self._root_cause(rep))
                return
            # the engine's containers: read when the log was quiet for a poll, and every few polls
            # (a worker's container can die while the head's log still moves)
            if quiet or polls % self.STATE_EVERY_POLLS == 0:
                death = await self._dead_container(tracker.report)
                if death is not None and death.kind not in exits.CONTAINER_KINDS:
                    await read_log(final=True)  # an ordinary exit: its last lines may name the cause
                    death = exits.classify(death.node, self._states[(death.node, death.container)], tracker.report,
                                           self._plan_figures())
                if death is not None:
                    quiet_s = (time.monotonic() - last_change) * self.runner.settings.speed
                    self.runner.note(f"{death.what}; the log had been quiet for {quiet_s:.0f} s", "error", death.node)
                    self._calibrate()
                    rep = tracker.report
                    from_log = rep.state == "failed" and death.kind not in exits.CONTAINER_KINDS
                    await self._failed(rep, None if from_log else death)
                    return
            idle = (time.monotonic() - last_change) * self.runner.settings.speed
            if idle > self.runner.settings.hang_after_s:
                await self._hung(idle)
                return
            if time.monotonic() > deadline:
                await self._timeout()
                return
            await asyncio.sleep(self.runner.settings.poll_s)

    async def _root_cause(self, rep: Any) -> Any:
        """A native multi-node start that failed in words the head cannot explain ("Engine core
        initialization failed … Failed core proc(s): {}": a headless worker died) is explained by that
        worker's own log, where vLLM printed the cause (a worker's free-memory check, its NCCL): read
        each worker's container log and take the first report that names a kind."""
        flow = self.flow
        if rep.failure_kind not in (None, "other") or flow.executor != "native":
            return rep
        for n in flow.nodes[1:]:
            res = await self.runner.read(n, DockerLogFollow().command(flow.container(flow.engine_kind.name), tail=400),
                                         quiet=True)
            worker = flow.engine_kind.log_tracker()
            if worker is None:
                return rep
            for line in DockerLogFollow().feed(res.stdout, res.stderr) if res.ok else []:  # in the order written
                for part in line.splitlines() or [line]:
                    worker.feed(part)
            got = worker.report
            if got.state == "failed" and got.failure_kind not in (None, "other"):
                self.runner.note(f"the start failed on {n}: {display_text(got.failure_line or got.failure_kind or '')}",
                                 "error", node=n)
                return got
        return rep

    def _engine_containers(self) -> dict[str, list[str]]:
        """The containers this deployment starts for the engine, by node (their names carry the
        deployment's id): the Ray head and workers (vLLM runs in the head's), else one vLLM or SGLang
        container per node of the start (one on the head for a single-node start)."""
        flow = self.flow
        if flow.executor == "single":
            return {flow.head: [flow.container(flow.engine_kind.name)]}
        return {n: [flow.container("ray" if flow.executor == "ray" else flow.engine_kind.name)] for n in flow.nodes}

    def _plan_figures(self) -> dict[str, Any]:
        need = (self.flow.plan.need or {}).get(self.flow.head)
        return {"tp": self.flow.plan.tp, "gmu": self.flow.plan.gmu, "max_model_len": self.flow.plan.max_model_len,
                "need_gib": need / GIB if need else None}

    async def _dead_container(self, rep: Any) -> exits.ContainerDeath | None:
        """One ``docker inspect`` per node (at once) of the engine's containers; the first dead one
        (the head's first), classified with what the log says the engine was doing. A node that does
        not answer says nothing: unknown is not dead."""
        names = self._engine_containers()

        async def one(n: str) -> dict[str, exits.ContainerState]:
            res = await self.runner.read(n, docker_state(*names[n]), timeout=30, quiet=True)
            if res.exit_status is None:
                return {}
            return exits.parse_states(res.stdout, res.stderr, names[n])

        got = await self.runner.on_all(list(names), one)
        self._states = {(n, name): st for n, states in zip(names, got, strict=True) for name, st in states.items()}
        for n, states in zip(names, got, strict=True):
            for name in names[n]:
                st = states.get(name)
                death = exits.classify(n, st, rep, self._plan_figures()) if st is not None else None
                if death is not None:
                    return death
        return None

    def _calibrate(self) -> None:
        """Plan notes from the start's own figures (deploy/calibrate.py); kept for a re-plan."""
        try:
            spec = self.flow.spec
        except StepFailed:
            return
        opts = PlanOptions(tp=int(self.flow.plan.tp or 1), max_model_len=self.flow.plan.max_model_len,
                           gpu_memory_utilization=float(self.flow.plan.gmu or DEFAULT_GMU), force=True,
                           language_model_only=bool(self.flow.plan.language_model_only),
                           vllm_version=self.flow.plan.vllm_version)  # the image's, as the engine step read it
        cal = serve_calibration(spec, "".join(getattr(self, "_seen", [])), opts)
        if cal is None:
            return
        for line in cal.lines:
            self.runner.note(f"calibration: {line}")
        if cal.longest_len:
            self.flow.update(calibrated_longest_len=cal.longest_len)

    async def _failed(self, rep: Any, death: exits.ContainerDeath | None = None) -> None:
        """A failed start, read from the log (``rep``) or from a dead container (``death``: killed,
        OOM-killed, crashed or removed while the log said nothing)."""
        kind = death.kind if death is not None else (rep.failure_kind or "other")
        back = {"oom": "plan", "unsupported_architecture": "engine", "nccl": "network", "ray": "cluster",
                "segfault": "engine"}.get(kind)
        proof = death.what if death is not None else rep.failure_line or ""
        advice = death.advice if death is not None else rep.advice or ""
        options = []
        layout_fits = bool(self.flow.plan.plan_fits)
        if death is not None and kind in ("killed", "removed", "exited"):
            options.append(Option("again", "start again", "the engine's containers started afresh ("
                                  + ("the Ray cluster formed again, then vLLM" if self.flow.executor == "ray"
                                     else "the same command")
                                  + ("; the page cache freed again first" if self.flow.plan.drop else "")
                                  + "): nothing in the log says the start was wrong"))
        if kind == "oom" and not layout_fits:
            options.append(Option("back-plan", "back to the plan: this layout does not fit",
                                  f"TP={self.flow.plan.tp} was chosen against the plan's verdict; choose again"))
        elif kind == "oom":
            options.append(Option("shorter", "a shorter context and less memory", "--max-model-len halved, "
                                  "gmu 0.80: more room for the weights' peak"))
        if kind == "killed":
            options.append(Option("back-plan", "back to the plan: less memory per node", "if earlyoom or "
                                  "systemd-oomd killed it, the node was short of memory: choose a layout with room"))
        if back and all(o.value != f"back-{back}" for o in options):
            options.append(Option(f"back-{back}", f"back to the {back} step", advice))
        options.append(Option("stop", "stop here", "read the log and decide by hand"))
        seen = list(self.flow.plan.failures or [])
        again = kind in seen  # the same failure twice: going back once more would not help
        rec = "stop" if again else options[0].value
        self.flow.update(failures=[*seen, kind])
        measured = (proof[:300], advice) if death is None else (proof[:300], f"the log: {death.during}", advice)
        title = (f"The engine failed to start ({kind})" if death is None or "ready" not in death.during
                 else f"The engine stopped after it was ready ({kind})")
        d = Decision("serve.failure", self.id, title, measured, tuple(options), rec,
                     (f"the same {kind} failure again: going back once more would not help" if again
                      else advice or f"the log shows a {kind} failure"))
        answer = await self.runner.decide(d)
        self.runner.forget("serve.failure")
        await self._remove_started()
        if answer == "again":
            await self._start_again(kind)
        if answer == "shorter":
            halved = max(4096, int(self.flow.plan.max_model_len or 65536) // 2)
            measured = self.flow.plan.calibrated_longest_len
            self.flow.update(max_model_len_override=int(measured) if measured and measured >= 4096 else halved)
            self.flow.update(gmu_override=0.80)
            raise GoTo("plan", "less context and memory after an out-of-memory start")
        if answer.startswith("back-"):
            target = answer.removeprefix("back-")
            self.runner.forget(*self.flow.step(target).decisions)
            raise GoTo(target, f"{kind} failure")
        raise StepFailed(f"the engine failed ({kind}): {proof[:200]}", advice or "read the log")

    async def _start_again(self, kind: str) -> None:
        """After a container was killed or removed: over Ray, every Ray container of this deployment
        goes (a Ray worker whose head died does not rejoin a new one) and the cluster step forms it
        again; else the serve step starts its containers again. The page cache is dropped again first
        when the operator had it dropped before launch: the shards the killed start read sit there, and
        vLLM's start-up check counts only free memory (a retry failed it by 0.3-0.9 GiB on the demo)."""
        if self.flow.plan.drop:
            await drop_page_cache(self.flow, self.flow.nodes)
        if self.flow.executor == "ray":
            for s in [s for s in self.runner.state.started if s.name == self.flow.container("ray")]:
                await self.runner.change(s.node, docker_rm_force(s.name))
                self.runner.state.started.remove(s)
            self.runner.save()
            raise GoTo("cluster", f"start again after the engine's container was {kind}")
        raise GoTo("serve", f"start again after the engine's container was {kind}")

    async def _hung(self, idle: float) -> None:
        waits = int(self.flow.plan.hang_waits or 0)
        known_hang = self.flow.engine_kind.known_hang  # a stall the field reports for this engine
        default = engine_kinds.DEFAULT
        rec = default.name if known_hang else "wait" if waits < 2 else "stop"
        why = (known_hang if known_hang else
               "a cold start compiles kernels and can be quiet for long" if rec == "wait" else
               f"no progress after waiting {waits} times: read the engine's log")
        options = [Option("wait", "wait longer", "a cold start can be slow"), Option("stop", "stop here", "")]
        if known_hang:
            options.insert(0, Option(default.name, f"back to {default.label} with Ray",
                                     f"{default.label} over Ray worked in the same setup"))
        d = Decision("serve.hang", self.id, "No progress: the start looks hung",
                     (f"no new log line for {idle:.0f} s ({self.flow.engine}, {len(self.flow.nodes)} nodes)",),
                     tuple(options), rec, why)
        answer = await self.runner.decide(d)
        self.runner.forget("serve.hang")
        if answer == "wait":
            self.flow.update(hang_waits=waits + 1)
            return await self._follow()
        await self._remove_started()
        if answer == default.name:
            self.runner.preset("engine.image", next(k.ref for k in engines.KNOWN_IMAGES if k.engine is default))
            self.flow.update(engine=default.name)
            self.flow.update(executor="ray")
            raise GoTo("engine", "the SGLang start hung: back to vLLM")
        raise StepFailed("the engine start hung", "read the engine's log; NCCL needs both ranks")

    async def _timeout(self) -> None:
        raise StepFailed("the engine did not become ready in time",
                         "a cold start can take long: --resume keeps waiting (VLLM_ENGINE_READY_TIMEOUT_S is 3600)")

    async def _remove_started(self) -> None:
        """Remove the engine containers this attempt started (the Ray cluster stays) and count the
        attempt, so the next start is a new command and not one 'done before'."""
        self.runner.state.steps["serve-attempt"] = str(int(self.runner.state.steps.get("serve-attempt", "1")) + 1)
        names = [s for s in self.runner.state.started if "-ray-" not in s.name]
        for s in names:
            await self.runner.change(s.node, docker_rm_force(s.name))
            self.runner.state.started.remove(s)
        self.runner.save()
