"""The bench's host side: the serving arrival process, the rollout policies, the co-serving guard as the bench
builds it, and the one host loop every scenario runs.

The guard is ``rose_core.policy.CoServingGuard`` built with ``CoServingGuard.build``, the executor's decision
(no copy of it here). Mapping of the bench's state onto the guard's inputs:

- latency models from the start-up profile: serving ``T_prf = T_first`` (one step: the proxy has no prefill),
  ``T_dec`` flat in the batch; rollout ``T_chunk`` per ``chunk_tokens`` prefill tokens, no decode;
- the serving burst in flight -> one decoding ``LiveRequest`` (its last token, or its arrival before the
  first: a burst's first step is held to the TPOT rule); an idle gap -> one ``LiveRequest`` prefilling a
  1-token prompt that arrives now (its TTFT slack bounds what an unannounced arrival finds queued);
- a rollout chunk -> a ``QueuedTurn`` of ``chunk_tokens``, decided at ``now_eff = now +`` the predicted GPU
  time of the rollout chunks already queued. A chunk is one graph replay, so it launches only when the guard
  starts the turn with every one of its tokens admitted.

Settings as the executor's defaults: ``margin_s`` = ``--margin-ms``, hold margin on (it is 0 here: the
profiled rollout has no decode step, and the chunks already queued are charged through ``now_eff``).
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from rose_core.policy import CoServingGuard, GuardSettings, LatencyModel, LiveRequest, QueuedTurn, SloBudgets

from .report import Recorder
from .rig import Handle, Rig

ADMISSION_IMPL = f"{CoServingGuard.__module__.rpartition('.')[0]}.{CoServingGuard.__qualname__}"
"""What decides (``rose_core.policy.CoServingGuard``), named in the JSON."""
CHUNK_KEY = "rollout-chunk"


@dataclass(frozen=True)
class LatencyProfile:
    """The guard's latency model, from the start-up profile (seconds)."""

    t_dec: float
    """Serving decode step (host TPOT p99)."""
    t_first: float
    """Serving step, first of a burst (CUDA-event p99)."""
    t_chunk: float
    """One rollout chunk (CUDA-event p99)."""

    def serving_model(self) -> LatencyModel:
        return LatencyModel(self.t_first, prefill_per_token_s=0.0, decode_base_s=self.t_dec, decode_per_seq_s=0.0)

    def rollout_model(self, chunk_tokens: int) -> LatencyModel:
        return LatencyModel(0.0, prefill_per_token_s=self.t_chunk / chunk_tokens, decode_base_s=0.0, decode_per_seq_s=0.0)


def decoding(arrival: float, last_token_at: float | None) -> LiveRequest:
    """The serving burst in flight: its next token is due B_TPOT after the last one (or its arrival)."""
    return LiveRequest("serving", arrival, 1, 0, 0, prefilling=False, last_token_s=last_token_at)


def arriving(now: float) -> LiveRequest:
    """An idle gap: a request that would arrive right now (its TTFT slack)."""
    return LiveRequest("arrival", now, 1, 0, 0, prefilling=True, last_token_s=None)


@dataclass
class Burst:
    arrival: float
    steps: int


