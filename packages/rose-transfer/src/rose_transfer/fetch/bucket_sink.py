"""Where a pull puts each bucket: ``FileSink`` (a version file) or ``MemorySink`` (resident weights).

``TransferClient.pull`` asks the sink where a bucket's bulk frame may land (``landing``), hands the
received frames to ``accept`` on a worker thread of ``pool`` (verify, stage; raises ``BucketCorrupt``
to pull the bucket again), then ``release``s the landing."""

from __future__ import annotations

from concurrent.futures import Executor
from typing import Any, Protocol

from rose_core.protocol.messages import BucketInfo, WeightManifest


class BucketSink(Protocol):
    window: int  # buckets requested or being verified at once

    @property
    def pool(self) -> Executor: ...

    def prepare(self, manifest: WeightManifest) -> None: ...

    def landing(self, info: BucketInfo) -> tuple[Any, memoryview | None]: ...

    def accept(self, frames: list[Any], info: BucketInfo, token: Any) -> None: ...

    def release(self, token: Any) -> None: ...

    def close(self) -> None: ...
