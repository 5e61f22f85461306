"""Does the README demo learn? An in-process proxy of the live RL loop (``rose run``), for choosing ``RLConfig``
defaults without vLLM.

Same code paths as ``rose_core.app.jobs.rl_job`` except the sampler: per step the episodes are built exactly as
``RLJob._start_rollout`` builds them (env seed ``rl.seed * 1_000_003 + step * 1000 + p``, ``FrozenLakeEnv``,
``Episode``, the policy's codec from ``load_tokenizer``), each turn is sampled from the trainer's own Hugging Face
model (``torch.multinomial`` at ``rl.sampling.temperature``, at most ``rl.max_tokens_per_turn`` tokens, stopping after EOS,
which is kept in the response as vLLM keeps it), the sampled tokens' logprobs are the behaviour logprobs, and the
step trains with ``build_samples_from_config`` + ``PolicyTrainer.from_config(...).train_step``.

Differences from the live system: the live sampler is vLLM in bf16 from weights re-exported after every step;
this proxy samples from the fp32 trainer model (so behaviour == proximal up to float noise, where live has a
small bf16 gap), with its own RNG stream, so the numbers are a proxy of the live run's, not a replay of them. DAPO
here means DAPO's loss presets (clip-higher, token-mean); the proxy does no dynamic sampling.

Live time is estimated, not measured: rollout seconds ∝ turns sampled and train seconds ∝ trained tokens
(prompt + response, times epochs), calibrated on the live demo (12 trajectories x ~3 turns: ~5 s rollout, ~2.5 s
train at 2 epochs), plus a small per-step weight-sync constant. The proxy's own sampling/training seconds are
printed too.

    /work/bin/wtrun python tools/learning_sweep.py --steps 15 --seed 0,1 [--lr 3e-3 --prompts 4 --group 4
        --epochs 2 --max-turns 4 --env-size 4 --algorithm grpo|dapo --json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Live calibration (the demo on 2 cores, vLLM on CPU): 12 trajectories x ~3 turns.
LIVE_ROLLOUT_S_PER_TURN = 5.0 / 36.0
LIVE_TRAIN_S_PER_TOKEN_EPOCH = 2.5 / (36 * 143 * 2)
"""~36 samples of ~143 tokens (prompt + response; measured with this tool at the old defaults), 2 epochs."""
LIVE_SYNC_S = 0.5
"""Export + publish + apply of the tiny policy's weights, per step."""
LIVE_STARTUP_S = 70.0


@dataclass
class StepResult:
    step: int
    reward_mean: float
    success_rate: float
    trajectories: int
    turns: int
    train_tokens: int
    sample_seconds: float
    train_seconds: float
    live_seconds_est: float
    loss: float
    approx_kl: float
    clip_fraction: float


@dataclass
class RunResult:
    settings: dict[str, Any]
    steps: list[StepResult] = field(default_factory=list)

    @property
    def rewards(self) -> list[float]:
        return [s.reward_mean for s in self.steps]

    def summary(self) -> dict[str, Any]:
        r, succ = self.rewards, [s.success_rate for s in self.steps]
        k = min(5, len(r) // 2) or 1
        return {
            "first5": statistics.fmean(r[:k]),
            "last5": statistics.fmean(r[-k:]),
            "delta": statistics.fmean(r[-k:]) - statistics.fmean(r[:k]),
            "success_first5": statistics.fmean(succ[:k]),
            "success_last5": statistics.fmean(succ[-k:]),
            "live_rl_seconds_est": sum(s.live_seconds_est for s in self.steps),
            "proxy_seconds": sum(s.sample_seconds + s.train_seconds for s in self.steps),
        }


def make_config(args: argparse.Namespace, seed: int) -> Any:
    from rose_core.app.rl_config import RLConfig, SamplingConfig, TrainerConfig

    return RLConfig(
        steps=args.steps, prompts_per_step=args.prompts, group_size=args.group, max_turns=args.max_turns,
        max_tokens_per_turn=args.max_tokens, sampling=SamplingConfig(temperature=args.temperature),
        trainer=TrainerConfig(lr=args.lr, epochs=args.epochs), env_size=args.env_size, seed=seed,
        algorithm=args.algorithm,
    )


def sample_turn(model: Any, prompt: list[int], max_tokens: int, temperature: float, eos_id: int,
                generator: Any) -> tuple[list[int], list[float]]:
    """One response: multinomial at ``temperature`` (greedy at 0), logprobs of the sampled tokens under the
    tempered distribution (what vLLM reports), stopping after EOS."""
    import torch

    tokens: list[int] = []
    logprobs: list[float] = []
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt]), use_cache=True)
        for _ in range(max_tokens):
            logits = out.logits[0, -1].float()
            if temperature > 0:
                logp = torch.log_softmax(logits / temperature, dim=-1)
                token = int(torch.multinomial(logp.exp(), 1, generator=generator))
            else:
                logp = torch.log_softmax(logits, dim=-1)
                token = int(logp.argmax())
            tokens.append(token)
            logprobs.append(min(float(logp[token]), 0.0))
            if token == eos_id:
                break
            out = model(input_ids=torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True)
    return tokens, logprobs


