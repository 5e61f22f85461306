"""What the dashboard shows, computed from ``StatusSnapshot`` messages. Pure: no Textual, no clock, no I/O.

``DashboardModel.update(snapshot)`` returns a ``DashboardView``: frozen, comparable values (rows of
``Cell``s, texts, levels, trend series) that the widgets render as they are. The model keeps the little
state a dashboard needs across snapshots: the serving latency trends and the origin of the elapsed time.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from rose_core.protocol.messages import ExecutorStatus, LoadReport, StatusSnapshot, StepStatus
from rose_tui.formatting import (
    DASH,
    Level,
    format_age,
    format_bytes,
    format_clock,
    format_ms,
    format_ratio,
    format_reward,
    format_seconds,
    ratio_level,
    slo_level,
)
from rose_tui.learning import LearningView, learning_view

TREND_LENGTH = 120
"""Samples kept for the latency sparklines: one per snapshot, a minute at the 0.5 s cadence."""
EPOCH_THRESHOLD_S = 1e8
"""A ``StatusSnapshot.time`` above this is a wall-clock timestamp, not seconds since the run started."""

GOOD_STATES = frozenset({"ready", "running", "active", "serving", "idle", "ok"})
BAD_STATES = frozenset({"failed", "stalled", "lost", "dead", "error", "unreachable", "stopped"})


@dataclass(frozen=True, slots=True)
class Cell:
    """One shown value and how it stands (``None``: no colour)."""

    text: str
    level: Level | None = None


EXECUTOR_COLUMNS: tuple[tuple[str, str], ...] = (
    ("executor", "executor"),
    ("role", "role"),
    ("state", "state"),
    ("weights", "weights"),
    ("rollout", "rollout"),
    ("kv", "KV"),
    ("ttft", "TTFT p99"),
    ("tpot", "TPOT p99"),
    ("guard", "guard"),
    ("routing", "routed"),
    ("prefix", "prefix"),
    ("seen", "seen"),
)
"""``(key, label)`` of the executor table's columns, in order."""

HISTORY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("step", "step"),
    ("phase", "phase"),
    ("weights", "weights"),
    ("trajectories", "trajectories"),
    ("turns", "in flight / queued"),
    ("reward", "reward mean"),
)


@dataclass(frozen=True, slots=True)
class TableRow:
    """A row of a table: its stable key and its cells in column order."""

    key: str
    cells: tuple[Cell, ...]

    def cell(self, columns: tuple[tuple[str, str], ...], key: str) -> Cell:
        return self.cells[[k for k, _ in columns].index(key)]


@dataclass(frozen=True, slots=True)
class HeaderView:
    controller_id: str = ""
    elapsed: str = DASH
    finished: bool = False
    elapsed_label: str = "elapsed"
    """``elapsed`` (since the run started) or ``watching`` (since this dashboard's first status)."""


@dataclass(frozen=True, slots=True)
class StepView:
    """The RL step in progress; ``step is None`` when the controller runs none."""

    step: int | None = None
    phase: str = ""
    weights: str = DASH
    trajectories_done: int = 0
    trajectories_total: int = 0
    turns: str = DASH
    reward: str = DASH

    @property
    def title(self) -> str:
        if self.step is None:
            return "no step running"
        return f"step {self.step} · {self.phase}"

    @property
    def trajectories(self) -> str:
        return f"{self.trajectories_done}/{self.trajectories_total} trajectories"


@dataclass(frozen=True, slots=True)
class SloGaugeView:
    """One serving latency (fleet-wide worst p99) against its SLO, with its recent trend."""

    name: str
    value: Cell = field(default_factory=lambda: Cell(DASH, "idle"))
    slo: str = DASH
    trend: tuple[float, ...] = ()

    @property
    def text(self) -> str:
        return f"{self.name} p99 {self.value.text}  SLO {self.slo}"


SYNC_PARTS = ("publish", "transfer", "apply", "wait")
"""The parts of a weight sync, in the order they happen (``StatusSnapshot.weight_sync_*_seconds``)."""


