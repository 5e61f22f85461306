"""The client an external trainer's data-parallel ranks call: each pulls its part of each step's batch from the
trainer API, packed and binary (``jobs.trainer_batch``), trains, and the tensor-parallel ranks publish the next
version with ``rose_transfer.ShardPublisher`` (docs/gateway.md, "External trainers").

    client = TrainerClient(api_url, key_file="run/trainer.key", rank=dist.get_rank(), world=dist.get_world_size())
    while (batch := client.next_batch(wait_s=30, after=last_step)) is not None or ...:
        for tokens, turns in batch.rows(): ...   # one sequence per trajectory, each turn's response in it

    for part in client.step_parts(after=last_step):   # or: groups as they complete, before the step ends
        for tokens, turns in part.rows(): ...          # forward and backward now; the optimizer at part.final

Standard library HTTP only (``urllib``); msgspec and numpy decode the batch.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rose_core.app.jobs.trainer_batch import RankBatch, decode
from rose_core.app.rl.algorithm.sample import TrainSample
from rose_core.support.errors import RoseError


@dataclass(frozen=True, slots=True)
class BatchTurn:
    """One turn of a row: its response is ``tokens[start : start + length]`` of the row, its prompt the row
    before ``start``; ``behaviour_logprobs`` the sampler's, one per response token."""

    trajectory_id: str
    turn_index: int
    start: int
    length: int
    weight_version: int
    advantage: float
    temperature: float
    top_p: float
    behaviour_logprobs: np.ndarray


class TrainerBatch:
    """One rank's part of a step (``wire``: the decoded ``RankBatch``), its arrays as numpy views;
    ``received_bytes``: what came over HTTP (gzipped)."""

    def __init__(self, wire: RankBatch, received_bytes: int = 0) -> None:
        self.wire = wire
        self.received_bytes = received_bytes
        self.tokens = np.frombuffer(wire.tokens, dtype="<i4")
        self.row_offsets = np.frombuffer(wire.row_offsets, dtype="<i8")
        self.behaviour_logprobs = np.frombuffer(wire.behaviour_logprobs, dtype="<f4")

    @property
    def step(self) -> int:
        return self.wire.step

    @property
    def publish_version(self) -> int:
        return self.wire.publish_version

    @property
    def final(self) -> bool:
        """The step's last part (or its whole batch): train what it gave, then publish ``publish_version``."""
        return self.wire.final

    def rows(self) -> Iterator[tuple[np.ndarray, list[BatchTurn]]]:
        """Each row's tokens (one sequence: score it in one forward pass) and its turns."""
        w = self.wire
        column = {name: np.frombuffer(getattr(w, name), dtype=dtype) for name, dtype in (
            ("row_first_turn", "<i4"), ("row_turns", "<i4"), ("turn_starts", "<i4"), ("turn_lengths", "<i4"),
            ("turn_versions", "<i4"), ("turn_advantages", "<f4"), ("turn_temperatures", "<f4"),
            ("turn_top_ps", "<f4"))}
        turn, logprob = 0, 0
        for row, trajectory_id in enumerate(w.row_trajectories):
            turns = []
            for k in range(int(column["row_turns"][row])):
                length = int(column["turn_lengths"][turn])
                turns.append(BatchTurn(
                    trajectory_id, int(column["row_first_turn"][row]) + k, int(column["turn_starts"][turn]), length,
                    int(column["turn_versions"][turn]), float(column["turn_advantages"][turn]),
                    float(column["turn_temperatures"][turn]), float(column["turn_top_ps"][turn]),
                    self.behaviour_logprobs[logprob: logprob + length]))
                turn, logprob = turn + 1, logprob + length
            yield self.tokens[self.row_offsets[row]: self.row_offsets[row + 1]], turns

    def train_samples(self) -> list[TrainSample]:
        """The rank's turns as ROSE's reference trainer takes them (one sample per turn)."""
        return [TrainSample(
            trajectory_id=t.trajectory_id, turn_index=t.turn_index,
            prompt_token_ids=tuple(int(x) for x in tokens[: t.start]),
            response_token_ids=tuple(int(x) for x in tokens[t.start: t.start + t.length]),
            behaviour_logprobs=tuple(float(x) for x in t.behaviour_logprobs), weight_version=t.weight_version,
            advantage=t.advantage, temperature=t.temperature, top_p=t.top_p)
            for tokens, turns in self.rows() for t in turns]


