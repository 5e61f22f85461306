"""Serving-first memory: one 2x emergency cut on the high watermark, youngest aborted, frozen until a step."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rose_core.policy import MemoryPolicyConfig, RolloutMemoryUse, ServingFirstMemory

GB = 1 << 30
CFG = MemoryPolicyConfig(device_bytes=80 * GB, rollout_weight_bytes=2 * GB)


def uses(*sizes_gb: int) -> list[RolloutMemoryUse]:
    return [RolloutMemoryUse(f"r{i}", s * GB, started_at=float(i)) for i, s in enumerate(sizes_gb)]


def test_budget_leaves_headroom_for_serving() -> None:
    m = ServingFirstMemory(CFG, serving_bytes=20 * GB)
    assert m.budget_bytes == 80 * GB - 2 * GB - 20 * GB - CFG.headroom_bytes
    assert m.fits(0, m.budget_bytes) and not m.fits(1, m.budget_bytes)


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="headroom_fraction"):
        MemoryPolicyConfig(device_bytes=GB, headroom_fraction=1.5)
    with pytest.raises(ValueError, match="cut_factor"):
        MemoryPolicyConfig(device_bytes=GB, cut_factor=1.0)


def test_crossing_the_watermark_cuts_once_and_aborts_youngest() -> None:
    m = ServingFirstMemory(CFG, serving_bytes=20 * GB)
    before = m.budget_bytes  # about 42 GB
    assert not m.observe(1.0, 25 * GB, uses(10, 10, 10, 10)).cut  # inside the headroom, under the watermark
    d = m.observe(2.0, 30 * GB, uses(10, 10, 10, 10))
    assert d.cut and d.frozen and d.budget_bytes == before // 2
    assert d.abort == ("r3", "r2")  # 40 GB -> 20 GB <= 21 GB
    again = m.observe(3.0, 40 * GB, uses(10, 10))
    assert not again.cut and again.abort == () and again.budget_bytes == before // 2
    m.on_step(1, 20 * GB)
    assert not m.frozen and m.budget_bytes == before


def test_steps_must_increase() -> None:
    m = ServingFirstMemory(CFG)
    m.on_step(0, 0)
    with pytest.raises(ValueError, match="steps must increase"):
        m.on_step(0, 0)


@settings(max_examples=200, deadline=None)
@given(events=st.lists(st.tuples(st.booleans(), st.integers(0, 78)), max_size=60))
def test_budget_changes_only_at_a_step_after_a_cut(events: list[tuple[bool, int]]) -> None:
    m = ServingFirstMemory(CFG, serving_bytes=10 * GB)
    step, cut_in_step, now = 0, False, 0.0
    for is_step, serving_gb in events:
        now += 1.0
        before = m.budget_bytes
        if is_step:
            step += 1
            m.on_step(step, serving_gb * GB)
            cut_in_step = False
            continue
        d = m.observe(now, serving_gb * GB, uses(5, 5, 5))
        if cut_in_step:
            assert not d.cut and d.budget_bytes == before, "the budget moved while frozen"
        elif d.cut:
            cut_in_step = True
            assert d.budget_bytes == int(before / 2)
            kept = 15 * GB - 5 * GB * len(d.abort)
            assert kept <= d.budget_bytes
        else:
            assert d.budget_bytes == before
