"""The SLO guard's per-tick decision on simulated time (no engines): pure policy + observation mapping."""

from __future__ import annotations

import math

import pytest

from rose_core.policy import AdmissionConfig, DualSlackAdmission, LatencyModel
from rose_executor.co_serving_guard import CoServingGuard, QueuedTurn, serving_request
from rose_executor.live_request import LiveRequest

# Serving: 2 ms decode step + 0.1 ms/seq; prefill 5 ms + 20 us/token. Rollout: 1 ms step + 1 ms/seq.
SERVING = LatencyModel(0.005, 20e-6, 0.002, 0.0001)
ROLLOUT = LatencyModel(0.004, 10e-6, 0.001, 0.001)
CONFIG = AdmissionConfig(ttft_budget_s=0.5, tpot_budget_s=0.05, chunk_tokens=512)


def guard(feedback: bool = True) -> CoServingGuard:
    return CoServingGuard(DualSlackAdmission(CONFIG, SERVING, ROLLOUT), lambda: feedback)


def decoding(rid: str, last_token_s: float) -> LiveRequest:
    return LiveRequest(rid, 0.0, 16, 64, 3, prefilling=False, last_token_s=last_token_s)


def test_idle_serving_admits_everything() -> None:
    verdict = guard().decide(10.0, [], ["r1"], [QueuedTurn("q1", 100), QueuedTurn("q2", 50)])
    assert verdict.run_rollout and verdict.headroom and set(verdict.start) == {"q1", "q2"}
    assert math.isinf(verdict.min_slack_s)


def test_tpot_slack_gone_holds_the_rollout_engine_within_the_tick() -> None:
    # Last token 45 ms ago: 5 ms left of the 50 ms TPOT budget, the serving decode step alone needs 2.1 ms,
    # one rollout decode step 2 ms more: one running sequence fits, three do not.
    now = 10.045
    serving = [decoding("s1", 10.0)]
    one = guard().decide(now, serving, ["r1"], [])
    assert one.run_rollout and one.headroom and one.min_slack_s > 0
    three = guard().decide(now, serving, ["r1", "r2", "r3"], [QueuedTurn("q1", 8)])
    assert not three.run_rollout and three.start == ()


def test_prefilling_serving_request_uses_ttft_slack() -> None:
    waiting = LiveRequest("s1", 9.6, 4000, 64, 0, prefilling=True, last_token_s=None)
    # 0.5 s TTFT budget, 0.4 s gone, the 4000-token prompt needs 8 chunks x 5 ms + 80 ms = 120 ms: slack < 0.
    verdict = guard().decide(10.0, [waiting], [], [QueuedTurn("q1", 10)])
    assert not verdict.headroom and verdict.start == () and verdict.min_slack_s < 0
    assert serving_request(waiting).remaining_prompt_tokens == 4000


def test_cached_prompt_tokens_do_not_count_as_remaining_prefill() -> None:
    r = LiveRequest("s1", 1.0, 100, 10, 0, prefilling=True, last_token_s=None, cached_tokens=96)
    assert serving_request(r).remaining_prompt_tokens == 4
    assert serving_request(decoding("s2", 2.0)).last_token_at == 2.0


def test_p99_feedback_stops_new_sequences_but_keeps_running_ones() -> None:
    verdict = guard(feedback=False).decide(10.0, [], ["r1"], [QueuedTurn("q1", 10)])
    assert verdict.run_rollout and verdict.start == () and not verdict.headroom


def test_live_request_rejects_negative_counts() -> None:
    with pytest.raises(ValueError, match="token counts"):
        LiveRequest("x", 0.0, -1, 1, 0, prefilling=True, last_token_s=None)
    assert LiveRequest("y", 0.0, 10, 5, 7, prefilling=False, last_token_s=1.0).reserved_tokens == 17
