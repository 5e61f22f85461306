"""The controller over the in-process control channel (the real serde, wire and auth; no sockets), with
test peers playing executors (they speak the real protocol). Delivery is synchronous: a peer sends, one
``pump(0)`` handles it, and what the controller sent back is already in the peer's queue."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeVar

import numpy as np
import pytest

from rose_core.app.config import ControllerConfig, RunConfig, SchedulerConfig
from rose_core.app.controller.control_loop import ControlLoop
from rose_core.app.controller.controller import Controller
from rose_core.app.controller.controller_metrics import STATUS_SKIPPED
from rose_core.app.controller.job_hooks import AcceptedTurn, NoJob, TurnPayload
from rose_core.app.controller.registry import WELCOMES_AFTER_RETIRE
from rose_core.app.controller.weight_round import WeightRound
from rose_core.protocol import messages as m
from rose_core.protocol.auth import observer_key
from rose_core.scheduler import TurnTicket
from rose_core.support.metrics import REJECTED_MESSAGES
from rose_core.testing.inprocess_channel import InProcessClient, InProcessServer
from rose_core.transport.control_endpoint import ClientCallback

SECRET = b"k" * 32
MsgT = TypeVar("MsgT")


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def controller(clock: FakeClock) -> Iterator[Controller]:
    cfg = RunConfig(controller=ControllerConfig(stall_timeout_s=2.0, heartbeat_interval_s=1.0))
    ctl = Controller(cfg, SECRET, clock=clock, server=InProcessServer(SECRET))
    yield ctl
    ctl.close()


def recv_type(client: InProcessClient, kind: type[MsgT]) -> MsgT:
    """The first ``kind`` among the messages already delivered to ``client`` (others are skipped)."""
    while True:
        got = client.recv(0)
        assert got is not None, f"no {kind.__name__} arrived"
        if isinstance(got[1], kind):
            return got[1]


def join(ctl: Controller, eid: str, role: m.Role = "dedicated", capacity: int = 4,
         on_message: ClientCallback | None = None) -> InProcessClient:
    """A registered executor; with ``on_message`` the test's callback gets what the controller sends."""
    client = InProcessClient(ctl.address, SECRET, eid, on_message=on_message)
    client.send(m.Hello(peer_id=eid, kind="executor"))
    ctl.pump(0)
    if on_message is None:
        assert isinstance(recv_type(client, m.Welcome), m.Welcome)
    client.send(m.Register(executor_id=eid, role=role, device="cpu", host="h", models=[], memory_bytes=1,
                           rollout_capacity=capacity, weight_version=0))
    ctl.pump(0)
    assert eid in ctl.executors
    return client


class Recorder(NoJob):
    """A job that records the accepted results."""

    def __init__(self, accepted: list[AcceptedTurn]) -> None:
        self.accepted = accepted

    def on_result(self, accepted: AcceptedTurn) -> None:
        self.accepted.append(accepted)


def applied(ctl: Controller, weight_round: WeightRound) -> dict[str, m.WeightApplied]:
    """The round's answers, the controller's loop running until it has them."""
    return ControlLoop(ctl).result(weight_round.future, 5.0, weight_round.timed_out)


def turn(i: int, traj: str = "x") -> TurnTicket:
    payload = TurnPayload(np.arange(5, dtype=np.int32), m.SamplingParams(max_tokens=2), step=1)
    return TurnTicket(f"t{i}", f"{traj}{i}", 0, 0, 0.0, payload=payload)


def result(req: m.TurnRequest, eid: str, version: int = 0) -> m.TurnResult:
    return m.TurnResult(turn_id=req.turn_id, trajectory_id=req.trajectory_id, attempt=req.attempt, executor_id=eid,
                        weight_version=version, output_token_ids=np.array([1, 2], dtype=np.int32),
                        output_logprobs=np.array([-0.1, -0.2], dtype=np.float32), finish_reason="length")


def test_messages_before_hello_are_rejected(controller: Controller) -> None:
    before = REJECTED_MESSAGES.labels("no_handshake")._value.get()
    with InProcessClient(controller.address, SECRET, "rude") as client:
        client.send(m.Goodbye(peer_id="rude"))
        controller.pump(0)
        err = recv_type(client, m.ErrorReport)
        assert err.code == "no_handshake"
    assert REJECTED_MESSAGES.labels("no_handshake")._value.get() == before + 1


