"""The one place where remote commands are built, validated and quoted.

Every command that reaches a node's shell is a :class:`RemoteCommand`: an argument vector whose
parts are either validated values or constants of this module. ``shell()`` quotes each part
with :func:`shlex.quote`, so a model id, container name or path can never break out of its
argument. Commands that change a node carry ``mutating=True``; the UI shows them before they
run, asks for confirmation, refuses them read-only and journals them.

Validators reject anything unusual instead of trying to escape it: a Hugging Face repo id, a
container or unit name, a path. The rules follow what those systems themselves accept.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import shlex
from dataclasses import dataclass, field

from sparkconsole.errors import ValidationError

# Hugging Face: "owner/name", each part letters, digits, '-', '_', '.', no '--' or '..',
# not starting or ending with '-' or '.', at most 96 characters each (huggingface_hub rules).
_HF_PART = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?$")
# Docker container names: [a-zA-Z0-9][a-zA-Z0-9_.-]+ (docker/daemon/names.go); ids are hex.
_CONTAINER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
# Docker image references: registry/repo:tag@digest, conservative character set.
_IMAGE = re.compile(r"^[a-z0-9][a-z0-9._/:@-]{0,254}$")
# systemd unit names: letters, digits, ":-_.\@", with a known suffix or none (".service" implied).
_UNIT = re.compile(r"^[A-Za-z0-9:_.@-]{1,200}$")
# Paths: absolute or ~-relative, no shell or control characters, no '..' component.
_PATH = re.compile(r"^(?:~|/)[A-Za-z0-9/._+,=@~-]*$")
_IFNAME = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")
_HOST = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._:-]{0,253})$")


def validate_model_id(value: str) -> str:
    """Return ``value`` if it is a well-formed Hugging Face repo id ``owner/name``."""
    parts = value.split("/")
    if (
        len(parts) != 2
        or not all(_HF_PART.fullmatch(p) for p in parts)
        or any(".." in p or "--" in p for p in parts)
    ):
        raise ValidationError(f"not a valid Hugging Face repo id: {value!r} (expected owner/name)")
    return value


def validate_container(value: str) -> str:
    """Return ``value`` if it is a valid Docker container name or id."""
    if not _CONTAINER.fullmatch(value):
        raise ValidationError(f"not a valid container name: {value!r}")
    return value


def validate_image(value: str) -> str:
    """Return ``value`` if it looks like a Docker image reference."""
    if not _IMAGE.fullmatch(value) or ".." in value:
        raise ValidationError(f"not a valid image reference: {value!r}")
    return value


def validate_unit(value: str) -> str:
    """Return ``value`` if it is a valid systemd unit name."""
    if not _UNIT.fullmatch(value) or value.startswith("-"):
        raise ValidationError(f"not a valid systemd unit name: {value!r}")
    return value


def validate_path(value: str) -> str:
    """Return ``value`` if it is an absolute (or ``~``) path with no surprises in it."""
    if not _PATH.fullmatch(value) or any(part == ".." for part in value.split("/")):
        raise ValidationError(f"not an acceptable path: {value!r}")
    return value


def validate_ifname(value: str) -> str:
    """Return ``value`` if it is a Linux network interface name."""
    if not _IFNAME.fullmatch(value):
        raise ValidationError(f"not a valid interface name: {value!r}")
    return value


def validate_host(value: str) -> str:
    """Return ``value`` if it is a host name, alias or address: an IPv6 one too, bare, with its
    interface zone where it has one (``::1``, ``fe80::1%enp1s0``); brackets belong to a
    ``[host]:port`` spec, not to the host."""
    if not (is_ipv6(value) or (_HOST.fullmatch(value) and ":" not in value)):  # a colon: IPv6 or nothing
        raise ValidationError(f"not a valid host name or address: {value!r}")
    return value


def is_ipv6(value: str) -> bool:
    """``value`` is an IPv6 address, with an interface zone (``%IFNAME``) or without."""
    addr, sep, zone = value.partition("%")
    if sep and not _IFNAME.fullmatch(zone):
        return False
    try:
        ipaddress.IPv6Address(addr)
    except ValueError:
        return False
    return True


def validate_port(value: int) -> int:
    """Return ``value`` if it is a TCP port number (1-65535)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise ValidationError(f"not a port number: {value!r}")
    return value


@dataclass(frozen=True)
class RemoteCommand:
    """A command for one node, kept as an argument vector until the moment it is sent.

    ``argv`` is quoted part by part. ``env`` values are quoted too and set with ``env``.
    ``mutating`` marks commands that change the node; ``summary`` is the plain-words line the
    confirmation dialog and the journal show.
    """

    argv: tuple[str, ...]
    mutating: bool = False
    summary: str = ""
    env: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    # what the command reads on its stdin (a program piped into the image's Python): never in the
    # command's text, so never in the journal or the confirmation; the summary names it and its size
    stdin: str | None = field(default=None, repr=False, compare=False)

    def shell(self) -> str:
        """The exact string sent to the node's shell."""
        parts: list[str] = []
        if self.env:
            parts.append("env")
            for key, value in self.env:
                if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", key):
                    raise ValidationError(f"not a valid environment variable name: {key!r}")
                parts.append(shlex.quote(f"{key}={value}"))
        parts.extend(shlex.quote(a) for a in self.argv)
        return " ".join(parts)

    def __str__(self) -> str:
        return self.shell()


def command(*argv: str, mutating: bool = False, summary: str = "") -> RemoteCommand:
    """Build a :class:`RemoteCommand` from its arguments."""
    return RemoteCommand(tuple(argv), mutating=mutating, summary=summary)


def pipeline(*commands: RemoteCommand, summary: str = "") -> str:
    """Join already-built commands with ``|``: the only way this project writes a pipe."""
    return " | ".join(c.shell() for c in commands)


# ---- the commands the console sends -------------------------------------------------------

def docker_ps() -> RemoteCommand:
    return command("docker", "ps", "-a", "--format", "{{json .}}")


def docker_stats() -> RemoteCommand:
    return command("docker", "stats", "--no-stream", "--format", "{{json .}}")


def docker_action(action: str, container: str) -> RemoteCommand:
    """``docker stop|start|restart|rm NAME``: a mutating command."""
    if action not in {"stop", "start", "restart", "rm"}:
        raise ValidationError(f"unknown container action: {action!r}")
    name = validate_container(container)
    return command("docker", action, name, mutating=True, summary=f"docker {action} {name}")


def systemctl_action(action: str, unit: str) -> RemoteCommand:
    """``systemctl stop|start|restart UNIT``: a mutating command (needs sudo rights on the node)."""
    if action not in {"stop", "start", "restart"}:
        raise ValidationError(f"unknown unit action: {action!r}")
    name = validate_unit(unit)
    return command("sudo", "-n", "systemctl", action, name, mutating=True, summary=f"systemctl {action} {name}")


# What ``docker logs --since`` accepts: an RFC 3339 time (as ``docker logs -t`` prints it), a
# Unix time with optional fraction, or a relative duration such as ``10m`` / ``1h30m``.
_SINCE = re.compile(
    r"^(?:\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d)"
    r"|\d{1,12}(?:\.\d{1,9})?"
    r"|(?:\d{1,6}(?:ns|us|ms|s|m|h))+)$"
)


def validate_since(value: str) -> str:
    """Return ``value`` if ``docker logs --since`` reads it as a time (RFC 3339, Unix, or ``10m``)."""
    if not _SINCE.fullmatch(value):
        raise ValidationError(f"not a valid --since time: {value!r}")
    return value


def docker_logs(
    container: str,
    tail: int | None = 200,
    follow: bool = True,
    timestamps: bool = False,
    since: str | None = None,
) -> RemoteCommand:
    """``docker logs [--tail N|all] [-f] [-t] [--since T] NAME`` (``tail=None``: every line)."""
    argv = ["docker", "logs", "--tail", "all" if tail is None else str(int(tail))]
    if follow:
        argv.append("-f")
    if timestamps:
        argv.append("-t")
    if since is not None:
        argv += ["--since", validate_since(since)]
    argv.append(validate_container(container))
    return command(*argv)


LOG_HEAD_LINES = 4000
LOG_HEAD_BYTES = 4 * 1024 * 1024


def docker_log_head(container: str, lines: int = LOG_HEAD_LINES, max_bytes: int = LOG_HEAD_BYTES) -> RemoteScript:
    """The first ``lines`` lines of a container's log, stdout and stderr together: where vLLM
    printed its settings and memory figures, however long it has served since (a followed log
    starts at its last 200 lines). At most ``max_bytes`` of them: a line that never ends (a
    progress bar without newlines, a binary dump) would hold ``head -n`` forever, so ``head -c``
    comes first and ends the read there whatever ``head -n`` buffers. ``head`` closing the pipe
    ends ``docker logs`` early. The current start's lines only: a restarted container's log still
    holds its earlier runs (``docker restart`` keeps the log file), whose "ready" would be read as
    this start's, so the read begins at the container's ``State.StartedAt`` (``--since`` takes
    RFC 3339); where docker cannot say (the container is gone), the whole log's first lines."""
    name = validate_container(container)
    started = command("docker", "inspect", "-f", "{{.State.StartedAt}}", name).shell()
    since = command("docker", "logs", "--since", "X", name).shell().replace(" X ", ' "$s" ')
    whole = command("docker", "logs", name).shell()
    n, size = int(lines), int(max_bytes)
    text = (f"if s=$({started} 2>/dev/null) && [ -n \"$s\" ]; then {since}; else {whole}; fi 2>&1 "
            f"| head -c {size} | head -n {n}")
    return RemoteScript((), mutating=False, text=text,
                        summary=f"the first {n} lines of {container}'s log since its start (at most {size} bytes)")


SYSTEMCTL_SHOW_PROPS = ("Id", "LoadState", "ActiveState", "SubState")


def systemctl_show(units: list[str] | tuple[str, ...]) -> RemoteCommand:
    """``systemctl show -p Id,LoadState,ActiveState,SubState UNIT...``: every unit's state in one
    read-only command (blocks of ``Key=value`` lines separated by a blank line, in order)."""
    if not units:
        raise ValidationError("systemctl show needs at least one unit")
    names = [validate_unit(u) for u in units]
    return command("systemctl", "show", "--no-pager", "-p", ",".join(SYSTEMCTL_SHOW_PROPS), "--", *names)


def journalctl_follow(unit: str, lines: int = 200) -> RemoteCommand:
    return command("journalctl", "-f", "-n", str(int(lines)), "-u", validate_unit(unit), "--no-pager")


# sparkrun's narrow sudoers rule allows exactly this command (never `sh -c`, which a rule cannot narrow):
# /etc/sudoers.d/sparkrun-dropcaches-USER = `USER ALL=(root) NOPASSWD: /usr/bin/tee /proc/sys/vm/drop_caches`
DROP_CACHES_TEE = ("/usr/bin/tee", "/proc/sys/vm/drop_caches")


def drop_caches_rule(user: str) -> str:
    """The sudoers line that lets ``user`` drop the page cache and nothing else (sparkrun's), with
    how to install it safely (``visudo -cf`` checks it before it can lock sudo out)."""
    name = validate_container(user)
    return (f"echo '{name} ALL=(root) NOPASSWD: {' '.join(DROP_CACHES_TEE)}' | sudo tee "
            f"/etc/sudoers.d/sparkconsole-dropcaches-{name} && sudo chmod 0440 "
            f"/etc/sudoers.d/sparkconsole-dropcaches-{name} && sudo visudo -cf "
            f"/etc/sudoers.d/sparkconsole-dropcaches-{name}")


