"""Configuration of a ROSE job: msgspec Structs decoded from TOML with errors that name the field.

Every default is visible with `rose config show`. Validation raises ``ValueError`` in ``__post_init__``
(the validators of ``rose_core.config_support``); msgspec turns that into an error that carries the field's
path, and ``load_config`` (``config_support.load_toml``) turns it into one line for the user.
"""

from __future__ import annotations

import os
from typing import Any

import msgspec

from rose_core.config_support import (
    ConfigSection,
    load_toml,
    require_fraction,
    require_non_negative,
    require_port,
    require_positive,
)

__all__ = [
    "ClusterConfig",
    "ConfigSection",
    "ControllerConfig",
    "ExecutorsConfig",
    "LoadConfig",
    "RLConfig",
    "RunConfig",
    "SchedulerConfig",
    "SloConfig",
    "load_config",
    "require_fraction",
    "require_positive",
]

class ControllerConfig(ConfigSection):
    host: str = "127.0.0.1"
    port: int = 0
    """Control port; 0 picks a free one."""
    metrics_port: int = 0
    heartbeat_interval_s: float = 1.0
    stall_timeout_s: float = 2.0
    status_interval_s: float = 0.5
    turn_timeout_s: float = 600.0
    """A turn assigned longer than this to an executor that still heartbeats (held by its guard, or stuck) is
    re-routed and cancelled there; 0: no bound."""

    def __post_init__(self) -> None:
        require_positive(heartbeat_interval_s=self.heartbeat_interval_s, stall_timeout_s=self.stall_timeout_s)
        require_non_negative(turn_timeout_s=self.turn_timeout_s)
        require_port(port=self.port)
        if self.stall_timeout_s <= self.heartbeat_interval_s:
            raise ValueError("`stall_timeout_s` must exceed `heartbeat_interval_s`")


class SchedulerConfig(ConfigSection):
    max_concurrency_per_worker: int = 16
    max_borrowed_workers: int = 16
    staleness: int = 0
    """Weight versions a turn may lag behind the newest (0 = synchronous GRPO)."""
    queue_scan_limit: int = 256
    borrow_after_s: float = 2.0
    """Once the job starts (or a serving executor joins a running job), its load is watched this long before
    it may be borrowed; then the serving executors with the lowest KV use are borrowed first."""

    def __post_init__(self) -> None:
        require_positive(max_concurrency_per_worker=self.max_concurrency_per_worker, queue_scan_limit=self.queue_scan_limit)
        require_non_negative(borrow_after_s=self.borrow_after_s)
        require_non_negative(staleness=self.staleness, max_borrowed_workers=self.max_borrowed_workers)


class SloConfig(ConfigSection):
    ttft_ms: float = 2000.0
    tpot_ms: float = 400.0
    headroom_fraction: float = 0.8
    """A serving executor lends capacity only while its p99s stay under this fraction of the SLO."""

    def __post_init__(self) -> None:
        require_positive(ttft_ms=self.ttft_ms, tpot_ms=self.tpot_ms)
        require_fraction(headroom_fraction=self.headroom_fraction)


class RLConfig(ConfigSection):
    steps: int = 3
    prompts_per_step: int = 3
    group_size: int = 4
    max_turns: int = 4
    max_tokens_per_turn: int = 8
    max_context_tokens: int = 512
    temperature: float = 1.0
    lr: float = 1e-3
    clip_eps: float = 0.2
    epochs: int = 2
    env_size: int = 4
    seed: int = 0
    turn_timeout_s: float = 120.0
    weight_sync_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        require_positive(
            steps=self.steps,
            prompts_per_step=self.prompts_per_step,
            group_size=self.group_size,
            max_turns=self.max_turns,
            max_tokens_per_turn=self.max_tokens_per_turn,
            lr=self.lr,
            epochs=self.epochs,
        )
        if self.group_size < 2:
            raise ValueError("`group_size` must be >= 2 (GRPO normalises rewards within a group)")


class LoadConfig(ConfigSection):
    """The built-in bursty production traffic against the serving endpoint."""

    enabled: bool = True
    base_rps: float = 1.0
    burst_rps: float = 6.0
    mean_calm_s: float = 4.0
    mean_burst_s: float = 1.5
    prompt_tokens: int = 48
    max_tokens: int = 16
    max_in_flight: int = 8
    seed: int = 1
    endpoint_shares: list[float] = []
    """Share of the arrivals per serving executor, in the order of their ids (``serving-0``, ``serving-1``, ...);
    empty: equal shares."""

    def __post_init__(self) -> None:
        require_positive(base_rps=self.base_rps, burst_rps=self.burst_rps, max_in_flight=self.max_in_flight)
        if any(s < 0 for s in self.endpoint_shares) or (self.endpoint_shares and sum(self.endpoint_shares) <= 0):
            raise ValueError("`endpoint_shares` must be >= 0 with a positive sum (one per serving executor)")


