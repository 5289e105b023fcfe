"""The simulated services of ``tianji bench scale``'s control part (one process of them):
each with its own TCP connection to the controller and the real wire events. It registers
(``RegisterService`` with its role's topics), watches its role's topics (``WatchTopics``),
then sends a ``Heartbeat`` every second with its role's counters moving as in a run (actors
insert a fragment a second while granted; the learner consumes what the buffer inserted)
and reads the controller's commands (pause/resume, grants). Started by
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
        self.host = f"sim-{os.getpid()}"
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
        gate = asyncio.Semaphore(64)  # connections being made at once, per simulator
        joined0 = time.time()
        await asyncio.gather(*(self._join(s, gate) for s in self.sims))
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

    async def _join(self, sim: _Sim, gate: asyncio.Semaphore) -> None:
        publishes, watches = self.topology[sim.role]
        async with gate:
            delay = 0.05
            while True:  # as a service does: a refused or reset connect is tried again
                try:
                    sim.conn = await self.transport.connect(self.address, limits=self.limits)
                    break
                except TianjiError as exc:
                    log.debug("%s: connect: %r; again", sim.name, exc)
                    self.retries.append(sim.name)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 2.0)
            self.tasks.append(asyncio.create_task(self._reader(sim)))
            sim.waiting = {"", *watches}
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
            sim.conn.send_nowait(self._frames(hb))
        except TianjiError as exc:  # full or gone: this heartbeat is skipped
            log.debug("%s: heartbeat not sent: %r", sim.name, exc)
