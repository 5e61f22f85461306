"""The reference trainer: a Hugging Face policy in fp32 master weights, updated with GRPO / DAPO.

Decoupled PPO: before the first epoch the trainer recomputes the samples' logprobs (the *proximal* policy) and
clips ``new / proximal``; the sampler's (*behaviour*) logprobs weight each token by the truncated importance
ratio ``min(proximal / behaviour, tis_cap)``, so turns sampled on an older weight version are corrected
(``rose_core.app.rl.algorithm.policy_loss``; ``docs/rl.md``). One of the modules that import torch.
"""

from __future__ import annotations

import copy
import math
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rose_core.app.config import RLConfig
from rose_core.app.rl.algorithm.loss_settings import LossSettings
from rose_core.app.rl.algorithm.policy_loss import LossNorm, PolicyLoss, policy_loss
from rose_core.app.rl.algorithm.sample import TrainSample
from rose_core.app.rl.algorithm.trajectory_rows import Row, rows_of
from rose_core.app.rl.demo.models import iter_safetensors_names, quiet_progress
from rose_core.app.rl.trainer.checkpoint_dir import CheckpointState
from rose_core.app.rl.trainer.packed_batch import PackedBatch, collate
from rose_core.app.rl.trainer.trainer_state import load_checkpoint, save_checkpoint
from rose_core.protocol.engine_layout import EngineLayout, engine_layout_of
from rose_core.support.errors import RoseError, require_extra

with require_extra("torch, transformers and safetensors (the reference trainer)", "rose-core[train]"):
    import torch
    import transformers
    from safetensors.torch import save_file

_COPIED_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
)


@dataclass(slots=True, frozen=True)
class TrainStats:
    """One ``train_step``; means are over response tokens. ``clip_fraction``: token updates (over all epochs)
    the clip stopped; ``approx_kl``: k3 estimate of KL(proximal || new) after the step; ``logprob_gap``: mean
    |proximal - behaviour|. First epoch (before any optimizer step): ``ratio_mean`` of new/behaviour,
    ``behaviour_ratio_mean`` of proximal/behaviour (the same weights, so the two agree; ~1 on-policy, off by
    bf16 noise), ``tis_truncated_fraction`` of tokens whose IS weight hit ``tis_cap``, and ``kl_ref``, the k3
    KL(new || reference), only when ``kl_coef`` > 0."""

    loss: float
    clip_fraction: float
    approx_kl: float
    tokens: int
    seconds: float
    samples: int = 0
    grad_norm: float = 0.0
    logprob_gap: float = 0.0
    ratio_mean: float = 1.0
    behaviour_ratio_mean: float = 1.0
    tis_truncated_fraction: float = 0.0
    kl_ref: float | None = None