class TrainerClient:
    def __init__(self, url: str, key: str | None = None, *, key_file: str | Path | None = None, rank: int = 0,
                 world: int = 1, timeout_s: float = 120.0) -> None:
        if key is None:
            if key_file is None:
                raise RoseError("TrainerClient needs the trainer's key: key= or key_file= (the run's trainer.key)")
            key = Path(key_file).read_text().strip()
        if not 0 <= rank < world:
            raise RoseError(f"rank {rank} of world {world}: pass 0 <= rank < world")
        self.url, self.rank, self.world = url.rstrip("/"), rank, world
        self._headers = {"Authorization": f"Bearer {key}"}
        self._timeout_s = timeout_s

    def next_batch(self, wait_s: float = 30.0, *, after: int | None = None) -> TrainerBatch | None:
        """This rank's part of the batch waiting to be trained, waiting up to ``wait_s`` for one newer than step
        ``after`` (the last this rank trained: its batch stays offered until its version is published); None
        when there is none yet."""
        fields: dict[str, Any] = {"wait_s": wait_s, "rank": self.rank, "world": self.world}
        if after is not None:
            fields["after"] = after
        return self._batch(f"/trainer/batch?{urllib.parse.urlencode(fields)}", wait_s)

    def next_part(self, part: int, wait_s: float = 30.0, *, after: int | None = None) -> TrainerBatch | None:
        """This rank's share of part ``part`` of the next batch newer than step ``after`` (groups offered as they
        completed), as soon as it is offered; None when it is not yet."""
        fields: dict[str, Any] = {"wait_s": wait_s, "rank": self.rank, "world": self.world, "part": part}
        if after is not None:
            fields["after"] = after
        return self._batch(f"/trainer/batch?{urllib.parse.urlencode(fields)}", wait_s)

    def step_parts(self, wait_s: float = 30.0, *, after: int | None = None) -> Iterator[TrainerBatch]:
        """The next step's parts for this rank, each as soon as the job offers it, the last one ``final``
        (then train the rest and publish): a loop that starts its forward and backward passes on the first
        groups while the rollout goes on. Waits ``wait_s`` at a time, as long as it takes."""
        part, step = 0, None
        while True:
            batch = self.next_part(part, wait_s, after=after)
            if batch is None:
                continue
            if step is not None and batch.step != step:
                raise RoseError(f"step {step} was published while rank {self.rank} pulled its parts (part {part} "
                                f"came from step {batch.step}): every rank must pull every part before one publishes")
            step = batch.step
            yield batch
            if batch.final:
                return
            part += 1

    def status(self) -> dict[str, Any]:
        return dict(json.loads(self._get("/trainer/status", 0.0)[1]))

    def _batch(self, path: str, wait_s: float) -> TrainerBatch | None:
        status, body, received = self._get(path, wait_s, gzip=True)
        return None if status == 204 else TrainerBatch(decode(body), received)

    def _get(self, path: str, wait_s: float, *, gzip: bool = False) -> tuple[int, bytes, int]:
        """Status, body (gunzipped), and the bytes received."""
        headers = {**self._headers, "Accept-Encoding": "gzip"} if gzip else self._headers
        request = urllib.request.Request(self.url + path, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self._timeout_s + wait_s) as response:
                body = bytes(response.read())
                if response.headers.get("Content-Encoding", "") == "gzip":
                    return int(response.status), zlib.decompress(body, 31), len(body)
                return int(response.status), body, len(body)
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            raise RoseError(f"the trainer API answered {exc.code} to GET {path}: {detail}") from exc
