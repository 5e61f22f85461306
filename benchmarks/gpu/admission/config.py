"""The bench's settings (command line -> ``Config``) and its progress log (stderr)."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import torch

_T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')} +{elapsed_s():7.2f}s] {msg}", file=sys.stderr, flush=True)


def elapsed_s() -> float:
    """Seconds since the bench was imported."""
    return time.perf_counter() - _T0


@dataclass
class Config:
    device: str = "cuda"
    hidden: int = 4096
    ffn: int = 14336
    serve_tokens: int = 32
    layers: int = 32
    chunk_tokens: int = 512
    chunk_gemms: int = 8
    seconds: float = 8.0
    rollout_alone_seconds: float = 3.0
    duty: float = 0.5
    burst_steps: int = 40
    tpot_slo_mult: float = 1.1
    ttft_extra_chunks: float = 1.5
    margin_ms: float = 0.05
    green_sms: int = 8
    green_tpot_mult: float = 1.25
    graphs: bool = True
    seed: int = 0
    smoke: bool = False
    max_total_s: float = 140.0

    @property
    def chunk_flop(self) -> float:
        return 2.0 * self.chunk_tokens * self.hidden * self.ffn * self.chunk_gemms

    @property
    def green_flop(self) -> float:
        return 2.0 * self.chunk_tokens * self.hidden * self.ffn


def smoke_config(cfg: Config) -> Config:
    cfg.hidden, cfg.ffn, cfg.serve_tokens, cfg.layers = 128, 256, 8, 4
    cfg.chunk_tokens, cfg.chunk_gemms = 64, 2
    cfg.seconds = min(cfg.seconds, 0.3)
    cfg.rollout_alone_seconds = min(cfg.rollout_alone_seconds, 0.2)
    cfg.burst_steps = 8
    # the margin scales with the work: the GPU default (0.05 ms) is about a smoke chunk's whole CPU time, which
    # would leave the guarded scenario nothing to admit, even in an idle gap (slack 0.5 chunk)
    cfg.margin_ms = min(cfg.margin_ms, 0.005)
    cfg.max_total_s = min(cfg.max_total_s, 30.0)
    return cfg


def parse(argv: list[str] | None, description: str) -> Config:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu.admission", description=description)
    d = Config()
    p.add_argument("--smoke", action="store_true", help="tiny sizes, ~0.3 s per scenario (CPU when no GPU)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--seconds", type=float, default=d.seconds, help="wall seconds per co-location scenario")
    p.add_argument("--chunk-gemms", type=int, default=d.chunk_gemms, help="512-token GEMMs per rollout chunk")
    p.add_argument("--chunk-tokens", type=int, default=d.chunk_tokens)
    p.add_argument("--layers", type=int, default=d.layers)
    p.add_argument("--duty", type=float, default=d.duty, help="serving duty cycle of the arrival process")
    p.add_argument("--burst-steps", type=int, default=d.burst_steps, help="mean decode steps per serving burst")
    p.add_argument("--tpot-slo-mult", type=float, default=d.tpot_slo_mult)
    p.add_argument("--ttft-extra-chunks", type=float, default=d.ttft_extra_chunks)
    p.add_argument("--margin-ms", type=float, default=d.margin_ms, help="the guard's margin_s, ms")
    p.add_argument("--green-sms", type=int, default=d.green_sms, help="SMs of the green context (0: no dial)")
    p.add_argument("--green-tpot-mult", type=float, default=d.green_tpot_mult)
    p.add_argument("--no-graphs", action="store_true")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--max-total-s", type=float, default=d.max_total_s, help="skip scenarios past this budget")
    values = vars(p.parse_args(argv))
    device = values.pop("device")
    graphs = not values.pop("no_graphs")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but torch.cuda.is_available() is False")
    cfg = Config(device=device, graphs=graphs, **values)  # every other option is named as its Config field
    return smoke_config(cfg) if cfg.smoke else cfg
