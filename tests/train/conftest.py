"""Fixtures for tests that need the ``rose-core[train]`` extra: the tiny models, generated once per session."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from rose_core.app.rl.demo.models import ModelPaths, ensure_models
from rose_core.app.rl.trainer.trainer import PolicyTrainer


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> ModelPaths:
    return ensure_models(tmp_path_factory.mktemp("rose-models"))


@pytest.fixture
def make_trainer(models: ModelPaths) -> Callable[..., PolicyTrainer]:
    """Fresh reference trainers over the tiny policy (or ``model_dir``), each with its own AdamW."""

    def make(model_dir: Path | None = None, *, lr: float = 1e-3) -> PolicyTrainer:
        return PolicyTrainer(model_dir or models.policy, lr=lr, seed=0)

    return make
