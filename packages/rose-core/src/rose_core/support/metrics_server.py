"""The metrics endpoint of a ROSE process, bounded: it lives inside the production process on a serving host, so
no client of it (a scraper, a port scanner, a hostile peer holding sockets open) may cost that process more
than a fixed number of threads or hold one longer than a fixed time.

Invariant: at most ``MAX_CONNECTIONS`` connections are being served at once, each in its own thread, so the
endpoint never holds more than ``MAX_CONNECTIONS + 1`` threads (the accept loop included); a connection past
the cap is closed as soon as it is accepted (counted in ``rose_metrics_refused_connections_total``), and one
that sends nothing, or too slowly, is closed after ``REQUEST_TIMEOUT_S`` without data.

prometheus_client's own ``start_http_server`` is the same WSGI server with neither bound (one thread per
connection, no timeout); this module keeps its app (``make_wsgi_app``) and its server class and adds both.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import Counter, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 8
"""Connections served at once; a scrape takes milliseconds, so 8 leaves room for several scrapers."""
REQUEST_TIMEOUT_S = 5.0
"""How long a connection may stay silent (before its request, or in the middle of it) before it is closed."""

REFUSED_CONNECTIONS = Counter(
    "rose_metrics_refused_connections_total",
    "Connections to this metrics endpoint closed on accept: MAX_CONNECTIONS were being served already.",
)


class _Handler(WSGIRequestHandler):
    """One request per connection, closed after ``REQUEST_TIMEOUT_S`` of silence; logs nothing."""

    timeout = REQUEST_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:
        return


class _BoundedServer(ThreadingWSGIServer):
    """prometheus_client's threaded WSGI server with a cap on connections served at once."""

    address_family = socket.AF_INET
    request_queue_size = 128  # socketserver's 5 makes a burst of connects wait for SYN retries

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            REFUSED_CONNECTIONS.inc()
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that timed out or broke ends quietly (socketserver would print a traceback for each:
        a peer holding sockets open must not fill the production process's log)."""
        if not isinstance(sys.exc_info()[1], OSError):
            log.warning("metrics request from %s failed", client_address, exc_info=True)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _BoundedServer6(_BoundedServer):
    address_family = socket.AF_INET6


def start_metrics_server(host: str, port: int) -> ThreadingWSGIServer:
    """Serve this process's Prometheus registry on ``host:port`` from a daemon thread; raises ``OSError`` when
    the port cannot be bound. The server's ``server_address`` holds the port it got."""
    server_class = _BoundedServer6 if ":" in host else _BoundedServer
    server = make_server(host, port, make_wsgi_app(), server_class, handler_class=_Handler)
    threading.Thread(target=server.serve_forever, name="metrics-server", daemon=True).start()
    return server
