"""The sparse codec: bit-exact patches of new values, the smallest encoding chosen, corrupt input refused."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rose_transfer.codec.bucket_codec import DENSE, PATCH, CodecError, decode_bucket, encode_bucket
from rose_transfer.codec.patch_encoder import build_patch
from rose_transfer.codec.sparse_patch import HEADER, apply_patch, parse_patch, patch_blocks
from rose_transfer.codec.varint import VarintError, decode_varints, encode_varints
from rose_transfer.version.manifest import bucket_checksum


def _model_bucket(dtype: str, n: int, fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A base bucket of ``dtype`` bits and a new one with ``fraction`` of its elements changed."""
    rng = np.random.default_rng(seed)
    word = {"bfloat16": np.uint16, "float16": np.uint16, "float32": np.uint32}[dtype]
    base = rng.integers(0, np.iinfo(word).max, n, dtype=word, endpoint=True)
    new = base.copy()
    changed = rng.choice(n, int(n * fraction), replace=False)
    new[changed] ^= rng.integers(1, 1 << 8, changed.size).astype(word)  # small mantissa moves
    return base.view(np.uint8), new.view(np.uint8)


@pytest.mark.parametrize(("dtype", "word_bytes"), [("bfloat16", 2), ("float16", 2), ("float32", 4)])
def test_one_percent_changed_is_a_small_exact_patch(dtype: str, word_bytes: int) -> None:
    base, new = _model_bucket(dtype, 200_003, 0.01)
    encoded = encode_bucket(base, new, word_bytes=word_bytes)
    assert encoded.encoding == PATCH
    assert encoded.wire_bytes < new.nbytes * 0.02 + 4000
    assert decode_bucket(encoded.encoding, encoded.payload, base).tobytes() == new.tobytes()


def test_the_smallest_position_coding_and_dense_fallback_are_chosen() -> None:
    base, new = _model_bucket("bfloat16", 80_000, 0.01)
    varint = encode_bucket(base, new)
    base, new = _model_bucket("bfloat16", 80_000, 0.30)
    bitmap = encode_bucket(base, new)
    assert decode_bucket(bitmap.encoding, bitmap.payload, base).tobytes() == new.tobytes()
    base, new = _model_bucket("bfloat16", 80_000, 0.95)  # 95% values + a 1/16 bitmap > dense
    dense = encode_bucket(base, new)
    assert varint.encoding == bitmap.encoding == PATCH
    bitmap_bytes = HEADER.size + 80_000 // 8 + int(80_000 * 0.30) * 2
    assert bitmap.wire_bytes == bitmap_bytes  # bitmap: smaller than varints at 30%
    assert varint.wire_bytes < HEADER.size + 80_000 * 0.01 * 2 + 80_000 // 8  # varints: smaller at 1%
    assert dense.encoding == DENSE and dense.wire_bytes == new.nbytes


@pytest.mark.parametrize(("dense_share", "kind"), [(0.2, 0), (0.45, 1)])  # 0: varint positions, 1: bitmap
def test_buckets_mixing_dense_and_sparse_stretches(dense_share: float, kind: int) -> None:
    """At 0.45 the scan passes more changes than the bitmap has bytes halfway and switches to bits."""
    rng = np.random.default_rng(3)
    base = rng.integers(0, 1 << 16, 64 * 4096, dtype=np.uint16)
    new = base.copy()
    for chunk in range(64):
        share = dense_share if chunk % 2 else 0.01  # every other chunk dense
        where = chunk * 4096 + rng.choice(4096, int(4096 * share), replace=False)
        new[where] ^= 1
    encoded = encode_bucket(base.view(np.uint8), new.view(np.uint8))
    assert encoded.encoding == PATCH
    assert HEADER.unpack(encoded.payload[: HEADER.size].tobytes())[3] == kind
    assert decode_bucket(PATCH, encoded.payload, base.view(np.uint8)).tobytes() == new.tobytes()


