"""The per-host params relay: the subscribers of a host with a relay are told the relay
only, the relay is told the params service; the params service then sends each version
once per host, and the host's subscribers take it from the relay's board. A subscriber
of a host without a relay (or whose relay left) is told the params service."""

from __future__ import annotations

import asyncio
import types
from typing import Any

import numpy as np
import pytest

from tianji.rl.events import ParamsPublished
from tianji.rl.topics import LATEST_PARAMS, LEARNER_PARAMS
from tianji.runtime.board import BOARD_MIN_BYTES, Board
from tianji.runtime.controller import RELAY_ROLE, Controller
from tianji.runtime.heartbeats import ServiceStat
from tianji.runtime.service import Service
from tianji.services.params import ParamsRelay, ParamsService
from tianji.testing import run_async


def record(name: str, role: str, locality: str) -> Any:
    return types.SimpleNamespace(
        name=name,
        role=role,
        publishes=(LATEST_PARAMS,),
        locality=locality,
        address=f"tcp://{name}:1",
        local_address=f"shm://{name}",
    )


def test_subscribers_are_told_one_relay_of_their_host_and_the_relay_the_origin() -> None:
    ctl = Controller(bind="inproc://")
    ctl.registry = {
        "params-0": record("params-0", "params", "A"),
        "relay-1": record("relay-1", RELAY_ROLE, "B"),
    }
    assert ctl.publishers(LATEST_PARAMS, "B") == ("shm://relay-1",)  # an actor on B
    assert ctl.publishers(LATEST_PARAMS, "B", relay=True) == ("tcp://params-0:1",)
    assert ctl.publishers(LATEST_PARAMS, "C") == ("tcp://params-0:1",)  # no relay on C
    assert ctl.publishers(LATEST_PARAMS, "A") == ("shm://params-0",)
    ctl.registry["relay-0"] = record("relay-0", RELAY_ROLE, "B")  # a second relay on B
    assert ctl.publishers(LATEST_PARAMS, "B") == ("shm://relay-0",)  # one of them, never both
    del ctl.registry["relay-0"]
    del ctl.registry["relay-1"]  # the relay left: back to the origin
    assert ctl.publishers(LATEST_PARAMS, "B") == ("tcp://params-0:1",)


class Actor(Service):
    role = "actor"

    def __init__(self, name: str, **kw: Any) -> None:
        super().__init__(name, **kw)
        self.versions: list[int] = []
        self.enough = asyncio.Event()
        self.subscribe(LATEST_PARAMS, self.on_params, latest_only=True)

    async def on_params(self, ev: ParamsPublished) -> None:
        self.versions.append(ev.policy_version)
        if ev.policy_version == 3:
            self.enough.set()


class Learner(Service):
    role = "learner"


@pytest.mark.skipif(not Board.available(), reason="no writable /dev/shm")
def test_the_params_service_sends_a_version_once_per_host_through_the_relay() -> None:
    size = 2 * BOARD_MIN_BYTES

    async def main() -> tuple[ParamsService, ParamsRelay, list[Actor]]:
        ctl = Controller(bind="tcp://127.0.0.1:0")
        ctl_task = asyncio.create_task(ctl.run())
        await ctl.wait_ready()
        kw = {"bind": "tcp://127.0.0.1:0", "controller": ctl.address, "local_bind": "shm://"}
        learner = Learner("learner-0", publishes=[LEARNER_PARAMS], **kw)
        params = ParamsService("params-0", **kw)
        relay = ParamsRelay("relay-1", **kw)
        actors = [Actor(f"actor-{i}", **kw) for i in range(3)]
        for s in (relay, *actors):
            s.locality = "host-b"  # a second host, as the controller sees it
        everyone = (learner, params, relay, *actors)
        tasks = [asyncio.create_task(s.run()) for s in everyone]
        await relay.wait_subscribers(LATEST_PARAMS, len(actors))
        while params.subscriber_count(LATEST_PARAMS) != 1:  # noqa: ASYNC110 - goes down
            await asyncio.sleep(0.02)  # the actors left params-0 for the relay
        await learner.wait_subscribers(LEARNER_PARAMS)
        for version in (1, 2, 3):
            w = np.full(size, version, np.uint8)
            await learner.publish(ParamsPublished(policy_version=version, weights={"w": w}))
        await asyncio.wait_for(asyncio.gather(*(a.enough.wait() for a in actors)), 30)
        for s in everyone:
            s.stop("test over")
        await asyncio.gather(*tasks)
        ctl.stop("test over")
        await ctl_task
        return params, relay, actors

    params, relay, actors = run_async(main(), timeout=90)
    for actor in actors:
        assert actor.versions[-3:] == [1, 2, 3]
        assert actor.counters[ServiceStat.BOARD_READS] >= 3  # from the relay's board
    sent = params.counters[ServiceStat.PUBLISHED_BYTES]
    assert 3 * size <= sent < 3 * size + 10_000  # one copy per version: to the relay
    assert relay.counters[ServiceStat.BOARD_WRITES] == 3
