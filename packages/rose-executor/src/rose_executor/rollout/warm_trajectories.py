"""Trajectories whose last turn finished here recently: their prefix KV may still be cached locally."""

from __future__ import annotations

from collections import OrderedDict


class WarmTrajectories:
    """The most recent ``limit`` trajectory ids younger than ``horizon_s``; pure (takes ``now``)."""

    __slots__ = ("_seen", "horizon_s", "limit")

    def __init__(self, limit: int = 256, horizon_s: float = 120.0) -> None:
        if limit < 1 or horizon_s <= 0:
            raise ValueError("limit must be >= 1 and horizon_s > 0")
        self.limit = limit
        self.horizon_s = horizon_s
        self._seen: OrderedDict[str, float] = OrderedDict()

    def touch(self, trajectory_id: str, now: float) -> None:
        self._seen[trajectory_id] = now
        self._seen.move_to_end(trajectory_id)
        while len(self._seen) > self.limit:
            self._seen.popitem(last=False)

    def clear(self) -> None:
        """Forget every trajectory (e.g. the prefix cache was dropped by a weight update)."""
        self._seen.clear()

    def ids(self, now: float) -> list[str]:
        """Warm trajectory ids, most recent last."""
        cutoff = now - self.horizon_s
        while self._seen:
            oldest, seen_at = next(iter(self._seen.items()))
            if seen_at >= cutoff:
                break
            del self._seen[oldest]
        return list(self._seen)
