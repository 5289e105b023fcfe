"""The buffer service: stores what actors produce, hands batches to the learner on request.

Pure sampling logic lives in :mod:`tianji.rl.buffers`; this shell moves events. It never
sends a batch the learner did not ask for (cumulative credit from :class:`BatchRequested`),
so the learner's bounded queue is never overrun; with several learners each gets the
batches it asked for on its own topic, the one served least so far first. On-policy
fragments older than ``max_policy_lag`` versions are dropped (counted as ``dropped/stale``).

With ``[checkpoint] replay`` a replay shard publishes a snapshot of its contents on the
checkpoint schedule (and when asked before a clean stop) for the run's monitor to write; a
resumed shard (``restore=True``) starts from its snapshot (counted ``samples_restored``)
and stores nothing before it arrived.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from tianji.rl.algorithm import BufferSpec
from tianji.rl.books import Inbox, Outbox
from tianji.rl.buffers import ReplayBuffer, RolloutBuffer, make_buffer
from tianji.rl.checkpoint import pack_state, unpack_state
from tianji.rl.events import (
    BatchRequested,
    CheckpointTaken,
    PrioritiesUpdated,
    RestoreCheckpoint,
    SampleBatch,
    TakeCheckpoint,
    TrajectoryCollected,
)
from tianji.rl.run_balance import balance_config
from tianji.rl.stats import BookStat, BufferStat, Dropped
from tianji.rl.topics import (
    REQUESTS,
    batches_topic,
    buffer_name,
    learner_name,
    learners_of_shard,
    priorities_topic,
    replay_restore_topic,
    replay_snapshots_topic,
    trajectories_topic,
)
from tianji.runtime.core import Connection
from tianji.runtime.errors import ConfigError
from tianji.runtime.events import Event
from tianji.runtime.service import Service
from tianji.services.common import apply_run_options, parse_run_config, transitions
from tianji.services.numbered import publish_numbered, take_numbered

__all__ = ["BufferService"]

log = logging.getLogger("tianji.buffer")


class BufferService(Service):
    """Replay (uniform / prioritized) or rollout FIFO, as the algorithm's spec says.

    Args:
        name: service name.
        config: the run config as JSON data.
        buffer_spec: the algorithm's :class:`BufferSpec` fields.
        restore: start from the replay snapshot the monitor sends (a resumed run).
    """

    role = "buffer"
    RESTORE_TIMEOUT_S = 120.0

    def __init__(
        self,
        name: str,
        *,
        config: dict[str, Any],
        buffer_spec: dict[str, Any],
        index: int = 0,
        restore: bool = False,
        **kwargs: Any,
    ) -> None:
        run = parse_run_config(config)
        shards = run.buffer.shards
        if not 0 <= index < shards or name != buffer_name(index):
            raise ConfigError("buffer", name, f"buffer-<index> with index in [0, {shards})")
        self.index = index
        self.learners = {
            learner_name(j) for j in learners_of_shard(index, run.learner.count, shards)
        }
        topics = [batches_topic(n) for n in sorted(self.learners)]
        self.spec = BufferSpec(**buffer_spec)
        self.snapshots = run.checkpoint.replay and self.spec.kind != "rollout"
        if self.snapshots:
            topics.append(replay_snapshots_topic(name))
        super().__init__(name, publishes=topics, **kwargs)
        self.config = run
        apply_run_options(self, self.config)
        # on-policy rollouts older than this are dropped as stale before they are served
        self.max_lag = balance_config(run, self.spec).staleness_bound
        self.buffer = make_buffer(self.spec, seed=self.config.seed + 7919 * index)
        self.requested: dict[str, int] = {}  # cumulative batches each learner asked for
        self.sent: dict[str, int] = {}  # ... and were sent (credit = requested - sent)
        self.learner_version = 0
        self._ids = itertools.count()
        self.inbox = Inbox()  # the actors' numbered streams (tianji.rl.books)
        self.outbox = Outbox()  # ours, one per learner
        self._serving = asyncio.Lock()
        self._repeats: dict[str, tuple[int, int]] = {}  # learner -> (received, sent) at a repeat
        self._update_size()  # "ready" is 0 from the start for a replay shard
        self.subscribe(trajectories_topic(index, shards), self.on_trajectory)
        self.subscribe(REQUESTS, self.on_request_batches)
        self.subscribe(priorities_topic(index, shards), self.on_priorities)
        self._restored: asyncio.Event | None = None
        self._evicted_before = 0  # evictions a restored snapshot counted before us
        if restore:
            self._restored = asyncio.Event()
            self.subscribe(replay_restore_topic(name), self.on_restore)

    async def main(self) -> None:
        if self._restored is not None:
            try:
                await asyncio.wait_for(self._restored.wait(), self.RESTORE_TIMEOUT_S)
            except TimeoutError:
                self.fail(f"resume: no replay snapshot arrived in {self.RESTORE_TIMEOUT_S:.0f} s")
                return
        every = self.config.checkpoint.every_seconds
        while self.snapshots and every > 0:
            await asyncio.sleep(every)
            await self._snapshot()
        await super().main()

    async def on_restore(self, ev: RestoreCheckpoint) -> None:
        """Start from a replay snapshot (once; before anything is stored)."""
        assert self._restored is not None
        if self._restored.is_set():
            self.counters["restores_ignored"] += 1
            return
        assert isinstance(self.buffer, ReplayBuffer)
        try:
            self.buffer.load_state_dict(unpack_state(ev.state.tobytes()))
        except (ValueError, KeyError, TypeError) as exc:
            self.fail(f"cannot restore the replay snapshot: {exc}")
            return
        self.counters[BufferStat.SAMPLES_RESTORED] = len(self.buffer)
        # the snapshot's storage counts the evictions of the incarnations before it (kept
        # in their own heartbeats, or in the run before a resume): count only ours
        self._evicted_before = int(self.buffer.statistics()["evicted"])
        self.learner_version = max(self.learner_version, ev.policy_version)
        self._update_size()
        self._restored.set()
        self.report_soon()

    async def on_control(self, ev: Event) -> None:
        if isinstance(ev, TakeCheckpoint):
            if self.snapshots:
                await self._snapshot()
        else:
            await super().on_control(ev)

    async def _snapshot(self) -> None:
        """Publish the replay contents for the monitor to write (nothing while a resumed
        shard waits for its own snapshot, or while no monitor listens)."""
        if self._restored is not None and not self._restored.is_set():
            return
        topic_name = replay_snapshots_topic(self.name)
        if not self.subscriber_count(topic_name):
            self.counters["snapshots_unsent"] += 1
            return
        assert isinstance(self.buffer, ReplayBuffer)
        state = pack_state(self.buffer.state_dict())
        ev = CheckpointTaken(
            policy_version=self.learner_version, state=np.frombuffer(state, np.uint8)
        )
        if await self.publish(ev, topic_name):
            self.counters["snapshots_taken"] += 1

    async def on_trajectory(self, ev: TrajectoryCollected) -> None:
        if self._restored is not None and not self._restored.is_set():
            await self._restored.wait()  # store on top of the snapshot, never under it
        steps = transitions(ev.arrays)
        if not take_numbered(self, self.inbox, ev.actor, ev, steps, what="fragment"):
            return
        self.buffer.add(ev.arrays, policy_version=ev.policy_version)
        self.counters[BufferStat.SAMPLES_INSERTED] += steps
        self._count_evictions()
        await self._serve()
        self.report_soon()

    @property
    def credit(self) -> int:
        """Batches asked for and not sent yet."""
        return sum(self.requested.values()) - sum(self.sent.values())

    async def on_request_batches(self, ev: BatchRequested) -> None:
        if ev.learner not in self.learners or ev.buffer not in ("", self.name):
            return  # credit for another shard
        before = self.requested.get(ev.learner)
        if before is None:  # first word from it: a restarted buffer owes count - received
            self.sent[ev.learner] = min(ev.received, ev.count)
        elif ev.count < before:  # counting from 0 again: a restarted learner
            self.sent[ev.learner] = 0
        elif ev.count == before:
            self._on_repeat(ev)
        self.requested[ev.learner] = ev.count  # cumulative: a repeat changes nothing
        self.learner_version = max(self.learner_version, ev.learner_version)
        await self._serve()

    def _on_repeat(self, ev: BatchRequested) -> None:
        """A repeated request (the learner waited ``REPEAT_S`` with nothing arriving). If it
        has received less than we sent, and a repeat before said the same while we sent
        nothing since, the missing batches had a whole repeat interval to arrive: they were
        lost on the way (its stream numbers count their samples when the next one arrives).
        Grant its credit again, or it starves waiting for them."""
        sent = self.sent.get(ev.learner, 0)
        last = self._repeats.get(ev.learner)
        self._repeats[ev.learner] = (ev.received, sent)
        if ev.received >= sent or last != (ev.received, sent):
            return
        missing = sent - ev.received
        self.counters["credit_restored"] += missing
        log.warning("%s: %d batches sent to %s never arrived", self.name, missing, ev.learner)
        self.sent[ev.learner] = ev.received
        self._repeats.pop(ev.learner, None)

    async def on_priorities(self, ev: PrioritiesUpdated) -> None:
        update = getattr(self.buffer, "update_priorities", None)
        if update is None:
            self.counters["priorities_ignored"] += int(ev.indices.size)
            return
        ignored = update(ev.indices, ev.priorities)
        self.counters["priorities_stale"] += int(ignored)

    async def on_subscribed(self, conn: Connection, topics: Sequence[str]) -> None:
        await self._serve()  # a learner that asked before its subscription was wired

    def _next_learner(self) -> str | None:
        """The least served learner with credit that is subscribed to its batches now (a
        batch published before its subscription is wired would be lost)."""
        waiting = [
            n
            for n, count in self.requested.items()
            if count > self.sent.get(n, 0) and self.subscriber_count(batches_topic(n)) > 0
        ]
        return min(waiting, key=lambda n: self.sent.get(n, 0), default=None)

    async def _serve(self) -> None:
        if self._serving.locked():
            # a _serve under way (waiting for room on a learner's link) serves whatever
            # arrives meanwhile before it returns; waiting for it here would hold this
            # handler's link (an actor's fragments) behind a learner that waits for them
            return
        async with self._serving:  # one numbered batch at a time on each stream
            while (learner := self._next_learner()) is not None:
                self._drop_stale()
                batch = self.buffer.sample(self.spec.batch_size)
                if batch is None:
                    return
                await self._send_batch(learner, batch)

    async def _send_batch(self, learner: str, batch: dict[str, np.ndarray]) -> None:
        """Publish a batch numbered on the stream to ``learner``; count it sent when it was
        delivered to the learner's link, else unsent (on-policy samples taken out of the
        buffer are then lost: ``dropped/unsent``; replay draws are copies: ``draws_unsent``),
        and as ``sending`` meanwhile."""
        versions = batch.pop("policy_version").astype(np.int64)
        rollout = isinstance(self.buffer, RolloutBuffer)
        if rollout:  # per env column -> per transition
            versions = np.tile(versions, next(iter(batch.values())).shape[0])
        n = int(versions.size)
        topic_name = batches_topic(learner)
        self.sent[learner] = self.sent.get(learner, 0) + 1
        self.counters[BufferStat.BATCHES_SENT] += 1
        self._update_size()
        delivered = await publish_numbered(
            self,
            self.outbox,
            topic_name,
            functools.partial(
                SampleBatch,
                batch_id=next(self._ids),
                policy_version=self.learner_version,
                arrays=batch,
                policy_versions=versions,
                buffer=self.name,
            ),
            n,
            # rollout samples are taken out of the buffer: in no count until sent or unsent
            sending=n if rollout else 0,
            sending_key=BufferStat.SENDING,
            sent_key=BufferStat.SAMPLES_SENT,
            unsent_key=Dropped.UNSENT if rollout else BookStat.DRAWS_UNSENT,
        )
        if not delivered:
            log.warning("%s: a batch for %s found no link: %d unsent", self.name, learner, n)
        self.report_soon()

    def _drop_stale(self) -> None:
        if not isinstance(self.buffer, RolloutBuffer) or self.max_lag is None:
            return
        oldest = self.learner_version - self.max_lag
        dropped = self.buffer.drop_older_than(oldest)
        if dropped:
            self.counters[Dropped.STALE] += dropped
            self._update_size()

    def _count_evictions(self) -> None:
        stats = self.buffer.statistics()
        evicted = int(stats["evicted"])
        if isinstance(self.buffer, RolloutBuffer):
            self.counters[Dropped.EVICTED] = self.buffer.evicted_transitions
        else:
            self.counters[Dropped.EVICTED] = evicted - self._evicted_before
        self._update_size()

    def _update_size(self) -> None:
        """Gauges ``size`` (the buffer's own unit: fragments or transitions) and
        ``buffered_samples`` (transitions, for the run's sample accounting)."""
        self.gauges[BufferStat.SIZE] = float(len(self.buffer))
        if isinstance(self.buffer, RolloutBuffer):
            self.gauges[BufferStat.BUFFERED_SAMPLES] = float(self.buffer.stored_transitions)
        else:
            self.gauges[BufferStat.BUFFERED_SAMPLES] = float(len(self.buffer))
            # 0 while this replay shard cannot hand out a batch yet: the controller keeps
            # every producer running until all shards can (see Observation.filling)
            self.gauges[BufferStat.READY] = float(len(self.buffer) >= self.buffer.min_size)
