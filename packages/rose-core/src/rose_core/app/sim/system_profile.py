"""The compared systems, each a CONFIGURATION of the one simulation engine (never a separate code path)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rose_core.app.sim.scenario import SystemName

ElasticKind = Literal["none", "borrowed", "spot", "serverless"]
RemoteWeights = Literal["sparse-relayed", "dense-per-receiver"]
"""How a new version reaches the elastic GPUs in the other cluster. ``sparse-relayed``: rose-transfer (a
sparse patch crosses the slow link once per cluster, a relay fans it out). ``dense-per-receiver``: what
today's systems do (prior-art 1.4-1.9; the baseline of ``rose-transfer bench``): every remote instance pulls
the full model from the source, so the link carries one dense copy per remote worker."""


@dataclass(slots=True, frozen=True)
class SystemProfile:
    name: SystemName
    elastic: ElasticKind
    asynchronous: bool
    label: str
    remote_weights: RemoteWeights = "dense-per-receiver"


PROFILES: dict[str, SystemProfile] = {
    "fixed": SystemProfile("fixed", "none", False, "dedicated GPUs only, synchronous (ROLL-like)"),
    "fixed-async": SystemProfile("fixed-async", "none", True, "dedicated only, bounded staleness (AReaL-like)"),
    "elastic-spot": SystemProfile("elastic-spot", "spot", False,
                                  "+ spot GPUs: acquisition delay, preemptions, weight pull on join (RLBoost-like)"),
    "serverless": SystemProfile("serverless", "serverless", False,
                                "+ serverless GPU functions: cold starts, time limit (lambda-RL-like)"),
    "rose": SystemProfile("rose", "borrowed", False,
                          "+ borrowed serving GPUs under dual-slack admission and serving-first memory",
                          "sparse-relayed"),
    "rose-async": SystemProfile("rose-async", "borrowed", True,
                                "rose with bounded staleness: borrowed capacity and AReaL-like overlap together",
                                "sparse-relayed"),
}
