"""``rose-executor bench``'s pure parts: aggregation over repeats (medians in the issue's JSON shape, min / max
under ``spread``, attainment pooled over every request), the harvest ratio and the rollout token count."""

from __future__ import annotations

import pytest

from rose_executor.bench.bench_load import TokenCounter
from rose_executor.bench.bench_window import (
    CONFIGS,
    HARVEST_KEYS,
    LEVELS,
    Window,
    harvest_ratio,
    slo_from_alone,
    summarize,
)


def run(attainment: float, tokens: float, harvest: float, requests: float = 100.0) -> dict[str, object]:
    row = {
        "serving_ttft_p99_ms": 10.0,
        "serving_tpot_p99_ms": 5.0,
        "slo_attainment": attainment,
        "rollout_tokens_per_s": tokens,
        "requests": requests,
        "ttft_violations": 0.0,
        "tpot_violations": 0.0,
        "serving_device_share": 0.1,
        "rollout_device_share": 0.8,
    }
    level = {config: dict(row) for config in CONFIGS} | {
        "harvest_ratio": harvest,
        "harvest_ratio_unguarded": harvest + 0.1,
    }
    return {
        "levels": {name: level for name in LEVELS},
        "rollout_alone_tokens_per_s": tokens * 2,
        "rollout_alone_device_share": 0.9,
    }


def test_medians_spread_and_pooled_attainment() -> None:
    result = summarize([run(1.0, 100.0, 0.9), run(0.9, 300.0, 0.5, requests=300.0), run(0.99, 200.0, 0.7)])
    high = result["levels"]["high"]
    assert set(high) == {*CONFIGS, *HARVEST_KEYS}
    assert high["guarded"]["slo_attainment"] == pytest.approx(0.99)
    assert high["guarded"]["rollout_tokens_per_s"] == pytest.approx(200.0)
    assert high["guarded"]["serving_device_share"] == pytest.approx(0.1)
    assert high["harvest_ratio"] == pytest.approx(0.7)
    assert high["harvest_ratio_unguarded"] == pytest.approx(0.8)
    assert result["spread"]["high"]["guarded"]["slo_attainment"] == [0.9, 1.0]
    assert result["spread"]["high"]["harvest_ratio"] == [0.5, 0.9]
    assert result["pooled_slo_attainment"]["high"]["guarded"] == pytest.approx((100 + 270 + 99) / 500)
    assert result["rollout_alone_tokens_per_s"] == pytest.approx(400.0)
    assert result["rollout_alone_device_share"] == pytest.approx(0.9)


def test_slo_is_a_multiple_of_the_median_level_p99_so_one_noisy_level_does_not_set_it() -> None:
    windows = [Window(0.010, 0.004, 0.0, [], []), Window(0.120, 0.005, 0.0, [], []), Window(0.012, 0.006, 0.0, [], [])]
    ttft, tpot = slo_from_alone(windows, 1.5)
    assert ttft == pytest.approx(0.018) and tpot == pytest.approx(0.0075)


def test_the_ttft_budget_is_never_below_serving_alone_plus_the_guards_margin() -> None:
    """An SLO tighter than serving alone plus the rollout step no hold can stop is broken by co-location itself
    (an arrival waits for that step), so the bench's TTFT budget is at least that; TPOT stays the multiple."""
    windows = [Window(0.010, 0.004, 0.0, [], []), Window(0.012, 0.006, 0.0, [], [])]
    ttft, tpot = slo_from_alone(windows, 1.5, ttft_floor_extra_s=0.030)
    assert ttft == pytest.approx(0.011 + 0.030) and tpot == pytest.approx(0.0075)
    ttft, _ = slo_from_alone(windows, 1.5, ttft_floor_extra_s=0.002)  # under the multiple: the multiple stands
    assert ttft == pytest.approx(0.0165)


def window(serving_share: float, rollout_share: float) -> Window:
    return Window(0.01, 0.005, 1000.0, [], [], serving_share, rollout_share)


def test_harvest_is_the_share_of_the_device_time_serving_left_that_the_rollout_used() -> None:
    assert harvest_ratio(window(0.2, 0.4)) == pytest.approx(0.5)
    assert harvest_ratio(window(0.2, 0.8)) == pytest.approx(1.0)
    assert harvest_ratio(window(0.0, 0.0)) == 0.0


def test_harvest_is_zero_when_serving_left_nothing() -> None:
    assert harvest_ratio(window(1.0, 0.0)) == 0.0


def test_the_token_counter_counts_every_generated_token_of_an_iteration() -> None:
    counter = TokenCounter()
    counter.on_iteration([0.01, 0.02], [0.001, 0.001, 0.002], [])
    counter.on_iteration([], [0.001], [(0.01, 0.001)])
    assert counter.tokens == 6
