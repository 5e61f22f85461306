"""Prometheus metrics of the weight data plane (rejected frames count in rose_core's counter)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

SENT_BYTES = Counter("rose_weight_sent_bytes_total", "Bytes of weight replies sent by this publisher.")
RECEIVED_BYTES = Counter("rose_weight_received_bytes_total", "Bytes of weight replies received by this process.")
BUCKET_RETRIES = Counter(
    "rose_weight_bucket_retries_total", "Weight buckets pulled again after failing their signature or checksum."
)
RECONNECTS = Counter("rose_weight_reconnects_total", "Weight fetches resumed on a new connection.")
FETCH_SECONDS = Histogram(
    "rose_weight_fetch_seconds",
    "Wall time of complete weight version fetches.",
    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320),
)