def drop_caches() -> RemoteScript:
    """``sync; echo 3 | sudo -n /usr/bin/tee /proc/sys/vm/drop_caches``: the form a narrow sudoers
    rule (``DROP_CACHES_TEE``) allows as well as a full one; ``sudo -n`` fails at once (exit 1, "a
    password is required") instead of waiting for a password nobody types."""
    tee = command("sudo", "-n", *DROP_CACHES_TEE)
    return RemoteScript((), mutating=True, text=f"sync && echo 3 | {tee.shell()} > /dev/null",
                        summary="drop the page cache (sync; echo 3 | sudo tee /proc/sys/vm/drop_caches)")


def evict_page_cache(hub_dir: str) -> RemoteScript:
    """Evict the HF cache's model files from the page cache without root: ``dd if=FILE iflag=nocache
    count=0`` asks the kernel to drop a file's cached pages (GNU dd: "when count=0 all cached data
    for the file"; posix_fadvise DONTNEED, allowed to anyone who may read the file), after ``sync``
    has made them clean. On a stock Spark, where ``sudo`` needs a password, this frees what matters
    before launch: the weights just downloaded or copied, and those of the services just stopped,
    which vLLM's start-up check would count as used (a running engine keeps its weights in GPU
    memory, not in the page cache). Every regular file once: the blobs where ``hf`` downloaded (the
    snapshots' links point at them, and are skipped), the snapshot's own files where ``rsync -L``
    copied them (no blobs)."""
    d = shlex.quote(validate_path(hub_dir).rstrip("/"))
    text = (f"sync && for f in {d}/*/blobs/* {d}/*/snapshots/*/* {d}/*/snapshots/*/*/*; do "
            "[ -f \"$f\" ] && [ ! -h \"$f\" ] || continue; "
            "dd if=\"$f\" iflag=nocache count=0 status=none || exit 1; done")
    return RemoteScript((), mutating=True, text=text,
                        summary="evict the HF cache's model files from the page cache (dd iflag=nocache, no sudo)")


def kill_process(pid: int, name: str = "") -> RemoteCommand:
    """``kill -TERM PID``: a host process holding GPU memory (one the login user may signal)."""
    return command("kill", "-TERM", str(int(pid)), mutating=True,
                   summary=f"stop process {int(pid)}{f' ({name})' if name else ''}")


# ---- scripts: several quoted commands joined by fixed operators -------------------------------


@dataclass(frozen=True)
class RemoteScript(RemoteCommand):
    """A short ``sh`` program assembled here from quoted commands and constant operators.

    The deployment needs what one argument vector cannot say: ``&&``, redirections into a job's
    log, ``&`` with ``$!``, markers between the sections of one read. ``text`` is only ever built
    by the functions of this module from :class:`RemoteCommand` parts (each quoted by
    :meth:`RemoteCommand.shell`) and constant shell syntax, so the rule holds: nothing a user or a
    node typed reaches the shell unquoted.
    """

    text: str = ""

    def shell(self) -> str:
        return self.text


SECTION_MARK = "::sparkdeploy::"


def sectioned(sections: list[tuple[str, RemoteCommand | str]], summary: str = "") -> RemoteScript:
    """One read-only exec that runs every section with markers around it (the probe's framing):
    ``::sparkdeploy:: section NAME`` … output … ``::sparkdeploy:: rc NAME N``. A section is a
    built :class:`RemoteCommand` or a constant of the caller's module (a probe section's text,
    ``echo "$HOME"``): never text that came from a user or a node."""
    parts = []
    for name, cmd in sections:
        if not re.fullmatch(r"[a-z0-9-]+", name):
            raise ValidationError(f"not a section name: {name!r}")
        text = cmd.shell() if isinstance(cmd, RemoteCommand) else cmd
        parts.append(f"echo '{SECTION_MARK} section {name}'; {text} 2>&1; "
                     f"echo \"{SECTION_MARK} rc {name} $?\"")
    return RemoteScript((), summary=summary, text="; ".join(parts))


def and_then(*commands: RemoteCommand, mutating: bool | None = None, summary: str = "") -> RemoteScript:
    """``A && B && C``: stop at the first that fails."""
    text = " && ".join(c.shell() for c in commands)
    mut = any(c.mutating for c in commands) if mutating is None else mutating
    return RemoteScript((), mutating=mut, summary=summary, text=text)


def piped(left: RemoteCommand, right: RemoteCommand, *, mutating: bool = True, summary: str = "") -> RemoteScript:
    """``LEFT | RIGHT`` (``docker save IMAGE | ssh NODE docker load``)."""
    return RemoteScript((), mutating=mutating, summary=summary, text=pipeline(left, right))


def with_env(env: list[tuple[str, str]] | tuple[tuple[str, str], ...], cmd: RemoteCommand) -> RemoteCommand:
    """``cmd`` run with extra environment variables (``env K=V … CMD``)."""
    return RemoteCommand(cmd.argv, mutating=cmd.mutating, summary=cmd.summary, env=tuple(env))


@dataclass(frozen=True)
class JobFiles:
    """Where a detached job keeps its output, exit code and identity on the node.

    ``pid`` is written by the job itself as its first act: ``PID BOOT_ID START_TICKS`` (its pid, the
    node's ``/proc/sys/kernel/random/boot_id``, field 22 of ``/proc/PID/stat``: its start time in
    clock ticks since boot). The three together name one process for the life of the node: a bare
    pid is reused after a reboot (pids count up from the same place) or after the job was killed, and
    ``kill -0`` would call a stranger the job. So the job is found by its key alone (the file), also
    when the console was killed before it saved the pid (issue 23, items 5 and 8)."""

    log: str
    rc: str
    pid: str = ""

    @classmethod
    def under(cls, job_dir: str, name: str) -> JobFiles:
        validate_path(job_dir)
        if not re.fullmatch(r"[a-z0-9][a-z0-9_.-]{0,63}", name):
            raise ValidationError(f"not a job name: {name!r}")
        return cls(log=f"{job_dir}/{name}.log", rc=f"{job_dir}/{name}.rc", pid=f"{job_dir}/{name}.pid")


# Field 22 of /proc/PID/stat (starttime) read with the shell's own ``read`` (no cut/awk needed, and
# a job's comm is ``sh``: no spaces in field 2). Constant text.
_STAT_FIELDS = "_ " * 21 + "st _"
BOOT_ID = "/proc/sys/kernel/random/boot_id"


def _identity_line(pid_expr: str) -> str:
    """Shell text that prints ``PID BOOT_ID START_TICKS`` for the process ``pid_expr`` (constant text)."""
    return (f"read b < {BOOT_ID}; read {_STAT_FIELDS} < /proc/{pid_expr}/stat; "
            f'echo "{pid_expr} $b $st"')


def job_alive(files: JobFiles) -> str:
    """Shell text, true while the process named by ``files.pid`` runs: same boot, same pid, same start
    time. False when the file is missing, the node rebooted, or the pid now names another process."""
    pidf = shlex.quote(validate_path(files.pid))
    return (f"{{ read jp jb js < {pidf} && read nb < {BOOT_ID} && [ \"$jb\" = \"$nb\" ] && "
            f"read {_STAT_FIELDS} < /proc/$jp/stat && [ \"$st\" = \"$js\" ]; }} 2>/dev/null")


def detached(job_dir: str, files: JobFiles, inner: RemoteCommand, summary: str = "") -> RemoteScript:
    """Start ``inner`` detached from the SSH session (``setsid nohup``), its output in ``files.log``,
    its identity in ``files.pid`` (written by the job itself, first) and its exit code in ``files.rc``
    when it ends; prints the job's pid once its identity file is there (so a check that follows at once
    finds it). Losing the laptop's connection loses nothing: the console finds the job again by its
    files, even when it never learnt the pid.

    The ``&`` puts ``setsid`` alone in the background, not the ``mkdir && rm && setsid`` list: bash
    runs a backgrounded list in a subshell that keeps the SSH channel's stdout open until the job
    ends (the start would return only then, the pid unsaved while the job runs) and ``$!`` would
    be that subshell's pid, not the job's (the lab's console killed mid-copy found no job)."""
    pidf = shlex.quote(files.pid)
    job = (f"{_identity_line('$$')} > {pidf}; "
           f"{inner.shell()} > {shlex.quote(files.log)} 2>&1; echo $? > {shlex.quote(files.rc)}")
    wait = "for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do [ -s {0} ] && break; sleep 0.1; done"
    text = (f"mkdir -p {shlex.quote(validate_path(job_dir))} && rm -f {shlex.quote(files.rc)} {pidf} || exit 1; "
            f"setsid nohup sh -c {shlex.quote(job)} > /dev/null 2>&1 < /dev/null & "
            f"{wait.format(pidf)}; echo $!")
    return RemoteScript((), mutating=True, summary=summary or inner.summary, text=text)


def job_check(files: JobFiles, tail_bytes: int = 4096) -> RemoteScript:
    """Read-only: ``rc N`` when the job ended, ``running PID`` while the process its identity file
    names lives (same boot, same start time), ``lost`` when it neither ended nor runs, ``none`` when
    no job was ever started under these files; then the last bytes of its log."""
    rc, log, pidf = (shlex.quote(validate_path(p)) for p in (files.rc, files.log, files.pid))
    text = (f"if [ -f {rc} ]; then echo \"rc $(cat {rc})\"; elif {job_alive(files)}; then echo \"running $jp\"; "
            f"elif [ -f {pidf} ]; then echo lost; else echo none; fi; "
            f"tail -c {int(tail_bytes)} {log} 2>/dev/null")
    return RemoteScript((), text=text)


def kill_job(pid: int) -> RemoteCommand:
    """Stop a detached job and everything it started: ``setsid`` made its pid a process group, so
    ``kill -TERM -- -PID`` reaches the download or copy too, not only the ``sh -c`` around it."""
    return command("kill", "-TERM", "--", f"-{int(pid)}", mutating=True, summary=f"stop job {int(pid)}")


FILE_CHUNK_BYTES = 1 << 20  # the most one read of a growing log brings back


def file_chunk(path: str, offset: int, limit: int = FILE_CHUNK_BYTES, *, whole_lines: bool = True,
               identity: bool = False) -> RemoteScript:
    """A growing log read from byte ``offset`` (0-based): the first line is the byte offset the read
    ends at, counted by the node (``wc -c``), then exactly the bytes from ``offset`` to there.

    The transport decodes what comes back (an invalid byte becomes U+FFFD, three bytes), so the
    reader cannot count the file's bytes from the text it gets: the node's count is the next
    offset, and nothing is skipped or read twice. With ``whole_lines`` the read ends after the last
    newline (a line still being written, possibly cut inside a UTF-8 sequence, waits for the next
    read), unless one line alone fills ``limit`` bytes; without, it ends at the file's end (the
    last read, once the writer is gone). A file now shorter than ``offset`` (truncated, made anew)
    prints its size and nothing else. Read-only; ``sh``, ``wc``, ``tail`` and ``head`` only, and
    ``stat`` with ``identity``: a first line then names the file itself (device:inode, ``-`` where
    ``stat`` cannot say), so that a file replaced by a longer one is told from the same file grown."""
    p = shlex.quote(validate_path(path))
    off, lim = int(offset), int(limit)
    part = f"tail -c +{off + 1} {p} | head -c $((e - {off}))"
    text = f"i=$(stat -c %d:%i -- {p} 2>/dev/null) || i=-; echo \"$i\"; " if identity else ""
    text += f"s=$(wc -c < {p}) || exit 1; e=$((s)); if [ \"$e\" -gt {off + lim} ]; then e={off + lim}; fi; "
    if whole_lines:
        text += (f"if [ \"$e\" -gt {off} ] && [ \"$({part} | tail -c 1 | wc -l)\" -eq 0 ]; then "
                 f"u=$({part} | tail -n 1 | wc -c); "
                 f"if [ \"$u\" -lt $((e - {off})) ] || [ $((e - {off})) -lt {lim} ]; then e=$((e - u)); fi; fi; ")
    text += f"echo \"$e\"; if [ \"$e\" -gt {off} ]; then {part}; fi"
    return RemoteScript((), text=text, summary=f"read {path} from byte {off}")


