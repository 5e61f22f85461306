"""A weights-key holder that serves a forged bucket cannot make it pass (decision 724).

Every executor and relay holds the weights key, so any of them can sign bucket replies; what stops one from
serving another receiver forged weights is the bucket hash, anchored through the manifest digest in the
controller's signed announce. The hash must resist crafted collisions. xxh3 (the hash before) does not:
within one block, XXH3 adds each 64-bit input lane to a neighbouring accumulator and multiplies the lane's
two 32-bit halves (XORed with the public default secret) into its own. A lane whose low half equals the
secret's makes that product 0 whatever its high half, so two such lanes in consecutive stripes can trade
high halves and leave every accumulator, and the hash, unchanged.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path

import msgspec
import numpy as np
import pytest
import xxhash

from rose_transfer import DensePublisher, ResidentWeights, TransferError, WeightFetcher, load_arrays
from rose_transfer.serve.sparse_publisher import SparsePublisher
from rose_transfer.version.manifest import bucket_checksum

from .conftest import assert_same

BUCKET = 16 * 1024
# The first 16 bytes of XXH3's default secret (a constant of the algorithm): lane 0's key in stripes 0 and 1.
XXH3_SECRET_HEAD = bytes.fromhex("b8fe6c3923a44bbe7c01812cf721ad1c")


def _xxh3_twins(rng: np.random.Generator) -> tuple[bytes, bytes]:
    """Two different 16 KiB buckets with the same xxh3-64 and xxh3-128."""
    first = bytearray(rng.bytes(BUCKET))
    second = bytearray(first)
    for stripe in (0, 1):
        key_low = struct.unpack_from("<Q", XXH3_SECRET_HEAD, 8 * stripe)[0] & 0xFFFFFFFF
        struct.pack_into("<Q", first, 64 * stripe, (stripe + 1) << 32 | key_low)
        struct.pack_into("<Q", second, 64 * stripe, (2 - stripe) << 32 | key_low)
    return bytes(first), bytes(second)


def test_xxh3_twins_collide_and_the_bucket_checksum_tells_them_apart() -> None:
    genuine, forged = _xxh3_twins(np.random.default_rng(0))
    assert genuine != forged
    assert xxhash.xxh3_64_hexdigest(genuine) == xxhash.xxh3_64_hexdigest(forged)
    assert xxhash.xxh3_128_hexdigest(genuine) == xxhash.xxh3_128_hexdigest(forged)
    assert bucket_checksum(genuine) != bucket_checksum(forged)


async def test_a_weights_key_holder_serving_a_colliding_bucket_is_refused(tmp_path: Path) -> None:
    """A server holding the weights key (what a compromised relay is) serves bucket 2 swapped for its xxh3
    twin, signed correctly. The receiver refuses it (checksum mismatch, bounded retries) and keeps the version
    it held; from the genuine publisher the same version arrives bit-exact."""
    rng = np.random.default_rng(1)
    genuine, forged = _xxh3_twins(rng)
    stream = np.frombuffer(rng.bytes(2 * BUCKET) + genuine + rng.bytes(BUCKET), dtype=np.uint8).copy()
    tensors = {"weights": stream}
    secret = b"forged-bucket-tests-secret-01234"
    with (
        DensePublisher(secret=secret, host="127.0.0.1", port=0, bucket_bytes=BUCKET) as honest,
        DensePublisher(secret=secret, host="127.0.0.1", port=0, bucket_bytes=BUCKET) as relay,
    ):
        announce = honest.publish(1, 0, tensors)
        relay_announce = relay.publish(1, 0, tensors)
        assert relay_announce.manifest_digest == announce.manifest_digest
        served = relay._store.get(1)
        assert served is not None
        served.flat.stream[2 * BUCKET : 3 * BUCKET] = np.frombuffer(forged, dtype=np.uint8)
        fetcher = WeightFetcher(secret, "victim", timeout=5.0)
        dest = tmp_path / "v1.bin"
        dest.write_bytes(b"the version applied before")
        via_relay = msgspec.structs.replace(announce, source=relay_announce.source)
        with pytest.raises(TransferError, match=r"bucket 2 of weight version 1 failed \d+ times \(checksum mismatch\)"):
            await fetcher.fetch(via_relay, -1, dest)
        assert dest.read_bytes() == b"the version applied before"
        fetched = await fetcher.fetch(announce, -1, tmp_path / "v1-honest.bin")
        assert_same(load_arrays(fetched), tensors)


async def test_a_relay_serving_a_colliding_bucket_is_left_for_the_source(tmp_path: Path) -> None:
    """Through a relay that serves the twin, the receiver keeps what the relay served that passed, takes the
    rest from the source, ends bit-exact, and skips that relay for the next versions."""
    rng = np.random.default_rng(2)
    genuine, forged = _xxh3_twins(rng)
    tensors = {"weights": np.frombuffer(rng.bytes(BUCKET) + genuine + rng.bytes(2 * BUCKET), dtype=np.uint8).copy()}
    secret = b"forged-bucket-tests-secret-01234"
    with (
        DensePublisher(secret=secret, host="127.0.0.1", port=0, bucket_bytes=BUCKET) as source,
        DensePublisher(secret=secret, host="127.0.0.1", port=0, bucket_bytes=BUCKET) as relay,
    ):
        announce = source.publish(1, 0, tensors)
        relay_source = relay.publish(1, 0, tensors).source
        served = relay._store.get(1)
        assert served is not None
        served.flat.stream[BUCKET : 2 * BUCKET] = np.frombuffer(forged, dtype=np.uint8)
        fetcher = WeightFetcher(secret, "victim", timeout=5.0)
        fetched = await fetcher.fetch(announce, -1, tmp_path / "v1.bin", relay=relay_source)
        assert_same(load_arrays(fetched), tensors)
        assert not fetcher.relays.usable(relay_source, time.monotonic())


async def test_a_forged_patch_from_a_relay_is_rolled_back_and_the_version_taken_from_the_source() -> None:
    """The engine path: versions applied in place as patches. The relay's patch turns the held bucket into
    the twin; the in-place commit's hash refuses it and rolls the version back, the bucket is pulled again
    dense (the relay's twin refused again), then from the source. The receiver ends on the genuine version."""
    rng = np.random.default_rng(3)
    genuine, forged = _xxh3_twins(rng)
    v1 = np.frombuffer(rng.bytes(BUCKET) + genuine + rng.bytes(2 * BUCKET), dtype=np.uint8).copy()
    v0 = v1.copy()
    v0[rng.choice(v0.size, 400, replace=False)] ^= 1  # the step before: a few bytes differ in every bucket
    secret = b"forged-bucket-tests-secret-01234"
    with (
        SparsePublisher(secret=secret, host="127.0.0.1", port=0, bucket_bytes=BUCKET) as source,
        SparsePublisher(secret=secret, host="127.0.0.1", port=0, bucket_bytes=BUCKET) as relay,
    ):
        fetcher, target = WeightFetcher(secret, "victim", timeout=5.0), ResidentWeights()
        await fetcher.fetch_into(source.publish(0, 0, {"weights": v0}), target)
        relay.publish(0, 0, {"weights": v0})
        announce = source.publish(1, 1, {"weights": v1})
        relay_source = relay.publish(1, 1, {"weights": v1}).source
        served = relay._store.get(1)
        assert served is not None
        served.flat.stream[BUCKET : 2 * BUCKET] = np.frombuffer(forged, dtype=np.uint8)
        fetched = await fetcher.fetch_into(announce, target, relay=relay_source)
        assert target.version == 1 and fetched.patched_buckets > 0
        assert_same(target.arrays(), {"weights": v1})
        assert not fetcher.relays.usable(relay_source, time.monotonic())
