"""What the controller refuses in a turn's result: the top alternatives (``top_logprobs``) exactly as asked, and
the message that carries them over the wire."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rose_core.app.controller.job_hooks import TurnPayload
from rose_core.app.controller.result_check import result_problem
from rose_core.protocol import messages as m
from rose_core.protocol.serde import Decoder, Encoder
from rose_core.scheduler import TurnTicket


def _ticket(k: int) -> TurnTicket:
    payload = TurnPayload(np.arange(4, dtype=np.int32), m.SamplingParams(max_tokens=4, top_logprobs=k), step=1)
    return TurnTicket("t", "x", 0, 0, 0.0, payload=payload)


def _result(top_ids: object = None, top_logprobs: object = None) -> m.TurnResult:
    return m.TurnResult(turn_id="t", trajectory_id="x", attempt=0, executor_id="e", weight_version=0,
                        output_token_ids=np.array([7, 8], dtype=np.int32),
                        output_logprobs=np.array([-0.1, -0.2], dtype=np.float32), finish_reason="stop",
                        top_token_ids=top_ids, top_logprobs=top_logprobs)  # type: ignore[arg-type]


GOOD_IDS = np.array([[7, 3], [9, 8]], dtype=np.int32)
GOOD_LPS = np.array([[-0.1, -2.5], [-0.5, -math.inf]], dtype=np.float32)


def test_top_alternatives_as_asked_pass_and_travel_the_wire() -> None:
    result = _result(GOOD_IDS, GOOD_LPS)
    assert result_problem(result, _ticket(2)) == ("", "")
    assert result_problem(_result(), _ticket(0)) == ("", "")
    frames = Encoder().encode(result)
    back = Decoder(m.ToController).decode(frames)
    assert isinstance(back, m.TurnResult) and back.top_token_ids is not None and back.top_logprobs is not None
    assert back.top_token_ids.tolist() == GOOD_IDS.tolist() and back.top_logprobs[1, 1] == -math.inf
    plain = Decoder(m.ToController).decode(Encoder().encode(_result()))
    assert isinstance(plain, m.TurnResult) and plain.top_token_ids is None


@pytest.mark.parametrize(("ids", "lps", "k", "says"), [
    (None, None, 2, "shapes (None, None) for (2, 2)"),
    (GOOD_IDS, GOOD_LPS, 3, "for (2, 3)"),
    (GOOD_IDS, GOOD_LPS, 0, "not asked for"),
    (GOOD_IDS[:, :1], GOOD_LPS, 2, "shapes ((2, 1), (2, 2))"),
    (-GOOD_IDS, GOOD_LPS, 2, "non-negative"),
    (GOOD_IDS, -GOOD_LPS, 2, "<= 0"),
    (GOOD_IDS, np.array([[-0.1, np.nan], [-0.5, -1.0]], dtype=np.float32), 2, "<= 0"),
    (GOOD_IDS, GOOD_LPS[:, ::-1].copy(), 2, "likeliest first"),
])
def test_top_alternatives_not_as_asked_are_refused(ids: object, lps: object, k: int, says: str) -> None:
    reason, detail = result_problem(_result(ids, lps), _ticket(k))
    assert reason == "top" and says in detail, detail