def test_turn_routed_result_accepted(controller: Controller) -> None:
    accepted: list[AcceptedTurn] = []
    controller.attach(Recorder(accepted))
    with join(controller, "d1") as d1:
        controller.submit_turn(turn(1))
        controller.pump(0)
        req = recv_type(d1, m.TurnRequest)
        assert req.prompt_token_ids.tolist() == [0, 1, 2, 3, 4]
        d1.send(result(req, "d1"))
        controller.pump(0)
        assert accepted
        assert accepted[0].role == "dedicated" and controller.stats.turns_by_role["dedicated"] == 1


def test_abort_reroutes_to_the_other_executor_and_late_result_is_dropped(controller: Controller, clock: FakeClock) -> None:
    accepted: list[AcceptedTurn] = []
    controller.attach(Recorder(accepted))
    with join(controller, "d1", capacity=1) as d1, join(controller, "d2", capacity=1) as d2:
        controller.submit_turn(turn(1))
        controller.pump(0)
        assert controller.scheduler.running == 1
        first = controller.scheduler.where("t1")
        assert first is not None
        a = d1 if first == "d1" else d2
        req = recv_type(a, m.TurnRequest)
        a.send(m.TurnAborted(turn_id="t1", trajectory_id=req.trajectory_id, attempt=0, executor_id=first,
                             reason="memory"))
        controller.pump(0)
        assert controller.stats.reroutes == 1 and controller.scheduler.running == 1
        clients = {"d1": d1, "d2": d2}
        second_req = recv_type(clients[controller.scheduler.where("t1") or ""], m.TurnRequest)
        while second_req.attempt == 0:
            second_req = recv_type(clients[controller.scheduler.where("t1") or ""], m.TurnRequest)
        assert second_req.attempt == 1
        a.send(result(req, first))
        controller.pump(0)
        assert controller.stats.late_results == 1
        assert accepted == []


def test_stalled_executor_turns_are_rerouted(controller: Controller, clock: FakeClock) -> None:
    with join(controller, "d1", capacity=1) as d1, join(controller, "d2", capacity=1) as d2:
        controller.submit_turn(turn(1))
        controller.pump(0)
        assert controller.scheduler.running == 1
        first = controller.scheduler.where("t1")
        assert first is not None
        live, live_id = (d2, "d2") if first == "d1" else (d1, "d1")
        clock.now += 3.0
        live.send(m.Heartbeat(executor_id=live_id, seq=1, sent_at=0.0, load=m.LoadReport(weight_version=0)))
        controller.pump(0)
        assert controller.scheduler.where("t1") == live_id
        assert controller.executors[first].state == "stalled"


def test_a_turn_rerouted_from_a_stalled_executor_is_cancelled_there(controller: Controller, clock: FakeClock) -> None:
    """The stalled executor may come back: it is told to stop the re-routed attempt; its late result is dropped."""
    got: dict[str, list[m.FromController]] = {"d1": [], "d2": []}

    def keep(eid: str) -> ClientCallback:
        return lambda _peer, msg: got[eid].append(msg)

    with join(controller, "d1", capacity=1, on_message=keep("d1")) as d1, \
            join(controller, "d2", capacity=1, on_message=keep("d2")) as d2:
        controller.submit_turn(turn(1))
        controller.pump(0)
        first = controller.scheduler.where("t1")
        peers = {"d1": d1, "d2": d2}
        live_id = "d2" if first == "d1" else "d1"
        (request,) = [msg for msg in got[first] if isinstance(msg, m.TurnRequest)]
        clock.now += 3.0
        peers[live_id].send(m.Heartbeat(executor_id=live_id, seq=1, sent_at=0.0, load=m.LoadReport()))
        controller.pump(0)
        controller.pump(0)
        cancels = [msg for msg in got[first] if isinstance(msg, m.CancelTurn)]
        assert [(c.turn_id, c.attempt) for c in cancels] == [("t1", 0)]
        assert not [msg for msg in got[live_id] if isinstance(msg, m.CancelTurn)]
        assert controller.scheduler.take_cancellations() == []  # sent once
        peers[first].send(result(request, first))  # it came back and finished anyway: discarded
        controller.pump(0)
        assert controller.stats.late_results == 1