class ExecutorsConfig(ConfigSection):
    """The executors `rose run` starts on this machine."""

    dedicated: int = 1
    serving: int = 1
    kv_cache_gib: float = 1.0
    rollout_capacity: int = 4
    """Concurrent turns per executor: small, so one dedicated executor saturates and the borrowed one helps."""
    start_timeout_s: float = 300.0
    serving_overrides: dict[str, Any] = msgspec.field(default_factory=dict)
    """Fields of the serving executors' `rose-executor` config (docs/executor.md), over `rose run`'s own,
    e.g. ``memory_high_watermark`` or ``revoke_after_pressure_s``; the executor validates them."""
    dedicated_overrides: dict[str, Any] = msgspec.field(default_factory=dict)
    """The same for the dedicated executors."""

    def __post_init__(self) -> None:
        if self.dedicated < 0 or self.serving < 0 or self.dedicated + self.serving == 0:
            raise ValueError("need at least one executor (`dedicated` + `serving` >= 1)")
        require_positive(kv_cache_gib=self.kv_cache_gib, rollout_capacity=self.rollout_capacity)


RELAY_START = "start"
RELAY_NONE = "none"
TRANSPORTS = ("tcp", "ucx")


class ClusterConfig(ConfigSection):
    """Executors that sit behind one link from the trainer's cluster (weights cross it once per version).

    ``relay``: ``"start"`` (`rose run` starts a relay for this cluster and its executors pull through it),
    a ``tcp://host:port`` or ``ucx://host:port`` relay already running there (`rose-transfer relay`), or
    ``"none"``. ``transport``: how this cluster's executors reach a started relay (``tcp`` or ``ucx``).
    Executors in no cluster sit with the trainer and pull from the publisher directly."""

    name: str = ""
    executors: list[str] = msgspec.field(default_factory=list)
    relay: str = RELAY_START
    transport: str = "tcp"

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("every cluster needs a `name`")
        if not self.executors:
            raise ValueError(f"cluster {self.name!r} lists no `executors` (ids such as \"serving-0\")")
        if self.relay not in (RELAY_START, RELAY_NONE) and not self.relay.startswith(("tcp://", "ucx://")):
            raise ValueError(f"cluster {self.name!r}: `relay` is \"start\", \"none\" or a tcp:// / ucx:// address")
        if self.transport not in TRANSPORTS:
            raise ValueError(f"cluster {self.name!r}: `transport` is one of {list(TRANSPORTS)}")


class RunConfig(ConfigSection):
    controller: ControllerConfig = msgspec.field(default_factory=ControllerConfig)
    scheduler: SchedulerConfig = msgspec.field(default_factory=SchedulerConfig)
    slo: SloConfig = msgspec.field(default_factory=SloConfig)
    rl: RLConfig = msgspec.field(default_factory=RLConfig)
    load: LoadConfig = msgspec.field(default_factory=LoadConfig)
    executors: ExecutorsConfig = msgspec.field(default_factory=ExecutorsConfig)
    weight_publisher: str = "sparse"
    """Weight data plane from the `rose.weight_publishers` entry points: `sparse` (patches against the receiver's version) or `dense`."""
    models_dir: str = ".rose/models"
    run_dir: str = ".rose/run"
    clusters: list[ClusterConfig] = msgspec.field(default_factory=list)
    """Where the executors sit (`[[clusters]]`); executors in none sit with the trainer."""

    def __post_init__(self) -> None:
        known = {f"dedicated-{i}" for i in range(self.executors.dedicated)}
        known |= {f"serving-{i}" for i in range(self.executors.serving)}
        placed: dict[str, str] = {}
        for cluster in self.clusters:
            for executor in cluster.executors:
                if executor not in known:
                    raise ValueError(f"cluster {cluster.name!r} lists {executor!r}: this job runs {sorted(known)}")
                if executor in placed:
                    raise ValueError(f"{executor!r} is in clusters {placed[executor]!r} and {cluster.name!r}: pick one")
                placed[executor] = cluster.name
        names = [c.name for c in self.clusters]
        if len(set(names)) != len(names):
            raise ValueError(f"cluster names repeat: {names}")


def load_config(path: str | os.PathLike[str] | None) -> RunConfig:
    """The job config in ``path`` (TOML) over the defaults; ``None`` gives the defaults."""
    return RunConfig() if path is None else load_toml(path, RunConfig)
