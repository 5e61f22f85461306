"""The pure part: how a StatusSnapshot becomes rows and values, and how liveness is judged."""

from __future__ import annotations

import pytest
from tui_controller import make_snapshot

from rose_core.protocol.messages import ErrorReport, Welcome
from rose_tui.formatting import format_bytes, format_clock, format_ms, slo_level
from rose_tui.link import LinkMonitor, LinkState
from rose_tui.view import EXECUTOR_COLUMNS, HISTORY_COLUMNS, DashboardModel, fleet_latency_p99


@pytest.mark.parametrize(
    ("value", "slo", "level"),
    [
        (None, 250, "idle"),
        (100, 0, "idle"),
        (100, 250, "ok"),
        (200, 250, "ok"),
        (201, 250, "warn"),
        (250, 250, "warn"),
        (251, 250, "bad"),
    ],
)
def test_slo_level(value: float | None, slo: float, level: str) -> None:
    assert slo_level(value, slo) == level


def test_formats() -> None:
    assert format_ms(None) == "-"
    assert format_ms(42.25) == "42.2 ms"
    assert format_ms(310) == "310 ms"
    assert format_ms(12_500) == "12.5 s"
    assert format_bytes(512) == "512 B"
    assert format_bytes(367_001_600) == "350 MiB"
    assert format_bytes(3 * 1024**3) == "3.00 GiB"
    assert format_clock(3725.9) == "01:02:05"


def test_executor_rows() -> None:
    view = DashboardModel().update(make_snapshot(t=0.0))
    rows = {row.key: row for row in view.executors}
    assert list(rows) == ["dedicated-0", "serving-0", "serving-1"]

    def cell(executor: str, column: str) -> tuple[str, str | None]:
        c = rows[executor].cell(EXECUTOR_COLUMNS, column)
        return c.text, c.level

    assert cell("dedicated-0", "rollout") == ("14/16", None)
    assert cell("dedicated-0", "kv") == ("-", "idle")
    assert cell("dedicated-0", "ttft") == ("-", "idle")
    assert cell("dedicated-0", "weights") == ("v3", None)
    assert cell("serving-0", "ttft") == ("120 ms", "ok")
    assert cell("serving-0", "kv") == ("42%", "ok")
    assert cell("serving-1", "ttft") == ("310 ms", "bad")
    assert cell("serving-1", "tpot") == ("44.0 ms", "warn")
    assert cell("serving-1", "kv") == ("93%", "bad")
    assert cell("serving-1", "rollout") == ("0/4 frozen", "warn")
    assert cell("serving-1", "state") == ("draining", "warn")
    assert cell("serving-1", "seen") == ("2.4s", "bad")
    assert cell("serving-0", "seen") == ("0.6s", "ok")
    assert cell("serving-0", "rollout") == ("3/8 lent", None)
    assert cell("serving-0", "guard") == ("4s +12ms", None)
    assert cell("serving-0", "routing") == ("a55 b40", None)  # affinity 55, borrowed 40
    assert cell("serving-0", "prefix") == ("31%", None)
    assert cell("serving-1", "guard") == ("61s -8ms", "bad")  # serving's slack went below zero
    assert cell("dedicated-0", "guard") == ("-", "idle")
    assert cell("dedicated-0", "routing") == ("d200 a110", None)  # dedicated 200, affinity 110
    assert cell("serving-1", "routing") == ("-", None)


def test_a_serving_host_is_judged_by_its_own_slo_once_it_reports_one() -> None:
    """A host that measured its SLO (``[slo] from_alone``) carries it in its load: its cells are judged by it."""
    snapshot = make_snapshot(t=0.0)
    serving = next(e for e in snapshot.executors if e.executor_id == "serving-0")
    serving.load.slo_ttft_ms, serving.load.slo_tpot_ms = 100.0, 1000.0  # 120 ms TTFT is past its own 100 ms
    rows = {row.key: row for row in DashboardModel().update(snapshot).executors}
    assert rows["serving-0"].cell(EXECUTOR_COLUMNS, "ttft").level == "bad"
    assert rows["serving-1"].cell(EXECUTOR_COLUMNS, "ttft").level == "bad"  # no SLO of its own: the job's 250 ms


