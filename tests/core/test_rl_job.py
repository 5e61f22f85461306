"""The RL job over a real controller (in-process channel: real serde, wire and auth) with a test executor that
plays FrozenLake moves and applies weight versions, and a recording trainer. Shows what the job decides:
the version windows of synchronous and asynchronous steps (the next step's rollout runs while this one
trains), dynamic sampling's refill, greedy evaluation on held-out maps, checkpoints and resume."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest

from rose_core.app.config import RLConfig, RunConfig, SchedulerConfig
from rose_core.app.controller.controller import Controller
from rose_core.app.jobs.rl_job import EVAL_SEED_BASE, RLJob
from rose_core.app.rl.algorithm.sample import TrainSample
from rose_core.protocol import messages as m
from rose_core.protocol.engine_layout import EngineLayout
from rose_core.support.errors import RoseError
from rose_core.testing.inprocess_channel import InProcessClient, InProcessServer

SECRET = b"k" * 32


class CharCodec:
    """One token per character (ids 3..), EOS 2: enough for the episode's text round trip."""

    bos_id = None
    eos_id = 2

    def encode(self, text: str) -> list[int]:
        return [ord(c) + 3 for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(i - 3) for i in ids if i >= 3)


@dataclass
class Executor:
    """A test peer: answers every turn with a move (``policy(turn request) -> move``) on its weight version,
    and applies every announced version."""

    ctl: Controller
    policy: Any
    version: int = 0
    requests: list[m.TurnRequest] = field(default_factory=list)
    client: InProcessClient | None = None

    def join(self, eid: str = "d0") -> Executor:
        self.client = InProcessClient(self.ctl.address, SECRET, eid, on_message=self.on_message)
        self.client.send(m.Hello(peer_id=eid, kind="executor"))
        self.ctl.pump(0)
        self.client.send(m.Register(executor_id=eid, role="dedicated", device="cpu", host="h", models=[],
                                    memory_bytes=1, rollout_capacity=64, weight_version=0))
        self.ctl.pump(0)
        return self

    def on_message(self, _peer: bytes, msg: object) -> None:
        assert self.client is not None
        if isinstance(msg, m.TurnRequest):
            self.requests.append(msg)
            tokens = [*CharCodec().encode(self.policy(msg)), CharCodec.eos_id]
            self.client.send(m.TurnResult(
                turn_id=msg.turn_id, trajectory_id=msg.trajectory_id, attempt=msg.attempt, executor_id="d0",
                weight_version=self.version, output_token_ids=np.array(tokens, dtype=np.int32),
                output_logprobs=np.full(len(tokens), -0.5, dtype=np.float32), finish_reason="stop"))
        elif isinstance(msg, m.WeightAnnounce):
            self.version = msg.version
            self.client.send(m.WeightApplied(executor_id="d0", version=msg.version, seconds=0.0, bytes_received=1))


@dataclass
class Trainer:
    """Records what it trained on and on which thread; its checkpoints are JSON files."""

    executor: Executor
    calls: list[dict[str, Any]] = field(default_factory=list)
    steps: int = 0
    wait_s: float = 0.0
    last_step: int = 0
    """How long a step waits for a turn of the next step to reach the executor (synchronous steps: it
    cannot, the next step starts after this one returns; asynchronous: it does, as soon as the job pumps)."""

    def train_step(self, samples: list[TrainSample]) -> Any:
        self.steps += 1
        step = max(int(s.trajectory_id.split("-")[0][1:]) for s in samples)
        self.calls.append({"samples": samples, "thread": threading.current_thread().name,
                           "next_step_ran": self._next_step_runs(step + 1)})
        return None

    def _next_step_runs(self, step: int) -> bool:
        """Whether a turn of ``step`` reaches the executor while this step trains (given ``wait_s``)."""
        deadline = time.monotonic() + (self.wait_s if step <= self.last_step else 0.0)
        while True:
            if any(r.step == step for r in self.executor.requests):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    def export_weights(self) -> dict[str, Any]:
        return {"w": self.steps}

    def engine_layout(self) -> EngineLayout:
        return EngineLayout(engine="vllm")

    def save_checkpoint(self, root: Path, *, step: int, weight_version: int, keep: int, extra: Mapping[str, Any],
                        rl: Mapping[str, Any]) -> Path:
        root.mkdir(parents=True, exist_ok=True)
        path = root / f"step-{step:06d}"
        path.write_text(f"{step} {weight_version} {self.steps}")
        return path

    def load_checkpoint(self, path: Path) -> Any:
        step, version, steps = (int(x) for x in path.read_text().split())
        self.steps = steps
        return type("State", (), {"step": step, "weight_version": version})()


class Publisher:
    def publish(self, version: int, step: int, tensors: Mapping[str, Any], *,
                layout: EngineLayout | None = None) -> m.WeightAnnounce:
        return m.WeightAnnounce(version=version, step=step, source="test")

    def start_relay(self, relay_id: str, *, transport: str = "tcp") -> Any:
        raise NotImplementedError("no relays in this test")

    def close(self) -> None:
        return None


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
    job, executor, trainer = make_job(always("up"), eval={"every": 2, "maps": 3}, steps=2)
    first, second = job.run_step(1), job.run_step(2)
    assert first.eval_success is None and second.eval_success is not None
    evals = [r for r in executor.requests if "-eval" in r.trajectory_id]
    assert {r.trajectory_id.split("/")[0] for r in evals} == {"s2-eval0", "s2-eval1", "s2-eval2"}
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
