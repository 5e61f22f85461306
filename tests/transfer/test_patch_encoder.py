"""The compiled patch encoder: byte for byte the patch a plain numpy reading of the format gives, for
contiguous buckets and for buckets scanned in runs straight from two streams (a shard view's rows)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rose_core.protocol.messages import ShardView
from rose_transfer.codec.bucket_codec import PATCH, decode_bucket, encode_bucket
from rose_transfer.codec.patch_encoder import build_patch, build_patch_runs, prepare
from rose_transfer.codec.scan_buffers import scan_buffers
from rose_transfer.codec.sparse_patch import HEADER
from rose_transfer.codec.varint import encode_varints
from rose_transfer.codec.words import word_view
from rose_transfer.plan.shard_inference import infer_shard_spec
from rose_transfer.plan.view_cut import view_cut, view_manifest
from rose_transfer.serve.bucket_patch import patch_reply
from rose_transfer.serve.served_view import ServedView
from rose_transfer.version.manifest import flatten
from rose_transfer.wire.sealer import Sealer


def reference_patch(base: np.ndarray, new: np.ndarray, word_bytes: int) -> bytes | None:
    """The format read plainly: every changed word, each coding's exact size, ties to byte gaps then
    varints, None unless smaller than the bucket."""
    old_w, new_w = word_view(base, word_bytes), word_view(new, word_bytes)
    positions = np.flatnonzero(old_w != new_w)
    gaps = np.diff(positions, prepend=-1) - 1
    n_words = new_w.size
    tail = new[n_words * word_bytes :].tobytes()
    byte_gaps = bytes(np.minimum(gaps, 255).astype(np.uint8)) + gaps[gaps >= 255].astype("<u4").tobytes()
    bitmap = np.zeros(n_words, dtype=bool)
    bitmap[positions] = True
    codings = {2: byte_gaps, 0: encode_varints(gaps).tobytes(), 1: np.packbits(bitmap, bitorder="little").tobytes()}
    kind = min(codings, key=lambda k: len(codings[k]))
    values = new_w[positions].tobytes()
    header = HEADER.pack(b"RSPB", 1, word_bytes, kind, new.nbytes, positions.size, len(codings[kind]))
    payload = header + codings[kind] + values + tail
    return payload if len(payload) < new.nbytes else None


def _pair(data: st.DataObject, word_bytes: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    base = np.frombuffer(data.draw(st.binary(min_size=n, max_size=n)), dtype=np.uint8).copy()
    new = base.copy()
    pattern = data.draw(st.sampled_from(["random", "every", "block", "none", "all"]))
    words = n // word_bytes
    if pattern == "random" and words:
        fraction = data.draw(st.sampled_from([0.001, 0.01, 0.03, 0.1, 0.13, 0.3, 0.6, 0.94, 0.97]))
        rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
        picked = rng.choice(words, int(words * fraction), replace=False)
        new[picked * word_bytes] ^= 1
    elif pattern == "every" and words:
        new[:: data.draw(st.integers(1, 300)) * word_bytes] ^= 0x80
    elif pattern == "block":
        start = data.draw(st.integers(0, n))
        new[start : start + data.draw(st.integers(0, n))] ^= 0xFF
    elif pattern == "all":
        new ^= 0x5A
    if n % word_bytes and data.draw(st.booleans()):
        new[-1] ^= 3  # the raw tail
    return base, new


@settings(max_examples=300, deadline=None)
@given(data=st.data(), word_bytes=st.sampled_from([1, 2, 4, 8]), n=st.integers(0, 20_000))
def test_the_compiled_encoder_writes_the_reference_patch(data: st.DataObject, word_bytes: int, n: int) -> None:
    base, new = _pair(data, word_bytes, n)
    patch = build_patch(base, new, word_bytes)
    want = reference_patch(base, new, word_bytes)
    assert (None if patch is None else patch.tobytes()) == want
    encoded = encode_bucket(base, new, word_bytes=word_bytes)
    assert decode_bucket(encoded.encoding, encoded.payload, base).tobytes() == new.tobytes()


def _runs_and_bucket(data: st.DataObject, stream_words: int) -> tuple[np.ndarray, int]:
    """Rows in bucket order, with gaps between them (padding), read from anywhere in the stream."""
    rows, dst = [], 0
    for _ in range(data.draw(st.integers(0, 40))):
        dst += data.draw(st.integers(0, 9))
        n = data.draw(st.integers(0, 300))
        if n > stream_words:
            break
        rows.append((data.draw(st.integers(0, stream_words - n)), dst, n))
        dst += n
    bucket_words = dst + data.draw(st.integers(0, 9))
    return np.array(rows, dtype=np.int64).reshape(-1, 3), bucket_words


def _assembled(stream: np.ndarray, runs: np.ndarray, bucket_words: int, word_bytes: int) -> np.ndarray:
    words, out = word_view(stream, word_bytes), np.zeros(bucket_words, dtype=word_view(stream, word_bytes).dtype)
    for src, dst, n in runs:
        out[dst : dst + n] = words[src : src + n]
    return out.view(np.uint8)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), word_bytes=st.sampled_from([1, 2, 4, 8]), stream_words=st.integers(1, 3000))
def test_a_bucket_scanned_in_runs_is_the_patch_of_the_bucket_cut_first(
    data: st.DataObject, word_bytes: int, stream_words: int
) -> None:
    base, new = _pair(data, word_bytes, stream_words * word_bytes)
    runs, bucket_words = _runs_and_bucket(data, stream_words)
    cut_base, cut_new = _assembled(base, runs, bucket_words, word_bytes), _assembled(new, runs, bucket_words, word_bytes)
    got = build_patch_runs(base, new, runs, bucket_words * word_bytes, word_bytes)
    want = build_patch(cut_base, cut_new, word_bytes)
    assert (None if got is None else got.tobytes()) == (None if want is None else want.tobytes())


@pytest.mark.parametrize(
    ("runs", "message"),
    [
        ([[0, 0, -1]], "negative"),
        ([[95, 0, 10]], "past the streams"),
        ([[0, 95, 10]], "past the streams or the bucket"),
        ([[0, 10, 10], [20, 15, 5]], "increasing bucket order"),
        ([[0, 10, 10], [20, 0, 5]], "increasing bucket order"),
    ],
)
def test_runs_outside_the_streams_or_out_of_order_are_refused(runs: list[list[int]], message: str) -> None:
    stream = np.zeros(200, dtype=np.uint8)
    with pytest.raises(ValueError, match=message):
        build_patch_runs(stream, stream.copy(), np.array(runs, dtype=np.int64), 200, 2)
    with pytest.raises(ValueError, match="whole 2-byte words"):
        build_patch_runs(stream, stream.copy(), np.empty((0, 3), dtype=np.int64), 199, 2)


def _llama(step: int) -> dict[str, np.ndarray]:
    """A Llama-shaped bf16 state (as uint16 bits) whose every step changes about 3% of the words."""
    rng = np.random.default_rng(0)
    shapes = {
        "model.embed_tokens.weight": (1000, 96),
        "model.layers.0.self_attn.q_proj.weight": (96, 96),
        "model.layers.0.self_attn.k_proj.weight": (32, 96),
        "model.layers.0.self_attn.v_proj.weight": (32, 96),
        "model.layers.0.self_attn.o_proj.weight": (96, 96),
        "model.layers.0.mlp.gate_proj.weight": (256, 96),
        "model.layers.0.mlp.up_proj.weight": (256, 96),
        "model.layers.0.mlp.down_proj.weight": (96, 256),
        "model.layers.0.input_layernorm.weight": (96,),
        "model.norm.weight": (96,),
        "lm_head.weight": (1000, 96),
    }
    state = {name: rng.integers(0, 1 << 16, shape, dtype=np.uint16) for name, shape in shapes.items()}
    for _ in range(step):
        for tensor in state.values():
            flat = tensor.reshape(-1)
            flat[rng.random(flat.size) < 0.03] ^= 1
    return state


@pytest.mark.parametrize("bucket_bytes", [4096, 50_000, 1 << 20])
@pytest.mark.parametrize("rank", [0, 1])
def test_a_shard_views_patches_are_scanned_from_the_streams_and_equal_the_cut_ones(bucket_bytes: int, rank: int) -> None:
    """What the publisher serves a TP-2 engine: every bucket of a Llama-shaped view is scanned in runs
    (no cut), and each payload is the one the cut buckets give."""
    states = [_llama(step) for step in (0, 1)]
    shards = {name: infer_shard_spec(name, tensor.shape).to_text() for name, tensor in states[0].items()}
    base, new = (flatten(state, version=v, bucket_bytes=bucket_bytes, shards=shards) for v, state in enumerate(states))
    view = ShardView(tp=2, rank=rank)
    cut = view_cut(new.manifest, view)
    assert cut.total < new.manifest.total_bytes * 0.6  # a rank's half (and the replicated norms)
    scratch = np.empty(bucket_bytes, dtype=np.uint8)
    served_base = ServedView(view_manifest(base.manifest, cut, base.stream, scratch), base, cut)
    served_new = ServedView(view_manifest(new.manifest, cut, new.stream, scratch), new, cut)
    for index in range(cut.bucket_count()):
        assert cut.runs(index, 2) is not None, index  # the view path never cuts
        reply = patch_reply(served_base, served_new, index, lambda n: np.empty(n, dtype=np.uint8))
        old_bucket = cut.cut(index, base.stream, np.empty(bucket_bytes, dtype=np.uint8)).copy()
        new_bucket = cut.cut(index, new.stream, np.empty(bucket_bytes, dtype=np.uint8))
        expected = encode_bucket(old_bucket, new_bucket, word_bytes=2)
        assert (reply.encoding, bytes(reply.data)) == (expected.encoding, bytes(expected.payload)), index
        assert reply.encoding == PATCH


def test_prepare_sizes_a_threads_buffers_for_the_densest_patch_a_bucket_can_have() -> None:
    """A publisher readies its sealing threads when it serves a version (``TransferServer.prepare_for``): no
    patch of a bucket of that size allocates (or faults in) scan buffers later."""
    prepare(1 << 20, 2)
    held = scan_buffers(1, 1, 2, 1)
    rng = np.random.default_rng(4)
    base = rng.integers(0, 1 << 16, 1 << 19, dtype=np.uint16)
    for fraction in (0.03, 0.5, 0.93):  # sparse, past the bitmap switch, just short of dense
        new = base.copy()
        new[rng.random(base.size) < fraction] ^= 1
        assert build_patch(base.view(np.uint8), new.view(np.uint8), 2) is not None
        assert scan_buffers(1, 1, 2, 1) is held


def test_a_sealer_runs_a_task_once_on_each_of_its_threads() -> None:
    sealer = Sealer(b"s" * 32, workers=3)
    seen: list[int] = []
    try:
        for future in sealer.on_every_worker(lambda: seen.append(threading.get_ident())):
            future.result(10)
    finally:
        sealer.close()
    assert len(seen) == 3 and len(set(seen)) == 3