def test_step_slo_sync_and_history() -> None:
    view = DashboardModel().update(make_snapshot(t=12.0, step=4))
    assert view.header.controller_id == "ctl-test"
    assert view.header.elapsed == "00:00:12"
    assert view.step.title == "step 4 · rollout"
    assert (view.step.trajectories_done, view.step.trajectories_total) == (24, 64)
    assert view.step.turns == "17 in flight · 5 queued"
    assert view.step.reward == "+0.375"
    assert view.step.weights == "v3"
    assert view.ttft.value.level == "bad"  # the worst serving executor is past the SLO
    assert view.ttft.slo == "250 ms"
    assert view.tpot.value.level == "warn"
    assert view.weight_sync.text == (
        "last weight sync 1.84 s · 350 MiB (publish 0.05 · transfer 0.41 · apply 0.90 · wait 0.48)"
    )
    assert view.weight_sync.headline == "last weight sync 1.84 s · 350 MiB"
    assert [row.key for row in view.history] == ["3", "2", "1", "0"]  # newest first
    newest = view.history[0]
    assert newest.cell(HISTORY_COLUMNS, "trajectories").text == "64/64"
    assert newest.cell(HISTORY_COLUMNS, "reward").text == "+0.300"


def test_without_step_or_serving() -> None:
    snapshot = make_snapshot()
    snapshot.step = None
    snapshot.executors = [e for e in snapshot.executors if e.role == "dedicated"]
    snapshot.weight_sync_seconds, snapshot.weight_sync_bytes = 0.0, 0
    view = DashboardModel().update(snapshot)
    assert view.step.title == "no step running"
    assert view.ttft.value.text == "-" and view.ttft.trend == ()
    assert view.weight_sync.text == "weight sync: none yet"
    assert fleet_latency_p99(snapshot.executors) == (None, None)


def test_weight_sync_from_a_controller_without_its_parts() -> None:
    snapshot = make_snapshot()
    snapshot.weight_sync_publish_seconds = snapshot.weight_sync_transfer_seconds = 0.0
    snapshot.weight_sync_apply_seconds = snapshot.weight_sync_wait_seconds = 0.0
    sync = DashboardModel().update(snapshot).weight_sync
    assert (sync.text, sync.breakdown) == ("last weight sync 1.84 s · 350 MiB", "")


def test_trends_are_bounded_and_ordered() -> None:
    model = DashboardModel(trend_length=5)
    for i in range(8):
        view = model.update(make_snapshot(t=float(i)))
    assert len(view.ttft.trend) == 5
    assert view.ttft.trend[-1] == fleet_latency_p99(make_snapshot(t=7.0).executors)[0]


def test_wall_clock_time_counts_from_first_snapshot() -> None:
    model = DashboardModel()
    model.update(make_snapshot(t=1_700_000_000.0))
    header = model.update(make_snapshot(t=1_700_000_065.0)).header
    assert (header.elapsed_label, header.elapsed) == ("watching", "00:01:05")


def test_link_states_over_time() -> None:
    link = LinkMonitor(started_at=100.0, stall_after_s=3.0)
    assert link.state(100.0) is LinkState.CONNECTING
    assert link.state(103.0) is LinkState.UNREACHABLE
    assert link.should_hello(103.0)
    link.on_hello(103.0)
    assert not link.should_hello(104.0)
    link.on_welcome(104.0, Welcome(controller_id="c"))
    assert link.state(104.5) is LinkState.UNREACHABLE  # a Welcome is not a status
    link2 = LinkMonitor(started_at=100.0, stall_after_s=3.0)
    link2.on_welcome(100.5, Welcome(controller_id="c"))
    assert link2.view(101.0).text == "connected, waiting for status"
    link.on_status(105.0, finished=False)
    assert link.view(105.0).state is LinkState.LIVE and link.view(105.0).text == "live"
    assert link.state(107.9) is LinkState.LIVE
    view = link.view(108.5)
    assert view.state is LinkState.UNREACHABLE and view.text == "unreachable (no status for 3.5s)"
    assert view.level == "bad"
    link.on_status(109.0, finished=False)
    assert link.state(109.0) is LinkState.LIVE
    link.on_status(110.0, finished=True)
    assert link.state(200.0) is LinkState.FINISHED


def test_rejection_and_notice() -> None:
    link = LinkMonitor(started_at=0.0)
    link.on_error(1.0, ErrorReport(code="unauthenticated", message="bad signature: fix the secret", ref="unsigned"))
    view = link.view(10.0)
    assert view.state is LinkState.REJECTED
    assert view.text == "rejected (unauthenticated)"
    assert "bad signature: fix the secret" in view.error
    assert not link.should_hello(10.0)

    link = LinkMonitor(started_at=0.0)
    link.on_error(1.0, ErrorReport(code="wrong_version", message="peer speaks protocol 2, controller 1: upgrade"))
    assert link.view(1.0).state is LinkState.REJECTED  # the controller refused our Hello (a signed report)

    link = LinkMonitor(started_at=0.0)
    link.on_status(0.5, finished=False)
    link.on_error(1.0, ErrorReport(code="busy", message="too many observers"))
    assert link.view(1.0).state is LinkState.LIVE
    assert link.view(1.0).error == "Controller says (busy): too many observers"
    assert link.view(30.0).error == ""
