"""The one screen: header, step and serving SLO side by side, executors, step history beside the learning
sparklines, key bar."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer

from rose_tui.learning import LearningView
from rose_tui.link import LinkState, LinkView
from rose_tui.view import (
    EXECUTOR_COLUMNS,
    HISTORY_COLUMNS,
    DashboardView,
    HeaderView,
    SloGaugeView,
    StepView,
    TableRow,
    WeightSyncView,
)
from rose_tui.widgets import ErrorBanner, LearningPanel, SloGauge, StatusHeader, StepPanel, ViewTable

NARROW_WIDTH = 96
"""Below this many cells the executor table drops its least needed columns (role is implied by KV "-")."""
NARROW_HIDDEN = ("role", "guard", "routing", "prefix")
HISTORY_NARROW_WIDTH = 60
"""Beside the learning panel on an 80-column terminal the history table keeps step, phase, trajectories, reward."""
HISTORY_NARROW_HIDDEN = ("weights", "turns")


class DashboardScreen(Screen[None]):
    """Holds the current view as reactive parts; each widget is bound to the parts it shows."""

    header: reactive[HeaderView] = reactive(HeaderView())
    link: reactive[LinkView] = reactive(LinkView())
    executors: reactive[tuple[TableRow, ...]] = reactive(())
    step: reactive[StepView] = reactive(StepView())
    ttft: reactive[SloGaugeView] = reactive(SloGaugeView("TTFT"))
    tpot: reactive[SloGaugeView] = reactive(SloGaugeView("TPOT"))
    weight_sync: reactive[WeightSyncView] = reactive(WeightSyncView())
    history: reactive[tuple[TableRow, ...]] = reactive(())
    learning: reactive[LearningView] = reactive(LearningView())

    def compose(self) -> ComposeResult:
        yield StatusHeader(id="header").data_bind(DashboardScreen.header, DashboardScreen.link)
        yield ErrorBanner(id="error").data_bind(DashboardScreen.link)
        with Horizontal(id="overview"):
            yield StepPanel(id="step").data_bind(DashboardScreen.step, DashboardScreen.weight_sync)
            with Vertical(id="slo"):
                yield SloGauge(id="ttft").data_bind(gauge=DashboardScreen.ttft)
                yield SloGauge(id="tpot").data_bind(gauge=DashboardScreen.tpot)
        yield ViewTable(
            EXECUTOR_COLUMNS, narrow_width=NARROW_WIDTH, narrow_hidden=NARROW_HIDDEN, id="executors"
        ).data_bind(view_rows=DashboardScreen.executors)
        with Horizontal(id="lower"):
            yield ViewTable(
                HISTORY_COLUMNS, narrow_width=HISTORY_NARROW_WIDTH, narrow_hidden=HISTORY_NARROW_HIDDEN, id="history"
            ).data_bind(view_rows=DashboardScreen.history)
            yield LearningPanel(id="learning").data_bind(DashboardScreen.learning)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#step").border_title = "step"
        self.query_one("#slo").border_title = "serving p99 vs SLO"
        self._set_table_titles()

    def show(self, view: DashboardView) -> None:
        self.header = view.header
        self.executors = view.executors
        self.step = view.step
        self.ttft = view.ttft
        self.tpot = view.tpot
        self.weight_sync = view.weight_sync
        self.history = view.history
        self.learning = view.learning

    def watch_link(self, link: LinkView) -> None:
        """Dim what is shown while it is stale."""
        self.set_class(link.state in (LinkState.UNREACHABLE, LinkState.REJECTED), "-stale")

    def watch_executors(self) -> None:
        self._set_table_titles()

    def watch_history(self) -> None:
        self._set_table_titles()

    def _set_table_titles(self) -> None:
        for table in self.query("#executors"):
            table.border_title = f"executors ({len(self.executors)})"
        for table in self.query("#history"):
            table.border_title = f"step history ({len(self.history)})"
