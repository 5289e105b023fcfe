"""Sans-I/O framing for byte-stream transports (TCP today).

Stream layout::

    preamble   8 bytes  b"TIANJI" + version (2 bytes, big-endian); sent once by each side
    hello      16 bytes the side's nonce               } the run-token handshake
    proof      32 bytes HMAC of both nonces (_auth.py) } (read before any message)
    message    <I nframes> <Q len_0> ... <Q len_n-1> frame_0 ... frame_n-1
    goodbye    <I 0xFFFFFFFF>   (graceful close; EOF without it means the peer vanished)

:class:`FrameParser` receives into its own preallocated buffer and, for large frames, hands
out the frame's final destination, so the kernel writes payloads straight where they end
up (``asyncio.BufferedProtocol``). Declared counts and lengths are checked against the
:class:`~tianji.runtime.core.Limits` before anything is allocated.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
from tianji.transports._auth import NONCE_BYTES, PROOF_BYTES, Handshake

from tianji.runtime.errors import BadFrame

__all__ = ["GOODBYE", "PREAMBLE", "FrameParser", "encode_prefix"]

PREAMBLE = b"TIANJI\x00\x02"  # version 2: the run-token handshake follows
GOODBYE_COUNT = 0xFFFFFFFF
GOODBYE = struct.pack("<I", GOODBYE_COUNT)
_COUNT = struct.Struct("<I")
_DIRECT_THRESHOLD = 64 << 10  # frames at least this big are received in place
_BUFFER_SIZE = 256 << 10
"""The largest receive buffer of a connection (one whose messages need it grows to it)."""
_FIRST_BUFFER_SIZE = 16 << 10
"""A new connection's receive buffer: a controller's thousand control links would hold
256 MiB at the largest size (measured: 501 MB of controller RSS at 1,000 services)."""
_FREE_REFCOUNT = 3  # list entry + loop variable + getrefcount's argument


def encode_prefix(lengths: Sequence[int]) -> bytes:
    """The bytes that precede a message's frames on the stream."""
    return struct.pack(f"<I{len(lengths)}Q", len(lengths), *lengths)