# ---- the deployment's commands ------------------------------------------------------------------

HF_HUB_URL = "https://huggingface.co"
# The Hub as the node's own ``hf`` sees it: ``$HF_ENDPOINT`` when the node sets one (a mirror, a
# proxy), else huggingface.co. Constant shell text: the node's shell expands it, nothing is
# interpolated from a user.
HF_HUB_ON_NODE = f'"${{HF_ENDPOINT:-{HF_HUB_URL}}}"'


# The node's own Hub token as a header on curl's stdin (``-H @-``): gated repos answer 401 without it,
# and a header read from stdin never shows in the node's process list nor in what the console prints
# (this text is constant: the token is read by the node's shell). ``$HF_TOKEN`` first, as hf does.
HUB_AUTH_ON_NODE = ('{ t="${HF_TOKEN:-$(cat "${HF_HOME:-$HOME/.cache/huggingface}/token" 2>/dev/null)}"; '
                    'if [ -n "$t" ]; then printf \'Authorization: Bearer %s\\n\' "$t"; fi; } | ')


def _hub_curl(head: RemoteCommand, path: str, summary: str = "", auth: bool = False) -> RemoteScript:
    """``curl … "${HF_ENDPOINT:-https://huggingface.co}"'/api/…'``: the curl options and the
    path quoted as usual, the endpoint left to the node's shell; with ``auth`` the node's token
    goes as a header (:data:`HUB_AUTH_ON_NODE`)."""
    pre, hdr = (HUB_AUTH_ON_NODE, " -H @-") if auth else ("", "")
    return RemoteScript((), summary=summary, text=f"{pre}{head.shell()}{hdr} {HF_HUB_ON_NODE}{shlex.quote(path)}")


def hub_reachable(model: str) -> RemoteScript:
    path = f"/api/models/{validate_model_id(model)}"
    return _hub_curl(command("curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}\\n", "--max-time", "5"), path)


def hub_tree(model: str, revision: str = "main") -> RemoteScript:
    """The Hub's file list for ``model`` (sizes, and sha256 as ``lfs.oid`` for large files)."""
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", revision):
        raise ValidationError(f"not a revision: {revision!r}")
    path = f"/api/models/{validate_model_id(model)}/tree/{revision}?recursive=true"
    return _hub_curl(command("curl", "-sS", "--max-time", "20"), path, auth=True)


def hub_file(model: str, filename: str, revision: str = "main") -> RemoteScript:
    """One small file of a repo from the Hub through the node (``config.json``, the safetensors
    index), with the node's token: ``-f`` so a missing file is an exit code, not a 404 page."""
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", revision) or not re.fullmatch(r"[A-Za-z0-9._-]{1,128}", filename):
        raise ValidationError(f"not a Hub file: {filename!r}@{revision!r}")
    path = f"/{validate_model_id(model)}/resolve/{revision}/{filename}"
    return _hub_curl(command("curl", "-sSfL", "--max-time", "20"), path, auth=True)


HUB_PROBE_BYTES = 64 << 20  # a rehearsal's read of the Hub: 64 MiB, a few seconds on a home line


def hub_read_rate(model: str, filename: str, nbytes: int = HUB_PROBE_BYTES) -> RemoteScript:
    """A bounded ranged read of one of ``model``'s files from the Hub, thrown away (``-o /dev/null``:
    nothing is written): ``BYTES FIRST_BYTE_S TOTAL_S``, so the rate is the bytes over the time after
    the first byte (what a long download sees). With the node's token, as the download has it."""
    if not re.fullmatch(r"[A-Za-z0-9._/-]{1,256}", filename) or ".." in filename.split("/"):
        raise ValidationError(f"not a Hub file: {filename!r}")
    if not 1 <= nbytes <= 1 << 31:
        raise ValidationError(f"a Hub read of {nbytes} bytes")
    path = f"/{validate_model_id(model)}/resolve/main/{filename}"
    return _hub_curl(command("curl", "-sSL", "-r", f"0-{nbytes - 1}", "-o", "/dev/null", "-w",
                             "%{size_download} %{time_starttransfer} %{time_total}\\n", "--max-time", "20"),
                     path, summary=f"read {nbytes >> 20} MiB of {filename} from the Hub (measure; nothing kept)",
                     auth=True)


def parse_read_rate(text: str) -> float | None:
    """``BYTES FIRST_BYTE_S TOTAL_S`` (curl's -w) → bytes per second after the first byte; None when
    it did not read enough to tell (under 1 MiB, or no time)."""
    got = _last_floats(text, 3)
    if got is None:
        return None
    n, first, total = got
    span = total - first
    return n / span if n >= 1 << 20 and span > 0 else None


LINK_PROBE_BYTES = 128 << 20  # a rehearsal's stream over the fast link: 128 MiB, a fraction of a second on a Spark pair
NOW = "$(date +%s.%N)"  # the node's own clock, so the console's round trip is not in a timing


def peer_link_rate(user_host: str, nbytes: int = LINK_PROBE_BYTES, *, port: int | None = None) -> RemoteScript:
    """What a copy to the peer costs, timed on the node, nothing written on either end: one ``ssh
    PEER true`` (the connection's own cost, paid by every rsync pass and image copy), then ``nbytes``
    of zeros streamed to ``wc -c`` there (the link as ssh carries it: rsync over ssh is ssh-bound).
    Prints ``BYTES T0 T1 T2``: :func:`parse_link_rate`."""
    if not 1 <= nbytes <= 1 << 31:
        raise ValidationError(f"a stream of {nbytes} bytes")
    head = command("head", "-c", str(nbytes), "/dev/zero")
    sink = RemoteCommand(("timeout", "30", *ssh_to(user_host, "wc", "-c", port=port).argv))
    text = (f"s={NOW} && {ssh_to(user_host, 'true', port=port).shell()} && m={NOW} && "
            f"n=$({pipeline(head, sink)}) && e={NOW} && echo \"$n $s $m $e\"")
    return RemoteScript((), text=text, summary=f"stream {nbytes >> 20} MiB to {user_host.rpartition('@')[2]} "
                        "over ssh (measure; nothing kept)")


def parse_link_rate(text: str) -> tuple[float, float | None] | None:
    """``BYTES T0 T1 T2`` → (one ssh connection's seconds, bytes per second of the stream after its
    own connection); None when the text is not that. The rate is None under 1 MiB or no time."""
    got = _last_floats(text, 4)
    if got is None or got[2] < got[1] or got[3] < got[2]:
        return None
    n, t0, t1, t2 = got
    connect = t1 - t0
    stream = (t2 - t1) - connect
    return connect, (n / stream if n >= 1 << 20 and stream > 0 else None)


def hf_start_time() -> RemoteScript:
    """How long the host's ``hf`` takes to start (``hf version``: it reads nothing and writes
    nothing), timed on the node: ``T0 T1``. Every download and check that runs ``hf`` pays it."""
    return RemoteScript((), text=f"s={NOW} && {command('hf', 'version').shell()} > /dev/null 2>&1 && "
                        f"echo \"$s {NOW}\"", summary="time hf's start (hf version; nothing kept)")


def parse_span(text: str) -> float | None:
    """``T0 T1`` → seconds, None when the text is not that."""
    got = _last_floats(text, 2)
    return got[1] - got[0] if got is not None and got[1] >= got[0] else None


def _last_floats(text: str, n: int) -> list[float] | None:
    """The first ``n`` words of ``text``'s last line as numbers (a timed read's report), or None."""
    words = text.strip().splitlines()[-1].split() if text.strip() else []
    try:
        return [float(w) for w in words[:n]] if len(words) >= n else None
    except ValueError:
        return None


def hf_download(model: str) -> RemoteCommand:
    """``hf download MODEL``: the token, if any, is read by ``hf`` from the node's own files."""
    m = validate_model_id(model)
    return command("hf", "download", m, mutating=True, summary=f"download {m} from the Hub")


RSYNC_SSH = "ssh -o BatchMode=yes -o ConnectTimeout=10 -o ServerAliveInterval=5 -o ServerAliveCountMax=3"


def _peer(user_host: str) -> tuple[str, str]:
    """``(user, host)`` of a node-to-node destination ``[USER@]HOST``, both checked (HOST may be an
    IPv6 address, bare: ``nvidia@fe80::1%enp1s0f1np1``)."""
    user, _, host = user_host.rpartition("@")
    validate_host(host)
    if user:
        validate_container(user)
    return user, host


def rsync_target(user_host: str, path: str) -> str:
    """rsync's remote spec ``[USER@]HOST:PATH``, an IPv6 HOST in brackets (``USER@[fe80::1]:PATH``):
    rsync(1) splits a bare one at its first colon, taking the rest for a path ("Note that IPv6
    addresses must be enclosed in brackets", rsync(1), USAGE / ADVANCED USAGE)."""
    user, host = _peer(user_host)
    where = f"[{host}]" if is_ipv6(host) else host
    return f"{user + '@' if user else ''}{where}:{path}"


def rsync_dir(src: str, user_host: str, dest: str, *, exclude: tuple[str, ...] = ("blobs/",),
              port: int | None = None) -> RemoteCommand:
    """Copy a model directory to another node over the fast link: links dereferenced (``-L``: the
    HF cache's snapshot links would arrive broken otherwise), a cut file kept (``--partial``).
    ssh's keepalive (``RSYNC_SSH``) makes a pass whose link went dead fail in about 15 s, not after
    TCP's retransmissions give up (about 15 minutes), so the wizard sees it and can offer to wait.
    ``port``: the far sshd's, when not 22 (``-e 'ssh … -p PORT'``: rsync has no port of its own
    for a remote shell); an IPv6 ``user_host`` goes in brackets (:func:`rsync_target`)."""
    _, host = _peer(user_host)
    argv = ["rsync", "-a", "--partial", "-L"]
    for e in exclude:
        if not re.fullmatch(r"[A-Za-z0-9._/-]{1,64}", e):
            raise ValidationError(f"not an rsync exclude: {e!r}")
        argv += ["--exclude", e]
    rsh = RSYNC_SSH + (f" -p {validate_port(port)}" if port and port != 22 else "")
    argv += ["--info=progress2", "-e", rsh,
             validate_path(src).rstrip("/") + "/", rsync_target(user_host, validate_path(dest).rstrip("/") + "/")]
    return command(*argv, mutating=True, summary=f"copy {src} to {host}")


STREAM_EVERY_S = 5  # seconds between two copy passes while the download runs


def stream_copy(rsync: RemoteCommand, download: JobFiles, every_s: int = STREAM_EVERY_S) -> RemoteScript:
    """The copy that runs beside the download, as one detached job on the downloading node.

    ``hf download`` writes each file as ``blobs/<sha>.incomplete`` and links it from
    ``snapshots/<rev>/`` only once it is whole, so an ``rsync -L`` of the snapshot sends finished
    files only. While the download runs (its identity file names a live process, :func:`job_alive`)
    and has not written its exit code, the copy is run again every ``every_s`` seconds (a pass that
    finds nothing new costs a file list); once the download has ended with 0, one final pass sends
    the rest, and the job's exit code is that pass's. A download that failed, or died without an exit
    code (killed, the node rebooted), ends the copy with 1 (``--resume`` starts both again): the copy
    never waits for ever on a download that is gone (issue 23, item 7).
    Built from the quoted ``rsync`` command and constant shell syntax only (remote.py's rule)."""
    rc = shlex.quote(validate_path(download.rc))
    cmd = rsync.shell()
    src = shlex.quote(rsync.argv[-2])  # rsync_dir's source: a pass waits until the download made it
    # one group, so a redirection after it (the job's log) takes every pass's output; no pass before
    # the download has made the model's folder (rsync would say "change_dir … No such file", code 23,
    # read by the copy's watcher as a failed pass)
    text = (f"{{ until [ -f {rc} ] || ! {job_alive(download)}; do if [ -d {src} ]; then {cmd} || true; fi; "
            f"sleep {int(every_s)}; done; "
            f'[ -f {rc} ] && [ "$(cat {rc})" = 0 ] && {cmd}; }}')
    return RemoteScript((), mutating=True, text=text,
                        summary=f"{rsync.summary}, each file as soon as it is downloaded, then a final pass")


