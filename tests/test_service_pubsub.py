"""Services publish and subscribe through the controller's registry, over every transport."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from tianji import transports
from tianji.runtime.codec import encode
from tianji.runtime.controller import Controller
from tianji.runtime.core import Limits, ServiceState
from tianji.runtime.errors import BrokenByPeer, EndOfStream, ServiceFailed, WouldBlock
from tianji.runtime.events import ArraysPublished, Heartbeat, topic
from tianji.runtime.service import Service, ServiceOptions
from tianji.testing import LISTEN_ADDRESSES, free_tcp_port, run_async

SCHEMES = ["inproc", "tcp", "shm"]


def arrays(seq: int, size: int = 16) -> ArraysPublished:
    return ArraysPublished(
        seq=seq, policy_version=seq // 10, arrays={"x": np.full(size, seq, np.int64)}, meta={}
    )


class Collector(Service):
    role = "collector"

    def __init__(self, name: str, *, delay: float = 0.0, **kw: Any) -> None:
        super().__init__(name, **kw)
        self.seen: list[int] = []
        self.delay = delay
        self.subscribe(ArraysPublished, self.on_arrays)

    async def on_arrays(self, ev: ArraysPublished) -> None:
        assert int(ev.arrays["x"][0]) == ev.seq
        self.seen.append(ev.seq)
        if self.delay:
            await asyncio.sleep(self.delay)


@contextlib.asynccontextmanager
async def running(*services: Service) -> AsyncIterator[list[asyncio.Task[None]]]:
    tasks = [asyncio.create_task(s.run()) for s in services]
    try:
        await asyncio.wait_for(asyncio.gather(*(s.wait_ready() for s in services)), 10)
        yield tasks
    finally:
        for s in services:
            s.stop("test over")
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 20)


async def until(predicate: Any, timeout: float = 10.0) -> None:
    async def poll() -> None:
        # Polling is right here: the predicates read plain attributes of other services.
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), timeout)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_subscribers_receive_every_event_in_order_via_the_registry(scheme: str) -> None:
    bind = LISTEN_ADDRESSES[scheme]

    async def main() -> None:
        ctl = Controller(bind=bind)
        async with running(ctl):
            pub = Service("pub", bind=bind, controller=ctl.address, publishes=[ArraysPublished])
            subs = [Collector(f"sub-{i}", bind=bind, controller=ctl.address) for i in range(2)]
            async with running(pub, *subs):
                await pub.wait_subscribers(ArraysPublished, 2)
                for i in range(500):
                    assert await pub.publish(arrays(i)) == 2
                await until(lambda: all(len(s.seen) == 500 for s in subs))
                assert all(s.seen == list(range(500)) for s in subs)
                assert pub.counters["published"] == 500
                assert set(ctl.registry) == {"pub", "sub-0", "sub-1"}

    run_async(main())


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_publisher_that_appears_later_is_picked_up(scheme: str) -> None:
    bind = LISTEN_ADDRESSES[scheme]

    async def main() -> None:
        ctl = Controller(bind=bind)
        async with running(ctl):
            sub = Collector("sub", bind=bind, controller=ctl.address)
            async with running(sub):
                late = Service(
                    "late", bind=bind, controller=ctl.address, publishes=[ArraysPublished]
                )
                async with running(late):
                    await late.wait_subscribers(ArraysPublished)
                    await late.publish(arrays(7))
                    await until(lambda: sub.seen == [7])
                # the publisher left: the controller no longer lists it
                await until(lambda: ctl.publishers(topic(ArraysPublished)) == ())

    run_async(main())


@pytest.mark.parametrize("scheme", SCHEMES)
def test_subscriber_reconnects_when_the_publisher_comes_back(scheme: str) -> None:
    address = {
        "inproc": "inproc://comeback",
        "tcp": f"tcp://127.0.0.1:{free_tcp_port()}",
        "shm": f"shm://comeback-{os.getpid()}",
    }[scheme]
    fast = ServiceOptions(reconnect_min=0.01, reconnect_max=0.05)

    async def main() -> None:
        sub = Collector("sub", bind=LISTEN_ADDRESSES[scheme], options=fast)
        async with running(sub):
            sub.add_publisher(ArraysPublished, address)
            for round_ in range(2):
                pub = Service("pub", bind=address, publishes=[ArraysPublished])
                async with running(pub):
                    await pub.wait_subscribers(ArraysPublished)
                    await pub.publish(arrays(round_))
                    await until(lambda r=round_: sub.seen[-1:] == [r])  # type: ignore[misc]
            assert sub.seen == [0, 1]
            assert sub.counters["link_reconnects"] >= 1

    run_async(main())


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_slow_subscriber_makes_the_publisher_wait_with_bounded_queues(scheme: str) -> None:
    bind = LISTEN_ADDRESSES[scheme]
    limits = Limits(queue_messages=4, queue_bytes=64 << 10)
    options = ServiceOptions(limits=limits)

    async def main() -> None:
        pub = Service("pub", bind=bind, options=options, publishes=[ArraysPublished])
        sub = Collector("sub", bind=bind, options=options, delay=0.2)
        async with running(pub, sub):
            sub.add_publisher(ArraysPublished, pub.address)
            await pub.wait_subscribers(ArraysPublished)
            big = 16 << 10  # 128 KiB per event with int64
            sent = 0

            async def flood() -> None:
                nonlocal sent
                for i in range(10_000):
                    await pub.publish(arrays(i, big))
                    sent += 1

            task = asyncio.create_task(flood())
            await asyncio.sleep(1.0)
            # the slow handler saw ~5 events; the publisher is held back, not buffering 10k
            assert not task.done()
            in_flight = sent - len(sub.seen)
            kernel_slack = 64  # socket buffers on loopback hold a few MiB on TCP
            assert in_flight <= limits.queue_messages * 2 + kernel_slack, in_flight
            with pytest.raises(WouldBlock):
                for i in range(1000):
                    pub.publish_nowait(arrays(i, big))
            task.cancel()

    run_async(main())


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_malformed_message_closes_only_that_connection(scheme: str) -> None:
    bind = LISTEN_ADDRESSES[scheme]

    async def main() -> None:
        pub = Service("pub", bind=bind, publishes=[ArraysPublished])
        sub = Collector("sub", bind=bind)
        async with running(pub, sub):
            sub.add_publisher(ArraysPublished, pub.address)
            await pub.wait_subscribers(ArraysPublished)
            transport = transports.for_address(pub.address)
            for garbage in ([b"", b"\xc1\xc1\xc1"], [b"\xff\xfe"], [b"Heartbeat", b"junk"]):
                bad = await transport.connect(pub.address, limits=Limits())
                await bad.send(garbage)
                with pytest.raises((BrokenByPeer, EndOfStream)):
                    await asyncio.wait_for(bad.recv(), 5)
            # a well-formed event on the wrong topic is also refused
            bad = await transport.connect(pub.address, limits=Limits())
            await bad.send(
                [
                    topic(ArraysPublished).encode(),
                    *encode(
                        Heartbeat(
                            name="x",
                            role="y",
                            state="z",
                            counters={},
                            gauges={},
                            queue_depths={},
                            sent_at=0.0,
                        )
                    ),
                ]
            )
            with pytest.raises((BrokenByPeer, EndOfStream)):
                await asyncio.wait_for(bad.recv(), 5)
            assert pub.counters["bad_frames"] == 4
            await pub.publish(arrays(1))
            await until(lambda: sub.seen == [1])

    run_async(main())


def test_events_nobody_subscribes_to_are_counted_not_silently_lost() -> None:
    async def main() -> None:
        pub = Service("pub", publishes=[ArraysPublished])
        async with running(pub):
            assert await pub.publish(arrays(1)) == 0
            assert pub.counters["published_unsubscribed"] == 1
            assert pub.heartbeat().counters["published_unsubscribed"] == 1

    run_async(main())


def test_lifecycle_states_run_in_order_and_main_returning_stops_the_service() -> None:
    seen: list[ServiceState] = []

    class OneShot(Service):
        def _set_state(self, state: ServiceState) -> None:
            seen.append(state)
            super()._set_state(state)

        async def main(self) -> None:
            assert self.state is ServiceState.RUNNING

    async def main() -> None:
        svc = OneShot("one")
        await svc.run()
        assert svc.stop_reason == "main finished"
        svc.stop("again")  # idempotent, keeps the first reason
        assert svc.stop_reason == "main finished"
        with pytest.raises(RuntimeError):
            await svc.run()

    run_async(main())
    assert seen == [
        ServiceState.STARTING,
        ServiceState.READY,
        ServiceState.RUNNING,
        ServiceState.DRAINING,
        ServiceState.STOPPED,
    ]


def test_a_failed_service_raises_service_failed_naming_it() -> None:
    class Broken(Service):
        async def main(self) -> None:
            self.fail("disk on fire")
            await asyncio.sleep(10)

    with pytest.raises(ServiceFailed) as info:
        run_async(Broken("broken-1").run())
    assert info.value.service == "broken-1" and "disk on fire" in info.value.reason


def test_a_service_without_its_controller_fails_after_the_grace_period() -> None:
    options = ServiceOptions(controller_grace=0.3, reconnect_min=0.01, reconnect_max=0.05)
    dead = f"tcp://127.0.0.1:{free_tcp_port()}"
    with pytest.raises(ServiceFailed) as info:
        run_async(
            Service("orphan", bind="tcp://127.0.0.1:0", controller=dead, options=options).run()
        )
    assert "unreachable" in info.value.reason


def test_heartbeats_reach_the_controller_with_counters_and_queue_depths() -> None:
    options = ServiceOptions(heartbeat_interval=0.05)

    async def main() -> None:
        ctl = Controller(bind="tcp://127.0.0.1:0")
        async with running(ctl):
            pub = Service(
                "pub",
                bind="tcp://127.0.0.1:0",
                controller=ctl.address,
                options=options,
                publishes=[ArraysPublished],
            )
            async with running(pub):
                await pub.publish(arrays(1))
                await ctl.wait_until(
                    lambda c: (
                        (hb := c.registry["pub"].last_heartbeat) is not None
                        and hb.counters.get("published") == 1
                    ),
                    timeout=5,
                )
                hb = ctl.registry["pub"].last_heartbeat
                assert hb is not None and hb.role == "service" and hb.state == "running"

    run_async(main())
