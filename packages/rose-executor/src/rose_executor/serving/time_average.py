"""The time-weighted mean of a stepwise signal (a value holds until the next one) over the last N seconds.

Pure: ``now`` is passed in. Before its first value the signal counts as 0 (an engine that reported nothing
was idle), so two signals watched over the same window compare fairly.
"""

from __future__ import annotations

from collections import deque


class TimeAverage:
    __slots__ = ("_points", "horizon_s")

    def __init__(self, horizon_s: float, max_points: int = 8192) -> None:
        if horizon_s <= 0:
            raise ValueError(f"horizon_s must be > 0 (got {horizon_s})")
        self.horizon_s = horizon_s
        self._points: deque[tuple[float, float]] = deque(maxlen=max_points)

    def set(self, now: float, value: float) -> None:
        if not self._points or self._points[-1][1] != value:
            self._points.append((now, value))

    @property
    def last(self) -> float:
        return self._points[-1][1] if self._points else 0.0

    def mean(self, now: float) -> float:
        """The integral of the signal over ``[now - horizon_s, now]``, divided by ``horizon_s``."""
        cutoff = now - self.horizon_s
        points = self._points
        while len(points) >= 2 and points[1][0] <= cutoff:
            points.popleft()  # the value before it no longer reaches into the window
        area = 0.0
        for i, (at, value) in enumerate(points):
            start = max(at, cutoff)
            end = points[i + 1][0] if i + 1 < len(points) else now
            if end > start:
                area += value * (end - start)
        return area / self.horizon_s
