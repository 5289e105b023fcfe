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

import math
import pickle
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tianji.rl.events import (
    ActionsComputed,
    BatchRequested,
    CheckpointTaken,
    ComputeActions,
    EpisodesFinished,
    GradientsShared,
    GrantConsumption,
    GrantProduction,
    ParamsPublished,
    PolicyEvaluated,
    PrioritiesUpdated,
    RestoreCheckpoint,
    SampleBatch,
    TakeCheckpoint,
    TrajectoryCollected,
)
from tianji.runtime import codec
from tianji.runtime.codec import ARRAY_EXT, WIRE_VERSION, Codec, decode, encode
from tianji.runtime.errors import BadFrame
from tianji.runtime.events import (
    ArraysPublished,
    BoardPosted,
    Event,
    Heartbeat,
    PublishersChanged,
    RegisterService,
    ServiceRegistered,
    ServiceReported,
    Shutdown,
    Subscribe,
    Want,
    WatchTopics,
    event,
    event_types,
)

# --------------------------------------------------------------------------- helpers


def assert_same(expected: object, actual: object, path: str = "event") -> None:
    """Structural equality that also compares types, dtypes, shapes and raw array bytes.

    Struct ``==`` cannot compare events holding arrays, and ``np.array_equal`` treats
    NaN payloads and ``-0.0`` loosely; the wire must be bit-exact.
    """
    assert type(actual) is type(expected), f"{path}: {type(actual)} != {type(expected)}"
    if isinstance(expected, Event):
        for name in expected.__struct_fields__:
            assert_same(getattr(expected, name), getattr(actual, name), f"{path}.{name}")
    elif isinstance(expected, np.ndarray):
        assert isinstance(actual, np.ndarray)
        assert actual.dtype == expected.dtype, f"{path}: dtype {actual.dtype} != {expected.dtype}"
        assert actual.dtype.str == expected.dtype.str, f"{path}: byte order changed"
        assert actual.shape == expected.shape, f"{path}: shape {actual.shape} != {expected.shape}"
        assert actual.tobytes() == expected.tobytes(), f"{path}: array bytes differ"
    elif isinstance(expected, dict):
        assert isinstance(actual, dict)
        assert list(actual) == list(expected), f"{path}: keys {list(actual)} != {list(expected)}"
        for key, value in expected.items():
            assert_same(value, actual[key], f"{path}[{key!r}]")
    elif isinstance(expected, tuple):
        assert isinstance(actual, tuple)
        assert len(actual) == len(expected), f"{path}: length {len(actual)} != {len(expected)}"
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            assert_same(e, a, f"{path}[{i}]")
    elif isinstance(expected, float) and math.isnan(expected):
        assert isinstance(actual, float) and math.isnan(actual), f"{path}: {actual} is not NaN"
    else:
        assert actual == expected, f"{path}: {actual!r} != {expected!r}"


def round_trip(ev: Event, c: Codec | None = None) -> Event:
    frames = (c or codec._default_codec).encode(ev)
    return (c or codec._default_codec).decode(frames)


def arrays_event(**arrays: np.ndarray) -> ArraysPublished:
    return ArraysPublished(seq=1, policy_version=2, arrays=arrays, meta={})


def array_ext(dtype: object, shape: object, index: object) -> msgpack.ExtType:
    """An array reference exactly as the codec writes it: ext 1 of [dtype, shape, index]."""
    return msgpack.ExtType(ARRAY_EXT, msgpack.packb([dtype, shape, index]))


def header(type_name: object, body: object, version: object = WIRE_VERSION) -> bytes:
    """A hand-made header frame: [version, type, body]."""
    return msgpack.packb([version, type_name, body], use_bin_type=True)


def arrays_body(arrays: object, **overrides: object) -> dict[str, object]:
    body: dict[str, object] = {"seq": 1, "policy_version": 2, "arrays": arrays, "meta": {}}
    body.update(overrides)
    return body


def float32_frame(n: int = 3) -> bytes:
    return np.arange(n, dtype=np.float32).tobytes()


