"""The co-serving decision, defined once: engine state -> policy inputs, SLO budgets, margins, hold or admit.

The executor drives it every control tick with the wall clock, ``rose sim`` with simulated time and the GPU
admission bench with CUDA-event time; all three build it with ``CoServingGuard.build`` and call ``decide``.
Pure: ``now`` and every observation are arguments (including the p99 feedback rule's verdict).

Observations (approximations, documented in docs/executor.md):
- serving requests come from the serving engine front-end's request states (``LiveRequest``): arrival,
  vLLM's ``is_prefilling`` flag, last-token timestamp; a prefilling request counts as remaining the uncached
  prompt tokens of *every* request still prefilling (vLLM does not expose chunked-prefill progress per
  request, and it batches a burst's prefills into the same steps, so each waits for all of them);
- every running rollout sequence is a decode candidate (a sequence still in its first prefill chunk is
  counted as one decode step); every queued rollout turn is a prefill candidate of its prompt length.

Margins: every admission keeps ``margin_s`` of slack plus, with ``hold_margin``, the rollout step a hold
cannot stop (``hold_margin_s``: a hold lands between engine steps, so the step in flight still runs).

Mechanism mapping: a queued turn starts only if (part of) its prefill is admitted; the rollout engine keeps
running only while every running sequence's decode step is admitted, else it is held (paused, requests
kept). ``headroom`` (the heartbeat's ``slo_headroom``) is whether one more decode step would be admitted,
AND-ed with the p99 feedback verdict, which catches latency-model error the per-tick prediction cannot see.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rose_core.policy.dual_slack_admission import AdmissionConfig, AdmissionDecision, DualSlackAdmission
from rose_core.policy.latency_model import LatencyModel
from rose_core.policy.live_request import LiveRequest
from rose_core.policy.serving_request import RolloutWork, ServingRequest

PROBE_ID = "rose-guard-probe"


@dataclass(frozen=True, slots=True)
class SloBudgets:
    """The serving SLO the guard protects: TTFT and TPOT budgets, seconds."""

    ttft_s: float
    tpot_s: float

    @classmethod
    def from_profile(
        cls, multiple: float, serving_alone: LatencyModel, longest_prompt: int, chunk_tokens: int, max_num_seqs: int
    ) -> SloBudgets:
        """``multiple`` x what serving alone achieves: the TTFT of its longest profiled prompt and the TPOT of
        a full decode batch."""
        ttft = serving_alone.prefill_s(longest_prompt, chunk_tokens)
        return cls(multiple * ttft, multiple * serving_alone.decode_step_s(max_num_seqs))


@dataclass(frozen=True, slots=True)
class GuardSettings:
    slo: SloBudgets
    chunk_tokens: int = 512
    """Rollout prefill tokens admitted per engine step."""
    margin_s: float = 0.0
    """Slack every admission keeps in reserve against latency-model error."""
    hold_margin: bool = True
    """Also keep in reserve the rollout step a hold cannot stop (``hold_margin_s`` at ``rollout_batch``)."""
    rollout_batch: int = 16
    """The rollout engine's most concurrent sequences (its decode batch at full load)."""
    hold_chunk: bool = True
    """The step a hold cannot stop may carry a prefill chunk (an engine that, once a prefill is admitted, runs
    its chunks step after step: vLLM's chunked prefill); False where every chunk is admitted at its own
    launch (the GPU admission bench), so the chunk in flight is already priced."""


def hold_margin_s(rollout: LatencyModel, max_num_seqs: int, chunk_tokens: int = 0) -> float:
    """What a hold cannot stop: the rollout engine's step in flight when the pause lands, at its largest (from
    the profile): a decode step of its full batch, plus, with chunked prefill (``chunk_tokens`` > 0), a prefill
    chunk in the same step (a serving arrival mid-chunk waits for the whole chunk). Every admission keeps
    this much slack in reserve."""
    return rollout.step_s(max(1, max_num_seqs), max(0, chunk_tokens))


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
    decode_seqs: int = 0
    """Rollout decode steps admitted this tick (of the running sequences)."""
    prefill_tokens: int = 0
    """Rollout prefill tokens admitted this tick (at most one chunk)."""


class CoServingGuard:
    def __init__(self, admission: DualSlackAdmission) -> None:
        self.admission = admission

    @classmethod
    def build(cls, settings: GuardSettings, serving: LatencyModel, rollout: LatencyModel) -> CoServingGuard:
        """The guard every driver uses: SLO budgets, chunk and margins from ``settings``; ``serving`` predicts
        the serving engine's steps (the executor passes the slower of its alone / co-located profiles)."""
        margin_s = settings.margin_s
        if settings.hold_margin:
            chunk = settings.chunk_tokens if settings.hold_chunk else 0
            margin_s += hold_margin_s(rollout, settings.rollout_batch, chunk)
        config = AdmissionConfig(settings.slo.ttft_s, settings.slo.tpot_s, settings.chunk_tokens, margin_s)
        return cls(DualSlackAdmission(config, serving, rollout))

    def ttft_floor_s(self, prompt_tokens: int) -> float:
        """The tightest TTFT budget this guard can keep for a ``prompt_tokens`` serving request that arrives
        unannounced: its prefill (the serving model) plus the margin every admission keeps (the rollout step
        a hold cannot stop, and the reserve against model error). Such an arrival finds a rollout step in
        flight whatever the guard decided, so under a tighter budget co-location itself breaks the SLO: the
        guard can then only stop lending, not protect the arrival."""
        config = self.admission.config
        return self.admission.serving_model.prefill_s(prompt_tokens, config.chunk_tokens) + config.margin_s

    def decide(
        self,
        now: float,
        serving: Sequence[LiveRequest],
        running: Sequence[str],
        queued: Sequence[QueuedTurn],
        feedback_ok: bool = True,
    ) -> GuardVerdict:
        """Hold or admit at ``now``. ``feedback_ok``: the p99 feedback rule's verdict (True when off)."""
        requests = serving_requests(serving)
        probe = self.admission.admit(now, requests, [RolloutWork(PROBE_ID, "decode")])
        headroom = bool(probe.admitted) and feedback_ok
        candidates = [RolloutWork(key, "decode") for key in running]
        candidates += [RolloutWork(q.key, "prefill", max(1, q.prompt_tokens)) for q in queued]
        decision = self.admission.admit(now, requests, candidates)
        held = set(decision.held)
        run_rollout = not any(key in held for key in running)
        slack = decision.min_slack_s if candidates else probe.min_slack_s
        start = _started(decision, queued) if run_rollout and feedback_ok else ()
        return GuardVerdict(start, run_rollout, headroom, slack, decision.decode_seqs, decision.prefill_tokens)


def _started(decision: AdmissionDecision, queued: Sequence[QueuedTurn]) -> tuple[str, ...]:
    keys = {q.key for q in queued}
    return tuple(w.request_id for w in decision.admitted if w.kind == "prefill" and w.request_id in keys)


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
