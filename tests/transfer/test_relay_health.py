"""A relay that failed is skipped for a while, then tried again: pure rules (``RelayHealth``), and a fetcher
whose relay slams every connection shut (real sockets)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rose_core.support.errors import ConfigError
from rose_transfer import DensePublisher, WeightFetcher, load_arrays
from rose_transfer.fetch.relay_health import RelayHealth

from .conftest import SECRET, assert_same, random_state_dict


def test_a_failed_relay_is_skipped_for_its_backoff_which_doubles_up_to_the_cap() -> None:
    health = RelayHealth(first_s=10, max_s=25)
    assert health.usable("r", 0.0)
    assert health.failed("r", 100.0) == 10
    assert not health.usable("r", 109.9) and health.retry_in("r", 105.0) == 5.0
    assert health.usable("r", 110.0) and health.usable("other", 100.0)
    assert health.failed("r", 110.0) == 20
    assert health.failed("r", 130.0) == 25  # capped
    health.succeeded("r")
    assert health.usable("r", 130.0) and health.failed("r", 131.0) == 10  # a success starts it over


@given(st.lists(st.sampled_from(["fail", "ok", "wait"]), max_size=40))
def test_a_relay_is_never_skipped_longer_than_the_cap(events: list[str]) -> None:
    health, now = RelayHealth(first_s=3, max_s=50), 0.0
    for event in events:
        if event == "fail":
            health.failed("r", now)
        elif event == "ok":
            health.succeeded("r")
        now += 7.0 if event == "wait" else 0.0
        assert 0.0 <= health.retry_in("r", now) <= 50
        assert health.usable("r", now) == (health.retry_in("r", now) == 0.0)


def test_bad_backoffs_are_refused() -> None:
    with pytest.raises(ConfigError, match="0 < first_s <= max_s"):
        RelayHealth(first_s=10, max_s=5)


class SlammingRelay:
    """Accepts connections and closes each at once, counting them: a relay that is there and serves nothing."""

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.source = f"tcp://127.0.0.1:{self._sock.getsockname()[1]}"
        self.accepted = 0
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._sock.close()


@pytest.fixture
def slamming() -> Iterator[SlammingRelay]:
    relay = SlammingRelay()
    yield relay
    relay.close()


async def test_after_a_relay_failed_the_next_versions_go_to_the_source_until_its_backoff_ends(
    publisher: DensePublisher, slamming: SlammingRelay, tmp_path: Path
) -> None:
    now = [0.0]
    fetcher = WeightFetcher(SECRET, "behind-a-dead-relay", relay_health=RelayHealth(first_s=30), clock=lambda: now[0])
    for version in (1, 2, 3):
        tensors = random_state_dict(seed=version)
        announce = publisher.publish(version, version, tensors)
        accepted = slamming.accepted
        fetched = await fetcher.fetch(announce, -1, tmp_path / f"v{version}.bin", relay=slamming.source)
        assert_same(load_arrays(fetched), tensors)
        tried = slamming.accepted - accepted
        if version == 1:
            assert tried == 1 + fetcher.relay_reconnects  # tried, then the source
        elif version == 2:
            assert tried == 0  # within the backoff: straight to the source
            now[0] = 31.0
        else:
            assert tried == 1 + fetcher.relay_reconnects  # the backoff is over: tried again
    assert fetcher.relays.retry_in(slamming.source, now[0]) == 60.0  # failed twice in a row: doubled
