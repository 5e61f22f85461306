"""What one weight fetch has achieved so far; it survives reconnects, so a fetch resumes where it was."""

from __future__ import annotations

from dataclasses import dataclass, field

from rose_core.protocol.messages import ShardView, WeightAnnounce, WeightManifest
from rose_transfer.errors import BucketRefused
from rose_transfer.fetch.held_bases import BaseFile
from rose_transfer.fetch.partial_file import PartialFile


@dataclass(slots=True)
class FetchProgress:
    announce: WeightAnnounce
    have_version: int
    max_bucket_retries: int
    manifest: WeightManifest | None = None
    file: PartialFile | None = None
    done: set[int] = field(default_factory=set)
    retries: dict[int, int] = field(default_factory=dict)
    bytes_received: int = 0
    wanted: frozenset[int] | None = None  # the buckets to pull (a shard's); None: all
    base: BaseFile | None = None  # the file of ``have_version``, for patches (a file fetch)
    base_buckets: frozenset[int] = frozenset()  # the buckets of ``have_version`` held, valid: patch bases
    dense_only: set[int] = field(default_factory=set)  # buckets whose patch failed: pulled dense
    sources: list[str] = field(default_factory=list)  # where to pull from, in order (relay, then source)
    view: ShardView | None = None  # pull the version as this shard holds it; None: whole

    @property
    def source(self) -> str:
        return self.sources[0] if self.sources else self.announce.source

    def bucket_base(self, index: int) -> int:
        """The version a bucket is asked against: ours if we hold its bytes, else -1 (dense)."""
        usable = index in self.base_buckets and index not in self.dense_only
        return self.have_version if usable else -1

    @property
    def version(self) -> int:
        return self.announce.version

    def missing(self) -> list[int]:
        if self.manifest is None:
            return []
        wanted = self.wanted
        return [
            b.index for b in self.manifest.buckets if b.index not in self.done and (wanted is None or b.index in wanted)
        ]

    def corrupt(self, index: int, reason: str) -> None:
        """Count a failed bucket; raise once it failed more often than allowed."""
        count = self.retries[index] = self.retries.get(index, 0) + 1
        self.dense_only.add(index)  # a patch may have met a diverged base: the retry is dense
        if count > self.max_bucket_retries:
            raise BucketRefused(
                f"bucket {index} of weight version {self.version} failed {count} times ({reason}): "
                "the publisher's copy is corrupt or the link corrupts data; republish or check the network"
            )
