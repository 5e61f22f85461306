"""End to end over a real socket: this test plays the controller with a real ``ControlServer``."""

from __future__ import annotations

import time
from collections.abc import Callable

from textual.pilot import Pilot
from textual.widgets import Label
from tui_controller import TuiController

from rose_core.protocol.auth import as_observer
from rose_tui.app import RoseTui
from rose_tui.status_feed import StatusFeed
from rose_tui.widgets import ErrorBanner, ViewTable

STALL_S = 1.0


async def wait_for(pilot: Pilot[None], condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await pilot.pause(0.05)


def link_text(app: RoseTui) -> str:
    return str(app.screen.query_one("#link", Label).render())


def executor_ids(app: RoseTui) -> list[str]:
    return [str(row.key.value) for row in app.screen.query_one("#executors", ViewTable).ordered_rows]


def wait_until(condition: Callable[[], bool], timeout: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


async def test_live_then_unreachable_then_back(controller: TuiController, secret: bytes) -> None:
    app = RoseTui(StatusFeed(controller.address, as_observer(secret)), stall_after_s=STALL_S)  # as rose-tui does
    async with app.run_test(size=(120, 35)) as pilot:
        await wait_for(pilot, lambda: executor_ids(app) == ["dedicated-0", "serving-0", "serving-1"])
        assert link_text(app) == "● live"
        assert controller.hellos[0].kind == "observer"
        assert controller.hellos[0].peer_id.startswith("tui-")
        # every snapshot handed to the app is acknowledged (the controller's credit: rose_core STATUS_CREDIT)
        await wait_for(pilot, lambda: len(controller.acks) >= 3)
        assert all(ack.snapshot_time > 0 for ack in controller.acks)

        controller.pause()
        await wait_for(pilot, lambda: "unreachable" in link_text(app))
        assert executor_ids(app)  # the last known state stays on screen, dimmed
        assert app.screen.has_class("-stale")

        controller.resume()
        await wait_for(pilot, lambda: link_text(app) == "● live")
        assert not app.screen.has_class("-stale")


async def test_a_restarted_controller_is_greeted_again(secret: bytes) -> None:
    first = TuiController(secret)
    address = first.address
    app = RoseTui(StatusFeed(address, secret), stall_after_s=STALL_S)
    try:
        async with app.run_test(size=(120, 35)) as pilot:
            await wait_for(pilot, lambda: link_text(app) == "● live")
            first.close()
            await wait_for(pilot, lambda: "unreachable" in link_text(app))
            with TuiController(secret, address=address) as second:
                await wait_for(pilot, lambda: link_text(app) == "● live")
                assert len(second.hellos) >= 1
    finally:
        first.close()


async def test_bad_secret_shows_the_rejection(controller: TuiController) -> None:
    app = RoseTui(StatusFeed(controller.address, b"not-the-controller-secret-0123456"), stall_after_s=STALL_S)
    async with app.run_test(size=(120, 35)) as pilot:
        banner = app.screen.query_one(ErrorBanner)
        await wait_for(pilot, lambda: banner.display)
        assert "bad signature" in str(banner.render())
        assert link_text(app) == "● rejected (unauthenticated)"
        await pilot.pause(STALL_S * 1.5)
        assert link_text(app) == "● rejected (unauthenticated)"  # not hidden behind "unreachable"
    assert controller.server.rejected >= 1
    assert not controller.hellos


async def test_q_says_goodbye(controller: TuiController, secret: bytes) -> None:
    feed = StatusFeed(controller.address, secret)
    app = RoseTui(feed)
    async with app.run_test(size=(120, 35)) as pilot:
        await wait_for(pilot, lambda: bool(executor_ids(app)))
        await pilot.press("q")
    assert feed.closed
    assert wait_until(lambda: bool(controller.goodbyes))
    assert controller.goodbyes[0].peer_id == feed.peer_id
    assert controller.goodbyes[0].reason == "quit"
    assert not controller.observers
