"""The simulated services of ``tianji bench scale``'s control part (one process of them):
each with its own TCP connection to the controller and the real wire events. It registers
(``RegisterService`` with its role's topics), watches its role's topics (``WatchTopics``),
then sends a ``Heartbeat`` every second with its role's counters moving as in a run (actors
insert a fragment a second while granted; the learner consumes what the buffer inserted)
and reads the controller's commands (pause/resume, grants). With ``aggregated``, each
also watches the heartbeat aggregator's pseudo-topic and sends its heartbeats to the
aggregator the controller names, on a connection of its own. Started by
:func:`tianji.bench.scale_control.measure_control`."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
from typing import Any

from tianji.rl.events import GrantProduction
from tianji.rl.stats import ActorStat, BufferStat, LearnerStat
from tianji.rl.topics import (
    CHECKPOINTS,
    EPISODES,
    LATEST_PARAMS,
    LEARNER_PARAMS,
    REQUESTS,
    batches_topic,
    learner_name,
    priorities_topic,
    trajectories_topic,
)
from tianji.runtime.aggregation import HEARTBEATS_TOPIC
from tianji.runtime.codec import Codec
from tianji.runtime.core import Limits
from tianji.runtime.errors import TianjiError
from tianji.runtime.events import (
    Heartbeat,
    PublishersChanged,
    RegisterService,
    ServiceRegistered,
    Shutdown,
    WatchTopics,
)
from tianji.runtime.plugins import transport_for

__all__ = ["Simulator", "topics"]

log = logging.getLogger(__name__)

FRAGMENT = 256
"""Samples an actor inserts per second."""


def topics() -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """Role -> (topics it publishes, topics it watches), as the real services of a
    one-learner, one-shard DQN run."""
    traj = trajectories_topic(0, 1)
    learner = learner_name(0)
    return {
        "actor": ((traj, EPISODES), (LATEST_PARAMS,)),
        "buffer": ((batches_topic(learner),), (traj, REQUESTS, priorities_topic(0, 1))),
        "learner": (
            (REQUESTS, priorities_topic(0, 1), LEARNER_PARAMS, CHECKPOINTS),
            (batches_topic(learner),),
        ),
        "params": ((LATEST_PARAMS,), (LEARNER_PARAMS,)),
        "monitor": ((), (EPISODES, CHECKPOINTS)),
    }


class _Sim:
    """One simulated service: its connection, its counters and its registry timings."""

    def __init__(self, name: str, role: str, phase: float) -> None:
        self.name, self.role, self.phase = name, role, phase
        self.conn: Any = None
        self.aggregator: Any = None  # the connection to its node's aggregator, while up
        self.sent_at = 0.0
        self.waiting: set[str] = set()
        self.answered: float | None = None
        self.limit: int | None = None  # fragments granted in all (None: no grant yet)
        self.counters: dict[str, int] = {}
        self.gauges: dict[str, float] = {}


class Simulator:
    """The services of one simulator process (``job``: the controller's ``address``, the
    ``names`` as (name, role), their heartbeat ``phases`` and the ``scale`` of the buffer's
    and learner's counters); :meth:`run` until stdin closes."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.topology = topics()
        self.codec = Codec()
        self.address = job["address"]
        self.transport = transport_for(self.address)
        self.limits = Limits()
        self.scale = int(job["scale"])
        self.sims = [
            _Sim(name, role, phase)
            for (name, role), phase in zip(job["names"], job["phases"], strict=True)
        ]
        self.host = job.get("locality") or f"sim-{os.getpid()}"
        self.aggregated = bool(job.get("aggregated"))  # heartbeats through an aggregator
        self.gate = asyncio.Semaphore(64)  # connections being made at once
        self.answered: list[_Sim] = []
        self.retries: list[str] = []  # connects that failed (the controller's queue was full)
        self.all_answered = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []
        self.inserted = self.consumed = 0

    def _frames(self, ev: Any) -> list[Any]:
        return [b"", *self.codec.encode(ev)]  # CONTROL topic, then the event

    async def run(self) -> dict[str, Any]:
        """Join every service, send heartbeats until the driver closes stdin; the
        registry's answer times, the join's length and the connect retries."""
        stop = threading.Event()

        def wait_for_eof() -> None:
            sys.stdin.read()
            stop.set()

        threading.Thread(target=wait_for_eof, daemon=True).start()
        joined0 = time.time()
        await asyncio.gather(*(self._join(s, self.gate) for s in self.sims))
        await self.all_answered.wait()
        joined = time.time()
        start = time.monotonic()
        next_beat = {id(s): start + s.phase for s in self.sims}
        while not stop.is_set():  # until the driver closes our stdin
            now = time.monotonic()
            for sim in self.sims:
                if next_beat[id(sim)] > now:
                    continue
                next_beat[id(sim)] += 1.0
                self._count(sim, int(now - start))
                self._beat(sim)
            await asyncio.sleep(0.01)
        for sim in self.sims:
            sim.conn.abort()
            if sim.aggregator is not None:
                sim.aggregator.abort()
        for task in self.tasks:
            task.cancel()
        waits = [(s.answered - s.sent_at) * 1000 for s in self.sims if s.answered is not None]
        retries = len(self.retries)
        return {"register_ms": waits, "join_s": joined - joined0, "connect_retries": retries}

    async def _reader(self, sim: _Sim) -> None:
        try:
            while True:
                got = await sim.conn.recv()
                ev = self.codec.decode(got[1:])
                if isinstance(ev, ServiceRegistered):
                    sim.waiting.discard("")
                elif isinstance(ev, PublishersChanged) and ev.topic == HEARTBEATS_TOPIC:
                    if ev.addresses and sim.aggregator is None:
                        self.tasks.append(asyncio.create_task(self._link(sim, ev.addresses[0])))
                elif isinstance(ev, PublishersChanged):
                    sim.waiting.discard(ev.topic)
                elif isinstance(ev, GrantProduction):
                    sim.limit = ev.limit
                elif isinstance(ev, Shutdown):
                    return
                if sim.answered is None and not sim.waiting:
                    sim.answered = time.time()
                    self.answered.append(sim)
                    if len(self.answered) == len(self.sims):
                        self.all_answered.set()
        except TianjiError as exc:  # the controller closed the link: the bench is over
            log.debug("%s: link closed: %r", sim.name, exc)

    async def _connect(self, sim: _Sim, address: str) -> Any:
        delay = 0.05
        while True:  # as a service does: a refused or reset connect is tried again
            try:
                return await transport_for(address).connect(address, limits=self.limits)
            except TianjiError as exc:
                log.debug("%s: connect to %s: %r; again", sim.name, address, exc)
                self.retries.append(sim.name)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _link(self, sim: _Sim, address: str) -> None:
        """Heartbeat through the node's aggregator (a link of its own, as a service has)
        until the link ends (then straight to the controller again)."""
        async with self.gate:
            conn = await self._connect(sim, address)
        sim.aggregator = conn
        try:
            while True:
                await conn.recv()  # it sends nothing: this sees the link end
        except TianjiError as exc:
            log.debug("%s: aggregator link closed: %r", sim.name, exc)
        finally:
            sim.aggregator = None

    async def _join(self, sim: _Sim, gate: asyncio.Semaphore) -> None:
        publishes, watches = self.topology[sim.role]
        async with gate:
            sim.conn = await self._connect(sim, self.address)
            self.tasks.append(asyncio.create_task(self._reader(sim)))
            sim.waiting = {"", *watches}
            if self.aggregated:  # told its node's aggregator (not waited for, as a service)
                watches = (*watches, HEARTBEATS_TOPIC)
            sim.sent_at = time.time()
            reg = RegisterService(
                name=sim.name,
                role=sim.role,
                address=f"tcp://127.0.0.1:{10000 + hash(sim.name) % 50000}",
                publishes=publishes,
                host=self.host,
                pid=os.getpid(),
                local_address="",
                locality=self.host,
                run_digest="",
            )
            await sim.conn.send(self._frames(reg))
            await sim.conn.send(self._frames(WatchTopics(topics=watches)))

    def _count(self, sim: _Sim, elapsed: int) -> None:
        """Move ``sim``'s counters by a second of its role's work (``elapsed`` s in)."""
        c = sim.counters
        granted = sim.limit is None or c.get(ActorStat.FRAGMENTS_SENT, 0) < sim.limit
        if sim.role == "actor" and granted:
            c[ActorStat.ENV_STEPS] = c.get(ActorStat.ENV_STEPS, 0) + FRAGMENT
            c[ActorStat.SAMPLES_PRODUCED] = c.get(ActorStat.SAMPLES_PRODUCED, 0) + FRAGMENT
            c[ActorStat.FRAGMENTS_SENT] = c.get(ActorStat.FRAGMENTS_SENT, 0) + 1
            c[ActorStat.EPISODES] = c.get(ActorStat.EPISODES, 0) + 10
            sim.gauges[ActorStat.POLICY_VERSION] = float(elapsed)
            self.inserted += FRAGMENT
        elif sim.role == "buffer":
            c[BufferStat.SAMPLES_INSERTED] = self.inserted * self.scale
            c[BufferStat.SAMPLES_SENT] = self.consumed
            sim.gauges[BufferStat.SIZE] = float(min(self.inserted, 100_000))
        elif sim.role == "learner":
            self.consumed = self.inserted * self.scale * 2
            c[LearnerStat.SAMPLES_RECEIVED] = self.consumed
            c[LearnerStat.SAMPLES_CONSUMED] = self.consumed
            c[LearnerStat.LEARNER_UPDATES] = elapsed
            sim.gauges[LearnerStat.PARAMS_VERSION] = float(elapsed)

    def _beat(self, sim: _Sim) -> None:
        hb = Heartbeat(
            name=sim.name,
            role=sim.role,
            state="running",
            counters=dict(sim.counters),
            gauges={**sim.gauges, "rss_mb": 250.0, "max_rss_mb": 260.0},
            queue_depths={},
            sent_at=time.time(),
        )
        try:
            if sim.aggregator is not None:
                try:
                    sim.aggregator.send_nowait(self._frames(hb))
                    return
                except TianjiError as exc:  # as a service does: straight to the controller
                    log.debug("%s: heartbeat to the aggregator failed: %r", sim.name, exc)
            sim.conn.send_nowait(self._frames(hb))
        except TianjiError as exc:  # full or gone: this heartbeat is skipped
            log.debug("%s: heartbeat not sent: %r", sim.name, exc)
