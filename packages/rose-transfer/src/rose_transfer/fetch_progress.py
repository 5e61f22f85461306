"""What one weight fetch has achieved so far; it survives reconnects, so a fetch resumes where it was."""

from __future__ import annotations

from dataclasses import dataclass, field

from rose_core.messages import WeightAnnounce, WeightManifest
from rose_transfer.errors import TransferError
from rose_transfer.partial_file import PartialFile


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

    @property
    def version(self) -> int:
        return self.announce.version

    def missing(self) -> list[int]:
        if self.manifest is None:
            return []
        return [b.index for b in self.manifest.buckets if b.index not in self.done]

    def corrupt(self, index: int, reason: str) -> None:
        """Count a failed bucket; raise once it failed more often than allowed."""
        count = self.retries[index] = self.retries.get(index, 0) + 1
        if count > self.max_bucket_retries:
            raise TransferError(
                f"bucket {index} of weight version {self.version} failed {count} times ({reason}): "
                "the publisher's copy is corrupt or the link corrupts data; republish or check the network"
            )