def test_observer_receives_status_snapshots(controller: Controller) -> None:
    with join(controller, "d1"), InProcessClient(controller.address, SECRET, "tui") as tui:
        tui.send(m.Hello(peer_id="tui", kind="observer"))
        controller.pump(0)
        recv_type(tui, m.Welcome)
        snap = recv_type(tui, m.StatusSnapshot)
        assert [e.executor_id for e in snap.executors] == ["d1"]


def drain(client: InProcessClient, kind: type[MsgT]) -> list[MsgT]:
    """Every ``kind`` already delivered to ``client`` (others are dropped)."""
    out = []
    while (got := client.recv(0)) is not None:
        if isinstance(got[1], kind):
            out.append(got[1])
    return out


def test_a_dashboard_that_stops_reading_holds_at_most_the_credit_and_then_gets_the_newest(
    controller: Controller, clock: FakeClock,
) -> None:
    """Status is coalesced: an observer that does not acknowledge what it was sent (stopped, slow) is sent no
    more than ``STATUS_CREDIT`` snapshots however often the controller publishes, each skipped one counted;
    its next ack brings the newest snapshot, not a backlog."""
    skipped = STATUS_SKIPPED._value.get()
    with join(controller, "d1"), InProcessClient(controller.address, SECRET, "tui") as tui:
        tui.send(m.Hello(peer_id="tui", kind="observer"))
        controller.pump(0)
        for _ in range(50):  # 50 status intervals while the dashboard reads nothing
            clock.now += controller.config.controller.status_interval_s
            controller.pump(0)
        held = drain(tui, m.StatusSnapshot)
        assert len(held) == m.STATUS_CREDIT
        assert STATUS_SKIPPED._value.get() - skipped == 51 - m.STATUS_CREDIT  # the Hello's snapshot, then 50
        tui.send(m.StatusAck(snapshot_time=held[0].time))
        controller.pump(0)
        clock.now += controller.config.controller.status_interval_s
        controller.pump(0)
        (newest,) = drain(tui, m.StatusSnapshot)
        assert newest.time > held[-1].time  # the newest, one of it
        for snap in (held[1], newest):  # a dashboard that keeps up gets one every interval
            tui.send(m.StatusAck(snapshot_time=snap.time))
        for _ in range(3):
            clock.now += controller.config.controller.status_interval_s
            controller.pump(0)
            (snap,) = drain(tui, m.StatusSnapshot)
            tui.send(m.StatusAck(snapshot_time=snap.time))


def test_only_an_observer_may_acknowledge_status(controller: Controller) -> None:
    before = REJECTED_MESSAGES.labels("wrong_role")._value.get()
    with join(controller, "d1") as d1:
        d1.send(m.StatusAck(snapshot_time=1.0))
        controller.pump(0)
    assert REJECTED_MESSAGES.labels("wrong_role")._value.get() == before + 1


def forged_by_a_dashboard() -> list[m.ToController]:
    """Executor messages a dashboard's connection might forge: to register itself, revoke, abort, report weights."""
    return [
        m.Register(executor_id="tui", role="dedicated", device="cpu", host="h", models=[], memory_bytes=1,
                   rollout_capacity=4, weight_version=0),
        m.Heartbeat(executor_id="d1", seq=1, sent_at=0.0, load=m.LoadReport(revoked=True)),
        m.TurnAborted(turn_id="t1", trajectory_id="x1", attempt=0, executor_id="d1", reason="forged"),
        m.WeightApplied(executor_id="d1", version=7, seconds=0.1, bytes_received=1),
    ]


def test_an_observer_may_only_watch(controller: Controller) -> None:
    """The dashboard's connection cannot act for an executor: every executor message from it is refused, counted."""
    before = REJECTED_MESSAGES.labels("wrong_role")._value.get()
    with join(controller, "d1"), InProcessClient(controller.address, SECRET, "tui") as tui:
        controller.submit_turn(turn(1))
        controller.pump(0)
        tui.send(m.Hello(peer_id="tui", kind="observer"))
        controller.pump(0)
        req = controller.scheduler.running
        forged = forged_by_a_dashboard()
        for msg in forged:
            tui.send(msg)
            controller.pump(0)
        assert REJECTED_MESSAGES.labels("wrong_role")._value.get() == before + len(forged)
        assert set(controller.executors) == {"d1"} and not controller.executors["d1"].revoked
        assert controller.scheduler.running == req == 1 and controller.stats.reroutes == 0
        assert 7 not in controller.executors["d1"].applied


