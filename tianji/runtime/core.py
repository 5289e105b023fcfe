"""The tianji vocabulary: read this file first.

Everything in tianji is one of a few things declared here:

* a :class:`Transport` moves *messages* (lists of byte frames) between two endpoints.
  It knows nothing of events or RL; the codec turns events into frames.
* a service is an asyncio object with a lifecycle (:class:`ServiceLifecycle`) that
  publishes and subscribes to typed events (see :mod:`tianji.runtime.events`) over
  transports; every one extends :class:`tianji.runtime.service.Service`.
* an :class:`Algorithm` is the RL math: batched ``act`` and ``update``; no I/O.
* a :class:`Buffer` stores samples and hands out batches; no I/O.

The concrete runtime lives in :mod:`tianji.runtime.service`, transports in :mod:`tianji.transports`.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from tianji.runtime.errors import BadFrame, ConfigError

__all__ = [
    "Connection",
    "ConnectionStatistics",
    "Frames",
    "Limits",
    "Listener",
    "recv_batch",
    "ServiceLifecycle",
    "ServiceState",
    "Transport",
]

Frames = Sequence[bytes | bytearray | memoryview]
"""One message on the wire: a header frame followed by zero or more payload frames."""

MAX_FRAMES = 16384
"""Upper bound of ``Limits.max_frames`` (a message's length prefix must fit a read buffer)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Bounds every connection enforces (see ``[transport]`` in the run config).

    Attributes:
        max_frame_bytes: a frame longer than this is refused before it is allocated.
        max_frames: a message with more frames than this is refused.
        queue_messages: messages a connection buffers per direction before the sender waits.
        queue_bytes: bytes a connection buffers per direction before the sender waits. A
            single message larger than this is still admitted into an empty queue.
    """

    max_frame_bytes: int = 1 << 30
    max_frames: int = 4096
    queue_messages: int = 1024
    queue_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        for name in ("max_frame_bytes", "max_frames", "queue_messages", "queue_bytes"):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise ConfigError(f"transport.{name}", value, "a positive integer")
        if self.max_frames > MAX_FRAMES:
            raise ConfigError("transport.max_frames", self.max_frames, f"at most {MAX_FRAMES}")

    def check_message(self, frames: Frames) -> tuple[list[memoryview], int]:
        """Validate an outgoing message before anything is copied or written.

        Returns:
            The frames as byte memoryviews, and the payload size in bytes.

        Raises:
            BadFrame: if the message is empty, has too many frames or a frame is too large.
        """
        if not frames:
            raise BadFrame("empty_message", "a message needs at least one frame")
        if len(frames) > self.max_frames:
            raise BadFrame("too_many_frames", f"{len(frames)} frames > max {self.max_frames}")
        views = [memoryview(f).cast("B") for f in frames]
        size = 0
        for i, v in enumerate(views):
            if v.nbytes > self.max_frame_bytes:
                raise BadFrame(
                    "frame_too_large", f"frame {i} is {v.nbytes} bytes > max {self.max_frame_bytes}"
                )
            size += v.nbytes
        return views, size


@dataclasses.dataclass(slots=True)
class ConnectionStatistics:
    """Counters and queue depths of one connection (a snapshot; see ``statistics()``).

    Messages and bytes count payload frames as the application sees them (no framing
    overhead): a message counts as sent when ``send`` accepted it and as received when
    ``recv`` returned it, so both ends of a drained link agree.
    """

    messages_sent: int = 0
    bytes_sent: int = 0
    messages_received: int = 0
    bytes_received: int = 0
    send_queue_messages: int = 0
    send_queue_bytes: int = 0
    recv_queue_messages: int = 0
    recv_queue_bytes: int = 0


@runtime_checkable
class Connection(Protocol):
    """A bidirectional, ordered, message-oriented link to one peer.

    Usage::

        async with await transport.connect("tcp://127.0.0.1:5555") as conn:
            await conn.send([header, payload])     # waits while the peer is slow
            frames = await conn.recv()             # raises EndOfStream / BrokenByPeer

    ``send`` applies backpressure: it returns once the message is queued within the
    connection's :class:`Limits`; ``send_nowait`` raises ``WouldBlock`` instead of waiting.
    The caller must not mutate buffers passed to ``send`` until ``drain()`` returns.
    ``recv`` returns frames owned by the caller. ``aclose`` is idempotent, flushes what
    was queued (bounded by a timeout) and tells the peer goodbye, so the peer's ``recv``
    raises ``EndOfStream``; a peer that vanishes without goodbye raises ``BrokenByPeer``.
    """

    @property
    def peer(self) -> str: ...

    async def send(self, frames: Frames) -> None: ...

    def send_nowait(self, frames: Frames) -> None: ...

    async def drain(self) -> None: ...

    async def recv(self) -> list[memoryview]: ...

    async def aclose(self) -> None: ...

    def abort(self) -> None: ...

    def statistics(self) -> ConnectionStatistics: ...

    async def __aenter__(self) -> Connection: ...

    async def __aexit__(self, *exc: object) -> None: ...


async def recv_batch(
    conn: Connection, max_messages: int = 64, max_bytes: int = 1 << 20
) -> list[list[memoryview]]:
    """Wait for the next message on ``conn``, then take every further complete message it
    has already received, in order: up to ``max_messages`` in all, and no more once those
    beyond the first hold ``max_bytes`` (so a batch adds at most about ``max_bytes`` plus
    one message to what the connection's limits bound).

    A transport may offer this as ``conn.recv_batch(max_messages, max_bytes)`` (inproc, tcp and shm
    do), so a burst costs one wake-up instead of one per message; for one that does not,
    this is ``[await conn.recv()]``. Errors are those of ``recv``, raised only when no
    message is ready: a batch ends before an error, which the next call raises.
    """
    batch = getattr(conn, "recv_batch", None)
    if batch is not None:
        got: list[list[memoryview]] = await batch(max_messages, max_bytes)
        return got
    return [await conn.recv()]


@runtime_checkable
class Listener(Protocol):
    """Accepts connections on one address.

    Usage::

        listener = await transport.listen("tcp://127.0.0.1:0")
        print(listener.address)                    # "tcp://127.0.0.1:41234": port resolved
        conn = await listener.accept()
        await listener.aclose()                    # idempotent; accepted connections live on
    """

    @property
    def address(self) -> str: ...

    async def accept(self) -> Connection: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class Transport(Protocol):
    """A way to move messages: ``inproc``, ``tcp``, ``shm`` or a third-party one.

    A transport is looked up by the scheme of an address (``tcp://host:port``) in
    :mod:`tianji.transports`; third parties register under the entry-point group
    ``tianji.transports``. Every transport passes ``tests/test_transport_conformance.py``.

    Usage::

        transport = tianji.transports.get("tcp")
        listener = await transport.listen("tcp://127.0.0.1:0", limits=Limits())
        conn = await transport.connect(listener.address, limits=Limits())
    """

    scheme: str

    async def listen(self, address: str, *, limits: Limits) -> Listener: ...

    async def connect(self, address: str, *, limits: Limits) -> Connection: ...


class ServiceState(enum.Enum):
    """Lifecycle of a service: each state is entered once, in this order."""

    CREATED = "created"
    STARTING = "starting"
    READY = "ready"
    RUNNING = "running"
    DRAINING = "draining"
    STOPPED = "stopped"


@runtime_checkable
class ServiceLifecycle(Protocol):
    """What a runner sees of a service (:class:`tianji.runtime.service.Service` and its
    subclasses): an asyncio component that talks only through typed events.

    Usage::

        svc = MyService(name="actor-0", controller="tcp://127.0.0.1:7000")
        task = asyncio.create_task(svc.run())
        await svc.wait_ready()        # listening, registered, subscriptions wired
        ...
        svc.stop("done")               # graceful drain; cancel ``task`` to force
        await task
    """

    name: str
    role: str

    @property
    def state(self) -> ServiceState: ...

    async def run(self) -> None: ...

    async def wait_ready(self) -> None: ...

    def stop(self, reason: str) -> None: ...
