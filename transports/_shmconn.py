"""One end of an ``shm`` link: :class:`ShmConnection` (see :mod:`tianji.transports.shm`).

The connection owns the Unix socket of the link (hello, doorbells, EOF) and the two ring
ends (:mod:`tianji.transports._shmqueue`); it turns their state into the
:class:`tianji.runtime.core.Connection` behaviour: waiting, errors, closing.

Hello (32 bytes, each side sends one first)::

    magic b"TIANJISH", u32 version, u32 pid, u64 ring data size, u64 reserved
    + SCM_RIGHTS: the descriptor of the ring the sender writes into

After the hello every byte on the socket is a doorbell (``0x01``): "look at the rings
again". Anything else is ``BadFrame``; EOF means the peer is gone.
"""

from __future__ import annotations

import array
import asyncio
import logging
import os
import socket
import struct

from tianji.transports._shmqueue import (
    RingReader,
    RingWriter,
    ShmLease,
    begin_bytes,
    chunk_bytes,
    layout,
    pieces,
)
from tianji.transports._shmring import Ring, ring_size

from tianji.runtime.core import ConnectionStatistics, Frames, Limits
from tianji.runtime.errors import (
    BadFrame,
    BrokenByPeer,
    ClosedByUs,
    EndOfStream,
    TianjiError,
    WouldBlock,
)

__all__ = ["HELLO", "HELLO_MAGIC", "ShmConnection"]

log = logging.getLogger("tianji.transports.shm")

CLOSE_TIMEOUT = 30.0  # how long aclose waits for a large message still being written
HELLO = struct.Struct("<8sIIQQ")  # magic, version, pid, ring data size, reserved
HELLO_MAGIC = b"TIANJISH"
HELLO_VERSION = 1
DOORBELL = b"\x01"


