"""One RL job over the controller: rollout (turn by turn, routed by the scheduler), train, ship weights.

The job plugs into the controller's one loop (``ControlLoop``) through its hooks (``on_result``, ``on_tick``,
``status``) and runs each step as a script that waits on futures: the rollout complete, the training done, the
version applied everywhere. Hooks never wait; the script never handles a message itself.

Version semantics: the generated model is version 0; step ``s`` trains on top of version ``s - 1`` and
publishes version ``s``. Every turn carries the window of versions it may run on, ``[T - staleness, T]`` with
``T`` the version its step trains on top of; the controller refuses a result outside it (``version_mismatches``).
A turn given up (failed past ``scheduler.turn_retries``) drops its trajectory (``failed_trajectories``).

Synchronous (``scheduler.staleness = 0``): rollout on ``s - 1`` -> train -> ship ``s``. Asynchronous
(``staleness >= 1``): once step ``s``'s rollout is done, step ``s + 1``'s starts at once (on ``s - 1``, window
``[s - staleness, s]``) and runs while step ``s`` trains (in a thread; the loop keeps going) and ships; the
trainer's decoupled-PPO correction uses each turn's behaviour logprobs, so turns one version old are trained
correctly. One step ahead at most.

Dynamic sampling (``rl.sampling.dynamic_sampling``): groups whose rewards are all equal are dropped and new groups
rolled out in their place, at most ``rl.sampling.max_refill_rounds`` times a step. Evaluation (``rl.eval.every``):
held-out maps played greedily beside the step's rollout, never trained on: on the first step (the weights before
any update, the run's starting point), every ``every``-th step and the last one. Checkpoints
(``rl.checkpoint.every``) after the step's weights shipped; ``resume`` continues from one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from rose_core.app.config import RunConfig
from rose_core.app.controller.control_loop import ControlLoop
from rose_core.app.controller.controller import Controller
from rose_core.app.controller.controller_metrics import STEP_SECONDS
from rose_core.app.controller.job_hooks import AcceptedTurn, JobStatus, TurnPayload
from rose_core.app.jobs.external_trainer import ExternalTrainer
from rose_core.app.jobs.host_slo import Judged, judged, judged_since
from rose_core.app.jobs.serving_window import ServingTraffic
from rose_core.app.jobs.step_report import StepReport, prefix_hit_ratio, share, train_figures
from rose_core.app.jobs.step_rollout import StepRollout
from rose_core.app.jobs.trainer_protocol import Trainer
from rose_core.app.rl.algorithm.grpo import build_samples_from_config, informative_groups
from rose_core.app.rl.algorithm.sample import TrainSample
from rose_core.app.rl.algorithm.trajectory import Trajectory
from rose_core.app.rl.environments.codec import TextCodec
from rose_core.app.rl.environments.episode import Episode
from rose_core.app.rl.environments.registry import load_environment
from rose_core.app.weight_publisher import WeightPublisher, WeightRelay
from rose_core.protocol.messages import SamplingParams, StepStarted, StepStatus, WeightAnnounce
from rose_core.scheduler import GivenUp, TurnTicket
from rose_core.support.errors import RoseError

log = logging.getLogger(__name__)
PROGRESS_S = 0.5
"""How often the step's status is refreshed while its rollout runs."""

EVAL_SEED_BASE = 10**12
"""Seeds of the held-out evaluation maps (training seeds, ``rl.seed * 1_000_003 + step * 1000 + p``, stay far
below for any realistic seed and step count)."""