@dataclass(slots=True, frozen=True)
class TrainerConfig:
    """Optimizer settings and the loss's; ``threads`` is torch's intra-op thread count (the demo shares 2 cores)."""

    lr: float = 1e-4
    epochs: int = 2
    seed: int = 0
    threads: int = 1
    max_grad_norm: float = 1.0
    micro_batch_size: int = 32
    loss: LossSettings = field(default_factory=LossSettings)
    pack: bool = True
    """One sequence per trajectory (``packed_batch``); False: one per turn (the same loss, more compute)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.lr) and self.lr > 0.0):
            raise ValueError(f"learning rate {self.lr} must be positive")
        if min(self.epochs, self.threads, self.micro_batch_size) < 1:
            raise ValueError("epochs, threads and micro_batch_size must each be at least 1")
        if not self.max_grad_norm > 0.0:
            raise ValueError(f"max_grad_norm {self.max_grad_norm} must be positive")


@dataclass(slots=True)
class _Tally:
    """Sums of ``PolicyLoss`` counters: ``clipped`` over all epochs, the rest over the first."""

    clipped: float = 0.0
    truncated: float = 0.0
    ratio: float = 0.0
    behaviour_ratio: float = 0.0
    kl: float = 0.0

    def add(self, terms: PolicyLoss, *, first_epoch: bool) -> None:
        self.clipped += terms.clipped
        if first_epoch:
            self.truncated += terms.truncated
            self.ratio += terms.ratio
            self.behaviour_ratio += terms.behaviour_ratio
            self.kl += terms.kl


class PolicyTrainer:
    """Holds the policy loaded from ``model_dir`` (bf16 on disk) as fp32 parameters with AdamW; with
    ``kl_coef`` > 0 also a frozen fp32 copy of the initial policy as the KL reference."""

    def __init__(
        self,
        model_dir: Path,
        *,
        lr: float = 1e-4,
        epochs: int = 2,
        seed: int = 0,
        threads: int = 1,
        max_grad_norm: float = 1.0,
        micro_batch_size: int = 32,
        loss: LossSettings | None = None,
        pack: bool = True,
    ) -> None:
        self.config = TrainerConfig(
            lr, epochs, seed, threads, max_grad_norm, micro_batch_size, loss if loss is not None else LossSettings(),
            pack,
        )
        torch.set_num_threads(threads)
        torch.manual_seed(seed)
        self.model_dir = model_dir
        self.steps = 0
        self.model = _load_policy(model_dir)
        self.reference = _frozen_copy(self.model) if self.config.loss.kl_coef > 0.0 else None
        self.names = _checkpoint_names(model_dir, self.model)
        self.pad_id = int(self.model.config.pad_token_id or 0)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.config.lr)

    @classmethod
    def from_config(cls, model_dir: Path, rl: RLConfig) -> PolicyTrainer:
        """The job's trainer: ``rl``'s learning rate, epochs, seed and policy loss (``LossSettings.from_config``)."""
        return cls(model_dir, lr=rl.trainer.lr, epochs=rl.trainer.epochs, seed=rl.seed, loss=LossSettings.from_config(rl))

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    @property
    def max_length(self) -> int:
        return int(self.model.config.max_position_embeddings)

    def train_step(self, samples: Sequence[TrainSample]) -> TrainStats:
        """One update (``epochs`` optimizer steps) over the samples' response tokens; the proximal logprobs are
        the first epoch's own forward pass (detached), the behaviour logprobs the samples' own."""
        started = time.perf_counter()
        batches = self._batches(samples)
        norm = LossNorm(tokens=sum(int(b.mask.sum()) for b in batches), sequences=len(samples))
        tally = _Tally()
        losses, grad_norm = [], 0.0
        for epoch in range(self.config.epochs):
            self.optimizer.zero_grad(set_to_none=True)
            loss = 0.0
            for batch in batches:
                terms = self._backward(batch, norm)
                loss += float(terms.loss.detach())
                tally.add(terms, first_epoch=epoch == 0)
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm))
            self.optimizer.step()
            losses.append(loss)
        self.steps += 1
        return self._stats(batches, norm, tally, sum(losses) / len(losses), grad_norm, started)

    def _stats(
        self, batches: list[PackedBatch], norm: LossNorm, tally: _Tally, loss: float, grad_norm: float, started: float
    ) -> TrainStats:
        tokens = norm.tokens
        return TrainStats(
            loss=loss,
            clip_fraction=tally.clipped / (tokens * self.config.epochs),
            approx_kl=self._approx_kl(batches) / tokens,
            tokens=tokens,
            seconds=time.perf_counter() - started,
            samples=norm.sequences,
            grad_norm=grad_norm,
            logprob_gap=_gap(batches) / tokens,
            ratio_mean=tally.ratio / tokens,
            behaviour_ratio_mean=tally.behaviour_ratio / tokens,
            tis_truncated_fraction=tally.truncated / tokens,
            kl_ref=tally.kl / tokens if self.reference is not None else None,
        )

    def response_logprobs(self, samples: Sequence[TrainSample]) -> list[list[float]]:
        """Current logprobs of each sample's response tokens (in the samples' order)."""
        batches = self._batches(samples, sort=False, pack=False)
        result: list[list[float]] = []
        for batch in batches:
            values = self._logprobs(batch, grad=False)
            for row, mask in zip(values, batch.mask, strict=True):
                result.append(row[mask.bool()].tolist())
        return result

    def save_checkpoint(
        self, root: Path, *, step: int, weight_version: int, keep: int, extra: Mapping[str, Any], rl: Mapping[str, Any]
    ) -> Path:
        """A resumable checkpoint of this trainer under ``root`` (``rose_core.app.rl.trainer.trainer_state``)."""
        return save_checkpoint(root, step=step, weight_version=weight_version, model=self.model,
                               optimizer=self.optimizer, extra=extra, keep=keep, trainer_steps=self.steps, rl=rl)

    def load_checkpoint(self, path: Path) -> CheckpointState:
        """Restore policy, optimizer, generators and step count from a checkpoint folder (or the newest under
        a directory); build the trainer exactly as the run that wrote it did."""
        state = load_checkpoint(path, self.model, self.optimizer)
        self.steps = state.trainer_steps
        return state

    def engine_layout(self) -> EngineLayout:
        """How the rollout engines (vLLM) hold this model's tensors, for the publisher to cut."""
        return engine_layout_of(self.model.config.to_dict())

    def export_weights(self) -> dict[str, torch.Tensor]:
        """bf16 contiguous copies under the checkpoint's own tensor names (what vLLM's loader maps)."""
        state = self.model.state_dict()
        return {name: state[name].detach().to(torch.bfloat16).contiguous() for name in self.names}

    def save(self, directory: Path) -> None:
        """A bf16 model directory (config, tokenizer, safetensors) that vLLM and transformers load."""
        directory.mkdir(parents=True, exist_ok=True)
        for name in _COPIED_FILES:
            if (self.model_dir / name).is_file():
                shutil.copyfile(self.model_dir / name, directory / name)
        save_file(self.export_weights(), str(directory / "model.safetensors"), metadata={"format": "pt"})

    def _backward(self, batch: PackedBatch, norm: LossNorm) -> PolicyLoss:
        """Accumulate the policy loss's gradient for one micro-batch; the first call fixes its proximal (and
        reference) logprobs."""
        new = self._logprobs(batch, grad=True)
        if batch.proximal is None:
            batch.proximal = new.detach()
            if self.reference is not None:
                batch.reference = self._logprobs(batch, grad=False, model=self.reference)
        terms = policy_loss(
            new, batch.proximal, batch.behaviour, batch.mask, batch.advantages, self.config.loss, norm, batch.reference,
            batch.turn_tokens,
        )
        terms.loss.backward()  # type: ignore[no-untyped-call]
        return terms

    def _approx_kl(self, batches: list[PackedBatch]) -> float:
        total = 0.0
        for batch in batches:
            log_ratio = self._logprobs(batch, grad=False) - _proximal(batch)
            total += float(((torch.exp(log_ratio) - 1.0 - log_ratio) * batch.mask).sum())
        return total

    def _logprobs(
        self, batch: PackedBatch, *, grad: bool, model: transformers.PreTrainedModel | None = None
    ) -> torch.Tensor:
        """Logprobs of the response tokens under ``model`` (default the policy), zero where masked. Models stay
        in eval mode (no dropout)."""
        with torch.set_grad_enabled(grad):
            logits = (self.model if model is None else model)(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
            picked = logits.gather(1, batch.positions[:, :, None].expand(-1, -1, logits.shape[-1]))
            logprobs = sampled_logprobs(picked.float(), batch.targets, batch.temperature, batch.top_p)
            return logprobs.gather(2, batch.targets[:, :, None]).squeeze(2) * batch.mask

    def _batches(self, samples: Sequence[TrainSample], *, sort: bool = True, pack: bool | None = None
                 ) -> list[PackedBatch]:
        """Micro-batches of ``micro_batch_size`` rows (one per trajectory, or per turn: ``TrainerConfig.pack``),
        shortest first when ``sort``."""
        if not samples:
            raise ValueError("no samples to train on: pass at least one TrainSample")
        for sample in samples:
            self._check_sample(sample)
        rows: list[Row] = rows_of(samples, pack=self.config.pack if pack is None else pack)
        ordered = sorted(rows, key=lambda row: row[-1].length) if sort else rows
        size = self.config.micro_batch_size
        return [collate(ordered[i : i + size], self.pad_id) for i in range(0, len(ordered), size)]

    def _check_sample(self, sample: TrainSample) -> None:
        if sample.length > self.max_length:
            raise ValueError(
                f"sample {sample.trajectory_id}/{sample.turn_index} has {sample.length} tokens, over the "
                f"model's {self.max_length}: lower max_prompt_tokens"
            )
        highest = max(*sample.prompt_token_ids, *sample.response_token_ids)
        if highest >= self.vocab_size:
            raise ValueError(
                f"token id {highest} is outside the policy's vocabulary of {self.vocab_size}: "
                "tokenize with the policy's own tokenizer"
            )


def sampled_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: torch.Tensor,
                     top_p: torch.Tensor) -> torch.Tensor:
    """Log-probabilities under the distribution each token was sampled from (``temperature``, ``top_p``: [B, T]),
    as vLLM's sampler builds it (and reports it with ``logprobs_mode = processed_logprobs``): the logits divided
    by the token's temperature
    (greedy rows, temperature 0, at 1: vLLM reports those unscaled), then vLLM's top-p rule: sorted ascending,
    the tokens whose cumulative probability is at most ``1 - top_p`` dropped, the most likely one always kept.
    The sampled token itself is never dropped: by construction it was inside the sampler's nucleus, and a
    cumulative sum a rounding away from the boundary must not make its logprob -inf."""
    scale = torch.where(temperature > 0.0, temperature, torch.ones_like(temperature))
    logits = logits / scale[:, :, None]
    if bool((top_p < 1.0).any()):
        ascending, order = logits.sort(dim=-1)
        drop = ascending.softmax(dim=-1).cumsum(dim=-1) <= (1.0 - top_p)[:, :, None]
        drop[..., -1] = False
        drop = torch.zeros_like(drop).scatter(-1, order, drop).scatter(-1, targets[:, :, None], False)
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.log_softmax(logits, dim=-1)


