"""The parts a service owns, each alone (no Service): its subscriptions
(``runtime/links.py``), its controller link (``runtime/heartbeats.py``), its board
(``runtime/sharing.py``), its peers (``runtime/serving.py``) and its messages
(``runtime/wiring.py``), each given plain callables in place of the service."""

from __future__ import annotations

import asyncio
import collections
import os
from collections.abc import Coroutine
from typing import Any

import numpy as np
import pytest

from tianji.runtime import plugins
from tianji.runtime.aggregation import HEARTBEATS_TOPIC
from tianji.runtime.board import SHM_DIR, Board
from tianji.runtime.codec import Codec
from tianji.runtime.core import Connection, Limits
from tianji.runtime.errors import BadFrame, BrokenByPeer, EndOfStream, ServiceFailed
from tianji.runtime.events import (
    ArraysPublished,
    BoardPosted,
    Event,
    Heartbeat,
    PublishersChanged,
    RegisterService,
    ServiceRegistered,
    ServiceReported,
    Shutdown,
    Subscribe,
    WatchTopics,
    topic,
)
from tianji.runtime.heartbeats import ControllerLink, ServiceStat
from tianji.runtime.links import Subscriptions
from tianji.runtime.serving import Peers
from tianji.runtime.sharing import BoardSharing
from tianji.runtime.wiring import CONTROL, Messages, ServiceOptions
from tianji.testing import run_async

ARRAYS = topic(ArraysPublished)
OPTIONS = ServiceOptions(reconnect_min=0.01, reconnect_max=0.02, heartbeat_interval=60.0)
WIRE = Messages(Codec())


def arrays(seq: int, size: int = 4) -> ArraysPublished:
    w = np.full(size, seq, np.uint8)
    return ArraysPublished(seq=seq, policy_version=0, arrays={"w": w}, meta={})


