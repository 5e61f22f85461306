"""The RL job over a real controller (in-process channel: real serde, wire and auth) with a test executor that
plays FrozenLake moves and applies weight versions, and a recording trainer (``rl_job_peers``). Shows what the job decides:
the version windows of synchronous and asynchronous steps (the next step's rollout runs while this one
trains), dynamic sampling's refill, greedy evaluation on held-out maps, checkpoints and resume."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import msgspec
import pytest
from rl_job_peers import SECRET, CharCodec, Executor, Publisher, Trainer

from rose_core.app.config import RLConfig, RunConfig, SchedulerConfig
from rose_core.app.controller.controller import Controller
from rose_core.app.jobs.external_trainer import ExternalTrainer
from rose_core.app.jobs.rl_job import EVAL_SEED_BASE, RLJob
from rose_core.app.jobs.trainer_batch import RankBatch, decode
from rose_core.app.trainer_client import TrainerBatch
from rose_core.protocol.messages import WeightAnnounce
from rose_core.support.errors import RoseError
from rose_core.testing.inprocess_channel import InProcessServer


@pytest.fixture
def make_job(tmp_path: Path) -> Iterator[Any]:
    made: list[Controller] = []

    def make(policy: Any, *, staleness: int = 0, **rl: Any) -> tuple[RLJob, Executor, Trainer]:
        rl_config = msgspec.convert({"steps": 3, "prompts_per_step": 2, "group_size": 2, "max_turns": 2,
                                     "algorithm": "grpo", "eval": {"every": 0}, "max_tokens_per_turn": 8, **rl},
                                    RLConfig)
        config = RunConfig(rl=rl_config, scheduler=SchedulerConfig(staleness=staleness), run_dir=str(tmp_path))
        ctl = Controller(config, SECRET, server=InProcessServer(SECRET))
        made.append(ctl)
        executor = Executor(ctl, policy).join()
        trainer = Trainer(executor)
        return RLJob(ctl, config, CharCodec(), trainer, Publisher()), executor, trainer

    yield make
    for ctl in made:
        ctl.close()


def always(move: str) -> Any:
    return lambda _msg: move


def by_group(moves: Mapping[str, str], default: str = "up") -> Any:
    """A move for chosen trajectories (an invalid one, ``xyz``, earns less than any move): their group then has
    a reward spread; every other group plays the same move on the same map, so it has none."""
    return lambda msg: next((mv for key, mv in moves.items() if msg.trajectory_id.endswith(key)), default)


def test_a_synchronous_step_runs_every_turn_on_the_version_it_trains_on_top_of(make_job: Any) -> None:
    job, executor, trainer = make_job(always("up"))
    trainer.wait_s, trainer.last_step = 0.3, 3
    reports = [job.run_step(s) for s in (1, 2, 3)]
    assert [r.published_version for r in reports] == [1, 2, 3]
    assert {(r.min_version, r.max_version) for r in executor.requests if r.step == 2} == {(1, 1)}
    assert all(call["thread"] == "MainThread" and not call["next_step_ran"] for call in trainer.calls)
    assert all(r.version_mismatches == 0 and r.lost_trajectories == 0 for r in reports)
    assert all(r.overlap_seconds == 0.0 and r.max_staleness == 0 for r in reports)


def test_an_asynchronous_step_rolls_out_the_next_step_while_it_trains(make_job: Any) -> None:
    job, executor, trainer = make_job(always("up"), staleness=1)
    trainer.wait_s, trainer.last_step = 10.0, 3  # returns as soon as the turn arrives
    reports = [job.run_step(s) for s in (1, 2, 3)]
    step2 = [r for r in executor.requests if r.step == 2]
    assert {(r.min_version, r.max_version) for r in step2} == {(0, 1)}  # trains on top of 1; one version back
    # step 2's turns ran while step 1 trained (off the main thread, the controller pumping)
    assert [call["next_step_ran"] for call in trainer.calls] == [True, True, False]
    assert [call["thread"] for call in trainer.calls] == ["rose-train", "rose-train", "MainThread"]
    assert all(r.version_mismatches == 0 and r.lost_trajectories == 0 for r in reports)
    assert max(r.max_staleness for r in reports) <= 1
    assert reports[0].overlap_seconds > 0.0 and reports[-1].overlap_seconds == 0.0
    assert [r.published_version for r in reports] == [1, 2, 3]


def test_dynamic_sampling_refills_groups_without_reward_spread(make_job: Any) -> None:
    job, executor, trainer = make_job(by_group({"-p0-g0": "xyz"}), sampling={"dynamic_sampling": True,
                                      "max_refill_rounds": 2}, steps=1)
    report = job.run_step(1)
    groups = {r.trajectory_id.rsplit("-g", 1)[0] for r in executor.requests}
    assert groups == {"s1-p0", "s1-p1", "s1-p2", "s1-p3"}  # p1 had no spread: refilled twice (p2, then p3)
    assert report.dropped_groups == 3
    trained = {s.trajectory_id.rsplit("-g", 1)[0] for s in trainer.calls[0]["samples"]}
    assert trained == {"s1-p0"}


def test_without_dynamic_sampling_every_group_is_trained(make_job: Any) -> None:
    job, _, trainer = make_job(by_group({"-p0-g0": "xyz"}), steps=1)
    report = job.run_step(1)
    assert report.dropped_groups == 0
    assert {s.trajectory_id.rsplit("-g", 1)[0] for s in trainer.calls[0]["samples"]} == {"s1-p0", "s1-p1"}


def test_evaluation_plays_held_out_maps_greedily_and_never_trains_on_them(make_job: Any) -> None:
    """On the first step (the weights before any update: where the run starts from), every ``every``-th step, and
    the last step."""
    job, executor, trainer = make_job(always("up"), eval={"every": 3, "maps": 3}, steps=5)
    reports = [job.run_step(step) for step in range(1, 6)]
    assert [r.step for r in reports if r.eval_success is not None] == [1, 3, 5]
    evals = [r for r in executor.requests if "-eval" in r.trajectory_id]
    assert {r.trajectory_id.split("/")[0] for r in evals} == {f"s{s}-eval{i}" for s in (1, 3, 5) for i in range(3)}
    assert all(r.sampling.temperature == 0.0 for r in evals)
    assert all("-eval" not in s.trajectory_id for call in trainer.calls for s in call["samples"])
    assert EVAL_SEED_BASE > 2 * 1_000_003 + 2 * 1000  # held-out seeds never meet training ones


def test_the_job_plays_the_environment_named_in_rl_env(make_job: Any, lake_plugin: Path) -> None:
    job, executor, _ = make_job(always("right"), env="corridor", env_size=3, max_turns=2,
                                eval={"every": 1, "maps": 2}, steps=1)
    report = job.run_step(1)
    assert report.success_rate == 1.0 and report.eval_success == 1.0 and report.lost_trajectories == 0
    prompts = [CharCodec().decode(r.prompt_token_ids.tolist()) for r in executor.requests]
    assert all(p.startswith("Corridor: walk to the exit") for p in prompts) and len(prompts) > 4


def test_an_unknown_environment_stops_the_job_before_it_starts(make_job: Any) -> None:
    with pytest.raises(RoseError, match=r"no environment 'nope' .*\(installed: frozenlake\): pip install"):
        make_job(always("up"), env="nope")


def test_checkpoints_every_n_steps_and_after_the_last(make_job: Any, tmp_path: Path) -> None:
    job, _, _ = make_job(always("up"), checkpoint={"every": 2}, steps=3)
    written = [job.run_step(s).checkpoint for s in (1, 2, 3)]
    assert written[0] == "" and written[1].endswith("step-000002") and written[2].endswith("step-000003")
    assert Path(written[1]).parent == tmp_path / "checkpoints"


def test_resume_ships_the_restored_weights_and_goes_on_with_the_next_version(make_job: Any, tmp_path: Path) -> None:
    job, _, _ = make_job(always("up"), checkpoint={"every": 1}, steps=2)
    saved = [job.run_step(s).checkpoint for s in (1, 2)]
    resumed, executor, trainer = make_job(always("up"), steps=4)
    after = resumed.resume(Path(saved[-1]))
    assert after == 2 and resumed.version == 2 and executor.version == 2 and trainer.steps == 2
    report = resumed.run_step(after + 1)
    assert report.published_version == 3 and report.weight_version == 2
    assert {(r.min_version, r.max_version) for r in executor.requests} == {(2, 2)}



def _pull_every_part(external: ExternalTrainer, out: list[RankBatch]) -> None:
    """An external trainer's rank pulling the step's parts in order until the final one, then the whole batch
    (as a trainer that does not stream gets it), then publishing."""
    part = 0
    while not (out and out[-1].final):
        data = external.next_rank_batch(30.0, 0, 1, after=0, part=part)
        if data is not None:
            out.append(decode(data))
            part += 1
    whole = external.next_rank_batch(0.0, 0, 1, after=0)
    assert whole is not None
    out.append(decode(whole))
    external.published(WeightAnnounce(version=out[-1].publish_version, step=out[-1].step, source="test"))


def test_an_external_trainer_is_offered_each_group_as_it_completes(make_job: Any) -> None:
    """Three groups, s1-p0 and s1-p2 with a reward spread: each is offered as its own part once its last episode
    ends, before the step's end adds the last part (nothing left: empty) marked final; dynamic sampling drops the
    group without spread whole (no part for it), so the parts hold exactly the whole batch."""
    job, _, _ = make_job(by_group({"-p0-g0": "xyz", "-p2-g1": "xyz"}), steps=1, prompts_per_step=3,
                         sampling={"dynamic_sampling": True, "max_refill_rounds": 0})
    external = ExternalTrainer(ranks=1, wake=job.controller.wake)
    job.trainer = external
    pulled: list[RankBatch] = []
    puller = threading.Thread(target=_pull_every_part, args=(external, pulled))
    puller.start()
    report = job.run_step(1)
    puller.join(timeout=30)
    *parts, whole = pulled
    assert report.published_version == 1 and report.dropped_groups == 1
    assert [(p.part, p.final) for p in parts] == [(0, False), (1, False), (2, True)]
    groups = [{t.rsplit("-g", 1)[0] for t in p.row_trajectories} for p in parts]
    assert sorted(map(sorted, groups[:2])) == [["s1-p0"], ["s1-p2"]] and groups[2] == set()
    assert (whole.part, whole.final) == (-1, True)
    assert sorted(_turns(whole)) == sorted(t for p in parts for t in _turns(p))  # the same turns, bit for bit
    assert whole.samples == sum(p.samples for p in parts) == 8


def _turns(batch: RankBatch) -> list[tuple[Any, ...]]:
    return [(s.trajectory_id, s.turn_index, s.prompt_token_ids, s.response_token_ids, s.behaviour_logprobs,
             s.advantage) for s in TrainerBatch(batch).train_samples()]
