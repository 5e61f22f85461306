"""One data-parallel rank of an external trainer, as its own process (the external-trainer run starts two):
pulls its share of each step's batch with ``TrainerClient``, part by part as the job's groups complete
(``step_parts``; a trainer with its own loop would run forward and backward on each part as it comes), trains ROSE's reference trainer on it with the
gradients averaged across the ranks (torch.distributed, gloo: a hook on every parameter all-reduces each
backward's gradient, so both ranks take the same step), and rank 0 publishes the next version through the
shard intake (one tensor-parallel rank). Writes what it saw, one JSON line per step, to ``OUT``.

    python dp_trainer.py RANK WORLD STEPS API KEY_FILE SECRET_FILE POLICY_DIR RENDEZVOUS_PORT OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from rose_core.app.jobs.trainer_batch import encode
from rose_core.app.rl.trainer.trainer import PolicyTrainer
from rose_core.app.trainer_client import TrainerClient
from rose_core.protocol.auth import load_secret
from rose_transfer import ShardPublisher
from rose_transfer.plan.engine_layout import to_engine_layout


def main() -> None:
    rank, world, steps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    api, key_file, secret_file, policy, port, out = sys.argv[4:10]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    trainer = PolicyTrainer(Path(policy), lr=1e-3, seed=0)
    for parameter in trainer.model.parameters():
        parameter.register_hook(_averaged(world))
    client = TrainerClient(api, key_file=key_file, rank=rank, world=world, timeout_s=90)
    secret = load_secret(secret_file)
    last = None
    with open(out, "w") as record:
        while last is None or last < steps:
            parts = list(client.step_parts(wait_s=30, after=last))  # groups as they complete, the last final
            samples = [s for part in parts for s in part.train_samples()]
            batch = parts[-1]
            stats = trainer.train_step(samples)
            if rank == 0:
                tensors = to_engine_layout(trainer.export_weights(), trainer.engine_layout())
                with ShardPublisher(secret=secret, intake=batch.wire.intake, rank=0, ranks=batch.wire.ranks) as pub:
                    pub.publish_shard(batch.publish_version, batch.step, tensors)
            digest = float(sum(p.detach().double().sum() for p in trainer.model.parameters()))
            record.write(json.dumps({
                "step": batch.step, "turns": sorted([s.trajectory_id, s.turn_index] for s in samples),
                "parts": [[part.wire.part, part.final, len(part.wire.row_trajectories)] for part in parts],
                "step_turns": sum(part.wire.samples for part in parts),
                "bytes": sum(len(encode(part.wire)) for part in parts),
                "received_bytes": sum(part.received_bytes for part in parts),
                "token_bytes": sum(4 * len(part.tokens) for part in parts),
                "logprob_bytes": sum(4 * len(part.behaviour_logprobs) for part in parts),
                "loss": stats.loss, "weights_sum": digest}) + "\n")
            record.flush()
            last = batch.step
    dist.destroy_process_group()


def _averaged(world: int):  # type: ignore[no-untyped-def]
    def hook(grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad / world
    return hook


if __name__ == "__main__":
    main()
