"""The production endpoint: vLLM's own OpenAI-compatible app on the serving engine, run by uvicorn inside
the executor's event loop (``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``, ``/health``).

The app itself comes from ``VllmEngine.openai_app`` (vLLM's ``build_app`` + ``init_app_state``, with its API
key check); this module owns the listening socket and the uvicorn server (TLS, the concurrency limit) and leaves
signal handling to the executor. ``EndpointOptions`` are the ``[serving]`` settings that make the endpoint safe
to expose (docs/security.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import ssl
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import uvicorn

from rose_core.config.executor_config import ServingSection
from rose_core.support.errors import RoseError
from rose_executor.engine.engine_protocol import Engine

log = logging.getLogger(__name__)


class _QuietServer(uvicorn.Server):
    """A uvicorn server that leaves SIGINT/SIGTERM to the executor."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0 picks a free one), or one clear error line."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise RoseError(
                f"serving port {host}:{port} is already in use: set `port` under [serving] in the executor config to a free port"
            ) from exc
        raise RoseError(f"cannot listen on {host}:{port} ({exc.strerror}): fix `host` / `port` under [serving]") from exc
    sock.setblocking(False)
    return sock


@dataclass(frozen=True)
class EndpointOptions:
    """What guards the production endpoint: the clients' key, TLS files, the concurrency limit (0: none)."""

    api_key: str = ""
    ssl_certfile: str = ""
    ssl_keyfile: str = ""
    ssl_ca_certs: str = ""
    max_concurrency: int = 0

    @classmethod
    def of(cls, serving: ServingSection) -> EndpointOptions:
        """The ``[serving]`` section's options (reads the key file)."""
        return cls(serving.api_key(), serving.ssl_certfile, serving.ssl_keyfile, serving.ssl_ca_certs,
                   serving.max_concurrency)

    def uvicorn_settings(self) -> dict[str, Any]:
        settings: dict[str, Any] = {"limit_concurrency": self.max_concurrency or None}
        if self.ssl_certfile:
            settings |= {"ssl_certfile": self.ssl_certfile, "ssl_keyfile": self.ssl_keyfile}
        if self.ssl_ca_certs:
            settings |= {"ssl_ca_certs": self.ssl_ca_certs, "ssl_cert_reqs": ssl.CERT_REQUIRED}
        return settings


class OpenAIServer:
    """vLLM's OpenAI-compatible server for one engine, listening on ``host:port``."""

    def __init__(self, host: str, port: int, options: EndpointOptions | None = None) -> None:
        self.host = host
        self.port = port
        self.options = options or EndpointOptions()
        self._sock: socket.socket | None = None
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, e.g. ``http://127.0.0.1:8000/v1``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}/v1"

    @property
    def scheme(self) -> str:
        return "https" if self.options.ssl_certfile else "http"

    def reserve(self) -> socket.socket:
        """Bind the port now (fail fast when it is busy); serving starts with ``start``."""
        if self._sock is None:
            self._sock = bind_socket(self.host, self.port)
            self.port = int(self._sock.getsockname()[1])
        return self._sock

    async def start(self, engine: Engine, served_model_name: str = "") -> str:
        """Build vLLM's app on ``engine`` and serve it in the background; returns ``base_url``."""
        sock = self.reserve()
        self._sock = None
        try:
            app = await engine.openai_app(served_model_name, self.options.api_key)
        except BaseException:
            sock.close()
            raise
        config = uvicorn.Config(
            app, log_level="warning", access_log=False, lifespan="on", timeout_keep_alive=5, log_config=None,
            **self.options.uvicorn_settings(),
        )  # log_config=None: leave the executor's logging alone (uvicorn's dictConfig silenced it)
        server = self._server = _QuietServer(config)
        self._task = asyncio.create_task(self._serve(server, sock), name="openai-server")
        while not server.started:
            if self._task.done():
                self._task.result()
                raise RoseError(f"the OpenAI server on {self.base_url} stopped during start-up")
            await asyncio.sleep(0.02)
        log.info("OpenAI-compatible API on %s", self.base_url)
        return self.base_url

    async def _serve(self, server: uvicorn.Server, sock: socket.socket) -> None:
        try:
            await server.serve(sockets=[sock])
        except SystemExit as exc:  # uvicorn exits the process when the app's lifespan fails
            raise RoseError(f"the OpenAI server on {self.base_url} failed to start (lifespan error)") from exc
        finally:
            sock.close()

    async def stop(self, timeout: float = 5.0) -> None:
        """Stop accepting, close connections, wait for the server task."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except (TimeoutError, RoseError):
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, RoseError):
                await self._task
        self._server = None
        self._task = None
