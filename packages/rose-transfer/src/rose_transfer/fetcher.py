"""``WeightFetcher``: pulls an announced weight version into a file, whole or not at all.

The version is received into a hidden temp file next to ``dest`` and renamed to ``dest`` only when
every bucket passed its signature and checksum. A corrupt bucket is pulled again (bounded); a dropped
connection is re-opened and the fetch resumes with the buckets still missing (bounded, reset whenever
a connection makes progress).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from pathlib import Path

from rose_core.auth import MIN_SECRET_BYTES
from rose_core.errors import ConfigError, ProtocolError
from rose_core.messages import WeightAnnounce
from rose_core.metrics import REJECTED_MESSAGES
from rose_transfer.bucket_buffers import BucketBuffers
from rose_transfer.bucket_checker import BucketChecker
from rose_transfer.errors import TransferError
from rose_transfer.fetch_progress import FetchProgress
from rose_transfer.fetched_version import FetchedVersion
from rose_transfer.held_bases import HeldBases
from rose_transfer.manifest import check_manifest
from rose_transfer.metrics import FETCH_SECONDS, RECEIVED_BYTES, RECONNECTS
from rose_transfer.partial_file import PartialFile
from rose_transfer.tcp_address import parse_source
from rose_transfer.transfer_client import REPLY_OVERHEAD, TransferClient
from rose_transfer.ucx_address import UCX_SCHEME, parse_ucx_source

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
        progress = FetchProgress(announce, have_version, self.max_bucket_retries)
        progress.wanted = None if buckets is None else frozenset(buckets)
        progress.sources = [s for s in (relay, announce.source) if s]
        try:
            await self._fetch_with_reconnects(progress, Path(dest))
            if progress.file is None or progress.manifest is None:
                raise RuntimeError("a finished fetch has its file and manifest")
            path = self._commit(progress.file, announce.version)
            self.bases.record(path, progress.manifest, frozenset(progress.done))
        finally:
            if progress.base is not None:
                progress.base.close()
            if progress.file is not None and progress.file.temp.exists():
                progress.file.discard()
        seconds = time.perf_counter() - started
        FETCH_SECONDS.observe(seconds)
        log.info("fetched weight version %d (%d bytes) in %.2f s", announce.version, progress.bytes_received, seconds)
        return FetchedVersion(
            version=announce.version,
            path=path,
            entries=progress.manifest.tensors,
            bytes_received=progress.bytes_received,
            seconds=seconds,
            digest=progress.manifest.digest,
        )

    def _commit(self, file: PartialFile, version: int) -> Path:
        try:
            return file.commit(self.durable)
        except OSError as exc:
            raise TransferError(
                f"cannot move weight version {version} into place at {file.dest} ({exc.strerror}): "
                "fix the weights directory"
            ) from exc

    async def _fetch_with_reconnects(self, progress: FetchProgress, dest: Path) -> None:
        failures = 0
        while True:
            done_before = len(progress.done)
            try:
                await self._fetch_on_one_connection(progress, dest)
                return
            except (OSError, TimeoutError, ProtocolError) as exc:
                if isinstance(exc, ProtocolError):
                    REJECTED_MESSAGES.labels(exc.reason).inc()
                failures = 0 if len(progress.done) > done_before else failures + 1
                if len(progress.sources) > 1 and failures > self.relay_reconnects:
                    log.warning("relay %s failed (%s); pulling from the source", progress.source, _describe(exc))
                    progress.sources.pop(0)
                    failures = 0
                    continue
                if failures > self.max_reconnects:
                    raise TransferError(
                        f"cannot fetch weight version {progress.version} from {progress.source} "
                        f"({_describe(exc)}, {failures} tries): check that the publisher runs and is reachable"
                    ) from exc
                log.warning("weight fetch of version %d interrupted (%s); resuming", progress.version, _describe(exc))
                RECONNECTS.inc()
                await asyncio.sleep(min(0.05 * 2**failures, 2.0))

    async def _fetch_on_one_connection(self, progress: FetchProgress, dest: Path) -> None:
        announce = progress.announce
        source = progress.source
        host, port = parse_ucx_source(source) if source.startswith(UCX_SCHEME) else parse_source(source)
        client = await TransferClient.connect(
            host, port, secret=self._secret, receiver_id=self.receiver_id, source=source, timeout=self.timeout
        )
        try:
            if progress.manifest is None:
                manifest = await client.fetch_manifest(announce.version, progress.have_version, self.receiver_id)
                check_manifest(manifest, version=announce.version, digest=announce.manifest_digest)
                progress.file = PartialFile(dest, manifest.total_bytes)
                progress.manifest = manifest
                held = self.bases.usable(progress.have_version, manifest)
                if held is not None:
                    progress.base, progress.base_buckets = held
            checker = BucketChecker(self._secret, progress.manifest.bucket_bytes + REPLY_OVERHEAD)
            try:
                largest = max((b.nbytes for b in progress.manifest.buckets), default=0)
                with self.buffers.lend(self.window, largest) as buffers:
                    await client.pull(progress, checker, buffers, self.receiver_id)
            finally:
                checker.close()
        finally:
            progress.bytes_received += client.bytes_received
            RECEIVED_BYTES.inc(client.bytes_received)
            client.close()


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
