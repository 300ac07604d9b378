"""``sparkconsole`` / ``sparkconsole tui``: open the console on the configured cluster."""

from __future__ import annotations

import argparse

from sparkconsole.cli import add_cluster_args
from sparkconsole.commands._cluster import cluster_from_args


def add_parser(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser("tui", help="open the console (the default command)",
                        description="Open the console on the configured cluster (--config, --host, --local), "
                        "or on the simulated one with --demo.")
    add_cluster_args(p)
    p.add_argument("--interval", type=float, default=2.0, help="seconds between probes of a node (default 2)")
    p.add_argument("--no-serving", dest="serving", action="store_false",
                   help="turn the serving poll off (no engine discovery, no /metrics reads)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from sparkconsole.ui.app import DemoOptions, run_console

    if args.interval <= 0:
        from sparkconsole.errors import UserError

        raise UserError("--interval must be more than 0 seconds")
    if args.demo:
        return run_console(demo=DemoOptions(read_only=bool(args.read_only)), interval=args.interval,
                           serving=args.serving)
    config = cluster_from_args(args)
    return run_console(config, interval=args.interval, serving=args.serving)
