"""The shard intake's refusals: every bad publish from a trainer group fails whole, for every rank, with
an error naming the fix, and publishes nothing (real sockets; ranks are threads of this process)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rose_core.protocol.auth import Signer, weights_key
from rose_core.protocol.messages import Hello, ShardAccepted, ShardIntakeReply, ShardOffer, Welcome
from rose_core.protocol.wire import Framer
from rose_core.support.errors import ConfigError, RoseError
from rose_transfer import DensePublisher, ShardPublisher, TransferError, flatten
from rose_transfer.version.manifest import layout
from rose_transfer.wire.connect import tcp_connect

from .conftest import SECRET
from .test_rejections import _exchange, _frame, _rejected

SPECS = {"up.weight": "column", "down.weight": "row"}


def _rank_state(rank: int, version: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(100 * version + rank)
    return {
        "up.weight": rng.standard_normal((8, 6), dtype=np.float32),
        "down.weight": rng.standard_normal((6, 4), dtype=np.float32),
        "norm.weight": np.full(6, float(version), dtype=np.float32),
    }


@pytest.fixture
def publisher() -> Iterator[DensePublisher]:
    with DensePublisher(secret=SECRET, host="127.0.0.1", port=0, bucket_bytes=256) as pub:
        yield pub


def _publish(
    intake: str, parts: Mapping[int, tuple[dict[str, Any], Mapping[str, str]]], version: int = 1, ranks: int = 2
) -> dict[int, Any]:
    """Each rank of ``parts`` publishes its (tensors, specs) of ``version`` in its own thread: its
    announcement, or the exception it raised."""
    out: dict[int, Any] = {}

    def run(rank: int) -> None:
        tensors, specs = parts[rank]
        with ShardPublisher(secret=SECRET, intake=intake, rank=rank, ranks=ranks, timeout=10.0) as pub:
            try:
                out[rank] = pub.publish_shard(version, version, tensors, specs)
            except RoseError as exc:
                out[rank] = exc

    threads = [threading.Thread(target=run, args=(rank,)) for rank in parts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return out


def _good(version: int = 1) -> dict[int, tuple[dict[str, Any], Mapping[str, str]]]:
    return {rank: (_rank_state(rank, version), SPECS) for rank in (0, 1)}


def _refused(results: dict[int, Any], *fragments: str) -> None:
    for rank, result in results.items():
        assert isinstance(result, TransferError), (rank, result)
        for fragment in fragments:
            assert fragment in str(result), (rank, str(result))


def test_a_good_group_publishes_the_whole_version(publisher: DensePublisher) -> None:
    results = _publish(publisher.open_shard_intake(2, timeout=5.0), _good())
    assert results[0] == results[1] and results[0].version == 1
    want = {
        "up.weight": np.concatenate([_rank_state(0)["up.weight"], _rank_state(1)["up.weight"]]),
        "down.weight": np.concatenate([_rank_state(0)["down.weight"], _rank_state(1)["down.weight"]], axis=1),
        "norm.weight": _rank_state(0)["norm.weight"],
    }
    stream = publisher.stream(1)
    assert np.array_equal(stream, flatten(want, version=1, bucket_bytes=256, shards=SPECS).stream)


def test_specs_that_differ_across_ranks_fail_every_rank(publisher: DensePublisher) -> None:
    parts = _good()
    parts[1] = (parts[1][0], {**SPECS, "down.weight": "column"})
    results = _publish(publisher.open_shard_intake(2, timeout=5.0), parts)
    _refused(results, "down.weight is sharded 'row' on rank 0 but 'column' on rank 1", "same specs on every rank")
    assert publisher.versions() == []


def test_a_tensor_missing_on_one_rank_is_named(publisher: DensePublisher) -> None:
    parts = _good()
    del parts[1][0]["norm.weight"]
    results = _publish(publisher.open_shard_intake(2, timeout=5.0), parts)
    _refused(results, "lacks ['norm.weight']", "every rank publishes")


def test_a_shard_of_the_wrong_shape_for_its_spec_is_named(publisher: DensePublisher) -> None:
    parts = _good()
    parts[1][0]["down.weight"] = np.zeros((6, 3), dtype=np.float32)  # a row shard of [6, 8] is [6, 4]
    results = _publish(publisher.open_shard_intake(2, timeout=5.0), parts)
    _refused(results, "down.weight: rank 1 holds shape [6, 3]", "fix the shard spec")


def test_replicated_tensors_that_differ_in_shape_are_named(publisher: DensePublisher) -> None:
    parts = _good()
    parts[1][0]["norm.weight"] = np.ones(5, dtype=np.float32)
    _refused(_publish(publisher.open_shard_intake(2, timeout=5.0), parts), "norm.weight is replicated", "shard spec")


def test_a_rank_that_never_arrives_fails_the_version_after_the_timeout(publisher: DensePublisher) -> None:
    intake = publisher.open_shard_intake(2, timeout=0.5)
    results = _publish(intake, {0: _good()[0]})
    _refused(results, "ranks [1] of 2 did not offer weight version 1 within 0.5 s", "every rank")
    assert publisher.versions() == []
    again = _publish(intake, _good())  # nothing was kept: the whole group can publish it again
    assert again[0].version == again[1].version == 1


def test_a_version_published_twice_is_refused(publisher: DensePublisher) -> None:
    intake = publisher.open_shard_intake(2, timeout=5.0)
    assert _publish(intake, _good())[0].version == 1
    _refused(_publish(intake, _good()), "weight version 1 is not newer than the published 1", "once")
    assert publisher.versions() == [1]


def test_two_processes_claiming_one_rank_are_refused(publisher: DensePublisher) -> None:
    intake = publisher.open_shard_intake(2, timeout=5.0)
    out: dict[int, Any] = {}

    def run(slot: int) -> None:
        with ShardPublisher(secret=SECRET, intake=intake, rank=0, ranks=2, timeout=10.0) as pub:
            try:
                out[slot] = pub.publish_shard(1, 1, _rank_state(0), SPECS)
            except RoseError as exc:
                out[slot] = exc

    threads = [threading.Thread(target=run, args=(slot,)) for slot in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    _refused(out, "two processes offered rank 0 of weight version 1", "its own rank")


def test_a_group_of_another_size_is_refused(publisher: DensePublisher) -> None:
    intake = publisher.open_shard_intake(2, timeout=5.0)
    results = _publish(intake, {0: _good()[0]}, ranks=4)
    _refused(results, "a group of 4 ranks, this intake gathers 2", "tensor-parallel size")


def test_local_mistakes_fail_before_connecting(publisher: DensePublisher) -> None:
    with pytest.raises(ConfigError, match="rank 2 is outside a tensor-parallel group of 2"):
        ShardPublisher(secret=SECRET, intake="tcp://127.0.0.1:1", rank=2, ranks=2)
    with ShardPublisher(secret=SECRET, intake="tcp://127.0.0.1:1", rank=0, ranks=2) as pub:
        with pytest.raises(ConfigError, match=r"shard specs name \['lm_head.weight'\]"):
            pub.publish_shard(1, 1, _rank_state(0), {"lm_head.weight": "vocab"})
        with pytest.raises(RoseError, match=r"up\.weight: unknown shard kind 'columns'"):
            pub.publish_shard(1, 1, _rank_state(0), {"up.weight": "columns"})


def test_an_unreachable_intake_is_named() -> None:
    with socket.socket() as unused:  # bound, never listening
        unused.bind(("127.0.0.1", 0))
        intake = f"tcp://127.0.0.1:{unused.getsockname()[1]}"
        pub = ShardPublisher(secret=SECRET, intake=intake, rank=0, ranks=1, timeout=2.0)
        with pub, pytest.raises(TransferError, match="shard intake runs and is reachable"):
            pub.publish_shard(1, 1, _rank_state(0), SPECS)


def test_a_rank_that_stops_sending_fails_the_version_for_every_rank(publisher: DensePublisher) -> None:
    intake = publisher.open_shard_intake(2, timeout=0.5)
    entries, _ = layout(_rank_state(1), SPECS)
    offer = ShardOffer(version=1, step=1, rank=1, ranks=2, tensors=entries)
    silent = threading.Thread(target=asyncio.run, args=(_offer_then_fall_silent(intake, offer),))
    silent.start()
    results = _publish(intake, {0: _good()[0]})
    silent.join(10)
    _refused(results, "rank 1 stopped sending weight version 1 (no bytes from the peer for 0.5 s)", "again")
    assert publisher.versions() == []


async def _offer_then_fall_silent(intake: str, offer: ShardOffer) -> None:
    """A rank that offers its part, is accepted, and never sends a byte of it."""
    conn = await tcp_connect(intake, 5.0)
    framer = Framer(Signer(SECRET), ShardIntakeReply)
    try:
        await conn.send(framer.seal(Hello(peer_id="silent-rank", kind="weights")))
        assert isinstance(framer.open(await conn.recv(1 << 20)), Welcome)
        await conn.send(framer.seal(offer))
        assert isinstance(framer.open(await conn.recv(1 << 20)), ShardAccepted)
        await asyncio.sleep(2.0)
    finally:
        conn.close()


def test_an_intake_keyed_with_the_secret_refuses_a_rank_holding_only_the_weights_key() -> None:
    """What `rose run` sets up: the publisher serves on the weights key (every executor holds it) and its intake
    keeps the secret, so an executor's key cannot publish a version; the trainer's secret can."""
    with DensePublisher(secret=weights_key(SECRET), host="127.0.0.1", port=0, bucket_bytes=256) as publisher:
        intake = publisher.open_shard_intake(1, timeout=2.0, key=SECRET)
        executor = ShardPublisher(secret=weights_key(SECRET), intake=intake, rank=0, ranks=1, timeout=2.0)
        with executor, pytest.raises(TransferError):
            executor.publish_shard(1, 1, _rank_state(0), SPECS)
        assert publisher.versions() == []
        with ShardPublisher(secret=SECRET, intake=intake, rank=0, ranks=1, timeout=10.0) as trainer:
            announce = trainer.publish_shard(1, 1, _rank_state(0), SPECS)
        assert announce.version == 1 and publisher.versions() == [1]


_garbage = st.one_of(
    st.binary(max_size=4096),
    st.lists(st.binary(max_size=512), min_size=1, max_size=20).map(_frame),
    st.lists(st.binary(max_size=64), min_size=3, max_size=4).map(lambda fs: _frame([b"ROSE\x00\x03\x00", *fs[1:]])),
)


@pytest.fixture(scope="module")
def intake_port() -> Iterator[int]:
    """One intake for every fuzzed example."""
    with DensePublisher(secret=SECRET, host="127.0.0.1", port=0, bucket_bytes=256) as pub:
        yield int(pub.open_shard_intake(1, timeout=10.0).rsplit(":", 1)[1])


@settings(max_examples=40, deadline=None)
@given(payload=_garbage)
def test_garbage_never_stops_the_intake(intake_port: int, payload: bytes) -> None:
    port = intake_port
    _exchange(port, payload)
    hello = Framer(Signer(SECRET), ShardIntakeReply).seal(Hello(peer_id="trainer-rank-0", kind="weights"))
    assert b"welcome" in _exchange(port, _frame([bytes(f) for f in hello]))  # still answers a rank


def test_refusals_before_authentication_are_counted_and_a_rank_still_publishes(publisher: DensePublisher) -> None:
    """Garbage, a bad signature and an oversized first frame are each refused and counted; connections over the
    cap of those still before their Hello are closed as they arrive (``over_capacity``); then a rank publishes."""
    intake = publisher.open_shard_intake(1, timeout=10.0)
    port = int(intake.rsplit(":", 1)[1])
    before = {r: _rejected(r) for r in ("malformed", "unauthenticated", "oversized", "over_capacity")}
    _exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    forged = Framer(Signer(b"not-the-secret-0123456789abcdef"), ShardIntakeReply).seal(Hello(peer_id="x", kind="weights"))
    _exchange(port, _frame([bytes(f) for f in forged]))
    _exchange(port, struct.pack(">IQ", 1, 1 << 20))  # one frame of 1 MiB announced before any Hello
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(64)]  # the cap: 64 before their Hello
    try:
        closed_at_once = False
        for _ in range(50):  # until the intake has taken the 64 (accepting is asynchronous)
            with socket.create_connection(("127.0.0.1", port)) as extra:
                extra.settimeout(0.5)
                with contextlib.suppress(TimeoutError):
                    closed_at_once = extra.recv(1) == b""
            if closed_at_once:
                break
        assert closed_at_once
    finally:
        for sock in idle:
            sock.close()
    for reason, count in before.items():
        assert _rejected(reason) > count, reason
    for _ in range(100):  # until the intake has seen the 64 end (it notices each end on its own loop)
        with socket.create_connection(("127.0.0.1", port)) as probe:
            probe.settimeout(0.2)
            try:
                if probe.recv(1) == b"":  # closed at once: still at the cap
                    continue
            except TimeoutError:
                break  # taken: room again
            except OSError:
                continue
    with ShardPublisher(secret=SECRET, intake=intake, rank=0, ranks=1, timeout=10.0) as rank:
        assert rank.publish_shard(1, 1, _rank_state(0), SPECS).version == 1
