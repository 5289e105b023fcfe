"""TCP transport (``tcp://HOST:PORT``, port 0 picks a free port).

Receiving uses :class:`asyncio.BufferedProtocol`: the kernel writes into the parser's
preallocated buffer, and large frames straight into their final ``bytearray`` (see
:mod:`tianji.transports._framing`). Sending writes the length prefix and then each frame
as a memoryview (no concatenation). Backpressure runs end to end: a full receive queue
pauses reading, the peer's kernel buffers fill, the sender's write buffer passes its high
water mark and ``send`` waits. ``TCP_NODELAY`` is set on every socket.

Every connection starts with the run-token handshake (:mod:`tianji.transports._auth`):
with a token (``TIANJI_TOKEN``, or ``TcpTransport(token=...)``) a peer that cannot prove
it knows the same token is refused with a logged reason before any of its data is read;
``connect`` and ``accept`` hand out a connection only once the handshake succeeded.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from typing import cast

from tianji.transports._address import format_tcp_address, parse_tcp_address
from tianji.transports._auth import TOKEN_HINT, Handshake, token_from_env
from tianji.transports._framing import GOODBYE, PREAMBLE, FrameParser, encode_prefix
from tianji.transports._tls import TLS_HINT, TlsFiles, client_context, server_context, tls_from_env

from tianji.runtime.core import ConnectionStatistics, Frames, Limits
from tianji.runtime.errors import (
    BadFrame,
    BrokenByPeer,
    ClosedByUs,
    EndOfStream,
    HandshakeRefused,
    TianjiError,
    WouldBlock,
)
from tianji.runtime.queues import BoundedQueue

__all__ = ["TcpConnection", "TcpListener", "TcpTransport", "parse_tcp_address"]

log = logging.getLogger(__name__)
_LARGE = 16 << 10  # frames this big are written as memoryviews, not copied into the cork
_CORK_LIMIT = 256 << 10  # corked bytes are flushed at once beyond this
CLOSE_TIMEOUT = 10.0  # how long aclose waits for the peer to read everything and close
HANDSHAKE_TIMEOUT = 30.0  # a peer that has not proved the token by then is dropped (generous: a
# starting process on a loaded machine can take seconds to answer)


class _StreamProtocol(asyncio.BufferedProtocol):
    """Glue between an asyncio transport and a :class:`TcpConnection`."""

    def __init__(self, limits: Limits, peer_hint: str, role: str, token: bytes | None) -> None:
        self.limits = limits
        self.peer = peer_hint
        self.transport: asyncio.Transport | None = None
        self.handshake = Handshake(role, token)
        self.parser = FrameParser(
            max_frame_bytes=limits.max_frame_bytes,
            max_frames=limits.max_frames,
            handshake=self.handshake,
            send=self._write_raw,
        )
        self._handshake_timer: asyncio.TimerHandle | None = None
        self.inbox: BoundedQueue[list[memoryview]] = BoundedQueue(
            f"tcp recv {peer_hint}", max_items=limits.queue_messages, max_bytes=limits.queue_bytes
        )
        self.connected = asyncio.get_running_loop().create_future()
        self.lost = asyncio.get_running_loop().create_future()
        self.error: TianjiError | None = None
        self._writable = asyncio.Event()
        self._writable.set()
        self._reading_paused = False
        self.discarded = 0  # messages that arrived after the inbox was closed

    # -------------------------------------------------------------- asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peername = transport.get_extra_info("peername")
        if peername:
            self.peer = format_tcp_address(str(peername[0]), int(peername[1]))
            self.inbox.name = f"tcp recv {self.peer}"
        high = self.limits.queue_bytes
        self.transport.set_write_buffer_limits(high=high, low=high // 4)
        self.transport.write(PREAMBLE + self.handshake.hello())
        self._handshake_timer = asyncio.get_running_loop().call_later(
            HANDSHAKE_TIMEOUT, self._handshake_expired
        )

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.parser.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        try:
            self.parser.buffer_updated(nbytes)
        except BadFrame as exc:
            self._deliver()  # complete messages before the bad bytes still count
            self._fail(exc.with_peer(self.peer))
            return
        if self.handshake.done and not self.connected.done():
            self._handshake_succeeded()
        self._deliver()
        if self.parser.goodbye:
            self.inbox.close(EndOfStream(self.peer))
        elif self.inbox.full() and not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        if not self.parser.goodbye:
            self._fail(BrokenByPeer(self.peer, "connection closed without goodbye"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.error is None and not self.parser.goodbye:
            reason = f"{type(exc).__name__}: {exc}" if exc else "connection closed without goodbye"
            self.error = BrokenByPeer(self.peer, reason)
        self.inbox.close(self.error or EndOfStream(self.peer))
        self._writable.set()
        if not self.lost.done():
            self.lost.set_result(None)
        if not self.connected.done():
            self.connected.set_exception(self.error or EndOfStream(self.peer))

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # -------------------------------------------------------------- helpers
    def _write_raw(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def _handshake_succeeded(self) -> None:
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
        self.connected.set_result(None)

    def _handshake_expired(self) -> None:
        if not self.handshake.done:
            why = f"no proof of the run token within {HANDSHAKE_TIMEOUT:g} s"
            self._fail(BadFrame("auth_timeout", why).with_peer(self.peer))

    def _deliver(self) -> None:
        if self.inbox.closed:  # closed locally: the application no longer reads
            self.discarded += len(self.parser.messages)
        else:
            for frames, size in self.parser.messages:
                self.inbox.put_force(frames, size)
        self.parser.messages.clear()

    def _fail(self, error: TianjiError) -> None:
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
        if self.error is None:
            self.error = error
            if isinstance(error, BadFrame):
                log.warning("closing connection from %s: %s", self.peer, str(error))
        self.inbox.close(error)
        if self.transport is not None:
            self.transport.abort()

    def after_get(self) -> None:
        """Resume reading once the inbox has room again (or was closed)."""
        if self._reading_paused and not self.inbox.full() and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()


class TcpConnection:
    """A framed TCP link. See :class:`tianji.runtime.core.Connection` for the contract."""

    def __init__(self, protocol: _StreamProtocol) -> None:
        self._p = protocol
        self._closed = False
        self._cork = bytearray()
        self._flush_scheduled = False
        self.close_timeout = CLOSE_TIMEOUT
        self.messages_sent = 0
        self.bytes_sent = 0
        self.messages_received = 0
        self.bytes_received = 0

    @property
    def peer(self) -> str:
        return self._p.peer

    def _check_open(self) -> asyncio.Transport:
        if self._closed:
            raise ClosedByUs(f"tcp connection to {self.peer}")
        if self._p.lost.done() or self._p.transport is None or self._p.transport.is_closing():
            raise self._p.error or EndOfStream(self.peer)
        if self._p.parser.goodbye:
            raise EndOfStream(self.peer)
        return self._p.transport

    def _write(self, transport: asyncio.Transport, frames: Frames) -> None:
        """Queue one message: small parts are corked, large frames go out as they are.

        Small messages sent in one loop iteration leave in one write (one syscall); a
        frame of ``_LARGE`` bytes or more is handed to the transport as a memoryview, so
        a numpy payload is never concatenated or copied on the way to the socket.
        """
        views, size = self._p.limits.check_message(frames)
        out = self._cork
        out += encode_prefix([v.nbytes for v in views])
        for v in views:
            if v.nbytes >= _LARGE:
                self._flush()
                transport.write(v)
                out = self._cork
            else:
                out += v
        if len(out) >= _CORK_LIMIT:
            self._flush()
        elif out and not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        self.messages_sent += 1
        self.bytes_sent += size

    def _flush(self) -> None:
        """Hand the corked bytes to the transport (a fresh buffer replaces them)."""
        self._flush_scheduled = False
        if not self._cork:
            return
        out, self._cork = self._cork, bytearray()
        transport = self._p.transport
        if transport is not None and not transport.is_closing():
            transport.write(out)

    async def send(self, frames: Frames) -> None:
        while True:
            transport = self._check_open()
            if self._p._writable.is_set():
                self._write(transport, frames)
                return
            await self._p._writable.wait()

    def send_nowait(self, frames: Frames) -> None:
        transport = self._check_open()
        if not self._p._writable.is_set():
            raise WouldBlock(f"tcp send {self.peer}", 0, transport.get_write_buffer_size())
        self._write(transport, frames)

    async def drain(self) -> None:
        """Wait until everything sent so far has left our buffers for the kernel.

        uvloop keeps references to written memoryviews until they are sent, so only an
        empty write buffer means the caller may reuse its arrays. Lowering the limits to
        zero makes the transport call ``resume_writing`` exactly when it is empty.
        """
        self._flush()
        transport = self._check_open()
        if transport.get_write_buffer_size() == 0:
            return
        high = self._p.limits.queue_bytes
        transport.set_write_buffer_limits(high=0, low=0)
        try:
            while transport.get_write_buffer_size() > 0:
                self._p._writable.clear()
                await self._p._writable.wait()
                transport = self._check_open()
        finally:
            if not transport.is_closing():
                transport.set_write_buffer_limits(high=high, low=high // 4)

    async def recv(self) -> list[memoryview]:
        if self._closed:
            raise ClosedByUs(f"tcp connection to {self.peer}")
        frames = await self._p.inbox.get()
        self._p.after_get()
        self.messages_received += 1
        self.bytes_received += sum(f.nbytes for f in frames)
        return frames

    async def recv_batch(
        self, max_messages: int = 64, max_bytes: int = 1 << 20
    ) -> list[list[memoryview]]:
        """Wait for a message, then take every further complete one already received (up
        to ``max_messages`` in all, and no more once those beyond the first reach
        ``max_bytes``): one wake-up for a burst."""
        batch = [await self.recv()]
        inbox = self._p.inbox
        nbytes = 0
        while len(batch) < max_messages and nbytes < max_bytes and len(inbox):
            frames = inbox.get_nowait()
            size = sum(f.nbytes for f in frames)
            self.messages_received += 1
            self.bytes_received += size
            nbytes += size
            batch.append(frames)
        self._p.after_get()
        return batch

    async def aclose(self) -> None:
        """Flush what is queued, say goodbye and close. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._p.inbox.close(ClosedByUs(f"tcp connection to {self.peer}"), discard=True)
        self._p.after_get()  # keep reading (and discarding) so nothing unread triggers a RST
        transport = self._p.transport
        if transport is None or transport.is_closing():
            return
        # Half-close: goodbye and FIN after everything queued. Closing outright while
        # unread bytes sit in our receive buffer would send a RST, and a RST makes the
        # peer's kernel discard data it has not read yet. The peer closes on our FIN.
        self._cork += GOODBYE
        self._flush()
        if transport.can_write_eof():
            transport.write_eof()
        try:
            await asyncio.wait_for(asyncio.shield(self._p.lost), self.close_timeout)
        except TimeoutError as exc:
            log.warning(
                "%s did not close within %.1fs (%r); closing", self.peer, self.close_timeout, exc
            )
            transport.close()

    def abort(self) -> None:
        """Close at once without goodbye: the peer sees :class:`BrokenByPeer`."""
        self._closed = True
        self._cork = bytearray()
        self._p.inbox.close(ClosedByUs(f"tcp connection to {self.peer}"), discard=True)
        # (after a flushing close, 3.11's transport may be gone without knowing it)
        if self._p.transport is not None and not self._p.lost.done():
            self._p.transport.abort()

    def statistics(self) -> ConnectionStatistics:
        t = self._p.transport
        return ConnectionStatistics(
            messages_sent=self.messages_sent,
            bytes_sent=self.bytes_sent,
            messages_received=self.messages_received,
            bytes_received=self.bytes_received,
            send_queue_messages=0,
            send_queue_bytes=t.get_write_buffer_size() if t is not None else 0,
            recv_queue_messages=len(self._p.inbox),
            recv_queue_bytes=self._p.inbox.nbytes,
        )

    async def __aenter__(self) -> TcpConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class TcpListener:
    """A listening TCP socket; accepted connections queue up (bounded) for :meth:`accept`."""

    def __init__(self, limits: Limits, backlog: int, token: bytes | None) -> None:
        self._limits = limits
        self._token = token
        self._server: asyncio.Server | None = None
        self._address = ""
        self._pending: BoundedQueue[TcpConnection] = BoundedQueue(
            "tcp accept queue", max_items=backlog, max_bytes=backlog
        )
        self.refused = 0

    @property
    def address(self) -> str:
        return self._address

    def _protocol(self) -> _StreamProtocol:
        proto = _StreamProtocol(self._limits, "tcp-peer", "server", self._token)
        proto.connected.add_done_callback(lambda f: self._on_connected(proto, f))
        return proto

    def _on_connected(self, proto: _StreamProtocol, fut: asyncio.Future[None]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return
        try:
            self._pending.put_nowait(TcpConnection(proto), 1)
        except TianjiError as exc:
            self.refused += 1
            log.warning(
                "refusing connection from %s: accept queue full or closed: %s", proto.peer, exc
            )
            if proto.transport is not None:
                proto.transport.abort()

    async def _start(self, host: str, port: int, tls: TlsFiles | None = None) -> None:
        loop = asyncio.get_running_loop()
        ctx = server_context(tls) if tls is not None else None
        self._server = await loop.create_server(
            self._protocol, host, port, reuse_address=True, ssl=ctx
        )
        sockname = self._server.sockets[0].getsockname()
        self._address = format_tcp_address(str(sockname[0]), int(sockname[1]))

    async def accept(self) -> TcpConnection:
        return await self._pending.get()

    async def aclose(self) -> None:
        """Stop listening (idempotent); already accepted connections stay open."""
        if self._server is not None:
            self._server.close()
            self._server = None
        self._pending.close(ClosedByUs(self._address))
        while len(self._pending):
            self._pending.get_nowait().abort()

    async def __aenter__(self) -> TcpListener:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class TcpTransport:
    """The ``tcp`` transport. ``listen("tcp://127.0.0.1:0")`` picks a free port.

    Args:
        backlog: accepted connections waiting for :meth:`TcpListener.accept`.
        token: the run token; ``None`` reads ``TIANJI_TOKEN`` at each listen/connect
            (unset: no token is required, and peers that require one refuse us).
        tls: certificate, key and CA for mutual TLS (:mod:`tianji.transports._tls`);
            ``None`` reads ``TIANJI_TLS_*`` at each listen/connect (unset: plain TCP).
    """

    scheme = "tcp"

    def __init__(
        self,
        backlog: int = 256,
        token: bytes | str | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        self.backlog = backlog
        self.token = token.encode() if isinstance(token, str) else token
        self.tls = tls

    def _tls(self) -> TlsFiles | None:
        return self.tls if self.tls is not None else tls_from_env()

    def _token(self) -> bytes | None:
        return self.token if self.token is not None else token_from_env()

    async def listen(self, address: str, *, limits: Limits) -> TcpListener:
        host, port = parse_tcp_address(address)
        listener = TcpListener(limits, self.backlog, self._token())
        await listener._start(host, port, self._tls())
        return listener

    async def connect(self, address: str, *, limits: Limits) -> TcpConnection:
        host, port = parse_tcp_address(address)
        loop = asyncio.get_running_loop()
        token = self._token()
        tls = self._tls()
        ctx = client_context(tls) if tls is not None else None
        try:
            _, proto = await loop.create_connection(
                lambda: _StreamProtocol(limits, address, "client", token),
                host,
                port,
                ssl=ctx,
                server_hostname=host if ctx is not None else None,
            )
        except ssl.SSLError as exc:  # the TLS handshake: another CA, or TLS on one side only
            raise HandshakeRefused(address, f"TLS handshake failed: {exc}", TLS_HINT) from exc
        except OSError as exc:
            raise BrokenByPeer(address, f"connect failed: {exc.strerror or exc}") from exc
        try:
            await asyncio.wait_for(asyncio.shield(proto.connected), HANDSHAKE_TIMEOUT + 1)
        except TimeoutError:
            proto._fail(BrokenByPeer(address, "no handshake from the listener"))
            raise BrokenByPeer(address, "no handshake from the listener") from None
        except BadFrame as exc:  # we refused it: it does not know our token
            raise HandshakeRefused(address, f"refused the listener: {exc}", TOKEN_HINT) from exc
        except TianjiError as exc:  # it closed on us: most likely it refused our token
            why = "closed during the handshake (does it require a different run token?)"
            raise HandshakeRefused(address, why, f"{TOKEN_HINT}, or {TLS_HINT}") from exc
        return TcpConnection(proto)
