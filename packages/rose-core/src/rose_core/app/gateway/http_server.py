"""The gateway on a socket: a threaded HTTP/1.1 server (keep-alive, one thread per connection) with bearer
authentication, the routes below, JSON bodies and server-sent events for ``stream``.

    POST /sessions                                  {"group": ID, "metadata": {...}} -> session_id, base_url
    GET  /sessions/<id>                             the session's token history (segments, masks)
    GET  /sessions/<id>/v1/models                   [policy]
    POST /sessions/<id>/v1/chat/completions         one turn (OpenAI chat completions)
    POST /sessions/<id>/v1/completions              one turn (OpenAI completions)
    POST /sessions/<id>/reward                      {"reward": R} closes the session
    GET  /health                                    no key needed

``ApiServer`` is the same server over any routes (the external trainer's API, ``rose_core.app.jobs.external_trainer``).
Every refusal is an OpenAI-shaped error with a 4xx/5xx status naming the fix; a handler's failure never
reaches the server loop, so one bad request cannot stop the gateway or the sessions in flight.

What a client without the key can hold (``ServerLimits``): connections that have not yet shown the key
(a request with it) are at most half of ``max_connections``; a new connection past that closes the oldest of
them (a slow or stalled client is shed, a well-behaved one that connects after it is served), and past
``max_connections`` in all a new connection gets a 503 and is closed. Every connection waits at most
``idle_timeout_s`` for a client's next bytes (headers, body, keep-alive). The key is checked before the body is
read, so a keyless body is never read, and a body is at most ``MAX_BODY_BYTES``. One thread per connection:
threads are bounded by ``max_connections``. A key another server's clients hold (``refused_keys``: the agents'
key on the trainer API) gets a 403 that says so.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import re
import socket
import sys
import threading
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import parse_qs

from prometheus_client import Counter

from rose_core.app.gateway.gateway import Gateway
from rose_core.app.gateway.openai_api import GatewayError, json_bytes

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 8 << 20
_SESSION = r"/sessions/(?P<sid>[0-9a-f]{1,64})"
REFUSED_REQUESTS = Counter(
    "rose_api_refused_requests_total",
    "HTTP requests the gateway or the trainer API refused (4xx: malformed, unauthenticated, unknown; 501: no such "
    "method), by server and status.",
    ["server", "status"],
)
@dataclass(frozen=True, slots=True)
class ServerLimits:
    max_connections: int = 256
    """Connections open at once (a thread each), at most half of them not yet proven by the key; more get a 503."""
    idle_timeout_s: float = 30.0
    """The longest wait for a client's next bytes (request line, headers, body, the next keep-alive request)."""


Route = Callable[[Any, dict[str, str], bytes], Any]
"""(the API's object, the path's groups and the query's parameters, the body) -> a JSON value, bytes (binary)
or SSE events."""

GZIP_LEVEL = 1
"""zlib's fastest level: token ids held in int32 are mostly zero bytes, and level 1 takes most of that (a batch
of a third responses: 0.86-1.06x its ids' int32 bytes, from 1.44x, tens of MB/s on one core, off the GIL)."""
GZIP_MIN_BYTES = 512


def accepts_gzip(header: str) -> bool:
    """Whether an ``Accept-Encoding`` header takes gzip (named, not with ``q=0``)."""
    for item in header.lower().split(","):
        name, _, params = item.partition(";")
        if name.strip() in ("gzip", "*"):
            q = params.strip()
            return not (q.startswith("q=") and q[2:].strip() in ("0", "0.0", "0.00", "0.000"))
    return False


def _chat(gw: Gateway, params: dict[str, str], body: bytes) -> Any:
    req, reply = gw.chat(params["sid"], body)
    return gw.chat_chunks(req, reply) if req.stream else gw.chat_response(req, reply)


def _completion(gw: Gateway, params: dict[str, str], body: bytes) -> Any:
    req, reply = gw.completion(params["sid"], body)
    return gw.completion_chunks(req, reply) if req.stream else gw.completion_response(req, reply)


GATEWAY_ROUTES: list[tuple[str, re.Pattern[str], Route]] = [
    ("POST", re.compile(r"/sessions/?"), lambda gw, _p, body: gw.open_session(body)),
    ("GET", re.compile(_SESSION + r"/?"), lambda gw, p, _body: gw.describe(p["sid"])),
    ("GET", re.compile(_SESSION + r"/v1/models/?"), lambda gw, p, _body: gw.models(p["sid"])),
    ("POST", re.compile(_SESSION + r"/v1/chat/completions/?"), _chat),
    ("POST", re.compile(_SESSION + r"/v1/completions/?"), _completion),
    ("POST", re.compile(_SESSION + r"/reward/?"), lambda gw, p, body: gw.reward(p["sid"], body)),
]


