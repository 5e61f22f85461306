"""The elastic rollout scheduler (pure policy)."""

from rose_core.scheduler.decisions import Assignment, Cancellation, GivenUp, Verdict
from rose_core.scheduler.elastic_scheduler import ElasticScheduler
from rose_core.scheduler.scheduler_config import SchedulerConfig
from rose_core.scheduler.turn_queue import TurnQueue
from rose_core.scheduler.turn_ticket import TurnTicket
from rose_core.scheduler.worker_state import Pool, WorkerState

__all__ = ["Assignment", "Cancellation", "ElasticScheduler", "GivenUp", "Pool", "SchedulerConfig", "TurnQueue", "TurnTicket", "Verdict", "WorkerState"]
