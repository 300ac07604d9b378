"""Typed messages from the app to its screens (Harlequin's way): the app says what happened,
each screen decides what that means for what it shows. No screen calls into another, and the
app never probes a screen for a method.

The app's news for screens (:class:`NodeUpdated`, :class:`AgesTicked`, :class:`ActionFinished`)
do not bubble: a screen that does not handle one simply ignores it. A screen's intents
(:class:`OpenNode`, :class:`OpenLogs`, :class:`OpenEngines`, :class:`ServiceActionRequested`,
:class:`DeploymentRequested`) bubble up to the app, which owns the screen stack and the nodes'
connections.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from textual.message import Message

from sparkconsole.services import Service

if TYPE_CHECKING:
    from sparkconsole.deploy.decisions import Answerer
    from sparkconsole.deploy.events import Event
    from sparkconsole.deploy.flow import Options
    from sparkconsole.deploy.runner import Confirm
    from sparkconsole.deploy.state import DeploymentState
    from sparkconsole.remote import RemoteCommand

    OnPlan = Callable[[str, str, list[tuple[str, RemoteCommand]]], None]


class NodeUpdated(Message, bubble=False):
    """A node's poll ended (a new sample, a gap, or a failure): its state may have changed."""

    def __init__(self, node: str) -> None:
        super().__init__()
        self.node = node


class AgesTicked(Message, bubble=False):
    """A second passed: ages and staleness moved for every node, nothing else did."""


class ActionFinished(Message, bubble=False):
    """A service action (stop, start, restart, remove) ran on ``node``."""

    def __init__(self, node: str, ok: bool, text: str) -> None:
        super().__init__()
        self.node = node
        self.ok = ok
        self.text = text


class OpenNode(Message):
    """Show one node's detail."""

    def __init__(self, node: str) -> None:
        super().__init__()
        self.node = node


class OpenLogs(Message):
    """Follow one service's log on one node."""

    def __init__(self, node: str, service: Service) -> None:
        super().__init__()
        self.node = node
        self.service = service


class OpenEngines(Message):
    """Show the engines one node serves; ``where`` (a container's name, a host pid) names the one to
    focus when it runs one. ``node`` may be a merged log's "a + b": the app finds the node."""

    def __init__(self, node: str, where: str | None = None) -> None:
        super().__init__()
        self.node = node
        self.where = where


class ServiceActionRequested(Message):
    """Stop, start, restart or remove a service: the app shows the command, asks, runs, journals."""

    def __init__(self, node: str, service: Service, action: str) -> None:
        super().__init__()
        self.node = node
        self.service = service
        self.action = action


class DeploymentRequested(Message):
    """Run (or tear down) a deployment: the wizard asks, the app opens it.

    The app holds what a deployment is opened with (the cluster's config, the journal, the
    transport factory, the demo's clock) and opens it through
    :func:`sparkconsole.deploy.opening.open_deployment`, as ``sparkconsole deploy`` does. The
    wizard brings the deployment and how it is answered and shown: ``answer`` and ``confirm`` (its
    dialogs), ``emit`` and ``on_plan`` (the event stream), and ``on_state(running, error)``, told when
    the run starts and when it ends (``error``: why it could not run or crashed; "" otherwise).
    """

    def __init__(self, state: DeploymentState, options: Options, *, teardown: bool, until: str | None,
                 answer: Answerer, confirm: Confirm, emit: Callable[[Event], None], on_plan: OnPlan,
                 on_state: Callable[[bool, str], None]) -> None:
        super().__init__()
        self.state = state
        self.options = options
        self.teardown = teardown
        self.until = until
        self.answer = answer
        self.confirm = confirm
        self.emit = emit
        self.on_plan = on_plan
        self.on_state = on_state


class RehearsalRequested(Message):
    """Rehearse the deployment of ``options`` on a twin of the cluster (the wizard's ``R``): the app
    reads the nodes read-only, builds the twin, runs the flow there and shows the report."""

    def __init__(self, options: Options) -> None:
        super().__init__()
        self.options = options
