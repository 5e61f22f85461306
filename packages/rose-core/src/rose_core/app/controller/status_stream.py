"""The status stream to dashboards (observers): a ``StatusSnapshot`` every ``controller.status_interval_s``
and at once to an observer that just said Hello.

Credit: an observer holds at most ``STATUS_CREDIT`` snapshots it has not acknowledged (``StatusAck``); one
behind (or stopped) is skipped, counted in ``rose_status_skipped_total``, and gets the newest snapshot once
it acknowledges again. Status is coalesced: the newest snapshot wins, nothing queues for a slow dashboard.
"""

from __future__ import annotations

from rose_core.app.controller import controller_metrics as metrics
from rose_core.protocol.messages import STATUS_CREDIT, StatusSnapshot
from rose_core.transport.control_endpoint import ServerEndpoint


class StatusStream:
    def __init__(self, server: ServerEndpoint, interval_s: float) -> None:
        self.server = server
        self.interval_s = interval_s
        self.observers: dict[bytes, int] = {}
        """Each observer's snapshots sent and not yet acknowledged."""
        self._next_at = 0.0

    def watch(self, peer: bytes) -> None:
        """An observer said Hello (again: a restarted dashboard with the same id gets its credit renewed)."""
        self.observers[peer] = 0

    def is_observer(self, peer: bytes) -> bool:
        return peer in self.observers

    def acked(self, peer: bytes) -> None:
        self.observers[peer] = max(0, self.observers[peer] - 1)

    def forget(self, peer: bytes) -> None:
        self.observers.pop(peer, None)

    def due(self, now: float) -> bool:
        """Whether the interval has passed (the next one starts now when it has)."""
        if now < self._next_at:
            return False
        self._next_at = now + self.interval_s
        return True

    def publish(self, snapshot: StatusSnapshot) -> None:
        for peer, unacked in list(self.observers.items()):
            if unacked >= STATUS_CREDIT:
                metrics.STATUS_SKIPPED.inc()
                continue
            self.observers[peer] = unacked + 1
            self.server.send(peer, snapshot)
