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
    """Return ``value`` if it is a host name, alias or address."""
    if not _HOST.fullmatch(value):
        raise ValidationError(f"not a valid host name or address: {value!r}")
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


def drop_caches() -> RemoteCommand:
    return command(
        "sudo", "-n", "sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches",
        mutating=True, summary="drop the page cache (sync; echo 3 > /proc/sys/vm/drop_caches)",
    )
