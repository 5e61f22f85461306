"""Signs reply messages on worker threads: a MAC over a 64 MiB bucket takes milliseconds (Poly1305) to
tens of milliseconds (HMAC-SHA256), which must not stall the event loop that serves every other
connection. ``bulk_mac`` picks the signature of replies that carry a bucket (``rose_core.protocol.auth``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import msgspec

from rose_core.protocol.auth import POLY1305, Signer
from rose_core.protocol.messages import TransferReply
from rose_core.protocol.wire import Framer


class Sealer:
    def __init__(self, secret: bytes, workers: int = 2, bulk_mac: str = POLY1305) -> None:
        self._secret = secret
        self.bulk_mac = bulk_mac
        self._local = threading.local()
        self.workers = workers
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rose-seal")

    def seal(self, msg: msgspec.Struct) -> list[Any]:
        """Sealed frames of ``msg``; callable from any thread."""
        framer = getattr(self._local, "framer", None)
        if framer is None:
            framer = self._local.framer = Framer(Signer(self._secret), TransferReply, bulk_mac=self.bulk_mac)
        return framer.seal(msg)

    def on_every_worker(self, fn: Callable[[], None], timeout: float = 60.0) -> list[Future[None]]:
        """Run ``fn`` once on each worker thread (for per-thread state: buffers, compiled kernels)."""
        barrier = threading.Barrier(self.workers, timeout=timeout)

        def run() -> None:
            barrier.wait()  # every worker holds one of these tasks: each thread runs ``fn`` exactly once
            fn()

        return [self.pool.submit(run) for _ in range(self.workers)]

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
