"""``sparkconsole snapshot``: one probe of every node, printed as JSON or one line per node."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from sparkconsole.cli import add_cluster_args
from sparkconsole.commands._cluster import open_cluster
from sparkconsole.errors import UserError
from sparkconsole.logs.follow import display_lines
from sparkconsole.probe.alerts import cluster_alerts
from sparkconsole.probe.poller import snapshot_cluster, states_to_json
from sparkconsole.probe.state import NodeState, NodeStatus
from sparkconsole.sim.scenarios import SCENARIOS


def add_parser(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser("snapshot", help="probe every node once and print what was seen",
                        description="Probe every node once (all sections) and print the typed samples "
                        "the dashboard shows.")
    add_cluster_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--timeout", type=float, default=20.0, help="seconds to wait for each node (default 20)")
    p.add_argument("--scenario", default="story", choices=SCENARIOS,
                   help="with --demo: the simulated cluster's starting state (default story)")
    p.add_argument("--nodes", type=int, default=2, metavar="N", help="with --demo: how many Sparks (default 2)")
    p.set_defaults(func=run)


def _line(state: NodeState) -> str:
    """One node on one line. The reason and the GPU's name are the node's words, and the node's
    name may be this machine's hostname (``--local``): all cleaned of escape sequences (they would
    reach the operator's terminal) and kept on the line."""
    s = state.sample
    name = display_lines(state.name, " ")
    if s is None:
        return f"{name:<16} {state.status.value:<10} {display_lines(state.reason, ' ')}"
    mem = s.memory
    gib = 2**30
    used = f"{mem.used_bytes / gib:.1f}" if mem.used_bytes is not None else "—"
    total = f"{mem.total_bytes / gib:.1f}" if mem.total_bytes is not None else "—"
    gpu = display_lines(s.gpus[0].name, " ") if s.gpus and s.gpus[0].name else "no GPU read"
    up = sum(1 for link in s.links if link.state == "up")
    return (f"{name:<16} {state.status.value:<10} {gpu:<14} memory {used}/{total} GiB  "
            f"links up {up}/{len(s.links)}  containers {sum(c.state == 'running' for c in s.containers)}")


async def _snapshot(args: argparse.Namespace) -> list[NodeState]:
    async with open_cluster(args) as config:
        return await snapshot_cluster(config, timeout=args.timeout)


def run(args: argparse.Namespace) -> int:
    if args.timeout <= 0 or not 1 <= args.nodes <= 16:
        raise UserError("--timeout must be more than 0 and --nodes between 1 and 16")
    states = asyncio.run(_snapshot(args))
    alerts = cluster_alerts(states)
    if args.json:
        data = states_to_json(states)
        data["alerts"] = [{"node": a.node, "severity": a.severity, "text": a.text} for a in alerts]
        json.dump(data, sys.stdout, indent=2)  # ensure_ascii (the default): every control char is a \u escape
        sys.stdout.write("\n")
    else:
        for state in states:
            print(_line(state))
        for a in alerts:
            print(f"{a.severity}: {display_lines(a.node, ' ')}: {display_lines(a.text, ' ')}")
    return 0 if all(s.status is NodeStatus.UP for s in states) else 3
