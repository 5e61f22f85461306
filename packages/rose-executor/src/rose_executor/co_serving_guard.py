"""The SLO guard's per-tick decision: the pure ``DualSlackAdmission`` fed with what the engines show now.

Observations (approximations, documented in docs/executor.md):
- serving requests come from the serving engine front-end's request states (``VllmEngine.live_requests``):
  arrival, vLLM's ``is_prefilling`` flag, last-token timestamp; a prefilling request counts as remaining the
  uncached prompt tokens of *every* request still prefilling (vLLM does not expose chunked-prefill progress
  per request, and it batches a burst's prefills into the same steps, so each waits for all of them);
- every running rollout sequence is a decode candidate (a sequence still in its first prefill chunk is
  counted as one decode step); every queued rollout turn is a prefill candidate of its prompt length.

Mechanism mapping: a queued turn starts only if (part of) its prefill is admitted; the rollout engine keeps
running only while every running sequence's decode step is admitted, else it is paused with its requests
kept. ``headroom`` (the heartbeat's ``slo_headroom``) is whether one more decode step would be admitted,
AND-ed with the p99 feedback rule (``ServingMonitor.has_headroom``) when one is given, which catches
latency-model error that the per-tick prediction cannot see.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rose_core.policy import DualSlackAdmission, RolloutWork, ServingRequest
from rose_executor.live_request import LiveRequest

PROBE_ID = "rose-guard-probe"


@dataclass(frozen=True, slots=True)
class QueuedTurn:
    key: str
    prompt_tokens: int


@dataclass(frozen=True, slots=True)
class GuardVerdict:
    start: tuple[str, ...]
    """Keys of queued turns admitted to start now."""
    run_rollout: bool
    """False: hold the rollout engine (pause, keep requests) this tick."""
    headroom: bool
    min_slack_s: float


class CoServingGuard:
    def __init__(self, admission: DualSlackAdmission, feedback: Callable[[], bool] | None = None) -> None:
        self.admission = admission
        self._feedback = feedback

    def set_feedback(self, feedback: Callable[[], bool] | None) -> None:
        self._feedback = feedback

    def decide(
        self, now: float, serving: Sequence[LiveRequest], running: Sequence[str], queued: Sequence[QueuedTurn]
    ) -> GuardVerdict:
        requests = serving_requests(serving)
        feedback_ok = self._feedback() if self._feedback is not None else True
        probe = self.admission.admit(now, requests, [RolloutWork(PROBE_ID, "decode")])
        headroom = bool(probe.admitted) and feedback_ok
        candidates = [RolloutWork(key, "decode") for key in running]
        candidates += [RolloutWork(q.key, "prefill", max(1, q.prompt_tokens)) for q in queued]
        decision = self.admission.admit(now, requests, candidates)
        held = set(decision.held)
        run_rollout = not any(key in held for key in running)
        queued_keys = {q.key for q in queued}
        start = tuple(w.request_id for w in decision.admitted if w.kind == "prefill" and w.request_id in queued_keys)
        slack = decision.min_slack_s if candidates else probe.min_slack_s
        may_start = run_rollout and feedback_ok
        return GuardVerdict(start if may_start else (), run_rollout, headroom, slack)


def serving_requests(live: Sequence[LiveRequest]) -> list[ServingRequest]:
    """The policy's view of the in-flight serving requests: a prefilling one waits for the uncached prompt
    tokens of every prefilling request (one burst is prefilled in the same engine steps)."""
    pending = sum(_uncached(r) for r in live if r.prefilling)
    return [serving_request(r, pending) for r in live]


def serving_request(r: LiveRequest, pending_prefill_tokens: int = 0) -> ServingRequest:
    """The policy's view of one in-flight serving request: while prefilling, its whole uncached prompt, or
    ``pending_prefill_tokens`` (the burst it is prefilled with) when that is larger."""
    if r.prefilling:
        remaining = max(_uncached(r), pending_prefill_tokens)
        return ServingRequest(r.request_id, r.arrival_s, remaining, r.last_token_s)
    last = r.last_token_s if r.last_token_s is not None else r.arrival_s
    return ServingRequest(r.request_id, r.arrival_s, 0, last)


def _uncached(r: LiveRequest) -> int:
    return max(1, r.prompt_tokens - r.cached_tokens)
