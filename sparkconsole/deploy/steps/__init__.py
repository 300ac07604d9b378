"""The deployment's steps, in the order they run. This list is the whole of the flow's shape.

Each step is a class in its own module (one family of work: the plan, the weights, the engine's
start...) with a stable ``id`` (the state, the journal, ``--until`` and ``--answer`` use it) and
the phases of :class:`~sparkconsole.deploy.steps.base.Step`: ``probe → decide → send → watch →
verify``. The runner runs this list and nothing else; what differs between steps is declared on
the step (``rerun_when_done``, ``decisions``), never tested by name.

To add a step: write one module here with a ``Step`` subclass (an ``id``, a ``title``, the
decisions it may ask, and the phases it needs: its changes go out in ``send`` and only there, so
``--plan-only`` and the confirmation show them), then add it to ``STEPS`` below, where it runs.
Results it hands to later steps go in :class:`~sparkconsole.deploy.deployment_plan.DeploymentPlan`.
"""

from __future__ import annotations

from sparkconsole.deploy.steps.base import Step
from sparkconsole.deploy.steps.benchmark import Benchmark
from sparkconsole.deploy.steps.canary import Canary
from sparkconsole.deploy.steps.cluster import Cluster
from sparkconsole.deploy.steps.engine import Engine
from sparkconsole.deploy.steps.guard import Guard
from sparkconsole.deploy.steps.images import Images
from sparkconsole.deploy.steps.memory import Caches, FreeMemory
from sparkconsole.deploy.steps.network import Network
from sparkconsole.deploy.steps.plan import Plan
from sparkconsole.deploy.steps.recon import Recon
from sparkconsole.deploy.steps.serve import Serve
from sparkconsole.deploy.steps.verify import Verify
from sparkconsole.deploy.steps.weights import Weights

STEPS: tuple[type[Step], ...] = (Recon, Plan, Engine, Canary, Network, Weights, Images, FreeMemory, Caches, Cluster, Guard,
                                 Serve, Verify, Benchmark)
STEP_IDS: tuple[str, ...] = tuple(s.id for s in STEPS)

__all__ = ["STEPS", "STEP_IDS", "Benchmark", "Caches", "Cluster", "Engine", "FreeMemory", "Guard", "Images", "Network",
           "Plan", "Recon", "Serve", "Step", "Verify", "Weights"]
