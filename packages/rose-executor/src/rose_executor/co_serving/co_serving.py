"""The co-serving mechanism of a serving host: every control tick, drive the pure policies with what the
engines show and turn their decisions into vLLM calls (start queued rollout turns, pause/resume the rollout
engine, abort rollout requests on a memory cut).

One implementation, several drivers: ``CoServingGuard`` (the co-serving decision) and ``ServingFirstMemory``
are rose-core's pure policies; ``rose sim`` and the GPU admission bench drive the same objects with their own
time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import Callable

from rose_core.config.executor_config import ExecutorConfig
from rose_core.policy import CoServingGuard, GuardSettings, GuardVerdict, LiveRequest, SloBudgets
from rose_executor import metrics
from rose_executor.engine.bounded_call import bounded
from rose_executor.engine.clock import WALL_CLOCK, Clock
from rose_executor.engine.engine_protocol import Engine
from rose_executor.memory.serving_first_budget import ServingFirstBudget
from rose_executor.profile.colocated_profile import guard_serving_model
from rose_executor.profile.latency_profile import EngineProfile
from rose_executor.rollout.engine_memory import EngineMemory
from rose_executor.rollout.rollout_runner import RolloutRunner

log = logging.getLogger(__name__)


def slo_budgets(config: ExecutorConfig, serving: EngineProfile) -> SloBudgets | None:
    """Config values, or ``[slo] from_profile`` x the profiled serving-alone TTFT / TPOT when that is > 0;
    None with ``[slo] from_alone`` (the host measures them: ``AloneCalibration``)."""
    if config.slo.from_alone > 0:
        return None
    if config.slo.from_profile <= 0:
        return SloBudgets(config.slo.ttft_ms / 1000, config.slo.tpot_ms / 1000)
    longest = max(n for n, _ in serving.prefill_points)
    return SloBudgets.from_profile(config.slo.from_profile, serving.latency_model(), longest,
                                   config.rollout.prefill_chunk_tokens, config.serving.max_num_seqs)  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class PendingGuard:
    """A guard whose SLO is still being measured: ``ready()`` builds it once ``slo()`` answers; until then the
    host lends nothing (every turn held, no headroom reported, no pressure counted)."""

    slo: Callable[[], SloBudgets | None]
    build: Callable[[SloBudgets], CoServingGuard]

    def ready(self) -> CoServingGuard | None:
        slo = self.slo()
        return self.build(slo) if slo is not None else None


MEASURING = GuardVerdict(start=(), run_rollout=False, headroom=False, min_slack_s=math.inf)
"""The verdict while the SLO is being measured: nothing runs."""


def guard_settings(config: ExecutorConfig, slo: SloBudgets) -> GuardSettings:
    return GuardSettings(slo, config.rollout.prefill_chunk_tokens, config.slo.admission_margin_ms / 1000, config.slo.hold_margin,
                         config.rollout.capacity)  # fmt: skip


def check_ttft_floor(guard: CoServingGuard, slo: SloBudgets, longest_prompt: int) -> float:
    """Publish the guard's TTFT floor for the longest profiled serving prompt and warn, naming the fix, when
    the TTFT budget is below it (a request that arrives while a rollout step runs waits for that step, whatever
    the guard decides). Returns the floor, seconds."""
    floor = guard.ttft_floor_s(longest_prompt)
    metrics.GUARD_TTFT_FLOOR.set(floor)
    if slo.ttft_s < floor:
        log.warning(
            "the TTFT budget (%.1f ms) is below what co-location can keep for a %d-token serving prompt (%.1f ms: "
            "its prefill plus the rollout step a hold cannot stop and the admission margin, %.1f ms): a request "
            "that arrives while a rollout step runs waits for it, so this SLO will be missed on this device "
            "while rollout turns run here. Raise [slo] ttft_ms (or from_profile), or lower [rollout] "
            "prefill_chunk_tokens or capacity",
            slo.ttft_s * 1e3, longest_prompt, floor * 1e3, guard.admission.config.margin_s * 1e3,
        )  # fmt: skip
    return floor


class CoServing:
    """The guard and the memory budget of one serving host, driven by ``run``: every ``interval_s``, and at
    once when a serving request arrives or finishes or a rollout turn is submitted.

    Inactive / active: while no rollout turn is in flight the policy sits loaded but inactive (the rollout
    engine held, no KV reserved under the memory budget, nothing admitted); the first submitted turn wakes
    the tick, which resumes the engine and releases the turn if serving slack allows (activation bound:
    ``rose-executor bench``'s ``activation`` figure, docs/executor.md). Where the rollout engine can release
    its memory (GPU sleep mode), inactive also means released (after the hold), and activation first
    restores it; a weight update holds it restored (``EngineMemory.hold``) until it is committed.

    An emergency memory cut (serving crossed the high watermark) gives back the youngest turns that no longer
    fit the cut budget, which frees admission room on CPU. Where the rollout engine can release its memory (GPU
    sleep mode: its KV pool is fixed, so giving back some turns frees no device memory), the cut gives back
    every rollout turn and releases the engine's memory at once, and it stays released, its turns held, until
    the budget thaws at the next step.
    """

    def __init__(
        self,
        guard: CoServingGuard | PendingGuard,
        serving: Engine,
        rollout: Engine,
        runner: RolloutRunner,
        interval_s: float,
        memory: ServingFirstBudget | None = None,
        clock: Clock = WALL_CLOCK,
        *,
        engine_memory: EngineMemory | None = None,
        on_sustained_pressure: Callable[[float], None] | None = None,
        revoke_after_s: float = 0.0,
        call_timeout_s: float = 60.0,
    ) -> None:
        """``clock``: the serving engine's (its ``live_requests`` stamps); ticks read ``now`` from it.
        ``engine_memory``: the rollout engine's memory, shared with the weight updater (default: its own).
        ``on_sustained_pressure`` is called once (with the seconds) when serving went ``revoke_after_s``
        without headroom (0: never). ``call_timeout_s``: how long a pause or resume of the rollout engine may
        take before it counts as hung (``EngineHung`` ends the guard's loop, and with it the lease).
        A ``PendingGuard``: the guard is built once its SLO is measured, and the host lends nothing before."""
        self.guard: CoServingGuard | None = guard if isinstance(guard, CoServingGuard) else None
        self._pending = guard if isinstance(guard, PendingGuard) else None
        self.serving = serving
        self.rollout = rollout
        self.runner = runner
        self.interval_s = interval_s
        self.memory = memory
        self.clock = clock
        self.headroom = True
        self.paused = False
        self.active = False
        self.last: GuardVerdict | None = None
        self.feedback: Callable[[], bool] | None = None
        """The p99 feedback rule (``ServingMonitor.has_headroom``); None: off."""
        self.unguarded = False
        """``[slo] guard = false``: every queued turn starts and the engine runs, whatever serving does."""
        self.hold_seconds_total = 0.0
        """Time rollout turns were in flight here while the guard held them (serving had no slack to lend:
        queued turns not released, running ones paused when their next step would break a budget)."""
        self.pressure_since: float | None = None
        """Since when serving has had no headroom, without a break (None: it has headroom)."""
        self.on_sustained_pressure = on_sustained_pressure
        self.revoke_after_s = revoke_after_s
        self.call_timeout_s = call_timeout_s
        self.engine_memory = engine_memory or EngineMemory(rollout, call_timeout_s)
        self._restores_seen = self.engine_memory.restores
        self._released_by_cut = False
        self._last_tick: float | None = None
        self._wake = asyncio.Event()

    @classmethod
    def build(
        cls,
        config: ExecutorConfig,
        profiles: tuple[EngineProfile, EngineProfile],
        engines: tuple[Engine, Engine],
        runner: RolloutRunner,
        colocated: EngineProfile | None = None,
        *,
        slo: Callable[[], SloBudgets | None],
        engine_memory: EngineMemory | None = None,
        on_sustained_pressure: Callable[[float], None] | None = None,
    ) -> CoServing:
        """The guard of a serving host from its config and the (serving, rollout) profiles, plus the serving
        profile measured beside a saturated rollout engine when there is one; no p99 feedback until
        ``set_feedback``. ``slo``: the host's budgets (the monitor's: None while it measures them)."""
        serving_model = guard_serving_model(profiles[0], colocated)
        longest = max(n for n, _ in profiles[0].prefill_points)

        def build_guard(budgets: SloBudgets) -> CoServingGuard:
            guard = CoServingGuard.build(guard_settings(config, budgets), serving_model, profiles[1].latency_model())
            log.info("SLO guard: TTFT budget %.1f ms, TPOT budget %.1f ms", budgets.ttft_s * 1e3, budgets.tpot_s * 1e3)
            check_ttft_floor(guard, budgets, longest)
            return guard

        pending = PendingGuard(slo, build_guard)
        co = cls(pending.ready() or pending, engines[0], engines[1], runner, config.slo.guard_interval_s,
                 runner.memory, engine_memory=engine_memory, on_sustained_pressure=on_sustained_pressure,
                 revoke_after_s=config.slo.revoke_after_pressure_s, call_timeout_s=config.rollout.call_timeout_s)
        if not config.slo.guard:
            log.warning("[slo] guard = false: rollout turns run whatever serving does (a benchmark's baseline; "
                        "serving's SLO is measured, not kept)")
            co.unguarded = True
        return co

    def set_feedback(self, feedback: Callable[[], bool] | None) -> None:
        self.feedback = feedback

    def wake(self) -> None:
        """Run the next tick now (a serving arrival or finish, a submitted rollout turn)."""
        self._wake.set()

    async def run(self) -> None:
        """The control loop. It alone owns the rollout engine's pause state: a weight update never pauses
        or resumes the engine (it commits between steps, paused or not)."""
        self.serving.add_activity_listener(self.wake)
        self.runner.add_submit_listener(self.wake)
        try:
            while True:
                self._wake.clear()
                await self.tick(self.clock.now())
                await self._until_next_tick()
        finally:
            self.serving.remove_activity_listener(self.wake)
            self.runner.remove_submit_listener(self.wake)

    async def _until_next_tick(self) -> None:
        """``interval_s``, or less if woken. (Not ``asyncio.wait_for``: on Python 3.11 a cancel that lands as
        its timeout fires can leave the caller hung; a timer that sets the same event cannot.)"""
        if self._wake.is_set():
            return
        timer = self.clock.call_later(self.interval_s, self._wake.set)
        try:
            await self._wake.wait()
        finally:
            timer.cancel()

    def held_turns(self) -> int:
        """Rollout turns the guard holds back (the heartbeat's ``rollout_held``): those waiting for it to start
        them and, while it pauses the rollout engine, those running (decision 823: the controller may move them
        to a dedicated executor with room)."""
        return len(self.runner.queued()) + (len(self.runner.running()) if self.paused else 0)

    def serving_requests(self) -> list[LiveRequest]:
        """The serving engine's production requests in flight (not the executor's own ``rose-`` probes)."""
        return [r for r in self.serving.live_requests() if not r.request_id.startswith("rose-")]

    async def tick(self, now: float) -> GuardVerdict:
        serving = self.serving_requests()
        if self.memory is not None:
            decision = self.memory.observe(now, serving, self.runner.memory_uses())
            if decision.abort:
                self._cut(decision.budget_bytes, decision.abort)
        running, queued = self.runner.running(), self.runner.queued()
        self.active = bool(running or queued)
        cut_hold = self._released_by_cut = self._released_by_cut and self.runner.budget_frozen
        if self.active and not cut_hold:
            await self.engine_memory.restore()  # a released engine gets its memory back before work runs
        if self.engine_memory.restores != self._restores_seen:  # restored (here or by an update): it runs again
            self._restores_seen, self.paused = self.engine_memory.restores, False
        feedback_ok = self.feedback() if self.feedback is not None else True
        guard = self._guard()
        if self.unguarded:
            verdict = GuardVerdict(start=tuple(q.key for q in queued), run_rollout=True, headroom=True,
                                   min_slack_s=math.inf)
        else:
            verdict = guard.decide(now, serving, running, queued, feedback_ok) if guard is not None else MEASURING
        if cut_hold:  # nothing runs on released memory until the budget thaws
            verdict = dataclasses.replace(verdict, start=(), run_rollout=False)
        self._account(now, verdict, measuring=guard is None and not self.unguarded)
        self.last = verdict
        if verdict.headroom != self.headroom:
            self._log_headroom(now, verdict, serving, feedback_ok)
        self.headroom = verdict.headroom
        self.runner.held = not verdict.headroom
        metrics.GUARD_MIN_SLACK.set(verdict.min_slack_s if math.isfinite(verdict.min_slack_s) else math.inf)
        await self._apply(verdict)
        if not self.active or cut_hold:
            await self.engine_memory.release()  # where the platform can, and no weight update holds it
        return verdict

    def _guard(self) -> CoServingGuard | None:
        if self.guard is None and self._pending is not None:
            self.guard = self._pending.ready()
        return self.guard

    def _cut(self, budget_bytes: int, youngest: tuple[str, ...] | list[str]) -> None:
        """An emergency cut: give back ``youngest`` (admission room), or, where the rollout engine can release
        its memory, every turn (its memory is released by the tick and stays so until the budget thaws)."""
        physical = self.engine_memory.engine.can_release_memory
        keys = [*self.runner.running(), *(q.key for q in self.runner.queued())] if physical else list(youngest)
        log.warning("serving memory crossed the high watermark: rollout budget cut to %d bytes, aborting %d rollout "
                    "turns%s", budget_bytes, len(keys),
                    "; the rollout engine releases its memory until the next step" if physical else "")
        self.runner.abort_keys(keys, "memory")
        self._released_by_cut = physical

    @staticmethod
    def _log_headroom(now: float, verdict: GuardVerdict, serving: list[LiveRequest], feedback_ok: bool) -> None:
        """A headroom change, with what decided it (the operator's first question when rollout stops here)."""
        oldest = min(serving, key=lambda r: r.arrival_s, default=None)
        worst = (f"; oldest {oldest.request_id}: {now - oldest.arrival_s:.2f} s old, {oldest.tokens_out} tokens out,"
                 f" {'prefilling' if oldest.prefilling else 'decoding'}") if oldest else ""
        log.debug("SLO headroom %s: min slack %.1f ms, p99 feedback %s, %d serving requests in flight%s",
                 "regained" if verdict.headroom else "lost", verdict.min_slack_s * 1e3,
                 "ok" if feedback_ok else "over", len(serving), worst)

    def _account(self, now: float, verdict: GuardVerdict, measuring: bool = False) -> None:
        """Hold time (work waiting, not allowed to run) and sustained pressure (no headroom without a break;
        not while the SLO is being measured: that is no pressure from serving)."""
        last, self._last_tick = self._last_tick, now
        if last is not None and self.active and not verdict.headroom:
            self.hold_seconds_total += max(0.0, now - last)
        if verdict.headroom or measuring:
            self.pressure_since = None
            return
        if self.pressure_since is None:
            self.pressure_since = now
        lasted = now - self.pressure_since
        if self.revoke_after_s > 0 and lasted >= self.revoke_after_s and self.on_sustained_pressure is not None:
            callback, self.on_sustained_pressure = self.on_sustained_pressure, None
            callback(lasted)

    async def _apply(self, verdict: GuardVerdict) -> None:
        run = verdict.run_rollout and self.active
        if not run and not self.paused:
            await bounded(self.rollout.pause(keep_requests=True), self.call_timeout_s, "pause")
            self.paused = True
            if self.active:
                metrics.GUARD_HOLDS.inc()
        elif run and self.paused:
            await bounded(self.rollout.resume(), self.call_timeout_s, "resume")
            self.paused = False
        metrics.ROLLOUT_ENGINE_PAUSED.set(1 if self.paused else 0)
        metrics.ROLLOUT_ACTIVE.set(1 if self.active else 0)
        if verdict.start:
            self.runner.release(verdict.start)

    def on_step(self, step: int) -> None:
        if self.memory is not None:
            self.memory.on_step(step, self.serving_requests())