def array_message(ext: object, payload: object = None, **overrides: object) -> list[Any]:
    """An ArraysPublished message whose one array ``x`` is ``ext``, plus its payload frame."""
    body = arrays_body({"x": ext}, **overrides)
    return [header("ArraysPublished", body), float32_frame() if payload is None else payload]


def decode_error(frames: list[Any], c: Codec | None = None) -> BadFrame:
    with pytest.raises(BadFrame) as info:
        (c or codec._default_codec).decode(frames)
    return info.value


# --------------------------------------------------------------------------- samples

RNG = np.random.default_rng(1234)


def sample_events() -> list[Event]:
    """One populated instance of every event class declared in tianji.runtime.events."""
    return [
        Subscribe(topics=("Heartbeat", "TrajectoryCollected/actor-3")),
        Subscribe(
            topics=("ParamsPublished/latest",),
            locality="h/net:1",
            on_demand=("ParamsPublished/latest",),
        ),
        Want(topic="ParamsPublished/latest"),
        BoardPosted(
            topic="ParamsPublished/latest",
            board="tianji-1-2-board0a",
            slot=2,
            seq=6,
            lengths=(40, 4096),
        ),
        RegisterService(
            name="actor-0",
            role="actor",
            address="tcp://127.0.0.1:5555",
            publishes=("TrajectoryCollected/actor-0",),
            host="node-1",
            pid=4242,
        ),
        ServiceRegistered(name="actor-0", run_id="run-2024-07"),
        WatchTopics(topics=()),
        PublishersChanged(topic="ParamsPublished", addresses=("tcp://10.0.0.1:1", "inproc://b")),
        Heartbeat(
            name="learner",
            role="learner",
            state="running",
            counters={"updates": 12, "negative": -3, "max": 2**63 - 1},
            gauges={"loss": 0.25, "lr": 3e-4},
            queue_depths={},
            sent_at=1712345678.25,
        ),
        EpisodesFinished(
            actor="actor-1",
            policy_version=3,
            returns=np.array([10.0, 200.0], np.float32),
            lengths=np.array([10, 200], np.int64),
            env_steps=4096,
        ),
        PolicyEvaluated(
            worker="eval-0",
            policy_version=12,
            returns=np.array([500.0, 480.5]),
            lengths=np.array([500, 481], np.int64),
        ),
        BatchRequested(learner="learner-0", count=2, learner_version=17),
        CheckpointTaken(policy_version=40, state=np.frombuffer(b"packed state", np.uint8)),
        RestoreCheckpoint(policy_version=40, state=np.frombuffer(b"packed", np.uint8)),
        TakeCheckpoint(reason="complete"),
        ComputeActions(
            actor="actor-0",
            request_id=7,
            obs=np.zeros((4, 3), np.float32),
            env_ids=np.arange(4, dtype=np.int32),
            starts=np.array([True, False, False, True]),
        ),
        ActionsComputed(
            actor="actor-0",
            request_id=7,
            policy_version=3,
            arrays={"action": np.array([0, 1, 1, 0]), "logp": np.zeros(4, np.float32)},
        ),
        SampleBatch(
            batch_id=5,
            policy_version=17,
            arrays={"obs": np.ones((4, 3), np.float32), "action": np.arange(4)},
            policy_versions=np.array([15, 16, 16, 17], np.int64),
        ),
        GradientsShared(
            learner="learner-1",
            index=1,
            step=42,
            grads=RNG.standard_normal(10, dtype=np.float32),
            digest="0f1e2d3c",
        ),
        PrioritiesUpdated(
            policy_version=17,
            indices=np.array([3, 9], np.int64),
            priorities=np.array([0.5, 1.5], np.float32),
        ),
        ServiceReported(
            name="learner-0",
            status="ok",
            summary={"return_mean": 195.5, "steps": 100_000, "curve": ((0, 9.5), (1000, 22.0))},
        ),
        Shutdown(reason="done"),
        GrantProduction(limit=0, min_version=0, reason="draining before the run stops"),
        GrantConsumption(limit=4096, reason="consumed 3968 in [3000, 4096]"),
        GrantProduction(limit=12, min_version=5, reason="3/4 fragments outstanding"),
        ArraysPublished(
            seq=7,
            policy_version=3,
            arrays={
                "f32": RNG.standard_normal((4, 5), dtype=np.float32),
                "u8": RNG.integers(0, 255, size=(2, 3, 4), dtype=np.uint8),
                "scalar": np.array(2.5),
                "empty": np.zeros((0, 3), dtype=np.int64),
            },
            meta={
                "env": "CartPole-v1",
                "nested": {"tuple": (1, 2.5, "three", None, True, b"\x00\xff"), "deep": {"x": ()}},
                "array_in_meta": (np.arange(3, dtype=np.int16),),
            },
        ),
        TrajectoryCollected(
            actor="actor-3",
            policy_version=9,
            arrays={
                "obs": RNG.standard_normal((16, 4), dtype=np.float32),
                "action": RNG.integers(0, 2, size=16, dtype=np.int64),
                "reward": np.ones(16, dtype=np.float32),
                "done": np.arange(16) % 5 == 0,
            },
        ),
        ParamsPublished(
            policy_version=10,
            weights={"w": RNG.standard_normal((8, 4)), "b": np.zeros(4, dtype=np.float32)},
        ),
    ]


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

