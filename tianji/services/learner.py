"""The learner: consumes sample batches, updates the algorithm, publishes weights.

Updates run in a worker thread (``asyncio.to_thread``) so heartbeats and control
commands keep flowing during a long update. It measures the policy lag of every sample
it consumes (learner version at consumption minus the sample's behaviour version).
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from tianji.balance import LagStats
from tianji.events import (
    BatchRequested,
    ConsumptionGranted,
    Event,
    ParamsPublished,
    PrioritiesUpdated,
    SampleBatch,
)
from tianji.service import Service
from tianji.services import BATCHES, LEARNER_PARAMS, PRIORITIES, REQUESTS
from tianji.services.common import apply_run_options, make_algorithm, parse_run_config

__all__ = ["LagStats", "LearnerService"]


class LearnerService(Service):
    """The learner process (one per run in this version).

    It consumes only what the controller grants (:class:`ConsumptionGranted`: a limit on
    its cumulative ``samples_consumed``; unlimited until the first grant), so an
    off-policy learner that runs ahead of the actors waits for data.
    """

    role = "learner"

    def __init__(self, name: str, *, config: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(name, publishes=[LEARNER_PARAMS, REQUESTS, PRIORITIES], **kwargs)
        self.config = parse_run_config(config)
        apply_run_options(self, self.config)
        self.algo = make_algorithm(
            self.config, seed=self.config.seed, device=self.config.learner.device
        )
        self.version = 0
        self.on_policy = self.algo.buffer_spec().kind == "rollout"
        self.bound_lag = self.on_policy and self.config.controller.mode != "unbalanced"
        self.lag = LagStats()
        self.limit: int | None = None
        self._granted = asyncio.Event()
        self._current: SampleBatch | None = None
        self._closing = False
        self._batches: asyncio.Queue[SampleBatch] = asyncio.Queue(self.config.learner.prefetch)
        self.requested = 0  # batches asked for since start (the cumulative credit we sent)
        self._held = 0  # samples received and not yet consumed or dropped (queued, training)
        self.gauges["held_samples"] = 0.0
        self.gauges["waiting_s"] = 0.0
        self.subscribe(BATCHES, self.on_batch)

    async def on_batch(self, ev: SampleBatch) -> None:
        self.counters["samples_received"] += int(ev.policy_versions.size)
        if self._closing:
            self._drop_at_stop([ev])
            return
        self._held += int(ev.policy_versions.size)
        self.gauges["held_samples"] = float(self._held)
        await self._batches.put(ev)  # bounded, and the buffer sends only what we requested

    async def on_control(self, ev: Event) -> None:
        if isinstance(ev, ConsumptionGranted):
            self.limit = None if ev.limit < 0 else ev.limit
            self.gauges["consume_limit"] = float(ev.limit)
            self._granted.set()
        else:
            await super().on_control(ev)

    def _drop_at_stop(self, batches: list[SampleBatch]) -> None:
        """On-policy batches the learner will never use are dropped (reason ``shutdown``);
        replay batches are copies of what stays in the buffer, so nothing is lost."""
        if self.on_policy:
            lost = sum(int(b.policy_versions.size) for b in batches)
            if lost:
                self.counters["dropped/shutdown"] += lost

    def _release_held(self, n: int) -> None:
        """``n`` held samples were just counted as consumed or dropped (same step, so a
        heartbeat never sees them twice or not at all)."""
        self._held -= n
        self.gauges["held_samples"] = float(self._held)

    async def _wait_for_grant(self, n: int) -> None:
        if self.limit is None or self.counters["samples_consumed"] + n <= self.limit:
            return
        loop = asyncio.get_running_loop()
        started = loop.time()
        self.report_soon()
        while self.limit is not None and self.counters["samples_consumed"] + n > self.limit:
            self._granted.clear()
            await self._granted.wait()
        self.gauges["waiting_s"] += loop.time() - started

    async def _publish_weights(self) -> None:
        weights = self.algo.get_weights()
        await self.publish(
            ParamsPublished(policy_version=self.version, weights=weights), LEARNER_PARAMS
        )

    async def main(self) -> None:
        import torch

        torch.set_num_threads(self.config.learner.torch_threads)
        await self.wait_subscribers(LEARNER_PARAMS)  # the params service
        await self._publish_weights()
        self.report_soon()  # the controller balances on our version from the start
        await self.wait_subscribers(REQUESTS)  # the buffer
        await self._request(self.config.learner.prefetch)
        try:
            while True:
                self._current = await self._next_batch()
                await self._learn(self._current)
                self._current = None
        finally:
            self._closing = True
            queued = [self._batches.get_nowait() for _ in range(self._batches.qsize())]
            self._drop_at_stop(queued + ([self._current] if self._current is not None else []))
            self._held = 0
            self.gauges["held_samples"] = 0.0

    async def _next_batch(self) -> SampleBatch:
        """The next batch; while none comes, the cumulative request is repeated every
        ``REPEAT_S`` (harmless if it had arrived; makes good a request lost on a link)."""
        while True:
            try:
                return await asyncio.wait_for(self._batches.get(), self.REPEAT_S)
            except TimeoutError:
                self.counters["requests_repeated"] += 1
                await self._request(0)

    REPEAT_S = 2.0

    async def _request(self, more: int) -> None:
        self.requested += more
        ev = BatchRequested(learner=self.name, count=self.requested, learner_version=self.version)
        await self.publish(ev, REQUESTS)

    async def _learn(self, batch: SampleBatch) -> None:
        n = int(batch.policy_versions.size)
        await self._wait_for_grant(n)
        lags = self.version - batch.policy_versions
        if self.bound_lag and lags.size and int(lags.max()) > self.config.learner.max_policy_lag:
            # Went stale in flight (the buffer checked against an older learner version).
            self.counters["dropped/stale"] += int(lags.size)
            self._release_held(n)
            await self._request(1)
            self.report_soon()
            return
        self.lag.add(lags)
        result = await asyncio.to_thread(self.algo.update, batch.arrays)
        self.version += 1
        self.counters["learner_updates"] = self.version
        self.counters["samples_consumed"] += n
        self._release_held(n)
        for key, count in self.lag.as_counters().items():
            self.counters[key] = count
        self.gauges.update(result.metrics)
        self.gauges["policy_lag_mean"] = float(lags.mean()) if n else 0.0
        self.report_soon()
        await self._request(1)
        if result.priorities is not None and "index" in batch.arrays:
            await self.publish(
                PrioritiesUpdated(
                    policy_version=self.version,
                    indices=batch.arrays["index"],
                    priorities=np.asarray(result.priorities, np.float32),
                ),
                PRIORITIES,
            )
        if self.version % self.config.learner.publish_interval == 0:
            await self._publish_weights()
