"""Fragment collection: an actor's envs, stepped in groups (an env ring) into ``[T, N]`` arrays.

Pure logic around ``await act(obs, rows, starts)``: no transport, no service. With one group the
actor steps all its envs, asks for their actions, steps again. With K groups (``[actors]
splits = K``, Sample Factory's double-buffered sampling, SRL's env ring) each group runs
its own loop: while one group waits for the inference service's answer, another steps its
envs, so neither the actor nor the inference service sits idle waiting for the other.
Every group writes its columns in place into the fragment's preallocated ``[T, N, ...]``
arrays (no stacking copy; pixel observations stay uint8).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from tianji.rl.envs import records_episodes
from tianji.rl.multiagent import is_multi_agent

__all__ = ["Act", "EnvGroup", "FragmentCollector"]

Act = Callable[[np.ndarray, range, np.ndarray], Awaitable[dict[str, np.ndarray]]]
"""``await act(obs, rows, starts) -> {"action": ..., ...}``: actions for the envs ``rows``
(the actor's env indices of one group) whose episodes begin where ``starts`` (bool) is set;
an inference service keeps per-env state (recurrent policies) by them."""


class _Fragment:
    """The ``[T, N, ...]`` arrays of one fragment, allocated at the first write of a key."""

    def __init__(self, length: int, num_envs: int) -> None:
        self.length, self.num_envs = length, num_envs
        self.columns: dict[str, np.ndarray] = {}

    def write(self, t: int, rows: range, step: dict[str, Any]) -> None:
        for key, value in step.items():
            arr = np.asarray(value)
            column = self.columns.get(key)
            if column is None:
                shape = (self.length, self.num_envs, *arr.shape[1:])
                column = self.columns[key] = np.empty(shape, arr.dtype)
            column[t, rows.start : rows.stop] = arr


class EnvGroup:
    """One group of envs (a vector env) and its running state between fragments.

    With multi-agent envs (``tianji.rl.multiagent``) every step also records ``state``,
    ``next_state`` (the true one at episode ends) and ``agent_reward`` from the env's info.
    Episode returns are the sums of the rewards, or, when the env records episodes
    (gymnasium's ``RecordEpisodeStatistics``, as the Atari preset does), the true episodes
    it reports: whole games with unclipped scores, a lost life no episode end.
    """

    def __init__(self, envs: gym.vector.SyncVectorEnv, rows: range, seed: int) -> None:
        if len(rows) != envs.num_envs:
            raise ValueError(f"rows {rows} do not match the group's {envs.num_envs} envs")
        self.envs, self.rows = envs, rows
        self.obs, info = envs.reset(seed=seed)
        self.multi_agent = is_multi_agent(envs.envs[0])
        self.records = records_episodes(envs.envs[0])
        self.state: np.ndarray | None = info["state"] if self.multi_agent else None
        self.games: list[tuple[str, int, float]] = []
        """Two-player games that ended (``tianji.rl.selfplay``): (opponent, seat, outcome)."""
        self.episode_return = np.zeros(envs.num_envs, np.float64)
        self.episode_length = np.zeros(envs.num_envs, np.int64)
        self.starts = np.ones(envs.num_envs, bool)  # each env's first obs of an episode
        space = envs.single_action_space
        self._clip = (space.low, space.high) if isinstance(space, gym.spaces.Box) else None

    async def run(
        self, act: Act, fragment: _Fragment, returns: list[float], lengths: list[int]
    ) -> None:
        """Step ``fragment.length`` times, writing this group's rows of ``fragment``."""
        for t in range(fragment.length):
            out = await act(self.obs, self.rows, self.starts)
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
            if self.multi_agent:
                step.update(self._agent_columns(info, done))
            fragment.write(t, self.rows, step)
            self._count(reward, done, info, returns, lengths)
            self.obs, self.starts = next_obs, done

    def _count(
        self,
        reward: np.ndarray,
        done: np.ndarray,
        info: dict[str, Any],
        returns: list[float],
        lengths: list[int],
    ) -> None:
        self.episode_return += reward
        self.episode_length += 1
        if done.any() and "_outcome" in info.get("final_info", {}):
            self._games(info["final_info"], done)
        for i in np.flatnonzero(done):
            if self.records:
                final = info["final_info"]
                if "_episode" in final and final["_episode"][i]:
                    returns.append(float(final["episode"]["r"][i]))
                    lengths.append(int(final["episode"]["l"][i]))
            else:
                returns.append(float(self.episode_return[i]))
                lengths.append(int(self.episode_length[i]))
            self.episode_return[i] = 0.0
            self.episode_length[i] = 0

    def _games(self, final: dict[str, Any], done: np.ndarray) -> None:
        for i in np.flatnonzero(done & final["_outcome"]):
            self.games.append(
                (str(final["opponent"][i]), int(final["seat"][i]), float(final["outcome"][i]))
            )

    def _agent_columns(self, info: dict[str, Any], done: np.ndarray) -> dict[str, np.ndarray]:
        """``state``, ``next_state`` and ``agent_reward`` of one multi-agent step. For an
        env that reset in this step the top-level info is the new episode's; its last
        step's info is in ``final_info``."""
        next_state = np.asarray(info["state"], np.float32)
        agent_reward = np.asarray(info["agent_reward"], np.float32)
        true_next = next_state
        if done.any():
            final = info["final_info"]
            true_next, agent_reward = next_state.copy(), agent_reward.copy()
            for i in np.flatnonzero(done):
                true_next[i] = final["state"][i]
                agent_reward[i] = final["agent_reward"][i]
        state, self.state = self.state, next_state
        assert state is not None  # set at reset for multi-agent envs
        return {"state": state, "next_state": true_next, "agent_reward": agent_reward}


class FragmentCollector:
    """Steps env groups for ``length`` steps and returns a ``[T, N]`` fragment.

    Args:
        envs: one vector env, or the groups of an env ring (stepped concurrently; their
            envs are the fragment's env axis in order).
        length: steps per env in a fragment.
        seed: group k's envs reset with ``seed + k * 10_000``.
    """

    def __init__(
        self,
        envs: gym.vector.SyncVectorEnv | Sequence[gym.vector.SyncVectorEnv],
        length: int,
        seed: int,
    ) -> None:
        groups = [envs] if isinstance(envs, gym.vector.VectorEnv) else list(envs)
        self.length = length
        self.groups: list[EnvGroup] = []
        start = 0
        for k, group in enumerate(groups):
            rows = range(start, start + group.num_envs)
            self.groups.append(EnvGroup(group, rows, seed + k * 10_000))
            start = rows.stop
        self.num_envs = start

    async def collect(self, act: Act) -> tuple[dict[str, np.ndarray], list[float], list[int]]:
        """Run ``length`` steps in every group; ``act`` is awaited once per group and step.

        Returns:
            ``(fragment, episode returns, episode lengths)`` of the episodes that ended.
        """
        fragment = _Fragment(self.length, self.num_envs)
        returns: list[float] = []
        lengths: list[int] = []
        if len(self.groups) == 1:
            await self.groups[0].run(act, fragment, returns, lengths)
        else:
            async with asyncio.TaskGroup() as tg:
                for group in self.groups:
                    tg.create_task(group.run(act, fragment, returns, lengths))
        return fragment.columns, returns, lengths

    def take_games(self) -> list[tuple[str, int, float]]:
        """The two-player games that ended since the last call: (opponent, seat, outcome)."""
        games = [g for group in self.groups for g in group.games]
        for group in self.groups:
            group.games.clear()
        return games

    def close(self) -> None:
        """Close every group's envs."""
        for group in self.groups:
            group.envs.close()
