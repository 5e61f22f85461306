"""The weight versions a publisher serves: the newest ``keep`` of them, safe to share across threads."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from rose_core.errors import RoseError
from rose_core.messages import ShardView
from rose_transfer.plan.shard_view import view_version
from rose_transfer.version.manifest import FlatVersion

MAX_VIEWS = 64  # shard views cut per version (each may be as large as the version)


@dataclass(slots=True)
class ServedVersion:
    """A version being served. ``sealed`` caches signed reply frames; only the server's loop touches it.
    ``view`` cuts shard views on first use (on worker threads) and keeps them with the version."""

    flat: FlatVersion
    sealed: dict[Any, Any] = field(default_factory=dict)
    views: dict[ShardView, FlatVersion] = field(default_factory=dict)
    view_locks: dict[ShardView, threading.Lock] = field(default_factory=dict)
    locks_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def version(self) -> int:
        return self.flat.manifest.version

    def view(self, view: ShardView | None) -> FlatVersion:
        """The version as ``view`` holds it (None: whole)."""
        if view is None:
            return self.flat
        with self.locks_lock:
            if view not in self.view_locks and len(self.view_locks) >= MAX_VIEWS:
                raise RoseError(f"this version already serves {MAX_VIEWS} shard views: no more are cut")
            lock = self.view_locks.setdefault(view, threading.Lock())
        with lock:  # one cut per view; different views are cut in parallel
            cut = self.views.get(view)
            if cut is None:
                cut = self.views[view] = view_version(self.flat, view)
            return cut


class VersionStore:
    """Versions by number; adding one evicts the oldest beyond ``keep``. Evicted versions stay alive for
    connections that still hold them (they finish the reply they are sending)."""

    def __init__(self, keep: int = 2) -> None:
        if keep < 1:
            raise RoseError(f"a publisher must keep at least 1 weight version, got keep={keep}")
        self._keep = keep
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
            self._versions[version] = ServedVersion(flat)
            for old in sorted(self._versions)[: -self._keep]:
                del self._versions[old]

    def get(self, version: int) -> ServedVersion | None:
        with self._lock:
            return self._versions.get(version)

    def versions(self) -> list[int]:
        with self._lock:
            return sorted(self._versions)