def test_a_dashboard_with_the_observer_key_watches_and_can_do_nothing_else(controller: Controller) -> None:
    """What `rose run` hands a dashboard (``observer.key``): the controller's status reaches it, and the same
    forged executor messages as above, now signed with that key, are refused before the controller sees them
    (even a Hello claiming to be an executor)."""
    before = REJECTED_MESSAGES.labels("wrong_role")._value.get()
    with join(controller, "d1"), InProcessClient(controller.address, observer_key(SECRET), "tui") as tui:
        controller.submit_turn(turn(1))
        controller.pump(0)
        forged = [m.Hello(peer_id="tui", kind="executor"), *forged_by_a_dashboard()]
        for msg in forged:
            tui.send(msg)
            controller.pump(0)
        tui.send(m.Hello(peer_id="tui", kind="observer"))
        controller.pump(0)
        assert isinstance(recv_type(tui, m.Welcome), m.Welcome)  # sealed with the observer key, verified by it
        assert recv_type(tui, m.StatusSnapshot).executors  # it sees the job
        assert REJECTED_MESSAGES.labels("wrong_role")._value.get() == before + len(forged)
        assert set(controller.executors) == {"d1"} and not controller.executors["d1"].revoked
        assert controller.scheduler.running == 1 and controller.stats.reroutes == 0


def test_an_executor_speaks_only_for_itself(controller: Controller) -> None:
    before = REJECTED_MESSAGES.labels("not_owner")._value.get()
    with join(controller, "d1"), join(controller, "d2") as d2:
        d2.send(m.Goodbye(peer_id="d1", reason="evicting someone else"))
        controller.pump(0)
        d2.send(m.Heartbeat(executor_id="d1", seq=1, sent_at=0.0, load=m.LoadReport(revoked=True)))
        controller.pump(0)
        assert set(controller.executors) == {"d1", "d2"} and not controller.executors["d1"].revoked
    assert REJECTED_MESSAGES.labels("not_owner")._value.get() == before + 2


def test_goodbye_removes_the_executor_and_reroutes(controller: Controller) -> None:
    with join(controller, "d1") as d1:
        controller.submit_turn(turn(1))
        controller.pump(0)
        assert controller.scheduler.running == 1
        d1.send(m.Goodbye(peer_id="d1", reason="bye"))
        controller.pump(0)
        assert "d1" not in controller.executors
        assert len(controller.scheduler.queue) == 1


def test_weight_announce_waits_for_every_executor(controller: Controller) -> None:
    def apply(_peer: bytes, msg: m.FromController) -> None:
        # d1's side, run as the announce arrives: inside the controller's send, before it pumps.
        if isinstance(msg, m.WeightAnnounce):
            d1.send(m.WeightApplied(executor_id="d1", version=msg.version, seconds=0.1, bytes_received=123))

    with join(controller, "d1", on_message=apply) as d1:
        ann = m.WeightAnnounce(version=1, step=1, source="tcp://x:1")
        done = applied(controller, controller.announce_weights(ann))
        assert done["d1"].bytes_received == 123
        assert controller.scheduler.workers["d1"].weight_version == 1