def ssh_to(user_host: str, *argv: str, port: int | None = None) -> RemoteCommand:
    """``ssh -o BatchMode=yes [-p PORT] USER@HOST CMD…`` from one node to another (never asks a
    password). ``port``: the far sshd's, when not 22. An IPv6 HOST goes bare (``USER@fe80::1%IF``):
    ssh(1) takes the destination's host as written, and a ``-p`` for the port."""
    _peer(user_host)
    inner = " ".join(shlex.quote(a) for a in argv)
    opts = ["-p", str(validate_port(port))] if port and port != 22 else []
    return command("ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", *opts, user_host, inner)


def mkdir_p(path: str) -> RemoteCommand:
    return command("mkdir", "-p", validate_path(path), mutating=True, summary=f"mkdir -p {path}")


def image_layers(image: str) -> RemoteCommand:
    """``docker image inspect -f '{{json .RootFS.Layers}}' IMAGE``: the image's layer digests, what
    survives ``docker save | docker load`` under every store (under containerd's the ID can change:
    moby#48401, #47674, docker/cli#6670)."""
    return command("docker", "image", "inspect", "-f", "{{json .RootFS.Layers}}", validate_image(image))


def docker_pull(image: str) -> RemoteCommand:
    img = validate_image(image)
    return command("docker", "pull", img, mutating=True, summary=f"pull {img}")


def image_copy(image: str, user_host: str, *, port: int | None = None) -> RemoteScript:
    """``docker save IMAGE | ssh [-p PORT] NODE docker load``: streamed, never staged in /tmp."""
    img = validate_image(image)
    return piped(command("docker", "save", img), ssh_to(user_host, "docker", "load", port=port),
                 summary=f"copy image {img} to {user_host.rpartition('@')[2]}")


def python_in_image(image: str, program: str, *, gpus: bool = False) -> RemoteCommand:
    """Run the image's own Python once (``--rm``): what its vLLM knows, before 119 GB move. With
    ``gpus`` it sees the GPU, so torch can say whether its build has kernels for it. Mutating: it
    creates a container on the node (and takes GPU memory while it runs), so read-only and plan-only
    runs never send it."""
    img = validate_image(image)
    return command("docker", "run", "--rm", *(["--gpus", "all"] if gpus else []), "--entrypoint", "python3", img,
                   "-c", program, mutating=True,  # it creates (and removes) a container: a change, shown first
                   summary=f"ask {img}'s own Python which engine versions and architectures it has")


def hf_download_in_image(image: str, model: str, hf_dir: str, user: tuple[int, int] | None,
                         name: str, files: tuple[str, ...] = (), local_dir: str | None = None) -> RemoteCommand:
    """``docker run --rm --name NAME --user UID:GID -v HF_DIR:/hf -e HF_HOME=/hf --entrypoint hf IMAGE
    download MODEL``: the download where the tool is on a stock Spark, which has no ``hf`` on the
    host (NVIDIA's playbooks run ``hf download`` in the vLLM container with the cache mounted).
    As the login user (``--user``), so nothing in the user's cache becomes root's; the token is the
    mounted cache's own file (``/hf/token``), never an argument. ``/hf``, not ``/root/...``: a
    non-root user cannot pass through the image's ``/root`` (mode 700)."""
    img, m = validate_image(image), validate_model_id(model)
    argv = ["docker", "run", "--rm", "--name", validate_container(name)]
    if user is not None:
        argv += ["--user", f"{int(user[0])}:{int(user[1])}"]
    for f in files:  # only these files of the repository (the canary's config and tokenizer)
        if not re.fullmatch(r"[A-Za-z0-9._-]{1,128}", f):
            raise ValidationError(f"not a repository file name: {f!r}")
    argv += ["-v", f"{validate_path(hf_dir)}:/hf", "-e", "HF_HOME=/hf", "--entrypoint", "hf", img, "download", m,
             *files]
    if local_dir is not None:  # the files themselves in this folder (a path in the container), not the cache
        argv += ["--local-dir", validate_path(local_dir)]
    what = f"{', '.join(files)} of {m}" if files else m
    return command(*argv, mutating=True, summary=f"download {what} from the Hub with {img}'s hf")


def python_stdin_in_image(image: str, program: str, args: list[str], *, name: str, hf_dir: str,
                          user: tuple[int, int] | None, what: str) -> RemoteCommand:
    """``docker run --rm -i --name NAME [--user UID:GID] -v HF_DIR:/hf --entrypoint python3 IMAGE - ARGS``
    with ``program`` on its stdin: a program too long for a command line (the canary's miniature
    writer, ~30 kB) run by the image's own Python, as the login user so what it writes in the user's
    cache stays the user's. The program's text is in no command line, journal or confirmation: the
    summary names it, its size and its digest."""
    img = validate_image(image)
    argv = ["docker", "run", "--rm", "-i", "--name", validate_container(name)]
    if user is not None:
        argv += ["--user", f"{int(user[0])}:{int(user[1])}"]
    argv += ["-v", f"{validate_path(hf_dir)}:/hf", "--entrypoint", "python3", img, "-",
             *(validate_path(a) if a.startswith("/") else a for a in args)]
    digest = hashlib.sha256(program.encode()).hexdigest()[:12]
    return RemoteCommand(tuple(argv), mutating=True, stdin=program,
                         summary=f"{what} with {img}'s own Python (the program on stdin, "
                                 f"{len(program.encode()):,} bytes, sha256 {digest}…)")


def uvx_hf_download(model: str) -> RemoteCommand:
    """``uvx hf download MODEL``: huggingface_hub's CLI run by uv without installing it (eugr's
    spark-vllm-docker does this), where the host has uv but no ``hf``."""
    m = validate_model_id(model)
    return command("uvx", "hf", "download", m, mutating=True, summary=f"download {m} from the Hub (uvx hf)")


def ping_df(ip: str, payload: int, count: int = 3) -> RemoteCommand:
    """A don't-fragment ping with ``payload`` bytes (MTU − 28) over the fast link."""
    return command("ping", "-c", str(int(count)), "-W", "2", "-M", "do", "-s", str(int(payload)),
                   validate_host(ip))


def docker_run(name: str, image: str, *, options: list[str], entrypoint: str | None = None,
               args: list[str] | tuple[str, ...] = (), env: list[tuple[str, str]] | None = None,
               mounts: list[tuple[str, str]] | None = None, summary: str = "") -> RemoteCommand:
    """``docker run -d --name NAME [options] [-e K=V…] [-v A:B…] [--entrypoint E] IMAGE ARGS…``."""
    argv = ["docker", "run", "-d", "--name", validate_container(name), *options]
    for key, value in env or []:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValidationError(f"not a valid environment variable name: {key!r}")
        argv += ["-e", f"{key}={value}"]
    for src, dst in mounts or []:
        argv += ["-v", f"{validate_path(src)}:{validate_path(dst)}"]
    if entrypoint is not None:
        argv += ["--entrypoint", entrypoint]
    argv += [validate_image(image), *args]
    return command(*argv, mutating=True, summary=summary or f"start container {name}")


def docker_exec(container: str, argv: list[str], *, detach: bool = False,
                env: list[tuple[str, str]] | None = None, mutating: bool = False, summary: str = "") -> RemoteCommand:
    out = ["docker", "exec"]
    if detach:
        out.append("-d")
    for key, value in env or []:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValidationError(f"not a valid environment variable name: {key!r}")
        out += ["-e", f"{key}={value}"]
    out += [validate_container(container), *argv]
    return command(*out, mutating=mutating, summary=summary)


def docker_rm_force(*names: str) -> RemoteCommand:
    valid = [validate_container(n) for n in names]
    return command("docker", "rm", "-f", *valid, mutating=True, summary=f"remove {' '.join(valid)}")


def http_get(url: str, *, fail: bool = False) -> RemoteCommand:
    if not re.fullmatch(r"http://[A-Za-z0-9.:-]+(?:/[A-Za-z0-9._/-]*)?", url):
        raise ValidationError(f"not a local URL: {url!r}")
    return command("curl", "-sf" if fail else "-s", "--max-time", "10", url)


def http_post_json(url: str, body: str, timeout_s: int = 300) -> RemoteCommand:
    if not re.fullmatch(r"http://[A-Za-z0-9.:-]+(?:/[A-Za-z0-9._/-]*)?", url):
        raise ValidationError(f"not a local URL: {url!r}")
    return command("curl", "-s", "--max-time", str(int(timeout_s)), "-X", "POST", url,
                   "-H", "Content-Type: application/json", "-d", body)


# ---- the served endpoint's API key ----------------------------------------------------------------
#
# The key is a secret: its value is never in a command's text (commands are journaled and shown), never
# in what the console prints, never in the state file. It is made on the head by the head's own shell
# and stays there, in a file only the login user reads; every command that needs it has the node's
# shell read that file. vLLM takes it from its environment (``VLLM_API_KEY``: vllm/entrypoints/openai/
# api_server.py, ``if token := args.api_key or envs.VLLM_API_KEY``), so it is not on the engine's
# command line either, which ``ps`` shows every user of the node and which vLLM logs among its
# non-default arguments (``--api-key`` verbatim until vLLM PR #52523).

API_KEY_ENV = "VLLM_API_KEY"
# a random UUID per read (the kernel's CSPRNG: 122 random bits each); two make the key
_KERNEL_UUID = "/proc/sys/kernel/random/uuid"


def api_key_path(home: str) -> str:
    """Where the head keeps the endpoint's key: ``~/.config/sparkconsole/api-key`` of the login user
    (one key per head, kept across deployments and resumes, so clients keep working)."""
    return validate_path(f"{home.rstrip('/')}/.config/sparkconsole/api-key")


def make_api_key(path: str) -> RemoteScript:
    """An API key for the endpoint, kept on the node (:func:`_make_secret`)."""
    return _make_secret(path, f"keep an API key for the endpoint in {path} (made once, on the node, mode 600)")


def _make_secret(path: str, summary: str) -> RemoteScript:
    """``umask 077 && mkdir -p DIR && { [ -s FILE ] || printf '%s%s\\n' "$(cat UUID)" "$(cat UUID)" >
    FILE; }``: a key made on the node from the kernel's random UUIDs, readable by the login user only,
    and an existing one kept (a resume, a second deployment: clients keep the key they have). The
    key never crosses the network: nothing of it is in this text, and nothing comes back."""
    p = validate_path(path)
    f, d = shlex.quote(p), shlex.quote(p.rsplit("/", 1)[0] or "/")
    text = (f"umask 077 && mkdir -p {d} && {{ [ -s {f} ] || "
            f"printf '%s%s\\n' \"$(cat {_KERNEL_UUID})\" \"$(cat {_KERNEL_UUID})\" > {f}; }}")
    return RemoteScript((), mutating=True, text=text,
                        summary=summary)


