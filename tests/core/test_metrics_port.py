"""The metrics endpoint on a real socket: whatever bytes arrive on it, it goes on serving ``/metrics``."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rose_core.support.metrics import serve_metrics

RAW = st.one_of(
    st.binary(max_size=300),
    st.builds(lambda line, headers: f"{line}\r\n{headers}\r\n\r\n".encode(), st.text(max_size=60), st.text(max_size=200)),
    st.just(b"GET /metrics HTTP/1.1\r\n" + b"X: " + b"a" * 70_000 + b"\r\n\r\n"),
)


@pytest.fixture(scope="module")
def url() -> str:
    return serve_metrics("127.0.0.1", 0)  # a daemon thread, as in every ROSE process


@settings(max_examples=80, deadline=None)
@given(raw=RAW)
def test_raw_bytes_never_stop_the_metrics_endpoint(url: str, raw: bytes) -> None:
    host, port = url.removeprefix("http://").removesuffix("/metrics").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(raw)
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(65536):
            pass
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200 and b"rose_rejected_messages_total" in resp.read()
