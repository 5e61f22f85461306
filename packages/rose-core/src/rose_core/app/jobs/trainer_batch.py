"""A step's batch for external trainers in its binary form: one token sequence per trajectory, split across
data-parallel ranks, msgpack with the arrays as raw little-endian bytes (``GET /trainer/batch?rank=R&world=W``).

Each row is a trajectory's turns that extend each other (``trajectory_rows``): its tokens once, not each turn's
prompt again. Each turn is described in columns (one array per field: where its response starts in its row and
how long it is, its advantage, the distribution it was sampled from, the version that sampled it); the
behaviour logprobs of all response tokens follow in turn order. Rank ``r`` of ``world`` gets the rows the split gives it
(longest first, each to the rank with the fewest tokens so far: every rank's share within one row's length of
the others); all ranks of a step together get every row exactly once.

Rules: a msgpack array of the fields in their order (no field names: a part of a step streamed group by group
is small, and names would be a third of it); fields are only ever appended, with defaults (``FORMAT`` names
the layout, version 2 since the array form); ``tokens`` int32,
``row_offsets`` int64 (``rows + 1`` of them), per-row and per-turn columns int32 or float32, ``behaviour_logprobs``
float32. Size: 4 bytes per unique token, 4 per response token (its logprob), 24 per turn and a few dozen per
row: a batch whose responses are 10% of its tokens is 1.20x its tokens' bytes (``tests/core/
test_trainer_batch.py``), where the per-turn JSON repeats every prompt. On the wire it is gzipped for clients
that accept it (the trainer API's HTTP server; most of an int32 id's bytes are zeros).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import msgspec
import numpy as np

from rose_core.app.rl.algorithm.sample import TrainSample
from rose_core.app.rl.algorithm.trajectory_rows import Row, rows_of
from rose_core.support.errors import RoseError

FORMAT = "rose-trainer-batch/2"


class RankBatch(msgspec.Struct, kw_only=True, array_like=True):
    format: str = FORMAT
    step: int
    base_version: int
    publish_version: int
    intake: str
    ranks: int
    """Tensor-parallel ranks that publish the next version (``rl.trainer.ranks``)."""
    rank: int
    """This data-parallel rank, of ``world``."""
    world: int
    samples: int
    """Turns in this batch, every rank's (the whole step's, or this part's)."""
    tokens: bytes
    """int32: every row's tokens, concatenated."""
    row_offsets: bytes
    """int64, rows + 1: row ``r`` is ``tokens[row_offsets[r]:row_offsets[r + 1]]``."""
    row_trajectories: list[str]
    row_first_turn: bytes
    """int32 per row: the turn index of its first turn (its turns are consecutive)."""
    row_turns: bytes
    """int32 per row: how many turns it holds (the turn arrays below are in row order)."""
    turn_starts: bytes
    """int32 per turn: the row position of its first response token (its prompt is the row before it)."""
    turn_lengths: bytes
    """int32 per turn: its response tokens."""
    turn_versions: bytes
    """int32 per turn: the weight version that sampled it."""
    turn_advantages: bytes
    turn_temperatures: bytes
    turn_top_ps: bytes
    """float32 per turn: its advantage and the distribution it was sampled from."""
    behaviour_logprobs: bytes
    """float32 per response token, in turn order."""
    part: int = -1
    """Which part of the step's batch this is (0, 1, ...: groups as they completed, then the rest at the step's
    end); -1: the whole batch."""
    final: bool = True
    """The step's last part (its batch is complete: train, then publish ``publish_version``)."""


def split_rows(rows: Sequence[Row], world: int) -> list[list[int]]:
    """Row indices per rank: longest first, each to the rank with the fewest tokens so far (ties: lowest rank)."""
    shares: list[list[int]] = [[] for _ in range(world)]
    load = [0] * world
    for index in sorted(range(len(rows)), key=lambda i: (-rows[i][-1].length, i)):
        rank = min(range(world), key=lambda r: (load[r], r))
        shares[rank].append(index)
        load[rank] += rows[index][-1].length
    return [sorted(share) for share in shares]


def rank_batch(samples: Sequence[TrainSample], header: dict[str, object], rank: int, world: int) -> RankBatch:
    """Rank ``rank``'s part of the step's ``samples`` (``header``: the step's fields of ``RankBatch``)."""
    rows = rows_of(samples, pack=True)
    mine = [rows[i] for i in split_rows(rows, world)[rank]]
    turns = [sample for row in mine for sample in row]
    tokens = [t for row in mine for t in row[-1].prompt_token_ids + row[-1].response_token_ids]
    offsets = list(itertools.accumulate((row[-1].length for row in mine), initial=0))

    def array(values: Sequence[float], dtype: str) -> bytes:
        return np.asarray(values, dtype=dtype).tobytes()

    return RankBatch(
        **header, rank=rank, world=world, samples=len(samples),  # type: ignore[arg-type]
        tokens=array(tokens, "<i4"), row_offsets=array(offsets, "<i8"),
        row_trajectories=[row[0].trajectory_id for row in mine],
        row_first_turn=array([row[0].turn_index for row in mine], "<i4"), row_turns=array([len(row) for row in mine], "<i4"),
        turn_starts=array([len(s.prompt_token_ids) for s in turns], "<i4"),
        turn_lengths=array([len(s.response_token_ids) for s in turns], "<i4"),
        turn_versions=array([s.weight_version for s in turns], "<i4"),
        turn_advantages=array([s.advantage for s in turns], "<f4"),
        turn_temperatures=array([s.temperature for s in turns], "<f4"),
        turn_top_ps=array([s.top_p for s in turns], "<f4"),
        behaviour_logprobs=array([x for s in turns for x in s.behaviour_logprobs], "<f4"),
    )


def encode(batch: RankBatch) -> bytes:
    return msgspec.msgpack.encode(batch)


def decode(data: bytes) -> RankBatch:
    """A batch from the trainer API; a clear error when it is not one this package reads."""
    try:
        batch = msgspec.msgpack.decode(data, type=RankBatch)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise RoseError(f"not a {FORMAT} batch ({exc}): install the same rose-core on the trainer's side as on the "
                        "controller's") from exc
    if batch.format != FORMAT:
        raise RoseError(f"a {batch.format!r} batch, this client reads {FORMAT!r}: install the same rose-core on the "
                        "trainer's side as on the controller's")
    return batch
