"""Trainer time per step with one sequence per trajectory against one per turn, side by side in one invocation:
the reference trainer (`PolicyTrainer.train_step`, the product's) over the same 10-turn trajectories (prompts
that grow by each response and a new observation, as an agent's session does), alternating which form goes
first on each repeat. Prints the median seconds per step of each, their ratio, and the forward tokens each
form scores (the per-turn form re-scores every turn's whole prefix).

    python3 benchmarks/trainer_packing.py [--trajectories 16 --turns 10 --repeats 5 --models .rose/models --json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

from rose_core.app.rl.algorithm.sample import TrainSample
from rose_core.app.rl.algorithm.trajectory_rows import rows_of
from rose_core.app.rl.demo.models import ensure_models
from rose_core.app.rl.trainer.trainer import PolicyTrainer


def agent_samples(trajectories: int, turns: int, seed: int) -> list[TrainSample]:
    """Trajectories of ``turns`` turns: a 64-token first prompt, 8-24-token responses, 16-32-token observations."""
    rng = random.Random(seed)
    samples = []
    for t in range(trajectories):
        prompt = tuple(rng.randrange(8, 150) for _ in range(64))
        advantage = rng.uniform(-1.0, 1.0)
        for index in range(turns):
            response = tuple(rng.randrange(8, 150) for _ in range(rng.randint(8, 24)))
            samples.append(TrainSample(f"t{t}", index, prompt, response, tuple(-3.0 for _ in response), 0, advantage))
            prompt = prompt + response + tuple(rng.randrange(8, 150) for _ in range(rng.randint(16, 32)))
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trajectories", type=int, default=16)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--models", type=Path, default=Path(".rose/models"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    policy = ensure_models(args.models).policy
    samples = agent_samples(args.trajectories, args.turns, seed=0)
    trainers = {"packed": PolicyTrainer(policy, pack=True), "per_turn": PolicyTrainer(policy, pack=False)}
    seconds: dict[str, list[float]] = {name: [] for name in trainers}
    for repeat in range(args.repeats):
        for name in (list(trainers) if repeat % 2 == 0 else list(reversed(trainers))):
            started = time.perf_counter()
            trainers[name].train_step(samples)
            seconds[name].append(time.perf_counter() - started)
    forward_tokens = {name: sum(row[-1].length for row in rows_of(samples, pack=name == "packed"))
                      for name in trainers}
    result: dict[str, Any] = {
        "trajectories": args.trajectories, "turns": args.turns, "repeats": args.repeats,
        "seconds_per_step": {name: round(statistics.median(v), 4) for name, v in seconds.items()},
        "forward_tokens": forward_tokens,
    }
    result["per_turn_over_packed"] = round(result["seconds_per_step"]["per_turn"]
                                           / result["seconds_per_step"]["packed"], 2)
    if args.json:
        print(json.dumps(result))
        return
    print(f"{args.trajectories} trajectories x {args.turns} turns, {args.repeats} steps each, medians:")
    for name in trainers:
        print(f"  {name:9s} {result['seconds_per_step'][name]:.3f} s/step, {forward_tokens[name]} tokens scored")
    print(f"  one sequence per trajectory is {result['per_turn_over_packed']}x faster")


if __name__ == "__main__":
    main()
