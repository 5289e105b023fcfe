"""Unit tests of the sans-I/O codec (:mod:`tianji.runtime.codec`): no sockets, no event loop.

What is proven here:

* every event in :mod:`tianji.runtime.events` round-trips, arrays of every numeric dtype and layout
  included, bit-exact;
* encoding a C-contiguous array and decoding a frame copy nothing;
* every kind of malformed input raises :class:`BadFrame` with the documented ``reason``, and
  no other exception type ever escapes ``decode`` (property tests);
* nothing but registered event types and numeric dtypes can come off the wire (no pickle).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from codec_helpers import (
    DTYPES,
    RNG,
    array_ext,
    array_message,
    arrays_event,
    assert_same,
    round_trip,
    sample_events,
)

from tianji.runtime.codec import Codec, decode, encode
from tianji.runtime.errors import BadFrame
from tianji.runtime.events import (
    ArraysPublished,
    Event,
    Shutdown,
    event_types,
)


def test_every_declared_event_has_a_round_trip_sample() -> None:
    declared = {
        info.cls
        for info in event_types().values()
        if info.cls.__module__ in ("tianji.runtime.events", "tianji.rl.events")
    }
    sampled = {type(ev) for ev in sample_events()}
    missing = sorted(cls.__name__ for cls in declared - sampled)
    assert not missing, f"add a sample to sample_events() for {missing}"


@pytest.mark.parametrize("ev", sample_events(), ids=lambda ev: type(ev).__name__)
def test_every_event_round_trips(ev: Event) -> None:
    assert_same(ev, decode(encode(ev)))


def test_docstring_example_decodes_to_an_equal_event() -> None:
    assert decode(encode(Shutdown(reason="done"))) == Shutdown(reason="done")


def test_encode_puts_the_header_first_and_one_frame_per_array() -> None:
    ev = arrays_event(a=np.zeros(3, np.float32), b=np.zeros(2, np.uint8))
    frames = encode(ev)
    assert len(frames) == 3
    assert [memoryview(f).nbytes for f in frames[1:]] == [12, 2]


def test_a_handmade_header_in_the_documented_layout_decodes() -> None:
    """Sanity check of the helpers the BadFrame tests build their malformed input from."""
    frames = array_message(array_ext("<f4", [3], 1))
    ev = decode(frames)
    assert isinstance(ev, ArraysPublished)
    np.testing.assert_array_equal(ev.arrays["x"], np.arange(3, dtype=np.float32))


# --------------------------------------------------------------------------- arrays


@pytest.mark.parametrize("dtype", DTYPES)
def test_arrays_of_every_numeric_dtype_round_trip_bit_exact(dtype: str) -> None:
    arr = (RNG.standard_normal((3, 4)) * 100).astype(dtype)
    out = round_trip(arrays_event(x=arr))
    assert isinstance(out, ArraysPublished)
    assert_same(arr, out.arrays["x"])


def test_big_endian_array_keeps_its_byte_order_and_values() -> None:
    arr = np.array([1.5, -2.25, 3e30], dtype=">f4")
    out = round_trip(arrays_event(x=arr)).arrays["x"]  # type: ignore[attr-defined]
    assert out.dtype.str == ">f4"
    np.testing.assert_array_equal(out, arr)


def test_float_specials_survive_bit_exact() -> None:
    arr = np.array([np.nan, -np.nan, np.inf, -np.inf, -0.0, 5e-324], dtype=np.float64)
    assert_same(arr, round_trip(arrays_event(x=arr)).arrays["x"])  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: np.array(3.5), id="0d-float"),
        pytest.param(lambda: np.array(True), id="0d-bool"),
        pytest.param(lambda: np.zeros((0,), np.float32), id="empty-1d"),
        pytest.param(lambda: np.zeros((3, 0), np.int64), id="empty-2d"),
        pytest.param(lambda: np.zeros((2, 0, 0), np.float16), id="empty-3d"),
        pytest.param(lambda: np.zeros((0,), ">f4"), id="empty-big-endian"),
    ],
)
def test_zero_dimensional_and_empty_arrays_keep_their_shape(make: Callable[[], np.ndarray]) -> None:
    arr = make()
    out = round_trip(arrays_event(x=arr)).arrays["x"]  # type: ignore[attr-defined]
    assert out.shape == arr.shape
    assert_same(arr, out)


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: np.arange(12, dtype=np.float32).reshape(3, 4).T, id="transposed"),
        pytest.param(lambda: np.asfortranarray(np.arange(24.0).reshape(2, 3, 4)), id="fortran"),
        pytest.param(lambda: np.arange(20, dtype=np.int64)[::3], id="strided"),
        pytest.param(lambda: np.arange(10, dtype=np.uint8)[::-1], id="reversed"),
        pytest.param(lambda: np.arange(60, dtype=">f4").reshape(3, 4, 5)[:, 1:3, ::2], id="slab"),
    ],
)
def test_non_contiguous_arrays_round_trip_in_logical_order(make: Callable[[], np.ndarray]) -> None:
    arr = make()
    assert not arr.flags.c_contiguous
    out = round_trip(arrays_event(x=arr)).arrays["x"]  # type: ignore[attr-defined]
    assert_same(np.ascontiguousarray(arr), out)
    np.testing.assert_array_equal(out, arr)


def test_numpy_scalars_in_meta_arrive_as_python_scalars() -> None:
    ev = ArraysPublished(
        seq=1, policy_version=1, arrays={}, meta={"f": np.float32(0.5), "i": np.int64(-4)}
    )
    out = round_trip(ev)
    assert out.meta == {"f": 0.5, "i": -4}  # type: ignore[attr-defined]
    assert type(out.meta["i"]) is int  # type: ignore[attr-defined]


def test_nested_dict_and_tuple_meta_round_trips() -> None:
    meta: dict[str, Any] = {
        "a": {"b": {"c": (1, (2, (3, ())), {"d": None})}},
        "mixed": (True, -1, 2**64 - 1, -(2**63), 1.25, "s", b"bytes"),
        "arrays": {"inner": (np.ones((2, 2), np.float32), {"deeper": np.array(7, np.uint8)})},
        "": "empty key",
    }
    ev = ArraysPublished(seq=3, policy_version=4, arrays={}, meta=meta)
    assert_same(ev, round_trip(ev))


# --------------------------------------------------------------------------- zero copy


def test_encode_does_not_copy_a_c_contiguous_array() -> None:
    arr = np.arange(4096, dtype=np.float32).reshape(64, 64)
    frames = encode(arrays_event(x=arr))
    payload = np.frombuffer(frames[1], dtype=np.uint8)
    assert np.shares_memory(payload, arr)
    assert payload.__array_interface__["data"][0] == arr.__array_interface__["data"][0]
    assert payload.nbytes == arr.nbytes
    arr[0, 0] = 99.0  # the frame aliases the array: the caller must not mutate before drain()
    assert np.frombuffer(frames[1], dtype=np.float32)[0] == 99.0


@pytest.mark.parametrize("dtype", ["bool", "float16", "complex64", ">f4", "int64"])
def test_encode_does_not_copy_any_numeric_dtype(dtype: str) -> None:
    arr = np.zeros((5, 7), dtype=dtype)
    frames = encode(arrays_event(x=arr))
    assert np.shares_memory(np.frombuffer(frames[1], dtype=np.uint8), arr)


def test_encode_of_a_zero_dimensional_array_does_not_copy() -> None:
    arr = np.array(1.0, dtype=np.float64)
    frames = encode(arrays_event(x=arr))
    assert np.shares_memory(np.frombuffer(frames[1], dtype=np.uint8), arr)


def test_decode_does_not_copy_and_a_bytearray_frame_gives_a_writable_array() -> None:
    source = np.arange(1000, dtype=np.float64)
    frames = encode(arrays_event(x=source))
    payload = bytearray(frames[1])
    out = decode([frames[0], payload]).arrays["x"]  # type: ignore[attr-defined]
    payload_view = np.frombuffer(payload, dtype=np.uint8)
    assert np.shares_memory(out, payload_view)
    assert out.__array_interface__["data"][0] == payload_view.__array_interface__["data"][0]
    assert out.flags.writeable
    out[0] = -1.0  # writes land in the frame: proof that no copy sits in between
    assert np.frombuffer(payload, dtype=np.float64)[0] == -1.0


def test_decode_of_a_bytes_frame_gives_a_read_only_view_of_it() -> None:
    frames = encode(arrays_event(x=np.arange(10, dtype=np.int64)))
    payload = bytes(frames[1])
    out = decode([frames[0], payload]).arrays["x"]  # type: ignore[attr-defined]
    assert np.shares_memory(out, np.frombuffer(payload, dtype=np.uint8))
    assert not out.flags.writeable


def test_decode_of_a_memoryview_slice_does_not_copy() -> None:
    backing = bytearray(b"\x00" * 8 + np.arange(4, dtype=np.int32).tobytes() + b"\x00" * 8)
    frames = array_message(array_ext("<i4", [4], 1), memoryview(backing)[8:24])
    out = decode(frames).arrays["x"]  # type: ignore[attr-defined]
    np.testing.assert_array_equal(out, [0, 1, 2, 3])
    assert np.shares_memory(out, np.frombuffer(backing, dtype=np.uint8))


# --------------------------------------------------------------------------- encode errors


@pytest.mark.parametrize(
    "arr",
    [
        pytest.param(np.array([object(), 1], dtype=object), id="object"),
        pytest.param(np.array(["a", "bc"]), id="unicode"),
        pytest.param(np.array([b"a"]), id="bytes"),
        pytest.param(np.array(["2024-01-01"], dtype="datetime64[D]"), id="datetime"),
        pytest.param(np.zeros(2, dtype=[("a", "<f4"), ("b", "<i4")]), id="structured"),
        pytest.param(np.zeros(2, dtype="V8"), id="void"),
    ],
)
def test_encoding_a_non_numeric_array_raises_type_error(arr: np.ndarray) -> None:
    with pytest.raises(TypeError):
        encode(arrays_event(x=arr))


def test_encoding_a_non_event_raises_type_error() -> None:
    with pytest.raises(TypeError):
        encode({"reason": "done"})  # type: ignore[arg-type]


def test_encoding_an_unencodable_meta_value_raises_type_error() -> None:
    with pytest.raises(TypeError):
        encode(ArraysPublished(seq=1, policy_version=1, arrays={}, meta={"f": open}))


def test_a_failed_encode_leaves_the_codec_usable() -> None:
    c = Codec()
    with pytest.raises(TypeError):
        c.encode(arrays_event(a=np.zeros(2), bad=np.array([object()], dtype=object)))
    ev = arrays_event(ok=np.arange(3, dtype=np.int16))
    frames = c.encode(ev)
    assert len(frames) == 2  # no array frames left over from the failed attempt
    assert_same(ev, c.decode(frames))


def test_encode_refuses_a_frame_over_max_frame_bytes() -> None:
    c = Codec(max_frame_bytes=100)
    with pytest.raises(BadFrame) as info:
        c.encode(arrays_event(x=np.zeros(101, np.uint8)))
    assert info.value.reason == "frame_too_large"
    assert len(c.encode(arrays_event(x=np.zeros(100, np.uint8)))) == 2  # the limit is inclusive


def test_encode_refuses_more_than_max_frames() -> None:
    c = Codec(max_frames=2)
    with pytest.raises(BadFrame) as info:
        c.encode(arrays_event(a=np.zeros(1), b=np.zeros(1)))
    assert info.value.reason == "too_many_frames"
