"""The RL step in progress: phase, weights, trajectories done as a bar, turns, reward; and the last
weight sync with its parts."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.widgets import Label, ProgressBar

from rose_tui.view import StepView, WeightSyncView


class StepPanel(Vertical):
    step: reactive[StepView] = reactive(StepView())
    weight_sync: reactive[WeightSyncView] = reactive(WeightSyncView())

    def compose(self) -> ComposeResult:
        yield Label("", id="step-title")
        with Horizontal(id="step-progress"):
            yield ProgressBar(total=None, show_eta=False, show_percentage=False, id="trajectories-bar")
            yield Label("", id="trajectories")
        yield Label("", id="step-turns")
        yield Label("", id="step-reward")
        yield Label("", id="weight-sync")
        yield Label("", id="weight-sync-parts")

    def watch_step(self, step: StepView) -> None:
        self.query_one("#step-title", Label).update(step.title)
        self.query_one("#step-progress").display = step.step is not None
        bar = self.query_one("#trajectories-bar", ProgressBar)
        bar.update(total=max(step.trajectories_total, 1), progress=step.trajectories_done)
        self.query_one("#trajectories", Label).update(step.trajectories)
        self.query_one("#step-turns", Label).update(f"turns {step.turns}")
        self.query_one("#step-reward", Label).update(f"weights {step.weights} · reward mean {step.reward}")

    def watch_weight_sync(self, sync: WeightSyncView) -> None:
        self.query_one("#weight-sync", Label).update(sync.headline)
        parts = self.query_one("#weight-sync-parts", Label)
        parts.update(f"{sync.breakdown} s" if sync.breakdown else "")
        parts.display = bool(sync.breakdown)
