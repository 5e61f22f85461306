"""Fixtures for tests that need the ``rose-core[train]`` extra: the tiny models, generated once per session."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from rose_core.rl.models import ModelPaths, ensure_models


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> ModelPaths:
    return ensure_models(tmp_path_factory.mktemp("rose-models"))