def test_weight_sync_breakdown_adds_up_per_executor(controller: Controller, clock: FakeClock) -> None:
    """Each executor reports its transfer and apply; the controller's clock gives the rest as its wait."""
    def replier(eid: str, pass_s: float, transfer_s: float, apply_s: float) -> ClientCallback:
        def apply(_peer: bytes, msg: m.FromController) -> None:
            if isinstance(msg, m.WeightAnnounce):
                clock.now += pass_s  # the controller's clock moves on while this executor works
                peers[eid].send(m.WeightApplied(
                    executor_id=eid, version=msg.version, seconds=transfer_s + apply_s, bytes_received=100,
                    queue_seconds=0.01, transfer_seconds=transfer_s, apply_seconds=apply_s, drain_seconds=0.02,
                    commit_seconds=0.04, retransform_seconds=0.05, aborted_turns=2, tensors_changed=3,
                    weights_digest="good" if eid == "d1" else "bad"))
        return apply

    peers: dict[str, InProcessClient] = {}
    peers["d1"] = join(controller, "d1", on_message=replier("d1", 1.0, 0.2, 0.5))
    peers["d2"] = join(controller, "d2", on_message=replier("d2", 0.5, 0.3, 0.1))
    with peers["d1"], peers["d2"]:
        ann = m.WeightAnnounce(version=1, step=1, source="tcp://x:1", manifest_digest="good")
        applied(controller, controller.announce_weights(ann, publish_s=0.25, export_s=0.05))
        sync = controller.last_sync
        # d1's announce went out at 100.0, d2's at 101.0; both replies are handled at 101.5.
        d1, d2 = sync.executors["d1"], sync.executors["d2"]
        assert (d1.elapsed_s, d1.transfer_s, d1.apply_s, d1.wait_s) == pytest.approx((1.5, 0.2, 0.5, 0.8))
        assert (d2.elapsed_s, d2.transfer_s, d2.apply_s, d2.wait_s) == pytest.approx((0.5, 0.3, 0.1, 0.1))
        assert (d1.bytes_received, d1.queue_s, d1.commit_s, d1.retransform_s, d1.aborted_turns) == (
            100, 0.01, 0.04, 0.05, 2)
        assert (d1.drain_s, d1.tensors_changed, d1.digest_ok, d2.digest_ok) == (0.02, 3, True, False)
        assert sync.digest_mismatches == 1  # d2's engine holds other weights than the trainer published
        assert (sync.publish_s, sync.export_s, sync.announce_s) == pytest.approx((0.25, 0.05, 1.5))
        assert (sync.transfer_s, sync.apply_s, sync.wait_s) == pytest.approx((0.3, 0.5, 0.8))  # max of each
        assert sync.last == "d1"
        assert controller.weight_sync == (pytest.approx(1.75), 200)
        snap = controller.snapshot(clock.now)
        assert snap.weight_sync_seconds == pytest.approx(1.75)
        assert (snap.weight_sync_publish_seconds, snap.weight_sync_transfer_seconds, snap.weight_sync_apply_seconds,
                snap.weight_sync_wait_seconds) == pytest.approx((0.25, 0.3, 0.5, 0.8))


def test_weight_sync_from_an_executor_without_the_parts(controller: Controller, clock: FakeClock) -> None:
    """An older executor sends no parts: all of its time shows as wait, nothing is made up."""
    def apply(_peer: bytes, msg: m.FromController) -> None:
        if isinstance(msg, m.WeightAnnounce):
            clock.now += 0.4
            d1.send(m.WeightApplied(executor_id="d1", version=msg.version, seconds=0.3, bytes_received=7))

    with join(controller, "d1", on_message=apply) as d1:
        applied(controller, controller.announce_weights(m.WeightAnnounce(version=1, step=1, source="tcp://x:1")))
        part = controller.last_sync.executors["d1"]
        assert (part.transfer_s, part.apply_s, part.wait_s) == pytest.approx((0.0, 0.0, 0.4))
        assert controller.last_sync.publish_s == 0.0


def beat(client: InProcessClient, eid: str, seq: int = 1, **load: object) -> None:
    client.send(m.Heartbeat(executor_id=eid, seq=seq, sent_at=0.0, load=m.LoadReport(weight_version=0, **load)))


def test_serving_executors_are_borrowed_at_job_start_lowest_kv_use_first(clock: FakeClock) -> None:
    """Nothing is borrowed at registration; once the job opens borrowing and the load was watched for
    ``borrow_after_s``, the least loaded serving executor is borrowed (here one slot: the busier one waits)."""
    cfg = RunConfig(controller=ControllerConfig(stall_timeout_s=5.0, heartbeat_interval_s=1.0),
                    scheduler=SchedulerConfig(max_borrowed_workers=1, borrow_after_s=2.0))
    ctl = Controller(cfg, SECRET, clock=clock, server=InProcessServer(SECRET))
    try:
        with join(ctl, "busy", role="serving") as busy, join(ctl, "calm", role="serving") as calm:
            beat(busy, "busy", serving_kv_usage_ratio=0.30)
            beat(calm, "calm", serving_kv_usage_ratio=0.05)
            ctl.pump(0)
            assert not any(w.borrowed for w in ctl.scheduler.workers.values())  # the job has not started
            ctl.open_borrowing()
            clock.now += 1.0
            ctl.pump(0)
            assert not any(w.borrowed for w in ctl.scheduler.workers.values())  # still watching
            clock.now += 1.5
            ctl.pump(0)
            assert {w.worker_id for w in ctl.scheduler.workers.values() if w.borrowed} == {"calm"}
            snap = ctl.snapshot(clock.now)
            assert {e.executor_id: e.borrowed for e in snap.executors} == {"busy": False, "calm": True}
    finally:
        ctl.close()


