"""Cooperative multi-agent envs: a PettingZoo parallel env as one gymnasium env.

Every tianji service steps gymnasium envs in vectors, so a PettingZoo parallel env is
wrapped into one :class:`ParallelEnvAdapter` whose spaces stack the agents:

* observation ``[A, D]`` (agent ``i``'s observation in row ``i``, in ``possible_agents``
  order), action ``MultiDiscrete([n] * A)`` (one discrete action per agent);
* reward: the *team* reward, the sum (``team_reward = "sum"``) or mean of the agents'
  rewards; each agent's own reward is in ``info["agent_reward"] [A]``;
* ``info["state"] [S]``: the env's global state (``env.state()``) for the observation
  returned with it, or the agents' observations concatenated when the env has none;
* the episode ends when every agent is done: ``terminated`` if every agent terminated,
  else ``truncated``. An agent done before the others gets zero observations and rewards.

Actors record ``state``, ``next_state`` and ``agent_reward`` in every fragment of such an
env (see ``tianji.services.actor.FragmentCollector``), so a multi-agent fragment is::

    obs [T, N, A, D]   action [T, N, A]   reward [T, N]   agent_reward [T, N, A]
    terminated [T, N]  truncated [T, N]   next_obs [T, N, A, D]
    state [T, N, S]    next_state [T, N, S]      + the algorithm's extras

A multi-agent algorithm declares ``multi_agent = True`` and takes the state space as the
keyword argument ``state_space`` (see ``algorithms/mappo.py`` and ``algorithms/qmix.py``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from tianji.runtime.errors import ConfigError

__all__ = ["TEAM_REWARDS", "ParallelEnvAdapter", "is_multi_agent", "pettingzoo_factory"]

TEAM_REWARDS = ("sum", "mean")


class ParallelEnvAdapter(gym.Env[np.ndarray, np.ndarray]):
    """A cooperative PettingZoo ``ParallelEnv`` seen as one gymnasium env (see module doc).

    Args:
        env: the parallel env; every agent must have the same Box observation shape and
            the same Discrete action space.
        team_reward: ``"sum"`` or ``"mean"`` of the agents' rewards.
        name: how the env is named in errors (the configured id).

    Raises:
        ConfigError: naming the env and the agent whose spaces differ or are unsupported.
    """

    def __init__(self, env: Any, *, team_reward: str = "sum", name: str = "") -> None:
        if team_reward not in TEAM_REWARDS:
            raise ConfigError("env.team_reward", team_reward, '"sum" or "mean"')
        self.env = env
        self.name = name or type(env).__name__
        self.agents: list[str] = list(env.possible_agents)
        if not self.agents:
            raise ConfigError("env.id", self.name, "a parallel env with at least one agent")
        self._mean = team_reward == "mean"
        first = self.agents[0]
        obs_space, act_space = env.observation_space(first), env.action_space(first)
        self._check_agent_spaces(obs_space, act_space)
        n = len(self.agents)
        self.obs_shape: tuple[int, ...] = tuple(obs_space.shape)
        self.observation_space = spaces.Box(
            np.broadcast_to(obs_space.low, (n, *self.obs_shape)).astype(np.float32),
            np.broadcast_to(obs_space.high, (n, *self.obs_shape)).astype(np.float32),
            dtype=np.float32,
        )
        self.action_space = spaces.MultiDiscrete(
            np.full(n, int(act_space.n)), start=np.full(n, int(act_space.start))
        )
        self.state_space = self._state_space()
        self.metadata = dict(getattr(env, "metadata", {}))
        self.render_mode = getattr(env, "render_mode", None)

    @property
    def n_agents(self) -> int:
        """Agents in the env (``A``)."""
        return len(self.agents)

    def _check_agent_spaces(self, obs_space: Any, act_space: Any) -> None:
        for agent in self.agents:
            own_obs, own_act = self.env.observation_space(agent), self.env.action_space(agent)
            if not isinstance(own_obs, spaces.Box):
                why = f"Box observations for every agent; {agent} has {own_obs!r}"
                raise ConfigError("env.id", self.name, why)
            if not isinstance(own_act, spaces.Discrete):
                why = f"Discrete actions for every agent; {agent} has {own_act!r}"
                raise ConfigError("env.id", self.name, why)
            if own_obs.shape != obs_space.shape or own_act != act_space:
                why = (
                    "the same observation shape and action space for every agent; "
                    f"{agent} has {own_obs.shape} / {own_act!r}, "
                    f"{self.agents[0]} has {obs_space.shape} / {act_space!r}"
                )
                raise ConfigError("env.id", self.name, why)

    def _state_space(self) -> spaces.Box:
        space = getattr(self.env, "state_space", None)
        if isinstance(space, spaces.Box):
            self._has_state = True
            return spaces.Box(
                np.asarray(space.low, np.float32).reshape(-1),
                np.asarray(space.high, np.float32).reshape(-1),
                dtype=np.float32,
            )
        self._has_state = False  # no global state: the agents' observations concatenated
        size = self.n_agents * int(np.prod(self.obs_shape))
        return spaces.Box(-np.inf, np.inf, (size,), np.float32)

    def _stack(self, per_agent: dict[str, Any]) -> np.ndarray:
        out = np.zeros((self.n_agents, *self.obs_shape), np.float32)
        for i, agent in enumerate(self.agents):
            if agent in per_agent:
                out[i] = per_agent[agent]
        return out

    def _state(self, obs: np.ndarray) -> np.ndarray:
        if self._has_state:
            return np.asarray(self.env.state(), np.float32).reshape(-1)
        return obs.reshape(-1)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every agent; info holds ``state`` and a zero ``agent_reward``."""
        super().reset(seed=seed)
        obs_dict, _ = self.env.reset(seed=seed, options=options)
        obs = self._stack(obs_dict)
        info = {"state": self._state(obs), "agent_reward": np.zeros(self.n_agents, np.float32)}
        return obs, info

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Step every live agent with its row of ``action [A]``; the team reward out."""
        action = np.asarray(action).reshape(-1)
        if action.shape != (self.n_agents,):
            raise ValueError(f"{self.name}: expected {self.n_agents} actions, got {action.shape}")
        live = list(self.env.agents)
        index = {agent: i for i, agent in enumerate(self.agents)}
        obs_dict, rewards, terms, _, _ = self.env.step(
            {agent: int(action[index[agent]]) for agent in live}
        )
        obs = self._stack(obs_dict)
        agent_reward = np.zeros(self.n_agents, np.float32)
        for agent, r in rewards.items():
            agent_reward[index[agent]] = r
        over = not self.env.agents
        terminated = over and all(bool(terms.get(a, True)) for a in live)
        team = float(agent_reward.mean() if self._mean else agent_reward.sum())
        info = {"state": self._state(obs), "agent_reward": agent_reward}
        return obs, team, terminated, over and not terminated, info

    def render(self) -> Any:
        """The parallel env's render (``render_mode`` comes from ``[env] kwargs``)."""
        return self.env.render()

    def close(self) -> None:
        """Close the parallel env."""
        self.env.close()