class ShmConnection:
    """One end of a shared-memory link. See :class:`tianji.runtime.core.Connection`.

    Beyond that protocol, :meth:`recv_lease` receives without copying.
    """

    def __init__(self, sock: socket.socket, limits: Limits, peer: str, max_ring: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._sock: socket.socket | None = sock
        self._limits = limits
        self._peer = peer
        self.close_timeout = CLOSE_TIMEOUT
        self._closed = False
        self._error: TianjiError | None = None
        self._can_recv = asyncio.Event()
        self._can_send = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._hello = bytearray()
        self._hello_fds: list[int] = []
        self.messages_sent = self.bytes_sent = self.messages_received = self.bytes_received = 0
        ring, fd = Ring.create(ring_size(limits.queue_bytes, max_ring))
        self._w: RingWriter | None = RingWriter(ring, limits, self._doorbell)
        self._r: RingReader | None = None  # once the peer's hello brought its ring
        try:
            hello = HELLO.pack(HELLO_MAGIC, HELLO_VERSION, os.getpid(), ring.size, 0)
            rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))]
            sock.sendmsg([hello], rights, socket.MSG_NOSIGNAL)
        except OSError as exc:
            self._peer_gone(f"{type(exc).__name__}: {exc}")
            return
        finally:
            os.close(fd)
        self._loop.add_reader(sock.fileno(), self._on_readable)

    @property
    def peer(self) -> str:
        return self._peer

    # ------------------------------------------------------------------ sending
    def _live_writer(self) -> RingWriter:
        if self._error is not None:
            raise self._error
        if self._w is None:
            raise ClosedByUs(f"shm connection to {self._peer}")
        return self._w

    def _check_open(self) -> RingWriter:
        if self._closed:
            raise ClosedByUs(f"shm connection to {self._peer}")
        return self._live_writer()

    def _prepare(self, frames: Frames) -> tuple[list[memoryview], list[int], int, int]:
        if self._closed or self._error is not None or self._w is None:
            self._check_open()
        views, size = self._limits.check_message(frames)  # before anything is copied
        lengths, rec = layout(views)
        return views, lengths, size, rec

    def _count(self, size: int) -> None:
        self.messages_sent += 1
        self.bytes_sent += size

    async def send(self, frames: Frames) -> None:
        views, lengths, size, rec = self._prepare(frames)
        w = self._w
        if self._writer is None and w is not None and rec <= w.half and w.room(rec, True):
            w.write_message(views, lengths, rec, size)  # the common case: room in the ring
            self.messages_sent += 1
            self.bytes_sent += size
            return
        while True:
            if self._writer is not None:
                await self._join_writer()
                continue
            w = self._check_open()
            if rec > w.half:
                self._start_writer(views, size)
                await self._join_writer()
                return
            if w.room(rec, True):
                w.write_message(views, lengths, rec, size)
                self._count(size)
                return
            await self._wait_room(w, rec, True)

    def send_nowait(self, frames: Frames) -> None:
        views, lengths, size, rec = self._prepare(frames)
        w = self._check_open()
        big = rec > w.half
        if self._writer is not None or not w.room(begin_bytes(len(views)) if big else rec, True):
            raise WouldBlock(f"shm send {self._peer}", *w.in_flight())
        if big:
            self._start_writer(views, size)
        else:
            w.write_message(views, lengths, rec, size)
            self._count(size)

    async def drain(self) -> None:
        """Return once every message given to ``send``/``send_nowait`` is in the ring."""
        while self._writer is not None:
            await self._join_writer()
        self._check_open()

    async def _wait_room(self, w: RingWriter, rec: int, message: bool) -> None:
        self._can_send.clear()
        w.arm_wait(rec, message)
        if not w.room(rec, message):
            await self._can_send.wait()
        if self._w is w:
            w.disarm_wait()

    # large messages: written by a task, so a cancelled send never leaves half a message
    def _start_writer(self, views: list[memoryview], size: int) -> None:
        self._count(size)
        task = self._loop.create_task(self._write_large(views, size))
        self._writer = task
        task.add_done_callback(self._writer_done)

    def _writer_done(self, task: asyncio.Task[None]) -> None:
        if self._writer is task:
            self._writer = None
        exc = None if task.cancelled() else task.exception()
        if exc is not None and not isinstance(exc, TianjiError):
            log.error("shm writer to %s failed", self._peer, exc_info=exc)
            self.abort()
        self._can_send.set()

    async def _join_writer(self) -> None:
        if self._writer is not None:
            await asyncio.wait({self._writer})  # if we are cancelled, the writer runs on
        self._check_open()

    async def _room_for(self, rec: int, message: bool) -> RingWriter:
        while True:
            w = self._live_writer()
            if w.room(rec, message):
                return w
            await self._wait_room(w, rec, message)

    async def _write_large(self, views: list[memoryview], size: int) -> None:
        (await self._room_for(begin_bytes(len(views)), True)).write_begin(views, size)
        source = pieces(views)
        next(source)
        left = size
        while left:
            k = min(left, self._live_writer().chunk)
            w = await self._room_for(chunk_bytes(k), False)
            left -= k
            w.write_chunk(source, k, size, last=not left)

    # ------------------------------------------------------------------ receiving
    async def recv(self) -> list[memoryview]:
        frames, _ = await self._next(lease=False)
        return frames

    async def recv_batch(
        self, max_messages: int = 64, max_bytes: int = 1 << 20
    ) -> list[list[memoryview]]:
        """Wait for a message, then take every further complete one already in the ring
        (up to ``max_messages`` in all, and no more once those beyond the first reach
        ``max_bytes``): one wake-up for a burst."""
        return [frames for frames, _ in await self._burst(False, max_messages, max_bytes)]

    async def recv_lease_batch(
        self, max_messages: int = 64, max_bytes: int = 1 << 20
    ) -> list[ShmLease]:
        """:meth:`recv_batch`, each message as a lease on the ring (see :meth:`recv_lease`);
        release them in any order, the space returns in order."""
        burst = await self._burst(True, max_messages, max_bytes)
        return [held for _, held in burst if held is not None]

    async def _burst(
        self, lease: bool, max_messages: int, max_bytes: int
    ) -> list[tuple[list[memoryview], ShmLease | None]]:
        batch = [await self._next(lease)]
        nbytes = 0
        while len(batch) < max_messages and nbytes < max_bytes:
            got = self._take_ready(lease)
            if got is None:
                break
            batch.append(got)
            nbytes += sum([f.nbytes for f in got[0]])
        return batch

    def _take_ready(self, lease: bool) -> tuple[list[memoryview], ShmLease | None] | None:
        """The next complete message if one is in the ring now (never waits, never raises:
        a malformed record closes the connection and is left in ``_error`` for ``recv``)."""
        r = self._r
        if r is None or self._closed:
            return None
        try:
            got = r.take(lease)
        except BadFrame as exc:
            self._fail(exc.with_peer(self._peer))
            return None
        if got is not None:
            self.messages_received += 1
            self.bytes_received += sum([f.nbytes for f in got[0]])
        return got

    async def recv_lease(self) -> ShmLease:
        """Receive the next message as views into the ring, without a copy.

        Usage::

            with await conn.recv_lease() as frames:   # or: lease = ...; lease.release()
                obs = np.frombuffer(frames[1], dtype=np.float32)
                ...                                    # done with obs before release

        The ring space goes back to the sender on release, in order: see :class:`ShmLease`.
        """
        _, lease = await self._next(lease=True)
        assert lease is not None
        return lease

    async def _next(self, lease: bool) -> tuple[list[memoryview], ShmLease | None]:
        while True:
            if self._closed:
                raise ClosedByUs(f"shm connection to {self._peer}")
            got = self._take_ready(lease)  # a malformed record: self._error, raised below
            if got is not None:
                return got
            r = self._r
            if r is not None and r.ended():
                if r.mid_message:
                    raise BrokenByPeer(self._peer, "goodbye in the middle of a message")
                raise EndOfStream(self._peer)
            if self._error is not None:
                raise self._error
            self._can_recv.clear()
            if r is None or r.sleep():
                await self._can_recv.wait()

    # ------------------------------------------------------------------ socket events
    def _doorbell(self) -> None:
        if self._sock is not None:
            try:
                self._sock.send(DOORBELL, socket.MSG_NOSIGNAL)
            except BlockingIOError:  # full: the peer has wake-ups pending
                return
            except OSError as exc:  # gone: our reader sees the EOF
                log.debug("%s: doorbell: %r", self.peer, exc)

    def _on_readable(self) -> None:
        if self._sock is None:
            return
        if self._r is None:
            self._read_hello()
            return
        try:
            data = self._sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._peer_gone(f"{type(exc).__name__}: {exc}")
            return
        if not data:
            self._peer_gone("connection closed without goodbye")
        elif data.count(DOORBELL) != len(data):
            self._fail(BadFrame("bad_control", f"unexpected bytes {data[:16]!r}", self._peer))
        else:
            self._can_recv.set()
            self._can_send.set()

    def _read_hello(self) -> None:
        assert self._sock is not None
        try:
            msg, ancillary, flags, _ = self._sock.recvmsg(
                HELLO.size - len(self._hello), socket.CMSG_SPACE(4 * 4)
            )
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._peer_gone(f"{type(exc).__name__}: {exc}")
            return
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
                self._hello_fds.extend(fds)
        if not msg:
            self._peer_gone("connection closed during the handshake")
            return
        self._hello += msg
        try:
            self._check_hello(flags)
        except (BadFrame, OSError) as exc:
            bad = exc if isinstance(exc, BadFrame) else BadFrame("bad_handshake", str(exc))
            self._fail(bad.with_peer(self._peer))

    def _check_hello(self, flags: int) -> None:
        got = bytes(self._hello[: len(HELLO_MAGIC)])
        if not HELLO_MAGIC.startswith(got) or flags & socket.MSG_CTRUNC:
            raise BadFrame("bad_handshake", f"hello starts with {got!r}, not {HELLO_MAGIC!r}")
        if len(self._hello) < HELLO.size:
            return
        _, version, _, size, _ = HELLO.unpack(self._hello)
        if version != HELLO_VERSION or len(self._hello_fds) != 1:
            raise BadFrame(
                "bad_handshake",
                f"hello version {version} with {len(self._hello_fds)} descriptors (expected 1)",
            )
        fd = self._hello_fds.pop()
        try:
            self._r = RingReader(Ring.attach(fd, size), self._limits, self._doorbell)
        finally:
            os.close(fd)
        self._can_recv.set()

    async def _handshake(self) -> None:
        """Wait for the peer's hello (``connect`` returns a link that is ready)."""
        while self._r is None:
            self._check_open()
            self._can_recv.clear()
            await self._can_recv.wait()

    # ------------------------------------------------------------------ closing
    def _peer_gone(self, reason: str) -> None:
        if self._error is None:
            goodbye = self._r is not None and self._r.said_goodbye
            self._error = EndOfStream(self._peer) if goodbye else BrokenByPeer(self._peer, reason)
        self._close_socket()
        self._wake()

    def _fail(self, error: TianjiError) -> None:
        """The peer sent garbage: close this connection only, without goodbye."""
        if self._error is None:
            self._error = error
            log.warning("closing shm connection from %s: %s", self._peer, error)
        self._close_socket()
        if self._r is not None:
            self._r.close()
            self._r = None
        self._wake()

    def _wake(self) -> None:
        self._can_recv.set()
        self._can_send.set()

    def _close_socket(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                self._loop.remove_reader(sock.fileno())
            except (RuntimeError, ValueError, OSError) as exc:  # loop closed already
                log.debug("%s: remove_reader: %r", self.peer, exc)
            sock.close()
        for fd in self._hello_fds:
            os.close(fd)
        self._hello_fds.clear()

    def _teardown(self, goodbye: bool) -> None:
        w, self._w = self._w, None
        if w is not None:
            if goodbye and self._error is None:
                w.goodbye()  # after the last record: the peer drains, then ends
            w.ring.close()
        if self._writer is not None:
            self._writer.cancel()
        self._close_socket()
        r, self._r = self._r, None
        if r is not None:
            r.close()
        self._wake()

    async def aclose(self) -> None:
        """Finish a large message being written, say goodbye and close. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._wake()  # pending recv/send calls raise ClosedByUs
        writer = self._writer
        if writer is not None:
            done, _ = await asyncio.wait({writer}, timeout=self.close_timeout)
            if not done:
                log.warning(
                    "%s did not read a large message within %.1fs; aborting",
                    self._peer,
                    self.close_timeout,
                )
                self._teardown(goodbye=False)
                return
        self._teardown(goodbye=True)

    def abort(self) -> None:
        """Close at once without goodbye: the peer sees :class:`BrokenByPeer`."""
        self._closed = True
        self._teardown(goodbye=False)

    def statistics(self) -> ConnectionStatistics:
        sent = self._w.in_flight() if self._w is not None else (0, 0)
        queued = (0, 0)
        if self._r is not None:
            queued = self._r.queued(self.messages_received, self.bytes_received)
        return ConnectionStatistics(
            messages_sent=self.messages_sent,
            bytes_sent=self.bytes_sent,
            messages_received=self.messages_received,
            bytes_received=self.bytes_received,
            send_queue_messages=sent[0],
            send_queue_bytes=sent[1],
            recv_queue_messages=queued[0],
            recv_queue_bytes=queued[1],
        )

    async def __aenter__(self) -> ShmConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
