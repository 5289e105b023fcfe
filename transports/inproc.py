"""In-process transport (``inproc://name``): the reference implementation.

Both ends live in one event loop. Each direction is a :class:`BoundedQueue`, so a slow
receiver makes the sender wait exactly as over a network. Frames are copied into fresh
``bytearray`` objects on send, so a sender may reuse its buffers at once (as with TCP),
and receivers get writable buffers.
"""

from __future__ import annotations

import asyncio
import itertools

from tianji.runtime.core import ConnectionStatistics, Frames, Limits
from tianji.runtime.errors import BrokenByPeer, ClosedByUs, EndOfStream, TianjiError
from tianji.runtime.queues import BoundedQueue

__all__ = ["InprocConnection", "InprocListener", "InprocTransport"]

_listeners: dict[str, InprocListener] = {}
_ids = itertools.count(1)


class InprocConnection:
    """One end of an in-process link. See :class:`tianji.runtime.core.Connection`."""

    def __init__(self, local: str, peer: str, limits: Limits) -> None:
        self._local = local
        self._peer_name = peer
        self._limits = limits
        self._inbox: BoundedQueue[list[memoryview]] = BoundedQueue(
            f"inproc {local}<-{peer}", max_items=limits.queue_messages, max_bytes=limits.queue_bytes
        )
        self._other: InprocConnection | None = None
        self._closed = False
        self._stats = ConnectionStatistics()

    @staticmethod
    def pair(a: str, b: str, limits: Limits) -> tuple[InprocConnection, InprocConnection]:
        left, right = InprocConnection(a, b, limits), InprocConnection(b, a, limits)
        left._other, right._other = right, left
        return left, right

    @property
    def peer(self) -> str:
        return self._peer_name

    def _prepare(self, frames: Frames) -> tuple[list[memoryview], int]:
        if self._closed:
            raise ClosedByUs(f"inproc connection to {self._peer_name}")
        views, size = self._limits.check_message(frames)  # before any copy
        return [memoryview(bytearray(v)) for v in views], size

    def _count(self, size: int) -> None:
        self._stats.messages_sent += 1
        self._stats.bytes_sent += size

    async def send(self, frames: Frames) -> None:
        copies, size = self._prepare(frames)
        assert self._other is not None
        await self._other._inbox.put(copies, size)
        self._count(size)

    def send_nowait(self, frames: Frames) -> None:
        copies, size = self._prepare(frames)
        assert self._other is not None
        self._other._inbox.put_nowait(copies, size)
        self._count(size)

    async def drain(self) -> None:
        if self._closed:
            raise ClosedByUs(f"inproc connection to {self._peer_name}")

    async def recv(self) -> list[memoryview]:
        try:
            if self._closed:
                raise ClosedByUs(f"inproc connection to {self._peer_name}")
            frames = await self._inbox.get()
        except TianjiError:
            if self._closed:  # we closed, maybe while waiting: say so, whatever the peer did
                raise ClosedByUs(f"inproc connection to {self._peer_name}") from None
            raise
        self._stats.messages_received += 1
        self._stats.bytes_received += sum(f.nbytes for f in frames)
        return frames

    async def recv_batch(
        self, max_messages: int = 64, max_bytes: int = 1 << 20
    ) -> list[list[memoryview]]:
        """Wait for a message, then take every further one already queued (up to
        ``max_messages`` in all, and no more once those beyond the first reach
        ``max_bytes``)."""
        batch = [await self.recv()]
        nbytes = 0
        while len(batch) < max_messages and nbytes < max_bytes and len(self._inbox):
            frames = self._inbox.get_nowait()
            size = sum(f.nbytes for f in frames)
            self._stats.messages_received += 1
            self._stats.bytes_received += size
            nbytes += size
            batch.append(frames)
        return batch

    async def aclose(self) -> None:
        self._shutdown(EndOfStream(self._local))

    def abort(self) -> None:
        self._shutdown(BrokenByPeer(self._local, "connection aborted"))

    def _shutdown(self, peer_error: EndOfStream | BrokenByPeer) -> None:
        if self._closed:
            return
        self._closed = True
        # The peer sends into our inbox: from its side, we ended the stream (or vanished).
        self._inbox.close(peer_error, discard=True)
        if self._other is not None:
            self._other._inbox.close(peer_error)

    def statistics(self) -> ConnectionStatistics:
        s = self._stats
        other = self._other._inbox if self._other is not None else None
        return ConnectionStatistics(
            messages_sent=s.messages_sent,
            bytes_sent=s.bytes_sent,
            messages_received=s.messages_received,
            bytes_received=s.bytes_received,
            send_queue_messages=len(other) if other is not None else 0,
            send_queue_bytes=other.nbytes if other is not None else 0,
            recv_queue_messages=len(self._inbox),
            recv_queue_bytes=self._inbox.nbytes,
        )

    async def __aenter__(self) -> InprocConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class InprocListener:
    """Accepts in-process connections on ``inproc://name``."""

    def __init__(self, name: str, limits: Limits, backlog: int = 128) -> None:
        self._name = name
        self._limits = limits
        self._pending: BoundedQueue[InprocConnection] = BoundedQueue(
            f"inproc listener {name}", max_items=backlog, max_bytes=backlog
        )

    @property
    def address(self) -> str:
        return f"inproc://{self._name}"

    def _offer(self, conn: InprocConnection) -> None:
        self._pending.put_nowait(conn, 1)

    async def accept(self) -> InprocConnection:
        return await self._pending.get()

    async def aclose(self) -> None:
        if _listeners.get(self._name) is self:
            del _listeners[self._name]
        self._pending.close(ClosedByUs(self.address))
        while len(self._pending):
            self._pending.get_nowait().abort()

    async def __aenter__(self) -> InprocListener:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class InprocTransport:
    """``inproc://NAME``; ``inproc://`` (empty name) picks a unique one, like port 0."""

    scheme = "inproc"

    async def listen(self, address: str, *, limits: Limits) -> InprocListener:
        name = _name_of(address) or f"auto-{next(_ids)}"
        if name in _listeners:
            raise OSError(f"inproc address {address!r} is already in use")
        listener = InprocListener(name, limits)
        _listeners[name] = listener
        return listener

    async def connect(self, address: str, *, limits: Limits) -> InprocConnection:
        name = _name_of(address)
        listener = _listeners.get(name)
        if listener is None:
            raise BrokenByPeer(address, "connection refused: nothing listens there")
        await asyncio.sleep(0)  # connecting is a suspension point, as for real transports
        local, remote = InprocConnection.pair(f"inproc-client-{next(_ids)}", address, limits)
        try:
            listener._offer(remote)
        except TianjiError as exc:  # backlog full, or the listener closed meanwhile
            raise BrokenByPeer(address, f"connection refused: {exc}") from None
        return local


def _name_of(address: str) -> str:
    scheme, sep, name = address.partition("://")
    if scheme != "inproc" or not sep:
        raise ValueError(f"not an inproc address: {address!r}")
    return name
