"""The heartbeat batches of one flush tick are decided together (issue 36): every node's
aggregator flushes on the same wall-clock ticks, and a controller decision woken by one
node's batch waits (briefly, bounded) for the other nodes' batches of that tick, so two
aggregators cost one decision per tick, not two."""

from __future__ import annotations

import asyncio
import collections
import types
from collections.abc import Mapping
from typing import Any

import pytest

from tests.test_heartbeat_aggregator import Peer, beat, record
from tianji.runtime import aggregator as aggregator_module
from tianji.runtime.aggregation import AGGREGATOR_ROLE
from tianji.runtime.aggregator import HeartbeatAggregator
from tianji.runtime.controller import Controller, Send
from tianji.runtime.events import Heartbeat, HeartbeatBatch
from tianji.runtime.rounds import INCOMPLETE, BatchRounds
from tianji.testing import run_async


def test_a_round_waits_for_the_aggregators_of_the_round_before_and_no_longer() -> None:
    async def main() -> tuple[collections.Counter[str], list[str]]:
        counters: collections.Counter[str] = collections.Counter()
        rounds = BatchRounds(counters, gather_s=30.0)
        steps = []
        await asyncio.wait_for(rounds.gather(), 1.0)  # no batch (a direct heartbeat): no wait
        rounds.arrived("aggregator-a")
        rounds.arrived("aggregator-b")
        await asyncio.wait_for(rounds.gather(), 1.0)  # the first round expects nobody
        rounds.close()

        rounds.arrived("aggregator-a")
        waiting = asyncio.create_task(rounds.gather())
        await asyncio.sleep(0.02)
        steps.append("waits for b" if not waiting.done() else "did not wait")
        rounds.arrived("aggregator-b")
        await asyncio.wait_for(waiting, 1.0)  # b's batch ends the wait, not the 30 s
        rounds.close()

        rounds.gather_s = 0.02  # b stops: the next round waits 20 ms for it, then goes on
        rounds.arrived("aggregator-a")
        await asyncio.wait_for(rounds.gather(), 1.0)
        rounds.close()
        rounds.arrived("aggregator-a")  # and b is not waited for again
        rounds.gather_s = 30.0
        await asyncio.wait_for(rounds.gather(), 1.0)
        return counters, steps

    counters, steps = run_async(main())
    assert steps == ["waits for b"]
    assert counters[INCOMPLETE] == 1


class Decisions:
    """A controller plug-in recording which heartbeats each update saw as new."""

    roles = frozenset({"actor"})

    def __init__(self) -> None:
        self.updates: list[set[str]] = []
        self._seen: dict[str, Heartbeat] = {}

    def attach(self, send: Send) -> None:
        return None

    async def update(self, heartbeats: Mapping[str, Heartbeat], live: Mapping[str, Any]) -> None:
        new = {n for n, hb in heartbeats.items() if self._seen.get(n) is not hb}
        self._seen = dict(heartbeats)
        self.updates.append(new)

    def gauges(self) -> dict[str, float]:
        return {}

    def forget(self, name: str) -> None:
        return None

    def retired(self, hb: Heartbeat) -> Heartbeat:
        return hb

    def rejoined(self, retired: str, heartbeats: dict[str, Heartbeat]) -> None:
        return None


def test_two_nodes_batches_of_one_tick_make_one_decision() -> None:
    async def main() -> list[set[str]]:
        plugin = Decisions()
        ctl = Controller(bind="inproc://", plugins=[plugin])
        conns = {"a": Peer("agg-a"), "b": Peer("agg-b")}
        ctl.registry = {
            "aggregator-a": record("aggregator-a", AGGREGATOR_ROLE, "A", conns["a"]),
            "aggregator-b": record("aggregator-b", AGGREGATOR_ROLE, "B", conns["b"]),
            "actor-a": record("actor-a", "actor", "A"),
            "actor-b": record("actor-b", "actor", "B"),
        }
        loop = asyncio.create_task(ctl._plugin_loop())

        async def tick(at: float, gap: float) -> None:
            for node in ("a", "b"):
                batch = HeartbeatBatch(
                    aggregator=f"aggregator-{node}", heartbeats=(beat(f"actor-{node}", at),)
                )
                await ctl.on_request(batch, conns[node])  # type: ignore[arg-type]
                await asyncio.sleep(gap)  # b's batch lands a little after a's

        await tick(1.0, 0.002)  # the first round: nobody expected yet (a decision each)
        await asyncio.sleep(0.1)
        learned = len(plugin.updates)
        for at in (2.0, 3.0):
            await tick(at, 0.002)
            await asyncio.sleep(0.1)
        loop.cancel()
        return plugin.updates[learned:]

    assert run_async(main()) == [{"actor-a", "actor-b"}, {"actor-a", "actor-b"}]


@pytest.mark.parametrize("interval", [0.04, 0.02, 0.25])
def test_every_aggregator_flushes_on_the_same_wall_clock_ticks(
    monkeypatch: pytest.MonkeyPatch, interval: float
) -> None:
    agg = HeartbeatAggregator("aggregator-0", flush_interval=interval)
    for now in (1_700_000_000.0013, 1_700_000_000.0391, 1_700_000_123.4567):
        clock = types.SimpleNamespace(time=lambda now=now: now)
        monkeypatch.setattr(aggregator_module, "time", clock)
        wait = agg.until_tick()
        assert 0 < wait <= interval  # a heartbeat still waits one interval at most
        ticks = (now + wait) / interval
        assert ticks == pytest.approx(round(ticks), abs=1e-6)