def _gap(batches: Sequence[PackedBatch]) -> float:
    """Summed |proximal - behaviour| logprob over response tokens: large values mean stale or wrong weights."""
    return sum(float(((_proximal(b) - b.behaviour).abs() * b.mask).sum()) for b in batches)


def _proximal(batch: PackedBatch) -> torch.Tensor:
    if batch.proximal is None:
        raise RuntimeError("the batch has no proximal logprobs yet: run its first epoch (_backward) first")
    return batch.proximal


def _frozen_copy(model: transformers.PreTrainedModel) -> transformers.PreTrainedModel:
    """The KL reference: the initial policy's fp32 weights, never trained."""
    reference = copy.deepcopy(model)
    reference.requires_grad_(False)
    reference.eval()
    return reference


def _load_policy(model_dir: Path) -> transformers.PreTrainedModel:
    if not (model_dir / "config.json").is_file():
        raise RoseError(f"no model at {model_dir}: run ensure_models() or pass a Hugging Face model directory")
    with quiet_progress():
        model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()
    return model


def _checkpoint_names(model_dir: Path, model: transformers.PreTrainedModel) -> tuple[str, ...]:
    names = tuple(iter_safetensors_names(model_dir))
    missing = sorted(set(names) - set(model.state_dict()))
    if not names or missing:
        raise RoseError(
            f"the checkpoint in {model_dir} does not match its model ({missing[:3]} not found): regenerate it"
        )
    return names
