"""`rose run` with `rl.trainer = "external"`: ROSE rolls out (FrozenLake, both pools) and a trainer outside it,
here in the test process, pulls each step's batch from the trainer API with the package's client
(`rose_core.app.trainer_client`: one sequence per trajectory, binary) and the trainer's own key, trains ROSE's reference trainer on it
(any trainer would do), and publishes the next version itself through the shard intake; the job announces it
and the next step's turns run on it. Real engines, real sockets, a real trainer and publisher."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from rose_core.app.rl.demo.models import ensure_models
from rose_core.app.rl.trainer.trainer import PolicyTrainer
from rose_core.app.trainer_client import TrainerClient
from rose_core.protocol.auth import load_secret
from rose_transfer import ShardPublisher
from rose_transfer.plan.engine_layout import to_engine_layout

from .rose_run_support import LiveRun

STEPS = 2
CONFIG = """
models_dir = "{work}/models"
run_dir = "{work}/run"

[rl]
trainer.kind = "external"
max_tokens_per_turn = 24
algorithm = "grpo"
eval.every = 0
"""


def external_trainer(api: str, key: str, secret: bytes, policy: Path, seen: list[dict[str, Any]]) -> None:
    """Pull (the packed binary batch, with the package's client, as data-parallel rank 0 of 1), train, publish,
    for every step of the run; the first step's JSON form is checked against the binary one."""
    trainer = PolicyTrainer(policy, lr=1e-3, seed=0)
    client = TrainerClient(api, key, rank=0, world=1, timeout_s=90)
    while len(seen) < STEPS:
        batch = client.next_batch(wait_s=30, after=seen[-1]["step"] if seen else None)
        if batch is None:
            continue  # none yet, or still the one trained: its version is on its way
        samples = batch.train_samples()
        if not seen:
            as_json = httpx.get(f"{api}/trainer/next", headers={"Authorization": f"Bearer {key}"}, timeout=30).json()
            assert sorted((s["trajectory_id"], s["turn_index"]) for s in as_json["samples"]) == \
                sorted((s.trajectory_id, s.turn_index) for s in samples)
        stats = trainer.train_step(samples)
        tensors = to_engine_layout(trainer.export_weights(), trainer.engine_layout())
        with ShardPublisher(secret=secret, intake=batch.wire.intake, rank=0, ranks=batch.wire.ranks) as publisher:
            announce = publisher.publish_shard(batch.publish_version, batch.step, tensors)
        seen.append({"step": batch.step, "version": announce.version, "samples": len(samples),
                     "trajectories": len(set(batch.wire.row_trajectories)), "loss": stats.loss})


@pytest.fixture(scope="module")
def external_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("rose-run-external")
    policy = ensure_models(work / "models").policy
    seen: list[dict[str, Any]] = []
    with LiveRun(work, CONFIG.format(work=work), STEPS) as run:
        found = run.wait_for_line(r"trainer-api (http://\S+) key-file (\S+) intake (\S+) ranks 1")
        key = Path(found.group(2)).read_text().strip()
        worker = threading.Thread(target=external_trainer, daemon=True,
                                  args=(found.group(1), key, load_secret(str(work / "run" / "secret")), policy, seen))
        worker.start()
        report = run.finish()
        worker.join(timeout=60)
    return {"report": report, "seen": seen}


def test_the_external_trainer_trains_every_step_and_its_versions_reach_the_executors(
        external_run: dict[str, Any]) -> None:
    report, seen = external_run["report"], external_run["seen"]
    assert report["ok"], f"{report['error']}\n{report['_stderr'][-3000:]}\n{report['_logs']}"
    assert [s["version"] for s in seen] == [1, 2] and [s["published_version"] for s in report["steps"]] == [1, 2]
    for mine, step in zip(seen, report["steps"], strict=True):
        assert mine["trajectories"] == step["trajectories"] and mine["samples"] > 0
    assert report["lost_trajectories"] == 0 and report["version_mismatches"] == 0
    assert report["weight_digest_mismatches"] == 0  # the engines hold exactly what the trainer published
    assert report["steps"][1]["weight_version"] == 1  # step 2 rolled out on the external trainer's version
    assert all(e["weight_version"] == 2 for e in report["executors"])
