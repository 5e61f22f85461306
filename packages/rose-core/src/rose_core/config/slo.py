"""The serving SLO, spelled the same in a job's config and an executor's (`[slo]`): the latency budgets of
production requests and the share of them serving keeps for itself before it lends."""

from __future__ import annotations

from rose_core.config.sections import ConfigSection, require_fraction, require_positive


class SloConfig(ConfigSection):
    ttft_ms: float = 2000.0
    tpot_ms: float = 400.0
    headroom_fraction: float = 0.8
    """A serving executor lends capacity only while its p99s stay under this fraction of the SLO."""

    def __post_init__(self) -> None:
        require_positive(ttft_ms=self.ttft_ms, tpot_ms=self.tpot_ms)
        require_fraction(headroom_fraction=self.headroom_fraction)
