"""A profiled step-time model: affine fits of prefill time vs tokens and decode step time vs batch size.

The co-serving admission controller predicts, with this model, how long an engine step takes once candidate
rollout work is added. The executor builds it from points profiled at start-up; the simulator from points
measured on its GPU model. Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def _affine_fit(points: Sequence[tuple[float, float]], what: str) -> tuple[float, float]:
    """Least-squares intercept and slope of ``seconds = a + b * x`` (slope clamped at >= 0)."""
    if len(points) < 2:
        raise ValueError(f"`{what}` needs at least 2 profiled points (got {len(points)})")
    xs = [float(x) for x, _ in points]
    ys = [float(y) for _, y in points]
    if any(y < 0 for y in ys) or any(x < 0 for x in xs):
        raise ValueError(f"`{what}` points must be non-negative")
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    if var == 0:
        raise ValueError(f"`{what}` points need at least two distinct sizes")
    slope = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var)
    return max(0.0, my - slope * mx), slope


@dataclass(slots=True, frozen=True)
class LatencyModel:
    """``T_prf(tokens) = prefill_base_s + prefill_per_token_s * tokens``;
    ``T_dec(batch) = decode_base_s + decode_per_seq_s * batch``; one engine step mixing both costs
    ``decode_base_s + decode_per_seq_s * batch + prefill_per_token_s * tokens``."""

    prefill_base_s: float
    prefill_per_token_s: float
    decode_base_s: float
    decode_per_seq_s: float

    def __post_init__(self) -> None:
        for name in ("prefill_base_s", "prefill_per_token_s", "decode_base_s", "decode_per_seq_s"):
            value = getattr(self, name)
            if not value >= 0:
                raise ValueError(f"LatencyModel `{name}` must be >= 0 (got {value})")

    @classmethod
    def fit(cls, prefill_points: Sequence[tuple[float, float]],
            decode_points: Sequence[tuple[float, float]]) -> LatencyModel:
        """Fit from profiled ``(tokens, seconds)`` prefill points and ``(batch, seconds)`` decode-step points."""
        pa, pb = _affine_fit(prefill_points, "prefill_points")
        da, db = _affine_fit(decode_points, "decode_points")
        return cls(pa, pb, da, db)

    def prefill_s(self, tokens: int, chunk_tokens: int = 0) -> float:
        """Time to prefill ``tokens`` (in chunks of ``chunk_tokens``: one step overhead per chunk)."""
        if tokens <= 0:
            return 0.0
        chunks = 1 if chunk_tokens <= 0 else -(-tokens // chunk_tokens)
        return chunks * self.prefill_base_s + tokens * self.prefill_per_token_s

    def decode_step_s(self, batch: int) -> float:
        return self.decode_base_s + self.decode_per_seq_s * batch if batch > 0 else 0.0

    def step_s(self, decode_batch: int, prefill_tokens: int) -> float:
        """One engine step that decodes ``decode_batch`` sequences and prefills ``prefill_tokens`` tokens."""
        if decode_batch <= 0 and prefill_tokens <= 0:
            return 0.0
        base = self.decode_base_s if decode_batch > 0 else self.prefill_base_s
        return base + self.decode_per_seq_s * max(0, decode_batch) + self.prefill_per_token_s * max(0, prefill_tokens)
