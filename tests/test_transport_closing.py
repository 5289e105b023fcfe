"""Transport conformance, continued (see ``test_transport_conformance.py``): closing and
peers that go away, malformed input."""

from __future__ import annotations

import asyncio
import contextlib
import time
import tracemalloc

import numpy as np
import pytest
import tianji.transports
from tianji.transports._framing import PREAMBLE
from transport_harness import (
    AUTHENTICATED_BEFORE_ACCEPT,
    BACKPRESSURE_MESSAGE,
    RAW_STREAMS,
    SMALL_LIMITS,
    KiB,
    MiB,
    as_bytes,
    first_send_error,
    message,
    open_link,
    open_listener,
    run,
    stalled_producer,
)

from tianji.runtime.core import (
    Limits,
    recv_batch,
)
from tianji.runtime.errors import (
    BadFrame,
    BrokenByPeer,
    ClosedByUs,
    EndOfStream,
    TianjiError,
)

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
    payload = bytes(BACKPRESSURE_MESSAGE)

    async def main() -> None:
        async with open_link(scheme, SMALL_LIMITS) as link:
            producer, _ = await stalled_producer(link.client, lambda seq: [payload])
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