class RLJob:
    """``loop``: the controller's loop to wait on (the launcher's, with its watchdogs); by default one of the
    job's own with ``watchdog`` as its watchdog."""

    def __init__(
        self,
        controller: Controller,
        config: RunConfig,
        codec: TextCodec,
        trainer: Trainer | ExternalTrainer,
        publisher: WeightPublisher,
        serving: ServingTraffic | None = None,
        watchdog: Callable[[], None] | None = None,
        on_progress: Callable[[StepStatus], None] | None = None,
        relays: Mapping[str, WeightRelay] | None = None,
        loop: ControlLoop | None = None,
    ) -> None:
        self.controller = controller
        self.config = config
        self.codec = codec
        self.trainer = trainer
        self.publisher = publisher
        self.serving = serving
        self.loop = loop or ControlLoop(controller, [watchdog] if watchdog else [])
        self.on_progress = on_progress or (lambda _status: None)
        self.relays = dict(relays or {})
        self.make_env = self._environment()
        self.version = 0
        self.step_status: StepStatus | None = None
        self.history: list[StepStatus] = []
        self._rollout: StepRollout | None = None
        """The newest rollout started: the one results go to."""
        self._next: StepRollout | None = None
        """The next step's rollout, started while this step trains (asynchronous steps)."""
        self._rolling_out: StepRollout | None = None
        """The rollout the step's script waits for (its status is refreshed every ``PROGRESS_S``)."""
        self._last_progress = 0.0
        self._link_before: dict[str, int] = {}
        self.closers: list[Callable[[], None]] = []
        self._external: WeightAnnounce | None = None
        """The version an external trainer published this step (``rl.trainer = "external"``)."""
        self._prefix_before: tuple[dict[str, int], dict[str, int]] = ({}, {})
        self._judged_before: Judged = {}
        controller.attach(self)

    def _environment(self) -> Any:
        """The factory of the job's episodes (``rl.env``)."""
        return load_environment(self.config.rl.env)

    def close(self) -> None:
        """Stop what the job started beside the controller (the trainer API, the gateway), newest first."""
        while self.closers:
            self.closers.pop()()

    # ---------------------------------------------------------------- the loop's hooks

    def on_result(self, accepted: AcceptedTurn) -> None:
        rollout = self._rollout
        res = accepted.result
        if rollout is None or res.trajectory_id not in rollout.open:
            return
        rollout.count(accepted)
        episode = rollout.episodes[res.trajectory_id]
        episode.advance(res.output_token_ids.tolist(), res.output_logprobs.tolist(), res.weight_version,
                        temperature=self._temperature(rollout, res.trajectory_id))
        if episode.done:
            rollout.open.discard(res.trajectory_id)
            self.controller.finish_trajectory(res.trajectory_id)
            self._offer_settled(rollout, episode.trajectory.group_id)
            rollout.check_complete(not rollout.open)
        else:
            self._submit_turn(rollout, res.trajectory_id)

    def on_given_up(self, given_up: GivenUp) -> None:
        """A turn nothing will run: its trajectory is dropped from the step (counted in ``failed_trajectories``)."""
        rollout, tid = self._rollout, given_up.ticket.trajectory_id
        if rollout is None or tid not in rollout.open:
            return
        rollout.open.discard(tid)
        rollout.failed += 1
        self.controller.finish_trajectory(tid)
        self._offer_settled(rollout, rollout.episodes[tid].trajectory.group_id)
        rollout.check_complete(not rollout.open)

    def on_tick(self, now: float) -> None:
        rollout = self._rolling_out
        if rollout is not None and time.monotonic() - self._last_progress > PROGRESS_S:
            self._last_progress = time.monotonic()
            self._set_phase(rollout, "rollout")

    def status(self) -> JobStatus:
        return JobStatus(self.step_status, tuple(self.history))

    # ---------------------------------------------------------------- one step

    def run_step(self, step: int) -> StepReport:
        started = time.monotonic()
        stats = self.controller.stats
        moved_before = (stats.reroutes, stats.overdue, stats.held_moved)
        refused_before = dict(stats.refused_results)
        self._prefix_before = (dict(stats.prompt_tokens_by_role), dict(stats.prefix_hit_tokens_by_role))
        self._judged_before = judged(self.controller.executors.values())
        self.controller.open_borrowing()
        rollout, self._next = self._next or self._start_rollout(step), None
        deadline = time.monotonic() + self.config.rl.turn_timeout_s * self.config.rl.max_turns
        self._drive(rollout, deadline)
        if self.config.rl.sampling.dynamic_sampling:
            self._refill(rollout, deadline)
        rollout_s = time.monotonic() - started
        everything = rollout.finished()
        trained = informative_groups(everything)[0] if self.config.rl.sampling.dynamic_sampling else everything
        if self.config.scheduler.staleness > 0 and step < self.config.rl.steps:
            self._next = self._start_rollout(step + 1, ahead=True)
        self._set_phase(rollout, "train")
        train_stats, train_s = self._train(build_samples_from_config(trained, self.config.rl), rollout)
        self._set_phase(rollout, "weight_sync")
        sync_s, sync_bytes = self._ship_weights(step)
        ended = time.monotonic()
        for phase, secs in (("rollout", rollout_s), ("train", train_s), ("weight_sync", sync_s)):
            STEP_SECONDS.labels(phase).observe(secs)
        report = self._report(rollout, everything, rollout_s, train_s, sync_s, sync_bytes, (started, ended))
        report.turns_rerouted, report.turns_overdue, report.turns_held_moved = (
            now - before for now, before in zip((stats.reroutes, stats.overdue, stats.held_moved), moved_before, strict=True)
        )
        refused = {k: n - refused_before.get(k, 0) for k, n in stats.refused_results.items()}
        report.refused_results, report.version_mismatches = sum(refused.values()), refused.get("version", 0)
        report.train = train_figures(train_stats)
        report.train_loss = float(report.train.get("loss") or 0.0)
        report.max_staleness = max((self.version - 1 - t.weight_version for tr in trained for t in tr.turns), default=0)
        report.overlap_seconds = train_s + sync_s if self._next is not None else 0.0
        report.step_seconds = ended - started
        report.sync_breakdown = self.controller.last_sync
        report.link_bytes = {name: relay.upstream_bytes - self._link_before.get(name, 0)
                             for name, relay in self.relays.items()}
        report.checkpoint = self.checkpoint(step, report)
        self._finish_status(rollout, report)
        return report

    def resume(self, path: Path) -> int:
        """Continue from a checkpoint (a ``step-NNNNNN`` folder or a directory of them): restore the trainer,
        ship its weights to every executor (a full sync), and return the step it was taken after."""
        trainer = self._own_trainer()
        state = trainer.load_checkpoint(path)
        weights = trainer.export_weights()
        announce = self.publisher.publish(state.weight_version, state.step, weights, layout=trainer.engine_layout())
        self._ship(announce)
        self.version = announce.version
        return int(state.step)

    # ---------------------------------------------------------------- train

    def _train(self, samples: list[TrainSample], rollout: StepRollout) -> tuple[Any, float]:
        """One trainer step: inline, or in a thread while the loop runs (the next step's rollout goes on); with
        an external trainer, the wait until it published the next version."""
        t0 = time.monotonic()
        if isinstance(self.trainer, ExternalTrainer):
            self.trainer.offer(rollout.step, self.version, samples, rollout.finished())
            version, timeout = self.version + 1, self.config.rl.trainer.timeout_s
            self._external = self.loop.result(self.trainer.published_version(version), timeout,
                                              lambda: self.trainer.timed_out(version, timeout))  # type: ignore[union-attr]
            return None, time.monotonic() - t0
        if not samples:
            log.warning("step %d: no samples to train on (every group dropped); the weights stay as they are",
                        rollout.step)
            return None, 0.0
        if self._next is None:  # nothing else runs meanwhile: train on this thread
            return self.trainer.train_step(samples), time.monotonic() - t0
        trainer = self.trainer
        training = self.loop.run_in_thread(lambda: trainer.train_step(samples), "rose-train")
        self.loop.wait(training)
        return training.result(), time.monotonic() - t0

    def _own_trainer(self) -> Trainer:
        """ROSE's trainer (checkpoints, exports); an external trainer does those itself."""
        if isinstance(self.trainer, ExternalTrainer):
            raise RoseError("this needs ROSE's trainer (rl.trainer = \"reference\"): the external trainer "
                            "checkpoints and publishes its weights itself")
        return self.trainer

    def checkpoint(self, step: int, report: StepReport, *, last: bool = False) -> str:
        """Checkpoint after ``step`` when ``rl.checkpoint.every`` asks for it, or when it is the run's last (``last``:
        a run stopped early); the checkpoint's path, or ``""``."""
        every = self.config.rl.checkpoint.every
        if every <= 0 or (step % every and step != self.config.rl.steps and not last):
            return ""
        rl = self.config.rl
        root = Path(rl.checkpoint.dir or Path(self.config.run_dir) / "checkpoints")
        path = self._own_trainer().save_checkpoint(root, step=step, weight_version=self.version, keep=rl.checkpoint.keep,
                                                   extra={"reward_mean": report.reward_mean}, rl=msgspec.to_builtins(rl))
        log.info("step %d: checkpoint %s", step, path)
        return str(path)

    # ---------------------------------------------------------------- rollout

    def _start_rollout(self, step: int, *, ahead: bool = False) -> StepRollout:
        """Step ``step``'s rollout; ``ahead``: started before the current step's weights shipped (asynchronous),
        so it trains on top of one version newer than the newest now."""
        rl = self.config.rl
        top = self.version + (1 if ahead else 0)
        rollout = StepRollout(step, self.version, (max(0, top - self.config.scheduler.staleness), top))
        self._rollout = rollout
        self.controller.broadcast(StepStarted(step=step, weight_version=self.version))
        self._add_groups(rollout, rl.prompts_per_step)
        if self._evaluates(step):
            self._add_evals(rollout)
        self._set_phase(rollout, "rollout")
        return rollout

    def _add_groups(self, rollout: StepRollout, count: int) -> None:
        rl = self.config.rl
        rollout.reopen()
        for p in range(rollout.groups, rollout.groups + count):
            seed = rl.seed * 1_000_003 + rollout.step * 1000 + p
            for g in range(rl.group_size):
                self._add_episode(rollout, f"s{rollout.step}-p{p}-g{g}", f"s{rollout.step}-p{p}", seed)
        rollout.groups += count

    def _evaluates(self, step: int) -> bool:
        """Whether step ``step`` plays the held-out maps: the first (on the weights before any update: where the run
        starts from), every ``rl.eval.every``-th, and the last."""
        every = self.config.rl.eval.every
        return every > 0 and (step == 1 or step % every == 0 or step == self.config.rl.steps)

    def _add_evals(self, rollout: StepRollout) -> None:
        for i in range(self.config.rl.eval.maps):
            tid = f"s{rollout.step}-eval{i}"
            rollout.evals.add(tid)
            self._add_episode(rollout, tid, f"s{rollout.step}-eval", EVAL_SEED_BASE + i)

    def _add_episode(self, rollout: StepRollout, tid: str, group: str, seed: int) -> None:
        rl = self.config.rl
        env = self.make_env(seed, rl)
        rollout.episodes[tid] = Episode(tid, group, env, self.codec, rl.max_context_tokens)
        if tid not in rollout.evals:
            rollout.members.setdefault(group, []).append(tid)
        rollout.open.add(tid)
        self._submit_turn(rollout, tid)

    def _refill(self, rollout: StepRollout, deadline: float) -> None:
        """Dynamic sampling: roll out new groups for those with no reward spread, at most ``max_refill_rounds``."""
        rl = self.config.rl
        for _ in range(rl.sampling.max_refill_rounds):
            kept, dropped = informative_groups(rollout.finished())
            missing = rl.prompts_per_step - len({t.group_id for t in kept})
            if missing <= 0 or time.monotonic() >= deadline:
                break
            log.info("step %d: %d groups without reward spread; rolling out %d more", rollout.step, len(dropped),
                     missing)
            self._add_groups(rollout, missing)
            self._drive(rollout, deadline)
        rollout.dropped = len(informative_groups(rollout.finished())[1])

    def _offer_settled(self, rollout: StepRollout, group_id: str) -> None:
        """An external trainer gets a group's samples as soon as none of its episodes is open (ROSE's own trainer
        takes the whole batch at the step's end: nothing to do here)."""
        if not isinstance(self.trainer, ExternalTrainer):
            return
        group = rollout.settle(group_id)
        if group is not None:
            self._offer_group(rollout, group)

    def _offer_group(self, rollout: StepRollout, group: list[Trajectory]) -> None:
        """A complete group's samples to an external trainer, before the step ends (``ExternalTrainer.
        offer_groups``): what the step's batch will hold of it (its advantages are its own; dynamic sampling
        drops it whole or keeps it whole)."""
        if not isinstance(self.trainer, ExternalTrainer) or not group:
            return
        if self.config.rl.sampling.dynamic_sampling:
            group = informative_groups(group)[0]
        self.trainer.offer_groups(rollout.step, rollout.window[1], build_samples_from_config(group, self.config.rl))

    def _temperature(self, rollout: StepRollout, trajectory_id: str) -> float:
        """Held-out maps are played greedily; every other turn at ``rl.sampling.temperature``."""
        return 0.0 if trajectory_id in rollout.evals else self.config.rl.sampling.temperature

    def _submit_turn(self, rollout: StepRollout, trajectory_id: str) -> None:
        k = rollout.turn_counts.get(trajectory_id, 0)
        rollout.turn_counts[trajectory_id] = k + 1
        rl = self.config.rl
        lo, hi = rollout.window
        prompt = np.asarray(rollout.episodes[trajectory_id].prompt(), dtype=np.int32)
        temperature = self._temperature(rollout, trajectory_id)
        payload = TurnPayload(prompt, SamplingParams(max_tokens=rl.max_tokens_per_turn, temperature=temperature),
                              rollout.step)
        self.controller.submit_turn(TurnTicket(f"{trajectory_id}/t{k}", trajectory_id, lo, hi,
                                               time.monotonic(), payload=payload))

    def _drive(self, rollout: StepRollout, deadline: float) -> None:
        """Wait until every trajectory of ``rollout`` is done, or the deadline."""
        rollout.check_complete(not rollout.open)
        self._rolling_out = rollout
        try:
            self.loop.wait(rollout.complete, deadline)
        finally:
            self._rolling_out = None
        if rollout.open:
            log.error("step %d: %d trajectories did not finish before the deadline", rollout.step, len(rollout.open))

    def _set_phase(self, rollout: StepRollout, phase: str, report: StepReport | None = None) -> None:
        total = len(rollout.episodes)
        running, queued = self.controller.turns_in_flight()
        status = StepStatus(
            step=rollout.step, phase=phase, weight_version=rollout.version, trajectories_total=total,
            trajectories_done=total - len(rollout.open), turns_in_flight=running, turns_queued=queued,
        )
        if report is not None:
            status.reward_mean, status.success_rate = report.reward_mean, report.success_rate
            status.eval_success = report.eval_success
            status.rollout_seconds, status.train_seconds = report.rollout_seconds, report.train_seconds
            status.sync_seconds = report.sync_seconds
        self.step_status = status
        self.on_progress(status)

    def _finish_status(self, rollout: StepRollout, report: StepReport) -> None:
        self._set_phase(rollout, "done", report)
        if self.step_status is not None:
            self.history.append(self.step_status)
        if self._next is not None:  # the next step's rollout is what runs now
            self._set_phase(self._next, "rollout")

    # ---------------------------------------------------------------- weights

    def _ship_weights(self, step: int) -> tuple[float, int]:
        self._link_before = {name: relay.upstream_bytes for name, relay in self.relays.items()}
        t0 = time.monotonic()
        if self._external is not None:  # published by the external trainer (its time is the step's train_s)
            announce, self._external, export_s, publish_s = self._external, None, 0.0, 0.0
        else:
            trainer = self._own_trainer()
            weights = trainer.export_weights()
            export_s = time.monotonic() - t0
            announce = self.publisher.publish(self.version + 1, step, weights, layout=trainer.engine_layout())
            publish_s = time.monotonic() - t0
        applied = self._ship(announce, publish_s=publish_s, export_s=export_s)
        self.version = announce.version
        return time.monotonic() - t0, sum(a.bytes_received for a in applied.values())

    def _ship(self, announce: WeightAnnounce, publish_s: float = 0.0, export_s: float = 0.0) -> dict[str, Any]:
        """Announce a version and wait for the executors; one whose apply failed is taken out of the job (its
        engine rolled back); the job goes on on the rest, or on hosts that come back (a new lease, caught up)."""
        weight_round = self.controller.announce_weights(announce, publish_s=publish_s, export_s=export_s)
        applied = self.loop.result(weight_round.future, self.config.rl.weight_sync_timeout_s, weight_round.timed_out)
        failed = {eid: a.error for eid, a in applied.items() if not a.ok}
        for eid, error in failed.items():
            self.controller.retire(eid, f"weight version {announce.version} failed: {error}")
        if failed and not self.controller.executors and not self.controller.registry.returning:
            raise RuntimeError(f"weight version {announce.version} failed on every executor: {failed}")
        return {eid: a for eid, a in applied.items() if eid not in failed}

    # ---------------------------------------------------------------- report

    def _report(
        self, rollout: StepRollout, trajectories: list[Trajectory], rollout_s: float, train_s: float, sync_s: float,
        sync_bytes: int, span: tuple[float, float],
    ) -> StepReport:
        rewards = [t.total_reward for t in trajectories]
        evals = rollout.finished(evals=True)
        slo = self.config.slo
        window = self.serving.window(span[0], span[1], slo.ttft_ms, slo.tpot_ms) if self.serving else None
        hosts_judged, hosts_over = judged_since(judged(self.controller.executors.values()), self._judged_before)
        return StepReport(
            step=rollout.step, weight_version=rollout.version, trajectories=len(trajectories),
            turns_dedicated=rollout.by_role.get("dedicated", 0), turns_serving=rollout.by_role.get("serving", 0),
            reward_mean=float(np.mean(rewards)) if rewards else 0.0, rollout_seconds=rollout_s,
            train_seconds=train_s, sync_seconds=sync_s, sync_bytes=sync_bytes,
            serving_requests=window.requests if window else 0,
            serving_ttft_p99_ms=window.ttft_p99_ms if window else 0.0,
            serving_tpot_p99_ms=window.tpot_p99_ms if window else 0.0,
            serving_slo_violations=hosts_over + (window.failed if window else 0), serving_slo_judged=hosts_judged,
            lost_trajectories=len(rollout.open), failed_trajectories=rollout.failed,
            published_version=self.version, prefix_hit_ratio=prefix_hit_ratio(self.controller.stats, self._prefix_before),
            success_rate=share(t.success for t in trajectories),
            eval_success=share(t.success for t in evals) if rollout.evals else None,
            dropped_groups=rollout.dropped, groups=rollout.groups,
        )
