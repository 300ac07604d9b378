"""A simulated DGX Spark cluster behind a real SSH server: the demo and the test bed.

Public API::

    from sparkconsole.sim import start_demo_cluster, SimClock

    async with start_demo_cluster(nodes=2, scenario="story", speed=1.0, clock=None) as demo:
        demo.config   # a ClusterConfig: 127.0.0.1, port, user, identity, known_hosts per node
        demo.sim      # the SimCluster model (inspect it; with SimClock.frozen(), advance its clock)
        await demo.stop()

Modules: :mod:`~sparkconsole.sim.clock` (sim time), :mod:`~sparkconsole.sim.model` (state: nodes,
containers, memory, the model and image catalogues), :mod:`~sparkconsole.sim.vfs` (each node's
files), :mod:`~sparkconsole.sim.procs` (each node's process table, outliving SSH channels),
:mod:`~sparkconsole.sim.formats` (real output formats), :mod:`~sparkconsole.sim.vllm_logs`
(version-specific vLLM logs), :mod:`~sparkconsole.sim.sglang` (SGLang runs, the engine check),
:mod:`~sparkconsole.sim.sh` (a POSIX ``sh``: parse, expand, interp),
:mod:`~sparkconsole.sim.tools` (one module per tool family: sys, files, net, docker, ray, hf,
rsync), :mod:`~sparkconsole.sim.shell` (the node's shell, with the table of what it answers and
what it does not), :mod:`~sparkconsole.sim.server` (asyncssh; ``DemoCluster.write_inventory``),
:mod:`~sparkconsole.sim.scenarios` (story, healthy, link-down, node-lost, old-image).
Nothing here imports Textual.
"""

from sparkconsole.sim.clock import SimClock
from sparkconsole.sim.model import SimCluster
from sparkconsole.sim.scenarios import SCENARIOS, build
from sparkconsole.sim.server import DemoCluster, start_cluster, start_demo_cluster
from sparkconsole.sim.shell import Shell

__all__ = ["SCENARIOS", "DemoCluster", "Shell", "SimClock", "SimCluster", "build", "start_cluster",
           "start_demo_cluster"]
