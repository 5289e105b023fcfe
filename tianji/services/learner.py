"""The learner: consumes sample batches, updates the algorithm, publishes weights.

Updates run in a worker thread (``asyncio.to_thread``) so heartbeats and control
commands keep flowing during a long update. It measures the policy lag of every sample
it consumes (learner version at consumption minus the sample's behaviour version).
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import numpy as np

from tianji.events import BatchRequested, ParamsPublished, PrioritiesUpdated, SampleBatch
from tianji.service import Service
from tianji.services import BATCHES, LEARNER_PARAMS, PRIORITIES, REQUESTS
from tianji.services.common import make_algorithm, parse_run_config

__all__ = ["LagStats", "LearnerService"]


class LagStats:
    """Distribution of policy lag (in versions) over consumed samples, with bounded size.

    Lags below ``EXACT`` are counted exactly; larger ones (replay) in power-of-two buckets
    named by their lower bound, so a heartbeat carries at most ~``EXACT`` + 60 counters.
    The sum and the maximum are kept exactly.
    """

    EXACT = 32

    def __init__(self) -> None:
        self.counts: collections.Counter[int] = collections.Counter()
        self.total_lag = 0
        self.max_lag = 0

    @classmethod
    def bucket(cls, lag: int) -> int:
        return lag if lag < cls.EXACT else 1 << (lag.bit_length() - 1)

    def add(self, lags: np.ndarray) -> None:
        lags = lags.astype(np.int64)
        if not lags.size:
            return
        self.total_lag += int(lags.sum())
        self.max_lag = max(self.max_lag, int(lags.max()))
        values, counts = np.unique(lags, return_counts=True)
        for v, c in zip(values.tolist(), counts.tolist(), strict=True):
            self.counts[self.bucket(int(v))] += int(c)

    def as_counters(self) -> dict[str, int]:
        """Histogram as heartbeat counters ``lag/<bucket>``, plus ``lag_sum`` and ``lag_max``."""
        out = {f"lag/{k}": n for k, n in self.counts.items()}
        out["lag_sum"] = self.total_lag
        out["lag_max"] = self.max_lag
        return out

    @staticmethod
    def summarize(counts: dict[int, int], total_lag: int, max_lag: int) -> dict[str, float] | None:
        """mean, p50, p95, max (None when empty); quantiles above ``EXACT`` are bucket
        lower bounds."""
        total = sum(counts.values())
        if total == 0:
            return None
        keys = sorted(counts)

        def quantile(q: float) -> float:
            seen = 0
            for k in keys:
                seen += counts[k]
                if seen >= q * total:
                    return float(k)
            return float(keys[-1])

        return {
            "mean": total_lag / total,
            "p50": quantile(0.5),
            "p95": quantile(0.95),
            "max": float(max_lag),
        }


class LearnerService(Service):
    """The learner process (one per run in this version)."""

    role = "learner"

    def __init__(self, name: str, *, config: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(name, publishes=[LEARNER_PARAMS, REQUESTS, PRIORITIES], **kwargs)
        self.config = parse_run_config(config)
        self.algo = make_algorithm(
            self.config, seed=self.config.seed, device=self.config.learner.device
        )
        self.version = 0
        self.on_policy = self.algo.buffer_spec().kind == "rollout"
        self.lag = LagStats()
        self._batches: asyncio.Queue[SampleBatch] = asyncio.Queue(self.config.learner.prefetch)
        self.subscribe(BATCHES, self.on_batch)

    async def on_batch(self, ev: SampleBatch) -> None:
        await self._batches.put(ev)  # bounded: a full queue holds the buffer back

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
        await self.wait_subscribers(REQUESTS)  # the buffer
        await self._request(self.config.learner.prefetch)
        while True:
            batch = await self._batches.get()
            await self._learn(batch)

    async def _request(self, count: int) -> None:
        ev = BatchRequested(learner=self.name, count=count, learner_version=self.version)
        await self.publish(ev, REQUESTS)

    async def _learn(self, batch: SampleBatch) -> None:
        lags = self.version - batch.policy_versions
        if self.on_policy and lags.size and int(lags.max()) > self.config.learner.max_policy_lag:
            # Went stale in flight (the buffer checked against an older learner version).
            self.counters["dropped/stale"] += int(lags.size)
            await self._request(1)
            return
        self.lag.add(lags)
        result = await asyncio.to_thread(self.algo.update, batch.arrays)
        self.version += 1
        n = int(batch.policy_versions.size)
        self.counters["learner_updates"] = self.version
        self.counters["samples_consumed"] += n
        for key, count in self.lag.as_counters().items():
            self.counters[key] = count
        self.gauges.update(result.metrics)
        self.gauges["policy_lag_mean"] = float(lags.mean()) if n else 0.0
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
