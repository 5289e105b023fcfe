"""Shared-memory transport (``shm://NAME``): processes on one host, frames through rings.

Each direction of a link is a single-producer single-consumer ring in a ``/dev/shm``
segment (layout in :mod:`tianji.transports._shmring`, ring ends in
:mod:`tianji.transports._shmqueue`). ``send`` writes each frame once into the ring;
``recv`` copies it out once into buffers the caller owns, and
:meth:`ShmConnection.recv_lease` hands out views into the ring itself, whose space is
freed when the lease is released. Messages larger than half a ring travel in chunks.

Control runs over a Unix socket in Linux's abstract namespace (``\\0tianji-shm-NAME``: no
socket file). On connect both ends send a 32-byte hello carrying the descriptor of the
ring they write into (``SCM_RIGHTS``); the segment files are unlinked before that, so a
kill -9 at any later point leaves nothing in ``/dev/shm``. After the hello the socket
carries only doorbell bytes, and its EOF says the peer is gone.

Wake-ups: the socket is registered with ``loop.add_reader``. The writer rings (one byte)
only when the reader announced that it sleeps; the reader rings only when the writer
waits for room and enough was freed. A busy link makes no syscalls for wake-ups; an idle
link costs nothing (no timers, no polling).

Closing: ``aclose`` marks goodbye after the last record and closes the socket; the peer's
mapping keeps the ring, so it reads everything, then ``EndOfStream``. ``abort`` (or a
crash) closes without goodbye: ``BrokenByPeer`` once the data is read.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import itertools
import logging
import os
import re
import secrets
import socket
import struct

from tianji.transports._shmqueue import (
    RingReader,
    RingWriter,
    ShmLease,
    begin_bytes,
    chunk_bytes,
    message_bytes,
    pieces,
)
from tianji.transports._shmring import Ring, ring_size, sweep_stale_segments

from tianji.core import ConnectionStatistics, Frames, Limits
from tianji.errors import BadFrame, BrokenByPeer, ClosedByUs, EndOfStream, TianjiError, WouldBlock
from tianji.queues import BoundedQueue

__all__ = ["ShmConnection", "ShmLease", "ShmListener", "ShmTransport", "socket_address"]

log = logging.getLogger(__name__)

CLOSE_TIMEOUT = 30.0  # how long aclose waits for a large message still being written
HANDSHAKE_TIMEOUT = 10.0  # how long connect waits for the listener's hello
MAX_RING = 8 << 20
HELLO = struct.Struct("<8sIIQQ")  # magic, version, pid, ring data size, reserved
HELLO_MAGIC = b"TIANJISH"
HELLO_VERSION = 1
DOORBELL = b"\x01"
_NAME = re.compile(r"[A-Za-z0-9._-]{1,80}")
_ids = itertools.count(1)


def socket_address(address: str) -> bytes:
    """The abstract Unix socket name behind ``shm://NAME``.

    Raises:
        ValueError: if ``address`` is not ``shm://NAME`` with a non-empty NAME.
    """
    name = _name_of(address)
    if not name:
        raise ValueError(f"shm address {address!r} has no name")
    return b"\0tianji-shm-" + name.encode()


def _name_of(address: str) -> str:
    scheme, sep, name = address.partition("://")
    if scheme != "shm" or not sep or (name and not _NAME.fullmatch(name)):
        raise ValueError(
            f"not an shm address: {address!r} (expected shm://NAME, NAME of letters, digits, "
            "'.', '_', '-')"
        )
    return name


class ShmConnection:
    """One end of a shared-memory link. See :class:`tianji.core.Connection`.

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

    def _prepare(self, frames: Frames) -> tuple[list[memoryview], int, int]:
        self._check_open()
        views, size = self._limits.check_message(frames)  # before anything is copied
        return views, size, message_bytes(views)

    def _count(self, size: int) -> None:
        self.messages_sent += 1
        self.bytes_sent += size

    async def send(self, frames: Frames) -> None:
        views, size, rec = self._prepare(frames)
        w = self._w
        if self._writer is None and w is not None and rec <= w.half and w.room(rec, True):
            w.write_message(views, rec, size)  # the common case: room in the ring
            self._count(size)
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
                w.write_message(views, rec, size)
                self._count(size)
                return
            await self._wait_room(w, rec, True)

    def send_nowait(self, frames: Frames) -> None:
        views, size, rec = self._prepare(frames)
        w = self._check_open()
        big = rec > w.half
        if self._writer is not None or not w.room(begin_bytes(len(views)) if big else rec, True):
            raise WouldBlock(f"shm send {self._peer}", *w.in_flight())
        if big:
            self._start_writer(views, size)
        else:
            w.write_message(views, rec, size)
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
        yielded = False
        while True:
            if self._closed:
                raise ClosedByUs(f"shm connection to {self._peer}")
            r = self._r
            if r is not None:
                try:
                    got = r.take(lease)
                except BadFrame as exc:
                    self._fail(exc.with_peer(self._peer))
                    raise exc.with_peer(self._peer) from None
                if got is not None:
                    self.messages_received += 1
                    self.bytes_received += sum([f.nbytes for f in got[0]])
                    return got
                if r.ended():
                    if r.mid_message:
                        raise BrokenByPeer(self._peer, "goodbye in the middle of a message")
                    raise EndOfStream(self._peer)
            if self._error is not None:
                raise self._error
            if r is not None and not yielded:
                # Streaming, the writer is likely to publish again within a loop turn: look
                # once more before asking for a doorbell (saves both sides a syscall).
                yielded = True
                await asyncio.sleep(0)
                continue
            self._can_recv.clear()
            if r is None or r.sleep():
                await self._can_recv.wait()

    # ------------------------------------------------------------------ socket events
    def _doorbell(self) -> None:
        if self._sock is not None:
            # full: the peer has wake-ups pending; gone: our reader sees the EOF
            with contextlib.suppress(OSError):
                self._sock.send(DOORBELL, socket.MSG_NOSIGNAL)

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
            with contextlib.suppress(RuntimeError, ValueError, OSError):  # loop closed already
                self._loop.remove_reader(sock.fileno())
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


