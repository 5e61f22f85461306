"""The discrete-event cluster simulator: one engine, every compared system is a configuration of it.

Simulated time only (a heap of events); it drives the real ``ElasticScheduler`` for every turn, the real
``CoServingGuard`` (through the co-serving table) and one real ``ServingFirstMemory`` per borrowed GPU.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

from rose_core.app.sim.co_serving_table import ROLLOUT_CHUNK_TOKENS
from rose_core.app.sim.gpu_model import RooflineModel
from rose_core.app.sim.run_record import RunRecord
from rose_core.app.sim.scenario import Algorithm
from rose_core.app.sim.sim_environment import SimEnvironment
from rose_core.app.sim.sim_worker import RunningTurn, SimWorker
from rose_core.app.sim.system_profile import SystemProfile
from rose_core.app.sim.workload import Trajectory, groups_launched, sample_batch
from rose_core.policy import MemoryPolicyConfig, RolloutMemoryUse, ServingFirstMemory
from rose_core.scheduler import Assignment, ElasticScheduler, TurnTicket
from rose_core.scheduler.scheduler_config import SchedulerConfig

TURN_DONE, ENV_DONE, SYNC_DONE, WORKER_READY, WORKER_LEAVE, MEM_PRESSURE, TRAIN_DONE = range(7)


class ClusterSim:
    def __init__(self, env: SimEnvironment, profile: SystemProfile, algorithm: Algorithm,
                 progress: Callable[[int], None] | None = None, unbounded: bool = False) -> None:
        """``unbounded``: a dedicated GPU for every trajectory a step can have in flight, each running one
        sequence (the critical-path reference: no system with more GPUs can roll a step out faster)."""
        sc = env.scenario
        self.env, self.sc, self.profile, self.algorithm = env, sc, profile, algorithm
        self.unbounded = unbounded
        self.progress = progress
        self.rng = np.random.default_rng(sc.seed + 17)
        self.staleness = sc.workload.async_staleness if profile.asynchronous else 0
        self.sched = ElasticScheduler(SchedulerConfig(
            max_concurrency_per_worker=sc.workload.concurrency_per_worker,
            max_borrowed_workers=sc.cluster.borrowable_gpus // sc.rollout_model.tp, staleness=self.staleness))
        self.rollout = RooflineModel(sc.gpu, sc.rollout_model)
        self.heap: list[tuple[float, int, int, Any, Any, Any]] = []
        self.seq = itertools.count()
        self.now = 0.0
        self.workers: dict[str, SimWorker] = {}
        self.trajectories: dict[str, Trajectory] = {}
        self.record = RunRecord(profile.name, algorithm, sc.workload.batch)
        self.version = 0
        self.remote_version = 0
        self.next_batch = 0
        self.next_train = 0
        self.trainer_busy = False
        self.remaining: dict[int, int] = {}
        self.slot_serial = itertools.count()
        self.slot_worker: dict[int, str] = {}
        """Elastic slot -> its current (joining or live) spot instance or serverless function."""
        self.dirty = True

    # ------------------------------------------------------------------ setup and main loop

    def run(self) -> RunRecord:
        self._add_dedicated()
        if self.profile.elastic == "borrowed":
            self._borrow_serving()
        elif self.profile.elastic == "spot":
            for slot in range(self._slots()):
                self._request_spot(slot)
        self._try_launch()
        self._place()
        handlers = (self._on_turn_done, self._on_env_done, self._on_sync_done, self._on_worker_ready,
                    self._on_worker_leave, self._on_mem_pressure, self._on_train_done)
        while self.heap and self.record.steps < self.sc.workload.steps:
            self.now, _, kind, a, b, c = heapq.heappop(self.heap)
            handlers[kind](a, b, c)
            if self.dirty and self.sched.queue:
                self._place()
        self.record.end_time = self.now
        self.record.counters = dict(self.sched.counters)
        return self.record

    def _push(self, at: float, kind: int, a: Any = None, b: Any = None, c: Any = None) -> None:
        heapq.heappush(self.heap, (at, next(self.seq), kind, a, b, c))

    def _slots(self) -> int:
        return self.sc.cluster.borrowable_gpus // self.sc.rollout_model.tp

    def _add_dedicated(self) -> None:
        cap = 1 if self.unbounded else self.sc.workload.concurrency_per_worker
        for i in range(self._dedicated_workers()):
            wid = f"dedicated{i}"
            self.workers[wid] = SimWorker(wid, "dedicated")
            self.sched.add_worker(0.0, wid, "dedicated", cap, 0)

    def _dedicated_workers(self) -> int:
        if not self.unbounded:
            return self.sc.cluster.dedicated_rollout_gpus // self.sc.rollout_model.tp
        wl = self.sc.workload
        most = max(groups_launched(wl, self.algorithm, s) for s in range(wl.steps)) * wl.group_size
        return most * (1 + self.staleness)

    # ------------------------------------------------------------------ elastic pools

    def _borrow_serving(self) -> None:
        env, cap = self.env, self.sc.workload.concurrency_per_worker
        for cand in env.candidates:
            self.sched.add_worker(0.0, cand.worker_id, "serving", cap, 0)
        chosen = set(self.sched.borrow([(c.worker_id, env.kv_usage_ratio(c)) for c in env.candidates]))
        for wid in chosen:  # activating the pre-deployed rollout model: no rollout headroom yet
            self.sched.observe(0.0, wid, weight_version=0, slo_headroom=False)
        activation = self.sc.elastic.rose_activation_s
        for cand in env.candidates:
            if cand.worker_id not in chosen:
                self.sched.remove_worker(0.0, cand.worker_id, "not borrowed")
                continue
            cls = env.classes[cand.serving_class]
            memory = ServingFirstMemory(self._memory_config(), int(cls.serving_bytes[int(cand.offset)]))
            self.workers[cand.worker_id] = SimWorker(cand.worker_id, "borrowed", cls.curve, cand.offset,
                                                     cand.serving_class, memory, overhead_s=activation)
            self.record.borrowed.append((cand.serving_class, cand.offset))
            self._push(activation, WORKER_READY, cand.worker_id, 0, None)

    def _memory_config(self) -> MemoryPolicyConfig:
        device = int(self.sc.gpu.memory_gib * (1 << 30))
        return MemoryPolicyConfig(device_bytes=device, rollout_weight_bytes=int(self.rollout.weight_bytes))

    def _request_spot(self, slot: int) -> None:
        el = self.sc.elastic
        attempts = int(self.rng.geometric(el.spot_availability))
        delay = float(self.rng.exponential(el.spot_acquire_mean_s, attempts).sum())
        self._join_later(slot, f"spot{slot}.{next(self.slot_serial)}", "spot", delay + el.spot_join_load_s)

    def _start_function(self, slot: int) -> None:
        delay = float(self.rng.exponential(self.sc.elastic.serverless_cold_start_mean_s))
        self._join_later(slot, f"fn{slot}.{next(self.slot_serial)}", "serverless", delay)

    def _join_later(self, slot: int, wid: str, kind: str, delay: float) -> None:
        self.slot_worker[slot] = wid
        total = delay + self._dense_pull_s()
        self.workers[wid] = SimWorker(wid, kind, overhead_s=total, alive=False)
        self.record.overhead_s += total
        self._push(self.now + total, WORKER_READY, wid, 0, self.now)

    def _dense_pull_s(self) -> float:
        return 2 * self.sc.rollout_model.params_b * 1e9 * 8 / (self.sc.cluster.cross_gbps * 1e9)

    def _on_worker_ready(self, wid: str, generation: int, started: float | str | None) -> None:
        w = self.workers[wid]
        cap = self.sc.workload.concurrency_per_worker
        if w.kind == "borrowed":
            self._borrowed_ready(w, relend=started == "relend")
            return
        if w.kind == "serverless" and not self.remaining:
            self.slot_worker.pop(self._slot_of(wid), None)  # the rollout phase ended while it cold-started
            return
        w.alive = True
        self.sched.add_worker(self.now, wid, "dedicated", cap, self.version)
        if w.kind == "spot":
            life = float(self.rng.exponential(self.sc.elastic.spot_lifetime_mean_s))
            self._push(self.now + life, WORKER_LEAVE, wid, w.generation, "preempted")
        else:
            start = started if isinstance(started, float) else self.now
            limit_at = start + self.sc.elastic.serverless_limit_s
            self._push(limit_at, WORKER_LEAVE, wid, w.generation, "time_limit")
        self.dirty = True

    def _borrowed_ready(self, w: SimWorker, *, relend: bool) -> None:
        """A borrowed GPU finished activating (or, ``relend``, its owner lends it again: activate again)."""
        if relend:
            self.sched.lend_again(w.worker_id)
            self.sched.borrow([(w.worker_id, 0.0)], limit=1)
            self.sched.observe(self.now, w.worker_id, weight_version=self.remote_version, slo_headroom=False)
            self._push(self.now + self.sc.elastic.rose_activation_s, WORKER_READY, w.worker_id, w.generation, None)
            return
        self.record.overhead_s += w.overhead_s
        frozen = w.memory.frozen if w.memory is not None else False
        self.sched.observe(self.now, w.worker_id, weight_version=self.remote_version, budget_frozen=frozen)
        self.dirty = True
        mean = self.sc.elastic.rose_revoke_mean_s
        if mean > 0:
            self._push(self.now + float(self.rng.exponential(mean)), WORKER_LEAVE, w.worker_id, w.generation,
                       "revoked")

    def _on_worker_leave(self, wid: str, generation: int, reason: str) -> None:
        w = self.workers[wid]
        if generation != w.generation or not w.alive:
            return
        if w.kind == "borrowed":  # the serving owner takes it back: its turns are re-routed
            w.generation += 1
            w.running.clear()
            self.sched.revoke(self.now, wid)
            self.record.revocations += 1
            self._push(self.now + self.sc.elastic.rose_relend_s, WORKER_READY, wid, w.generation, "relend")
            self.dirty = True
            return
        self._retire(w, reason)
        slot = self._slot_of(wid)
        if w.kind == "spot":
            self._request_spot(slot)
        elif self.remaining:
            self._start_function(slot)

    @staticmethod
    def _slot_of(wid: str) -> int:
        return int(wid.split(".", maxsplit=1)[0].removeprefix("spot").removeprefix("fn"))

    def _retire(self, w: SimWorker, reason: str) -> None:
        self.slot_worker.pop(self._slot_of(w.worker_id), None)
        w.alive = False
        w.generation += 1
        w.running.clear()
        self.sched.remove_worker(self.now, w.worker_id, reason)
        self.dirty = True

    # ------------------------------------------------------------------ RL steps

    def _try_launch(self) -> None:
        steps = self.sc.workload.steps
        while self.next_batch < steps and self.version >= self.next_batch - self.staleness:
            self._launch(self.next_batch)
            self.next_batch += 1

    def _launch(self, batch: int) -> None:
        trajectories = sample_batch(self.sc.seed, self.sc.workload, self.algorithm, batch)
        self.remaining[batch] = len(trajectories)
        self.record.begin_batch(batch, self.now, len(trajectories))
        lo = max(0, batch - self.staleness)
        for traj in trajectories:
            self.trajectories[traj.trajectory_id] = traj
            self.sched.submit(self.now, TurnTicket(f"{traj.trajectory_id}.0", traj.trajectory_id, lo, batch,
                                                   self.now, payload=traj))
        if self.profile.elastic == "borrowed":
            self._rebudget(batch)
        elif self.profile.elastic == "serverless":
            for slot in range(self._slots()):
                if slot not in self.slot_worker:
                    self._start_function(slot)
        self.dirty = True

    def _on_train_done(self, batch: int, _b: Any, _c: Any) -> None:
        self.trainer_busy = False
        self.version = batch + 1
        self.record.end_batch_training(batch, self.now)
        cl, w = self.sc.cluster, self.sc.weights
        dense = 2 * self.sc.rollout_model.params_b * 1e9
        self._push(self.now + dense * 8 / (cl.intra_gbps * 1e9) + w.sync_overhead_s, SYNC_DONE, self.version,
                   "dedicated", None)
        if self.profile.elastic != "none":
            link_s = self._remote_link_bytes(dense) * 8 / (cl.cross_gbps * 1e9)
            self.record.remote_sync_s += link_s
            self._push(self.now + link_s + w.apply_s + w.sync_overhead_s, SYNC_DONE, self.version, "remote", None)
        if self.progress is not None:
            self.progress(self.record.steps)
        self._try_launch()
        self._try_train()

    def _remote_link_bytes(self, dense: float) -> float:
        """Bytes one new version puts on the cross-cluster link (see ``SystemProfile.remote_weights``)."""
        if self.profile.remote_weights == "sparse-relayed":
            return dense * self.sc.weights.sparse_bytes_per_element / 2
        remote = sum(1 for w in self.workers.values() if w.kind != "dedicated" and w.alive)
        return dense * max(1, remote)

    def _try_train(self) -> None:
        b = self.next_train
        if self.trainer_busy or b >= self.next_batch or b in self.remaining:
            return
        self.trainer_busy = True
        self.next_train += 1
        tokens = self.record.training_tokens(b)
        sc = self.sc
        flops = sc.trainer.flops_per_token_factor * sc.rollout_model.params_b * 1e9 * tokens
        seconds = flops / (sc.cluster.training_gpus * sc.gpu.peak_tflops * 1e12 * sc.trainer.mfu)
        self._push(self.now + seconds, TRAIN_DONE, b, None, None)

    def _on_sync_done(self, version: int, group: str, _c: Any) -> None:
        if group == "remote":
            self.remote_version = max(self.remote_version, version)
        for wid, w in self.workers.items():
            if (w.kind == "dedicated") == (group == "dedicated") and wid in self.sched.workers:
                st = self.sched.workers[wid]
                if not st.slo_headroom:
                    continue  # still activating: it takes the newest version when it is ready
                frozen = w.memory.frozen if w.memory is not None else False
                self.sched.observe(self.now, wid, weight_version=version, budget_frozen=frozen)
        self.dirty = True

    # ------------------------------------------------------------------ turns

    def _place(self) -> None:
        self.dirty = False
        for a in self.sched.schedule(self.now):
            self._start_turn(a)

    def _start_turn(self, a: Assignment) -> None:
        traj: Trajectory = a.ticket.payload
        w = self.workers[a.worker_id]
        obs = self.sc.workload.observation_tokens
        warm = traj.turn > 0 and traj.last_worker == a.worker_id
        prefill = obs if warm else traj.context_tokens
        decode = traj.decode_tokens[traj.turn]
        batch = len(w.running) + 1
        ctx = traj.context_tokens + decode / 2
        work = self.rollout.prefill_s(prefill, ROLLOUT_CHUNK_TOKENS) + decode * self.rollout.step_s(batch, 0, ctx)
        kv = int((traj.context_tokens + decode) * self.sc.rollout_model.kv_bytes_per_token / self.sc.rollout_model.tp)
        w.running[a.ticket.turn_id] = RunningTurn(traj.trajectory_id, a.ticket.attempt, self.now, kv)
        self.record.prefill_tokens += prefill
        self._push(w.finish_time(self.now, work), TURN_DONE, a.worker_id, a.ticket.turn_id, a.ticket.attempt)

    def _on_turn_done(self, wid: str, turn_id: str, attempt: int) -> None:
        w = self.workers[wid]
        rt = w.running.get(turn_id)
        if rt is None or rt.attempt != attempt:
            return  # aborted, re-routed or its worker left: this GPU produced nothing
        del w.running[turn_id]
        self.dirty = True
        if self.sched.complete(self.now, wid, turn_id, attempt) != "accepted":
            return
        traj = self.trajectories[rt.trajectory_id]
        decode = traj.decode_tokens[traj.turn]
        traj.context_tokens += decode + self.sc.workload.observation_tokens
        traj.tokens_total += decode
        traj.last_worker = wid
        traj.turn += 1
        if traj.turn < traj.turns:
            self._push(self.now + traj.think_s[traj.turn - 1], ENV_DONE, traj.trajectory_id, None, None)
        else:
            self._finish(traj)

    def _on_env_done(self, trajectory_id: str, _b: Any, _c: Any) -> None:
        traj = self.trajectories[trajectory_id]
        lo = max(0, traj.batch - self.staleness)
        self.sched.submit(self.now, TurnTicket(f"{trajectory_id}.{traj.turn}", trajectory_id, lo, traj.batch,
                                               self.now, payload=traj))
        self.dirty = True

    def _finish(self, traj: Trajectory) -> None:
        traj.done_at = self.now
        self.sched.finish_trajectory(traj.trajectory_id)
        del self.trajectories[traj.trajectory_id]
        self.record.trajectory_done(traj, self.now)
        self.remaining[traj.batch] -= 1
        if self.remaining[traj.batch] == 0:
            del self.remaining[traj.batch]
            self.record.end_batch_rollout(traj.batch, self.now)
            if self.profile.elastic == "serverless" and not self.remaining:
                for w in list(self.workers.values()):
                    if w.kind == "serverless" and w.alive:
                        self._retire(w, "released")
            self._try_train()

    # ------------------------------------------------------------------ serving-first memory

    def _serving_bytes(self, w: SimWorker) -> int:
        cls = self.env.classes[w.serving_class]
        return int(cls.serving_bytes[int(self.now + w.offset) % len(cls.serving_bytes)])

    def _rebudget(self, batch: int) -> None:
        for wid, w in self.workers.items():
            if w.memory is None:
                continue
            w.memory.on_step(batch, self._serving_bytes(w))
            st = self.sched.workers.get(wid)
            if st is not None and st.budget_frozen:
                self.sched.observe(self.now, wid, weight_version=st.weight_version, budget_frozen=False,
                                   slo_headroom=st.slo_headroom)
            self._watch_memory(w, batch)

    def _watch_memory(self, w: SimWorker, batch: int) -> None:
        memory = w.memory
        if memory is None:
            return
        series = self.env.classes[w.serving_class].serving_bytes
        start = int(self.now + w.offset)
        window = np.take(series, np.arange(start, start + 4 * 3600), mode="wrap")
        over = np.flatnonzero(window >= memory.serving_limit_bytes)
        if len(over):
            self._push(self.now + float(over[0]) + 0.5, MEM_PRESSURE, w.worker_id, batch, None)

    def _on_mem_pressure(self, wid: str, batch: int, _c: Any) -> None:
        w = self.workers[wid]
        if w.memory is None or batch != self.next_batch - 1:
            return
        uses = [RolloutMemoryUse(tid, rt.kv_bytes, rt.started_at) for tid, rt in w.running.items()]
        decision = w.memory.observe(self.now, self._serving_bytes(w), uses)
        if not decision.cut:
            return
        self.record.memory_cuts += 1
        for tid in decision.abort:
            rt = w.running.pop(tid)
            self.sched.abort(self.now, wid, tid, rt.attempt, "memory")
        st = self.sched.workers[wid]
        self.sched.observe(self.now, wid, weight_version=st.weight_version, budget_frozen=True,
                           slo_headroom=st.slo_headroom)
        self.dirty = True
