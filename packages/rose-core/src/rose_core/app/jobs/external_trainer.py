"""The trainer of a job whose trainer is yours (``rl.trainer = "external"``): ROSE rolls out, you train.

Each step the RL job ``offer``s its batch (the step's training samples, one per turn, with the GRPO advantage
the job's settings give, and its trajectories' rewards); your trainer pulls it from the trainer API
(``GET /trainer/next``, ``trainer_routes``), trains however it likes, and publishes version
``publish_version`` itself, each tensor-parallel rank its own shard, through the publisher's shard intake
(``rose_transfer.ShardPublisher`` to ``intake``). ``published`` is called with the announcement once every
rank's part is in; the job then announces it to the executors as if ROSE had trained it. A batch stays
offered (pulling it again returns it again) until its version is published, so a trainer that restarts
mid-step pulls it again and loses nothing.

Groups are offered as they complete, before the step ends (``offer_groups``): each call is one part of the
step's batch, and the step's end adds the last part (what the parts did not hold, often nothing) marked final.
A trainer that pulls parts (``GET /trainer/batch?part=K``) can run forward and backward passes on the first
groups while the rollout goes on and step its optimizer at the final part; one that pulls the whole batch
gets it at the step's end, as before. A group's samples do not change once it is complete (its advantages
are its own), so the parts together are the whole batch.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
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


@dataclass(slots=True)
class _Offered:
    """One step's batch as offered so far: its parts (groups as they completed, then the rest at the step's
    end), whole once ``final``."""

    header: dict[str, Any]
    parts: list[Sequence[TrainSample]] = field(default_factory=list)
    offered: set[tuple[str, int]] = field(default_factory=set)
    """(trajectory id, turn index) of every turn in a part."""
    final: bool = False
    samples: Sequence[TrainSample] = ()
    """The whole batch (once final)."""
    document: dict[str, Any] | None = None
    """The whole batch as ``GET /trainer/next``'s JSON (once final)."""
    encoded: dict[tuple[int, int, int], bytes] = field(default_factory=dict)
    """(rank, world, part; -1: the whole batch) -> the binary batch, built once."""


