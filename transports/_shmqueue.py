"""The two ends of a shared-memory ring, sans-I/O: :class:`RingWriter` and :class:`RingReader`.

They read and write records (see :mod:`tianji.transports._shmring` for the layout) and
the header counters, and call ``doorbell()`` when the other side sleeps and must be
woken; waiting, sockets and the event loop belong to :mod:`tianji.transports.shm`.

Sleeping without lost wake-ups (Dekker-style; both sides fence between store and load):

* reader: set ``SLEEPING``, fence, look at ``TAIL`` again; sleep only if still empty.
  Writer: publish ``TAIL``, fence, if ``SLEEPING``: clear it and ring.
* writer: publish the ``HEAD``/``MSGS_R`` it needs (``WAIT_HEAD``/``WAIT_MSGS``), fence,
  look at the room again; sleep only if still short. Reader: publish ``HEAD``, fence,
  ring if the wait target is reached.

The fence is an uncontended lock acquire/release: a locked read-modify-write on x86-64.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Generator

from tianji.transports._shmring import (
    BYTES_R,
    BYTES_W,
    CHUNK_DATA,
    GOODBYE,
    HEAD,
    KIND_BEGIN,
    KIND_CHUNK,
    KIND_MSG,
    KIND_WRAP,
    MSGS_R,
    MSGS_W,
    PAGE,
    RECORD,
    RECORD_BYTES,
    SLEEPING,
    TAIL,
    WAIT_HEAD,
    WAIT_MSGS,
    Ring,
    header,
    table,
)

from tianji.runtime.core import Limits
from tianji.runtime.errors import BadFrame

__all__ = ["RingReader", "RingWriter", "ShmLease", "layout"]

log = logging.getLogger(__name__)

_fence_lock = threading.Lock()
_acquire, _release = _fence_lock.acquire, _fence_lock.release


def fence() -> None:
    """A full memory barrier (store-load ordering between the two processes)."""
    _acquire()
    _release()


def layout(views: list[memoryview]) -> tuple[list[int], int]:
    """The frame lengths, and the bytes of the MSG record holding ``views`` (header,
    lengths, frames at 64-byte aligned offsets)."""
    o = (RECORD_BYTES + 8 * len(views) + 63) & -64
    lengths = []
    for v in views:
        n = v.nbytes
        lengths.append(n)
        o = (o + n + 63) & -64
    return lengths, o


def begin_bytes(nframes: int) -> int:
    return (RECORD_BYTES + 8 * nframes + 63) & -64


def chunk_bytes(k: int) -> int:
    return CHUNK_DATA + ((k + 63) & -64)


Pieces = Generator[memoryview, int, None]


def pieces(views: list[memoryview]) -> Pieces:
    """The bytes of ``views`` in order: send the most you want, get at most that much.

    Prime it with ``next()`` first (that yields an empty view).
    """
    want = yield memoryview(b"")
    for v in views:
        at, n = 0, v.nbytes
        while at < n:
            take = min(want, n - at)
            want = yield v[at : at + take]
            at += take


class RingWriter:
    """Producer end: writes records into our ring, bounded by :class:`Limits`.

    ``queue_bytes`` bounds the ring bytes in flight (records with their headers), and
    ``queue_messages`` the messages; a message is admitted into an empty ring whatever
    its size. Records larger than half the ring are never written: large messages go as
    a BEGIN record and chunks (:meth:`write_begin`, :meth:`write_chunk`).
    """

    def __init__(self, ring: Ring, limits: Limits, doorbell: Callable[[], None]) -> None:
        self.ring = ring
        self.size = ring.size
        self.half = ring.size // 2
        self.cap = min(ring.size, (limits.queue_bytes + 63) & -64)
        self.chunk = max(PAGE, (min(self.cap, ring.size // 4) - CHUNK_DATA) & -64)
        self._max_msgs = limits.queue_messages
        self._doorbell = doorbell
        self._hdr = ring.hdr
        self._data = ring.data
        self.tail = self.head = self.msgs = self.msgs_read = self.nbytes = 0

    def room(self, rec: int, message: bool) -> bool:
        """Whether a record of ``rec`` bytes may be written now."""
        if message and self.msgs - self.msgs_read >= self._max_msgs:
            self.msgs_read = self._hdr[MSGS_R]
            if self.msgs - self.msgs_read >= self._max_msgs:
                return False
        tail = self.tail
        room = self.size - tail % self.size
        used = tail - self.head
        if used and used + (rec if rec <= room else room + rec) > self.cap:
            self.head = self._hdr[HEAD]
            used = tail - self.head
            return not used or used + (rec if rec <= room else room + rec) <= self.cap
        return True

    def arm_wait(self, rec: int, message: bool) -> None:
        """Ask the reader to ring once ``rec`` fits; then check ``room`` again before sleeping."""
        tail = self.tail
        room = self.size - tail % self.size
        total = rec if rec <= room else room + rec
        self._hdr[WAIT_MSGS] = max(0, self.msgs - self._max_msgs + 1) if message else 0
        self._hdr[WAIT_HEAD] = max(self.head, min(tail, tail + total - self.cap)) + 1
        fence()

    def disarm_wait(self) -> None:
        self._hdr[WAIT_HEAD] = 0

    def _reserve(self, rec: int) -> int:
        off = self.tail % self.size
        room = self.size - off
        if rec <= room:
            return off
        RECORD.pack_into(self._data, off, KIND_WRAP, 0, room, 0)
        self.tail += room
        return 0

    def _publish(self, rec: int, msgs: int, nbytes: int) -> None:
        hdr = self._hdr
        self.tail += rec
        if msgs:
            self.msgs += msgs
            self.nbytes += nbytes
            hdr[MSGS_W] = self.msgs
            hdr[BYTES_W] = self.nbytes
        hdr[TAIL] = self.tail
        _acquire()  # fence(), inlined: this runs once per message
        _release()
        if hdr[SLEEPING]:
            hdr[SLEEPING] = 0
            self._doorbell()

    def write_message(
        self, views: list[memoryview], lengths: list[int], rec: int, size: int
    ) -> None:
        """Write one whole message (``room(rec, True)`` said yes; ``rec <= half``)."""
        data = self._data
        pos = self._reserve(rec)
        n = len(views)
        header(n).pack_into(data, pos, KIND_MSG, n, rec, size, *lengths)
        o = pos + ((RECORD_BYTES + 8 * n + 63) & -64)
        for v, length in zip(views, lengths, strict=True):
            if length:
                data[o : o + length] = v
                o = (o + length + 63) & -64
        self._publish(rec, 1, size)

    def write_begin(self, views: list[memoryview], size: int) -> None:
        """Start a large message: the lengths (``room(begin_bytes(n), True)`` said yes)."""
        n = len(views)
        rec = begin_bytes(n)
        pos = self._reserve(rec)
        lengths = [v.nbytes for v in views]
        header(n).pack_into(self._data, pos, KIND_BEGIN, n, rec, size, *lengths)
        self._publish(rec, int(size == 0), 0)

    def write_chunk(self, source: Pieces, k: int, size: int, last: bool) -> int:
        """Write the next ``k`` bytes of a large message taken from ``source``.

        ``source`` yields consecutive pieces of the message; a piece that does not fit is
        split and its rest is yielded first on the next call (see :func:`pieces`).

        Returns:
            The record size (``room(chunk_bytes(k), False)`` said yes).
        """
        rec = chunk_bytes(k)
        pos = self._reserve(rec)
        data = self._data
        RECORD.pack_into(data, pos, KIND_CHUNK, 0, rec, k)
        o, end = pos + CHUNK_DATA, pos + CHUNK_DATA + k
        while o < end:
            piece = source.send(end - o)
            data[o : o + piece.nbytes] = piece
            o += piece.nbytes
        self._publish(rec, int(last), size)
        return rec

    def in_flight(self) -> tuple[int, int]:
        """(messages, bytes) written and not yet consumed by the reader."""
        return self.msgs - self._hdr[MSGS_R], self.nbytes - self._hdr[BYTES_R]

    def goodbye(self) -> None:
        """Mark the end of the stream (after the last published record)."""
        self._hdr[GOODBYE] = 1


class ShmLease:
    """A message received with ``ShmConnection.recv_lease``: ``frames`` view the ring.

    The frames stay valid until :meth:`release` (or the end of a ``with`` block); the
    ring space, and so the sender's room, is given back only then and in order: an
    unreleased lease also holds back the space of every later message, so a consumer
    that keeps leases applies backpressure. Messages larger than half the ring arrive as
    copies (they have no single contiguous view); releasing those is free.

    After release the views raise ``ValueError`` if used. Objects made from them before
    (``np.frombuffer``) keep the mapping alive, so they never touch freed memory, but
    their bytes may be overwritten by later messages: copy what must outlive the lease.
    """

    __slots__ = ("_end", "_msgs", "_nbytes", "_reader", "frames", "released")

    def __init__(self, frames: list[memoryview], reader: RingReader | None, nbytes: int) -> None:
        self.frames = frames
        self.released = reader is None
        self._reader = reader
        self._end = 0
        self._msgs = 1
        self._nbytes = nbytes

    def release(self) -> None:
        """Give the space back to the sender (idempotent)."""
        if self.released:
            return
        self.released = True
        if self._reader is not None:
            self._reader._release_leases()
            self._reader = None
        for frame in self.frames:
            try:
                frame.release()
            except BufferError as exc:  # an ndarray still wraps it: it goes with that
                log.debug("frame kept: %r", exc)

    def __enter__(self) -> list[memoryview]:
        return self.frames

    def __exit__(self, *exc: object) -> None:
        self.release()


class _Assembly:
    """A large message being received chunk by chunk; frames are allocated as bytes arrive."""

    __slots__ = ("filled", "frames", "left", "lengths", "payload")

    def __init__(self, lengths: tuple[int, ...], payload: int) -> None:
        self.lengths = lengths
        self.frames: list[memoryview] = []
        self.filled = 0  # bytes in frames[-1]
        self.left = self.payload = payload

    def feed(self, src: memoryview) -> None:
        p, k = 0, src.nbytes
        if k > self.left:
            raise BadFrame("bad_record", f"chunk of {k} bytes exceeds the {self.left} announced")
        while p < k:
            if not self.frames or self.filled == self.frames[-1].nbytes:
                self._next_frame()
            cur = self.frames[-1]
            take = min(k - p, cur.nbytes - self.filled)
            cur[self.filled : self.filled + take] = src[p : p + take]
            self.filled += take
            p += take
        self.left -= k

    def _next_frame(self) -> None:
        while True:  # empty frames are complete as soon as they start
            self.frames.append(memoryview(bytearray(self.lengths[len(self.frames)])))
            self.filled = 0
            if self.frames[-1].nbytes:
                return

    def finish(self) -> list[memoryview]:
        while len(self.frames) < len(self.lengths):
            self.frames.append(memoryview(bytearray(self.lengths[len(self.frames)])))
        return self.frames


class RingReader:
    """Consumer end: parses the peer's records, checks them against :class:`Limits`.

    Everything in the ring is untrusted: a record that does not parse raises
    :class:`BadFrame` and the connection must be dropped.
    """

    def __init__(self, ring: Ring, limits: Limits, doorbell: Callable[[], None]) -> None:
        self.ring = ring
        self._limits = limits
        self._doorbell = doorbell
        self._hdr = ring.hdr
        self._data = ring.data
        self._size = ring.size
        self.pos = self.head = self._hdr[HEAD]  # parsed up to / given back up to
        self._tail = self.pos
        self._freed_msgs = self._freed_bytes = 0
        self._leases: collections.deque[ShmLease] = collections.deque()
        self._asm: _Assembly | None = None
        self._closed = False

    def has_data(self) -> bool:
        if self.pos != self._tail:
            return True
        self._tail = self._hdr[TAIL]
        return self.pos != self._tail

    def ended(self) -> bool:
        """Whether the writer said goodbye and everything before it was parsed."""
        return bool(self._hdr[GOODBYE]) and not self.has_data()

    @property
    def said_goodbye(self) -> bool:
        return bool(self._hdr[GOODBYE])

    @property
    def mid_message(self) -> bool:
        return self._asm is not None

    def sleep(self) -> bool:
        """Announce that we sleep; False if there is something to read after all."""
        hdr = self._hdr
        hdr[SLEEPING] = 1
        fence()
        if self.has_data() or hdr[GOODBYE]:
            hdr[SLEEPING] = 0
            return False
        return True

    def queued(self, taken_msgs: int, taken_bytes: int) -> tuple[int, int]:
        """(messages, bytes) written by the peer and not yet taken by the application."""
        return self._hdr[MSGS_W] - taken_msgs, self._hdr[BYTES_W] - taken_bytes

    def take(self, lease: bool) -> tuple[list[memoryview], ShmLease | None] | None:
        """Parse records until a whole message is out (None: not there yet).

        Raises:
            BadFrame: if a record is malformed or breaks the limits.
        """
        data, n = self._data, self._size
        while self.pos != self._tail or self.has_data():
            off = self.pos % n
            kind, nframes, size, payload = RECORD.unpack_from(data, off)
            if size < 64 or size & 63 or size > self._tail - self.pos or off + size > n:
                raise BadFrame("bad_record", f"record of {size} bytes at offset {off}")
            if kind == KIND_MSG and self._asm is None:
                frames = self._parse_message(off, nframes, size, payload, lease)
                held = ShmLease(frames, self, payload) if lease else None
                self._consume(size, 1, payload, held)
                return frames, held
            if kind == KIND_WRAP and off + size == n:
                self._consume(size, 0, 0, None)
                continue
            if kind == KIND_BEGIN and self._asm is None:
                self._asm = self._parse_begin(off, nframes, size, payload)
            elif kind == KIND_CHUNK and self._asm is not None and CHUNK_DATA + payload <= size:
                self._asm.feed(data[off + CHUNK_DATA : off + CHUNK_DATA + payload])
            else:
                raise BadFrame("bad_record", f"unexpected record kind {kind} at offset {off}")
            asm = self._asm
            if asm.left:
                self._consume(size, 0, 0, None)
                continue
            self._asm = None  # complete: the message counts as read with its last record
            self._consume(size, 1, asm.payload, None)
            frames = asm.finish()
            return frames, (ShmLease(frames, None, asm.payload) if lease else None)
        return None

    def _lengths(self, off: int, nframes: int, size: int) -> tuple[int, ...]:
        limits = self._limits
        if not 1 <= nframes <= limits.max_frames:
            raise BadFrame(
                "bad_frame_count", f"message declares {nframes} frames (1..{limits.max_frames})"
            )
        if RECORD_BYTES + 8 * nframes > size:
            raise BadFrame("bad_record", f"{nframes} frame lengths overflow a {size}-byte record")
        lengths: tuple[int, ...] = table(nframes).unpack_from(self._data, off + RECORD_BYTES)
        if max(lengths) > limits.max_frame_bytes:
            i = next(i for i, n in enumerate(lengths) if n > limits.max_frame_bytes)
            raise BadFrame(
                "frame_too_large",
                f"frame {i} declares {lengths[i]} bytes > max_frame_bytes {limits.max_frame_bytes}",
            )
        return lengths

    def _parse_message(
        self, off: int, nframes: int, size: int, payload: int, lease: bool
    ) -> list[memoryview]:
        data = self._data
        o = (RECORD_BYTES + 8 * nframes + 63) & -64
        frames = []
        lengths = self._lengths(off, nframes, size)
        for length in lengths:
            end = o + length
            if end > size:
                raise BadFrame("bad_record", f"a frame overruns its {size}-byte record")
            view = data[off + o : off + end]
            frames.append(view if lease else memoryview(bytearray(view)))
            o = (end + 63) & -64
        if o != size or sum(lengths) != payload:
            raise BadFrame("bad_record", f"record of {size} bytes, but its frames end at {o}")
        return frames

    def _parse_begin(self, off: int, nframes: int, size: int, payload: int) -> _Assembly:
        lengths = self._lengths(off, nframes, size)
        if sum(lengths) != payload or begin_bytes(nframes) != size:
            raise BadFrame("bad_record", f"large message of {sum(lengths)} bytes, not {payload}")
        return _Assembly(lengths, payload)

    def _consume(self, size: int, msgs: int, nbytes: int, held: ShmLease | None) -> None:
        """Move past a record; its space goes back now, or when ``held`` is released."""
        self.pos += size
        if held is None and not self._leases:
            self.head = self.pos
            self._freed_msgs += msgs
            self._freed_bytes += nbytes
            self._publish_head()
            return
        if held is None:  # behind an unreleased lease: freed together with it
            held = ShmLease([], None, nbytes)
            held._msgs = msgs
        held._end = self.pos
        self._leases.append(held)

    def _release_leases(self) -> None:
        leases = self._leases
        while leases and leases[0].released:
            done = leases.popleft()
            self.head = done._end
            self._freed_msgs += done._msgs
            self._freed_bytes += done._nbytes
        if not self._closed:
            self._publish_head()

    def _publish_head(self) -> None:
        hdr = self._hdr
        hdr[MSGS_R] = self._freed_msgs
        hdr[BYTES_R] = self._freed_bytes
        hdr[HEAD] = self.head
        _acquire()  # fence(), inlined: this runs once per message
        _release()
        want = hdr[WAIT_HEAD]
        if want and self.head >= want - 1 and self._freed_msgs >= hdr[WAIT_MSGS]:
            hdr[WAIT_HEAD] = 0
            self._doorbell()

    def close(self) -> None:
        """Drop the ring; frames of unreleased leases keep their mapping alive."""
        self._closed = True
        self._leases.clear()
        self.ring.close()
