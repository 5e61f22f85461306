"""Shared fixtures: tiny models generated once per session into a temp dir, and vLLM CPU settings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rose_core.app.rl.demo.models import ModelPaths, ensure_models

# vLLM's CPU backend: a small KV cache per engine (GiB; overrides kv_cache_gib), quiet logs.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

SECRET = b"executor-tests-secret-0123456789"


@pytest.fixture(autouse=True, scope="session")
def _lease_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The executors' lending leases in a directory of this test session (not the host's)."""
    os.environ["ROSE_LEASE_DIR"] = str(tmp_path_factory.mktemp("leases"))


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> ModelPaths:
    return ensure_models(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def policy_dir(models: ModelPaths) -> Path:
    return models.policy


@pytest.fixture(scope="session")
def serving_dir(models: ModelPaths) -> Path:
    return models.serving
