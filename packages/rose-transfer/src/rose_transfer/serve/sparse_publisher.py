"""``SparsePublisher``: the ``rose.weight_publishers`` entry ``sparse``.

``DensePublisher`` with ``sparse`` set (same constructor and ``WeightPublisher`` protocol; it needs
``keep_versions >= 2``): it keeps the previous version and answers a receiver that says it holds it
(``have_version``) with per-bucket sparse patches (the new values at changed positions, or dense where
that is smaller). Receivers holding anything else get the dense version: a full sync.
``WeightFetcher`` handles both transparently."""

from __future__ import annotations

from typing import ClassVar

from rose_transfer.serve.publisher import DensePublisher


class SparsePublisher(DensePublisher):
    sparse: ClassVar[bool] = True
