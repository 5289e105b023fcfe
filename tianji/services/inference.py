"""The inference service: one batched forward pass for the observations of many actors.

Actors with ``[actors] inference = "service"`` send :class:`ComputeActions` and wait for
:class:`ActionsComputed` on their own topic. Requests that arrive together are concatenated
into one batch (up to ``max_batch_requests``), so the policy runs once for all of them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from tianji.rl.events import ActionsComputed, ComputeActions, ParamsPublished
from tianji.rl.topics import LATEST_PARAMS, OBSERVATIONS, actions_topic
from tianji.runtime.service import Service
from tianji.services.common import make_algorithm, parse_run_config

__all__ = ["InferenceService"]


class InferenceService(Service):
    """Batched policy forward passes for all actors (see the module docstring)."""

    role = "inference"

    def __init__(
        self, name: str, *, config: dict[str, Any], max_batch_requests: int = 64, **kwargs: Any
    ) -> None:
        cfg = parse_run_config(config)
        actors = [f"actor-{i}" for i in range(cfg.actors.count)]
        super().__init__(name, publishes=[actions_topic(a) for a in actors], **kwargs)
        self.config = cfg
        self.algo = make_algorithm(cfg, seed=cfg.seed, device=cfg.learner.device)
        self.policy_version = -1
        self.max_batch_requests = max_batch_requests
        self._requests: asyncio.Queue[ComputeActions] = asyncio.Queue(2 * len(actors) + 8)
        self._pending: ParamsPublished | None = None
        self._have_params = asyncio.Event()
        self.subscribe(OBSERVATIONS, self.on_observations)
        self.subscribe(LATEST_PARAMS, self.on_params)

    async def on_observations(self, ev: ComputeActions) -> None:
        await self._requests.put(ev)  # bounded: a backlog holds the actors back

    async def on_params(self, ev: ParamsPublished) -> None:
        if ev.policy_version > self.policy_version:
            self._pending = ev
            self._have_params.set()

    async def main(self) -> None:
        import torch

        torch.set_num_threads(self.config.learner.torch_threads)
        await self._have_params.wait()
        while True:
            batch = [await self._requests.get()]
            await asyncio.sleep(0)  # let requests that arrived together join this batch
            while len(batch) < self.max_batch_requests and not self._requests.empty():
                batch.append(self._requests.get_nowait())
            self._apply_params()
            await self._answer(batch)

    def _apply_params(self) -> None:
        if self._pending is not None:
            self.algo.set_weights(self._pending.weights, self._pending.policy_version)
            self.policy_version = self._pending.policy_version
            self._pending = None

    async def _answer(self, batch: list[ComputeActions]) -> None:
        sizes = [len(r.obs) for r in batch]
        out = self.algo.act(np.concatenate([r.obs for r in batch]), explore=True)
        self.counters["requests"] += len(batch)
        self.counters["forward_passes"] += 1
        self.gauges["requests_per_pass"] = (
            self.counters["requests"] / self.counters["forward_passes"]
        )
        start = 0
        for request, size in zip(batch, sizes, strict=True):
            part = {k: np.ascontiguousarray(v[start : start + size]) for k, v in out.items()}
            start += size
            reply = ActionsComputed(
                actor=request.actor,
                request_id=request.request_id,
                policy_version=self.policy_version,
                arrays=part,
            )
            await self.publish(reply, actions_topic(request.actor))
