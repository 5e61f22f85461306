"""The elastic scheduler: routing order, failure paths, and invariants over random event sequences."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rose_core.app.config import SchedulerConfig
from rose_core.scheduler import ElasticScheduler, TurnTicket


def ticket(turn: str, traj: str = "x", now: float = 0.0, version: int = 0) -> TurnTicket:
    return TurnTicket(turn, traj, min_version=version, max_version=version, first_queued_at=now)


def sched(capacity: int = 2) -> ElasticScheduler:
    s = ElasticScheduler(SchedulerConfig(max_concurrency_per_worker=capacity))
    s.add_worker(0, "d1", "dedicated", 16, 0)
    s.add_worker(0, "d2", "dedicated", 16, 0)
    s.add_worker(0, "s1", "serving", 16, 0)
    s.borrow([("s1", 0.1)])
    return s


def test_least_loaded_dedicated_first_then_borrowed_then_queue() -> None:
    s = sched(capacity=1)
    for i in range(4):
        s.submit(0, ticket(f"t{i}", f"x{i}"))
    out = s.schedule(0)
    assert [(a.worker_id, a.reason) for a in out] == [("d1", "dedicated"), ("d2", "dedicated"), ("s1", "borrowed")]
    assert len(s.queue) == 1


def test_affinity_routes_the_next_turn_back() -> None:
    s = sched()
    s.submit(0, ticket("a0", "A"))
    s.submit(0, ticket("b0", "B"))
    first = {a.ticket.turn_id: a.worker_id for a in s.schedule(0)}
    s.complete(1, first["b0"], "b0", 0)
    s.submit(1, ticket("b1", "B", 1))
    again = s.schedule(1)
    assert again[0].worker_id == first["b0"] and again[0].reason == "affinity"


def test_serving_worker_without_headroom_or_frozen_is_skipped() -> None:
    s = ElasticScheduler()
    s.add_worker(0, "s1", "serving", 4, 0)
    s.borrow([("s1", 0.0)])
    s.observe(0, "s1", weight_version=0, slo_headroom=False)
    s.submit(0, ticket("t"))
    assert s.schedule(0) == []
    s.observe(1, "s1", weight_version=0, slo_headroom=True, budget_frozen=True)
    assert s.schedule(1) == []
    s.observe(2, "s1", weight_version=0, slo_headroom=True)
    assert [a.worker_id for a in s.schedule(2)] == ["s1"]


def test_unborrowed_serving_workers_are_never_used() -> None:
    s = ElasticScheduler()
    s.add_worker(0, "s1", "serving", 4, 0)
    s.submit(0, ticket("t"))
    assert s.schedule(0) == []


def test_borrow_picks_lowest_kv_usage_once() -> None:
    s = ElasticScheduler(SchedulerConfig(max_borrowed_workers=2))
    for wid in ("a", "b", "c"):
        s.add_worker(0, wid, "serving", 4, 0)
    assert s.borrow([("a", 0.9), ("b", 0.1), ("c", 0.5)]) == ["b", "c"]
    assert s.borrow([("a", 0.9), ("b", 0.1), ("c", 0.5)], limit=5) == ["a"]


def test_version_window_is_respected() -> None:
    s = sched()
    s.submit(0, ticket("t", version=1))
    assert s.schedule(0) == []
    s.observe(1, "d2", weight_version=1)
    assert [a.worker_id for a in s.schedule(1)] == ["d2"]


def test_abort_reroutes_and_late_result_is_discarded() -> None:
    s = sched()
    s.submit(0, ticket("t"))
    (a,) = s.schedule(0)
    assert s.abort(1, a.worker_id, "t", 0, "memory")
    (b,) = s.schedule(1)
    assert b.ticket.attempt == 1
    assert s.complete(2, a.worker_id, "t", 0) == "late"
    assert s.complete(2, b.worker_id, "t", 1) == "accepted"
    assert s.complete(3, b.worker_id, "t", 1) == "duplicate"
    assert s.counters["late_results"] == 1


def test_stalled_worker_turns_move_and_it_recovers() -> None:
    s = sched()
    s.submit(0, ticket("t"))
    (a,) = s.schedule(0)
    for wid in ("d1", "d2", "s1"):
        if wid != a.worker_id:
            s.observe(2.5, wid, weight_version=0)
    assert s.find_stalled(2.5, 2.0) == [a.worker_id]
    (b,) = s.schedule(2.5)
    assert b.worker_id != a.worker_id and b.ticket.attempt == 1
    s.observe(3, a.worker_id, weight_version=0)
    assert s.workers[a.worker_id].health == "ready"


def test_revoked_serving_worker_gives_its_turns_back() -> None:
    s = ElasticScheduler()
    s.add_worker(0, "s1", "serving", 4, 0)
    s.add_worker(0, "d1", "dedicated", 0, 0)
    s.borrow([("s1", 0.0)])
    s.submit(0, ticket("t"))
    (_a,) = s.schedule(0)
    moved = s.revoke(1, "s1")
    assert [t.turn_id for t in moved] == ["t"]
    assert s.schedule(1) == []


def test_requeued_turns_keep_their_place() -> None:
    s = ElasticScheduler(SchedulerConfig(max_concurrency_per_worker=1))
    s.add_worker(0, "d1", "dedicated", 1, 0)
    s.submit(0, ticket("old", "A", now=0))
    (_a,) = s.schedule(0)
    s.submit(5, ticket("new", "B", now=5))
    s.abort(6, "d1", "old", 0, "weight_update")
    (b,) = s.schedule(6)
    assert b.ticket.turn_id == "old"
    s.abort(7, "d1", "old", 1, "memory")  # no room there: it keeps off d1 for a while, then tries again
    (c,) = s.schedule(7)
    assert c.ticket.turn_id == "new"
    s.complete(8, "d1", "new", 0)
    assert s.schedule(8) == [] and [a.ticket.turn_id for a in s.schedule(7 + 2.0)] == ["old"]


def _held_on_serving(held: int, dedicated_capacity: int) -> ElasticScheduler:
    """A borrowed serving worker running t0..t3 (assigned in that order), a dedicated worker with
    ``dedicated_capacity`` slots that joins afterwards (idle), and a heartbeat at t=1 saying ``held`` are held."""
    s = ElasticScheduler()
    s.add_worker(0, "s1", "serving", 4, 0)
    s.borrow([("s1", 0.0)])
    for i in range(4):
        s.submit(i * 0.1, ticket(f"t{i}", f"x{i}", now=i * 0.1))
        s.schedule(i * 0.1)
    s.add_worker(0.5, "d1", "dedicated", dedicated_capacity, 0)
    s.observe(1.0, "s1", weight_version=0, held=held)
    return s


def test_held_turns_move_to_a_dedicated_worker_with_room_newest_first_and_are_cancelled() -> None:
    s = _held_on_serving(held=2, dedicated_capacity=4)
    assert s.find_held(1.5, 1.0) == []  # not held long enough yet
    s.observe(1.9, "s1", weight_version=0, held=2)  # still holding: the clock runs from the first report
    moved = s.find_held(2.0, 1.0)
    assert [(wid, t.turn_id, t.attempt) for wid, t in moved] == [("s1", "t3", 1), ("s1", "t2", 1)]
    assert sorted((c.worker_id, c.turn_id, c.attempt) for c in s.take_cancellations()) == [
        ("s1", "t2", 0), ("s1", "t3", 0)]
    placed = s.schedule(2.0)
    assert sorted((a.ticket.turn_id, a.worker_id) for a in placed) == [("t2", "d1"), ("t3", "d1")]
    assert s.counters["rerouted_held"] == 2
    assert s.find_held(2.5, 1.0) == []  # the two it still runs are not held


def test_held_turns_stay_while_no_dedicated_worker_has_room_or_holds_their_version() -> None:
    full = _held_on_serving(held=3, dedicated_capacity=1)
    full.submit(0.6, ticket("busy", "y", now=0.6))
    assert [a.worker_id for a in full.schedule(0.6)] == ["d1"]  # the dedicated worker is full now
    assert full.find_held(5.0, 1.0) == [] and full.take_cancellations() == []
    behind = _held_on_serving(held=3, dedicated_capacity=4)
    behind.observe(1.0, "d1", weight_version=1)  # holds another version than the turns' window
    assert behind.find_held(5.0, 1.0) == []
    partial = _held_on_serving(held=3, dedicated_capacity=1)
    assert [t.turn_id for _, t in partial.find_held(5.0, 1.0)] == ["t3"]  # as many as there is room for


def test_a_worker_that_stopped_holding_keeps_its_turns() -> None:
    s = _held_on_serving(held=2, dedicated_capacity=4)
    s.observe(1.5, "s1", weight_version=0, held=0)  # serving's slack came back: the guard released them
    s.observe(1.8, "s1", weight_version=0, held=1)  # a new hold starts the clock again
    assert s.find_held(2.5, 1.0) == []
    assert [t.turn_id for _, t in s.find_held(2.9, 1.0)] == ["t3"]


class SchedulerMachine(RuleBasedStateMachine):
    """Random joins, stalls, aborts and failures, results, revocations, re-lending, turn timeouts, held turns
    moved and turns the job withdraws: nothing lost, nothing accepted twice, no turn back on a worker it failed
    on."""

    def __init__(self) -> None:
        super().__init__()
        self.s = ElasticScheduler(SchedulerConfig(max_concurrency_per_worker=3))
        self.now = 0.0
        self.submitted: set[str] = set()
        self.accepted: list[str] = []
        self.given_up: list[str] = []
        self.withdrawn: list[str] = []
        self.n = 0
        self.workers = 0

    @rule(pool=st.sampled_from(["dedicated", "serving"]))
    def join(self, pool: str) -> None:
        self.workers += 1
        wid = f"w{self.workers}"
        self.s.add_worker(self.now, wid, pool, 3, 0)  # type: ignore[arg-type]
        if pool == "serving":
            self.s.borrow([(wid, 0.0)])

    @rule(k=st.integers(1, 4))
    def submit(self, k: int) -> None:
        for _ in range(k):
            self.n += 1
            tid = f"t{self.n}"
            self.s.submit(self.now, ticket(tid, f"x{self.n % 5}", self.now))
            self.submitted.add(tid)

    @rule()
    def schedule(self) -> None:
        self.now += 0.1
        for a in self.s.schedule(self.now):
            assert a.ticket.turn_id in self.submitted

    @precondition(lambda self: self.s.running > 0)
    @rule(data=st.data(), late=st.booleans())
    def finish(self, data: st.DataObject, late: bool) -> None:
        tid = data.draw(st.sampled_from(sorted(self.s._running)))
        wid, tk = self.s._running[tid]
        attempt = tk.attempt - 1 if late else tk.attempt
        verdict = self.s.complete(self.now, wid, tid, attempt)
        if verdict == "accepted":
            self.accepted.append(tid)

    @precondition(lambda self: self.s.running > 0)
    @rule(data=st.data(), reason=st.sampled_from(["memory", "engine_error: EngineDeadError", "invalid_result: shape"]))
    def abort(self, data: st.DataObject, reason: str) -> None:
        tid = data.draw(st.sampled_from(sorted(self.s._running)))
        wid, tk = self.s._running[tid]
        self.s.abort(self.now, wid, tid, tk.attempt, reason)
        self.given_up += [g.ticket.turn_id for g in self.s.take_given_up()]

    @precondition(lambda self: self.s.running > 0 or len(self.s.queue) > 0)
    @rule(data=st.data())
    def withdraw(self, data: st.DataObject) -> None:
        """The job stops waiting for a queued or running turn (a gateway call timed out)."""
        tid = data.draw(st.sampled_from(sorted([*self.s._running, *(t.turn_id for t in self.s.queue)])))
        where = self.s.where(tid)
        self.s.take_cancellations()  # those earlier re-routes left (the controller sends them every tick)
        assert self.s.withdraw(tid) and not self.s.withdraw(tid)
        cancelled = [(c.worker_id, c.turn_id) for c in self.s.take_cancellations()]
        assert (where, tid) in cancelled if where is not None else tid not in [t for _, t in cancelled]
        self.withdrawn.append(tid)

    @precondition(lambda self: bool(self.s.workers))
    @rule(data=st.data(), how=st.sampled_from(["stall", "gone", "revoke", "lend_again", "overdue", "heartbeat", "held"]))
    def disturb(self, data: st.DataObject, how: str) -> None:
        wid = data.draw(st.sampled_from(sorted(self.s.workers)))
        if how == "stall":
            self.now += 3
            for other in self.s.workers:
                if other != wid:
                    self.s.observe(self.now, other, weight_version=0)
            self.s.find_stalled(self.now, 2.0)
        elif how == "gone":
            self.s.remove_worker(self.now, wid)
        elif how == "revoke":
            self.s.revoke(self.now, wid)
        elif how == "lend_again":
            self.s.lend_again(wid)
            self.s.borrow([(wid, 0.0)])
        elif how == "overdue":
            self.now += 0.5
            self.s.find_overdue(self.now, 0.3)
        elif how == "held":
            self.s.observe(self.now, wid, weight_version=0, held=data.draw(st.integers(0, 3)))
            self.now += 0.5
            self.s.find_held(self.now, 0.3)
        else:
            self.s.observe(self.now, wid, weight_version=0)

    @invariant()
    def nothing_lost_nothing_twice(self) -> None:
        queued = [t.turn_id for t in self.s.queue]
        running = list(self.s._running)
        done = self.accepted + self.given_up + self.withdrawn
        everything = queued + running + done
        assert len(everything) == len(set(everything)), "a turn is in two places"
        assert set(everything) == self.submitted, "a turn was lost"

    @invariant()
    def workers_run_what_the_scheduler_thinks(self) -> None:
        for tid, (wid, tk) in self.s._running.items():
            worker = self.s.workers.get(wid)
            assert worker is not None and worker.in_flight.get(tid) == tk.attempt
            assert worker.load <= worker.capacity
            assert wid not in tk.failed_on, "a turn runs again on a worker it failed on"
            assert len(tk.failed_on) <= self.s.config.turn_retries


TestSchedulerMachine = SchedulerMachine.TestCase
TestSchedulerMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_only_reroutes_from_workers_that_may_still_run_them_are_cancelled() -> None:
    s = sched()
    for i in range(3):
        s.submit(0, ticket(f"t{i}"))
    placed = {a.ticket.turn_id: a.worker_id for a in s.schedule(0)}
    by_worker: dict[str, list[str]] = {}
    for turn_id, wid in placed.items():
        by_worker.setdefault(wid, []).append(turn_id)
    gone, *_ = by_worker
    s.remove_worker(1.0, gone)  # gone: nothing left to tell
    assert s.take_cancellations() == []
    for wid in [w for w in s.workers if w not in by_worker]:
        s.observe(2.5, wid, weight_version=0)  # idle workers heartbeat; the busy ones fall silent
    stalled = s.find_stalled(2.5, 2.0)
    expected = sorted((wid, t, 0) for wid in stalled for t in by_worker.get(wid, []))
    assert sorted((c.worker_id, c.turn_id, c.attempt) for c in s.take_cancellations()) == expected
    assert s.take_cancellations() == []


def test_queued_turns_take_the_dedicated_room_before_held_ones_move() -> None:
    s = _held_on_serving(held=2, dedicated_capacity=2)
    s.submit(0.6, ticket("waiting", "y", now=0.6))
    assert [t.turn_id for _, t in s.find_held(5.0, 1.0)] == ["t3"]  # two free slots, one queued turn: one moves
    s2 = _held_on_serving(held=2, dedicated_capacity=1)
    s2.submit(0.6, ticket("waiting", "y", now=0.6))
    assert s2.find_held(5.0, 1.0) == []


def test_a_turn_that_fails_on_engines_never_goes_back_there_and_is_given_up_after_its_retries() -> None:
    s = ElasticScheduler(SchedulerConfig(turn_retries=2))
    for wid in ("d1", "d2", "d3", "d4"):
        s.add_worker(0, wid, "dedicated", 4, 0)
    s.submit(0, ticket("t"))
    tried, given_up = [], []
    for attempt in range(3):
        (a,) = s.schedule(attempt + 1.0)
        assert a.worker_id not in tried and a.ticket.attempt == attempt
        tried.append(a.worker_id)
        assert s.abort(attempt + 1.5, a.worker_id, "t", attempt, "engine_error: EngineDeadError")
        given_up.append([g.ticket.turn_id for g in s.take_given_up()])
    assert given_up == [[], [], ["t"]]
    assert s.schedule(10) == [] and s.running == 0 and not s.queue  # three failures: given up, nothing runs it
    assert s.is_done("t") and s.counters["given_up"] == 1
    assert s.complete(11, tried[-1], "t", 2) == "duplicate"


def test_a_turn_that_failed_on_every_worker_is_given_up_at_once() -> None:
    s = ElasticScheduler(SchedulerConfig(turn_retries=5))
    s.add_worker(0, "d1", "dedicated", 4, 0)
    s.submit(0, ticket("t", "x"))
    (placed,) = s.schedule(1)
    assert placed.worker_id == "d1"
    s.abort(2, "d1", "t", 0, "invalid_result: logprobs")
    (gone,) = s.take_given_up()
    assert (gone.ticket.turn_id, gone.ticket.failed_on, gone.reason) == ("t", ("d1",), "invalid_result: logprobs")
    assert s.take_given_up() == []  # once each


def test_a_turn_given_back_for_lack_of_room_is_not_a_failure() -> None:
    s = ElasticScheduler(SchedulerConfig(turn_retries=0))
    s.add_worker(0, "d1", "dedicated", 4, 0)
    s.submit(0, ticket("t"))
    for attempt, now in enumerate((1.0, 4.0, 7.0)):
        (a,) = s.schedule(now)
        assert (a.worker_id, a.ticket.attempt) == ("d1", attempt)
        s.abort(now + 0.5, "d1", "t", attempt, "memory")  # back after AVOID_S, as often as it takes
    assert s.take_given_up() == [] and s.queue
