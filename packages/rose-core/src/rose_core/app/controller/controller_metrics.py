"""Prometheus metrics of the controller process."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

TURNS_ROUTED = Counter("rose_turns_routed_total", "Turns sent to an executor, by routing reason.", ["reason"])
TURNS_COMPLETED = Counter("rose_turns_completed_total", "Turn results accepted, by executor role.", ["role"])
TURNS_REROUTED = Counter("rose_turns_rerouted_total", "Turns re-routed after an abort, stall or exit.", ["reason"])
STATUS_SKIPPED = Counter(
    "rose_status_skipped_total",
    "Status snapshots not sent to an observer that still held STATUS_CREDIT unacknowledged ones (it gets a newer one).",
)
REFUSED_RESULTS = Counter("rose_refused_results_total",
                          "Turn results refused (wrong shape, non-finite logprobs, outside the version window...).",
                          ["reason"])
TURNS_GIVEN_UP = Counter("rose_turns_given_up_total",
                         "Turns that failed on executors more often than scheduler.turn_retries allows.")
LATE_RESULTS = Counter("rose_late_results_total", "Results of re-routed or finished turns, discarded.")
EXECUTORS = Gauge("rose_executors", "Registered executors, by role and state.", ["role", "state"])
QUEUED_TURNS = Gauge("rose_turns_queued", "Turns waiting for a worker.")
RUNNING_TURNS = Gauge("rose_turns_running", "Turns running on an executor.")
WEIGHT_VERSION = Gauge("rose_weight_version", "Newest published weight version.")
WEIGHT_SYNC_SECONDS = Histogram(
    "rose_weight_sync_seconds", "Publish-to-applied-everywhere time of a weight version.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
WEIGHT_SYNC_BYTES = Counter("rose_weight_sync_bytes_total", "Weight bytes received by executors.")
STEP_SECONDS = Histogram(
    "rose_step_phase_seconds", "Duration of an RL step's phases.", ["phase"],
    buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
)