def test_gap_codings_tying_with_the_bitmap_is_a_patch() -> None:
    """Every 8th bf16 word changed: a dense chunk (half its uint64 words differ) whose gap codings'
    lower bound (one byte per change) ties exactly with the bitmap (one bit per word). The tie goes to
    byte gaps, so their exact size must be known (it used to raise RuntimeError)."""
    n = 80_000
    base = np.random.default_rng(5).integers(0, 1 << 16, n, dtype=np.uint16)
    new = base.copy()
    new[::8] ^= 1
    payload = build_patch(base.view(np.uint8), new.view(np.uint8), 2)
    assert payload is not None
    _, _, _, kind, _, count, position_bytes = HEADER.unpack(payload[: HEADER.size].tobytes())
    assert (count, position_bytes) == (n // 8, n // 8)  # the tie: gaps of 7, one byte each == the bitmap
    assert kind == 2  # byte gaps, which win ties
    out = np.empty(2 * n, dtype=np.uint8)
    apply_patch(payload, base.view(np.uint8), out)
    assert out.tobytes() == new.tobytes()
    encoded = encode_bucket(base.view(np.uint8), new.view(np.uint8))
    assert encoded.encoding == PATCH
    assert decode_bucket(PATCH, encoded.payload, base.view(np.uint8)).tobytes() == new.tobytes()


def test_unchanged_bucket_is_a_header() -> None:
    base, _ = _model_bucket("float32", 1000, 0)
    encoded = encode_bucket(base, base.copy(), word_bytes=4)
    assert (encoded.encoding, encoded.wire_bytes) == (PATCH, HEADER.size)
    assert decode_bucket(PATCH, encoded.payload, base).tobytes() == base.tobytes()


def test_nan_payloads_and_signed_zeros_are_exact() -> None:
    base = np.array([0.0, 1.0, np.nan, 2.0] * 100, dtype=np.float32)
    new = base.copy()
    new[0] = -0.0
    new.view(np.uint32)[2] = 0x7FC00001  # another NaN payload
    encoded = encode_bucket(base.view(np.uint8), new.view(np.uint8), word_bytes=4)
    assert encoded.encoding == PATCH
    out = decode_bucket(encoded.encoding, encoded.payload, base.view(np.uint8))
    assert out.tobytes() == new.tobytes()


def test_patch_in_place_over_the_base() -> None:
    base, new = _model_bucket("bfloat16", 10_000, 0.02)
    held = base.copy()
    encoded = encode_bucket(base, new)
    assert decode_bucket(encoded.encoding, encoded.payload, held, out=held) is held
    assert held.tobytes() == new.tobytes()


def test_without_a_base_a_bucket_travels_dense() -> None:
    _, new = _model_bucket("bfloat16", 1000, 0.01)
    encoded = encode_bucket(None, new)
    assert encoded.encoding == DENSE
    assert decode_bucket(DENSE, encoded.payload, None).tobytes() == new.tobytes()
    with pytest.raises(CodecError, match="needs the base version"):
        decode_bucket(PATCH, encode_bucket(new, new).payload, None)


def test_zstd_is_kept_only_when_it_saves_bytes() -> None:
    pytest.importorskip("zstandard")
    base = np.zeros(100_000, dtype=np.uint16).view(np.uint8)
    new = base.copy().view(np.uint16)
    new[::50] = 7
    encoded = encode_bucket(base, new.view(np.uint8), compress=True)
    assert encoded.encoding == "patch+zstd"
    assert decode_bucket(encoded.encoding, encoded.payload, base).tobytes() == new.tobytes()
    noise = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8)
    assert encode_bucket(None, noise, compress=True).encoding == DENSE
    with pytest.raises(CodecError, match="compressed bucket is corrupt"):
        decode_bucket("patch+zstd", b"not zstd at all", base)


def test_unknown_encoding_names_the_fix() -> None:
    with pytest.raises(CodecError, match="install the same rose-transfer"):
        decode_bucket("delta", b"", None)


@settings(max_examples=150, deadline=None)
@given(
    data=st.binary(min_size=0, max_size=3000),
    word_bytes=st.sampled_from([1, 2, 4, 8]),
    edits=st.lists(st.tuples(st.integers(0, 2999), st.integers(0, 255)), max_size=200),
)
def test_any_edit_round_trips_bit_exact(data: bytes, word_bytes: int, edits: list[tuple[int, int]]) -> None:
    base = np.frombuffer(data, dtype=np.uint8)
    new = base.copy()
    for position, value in edits:
        if position < new.size:
            new[position] = value
    encoded = encode_bucket(base, new, word_bytes=word_bytes)
    assert encoded.wire_bytes <= max(new.nbytes, HEADER.size)
    assert decode_bucket(encoded.encoding, encoded.payload, base).tobytes() == new.tobytes()
    if encoded.encoding == PATCH:
        words = new.nbytes // word_bytes
        old_w = base[: words * word_bytes].reshape(-1, word_bytes)
        new_w = new[: words * word_bytes].reshape(-1, word_bytes)
        blocks = list(patch_blocks(parse_patch(encoded.payload, base.nbytes)))
        written = np.concatenate([p.copy() for p, _ in blocks]) if blocks else np.empty(0, dtype=np.int64)
        assert written.tolist() == np.flatnonzero((old_w != new_w).any(axis=1)).tolist()  # exactly the changed words


