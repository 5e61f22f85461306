"""The co-serving guard's per-tick decision on simulated time (no engines): pure policy + observation mapping."""

from __future__ import annotations

import math

import pytest

from rose_core.policy import (
    AdmissionConfig,
    CoServingGuard,
    DualSlackAdmission,
    GuardSettings,
    LatencyModel,
    LiveRequest,
    QueuedTurn,
    SloBudgets,
    hold_margin_s,
)
from rose_core.policy.co_serving_guard import serving_request, serving_requests

# Serving: 2 ms decode step + 0.1 ms/seq; prefill 5 ms + 20 us/token. Rollout: 1 ms step + 1 ms/seq.
SERVING = LatencyModel(0.005, 20e-6, 0.002, 0.0001)
ROLLOUT = LatencyModel(0.004, 10e-6, 0.001, 0.001)
CONFIG = AdmissionConfig(ttft_budget_s=0.5, tpot_budget_s=0.05, chunk_tokens=512)


def guard() -> CoServingGuard:
    return CoServingGuard(DualSlackAdmission(CONFIG, SERVING, ROLLOUT))


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
    verdict = guard().decide(10.0, [], ["r1"], [QueuedTurn("q1", 10)], feedback_ok=False)
    assert verdict.run_rollout and verdict.start == () and not verdict.headroom


def test_live_request_rejects_negative_counts() -> None:
    with pytest.raises(ValueError, match="token counts"):
        LiveRequest("x", 0.0, -1, 1, 0, prefilling=True, last_token_s=None)
    assert LiveRequest("y", 0.0, 10, 5, 7, prefilling=False, last_token_s=1.0).reserved_tokens == 17


def test_a_burst_is_prefilled_together() -> None:
    # Two requests of one burst prefill in the same engine steps: each waits for both prompts (minus cache).
    a = LiveRequest("a", 1.0, 32, 8, 0, prefilling=True, last_token_s=None)
    b = LiveRequest("b", 1.001, 32, 8, 0, prefilling=True, last_token_s=None, cached_tokens=16)
    views = serving_requests([a, b, decoding("c", 0.9)])
    assert [v.remaining_prompt_tokens for v in views] == [48, 48, 0]
    assert views[2].last_token_at == 0.9


def test_a_burst_that_alone_fits_is_held_together() -> None:
    # 100 ms TTFT budget, 20 ms gone; one 1000-token prompt needs 25 ms, a burst of three 75 ms: plus the
    # rollout decode step (2 ms) the burst leaves no slack.
    one = [LiveRequest("s0", 9.98, 1000, 8, 0, prefilling=True, last_token_s=None)]
    burst = [LiveRequest(f"s{i}", 9.98, 1000, 8, 0, prefilling=True, last_token_s=None) for i in range(3)]
    tight = CoServingGuard(DualSlackAdmission(AdmissionConfig(0.1, 0.05), SERVING, ROLLOUT))
    assert tight.decide(10.0, one, ["r1"], []).run_rollout
    assert not tight.decide(10.0, burst, ["r1"], []).run_rollout


def test_hold_margin_is_the_rollout_step_a_pause_cannot_stop() -> None:
    assert hold_margin_s(ROLLOUT, 8) == pytest.approx(0.001 + 8 * 0.001)
    assert hold_margin_s(ROLLOUT, 0) == pytest.approx(0.002)
    chunk = 256  # with chunked prefill the step in flight may carry a whole chunk beside the decodes
    assert hold_margin_s(ROLLOUT, 8, chunk) == pytest.approx(ROLLOUT.step_s(8, chunk))
    assert hold_margin_s(ROLLOUT, 8, chunk) > hold_margin_s(ROLLOUT, 8)


def test_build_adds_the_hold_margin_to_the_admission_margin() -> None:
    settings = GuardSettings(SloBudgets(0.5, 0.05), chunk_tokens=256, margin_s=0.003, rollout_batch=8)
    built = CoServingGuard.build(settings, SERVING, ROLLOUT).admission.config
    assert built == AdmissionConfig(0.5, 0.05, 256, 0.003 + hold_margin_s(ROLLOUT, 8, 256))
    priced = GuardSettings(SloBudgets(0.5, 0.05), chunk_tokens=256, margin_s=0.003, rollout_batch=8, hold_chunk=False)
    assert CoServingGuard.build(priced, SERVING, ROLLOUT).admission.config.margin_s == pytest.approx(
        0.003 + hold_margin_s(ROLLOUT, 8))  # each chunk admitted at its launch: no chunk in the margin
    unheld = GuardSettings(SloBudgets(0.5, 0.05), margin_s=0.003, hold_margin=False)
    assert CoServingGuard.build(unheld, SERVING, ROLLOUT).admission.config.margin_s == pytest.approx(0.003)


def test_the_ttft_floor_is_an_arrivals_prefill_plus_the_margin_every_admission_keeps() -> None:
    settings = GuardSettings(SloBudgets(0.5, 0.05), chunk_tokens=256, margin_s=0.003, rollout_batch=8)
    built = CoServingGuard.build(settings, SERVING, ROLLOUT)
    floor = built.ttft_floor_s(1024)
    assert floor == pytest.approx(SERVING.prefill_s(1024, 256) + 0.003 + hold_margin_s(ROLLOUT, 8, 256))
    # at a budget under the floor, an arrival with no rollout work admitted yet is already out of slack
    tight = CoServingGuard.build(GuardSettings(SloBudgets(floor * 0.9, 0.05), 256, 0.003, rollout_batch=8),
                                 SERVING, ROLLOUT)  # fmt: skip
    arriving = LiveRequest("s", 0.0, 1024, 0, 0, prefilling=True, last_token_s=None)
    assert tight.decide(0.0, [arriving], (), (QueuedTurn("q", 64),)).start == ()
    roomy = CoServingGuard.build(GuardSettings(SloBudgets(floor * 1.5, 0.05), 256, 0.003, rollout_batch=8),
                                 SERVING, ROLLOUT)  # fmt: skip
    assert roomy.decide(0.0, [arriving], (), (QueuedTurn("q", 64),)).start == ("q",)


def test_slo_budgets_from_a_profile_are_a_multiple_of_serving_alone() -> None:
    budgets = SloBudgets.from_profile(4.0, SERVING, longest_prompt=1024, chunk_tokens=512, max_num_seqs=8)
    assert budgets.ttft_s == pytest.approx(4 * SERVING.prefill_s(1024, 512))
    assert budgets.tpot_s == pytest.approx(4 * SERVING.decode_step_s(8))


def test_verdict_reports_the_admitted_rollout_work() -> None:
    verdict = guard().decide(10.0, [], ["r1", "r2"], [QueuedTurn("q1", 100)])
    assert (verdict.decode_seqs, verdict.prefill_tokens) == (2, 100)
