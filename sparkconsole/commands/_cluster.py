"""Choosing the cluster from the command line: ``--config``, ``--host``, ``--local`` or ``--demo``."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace

from sparkconsole.config import ClusterConfig, adhoc_cluster, config_search, load_config, local_cluster
from sparkconsole.errors import ConfigError


def cluster_from_args(args: argparse.Namespace) -> ClusterConfig:
    """The configured cluster (not the demo): explicit flags win over files."""
    chosen = [name for name in ("config", "host", "local") if getattr(args, name, None)]
    if len(chosen) > 1:
        raise ConfigError("choose one of --config, --host and --local")
    read_only = bool(getattr(args, "read_only", False))
    if getattr(args, "local", False):
        return local_cluster(read_only=read_only)
    if getattr(args, "host", None):
        return adhoc_cluster(args.host, read_only=read_only)
    path = config_search(getattr(args, "config", None))
    if path is None:
        raise ConfigError(
            "no cluster configured: pass --host A --host B, --config FILE, --local, or try "
            "`sparkconsole demo`"
        )
    config = load_config(path)
    return replace(config, read_only=config.read_only or read_only)


@contextlib.asynccontextmanager
async def open_cluster(args: argparse.Namespace, *, demo_speed: float = 1.0) -> AsyncIterator[ClusterConfig]:
    """Yield the cluster to talk to; with ``--demo`` the simulated cluster runs meanwhile."""
    if getattr(args, "demo", False):
        from sparkconsole.sim import start_demo_cluster

        async with start_demo_cluster(
            nodes=getattr(args, "nodes", 2) or 2,
            scenario=getattr(args, "scenario", "story") or "story",
            speed=demo_speed,
            twin=getattr(args, "twin", None),
        ) as demo:
            config = demo.config
            if getattr(args, "read_only", False):
                config = replace(config, read_only=True)
            yield config
        return
    yield cluster_from_args(args)
