"""Events received over shared memory reach their handlers as views of the ring, and the
ring space goes back when the handler is done, unless something kept the arrays
(:mod:`tianji.runtime.leases`)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import mmap
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from tianji import transports
from tianji.runtime.codec import Codec
from tianji.runtime.controller import Controller
from tianji.runtime.core import Limits
from tianji.runtime.events import ArraysPublished, Event
from tianji.runtime.leases import Handoff
from tianji.runtime.service import Service
from tianji.testing import LISTEN_ADDRESSES, run_async

LIMITS = Limits(queue_bytes=1 << 20)  # a 1-MiB-ish ring: 256-KiB messages wrap it quickly


def event(seq: int, size: int = 1 << 18) -> ArraysPublished:
    x = np.full(size // 8, seq, np.int64)
    return ArraysPublished(seq=seq, policy_version=0, arrays={"x": x}, meta={"k": [1, 2]})


@contextlib.asynccontextmanager
async def shm_link() -> AsyncIterator[tuple[Any, Any]]:
    transport = transports.get("shm")
    listener = await transport.listen("shm://", limits=LIMITS)
    client = await transport.connect(listener.address, limits=LIMITS)
    server = await listener.accept()
    try:
        yield client, server
    finally:
        client.abort()
        server.abort()
        await listener.aclose()


def in_ring(arr: np.ndarray, conn: Any) -> bool:
    ring = np.frombuffer(conn._r.ring.mm, dtype=np.uint8)
    start = ring.ctypes.data
    return bool(start <= arr.ctypes.data < start + ring.nbytes)


async def deliver(server: Any, handoff: Handoff, handler: Any) -> None:
    """What a service's shm link does with one message (tianji/runtime/links.py)."""
    codec = Codec()
    (lease,) = await server.recv_lease_batch(1)
    ev = codec.decode(lease.frames)
    with handoff.settled(lease, ev):
        handler(ev)
    del ev


async def send(client: Any, ev: Event) -> None:
    await client.send(Codec().encode(ev))


def test_a_handler_that_keeps_nothing_gives_the_ring_slot_back_when_it_returns() -> None:
    async def main() -> None:
        async with shm_link() as (client, server):
            handoff = Handoff()
            seen: list[bool] = []

            def handler(ev: ArraysPublished) -> None:
                seen.append(in_ring(ev.arrays["x"], server))  # zero copy: a view of the ring
                assert client.statistics().send_queue_messages == 1  # held while it runs
                assert int(ev.arrays["x"].sum()) == 7 * ev.arrays["x"].size

            await send(client, event(7))
            await deliver(server, handoff, handler)
            assert seen == [True]
            assert client.statistics().send_queue_messages == 0  # the slot is back
            assert (handoff.arrays_copied, handoff.leases_held) == (0, 0)

    run_async(main())


def test_a_kept_event_gets_copies_that_stay_valid_after_the_ring_is_reused() -> None:
    async def main() -> None:
        async with shm_link() as (client, server):
            handoff = Handoff()
            kept: list[ArraysPublished] = []
            await send(client, event(1))
            await deliver(server, handoff, kept.append)
            assert handoff.arrays_copied == 1 and handoff.leases_held == 0
            assert client.statistics().send_queue_messages == 0  # released: no hold
            for seq in range(2, 20):  # 18 x 256 KiB: the 1-MiB ring wraps several times
                await send(client, event(seq))
                await deliver(server, handoff, lambda ev: None)
            x = kept[0].arrays["x"]
            assert not in_ring(x, server)
            assert np.array_equal(x, np.full(x.size, 1, np.int64))
            assert kept[0].meta == {"k": (1, 2)}

    run_async(main())


def test_a_kept_array_holds_its_lease_until_it_is_dropped() -> None:
    async def main() -> None:
        async with shm_link() as (client, server):
            handoff = Handoff()
            kept: list[np.ndarray] = []
            await send(client, event(3))
            await deliver(server, handoff, lambda ev: kept.append(ev.arrays["x"][10:]))
            assert handoff.leases_held == 1 and handoff.held_now == 1
            assert in_ring(kept[0], server)  # still the ring's bytes, not a copy
            await send(client, event(4))
            await deliver(server, handoff, lambda ev: None)
            # the held message holds back the space of the later one too: backpressure
            assert client.statistics().send_queue_messages == 2
            assert np.array_equal(kept[0], np.full(kept[0].size, 3, np.int64))
            kept.clear()
            handoff.poll()  # a service's link does this every 50 ms while a lease is held
            assert handoff.held_now == 0
            assert client.statistics().send_queue_messages == 0

    run_async(main())


