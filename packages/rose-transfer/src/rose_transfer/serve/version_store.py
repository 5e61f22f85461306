"""The weight versions a publisher serves: the newest ``keep`` of them, safe to share across threads."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from rose_core.protocol.messages import ShardView
from rose_core.support.errors import RoseError
from rose_transfer.plan.view_cut import view_cut, view_manifest
from rose_transfer.serve.scratch import scratch
from rose_transfer.serve.served_view import ServedView
from rose_transfer.version.buffer_pool import BufferPool
from rose_transfer.version.manifest import FlatVersion

MAX_VIEWS = 64  # shard views served per version


@dataclass(slots=True)
class ServedVersion:
    """A version being served. ``sealed`` caches signed reply frames; only the server's loop touches it.
    ``view`` describes shard views on first use (on worker threads: each bucket is cut once to be
    checksummed) and keeps their manifests with the version; their bytes are cut again when needed."""

    flat: FlatVersion
    pool: BufferPool = field(default_factory=BufferPool)
    sealed: dict[Any, Any] = field(default_factory=dict)
    views: dict[ShardView, ServedView] = field(default_factory=dict)
    view_locks: dict[ShardView, threading.Lock] = field(default_factory=dict)
    locks_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def version(self) -> int:
        return self.flat.manifest.version

    def view(self, view: ShardView | None) -> ServedView:
        """The version as ``view`` holds it (None: whole)."""
        if view is None:
            return ServedView(self.flat.manifest, self.flat)
        with self.locks_lock:
            if view not in self.view_locks and len(self.view_locks) >= MAX_VIEWS:
                raise RoseError(f"this version already serves {MAX_VIEWS} shard views: no more are cut")
            lock = self.view_locks.setdefault(view, threading.Lock())
        with lock:  # one manifest per view; different views are described in parallel
            served = self.views.get(view)
            if served is None:
                served = self.views[view] = self._describe(view)
            return served

    def _describe(self, view: ShardView) -> ServedView:
        whole = self.flat.manifest
        cut = view_cut(whole, view)
        manifest = view_manifest(whole, cut, self.flat.stream, scratch(0, whole.bucket_bytes))
        return ServedView(manifest, self.flat, cut)


class VersionStore:
    """Versions by number; adding one evicts the oldest beyond ``keep``. Evicted versions stay alive for
    connections that still hold them (they finish the reply they are sending); their buffers go back
    to ``pool`` once nothing references them."""

    def __init__(self, keep: int = 2, pool: BufferPool | None = None) -> None:
        if keep < 1:
            raise RoseError(f"a publisher must keep at least 1 weight version, got keep={keep}")
        self._keep = keep
        self.pool = pool or BufferPool()
        self._versions: dict[int, ServedVersion] = {}
        self._lock = threading.Lock()

    def add(self, flat: FlatVersion) -> None:
        version = flat.manifest.version
        with self._lock:
            newest = max(self._versions, default=-1)
            if version <= newest:
                raise RoseError(
                    f"weight version {version} is not newer than the published {newest}: publish increasing versions"
                )
            self._versions[version] = ServedVersion(flat, self.pool)
            evicted = [self._versions.pop(old) for old in sorted(self._versions)[: -self._keep]]
        del evicted  # outside the lock: freeing a version may hand its buffers back to the pool

    def get(self, version: int) -> ServedVersion | None:
        with self._lock:
            return self._versions.get(version)

    def versions(self) -> list[int]:
        with self._lock:
            return sorted(self._versions)
