"""Reward, success, eval success and the step phases over the finished steps, one sparkline mark per step,
fitted to the panel's width (the newest steps kept)."""

from __future__ import annotations

from textual import events
from textual.reactive import reactive
from textual.widgets import Static

from rose_tui.learning import LearningView


class LearningPanel(Static):
    learning: reactive[LearningView] = reactive(LearningView())

    def watch_learning(self) -> None:
        self._show()

    def on_resize(self, _event: events.Resize) -> None:
        self._show()

    def _show(self) -> None:
        self.border_title = self.learning.title
        self.update("\n".join(self.learning.lines(self.content_size.width)))
