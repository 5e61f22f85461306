"""Dual-SLO admission of rollout work into a co-serving engine step (paper-notes 2.1(c)).

For every in-flight serving request ``r`` at time ``now``:

    prefill slack  = r.arrival    + B_TTFT - now - T_prf(remaining prompt tokens, chunk) - T_rollout
    decode slack   = r.last_token + B_TPOT - now - T_dec(serving decode batch)           - T_rollout

where ``T_rollout`` is the predicted time of the rollout work added to the step (rollout model's
``LatencyModel``). The controller admits the largest set of candidate rollout work (decode steps first, then
prefill chunks of at most ``chunk_tokens``) that keeps every slack above ``margin_s``; otherwise it holds.
Pure: ``now`` is an argument, nothing is read from a clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rose_core.policy.latency_model import LatencyModel
from rose_core.policy.serving_request import RolloutWork, ServingRequest


@dataclass(slots=True, frozen=True)
class AdmissionConfig:
    ttft_budget_s: float
    tpot_budget_s: float
    chunk_tokens: int = 512
    """Rollout prefill tokens per engine step (paper: 512-token chunks bound the rollout step)."""
    margin_s: float = 0.0
    """Every slack must stay above this after admission (a guard against model error)."""

    def __post_init__(self) -> None:
        if not self.ttft_budget_s > 0 or not self.tpot_budget_s > 0:
            raise ValueError("`ttft_budget_s` and `tpot_budget_s` must be > 0")
        if self.chunk_tokens <= 0:
            raise ValueError(f"`chunk_tokens` must be > 0 (got {self.chunk_tokens})")
        if not self.margin_s >= 0:
            raise ValueError(f"`margin_s` must be >= 0 (got {self.margin_s})")


@dataclass(slots=True, frozen=True)
class AdmissionDecision:
    admitted: tuple[RolloutWork, ...]
    """Admitted work; a prefill's ``tokens`` is the chunk admitted this step."""
    held: tuple[str, ...]
    """Request ids of candidates not admitted (or only partly, for a prefill)."""
    rollout_step_s: float
    """Predicted time the admitted rollout work adds to the step."""
    min_slack_s: float
    """Smallest serving slack after admission (``inf`` without serving requests)."""

    @property
    def decode_seqs(self) -> int:
        return sum(1 for w in self.admitted if w.kind == "decode")

    @property
    def prefill_tokens(self) -> int:
        return sum(w.tokens for w in self.admitted if w.kind == "prefill")


class DualSlackAdmission:
    def __init__(self, config: AdmissionConfig, serving_model: LatencyModel, rollout_model: LatencyModel) -> None:
        self.config = config
        self.serving_model = serving_model
        self.rollout_model = rollout_model

    def slack_s(self, now: float, serving: Sequence[ServingRequest], rollout_step_s: float = 0.0) -> float:
        """Smallest prefill/decode slack over ``serving`` with ``rollout_step_s`` of rollout work added."""
        decode_batch = sum(1 for r in serving if not r.in_prefill)
        t_dec = self.serving_model.decode_step_s(decode_batch)
        cfg = self.config
        worst = math.inf
        for r in serving:
            if r.in_prefill:
                t_prf = self.serving_model.prefill_s(r.remaining_prompt_tokens, cfg.chunk_tokens)
                slack = r.arrival + cfg.ttft_budget_s - now - t_prf
            else:
                last = r.last_token_at if r.last_token_at is not None else r.arrival
                slack = last + cfg.tpot_budget_s - now - t_dec
            worst = min(worst, slack)
        return worst - rollout_step_s

    def admit(self, now: float, serving: Sequence[ServingRequest],
              candidates: Sequence[RolloutWork]) -> AdmissionDecision:
        budget = self.slack_s(now, serving) - self.config.margin_s
        if budget <= 0:
            return AdmissionDecision((), tuple(c.request_id for c in candidates), 0.0, budget + self.config.margin_s)
        admitted: list[RolloutWork] = []
        held: list[str] = []
        decodes = [c for c in candidates if c.kind == "decode"]
        prefills = sorted((c for c in candidates if c.kind == "prefill"), key=lambda c: c.tokens)
        n_dec = self._decodes_within(budget, len(decodes))
        admitted.extend(decodes[:n_dec])
        held.extend(c.request_id for c in decodes[n_dec:])
        room = self.config.chunk_tokens
        for c in prefills:
            fit = min(c.tokens, room, self._prefill_tokens_within(budget, n_dec, self.config.chunk_tokens - room))
            if fit > 0:
                admitted.append(RolloutWork(c.request_id, "prefill", fit))
                room -= fit
            if fit < c.tokens:
                held.append(c.request_id)
        step = self.rollout_model.step_s(n_dec, self.config.chunk_tokens - room)
        return AdmissionDecision(tuple(admitted), tuple(held), step, self.slack_s(now, serving, step))

    def _decodes_within(self, budget: float, available: int) -> int:
        """Most decode sequences whose step keeps ``time < budget`` (binary search: time grows with batch)."""
        lo, hi = 0, available
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.rollout_model.step_s(mid, 0) < budget:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _prefill_tokens_within(self, budget: float, decode_batch: int, prefill_so_far: int) -> int:
        """Extra prefill tokens that keep the rollout step strictly under ``budget``."""
        lo, hi = 0, self.config.chunk_tokens - prefill_so_far
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.rollout_model.step_s(decode_batch, prefill_so_far + mid) < budget:
                lo = mid
            else:
                hi = mid - 1
        return lo
