"""`rose run` at an RL learning rate with two clusters in config: the remote one pulls every version through a
relay over UCX, and the weight links are encrypted (`weights_tls`: the publisher and the relay's upstream link
are TLS; the trainer-side executor pulls over TLS). Real vLLM CPU engines, a real relay, real UCX, real TLS,
real trainer."""

from __future__ import annotations

import pytest

from .rose_run_support import run_report as rose_run

STEPS = 3
CONFIG = """
models_dir = "{work}/models"
run_dir = "{work}/run"

[controller]
weights_tls = true

[rl]
trainer.lr = 1e-6

[[clusters]]
name = "trainer-side"
executors = ["dedicated-0"]
relay = "none"

[[clusters]]
name = "remote"
executors = ["serving-0"]
relay = "start"
transport = "ucx"
"""


@pytest.fixture(scope="module")
def run_report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    work = tmp_path_factory.mktemp("rose-run-clusters")
    return rose_run(work, CONFIG.format(work=work), STEPS)


def test_the_run_finishes_ok_with_every_turn_on_its_version(run_report: dict) -> None:
    assert run_report["ok"], f"{run_report['error']}\n{run_report['_stderr'][-3000:]}\n{run_report['_logs']}"
    assert run_report["version_mismatches"] == 0
    assert "cluster remote: serving-0 pull weights through ucx://" in run_report["_stdout"]
    assert " weights tls://" in run_report["_stdout"]  # the publisher serves TLS only: every pull was encrypted


def test_every_engine_holds_the_trainers_weights_every_step(run_report: dict) -> None:
    assert run_report["weight_digest_mismatches"] == 0
    for step in run_report["steps"]:
        assert all(e["digest_ok"] for e in step["sync_breakdown"]["executors"].values()), step["step"]


def test_the_link_carries_each_version_once_and_patches_after_the_first(run_report: dict) -> None:
    """The remote cluster's link carries the first version whole, then at most a tenth of it per version."""
    first, *rest = run_report["steps"]
    dense = first["link_bytes"]["remote"]
    remote = first["sync_breakdown"]["executors"]["serving-0"]
    assert remote["full_sync"] and dense >= remote["bytes_received"] * 0.9  # it came through the relay
    print(f"\nbytes over the remote link per version: {[s['link_bytes']['remote'] for s in run_report['steps']]}")
    for step in rest:
        assert step["link_bytes"]["remote"] <= dense / 10, step["step"]
        assert not step["sync_breakdown"]["executors"]["serving-0"]["full_sync"]
