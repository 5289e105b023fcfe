"""Scoped services (population members) keep their data to their own scope."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from test_service_pubsub import Collector, running, until

from tianji.runtime.controller import Controller
from tianji.runtime.errors import ConfigError
from tianji.runtime.events import ArraysPublished, Heartbeat
from tianji.runtime.scope import (
    full_name,
    local_view,
    scope_of,
    scoped_topic,
    split_name,
    unscoped_topic,
)
from tianji.runtime.service import Service
from tianji.services.balancer import Balancer
from tianji.services.population import PopulationBalancer
from tianji.testing import LISTEN_ADDRESSES, run_async


def arrays(seq: int) -> ArraysPublished:
    return ArraysPublished(seq=seq, policy_version=0, arrays={"x": np.full(4, seq)}, meta={})


def test_names_split_into_scope_and_local_name() -> None:
    assert full_name("m1", "learner-0") == "m1.learner-0"
    assert full_name("", "learner-0") == "learner-0"
    assert split_name("m1.learner-0", "m1") == "learner-0"
    assert split_name("learner-0", "m1") == "learner-0"
    assert scope_of("m1.actor-3#2") == "m1" and scope_of("actor-3") == ""
    assert scoped_topic("m0", "TrajectoryCollected") == "TrajectoryCollected/@m0"
    assert scoped_topic("m0", "SampleBatch/learner-0") == "SampleBatch/@m0/learner-0"
    for t in ("TrajectoryCollected", "SampleBatch/learner-0", "X/a/b"):
        assert unscoped_topic("m0", scoped_topic("m0", t)) == t
        assert unscoped_topic("m1", scoped_topic("m0", t)) == scoped_topic("m0", t)
    view = local_view({"m0.actor-0": 1, "m1.actor-0": 2, "m0.actor-0#1": 3, "actor-0": 4}, "m0")
    assert view == {"actor-0": 1, "actor-0#1": 3}
    with pytest.raises(ConfigError, match=r"m2\.learner-0"):
        split_name("m2.learner-0", "m1")
    with pytest.raises(ConfigError, match="Bad Scope"):
        Service("x", scope="Bad Scope")


@pytest.mark.parametrize("scheme", ["inproc", "tcp"])
def test_a_scoped_subscriber_gets_only_its_own_scopes_events(scheme: str) -> None:
    bind = LISTEN_ADDRESSES[scheme]

    async def main() -> None:
        ctl = Controller(bind=bind)
        async with running(ctl):
            pubs = {
                s: Service(
                    "pub", bind=bind, controller=ctl.address, publishes=[ArraysPublished], scope=s
                )
                for s in ("m0", "m1")
            }
            subs = {
                s: Collector(
                    "m0.sub" if s == "m0" else "sub", bind=bind, controller=ctl.address, scope=s
                )
                for s in ("m0", "m1")
            }
            async with running(*pubs.values(), *subs.values()):
                assert set(ctl.registry) >= {"m0.pub", "m1.pub", "m0.sub", "m1.sub"}
                assert subs["m0"].name == "sub" and subs["m0"].full_name == "m0.sub"
                for pub in pubs.values():
                    await pub.wait_subscribers(ArraysPublished, 1)
                    assert pub.subscriber_count(ArraysPublished) == 1
                for i in range(20):
                    await pubs["m0"].publish(arrays(i))
                    await pubs["m1"].publish(arrays(1000 + i))
                await until(lambda: len(subs["m0"].seen) == 20 and len(subs["m1"].seen) == 20)
                await asyncio.sleep(0.1)  # nothing more arrives
                assert subs["m0"].seen == list(range(20))
                assert subs["m1"].seen == list(range(1000, 1020))
                beats = {n: hb for n, hb in ctl.heartbeats.items() if n.endswith("sub")}
                assert all(hb.name == n for n, hb in beats.items())

    run_async(main())


class Recorder:
    """A member balancer stand-in: what it saw and what it sent."""

    def __init__(self) -> None:
        self.seen: list[tuple[set[str], set[str]]] = []
        self.forgot: list[str] = []
        self.send: Any = None

    def attach(self, send: Any) -> None:
        self.send = send

    async def update(self, heartbeats: Any, live: Any) -> None:
        self.seen.append((set(heartbeats), set(live)))
        await self.send("actor-0", "grant")

    def gauges(self) -> dict[str, float]:
        return {"balance/decisions": 1.0}

    def forget(self, name: str) -> None:
        self.forgot.append(name)

    def retired(self, hb: Heartbeat) -> Heartbeat:
        return hb

    def rejoined(self, retired: str, heartbeats: dict[str, Heartbeat]) -> None:
        self.forgot.append(f"rejoined {retired} {sorted(heartbeats)}")


def test_the_population_balancer_gives_each_member_its_own_services_under_local_names() -> None:
    members = {"m0": Recorder(), "m1": Recorder()}
    balancer = PopulationBalancer(members)  # type: ignore[arg-type]
    sent: list[tuple[str, Any]] = []

    async def send(name: str, ev: Any) -> bool:
        sent.append((name, ev))
        return True

    balancer.attach(send)
    beats: dict[str, Any] = {
        "m0.actor-0": 1, "m0.learner-0": 2, "m1.actor-0": 3, "m1.actor-0#1": 4, "monitor": 5,
    }  # fmt: skip
    live = {"m0.actor-0": 1, "m1.actor-0": 3}
    run_async(balancer.update(beats, live))
    assert members["m0"].seen == [({"actor-0", "learner-0"}, {"actor-0"})]
    assert members["m1"].seen == [({"actor-0", "actor-0#1"}, {"actor-0"})]
    assert sent == [("m0.actor-0", "grant"), ("m1.actor-0", "grant")]
    balancer.forget("m1.actor-0")
    balancer.rejoined("m0.learner-0#1", beats)
    assert members["m1"].forgot == ["actor-0"]
    assert members["m0"].forgot == ["rejoined learner-0#1 ['actor-0', 'learner-0']"]
    assert balancer.gauges() == {"balance/decisions": 2.0}
    assert isinstance(Balancer.ROLES, frozenset) and balancer.roles == Balancer.ROLES