@settings(max_examples=200, deadline=None)
@given(flip=st.integers(0, 10_000), value=st.integers(1, 255), cut=st.integers(0, 50))
def test_corrupt_patches_raise_codec_error_or_decode(flip: int, value: int, cut: int) -> None:
    """A corrupt payload is refused with CodecError or decodes to some bucket (the checksum then
    catches it); it never raises anything else or writes outside the bucket."""
    base, new = _model_bucket("bfloat16", 4000, 0.05, seed=1)
    payload = bytearray(encode_bucket(base, new).payload.tobytes())
    payload[flip % len(payload)] ^= value
    if cut:
        del payload[-cut:]
    out = np.zeros(base.nbytes + 16, dtype=np.uint8)
    with contextlib.suppress(CodecError):
        decode_bucket(PATCH, bytes(payload), base, out=out[: base.nbytes])
    assert not out[base.nbytes :].any()


@given(st.lists(st.integers(0, 2**64 - 1), max_size=300))
def test_varints_round_trip(values: list[int]) -> None:
    array = np.array(values, dtype=np.uint64)
    assert decode_varints(encode_varints(array), len(values)).tolist() == values


def test_varint_errors() -> None:
    with pytest.raises(VarintError):
        decode_varints(np.array([0x80, 0x80], dtype=np.uint8), 1)
    with pytest.raises(VarintError):
        decode_varints(np.array([1, 2], dtype=np.uint8), 1)
    with pytest.raises(VarintError, match="longer than 10"):
        decode_varints(np.array([0xFF] * 11 + [1], dtype=np.uint8), 1)


def _gaps_patch(n_words: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    base = rng.integers(0, 1 << 16, n_words, dtype=np.uint16)
    new = base.copy()
    new[positions] ^= 1
    return base.view(np.uint8), new.view(np.uint8), encode_bucket(base.view(np.uint8), new.view(np.uint8)).payload


def test_byte_gaps_escape_long_gaps_and_are_chosen_at_rl_sparsity() -> None:
    rng = np.random.default_rng(5)
    dense_run = np.flatnonzero(rng.random(300_000) < 0.03)  # RL-step sparsity: byte gaps are smallest
    positions = np.concatenate([dense_run, [400_000, 2_000_000, 2_000_001]])  # and a few gaps >= 255
    base, new, payload = _gaps_patch(2_100_000, positions)
    assert HEADER.unpack(payload[: HEADER.size].tobytes())[3] == 2
    escaped = np.count_nonzero(np.diff(positions, prepend=-1) - 1 >= 255)
    assert escaped >= 2
    assert payload.nbytes == HEADER.size + positions.size * 3 + escaped * 4  # a code and a value each
    assert decode_bucket(PATCH, payload, base).tobytes() == new.tobytes()


def test_byte_gaps_refuse_miscounted_escapes_and_positions_past_the_bucket() -> None:
    base, _, payload = _gaps_patch(100_000, np.array([10, 50_000, 99_999]))
    codes_at = HEADER.size
    for corrupt in (lambda p: p.__setitem__(codes_at, 255), lambda p: p.__setitem__(codes_at + 2, 254)):
        bad = payload.copy()
        corrupt(bad)
        with pytest.raises(CodecError):
            decode_bucket(PATCH, bad, base)


def test_a_patch_failing_midway_rolls_back_every_block_it_wrote() -> None:
    """Positions come in one reused buffer block by block; the rollback decodes them again."""
    from rose_transfer.codec.sparse_patch import PatchError
    from rose_transfer.resident.in_place_patch import patch_in_place
    from rose_transfer.resident.undo_log import UndoLog

    n_words = 4_000_000
    positions = np.flatnonzero(np.random.default_rng(9).random(n_words) < 0.02)  # about 5 blocks
    base, new, payload = _gaps_patch(n_words, positions)
    undo, held = UndoLog(), base.copy()
    assert patch_in_place(payload, held, undo) == bucket_checksum(new)
    undo.rollback()
    assert held.tobytes() == base.tobytes()
    bad = payload.copy()
    bad[HEADER.size + positions.size - 2 : HEADER.size + positions.size] = 254  # the last block runs past the end
    undo.start(0)
    with pytest.raises(PatchError):
        patch_in_place(bad, held, undo)
    assert held.tobytes() != base.tobytes()  # earlier blocks were written
    undo.rollback()
    assert held.tobytes() == base.tobytes()
