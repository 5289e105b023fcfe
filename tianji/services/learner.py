"""The learner: consumes sample batches, updates the algorithm, publishes weights.

Long updates run in a worker thread so heartbeats and control commands keep flowing
during them; short off-policy ones on the loop's thread
(:mod:`tianji.services.update_runner`). It measures the policy lag of every sample
it consumes (learner version at consumption minus the sample's behaviour version).

With ``learner.count = K > 1`` there are K data-parallel learners ``learner-0..K-1``:
each asks the buffer for its own batches, and they average their gradients at every
optimizer step (:mod:`tianji.services.learner_sync`: PyTorch's collectives, or tianji's
own all-to-all for small gradients), so all hold identical weights; only ``learner-0``
publishes them. Each learner computes on its own device
(:func:`tianji.services.devices.resolve_device`).

Learner-0 also takes the checkpoints (``[checkpoint]``): every ``every_updates`` updates
or ``every_seconds`` seconds it packs its algorithm's whole state between two updates and
publishes it (:class:`CheckpointTaken`) to the run's monitor, which writes it. A resumed
run's learners (``restore=True``) wait for the state to continue from
(:class:`RestoreCheckpoint`) before anything else.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from tianji.rl.books import Inbox
from tianji.rl.events import (
    AdoptState,
    BatchRequested,
    GrantConsumption,
    ParamsPublished,
    PrioritiesUpdated,
    SampleBatch,
    TakeCheckpoint,
)
from tianji.rl.lagstats import LagStats
from tianji.rl.run_balance import balance_config
from tianji.rl.stats import BookStat, Dropped, LearnerStat
from tianji.rl.topics import (
    CHECKPOINTS,
    LEARNER_PARAMS,
    RENDEZVOUS,
    REQUESTS,
    RESTORE,
    batches_topic,
    buffer_name,
    learner_name,
    priorities_topic,
    shards_of_learner,
)
from tianji.runtime.core import Connection
from tianji.runtime.errors import ConfigError, SyncFailed
from tianji.runtime.events import Event
from tianji.services.common import apply_run_options, check_lr, make_algorithm, parse_run_config
from tianji.services.devices import resolve_device
from tianji.services.learner_sync import LearnerSync, sync_topics
from tianji.services.numbered import take_numbered
from tianji.services.update_runner import UpdateRunner

__all__ = ["LagStats", "LearnerService"]

log = logging.getLogger(__name__)


class LearnerService(LearnerSync):
    """One learner process (``index`` of ``learner.count``; see the module docstring).

    It consumes only what the controller grants (:class:`GrantConsumption`: a limit on
    its cumulative ``samples_consumed``; unlimited until the first grant), so an
    off-policy learner that runs ahead of the actors waits for data.

    Args:
        restore: wait for a :class:`RestoreCheckpoint` and continue from it (a resumed run).

    Raises:
        ConfigError: for an ``index`` outside ``learner.count``, a name other than
            ``learner-<index>``, an algorithm without ``gradient_sync`` when K > 1, or a
            device this host does not have (naming the learner).
    """

    role = "learner"

    def __init__(
        self,
        name: str,
        *,
        config: dict[str, Any],
        index: int = 0,
        restore: bool = False,
        **kwargs: Any,
    ) -> None:
        run = parse_run_config(config)
        count = run.learner.count
        shards = run.buffer.shards
        self.shards = [buffer_name(s) for s in shards_of_learner(index, count, shards)]
        self._priorities = {
            buffer_name(s): priorities_topic(s, shards)
            for s in shards_of_learner(index, count, shards)
        }
        super().__init__(name, publishes=self._topics(name, index, count), **kwargs)
        self.config = run
        self.index = index
        apply_run_options(self, self.config)
        self._check_data_parallel(name, index, count)
        self.device = resolve_device(name, self.config.learner.device, index=index)
        # Every learner is built from the run's seed: identical initial weights (checked
        # at the first all-reduce step).
        self.algo = make_algorithm(self.config, seed=self.config.seed, device=self.device)
        self._setup_sync(name, index, count)
        self.version = 0
        self._published: ParamsPublished | None = None  # the newest weights published
        spec = self.algo.buffer_spec()
        self.on_policy = spec.kind == "rollout"
        balance = balance_config(self.config, spec)
        self.max_lag = balance.staleness_bound  # older batches are dropped as stale
        self.publish_at_round_end = balance.publish_at_round_end
        self.publish_every = balance.publish_interval
        self.lag = LagStats()
        self.limit: int | None = None
        self._granted = asyncio.Event()
        self._current: SampleBatch | None = None
        self._closing = False
        self._batches: asyncio.Queue[SampleBatch] = asyncio.Queue(self.config.learner.prefetch)
        self.requested = 0  # batches asked for since start (the cumulative credit we sent)
        self.requested_from = dict.fromkeys(self.shards, 0)  # ... per buffer shard
        self.received_from = dict.fromkeys(self.shards, 0)  # batches got from each shard
        self._held = 0  # samples received and not yet consumed or dropped (queued, training)
        self.inbox = Inbox()  # the buffers' numbered streams (tianji.rl.books)
        self._warned_weights_only = False
        self.gauges[LearnerStat.HELD_SAMPLES] = 0.0
        self.gauges[LearnerStat.WAITING_S] = 0.0  # for the controller's consumption grant
        self.gauges[LearnerStat.IDLE_S] = 0.0  # for a batch (none buffered)
        self.gauges[LearnerStat.UPDATE_S] = 0.0  # in updates
        self.subscribe(batches_topic(name), self.on_batch)
        # A resumed run's learners wait for the state to continue from: restarted ones
        # (restore), and in a hand deployment those told so at registration (resuming).
        self._restore_wanted = restore
        self._restored = asyncio.Event()
        self.subscribe(RESTORE, self.on_restore)
        self._checkpointed = (0, 0.0)  # (version, loop time) of the last checkpoint
        self._updating = False  # an update runs in the worker thread: the state is in flux
        self._checkpoint_wanted = False  # requested during an update: take it right after

    def _topics(self, name: str, index: int, count: int) -> list[str]:
        """What this learner publishes: batch requests, priorities to its shards; learner-0
        also the weights and checkpoints; with K > 1 what the gradient sync needs."""
        topics = [REQUESTS, *sorted(set(self._priorities.values()))]
        topics += [LEARNER_PARAMS, CHECKPOINTS] if index == 0 else []
        return topics + sync_topics(name, index, count)

    @staticmethod
    def _check_data_parallel(name: str, index: int, count: int) -> None:
        if not 0 <= index < count:
            raise ConfigError("learner index", index, f"in [0, learner.count={count})")
        if count > 1 and name != learner_name(index):
            raise ConfigError("learner name", name, f"{learner_name(index)!r} (index {index})")

    async def on_batch(self, ev: SampleBatch) -> None:
        n = int(ev.policy_versions.size)
        missing = self.inbox.lost_messages
        lost_key = Dropped.LOST_IN_TRANSIT if self.on_policy else BookStat.DRAWS_LOST
        if not take_numbered(self, self.inbox, ev.buffer, ev, n, what="batch", lost_key=lost_key):
            return
        self.counters["batches_lost"] += self.inbox.lost_messages - missing
        if self.limit is not None and self.counters[LearnerStat.SAMPLES_CONSUMED] >= self.limit:
            self.report_soon()  # held back by its grant (a draining run waits to see this)
        if ev.buffer in self.received_from:
            self.received_from[ev.buffer] += 1
        if self._closing:
            self._count_unused(n)
            return
        self._held += int(ev.policy_versions.size)
        self.gauges[LearnerStat.HELD_SAMPLES] = float(self._held)
        await self._batches.put(ev)  # bounded, and the buffer sends only what we requested

    async def on_control(self, ev: Event) -> None:
        if isinstance(ev, AdoptState):
            await self.on_adopt(ev)
        elif isinstance(ev, TakeCheckpoint):
            if self._updating:
                self._checkpoint_wanted = True
            elif self.index == 0 and self.version != self._checkpointed[0]:
                await self._checkpoint()
        elif isinstance(ev, GrantConsumption):
            self.limit = None if ev.limit < 0 else ev.limit
            self.gauges[LearnerStat.CONSUME_LIMIT] = float(ev.limit)
            self._granted.set()
            self.report_soon()
        else:
            await super().on_control(ev)

    def _count_unused(self, n: int) -> None:
        """``n`` samples the learner received and will never use (it stops): on-policy they
        are dropped (reason ``shutdown``); replay draws are copies of what stays in the
        buffer, so nothing is lost (``draws_unused``)."""
        if n:
            self.counters[Dropped.SHUTDOWN if self.on_policy else BookStat.DRAWS_UNUSED] += n

    def _release_held(self, n: int) -> None:
        """``n`` held samples were just counted as consumed or dropped (same step, so a
        heartbeat never sees them twice or not at all)."""
        self._held -= n
        self.gauges[LearnerStat.HELD_SAMPLES] = float(self._held)

    async def _wait_for_grant(self, n: int) -> None:
        if self.limit is None or self.counters[LearnerStat.SAMPLES_CONSUMED] + n <= self.limit:
            return
        if self.publish_at_round_end and self.index == 0:
            await self._publish_weights()  # the round's updates are done: actors go on
        loop = asyncio.get_running_loop()
        started = loop.time()
        self.report_soon()
        while (
            self.limit is not None and self.counters[LearnerStat.SAMPLES_CONSUMED] + n > self.limit
        ):
            self._granted.clear()
            await self._granted.wait()
        self.gauges[LearnerStat.WAITING_S] += loop.time() - started

    async def _publish_weights(self) -> None:
        if self.gauges.get(LearnerStat.PARAMS_VERSION) == float(self.version):
            return  # published already
        weights = self.algo.get_weights()
        self._published = ParamsPublished(policy_version=self.version, weights=weights)
        await self.publish(self._published, LEARNER_PARAMS)
        self.gauges[LearnerStat.PARAMS_VERSION] = float(self.version)  # the controller grants on it
        self.report_soon()

    async def on_subscribed(self, conn: Connection, topics: Sequence[str]) -> None:
        """A parameter service that subscribes after weights were published (it restarted)
        gets the newest ones at once: they are its whole state. A peer learner that
        subscribes after the rendezvous was offered gets the offer."""
        if LEARNER_PARAMS in topics and self._published is not None:
            await self.send_to_subscriber(conn, self._published, LEARNER_PARAMS)
            self.counters["params_resent"] += 1
        if RENDEZVOUS in topics and self.index == 0 and self._offer is not None:
            await self.send_to_subscriber(conn, self._offer, RENDEZVOUS)

    async def main(self) -> None:
        learner = self.config.learner
        parallel = learner.count > 1
        self.runner = UpdateRunner(
            self.name,
            threads=learner.torch_threads,
            inline=not parallel and self.algo.buffer_spec().kind != "rollout",
            inline_below_ms=learner.inline_below_ms,
        )
        if self._waits_for_restore() and not await self._wait_restored():
            return
        self._checkpointed = (self.version, asyncio.get_running_loop().time())
        if self.index == 0:
            await self.wait_subscribers(LEARNER_PARAMS)  # the params service
            await self._publish_weights()
        self.report_soon()  # the controller balances on our version from the start
        try:
            if parallel:
                await self._start_sync()
            await self.wait_subscribers(REQUESTS, self.config.buffer.shards)  # every buffer
            await self._request(self.config.learner.prefetch)
            while True:
                self._current = await self._next_batch()
                await self._learn(self._current)
                self._current = None
        except (SyncFailed, ConfigError) as exc:
            self.fail(str(exc))
        finally:
            self._closing = True
            self._checkpoint_at_stop()
            self._close_sync()
            self.runner.close()
            # everything still held (queued, current, or waiting for room in the queue) is
            # dropped at stop: counted from the held count, which covers all three
            self._count_unused(self._held)
            self._held = 0
            self.gauges[LearnerStat.HELD_SAMPLES] = 0.0

    async def _next_batch(self) -> SampleBatch:
        """The next batch; while none comes, the cumulative request is repeated every
        ``REPEAT_S`` (harmless if it had arrived; makes good a request lost on a link).
        Time spent waiting for it is the gauge ``idle_s`` (the learner starved of data)."""
        if not self._batches.empty():
            return self._batches.get_nowait()
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            while True:
                try:
                    return await asyncio.wait_for(self._batches.get(), self.REPEAT_S)
                except TimeoutError:
                    self.counters["requests_repeated"] += 1
                    await self._request(0)
        finally:
            self.gauges[LearnerStat.IDLE_S] += loop.time() - started

    REPEAT_S = 2.0

    async def _request(self, more: int) -> None:
        """Ask for ``more`` batches (0: repeat the cumulative credit), spread round-robin
        over this learner's buffer shards; one cumulative count per shard."""
        for _ in range(more):
            shard = self.shards[self.requested % len(self.shards)]
            self.requested_from[shard] += 1
            self.requested += 1
        for shard, count in self.requested_from.items():
            ev = BatchRequested(
                learner=self.name,
                count=count,
                learner_version=self.version,
                buffer=shard if self.config.buffer.shards > 1 else "",
                received=self.received_from[shard],
            )
            await self.publish(ev, REQUESTS)

    async def _learn(self, batch: SampleBatch) -> None:
        n = int(batch.policy_versions.size)
        await self._wait_for_grant(n)
        lags = self.version - batch.policy_versions
        if self.max_lag is not None and lags.size and int(lags.max()) > self.max_lag:
            # Went stale in flight (the buffer checked against an older learner version).
            # With K learners this takes no all-reduce step: the peers wait at the next
            # step until this learner has a fresh batch, so the step numbers never diverge.
            self.counters[Dropped.STALE] += int(lags.size)
            self._release_held(n)
            self._current = None  # counted: a stop from here on must not drop it again
            await self._request(1)
            self.report_soon()
            return
        self.lag.add(lags)
        self._updating = True  # stays set if cancelled: the thread may still be updating
        started = asyncio.get_running_loop().time()
        result = await self.runner.run(self.algo.update, batch.arrays)
        self.gauges[LearnerStat.UPDATE_S] += asyncio.get_running_loop().time() - started
        self.gauges["updates_in_thread"] = 0.0 if self.runner.inline else 1.0
        self._updating = False
        self.version += 1
        self.counters[LearnerStat.LEARNER_UPDATES] = self.version
        self.counters[LearnerStat.SAMPLES_CONSUMED] += n
        self._release_held(n)
        # Counted as consumed: a stop that cancels the awaits below must not also count it
        # as dropped at shutdown (the accounting would then exceed what was produced).
        self._current = None
        for key, count in self.lag.as_counters().items():
            self.counters[key] = count
        self.gauges.update(result.metrics)
        check_lr(self, result.metrics.get("lr"), self.version)
        self.gauges[LearnerStat.POLICY_LAG_MEAN] = float(lags.mean()) if n else 0.0
        self._report_sync()
        self.report_soon()
        await self._request(1)
        if result.priorities is not None and "index" in batch.arrays:
            await self.publish(
                PrioritiesUpdated(
                    policy_version=self.version,
                    indices=batch.arrays["index"],
                    priorities=np.asarray(result.priorities, np.float32),
                ),
                self._priorities.get(batch.buffer, self._priorities[self.shards[0]]),
            )
        publish = self.version % self.publish_every == 0
        if self.index == 0 and publish and not self.publish_at_round_end:
            await self._publish_weights()
        await self._maybe_checkpoint()
        await self._adopt()
