"""Sans-I/O codec: ``encode(event) -> frames`` and ``decode(frames) -> event``.

Wire layout of one message (a list of frames)::

    frame 0        msgpack header: [WIRE_VERSION, "EventType", {field: value, ...}]
    frame 1..n     raw buffers of the numpy arrays referenced from the header

An array inside the header is a msgpack extension (code 1) holding
``[dtype_str, shape, frame_index]``. Encoding never copies a C-contiguous array (its
memoryview becomes the frame); decoding wraps frames with ``np.frombuffer``, which copies
nothing. Nothing on the wire is pickled: only numeric dtypes travel, and every field is
checked against the event's annotations, so malformed input raises :class:`BadFrame`.

msgspec does the msgpack work and the field checks in C: the header is decoded as
``(version, type, Raw body)`` and the body by a decoder typed with the event class, so a
heartbeat costs ~1.4 µs to decode and ~1.8 µs to encode, most of that the encode-side field
check (generated per event class by :mod:`tianji.runtime.fieldcheck`; ``tianji bench
transport`` prints a ``codec`` row). Fields typed ``Any`` (free-form
metadata) are checked in Python after decoding: primitives, lists/tuples and string-keyed
maps of them, at most 32 levels deep.

The codec does no I/O and keeps no per-connection state; it is tested without sockets::

    >>> from tianji.runtime.events import Shutdown
    >>> decode(encode(Shutdown(reason="done")))
    Shutdown(reason='done')
"""

from __future__ import annotations

import math
import typing
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import msgspec
import numpy as np

from tianji.runtime.errors import BadFrame
from tianji.runtime.events import Event, EventInfo, event_info
from tianji.runtime.fieldcheck import MAX_DEPTH, PRIMITIVES, event_check

__all__ = ["DEFAULT_MAX_FRAME_BYTES", "Codec", "decode", "encode", "message_nbytes"]

WIRE_VERSION = 1
ARRAY_EXT = 1
DEFAULT_MAX_FRAME_BYTES = 1 << 30
_ALLOWED_KINDS = frozenset("biufc")
_MAX_NDIM = 32  # numpy allows 64; no RL array needs more than a handful
_MAX_DIM = 1 << 40
Frame = bytes | bytearray | memoryview
"""One frame of a message (a header or an array's raw buffer)."""
_NO_VIEWS: list[memoryview] = []  # (never appended to)


def message_nbytes(frames: Sequence[Frame]) -> int:
    """Total payload bytes of a message (sum of frame lengths)."""
    return sum(memoryview(f).nbytes for f in frames)


