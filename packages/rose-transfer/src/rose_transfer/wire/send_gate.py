"""``SendGate``: what a connection may await before it puts bytes on the wire.

By default there is none and a message goes out in one ``sendall`` per large frame. A connection
given a gate sends in pieces of at most ``GATE_CHUNK_BYTES`` and awaits ``gate.admit(n)`` before
each piece, so the gate decides when bytes leave (e.g. to share a rate among many connections)."""

from __future__ import annotations

from typing import Protocol

GATE_CHUNK_BYTES = 1024 * 1024  # a gated TCP connection sends in pieces of at most this size


class SendGate(Protocol):
    async def admit(self, nbytes: int) -> None:
        """Return when ``nbytes`` more may go on the wire."""
        ...
