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
"""

from __future__ import annotations

import hmac
import logging
import re
import threading
from collections.abc import Callable, Iterator
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
Route = Callable[[Any, dict[str, str], bytes], Any]
"""(the API's object, the path's groups and the query's parameters, the body) -> a JSON value or SSE events."""


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


class ApiServer:
    """Serves ``routes`` over ``target`` on ``host:port`` (0: a free port) from its own thread; ``url``."""

    def __init__(self, target: Any, routes: list[tuple[str, re.Pattern[str], Route]], key: str,
                 host: str = "127.0.0.1", port: int = 0, name: str = "rose-api") -> None:
        handler = type("Handler", (_Handler,), {"target": target, "routes": routes, "key": key.encode(),
                                                "server_name": name})
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self.url = f"http://{host}:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name=name, daemon=True)

    def start(self) -> Self:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class GatewayServer(ApiServer):
    """The rollout gateway's server; closing it fails the calls still waiting for their turns."""

    def __init__(self, gateway: Gateway, key: str, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(gateway, GATEWAY_ROUTES, key, host, port, name="rose-gateway")
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
            body = self._body()
            path, _, query = self.path.partition("?")
            if path == "/health":
                self._json(200, {"status": "ok"})
                return
            self._authenticate()
            result = self._route(method, path, query, body)
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
        else:
            self._stream(result)

    def _body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            self.close_connection = True
            raise GatewayError(411, "chunked request bodies are not supported: send Content-Length")
        if length is None:
            return b""
        if not length.isdigit() or int(length) > MAX_BODY_BYTES:
            self.close_connection = True
            raise GatewayError(413, f"the body must have a Content-Length of at most {MAX_BODY_BYTES} bytes")
        return self.rfile.read(int(length))

    def _authenticate(self) -> None:
        given = self.headers.get("Authorization", "")
        if not given.startswith("Bearer "):
            raise GatewayError(401, "missing bearer key: send `Authorization: Bearer <key>` with the contents of "
                                    "the gateway's key file (the openai client's api_key)", kind="authentication_error")
        if not hmac.compare_digest(given[len("Bearer "):].strip().encode(), self.key):
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