def with_key_from_file(cmd: RemoteCommand, path: str, name: str = API_KEY_ENV) -> RemoteScript:
    """``k="$(cat FILE)" && [ -n "$k" ] && NAME="$k" docker run|exec -e NAME …``: ``cmd`` (a
    ``docker run`` or ``docker exec``) with the key passed in its environment. ``-e NAME`` without a
    value takes NAME from the docker client's environment, where the node's shell put what it read
    from the file: the value is in no command line. A missing or empty file stops here (``cat``'s
    error), never an engine started without the key. ``argv`` stays the docker command's, so what
    reads a command's container name reads it as before."""
    if cmd.argv[:2] not in (("docker", "run"), ("docker", "exec")) or cmd.env:
        raise ValidationError("a key goes only into a docker run or docker exec")
    if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", name):
        raise ValidationError(f"not a valid environment variable name: {name!r}")
    keyed = RemoteCommand((*cmd.argv[:2], "-e", name, *cmd.argv[2:]), mutating=cmd.mutating, summary=cmd.summary)
    f = shlex.quote(validate_path(path))
    return RemoteScript(keyed.argv, mutating=cmd.mutating, text=f'k="$(cat {f})" && [ -n "$k" ] && '
                        f'{name}="$k" {keyed.shell()}', summary=f"{cmd.summary} (the API key from {path})")


def _bearer_from_file(path: str) -> str:
    """The key as an ``Authorization`` header on curl's stdin (``-H @-``), read by the node's shell;
    nothing when the file is absent (an engine without a key ignores the header)."""
    f = shlex.quote(validate_path(path))
    return f"{{ [ -s {f} ] && printf 'Authorization: Bearer %s\\n' \"$(cat {f})\"; }} | "


def http_get_keyed(url: str, key_file: str, *, fail: bool = False) -> RemoteScript:
    """:func:`http_get` with the head's API key as a header read from curl's stdin: never in the
    node's process list nor in this text."""
    return RemoteScript((), text=f"{_bearer_from_file(key_file)}{http_get(url, fail=fail).shell()} -H @-")


def http_post_json_keyed(url: str, body: str, key_file: str, timeout_s: int = 300) -> RemoteScript:
    """:func:`http_post_json` with the head's API key as a header read from curl's stdin."""
    return RemoteScript((), text=f"{_bearer_from_file(key_file)}{http_post_json(url, body, timeout_s).shell()} -H @-")


def http_status(url: str) -> RemoteCommand:
    """``curl -s -o /dev/null -w '%{http_code}\\n' URL``: only the status a request without a key gets
    (``000`` when nothing answers)."""
    if not re.fullmatch(r"http://[A-Za-z0-9.:-]+(?:/[A-Za-z0-9._/-]*)?", url):
        raise ValidationError(f"not a local URL: {url!r}")
    return command("curl", "-s", "-o", "/dev/null", "-w", "%{http_code}\\n", "--max-time", "10", url)


def listening_tcp() -> RemoteCommand:
    """``ss -ltn``: the node's listening TCP sockets and the address each is bound to."""
    return command("ss", "-ltn")


def serve_in_container(container: str, argv: list[str], log_path: str,
                       env: list[tuple[str, str]] | None = None) -> RemoteCommand:
    """``docker exec -d [-e K=V] CONTAINER sh -c 'exec ARGV > LOG 2>&1'``: the engine runs in the
    Ray head's container (as NVIDIA's playbook does) and writes its log to a path the container
    mounts from the node, so the console follows it with ``tail -c +N`` after any disconnect."""
    inner = "exec " + " ".join(shlex.quote(a) for a in argv) + f" > {shlex.quote(validate_path(log_path))} 2>&1"
    return docker_exec(container, ["sh", "-c", inner], detach=True, env=env, mutating=True,
                       summary=f"start {' '.join(argv[:2])} in {container}")


def write_in_container(container: str, path: str, text: str, summary: str = "") -> RemoteCommand:
    """``docker exec CONTAINER sh -c 'mkdir -p DIR && printf "%s\\n" "$1" > PATH' sh TEXT``: a small
    file in the container's own file system. ``TEXT`` travels as ``$1``, an argument, so nothing of
    it is ever read as shell; the script around it is constant but for the quoted path."""
    p = validate_path(path)
    d = p.rsplit("/", 1)[0] or "/"
    script = f"mkdir -p {shlex.quote(d)} && printf '%s\\n' \"$1\" > {shlex.quote(p)}"
    return docker_exec(container, ["sh", "-c", script, "sh", text], mutating=True,
                       summary=summary or f"write {p} in {container}")


# What ``docker_state`` prints per container: ``/NAME {"Status":…,"OOMKilled":…,"ExitCode":…,…}``
# (the State object as docker's ``json`` template function writes it; parsed by deploy/exits.py).
DOCKER_STATE_FORMAT = "{{.Name}} {{json .State}}"


def docker_state(*names: str) -> RemoteCommand:
    """``docker inspect -f '{{.Name}} {{json .State}}' NAME…``: every named container's state in one
    read-only command (status, exit code, whether the kernel's OOM killer ended it, when). A name
    with no container is ``Error: No such object: NAME`` on stderr and exit 1; the others still print."""
    if not names:
        raise ValidationError("docker inspect needs at least one container")
    valid = [validate_container(n) for n in names]
    return command("docker", "inspect", "-f", DOCKER_STATE_FORMAT, *valid)


# ---- engines found on their own (issue 24, item 1) ------------------------------------------------
#
# Per running container: ``/NAME IMAGE "PATH" ["ARG",…]``. ``Path`` and ``Args`` are what the
# container's process runs: the daemon splits ENTRYPOINT + CMD into the executable and the rest
# (moby's ``getEntrypointAndArgs``: ``entrypoint[0], entrypoint[1:] + cmd``, or ``cmd[0], cmd[1:]``
# without an entrypoint; the Engine API's ContainerInspectResponse documents ``Path`` as "the path to
# the command being run" and ``Args`` as "the arguments to the command being run"). So an image
# whose ENTRYPOINT is ``vllm serve`` run with only ``MODEL --port …`` still reads
# ``"vllm" ["serve","MODEL","--port",…]``, and NGC's reads ``"/opt/nvidia/nvidia_entrypoint.sh"
# ["vllm","serve",…]``: ``.Config.Cmd`` alone would miss the entrypoint. ``json`` keeps an argument
# with spaces in one piece. Names and images have no spaces (docker's own rules), so the first two
# words are theirs.
ENGINE_INSPECT_FORMAT = "{{.Name}} {{.Config.Image}} {{json .Path}} {{json .Args}}"
# the names come from ``docker ps`` (running containers only); none: no inspect (it would refuse
# an empty list with a usage error)
_ENGINE_CONTAINERS = (
    "n=$(docker ps --format '{{.Names}}') && { [ -z \"$n\" ] || docker inspect -f "
    + shlex.quote(ENGINE_INSPECT_FORMAT) + " $n; }")
# host processes that name an engine (a container's processes are in the host's table too); the
# bracket keeps grep's own command line out of its matches
_ENGINE_PROCESSES = "ps -eo pid=,args= | grep -E '[v]llm|[s]glang'"
# what runs inside each running container besides its main process: ``NAME PID ARGS`` of the ones
# naming an engine. vLLM over Ray runs as a ``docker exec``ed ``vllm serve`` in the Ray head's container
# (NVIDIA's playbook, the wizard's own Ray path), whose main process is ``ray start``: only ``docker
# top`` ties that server to its container (and image), which ``vllm bench serve`` runs in. docker top
# runs ``ps`` with the given options on the container's processes; its first line is the header.
_ENGINE_INSIDE = (
    "for c in $(docker ps --format '{{.Names}}'); do docker top \"$c\" -eo pid,args 2>/dev/null | "
    "while read -r pid args; do [ \"$pid\" = PID ] || echo \"$c $pid $args\"; done; done | "
    "grep -E '[v]llm|[s]glang'")


def engine_cmdlines() -> RemoteScript:
    """One read-only exec listing what could be an inference engine on the node: section
    ``containers`` (one :data:`ENGINE_INSPECT_FORMAT` line per running container) and section
    ``processes`` (``PID ARGS`` of host processes naming vllm or sglang; grep's exit 1 there means
    none) and section ``inside`` (``NAME PID ARGS`` of such processes inside each running container,
    by ``docker top``: an engine ``docker exec``ed in a Ray container). Constant text: no value from a
    user or a node is in it. Read by :func:`sparkconsole.serving.discover.rows_from_engine_cmdlines`."""
    return sectioned([("containers", _ENGINE_CONTAINERS), ("inside", _ENGINE_INSIDE),
                      ("processes", _ENGINE_PROCESSES)],
                     summary="list the node's vLLM and SGLang engines")


# The serving poll's page reads, as the probe runs them: ``$1`` the ports (``8000,8001``), ``$2`` the
# pattern of the lines the console reads. ONE curl reads every engine's page (two processes a read
# for the node, however many engines: issue 25), each page followed by a :data:`PAGE_MARK` line naming
# its URL and status (``-w``), curl's own error line in the same stream before it (``--stderr -``:
# ``curl: (7) Failed to connect …``, so the console can say why an engine did not answer). The pages
# are filtered on the node (``grep -E``) so only those lines cross the connection.
PAGE_MARK = "::sparkpage::"
# Every page read is bounded in bytes on the node before it crosses: curl refuses a page whose
# Content-Length passes METRICS_FETCH_MAX_BYTES (``--max-filesize``; error 63, which the console says),
# and since that does not bound a chunked page on every curl, what grep keeps is cut at
# METRICS_PAGE_MAX_BYTES a page (``head -c``; the console refuses a page that reaches it whole). Without
# ``pipefail`` (POSIX sh) the exit code is head's.
METRICS_FETCH_MAX_BYTES = 16 * 1024 * 1024
METRICS_PAGE_MAX_BYTES = 1024 * 1024
METRICS_PAGE_SCRIPT = (
    "u=''; pn=0; q=$1; while [ -n \"$q\" ]; do u=\"$u http://127.0.0.1:${q%%,*}/metrics\"; pn=$((pn+1)); "
    "case $q in *,*) q=${q#*,} ;; *) q='' ;; esac; done; "
    f"curl -sS -m 2 --max-filesize {METRICS_FETCH_MAX_BYTES} --stderr - -w '\\n" + PAGE_MARK
    + " %{url_effective} %{http_code}\\n' $u | grep -E \"$2\" | head -c $((pn * "
    + f"{METRICS_PAGE_MAX_BYTES} + 4096))"
)


def metrics_pattern() -> str:
    """What the page read keeps: the lines :func:`sparkconsole.serving.metrics.parse_metrics` reads,
    curl's error line and the page marks."""
    from sparkconsole.serving.metrics import sample_pattern

    return sample_pattern() + "|^curl: |^" + PAGE_MARK + " "


def metrics_probe(*ports: int) -> RemoteCommand:
    """The engines' ``/metrics`` on ``ports`` of the node's loopback, read by one curl and filtered
    there (:data:`METRICS_PAGE_SCRIPT`); the probe's ``metrics-P1,P2`` section runs the same script
    with the ports from its request line (:func:`sparkconsole.probe.script.probe_script`). Split the
    answer with :func:`sparkconsole.probe.script.split_pages`."""
    if not ports:
        raise ValidationError("port: at least one engine port")
    checked = [validate_port(p) for p in ports]
    return command("sh", "-c", METRICS_PAGE_SCRIPT, "sh", ",".join(str(p) for p in checked), metrics_pattern(),
                   summary="read the engine metrics on port" + ("s " if len(checked) > 1 else " ")
                   + ", ".join(str(p) for p in checked))


# ---- benchmark (issue 24, item 4) ---------------------------------------------------------------------
#
# ``vllm bench serve`` runs in the engine's own container (the image has it, and its tokenizer reaches
# the model's files there); ``llama-benchy`` runs on the head through ``uvx``. Both talk to the engine on
# the head's loopback, are bounded by ``timeout`` (a hung engine does not hold the node's connection),
# and are marked mutating: they put load on a served endpoint, so they are shown and confirmed first.
# An engine with an API key gets it from the head's key file through :func:`with_key_from_file`
# (``OPENAI_API_KEY``: what vLLM's openai backends send as ``Authorization: Bearer``); its value is in
# no command line.

BENCH_KEY_ENV = "OPENAI_API_KEY"
_SERVED = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,199}$")


