"""Shared-memory transport (``shm://NAME``): processes on one host, frames through rings.

Each direction of a link is a single-producer single-consumer ring in a ``/dev/shm``
segment (layout in :mod:`~tianji.transports._shmring`, ring ends in
:mod:`~tianji.transports._shmqueue`, the connection in :mod:`~tianji.transports._shmconn`;
this module holds the listener and the transport). ``send`` writes each frame once into the ring;
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

import asyncio
import itertools
import logging
import os
import re
import secrets
import socket
import struct

from tianji.transports._shmconn import HELLO, HELLO_MAGIC, ShmConnection
from tianji.transports._shmqueue import ShmLease
from tianji.transports._shmring import sweep_stale_segments

from tianji.runtime.core import Limits
from tianji.runtime.errors import BrokenByPeer, ClosedByUs
from tianji.runtime.queues import BoundedQueue

__all__ = [
    "HELLO",
    "HELLO_MAGIC",
    "ShmConnection",
    "ShmLease",
    "ShmListener",
    "ShmTransport",
    "socket_address",
]

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT = 10.0  # how long connect waits for the listener's hello
MAX_RING = 4 << 20  # per direction; 4 MiB (the L2 size here) beat 8 MiB at 64 KiB and 1 MiB
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
                log.warning("%s: accept failed: %s", self.address, str(exc))
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
            log.warning("%s: cannot serve pid %d: %s", self.address, pid, str(exc))
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
