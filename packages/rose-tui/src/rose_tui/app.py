"""The ``rose-tui`` application: owns the feed, polls it from a worker thread, and shows what arrives."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from textual import work
from textual.app import App
from textual.binding import Binding
from textual.worker import get_current_worker

from rose_tui.dashboard_screen import DashboardScreen
from rose_tui.feed_events import ErrorReceived, StatusReceived, WelcomeReceived, feed_event
from rose_tui.link import STALL_AFTER_S, LinkMonitor
from rose_tui.status_feed import StatusFeed
from rose_tui.view import DashboardModel

POLL_TIMEOUT_S = 0.1
LINK_CHECK_S = 0.25


class RoseTui(App[None]):
    """Live dashboard of a ROSE controller. Without a feed it shows only what is posted to it (tests)."""

    CSS_PATH = "rose_tui.tcss"
    TITLE = "ROSE"
    BINDINGS = [Binding("q", "quit", "Quit")]

    def __init__(
        self,
        feed: StatusFeed | None = None,
        *,
        stall_after_s: float = STALL_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.feed = feed
        self.model = DashboardModel()
        self._clock = clock
        self.link_monitor = LinkMonitor(clock(), stall_after_s)
        self._dashboard = DashboardScreen(id="dashboard")

    def get_default_screen(self) -> DashboardScreen:
        return self.dashboard

    @property
    def dashboard(self) -> DashboardScreen:
        return self._dashboard

    def on_mount(self) -> None:
        if self.feed is not None:
            self.sub_title = self.feed.address
            self._say_hello()
            self._poll_feed()
        self.set_interval(LINK_CHECK_S, self.refresh_link)

    @work(thread=True, exclusive=True, group="feed", name="status-feed")
    def _poll_feed(self) -> None:
        worker = get_current_worker()
        feed = self.feed
        while feed is not None and not worker.is_cancelled and not feed.closed:
            msg = feed.recv(timeout=POLL_TIMEOUT_S)
            if msg is not None:
                self.post_message(feed_event(msg))

    def on_welcome_received(self, event: WelcomeReceived) -> None:
        self.model.heartbeat_interval_s = event.welcome.heartbeat_interval_s
        self.model.stall_timeout_s = event.welcome.stall_timeout_s
        self.link_monitor.on_welcome(self._clock(), event.welcome)
        self.refresh_link()

    def on_status_received(self, event: StatusReceived) -> None:
        self.link_monitor.on_status(self._clock(), event.snapshot.finished)
        self.dashboard.show(self.model.update(event.snapshot))
        self.refresh_link()

    def on_error_received(self, event: ErrorReceived) -> None:
        self.link_monitor.on_error(self._clock(), event.report)
        self.refresh_link()

    def refresh_link(self) -> None:
        now = self._clock()
        if self.feed is not None and not self.feed.closed and self.link_monitor.should_hello(now):
            self._say_hello()
        self.dashboard.link = self.link_monitor.view(now)

    def _say_hello(self) -> None:
        if self.feed is not None:
            self.feed.hello()
            self.link_monitor.on_hello(self._clock())

    async def action_quit(self) -> None:
        if self.feed is not None:
            await asyncio.to_thread(self.feed.close, "quit")
        self.exit()

    def on_unmount(self) -> None:
        if self.feed is not None:
            self.feed.close("exit")
