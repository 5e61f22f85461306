"""``SparsePublisher``: the ``rose.weight_publishers`` entry ``sparse``.

Same constructor and ``WeightPublisher`` protocol as ``DensePublisher``; it keeps the previous version
and answers a receiver that says it holds it (``have_version``) with per-bucket sparse patches (the new
values at changed positions, or dense where that is smaller). Receivers holding anything else get the
dense version: a full sync. ``WeightFetcher`` handles both transparently."""

from __future__ import annotations

from rose_core.auth import POLY1305
from rose_core.errors import ConfigError
from rose_transfer.serve.publisher import DensePublisher
from rose_transfer.version.manifest import DEFAULT_BUCKET_BYTES


class SparsePublisher(DensePublisher):
    def __init__(
        self,
        *,
        secret: bytes,
        host: str,
        port: int,
        keep_versions: int = 2,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        publisher_id: str = "",
        bulk_mac: str = POLY1305,
    ) -> None:
        if keep_versions < 2:
            raise ConfigError(
                f"a sparse publisher keeps the previous version too: keep_versions >= 2, not {keep_versions}"
            )
        super().__init__(
            secret=secret,
            host=host,
            port=port,
            keep_versions=keep_versions,
            bucket_bytes=bucket_bytes,
            publisher_id=publisher_id,
            sparse=True,
            bulk_mac=bulk_mac,
        )
