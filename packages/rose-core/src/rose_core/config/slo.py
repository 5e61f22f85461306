"""The serving SLO, spelled the same in a job's config and an executor's (`[slo]`): the latency budgets of
production requests (fixed, or measured on production served alone: ``from_alone``) and the share of them
serving keeps for itself before it lends. A serving executor measures by default only when told to
(``from_alone = 0``: its operator's budgets); a job's `rose run` tells its serving executors to (``JobSlo``)."""

from __future__ import annotations

from rose_core.config.sections import ConfigSection, require_fraction, require_non_negative, require_positive


class SloConfig(ConfigSection):
    ttft_ms: float = 2000.0
    tpot_ms: float = 400.0
    headroom_fraction: float = 0.8
    """A serving executor lends capacity only while its p99s stay under this fraction of the SLO."""
    from_alone: float = 0.0
    """> 0: the budgets are this multiple of the p99 TTFT and p99 TPOT of the first ``calibration_requests``
    production requests a serving host finishes before it lends anything (vLLM's request timings, measured once
    per executor process; in place of ttft_ms and tpot_ms); its guard holds every rollout turn until then."""
    calibration_requests: int = 50
    """How many production requests served alone set a ``from_alone`` SLO."""

    def __post_init__(self) -> None:
        require_positive(ttft_ms=self.ttft_ms, tpot_ms=self.tpot_ms, calibration_requests=self.calibration_requests)
        require_non_negative(from_alone=self.from_alone)
        require_fraction(headroom_fraction=self.headroom_fraction)


class JobSlo(SloConfig):
    """A job's `[slo]` (`rose run`): its serving executors measure the SLO on production served alone, at
    ``from_alone`` x its p99, and the run's report judges production by the same numbers (0: the fixed
    ttft_ms / tpot_ms for both)."""

    from_alone: float = 2.0
    """2 x: the measured p99 is of the host with no job; once the job runs, the serving core also applies every
    step's weights to the rollout engine, and the p99 feedback (lend only under 0.8 x the SLO) at 1.5 x left the
    host lending nothing in a CI run that had measured a quiet alone (TPOT p99 4.9 ms, budget 7.4 ms, the
    job's steps 4-8 ms without a turn lent)."""
    calibration_requests: int = 20
    """20 (an operator's executor: 50): at the demo's 1 production request/s the job's first step waits about
    20 s for its SLO; the p99 of 20 or of 50 requests is their slowest either way (nearest rank)."""
