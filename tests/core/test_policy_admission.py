"""Dual-slack admission: admits the most rollout work that keeps every serving slack positive, else holds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rose_core.policy import AdmissionConfig, DualSlackAdmission, LatencyModel, RolloutWork, ServingRequest

MODEL = LatencyModel(prefill_base_s=0.004, prefill_per_token_s=2e-5, decode_base_s=0.008, decode_per_seq_s=0.0005)


def controller(ttft: float = 0.5, tpot: float = 0.1, margin: float = 0.0) -> DualSlackAdmission:
    return DualSlackAdmission(AdmissionConfig(ttft, tpot, margin_s=margin), MODEL, MODEL)


def decodes(n: int) -> list[RolloutWork]:
    return [RolloutWork(f"r{i}", "decode") for i in range(n)]


def test_fit_recovers_an_affine_model() -> None:
    fitted = LatencyModel.fit([(128, 0.004 + 128 * 2e-5), (1024, 0.004 + 1024 * 2e-5), (4096, 0.004 + 4096 * 2e-5)],
                              [(1, 0.0085), (16, 0.016), (64, 0.040)])
    assert fitted.prefill_per_token_s == pytest.approx(2e-5)
    assert fitted.prefill_base_s == pytest.approx(0.004)
    assert fitted.decode_per_seq_s == pytest.approx(0.0005)
    assert fitted.decode_step_s(0) == 0.0


@pytest.mark.parametrize("bad", [[(1, 1.0)], [(4, 1.0), (4, 2.0)], [(1, -1.0), (2, 1.0)]])
def test_fit_rejects_unusable_points(bad: list[tuple[float, float]]) -> None:
    with pytest.raises(ValueError, match="prefill_points"):
        LatencyModel.fit(bad, [(1, 0.01), (2, 0.02)])


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="chunk_tokens"):
        AdmissionConfig(0.5, 0.1, chunk_tokens=0)
    with pytest.raises(ValueError, match="tpot_budget_s"):
        AdmissionConfig(0.5, 0.0)
    with pytest.raises(ValueError, match="last_token_at"):
        ServingRequest("s", arrival=0.0)


def test_without_serving_everything_is_admitted_in_one_chunk() -> None:
    d = controller().admit(10.0, [], [*decodes(16), RolloutWork("p", "prefill", 2000)])
    assert d.decode_seqs == 16 and d.prefill_tokens == 512 and d.held == ("p",)


def test_tight_tpot_slack_holds_everything() -> None:
    serving = [ServingRequest("s", arrival=0.0, last_token_at=9.92)]  # 0.1 - 0.08 - 0.0085 = 0.0115 s slack
    d = controller().admit(10.0, serving, decodes(16))
    assert d.decode_seqs == 0 or d.rollout_step_s < 0.0115
    assert controller().admit(10.0, [ServingRequest("s", 0.0, last_token_at=9.9)], decodes(4)).admitted == ()


def test_partial_admission_is_the_largest_that_fits() -> None:
    serving = [ServingRequest("s", arrival=0.0, last_token_at=10.0)]  # slack 0.1 - 0.0085 = 0.0915 s
    d = controller().admit(10.0, serving, decodes(300))
    # 0.008 + 0.0005 n < 0.0915 -> n <= 166
    assert d.decode_seqs == 166
    assert d.min_slack_s > 0


def test_pending_prefill_limits_admission_by_ttft() -> None:
    serving = [ServingRequest("s", arrival=9.565, remaining_prompt_tokens=2048)]  # ttft slack 0.00804 s
    d = controller().admit(10.0, serving, [RolloutWork("p", "prefill", 4096)])
    assert d.prefill_tokens == 201 and d.min_slack_s > 0


serving_requests = st.lists(
    st.one_of(
        st.builds(lambda a, k: ServingRequest("p", arrival=a, remaining_prompt_tokens=k),
                  st.floats(9.0, 10.0), st.integers(1, 8192)),
        st.builds(lambda a, t: ServingRequest("d", arrival=a, last_token_at=t),
                  st.floats(0.0, 9.0), st.floats(9.8, 10.0)),
    ),
    max_size=40,
)
candidates = st.lists(
    st.one_of(st.builds(lambda i: RolloutWork(f"d{i}", "decode"), st.integers(0, 99)),
              st.builds(lambda i, k: RolloutWork(f"p{i}", "prefill", k), st.integers(0, 99), st.integers(1, 4096))),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(serving=serving_requests, work=candidates, margin=st.floats(0, 0.05))
def test_admission_never_makes_a_slack_negative(serving: list[ServingRequest], work: list[RolloutWork],
                                                margin: float) -> None:
    ctl = controller(margin=margin)
    d = ctl.admit(10.0, serving, work)
    if d.admitted:
        assert ctl.slack_s(10.0, serving, d.rollout_step_s) > margin
        assert d.prefill_tokens <= 512
    else:
        assert d.rollout_step_s == 0.0
    one_more = ctl.rollout_model.step_s(d.decode_seqs + 1, d.prefill_tokens)
    spare_decodes = sum(1 for w in work if w.kind == "decode") > d.decode_seqs
    if spare_decodes and serving:
        assert ctl.slack_s(10.0, serving, one_more) <= margin or (d.decode_seqs == 0 and not d.admitted)