DTYPES = [
    "float32", "float64", "int64", "uint8", "bool", "float16", "complex64",
    ">f4", ">i8", "int8", "int16", "uint64", "complex128",
]  # fmt: skip


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


# --------------------------------------------------------------------------- BadFrame cases


def test_empty_message_is_bad_frame_empty_message() -> None:
    assert decode_error([]).reason == "empty_message"


def test_empty_header_frame_is_bad_frame_malformed_header() -> None:
    assert decode_error([b""]).reason == "malformed_header"


def test_every_truncation_of_a_header_is_bad_frame_malformed_header() -> None:
    full = bytes(encode(Heartbeat(
        name="n", role="r", state="s", counters={"a": 1}, gauges={}, queue_depths={"q": 2},
        sent_at=1.5,
    ))[0])  # fmt: skip
    for cut in range(1, len(full)):
        err = decode_error([full[:cut]])
        assert err.reason == "malformed_header", f"cut at {cut}: {err}"


def test_trailing_bytes_after_the_header_are_bad_frame_malformed_header() -> None:
    full = bytes(encode(Shutdown(reason="x"))[0])
    assert decode_error([full + b"\x00"]).reason == "malformed_header"


@pytest.mark.parametrize(
    "garbage",
    [b"\xc1", b"\xff\xfe\xfd\xfc", b"GET / HTTP/1.1\r\n\r\n", b"\x00", b"\x93\x01\xc1"],
    ids=["reserved-byte", "high-bytes", "http", "a-lone-int", "reserved-inside-array"],
)
def test_garbage_header_bytes_are_bad_frame_malformed_header(garbage: bytes) -> None:
    assert decode_error([garbage]).reason == "malformed_header"


@pytest.mark.parametrize(
    "frame",
    [
        pytest.param(msgpack.packb({"v": 1}), id="map"),
        pytest.param(msgpack.packb([1, "Shutdown"]), id="two-items"),
        pytest.param(msgpack.packb([1, "Shutdown", {"reason": "x"}, 4]), id="four-items"),
    ],
)
def test_a_header_that_is_not_a_three_item_array_is_bad_frame_malformed_header(
    frame: bytes,
) -> None:
    assert decode_error([frame]).reason == "malformed_header"


@pytest.mark.parametrize("version", [0, 2, 255, "1", None])
def test_wrong_wire_version_is_bad_frame_wire_version(version: object) -> None:
    err = decode_error([header("Shutdown", {"reason": "x"}, version=version)])
    assert err.reason == "wire_version"


@pytest.mark.parametrize("type_name", ["NoSuchEvent", "shutdown", "", 42, None, b"Shutdown"])
def test_unknown_event_type_is_bad_frame_unknown_event_type(type_name: object) -> None:
    err = decode_error([header(type_name, {"reason": "x"})])
    assert err.reason == "unknown_event_type"