def validate_served_name(value: str) -> str:
    """Return ``value`` if it is a plausible served model name (``--served-model-name``, a repo id, a path)."""
    if not isinstance(value, str) or not _SERVED.fullmatch(value) or ".." in value.split("/"):
        raise ValidationError(f"not a served model name: {value!r}")
    return value


def _bench_int(name: str, value: int, low: int, high: int) -> str:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValidationError(f"{name} must be a whole number from {low} to {high}: {value!r}")
    return str(value)


def vllm_bench_serve(container: str, port: int, served: str, tokenizer: str, *, concurrency: int,
                     num_prompts: int, input_len: int, output_len: int, result_dir: str, result_filename: str,
                     time_limit_s: int = 600, key_file: str | None = None) -> RemoteScript:
    """``docker exec CONTAINER timeout T vllm bench serve --backend openai-chat --base-url
    http://127.0.0.1:PORT --endpoint /v1/chat/completions --model SERVED --tokenizer TOK --dataset-name
    random --random-input-len N --random-output-len M --num-prompts R --max-concurrency C
    --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,95,99 --save-result --result-dir D
    --result-filename F`` (the percentiles the published runs print), then ``docker exec CONTAINER cat D/F``: sections ``bench``
    (its stdout) and ``result`` (the JSON it saved). ``key_file``: the head's API key file, passed as
    ``OPENAI_API_KEY`` (:func:`with_key_from_file`)."""
    p = validate_port(port)
    d = validate_path(result_dir)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,120}\.json", result_filename):
        raise ValidationError(f"not a result file name: {result_filename!r}")
    argv = ["timeout", _bench_int("the time limit", time_limit_s, 10, 86_400), "vllm", "bench", "serve",
            "--backend", "openai-chat", "--base-url", f"http://127.0.0.1:{p}", "--endpoint", "/v1/chat/completions",
            "--model", validate_served_name(served), "--tokenizer", validate_served_name(tokenizer),
            "--dataset-name", "random", "--random-input-len", _bench_int("the input length", input_len, 1, 1_000_000),
            "--random-output-len", _bench_int("the output length", output_len, 1, 1_000_000),
            "--num-prompts", _bench_int("the requests", num_prompts, 1, 100_000),
            "--max-concurrency", _bench_int("the concurrency", concurrency, 1, 1024),
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,95,99",
            "--save-result", "--result-dir", d, "--result-filename", result_filename]
    summary = f"benchmark {served} at concurrency {concurrency} with vllm bench serve in {container}"
    bench: RemoteCommand = docker_exec(container, argv, mutating=True, summary=summary)
    if key_file is not None:
        bench = with_key_from_file(bench, key_file, name=BENCH_KEY_ENV)
    read = docker_exec(container, ["cat", f"{d.rstrip('/')}/{result_filename}"])
    script = sectioned([("bench", bench), ("result", f"{read.shell()} && echo")], summary=summary)
    return RemoteScript((), mutating=True, summary=script.summary, text=script.text)


#: The llama-benchy release the console runs (``uvx --from llama-benchy==V``): pinned, so a benchmark
#: compares with the runs before it and no new release runs unreviewed on the head. Its CLI takes the
#: key only as ``--api-key`` (0.4.0's ``config.py``; default ``EMPTY``, no environment variable).
LLAMA_BENCHY_VERSION = "0.4.0"


def llama_benchy(port: int, served: str, concurrencies: list[int] | tuple[int, ...], pp: int, tg: int, *,
                 runs: int = 3, tokenizer: str | None = None, time_limit_s: int = 600,
                 key_file: str | None = None) -> RemoteCommand:
    """``timeout T uvx --from llama-benchy==V llama-benchy --base-url http://127.0.0.1:PORT/v1 --model SERVED
    [--tokenizer ID] --pp N --tg M --depth 0 --concurrency C1 C2 … --runs K --latency-mode generation
    --format md`` on the head (the options of the published Spark runs; ``V`` is
    :data:`LLAMA_BENCHY_VERSION`). ``tokenizer`` only when it is a Hub repo id. ``key_file``: the head's
    API key file, read by the head's shell into ``--api-key "$k"`` (the only way llama-benchy takes a
    key): its value is in no text here, but it is on llama-benchy's command line on the head while it
    runs, where the head's other users can see it (``ps``)."""
    p = validate_port(port)
    concs = [_bench_int("a concurrency", c, 1, 1024) for c in concurrencies]
    if not concs:
        raise ValidationError("llama-benchy needs at least one concurrency")
    head = ["timeout", _bench_int("the time limit", time_limit_s, 10, 86_400), "uvx", "--from",
            f"llama-benchy=={LLAMA_BENCHY_VERSION}", "llama-benchy"]
    argv = ["--base-url", f"http://127.0.0.1:{p}/v1", "--model", validate_served_name(served)]
    if tokenizer is not None:
        argv += ["--tokenizer", validate_model_id(tokenizer)]
    argv += ["--pp", _bench_int("the prompt length", pp, 1, 1_000_000),
             "--tg", _bench_int("the generation length", tg, 1, 1_000_000), "--depth", "0",
             "--concurrency", *concs, "--runs", _bench_int("the runs", runs, 1, 100),
             "--latency-mode", "generation", "--format", "md"]
    summary = f"benchmark {served} at concurrency {' '.join(concs)} with llama-benchy {LLAMA_BENCHY_VERSION}"
    if key_file is None:
        return command(*head, *argv, mutating=True, summary=summary)
    f = shlex.quote(validate_path(key_file))
    text = (f'k="$(cat {f})" && [ -n "$k" ] && {command(*head).shell()} --api-key "$k" '
            f"{command(*argv).shell()}")
    return RemoteScript((*head, *argv), mutating=True, text=text, summary=f"{summary} (the API key from {key_file})")


def uvx_available() -> RemoteScript:
    """``command -v uvx``: whether the head has uv's tool runner (exit 1 and nothing when not)."""
    return RemoteScript((), text="command -v uvx", summary="is uvx on the head")


def home_dir() -> RemoteScript:
    """``echo "$HOME"``: the login user's home (where the API key file is)."""
    return RemoteScript((), text='echo "$HOME"', summary="the login user's home")


# ---- Ray's authentication token ----------------------------------------------------------------
#
# Ray's token authentication (docs.ray.io ray-security/token-auth.html and
# ray-core/internals/token-authentication.html): available from Ray 2.52.0; switched by RAY_AUTH_MODE
# (``disabled`` | ``token``), which must be set the same on every node; with ``token`` Ray takes the token
# from RAY_AUTH_TOKEN (the environment), else RAY_AUTH_TOKEN_PATH (a file: unreadable or empty is fatal,
# "RAY_AUTH_TOKEN_PATH is set but file cannot be opened or is empty", src/ray/rpc/authentication/
# authentication_token_loader.cc, which reads the file's first line, whitespace trimmed), else
# ~/.ray/auth_token. Ray 2.59 turns it on by default for local clusters and Ray 2.61 for all clusters
# (docs.ray.io banner). The wizard sets it explicitly: a token made on the head like the API key (the
# kernel's random UUIDs, by the head's own shell), kept in a mode-600 file of the login user, copied to
# each worker node-to-node on ssh's stdin, and given to each Ray container as a read-only mounted file
# named by RAY_AUTH_TOKEN_PATH. Its value is in no command line, journal, state or event: every command
# here names only the file.

RAY_TOKEN_IN_CONTAINER = "/run/sparkconsole/ray-token"  # where the Ray containers see the token file


def ray_token_path(home: str) -> str:
    """Where a node keeps the Ray cluster's token: ``~/.config/sparkconsole/ray-token`` of its login user."""
    return validate_path(f"{home.rstrip('/')}/.config/sparkconsole/ray-token")


def ray_token_env() -> list[tuple[str, str]]:
    """The environment every Ray process the wizard starts carries: token mode, and the token's file
    (its path in the container, never its value)."""
    return [("RAY_AUTH_MODE", "token"), ("RAY_AUTH_TOKEN_PATH", RAY_TOKEN_IN_CONTAINER)]


def ray_token_mount(path: str) -> list[str]:
    """``--mount type=bind,source=FILE,target=RAY_TOKEN_IN_CONTAINER,readonly``: the node's token file
    in a Ray container, read-only. ``--mount`` rather than ``-v``: "If you use --mount to bind-mount a file
    or directory that does not yet exist on the Docker host, Docker does not automatically create it for
    you, but generates an error" (docs.docker.com storage/bind-mounts), where ``-v`` would make an empty
    directory of the missing file and Ray would start on it."""
    p = validate_path(path)
    if "," in p:  # --mount's fields are comma-separated: a comma in the path would start another field
        raise ValidationError(f"not an acceptable path for --mount: {path!r}")
    return ["--mount", f"type=bind,source={p},target={RAY_TOKEN_IN_CONTAINER},readonly"]


def make_ray_token(path: str) -> RemoteScript:
    """:func:`make_api_key`'s form for Ray's token (an existing one kept: a resume restarts no
    container, and the running ones keep the token they read)."""
    return _make_secret(path, f"keep a token for Ray's authentication in {path} (made once, on the node, mode 600)")


def copy_ray_token(path: str, user_host: str, dest: str, *, port: int | None = None) -> RemoteScript:
    """``[ -s FILE ] && cat FILE | ssh -o BatchMode=yes [-p PORT] USER@PEER 'umask 077 && mkdir -p DIR &&
    cat > DEST.new && [ -s DEST.new ] && mv -f DEST.new DEST'``: the head's token to a worker, node to
    node, the way the weights and the image go (:func:`ssh_to`, never a password asked). The token
    travels on ssh's stdin, so it is in no command line on either node; the far side writes it mode
    600 and only a whole, non-empty copy replaces the file there."""
    src, dst = validate_path(path), validate_path(dest)
    f = shlex.quote(src)
    d = dst.rsplit("/", 1)[0] or "/"
    far = (f"umask 077 && mkdir -p {shlex.quote(d)} && cat > {shlex.quote(dst + '.new')} && "
           f"[ -s {shlex.quote(dst + '.new')} ] && mv -f {shlex.quote(dst + '.new')} {shlex.quote(dst)}")
    ssh = ssh_to(user_host, "sh", "-c", far, port=port)
    return RemoteScript((), mutating=True, text=f"[ -s {f} ] && cat {f} | {ssh.shell()}",
                        summary=f"copy Ray's token to {user_host.rpartition('@')[2]} (on ssh's stdin, mode 600)")


def remove_file(path: str, summary: str = "") -> RemoteCommand:
    """``rm -f FILE``: a file this deployment made (teardown)."""
    p = validate_path(path)
    return command("rm", "-f", p, mutating=True, summary=summary or f"remove {p}")


# ---- the cluster's lock on its head ------------------------------------------------------------
#
# One deployment wizard per cluster, whoever runs it and from wherever: the lock is a folder on the
# head, made with one ``mkdir`` (atomic: of two consoles that try at once, one makes it and the
# other is told it exists), holding the holder's record (``holder.json``: laptop, pid, deployment,
# since, a token of its own) and a heartbeat (``beat``: the head's clock, Unix seconds, refreshed
# while the wizard runs). Every write of the record replaces a whole file (``mv -f``), so a reader
# never sees half of one. A holder is judged gone by the console (no refresh for a while, or its
# pid gone on the very laptop asking); taking over is then a compare-and-swap on the head: only
# while the record and the beat are still what the console judged, under a ``take`` folder that
# two consoles cannot both make. Refresh and release act only on a lock whose record is still the
# holder's own, so a console never removes a lock another took over. Answers start with one word
# (taken, held, busy, kept, lost, released, other) and, where the lock is not the asker's, three
# lines: the head's clock, the beat and the holder's record (at most HEAD_LOCK_READ_BYTES).

