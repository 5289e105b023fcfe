"""The inference service (SRL's "inference stream"): batched forward passes for many actors.

Actors with ``[actors] inference = "service"`` send :class:`ComputeActions` to their
service (actor ``i`` to service ``i % [inference] count``) and wait for
:class:`ActionsComputed` on their own topic. The service:

* batches requests: after the first one it waits up to ``[inference] max_wait_ms`` for
  ``batch_requests`` of them (default: one per actor it serves), at most
  ``max_batch_envs`` observations, and runs the policy once for all;
* runs the forward pass in a worker thread, so requests keep arriving (they form the next
  batch) and the event loop stays responsive while the network runs; a pass that costs
  less than a thread hand-off (under ``[inference] offload_above_ms`` for 8 observations,
  e.g. a small MLP) runs inline instead;
* keeps per-env state slots (:class:`~tianji.rl.slots.StateSlots`) for algorithms with
  ``recurrent = True`` (``initial_state(n)``, ``act(obs, explore=..., state=...)``
  returning ``next_state``), keyed by actor and env, fresh where an episode starts;
* refuses a malformed request (wrong observation shape or dtype, env ids that do not
  match), counts it and keeps serving everyone else;
* holds an answer whose actor has no link to it yet (a request can arrive over the
  service's link to the actor before the actor's link to the service is up) and delivers
  it once the link is up; after ``ANSWER_WAIT_S`` it is dropped and counted.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from typing import Any

import numpy as np

from tianji.rl.config import RunConfig
from tianji.rl.envs import env_spaces
from tianji.rl.events import ActionsComputed, ComputeActions, ParamsPublished
from tianji.rl.slots import StateSlots
from tianji.rl.stats import InferenceStat
from tianji.rl.topics import LATEST_PARAMS, actions_topic, observations_topic
from tianji.runtime.board import Lease
from tianji.runtime.loop import wait_set
from tianji.runtime.service import Service
from tianji.services.common import make_algorithm, parse_run_config
from tianji.services.devices import resolve_device

__all__ = ["InferenceService"]

log = logging.getLogger(__name__)

ANSWER_WAIT_S = 30.0
"""How long an answer waits for the asking actor's link to this service before it is dropped
(counted in ``answers_undelivered``)."""


def _observation_shape(config: RunConfig) -> tuple[int, ...]:
    """One observation's shape, as the env's observation space gives it."""
    observation_space, _ = env_spaces(config.env)
    return tuple(observation_space.shape or ())


class InferenceService(Service):
    """Batched policy forward passes for the actors assigned to it (see the module docstring).

    Args:
        name: service name.
        config: the run config as JSON data.
        index: which of the ``[inference] count`` services this is.
    """

    role = "inference"

    def __init__(self, name: str, *, config: dict[str, Any], index: int = 0, **kwargs: Any) -> None:
        cfg = parse_run_config(config)
        inference = cfg.inference
        actors = [f"actor-{i}" for i in range(cfg.actors.count) if i % inference.count == index]
        super().__init__(name, publishes=[actions_topic(a) for a in actors], **kwargs)
        self.config = cfg
        self.device = resolve_device(name, inference.device, index=index)
        self.algo = make_algorithm(cfg, seed=cfg.seed + index, device=self.device)
        self.obs_shape = _observation_shape(cfg)
        self.policy_version = -1
        self.batch_requests = inference.batch_requests or max(1, len(actors))
        self.max_batch_envs = inference.max_batch_envs
        self.max_wait = inference.max_wait_ms / 1000.0
        self.slots = StateSlots.for_algorithm(self.algo)
        bound = 2 * len(actors) * cfg.actors.splits + 8  # every group of every actor, twice
        self._requests: asyncio.Queue[ComputeActions] = asyncio.Queue(bound)
        self._held: ComputeActions | None = None  # did not fit the last batch
        self._arrived = asyncio.Event()  # a request was queued
        self._pending: ParamsPublished | None = None
        self._pending_lease: Lease | None = None
        self._have_params = asyncio.Event()
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=name)
        self.offload_above = inference.offload_above_ms / 1000.0
        self._per_obs: float | None = None  # forward seconds per observation (moving mean)
        self._inline = False  # the first passes run in the thread until measured
        self.gauges[InferenceStat.FORWARD_S] = 0.0
        self.subscribe(observations_topic(index, inference.count), self.on_observations)
        self.subscribe(LATEST_PARAMS, self.on_params, latest_only=True)

    async def on_observations(self, ev: ComputeActions) -> None:
        problem = self._malformed(ev)
        if problem is not None:
            self.counters[InferenceStat.REQUESTS_MALFORMED] += 1
            log.warning(
                "%s: refused request %s of %s: %s", self.name, ev.request_id, ev.actor, problem
            )
            return
        await self._requests.put(ev)  # bounded: a backlog holds the actors back
        self._arrived.set()

    def _malformed(self, ev: ComputeActions) -> str | None:
        obs = np.asarray(ev.obs)
        if obs.ndim != len(self.obs_shape) + 1 or tuple(obs.shape[1:]) != self.obs_shape:
            return f"observations of shape {obs.shape}, expected [n, *{self.obs_shape}]"
        if obs.dtype.kind not in "biuf":
            return f"observations of dtype {obs.dtype}, expected numbers"
        n = len(obs)
        if np.shape(ev.env_ids) != (n,) or np.shape(ev.starts) != (n,):
            return f"env_ids {np.shape(ev.env_ids)} / starts {np.shape(ev.starts)} for {n} obs"
        return None

    async def on_params(self, ev: ParamsPublished) -> None:
        if ev.policy_version > self.policy_version:
            self._pending = ev
            self._pending_lease = self.lease_of(ev)
            self._have_params.set()

    async def main(self) -> None:
        import torch

        torch.set_num_threads(self.config.inference.torch_threads)
        loop = asyncio.get_running_loop()
        await self._have_params.wait()
        try:
            while True:
                batch = await self._next_batch()
                while not self._apply_params():  # between passes: never while one runs
                    self._have_params.clear()  # torn: the newer version is on its way
                    await self._have_params.wait()
                started = time.perf_counter()
                if self._inline:
                    out = self._forward(batch)
                else:
                    out = await loop.run_in_executor(self._executor, self._forward, batch)
                took = time.perf_counter() - started
                self.gauges[InferenceStat.FORWARD_S] += took
                envs = sum(len(r.obs) for r in batch)
                self._choose_thread(took, envs)
                await self._answer(batch, out, envs)
        finally:
            self._executor.shutdown(wait=False, cancel_futures=True)

    async def _next_batch(self) -> list[ComputeActions]:
        """The first waiting request, then more until ``batch_requests`` of them,
        ``max_batch_envs`` observations or ``max_wait`` seconds."""
        first = self._held if self._held is not None else await self._requests.get()
        self._held = None
        batch, envs = [first], len(first.obs)
        deadline = time.monotonic() + self.max_wait
        while len(batch) < self.batch_requests:
            if self._requests.empty():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._arrived.clear()
                if not await wait_set(self._arrived, remaining):
                    break  # the batch's time is up
                continue
            request = self._requests.get_nowait()
            if self.max_batch_envs and envs + len(request.obs) > self.max_batch_envs:
                self._held = request
                break
            batch.append(request)
            envs += len(request.obs)
        return batch

    def _choose_thread(self, took: float, envs: int) -> None:
        """Where the next pass runs: inline while a pass over 8 observations costs less than
        ``[inference] offload_above_ms`` (a moving mean per observation), where a thread
        hand-off would cost more than the pass (an MLP on CartPole); in the worker thread
        otherwise (a CNN), so the loop keeps receiving and replying meanwhile."""
        if self.offload_above <= 0:
            return
        per_obs = took / max(1, envs)
        self._per_obs = per_obs if self._per_obs is None else 0.9 * self._per_obs + 0.1 * per_obs
        self._inline = self._per_obs * 8 < self.offload_above
        self.gauges[InferenceStat.INLINE] = float(self._inline)

    def _apply_params(self) -> bool:
        """Load the newest weights received, if any; False if they were overwritten on the
        params board while they were copied (torn: counted, wait for the next ones)."""
        if self._pending is None:
            return True
        pending, lease = self._pending, self._pending_lease
        self._pending = None
        self.algo.set_weights(pending.weights, pending.policy_version)
        if lease is not None and not lease.valid():
            self.counters[InferenceStat.PARAMS_TORN] += 1
            return False
        self.policy_version = pending.policy_version
        return True

    def _forward(self, batch: list[ComputeActions]) -> dict[str, np.ndarray]:
        """One forward pass for the whole batch (runs in the worker thread)."""
        obs = np.concatenate([r.obs for r in batch]) if len(batch) > 1 else batch[0].obs
        if self.slots is None:
            out: dict[str, np.ndarray] = self.algo.act(obs, explore=True)
            return out
        state = np.concatenate([self.slots.gather(r.actor, r.env_ids, r.starts) for r in batch])
        out = dict(self.algo.act(obs, explore=True, state=state))
        next_state = out.pop("next_state")
        start = 0
        for r in batch:
            self.slots.scatter(r.actor, r.env_ids, next_state[start : start + len(r.obs)])
            start += len(r.obs)
        return out

    async def _answer(
        self, batch: list[ComputeActions], out: dict[str, np.ndarray], envs: int
    ) -> None:
        self.counters[InferenceStat.REQUESTS] += len(batch)
        self.counters[InferenceStat.ENVS_ANSWERED] += envs
        self.counters[InferenceStat.FORWARD_PASSES] += 1
        passes = self.counters[InferenceStat.FORWARD_PASSES]
        self.gauges[InferenceStat.REQUESTS_PER_PASS] = (
            self.counters[InferenceStat.REQUESTS] / passes
        )
        self.gauges[InferenceStat.ENVS_PER_PASS] = (
            self.counters[InferenceStat.ENVS_ANSWERED] / passes
        )
        start = 0
        for request in batch:
            size = len(request.obs)
            part = {k: np.ascontiguousarray(v[start : start + size]) for k, v in out.items()}
            start += size
            reply = ActionsComputed(
                actor=request.actor,
                request_id=request.request_id,
                policy_version=self.policy_version,
                arrays=part,
            )
            topic = actions_topic(request.actor)
            if self.subscriber_count(topic):
                await self.publish(reply, topic)
            else:  # its link to us is not up yet (or reconnecting): answer once it is
                self._spawn(self._answer_late(reply, topic))

    async def _answer_late(self, reply: ActionsComputed, topic: str) -> None:
        """Deliver ``reply`` once the asking actor subscribes (the request can arrive over
        our link to the actor before the actor's link to us is up), or count it dropped
        after ``ANSWER_WAIT_S`` seconds."""
        try:
            await asyncio.wait_for(self.wait_subscribers(topic), ANSWER_WAIT_S)
        except TimeoutError:
            self.counters[InferenceStat.ANSWERS_UNDELIVERED] += 1
            log.warning(
                "%s: dropped the answer to request %s of %s: no link from it for %.0f s",
                self.name,
                reply.request_id,
                reply.actor,
                ANSWER_WAIT_S,
            )
            return
        self.counters[InferenceStat.ANSWERS_LATE] += 1
        await self.publish(reply, topic)
