"""Prometheus conventions: prefix ``rose_``, base units, ``_total`` counters, ``_ratio`` for 0..1."""

from __future__ import annotations

import socket

from prometheus_client import Counter

from rose_core.support.errors import RoseError
from rose_core.support.metrics_server import start_metrics_server

REJECTED_MESSAGES = Counter(
    "rose_rejected_messages_total",
    "Control-plane frames rejected, by reason.",
    ["reason"],
)
for _reason in ("malformed", "oversized", "unauthenticated", "unknown_type", "wrong_version", "no_handshake",
                "wrong_role", "not_owner"):
    REJECTED_MESSAGES.labels(_reason)

DROPPED_MESSAGES = Counter(
    "rose_dropped_messages_total",
    "Outgoing control-plane messages dropped: the peer's queue was full (it stopped reading) or it was gone.",
    ["reason"],
)
for _reason in ("peer_full", "peer_gone"):
    DROPPED_MESSAGES.labels(_reason)


def serve_metrics(host: str, port: int) -> str:
    """Start the metrics endpoint of this process (bounded: ``rose_core.support.metrics_server``); returns its
    URL. Port 0 picks a free port."""
    try:
        server = start_metrics_server(host, port)
    except OSError as exc:
        raise RoseError(f"metrics port {host}:{port} is busy ({exc.strerror}); pick another with --metrics-port") from exc
    bound = int(server.server_address[1])
    return f"http://[{host}]:{bound}/metrics" if ":" in host else f"http://{host}:{bound}/metrics"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