@pytest.mark.parametrize("dtype", ["O", "<U4", "nonsense", "", "S3", "V8", "M8[ns]", "f4,f4", 7])
def test_wrong_dtype_string_is_bad_frame_bad_dtype(dtype: object) -> None:
    frames = array_message(array_ext(dtype, [3], 1))
    assert decode_error(frames).reason == "bad_dtype"


@pytest.mark.parametrize("shape", [[-1], ["3"], [1.5], 3, None, [True]])
def test_invalid_shape_is_bad_frame_bad_shape(shape: object) -> None:
    frames = array_message(array_ext("<f4", shape, 1))
    assert decode_error(frames).reason == "bad_shape"


@pytest.mark.parametrize("shape", [[4], [2, 2], [], [0], [1, 3, 1, 2]])
def test_shape_and_frame_size_mismatch_is_bad_frame_size_mismatch(shape: list[int]) -> None:
    frames = array_message(array_ext("<f4", shape, 1), float32_frame(3))
    assert decode_error(frames).reason == "size_mismatch"


@pytest.mark.parametrize("index", [0, 2, 99, -1, "1", 1.0, None])
def test_out_of_range_frame_index_is_bad_frame_bad_frame_index(index: object) -> None:
    frames = array_message(array_ext("<f4", [3], index))
    assert decode_error(frames).reason == "bad_frame_index"


def test_a_frame_referenced_twice_is_bad_frame_bad_frame_index() -> None:
    arrays = {"x": array_ext("<f4", [3], 1), "y": array_ext("<f4", [3], 1)}
    frames = [header("ArraysPublished", arrays_body(arrays)), float32_frame(), float32_frame()]
    assert decode_error(frames).reason == "bad_frame_index"


def test_unreferenced_extra_frames_are_bad_frame_unreferenced_frames() -> None:
    frames = [*encode(arrays_event(x=np.zeros(2))), b"smuggled"]
    assert decode_error(frames).reason == "unreferenced_frames"
    assert decode_error([*encode(Shutdown(reason="x")), b""]).reason == "unreferenced_frames"


@pytest.mark.parametrize(
    "ext",
    [
        pytest.param(msgpack.ExtType(ARRAY_EXT, b"\xc1"), id="garbage"),
        pytest.param(msgpack.ExtType(ARRAY_EXT, msgpack.packb(["<f4", [3]])), id="two-items"),
        pytest.param(msgpack.ExtType(ARRAY_EXT, msgpack.packb(3)), id="not-an-array"),
        pytest.param(msgpack.ExtType(ARRAY_EXT, b""), id="empty"),
    ],
)
def test_malformed_array_descriptor_is_bad_frame_malformed_array(ext: msgpack.ExtType) -> None:
    frames = array_message(ext)
    assert decode_error(frames).reason == "malformed_array"


def test_frame_over_max_frame_bytes_is_refused_on_decode() -> None:
    c = Codec(max_frame_bytes=128)  # the header of these messages is ~70 bytes
    frames = encode(arrays_event(x=np.zeros(129, np.uint8)))
    err = decode_error(frames, c)
    assert err.reason == "frame_too_large"
    ok = encode(arrays_event(x=np.zeros(128, np.uint8)))
    assert isinstance(c.decode(ok), ArraysPublished)


def test_a_header_over_max_frame_bytes_is_refused_on_decode() -> None:
    c = Codec(max_frame_bytes=32)
    frames = [header("Shutdown", {"reason": "x" * 64})]
    assert decode_error(frames, c).reason == "frame_too_large"


def test_too_many_frames_is_refused_on_decode_before_parsing() -> None:
    c = Codec(max_frames=3)
    arrays = {str(i): np.zeros(1, np.uint8) for i in range(3)}
    frames = encode(arrays_event(**arrays))  # 4 frames
    assert decode_error(frames, c).reason == "too_many_frames"
    assert decode_error([b"\xc1"] * 4, c).reason == "too_many_frames"


