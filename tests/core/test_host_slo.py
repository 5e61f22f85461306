"""The run report judges production by each serving host's own SLO and counts (``jobs.host_slo``)."""

from __future__ import annotations

from rose_core.app.controller.executor_record import ExecutorRecord
from rose_core.app.jobs.host_slo import HostSlo, host_slos, judged, judged_since, measuring
from rose_core.protocol.messages import LoadReport, Register


def record(eid: str, role: str, **load: object) -> ExecutorRecord:
    info = Register(executor_id=eid, role=role, device="cpu", host="h", models=[], memory_bytes=1)
    rec = ExecutorRecord(peer=b"p", info=info, registered_at=0.0, last_seen=0.0)
    rec.load = LoadReport(**load)  # type: ignore[arg-type]
    return rec


def test_hosts_report_their_slo_once_measured_and_dedicated_executors_have_none() -> None:
    records = [record("d", "dedicated"), record("s0", "serving", slo_ttft_ms=30.0, slo_tpot_ms=8.0, slo_basis="b"),
               record("s1", "serving", slo_basis="calibrating: 3 of 50")]
    assert host_slos(records) == {"s0": HostSlo(30.0, 8.0, "b")}
    assert measuring(records) == {"s1": "calibrating: 3 of 50"}
    assert host_slos(records)["s0"].describe() == "TTFT <= 30.0 ms, TPOT <= 8.0 ms (b)"


def test_a_steps_violations_are_the_hosts_counts_over_the_step() -> None:
    before = judged([record("s0", "serving", serving_requests_total=10, serving_slo_violations_total=1),
                     record("s1", "serving", serving_requests_total=50, serving_slo_violations_total=5)])
    after = judged([record("s0", "serving", serving_requests_total=14, serving_slo_violations_total=2),
                    record("s1", "serving", serving_requests_total=3, serving_slo_violations_total=0),  # restarted
                    record("s2", "serving", serving_requests_total=2, serving_slo_violations_total=0),  # new
                    record("d", "dedicated", serving_requests_total=99)])
    assert judged_since(after, before) == (4 + 3 + 2, 1 + 0 + 0)
