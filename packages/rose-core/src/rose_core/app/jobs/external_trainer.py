"""The trainer of a job whose trainer is yours (``rl.trainer = "external"``): ROSE rolls out, you train.

Each step the RL job ``offer``s its batch (the step's training samples, one per turn, with the GRPO advantage
the job's settings give, and its trajectories' rewards); your trainer pulls it from the trainer API
(``GET /trainer/next``, ``trainer_routes``), trains however it likes, and publishes version
``publish_version`` itself, each tensor-parallel rank its own shard, through the publisher's shard intake
(``rose_transfer.ShardPublisher`` to ``intake``). ``published`` is called with the announcement once every
rank's part is in; the job then announces it to the executors as if ROSE had trained it. A batch stays
offered (pulling it again returns it again) until its version is published, so a trainer that restarts
mid-step pulls it again and loses nothing.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from rose_core.app.gateway.http_server import Route
from rose_core.app.gateway.openai_api import GatewayError
from rose_core.app.jobs import trainer_batch
from rose_core.app.rl.algorithm.sample import TrainSample
from rose_core.app.rl.algorithm.trajectory import Trajectory
from rose_core.protocol.messages import WeightAnnounce
from rose_core.support.errors import RoseError

WAIT_LIMIT_S = 60.0
"""The longest ``/trainer/next`` long-poll (a client asks with ``?wait_s=``)."""


def sample_json(sample: TrainSample) -> dict[str, Any]:
    """A training sample as the trainer API sends it: the turn's tokens (prompt then response), the response
    mask, behaviour logprobs aligned with the tokens (0.0 on prompt positions), the advantage."""
    prompt, response = sample.prompt_token_ids, sample.response_token_ids
    return {"trajectory_id": sample.trajectory_id, "turn_index": sample.turn_index,
            "tokens": [*prompt, *response], "mask": [0] * len(prompt) + [1] * len(response),
            "behaviour_logprobs": [0.0] * len(prompt) + list(sample.behaviour_logprobs),
            "prompt_length": len(prompt), "weight_version": sample.weight_version, "advantage": sample.advantage,
            "temperature": sample.temperature, "top_p": sample.top_p}


class ExternalTrainer:
    """``wake``: what to call when a version is published (the controller's ``wake``: the loop notices at once)."""

    def __init__(self, ranks: int, wake: Callable[[], None] = lambda: None) -> None:
        self.ranks = ranks
        self.intake = ""
        """The shard intake's ``tcp://`` source (set once the publisher opened it)."""
        self._wake = wake
        self._batch: dict[str, Any] | None = None
        self._samples: Sequence[TrainSample] = ()
        self._encoded: dict[tuple[int, int, int], bytes] = {}
        """(step, rank, world) -> the rank's binary batch, built once."""
        self._published: dict[int, Future[WeightAnnounce]] = {}
        self._changed = threading.Condition()

    # ---------------------------------------------------------------- the RL job (the controller's loop)

    def offer(self, step: int, base_version: int, samples: Sequence[TrainSample],
              trajectories: Sequence[Trajectory]) -> None:
        batch = {"step": step, "base_version": base_version, "publish_version": base_version + 1,
                 "intake": self.intake, "ranks": self.ranks, "samples": [sample_json(s) for s in samples],
                 "trajectories": [{"trajectory_id": t.trajectory_id, "group_id": t.group_id,
                                   "reward": t.total_reward, "success": t.success, "turns": len(t.turns)}
                                  for t in trajectories]}
        with self._changed:
            self._batch = batch
            self._samples = samples
            self._encoded = {}
            self._changed.notify_all()

    def published_version(self, version: int) -> Future[WeightAnnounce]:
        """Done with the announcement once every rank's part of ``version`` is in."""
        with self._changed:
            return self._future(version)

    @staticmethod
    def timed_out(version: int, timeout_s: float) -> RoseError:
        """What a wait for ``version`` raises when it runs out of time."""
        return RoseError(f"the external trainer did not publish version {version} within {timeout_s:.0f} s "
                         "(rl.trainer.timeout_s): is it running and pulling GET /trainer/next?")

    # ---------------------------------------------------------------- the publisher's thread

    def published(self, announce: WeightAnnounce) -> None:
        with self._changed:
            if self._batch is not None and self._batch["publish_version"] == announce.version:
                self._batch = None  # trained: the next pull waits for the next batch
            future = self._future(announce.version)
            self._changed.notify_all()
        if not future.done():
            future.set_result(announce)
        self._wake()

    def _future(self, version: int) -> Future[WeightAnnounce]:
        return self._published.setdefault(version, Future())

    # ---------------------------------------------------------------- the trainer API (HTTP threads)

    def next_batch(self, wait_s: float, after: int | None = None) -> dict[str, Any] | None:
        """The batch waiting to be trained (the same one until its version is published), waiting up to
        ``wait_s`` for one (newer than step ``after``, when given: a trainer that trained a step waits for the
        next instead of pulling it again); None when there is none yet."""
        deadline = time.monotonic() + min(max(wait_s, 0.0), WAIT_LIMIT_S)
        with self._changed:
            while self._batch is None or (after is not None and self._batch["step"] <= after):
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._changed.wait(left)
            return self._batch

    def next_rank_batch(self, wait_s: float, rank: int, world: int, after: int | None = None) -> bytes | None:
        """``next_batch``'s batch in its binary form, rank ``rank`` of ``world`` data-parallel ranks'
        (``trainer_batch``); None when there is none yet."""
        batch = self.next_batch(wait_s, after)
        if batch is None:
            return None
        with self._changed:
            if self._batch is not batch:  # published meanwhile: the next pull gets the next one
                return None
            key = (int(batch["step"]), rank, world)
            if key not in self._encoded:
                header = {name: batch[name] for name in ("step", "base_version", "publish_version", "intake", "ranks")}
                self._encoded[key] = trainer_batch.encode(trainer_batch.rank_batch(self._samples, header, rank, world))
            return self._encoded[key]

    def status(self) -> dict[str, Any]:
        with self._changed:
            return {"intake": self.intake, "ranks": self.ranks, "published_versions": sorted(v for v, f in self._published.items() if f.done()),
                    "pending_step": self._batch["step"] if self._batch else None}


def _wait_s(params: dict[str, str]) -> float:
    try:
        wait_s = float(params.get("wait_s", "0"))
    except ValueError as exc:
        raise GatewayError(400, f"wait_s = {params['wait_s']!r}: pass seconds (a number)", "wait_s") from exc
    if not (math.isfinite(wait_s) and wait_s >= 0.0):
        raise GatewayError(400, f"wait_s = {params['wait_s']!r}: pass a finite number of seconds >= 0", "wait_s")
    return wait_s


def _after(params: dict[str, str]) -> int | None:
    """``after``: the last step this trainer trained (the pull waits for a newer one); absent: any."""
    if "after" not in params:
        return None
    try:
        return int(params["after"])
    except ValueError as exc:
        raise GatewayError(400, f"after = {params['after']!r}: pass the last step trained (an integer)",
                           "after") from exc


def _rank(params: dict[str, str]) -> tuple[int, int]:
    """``rank`` and ``world`` (data-parallel), a 400 naming the fix unless 0 <= rank < world."""
    try:
        rank, world = int(params.get("rank", "0")), int(params.get("world", "1"))
    except ValueError as exc:
        raise GatewayError(400, "rank and world must be integers (this rank, the data-parallel ranks)", "rank") from exc
    if not 0 <= rank < world <= 4096:
        raise GatewayError(400, f"rank = {rank}, world = {world}: pass 0 <= rank < world <= 4096", "rank")
    return rank, world


TRAINER_ROUTES: list[tuple[str, re.Pattern[str], Route]] = [
    ("GET", re.compile(r"/trainer/next/?"), lambda t, p, _body: t.next_batch(_wait_s(p))),
    ("GET", re.compile(r"/trainer/batch/?"),
     lambda t, p, _body: t.next_rank_batch(_wait_s(p), *_rank(p), after=_after(p))),
    ("GET", re.compile(r"/trainer/status/?"), lambda t, _p, _body: t.status()),
]
"""``GET /trainer/next?wait_s=S``: the batch to train (200, JSON) or none yet (204); ``GET /trainer/batch?wait_s=S&
rank=R&world=W[&after=STEP]``: rank R's part of it (a batch newer than ``after``), packed and binary (``trainer_batch``, ``application/msgpack``);
``GET /trainer/status``."""
