"""The twin's stand-in for vLLM's OpenAI app: an ASGI app that answers ``/health`` (200) and nothing else (404),
so the production endpoint's lifecycle (bind, serve, drain, stop) runs for real around a ``FakeEngine``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


async def health_app(scope: MutableMapping[str, Any], receive: Receive, send: Send) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    found = scope.get("path") == "/health"
    status, body = (200, b"{}") if found else (404, b'{"detail": "the fake engine serves /health only"}')
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})