class Codec:
    """Encoder/decoder with limits. Not thread-safe: use one per thread.

    Args:
        max_frame_bytes: frames longer than this are refused on decode (and on encode, so a
            sender learns early that its peer would refuse the message).
        max_frames: messages with more frames than this are refused.
    """

    def __init__(
        self, *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, max_frames: int = 4096
    ) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.max_frames = max_frames
        self._buffers: list[memoryview] = []
        self._encoder = msgspec.msgpack.Encoder(enc_hook=self._default)
        self._descriptor = msgspec.msgpack.Encoder()  # array descriptors
        self._header = msgspec.msgpack.Decoder(tuple[Any, Any, msgspec.Raw])
        self._bodies: dict[str, _Body] = {}  # by wire name
        self._kinds: dict[type, _Kind] = {}
        self._views: list[memoryview] = _NO_VIEWS  # the message being decoded (its arrays)
        self._used: set[int] = set()

    # ----------------------------------------------------------------------------- encode
    def encode(self, ev: Event) -> list[Frame]:
        """Encode ``ev`` into frames (header first, then one frame per array).

        Raises:
            TypeError: if ``ev`` is not a registered event or holds an unencodable value.
            BadFrame: if a frame would exceed ``max_frame_bytes``.
        """
        kind = self._kinds.get(type(ev)) or self._kind(ev)
        bad = kind.check(ev)  # refuse here what the peer would refuse
        if bad is not None:
            value = getattr(ev, bad)
            raise TypeError(
                f"cannot encode {kind.name}.{bad}={_short(value)}: expected {kind.hints[bad]}"
            )
        self._buffers = []
        try:
            header = self._encoder.encode((WIRE_VERSION, kind.name, ev))
        finally:
            buffers, self._buffers = self._buffers, []
        if len(header) > self.max_frame_bytes:
            raise BadFrame(
                "frame_too_large",
                f"frame 0 is {len(header)} bytes > max {self.max_frame_bytes}",
            )
        if not buffers:
            return [header]
        if len(buffers) >= self.max_frames:
            raise BadFrame("too_many_frames", f"{len(buffers) + 1} frames > max {self.max_frames}")
        for i, frame in enumerate(buffers, 1):
            if frame.nbytes > self.max_frame_bytes:
                raise BadFrame(
                    "frame_too_large",
                    f"frame {i} is {frame.nbytes} bytes > max {self.max_frame_bytes}",
                )
        return [header, *buffers]

    def _kind(self, ev: object) -> _Kind:
        """What encoding an event of ``type(ev)`` needs (TypeError for a non-event)."""
        info = event_info(getattr(ev, "TYPE", ""))
        if info is None or type(ev) is not info.cls:
            raise TypeError(f"cannot encode {ev!r:.80}: not an event declared with @event")
        kind = _Kind(info.name, event_check(info), info.hints)
        self._kinds[info.cls] = kind
        return kind

    def _default(self, obj: object) -> object:
        if isinstance(obj, np.ndarray):
            if isinstance(obj, np.ma.MaskedArray):
                raise TypeError("cannot encode a masked array (the mask would be lost)")
            if obj.dtype.kind not in _ALLOWED_KINDS or obj.dtype.fields is not None:
                raise TypeError(f"cannot encode array of dtype {obj.dtype} (numeric dtypes only)")
            # (np.ascontiguousarray would turn a 0-d array into a 1-d one)
            arr = obj if obj.flags.c_contiguous else np.ascontiguousarray(obj).reshape(obj.shape)
            index = len(self._buffers) + 1
            # A uint8 view of the contiguous data: no copy, works for every numeric dtype.
            raw: Any = arr.reshape(-1).view(np.uint8)
            self._buffers.append(memoryview(raw))
            ext = self._descriptor.encode((arr.dtype.str, arr.shape, index))
            return msgspec.msgpack.Ext(ARRAY_EXT, ext)
        if isinstance(obj, np.generic):
            return obj.item()
        raise TypeError(f"cannot encode value of type {type(obj).__name__}: {obj!r:.80}")

    # ----------------------------------------------------------------------------- decode
    def decode(self, frames: Sequence[Frame]) -> Event:
        """Decode frames produced by :meth:`encode` back into an event.

        Raises:
            BadFrame: on any malformed input; ``reason`` names the problem.
        """
        count = len(frames)
        if count == 1:  # no arrays: no views to make (an array reference fails its index)
            head = frames[0]
            size = head.nbytes if type(head) is memoryview else len(head)
            if size > self.max_frame_bytes:
                raise BadFrame(
                    "frame_too_large",
                    f"frame 0 is {size} bytes > max {self.max_frame_bytes}",
                )
            views: list[memoryview] = _NO_VIEWS
        else:
            if not count:
                raise BadFrame("empty_message", "a message needs at least a header frame")
            if count > self.max_frames:
                raise BadFrame("too_many_frames", f"{count} frames > max {self.max_frames}")
            views = [memoryview(f) for f in frames]
            for i, v in enumerate(views):
                if v.nbytes > self.max_frame_bytes:
                    raise BadFrame(
                        "frame_too_large",
                        f"frame {i} is {v.nbytes} bytes > max {self.max_frame_bytes}",
                    )
            head = views[0]
        try:
            version, type_name, raw = self._header.decode(head)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise BadFrame("malformed_header", str(exc)) from None
        except RecursionError:
            raise BadFrame("too_deep", "the header nests too deep") from None
        if type(version) is not int or version != WIRE_VERSION:
            raise BadFrame("wire_version", f"version {version!r}, this peer speaks {WIRE_VERSION}")
        body = self._bodies.get(type_name) if type(type_name) is str else None
        if body is None:
            body = self._body(type_name)
        if views is _NO_VIEWS:  # an array reference fails its frame index (no frames)
            ev = body.decode(raw)
        else:
            self._views = views
            self._used = used = set[int]()
            try:
                ev = body.decode(raw)
            finally:
                self._views = _NO_VIEWS
            if len(used) != count - 1:
                raise BadFrame(
                    "unreferenced_frames",
                    f"{count - 1} buffer frames, {len(used)} referenced",
                )
        if body.free:
            body.check_free(ev)
        return ev

    def _body(self, type_name: object) -> _Body:
        """The body decoder of the event type ``type_name`` (built on first use)."""
        info = event_info(type_name) if type(type_name) is str else None
        if info is None:
            raise BadFrame("unknown_event_type", f"event type {type_name!r:.80} is not registered")
        body = _Body(info, self._ext_hook)
        self._bodies[info.name] = body
        return body

    def _ext_hook(self, code: int, data: memoryview) -> object:
        if code != ARRAY_EXT:
            raise BadFrame("unknown_extension", f"msgpack extension code {code}")
        return _decode_array(data, self._views, self._used)