def run(rl: Any, models_dir: Path, *, verbose: bool = True) -> RunResult:
    import torch

    from rose_core.app.rl.algorithm.grpo import build_samples_from_config
    from rose_core.app.rl.demo.models import ensure_models, load_tokenizer
    from rose_core.app.rl.environments.episode import Episode
    from rose_core.app.rl.environments.frozenlake import FrozenLakeEnv
    from rose_core.app.rl.trainer.trainer import PolicyTrainer

    models = ensure_models(models_dir)
    codec = load_tokenizer(models.policy)
    trainer = PolicyTrainer.from_config(models.policy, rl)  # threads=1, as in the live job
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(rl.seed)
    result = RunResult(settings=rl.to_dict() if hasattr(rl, "to_dict") else _fields(rl))
    for step in range(1, rl.steps + 1):
        t0 = time.perf_counter()
        episodes = []
        for p in range(rl.prompts_per_step):  # RLJob._start_rollout
            seed = rl.seed * 1_000_003 + step * 1000 + p
            for g in range(rl.group_size):
                env = FrozenLakeEnv(seed=seed, size=rl.env_size, max_turns=rl.max_turns)
                episodes.append(Episode(f"s{step}-p{p}-g{g}", f"s{step}-p{p}", env, codec, rl.max_context_tokens))
        turns = 0
        version = step - 1
        for episode in episodes:
            while not episode.done:
                ids, lps = sample_turn(trainer.model, episode.prompt(), rl.max_tokens_per_turn, rl.sampling.temperature,
                                       codec.eos_id, generator)
                episode.advance(ids, lps, version)
                turns += 1
        sample_s = time.perf_counter() - t0
        trajectories = [e.trajectory for e in episodes]
        samples = build_samples_from_config(trajectories, rl)
        t1 = time.perf_counter()
        stats = trainer.train_step(samples)
        train_s = time.perf_counter() - t1
        tokens = sum(s.length for s in samples)
        live = turns * LIVE_ROLLOUT_S_PER_TURN + tokens * rl.trainer.epochs * LIVE_TRAIN_S_PER_TOKEN_EPOCH + LIVE_SYNC_S
        sr = StepResult(
            step=step, reward_mean=statistics.fmean(t.total_reward for t in trajectories),
            success_rate=statistics.fmean(float(t.success) for t in trajectories), trajectories=len(trajectories),
            turns=turns, train_tokens=tokens, sample_seconds=sample_s, train_seconds=train_s,
            live_seconds_est=live, loss=stats.loss, approx_kl=stats.approx_kl, clip_fraction=stats.clip_fraction,
        )
        result.steps.append(sr)
        if verbose:
            print(f"  seed {rl.seed} step {step:2d}: reward {sr.reward_mean:+.3f} success {sr.success_rate:.2f} "
                  f"turns {turns:3d} tokens {tokens:5d} | proxy sample {sample_s:4.1f}s train {train_s:4.1f}s "
                  f"| live est {live:4.1f}s | kl {stats.approx_kl:.4f} clip {stats.clip_fraction:.3f}",
                  file=sys.stderr, flush=True)
    return result


def _fields(rl: Any) -> dict[str, Any]:
    top = {k: getattr(rl, k) for k in ("steps", "prompts_per_step", "group_size", "max_turns", "max_tokens_per_turn",
                                       "env_size", "seed", "algorithm")}
    return {**top, "temperature": rl.sampling.temperature, "lr": rl.trainer.lr, "epochs": rl.trainer.epochs,
            "clip_low": rl.loss.clip_low, "clip_high": rl.loss.clip_high, "loss_agg": rl.loss.loss_agg}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--seed", default="0", help="one seed or a comma list (run one after the other)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--prompts", type=int, default=3, help="prompts_per_step")
    ap.add_argument("--group", type=int, default=4, help="group_size")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=8, help="max_tokens_per_turn")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--env-size", type=int, default=4)
    ap.add_argument("--algorithm", choices=("grpo", "dapo"), default="grpo")
    ap.add_argument("--models-dir", type=Path, default=Path(".rose/models"))
    ap.add_argument("--json", action="store_true", help="one JSON object per seed on stdout")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    seeds = [int(s) for s in str(args.seed).split(",")]
    deltas = []
    for seed in seeds:
        rl = make_config(args, seed)
        res = run(rl, args.models_dir, verbose=not args.json)
        summ = res.summary()
        deltas.append(summ["delta"])
        if args.json:
            print(json.dumps({"settings": res.settings, "summary": summ,
                              "steps": [asdict(s) for s in res.steps]}), flush=True)
        else:
            print(f"seed {seed}: first5 {summ['first5']:+.3f} last5 {summ['last5']:+.3f} delta {summ['delta']:+.3f} "
                  f"success {summ['success_first5']:.2f}->{summ['success_last5']:.2f} | est. live RL "
                  f"{summ['live_rl_seconds_est']:.0f}s (+{LIVE_STARTUP_S:.0f}s start-up) | proxy "
                  f"{summ['proxy_seconds']:.0f}s", flush=True)
    if not args.json and len(seeds) > 1:
        print(f"min delta over seeds {seeds}: {min(deltas):+.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
