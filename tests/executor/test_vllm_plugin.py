"""ROSE's vLLM plugin bounds vLLM's lost-wakeup stall in every vLLM process (it is found by entry point)."""

from __future__ import annotations

from collections.abc import Iterator
from importlib.metadata import entry_points

import pytest
from vllm.distributed.device_communicators import shm_broadcast

from rose_executor.engine import vllm_plugin


@pytest.fixture(autouse=True)
def vllms_value() -> Iterator[None]:
    before = shm_broadcast.SHM_READER_RECHECK_INTERVAL_MS
    shm_broadcast.SHM_READER_RECHECK_INTERVAL_MS = 5000
    yield
    shm_broadcast.SHM_READER_RECHECK_INTERVAL_MS = before


def test_vllm_finds_the_plugin_by_its_entry_point() -> None:
    found = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert found.get("rose") == "rose_executor.engine.vllm_plugin:register"


def test_it_lowers_the_idle_readers_recheck(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(vllm_plugin.RECHECK_ENV, raising=False)
    vllm_plugin.register()
    assert shm_broadcast.SHM_READER_RECHECK_INTERVAL_MS == vllm_plugin.DEFAULT_RECHECK_MS
    vllm_plugin.register()  # vLLM may load plugins more than once per process
    assert shm_broadcast.SHM_READER_RECHECK_INTERVAL_MS == vllm_plugin.DEFAULT_RECHECK_MS


def test_zero_leaves_vllm_alone_and_nonsense_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(vllm_plugin.RECHECK_ENV, "0")
    vllm_plugin.register()
    assert shm_broadcast.SHM_READER_RECHECK_INTERVAL_MS == 5000
    monkeypatch.setenv(vllm_plugin.RECHECK_ENV, "soon")
    vllm_plugin.register()
    assert shm_broadcast.SHM_READER_RECHECK_INTERVAL_MS == vllm_plugin.DEFAULT_RECHECK_MS
