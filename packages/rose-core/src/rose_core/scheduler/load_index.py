"""Usable workers with spare capacity, bucketed by pool, weight version and load, so the least-loaded pick
neither scans every worker nor every worker holding the wrong version.

A worker sits in exactly one bucket ``(pool, version, load)`` while it is usable (ready; for a serving
worker: borrowed, with SLO headroom and an unfrozen budget) and below its capacity; otherwise in none. The
scheduler re-files a worker whenever its load, version or usability changes. A pick looks, for each version
inside the turn's window that some worker holds (a handful at most), at the lowest non-empty load bucket:
O(versions x capacity), independent of the number of workers.
"""

from __future__ import annotations

from collections.abc import Collection

from rose_core.scheduler.worker_state import Pool, WorkerState


class LoadIndex:
    def __init__(self) -> None:
        self._pools: dict[str, dict[int, list[dict[str, WorkerState]]]] = {"dedicated": {}, "serving": {}}
        self._count: dict[tuple[str, int], int] = {}
        self._where: dict[str, tuple[str, int, int]] = {}

    def __len__(self) -> int:
        return len(self._where)

    def refile(self, worker: WorkerState) -> None:
        """Put ``worker`` in the bucket its current state says (or in none)."""
        self.discard(worker.worker_id)
        if not worker.usable():
            return
        pool, version, load = worker.pool, worker.weight_version, worker.load
        buckets = self._pools[pool].setdefault(version, [])
        while len(buckets) <= load:
            buckets.append({})
        buckets[load][worker.worker_id] = worker
        self._where[worker.worker_id] = (pool, version, load)
        self._count[(pool, version)] = self._count.get((pool, version), 0) + 1

    def discard(self, worker_id: str) -> None:
        where = self._where.pop(worker_id, None)
        if where is None:
            return
        pool, version, load = where
        del self._pools[pool][version][load][worker_id]
        left = self._count[(pool, version)] - 1
        if left:
            self._count[(pool, version)] = left
        else:
            del self._count[(pool, version)]
            del self._pools[pool][version]

    def least_loaded(self, pool: Pool, min_version: int, max_version: int, excluded: Collection[str] = ()
                     ) -> WorkerState | None:
        """The least-loaded worker of ``pool`` holding a version in the window, other than ``excluded``."""
        best: WorkerState | None = None
        for version, buckets in self._pools[pool].items():
            if not min_version <= version <= max_version:
                continue
            for load, bucket in enumerate(buckets):
                if best is not None and load >= best.load:
                    break
                found = next((w for w in bucket.values() if w.worker_id not in excluded), None)
                if found is not None:
                    best = found
                    break
        return best
