"""The scheduler's load index and long-tail rule, plus the decision-latency benchmark."""

from __future__ import annotations

from hypothesis import settings
from hypothesis.stateful import invariant
from test_scheduler import SchedulerMachine

from rose_core.app.config import SchedulerConfig
from rose_core.app.sim.bench_scheduler import bench_scheduler
from rose_core.scheduler import ElasticScheduler, TurnTicket


class IndexedSchedulerMachine(SchedulerMachine):
    """The same random event sequences as test_scheduler: the index always equals a full scan."""

    @invariant()
    def index_matches_a_full_scan(self) -> None:
        s = self.s
        expected = {(w.worker_id, w.pool, w.weight_version, w.load) for w in s.workers.values() if w.usable()}
        indexed = {(wid, *where) for wid, where in s._index._where.items()}
        assert indexed == expected

    @invariant()
    def pick_is_least_loaded(self) -> None:
        s = self.s
        probe = TurnTicket("probe", "nobody", 0, 0, 0.0)
        found = s._pick(probe)
        usable = [w for w in s.workers.values() if w.usable() and w.holds(0, 0)]
        if found is None:
            assert not usable
            return
        worker, reason, _detail = found
        pool = [w for w in usable if w.pool == worker.pool]
        assert worker.load == min(w.load for w in pool)
        assert reason == "borrowed" or not any(w.pool == "serving" for w in [worker])
        if worker.pool == "serving":
            assert not any(w.pool == "dedicated" for w in usable)


TestIndexedSchedulerMachine = IndexedSchedulerMachine.TestCase
TestIndexedSchedulerMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def _straggler_on_borrowed() -> ElasticScheduler:
    """Trajectory B's turn finished on borrowed s1, A's on dedicated d1 (now idle); B's next turn is queued."""
    s = ElasticScheduler(SchedulerConfig(max_concurrency_per_worker=1))
    s.add_worker(0, "d1", "dedicated", 1, 0)
    s.add_worker(0, "s1", "serving", 1, 0)
    s.borrow([("s1", 0.0)])
    s.submit(0, TurnTicket("a0", "A", 0, 0, 0.0))
    s.submit(0, TurnTicket("b0", "B", 0, 0, 0.0))
    assert {a.ticket.turn_id: a.worker_id for a in s.schedule(0)} == {"a0": "d1", "b0": "s1"}
    s.complete(1, "d1", "a0", 0)
    s.finish_trajectory("A")
    s.complete(1, "s1", "b0", 0)
    s.submit(1, TurnTicket("b1", "B", 0, 0, 1.0))
    return s


def test_a_warm_prefix_on_a_borrowed_worker_keeps_the_next_turn_there() -> None:
    s = _straggler_on_borrowed()
    (a,) = s.schedule(1)
    assert (a.worker_id, a.reason) == ("s1", "affinity")
    assert s.workers["s1"].routed == {"borrowed": 1, "affinity": 1}


def test_long_tail_moves_a_straggler_whose_prefix_went_cold() -> None:
    s = _straggler_on_borrowed()
    s.observe(1, "s1", weight_version=0, warm_trajectories=[])  # its heartbeat: B's prefix was evicted
    (a,) = s.schedule(1)
    assert (a.worker_id, a.reason, a.detail) == ("d1", "long_tail", "prefix cold on s1")


def test_long_tail_moves_a_straggler_off_a_worker_holding_turns_for_serving() -> None:
    s = _straggler_on_borrowed()
    s.observe(1, "s1", weight_version=0, held=2, warm_trajectories=["B"])
    (a,) = s.schedule(1)
    assert (a.worker_id, a.reason) == ("d1", "long_tail")
    assert a.detail == "s1 holds 2 turns for serving"


def test_a_revoked_worker_is_not_affine_nor_borrowed_again_until_lent_again() -> None:
    s = _straggler_on_borrowed()
    s.revoke(1, "s1")
    assert s.borrow([("s1", 0.0)]) == []
    (a,) = s.schedule(1)
    assert (a.worker_id, a.reason) == ("d1", "dedicated")
    s.lend_again("s1")
    assert s.borrow([("s1", 0.0)]) == ["s1"]


def test_an_overdue_turn_on_a_heartbeating_worker_is_rerouted_and_cancelled_there() -> None:
    s = ElasticScheduler()
    s.add_worker(0, "d1", "dedicated", 4, 0)
    s.submit(0, TurnTicket("t0", "T", 0, 0, 0.0))
    s.submit(0, TurnTicket("u0", "U", 0, 0, 0.0))
    s.schedule(0)
    s.complete(5, "d1", "u0", 0)
    s.observe(9, "d1", weight_version=0)  # it still heartbeats: the stall rule does not fire
    assert s.find_stalled(9, 2.0) == [] and s.find_overdue(9, 10.0) == []
    ((old, ticket),) = s.find_overdue(11, 10.0)
    assert (old, ticket.turn_id, ticket.attempt) == ("d1", "t0", 1)
    assert [(c.worker_id, c.turn_id, c.attempt) for c in s.take_cancellations()] == [("d1", "t0", 0)]
    assert s.complete(12, "d1", "t0", 0) == "late"  # the old attempt's result stays discarded
    (again,) = s.schedule(12)
    assert again.ticket.attempt == 1 and s.complete(13, "d1", "t0", 1) == "accepted"
    assert s.find_overdue(100, 10.0) == [] and s.counters["rerouted_overdue"] == 1


def test_affinity_to_a_dedicated_worker_is_kept() -> None:
    s = ElasticScheduler()
    s.add_worker(0, "d1", "dedicated", 4, 0)
    s.add_worker(0, "d2", "dedicated", 4, 0)
    s.submit(0, TurnTicket("a0", "A", 0, 0, 0.0))
    (first,) = s.schedule(0)
    s.complete(1, first.worker_id, "a0", 0)
    s.submit(1, TurnTicket("a1", "A", 0, 0, 1.0))
    (again,) = s.schedule(1)
    assert (again.worker_id, again.reason) == (first.worker_id, "affinity")


def test_bench_reports_decision_percentiles() -> None:
    result = bench_scheduler(workers=100, trajectories=1000, decisions=500).to_dict()
    assert result["decisions"] == 500
    assert 0 < result["decision_p50_us"] <= result["decision_p99_us"] <= result["decision_max_us"]
    assert result["least_loaded_p99_us"] > 0


def test_a_turn_refused_for_memory_is_not_sent_straight_back_by_its_warm_affinity() -> None:
    """The borrowed worker's budget cannot hold the trajectory's next turn: it is given back as ``memory``
    and must wait for the dedicated worker, not bounce back to its warm, affine worker forever."""
    s = _straggler_on_borrowed()
    s.submit(1, TurnTicket("a1", "A2", 0, 0, 1.0))
    placed = {a.ticket.turn_id: a.worker_id for a in s.schedule(1)}
    assert placed == {"b1": "s1", "a1": "d1"}  # b1 affine to warm s1; the dedicated worker is now full
    assert s.abort(2, "s1", "b1", 0, "memory")
    assert s.schedule(2) == [] and s.schedule(3.5) == []  # s1 refused it, d1 is full: it waits, no bounce
    s.complete(3, "d1", "a1", 0)
    (again,) = s.schedule(3.6)
    assert (again.ticket.turn_id, again.worker_id, again.ticket.attempt) == ("b1", "d1", 1)
    assert again.ticket.avoid == ""  # placed: the next refusal decides afresh