class Tasks:
    """A stand-in for the service's task group: ``spawn`` and cancel everything at the end."""

    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[Any]] = []

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self.tasks.append(task)
        return task

    async def cancel(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def until(predicate: Any, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.005)


async def inproc_listener() -> Any:
    return await plugins.transport_for("inproc://").listen("inproc://", limits=Limits())


def subscriptions(tasks: Tasks, **kw: Any) -> tuple[Subscriptions, collections.Counter[str]]:
    counters: collections.Counter[str] = collections.Counter()

    async def send_quietly(conn: Connection | None, ev: Event) -> None:
        if conn is not None:
            await conn.send(WIRE.encode(ev, CONTROL))

    parts: dict[str, Any] = {
        "spawn": tasks.spawn,
        "encode": WIRE.encode,
        "decode": WIRE.decode,
        "send_quietly": send_quietly,
        "from_board": lambda ev, peer: None,
        "report_soon": lambda: None,
        "stopping": lambda: False,
    }
    parts.update(kw)
    return Subscriptions("sub", OPTIONS, counters, **parts), counters


class Peer:
    peer = "peer-1"


# ------------------------------------------------------------------------- subscriptions
def test_handlers_run_in_order_and_a_board_reference_is_resolved_first() -> None:
    async def main() -> None:
        resolved: dict[int, tuple[str, Event] | None] = {7: None, 8: (ARRAYS, arrays(80))}
        subs, counters = subscriptions(
            Tasks(), from_board=lambda ev, peer: resolved[ev.seq] if peer == "peer-1" else None
        )
        got: list[tuple[str, int]] = []

        async def first(ev: ArraysPublished) -> None:
            got.append(("first", ev.seq))

        async def second(ev: ArraysPublished) -> None:
            got.append(("second", ev.seq))

        assert subs.add_handler(ARRAYS, first, latest_only=False)
        assert not subs.add_handler(ARRAYS, second, latest_only=True)
        assert subs.latest_only == {ARRAYS}
        await subs.dispatch(ARRAYS, arrays(1), Peer())  # type: ignore[arg-type]
        ref = BoardPosted(topic=ARRAYS, board="b", slot=0, seq=7, lengths=(1,))
        await subs.dispatch(CONTROL, ref, Peer())  # type: ignore[arg-type]  # superseded
        newer = BoardPosted(topic=ARRAYS, board="b", slot=1, seq=8, lengths=(1,))
        await subs.dispatch(CONTROL, newer, Peer())  # type: ignore[arg-type]
        assert got == [("first", 1), ("second", 1), ("first", 80), ("second", 80)]
        assert counters[ServiceStat.RECEIVED] == 2  # the skipped reference is not received

    run_async(main())


def test_a_link_subscribes_receives_and_is_retired_when_its_publisher_leaves() -> None:
    async def main() -> None:
        tasks = Tasks()
        subs, counters = subscriptions(tasks)
        got: list[int] = []

        async def on_arrays(ev: ArraysPublished) -> None:
            got.append(ev.seq)

        subs.add_handler(ARRAYS, on_arrays, latest_only=False)
        listener = await inproc_listener()
        subs.set_publishers(ARRAYS, [listener.address, "inproc://me"], own={"inproc://me"})
        assert set(subs.links) == {listener.address}  # never a link to itself
        conn = await listener.accept()
        assert WIRE.decode(await conn.recv(), "pub") == (CONTROL, Subscribe(topics=(ARRAYS,)))
        for seq in (1, 2, 3):
            await conn.send(WIRE.encode(arrays(seq), ARRAYS))
        await until(lambda: got == [1, 2, 3])
        link = subs.links[listener.address]
        subs.set_publishers(ARRAYS, [], own=set())  # it left the registry
        assert subs.links == {} and link.retired
        await conn.send(WIRE.encode(arrays(4), ARRAYS))  # still in flight: read to the end
        await conn.aclose()
        await until(lambda: link.task is None)
        assert got == [1, 2, 3, 4] and counters["link_reconnects"] == 0
        await listener.aclose()
        await tasks.cancel()

    run_async(main())


def test_a_link_that_cannot_connect_is_reported_once_and_listed_as_down() -> None:
    async def main() -> None:
        tasks = Tasks()
        reports: list[int] = []
        subs, counters = subscriptions(tasks, report_soon=lambda: reports.append(1))
        subs.link_to("inproc://nobody-listens-here", {ARRAYS})
        await until(lambda: counters["link_connect_failures"] >= 3)
        down = subs.links_down()
        assert list(down) == ["inproc://nobody-listens-here"]
        assert down["inproc://nobody-listens-here"].endswith("s, never up)")
        assert reports == [1]  # the first failure asks for a heartbeat, not every retry
        await subs.close()
        await tasks.cancel()

    run_async(main())


# ------------------------------------------------------------------------- controller link
def test_the_controller_link_registers_watches_and_hands_on_what_the_controller_says() -> None:
    async def main() -> None:
        tasks = Tasks()
        seen: list[Any] = []
        stopping = asyncio.Event()
        counters: collections.Counter[str] = collections.Counter()
        registration = RegisterService(
            name="svc", role="relay", address="inproc://svc", publishes=(), host="h", pid=1
        )
        beat = Heartbeat(
            name="svc", role="relay", state="ready", counters={}, gauges={}, queue_depths={},
            sent_at=0.0,
        )  # fmt: skip

        async def on_command(ev: Event) -> None:
            seen.append(("command", ev))

        listener = await inproc_listener()
        link = ControllerLink(
            "svc", listener.address, OPTIONS, counters,
            encode=WIRE.encode, decode=WIRE.decode,
            registration=lambda: registration, watched=lambda: [ARRAYS],
            heartbeat=lambda: beat,
            on_registered=lambda ev: seen.append(("registered", ev.run_id)),
            on_publishers=lambda t, addresses: seen.append(("publishers", t, addresses)),
            on_command=on_command,
            stop=lambda reason: seen.append(("stop", reason)),
            fail=lambda reason: seen.append(("fail", reason)),
            stopping=stopping.is_set,
        )  # fmt: skip
        with pytest.raises(ServiceFailed, match="no controller link"):
            await link.send(Shutdown(reason="x"))
        tasks.spawn(link.run())
        tasks.spawn(link.heartbeats())
        conn = await listener.accept()
        assert WIRE.decode(await conn.recv(), "c")[1] == registration
        # and the pseudo-topic of its node's heartbeat aggregator
        watch = WatchTopics(topics=(ARRAYS, HEARTBEATS_TOPIC))
        assert WIRE.decode(await conn.recv(), "c")[1] == watch
        assert link.registered_conn() is None and not link.complete()
        await conn.send(WIRE.encode(ServiceRegistered(name="svc", run_id="run-1"), CONTROL))
        await until(lambda: link.registered.is_set())
        assert link.registered_conn() is not None and not link.complete()  # watching still
        await conn.send(WIRE.encode(PublishersChanged(topic=ARRAYS, addresses=("a",)), CONTROL))
        report = ServiceReported(name="ctl", status="ok", summary={})
        await conn.send(WIRE.encode(report, CONTROL))
        await conn.send(WIRE.encode(Shutdown(reason="done"), CONTROL))
        await until(lambda: len(seen) == 4)
        assert seen == [
            ("registered", "run-1"),
            ("publishers", ARRAYS, ("a",)),
            ("command", report),
            ("stop", "done"),
        ]
        assert link.complete()
        await reports_then_goodbye(link, conn, beat, counters, stopping)
        await tasks.cancel()
        await listener.aclose()

    run_async(main())


async def reports_then_goodbye(
    link: ControllerLink,
    conn: Any,
    beat: Heartbeat,
    counters: collections.Counter[str],
    stopping: asyncio.Event,
) -> None:
    """A registered link sends a heartbeat when asked and requests when told, and on
    stopping the last heartbeat, then closes."""
    link.report_soon()
    assert WIRE.decode(await conn.recv(), "c")[1] == beat
    assert counters["heartbeats_sent"] == 1
    await link.send(ServiceReported(name="svc", status="ok", summary={}))
    assert WIRE.decode(await conn.recv(), "c")[1].TYPE == "ServiceReported"
    stopping.set()
    goodbye = asyncio.ensure_future(link.goodbye())  # the last heartbeat, then close
    assert WIRE.decode(await conn.recv(), "c")[1] == beat
    with pytest.raises(EndOfStream):
        await conn.recv()
    await conn.aclose()
    await goodbye


def test_the_controller_link_fails_the_service_once_the_controller_stays_unreachable() -> None:
    async def main() -> None:
        failed: list[str] = []
        link = ControllerLink(
            "svc", "inproc://no-controller", ServiceOptions(controller_grace=0.05,
            reconnect_min=0.01), collections.Counter(),
            encode=WIRE.encode, decode=WIRE.decode,
            registration=lambda: None, watched=lambda: [],  # type: ignore[arg-type,return-value]
            heartbeat=lambda: None,  # type: ignore[arg-type,return-value]
            on_registered=lambda run_id: None, on_publishers=lambda t, a: None,
            on_command=lambda ev: asyncio.sleep(0), stop=lambda reason: None,
            fail=failed.append, stopping=lambda: False,
        )  # fmt: skip
        await asyncio.wait_for(link.run(), 5)
        assert len(failed) == 1 and failed[0].startswith("controller inproc://no-controller")

    run_async(main())


# ------------------------------------------------------------------------- board
@pytest.mark.skipif(not Board.available(), reason="no writable /dev/shm")
def test_a_large_event_goes_on_the_board_once_for_the_local_peers_only() -> None:
    class Conn:
        def __init__(self, peer: str) -> None:
            self.peer = peer

    near, far = Conn("near"), Conn("far")
    counters: collections.Counter[str] = collections.Counter()
    board = BoardSharing(counters, {near}, WIRE.encode, WIRE.decode)  # type: ignore[arg-type]
    big = WIRE.encode(arrays(5, 512 << 10), ARRAYS)
    size = sum(memoryview(f).nbytes for f in big)
    conns: list[Any] = [near, far]
    assert board.split(ARRAYS, big, conns) == (None, 2 * size)  # not shared on the board
    board.share(ARRAYS)
    small = WIRE.encode(arrays(6), ARRAYS)
    small_size = sum(memoryview(f).nbytes for f in small)
    assert board.split(ARRAYS, small, conns) == (None, 2 * small_size)  # too small
    assert board.split(ARRAYS, big, [far]) == (None, size)  # nobody local
    ref, sent = board.split(ARRAYS, big, conns)
    assert ref is not None and counters[ServiceStat.BOARD_WRITES] == 1
    assert sent == size + size + sum(memoryview(f).nbytes for f in ref)  # far's link + board
    name, posted = WIRE.decode([memoryview(f) for f in ref], "near")
    assert name == CONTROL and isinstance(posted, BoardPosted) and posted.topic == ARRAYS
    got = board.resolve(posted, "near")
    assert got is not None and got[0] == ARRAYS
    ev = got[1]
    assert isinstance(ev, ArraysPublished) and ev.seq == 5
    assert np.array_equal(ev.arrays["w"], np.full(512 << 10, 5, np.uint8))
    lease = board.lease_of(ev)
    assert lease is not None and lease.valid() and board.lease_of(arrays(5)) is None
    assert counters[ServiceStat.BOARD_READS] == 1
    assert board.board is not None
    path = os.path.join(SHM_DIR, board.board.name)
    assert os.path.exists(path)
    board.close()
    assert not os.path.exists(path) and board.board is None and board.reader is None


# ------------------------------------------------------------------------- peers
def test_peers_become_subscribers_hand_on_requests_and_are_forgotten_when_they_leave() -> None:
    async def main() -> None:
        tasks = Tasks()
        seen: list[Any] = []
        counters: collections.Counter[str] = collections.Counter()

        async def on_subscribed(conn: Connection, topics: Any) -> None:
            seen.append(("subscribed", tuple(topics)))

        async def on_request(ev: Event, conn: Connection) -> None:
            seen.append(("request", ev))

        async def on_peer_closed(conn: Connection) -> None:
            seen.append(("closed",))

        peers = Peers(
            "svc", counters, spawn=tasks.spawn, decode=WIRE.decode,
            notify=lambda: seen.append(("notify",)), on_subscribed=on_subscribed,
            on_request=on_request, on_peer_closed=on_peer_closed,
        )  # fmt: skip
        address, local = await peers.listen("inproc://", None, "10.0.0.9", Limits())
        assert address.startswith("inproc://") and local == ""  # no host:port to advertise
        peers.accept_all()
        client = await plugins.transport_for(address).connect(address, limits=Limits())
        await client.send(WIRE.encode(Subscribe(topics=(ARRAYS,)), CONTROL))
        report = ServiceReported(name="x", status="ok", summary={})
        await client.send(WIRE.encode(report, CONTROL))
        await until(lambda: ("request", report) in seen)
        assert seen == [("notify",), ("subscribed", (ARRAYS,)), ("request", report)]
        (conn,) = peers.by_topic[ARRAYS]
        depths: dict[str, int] = {}
        peers.queue_depths(depths)
        assert list(depths) == [f"to:{conn.peer}"]
        peers.drop(conn, BrokenByPeer(conn.peer, "gone"))
        assert peers.by_topic[ARRAYS] == set() and counters["subscribers_lost"] == 1
        await until(lambda: ("closed",) in seen)  # the aborted connection's loop ended
        assert peers.peers == set()
        await peers.abort()
        await tasks.cancel()

    run_async(main())


def test_a_peer_that_sends_garbage_is_closed_and_counted() -> None:
    async def main() -> None:
        tasks = Tasks()
        counters: collections.Counter[str] = collections.Counter()

        async def hook(*args: Any) -> None:
            return None

        peers = Peers(
            "svc", counters, spawn=tasks.spawn, decode=WIRE.decode, notify=lambda: None,
            on_subscribed=hook, on_request=hook, on_peer_closed=hook,
        )  # fmt: skip
        address, _ = await peers.listen("inproc://", None, None, Limits())
        peers.accept_all()
        client = await plugins.transport_for(address).connect(address, limits=Limits())
        await client.send([b"only a topic"])
        await until(lambda: counters["bad_frames"] == 1)
        await until(lambda: not peers.peers)
        await peers.abort()
        await tasks.cancel()

    run_async(main())


# ------------------------------------------------------------------------- messages
def test_a_message_is_its_topic_and_the_codec_frames_and_a_bad_one_names_its_peer() -> None:
    ev = arrays(3)
    frames = [memoryview(bytes(f)) for f in WIRE.encode(ev, ARRAYS)]
    name, back = WIRE.decode(frames, "p")
    assert name == ARRAYS and isinstance(back, ArraysPublished) and back.seq == 3
    with pytest.raises(BadFrame, match="topic_mismatch"):
        WIRE.decode([memoryview(b"Shutdown"), *frames[1:]], "p")
    with pytest.raises(BadFrame, match="missing_topic") as caught:
        WIRE.decode(frames[:1], "peer-9")
    assert "peer-9" in str(caught.value)
