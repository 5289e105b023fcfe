"""The codec (:mod:`tianji.runtime.codec`) on malformed input: every kind raises
:class:`BadFrame` with the documented ``reason``, and no other exception type ever escapes
``decode`` (property tests); nothing but registered event types and numeric dtypes comes off
the wire (no pickle)."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pytest
from codec_helpers import (
    DTYPES,
    array_ext,
    array_message,
    arrays_body,
    arrays_event,
    assert_same,
    decode_error,
    float32_frame,
    header,
    round_trip,
    sample_events,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tianji.runtime.codec import ARRAY_EXT, WIRE_VERSION, Codec, decode, encode
from tianji.runtime.errors import BadFrame
from tianji.runtime.events import (
    ArraysPublished,
    Event,
    Heartbeat,
    Shutdown,
    event,
    event_types,
)

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
