"""Can the demo's policy learn FrozenLake from a solver's demonstrations, and how fast? A probe for issue 33's
warm start (docs/rl.md, "What a warm start needs"), not part of the product.

Builds (prompt, move) pairs with the job's own ``Episode`` on training maps far from the RL and evaluation seeds
(the header, the rendered board, the turns before; the move as `` right`` plus the end token), a teacher that
plays a shortest path (or, with ``--noise``, a random move that often), trains the demo's policy on the moves
(cross-entropy on the response tokens only) and plays held-out maps greedily before and after.

    python tools/warm_start_probe.py --steps 300 [--lr 2e-3 --schedule onecycle|constant --batch 64
        --maps 4000 --noise 0.0 --eval-maps 32 --models .rose/models --json]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import deque
from pathlib import Path
from typing import Any

import torch
import transformers

from rose_core.app.jobs.rl_job import EVAL_SEED_BASE
from rose_core.app.rl.demo.models import TokenizerCodec, ensure_models, load_tokenizer
from rose_core.app.rl.environments.episode import Episode
from rose_core.app.rl.environments.frozenlake import FrozenLakeEnv
from rose_core.app.rl.environments.lake_map import HOLE, MOVES, Cell, LakeMap

DEMO_SEED_BASE = 10**11
"""Training maps of the demonstrations: far from the RL job's seeds and from the held-out evaluation maps."""
Pair = tuple[list[int], list[int]]


def first_move(lake: LakeMap, at: Cell) -> str:
    """The first move of a shortest path from ``at`` to the goal around the holes (breadth-first)."""
    came: dict[Cell, tuple[Cell, str] | None] = {at: None}
    queue = deque([at])
    while queue:
        here = queue.popleft()
        if here == lake.goal:
            break
        for name, (dr, dc) in MOVES.items():
            there = (here[0] + dr, here[1] + dc)
            if lake.inside(there) and lake.cell(there) != HOLE and there not in came:
                came[there] = (here, name)
                queue.append(there)
    here, move = lake.goal, ""
    while (step := came[here]) is not None:
        here, move = step
    return move


def demonstrations(codec: TokenizerCodec, maps: int, noise: float, rng: random.Random) -> list[Pair]:
    pairs: list[Pair] = []
    for seed in range(DEMO_SEED_BASE, DEMO_SEED_BASE + maps):
        env = FrozenLakeEnv(seed)
        episode = Episode(f"demo-{seed}", "demo", env, codec, 512)
        while not episode.done:
            move = rng.choice(list(MOVES)) if rng.random() < noise else first_move(env.lake, env.position)
            response = [*codec.encode(" " + move), codec.eos_id]
            pairs.append((episode.prompt(), response))
            episode.advance(response, [0.0] * len(response), 0)
    return pairs


def success(model: Any, codec: TokenizerCodec, maps: int) -> float:
    """Greedy play (8 tokens a turn, as the demo's rollout) on ``maps`` held-out maps: the share reaching the goal."""
    model.eval()
    solved = 0
    with torch.no_grad():
        for i in range(maps):
            env = FrozenLakeEnv(EVAL_SEED_BASE + i)
            episode = Episode(f"eval-{i}", "eval", env, codec, 512)
            while not episode.done:
                prompt = torch.tensor([episode.prompt()])
                out = model.generate(prompt, max_new_tokens=8, do_sample=False, eos_token_id=codec.eos_id,
                                     pad_token_id=codec.pad_id)
                response = out[0, prompt.shape[1]:].tolist()
                episode.advance(response, [0.0] * len(response), 0)
            solved += env.success
    model.train()
    return solved / maps


def batch_of(pairs: list[Pair], pad: int) -> dict[str, torch.Tensor]:
    width = max(len(p) + len(r) for p, r in pairs)
    ids = torch.full((len(pairs), width), pad)
    labels = torch.full((len(pairs), width), -100)
    mask = torch.zeros((len(pairs), width), dtype=torch.long)
    for i, (prompt, response) in enumerate(pairs):
        sequence = prompt + response
        ids[i, : len(sequence)] = torch.tensor(sequence)
        mask[i, : len(sequence)] = 1
        labels[i, len(prompt) : len(sequence)] = torch.tensor(response)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--schedule", choices=("onecycle", "constant"), default="onecycle")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--maps", type=int, default=4000)
    parser.add_argument("--noise", type=float, default=0.0, help="how often the teacher moves at random")
    parser.add_argument("--eval-maps", type=int, default=32)
    parser.add_argument("--models", type=Path, default=Path(".rose/models"))
    parser.add_argument("--save", type=Path, help="save the trained policy (bf16, with its tokenizer) here")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rng = random.Random(0)
    torch.manual_seed(0)
    paths = ensure_models(args.models)
    codec = load_tokenizer(paths.policy)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(paths.policy), dtype=torch.float32)
    pairs = demonstrations(codec, args.maps, args.noise, rng)
    before = success(model, codec, args.eval_maps)
    optimiser = torch.optim.AdamW(model.parameters(), lr=args.lr)
    schedule = (torch.optim.lr_scheduler.OneCycleLR(optimiser, max_lr=args.lr, total_steps=args.steps, pct_start=0.1)
                if args.schedule == "onecycle" else None)
    started, losses = time.perf_counter(), []
    for step in range(args.steps):
        loss = model(**batch_of(rng.sample(pairs, args.batch), codec.pad_id)).loss
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        if schedule is not None:
            schedule.step()
        losses.append(loss.item())
        if not args.json and (step % 100 == 0 or step == args.steps - 1):
            print(f"step {step}: loss {loss.item():.3f} ({time.perf_counter() - started:.0f} s)", flush=True)
    if args.save is not None:
        import shutil
        shutil.copytree(paths.policy, args.save, dirs_exist_ok=True)
        model.to(torch.bfloat16).save_pretrained(str(args.save))
        model.to(torch.float32)
    result = {"pairs": len(pairs), "steps": args.steps, "train_s": round(time.perf_counter() - started, 1),
              "final_loss": round(sum(losses[-20:]) / len(losses[-20:]), 4), "eval_maps": args.eval_maps,
              "success_before": before, "success_after": success(model, codec, args.eval_maps)}
    print(json.dumps(result) if args.json else
          f"{result['pairs']} pairs; {args.steps} steps in {result['train_s']} s; eval success "
          f"{before:.2f} -> {result['success_after']:.2f} on {args.eval_maps} held-out maps")


if __name__ == "__main__":
    main()