class _Kind(typing.NamedTuple):
    name: str  # the wire name
    check: Callable[[Event], str | None]  # the first field of the wrong type, or None
    hints: dict[str, Any]


class _Body:
    """How one event class's body is decoded: a msgspec decoder typed with the class
    (field types, missing and unknown fields checked in C), then a Python pass over the
    fields typed ``Any`` (``free``), which msgspec takes as they come."""

    __slots__ = ("decoder", "free", "info")

    def __init__(self, info: EventInfo, ext_hook: Callable[[int, memoryview], object]) -> None:
        self.info = info
        self.decoder = msgspec.msgpack.Decoder(info.cls, ext_hook=ext_hook, dec_hook=_dec_hook)
        self.free = tuple(name for name in info.fields if _holds_any(info.hints[name]))

    def decode(self, raw: msgspec.Raw) -> Event:
        try:
            ev: Event = self.decoder.decode(raw)
        except msgspec.ValidationError as exc:
            raise _invalid(self.info, str(exc)) from None
        except msgspec.DecodeError as exc:  # e.g. bad UTF-8 in a string of the body
            raise BadFrame("malformed_header", str(exc)) from None
        except RecursionError:
            raise BadFrame("too_deep", f"{self.info.name} nests too deep") from None
        return ev

    def check_free(self, ev: Event) -> None:
        """Check the ``Any`` fields' values (arrays in them become tuples)."""
        for name in self.free:
            value = getattr(ev, name)
            try:
                msgspec.structs.force_setattr(ev, name, _as_plain(value, MAX_DEPTH))
            except ValueError:
                raise BadFrame(
                    "bad_field_type",
                    f"{self.info.name}.{name}={_short(value)} does not match "
                    f"{self.info.hints[name]}",
                ) from None


def _dec_hook(kind: type, value: object) -> object:
    """msgspec's hook for the one type it does not know: arrays (decoded by the ext hook)."""
    if kind is np.ndarray and isinstance(value, np.ndarray):
        return value
    raise TypeError(f"Expected `{kind.__name__}`, got `{type(value).__name__}`")


def _holds_any(hint: Any) -> bool:
    return hint is Any or hint is object or any(_holds_any(a) for a in typing.get_args(hint))


def _invalid(info: EventInfo, message: str) -> BadFrame:
    """The BadFrame for a msgspec validation error (``message`` names the field path)."""
    if message.startswith(("Object missing required field", "Object contains unknown field")):
        return BadFrame("bad_fields", f"{info.name}: {message}")
    if " - at `" not in message:  # no field path: the body itself
        return BadFrame("malformed_body", f"{info.name} body: {message}")
    return BadFrame("bad_field_type", f"{info.name}: {message}")