def make_schedule(seconds: float, step_s: float, duty: float, mean_steps: int, seed: int) -> list[Burst]:
    """On/off serving arrivals: bursts of ``mean_steps`` +- 50% back-to-back steps (uniform), each after an
    exponential idle gap; gaps are rescaled so that busy time / (busy + idle time) is exactly ``duty`` (at
    ``step_s`` per step) and the bursts fill at most ``seconds``."""
    rng = random.Random(seed)
    if duty <= 0:
        return []
    lo, hi = max(2, mean_steps // 2), max(2, (3 * mean_steps) // 2)
    steps: list[int] = []
    gaps: list[float] = []
    busy = 0.0
    while True:
        n = rng.randint(lo, hi)
        if steps and busy + n * step_s > duty * seconds:
            break
        steps.append(n)
        gaps.append(rng.expovariate(1.0))
        busy += n * step_s
    scale = busy * (1.0 - duty) / duty / sum(gaps) if duty < 1.0 else 0.0
    out: list[Burst] = []
    t = 0.0
    for n, g in zip(steps, gaps, strict=True):
        t += g * scale
        out.append(Burst(t, n))
        t += n * step_s
    return out


@dataclass
class InFlight:
    handle: Handle
    pred_end: float
    lane: str


@dataclass
class View:
    """What a rollout policy sees and can do at one tick (times in seconds since the scenario start)."""

    now: float = 0.0
    serving_active: bool = False
    arrival: float = 0.0
    last_token_at: float | None = None
    step_launch: float | None = None
    full: list[InFlight] = field(default_factory=list)
    green: list[InFlight] = field(default_factory=list)
    launch_full: Callable[[], None] | None = None
    launch_green: Callable[[], None] | None = None
    t_chunk: float = 0.0

    def reanchor(self) -> None:
        """Close the loop on a completion seen at ``now``: the chunks still queued end ``t_chunk`` apart from
        ``now``. Without it the predicted ends chain open loop from launch times, and a GPU that runs chunks
        slower than profiled (an H200 ran a sustained rollout 5-8% slower than its start-up profile) makes the
        real queue outgrow the predicted one: over a long idle gap the guard's 1.5 queued chunks became about
        6, and the next serving burst waited behind them (TPOT step p99 up to 3x alone)."""
        for i, chunk in enumerate(self.full):
            chunk.pred_end = self.now + (i + 1) * self.t_chunk

    def full_pending_s(self) -> float:
        """Predicted GPU time of queued full-GPU rollout work still ahead of ``now`` (overdue chunks count
        0.1 chunk: they are still running)."""
        if not self.full:
            return 0.0
        return max(self.full[-1].pred_end - self.now, 0.1 * self.t_chunk)


class Policy:
    name = "none"

    def tick(self, v: View) -> None:
        pass

    def done(self, lane: str, t_launch: float, t_done: float) -> None:
        pass


class Saturate(Policy):
    def __init__(self, lane: str = "full", depth: int = 2) -> None:
        self.name, self.lane, self.depth = f"saturate_{lane}", lane, depth

    def tick(self, v: View) -> None:
        if self.lane == "full":
            while len(v.full) < self.depth and v.launch_full is not None:
                v.launch_full()
        else:
            while len(v.green) < self.depth and v.launch_green is not None:
                v.launch_green()


class BlindDuty(Policy):
    """The baseline's blind duty cycle: run one chunk, then stay idle as long as it took (duty 0.5)."""

    name = "blind_duty"

    def __init__(self, duty: float = 0.5) -> None:
        self.duty, self.next_ok = duty, 0.0

    def tick(self, v: View) -> None:
        if not v.full and v.now >= self.next_ok and v.launch_full is not None:
            v.launch_full()

    def done(self, lane: str, t_launch: float, t_done: float) -> None:
        self.next_ok = t_done + (t_done - t_launch) * (1.0 - self.duty) / self.duty


@dataclass(frozen=True)
class ChunkGuard:
    """The co-serving guard as the bench builds it, deciding on one rollout chunk of ``chunk_tokens``."""

    guard: CoServingGuard
    chunk_tokens: int

    @classmethod
    def build(cls, lat: LatencyProfile, slo: SloBudgets, margin_s: float, chunk_tokens: int) -> ChunkGuard:
        # every chunk is admitted at its own launch (against a request arriving now): the chunk in flight is
        # priced, so the hold margin charges no chunk (``hold_chunk=False``; it is 0 here)
        settings = GuardSettings(slo, chunk_tokens, margin_s, hold_margin=True, rollout_batch=1, hold_chunk=False)
        return cls(CoServingGuard.build(settings, lat.serving_model(), lat.rollout_model(chunk_tokens)), chunk_tokens)

    @property
    def margin_s(self) -> float:
        """Slack every admission keeps: ``margin_s`` plus the hold margin."""
        return self.guard.admission.config.margin_s

    def admits(self, now_eff: float, serving: list[LiveRequest]) -> bool:
        """Whether the guard starts one chunk at ``now_eff`` with all of its tokens admitted."""
        verdict = self.guard.decide(now_eff, serving, (), (QueuedTurn(CHUNK_KEY, self.chunk_tokens),))
        return CHUNK_KEY in verdict.start and verdict.prefill_tokens >= self.chunk_tokens


class Guarded(Policy):
    """Guarded admission of full-GPU chunks; optionally the green-context dial during serving bursts."""

    name = "guarded"

    def __init__(self, admission: ChunkGuard, green: ChunkGuard | None = None) -> None:
        self.adm, self.green_adm = admission, green
        self.admitted = self.admitted_while_serving = self.green_admitted = 0
        self._held_step: float | None = None

    def tick(self, v: View) -> None:
        serving = [decoding(v.arrival, v.last_token_at) if v.serving_active else arriving(v.now)]
        # while a serving step is in flight the TPOT slack only shrinks: once held, skip re-evaluating the
        # full-GPU lane until the next step (keeps the host loop fast between serving steps)
        if not (v.serving_active and v.step_launch is not None and v.step_launch == self._held_step):
            n = 0  # a few launches at most per tick, each re-evaluated against the grown queue
            while n < 4 and v.launch_full is not None and self.adm.admits(v.now + v.full_pending_s(), serving):
                v.launch_full()
                n += 1
            self.admitted += n
            if v.serving_active:
                self.admitted_while_serving += n
                if n == 0:
                    self._held_step = v.step_launch
        if self.green_adm is None or not v.serving_active or v.green or v.launch_green is None:
            return
        # the dial: slack of the serving step in flight, from its launch, under the serving model profiled with
        # the confined rollout running beside it
        t_ref = v.step_launch if v.step_launch is not None else v.now
        if self.green_adm.admits(t_ref + v.full_pending_s(), serving):
            v.launch_green()
            self.green_admitted += 1


def run_loop(
    rig: Rig,
    policy: Policy,
    bursts: list[Burst],
    seconds: float,
    t_chunk: float,
    hard_timeout_s: float,
    until_idle: bool = False,
) -> tuple[Recorder, float]:
    """Drive serving bursts and the rollout policy until ``seconds`` (or, with ``until_idle``, until every
    burst is served); return the records and the wall time (including the drain of the rollout work launched
    before the end)."""
    rec = Recorder()
    pending = deque(bursts)
    v = View(t_chunk=t_chunk)
    clock = time.perf_counter
    t0 = clock()
    green_ok = rig.green_stream is not None

    def launch_full() -> None:
        now = clock() - t0
        start = max(now, v.full[-1].pred_end) if v.full else now
        v.full.append(InFlight(rig.chunk(now), start + t_chunk, "full"))

    def launch_green() -> None:
        now = clock() - t0
        v.green.append(InFlight(rig.green(now), now, "green"))

    v.launch_full = launch_full
    v.launch_green = launch_green if green_ok else None
    active: Burst | None = None
    left = 0
    serv: Handle | None = None
    first = False
    while True:
        now = clock() - t0
        if serv is not None and serv.done():
            t_done = clock() - t0
            ms = serv.gpu_ms()
            rec.busy_gpu_ms += ms
            if first:
                rec.first_step_ms.append(ms)
                rec.first_delay_ms.append((t_done - active.arrival) * 1e3 if active else float("nan"))
            else:
                rec.tpot_step_ms.append(ms)
                if v.last_token_at is not None:
                    rec.host_tpot_ms.append((t_done - v.last_token_at) * 1e3)
            v.last_token_at = t_done
            serv, v.step_launch = None, None
            left -= 1
            if left <= 0:
                active, v.serving_active, v.last_token_at = None, False, None
        if serv is None and now < seconds:
            if active is None and pending and pending[0].arrival <= now:
                active = pending.popleft()
                left, v.serving_active, v.arrival, v.last_token_at = active.steps, True, active.arrival, None
            if active is not None:
                first = v.last_token_at is None
                v.step_launch = clock() - t0
                serv = rig.serve(v.step_launch)
        v.now = clock() - t0
        completed = False
        while v.full and v.full[0].handle.done():
            d = v.full.pop(0)
            rec.full_chunks += 1
            completed = True
            policy.done("full", d.handle.t_launch, v.now)
        if completed:
            v.reanchor()
        while v.green and v.green[0].handle.done():
            d = v.green.pop(0)
            rec.green_gemms += 1
            policy.done("green", d.handle.t_launch, v.now)
        finished = v.now >= seconds or (until_idle and not pending and active is None)
        if not finished:
            policy.tick(v)
        elif serv is None:
            break
        if v.now > hard_timeout_s:
            raise TimeoutError(f"scenario loop exceeded {hard_timeout_s:.0f} s")
    rig.sync()
    rec.full_chunks += len(v.full)
    rec.green_gemms += len(v.green)
    v.full.clear()
    v.green.clear()
    return rec, clock() - t0
