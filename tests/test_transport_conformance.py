"""The transport conformance suite: every transport in ``tianji.transports.names()`` must pass.

One suite, parametrized over the registered schemes (inproc, tcp, and whatever is added
later). A transport whose module does not import yet is skipped with the import error as
the reason. A new transport adds one entry to :data:`LISTEN_ADDRESSES` (and, if it runs
over a raw byte stream, one to :data:`RAW_STREAMS`).

The tests drive the :class:`tianji.runtime.core.Connection` /
:class:`~tianji.runtime.core.Listener` / :class:`~tianji.runtime.core.Transport` protocols
only. pytest-asyncio is not used: every test runs its coroutine with :func:`run`, which also
bounds it with a timeout so a hang fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import socket
import time
import tracemalloc
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import numpy as np
import pytest
import tianji.transports
from tianji.transports._framing import PREAMBLE

from tianji.runtime.codec import decode, encode
from tianji.runtime.core import (
    Connection,
    ConnectionStatistics,
    Limits,
    Listener,
    Transport,
    recv_batch,
)
from tianji.runtime.errors import (
    BadFrame,
    BrokenByPeer,
    ClosedByUs,
    EndOfStream,
    TianjiError,
    WouldBlock,
)
from tianji.runtime.events import ArraysPublished

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


# --------------------------------------------------------------------------- basics


def test_listen_resolves_the_address_and_objects_follow_the_protocols(scheme: str) -> None:
    async def main() -> None:
        async with open_link(scheme) as link:
            assert isinstance(link.transport, Transport)
            assert link.transport.scheme == scheme
            assert isinstance(link.listener, Listener)
            assert isinstance(link.client, Connection)
            assert isinstance(link.server, Connection)
            assert tianji.transports.split_address(link.listener.address)[0] == scheme
            assert link.listener.address != LISTEN_ADDRESSES[scheme], "port 0 / name not resolved"
            assert isinstance(link.client.peer, str) and link.client.peer
            assert isinstance(link.server.peer, str) and link.server.peer

    run(main())


def test_two_listeners_on_the_fresh_address_get_distinct_addresses(scheme: str) -> None:
    async def main() -> None:
        async with open_listener(scheme) as a, open_listener(scheme) as b:
            assert a.address != b.address

    run(main())


def test_messages_keep_their_order_and_frames_in_both_directions(scheme: str) -> None:
    counts = [1, 3, 1, 5, 2, 8, 1, 4] * 25

    async def pump(sender: Connection, receiver: Connection) -> None:
        async def send_all() -> None:
            for seq, n in enumerate(counts):
                await sender.send(message(seq, n, size=8 + seq % 50))

        async def recv_all() -> None:
            for seq, n in enumerate(counts):
                frames = await receiver.recv()
                assert as_bytes(frames) == message(seq, n, size=8 + seq % 50), f"message {seq}"

        async with asyncio.TaskGroup() as tg:
            tg.create_task(send_all())
            tg.create_task(recv_all())

    async def main() -> None:
        async with open_link(scheme) as link, asyncio.TaskGroup() as tg:
            tg.create_task(pump(link.client, link.server))
            tg.create_task(pump(link.server, link.client))

    run(main())


def test_frames_of_any_buffer_type_arrive_byte_exact_as_memoryviews(scheme: str) -> None:
    floats = np.linspace(0, 1, 100, dtype=np.float64)
    sent: list[Any] = [
        b"bytes",
        bytearray(b"bytearray"),
        memoryview(b"--memoryview slice--")[2:-2],
        memoryview(floats),  # a non-byte format ('d')
        b"",  # empty frames are frames too
    ]

    async def main() -> None:
        async with open_link(scheme) as link:
            await link.client.send(sent)
            frames = await link.server.recv()
            assert all(isinstance(f, memoryview) for f in frames)
            assert [f.nbytes for f in frames] == [memoryview(s).nbytes for s in sent]
            assert as_bytes(frames) == [memoryview(s).tobytes() for s in sent]

    run(main())


def test_a_buffer_may_be_reused_once_drain_returns(scheme: str) -> None:
    """The Connection contract: buffers are the caller's again after ``drain()``."""
    rng = np.random.default_rng(7)
    buffer = bytearray(rng.integers(0, 256, size=16 * MiB, dtype=np.uint8).tobytes())
    expected = bytes(buffer)

    async def main() -> None:
        async with open_link(scheme) as link:
            receiving = asyncio.create_task(link.server.recv())
            await link.client.send([buffer])
            await link.client.drain()
            buffer[:] = bytes(len(buffer))  # reuse it
            frames = await receiving
            assert bytes(frames[0]) == expected

    run(main(), timeout=30)


