"""``RelayHealth``: which relays a receiver skips for now because they failed, and until when.

Invariant: a relay that failed at ``t`` is skipped until ``t + backoff``; its backoff starts at ``first_s`` and
doubles with each failure in a row, up to ``max_s``; a fetch that went through it forgets its failures. So
after a relay dies, the versions that follow go straight to the source (no connect attempt per version), and
a relay that comes back is used again within ``max_s``. Pure: time is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass

from rose_core.support.errors import ConfigError


@dataclass(slots=True)
class _Failed:
    until: float
    backoff: float


class RelayHealth:
    def __init__(self, first_s: float = 30.0, max_s: float = 300.0) -> None:
        if not 0 < first_s <= max_s:
            raise ConfigError(f"relay backoff needs 0 < first_s <= max_s, got {first_s} and {max_s}")
        self.first_s = first_s
        self.max_s = max_s
        self._failed: dict[str, _Failed] = {}

    def usable(self, relay: str, now: float) -> bool:
        failed = self._failed.get(relay)
        return failed is None or now >= failed.until

    def retry_in(self, relay: str, now: float) -> float:
        """Seconds until ``relay`` is tried again (0: it is usable now)."""
        failed = self._failed.get(relay)
        return 0.0 if failed is None else max(0.0, failed.until - now)

    def failed(self, relay: str, now: float) -> float:
        """Record a failure of ``relay`` at ``now``; returns how long it is skipped."""
        previous = self._failed.get(relay)
        backoff = self.first_s if previous is None else min(previous.backoff * 2, self.max_s)
        self._failed[relay] = _Failed(now + backoff, backoff)
        return backoff

    def succeeded(self, relay: str) -> None:
        self._failed.pop(relay, None)
