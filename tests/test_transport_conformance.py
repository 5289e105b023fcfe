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
import time
from typing import Any

import numpy as np
import pytest
import tianji.transports
from transport_harness import (
    BACKPRESSURE_BOUND,
    BACKPRESSURE_MESSAGE,
    BACKPRESSURE_TOTAL,
    LISTEN_ADDRESSES,
    SMALL_LIMITS,
    MiB,
    as_bytes,
    eventually,
    message,
    open_link,
    open_listener,
    run,
    stalled_producer,
)

from tianji.runtime.codec import decode, encode
from tianji.runtime.core import (
    Connection,
    ConnectionStatistics,
    Listener,
    Transport,
)
from tianji.runtime.errors import (
    EndOfStream,
    WouldBlock,
)
from tianji.runtime.events import ArraysPublished

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
    total, payload = BACKPRESSURE_TOTAL, bytes(BACKPRESSURE_MESSAGE)

    async def main() -> None:
        async with open_link(scheme, SMALL_LIMITS) as link:
            producer, count = await stalled_producer(
                link.client, lambda seq: [seq.to_bytes(4, "little"), payload], total
            )
            accepted = count()
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
    total = BACKPRESSURE_TOTAL
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
