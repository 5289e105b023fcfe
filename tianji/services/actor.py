"""The actor: steps a vector of envs with its local policy copy and publishes fragments."""

from __future__ import annotations

import asyncio
from typing import Any

import gymnasium as gym
import numpy as np

from tianji.envs import make_vector_env
from tianji.events import EpisodesFinished, ParamsPublished, TrajectoryCollected
from tianji.service import Service
from tianji.services import EPISODES, LATEST_PARAMS, TRAJECTORIES
from tianji.services.common import make_algorithm, parse_run_config

__all__ = ["ActorService", "FragmentCollector"]


class FragmentCollector:
    """Steps ``envs`` for ``length`` steps with ``policy`` and returns a ``[T, N]`` fragment.

    Pure logic (no asyncio): it keeps the current observations and per-env episode
    returns between fragments, and reports the episodes that finished.
    """

    def __init__(self, envs: gym.vector.VectorEnv[Any, Any, Any], length: int, seed: int):
        self.envs = envs
        self.length = length
        self.obs, _ = envs.reset(seed=seed)
        self.episode_return = np.zeros(envs.num_envs, np.float64)
        self.episode_length = np.zeros(envs.num_envs, np.int64)
        space = envs.single_action_space
        self._clip = (space.low, space.high) if isinstance(space, gym.spaces.Box) else None

    def collect(self, act: Any) -> tuple[dict[str, np.ndarray], list[float], list[int]]:
        """Run ``length`` steps; ``act(obs) -> dict`` with at least ``"action"``."""
        columns: dict[str, list[np.ndarray]] = {}
        returns: list[float] = []
        lengths: list[int] = []
        for _ in range(self.length):
            out = act(self.obs)
            action = out["action"]
            env_action = np.clip(action, *self._clip) if self._clip is not None else action
            next_obs, reward, terminated, truncated, info = self.envs.step(env_action)
            done = terminated | truncated
            true_next = next_obs
            if done.any():  # same-step autoreset: the real last obs is in final_obs
                true_next = next_obs.copy()
                for i in np.flatnonzero(done):
                    true_next[i] = info["final_obs"][i]
            step = {
                "obs": self.obs,
                "reward": reward.astype(np.float32),
                "terminated": terminated,
                "truncated": truncated,
                "next_obs": true_next,
                **out,
            }
            for key, value in step.items():
                columns.setdefault(key, []).append(np.asarray(value))
            self.episode_return += reward
            self.episode_length += 1
            for i in np.flatnonzero(done):
                returns.append(float(self.episode_return[i]))
                lengths.append(int(self.episode_length[i]))
                self.episode_return[i] = 0.0
                self.episode_length[i] = 0
            self.obs = next_obs
        return {k: np.stack(v) for k, v in columns.items()}, returns, lengths


class ActorService(Service):
    """One actor process: N envs, a local policy copy, fragments out, weights in.

    Args:
        name: service name.
        config: the run config as JSON data.
        index: the actor's index (seeds its envs).
    """

    role = "actor"

    def __init__(self, name: str, *, config: dict[str, Any], index: int, **kwargs: Any) -> None:
        super().__init__(name, publishes=[TRAJECTORIES, EPISODES], **kwargs)
        self.config = parse_run_config(config)
        self.index = index
        self.seed = self.config.seed + 1000 * (index + 1)
        self.algo = make_algorithm(self.config, seed=self.seed, device="cpu")
        self.policy_version = -1
        self.sent_at_version = 0
        self._pending: ParamsPublished | None = None
        self._have_params = asyncio.Event()
        self.subscribe(LATEST_PARAMS, self.on_params)

    async def on_params(self, ev: ParamsPublished) -> None:
        if ev.policy_version > max(self.policy_version, self._pending_version()):
            self._pending = ev
            self._have_params.set()
        else:
            self.counters["params_ignored"] += 1

    def _pending_version(self) -> int:
        return self._pending.policy_version if self._pending is not None else -1

    def _apply_params(self) -> None:
        if self._pending is not None:
            self.algo.set_weights(self._pending.weights, self._pending.policy_version)
            self.policy_version = self._pending.policy_version
            self.gauges["policy_version"] = self.policy_version
            self.sent_at_version = 0
            self._pending = None
            self._have_params.clear()

    async def _pace(self) -> None:
        """Wait for newer weights once this version produced its share of fragments.

        Not before the learner's first update: until then the buffer must fill (e.g. to
        DQN's ``learning_starts``), and waiting would deadlock.
        """
        limit = self.config.actors.max_fragments_per_version
        learning = self.policy_version > 0
        if limit and learning and self.sent_at_version >= limit and self._pending is None:
            started = asyncio.get_running_loop().time()
            await self._have_params.wait()
            waited = asyncio.get_running_loop().time() - started
            self.gauges["waiting_for_params_s"] = self.gauges.get("waiting_for_params_s", 0.0) + waited

    async def main(self) -> None:
        import torch

        torch.set_num_threads(1)
        actors = self.config.actors
        envs = make_vector_env(self.config.env, actors.envs_per_actor)
        collector = FragmentCollector(envs, actors.fragment_length, self.seed)
        await self._have_params.wait()  # act with the learner's weights, never our own init
        await self.wait_subscribers(TRAJECTORIES)
        try:
            while True:
                await self._pace()
                self._apply_params()
                fragment, returns, lengths = collector.collect(
                    lambda obs: self.algo.act(obs, explore=True)
                )
                steps = actors.fragment_length * actors.envs_per_actor
                samples = self.algo.postprocess(fragment)
                self.counters["env_steps"] += steps
                self.counters["samples_produced"] += steps
                self.counters["episodes"] += len(returns)
                await self.publish(
                    TrajectoryCollected(
                        actor=self.name, policy_version=self.policy_version, arrays=samples
                    ),
                    TRAJECTORIES,
                )
                self.sent_at_version += 1
                await self.publish(
                    EpisodesFinished(
                        actor=self.name,
                        policy_version=self.policy_version,
                        returns=np.asarray(returns, np.float64),
                        lengths=np.asarray(lengths, np.int64),
                        env_steps=self.counters["env_steps"],
                    ),
                    EPISODES,
                )
        finally:
            envs.close()
