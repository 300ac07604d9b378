"""Typed messages from the app to its screens (Harlequin's way): the app says what happened,
each screen decides what that means for what it shows. No screen calls into another, and the
app never probes a screen for a method.

The app's news for screens (:class:`NodeUpdated`, :class:`AgesTicked`, :class:`ActionFinished`)
do not bubble: a screen that does not handle one simply ignores it. A screen's intents
(:class:`OpenNode`, :class:`OpenLogs`, :class:`ServiceActionRequested`) bubble up to the app,
which owns the screen stack and the nodes' connections.
"""

from __future__ import annotations

from textual.message import Message

from sparkconsole.services import Service


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


class ServiceActionRequested(Message):
    """Stop, start, restart or remove a service: the app shows the command, asks, runs, journals."""

    def __init__(self, node: str, service: Service, action: str) -> None:
        super().__init__()
        self.node = node
        self.service = service
        self.action = action