def test_a_64_mib_float32_array_round_trips_bit_exact(scheme: str) -> None:
    rng = np.random.default_rng(64)
    array = rng.standard_normal(16 * MiB, dtype=np.float32).reshape(4096, 4096)
    assert array.nbytes == 64 * MiB
    ev = ArraysPublished(seq=1, policy_version=7, arrays={"weights": array}, meta={"n": 1})

    async def main() -> None:
        async with open_link(scheme) as link:
            sending = asyncio.create_task(link.client.send(encode(ev)))
            frames = await link.server.recv()
            await sending
            out = decode(frames)
            assert isinstance(out, ArraysPublished)
            got = out.arrays["weights"]
            assert got.dtype == np.float32 and got.shape == array.shape
            assert np.array_equal(got, array)
            assert got.tobytes() == array.tobytes()

    run(main(), timeout=60)


def test_100k_small_events_arrive_complete_and_in_order(scheme: str) -> None:
    total = 100_000

    async def main() -> float:
        async with open_link(scheme) as link:
            started = time.perf_counter()

            async def produce() -> None:
                for seq in range(total):
                    ev = ArraysPublished(
                        seq=seq, policy_version=0, arrays={"x": np.array([seq])}, meta={}
                    )
                    await link.client.send(encode(ev))
                await link.client.aclose()

            async def consume() -> None:
                for expected in range(total):
                    ev = decode(await link.server.recv())
                    assert isinstance(ev, ArraysPublished)
                    assert ev.seq == expected, f"got seq {ev.seq}, expected {expected}"
                    assert int(ev.arrays["x"][0]) == expected
                with pytest.raises(EndOfStream):  # and nothing more than that
                    await link.server.recv()

            async with asyncio.TaskGroup() as tg:
                tg.create_task(produce())
                tg.create_task(consume())
            return time.perf_counter() - started

    elapsed = run(main(), timeout=60)
    assert elapsed < 30, f"100k small events took {elapsed:.1f} s"


# --------------------------------------------------------------------------- backpressure


def test_a_sender_blocks_while_its_peer_does_not_read_then_everything_arrives(
    scheme: str,
) -> None:
    total = BACKPRESSURE_BOUND // BACKPRESSURE_MESSAGE + 16
    payload = bytes(BACKPRESSURE_MESSAGE)

    async def main() -> None:
        async with open_link(scheme, SMALL_LIMITS) as link:
            accepted = 0

            async def produce() -> None:
                nonlocal accepted
                for seq in range(total):
                    await link.client.send([seq.to_bytes(4, "little"), payload])
                    accepted += 1

            producer = asyncio.create_task(produce())
            await wait_until_stalled(lambda: accepted, producer)
            if producer.done():
                producer.result()  # surface an exception, if that is why it finished
                pytest.fail(f"all {total} messages ({total * BACKPRESSURE_MESSAGE // MiB} MiB) "
                            "were accepted although nobody read: no backpressure")  # fmt: skip
            assert accepted * BACKPRESSURE_MESSAGE <= BACKPRESSURE_BOUND, f"{accepted} accepted"

            for seq in range(total):
                frames = await link.server.recv()
                assert int.from_bytes(frames[0], "little") == seq
                assert frames[1].nbytes == BACKPRESSURE_MESSAGE
            await producer

    run(main(), timeout=30)


def test_send_nowait_raises_would_block_while_the_peer_does_not_read(scheme: str) -> None:
    total = BACKPRESSURE_BOUND // BACKPRESSURE_MESSAGE + 16
    payload = bytes(BACKPRESSURE_MESSAGE)

    async def main() -> None:
        async with open_link(scheme, SMALL_LIMITS) as link:
            accepted = 0
            with pytest.raises(WouldBlock) as info:
                for seq in range(total):
                    link.client.send_nowait([seq.to_bytes(4, "little"), payload])
                    accepted += 1
            assert accepted * BACKPRESSURE_MESSAGE <= BACKPRESSURE_BOUND, f"{accepted} accepted"
            assert isinstance(info.value.resource, str)
            assert isinstance(info.value.count, int) and isinstance(info.value.nbytes, int)

            for seq in range(accepted):
                frames = await link.server.recv()
                assert int.from_bytes(frames[0], "little") == seq
            await link.client.drain()
            link.client.send_nowait([b"after", payload])  # room again once the peer read
            assert bytes((await link.server.recv())[0]) == b"after"

    run(main(), timeout=30)