def test_a_revoked_executor_gives_its_turns_back_and_the_next_one_is_borrowed(clock: FakeClock) -> None:
    """Its heartbeat says revoked: its turns are re-routed and cancelled there, it is never borrowed again,
    the freed slot goes to the other serving executor; nothing is lost or accepted twice. Its Goodbye (the
    lease ends) is counted as a departure, and this job does not welcome it again."""
    got: list[m.FromController] = []
    cfg = RunConfig(controller=ControllerConfig(stall_timeout_s=5.0, heartbeat_interval_s=1.0),
                    scheduler=SchedulerConfig(max_borrowed_workers=1, borrow_after_s=0.0))
    ctl = Controller(cfg, SECRET, clock=clock, server=InProcessServer(SECRET))
    try:
        with join(ctl, "s1", role="serving", on_message=lambda _p, msg: got.append(msg)) as s1, \
                join(ctl, "s2", role="serving") as s2:
            beat(s1, "s1", serving_kv_usage_ratio=0.01)
            beat(s2, "s2", serving_kv_usage_ratio=0.02)
            ctl.open_borrowing()
            ctl.pump(0)
            ctl.submit_turn(turn(1))
            ctl.pump(0)
            assert ctl.scheduler.where("t1") == "s1"
            (request,) = [msg for msg in got if isinstance(msg, m.TurnRequest)]
            beat(s1, "s1", seq=2, revoked=True)
            ctl.pump(0)
            ctl.pump(0)
            assert ctl.executors["s1"].revoked and ctl.scheduler.workers["s1"].revoked
            assert [(c.turn_id, c.attempt) for c in got if isinstance(c, m.CancelTurn)] == [("t1", 0)]
            assert ctl.scheduler.where("t1") == "s2"  # s2 was borrowed into the freed slot
            s1.send(result(request, "s1"))  # finished there anyway: discarded
            ctl.pump(0)
            assert ctl.stats.late_results == 1 and ctl.stats.reroutes == 1
            s1.send(m.Goodbye(peer_id="s1", reason="revoked: the serving owner sent SIGUSR1"))  # the lease ends
            ctl.pump(0)
            assert "s1" not in ctl.executors and ctl.stats.left == {"s1": "revoked: the serving owner sent SIGUSR1"}
            got.clear()
            s1.send(m.Hello(peer_id="s1", kind="executor"))  # the host looks for a job: not this one again
            ctl.pump(0)
            assert [msg.code for msg in got if isinstance(msg, m.ErrorReport)] == ["released"]
    finally:
        ctl.close()


def test_a_turn_held_past_the_timeout_on_a_live_executor_is_rerouted_and_cancelled(clock: FakeClock) -> None:
    got: dict[str, list[m.FromController]] = {"d1": [], "d2": []}
    cfg = RunConfig(controller=ControllerConfig(stall_timeout_s=5.0, heartbeat_interval_s=1.0, turn_timeout_s=30.0))
    ctl = Controller(cfg, SECRET, clock=clock, server=InProcessServer(SECRET))
    try:
        with join(ctl, "d1", capacity=1, on_message=lambda _p, msg: got["d1"].append(msg)) as d1, \
                join(ctl, "d2", capacity=1, on_message=lambda _p, msg: got["d2"].append(msg)) as d2:
            ctl.submit_turn(turn(1))
            ctl.pump(0)
            first = ctl.scheduler.where("t1")
            assert first is not None
            for seq in range(1, 10):  # both keep heartbeating: the stall rule never fires
                clock.now += 4.0
                beat(d1, "d1", seq)
                beat(d2, "d2", seq)
                ctl.pump(0)
            assert [(c.turn_id, c.attempt) for c in got[first] if isinstance(c, m.CancelTurn)] == [("t1", 0)]
            assert ctl.scheduler.running_ticket("t1").attempt == 1  # type: ignore[union-attr]
            assert ctl.scheduler.counters["rerouted_overdue"] == 1
    finally:
        ctl.close()


