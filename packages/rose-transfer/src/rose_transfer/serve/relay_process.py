"""``rose-transfer relay``: a relay as a process of its own, in a cluster away from the trainer.

The job's config names it (``[[clusters]] relay = "tcp://host:port"``); the executors of that cluster pull
every version through it and fall back to the publisher when it is gone. It runs until SIGTERM or SIGINT,
says what it relays, and reports what crossed the slow link (``upstream_bytes``) when it stops.

Invariant: the relay holds nothing a receiver needs to be correct: every reply it serves is the publisher's,
sealed by the publisher; killing it at any point costs its receivers only the way back to the source.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

from rose_core.support.errors import ConfigError
from rose_transfer.serve.relay import Relay

Say = Callable[[dict[str, Any]], None]
"""Where the relay's events go: ``started``, ``progress`` (upstream bytes grew) and ``stopped``."""


@dataclass(frozen=True, slots=True)
class RelaySettings:
    upstream: str
    """The publisher (``tcp://host:port``: `rose run`'s ``[controller] weights_port``; ``tls://host:port`` when
    it encrypts, ``[controller] weights_tls``: the relay then serves TLS too)."""
    host: str = "127.0.0.1"
    port: int = 0
    transport: str = "tcp"
    """How the cluster's receivers reach the relay: ``tcp`` (``source``) or ``ucx`` (``ucx_source`` too)."""
    ucx_port: int = 0
    relay_id: str = ""
    progress_every_s: float = 5.0

    def __post_init__(self) -> None:
        if not self.upstream.startswith(("tcp://", "tls://")):
            raise ConfigError(f"--upstream is the publisher's tcp://host:port (or tls://host:port), not {self.upstream!r}")
        if self.transport not in ("tcp", "ucx"):
            raise ConfigError(f"--transport is tcp or ucx, not {self.transport!r}")


def serve_relay(secret: bytes, settings: RelaySettings, say: Say, stop: threading.Event | None = None) -> int:
    """Relay until ``stop`` is set (or SIGTERM / SIGINT, from the main thread); returns the upstream bytes."""
    stop = stop or _stop_on_signals()
    relay = Relay(secret=secret, upstream=settings.upstream, host=settings.host, port=settings.port,
                  relay_id=settings.relay_id)
    try:
        started: dict[str, Any] = {"event": "started", "relay_id": relay.relay_id, "source": relay.source,
                                   "upstream": settings.upstream}
        if settings.transport == "ucx":
            started["ucx_source"] = relay.open_ucx(settings.ucx_port)
        say(started)
        reported = 0
        while not stop.wait(settings.progress_every_s):
            if (now := relay.upstream_bytes) != reported:
                say({"event": "progress", "upstream_bytes": now})
                reported = now
    finally:
        relay.close()
    say({"event": "stopped", "upstream_bytes": relay.upstream_bytes})
    return relay.upstream_bytes


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def handler(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, handler)
    return stop


def describe(event: dict[str, Any]) -> str:
    """One line a person reads for a relay event."""
    kind = event["event"]
    if kind == "started":
        ucx = f" and {event['ucx_source']}" if "ucx_source" in event else ""
        return f"relay {event['relay_id']}: serving {event['source']}{ucx}, pulling from {event['upstream']}"
    mb = event["upstream_bytes"] / 1e6
    stamp = time.strftime("%H:%M:%S")
    if kind == "progress":
        return f"{stamp} relayed {mb:.2f} MB from upstream so far"
    return f"{stamp} relay stopped: {mb:.2f} MB crossed the link from upstream"
