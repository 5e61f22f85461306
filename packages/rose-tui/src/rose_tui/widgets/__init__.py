"""The dashboard's widgets; each renders one part of a ``DashboardView`` from its reactive attributes."""

from rose_tui.widgets.error_banner import ErrorBanner
from rose_tui.widgets.learning_panel import LearningPanel
from rose_tui.widgets.slo_gauge import SloGauge
from rose_tui.widgets.status_header import StatusHeader
from rose_tui.widgets.step_panel import StepPanel
from rose_tui.widgets.view_table import ViewTable

__all__ = ["ErrorBanner", "LearningPanel", "SloGauge", "StatusHeader", "StepPanel", "ViewTable"]
