"""One GRPO job over the controller: rollout (turn by turn, routed by the scheduler), train, ship weights.

Version semantics: the generated model is version 0; step ``s`` rolls out on version ``s - 1`` (synchronous
GRPO, staleness 0 by default) and publishes version ``s``. Every turn result carries the version that
produced it; a result outside the allowed window is counted in ``version_mismatches``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from rose_core.config import RunConfig
from rose_core.controller.controller import AcceptedTurn, Controller, TurnPayload
from rose_core.controller.controller_metrics import STEP_SECONDS
from rose_core.controller.weight_sync import SyncBreakdown
from rose_core.messages import SamplingParams, StepStarted, StepStatus
from rose_core.rl.codec import TextCodec
from rose_core.rl.episode import Episode
from rose_core.rl.frozenlake import FrozenLakeEnv
from rose_core.rl.grpo import build_samples
from rose_core.rl.sample import TrainSample
from rose_core.run.load_generator import LoadGenerator
from rose_core.scheduler import TurnTicket
from rose_core.weights import EngineLayout, WeightPublisher, WeightRelay

log = logging.getLogger(__name__)


class Trainer(Protocol):
    def train_step(self, samples: list[TrainSample]) -> Any: ...

    def export_weights(self) -> dict[str, Any]: ...

    def engine_layout(self) -> EngineLayout: ...


@dataclass(slots=True)
class StepReport:
    step: int
    weight_version: int
    trajectories: int
    turns_dedicated: int
    turns_serving: int
    reward_mean: float
    rollout_seconds: float
    train_seconds: float
    sync_seconds: float
    sync_bytes: int
    serving_requests: int
    serving_ttft_p99_ms: float
    serving_tpot_p99_ms: float
    serving_slo_violations: int
    turns_rerouted: int = 0
    lost_trajectories: int = 0
    version_mismatches: int = 0
    published_version: int = 0
    train_loss: float = 0.0
    sync_breakdown: SyncBreakdown = field(default_factory=SyncBreakdown)
    """Where ``sync_seconds`` went (``rose_core.controller.weight_sync``; ``docs/controller.md``)."""
    link_bytes: dict[str, int] = field(default_factory=dict)
    """Per cluster with a started relay: bytes of this step's version that crossed the link to it."""
    prefix_hit_ratio: dict[str, float] = field(default_factory=dict)
    """Per pool (dedicated, serving): this step's accepted turns' prompt tokens served from the prefix cache."""
    success_rate: float = 0.0
    """Trajectories that reached the goal / trajectories trained on."""
    eval_success: float | None = None
    """Greedy success on the held-out maps (``rl.eval_every``; None on steps that did not evaluate)."""
    train: dict[str, float | None] = field(default_factory=dict)
    """The trainer's statistics (``TrainStats``): loss, clip_fraction, ratio_mean, behaviour_ratio_mean,
    tis_truncated_fraction, approx_kl, kl_ref, grad_norm, tokens, samples."""
    dropped_groups: int = 0
    """Groups dropped by dynamic sampling (every reward equal: no gradient) and refilled."""
    max_staleness: int = 0
    """The largest (trained version - sampling version) over the trained turns (<= scheduler.staleness)."""
    overlap_seconds: float = 0.0
    """Asynchronous steps: seconds of this step's training during which the next step's rollouts ran."""
    step_seconds: float = 0.0
    """Wall time from this step's start to its weights shipped (overlap included)."""
    checkpoint: str = ""
    """The checkpoint written after this step ("" when none)."""


@dataclass(slots=True)
class _Rollout:
    step: int
    version: int
    episodes: dict[str, Episode]
    open: set[str]
    turn_counts: dict[str, int] = field(default_factory=dict)
    by_role: dict[str, int] = field(default_factory=lambda: {"dedicated": 0, "serving": 0})
    mismatches: int = 0


