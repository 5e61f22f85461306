"""What the RL job needs of ROSE's own trainer (``rose_core.app.rl.trainer.trainer.PolicyTrainer`` is one): a step
on samples, its weights to publish and the engines' layout of them, checkpoints. A trainer outside ROSE is an
``ExternalTrainer`` instead (the job hands it batches and waits for its versions)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from rose_core.app.rl.algorithm.sample import TrainSample
from rose_core.protocol.engine_layout import EngineLayout


class Trainer(Protocol):
    def train_step(self, samples: list[TrainSample]) -> Any: ...

    def export_weights(self) -> dict[str, Any]: ...

    def engine_layout(self) -> EngineLayout: ...

    def save_checkpoint(self, root: Path, *, step: int, weight_version: int, keep: int, extra: Mapping[str, Any],
                        rl: Mapping[str, Any]) -> Path: ...

    def load_checkpoint(self, path: Path) -> Any: ...