def is_multi_agent(env: gym.Env[Any, Any]) -> bool:
    """Whether ``env`` (wrappers allowed) is a :class:`ParallelEnvAdapter`."""
    return isinstance(env.unwrapped, ParallelEnvAdapter)


def pettingzoo_factory(
    env_id: str, kwargs: dict[str, Any], team_reward: str
) -> Callable[[], ParallelEnvAdapter]:
    """A factory of adapted parallel envs for ``env_id``.

    ``env_id`` is a PettingZoo env module with a ``parallel_env(**kwargs)`` function
    (``"mpe2.simple_spread_v3"``) or ``"module:callable"`` returning a parallel env.

    Raises:
        ConfigError: naming ``env_id`` when it cannot be imported or is not callable.
    """
    expected = (
        "a PettingZoo env module with parallel_env(), e.g. mpe2.simple_spread_v3 "
        "(pip install mpe2), or module:callable returning a parallel env"
    )
    module_name, _, attr = env_id.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError("env.id", env_id, f"{expected} ({exc})") from None
    make = getattr(module, attr or "parallel_env", None)
    if not callable(make):
        raise ConfigError("env.id", env_id, expected)
    if team_reward not in TEAM_REWARDS:
        raise ConfigError("env.team_reward", team_reward, '"sum" or "mean"')

    def build() -> ParallelEnvAdapter:
        return ParallelEnvAdapter(make(**kwargs), team_reward=team_reward, name=env_id)

    return build
