"""One serving latency against its SLO, with a sparkline of its recent history; coloured by its level."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import Label, Sparkline

from rose_tui.view import SloGaugeView
from rose_tui.widgets.levels import set_level


class SloGauge(Vertical):
    gauge: reactive[SloGaugeView] = reactive(SloGaugeView("p99"))

    def compose(self) -> ComposeResult:
        yield Label("", classes="gauge-value")
        yield Sparkline([], classes="gauge-trend")

    def watch_gauge(self, gauge: SloGaugeView) -> None:
        label = self.query_one(".gauge-value", Label)
        label.update(gauge.text)
        set_level(self, gauge.value.level)
        trend = self.query_one(".gauge-trend", Sparkline)
        trend.data = list(gauge.trend)
        trend.visible = bool(gauge.trend)
