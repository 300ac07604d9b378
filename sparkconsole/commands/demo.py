"""``sparkconsole demo``: the console on a simulated two-Spark cluster behind real SSH servers.

``sparkconsole demo [--nodes N] [--scenario S] [--speed X] [--serve] [--read-only] [--no-serving]``

* without ``--serve``: opens the console on the simulated cluster (the UI starts the cluster in
  its own event loop);
* ``--serve``: keeps only the cluster running and prints how to reach each node with plain
  OpenSSH (``ssh -i KEY -p PORT -o UserKnownHostsFile=FILE root@127.0.0.1``), until Ctrl-C; it
  also writes an inventory file for the running cluster (``--inventory FILE``, default
  ``cluster.toml`` in the demo's directory) and prints ``sparkconsole --config FILE`` and
  ``sparkconsole deploy --config FILE``, so a second process can drive the same cluster.

``--nodes`` goes up to 64: nodes beyond the second are workers with their own names and
fast-link addresses (``192.168.200.12`` upwards).

Scenarios: see :mod:`sparkconsole.sim.scenarios`; the supported deploy commands: see
:mod:`sparkconsole.sim.shell`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys

from sparkconsole.errors import UserError
from sparkconsole.schema import MAX_NODES  # the inventory's cap, the twin file's too


def add_parser(subs: argparse._SubParsersAction) -> None:
    from sparkconsole.sim.scenarios import SCENARIOS

    p = subs.add_parser(
        "demo", help="open the console on a simulated DGX Spark cluster (no hardware needed)",
        description="Start a simulated cluster of DGX Sparks behind real SSH servers on 127.0.0.1 and open "
        "the console on it. With --serve, keep only the cluster running and print how to reach it with ssh.",
    )
    p.add_argument("--nodes", type=int, default=2, metavar="N", help="number of Sparks (default 2)")
    p.add_argument("--scenario", choices=SCENARIOS, default="story",
                   help="starting state: " + ", ".join(SCENARIOS) + " (default story)")
    p.add_argument("--speed", type=float, default=1.0, metavar="X",
                   help="simulated seconds per real second (default 1)")
    p.add_argument("--serve", action="store_true", help="only run the cluster and print ssh commands")
    p.add_argument("--read-only", action="store_true", help="the console refuses every change")
    p.add_argument("--no-serving", dest="serving", action="store_false",
                   help="turn the serving poll off (no engine discovery, no /metrics reads)")
    p.add_argument("--twin", metavar="FILE", default=None,
                   help="the cluster is this twin file (written by `deploy --rehearse`), not a scenario")
    p.add_argument("--inventory", metavar="FILE", default=None,
                   help="with --serve: where to write the cluster's config file (default: in the demo's directory)")
    p.set_defaults(func=run)


def _check(args: argparse.Namespace) -> None:
    if not 1 <= args.nodes <= MAX_NODES:
        raise UserError(f"--nodes must be between 1 and {MAX_NODES}", exit_code=2)
    if not 0 < args.speed <= 1000:
        raise UserError("--speed must be > 0 and at most 1000", exit_code=2)


def run(args: argparse.Namespace) -> int:
    _check(args)
    if args.twin:
        from sparkconsole.deploy.twin import load

        args.twin = load(args.twin)  # a bad file: one line, exit 2, before anything starts
        args.nodes = len(args.twin.nodes)
    if args.serve:
        try:
            asyncio.run(_serve(args))
        except KeyboardInterrupt:
            pass
        return 0
    from sparkconsole.ui.app import DemoOptions, run_console

    opts = DemoOptions(nodes=args.nodes, scenario=args.scenario, speed=args.speed, read_only=bool(args.read_only),
                       twin=args.twin)
    with _workdirs_removed_on_signal():
        return run_console(demo=opts, serving=args.serving)


# What stops the demo as Ctrl-C does: a service manager or `kill` (SIGTERM), the terminal going away (SIGHUP).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _stop_on_signals() -> asyncio.Event:
    """An event set by Ctrl-C (SIGINT), SIGTERM or SIGHUP, so the cluster is torn down in order (its
    folder, client key included, removed). Ctrl-C sets it too rather than raising KeyboardInterrupt
    wherever the loop happens to be: on a busy machine that landed mid-way through an SSH session's
    teardown and ended the demo with a traceback and exit 1."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, *STOP_SIGNALS):
        loop.add_signal_handler(sig, stop.set)
    return stop


@contextlib.contextmanager
def _workdirs_removed_on_signal():
    """While the console runs the demo in its own loop: SIGTERM or SIGHUP first removes the demo's
    temporary folders, then ends the process as that signal does."""
    from sparkconsole.sim.server import remove_workdirs

    def handler(signum, frame) -> None:
        remove_workdirs()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


async def _serve(args: argparse.Namespace) -> None:
    from sparkconsole.sim import start_demo_cluster

    stop = _stop_on_signals()
    async with start_demo_cluster(nodes=args.nodes, scenario=args.scenario, speed=args.speed,
                                  read_only=args.read_only, twin=args.twin) as demo:
        what = f"a twin of '{args.twin.cluster}'" if args.twin else f"'{args.scenario}'"
        print(f"Simulated cluster {what} with {args.nodes} Spark(s), speed x{args.speed:g}. "
              "Reach each node with OpenSSH:")
        for line in getattr(demo.sim, "invented", []):
            print(f"  (invented: {line})")
        for line in demo.ssh_commands():
            print("  " + line)
        inv = demo.write_inventory(getattr(args, "inventory", None))
        print(f"Files: {demo.workdir}  (client key, known_hosts)")
        print(f"Inventory: {inv}")
        print(f"  sparkconsole --config {inv}")
        print(f"  sparkconsole deploy --config {inv}")
        first = next(iter(demo.ssh_commands()), "").partition(": ")[2]  # as the node's login user
        print(f"Try: {first} nvidia-smi (or ibdev2netdev, docker ps, free -h). Ctrl-C stops the cluster.")
        sys.stdout.flush()
        await stop.wait()