@pytest.mark.parametrize("depth", [40, 100_000])
def test_nesting_beyond_the_limit_is_bad_frame_too_deep_or_bad_field_type(depth: int) -> None:
    # 40 levels decode, then fail the 32-level check; 100,000 exceed msgspec's own limit
    body = msgpack.packb(arrays_body({}), use_bin_type=True)[:-1]  # drop "meta": {}
    nested = b"\x91" * depth + b"\x00"
    frame = b"\x93\x01" + msgpack.packb("ArraysPublished") + body + b"\x81\xa1a" + nested
    err = decode_error([frame])
    assert err.reason == ("bad_field_type" if depth == 40 else "too_deep"), err


def test_a_body_that_is_not_a_map_is_bad_frame_malformed_body() -> None:
    assert decode_error([header("Shutdown", ["x"])]).reason == "malformed_body"


def test_a_missing_field_is_bad_frame_bad_fields() -> None:
    err = decode_error([header("ArraysPublished", {"seq": 1, "arrays": {}, "meta": {}})])
    assert err.reason == "bad_fields"
    assert "policy_version" in err.detail


def test_an_extra_field_is_bad_frame_bad_fields() -> None:
    err = decode_error([header("Shutdown", {"reason": "x", "__reduce__": "os.system"})])
    assert err.reason == "bad_fields"
    assert "__reduce__" in err.detail


def test_an_empty_body_is_bad_frame_bad_fields() -> None:
    assert decode_error([header("Shutdown", {})]).reason == "bad_fields"


def test_a_missing_field_that_has_a_default_decodes_with_the_default() -> None:
    # (a peer one field behind: Heartbeat.links_down was added with a default)
    body = {
        "name": "a", "role": "actor", "state": "running", "counters": {}, "gauges": {},
        "queue_depths": {}, "sent_at": 1.0,
    }  # fmt: skip
    ev = decode([header("Heartbeat", body)])
    assert isinstance(ev, Heartbeat) and ev.links_down == {}


def test_event_refuses_a_class_that_is_not_an_event_subclass() -> None:
    with pytest.raises(TypeError, match=r"subclass of tianji\.runtime\.events\.Event"):
        event(type("NotAnEvent", (), {"__annotations__": {"x": int}}))


def test_events_are_frozen_and_keyword_only() -> None:
    ev = Shutdown(reason="x")
    with pytest.raises(AttributeError):
        ev.reason = "y"  # type: ignore[misc]
    with pytest.raises(TypeError):
        Shutdown("x")  # type: ignore[misc]


@pytest.mark.parametrize(
    ("type_name", "body"),
    [
        pytest.param("ArraysPublished", arrays_body({}, policy_version="7"), id="version-str"),
        pytest.param("ArraysPublished", arrays_body({}, policy_version=True), id="version-bool"),
        pytest.param("ArraysPublished", arrays_body({}, policy_version=7.0), id="version-float"),
        pytest.param("ArraysPublished", arrays_body({}, seq=None), id="seq-none"),
        pytest.param("ArraysPublished", arrays_body({"x": 1}), id="array-is-int"),
        pytest.param("ArraysPublished", arrays_body({"x": b"\x00"}), id="array-is-bytes"),
        pytest.param("ArraysPublished", arrays_body({}, meta=[]), id="meta-is-list"),
        pytest.param("ArraysPublished", arrays_body({}, meta={b"k": 1}), id="meta-bytes-key"),
        pytest.param("ArraysPublished", arrays_body({}, meta={"k": {b"k": 1}}), id="meta-deep-key"),
        pytest.param("Shutdown", {"reason": b"bytes"}, id="str-is-bytes"),
        pytest.param("Shutdown", {"reason": 1}, id="str-is-int"),
        pytest.param("Subscribe", {"topics": "Heartbeat"}, id="tuple-is-str"),
        pytest.param("Subscribe", {"topics": ("a", 1)}, id="tuple-item-is-int"),
        pytest.param("Heartbeat", {"name": "n", "role": "r", "state": "s",
                                   "counters": {"a": "1"}, "gauges": {}, "queue_depths": {},
                                   "sent_at": 1.0, "links_down": {}}, id="dict-value-is-str"),
        pytest.param("Heartbeat", {"name": "n", "role": "r", "state": "s",
                                   "counters": {"a": 1}, "gauges": {}, "queue_depths": {},
                                   "sent_at": "now", "links_down": {}}, id="float-is-str"),
    ],
)  # fmt: skip
def test_a_field_of_the_wrong_type_is_bad_frame_bad_field_type(
    type_name: str, body: dict[str, object]
) -> None:
    err = decode_error([header(type_name, body)])
    assert err.reason == "bad_field_type"