class ExternalTrainer:
    """``wake``: what to call when a version is published (the controller's ``wake``: the loop notices at once)."""

    def __init__(self, ranks: int, wake: Callable[[], None] = lambda: None) -> None:
        self.ranks = ranks
        self.intake = ""
        """The shard intake's ``tcp://`` source (set once the publisher opened it)."""
        self._wake = wake
        self._steps: dict[int, _Offered] = {}
        """Step -> its batch, from its first part until its version is published."""
        self._published: dict[int, Future[WeightAnnounce]] = {}
        self._changed = threading.Condition()

    # ---------------------------------------------------------------- the RL job (the controller's loop)

    def offer_groups(self, step: int, base_version: int, samples: Sequence[TrainSample]) -> None:
        """Complete groups' samples, offered before the step's end (one part: ``GET /trainer/batch?part=K``)."""
        if not samples:
            return
        with self._changed:
            offered = self._offered(step, base_version)
            offered.parts.append(samples)
            offered.offered.update((s.trajectory_id, s.turn_index) for s in samples)
            self._changed.notify_all()

    def offer(self, step: int, base_version: int, samples: Sequence[TrainSample],
              trajectories: Sequence[Trajectory]) -> None:
        """The step's whole batch: what its parts did not hold is its last part (empty when they held it all)."""
        with self._changed:
            offered = self._offered(step, base_version)
            offered.parts.append([s for s in samples if (s.trajectory_id, s.turn_index) not in offered.offered])
            offered.final, offered.samples = True, samples
            offered.document = {**offered.header, "samples": [sample_json(s) for s in samples],
                                "trajectories": [{"trajectory_id": t.trajectory_id, "group_id": t.group_id,
                                                  "reward": t.total_reward, "success": t.success, "turns": len(t.turns)}
                                                 for t in trajectories]}
            self._changed.notify_all()

    def _offered(self, step: int, base_version: int) -> _Offered:
        header = {"step": step, "base_version": base_version, "publish_version": base_version + 1,
                  "intake": self.intake, "ranks": self.ranks}
        offered = self._steps.setdefault(step, _Offered(header))
        offered.header = header
        return offered

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
            for step in [s for s, o in self._steps.items() if o.header["publish_version"] <= announce.version]:
                del self._steps[step]  # trained: the next pull waits for the next batch
            future = self._future(announce.version)
            self._changed.notify_all()
        if not future.done():
            future.set_result(announce)
        self._wake()

    def _future(self, version: int) -> Future[WeightAnnounce]:
        return self._published.setdefault(version, Future())

    # ---------------------------------------------------------------- the trainer API (HTTP threads)

    def next_batch(self, wait_s: float, after: int | None = None) -> dict[str, Any] | None:
        """The whole batch waiting to be trained (the same one until its version is published), waiting up to
        ``wait_s`` for one (newer than step ``after``, when given: a trainer that trained a step waits for the
        next instead of pulling it again); None when there is none yet."""
        found = self._wait(wait_s, lambda: self._first(after, lambda o: o.final))
        return None if found is None else found[1].document

    def next_rank_batch(self, wait_s: float, rank: int, world: int, after: int | None = None,
                        part: int | None = None) -> bytes | None:
        """Rank ``rank`` of ``world`` data-parallel ranks' share (``trainer_batch``) of the whole batch
        (``next_batch``'s), or of its part ``part`` (0, 1, ...: the groups as they completed, the last part
        ``final``) as soon as that part is offered; None when there is none yet."""
        if part is None:
            found = self._wait(wait_s, lambda: self._first(after, lambda o: o.final))
        else:
            found = self._wait(wait_s, lambda: self._first(after, lambda o: len(o.parts) > part or o.final,
                                                           any_step=True))
        if found is None:
            return None
        step, offered = found
        index = -1 if part is None else part
        if index >= len(offered.parts):
            raise GatewayError(400, f"step {step} has {len(offered.parts)} parts (0 to {len(offered.parts) - 1}, the "
                                    "last marked final): pull parts in order and stop at the final one", "part")
        with self._changed:
            if self._steps.get(step) is not offered:  # published meanwhile: the next pull gets the next one
                return None
            key = (rank, world, index)
            if key not in offered.encoded:
                samples = offered.samples if index < 0 else offered.parts[index]
                last = index < 0 or (offered.final and index == len(offered.parts) - 1)
                header = {**offered.header, "part": index, "final": last}
                offered.encoded[key] = trainer_batch.encode(trainer_batch.rank_batch(samples, header, rank, world))
            return offered.encoded[key]

    def _first(self, after: int | None, ready: Callable[[_Offered], bool], *,
               any_step: bool = False) -> tuple[int, _Offered] | None:
        """The oldest step newer than ``after`` (only that one when ``any_step``: parts come step by step), if
        ``ready``; call under the lock."""
        for step in sorted(s for s in self._steps if after is None or s > after):
            if ready(self._steps[step]):
                return step, self._steps[step]
            if any_step:
                return None
        return None

    def _wait(self, wait_s: float, found: Callable[[], tuple[int, _Offered] | None]) -> tuple[int, _Offered] | None:
        deadline = time.monotonic() + min(max(wait_s, 0.0), WAIT_LIMIT_S)
        with self._changed:
            while (result := found()) is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._changed.wait(left)
            return result

    def status(self) -> dict[str, Any]:
        with self._changed:
            final = [s for s, o in self._steps.items() if o.final]
            return {"intake": self.intake, "ranks": self.ranks,
                    "published_versions": sorted(v for v, f in self._published.items() if f.done()),
                    "pending_step": min(final, default=None),
                    "parts": {str(s): len(o.parts) for s, o in sorted(self._steps.items())}}


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


def _part(params: dict[str, str]) -> int | None:
    """``part``: the part of the step's batch to pull (0, 1, ...); absent: the whole batch, at the step's end."""
    if "part" not in params:
        return None
    try:
        part = int(params["part"])
    except ValueError as exc:
        raise GatewayError(400, f"part = {params['part']!r}: pass 0, 1, ... (the parts in order)", "part") from exc
    if not 0 <= part <= 1_000_000:
        raise GatewayError(400, f"part = {part}: pass 0, 1, ... (the parts in order)", "part")
    return part


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
     lambda t, p, _body: t.next_rank_batch(_wait_s(p), *_rank(p), after=_after(p), part=_part(p))),
    ("GET", re.compile(r"/trainer/status/?"), lambda t, _p, _body: t.status()),
]
"""``GET /trainer/next?wait_s=S``: the batch to train (200, JSON) or none yet (204); ``GET /trainer/batch?wait_s=S&
rank=R&world=W[&after=STEP][&part=K]``: rank R's share of it (a batch newer than ``after``), or of its part K
(the groups as they completed), packed and binary (``trainer_batch``, ``application/msgpack``);
``GET /trainer/status``."""