def test_a_message_larger_than_queue_bytes_is_admitted_into_an_empty_queue(scheme: str) -> None:
    big = bytes(range(256)) * (4 * MiB // 256)

    async def main() -> None:
        async with open_link(scheme, SMALL_LIMITS) as link:
            sending = asyncio.create_task(link.client.send([big]))
            frames = await link.server.recv()
            await sending
            assert bytes(frames[0]) == big

    run(main())


# --------------------------------------------------------------------------- closing


def test_aclose_is_idempotent_on_connections_and_listeners(scheme: str) -> None:
    async def main() -> None:
        async with open_link(scheme) as link:
            await link.client.aclose()
            await link.client.aclose()
            link.client.abort()  # abort after close: a no-op, not an error
            await link.server.aclose()
            await link.server.aclose()
            await link.listener.aclose()
            await link.listener.aclose()

    run(main())


def test_abort_after_a_graceful_close_that_flushed_data_is_a_no_op(scheme: str) -> None:
    payload = bytes(16 * MiB)  # more than a socket takes at once: aclose has to flush

    async def main() -> None:
        async with open_link(scheme) as link:
            receiving = asyncio.create_task(link.server.recv())
            await link.client.send([payload])
            await link.client.aclose()
            link.client.abort()
            await link.client.aclose()
            assert (await receiving)[0].nbytes == len(payload)
            with pytest.raises(EndOfStream):
                await link.server.recv()

    run(main())


def test_async_with_closes_the_connection_gracefully(scheme: str) -> None:
    async def main() -> None:
        async with open_link(scheme) as link:
            async with link.client as conn:
                await conn.send([b"last words"])
            with pytest.raises(ClosedByUs):
                await link.client.send([b"too late"])
            assert as_bytes(await link.server.recv()) == [b"last words"]
            with pytest.raises(EndOfStream):
                await link.server.recv()

    run(main())


def test_graceful_close_delivers_all_data_then_end_of_stream(scheme: str) -> None:
    async def main() -> None:
        async with open_link(scheme) as link:
            for seq in range(10):
                await link.client.send(message(seq, 2))
            await link.client.aclose()
            for seq in range(10):
                assert as_bytes(await link.server.recv()) == message(seq, 2)
            with pytest.raises(EndOfStream) as info:
                await link.server.recv()
            assert isinstance(info.value.peer, str)
            with pytest.raises(EndOfStream):  # it stays at end of stream
                await link.server.recv()

    run(main())


def test_recv_batch_takes_every_ready_message_in_order_then_end_of_stream(scheme: str) -> None:
    async def main() -> None:
        async with open_link(scheme) as link:
            for seq in range(40):
                await link.client.send(message(seq, 1 + seq % 3))
            await link.client.aclose()
            got: list[bytes] = []
            batches = 0
            while len(got) < 40:
                batch = await recv_batch(link.server, max_messages=16)
                assert 1 <= len(batch) <= 16
                got += [as_bytes(frames) for frames in batch]
                batches += 1
            assert got == [message(seq, 1 + seq % 3) for seq in range(40)]
            assert batches < 40  # several per wake-up: they were all there
            assert link.server.statistics().messages_received == 40
            with pytest.raises(EndOfStream):
                await recv_batch(link.server)

    run(main())


def test_abort_surfaces_as_broken_by_peer_after_already_sent_messages(scheme: str) -> None:
    async def main() -> None:
        async with open_link(scheme) as link:
            for seq in range(3):
                await link.client.send(message(seq))
            link.client.abort()
            link.client.abort()  # idempotent too
            received: list[list[bytes]] = []
            with pytest.raises(BrokenByPeer) as info:
                for _ in range(4):
                    received.append(as_bytes(await link.server.recv()))
            assert received == [message(seq) for seq in range(len(received))], "not a prefix"
            assert isinstance(info.value.peer, str) and isinstance(info.value.reason, str)
            with pytest.raises(BrokenByPeer):
                await link.server.recv()

    run(main())


@pytest.mark.parametrize("how", ["aclose", "abort"])
def test_sending_to_a_peer_that_went_away_raises_a_peer_error(scheme: str, how: str) -> None:
    """Not ClosedByUs (we closed nothing) and not a hang."""

    async def main() -> None:
        async with open_link(scheme) as link:
            if how == "aclose":
                await link.server.aclose()
            else:
                link.server.abort()
            error = await first_send_error(link.client)
            assert isinstance(error, (BrokenByPeer, EndOfStream)), (
                f"send to a peer that called {how}() raised {type(error).__name__}: {error}"
            )

    run(main())


def test_a_send_blocked_by_backpressure_wakes_with_a_peer_error_when_the_peer_aborts(
    scheme: str,
) -> None:
    total = BACKPRESSURE_BOUND // BACKPRESSURE_MESSAGE + 16
    payload = bytes(BACKPRESSURE_MESSAGE)

    async def main() -> None:
        async with open_link(scheme, SMALL_LIMITS) as link:
            accepted = 0

            async def produce() -> None:
                nonlocal accepted
                for _ in range(total):
                    await link.client.send([payload])
                    accepted += 1

            producer = asyncio.create_task(produce())
            await wait_until_stalled(lambda: accepted, producer)
            assert not producer.done(), "the sender never blocked"
            link.server.abort()
            done, _ = await asyncio.wait({producer}, timeout=5)
            assert done, "a send blocked on a dead peer never woke up"
            error = producer.exception()
            assert isinstance(error, (BrokenByPeer, EndOfStream)), (
                f"pending send raised {type(error).__name__}: {error}"
            )

    run(main(), timeout=30)


@pytest.mark.parametrize("how", ["aclose", "abort"])
def test_recv_and_send_after_own_close_raise_closed_by_us(scheme: str, how: str) -> None:
    async def main() -> None:
        async with open_link(scheme) as link:
            await link.server.send([b"unread"])
            if how == "aclose":
                await link.client.aclose()
            else:
                link.client.abort()
            with pytest.raises(ClosedByUs):
                await link.client.recv()
            with pytest.raises(ClosedByUs):
                await link.client.send([b"x"])
            with pytest.raises(ClosedByUs):
                link.client.send_nowait([b"x"])

    run(main())


@pytest.mark.parametrize("peer_how", ["aclose", "abort"])
def test_recv_after_own_close_raises_closed_by_us_even_if_the_peer_closed_first(
    scheme: str, peer_how: str
) -> None:
    async def main() -> None:
        async with open_link(scheme) as link:
            if peer_how == "aclose":
                await link.server.aclose()
            else:
                link.server.abort()
            with pytest.raises((EndOfStream, BrokenByPeer)):
                await link.client.recv()
            await link.client.aclose()
            with pytest.raises(ClosedByUs):
                await link.client.recv()

    run(main())


def test_a_pending_recv_wakes_with_closed_by_us_when_closed_locally(scheme: str) -> None:
    async def main() -> None:
        async with open_link(scheme) as link:
            pending = asyncio.create_task(link.client.recv())
            await asyncio.sleep(0)  # let it start waiting
            await link.client.aclose()
            with pytest.raises(ClosedByUs):
                await pending

    run(main())


def test_connecting_where_nothing_listens_fails_promptly(scheme: str) -> None:
    async def main() -> None:
        transport = tianji.transports.get(scheme)
        async with open_listener(scheme) as listener:
            address = listener.address
        started = time.perf_counter()
        try:
            conn = await asyncio.wait_for(transport.connect(address, limits=Limits()), 5)
        except TimeoutError:
            pytest.fail(f"connect to {address} (nothing listens) hung")
        except (TianjiError, OSError) as exc:
            assert time.perf_counter() - started < 5, exc
        else:
            conn.abort()
            pytest.fail(f"connect to {address} succeeded although nothing listens there")

    run(main())


def test_accept_after_listener_close_raises_closed_by_us(scheme: str) -> None:
    async def main() -> None:
        async with open_listener(scheme) as listener:
            pending = asyncio.create_task(listener.accept())
            await asyncio.sleep(0)
            await listener.aclose()
            with pytest.raises(ClosedByUs):
                await pending
            with pytest.raises(ClosedByUs):
                await listener.accept()

    run(main())


def test_accepted_connections_outlive_their_listener(scheme: str) -> None:
    async def main() -> None:
        async with open_link(scheme) as link:
            await link.listener.aclose()
            await link.client.send([b"still here"])
            assert as_bytes(await link.server.recv()) == [b"still here"]
            await link.server.send([b"me too"])
            assert as_bytes(await link.client.recv()) == [b"me too"]

    run(main())


def test_connections_to_one_listener_are_independent(scheme: str) -> None:
    async def main() -> None:
        transport = tianji.transports.get(scheme)
        async with open_listener(scheme) as listener:
            clients = [await transport.connect(listener.address, limits=Limits()) for _ in range(3)]
            servers = [await listener.accept() for _ in range(3)]
            try:
                for i, client in enumerate(clients):
                    await client.send([f"hello from {i}".encode()])
                # accept order need not match connect order: match by first message
                by_client = {bytes((await s.recv())[0]): s for s in servers}
                assert sorted(by_client) == sorted(f"hello from {i}".encode() for i in range(3))
                for i, client in enumerate(clients):
                    server = by_client[f"hello from {i}".encode()]
                    for seq in range(5):
                        await client.send(message(seq * 10 + i))
                    await server.send([f"reply to {i}".encode()])
                for i, client in enumerate(clients):
                    server = by_client[f"hello from {i}".encode()]
                    for seq in range(5):
                        assert as_bytes(await server.recv()) == message(seq * 10 + i)
                    assert as_bytes(await client.recv()) == [f"reply to {i}".encode()]
                clients[0].abort()  # one peer dying leaves the others alone
                await clients[1].send([b"fine"])
                assert as_bytes(await by_client[b"hello from 1"].recv()) == [b"fine"]
            finally:
                for conn in (*clients, *servers):
                    conn.abort()

    run(main())


# --------------------------------------------------------------------------- malformed input


def test_oversized_or_empty_messages_are_refused_on_send_and_the_link_survives(
    scheme: str,
) -> None:
    limits = Limits(max_frames=4, max_frame_bytes=64 * KiB)

    async def main() -> None:
        async with open_link(scheme, limits) as link:
            with pytest.raises(BadFrame) as info:
                await link.client.send([b"x"] * 5)
            assert info.value.reason == "too_many_frames"
            with pytest.raises(BadFrame) as info:
                link.client.send_nowait([b"x"] * 5)
            assert info.value.reason == "too_many_frames"
            with pytest.raises(BadFrame) as info:
                await link.client.send([b"ok", bytes(64 * KiB + 1)])
            assert info.value.reason == "frame_too_large"
            with pytest.raises(BadFrame):
                await link.client.send([])

            await link.client.send([b"a"] * 4)  # exactly at the limits is fine
            await link.client.send([bytes(64 * KiB)])
            assert as_bytes(await link.server.recv()) == [b"a"] * 4
            assert (await link.server.recv())[0].nbytes == 64 * KiB
            await link.server.send([b"both directions still work"])
            assert as_bytes(await link.client.recv()) == [b"both directions still work"]

            other = await link.transport.connect(link.listener.address, limits=limits)
            try:
                accepted = await link.listener.accept()
                await other.send([b"listener still serves"])
                assert as_bytes(await accepted.recv()) == [b"listener still serves"]
                accepted.abort()
            finally:
                other.abort()

    run(main())


def test_an_oversized_frame_is_refused_before_it_is_copied(scheme: str) -> None:
    """Limits: "a frame longer than this is refused before it is allocated"."""
    frame = np.ones(32 * MiB, dtype=np.uint8)

    async def main() -> int:
        async with open_link(scheme, Limits(max_frame_bytes=1 * MiB)) as link:
            tracemalloc.start()
            try:
                with pytest.raises(BadFrame):
                    await link.client.send([frame])
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            return peak

    peak = run(main())
    assert peak < frame.nbytes // 2, f"refusing a 32 MiB frame allocated {peak / MiB:.1f} MiB"


@pytest.mark.parametrize(
    "garbage",
    [b"\xff" * 4096, b"GET / HTTP/1.1\r\nHost: tianji\r\n\r\n" + b"\x00" * 4096],
    ids=["0xff", "http"],
)
def test_garbage_on_a_raw_stream_is_bad_frame_and_the_listener_survives(
    raw_scheme: str, garbage: bytes
) -> None:
    scheme = raw_scheme
    limits = Limits(max_frame_bytes=1 * MiB)

    async def main() -> None:
        async with open_link(scheme, limits) as link:
            reader, writer = await RAW_STREAMS[scheme](link.listener.address)
            try:
                writer.write(garbage)
                await writer.drain()
                if scheme in AUTHENTICATED_BEFORE_ACCEPT:
                    with pytest.raises(TimeoutError):
                        await asyncio.wait_for(link.listener.accept(), 0.5)
                    try:  # the listener closes the stranger's stream: EOF or a reset
                        said = await asyncio.wait_for(reader.read(), 5)
                    except ConnectionResetError:
                        said = b""
                    assert said == b"" or said.startswith(PREAMBLE), said[:64]
                else:
                    victim = await link.listener.accept()
                    with pytest.raises(BadFrame) as info:
                        await victim.recv()
                    assert isinstance(info.value.reason, str) and info.value.reason
                    victim.abort()
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()

            await link.client.send([b"the existing link is unaffected"])
            assert as_bytes(await link.server.recv()) == [b"the existing link is unaffected"]
            fresh = await link.transport.connect(link.listener.address, limits=limits)
            try:
                accepted = await link.listener.accept()
                await fresh.send([b"a new proper connection"])
                assert as_bytes(await accepted.recv()) == [b"a new proper connection"]
                await accepted.send([b"served"])
                assert as_bytes(await fresh.recv()) == [b"served"]
                accepted.abort()
            finally:
                fresh.abort()

    run(main())


def test_a_raw_stream_that_hangs_up_at_once_is_broken_by_peer(raw_scheme: str) -> None:
    scheme = raw_scheme

    async def main() -> None:
        async with open_listener(scheme) as listener:
            _, writer = await RAW_STREAMS[scheme](listener.address)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            if scheme in AUTHENTICATED_BEFORE_ACCEPT:  # never proved the token: never accepted
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(listener.accept(), 0.5)
                return
            victim = await listener.accept()
            with pytest.raises(BrokenByPeer):
                await victim.recv()
            victim.abort()

    run(main())


# --------------------------------------------------------------------------- statistics


def test_statistics_count_messages_and_bytes_after_traffic(scheme: str) -> None:
    up = [message(seq, nframes=seq % 3 + 1, size=100 + seq) for seq in range(5)]
    down = [message(seq, nframes=2, size=1000) for seq in range(3)]

    async def main() -> None:
        async with open_link(scheme) as link:
            for frames in up:
                await link.client.send(frames)
            for frames in down:
                await link.server.send(frames)
            for frames in up:
                assert as_bytes(await link.server.recv()) == frames
            for frames in down:
                assert as_bytes(await link.client.recv()) == frames
            c, s = link.client.statistics(), link.server.statistics()
            assert isinstance(c, ConnectionStatistics) and isinstance(s, ConnectionStatistics)
            assert (c.messages_sent, s.messages_received) == (5, 5)
            assert (s.messages_sent, c.messages_received) == (3, 3)
            assert c.bytes_sent == s.bytes_received, "the two ends disagree on bytes"
            assert s.bytes_sent == c.bytes_received, "the two ends disagree on bytes"
            assert c.bytes_sent >= sum(len(f) for m in up for f in m)
            assert s.bytes_sent >= sum(len(f) for m in down for f in m)
            assert (s.recv_queue_messages, s.recv_queue_bytes) == (0, 0)
            assert (c.recv_queue_messages, c.recv_queue_bytes) == (0, 0)

    run(main())


def test_statistics_report_unread_messages_in_the_receive_queue(scheme: str) -> None:
    async def main() -> None:
        async with open_link(scheme) as link:
            for seq in range(3):
                await link.client.send(message(seq, size=1000))
            await eventually(lambda: link.server.statistics().recv_queue_messages >= 3)
            s = link.server.statistics()
            assert s.recv_queue_messages == 3
            assert s.recv_queue_bytes >= 3000
            await link.server.recv()
            assert link.server.statistics().recv_queue_messages == 2

    run(main())
