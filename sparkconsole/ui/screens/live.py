"""A screen that redraws from the data layer when the app says a node changed or a second passed."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from textual.css.query import NoMatches
from textual.screen import Screen
from textual.worker import Worker, WorkerState

from sparkconsole.ui.messages import ActionFinished, AgesTicked, NodeUpdated

if TYPE_CHECKING:
    from sparkconsole.ui.app import SparkConsoleApp


def console_app(screen: Screen) -> SparkConsoleApp:
    """The app, typed: screens read the cluster's state through it (never the other way)."""
    return cast("SparkConsoleApp", screen.app)


def forward_worker_failure(screen: Screen, event: Worker.StateChanged) -> None:
    """A screen's worker that raised goes to the app's one handler (notification + events)."""
    if event.state is WorkerState.ERROR:
        console_app(screen).worker_failed(event.worker)


class LiveScreen(Screen):
    """Subclasses draw everything in :meth:`draw` and one node in :meth:`draw_node`.

    The app posts :class:`NodeUpdated` when a node's poll ends and :class:`AgesTicked` once a
    second. A poll can end while the screen is still being built or already being torn down:
    then nothing is drawn, and the first refresh after mounting draws it.
    """

    _ready = False

    @property
    def sc(self) -> SparkConsoleApp:
        """The app, typed."""
        return console_app(self)

    def draw(self) -> None:  # pragma: no cover - every subclass draws
        raise NotImplementedError

    def draw_node(self, name: str) -> None:
        """One node changed; by default everything is drawn again."""
        self.draw()

    def mark_ready(self) -> None:
        """Call at the end of ``on_mount``: draw now, and once more after the first refresh."""
        self._ready = True
        self.refresh_all()
        self.call_after_refresh(self.refresh_all)

    def _drawable(self) -> bool:
        return self._ready and self.is_attached

    def refresh_all(self) -> None:
        if not self._drawable():
            return
        try:
            self.draw()
        except NoMatches:
            return

    def refresh_node(self, name: str) -> None:
        if not self._drawable():
            return
        try:
            self.draw_node(name)
        except NoMatches:
            return

    def on_node_updated(self, message: NodeUpdated) -> None:
        self.refresh_node(message.node)

    def on_ages_ticked(self, message: AgesTicked) -> None:
        self.refresh_all()

    def on_action_finished(self, message: ActionFinished) -> None:
        """A service action ran: screens that list services read them again."""

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        forward_worker_failure(self, event)