def test_turns_held_back_on_a_borrowed_executor_move_to_a_dedicated_one_with_room(clock: FakeClock) -> None:
    """The serving executor's heartbeats say its guard holds two turns; once the dedicated executor has room
    (one slot) and the hold lasted ``move_held_after_s``, the newest held turn moves there and is cancelled
    on the serving executor; the other stays."""
    got: dict[str, list[m.FromController]] = {"d1": [], "s1": []}
    cfg = RunConfig(controller=ControllerConfig(stall_timeout_s=5.0, heartbeat_interval_s=1.0),
                    scheduler=SchedulerConfig(borrow_after_s=0.0, move_held_after_s=1.0))
    ctl = Controller(cfg, SECRET, clock=clock, server=InProcessServer(SECRET))
    try:
        with join(ctl, "d1", capacity=1, on_message=lambda _p, msg: got["d1"].append(msg)) as d1, \
                join(ctl, "s1", role="serving", on_message=lambda _p, msg: got["s1"].append(msg)) as s1:
            beat(s1, "s1")
            ctl.open_borrowing()
            for i in (1, 2, 3):
                ctl.submit_turn(turn(i))
                clock.now += 0.1
                ctl.pump(0)
            assert [ctl.scheduler.where(f"t{i}") for i in (1, 2, 3)] == ["d1", "s1", "s1"]
            beat(s1, "s1", seq=2, rollout_held=2)
            ctl.pump(0)
            (first,) = [msg for msg in got["d1"] if isinstance(msg, m.TurnRequest)]
            d1.send(result(first, "d1"))  # the dedicated executor has room now
            clock.now += 0.5
            ctl.pump(0)
            assert ctl.scheduler.where("t3") == "s1"  # held for 0.5 s only
            clock.now += 0.6
            beat(s1, "s1", seq=3, rollout_held=2)
            ctl.pump(0)
            assert [(c.turn_id, c.attempt) for c in got["s1"] if isinstance(c, m.CancelTurn)] == [("t3", 0)]
            assert [(r.turn_id, r.attempt) for r in got["d1"] if isinstance(r, m.TurnRequest)][-1] == ("t3", 1)
            assert ctl.scheduler.where("t2") == "s1" and ctl.stats.held_moved == 1
    finally:
        ctl.close()


def test_the_job_releases_executors_and_welcomes_a_retired_one_back_a_bounded_number_of_times(
    controller: Controller,
) -> None:
    """Release, not Shutdown: a retired executor and, at the job's end, every executor is released (a serving
    host goes on serving and looks for its next job). A retired one (its weight apply failed) is welcomed back
    for a new lease ``WELCOMES_AFTER_RETIRE`` times; retired once more, this job refuses its Hello from then on."""
    with join(controller, "s1", role="serving") as s1, join(controller, "d1") as d1:
        for _ in range(WELCOMES_AFTER_RETIRE):
            controller.retire("s1", "weight version 3 failed: boom")
            released = recv_type(s1, m.Release)
            assert "taken out of the job: weight version 3 failed" in released.reason
            s1.send(m.Hello(peer_id="s1", kind="executor"))  # the host looks for a job: this one takes it back
            controller.pump(0)
            assert isinstance(recv_type(s1, m.Welcome), m.Welcome)
            s1.send(m.Register(executor_id="s1", role="serving", device="cpu", host="h", models=[], memory_bytes=1,
                               rollout_capacity=4, weight_version=-1))
            controller.pump(0)
            assert "s1" in controller.executors
        controller.retire("s1", "weight version 4 failed: boom")
        recv_type(s1, m.Release)
        s1.send(m.Hello(peer_id="s1", kind="executor"))
        controller.pump(0)
        assert recv_type(s1, m.ErrorReport).code == "released" and "s1" not in controller.executors
        done = controller.release_executors("run finished")
        assert recv_type(d1, m.Release).reason == "run finished" and not done.done()
        d1.send(m.Goodbye(peer_id="d1", reason="released"))
        controller.pump(0)
        assert done.done()


