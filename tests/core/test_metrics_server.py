"""The metrics endpoint is bounded (``rose_core.support.metrics_server``): idle connections held open cost its
process at most ``MAX_CONNECTIONS`` threads, the ones past the cap are closed and counted, the silent ones are
closed after the timeout, and a scrape works again once they are gone."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY

from rose_core.support import metrics_server
from rose_core.support.errors import RoseError
from rose_core.support.metrics import serve_metrics

HELD = 300
QUICK_TIMEOUT_S = 1.0


@pytest.fixture
def quick_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics_server._Handler, "timeout", QUICK_TIMEOUT_S)


def refused() -> float:
    return REGISTRY.get_sample_value("rose_metrics_refused_connections_total") or 0.0


def scrape(url: str, deadline_s: float = 15.0) -> str:
    """The endpoint's text, retried while its slots are still held (a refused connection resets)."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return str(response.read().decode())
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.2)


@contextlib.contextmanager
def idle_connections(url: str, count: int) -> Iterator[list[socket.socket]]:
    host, port = url.removeprefix("http://").split("/")[0].rsplit(":", 1)
    held: list[socket.socket] = []
    try:
        for _ in range(count):
            held.append(socket.create_connection((host, int(port)), timeout=10))
        yield held
    finally:
        for s in held:
            s.close()


def test_idle_connections_cost_at_most_the_cap_in_threads_and_are_closed(quick_timeout: None) -> None:
    url = serve_metrics("127.0.0.1", 0)
    assert "rose_metrics_refused_connections_total" in scrape(url)
    threads_before, refused_before, holding = threading.active_count(), refused(), time.monotonic()
    with idle_connections(url, HELD):
        most = max(threading.active_count() for _ in range(50))
        def served() -> int:  # each slot serves one silent connection per timeout at most; the rest are closed
            return metrics_server.MAX_CONNECTIONS * (1 + int((time.monotonic() - holding) / QUICK_TIMEOUT_S))

        while refused() - refused_before < HELD - served():
            time.sleep(0.05)
        assert most - threads_before <= metrics_server.MAX_CONNECTIONS
        assert "rose_" in scrape(url)  # the held slots time out; the endpoint answers again with them still open
    end = time.monotonic() + 15
    while threading.active_count() > threads_before and time.monotonic() < end:
        time.sleep(0.05)
    assert threading.active_count() <= threads_before


def test_a_busy_metrics_port_is_one_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RoseError, match="--metrics-port"):
            serve_metrics("127.0.0.1", port)
