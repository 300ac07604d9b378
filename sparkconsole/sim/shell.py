"""A simulated Spark's shell: the :mod:`sh <sparkconsole.sim.sh>` interpreter plus the node's tools.

An exec channel's command runs here as ``sh -c COMMAND`` would on the node (dash rules: see
:mod:`sparkconsole.sim.sh.interp`): sequences, pipelines, quoting, variables, ``$(...)``,
``$((...))``, redirections into the node's files, heredocs, ``if``/``for``/``while``/``case``,
``&`` jobs that live in the node's process table after the channel closes.

What the sim answers, by family (each module's docstring has the details):

==========  =========================================================================================
family      commands
==========  =========================================================================================
builtins    ``cd export unset set shift exit return break continue true false : test [ echo printf
            read eval wait kill command type trap umask pwd``
wrappers    ``nohup setsid sudo [-n] [-l] timeout env nice exec sh|bash [-c SCRIPT | FILE | stdin]``
files       ``cat grep head tail [-F] wc ls mkdir rm rmdir touch ln -s mv readlink basename dirname
            find sha256sum du df tee`` over the node's file system (``/proc``, ``/sys`` virtual)
sys         ``hostname uname nproc lscpu uptime sleep which free date id whoami nvidia-smi systemctl
            journalctl [-k] dmesg ps pgrep pkill true false``
net         ``ibdev2netdev ip ethtool ping ssh ss curl``
docker      ``docker ps stats images image info version logs stop start restart kill rm run exec inspect
            pull save|ssh docker load``; in a container: ``vllm serve``, ``python3 -m ...``, ``python3 -c``
ray         ``ray start --head|--address, ray status, ray stop``
hf          ``hf download``, ``hf auth whoami``, ``huggingface-cli download`` (in containers and on
            the permissive twin: a stock host has none)
bench       ``vllm bench serve`` in a vLLM container; ``uvx llama-benchy`` where the host has uvx
rsync       ``rsync -a [-L|--copy-unsafe-links] [--partial] [--size-only] [--exclude P]
            [--info=progress2] [-e ssh] SRC [HOST:]DEST``
==========  =========================================================================================

Not modelled: job control (``fg``, ``jobs``), ``set -e``/``-u``/``pipefail`` (accepted, ignored),
streaming pipelines (stages run one after the other, so ``tail -f X | grep`` never ends), aliases,
``case`` fall-through, arrays (bash), ``python3`` on the host, any tool not listed (``sh: 1: foo:
not found``, exit 127). A container sees the node's files only through its ``-v HOST:CTR``
bind mounts; every other path is its own (:class:`~sparkconsole.sim.container.ContainerFS`).
``kill PID`` of a ``sh -c`` wrapper kills the ``sh`` only, as on Linux: ``kill -- -PGID`` stops
the group (a ``setsid`` job's pgid is its pid).

Who runs the commands (:meth:`SimCluster.login <sparkconsole.sim.model.SimCluster.login>`): on a stock
node (every scenario but ``permissive``) the login user ``nvidia`` (uid 1000, in ``sudo`` and
``docker``, home ``/home/nvidia``), whose ``sudo`` needs a password (only the node's NOPASSWD rules,
``SimNode.sudo_rules``, pass ``sudo -n``) and whom a peer's sshd takes (``root@PEER``: ``Permission
denied (publickey)``); containers run as root. On the permissive twin: root everywhere, as before.
"""

from __future__ import annotations

import asyncio
import shlex

from sparkconsole.sim import formats as F
from sparkconsole.sim.model import SimCluster, SimNode
from sparkconsole.sim.sh.interp import IO, Capture, Interp, ShellExit, Stream, Writer
from sparkconsole.sim.tools.bench import BenchTools
from sparkconsole.sim.tools.common import UNITS_DEFAULT
from sparkconsole.sim.tools.docker import DockerTools
from sparkconsole.sim.tools.files import FileTools
from sparkconsole.sim.tools.hf import HfTools
from sparkconsole.sim.tools.net import NetTools
from sparkconsole.sim.tools.ray import RayTools
from sparkconsole.sim.tools.rsync import RsyncTools
from sparkconsole.sim.tools.sys import SysTools

__all__ = ["IO", "Capture", "Shell", "ShellExit", "Writer"]


class Shell(SysTools, FileTools, NetTools, DockerTools, RayTools, HfTools, RsyncTools, BenchTools, Interp):
    """One node's shell. ``run`` executes a command line as ``sh -c`` does; output goes to the
    writers as it comes; the command's processes join the node's process table."""

    def __init__(self, cluster: SimCluster, node: str) -> None:
        super().__init__(cluster, node)
        if cluster.virtual_files is None:
            cluster.virtual_files = lambda cl, n: F.sysfs_files(cl, n, cl.now())
        if cluster.virtual_file is None:
            cluster.virtual_file = lambda cl, n, path: F.virtual_file(cl, n, path, cl.now())
        cluster.units.setdefault(node, dict(UNITS_DEFAULT))

    @property
    def node(self) -> SimNode:
        return self.cluster.node(self.node_name)

    @staticmethod
    def tokenize(cmdline: str) -> list[str]:
        """Split a container command string as a shell would (no expansion)."""
        try:
            return shlex.split(cmdline)
        except ValueError:
            return cmdline.split()

    async def run(self, cmdline: str, out: Writer, err: Writer, stdin: str | None = None) -> int:
        """Run ``cmdline`` as its own session (like sshd's ``sh -c``). Cancelled (the channel
        closed), the session's foreground processes get SIGHUP; ``&`` jobs and ``setsid``/``nohup``
        ones keep running."""
        table = self.procs
        proc = table.spawn(["sh", "-c", cmdline])
        self.proc = proc
        task = table.start(proc, self.run_script(cmdline, IO(out, err, None if stdin is None else stdin if isinstance(stdin, Stream) else Stream(stdin),
                                                             self.env_for({}), proc),
                                                 exec_in=proc))
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            table.hangup(proc.sid)
            raise
        return proc.rc if proc.rc is not None else 0

    def hold(self, argv: list[str]) -> asyncio.Task[int]:
        """Start a long-lived shell process (``argv`` is what ``ps`` shows: the probe's ``sh -c``)
        that :meth:`run_here` runs scripts in, as one shell reading commands would; it ends when
        the returned task is cancelled (the channel closed)."""
        table = self.procs
        self.proc = table.spawn(argv)
        return table.start(self.proc, asyncio.get_running_loop().create_future())

    async def run_here(self, script: str, out: Writer, err: Writer) -> int:
        """``script`` in the held process: builtins and functions start nothing, each other command
        is a child of it (no ``sh -c`` of its own, unlike :meth:`run`)."""
        assert self.proc is not None, "hold() first"
        return await self.run_script(script, IO(out, err, None, self.env_for({}), self.proc))

    async def capture(self, cmdline: str, stdin: str | None = None) -> tuple[str, str, int]:
        o, e = Capture(), Capture()
        rc = await self.run(cmdline, o, e, stdin)
        return o.text(), e.text(), rc