class BufferPool:
    """Receive buffers for large frames, reused once nothing refers to them any more.

    Fresh memory costs a page fault per 4 KiB page (measured ≈ 1.8 µs each here, which
    alone caps a receiver near 2 GB/s). A buffer handed out is owned by the caller as the
    Connection contract says; the pool reuses it only after every view of it (frames,
    decoded numpy arrays) is gone, which it sees from the buffer's reference count.
    Buffers are kept per size class (64 KiB steps), at most ``max_bytes`` in total.
    """

    def __init__(self, max_bytes: int = 64 << 20, per_class: int = 4) -> None:
        self.max_bytes = max_bytes
        self.per_class = per_class
        self._classes: dict[int, list[np.ndarray]] = {}
        self._bytes = 0
        self.reused = 0
        self.allocated = 0

    def acquire(self, length: int) -> memoryview:
        """A writable view of exactly ``length`` bytes, from a free pooled buffer if any."""
        size = -(-length // _DIRECT_THRESHOLD) * _DIRECT_THRESHOLD
        pooled = self._classes.setdefault(size, [])
        for buf in pooled:
            # Referenced only by the list and by getrefcount's own argument: free again.
            if sys.getrefcount(buf) == _FREE_REFCOUNT:
                self.reused += 1
                raw: Any = buf[:length]
                return memoryview(raw)
        fresh: Any = np.empty(size, np.uint8)
        self.allocated += 1
        if len(pooled) < self.per_class and self._bytes + size <= self.max_bytes:
            pooled.append(fresh)
            self._bytes += size
        return memoryview(fresh[:length])


class FrameParser:
    """Incremental parser: feed it with :meth:`get_buffer` / :meth:`buffer_updated`.

    Complete messages accumulate in :attr:`messages` (the caller pops them); a graceful
    goodbye sets :attr:`goodbye`. Malformed input raises :class:`BadFrame`.
    """

    def __init__(
        self,
        *,
        max_frame_bytes: int,
        max_frames: int,
        handshake: Handshake | None = None,
        send: Any = None,
    ) -> None:
        self.handshake = handshake
        self._send = send  # where the handshake's proof goes (the transport's write)
        self.max_frame_bytes = max_frame_bytes
        self.max_frames = max_frames
        self.messages: list[tuple[list[memoryview], int]] = []
        self.goodbye = False
        self._buf = bytearray(_FIRST_BUFFER_SIZE)
        self._view = memoryview(self._buf)
        self._start = 0
        self._end = 0
        self._preamble_ok = False
        self._lengths: tuple[int, ...] | None = None
        self._frames: list[memoryview] = []
        self._size = 0
        self._direct: memoryview | None = None
        self._pool = BufferPool()
        self._filled = 0

    def get_buffer(self) -> memoryview:
        """Where the next received bytes should be written."""
        if self._direct is not None:
            return self._direct[self._filled :]
        if self._end == len(self._buf):
            self._make_room()
        return self._view[self._end :]

    def _make_room(self) -> None:
        """The buffer is full: move the bytes not parsed yet to its front, into a buffer
        twice as large (up to ``_BUFFER_SIZE``) when they fill half of it or more (a
        message, or a frame header, that does not fit in the buffer as it is). A link of
        many small messages keeps its size: what is left unparsed at the end of a read
        is a part of one message."""
        n = self._end - self._start
        if 2 * n < len(self._buf) or len(self._buf) >= _BUFFER_SIZE:
            self._compact()
            return
        grown = bytearray(min(_BUFFER_SIZE, 2 * len(self._buf)))
        grown[:n] = self._buf[self._start : self._end]
        self._buf, self._view = grown, memoryview(grown)
        self._start, self._end = 0, n

    def _compact(self) -> None:
        n = self._end - self._start
        self._buf[:n] = self._buf[self._start : self._end]
        self._start, self._end = 0, n

    def buffer_updated(self, nbytes: int) -> None:
        """Account for ``nbytes`` written into the last buffer and parse what is complete."""
        if self._direct is not None:
            self._filled += nbytes
            if self._filled == len(self._direct):
                self._frames.append(self._direct)
                self._direct = None
                self._parse()
            return
        self._end += nbytes
        self._parse()

    def _parse(self) -> None:
        while not self.goodbye:
            avail = self._end - self._start
            if not self._preamble_ok:
                if avail < len(PREAMBLE):
                    return
                got = bytes(self._buf[self._start : self._start + len(PREAMBLE)])
                if got != PREAMBLE:
                    raise BadFrame("bad_preamble", f"stream starts with {got!r}, not {PREAMBLE!r}")
                self._start += len(PREAMBLE)
                self._preamble_ok = True
            elif self.handshake is not None and not self.handshake.done:
                if not self._handshake(avail):
                    return
            elif self._lengths is None:
                if not self._parse_lengths(avail):
                    return
            elif len(self._frames) == len(self._lengths):
                self.messages.append((self._frames, self._size))
                self._lengths, self._frames, self._size = None, [], 0
            elif not self._frames and self._size <= avail and self._size < _DIRECT_THRESHOLD:
                self._take_whole_message()
            else:
                if not self._parse_frame(avail, self._lengths[len(self._frames)]):
                    return
        if self._end - self._start:
            raise BadFrame("data_after_goodbye", f"{self._end - self._start} bytes after goodbye")

    def _handshake(self, avail: int) -> bool:
        hs = self.handshake
        assert hs is not None
        if hs.peer_nonce is None:
            if avail < NONCE_BYTES:
                return False
            nonce = bytes(self._buf[self._start : self._start + NONCE_BYTES])
            self._start += NONCE_BYTES
            reply = hs.on_hello(nonce)
            if reply is not None:
                self._send(reply)
            return True
        if avail < PROOF_BYTES:
            return False
        proof = bytes(self._buf[self._start : self._start + PROOF_BYTES])
        self._start += PROOF_BYTES
        reply = hs.on_proof(proof)  # raises BadFrame("auth_failed") before anything else is read
        if reply is not None:
            self._send(reply)
        return True

    def _parse_lengths(self, avail: int) -> bool:
        if avail < 4:
            return False
        (count,) = _COUNT.unpack_from(self._buf, self._start)
        if count == GOODBYE_COUNT:
            self._start += 4
            self.goodbye = True
            return True
        if not 1 <= count <= self.max_frames:
            raise BadFrame(
                "bad_frame_count", f"message declares {count} frames (1..{self.max_frames})"
            )
        need = 4 + 8 * count
        if avail < need:
            if need > len(self._buf) - self._start:
                self._compact()
            return False
        lengths = struct.unpack_from(f"<{count}Q", self._buf, self._start + 4)
        for i, n in enumerate(lengths):
            if n > self.max_frame_bytes:
                raise BadFrame(
                    "frame_too_large",
                    f"frame {i} declares {n} bytes > max_frame_bytes {self.max_frame_bytes}",
                )
        self._start += need
        self._lengths = lengths
        self._size = sum(lengths)
        return True

    def _take_whole_message(self) -> None:
        """A small message that is all in the buffer: one copy, frames are slices of it."""
        assert self._lengths is not None
        size = self._size
        block = memoryview(bytearray(self._view[self._start : self._start + size]))
        offset = 0
        for n in self._lengths:
            self._frames.append(block[offset : offset + n])
            offset += n
        self._start += size

    def _parse_frame(self, avail: int, length: int) -> bool:
        if avail >= length:
            frame = memoryview(bytearray(self._view[self._start : self._start + length]))
            self._start += length
            self._frames.append(frame)
            return True
        if length >= _DIRECT_THRESHOLD:
            # Receive the rest straight into the frame's own buffer: no second copy.
            # np.empty: no zero-fill (bytearray(n) would write every byte once for nothing)
            target = self._pool.acquire(length)
            target[:avail] = self._view[self._start : self._end]
            self._start = self._end = 0
            self._direct, self._filled = target, avail
            return False
        if length > len(self._buf) - self._start:
            self._compact()
        return False
