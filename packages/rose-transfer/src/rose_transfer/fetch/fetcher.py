"""``WeightFetcher``: pulls an announced weight version into a file (``fetch``) or into weights held in
memory (``fetch_into``, patches applied in place), whole or not at all.

``fetch`` receives the version into a hidden temp file next to ``dest`` and renames it to ``dest`` only
when every bucket passed its signature and checksum; ``fetch_into`` stages it and applies it under the
target's lock with an undo log (``resident_commit``). A corrupt bucket is pulled again (bounded); a dropped
connection is re-opened and the fetch resumes with the buckets still missing (bounded, reset whenever
a connection makes progress). A relay that failed is skipped for a while (``RelayHealth``): the versions
after it died go straight to the source.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rose_core.protocol.auth import MIN_SECRET_BYTES
from rose_core.protocol.messages import ShardView, WeightAnnounce
from rose_core.support.errors import ConfigError, ProtocolError
from rose_core.support.metrics import REJECTED_MESSAGES
from rose_transfer.codec.patch_positions import changed_offsets
from rose_transfer.errors import BucketRefused, TransferError, UntrustedNotice
from rose_transfer.fetch.bucket_buffers import BucketBuffers
from rose_transfer.fetch.bucket_sink import BucketSink
from rose_transfer.fetch.fetch_progress import FetchProgress
from rose_transfer.fetch.file_sink import FileSink
from rose_transfer.fetch.held_bases import HeldBases
from rose_transfer.fetch.memory_sink import MemorySink
from rose_transfer.fetch.partial_file import PartialFile
from rose_transfer.fetch.relay_health import RelayHealth
from rose_transfer.fetch.transfer_client import TransferClient
from rose_transfer.metrics import FETCH_SECONDS, RECEIVED_BYTES, RECONNECTS
from rose_transfer.plan.shard_view import check_view
from rose_transfer.resident.resident_commit import commit
from rose_transfer.resident.resident_weights import ResidentWeights
from rose_transfer.version.fetched_version import FetchedInMemory, FetchedVersion
from rose_transfer.version.manifest import check_manifest
from rose_transfer.wire.tls_link import UntrustedServer

log = logging.getLogger(__name__)


class WeightFetcher:
    def __init__(
        self,
        secret: bytes,
        receiver_id: str,
        *,
        window: int = 4,
        max_bucket_retries: int = 3,
        max_reconnects: int = 5,
        timeout: float = 30.0,
        durable: bool = True,
        relay_reconnects: int = 1,
        relay_health: RelayHealth | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if len(secret) < MIN_SECRET_BYTES:
            raise ConfigError(f"the shared secret is {len(secret)} bytes; use at least {MIN_SECRET_BYTES}")
        if window < 1 or max_bucket_retries < 0 or max_reconnects < 0 or timeout <= 0:
            raise ConfigError("fetcher window must be >= 1, retries and reconnects >= 0, timeout > 0")
        self._secret = secret
        self.receiver_id = receiver_id
        self.window = window
        self.max_bucket_retries = max_bucket_retries
        self.max_reconnects = max_reconnects
        self.timeout = timeout
        self.durable = durable
        self.relay_reconnects = relay_reconnects
        self.relays = relay_health or RelayHealth()
        self._clock = clock
        self.bases = HeldBases()
        self.buffers = BucketBuffers()

    async def fetch(
        self,
        announce: WeightAnnounce,
        have_version: int,
        dest: Path,
        *,
        buckets: Iterable[int] | None = None,
        relay: str | None = None,
    ) -> FetchedVersion:
        """Fetch ``announce.version`` into the file ``dest``; ``have_version`` is the version held now.

        If this fetcher committed ``have_version`` itself and its file is still there, buckets come as
        patches against it (from a sparse publisher); otherwise whole. ``buckets``: pull only these
        (a shard's; the rest of the file stays zero). ``relay``: pull through this relay
        (``tcp://host:port``), falling back to ``announce.source`` when it fails."""
        started = time.perf_counter()
        progress = self._progress(announce, have_version, buckets, relay)
        sink = FileSink(self._secret, progress, Path(dest), self.bases, self.buffers, self.window)
        try:
            await self._fetch_with_reconnects(progress, sink)
            if progress.file is None or progress.manifest is None:
                raise RuntimeError("a finished fetch has its file and manifest")
            path = self._commit(progress.file, announce.version)
            self.bases.record(path, progress.manifest, frozenset(progress.done))
        finally:
            sink.close()
            if progress.base is not None:
                progress.base.close()
            if progress.file is not None and progress.file.temp.exists():
                progress.file.discard()
        seconds = self._finished(progress, started)
        return FetchedVersion(
            version=announce.version,
            path=path,
            entries=progress.manifest.tensors,
            bytes_received=progress.bytes_received,
            seconds=seconds,
            digest=progress.manifest.digest,
        )

    async def fetch_into(self, announce: WeightAnnounce, target: ResidentWeights, *, buckets: Iterable[int] | None = None,
                         relay: str | None = None, view: ShardView | None = None) -> FetchedInMemory:
        """Apply ``announce.version`` to the weights ``target`` holds in memory, whole or not at all.

        If ``target`` holds a version in the same layout, buckets come as patches against it (from a
        sparse publisher) and are written in place (O(changes)); otherwise this is a full sync. A
        bucket whose patched checksum fails rolls the whole version back and is pulled again, dense.
        On any error ``target`` still holds its previous version, bit for bit. ``view``: hold only this
        shard of every tensor, as the engine's local tensors (the publisher cuts the view; patches
        and checksums cover only its bytes); ``buckets`` then count the view's buckets.
        ``stage_into`` then ``commit_staged`` do the same in two steps (pull now, apply later)."""
        staged = await self.stage_into(announce, target, buckets=buckets, relay=relay, view=view)
        return await self.commit_staged(staged)

    async def stage_into(self, announce: WeightAnnounce, target: ResidentWeights, *, buckets: Iterable[int] | None = None,
                         relay: str | None = None, view: ShardView | None = None) -> StagedVersion:
        """Pull ``announce.version`` for ``target`` without touching it: patches kept as they came
        (O(changes)), dense buckets in a staging buffer. Apply with ``commit_staged`` or drop with
        ``StagedVersion.discard``."""
        check_view(view)
        started = time.perf_counter()
        progress = self._progress(announce, target.version, buckets, relay)
        progress.view = view
        sink = MemorySink(self._secret, target, progress, self.window)
        try:
            await self._fetch_with_reconnects(progress, sink)
        except BaseException:
            sink.close()
            raise
        return StagedVersion(progress, sink, started, time.perf_counter() - started)

    async def commit_staged(self, staged: StagedVersion) -> FetchedInMemory:
        """Apply a staged version to its target, whole or not at all (a bucket whose patched checksum
        fails rolls everything back and is pulled again, dense); the target's lock is held meanwhile."""
        progress, sink = staged.progress, staged.sink
        try:
            failed = [] if staged.retry else await asyncio.to_thread(_commit_staged, sink, progress)
            while staged.retry or failed:
                _mark_failed(progress, failed)
                staged.retry = False
                await self._fetch_with_reconnects(progress, sink)
                failed = await asyncio.to_thread(_commit_staged, sink, progress)
        finally:
            sink.close()
        return self._committed(staged)

    def try_commit_staged(self, staged: StagedVersion) -> FetchedInMemory | None:
        """``commit_staged`` in the calling thread, without an event loop (an engine worker commits between
        two steps this way): the version if every bucket checked out; None after a rollback (nothing
        applied; the failed buckets are marked), when ``commit_staged`` pulls them again and applies."""
        failed = _commit_staged(staged.sink, staged.progress)
        if failed:
            _mark_failed(staged.progress, failed)
            staged.retry = True
            return None
        staged.sink.close()
        return self._committed(staged)

    def _committed(self, staged: StagedVersion) -> FetchedInMemory:
        progress = staged.progress
        seconds = self._finished(progress, staged.started)
        return FetchedInMemory(progress.version, progress.bytes_received, seconds, len(staged.sink.patches))

    def _progress(
        self, announce: WeightAnnounce, have_version: int, buckets: Iterable[int] | None, relay: str | None
    ) -> FetchProgress:
        progress = FetchProgress(announce, have_version, self.max_bucket_retries)
        progress.wanted = None if buckets is None else frozenset(buckets)
        if relay and not self.relays.usable(relay, self._clock()):
            log.info("version %d from the source: relay %s failed, next try in %.0f s", announce.version, relay,
                     self.relays.retry_in(relay, self._clock()))
            relay = None
        progress.sources = [s for s in (relay, announce.source) if s]
        return progress

    @staticmethod
    def _finished(progress: FetchProgress, started: float) -> float:
        seconds = time.perf_counter() - started
        FETCH_SECONDS.observe(seconds)
        log.info("fetched weight version %d (%d bytes) in %.2f s", progress.version, progress.bytes_received, seconds)
        return seconds

    def _commit(self, file: PartialFile, version: int) -> Path:
        try:
            return file.commit(self.durable)
        except OSError as exc:
            raise TransferError(
                f"cannot move weight version {version} into place at {file.dest} ({exc.strerror}): "
                "fix the weights directory"
            ) from exc

    async def _fetch_with_reconnects(self, progress: FetchProgress, sink: BucketSink) -> None:
        failures = 0
        while True:
            done_before = len(progress.done)
            try:
                await self._fetch_on_one_connection(progress, sink)
                if len(progress.sources) > 1:  # still on the relay: it served this version
                    self.relays.succeeded(progress.source)
                return
            except BucketRefused as exc:
                if len(progress.sources) == 1:
                    raise
                self._leave_relay(progress, exc)  # what it served and passed its checksum is kept
                progress.retries.clear()
                failures = 0
            except (OSError, TimeoutError, ProtocolError) as exc:
                if isinstance(exc, ProtocolError):
                    REJECTED_MESSAGES.labels(exc.reason).inc()
                failures = 0 if len(progress.done) > done_before else failures + 1
                if len(progress.sources) > 1 and failures > self.relay_reconnects:
                    self._leave_relay(progress, exc)
                    failures = 0
                    continue
                if failures > self.max_reconnects:
                    fix = ("if that is the publisher, its shared secret differs from this receiver's: use the "
                           "controller's" if isinstance(exc, UntrustedNotice | UntrustedServer)
                           else "check that the publisher runs and is reachable")
                    raise TransferError(
                        f"cannot fetch weight version {progress.version} from {progress.source} "
                        f"({_describe(exc)}, {failures} tries): {fix}"
                    ) from exc
                log.warning("weight fetch of version %d interrupted (%s); resuming", progress.version, _describe(exc))
                RECONNECTS.inc()
                await asyncio.sleep(min(0.05 * 2**failures, 2.0))

    def _leave_relay(self, progress: FetchProgress, exc: BaseException) -> None:
        log.warning("relay %s failed (%s); pulling from the source", progress.source, _describe(exc))
        backoff = self.relays.failed(progress.sources.pop(0), self._clock())
        log.info("the next versions skip that relay for %.0f s", backoff)

    async def _fetch_on_one_connection(self, progress: FetchProgress, sink: BucketSink) -> None:
        announce = progress.announce
        source = progress.source
        started = time.perf_counter()
        client = await TransferClient.connect(
            source, secret=self._secret, receiver_id=self.receiver_id, timeout=self.timeout
        )
        connected = time.perf_counter()
        try:
            if progress.manifest is None:
                manifest = await client.fetch_manifest(
                    announce.version, progress.have_version, self.receiver_id, progress.view
                )
                check_manifest(manifest, version=announce.version, digest=announce.manifest_digest, view=progress.view)
                progress.manifest = manifest
                sink.prepare(manifest)
            described = time.perf_counter()
            await client.pull(progress, sink, self.receiver_id)
            log.debug(
                "version %d from %s: connect %.3f s, manifest %.3f s, buckets %.3f s",
                announce.version, source, connected - started, described - connected, time.perf_counter() - described,
            )
        finally:
            progress.bytes_received += client.bytes_received
            RECEIVED_BYTES.inc(client.bytes_received)
            client.close()


@dataclass(slots=True)
class StagedVersion:
    """A version pulled for ``ResidentWeights`` and not applied yet (``WeightFetcher.commit_staged``)."""

    progress: FetchProgress
    sink: MemorySink
    started: float
    stage_seconds: float
    retry: bool = False
    """A commit in the caller's thread rolled back: ``commit_staged`` pulls the failed buckets first."""

    @property
    def version(self) -> int:
        return self.progress.version

    @property
    def bytes_received(self) -> int:
        return self.progress.bytes_received

    def touched(self) -> tuple[np.ndarray, frozenset[int]]:
        """``(stream offsets of every byte a patch wrote, ascending; buckets placed dense)``."""
        manifest = self.progress.manifest
        if manifest is None:
            raise RuntimeError("a staged version has its manifest")
        parts = [
            changed_offsets(payload, manifest.buckets[index].nbytes) + manifest.buckets[index].offset
            for index, payload in sorted(self.sink.patches.items())
            if index not in self.sink.dense
        ]
        offsets = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
        return offsets, frozenset(self.sink.dense)

    def discard(self) -> None:
        """Drop the staged bytes (the target never saw them)."""
        self.sink.close()


def _mark_failed(progress: FetchProgress, failed: list[int]) -> None:
    for index in failed:
        progress.done.discard(index)
        progress.corrupt(index, "checksum mismatch after patching in place")


def _commit_staged(sink: MemorySink, progress: FetchProgress) -> list[int]:
    if progress.manifest is None:
        raise RuntimeError("a finished fetch has its manifest")
    return commit(sink.target, progress.manifest, sink.patches, sink.dense, sink.staging)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