HEAD_LOCK_DIR = ".cache/sparkconsole/lock.d"  # under the login user's home on the head
HEAD_LOCK_READ_BYTES = 4096
_LOCK_PRELUDE = f'umask 077; d="$HOME/{HEAD_LOCK_DIR}"; h="$d/holder.json"; '
_LOCK_RECORD = f'"$(head -c {HEAD_LOCK_READ_BYTES} "$h" 2>/dev/null)"'
_LOCK_BEAT = '"$(head -c 32 "$d/beat" 2>/dev/null)"'
_DEPLOYMENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def _lock_report(word: str) -> str:
    return (f"echo {word}; date +%s; printf '%s\\n' {_LOCK_BEAT}; printf '%s\\n' {_LOCK_RECORD}; exit 1")


def _lock_record(text: str, *, own: bool) -> str:
    """A holder's record as one quoted shell word. The console's own is one line of printable ASCII
    (``json.dumps``); one read back from the head (a stale holder's, compared before a takeover) is
    node data: any text without a NUL, within the read bound, quoted whole."""
    if "\0" in text or len(text.encode()) > HEAD_LOCK_READ_BYTES:
        raise ValidationError("not a lock record: a NUL byte or too long")
    if own and not re.fullmatch(r"[ -~]{2,1024}", text):
        raise ValidationError(f"not a lock record: {text[:80]!r}")
    return shlex.quote(text)


def _lock_write(record: str) -> str:
    return (f"printf '%s\\n' {record} > \"$h.new\" && mv -f \"$h.new\" \"$h\" && "
            "date +%s > \"$d/beat.new\" && mv -f \"$d/beat.new\" \"$d/beat\"")


def _lock_summary(what: str, deployment: str) -> str:
    if not _DEPLOYMENT_ID.fullmatch(deployment):
        raise ValidationError(f"not a deployment id: {deployment!r}")
    return f"{what} (~/{HEAD_LOCK_DIR}, deployment {deployment})"


def head_lock_take(record: str, deployment: str) -> RemoteScript:
    """Take the cluster's lock: ``mkdir`` the lock folder, then write the record and the beat;
    ``taken`` (exit 0) or, when the folder exists, ``held`` and who holds it (exit 1). A record that
    cannot be written (a full disk on the head) leaves no lock behind."""
    mine = _lock_record(record, own=True)
    text = (_LOCK_PRELUDE + f'mkdir -p "$HOME/{HEAD_LOCK_DIR.rsplit("/", 1)[0]}" || exit 1; '
            f'if mkdir "$d" 2>/dev/null; then if {_lock_write(mine)}; then echo taken; '
            f'else rm -rf "$d"; exit 1; fi; else {_lock_report("held")}; fi')
    return RemoteScript((), mutating=True, text=text,
                        summary=_lock_summary("take the cluster's lock on this head while the wizard runs",
                                              deployment))


def head_lock_take_over(record: str, stale_record: str, stale_beat: str, deployment: str) -> RemoteScript:
    """Take over a lock the console judged stale: under a ``take`` folder (one console at a time),
    and only while its record and beat are still ``stale_record`` and ``stale_beat`` (a holder that
    refreshed meanwhile keeps it): ``taken``; else ``held`` with who holds it now, or ``busy`` while
    another console takes it over (exit 1)."""
    mine = _lock_record(record, own=True)
    old = _lock_record(stale_record, own=False)
    if not re.fullmatch(r"\d{0,20}", stale_beat):
        raise ValidationError(f"not a lock's beat: {stale_beat[:40]!r}")
    text = (_LOCK_PRELUDE + 'if mkdir "$d/take" 2>/dev/null; then '
            f'if [ {_LOCK_RECORD} = {old} ] && [ {_LOCK_BEAT} = {shlex.quote(stale_beat)} ]; then '
            f'if {_lock_write(mine)}; then rmdir "$d/take"; echo taken; else rmdir "$d/take"; exit 1; fi; '
            f'else rmdir "$d/take"; {_lock_report("held")}; fi; else echo busy; exit 1; fi')
    return RemoteScript((), mutating=True, text=text,
                        summary=_lock_summary("take over the cluster's stale lock on this head", deployment))


def head_lock_refresh(record: str, deployment: str) -> RemoteScript:
    """The holder's heartbeat: the beat set to the head's clock while the record is still the
    holder's (``kept``), else ``lost`` with who holds it now (exit 1)."""
    mine = _lock_record(record, own=True)
    text = (_LOCK_PRELUDE + f'if [ {_LOCK_RECORD} = {mine} ]; then '
            'date +%s > "$d/beat.new" && mv -f "$d/beat.new" "$d/beat" && echo kept; '
            f'else {_lock_report("lost")}; fi')
    return RemoteScript((), mutating=True, text=text,
                        summary=_lock_summary("refresh the cluster's lock on this head", deployment))


def head_lock_release(record: str, deployment: str) -> RemoteScript:
    """Remove the lock folder while the record is still the holder's (``released``); a lock another
    console took over is left to it (``other``, exit 1)."""
    mine = _lock_record(record, own=True)
    text = (_LOCK_PRELUDE + f'if [ {_LOCK_RECORD} = {mine} ]; then rm -rf "$d" && echo released; '
            f'else {_lock_report("other")}; fi')
    return RemoteScript((), mutating=True, text=text,
                        summary=_lock_summary("release the cluster's lock on this head", deployment))


# ---- trust between the nodes (the fast link's ssh) ----------------------------------------------
# A node's own ed25519 host key, read over the console's ssh connection to that node (whose host key
# the transport has already verified), so the key another node is told to trust is the one that
# node's sshd offers, never one accepted blind on first use (host-key checking always stays on: no
# accept-new, no ssh-keyscan over the link).
HOST_KEY_FILE = "/etc/ssh/ssh_host_ed25519_key.pub"
HOST_KEY_READ_BYTES = 4096
KNOWN_HOSTS_FILE = '"$HOME/.ssh/known_hosts"'
_KEY_LINE = re.compile(r"^(ssh-ed25519) ([A-Za-z0-9+/]{20,200}={0,2})(?:[ \t].*)?$")


def read_host_key() -> RemoteCommand:
    """``head -c 4096 /etc/ssh/ssh_host_ed25519_key.pub``: the node's public host key (world-readable
    on Ubuntu; bounded, as every read from a node is)."""
    return command("head", "-c", str(HOST_KEY_READ_BYTES), HOST_KEY_FILE, summary="read the node's ssh host key")


def parse_host_key(text: str) -> tuple[str, str] | None:
    """``(key type, base64 blob)`` from a ``.pub`` file's first key line, checked: the blob decodes
    and names its own type (an OpenSSH key blob starts with its type string); None otherwise."""
    import base64
    import binascii

    for line in text.splitlines()[:8]:
        m = _KEY_LINE.match(line.strip())
        if not m:
            continue
        try:
            blob = base64.b64decode(m.group(2), validate=True)
        except (binascii.Error, ValueError):
            return None
        kind = m.group(1).encode()
        if blob[:4] != len(kind).to_bytes(4, "big") or blob[4:4 + len(kind)] != kind:
            return None
        return m.group(1), m.group(2)
    return None


def host_key_fingerprint(blob_b64: str) -> str:
    """``SHA256:…`` as ``ssh-keygen -lf`` and ssh's own prompts print it (unpadded base64 of the
    blob's SHA-256), so the operator can compare it with ``ssh-keygen -lf HOST_KEY_FILE`` on the node."""
    import base64

    digest = hashlib.sha256(base64.b64decode(blob_b64)).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


def known_hosts_entry(host: str, port: int | None, key_type: str, blob_b64: str) -> str:
    """One ``known_hosts`` line, as OpenSSH looks a host up: ``HOST TYPE KEY`` on port 22, else
    ``[HOST]:PORT TYPE KEY`` (sshd(8), SSH_KNOWN_HOSTS FILE FORMAT)."""
    validate_host(host)
    if not _KEY_LINE.match(f"{key_type} {blob_b64}"):
        raise ValidationError(f"not an ed25519 public key: {key_type} {blob_b64[:40]}")
    name = host if not port or port == 22 else f"[{host}]:{validate_port(port)}"
    return f"{name} {key_type} {blob_b64}"


def _checked_entries(entries: list[str] | tuple[str, ...]) -> list[str]:
    out = []
    for e in entries:
        name, _, key = e.partition(" ")
        host = name[1:].rsplit("]:", 1)[0] if name.startswith("[") else name
        port = int(name.rsplit(":", 1)[1]) if name.startswith("[") and name.rsplit(":", 1)[1].isdigit() else None
        kind, _, blob = key.partition(" ")
        if known_hosts_entry(host, port, kind, blob) != e:
            raise ValidationError(f"not a known_hosts line: {e[:80]!r}")
        out.append(e)
    return out


def known_hosts_lines(entries: list[str] | tuple[str, ...]) -> RemoteScript:
    """Which of ``entries`` the login user's ``~/.ssh/known_hosts`` already holds, word for word
    (read-only; no file: none). A key held another way (a hashed line) is asked for again and added
    once more as a plain line, which ssh accepts beside it."""
    pats = " ".join(f"-e {shlex.quote(e)}" for e in _checked_entries(entries))
    text = f"grep -xF {pats} {KNOWN_HOSTS_FILE} 2>/dev/null | head -c 65536; true"
    return RemoteScript((), summary="which peers' host keys this node's ssh already knows", text=text)


def add_known_hosts(entries: list[str] | tuple[str, ...], summary: str = "") -> RemoteScript:
    """Append each of ``entries`` to ``~/.ssh/known_hosts`` unless it is there already (``~/.ssh``
    made 0700 where missing, the file 0600): the change a node needs before its ssh, rsync or
    ``docker save | ssh`` may reach a peer over the fast link with BatchMode on."""
    parts = ['umask 077; mkdir -p "$HOME/.ssh" && touch ' + KNOWN_HOSTS_FILE]
    for e in _checked_entries(entries):
        q = shlex.quote(e)
        parts.append(f"{{ grep -qxF {q} {KNOWN_HOSTS_FILE} || echo {q} >> {KNOWN_HOSTS_FILE}; }}")
    return RemoteScript((), mutating=True, text=" && ".join(parts),
                        summary=summary or "add the peers' host keys to ~/.ssh/known_hosts")


# ---- the memory guard's node-side watcher (probe.memory_guard: the policy) ----------------------

