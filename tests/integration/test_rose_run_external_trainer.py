"""`rose run` with `rl.trainer = "external"`: ROSE rolls out (FrozenLake, both pools) and a trainer outside it,
two processes as two data-parallel ranks (`dp_trainer.py`: gradients averaged with torch.distributed), each
pulls its part of each step's batch from the trainer API with the package's client
(`rose_core.app.trainer_client`: one sequence per trajectory, binary) with the trainer's own key, trains ROSE's
reference trainer on it (any trainer would do), and rank 0 publishes the next version through the shard intake;
the job announces it and the next step's turns run on it. Real engines, real sockets, real trainer processes and
a real publisher."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rose_core.app.rl.demo.models import ensure_models
from rose_core.support.metrics import free_port

from .rose_run_support import LiveRun

STEPS = 3
WORLD = 2
GROUPS, GROUP_SIZE = 3, 4
DP_TRAINER = Path(__file__).with_name("dp_trainer.py")
CONFIG = """
models_dir = "{work}/models"
run_dir = "{work}/run"

[rl]
trainer.kind = "external"
prompts_per_step = 3
group_size = 4
max_tokens_per_turn = 24
algorithm = "grpo"
eval.every = 0
"""


@pytest.fixture(scope="module")
def external_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("rose-run-external")
    policy = ensure_models(work / "models").policy
    with LiveRun(work, CONFIG.format(work=work), STEPS) as run:
        found = run.wait_for_line(r"trainer-api (http://\S+) key-file (\S+) intake (\S+) ranks 1")
        port = str(free_port())
        ranks = [subprocess.Popen([sys.executable, str(DP_TRAINER), str(rank), str(WORLD), str(STEPS), found.group(1),
                                   found.group(2), str(work / "run" / "secret"), str(policy), port,
                                   str(work / f"rank-{rank}.jsonl")], stdout=subprocess.DEVNULL,
                                  stderr=(work / f"rank-{rank}.log").open("wb"))
                 for rank in range(WORLD)]
        report = run.finish()
        codes = [rank.wait(timeout=120) for rank in ranks]
    seen = [[json.loads(line) for line in (work / f"rank-{rank}.jsonl").read_text().splitlines()]
            for rank in range(WORLD)]
    logs = "\n".join((work / f"rank-{rank}.log").read_text()[-2000:] for rank in range(WORLD))
    return {"report": report, "seen": seen, "codes": codes, "logs": logs}


def test_two_data_parallel_ranks_train_every_step_and_their_versions_reach_the_executors(
        external_run: dict[str, Any]) -> None:
    """Each step: the two ranks pulled each group as it completed (its own part, before the step's end) and
    then the final part; their shares are disjoint and together hold every turn, took the same step (their
    weights agree), and rank 0's version reached every engine; each rank's step is at most 1.2x its payload (each
    unique token's id and each sampled token's logprob, once: every prompt is sent once, not once per turn), and
    what it received (gzipped) at most 1.2x its unique tokens' int32 bytes."""
    report, seen = external_run["report"], external_run["seen"]
    assert report["ok"], f"{report['error']}\n{report['_stderr'][-3000:]}\n{report['_logs']}"
    assert external_run["codes"] == [0] * WORLD, external_run["logs"]
    assert [s["published_version"] for s in report["steps"]] == list(range(1, STEPS + 1))
    for step, (zero, one) in enumerate(zip(*seen, strict=True), start=1):
        assert zero["step"] == one["step"] == step and zero["turns"] and one["turns"]
        # each of the step's groups came as its own part as it completed, then the final (empty) part
        assert [(k, final) for k, final, _ in zero["parts"]] == [(k, k == GROUPS) for k in range(GROUPS + 1)]
        for part in (zero, one):  # the ranks' shares of a group: two of its four trajectories each
            assert [rows for _, _, rows in part["parts"]] == [GROUP_SIZE // WORLD] * GROUPS + [0], part["parts"]
        turns = [tuple(t) for t in zero["turns"] + one["turns"]]
        assert len(set(turns)) == len(turns) == zero["step_turns"]
        assert zero["weights_sum"] == pytest.approx(one["weights_sum"], rel=1e-9)
        for part in (zero, one):  # each unique token's id, and each sampled token's logprob, once; gzipped
            assert part["bytes"] <= 1.2 * (part["token_bytes"] + part["logprob_bytes"]), part
            assert part["received_bytes"] <= 1.2 * part["token_bytes"], part
    assert report["lost_trajectories"] == 0 and report["version_mismatches"] == 0
    assert report["weight_digest_mismatches"] == 0  # the engines hold exactly what rank 0 published
    assert report["steps"][1]["weight_version"] == 1  # step 2 rolled out on the external trainer's version
    assert all(e["weight_version"] == STEPS for e in report["executors"])