@dataclass(frozen=True, slots=True)
class WeightSyncView:
    seconds: str = DASH
    size: str = DASH
    parts: tuple[tuple[str, str], ...] = ()
    """``(name, seconds)`` of the parts in ``SYNC_PARTS`` order; empty from a controller that sends none."""

    @property
    def headline(self) -> str:
        if self.seconds == DASH:
            return "weight sync: none yet"
        return f"last weight sync {self.seconds} · {self.size}"

    @property
    def breakdown(self) -> str:
        """``publish 0.05 · transfer 0.04 · apply 0.90 · wait 0.73`` (seconds), or empty."""
        return " · ".join(f"{name} {value}" for name, value in self.parts)

    @property
    def text(self) -> str:
        return f"{self.headline} ({self.breakdown})" if self.breakdown else self.headline


@dataclass(frozen=True, slots=True)
class DashboardView:
    header: HeaderView = HeaderView()
    executors: tuple[TableRow, ...] = ()
    step: StepView = StepView()
    ttft: SloGaugeView = SloGaugeView("TTFT")
    tpot: SloGaugeView = SloGaugeView("TPOT")
    weight_sync: WeightSyncView = WeightSyncView()
    history: tuple[TableRow, ...] = ()
    learning: LearningView = field(default_factory=LearningView)


class DashboardModel:
    """Turns the stream of snapshots into views; keeps the latency trends between them."""

    def __init__(
        self,
        trend_length: int = TREND_LENGTH,
        heartbeat_interval_s: float = 1.0,
        stall_timeout_s: float = 2.0,
    ) -> None:
        self._ttft: deque[float] = deque(maxlen=trend_length)
        self._tpot: deque[float] = deque(maxlen=trend_length)
        self._first_time: float | None = None
        self.heartbeat_interval_s = heartbeat_interval_s
        self.stall_timeout_s = stall_timeout_s

    def update(self, snapshot: StatusSnapshot) -> DashboardView:
        ttft, tpot = fleet_latency_p99(snapshot.executors)
        if ttft is not None and tpot is not None:
            self._ttft.append(ttft)
            self._tpot.append(tpot)
        return DashboardView(
            header=HeaderView(
                snapshot.controller_id,
                format_clock(self._elapsed(snapshot)),
                snapshot.finished,
                "elapsed" if snapshot.started_at > 0 or snapshot.time < EPOCH_THRESHOLD_S else "watching",
            ),
            executors=tuple(
                self.executor_row(e, snapshot)
                for e in sorted(snapshot.executors, key=lambda e: (e.role, e.executor_id))
            ),
            step=step_view(snapshot.step),
            ttft=SloGaugeView(
                "TTFT", _latency_cell(ttft, snapshot.slo_ttft_ms), format_ms(snapshot.slo_ttft_ms), tuple(self._ttft)
            ),
            tpot=SloGaugeView(
                "TPOT", _latency_cell(tpot, snapshot.slo_tpot_ms), format_ms(snapshot.slo_tpot_ms), tuple(self._tpot)
            ),
            weight_sync=weight_sync_view(snapshot),
            history=tuple(history_row(s) for s in reversed(snapshot.history)),
            learning=learning_view(snapshot.history),
        )

    def executor_row(self, e: ExecutorStatus, snapshot: StatusSnapshot) -> TableRow:
        load = e.load
        serving = e.role == "serving"
        rollout = f"{load.rollout_in_flight}/{load.rollout_capacity}"
        if load.rollout_budget_frozen:
            rollout += " frozen"
        if serving and e.borrowed:
            rollout += " lent"
        age = _age(e.last_seen_s, snapshot.time)
        cells = (
            Cell(e.executor_id),
            Cell(e.role),
            Cell(e.state, state_level(e.state)),
            _version_cell(e.weight_version),
            Cell(rollout, "warn" if load.rollout_budget_frozen else None),
            Cell(format_ratio(load.serving_kv_usage_ratio), ratio_level(load.serving_kv_usage_ratio))
            if serving
            else Cell(DASH, "idle"),
            _latency_cell(load.serving_ttft_p99_ms if serving else None, load.slo_ttft_ms or snapshot.slo_ttft_ms),
            _latency_cell(load.serving_tpot_p99_ms if serving else None, load.slo_tpot_ms or snapshot.slo_tpot_ms),
            guard_cell(load) if serving else Cell(DASH, "idle"),
            Cell(routing_text(e.routed)),
            Cell(format_ratio(load.prefix_hit_ratio)),
            Cell(format_age(age), self._age_level(age)),
        )
        return TableRow(e.executor_id, cells)

    def _age_level(self, age: float) -> Level:
        if age > self.stall_timeout_s:
            return "bad"
        if age > 1.5 * self.heartbeat_interval_s:
            return "warn"
        return "ok"

    def _elapsed(self, snapshot: StatusSnapshot) -> float:
        """Seconds since the run started; without ``started_at``, since this dashboard's first snapshot."""
        time_s = snapshot.time
        if snapshot.started_at > 0:
            return max(0.0, time_s - snapshot.started_at)
        if time_s < EPOCH_THRESHOLD_S:
            return time_s
        if self._first_time is None:
            self._first_time = time_s
        return time_s - self._first_time


