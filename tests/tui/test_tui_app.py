"""The app without a network: snapshots posted straight into it, asserted on the widgets."""

from __future__ import annotations

from textual.widgets import Label, ProgressBar, Sparkline
from tui_controller import make_snapshot

from rose_core.protocol.messages import ErrorReport
from rose_tui.app import RoseTui
from rose_tui.feed_events import ErrorReceived, StatusReceived
from rose_tui.widgets import ErrorBanner, LearningPanel, SloGauge, StepPanel, ViewTable


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def label_text(app: RoseTui, selector: str) -> str:
    return str(app.screen.query_one(selector, Label).render())


async def test_snapshot_fills_the_dashboard() -> None:
    app = RoseTui()
    async with app.run_test(size=(120, 35)) as pilot:
        for t in (10.0, 10.5, 11.0, 12.0):
            app.post_message(StatusReceived(make_snapshot(t=t, step=4)))
        await pilot.pause()

        table = app.screen.query_one("#executors", ViewTable)
        assert [row.key.value for row in table.ordered_rows] == ["dedicated-0", "serving-0", "serving-1"]
        assert table.get_cell("serving-1", "ttft").plain == "295 ms"  # 310 + 20 sin(12 / 3)
        assert table.get_cell("serving-1", "rollout").plain == "0/4 frozen"
        assert table.get_cell("dedicated-0", "kv").plain == "-"
        assert table.border_title == "executors (3)"
        ok_style = str(table.get_cell("serving-0", "ttft").style)
        bad_style = str(table.get_cell("serving-1", "ttft").style)
        assert ok_style != bad_style and "bold" in bad_style

        bar = app.screen.query_one("#trajectories-bar", ProgressBar)
        assert (bar.progress, bar.total) == (24, 64)
        assert label_text(app, "#trajectories") == "24/64 trajectories"
        assert label_text(app, "#step-title") == "step 4 · rollout"
        assert label_text(app, "#step-turns") == "turns 17 in flight · 5 queued"
        assert "reward mean +0.375" in label_text(app, "#step-reward")
        assert label_text(app, "#weight-sync") == "last weight sync 1.84 s · 350 MiB"
        assert label_text(app, "#weight-sync-parts") == "publish 0.05 · transfer 0.41 · apply 0.90 · wait 0.48 s"

        ttft = app.screen.query_one("#ttft", SloGauge)
        tpot = app.screen.query_one("#tpot", SloGauge)
        assert ttft.has_class("-bad") and not ttft.has_class("-ok")
        assert tpot.has_class("-warn")
        assert str(ttft.query_one(".gauge-value", Label).render()) == "TTFT p99 295 ms  SLO 250 ms"
        assert len(app.screen.query_one("#ttft", SloGauge).query_one(Sparkline).data or []) == 4

        history = app.screen.query_one("#history", ViewTable)
        assert [row.key.value for row in history.ordered_rows] == ["3", "2", "1", "0"]
        learning = app.screen.query_one(LearningPanel)
        assert learning.border_title == "learning (4 steps)"
        assert str(learning.render()).splitlines()[0] == "reward    ▁▃▆█ +0.300"
        assert label_text(app, "#controller") == "controller ctl-test"
        assert label_text(app, "#elapsed") == "elapsed 00:00:12"
        assert app.screen.query_one(StepPanel).step.step == 4


async def test_rows_update_in_place_and_rebuild_when_fleet_changes() -> None:
    app = RoseTui()
    async with app.run_test(size=(120, 35)) as pilot:
        app.post_message(StatusReceived(make_snapshot(t=1.0)))
        await pilot.pause()
        table = app.screen.query_one("#executors", ViewTable)
        before = table.get_cell("dedicated-0", "routing").plain
        app.post_message(StatusReceived(make_snapshot(t=5.0)))
        await pilot.pause()
        assert table.get_cell("dedicated-0", "routing").plain != before
        smaller = make_snapshot(t=6.0)
        smaller.executors = smaller.executors[:1]
        app.post_message(StatusReceived(smaller))
        await pilot.pause()
        assert [row.key.value for row in table.ordered_rows] == ["dedicated-0"]


async def test_link_state_follows_the_clock() -> None:
    clock = FakeClock()
    app = RoseTui(clock=clock)
    async with app.run_test(size=(120, 35)) as pilot:
        assert "connecting" in label_text(app, "#link")
        app.post_message(StatusReceived(make_snapshot()))
        await pilot.pause()
        link = app.screen.query_one("#link", Label)
        assert str(link.render()) == "● live" and link.has_class("-ok")
        clock.now += 3.5
        app.refresh_link()
        await pilot.pause()
        assert "unreachable" in str(link.render()) and link.has_class("-bad")
        app.post_message(StatusReceived(make_snapshot()))
        await pilot.pause()
        assert str(link.render()) == "● live"
        app.post_message(StatusReceived(make_snapshot(finished=True)))
        await pilot.pause()
        assert str(link.render()) == "● run finished"


async def test_rejection_is_shown_in_full() -> None:
    app = RoseTui()
    async with app.run_test(size=(120, 35)) as pilot:
        banner = app.screen.query_one(ErrorBanner)
        assert not banner.display
        message = "peer speaks protocol 2, this process speaks 1: install matching rose-core versions on both ends"
        app.post_message(ErrorReceived(ErrorReport(code="wrong_version", message=message, ref="unsigned")))
        await pilot.pause()
        assert banner.display and banner.has_class("-rejected")
        assert message in str(banner.render())
        assert "rejected (wrong_version)" in label_text(app, "#link")


async def test_fits_80x24() -> None:
    app = RoseTui()
    async with app.run_test(size=(80, 24)) as pilot:
        app.post_message(StatusReceived(make_snapshot()))
        await pilot.pause()
        table = app.screen.query_one("#executors", ViewTable)
        assert table.narrow and "role" not in table.shown_columns and "routing" not in table.shown_columns
        assert table.region.height >= 5
        assert table.virtual_size.width <= table.scrollable_content_region.width  # no sideways scrolling
        history = app.screen.query_one("#history", ViewTable)
        assert history.region.bottom <= 23
        assert history.narrow and history.virtual_size.width <= history.scrollable_content_region.width
        learning = app.screen.query_one(LearningPanel)
        assert learning.region.bottom <= 23 and learning.region.x >= history.region.right  # side by side
        assert all(len(line) <= learning.content_size.width for line in str(learning.render()).splitlines())
        await pilot.resize_terminal(120, 35)
        await pilot.pause()
        assert not table.narrow and table.get_cell("serving-1", "role").plain == "serving"
