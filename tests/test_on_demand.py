"""Topics taken on demand (tianji.runtime.demand): a subscriber gets the first event, then
one per want, the newest; what a newer event replaced meanwhile is counted."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import numpy as np

from tianji.rl.events import ParamsPublished
from tianji.rl.topics import LATEST_PARAMS
from tianji.runtime.controller import Controller
from tianji.runtime.demand import Demand, DemandStat
from tianji.runtime.service import Service
from tianji.testing import run_async


class Conn:
    """Stands for a subscriber's connection (Demand only hashes it)."""


def test_the_first_event_goes_out_then_the_newest_is_held_until_wanted() -> None:
    counters: collections.Counter[str] = collections.Counter()
    demand = Demand(counters)
    conn, other = Conn(), Conn()
    demand.subscribe(conn, ["w"])  # type: ignore[arg-type]
    assert demand.admit(conn, "w", [b"1"])  # type: ignore[arg-type]
    assert demand.admit(other, "w", [b"1"])  # type: ignore[arg-type]  # not on demand
    assert demand.admit(conn, "x", [b"1"])  # type: ignore[arg-type]  # another topic
    assert not demand.admit(conn, "w", [b"2"])  # type: ignore[arg-type]
    assert not demand.admit(conn, "w", [b"3"])  # type: ignore[arg-type]
    assert counters[DemandStat.SUPERSEDED] == 1  # 2 was replaced by 3 before a want
    assert demand.want(conn, "w") == [b"3"]  # type: ignore[arg-type]
    assert demand.want(conn, "w") is None  # type: ignore[arg-type]  # nothing held: wanting
    assert demand.admit(conn, "w", [b"4"])  # type: ignore[arg-type]  # goes out at once
    assert not demand.admit(conn, "w", [b"5"])  # type: ignore[arg-type]
    demand.forget(conn)  # type: ignore[arg-type]
    assert counters[DemandStat.HELD_UNSENT] == 1
    assert demand.want(conn, "w") is None  # type: ignore[arg-type]


class Taker(Service):
    def __init__(self, name: str, **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        self.got: list[int] = []
        self.changed = asyncio.Event()
        self.subscribe(LATEST_PARAMS, self.on_params, on_demand=True)

    async def on_params(self, ev: ParamsPublished) -> None:
        self.got.append(ev.policy_version)
        self.changed.set()

    async def until(self, count: int) -> None:
        while len(self.got) < count:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), 10)


def test_an_on_demand_subscriber_gets_one_event_per_want_over_tcp() -> None:
    async def main() -> tuple[Service, Taker, list[int]]:
        ctl = Controller(bind="tcp://127.0.0.1:0")
        ctl_task = asyncio.create_task(ctl.run())
        await ctl.wait_ready()
        kw = {"bind": "tcp://127.0.0.1:0", "controller": ctl.address}
        pub = Service("params-0", publishes=[LATEST_PARAMS], **kw)
        sub = Taker("actor-0", **kw)
        tasks = [asyncio.create_task(s.run()) for s in (pub, sub)]
        await pub.wait_subscribers(LATEST_PARAMS)

        async def put(version: int) -> None:
            w = np.full(8, version, np.float32)
            await pub.publish(
                ParamsPublished(policy_version=version, weights={"w": w}), LATEST_PARAMS
            )

        for version in range(1, 6):
            await put(version)
        await sub.until(1)
        await asyncio.sleep(0.2)  # nothing more comes unasked
        seen = list(sub.got)
        sub.want(LATEST_PARAMS)
        await sub.until(2)  # the newest held: 5
        await put(6)  # not wanted: held
        await asyncio.sleep(0.2)
        seen.append(len(sub.got))
        sub.want(LATEST_PARAMS)
        await sub.until(3)
        sub.want(LATEST_PARAMS)  # nothing held: the next one goes out at once
        await asyncio.sleep(0.1)
        await put(7)
        await sub.until(4)
        for s in (sub, pub):
            s.stop("test over")
        await asyncio.gather(*tasks)
        ctl.stop("test over")
        await ctl_task
        return pub, sub, seen

    pub, sub, seen = run_async(main(), timeout=60)
    assert seen == [1, 2]  # only the first, and nothing after 6 until wanted
    assert sub.got == [1, 5, 6, 7]
    assert pub.counters[DemandStat.SUPERSEDED] == 3  # 2, 3, 4: replaced before a want
