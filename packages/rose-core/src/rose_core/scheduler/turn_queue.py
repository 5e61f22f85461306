"""Pending turns in FIFO order with fair aging: a re-routed turn keeps its first enqueue time."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator

from rose_core.scheduler.turn_ticket import TurnTicket


class TurnQueue:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, TurnTicket]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[TurnTicket]:
        return (item[2] for item in sorted(self._heap))

    def push(self, ticket: TurnTicket) -> None:
        heapq.heappush(self._heap, (ticket.first_queued_at, next(self._seq), ticket))

    def drain(self, place: Callable[[TurnTicket], bool], scan_limit: int,
              keep_going: Callable[[], bool] | None = None) -> None:
        """Offer turns oldest first to ``place``; keep those it refuses. Stops after ``scan_limit`` refusals,
        or as soon as ``keep_going()`` says no turn can be placed any more."""
        kept: list[tuple[float, int, TurnTicket]] = []
        while self._heap and len(kept) < scan_limit and (keep_going is None or keep_going()):
            item = heapq.heappop(self._heap)
            if not place(item[2]):
                kept.append(item)
        for item in kept:
            heapq.heappush(self._heap, item)

    def remove(self, turn_id: str) -> TurnTicket | None:
        for i, item in enumerate(self._heap):
            if item[2].turn_id == turn_id:
                self._heap[i] = self._heap[-1]
                self._heap.pop()
                heapq.heapify(self._heap)
                return item[2]
        return None