def test_an_executor_that_registers_late_is_sent_the_newest_version_and_a_failed_catch_up_takes_it_out(
    controller: Controller,
) -> None:
    """A serving host taken out after a failed apply comes back for a new lease at -1: it is sent the job's newest
    version at once (not at the next step's announce, which would need its turns first); while it is away the
    job counts it as returning. Its catch-up fails: taken out again. The next one succeeds: it holds the version."""
    newest = m.WeightAnnounce(version=3, step=3, source="tcp://x:1")
    with join(controller, "s1", role="serving") as s1, join(controller, "d1") as d1:
        controller.announce_weights(newest)
        controller.retire("s1", "weight version 3 failed: boom")
        assert controller.registry.returning == {"s1"}
        for ok in (False, True):
            recv_type(s1, m.Release)
            s1.send(m.Hello(peer_id="s1", kind="executor"))
            controller.pump(0)
            recv_type(s1, m.Welcome)
            s1.send(m.Register(executor_id="s1", role="serving", device="cpu", host="h", models=[], memory_bytes=1,
                               rollout_capacity=4, weight_version=-1))
            controller.pump(0)
            assert controller.registry.returning == set() and recv_type(s1, m.WeightAnnounce) == newest
            s1.send(m.WeightApplied(executor_id="s1", version=3, seconds=0.1, bytes_received=1, ok=ok,
                                    error="" if ok else "no descriptors"))
            controller.pump(0)
        assert controller.stats.retired["s1"] == "weight version 3 failed: no descriptors"
        assert controller.executors["s1"].weight_version == 3
        while d1.recv(0) is not None:  # the round's announce, and the rest
            pass
        d1.send(m.Register(executor_id="d1", role="dedicated", device="cpu", host="h", models=[], memory_bytes=1,
                           rollout_capacity=4, weight_version=3))  # one that holds it is sent nothing
        controller.pump(0)
        assert d1.recv(0) is None


def test_the_welcome_names_the_jobs_policy(clock: FakeClock) -> None:
    ctl = Controller(RunConfig(), SECRET, clock=clock, server=InProcessServer(SECRET), policy_model_dir="/models/p")
    try:
        with InProcessClient(ctl.address, SECRET, "s1") as client:
            client.send(m.Hello(peer_id="s1", kind="executor"))
            ctl.pump(0)
            assert recv_type(client, m.Welcome).policy_model_dir == "/models/p"
    finally:
        ctl.close()


def test_a_withdrawn_turn_is_cancelled_on_its_executor_and_its_late_result_discarded(clock: FakeClock) -> None:
    """A gateway call that timed out: the job withdraws its turn; the executor running it is told to stop, the
    queued one never runs, and a result that still comes is discarded (nothing accepted for it)."""
    got: list[m.FromController] = []
    cfg = RunConfig(controller=ControllerConfig(stall_timeout_s=5.0, heartbeat_interval_s=1.0))
    ctl = Controller(cfg, SECRET, clock=clock, server=InProcessServer(SECRET))
    try:
        with join(ctl, "d1", capacity=1, on_message=lambda _p, msg: got.append(msg)) as d1:
            ctl.submit_turn(turn(1))
            ctl.submit_turn(turn(2))  # queued: d1 has room for one
            ctl.pump(0)
            (request,) = [msg for msg in got if isinstance(msg, m.TurnRequest)]
            assert ctl.withdraw_turn("t1") and ctl.withdraw_turn("t2") and not ctl.withdraw_turn("t1")
            ctl.pump(0)
            assert [(c.turn_id, c.attempt) for c in got if isinstance(c, m.CancelTurn)] == [("t1", 0)]
            assert [msg.turn_id for msg in got if isinstance(msg, m.TurnRequest)] == ["t1"]  # t2 never sent
            d1.send(result(request, "d1"))  # it finished before the cancel arrived
            ctl.pump(0)
            assert ctl.stats.late_results == 1 and ctl.scheduler.running == 0 and not ctl.scheduler.queue
            assert ctl.scheduler.counters["withdrawn"] == 2
    finally:
        ctl.close()
