from __future__ import annotations

import pytest

from rose_core.policy import SloBudgets
from rose_executor.rollout.warm_trajectories import WarmTrajectories
from rose_executor.serving.alone_calibration import AloneCalibration, p99
from rose_executor.serving.latency_window import LatencyWindow
from rose_executor.serving.serving_monitor import ServingMonitor, has_headroom
from rose_executor.serving.time_average import TimeAverage


def test_percentiles_cover_only_the_horizon() -> None:
    window = LatencyWindow(horizon_s=10.0)
    for i in range(50):
        window.add_ttft(now=i * 0.2, seconds=0.010)
        if i == 25:
            window.add_ttft(now=5.0, seconds=1.0)
    snap = window.snapshot(now=9.9)
    assert snap.ttft_samples == 51
    assert snap.ttft_p50_s == pytest.approx(0.010)
    assert snap.ttft_p99_s > 0.010
    later = window.snapshot(now=15.5)  # samples before t=5.5 aged out, the 1.0 s outlier with them
    assert later.ttft_samples == 22
    assert later.ttft_p99_s == pytest.approx(0.010)
    assert window.snapshot(now=100.0).ttft_p99_s == 0.0


def test_tpot_and_kv_usage() -> None:
    window = LatencyWindow(horizon_s=1.0)
    for i in range(10):
        window.add_tpot(now=0.5, seconds=0.001 * (i + 1))
    window.set_kv_usage(0.5, 1.7)  # clamped to 1.0, held from t=0.5
    snap = window.snapshot(now=1.0)
    assert snap.tpot_p50_s == pytest.approx(0.0055)
    assert snap.tpot_samples == 10
    assert snap.kv_usage_ratio == pytest.approx(0.5)  # full for half of the 1 s window


def test_kv_usage_is_the_time_weighted_mean_over_the_window() -> None:
    """A busy engine and a calm one compare by how long their KV was in use, not by one instant."""
    busy, calm = TimeAverage(10.0), TimeAverage(10.0)
    for t in range(10):  # busy: 0.4 for 0.8 s of every second; calm: 0.4 for 0.2 s
        busy.set(t, 0.4)
        busy.set(t + 0.8, 0.0)
        calm.set(t, 0.4)
        calm.set(t + 0.2, 0.0)
    assert busy.mean(10.0) == pytest.approx(0.32) and calm.mean(10.0) == pytest.approx(0.08)
    assert busy.last == 0.0  # an instant sample would call them equal
    assert busy.mean(25.0) == 0.0  # everything aged out
    steady = TimeAverage(2.0)
    steady.set(0.0, 0.25)
    assert steady.mean(100.0) == pytest.approx(0.25)  # a value older than the window still holds in it
    with pytest.raises(ValueError, match="horizon_s"):
        TimeAverage(0)


def test_window_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="horizon_s"):
        LatencyWindow(horizon_s=0)


def test_headroom_needs_both_p99_below_the_fraction() -> None:
    clock = [0.0]
    monitor = ServingMonitor(SloBudgets(1.0, 0.1), headroom_fraction=0.8, clock=lambda: clock[0])
    assert monitor.has_headroom()  # no traffic, no pressure
    monitor.on_iteration(ttfts=[0.5], tpots=[0.05, 0.05], finished=[(0.5, 0.05)])
    assert monitor.has_headroom()
    monitor.on_iteration(ttfts=[], tpots=[0.09] * 5, finished=[(0.2, 0.2)])
    assert not monitor.has_headroom()
    assert monitor.requests_total == 2
    assert monitor.violations_total == 1
    clock[0] = 60.0  # the window forgets
    assert monitor.has_headroom()
    assert has_headroom(monitor.snapshot(), 1.0, 0.1, 0.8)


def test_a_measured_slo_judges_nothing_and_lends_nothing_until_it_is_known() -> None:
    calibration = AloneCalibration(multiple=1.5, requests=3)
    monitor = ServingMonitor(calibration, headroom_fraction=0.8)
    assert monitor.slo is None and not monitor.has_headroom()
    monitor.on_iteration(ttfts=[], tpots=[], finished=[(0.010, 0.002), (0.030, 0.004)])
    assert monitor.slo is None and monitor.requests_total == 0
    assert "2 of 3" in monitor.basis()
    monitor.on_iteration(ttfts=[], tpots=[], finished=[(0.020, 0.003), (0.046, 0.001)])
    assert monitor.slo == SloBudgets(pytest.approx(0.045), pytest.approx(0.006))  # 1.5 x the p99 of the first 3
    assert monitor.requests_total == 1 and monitor.violations_total == 1  # the 4th is judged: over 45 ms
    assert monitor.has_headroom()
    assert "1.5 x serving alone's p99 over 3" in monitor.basis()
    again = ServingMonitor(calibration, headroom_fraction=0.8)  # a later lease keeps the host's SLO
    assert again.slo == monitor.slo


def test_calibration_rejects_what_cannot_be_measured() -> None:
    with pytest.raises(ValueError, match="multiple > 0"):
        AloneCalibration(multiple=0.0, requests=3)
    calibration = AloneCalibration(multiple=2.0, requests=1)
    assert calibration.add(float("nan"), 0.001) is None and calibration.seen == 0
    assert p99([]) == 0.0 and p99([float(v) for v in range(1, 201)]) == 198.0


def test_warm_trajectories_are_recent_and_bounded() -> None:
    warm = WarmTrajectories(limit=3, horizon_s=10.0)
    for i, name in enumerate("abcd"):
        warm.touch(name, now=float(i))
    warm.touch("b", now=5.0)
    assert warm.ids(now=6.0) == ["c", "d", "b"]
    assert warm.ids(now=13.5) == ["b"]
    warm.clear()
    assert warm.ids(now=13.5) == []
