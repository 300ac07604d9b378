"""A screen that redraws from the data layer whenever a poll ends or a second passes."""

from __future__ import annotations

from textual.css.query import NoMatches
from textual.screen import Screen
from textual.worker import Worker, WorkerState


def forward_worker_failure(screen: Screen, event: Worker.StateChanged) -> None:
    """A screen's worker that raised goes to the app's one handler (notification + events)."""
    if event.state is WorkerState.ERROR:
        handler = getattr(screen.app, "worker_failed", None)
        if handler is not None:
            handler(event.worker)


class LiveScreen(Screen):
    """Subclasses draw in :meth:`draw`; :meth:`refresh_all` is what the app calls.

    A poll can end while the screen is still being built or already being torn down: then
    nothing is drawn, and the first refresh after mounting draws it.
    """

    _ready = False

    def draw(self) -> None:  # pragma: no cover - every subclass draws
        raise NotImplementedError

    def mark_ready(self) -> None:
        """Call at the end of ``on_mount``: draw now, and once more after the first refresh."""
        self._ready = True
        self.refresh_all()
        self.call_after_refresh(self.refresh_all)

    def refresh_all(self) -> None:
        if not self._ready or not self.is_attached:
            return
        try:
            self.draw()
        except NoMatches:
            return

    def refresh_node(self, name: str) -> None:
        self.refresh_all()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        forward_worker_failure(self, event)
