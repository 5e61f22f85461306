"""`rose sim --bench-scheduler`: the latency of one routing decision of the real ElasticScheduler.

Setup: ``workers`` workers (a quarter dedicated, the rest borrowed serving workers, cap 16) with
``trajectories`` trajectories in flight, one turn each. Each measured decision is the steady-state cycle of
a multi-turn rollout: a running turn completes (untimed), the next turn of the same trajectory is submitted
(untimed), and ``schedule(now)`` places it (timed with ``perf_counter_ns``, one placement per call: the time
includes the queue pop, the pick and the bookkeeping). Every ``observe_every`` decisions one serving worker's
load report flips its SLO headroom (untimed), so the index keeps changing as in a live fleet.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from rose_core.scheduler import ElasticScheduler, TurnTicket
from rose_core.scheduler.scheduler_config import SchedulerConfig


@dataclass(slots=True, frozen=True)
class BenchResult:
    workers: int
    trajectories_in_flight: int
    decisions: int
    decision_p50_us: float
    decision_p99_us: float
    decision_max_us: float
    least_loaded_p50_us: float
    least_loaded_p99_us: float

    def to_dict(self) -> dict[str, float | int]:
        return {name: getattr(self, name) for name in self.__slots__}


def _percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def _fleet(workers: int, trajectories: int) -> ElasticScheduler:
    s = ElasticScheduler(SchedulerConfig(max_concurrency_per_worker=16, max_borrowed_workers=workers))
    dedicated = workers // 4
    for i in range(workers):
        s.add_worker(0.0, f"w{i}", "dedicated" if i < dedicated else "serving", 16, 0)
    s.borrow([(f"w{i}", 0.0) for i in range(dedicated, workers)])
    for t in range(trajectories):
        s.submit(0.0, TurnTicket(f"x{t}.0", f"x{t}", 0, 0, 0.0))
    placed = s.schedule(0.0)
    if len(placed) != trajectories:
        raise RuntimeError(f"only {len(placed)} of {trajectories} trajectories placed")
    return s


def bench_scheduler(workers: int = 1000, trajectories: int = 10_000, decisions: int = 20_000,
                    observe_every: int = 10, seed: int = 0) -> BenchResult:
    """Two runs: with the affinity table (the common case: the next turn goes back to the warm worker),
    and with every trajectory's affinity forgotten (each decision is a least-loaded pick)."""
    warm = _decision_samples(workers, trajectories, decisions, observe_every, seed, affinity=True)
    cold = _decision_samples(workers, trajectories, decisions, observe_every, seed, affinity=False)
    return BenchResult(workers, trajectories, decisions, round(_percentile(warm, 0.5), 2),
                       round(_percentile(warm, 0.99), 2), round(warm[-1], 2),
                       round(_percentile(cold, 0.5), 2), round(_percentile(cold, 0.99), 2))


def _decision_samples(workers: int, trajectories: int, decisions: int, observe_every: int, seed: int,
                      *, affinity: bool) -> list[float]:
    rng = random.Random(seed)
    s = _fleet(workers, trajectories)
    turn_of = {f"x{t}": 0 for t in range(trajectories)}
    running = [f"x{t}" for t in range(trajectories)]
    serving = [w for w in s.workers if s.workers[w].pool == "serving"]
    samples: list[float] = []
    now = 0.0
    for i in range(decisions):
        now += 0.001
        k = rng.randrange(len(running))
        traj = running[k]
        turn_id = f"{traj}.{turn_of[traj]}"
        s.complete(now, s.where(turn_id) or "", turn_id, 0)
        turn_of[traj] += 1
        if not affinity:
            s.finish_trajectory(traj)
        s.submit(now, TurnTicket(f"{traj}.{turn_of[traj]}", traj, 0, 0, now))
        if i % observe_every == 0:
            wid = rng.choice(serving)
            s.observe(now, wid, weight_version=0, slo_headroom=rng.random() < 0.9)
        t0 = time.perf_counter_ns()
        placed = s.schedule(now)
        samples.append((time.perf_counter_ns() - t0) / 1000.0)
        if len(placed) != 1:
            s.observe(now, serving[0], weight_version=0)  # keep capacity; this sample still counts
    samples.sort()
    return samples
