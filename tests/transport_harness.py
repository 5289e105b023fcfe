"""The harness of the transport conformance tests (``test_transport_conformance.py``,
``test_transport_closing.py``): every registered transport as a fixture, links opened and
closed in one event loop, raw streams for malformed input."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import socket
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import pytest
import tianji.transports

from tianji.runtime.core import (
    Connection,
    Limits,
    Listener,
    Transport,
)

T = TypeVar("T")

LISTEN_ADDRESSES: dict[str, str] = {
    # An address that listens somewhere fresh: an automatic name or port 0.
    # Every new transport adds its entry here; a scheme without one is skipped.
    "inproc": "inproc://",
    "tcp": "tcp://127.0.0.1:0",
    "shm": "shm://",
}

RawStream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _open_raw_tcp(address: str) -> RawStream:
    parts = urllib.parse.urlsplit(address)
    return await asyncio.open_connection(parts.hostname, parts.port)


async def _open_raw_shm(address: str) -> RawStream:
    # The shm handshake runs over an abstract Unix socket (imported late: a transport
    # that does not import must only skip its own tests). Connected here, not by path:
    # uvloop cannot connect to an abstract name itself.
    from tianji.transports.shm import socket_address

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, socket_address(address))
    return await asyncio.open_unix_connection(sock=sock)


RAW_STREAMS: dict[str, Callable[[str], Awaitable[RawStream]]] = {
    # Transports that run over a byte stream a stranger can write garbage into.
    "tcp": _open_raw_tcp,
    "shm": _open_raw_shm,
}
# Transports whose listener hands out a connection only after the peer proved the run
# token: garbage never reaches accept(); the stranger's stream is closed instead.
AUTHENTICATED_BEFORE_ACCEPT = {"tcp"}

KiB, MiB = 1 << 10, 1 << 20
DEFAULT_LIMITS = Limits()
SMALL_LIMITS = Limits(queue_messages=16, queue_bytes=1 * MiB)
BACKPRESSURE_MESSAGE = 256 * KiB
BACKPRESSURE_BOUND = 64 * MiB  # generous: kernel socket buffers count too
BACKPRESSURE_TOTAL = BACKPRESSURE_BOUND // BACKPRESSURE_MESSAGE + 16
"""Messages of ``BACKPRESSURE_MESSAGE`` bytes that overflow any allowed bound."""


# --------------------------------------------------------------------------- harness


@pytest.fixture(params=tianji.transports.names())
def scheme(request: pytest.FixtureRequest) -> str:
    """Each registered transport scheme that can run here (others skip with a reason)."""
    name: str = request.param
    if name not in LISTEN_ADDRESSES:
        pytest.skip(f"no conformance address for scheme {name!r}: add it to LISTEN_ADDRESSES")
    try:
        tianji.transports.get(name)
    except ImportError as exc:
        pytest.skip(f"transport {name!r} is registered but its module does not import: {exc!r}")
    return name


@pytest.fixture(params=sorted(RAW_STREAMS))
def raw_scheme(request: pytest.FixtureRequest) -> str:
    """Each transport with a raw byte stream a stranger can write garbage into (inproc has
    none: it carries Python objects)."""
    name: str = request.param
    return name


def run(coro: Coroutine[Any, Any, T], timeout: float = 10.0) -> T:
    """Run ``coro`` in a fresh event loop; a hang becomes a TimeoutError, not a stuck suite."""
    # Collecting here runs the finalizers of dead loops and sockets now, not while pytest
    # parses source to report a failure: on CPython 3.11.7 a finalizer running inside
    # ast.parse can raise "SystemError: AST constructor recursion depth mismatch"
    # (python/cpython#106905), which kills the whole session with INTERNALERROR.
    gc.collect()
    try:
        return asyncio.run(asyncio.wait_for(coro, timeout))
    finally:
        gc.collect()


@dataclasses.dataclass
class Link:
    """A listener with one connected pair: ``client`` (connected) and ``server`` (accepted)."""

    transport: Transport
    listener: Listener
    client: Connection
    server: Connection


@contextlib.asynccontextmanager
async def open_listener(scheme: str, limits: Limits = DEFAULT_LIMITS) -> AsyncIterator[Listener]:
    transport = tianji.transports.get(scheme)
    listener = await transport.listen(LISTEN_ADDRESSES[scheme], limits=limits)
    try:
        yield listener
    finally:
        await listener.aclose()


@contextlib.asynccontextmanager
async def open_link(scheme: str, limits: Limits = DEFAULT_LIMITS) -> AsyncIterator[Link]:
    """Listen, connect and accept; on exit abort both ends (fast, always releases)."""
    transport = tianji.transports.get(scheme)
    async with open_listener(scheme, limits) as listener:
        client = await transport.connect(listener.address, limits=limits)
        try:
            server = await listener.accept()
            try:
                yield Link(transport, listener, client, server)
            finally:
                _best_effort_abort(server)
        finally:
            _best_effort_abort(client)


def _best_effort_abort(conn: Connection) -> None:
    # Cleanup must not mask the test's own outcome; abort-after-close has its own test.
    with contextlib.suppress(Exception):
        conn.abort()


def message(seq: int, nframes: int = 1, size: int = 8) -> list[bytes]:
    """A recognisable multi-frame message: frame k of message seq is filled with a pattern."""
    return [
        seq.to_bytes(8, "little") + bytes([(seq + k) % 251]) * max(size - 8, 0)
        for k in range(nframes)
    ]


def as_bytes(frames: list[memoryview]) -> list[bytes]:
    return [bytes(f) for f in frames]


async def wait_until_stalled(count: Callable[[], int], task: asyncio.Task[Any]) -> None:
    """Return once ``count()`` stops growing for a quiet period (or ``task`` finished).

    Proving that a sender *blocks* needs a bounded wait by nature: it is the absence of
    progress, so there is no event to await.
    """
    last = -1
    while not task.done() and count() != last:
        last = count()
        await asyncio.sleep(0.3)


async def stalled_producer(
    conn: Connection, frames: Callable[[int], list[bytes]], total: int = BACKPRESSURE_TOTAL
) -> tuple[asyncio.Task[None], Callable[[], int]]:
    """Start a task that sends ``frames(0..total-1)`` on ``conn`` and return it, with the
    count of messages the transport accepted, once that count stopped growing
    (:func:`wait_until_stalled`): the peer's backpressure holds it, or it finished."""
    accepted = 0

    async def produce() -> None:
        nonlocal accepted
        for seq in range(total):
            await conn.send(frames(seq))
            accepted += 1

    producer = asyncio.create_task(produce())
    await wait_until_stalled(lambda: accepted, producer)
    return producer, lambda: accepted


async def eventually(condition: Callable[[], bool], attempts: int = 500) -> None:
    """Poll ``condition`` (for effects of the peer's I/O that have no event to await)."""
    for _ in range(attempts):
        if condition():
            return
        await asyncio.sleep(0.01)
    pytest.fail("condition never became true")


async def first_send_error(conn: Connection, attempts: int = 300) -> BaseException:
    """Send small messages until one fails; peers learn of a close asynchronously."""
    for _ in range(attempts):
        try:
            await conn.send([b"ping"])
        except Exception as exc:
            return exc
        await asyncio.sleep(0.01)
    pytest.fail(f"{attempts} sends to a dead peer all succeeded")
