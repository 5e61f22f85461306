"""One token sequence per trajectory: which training samples (turns) share a row.

A trajectory's turns share a row while each turn's prompt starts with the previous turn's prompt and response (a
multi-turn conversation grows at its end); a turn whose prompt does not (a history the agent rewrote, a context
cut) starts a new row. The row's tokens are its last turn's prompt and response; every turn's response sits in
them at its own positions. Used by the reference trainer (``trainer.packed_batch``) and by the batches served
to external trainers (``jobs.trainer_batch``).

Invariant: for every turn in a row, ``prompt + response`` is a prefix of the row's last turn's ``prompt +
response``.
"""

from __future__ import annotations

from collections.abc import Sequence

from rose_core.app.rl.algorithm.sample import TrainSample

Row = list[TrainSample]


def rows_of(samples: Sequence[TrainSample], *, pack: bool) -> list[Row]:
    """The samples' rows: with ``pack``, each trajectory's turns (in turn order) in as few rows as its prompts
    allow; without, one row per sample. Rows keep the trajectories' first-seen order."""
    if not pack:
        return [[sample] for sample in samples]
    by_trajectory: dict[str, list[TrainSample]] = {}
    for sample in samples:
        by_trajectory.setdefault(sample.trajectory_id, []).append(sample)
    rows: list[Row] = []
    for turns in by_trajectory.values():
        row: Row = []
        for sample in sorted(turns, key=lambda s: s.turn_index):
            if row and not _extends(sample, row[-1]):
                rows.append(row)
                row = []
            row.append(sample)
        rows.append(row)
    return rows


def _extends(sample: TrainSample, previous: TrainSample) -> bool:
    before = previous.prompt_token_ids + previous.response_token_ids
    return len(sample.prompt_token_ids) >= len(before) and sample.prompt_token_ids[: len(before)] == before
