"""``DensePublisher``: the ``rose.weight_publishers`` entry ``dense``. Serves whole weight versions.

The controller is synchronous, so the TCP server runs on its own event-loop thread; ``publish`` copies
the tensors into a flat stream (in the caller's thread), registers it, and returns the announcement.
The newest ``keep_versions`` versions stay fetchable.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from rose_core.auth import MIN_SECRET_BYTES
from rose_core.errors import ConfigError, RoseError
from rose_core.messages import WeightAnnounce
from rose_transfer.loop_thread import LoopThread
from rose_transfer.manifest import DEFAULT_BUCKET_BYTES, flatten
from rose_transfer.tcp_address import advertised_host, bind_listener, format_source
from rose_transfer.transfer_server import TransferServer
from rose_transfer.version_store import VersionStore

log = logging.getLogger(__name__)


class DensePublisher:
    """Implements ``rose_core.weights.WeightPublisher``; every byte of a version travels to every receiver."""

    def __init__(
        self,
        *,
        secret: bytes,
        host: str,
        port: int,
        keep_versions: int = 2,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        publisher_id: str = "",
    ) -> None:
        if len(secret) < MIN_SECRET_BYTES:
            raise ConfigError(f"the shared secret is {len(secret)} bytes; use at least {MIN_SECRET_BYTES}")
        if bucket_bytes <= 0:
            raise ConfigError(f"bucket_bytes must be positive, got {bucket_bytes}")
        self.bucket_bytes = bucket_bytes
        self._store = VersionStore(keep_versions)
        self._listener = bind_listener(host, port)
        self.port = int(self._listener.getsockname()[1])
        self.source = format_source(advertised_host(host), self.port)
        self._server = TransferServer(secret, self._store, publisher_id or f"weights@{self.source}")
        self._thread = LoopThread("rose-weight-publisher")
        self._serving = self._thread.submit(self._server.serve(self._listener))
        self._closed = False
        log.info("serving weight versions at %s", self.source)

    def publish(self, version: int, step: int, tensors: Mapping[str, Any]) -> WeightAnnounce:
        """Make ``version`` fetchable (whole) and return the announcement executors act on."""
        if self._closed:
            raise RoseError("this weight publisher is closed: create a new one to publish")
        if version < 0:
            raise RoseError(f"weight versions are non-negative, got {version}")
        flat = flatten(tensors, version=version, bucket_bytes=self.bucket_bytes)
        self._store.add(flat)
        manifest = flat.manifest
        log.info(
            "published weight version %d: %d bytes in %d buckets", version, manifest.total_bytes, len(manifest.buckets)
        )
        return WeightAnnounce(
            version=version,
            step=step,
            source=self.source,
            manifest_digest=manifest.digest,
            total_bytes=manifest.total_bytes,
        )

    def versions(self) -> list[int]:
        """The versions currently fetchable, oldest first."""
        return self._store.versions()

    @property
    def rejected(self) -> int:
        """Connections dropped for a rejected frame since start."""
        return self._server.rejected

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._thread.stop()
        self._listener.close()
        self._server.close()

    def __enter__(self) -> DensePublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
