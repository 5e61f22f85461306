"""The elastic scheduler's settings (`[scheduler]` of a job's config): the policy owns its configuration, the
job's config (``rose_core.app.config.RunConfig``) holds it as a section."""

from __future__ import annotations

from rose_core.config.sections import ConfigSection, require_non_negative, require_positive


class SchedulerConfig(ConfigSection):
    max_concurrency_per_worker: int = 16
    max_borrowed_workers: int = 16
    staleness: int = 0
    """Weight versions a turn may lag behind the newest (0 = synchronous GRPO)."""
    queue_scan_limit: int = 256
    borrow_after_s: float = 2.0
    """Once the job starts (or a serving executor joins a running job), its load is watched this long before
    it may be borrowed; then the serving executors with the lowest KV use are borrowed first."""
    move_held_after_s: float = 1.0
    """A borrowed serving executor whose heartbeats have said for this long that its guard holds turns back
    gives those turns to dedicated executors with room: re-routed and cancelled there (``held``). 0: never;
    they wait for serving's slack (up to the guard's latency window)."""

    turn_retries: int = 2
    """A turn that failed on an executor (an engine error, or a result the controller refused) is tried again at
    most this many times, each time on an executor it has not failed on; then its trajectory is dropped and
    counted (``failed_trajectories``)."""

    def __post_init__(self) -> None:
        require_positive(max_concurrency_per_worker=self.max_concurrency_per_worker, queue_scan_limit=self.queue_scan_limit)
        require_non_negative(borrow_after_s=self.borrow_after_s, move_held_after_s=self.move_held_after_s)
        require_non_negative(staleness=self.staleness, max_borrowed_workers=self.max_borrowed_workers,
                             turn_retries=self.turn_retries)
