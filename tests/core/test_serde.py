from __future__ import annotations

import msgspec
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rose_core.protocol import messages as m
from rose_core.protocol.serde import Decoder, Encoder, decode, encode
from rose_core.support.errors import ProtocolError


def _turn(tokens: np.ndarray) -> m.TurnRequest:
    return m.TurnRequest(
        turn_id="t1", trajectory_id="tr", attempt=2, prompt_token_ids=tokens,
        sampling=m.SamplingParams(max_tokens=4, seed=7), min_version=1, max_version=3, step=5,
    )


def test_large_arrays_travel_as_zero_copy_frames() -> None:
    tokens = np.arange(10_000, dtype=np.int32)
    frames = encode(_turn(tokens))
    assert len(frames) == 2
    assert memoryview(frames[1]).nbytes == tokens.nbytes
    assert np.shares_memory(np.frombuffer(frames[1], dtype=np.int32), tokens)
    back = decode(frames)
    assert isinstance(back, m.TurnRequest)
    assert back.prompt_token_ids.dtype == np.int32
    np.testing.assert_array_equal(back.prompt_token_ids, tokens)
    assert np.shares_memory(back.prompt_token_ids, np.frombuffer(frames[1], dtype=np.uint8))


def test_small_arrays_travel_inline() -> None:
    frames = encode(_turn(np.array([1, 2, 3], dtype=np.int64)))
    assert len(frames) == 1
    assert decode(frames).prompt_token_ids.tolist() == [1, 2, 3]


@given(
    st.sampled_from(["int8", "int16", "int32", "int64", "uint8", "float16", "float32", "float64"]),
    st.lists(st.integers(0, 5), min_size=0, max_size=3),
)
def test_any_numeric_array_round_trips(dtype: str, shape: list[int]) -> None:
    arr = (np.arange(int(np.prod(shape)) if shape else 1) % 100).astype(dtype).reshape(shape)
    result = m.TurnResult(
        turn_id="t", trajectory_id="x", attempt=0, executor_id="e", weight_version=1,
        output_token_ids=arr, output_logprobs=arr, finish_reason="length",
    )
    back = decode(encode(result))
    assert back.output_token_ids.dtype == arr.dtype
    assert back.output_token_ids.shape == arr.shape
    np.testing.assert_array_equal(back.output_logprobs, arr)


def test_every_message_type_round_trips_with_defaults() -> None:
    msgs = [
        m.Hello(peer_id="p", kind="executor"),
        m.Welcome(controller_id="c"),
        m.Register(executor_id="e", role="serving", device="cpu", host="h", memory_bytes=1,
                   models=[m.ModelInfo(name="x", purpose="rollout")]),
        m.Heartbeat(executor_id="e", seq=1, sent_at=0.5, load=m.LoadReport(warm_trajectories=["a"])),
        m.TurnAborted(turn_id="t", trajectory_id="x", attempt=0, executor_id="e", reason="memory"),
        m.WeightAnnounce(version=2, step=1, source="tcp://h:1"),
        m.WeightApplied(executor_id="e", version=2, seconds=0.1, bytes_received=10),
        m.StepStarted(step=1, weight_version=1),
        m.Shutdown(reason="done"),
        m.Goodbye(peer_id="e"),
        m.ErrorReport(code="x", message="y"),
        m.CancelTurn(turn_id="t", attempt=1),
        m.StatusSnapshot(controller_id="c", time=1.0, executors=[], step=None, slo_ttft_ms=1, slo_tpot_ms=1),
    ]
    enc, dec = Encoder(), Decoder()
    for msg in msgs:
        assert dec.decode(enc.encode(msg)) == msg


def test_unknown_type_and_malformed_are_told_apart() -> None:
    with pytest.raises(ProtocolError) as unknown:
        decode([msgspec.msgpack.encode({"type": "launch_missiles"})])
    assert unknown.value.reason == "unknown_type"
    with pytest.raises(ProtocolError) as missing:
        decode([msgspec.msgpack.encode({"type": "hello"})])
    assert missing.value.reason == "malformed"
    with pytest.raises(ProtocolError) as garbage:
        decode([b"\xc1\x00"])
    assert garbage.value.reason == "malformed"


def test_array_frame_that_lies_about_its_size_is_malformed() -> None:
    frames = encode(_turn(np.arange(1000, dtype=np.int32)))
    with pytest.raises(ProtocolError) as err:
        decode([frames[0], bytes(10)])
    assert err.value.reason == "malformed"
    with pytest.raises(ProtocolError):
        decode([frames[0]])


def test_object_dtype_is_refused() -> None:
    header = msgspec.msgpack.encode({
        "type": "turn_result", "turn_id": "t", "trajectory_id": "x", "attempt": 0, "executor_id": "e",
        "weight_version": 0, "output_token_ids": ["|O", [1], b"12345678"], "output_logprobs": ["<f4", [0], b""],
        "finish_reason": "stop",
    })
    with pytest.raises(ProtocolError):
        decode([header])


def test_appending_a_field_with_a_default_keeps_old_peers_decoding() -> None:
    class HelloV2(msgspec.Struct, tag="hello", tag_field="type", kw_only=True):
        peer_id: str
        kind: str
        protocol_version: int = m.PROTOCOL_VERSION
        software: str = ""
        new_field: int = 7

    data = msgspec.msgpack.encode(HelloV2(peer_id="p", kind="observer"))
    assert decode([data]) == m.Hello(peer_id="p", kind="observer")
