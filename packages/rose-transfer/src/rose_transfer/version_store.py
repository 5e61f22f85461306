"""The weight versions a publisher serves: the newest ``keep`` of them, safe to share across threads."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from rose_core.errors import RoseError
from rose_transfer.manifest import FlatVersion


@dataclass(slots=True)
class ServedVersion:
    """A version being served. ``sealed`` caches signed reply frames; only the server's loop touches it."""

    flat: FlatVersion
    sealed: dict[Any, Any] = field(default_factory=dict)

    @property
    def version(self) -> int:
        return self.flat.manifest.version


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
