"""The serving latency model the executor hands the co-serving guard."""

from __future__ import annotations

import pytest

from rose_executor.profile.colocated_profile import guard_serving_model
from rose_executor.profile.latency_profile import EngineProfile


def test_guard_predicts_serving_with_the_slower_of_alone_and_colocated() -> None:
    alone = EngineProfile(key="a", prefill_points=[(16, 0.004), (512, 0.020)], decode_points=[(1, 0.002), (8, 0.003)])
    beside = EngineProfile(key="c", prefill_points=[(16, 0.009), (512, 0.018)], decode_points=[(1, 0.005), (8, 0.007)])
    model = guard_serving_model(alone, beside)
    assert model.prefill_s(16) == pytest.approx(0.009) and model.prefill_s(512) == pytest.approx(0.020)
    assert model.decode_step_s(1) == pytest.approx(0.005) and model.decode_step_s(8) == pytest.approx(0.007)
    assert guard_serving_model(alone, None) == alone.latency_model()
