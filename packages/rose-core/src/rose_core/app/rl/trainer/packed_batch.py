"""A trainer micro-batch: rows of token sequences, each row holding the response tokens of one or more turns.

One sequence per trajectory (``trajectory_rows.rows_of``: a trajectory's turns share a row while each prompt extends
the previous turn's prompt and response). Every response token keeps what made it part
of a sample: its position (the logits of the token before it), its target, behaviour logprob, advantage,
sampling temperature and top-p, and its own turn's length (the per-sample normalisation of the loss,
``policy_loss.aggregate``). A row of one turn is the per-turn form. Causal attention makes a token's logits
depend on its prefix only, so the logprobs, and the loss, are the same either way; a 10-turn trajectory costs
one forward pass over its last turn's sequence instead of ten over a growing prefix.

Invariant: for every turn in a row, ``prompt + response`` is a prefix of the row's ``input_ids``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rose_core.app.rl.algorithm.sample import TrainSample
from rose_core.app.rl.algorithm.trajectory_rows import Row
from rose_core.support.errors import require_extra

with require_extra("torch (the reference trainer)", "rose-core[train]"):
    import torch

@dataclass(slots=True)
class PackedBatch:
    """[B, W] inputs and [B, T] response-token tensors (T: the most response tokens of a row)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    positions: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor
    advantages: torch.Tensor
    behaviour: torch.Tensor
    temperature: torch.Tensor
    """Each token's turn's sampling temperature and top-p (``TrainSample``): the logprobs are scored under them."""
    top_p: torch.Tensor
    turn_tokens: torch.Tensor
    """Each token's turn's response length (0 on padding)."""
    proximal: torch.Tensor | None = None
    """Set by the first epoch's forward pass (detached)."""
    reference: torch.Tensor | None = None
    """The frozen reference's logprobs, when ``kl_coef`` > 0."""


def collate(rows: Sequence[Row], pad_id: int) -> PackedBatch:
    width = max(row[-1].length for row in rows)
    depth = max(sum(len(s.response_token_ids) for s in row) for row in rows)
    shape = (len(rows), depth)
    batch = PackedBatch(
        input_ids=torch.full((len(rows), width), pad_id, dtype=torch.long),
        attention_mask=torch.zeros((len(rows), width), dtype=torch.long),
        positions=torch.zeros(shape, dtype=torch.long), targets=torch.zeros(shape, dtype=torch.long),
        mask=torch.zeros(shape), advantages=torch.zeros(shape), behaviour=torch.zeros(shape),
        temperature=torch.ones(shape), top_p=torch.ones(shape), turn_tokens=torch.zeros(shape),
    )
    for r, row in enumerate(rows):
        sequence = row[-1].prompt_token_ids + row[-1].response_token_ids
        batch.input_ids[r, : len(sequence)] = torch.tensor(sequence)
        batch.attention_mask[r, : len(sequence)] = 1
        at = 0
        for sample in row:
            _place(batch, r, at, sample)
            at += len(sample.response_token_ids)
    return batch


def _place(batch: PackedBatch, r: int, at: int, sample: TrainSample) -> None:
    """One turn's response tokens into row ``r`` from slot ``at``."""
    prompt, n = len(sample.prompt_token_ids), len(sample.response_token_ids)
    span = slice(at, at + n)
    batch.positions[r, span] = torch.arange(prompt - 1, prompt - 1 + n)
    batch.targets[r, span] = torch.tensor(sample.response_token_ids)
    batch.mask[r, span] = 1.0
    batch.behaviour[r, span] = torch.tensor(sample.behaviour_logprobs)
    batch.advantages[r, span] = sample.advantage
    batch.temperature[r, span] = sample.temperature
    batch.top_p[r, span] = sample.top_p
    batch.turn_tokens[r, span] = float(n)
