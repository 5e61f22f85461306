"""Cumulative rollout capacity of one GPU over a repeating per-second series, and its inverse.

``share[k]`` is the fraction of a dedicated GPU's rollout speed this GPU gives in second ``k`` (1 on a
dedicated GPU; on a borrowed serving GPU, what the admission controller leaves after serving). A turn that
needs ``work`` dedicated-GPU-seconds and starts at ``t0`` ends at the ``t`` where the integral of the share
from ``t0`` to ``t`` equals ``work``: one binary search, whatever the length of the turn.
"""

from __future__ import annotations

import math

import numpy as np


class HarvestCurve:
    def __init__(self, share: np.ndarray) -> None:
        if len(share) == 0 or float(share.min()) < 0:
            raise ValueError("a harvest share series must be non-empty and non-negative")
        self.share = share.astype(float)
        self.cum = np.concatenate([[0.0], np.cumsum(self.share)])
        self.period = len(share)
        self.per_period = float(self.cum[-1])
        if self.per_period <= 0:
            raise ValueError("a harvest share series must give some capacity")

    def integral(self, t: float) -> float:
        cycles, rem = divmod(t, self.period)
        k = int(rem)
        return cycles * self.per_period + float(self.cum[k]) + (rem - k) * float(self.share[k])

    def finish_time(self, t0: float, work: float) -> float:
        target = self.integral(t0) + work
        cycles = math.floor(target / self.per_period)
        rem = target - cycles * self.per_period
        # the earliest second k with cum[k] < rem <= cum[k + 1]: its share is > 0
        k = min(max(int(np.searchsorted(self.cum, rem, side="left")) - 1, 0), self.period - 1)
        frac = (rem - float(self.cum[k])) / float(self.share[k]) if self.share[k] > 0 else 0.0
        return max(t0, cycles * self.period + k + max(0.0, frac))