def test_an_array_where_a_scalar_is_expected_is_bad_frame_bad_field_type() -> None:
    frames = [
        header("ArraysPublished", arrays_body({}, seq=array_ext("<f4", [3], 1))),
        float32_frame(),
    ]
    assert decode_error(frames).reason == "bad_field_type"


def test_meta_nested_twenty_levels_deep_still_round_trips() -> None:
    """Whatever nesting bound the decoder applies must leave room for real metadata."""
    value: Any = {"leaf": (1, "x")}
    for level in range(20):
        value = {f"level{level}": (value,)} if level % 2 else {f"level{level}": value}
    ev = ArraysPublished(seq=1, policy_version=1, arrays={}, meta=value)
    assert_same(ev, round_trip(ev))


def test_deeply_nested_meta_is_bad_frame_not_recursion_error() -> None:
    """msgpack unpacks up to ~1000 levels; the field check must not blow the Python stack."""
    depth = 900
    body = (
        b"\x84"
        + msgpack.packb("seq") + b"\x01"
        + msgpack.packb("policy_version") + b"\x01"
        + msgpack.packb("arrays") + b"\x80"
        + msgpack.packb("meta") + b"\x81" + msgpack.packb("x")
        + b"\x91" * depth + b"\x01"
    )  # fmt: skip
    frame = b"\x93" + msgpack.packb(WIRE_VERSION) + msgpack.packb("ArraysPublished") + body
    try:
        decode([frame])
    except BadFrame:
        pass  # rejecting absurd nesting is fine; any other exception type is not
    except RecursionError as exc:  # pragma: no cover - the failure this test guards against
        pytest.fail(f"decode raised {type(exc).__name__} instead of BadFrame")


# --------------------------------------------------------------------------- no pickle on the wire

_UNPICKLED: list[str] = []


class _Tripwire:
    """Unpickling this calls a function with a side effect: proof that pickle ran."""

    def __reduce__(self) -> tuple[Callable[[str], None], tuple[str]]:
        return (_UNPICKLED.append, ("pickle ran",))


@pytest.mark.parametrize(
    "type_name", ["builtins.eval", "os.system", "numpy.ndarray", "pickle.loads", "Event"]
)
def test_a_header_naming_an_unregistered_type_is_refused(type_name: str) -> None:
    err = decode_error([header(type_name, {"reason": "x"})])
    assert err.reason == "unknown_event_type"


@pytest.mark.parametrize("code", [0, 2, 42, 127])  # -1 is msgpack's timestamp
def test_a_pickle_payload_in_a_foreign_extension_is_refused_unopened(code: int) -> None:
    _UNPICKLED.clear()
    smuggled = msgpack.ExtType(code, pickle.dumps(_Tripwire()))
    frames = [header("ArraysPublished", arrays_body({}, meta={"x": smuggled}))]
    assert decode_error(frames).reason == "unknown_extension"
    assert _UNPICKLED == []


def test_a_pickle_payload_as_array_bytes_is_never_unpickled() -> None:
    _UNPICKLED.clear()
    frames = array_message(array_ext("|O", [1], 1), pickle.dumps(_Tripwire()))
    assert decode_error(frames).reason == "bad_dtype"
    assert _UNPICKLED == []


# --------------------------------------------------------------------------- property tests

_HYPOTHESIS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
_DTYPES = [np.dtype(d) for d in DTYPES]


def _layout(arr_and_layout: tuple[np.ndarray, str]) -> np.ndarray:
    arr, layout = arr_and_layout
    if layout == "transposed":
        return arr.T
    if layout == "reversed" and arr.ndim:
        return arr[::-1]
    return arr


