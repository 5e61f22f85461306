"""The gateway job over a real controller (in-process channel) and a test executor, agents calling it over real
HTTP: an external trainer gets each group as the step takes it, before the step ends; a call whose turn runs
past ``gateway.turn_timeout_s`` gets a 504 and its turn is withdrawn from the executor running it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from rl_job_peers import SECRET, CharCodec, Executor, Publisher

from rose_core.app.config import ControllerConfig, GatewayConfig, RLConfig, RunConfig, SchedulerConfig
from rose_core.app.controller.controller import Controller
from rose_core.app.jobs.external_trainer import ExternalTrainer
from rose_core.app.jobs.gateway_job import GatewayJob
from rose_core.app.jobs.trainer_batch import RankBatch, decode
from rose_core.protocol import messages as m
from rose_core.testing.inprocess_channel import InProcessServer

KEY = "g" * 32
GROUP_SIZE = 2


@pytest.fixture
def make_job(tmp_path: Path) -> Iterator[Any]:
    made: list[tuple[Controller, GatewayJob]] = []

    def make(policy: Any, hung: bool = False, **gateway: Any) -> tuple[GatewayJob, Executor, ExternalTrainer]:
        rl = msgspec.convert({"env": "gateway", "steps": 1, "prompts_per_step": 2, "group_size": GROUP_SIZE,
                              "algorithm": "grpo", "eval": {"every": 0}, "max_tokens_per_turn": 8,
                              "trainer": {"kind": "external"}}, RLConfig)
        config = RunConfig(rl=rl, scheduler=SchedulerConfig(staleness=0), run_dir=str(tmp_path),
                           gateway=GatewayConfig(**gateway),
                           controller=ControllerConfig(stall_timeout_s=600.0))  # the test executor never beats
        ctl = Controller(config, SECRET, server=InProcessServer(SECRET))
        executor = (HungExecutor if hung else Executor)(ctl, policy).join()
        trainer = ExternalTrainer(ranks=1, wake=ctl.wake)
        job = GatewayJob(ctl, config, CharCodec(), trainer, Publisher(), policy_dir=tmp_path / "no-policy", key=KEY)
        made.append((ctl, job))
        return job, executor, trainer

    yield make
    for ctl, job in made:
        job.close()
        ctl.close()


def _agents(url: str, groups: list[str]) -> threading.Thread:
    """One thread playing each group's sessions in turn: a call (a token-id prompt), then rewards 0 and 1."""
    auth = {"Authorization": f"Bearer {KEY}"}

    def play() -> None:
        with httpx.Client(base_url=url, headers=auth, timeout=30) as http:
            for group in groups:
                for reward in range(GROUP_SIZE):
                    session = http.post("/sessions", json={"group": group}).json()["session_id"]
                    http.post(f"/sessions/{session}/v1/completions",
                              json={"model": "policy", "prompt": [5, 6, 7]}).raise_for_status()
                    http.post(f"/sessions/{session}/reward", json={"reward": float(reward)}).raise_for_status()

    thread = threading.Thread(target=play, daemon=True)
    thread.start()
    return thread


def test_an_external_trainer_gets_each_gateway_group_as_the_step_takes_it(make_job: Any) -> None:
    job, _, trainer = make_job(lambda _msg: "up")
    parts: list[RankBatch] = []

    def pull() -> None:
        while not (parts and parts[-1].final):
            data = trainer.next_rank_batch(30.0, 0, 1, after=0, part=len(parts))
            if data is not None:
                parts.append(decode(data))
        trainer.published(m.WeightAnnounce(version=parts[-1].publish_version, step=1, source="test"))

    puller = threading.Thread(target=pull, daemon=True)
    puller.start()
    agents = _agents(job.server.url, ["a", "b"])
    report = job.run_step(1)
    agents.join(timeout=30)
    puller.join(timeout=30)
    assert report.published_version == 1 and report.trajectories == 2 * GROUP_SIZE
    assert [(p.part, p.final, p.samples) for p in parts] == [(0, False, GROUP_SIZE), (1, False, GROUP_SIZE),
                                                             (2, True, 0)]
    groups = [{tid for tid in p.row_trajectories} for p in parts[:2]]
    assert all(len(g) == GROUP_SIZE for g in groups) and not groups[0] & groups[1]


@dataclass
class HungExecutor(Executor):
    """An executor whose engine hangs: it takes turns and never answers; it records the cancellations."""

    cancels: list[m.CancelTurn] = field(default_factory=list)

    def on_message(self, peer: bytes, msg: object) -> None:
        if isinstance(msg, m.TurnRequest):
            self.requests.append(msg)
        elif isinstance(msg, m.CancelTurn):
            self.cancels.append(msg)
        else:
            super().on_message(peer, msg)


def test_a_call_past_the_turn_timeout_gets_504_and_its_turn_is_withdrawn_from_the_executor(make_job: Any) -> None:
    job, executor, _ = make_job(lambda _msg: "up", turn_timeout_s=0.5, step_timeout_s=3.0, hung=True)
    assert isinstance(executor, HungExecutor)
    got: dict[str, httpx.Response] = {}

    def call() -> None:
        with httpx.Client(base_url=job.server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as http:
            session = http.post("/sessions", json={"group": "slow"}).json()["session_id"]
            got["call"] = http.post(f"/sessions/{session}/v1/completions", json={"model": "policy", "prompt": [5]})
            got["retry"] = http.post(f"/sessions/{session}/v1/completions", json={"model": "policy", "prompt": [5]})

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    with pytest.raises(Exception, match="session groups completed in 3 s"):
        job.run_step(1)  # the controller's loop runs meanwhile: it withdraws the turns the calls gave up on
    caller.join(timeout=30)
    assert got["call"].status_code == 504 and "gateway.turn_timeout_s" in got["call"].json()["error"]["message"]
    assert got["retry"].status_code == 504  # the session was free for the retry
    assert [c.turn_id for c in executor.cancels] == [r.turn_id for r in executor.requests]
    assert len(executor.cancels) == 2
    assert job.controller.scheduler.counters["withdrawn"] == 2 and job.controller.scheduler.running == 0
