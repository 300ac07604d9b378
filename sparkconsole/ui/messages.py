"""Typed messages from the app to its screens (Harlequin's way): the app says what happened,
each screen decides what that means for what it shows. No screen calls into another, and the
app never probes a screen for a method.

They do not bubble: a screen that does not handle one simply ignores it.
"""

from __future__ import annotations

from textual.message import Message


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
