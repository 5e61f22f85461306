"""Benchmark of a dense weight fetch between two processes on this host, beside the raw TCP ceiling
measured in the same run (one stream, ``sendall`` -> ``recv_into`` into touched memory, best of 3).

The fetch includes what a receiver really pays: signature and checksum checks, and writing a new
file (on /dev/shm by default; fresh pages cost about 0.2 s per 300 MB on the project's VMs)."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import secrets
import socket
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from rose_core.protocol.messages import WeightAnnounce
from rose_transfer.fetch.fetcher import WeightFetcher
from rose_transfer.serve.publisher import DensePublisher


@dataclass(slots=True)
class BenchResult:
    size_bytes: int
    bucket_bytes: int
    window: int
    publish_seconds: float
    raw_tcp_gbps: float
    fetch_seconds: list[float] = field(default_factory=list)

    @property
    def cold_gbps(self) -> float:
        """First fetch: the publisher signs each bucket while serving it."""
        return self.size_bytes / self.fetch_seconds[0] / 1e9

    @property
    def warm_gbps(self) -> float:
        """Best later fetch: buckets already signed (what every receiver after the first sees)."""
        return self.size_bytes / min(self.fetch_seconds[1:] or self.fetch_seconds) / 1e9

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "cold_gbps": self.cold_gbps, "warm_gbps": self.warm_gbps}


def run_loopback_bench(
    size_bytes: int, bucket_bytes: int, window: int = 4, runs: int = 3, dest_dir: Path | None = None
) -> BenchResult:
    secret = secrets.token_bytes(32)
    parent, child = mp.get_context("spawn").Pipe()
    process = mp.get_context("spawn").Process(
        target=_publisher_process, args=(child, secret, size_bytes, bucket_bytes), daemon=True
    )
    process.start()
    try:
        announce_bytes, publish_seconds, raw_port = parent.recv()
        announce = msgspec.msgpack.decode(announce_bytes, type=WeightAnnounce)
        raw_gbps = max(_raw_tcp_gbps(raw_port, size_bytes) for _ in range(3))
        result = BenchResult(size_bytes, bucket_bytes, window, publish_seconds, raw_gbps)
        directory = dest_dir or _fast_dir()
        fetcher = WeightFetcher(secret, "bench", window=window, durable=False)
        for run in range(runs):
            dest = Path(directory) / f".rose-bench-{secrets.token_hex(4)}-{run}.bin"
            fetched = asyncio.run(fetcher.fetch(announce, -1, dest))
            result.fetch_seconds.append(fetched.seconds)
            dest.unlink()
        return result
    finally:
        parent.send("stop")
        process.join(10)


def _fast_dir() -> str:
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() else tempfile.gettempdir()


def _raw_tcp_gbps(port: int, size: int) -> float:
    buffer = np.ones(size, dtype=np.uint8)  # touched, so page faults are not measured
    view = memoryview(buffer.data)
    with socket.create_connection(("127.0.0.1", port)) as sock:
        started = time.perf_counter()
        received = 0
        while received < size:
            n = sock.recv_into(view[received:])
            if n == 0:
                raise ConnectionError("the raw TCP sender closed early")
            received += n
        return size / (time.perf_counter() - started) / 1e9


def _publisher_process(conn: Connection, secret: bytes, size: int, bucket_bytes: int) -> None:
    weights = np.random.default_rng(0).integers(-(2**15), 2**15, size // 2, dtype=np.int16)
    raw = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=_raw_sender, args=(raw, memoryview(weights.data).cast("B")), daemon=True).start()
    with DensePublisher(secret=secret, host="127.0.0.1", port=0, bucket_bytes=bucket_bytes) as publisher:
        started = time.perf_counter()
        announce = publisher.publish(1, 0, {"weights": weights})
        seconds = time.perf_counter() - started
        conn.send((msgspec.msgpack.encode(announce), seconds, raw.getsockname()[1]))
        conn.recv()


def _raw_sender(server: socket.socket, data: memoryview) -> None:
    while True:
        sock, _ = server.accept()
        with sock:
            sock.sendall(data)