class ShmListener:
    """Accepts shm connections on ``shm://NAME`` (an abstract Unix socket).

    Connections are queued for :meth:`accept` as soon as they arrive; their handshake
    completes in the background (a stranger's garbage surfaces as ``BadFrame`` on that
    connection's ``recv``).
    """

    def __init__(self, name: str, limits: Limits, max_ring: int, backlog: int) -> None:
        self._name = name
        self._limits = limits
        self._max_ring = max_ring
        self._loop = asyncio.get_running_loop()
        self._pending: BoundedQueue[ShmConnection] = BoundedQueue(
            f"shm accept queue {name}", max_items=backlog, max_bytes=backlog
        )
        self._sock: socket.socket | None = None
        self.refused = 0

    @property
    def address(self) -> str:
        return f"shm://{self._name}"

    def _start(self, backlog: int) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.bind(socket_address(self.address))
        except OSError as exc:
            sock.close()
            raise OSError(exc.errno, f"shm address {self.address!r} is already in use") from exc
        sock.listen(backlog)
        sock.setblocking(False)
        self._sock = sock
        self._loop.add_reader(sock.fileno(), self._on_connection)

    def _on_connection(self) -> None:
        while self._sock is not None:
            try:
                sock, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. out of descriptors: that client sees a hang-up
                log.warning("%s: accept failed: %s", self.address, exc)
                return
            self._admit(sock)

    def _admit(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        pid, uid = _peer_credentials(sock)
        if len(self._pending) >= self._pending.max_items or uid not in (os.getuid(), 0):
            self.refused += 1
            log.warning(
                "%s: refusing pid %d (uid %d): accept queue full or another user",
                self.address,
                pid,
                uid,
            )
            sock.close()
            return
        try:
            conn = ShmConnection(sock, self._limits, f"{self.address}<-pid{pid}", self._max_ring)
        except OSError as exc:  # no room in /dev/shm, no descriptors, ...
            log.warning("%s: cannot serve pid %d: %s", self.address, pid, exc)
            sock.close()
            return
        self._pending.put_nowait(conn, 1)

    async def accept(self) -> ShmConnection:
        return await self._pending.get()

    async def aclose(self) -> None:
        """Stop listening (idempotent); already accepted connections stay open."""
        sock, self._sock = self._sock, None
        if sock is not None:
            self._loop.remove_reader(sock.fileno())
            sock.close()
        self._pending.close(ClosedByUs(self.address))
        while len(self._pending):
            self._pending.get_nowait().abort()

    async def __aenter__(self) -> ShmListener:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _peer_credentials(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a Unix socket."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _ = struct.unpack("3i", creds)
    return pid, uid


class ShmTransport:
    """``shm://NAME`` between processes of one host and user; ``shm://`` picks a fresh name.

    Linux only (abstract Unix sockets, ``/dev/shm``). Every ``listen`` and ``connect``
    first removes ring files left behind by killed processes.

    Args:
        max_ring: the largest ring per direction, in bytes; a link's ring holds
            ``Limits.queue_bytes``, at least 1 MiB and at most this.
        backlog: connections waiting for ``accept`` before new ones are refused.
    """

    scheme = "shm"

    def __init__(self, *, max_ring: int = MAX_RING, backlog: int = 256) -> None:
        self.max_ring = max_ring
        self.backlog = backlog

    async def listen(self, address: str, *, limits: Limits) -> ShmListener:
        name = _name_of(address) or f"{os.getpid()}-{next(_ids)}-{secrets.token_hex(3)}"
        sweep_stale_segments()
        listener = ShmListener(name, limits, self.max_ring, self.backlog)
        listener._start(self.backlog)
        return listener

    async def connect(self, address: str, *, limits: Limits) -> ShmConnection:
        target = socket_address(address)
        sweep_stale_segments()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(sock, target)
            _, uid = _peer_credentials(sock)
            if uid not in (os.getuid(), 0):
                raise ConnectionRefusedError(f"the listener runs as uid {uid}")
        except OSError as exc:
            sock.close()
            raise BrokenByPeer(address, f"connect failed: {exc.strerror or exc}") from exc
        except BaseException:
            sock.close()
            raise
        try:
            conn = ShmConnection(sock, limits, address, self.max_ring)
        except BaseException:
            sock.close()
            raise
        try:
            await asyncio.wait_for(conn._handshake(), HANDSHAKE_TIMEOUT)
        except TimeoutError:
            conn.abort()
            raise BrokenByPeer(address, f"no hello within {HANDSHAKE_TIMEOUT}s") from None
        except BaseException:
            conn.abort()
            raise
        return conn
