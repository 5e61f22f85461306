"""Whether the controller is reachable, from what arrived and when. Pure: time is an argument."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from rose_core.protocol.messages import ErrorReport, Welcome
from rose_tui.formatting import Level, format_age

STALL_AFTER_S = 3.0
"""Without a status for this long, the controller is shown as unreachable."""
NOTICE_TTL_S = 15.0
"""A signed ``ErrorReport`` (a notice during a healthy session) stays on screen this long."""

REJECTION_CODES = frozenset({"unauthenticated", "wrong_version"})
"""Signed ``ErrorReport`` codes that mean this dashboard was refused (the controller checks ``Hello``)."""


class LinkState(StrEnum):
    CONNECTING = "connecting"
    LIVE = "live"
    UNREACHABLE = "unreachable"
    REJECTED = "rejected"
    FINISHED = "finished"


LEVELS: dict[LinkState, Level] = {
    LinkState.CONNECTING: "warn",
    LinkState.LIVE: "ok",
    LinkState.UNREACHABLE: "bad",
    LinkState.REJECTED: "bad",
    LinkState.FINISHED: "idle",
}


@dataclass(frozen=True, slots=True)
class LinkView:
    state: LinkState = LinkState.CONNECTING
    text: str = "connecting"
    error: str = ""
    """A problem to show in full (a rejection, a notice); empty when there is none."""

    @property
    def level(self) -> Level:
        return LEVELS[self.state]


class LinkMonitor:
    """Tracks the observer session: handshake, the last status, rejections, the end of the run."""

    def __init__(self, started_at: float, stall_after_s: float = STALL_AFTER_S) -> None:
        self.stall_after_s = stall_after_s
        self._started_at = started_at
        self._last_status: float | None = None
        self._last_hello = started_at
        self._welcomed = False
        self._finished = False
        self._rejection: ErrorReport | None = None
        self._notice: tuple[float, ErrorReport] | None = None

    def on_hello(self, now: float) -> None:
        self._last_hello = now

    def on_welcome(self, now: float, welcome: Welcome) -> None:
        """The handshake worked. Liveness is judged by statuses alone: a controller that answers ``Hello``
        but publishes nothing is still shown as unreachable."""
        del now, welcome
        self._welcomed = True
        self._rejection = None

    def on_status(self, now: float, finished: bool) -> None:
        self._last_status = now
        self._finished = finished
        self._rejection = None

    def on_error(self, now: float, report: ErrorReport) -> None:
        """An unsigned report (bad secret, other frame version) or a refused ``Hello`` is a rejection;
        any other report is a notice."""
        if report.ref == "unsigned" or report.code in REJECTION_CODES:
            self._rejection = report
        else:
            self._notice = (now, report)

    def should_hello(self, now: float) -> bool:
        """Say Hello again while unheard from, so a restarted controller learns about this dashboard."""
        state = self.state(now)
        waiting = state in (LinkState.CONNECTING, LinkState.UNREACHABLE)
        return waiting and now - self._last_hello >= self.stall_after_s

    def silence(self, now: float) -> float:
        """Seconds since the last status (or since the start, before the first one)."""
        return now - (self._last_status if self._last_status is not None else self._started_at)

    def state(self, now: float) -> LinkState:
        if self._rejection is not None:
            return LinkState.REJECTED
        if self._finished:
            return LinkState.FINISHED
        if self.silence(now) >= self.stall_after_s:
            return LinkState.UNREACHABLE
        if self._last_status is None:
            return LinkState.CONNECTING
        return LinkState.LIVE

    def view(self, now: float) -> LinkView:
        state = self.state(now)
        if state is LinkState.REJECTED and self._rejection is not None:
            report = self._rejection
            return LinkView(
                state, f"rejected ({report.code})", f"The controller rejected this dashboard: {report.message}"
            )
        texts = {
            LinkState.CONNECTING: "connected, waiting for status" if self._welcomed else "connecting",
            LinkState.LIVE: "live",
            LinkState.UNREACHABLE: f"unreachable (no status for {format_age(self.silence(now))})",
            LinkState.FINISHED: "run finished",
        }
        return LinkView(state, texts[state], self._notice_text(now))

    def _notice_text(self, now: float) -> str:
        if self._notice is None or now - self._notice[0] > NOTICE_TTL_S:
            return ""
        report = self._notice[1]
        return f"Controller says ({report.code}): {report.message}"