any_array = st.tuples(
    st.sampled_from(_DTYPES).flatmap(
        lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5))
    ),
    st.sampled_from(["as-is", "transposed", "reversed"]),
).map(_layout)

plain_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=True)
    | st.text(max_size=16)
    | st.binary(max_size=16)
)
meta_values = st.recursive(
    plain_scalars | any_array,
    lambda children: (
        st.lists(children, max_size=4).map(tuple)
        | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=16,
)


@_HYPOTHESIS
@given(
    seq=st.integers(min_value=-(2**63), max_value=2**64 - 1),
    policy_version=st.integers(min_value=0, max_value=2**63 - 1),
    arrays=st.dictionaries(st.text(max_size=12), any_array, max_size=4),
    meta=st.dictionaries(st.text(max_size=12), meta_values, max_size=4),
)
def test_random_arrays_published_round_trips_bit_exact(
    seq: int, policy_version: int, arrays: dict[str, np.ndarray], meta: dict[str, Any]
) -> None:
    ev = ArraysPublished(seq=seq, policy_version=policy_version, arrays=arrays, meta=meta)
    assert_same(ev, decode(encode(ev)))


def _decode_only_raises_bad_frame(frames: list[bytes]) -> None:
    try:
        result = decode(frames)
    except BadFrame as exc:
        assert isinstance(exc.reason, str) and exc.reason
        return
    assert isinstance(result, Event)


@_HYPOTHESIS
@given(frames=st.lists(st.binary(max_size=256), max_size=5))
def test_random_bytes_only_ever_raise_bad_frame(frames: list[bytes]) -> None:
    _decode_only_raises_bad_frame(frames)


_VALID_MESSAGES = [[bytes(f) for f in encode(ev)] for ev in sample_events()]


@_HYPOTHESIS
@given(data=st.data())
def test_corrupted_valid_messages_only_ever_raise_bad_frame(data: st.DataObject) -> None:
    frames = list(data.draw(st.sampled_from(_VALID_MESSAGES)))
    target = data.draw(st.integers(0, len(frames) - 1), label="frame")
    frame = bytearray(frames[target])
    for _ in range(data.draw(st.integers(1, 4), label="edits")):
        op = data.draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        pos = data.draw(st.integers(0, max(len(frame) - 1, 0)))
        if op == "flip" and frame:
            frame[pos] = data.draw(st.integers(0, 255))
        elif op == "insert":
            frame[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and frame:
            del frame[pos]
        elif op == "truncate":
            del frame[pos:]
    frames[target] = bytes(frame)
    if data.draw(st.booleans(), label="drop or add a frame"):
        if len(frames) > 1 and data.draw(st.booleans()):
            frames.pop()
        else:
            frames.append(data.draw(st.binary(max_size=16)))
    _decode_only_raises_bad_frame(frames)


_FIELD_NAMES = sorted({f for info in event_types().values() for f in info.fields})
_EVENT_NAMES = sorted(event_types())
wire_values = st.recursive(
    plain_scalars
    | st.builds(
        array_ext,
        st.sampled_from(["<f4", "|u1", "|b1", "<c8", "O", "<U2", "bogus"]),
        st.lists(st.integers(-1, 4), max_size=3) | st.integers(-(2**63), 2**63 - 1),
        st.integers(-1, 4),
    )
    | st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=8)),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.text(max_size=4) | st.sampled_from(_FIELD_NAMES), children, max_size=3)
    ),
    max_leaves=12,
)


@_HYPOTHESIS
@given(
    version=st.sampled_from([WIRE_VERSION, WIRE_VERSION, 0, "1"]),
    type_name=st.sampled_from(_EVENT_NAMES) | st.text(max_size=8),
    body=st.dictionaries(st.sampled_from(_FIELD_NAMES) | st.text(max_size=4), wire_values,
                         max_size=6),
    payloads=st.lists(st.binary(max_size=24), max_size=3),
)  # fmt: skip
def test_well_formed_msgpack_with_wrong_content_only_ever_raises_bad_frame(
    version: object, type_name: object, body: dict[str, object], payloads: list[bytes]
) -> None:
    _decode_only_raises_bad_frame([header(type_name, body, version=version), *payloads])