GUARD_MARK = "sparkguard"
GUARD_INTERVAL_S = 2
# The watcher, run by bash where the node has it (its ``read -t`` on a private fifo is the tick's
# wait: no process at all per tick) and by sh elsewhere (``sleep``: one process per tick). Each tick
# reads /proc/meminfo (up to SwapFree) and /proc/pressure/memory with the shell's own ``read``, writes
# one state line, and acts only when the policy says so: ``docker stop`` of the next target (the
# console passes them in probe.memory_guard.stop_order's order), then a one-line reason, then
# again after ``stall_ticks`` ticks if memory is still short; with every target stopped it ends. The
# state line is rewritten when the level or the stall count changes, and every 15 ticks (measured on a
# shared x86 Linux host, not yet on a Spark: 0.39 ms of CPU per second at the 2 s default with bash,
# 0.67 ms at 1 s; writing the line every tick cost a third more).
# It ends too when its arm file is removed (the console disarms it) or the process it watches is
# gone (the engine ended on its own), removing its fifo: nothing of it is left but its files in the
# deployment's job folder, which teardown removes. Parameters are positional arguments (quoted by
# :meth:`RemoteCommand.shell`); the text is constant.
_GUARD_LAUNCH = 'b=sh; command -v bash >/dev/null 2>&1 && b=bash; t=$1; shift; exec "$b" -c "$t" sparkguard "$@"'
_GUARD_SCRIPT = r"""node=$1 sf=$2 rf=$3 af=$4 iv=$5 warn=$6 hard=$7 fth=$8 nth=$9
mi=${10} ps=${11} dk=${12} wp=${13}; shift 13
fifo=''
if [ -n "${BASH_VERSION:-}" ]; then
  fifo="$sf.fifo"; rm -f "$fifo"; mkfifo -m 600 "$fifo" && exec 9<>"$fifo" || fifo=''
fi
bye() { [ -n "$fifo" ] && rm -f "$fifo"; exit "${1:-0}"; }
trap 'bye 143' TERM; trap 'bye 129' HUP; trap 'bye 130' INT
nap() { if [ -n "$fifo" ]; then read -r -t "$iv" -u 9 _ || :; else sleep "$iv"; fi; }
x100() { v=${1#*=}; i=${v%%.*}; f=${v#"$i"}; f=${f#.}00; f=${f%"${f#??}"}; case $i$f in *[!0-9]*|'') r=0 ;; *) r=$((i * 100 + 1$f - 100)) ;; esac; }
n=0 grace=0 stopped='' last='' w=0
while :; do
  [ -e "$af" ] || { printf 'disarmed node=%s\n' "$node" >"$sf"; bye 0; }
  [ "$wp" = 0 ] || [ -d "/proc/$wp" ] || { printf 'ended node=%s why=watched-process-gone\n' "$node" >"$sf"; bye 0; }
  av=-1 st=0 sw=0
  while read -r k v _; do case $k in
    MemAvailable:) av=$v ;; SwapTotal:) st=$v ;; SwapFree:) sw=$v; break ;; esac; done <"$mi"
  sa=-1 fa=-1
  if [ -r "$ps" ]; then while read -r k a _; do x100 "$a"; case $k in some) sa=$r ;; full) fa=$r ;; esac; done <"$ps"; fi
  if [ "$fa" -gt "$fth" ]; then n=$((n + 1)); else n=0; fi
  cause=''
  if [ "$av" -ge 0 ] && [ "$av" -lt "$hard" ]; then cause=floor; elif [ "$n" -ge "$nth" ]; then cause=pressure; fi
  lv=ok; [ "$av" -ge 0 ] && [ "$av" -lt "$warn" ] && lv=warn; [ "$n" -gt 0 ] && lv=warn
  if [ -n "$cause" ] && [ "$grace" -le 0 ]; then
    if [ $# -eq 0 ]; then printf 'acted node=%s cause=%s avail_kib=%s hard_kib=%s full_x100=%s some_x100=%s swap_used_kib=%s stopped=%s\n' \
      "$node" "$cause" "$av" "$hard" "$fa" "$sa" "$((st - sw))" "${stopped#,}" >"$rf"; printf 'done node=%s\n' "$node" >"$sf"; bye 0; fi
    tg=$1; shift
    case $tg in pid:*) kill -TERM "-${tg#pid:}" 2>/dev/null || kill -TERM "${tg#pid:}" 2>/dev/null; rc=$? ;;
      *) "$dk" stop -t 10 "$tg" >/dev/null 2>&1; rc=$? ;; esac
    stopped="$stopped,$tg"
    printf 'acted node=%s cause=%s avail_kib=%s hard_kib=%s full_x100=%s some_x100=%s swap_used_kib=%s stopped=%s rc=%s\n' \
      "$node" "$cause" "$av" "$hard" "$fa" "$sa" "$((st - sw))" "${stopped#,}" "$rc" >"$rf"
    lv=acted n=0 grace=$nth
  fi
  [ "$grace" -gt 0 ] && grace=$((grace - 1))
  k="$lv $n $#"; w=$((w + 1))
  if [ "$k" != "$last" ] || [ "$w" -ge 15 ]; then last=$k w=0
    printf '%s node=%s avail_kib=%s warn_kib=%s hard_kib=%s full_x100=%s some_x100=%s stall=%s/%s swap_used_kib=%s left=%s\n' \
      "$lv" "$node" "$av" "$warn" "$hard" "$fa" "$sa" "$n" "$nth" "$((st - sw))" "$#" >"$sf"; fi
  [ $# -eq 0 ] && [ -n "$stopped" ] && bye 0
  nap
done
"""


@dataclass(frozen=True)
class GuardFiles:
    """Where a node's memory-guard watcher keeps its state: ``state`` (one line, rewritten each
    tick), ``reason`` (one line, written when it acted), ``arm`` (exists while armed; removing it
    disarms the watcher at its next tick). The job files (log, rc, pid) are the usual detached
    job's (:class:`JobFiles`) under the same folder."""

    state: str
    reason: str
    arm: str
    job: JobFiles

    @classmethod
    def under(cls, job_dir: str, name: str = "memguard") -> GuardFiles:
        job = JobFiles.under(job_dir, name)
        return cls(state=f"{job_dir}/{name}.state", reason=f"{job_dir}/{name}.reason",
                   arm=f"{job_dir}/{name}.arm", job=job)


def memory_guard_watch(node: str, files: GuardFiles, targets: list[str] | tuple[str, ...], *,
                       warn_floor_bytes: int, hard_floor_bytes: int, full_act_pct: float, stall_ticks: int,
                       interval_s: int = GUARD_INTERVAL_S, watch_pid: int = 0,
                       meminfo: str = "/proc/meminfo", pressure: str = "/proc/pressure/memory",
                       docker: str = "docker") -> RemoteCommand:
    """The watcher's command (the ``inner`` of :func:`detached`, started beside the engine): it
    stops ``targets`` in order (container names, or ``pid:N`` for an engine started on the host:
    its process group) when ``MemAvailable`` falls below ``hard_floor_bytes`` or ``full avg10``
    stays above ``full_act_pct`` for ``stall_ticks`` ticks. The paths are parameters so that tests
    run it against a fake ``/proc``; on a node they are the defaults."""
    checked = []
    for t in targets:
        if t.startswith("pid:"):
            if not t[4:].isdigit() or int(t[4:]) <= 1:
                raise ValidationError(f"not a process to stop: {t!r}")
            checked.append(t)
        else:
            checked.append(validate_container(t))
    if not 1 <= int(interval_s) <= 60 or not 1 <= int(stall_ticks) <= 100:
        raise ValidationError("the guard's interval is 1 to 60 s and its stall count 1 to 100 ticks")
    if not 0 < full_act_pct <= 100 or min(warn_floor_bytes, hard_floor_bytes) < 0:
        raise ValidationError("the guard's pressure threshold is a percentage and its floors are not negative")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}", node):
        raise ValidationError(f"not a node name: {node!r}")
    if docker != "docker":
        validate_path(docker)
    args = (node, validate_path(files.state), validate_path(files.reason), validate_path(files.arm),
            str(int(interval_s)), str(int(warn_floor_bytes) // 1024), str(int(hard_floor_bytes) // 1024),
            str(round(full_act_pct * 100)), str(int(stall_ticks)), validate_path(meminfo), validate_path(pressure),
            docker, str(int(watch_pid)), *checked)
    what = ", ".join(checked) or "nothing"
    return RemoteCommand(("sh", "-c", _GUARD_LAUNCH, GUARD_MARK, _GUARD_SCRIPT, *args), mutating=True,
                         summary=f"watch {node}'s memory and stop {what} before it runs out")


def memory_guard_arm(job_dir: str, files: GuardFiles, watch: RemoteCommand) -> RemoteScript:
    """Arm: make the arm file, then start the watcher detached (the wizard's job form), printing its
    pid."""
    start = detached(job_dir, files.job, watch, summary=watch.summary)
    text = (f"mkdir -p {shlex.quote(validate_path(job_dir))} && rm -f {shlex.quote(files.reason)} && "
            f": > {shlex.quote(files.arm)} || exit 1; {start.text}")
    return RemoteScript((), mutating=True, summary=watch.summary, text=text)


def memory_guard_disarm(files: GuardFiles) -> RemoteScript:
    """Disarm: remove the arm file (the watcher ends at its next tick, removing its fifo) and end it
    now, with its process group (``setsid`` made one), if its identity file names it still running.
    Its state and reason stay for the console."""
    arm = shlex.quote(validate_path(files.arm))
    text = (f"rm -f {arm}; if {job_alive(files.job)}; then kill -TERM -- \"-$jp\" 2>/dev/null; fi; true")
    return RemoteScript((), mutating=True, summary="disarm the memory guard", text=text)


def memory_guard_remove(files: GuardFiles) -> RemoteScript:
    """Teardown: disarm, wait (at most 5 s) for the watcher to be gone so that it writes nothing
    after, then remove every file it had (state, reason, fifo, job files)."""
    paths = " ".join(shlex.quote(validate_path(p)) for p in (
        files.arm, files.state, files.reason, files.state + ".fifo", files.job.log, files.job.rc, files.job.pid))
    wait = (f"i=0; while {job_alive(files.job)} && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done")
    text = f"{memory_guard_disarm(files).text}; {wait}; rm -f {paths}"
    return RemoteScript((), mutating=True, summary="remove the memory guard", text=text)


GUARD_STATE_MAX_BYTES = 4096


def memory_guard_status(files: GuardFiles) -> RemoteScript:
    """Read-only: ``armed``/``disarmed`` and whether the watcher runs, then its state line and its
    reason line (each cut at :data:`GUARD_STATE_MAX_BYTES`)."""
    arm, sf, rf = (shlex.quote(validate_path(p)) for p in (files.arm, files.state, files.reason))
    text = (f"if [ -e {arm} ]; then a=armed; else a=disarmed; fi; if {job_alive(files.job)}; then r=running; "
            f"else r=stopped; fi; echo \"guard $a $r\"; "
            f"printf 'state '; head -c {GUARD_STATE_MAX_BYTES} {sf} 2>/dev/null | head -n 1; echo; "
            f"printf 'reason '; head -c {GUARD_STATE_MAX_BYTES} {rf} 2>/dev/null | head -n 1; echo")
    return RemoteScript((), summary="the memory guard's state", text=text)


# ---- the kernel's log, where the login user may read it -------------------------------------------

KLOG_MARK = "::sparkklog::"
KLOG_LINES = 2000
KLOG_MAX_BYTES = 1024 * 1024


def kernel_log_read(lines: int = KLOG_LINES, max_bytes: int = KLOG_MAX_BYTES) -> RemoteScript:
    """Read-only: the kernel's newest ``lines`` log lines, from ``journalctl -k`` where the login user
    is in the ``adm`` or ``systemd-journal`` group (or is root), else from ``dmesg`` where
    ``kernel.dmesg_restrict`` is 0; the first line says which (``::sparkklog:: source journalctl`` /
    ``dmesg`` / ``none WHY``), read by :func:`sparkconsole.probe.kernel_log.parse_kernel_log`. Never
    sudo: what the user may not read is said, not forced. Cut at ``max_bytes``."""
    n, cap = int(lines), int(max_bytes)
    if not 1 <= n <= 100_000 or not 1024 <= cap <= 64 * 1024 * 1024:
        raise ValidationError("a kernel log read is 1 to 100000 lines and 1 KiB to 64 MiB")
    text = (f"g=\" $(id -Gn 2>/dev/null) \"; u=$(id -u); r=1; read r < /proc/sys/kernel/dmesg_restrict 2>/dev/null; "
            f"if [ \"$u\" = 0 ] || case $g in *' adm '*|*' systemd-journal '*) true ;; *) false ;; esac "
            f"&& command -v journalctl >/dev/null 2>&1; then echo '{KLOG_MARK} source journalctl'; "
            f"journalctl -k -q --no-pager -o short-iso -n {n} 2>&1 | head -c {cap}; "
            f"elif [ \"$r\" = 0 ] && command -v dmesg >/dev/null 2>&1; then echo '{KLOG_MARK} source dmesg'; "
            f"dmesg --time-format iso 2>&1 | tail -n {n} | head -c {cap}; "
            f"else echo \"{KLOG_MARK} source none not in adm or systemd-journal, kernel.dmesg_restrict=$r\"; fi")
    return RemoteScript((), summary="read the kernel's log (OOM kills, NVIDIA Xid errors)", text=text)