def test_a_handler_that_raises_still_settles_its_lease() -> None:
    def boom(ev: ArraysPublished) -> None:
        raise RuntimeError("handler failed")

    async def main() -> None:
        async with shm_link() as (client, server):
            handoff = Handoff()
            await send(client, event(5))
            with pytest.raises(RuntimeError):
                await deliver(server, handoff, boom)
            gc.collect()  # the traceback held the event; it is gone now
            handoff.poll()
            assert client.statistics().send_queue_messages == 0
            assert handoff.held_now == 0

    run_async(main())


def in_shared_memory(arr: np.ndarray) -> bool:
    """Whether ``arr`` views a memory map (the ring), not a buffer of this process."""
    root = arr
    while isinstance(root.base, np.ndarray):
        root = root.base
    return isinstance(root.base, memoryview) and isinstance(root.base.obj, mmap.mmap)


class Keeper(Service):
    role = "keeper"

    def __init__(self, name: str, **kw: Any) -> None:
        super().__init__(name, **kw)
        self.events: list[ArraysPublished] = []
        self.viewed_ring: list[bool] = []
        self.subscribe(ArraysPublished, self.on_arrays)

    async def on_arrays(self, ev: ArraysPublished) -> None:
        self.viewed_ring.append(in_shared_memory(ev.arrays["x"]))
        self.events.append(ev)  # kept: the runtime must copy before the ring is reused


@contextlib.asynccontextmanager
async def pub_and(sub_class: type[Service]) -> AsyncIterator[tuple[Service, Any]]:
    """A controller, a publisher of ArraysPublished and a ``sub_class`` subscriber on shm,
    running and linked; all stopped on exit."""
    bind = LISTEN_ADDRESSES["shm"]
    ctl = Controller(bind=bind)
    tasks = [asyncio.create_task(ctl.run())]
    await ctl.wait_ready()
    pub = Service("pub", bind=bind, controller=ctl.address, publishes=[ArraysPublished])
    sub = sub_class("sub", bind=bind, controller=ctl.address)
    tasks += [asyncio.create_task(s.run()) for s in (pub, sub)]
    try:
        await asyncio.gather(pub.wait_ready(), sub.wait_ready())
        await pub.wait_subscribers(ArraysPublished, 1)
        yield pub, sub
    finally:
        for s in (sub, pub, ctl):
            s.stop("test over")
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 20)


def test_a_subscriber_over_shm_gets_ring_views_and_keeps_valid_events() -> None:
    async def main() -> None:
        async with pub_and(Keeper) as (pub, sub):
            for seq in range(200):  # 200 x 256 KiB through the ring
                await pub.publish(event(seq))
            await pub.publish(event(200, size=64))  # small: copied out, not leased
            while len(sub.events) < 201:  # noqa: ASYNC110 - reads another service's list
                await asyncio.sleep(0.01)
            assert sub.viewed_ring == [True] * 200 + [False]
            for seq, ev in enumerate(sub.events):
                assert ev.seq == seq and np.all(ev.arrays["x"] == seq)
            assert sub.heartbeat().counters["zero_copy_arrays_copied"] == 200

    run_async(main())


class ArrayKeeper(Keeper):
    def __init__(self, name: str, **kw: Any) -> None:
        super().__init__(name, **kw)
        self.arrays: list[np.ndarray] = []

    async def on_arrays(self, ev: ArraysPublished) -> None:
        self.arrays.append(ev.arrays["x"])  # a raw view of the ring: the lease is held


def test_leases_held_for_kept_arrays_are_freed_once_the_arrays_are_dropped() -> None:
    async def main() -> None:
        async with pub_and(ArrayKeeper) as (pub, sub):
            for seq in range(3):
                await pub.publish(event(seq))
            while len(sub.arrays) < 3:  # noqa: ASYNC110 - reads another service's list
                await asyncio.sleep(0.01)
            beat = sub.heartbeat()
            assert beat.gauges["held_leases"] == 3 and beat.counters["zero_copy_leases_held"] == 3
            assert [int(a[0]) for a in sub.arrays] == [0, 1, 2]  # intact while held
            sub.arrays.clear()  # no further message comes: the link's poller frees them
            while "held_leases" in sub.heartbeat().gauges:  # noqa: ASYNC110
                await asyncio.sleep(0.01)

    run_async(main())
