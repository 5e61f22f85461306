"""The gateway on a socket: a threaded HTTP/1.1 server (keep-alive, one thread per connection) with bearer
authentication, the routes below, JSON bodies and server-sent events for ``stream``.

    POST /sessions                                  {"group": ID, "metadata": {...}} -> session_id, base_url
    GET  /sessions/<id>                             the session's token history (segments, masks)
    GET  /sessions/<id>/v1/models                   [policy]
    POST /sessions/<id>/v1/chat/completions         one turn (OpenAI chat completions)
    POST /sessions/<id>/v1/completions              one turn (OpenAI completions)
    POST /sessions/<id>/reward                      {"reward": R} closes the session
    GET  /health                                    no key needed

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
from typing import Any

from rose_core.gateway.gateway import Gateway
from rose_core.gateway.openai_api import GatewayError, json_bytes

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 8 << 20
_SESSION = r"/sessions/(?P<sid>[0-9a-f]{1,64})"
Route = Callable[[Gateway, str, bytes], Any]


def _chat(gw: Gateway, sid: str, body: bytes) -> Any:
    req, reply = gw.chat(sid, body)
    return gw.chat_chunks(req, reply) if req.stream else gw.chat_response(req, reply)


def _completion(gw: Gateway, sid: str, body: bytes) -> Any:
    req, reply = gw.completion(sid, body)
    return gw.completion_chunks(req, reply) if req.stream else gw.completion_response(req, reply)


ROUTES: list[tuple[str, re.Pattern[str], Route]] = [
    ("POST", re.compile(r"/sessions/?"), lambda gw, _sid, body: gw.open_session(body)),
    ("GET", re.compile(_SESSION + r"/?"), lambda gw, sid, _body: gw.describe(sid)),
    ("GET", re.compile(_SESSION + r"/v1/models/?"), lambda gw, sid, _body: gw.models(sid)),
    ("POST", re.compile(_SESSION + r"/v1/chat/completions/?"), _chat),
    ("POST", re.compile(_SESSION + r"/v1/completions/?"), _completion),
    ("POST", re.compile(_SESSION + r"/reward/?"), lambda gw, sid, body: gw.reward(sid, body)),
]


class GatewayServer:
    """Serves ``gateway`` on ``host:port`` (0: a free port) from its own thread; ``url`` once started."""

    def __init__(self, gateway: Gateway, key: str, host: str = "127.0.0.1", port: int = 0) -> None:
        self.gateway = gateway
        handler = type("Handler", (_Handler,), {"gateway": gateway, "key": key.encode()})
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self.url = f"http://{host}:{self._server.server_address[1]}"
        gateway.base_url = self.url
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="rose-gateway", daemon=True)

    def start(self) -> GatewayServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self.gateway.bridge.close()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "rose-gateway"
    disable_nagle_algorithm = True
    """TCP_NODELAY: headers and body leave as two writes, and Nagle would hold the body until the client's
    delayed ACK (40 ms on Linux) on every call."""
    gateway: Gateway
    key: bytes

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def _serve(self, method: str) -> None:
        try:
            body = self._body()
            path = self.path.split("?", 1)[0]
            if path == "/health":
                self._json(200, {"status": "ok"})
                return
            self._authenticate()
            result = self._route(method, path, body)
        except GatewayError as exc:
            self._json(exc.status, exc.body())
            return
        except Exception as exc:  # a bug of ours: the client gets a 500 that says so, the server goes on
            log.exception("gateway: %s %s failed", method, self.path)
            self._json(500, GatewayError(500, f"internal gateway error: {exc}", kind="server_error").body())
            return
        if isinstance(result, dict):
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

    def _route(self, method: str, path: str, body: bytes) -> Any:
        known = False
        for verb, pattern, route in ROUTES:
            match = pattern.fullmatch(path)
            if match is None:
                continue
            known = True
            if verb == method:
                return route(self.gateway, match.groupdict().get("sid") or "", body)
        if known:
            raise GatewayError(405, f"{method} is not allowed on {path}")
        raise GatewayError(404, f"no route {method} {path}: the API is under /sessions (docs/gateway.md)",
                           kind="not_found_error")

    def _json(self, status: int, value: Any) -> None:
        data = json_bytes(value)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self._headers_buffer.append(b"\r\n" + data)  # headers and body in one write
        self.flush_headers()

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
