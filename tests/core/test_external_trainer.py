"""The external trainer's side of the job: batches offered until their version is published, the wait that
pumps the controller and names the fix at its timeout, and the trainer API over real HTTP."""

from __future__ import annotations

import threading

import httpx
import pytest

from rose_core.app.controller.control_loop import ControlLoop
from rose_core.app.gateway.http_server import ApiServer
from rose_core.app.jobs.external_trainer import TRAINER_ROUTES, ExternalTrainer, sample_json
from rose_core.app.rl.algorithm.sample import TrainSample
from rose_core.app.rl.algorithm.trajectory import Trajectory
from rose_core.protocol.messages import WeightAnnounce
from rose_core.support.errors import RoseError

KEY = "t" * 32


def _sample() -> TrainSample:
    return TrainSample(trajectory_id="a", turn_index=0, prompt_token_ids=(1, 2, 3), response_token_ids=(4, 5),
                       behaviour_logprobs=(-0.5, -0.25), weight_version=0, advantage=1.5)


def _announce(version: int) -> WeightAnnounce:
    return WeightAnnounce(version=version, step=version, source="tcp://127.0.0.1:1", manifest_digest="d")


def test_a_sample_travels_as_tokens_mask_and_aligned_logprobs() -> None:
    out = sample_json(_sample())
    assert out["tokens"] == [1, 2, 3, 4, 5] and out["mask"] == [0, 0, 0, 1, 1]
    assert out["behaviour_logprobs"] == [0.0, 0.0, 0.0, -0.5, -0.25] and out["prompt_length"] == 3


def test_a_batch_stays_offered_until_its_version_is_published() -> None:
    woken = threading.Event()
    trainer = ExternalTrainer(ranks=2, wake=woken.set)
    assert trainer.next_batch(0.0) is None
    trainer.offer(3, 2, [_sample()], [Trajectory("a", "g", 0, total_reward=1.0)])
    first = trainer.next_batch(0.0)
    assert first is not None and first["publish_version"] == 3 and first["ranks"] == 2
    assert trainer.next_batch(0.0) is first  # pulled again (a restarted trainer): the same batch
    published = trainer.published_version(3)
    threading.Timer(0.05, trainer.published, args=(_announce(3),)).start()
    assert published.result(timeout=10).version == 3 and woken.wait(10)  # the controller's loop is woken
    assert trainer.next_batch(0.0) is None and trainer.status()["published_versions"] == [3]


class _Idle:
    """A controller with nothing to do: the loop's pump just waits."""

    def pump(self, timeout: float) -> None:
        threading.Event().wait(timeout)

    def wake(self) -> None:
        return None


def test_a_trainer_that_never_publishes_fails_the_step_with_the_fix() -> None:
    trainer = ExternalTrainer(ranks=1)
    trainer.offer(1, 0, [], [])
    with pytest.raises(RoseError, match=r"did not publish version 1 .* GET /trainer/next"):
        ControlLoop(_Idle()).result(trainer.published_version(1), 0.05, lambda: trainer.timed_out(1, 0.05))


def test_the_trainer_api_long_polls_and_refuses_bad_input() -> None:
    trainer = ExternalTrainer(ranks=1)
    server = ApiServer(trainer, TRAINER_ROUTES, KEY).start()
    auth = {"Authorization": f"Bearer {KEY}"}
    try:
        assert httpx.get(f"{server.url}/trainer/next", params={"wait_s": 0}, headers=auth).status_code == 204
        threading.Timer(0.1, trainer.offer, args=(1, 0, [_sample()], [])).start()
        resp = httpx.get(f"{server.url}/trainer/next", params={"wait_s": 5}, headers=auth, timeout=10)
        assert resp.status_code == 200 and resp.json()["samples"][0]["mask"] == [0, 0, 0, 1, 1]
        bad = httpx.get(f"{server.url}/trainer/next", params={"wait_s": "soon"}, headers=auth)
        assert bad.status_code == 400 and "wait_s" in bad.json()["error"]["message"]
        assert httpx.get(f"{server.url}/trainer/next", headers={}).status_code == 401
        assert httpx.post(f"{server.url}/trainer/next", headers=auth).status_code == 405
        assert httpx.get(f"{server.url}/trainer/status", headers=auth).json()["pending_step"] == 1
    finally:
        server.close()
