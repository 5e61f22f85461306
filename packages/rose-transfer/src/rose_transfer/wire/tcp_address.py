"""``tcp://HOST:PORT`` sources (and ``tls://HOST:PORT``, the same over TLS: ``tls_link``): parsing,
formatting, and the listening socket behind one."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

from rose_core.support.errors import RoseError

SCHEME = "tcp"
TLS_SCHEME = "tls"
_WILDCARDS = ("", "0.0.0.0", "::")


def format_source(host: str, port: int, *, tls: bool = False) -> str:
    scheme = TLS_SCHEME if tls else SCHEME
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def is_tls(source: str) -> bool:
    return source.startswith(f"{TLS_SCHEME}://")


def parse_source(source: str) -> tuple[str, int]:
    """``(host, port)`` of a ``tcp://HOST:PORT`` or ``tls://HOST:PORT`` source."""
    try:
        parts = urlsplit(source)
        host, port = parts.hostname, parts.port
    except ValueError:
        host, port, parts = None, None, None
    if parts is None or parts.scheme not in (SCHEME, TLS_SCHEME) or not host or port is None:
        raise RoseError(
            f"weight source {source!r} is not tcp://HOST:PORT or tls://HOST:PORT: fix the publisher's advertised address"
        )
    return host, port


def advertised_host(host: str) -> str:
    """The name receivers dial for a publisher bound to ``host`` (a wildcard is not dialable)."""
    return socket.gethostname() if host in _WILDCARDS else host


def bind_listener(host: str, port: int, backlog: int = 128) -> socket.socket:
    """A listening TCP socket on ``host:port`` (0 picks a free port)."""
    if not 0 <= port <= 65535:
        raise RoseError(f"weight port {port} is out of range: pick 0..65535 (0 picks a free port)")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise RoseError(f"cannot resolve weight host {host!r} ({exc.strerror}): fix the host name") from exc
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise RoseError(
            f"cannot serve weights on {host}:{port} ({exc.strerror}): pick a free port (0 picks one) "
            "or stop the process that holds it"
        ) from exc
    return sock