class _BoundedServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` with at most ``limits.max_connections`` connections (a thread each), of which at
    most half have not shown the key yet: past that, the oldest of those is shut down for the new one."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = 1024
    """The listen backlog (the standard library's 5 drops connections arriving in a burst: clients retry their
    SYN after a second)."""

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], limits: ServerLimits) -> None:
        super().__init__(address, handler)
        self._max = limits.max_connections
        self._max_unproven = max(1, limits.max_connections // 2)
        self._open: set[socket.socket] = set()
        self._unproven: OrderedDict[socket.socket, None] = OrderedDict()
        self._guard = threading.Lock()
        self.shed = 0
        """Connections closed to make room (stalled ones shed, and 503s)."""

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._guard:
            if len(self._unproven) >= self._max_unproven:
                oldest, _ = self._unproven.popitem(last=False)
                _shut(oldest)  # its thread sees the end of the stream and lets its slot go
                self.shed += 1
            admitted = len(self._open) < self._max
            if admitted:
                self._open.add(request)
                self._unproven[request] = None
        if not admitted:
            self.shed += 1
            REFUSED_REQUESTS.labels(getattr(self.RequestHandlerClass, "server_name", "rose-api"), "503").inc()
            _refuse_connection(request)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._forget(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._forget(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away (reset, broken pipe, shed) is routine: logged at debug, not printed."""
        error = sys.exc_info()[1]
        if isinstance(error, OSError):
            log.debug("connection from %s ended: %s", client_address, error)
            return
        log.exception("connection from %s failed", client_address)

    def proven(self, request: socket.socket) -> None:
        """The connection sent a request with the key: it is no longer shed for newcomers."""
        with self._guard:
            self._unproven.pop(request, None)

    def connections(self) -> int:
        with self._guard:
            return len(self._open)

    def _forget(self, request: socket.socket) -> None:
        with self._guard:
            self._open.discard(request)
            self._unproven.pop(request, None)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed by its thread
        sock.shutdown(socket.SHUT_RDWR)


def _refuse_connection(sock: socket.socket) -> None:
    body = json_bytes(GatewayError(503, "too many connections (gateway.max_connections): retry later",
                                   kind="unavailable").body())
    head = f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    with contextlib.suppress(OSError):  # best effort: a client that cannot take 200 bytes now gets only the close
        sock.settimeout(0.0)
        sock.send(head.encode() + b"Connection: close\r\n\r\n" + body)


class ApiServer:
    """Serves ``routes`` over ``target`` on ``host:port`` (0: a free port) from its own thread; ``url``.
    ``refused_keys``: keys that get a 403 with their message (another server's clients' keys)."""

    def __init__(self, target: Any, routes: list[tuple[str, re.Pattern[str], Route]], key: str,
                 host: str = "127.0.0.1", port: int = 0, name: str = "rose-api",
                 limits: ServerLimits | None = None, refused_keys: Mapping[str, str] | None = None) -> None:
        limits = limits or ServerLimits()
        handler = type("Handler", (_Handler,), {
            "target": target, "routes": routes, "key": key.encode(), "server_name": name,
            "timeout": limits.idle_timeout_s,
            "refused_keys": {k.encode(): message for k, message in (refused_keys or {}).items()}})
        self._server = _BoundedServer((host, port), handler, limits)
        self.url = f"http://{host}:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name=name, daemon=True)

    def start(self) -> Self:
        self._thread.start()
        return self

    def connections(self) -> int:
        """Connections open now (one thread each)."""
        return self._server.connections()

    @property
    def shed(self) -> int:
        return self._server.shed

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class GatewayServer(ApiServer):
    """The rollout gateway's server; closing it fails the calls still waiting for their turns."""

    def __init__(self, gateway: Gateway, key: str, host: str = "127.0.0.1", port: int = 0,
                 limits: ServerLimits | None = None) -> None:
        super().__init__(gateway, GATEWAY_ROUTES, key, host, port, name="rose-gateway", limits=limits)
        self.gateway = gateway
        gateway.base_url = self.url

    def close(self) -> None:
        self.gateway.bridge.close()
        super().close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "rose-gateway"
    disable_nagle_algorithm = True
    wbufsize = 1 << 16
    """TCP_NODELAY and a buffered writer (flushed after each response, and after each streamed event): headers
    and body written apart let Nagle hold the body until the client's delayed ACK, 40 ms on every call."""
    target: Any
    routes: list[tuple[str, re.Pattern[str], Route]]
    key: bytes
    server_name: str
    refused_keys: dict[bytes, str]

    def send_response(self, code: int, message: str | None = None) -> None:
        """Every status goes through here (ours and the stdlib's own 400s for a malformed request line or
        headers, 501 for a method no route has): refusals are counted."""
        if 400 <= code < 500 or code == 501:
            REFUSED_REQUESTS.labels(self.server_name, str(code)).inc()
        super().send_response(code, message)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def _serve(self, method: str) -> None:
        try:
            path, _, query = self.path.partition("?")
            if path == "/health":
                self._body()
                self._json(200, {"status": "ok"})
                return
            self._authenticate()
            result = self._route(method, path, query, self._body())
        except GatewayError as exc:
            self._json(exc.status, exc.body())
            return
        except Exception as exc:  # a bug of ours: the client gets a 500 that says so, the server goes on
            log.exception("gateway: %s %s failed", method, self.path)
            self._json(500, GatewayError(500, f"internal gateway error: {exc}", kind="server_error").body())
            return
        if result is None:
            self._json(204, None)
        elif isinstance(result, dict):
            self._json(200, result)
        elif isinstance(result, bytes):
            self._binary(result)
        else:
            self._stream(result)

    def _body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            self.close_connection = True
            raise GatewayError(411, "chunked request bodies are not supported: send Content-Length")
        if length is None:
            return b""
        if not (length.isascii() and length.isdigit()) or int(length) > MAX_BODY_BYTES:
            self.close_connection = True
            raise GatewayError(413, f"the body must have a Content-Length of at most {MAX_BODY_BYTES} bytes")
        return self.rfile.read(int(length))

    def _authenticate(self) -> None:
        """Before the body is read: a refused request leaves its body unread, so its connection is closed."""
        given = self.headers.get("Authorization", "")
        if not given.startswith("Bearer "):
            self.close_connection = True
            raise GatewayError(401, "missing bearer key: send `Authorization: Bearer <key>` with the contents of "
                                    "the gateway's key file (the openai client's api_key)", kind="authentication_error")
        sent = given[len("Bearer "):].strip().encode()
        if hmac.compare_digest(sent, self.key):
            server = self.server
            if isinstance(server, _BoundedServer):
                server.proven(self.connection)
            return
        self.close_connection = True
        for other, message in self.refused_keys.items():
            if hmac.compare_digest(sent, other):
                raise GatewayError(403, message, kind="permission_error")
        raise GatewayError(401, "wrong bearer key: use the contents of the key file `rose run` printed",
                           kind="authentication_error")

    def _route(self, method: str, path: str, query: str, body: bytes) -> Any:
        known = False
        for verb, pattern, route in self.routes:
            match = pattern.fullmatch(path)
            if match is None:
                continue
            known = True
            if verb == method:
                params = {k: v[0] for k, v in parse_qs(query).items()}
                return route(self.target, {**params, **match.groupdict()}, body)
        if known:
            raise GatewayError(405, f"{method} is not allowed on {path}")
        raise GatewayError(404, f"no route {method} {path} (docs/gateway.md)",
                           kind="not_found_error")

    def _json(self, status: int, value: Any) -> None:
        data = b"" if status == 204 else json_bytes(value)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)  # buffered (``wbufsize``): headers and body leave in one write, at the flush

    def _binary(self, data: bytes) -> None:
        """A binary body (the trainer API's batches), gzipped when the client accepts it (``Accept-Encoding``)."""
        gzipped = len(data) >= GZIP_MIN_BYTES and accepts_gzip(self.headers.get("Accept-Encoding", ""))
        if gzipped:
            packer = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)  # wbits 31: the gzip format
            data = packer.compress(data) + packer.flush()
        self.send_response(200)
        self.send_header("Content-Type", "application/msgpack")
        if gzipped:
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, chunks: Iterator[dict[str, Any]]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for chunk in chunks:
            self._chunk(b"data: " + json_bytes(chunk) + b"\n\n")
        self._chunk(b"data: [DONE]\n\n")
        self._chunk(b"")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()
