"""A node's heartbeat aggregator (issue 36): services told their node's aggregator send it
their heartbeats, the controller receives one batch per flush and takes each heartbeat in
it as a direct one, but only for registered, live services of the aggregator's node; a
service whose aggregator is gone or unreachable heartbeats straight to the controller."""

from __future__ import annotations

import asyncio
import collections
import socket
from typing import Any

import pytest

from tianji.runtime import aggregator as aggregator_module
from tianji.runtime.aggregation import AGGREGATOR_ROLE, HEARTBEATS_TOPIC, RouteStat
from tianji.runtime.aggregator import AggregatorStat, HeartbeatAggregator
from tianji.runtime.controller import Controller, ServiceRecord
from tianji.runtime.core import Connection
from tianji.runtime.errors import TianjiError
from tianji.runtime.events import Event, Heartbeat, HeartbeatBatch
from tianji.runtime.service import Service, ServiceOptions
from tianji.testing import run_async

FAST = ServiceOptions(heartbeat_interval=0.05, reconnect_min=0.02, reconnect_max=0.1)
TCP = "tcp://127.0.0.1:0"


def beat(name: str, sent_at: float = 1.0, role: str = "actor") -> Heartbeat:
    return Heartbeat(
        name=name,
        role=role,
        state="running",
        counters={"n": int(sent_at)},
        gauges={},
        queue_depths={},
        sent_at=sent_at,
    )


def record(name: str, role: str, locality: str, conn: Any = None, **kw: Any) -> ServiceRecord:
    return ServiceRecord(
        name=name,
        role=role,
        address=kw.pop("address", f"tcp://{name}:1"),
        publishes=kw.pop("publishes", ()),
        host="h",
        pid=1,
        conn=conn if conn is not None else Peer(name),
        registered_at=0.0,
        locality=locality,
        **kw,
    )


class Peer:
    """Stands for a connection (hashable, with a peer name)."""

    def __init__(self, peer: str) -> None:
        self.peer = peer


class Actor(Service):
    role = "actor"