ROUTING_SHORT = {"affinity": "a", "dedicated": "d", "borrowed": "b", "long_tail": "t"}
"""Routing reasons as the table shows them: affinity, dedicated, borrowed, long tail."""


def routing_text(routed: dict[str, int]) -> str:
    """Turns routed to an executor by reason, most first: ``a55 b40`` (affinity 55, borrowed 40)."""
    ranked = sorted(((n, reason) for reason, n in routed.items() if n), reverse=True)
    return " ".join(f"{ROUTING_SHORT.get(reason, reason)}{n}" for n, reason in ranked) or DASH


def guard_cell(load: LoadReport) -> Cell:
    """How long the SLO guard held rollout work here, and its last minimum serving slack: ``4s +12ms`` (red
    when the slack went below zero, yellow while it holds turns)."""
    slack = load.guard_min_slack_ms
    text = f"{load.guard_hold_seconds_total:.0f}s {slack:+.0f}ms"
    return Cell(text, "bad" if slack < 0 else "warn" if load.rollout_held else None)


def fleet_latency_p99(executors: list[ExecutorStatus]) -> tuple[float | None, float | None]:
    """The worst serving p99 TTFT and TPOT over the serving executors (``None`` without any)."""
    serving = [e.load for e in executors if e.role == "serving"]
    if not serving:
        return None, None
    return max(s.serving_ttft_p99_ms for s in serving), max(s.serving_tpot_p99_ms for s in serving)


def state_level(state: str) -> Level:
    if state in GOOD_STATES:
        return "ok"
    if state in BAD_STATES:
        return "bad"
    return "warn"


def step_view(step: StepStatus | None) -> StepView:
    if step is None:
        return StepView()
    return StepView(
        step=step.step,
        phase=step.phase,
        weights=_version_text(step.weight_version),
        trajectories_done=step.trajectories_done,
        trajectories_total=step.trajectories_total,
        turns=f"{step.turns_in_flight} in flight · {step.turns_queued} queued",
        reward=format_reward(step.reward_mean),
    )


def weight_sync_view(snapshot: StatusSnapshot) -> WeightSyncView:
    if snapshot.weight_sync_seconds <= 0 and snapshot.weight_sync_bytes <= 0:
        return WeightSyncView()
    values = (
        snapshot.weight_sync_publish_seconds,
        snapshot.weight_sync_transfer_seconds,
        snapshot.weight_sync_apply_seconds,
        snapshot.weight_sync_wait_seconds,
    )
    parts = tuple(zip(SYNC_PARTS, (f"{v:.2f}" for v in values), strict=True)) if any(v > 0 for v in values) else ()
    return WeightSyncView(
        format_seconds(snapshot.weight_sync_seconds), format_bytes(snapshot.weight_sync_bytes), parts
    )


def history_row(step: StepStatus) -> TableRow:
    cells = (
        Cell(str(step.step)),
        Cell(step.phase),
        Cell(_version_text(step.weight_version)),
        Cell(f"{step.trajectories_done}/{step.trajectories_total}"),
        Cell(f"{step.turns_in_flight} / {step.turns_queued}"),
        Cell(format_reward(step.reward_mean)),
    )
    return TableRow(str(step.step), cells)


def _latency_cell(value_ms: float | None, slo_ms: float) -> Cell:
    return Cell(format_ms(value_ms), slo_level(value_ms, slo_ms))


def _version_text(version: int) -> str:
    return DASH if version < 0 else f"v{version}"


def _version_cell(version: int) -> Cell:
    return Cell(DASH, "idle") if version < 0 else Cell(_version_text(version))


def _age(last_seen_s: float, now_s: float) -> float:
    """``last_seen_s`` is an age in seconds; a timestamp (same clock as ``now_s``) is turned into one."""
    if last_seen_s >= EPOCH_THRESHOLD_S:
        return max(0.0, now_s - last_seen_s)
    return max(0.0, last_seen_s)
