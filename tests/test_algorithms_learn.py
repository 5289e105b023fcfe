"""The algorithms learn in a plain in-process loop: vector env, actor copy, buffer, learner.

No services or processes: the loop plays the actor, buffer and learner services in turn,
passing weights through ``get_weights``/``set_weights`` exactly as they would.
"""

from __future__ import annotations

import collections
import time
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from tianji.algorithms.dqn import DQN
from tianji.algorithms.ppo import PPO

from tianji.rl.buffers import PrioritizedReplayBuffer, ReplayBuffer, RolloutBuffer, make_buffer


class Collector:
    """Steps N envs for T steps per fragment, recording the true final obs at episode ends."""

    def __init__(self, env_id: str, n_envs: int, seed: int) -> None:
        self.envs = gym.vector.SyncVectorEnv(
            [lambda: gym.make(env_id) for _ in range(n_envs)],
            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        )
        self.obs, _ = self.envs.reset(seed=seed)
        self.envs.action_space.seed(seed)
        self.episode_return = np.zeros(n_envs)
        self.returns: collections.deque[float] = collections.deque(maxlen=20)
        self.first: list[float] = []
        self.steps = 0
        self.episodes = 0

    def fragment(self, algo: Any, horizon: int) -> dict[str, np.ndarray]:
        """One ``[T, N, ...]`` fragment with every key ``act`` returned."""
        rows: dict[str, list[np.ndarray]] = collections.defaultdict(list)
        for _ in range(horizon):
            out = algo.act(self.obs, explore=True)
            obs, reward, terminated, truncated, info = self.envs.step(out["action"])
            next_obs = obs.copy()
            done = terminated | truncated
            for i in np.flatnonzero(done):
                next_obs[i] = info["final_obs"][i]
            step = dict(out, obs=self.obs, reward=reward, terminated=terminated)
            step.update(truncated=truncated, next_obs=next_obs)
            for k, v in step.items():
                rows[k].append(np.asarray(v))
            self._track(reward, done)
            self.obs = obs
        return {k: np.stack(v) for k, v in rows.items()}

    def _track(self, reward: np.ndarray, done: np.ndarray) -> None:
        self.episode_return += reward
        self.steps += len(reward)
        for i in np.flatnonzero(done):
            self.returns.append(float(self.episode_return[i]))
            if len(self.first) < 20:
                self.first.append(float(self.episode_return[i]))
            self.episode_return[i] = 0.0
            self.episodes += 1

    def mean_return(self) -> float:
        """Mean return of the last 20 episodes (0 before 20 episodes finished)."""
        return float(np.mean(self.returns)) if len(self.returns) == 20 else 0.0


def train_ppo(
    env_id: str,
    config: Any,
    *,
    seed: int,
    n_envs: int,
    horizon: int,
    max_steps: int,
    target: float | None,
) -> tuple[Collector, int, float]:
    """Run PPO until ``target`` mean return (or ``max_steps``); returns collector, updates, secs."""
    probe = gym.make(env_id)
    learner = PPO(config, probe.observation_space, probe.action_space, seed=seed, device="cpu")
    actor = PPO(config, probe.observation_space, probe.action_space, seed=seed + 1, device="cpu")
    actor.set_weights(learner.get_weights(), learner.version)
    buffer = make_buffer(learner.buffer_spec(), seed=seed)
    assert isinstance(buffer, RolloutBuffer)
    col = Collector(env_id, n_envs, seed)
    start = time.perf_counter()
    while col.steps < max_steps and (target is None or col.mean_return() < target):
        buffer.add(actor.postprocess(col.fragment(actor, horizon)), policy_version=actor.version)
        batch = buffer.sample(learner.buffer_spec().batch_size)
        if batch is not None:
            learner.update(batch)
            actor.set_weights(learner.get_weights(), learner.version)
    return col, learner.version, time.perf_counter() - start


@pytest.mark.slow
def test_ppo_learns_cartpole() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    # the example's settings (examples/cartpole_ppo.toml): the defaults learn too, slower
    config = PPO.Config(
        fragments_per_batch=2,
        lr=4e-3,
        lr_anneal_updates=200,
        lr_floor=0.1,
        gamma=0.98,
        gae_lambda=0.8,
        update_epochs=5,
        num_minibatches=2,
        ent_coef=0.0,
        clip_value_loss=False,
    )
    col, updates, secs = train_ppo(
        "CartPole-v1",
        config,
        seed=0,
        n_envs=4,
        horizon=128,
        max_steps=400_000,
        target=475.0,
    )
    print(
        f"PPO CartPole: {col.steps} env steps, {updates} updates, {secs:.1f}s, "
        f"mean return {col.mean_return():.1f}"
    )
    assert col.mean_return() >= 475.0


def train_dqn(
    config: Any,
    *,
    seed: int,
    n_envs: int,
    horizon: int,
    updates_per_fragment: int,
    max_steps: int,
    target: float,
) -> tuple[Collector, int, float]:
    """Run DQN on CartPole until ``target`` mean return (or ``max_steps``)."""
    probe = gym.make("CartPole-v1")
    learner = DQN(config, probe.observation_space, probe.action_space, seed=seed, device="cpu")
    actor = DQN(config, probe.observation_space, probe.action_space, seed=seed + 1, device="cpu")
    actor.set_weights(learner.get_weights(), learner.version)
    spec = learner.buffer_spec()
    buffer = make_buffer(spec, seed=seed)
    assert isinstance(buffer, ReplayBuffer)
    col = Collector("CartPole-v1", n_envs, seed)
    start = time.perf_counter()
    while col.steps < max_steps and col.mean_return() < target:
        buffer.add(actor.postprocess(col.fragment(actor, horizon)), policy_version=actor.version)
        for _ in range(updates_per_fragment):
            batch = buffer.sample(spec.batch_size)
            if batch is None:
                break
            result = learner.update(batch)
            if isinstance(buffer, PrioritizedReplayBuffer):
                assert result.priorities is not None
                buffer.update_priorities(batch["index"], result.priorities)
        actor.set_weights(learner.get_weights(), learner.version)
    return col, learner.version, time.perf_counter() - start


@pytest.mark.slow
@pytest.mark.parametrize("prioritized", [False, True], ids=["uniform", "prioritized"])
def test_dqn_learns_cartpole(prioritized: bool) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    col, updates, secs = train_dqn(
        DQN.Config(prioritized=prioritized),
        seed=0,
        n_envs=4,
        horizon=8,
        updates_per_fragment=4,
        max_steps=200_000,
        target=200.0,
    )
    print(
        f"DQN CartPole (prioritized={prioritized}): {col.steps} env steps, {updates} updates, "
        f"{secs:.1f}s, mean return {col.mean_return():.1f}"
    )
    assert col.mean_return() >= 200.0


@pytest.mark.slow
def test_ppo_improves_on_pendulum() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = PPO.Config(
        lr=1e-3,
        gamma=0.9,
        reward_scale=0.1,
        clip_value_loss=False,
        ent_coef=0.0,
        update_epochs=10,
    )
    col, updates, secs = train_ppo(
        "Pendulum-v1", config, seed=0, n_envs=4, horizon=256, max_steps=60_000, target=None
    )
    first = float(np.mean(col.first))
    print(
        f"PPO Pendulum: first 20 episodes {first:.0f}, last 20 {col.mean_return():.0f} after "
        f"{col.steps} env steps ({updates} updates, {secs:.1f}s)"
    )
    assert col.mean_return() > first + 400