_Shape = Annotated[
    tuple[Annotated[int, msgspec.Meta(ge=0, le=_MAX_DIM)], ...], msgspec.Meta(max_length=_MAX_NDIM)
]
# The descriptor [dtype_str, shape, frame_index], its types and bounds checked in C.
_ARRAY_SPEC = msgspec.msgpack.Decoder(tuple[str, _Shape, int])
_SPEC_PARTS = {"$[0]": "bad_dtype", "$[1]": "bad_shape", "$[2]": "bad_frame_index"}
_DTYPES: dict[str, np.dtype[Any]] = {}  # numeric dtypes seen on the wire, by their string


def _dtype(text: str) -> np.dtype[Any]:
    """The numeric dtype a descriptor names (BadFrame ``bad_dtype`` for anything else)."""
    dtype = _DTYPES.get(text)
    if dtype is not None:
        return dtype
    try:
        dtype = np.dtype(text)
    except TypeError as exc:
        raise BadFrame("bad_dtype", f"dtype {text!r:.40} is not a numeric dtype") from exc
    if dtype.kind not in _ALLOWED_KINDS or dtype.fields is not None:
        raise BadFrame("bad_dtype", f"dtype {text!r:.40} is not a numeric dtype")
    if len(_DTYPES) < 256:  # bounded: a peer cannot grow it without end
        _DTYPES[text] = dtype
    return dtype


def _spec_error(exc: Exception) -> BadFrame:
    """The BadFrame for a descriptor msgspec refused: the part its path names, if any."""
    message = str(exc)
    path = message.rpartition(" - at `")[2].rstrip("`")
    reason = _SPEC_PARTS.get(path[:4]) if isinstance(exc, msgspec.ValidationError) else None
    if reason == "bad_shape":
        return BadFrame(reason, f"shape: {message} (at most {_MAX_NDIM} dims in 0..2**40)")
    if reason is not None:
        return BadFrame(reason, f"array descriptor: {message}")
    return BadFrame("malformed_array", f"array descriptor: {type(exc).__name__}: {message}")


def _decode_array(data: memoryview, views: list[memoryview], used: set[int]) -> np.ndarray:
    try:
        dtype_str, shape, index = _ARRAY_SPEC.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        raise _spec_error(exc) from None
    dtype = _dtype(dtype_str)
    if not 1 <= index < len(views) or index in used:
        raise BadFrame("bad_frame_index", f"array frame index {index!r} (frames: {len(views)})")
    used.add(index)
    frame = views[index]
    if math.prod(shape) * dtype.itemsize != frame.nbytes:
        raise BadFrame(
            "size_mismatch",
            f"shape {shape} of {dtype.str} needs {math.prod(shape) * dtype.itemsize} bytes, "
            f"frame {index} has {frame.nbytes}",
        )
    return np.frombuffer(frame, dtype=dtype).reshape(shape)


def _short(value: object) -> str:
    try:
        return f"{value!r:.80}"
    except RecursionError as exc:
        return f"<deeply nested {type(value).__name__}: {exc}>"


def _as_plain(value: object, depth: int) -> object:
    """A decoded ``Any`` value with its arrays as tuples (as the msgpack codec gave them);
    ValueError if it holds anything but primitives and string-keyed maps, or nests deeper
    than ``depth``."""
    if isinstance(value, PRIMITIVES):
        return value
    if depth <= 0:
        raise ValueError("too deep")
    if isinstance(value, (list, tuple)):
        return tuple([_as_plain(v, depth - 1) for v in value])
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if type(k) is not str:
                raise ValueError("a map key that is not a str")
            out[k] = _as_plain(v, depth - 1)
        return out
    raise ValueError(f"a {type(value).__name__}")


_default_codec = Codec()


def encode(ev: Event) -> list[Frame]:
    """Encode with the module's default :class:`Codec` (see :meth:`Codec.encode`)."""
    return _default_codec.encode(ev)


def decode(frames: Sequence[Frame]) -> Event:
    """Decode with the module's default :class:`Codec` (see :meth:`Codec.decode`)."""
    return _default_codec.decode(frames)