class RLJob:
    def __init__(
        self,
        controller: Controller,
        config: RunConfig,
        codec: TextCodec,
        trainer: Trainer,
        publisher: WeightPublisher,
        serving: LoadGenerator | None = None,
        watchdog: Callable[[], None] | None = None,
        on_progress: Callable[[StepStatus], None] | None = None,
        relays: Mapping[str, WeightRelay] | None = None,
    ) -> None:
        self.controller = controller
        self.config = config
        self.codec = codec
        self.trainer = trainer
        self.publisher = publisher
        self.serving = serving
        self.watchdog = watchdog or (lambda: None)
        self.on_progress = on_progress or (lambda _status: None)
        self.relays = dict(relays or {})
        self.version = 0
        self._rollout: _Rollout | None = None
        self._link_before: dict[str, int] = {}
        self._prefix_before: tuple[dict[str, int], dict[str, int]] = ({}, {})
        controller.on_result = self._on_result

    # ---------------------------------------------------------------- one step

    def run_step(self, step: int) -> StepReport:
        started = time.monotonic()
        reroutes_before = self.controller.stats.reroutes
        stats = self.controller.stats
        self._prefix_before = (dict(stats.prompt_tokens_by_role), dict(stats.prefix_hit_tokens_by_role))
        self.controller.open_borrowing()
        self.controller.broadcast(StepStarted(step=step, weight_version=self.version))
        rollout = self._start_rollout(step)
        self._drive(rollout, time.monotonic() + self.config.rl.turn_timeout_s * self.config.rl.max_turns)
        rollout_s = time.monotonic() - started
        trajectories = [ep.trajectory for ep in rollout.episodes.values() if ep.done]
        self._set_phase(rollout, "train")
        t0 = time.monotonic()
        stats = self.trainer.train_step(build_samples(trajectories))
        train_s = time.monotonic() - t0
        self._set_phase(rollout, "weight_sync")
        sync_s, sync_bytes = self._ship_weights(step)
        ended = time.monotonic()
        for phase, secs in (("rollout", rollout_s), ("train", train_s), ("weight_sync", sync_s)):
            STEP_SECONDS.labels(phase).observe(secs)
        report = self._report(rollout, trajectories, rollout_s, train_s, sync_s, sync_bytes, (started, ended))
        report.turns_rerouted = self.controller.stats.reroutes - reroutes_before
        report.train_loss = float(getattr(stats, "loss", 0.0))
        report.sync_breakdown = self.controller.last_sync
        report.link_bytes = {name: relay.upstream_bytes - self._link_before.get(name, 0)
                             for name, relay in self.relays.items()}
        self._set_phase(rollout, "done", report.reward_mean)
        self.controller.history.append(self.controller.step_status)  # type: ignore[arg-type]
        return report

    # ---------------------------------------------------------------- rollout

    def _start_rollout(self, step: int) -> _Rollout:
        rl = self.config.rl
        episodes: dict[str, Episode] = {}
        for p in range(rl.prompts_per_step):
            seed = rl.seed * 1_000_003 + step * 1000 + p
            for g in range(rl.group_size):
                tid = f"s{step}-p{p}-g{g}"
                env = FrozenLakeEnv(seed=seed, size=rl.env_size, max_turns=rl.max_turns)
                episodes[tid] = Episode(tid, f"s{step}-p{p}", env, self.codec, rl.max_context_tokens)
        rollout = _Rollout(step, self.version, episodes, set(episodes))
        self._rollout = rollout
        for tid in episodes:
            self._submit_turn(rollout, tid)
        self._set_phase(rollout, "rollout")
        return rollout

    def _submit_turn(self, rollout: _Rollout, trajectory_id: str) -> None:
        k = rollout.turn_counts.get(trajectory_id, 0)
        rollout.turn_counts[trajectory_id] = k + 1
        rl = self.config.rl
        lo = max(0, rollout.version - self.config.scheduler.staleness)
        prompt = np.asarray(rollout.episodes[trajectory_id].prompt(), dtype=np.int32)
        payload = TurnPayload(prompt, SamplingParams(max_tokens=rl.max_tokens_per_turn, temperature=rl.temperature),
                              rollout.step)
        self.controller.submit_turn(TurnTicket(f"{trajectory_id}/t{k}", trajectory_id, lo, rollout.version,
                                               time.monotonic(), payload=payload))

    def _drive(self, rollout: _Rollout, deadline: float) -> None:
        last_progress = 0.0
        while rollout.open and time.monotonic() < deadline:
            self.watchdog()
            self.controller.pump(0.05)
            if time.monotonic() - last_progress > 0.5:
                last_progress = time.monotonic()
                self._set_phase(rollout, "rollout")
        if rollout.open:
            log.error("step %d: %d trajectories did not finish before the deadline", rollout.step, len(rollout.open))

    def _on_result(self, accepted: AcceptedTurn) -> None:
        rollout = self._rollout
        res = accepted.result
        if rollout is None or res.trajectory_id not in rollout.open:
            return
        if not accepted.ticket.min_version <= res.weight_version <= accepted.ticket.max_version:
            rollout.mismatches += 1
        rollout.by_role[accepted.role] = rollout.by_role.get(accepted.role, 0) + 1
        episode = rollout.episodes[res.trajectory_id]
        episode.advance(res.output_token_ids.tolist(), res.output_logprobs.tolist(), res.weight_version)
        if episode.done:
            rollout.open.discard(res.trajectory_id)
            self.controller.scheduler.finish_trajectory(res.trajectory_id)
        else:
            self._submit_turn(rollout, res.trajectory_id)

    def _set_phase(self, rollout: _Rollout, phase: str, reward: float | None = None) -> None:
        total = len(rollout.episodes)
        status = StepStatus(
            step=rollout.step, phase=phase, weight_version=rollout.version, trajectories_total=total,
            trajectories_done=total - len(rollout.open), turns_in_flight=self.controller.scheduler.running,
            turns_queued=len(self.controller.scheduler.queue), reward_mean=reward,
        )
        self.controller.step_status = status
        self.on_progress(status)

    # ---------------------------------------------------------------- weights

    def _ship_weights(self, step: int) -> tuple[float, int]:
        self._link_before = {name: relay.upstream_bytes for name, relay in self.relays.items()}
        t0 = time.monotonic()
        weights = self.trainer.export_weights()
        export_s = time.monotonic() - t0
        announce = self.publisher.publish(self.version + 1, step, weights, layout=self.trainer.engine_layout())
        publish_s = time.monotonic() - t0
        applied = self.controller.announce_weights(announce, self.config.rl.weight_sync_timeout_s,
                                                   publish_s=publish_s, export_s=export_s)
        failed = {eid: a.error for eid, a in applied.items() if not a.ok}
        if failed:
            raise RuntimeError(f"weight version {announce.version} failed on {failed}")
        self.version = announce.version
        return time.monotonic() - t0, sum(a.bytes_received for a in applied.values())

    # ---------------------------------------------------------------- report

    def _report(
        self, rollout: _Rollout, trajectories: list[Any], rollout_s: float, train_s: float, sync_s: float,
        sync_bytes: int, span: tuple[float, float],
    ) -> StepReport:
        rewards = [t.total_reward for t in trajectories]
        slo = self.config.slo
        window = self.serving.window(span[0], span[1], slo.ttft_ms, slo.tpot_ms) if self.serving else None
        return StepReport(
            step=rollout.step, weight_version=rollout.version, trajectories=len(trajectories),
            turns_dedicated=rollout.by_role.get("dedicated", 0), turns_serving=rollout.by_role.get("serving", 0),
            reward_mean=float(np.mean(rewards)) if rewards else 0.0, rollout_seconds=rollout_s,
            train_seconds=train_s, sync_seconds=sync_s, sync_bytes=sync_bytes,
            serving_requests=window.requests if window else 0,
            serving_ttft_p99_ms=window.ttft_p99_ms if window else 0.0,
            serving_tpot_p99_ms=window.tpot_p99_ms if window else 0.0,
            serving_slo_violations=window.slo_violations if window else 0,
            lost_trajectories=len(rollout.open), version_mismatches=rollout.mismatches,
            published_version=self.version, prefix_hit_ratio=self._prefix_hit_ratio(),
        )

    def _prefix_hit_ratio(self) -> dict[str, float]:
        stats, (prompt0, hit0) = self.controller.stats, self._prefix_before
        out = {}
        for role, prompt in stats.prompt_tokens_by_role.items():
            tokens = prompt - prompt0.get(role, 0)
            hits = stats.prefix_hit_tokens_by_role.get(role, 0) - hit0.get(role, 0)
            out[role] = round(hits / tokens, 4) if tokens else 0.0
        return out