class CountingController(Controller):
    """Counts the heartbeats it receives straight from each service and in batches."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.direct: collections.Counter[str] = collections.Counter()
        self.batched: collections.Counter[str] = collections.Counter()
        self.batches = 0

    async def on_request(self, ev: Event, conn: Connection) -> None:
        if isinstance(ev, Heartbeat):
            self.direct[ev.name] += 1
        elif isinstance(ev, HeartbeatBatch):
            self.batches += 1
            self.batched.update(hb.name for hb in ev.heartbeats)
        await super().on_request(ev, conn)


def test_each_service_is_told_the_first_aggregator_of_its_own_node_only() -> None:
    ctl = Controller(bind="inproc://")
    agg = {"publishes": (HEARTBEATS_TOPIC,)}
    ctl.registry = {
        "aggregator-1": record("aggregator-1", AGGREGATOR_ROLE, "B", **agg),
        "aggregator-0": record("aggregator-0", AGGREGATOR_ROLE, "B", **agg),
        "aggregator-2": record("aggregator-2", AGGREGATOR_ROLE, "A", **agg),
    }
    assert ctl.publishers(HEARTBEATS_TOPIC, "B") == ("tcp://aggregator-0:1",)
    assert ctl.publishers(HEARTBEATS_TOPIC, "A") == ("tcp://aggregator-2:1",)
    assert ctl.publishers(HEARTBEATS_TOPIC, "C") == ()  # no aggregator on C: direct
    assert ctl.publishers(HEARTBEATS_TOPIC, "") == ()


def test_the_aggregator_keeps_the_latest_heartbeat_per_service_and_counts_superseded() -> None:
    agg = HeartbeatAggregator("aggregator-0", max_services=2)
    agg.hold(beat("actor-0", 1.0))
    agg.hold(beat("actor-1", 1.0))
    agg.hold(beat("actor-0", 2.0))  # replaces the first: superseded, not lost
    agg.hold(beat("actor-2", 1.0))  # a third service over max_services=2: dropped
    assert {n: hb.sent_at for n, hb in agg.pending.items()} == {"actor-0": 2.0, "actor-1": 1.0}
    assert agg.counters[AggregatorStat.HEARTBEATS_IN] == 4
    assert agg.counters[AggregatorStat.SUPERSEDED] == 1
    assert agg.counters[AggregatorStat.OVER_CAPACITY] == 1


class Sending(HeartbeatAggregator):
    """An aggregator whose controller link is up and records what it sends (the first
    ``fail_at``-th send fails)."""

    def __init__(self, fail_at: int = 0) -> None:
        super().__init__("aggregator-0")
        self.sent: list[HeartbeatBatch] = []
        self.fail_at = fail_at
        self._controller.registered_conn = lambda: object()  # type: ignore[method-assign,return-value]

    async def send_to_controller(self, ev: Event) -> None:
        if len(self.sent) + 1 == self.fail_at:
            self.fail_at = 0
            raise TianjiError("link broke")
        assert isinstance(ev, HeartbeatBatch)
        self.sent.append(ev)


def test_a_flush_of_many_heartbeats_goes_out_in_bounded_batches_and_keeps_what_failed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(aggregator_module, "MAX_BATCH", 3)
    agg = Sending()
    for k in range(7):
        agg.hold(beat(f"actor-{k}", 1.0))
    assert run_async(agg.flush())
    assert [len(b.heartbeats) for b in agg.sent] == [3, 3, 1]
    assert agg.counters[AggregatorStat.HEARTBEATS_OUT] == 7 and not agg.pending
    failing = Sending(fail_at=2)  # the second of three batches fails
    for k in range(7):
        failing.hold(beat(f"actor-{k}", 1.0))
    assert not run_async(failing.flush())
    assert [len(b.heartbeats) for b in failing.sent] == [3]
    assert sorted(failing.pending) == [f"actor-{k}" for k in range(3, 7)]  # kept, not lost
    assert failing.counters[AggregatorStat.BATCHES_UNSENT] == 1
    assert run_async(failing.flush()) and not failing.pending
    assert [len(b.heartbeats) for b in failing.sent] == [3, 3, 1]


def test_a_batch_takes_only_live_registered_services_of_the_aggregators_node() -> None:
    async def main() -> Controller:
        ctl = Controller(bind="inproc://")
        agg_conn, actor_conn = Peer("agg"), Peer("actor")
        ctl.registry = {
            "aggregator-0": record("aggregator-0", AGGREGATOR_ROLE, "A", agg_conn),
            "actor-0": record("actor-0", "actor", "A", actor_conn),
            "actor-1": record("actor-1", "actor", "B"),  # another node's
            "actor-2": record("actor-2", "actor", "A"),
        }
        ctl.retire("actor-2")  # died: what its aggregator still holds is a dead one's
        heartbeats = tuple(beat(n, 5.0) for n in ("actor-0", "actor-1", "actor-2", "ghost"))
        batch = HeartbeatBatch(aggregator="aggregator-0", heartbeats=heartbeats)
        await ctl.on_request(batch, agg_conn)  # type: ignore[arg-type]
        await ctl.on_request(batch, actor_conn)  # type: ignore[arg-type]  # not an aggregator
        older = HeartbeatBatch(aggregator="aggregator-0", heartbeats=(beat("actor-0", 4.0),))
        await ctl.on_request(older, agg_conn)  # type: ignore[arg-type]
        return ctl

    ctl = run_async(main())
    assert set(ctl.heartbeats) == {"actor-0"}
    assert ctl.heartbeats["actor-0"].sent_at == 5.0  # the older one was overtaken
    assert ctl.registry["actor-0"].last_heartbeat is ctl.heartbeats["actor-0"]
    assert ctl.registry["actor-1"].last_heartbeat is None
    assert ctl.counters["heartbeats_refused"] == 3  # other node, retired, unregistered
    assert ctl.counters["heartbeat_batches_refused"] == 1
    assert ctl.counters["heartbeats_overtaken"] == 1


Tasks = tuple["asyncio.Task[None]", "asyncio.Task[None]", "asyncio.Task[None]"]


async def _node_with_an_aggregator() -> tuple[
    CountingController, HeartbeatAggregator, Actor, Tasks
]:
    """A controller, and an aggregator and an actor on one node (the aggregator ready
    before the actor starts); their running tasks."""
    ctl = CountingController(bind=TCP)
    ctl_task = asyncio.create_task(ctl.run())
    await ctl.wait_ready()
    agg = HeartbeatAggregator("aggregator-0", bind=TCP, controller=ctl.address)
    actor = Actor("actor-0", bind=TCP, controller=ctl.address, options=FAST)
    agg.locality = actor.locality = "node-a"
    agg_task = asyncio.create_task(agg.run())
    await agg.wait_ready()
    return ctl, agg, actor, (ctl_task, agg_task, asyncio.create_task(actor.run()))


def test_a_service_told_an_aggregator_heartbeats_through_it_in_batches() -> None:
    async def main() -> tuple[CountingController, Actor, HeartbeatAggregator, int]:
        ctl, agg, actor, (ctl_task, agg_task, actor_task) = await _node_with_an_aggregator()
        await ctl.wait_until(lambda c: actor.counters[RouteStat.VIA_AGGREGATOR] >= 3, 30)
        direct = ctl.direct["actor-0"]
        await ctl.wait_until(lambda c: c.batched["actor-0"] >= 8, 30)
        direct_after = ctl.direct["actor-0"]
        assert actor.counters[RouteStat.LINK_FAILURES] == 0
        for s in (actor, agg):
            s.stop("test over")
        await asyncio.gather(actor_task, agg_task)
        ctl.stop("test over")
        await ctl_task
        return ctl, actor, agg, direct_after - direct

    ctl, actor, agg, direct_meanwhile = run_async(main())
    assert direct_meanwhile == 0  # while the aggregator was up: batches only
    assert agg.counters[AggregatorStat.BATCHES_OUT] >= 1
    assert agg.counters[AggregatorStat.HEARTBEATS_OUT] >= ctl.batched["actor-0"]
    last = ctl.heartbeats["actor-0"]  # the goodbye, straight to the controller
    assert last.counters["heartbeats_sent"] == actor.counters["heartbeats_sent"]


def test_a_service_whose_aggregator_dies_goes_on_heartbeating_directly() -> None:
    async def main() -> tuple[CountingController, Actor]:
        ctl, agg, actor, (ctl_task, agg_task, actor_task) = await _node_with_an_aggregator()
        await ctl.wait_until(lambda c: c.batched["actor-0"] >= 2, 30)
        agg.stop("the aggregator dies")
        await agg_task
        direct = ctl.direct["actor-0"]
        seen = ctl.heartbeats["actor-0"].sent_at
        await ctl.wait_until(lambda c: c.direct["actor-0"] >= direct + 5, 30)
        assert ctl.heartbeats["actor-0"].sent_at > seen  # the controller still sees it
        assert "actor-0" in ctl.registry
        actor.stop("test over")
        await actor_task
        ctl.stop("test over")
        await ctl_task
        return ctl, actor

    run_async(main())


def test_a_service_that_cannot_reach_its_aggregator_heartbeats_directly() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"tcp://127.0.0.1:{s.getsockname()[1]}"

    async def main() -> tuple[CountingController, Actor]:
        ctl = CountingController(bind=TCP)
        ctl_task = asyncio.create_task(ctl.run())
        await ctl.wait_ready()
        # an aggregator the controller lists whose listener is gone
        ctl.registry["aggregator-0"] = record(
            "aggregator-0",
            AGGREGATOR_ROLE,
            "node-a",
            address=dead,
            publishes=(HEARTBEATS_TOPIC,),
        )
        actor = Actor("actor-0", bind=TCP, controller=ctl.address, options=FAST)
        actor.locality = "node-a"
        actor_task = asyncio.create_task(actor.run())
        await ctl.wait_until(lambda c: actor.counters[RouteStat.DIRECT] >= 5, 30)
        await ctl.wait_until(lambda c: c.direct["actor-0"] >= 5, 30)
        actor.stop("test over")
        await actor_task
        ctl.stop("test over")
        await ctl_task
        return ctl, actor

    ctl, actor = run_async(main())
    assert actor.counters[RouteStat.LINK_FAILURES] >= 1
    assert actor.counters[RouteStat.VIA_AGGREGATOR] == 0
    assert ctl.heartbeats["actor-0"].counters["heartbeats_sent"] >= 5
    assert ctl.batches == 0


def test_a_heartbeat_batch_round_trips_through_the_codec() -> None:
    from tianji.runtime.codec import decode, encode

    batch = HeartbeatBatch(aggregator="aggregator-0", heartbeats=(beat("a"), beat("b", 2.0)))
    assert decode(encode(batch)) == batch
