"""Action masks: which discrete actions are legal, carried inside the observation.

A turn-based game (connect four, chess, ...) forbids some actions in some states. The
convention of PettingZoo's classic games, and of gymnasium envs that follow it, is a
``Dict`` observation with an ``"observation"`` and an ``"action_mask"`` (1: legal). tianji
moves observations as one array through every service (actors, the inference service,
buffers, the learner), so such an observation is flattened into one float32 vector, the
features first and the mask last, and its space is a :class:`MaskedObs` — a ``Box`` that
knows how many trailing entries are the mask. Algorithms that honour masks (DQN, PPO,
IMPALA: ``Algorithm.action_masks = True``) never pick an illegal action, acting greedily or
exploring, and compute their targets over legal actions only; every other algorithm
refuses such an env before anything starts.

Usage::

    env = ActionMaskObservation(env)   # Dict(observation, action_mask) -> MaskedObs
    legal = legal_actions(obs, env.observation_space)   # bool [N, n]

:func:`tianji.rl.envs.env_factory` wraps an env with such a ``Dict`` space by itself.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from tianji.runtime.errors import ConfigError

__all__ = [
    "MASK_KEYS",
    "ActionMaskObservation",
    "MaskedObs",
    "flatten_masked",
    "has_mask_keys",
    "legal_actions",
    "mask_problem",
    "mask_size",
    "uniform_legal",
]

MASK_KEYS = ("observation", "action_mask")


class MaskedObs(spaces.Box):
    """A flat float32 observation ``[D + n]``: ``D`` features, then the action mask of a
    ``Discrete(n)`` action space (1.0 legal, 0.0 not).

    Args:
        features: the features' space (any Box; flattened).
        n_actions: the mask's length.
    """

    def __init__(self, features: spaces.Box, n_actions: int, seed: int | None = None) -> None:
        if n_actions < 1:
            raise ValueError(f"an action mask of {n_actions} entries")
        self.feature_shape: tuple[int, ...] = tuple(features.shape)
        self.n_actions = int(n_actions)
        low = np.concatenate([features.low.reshape(-1), np.zeros(n_actions)]).astype(np.float32)
        high = np.concatenate([features.high.reshape(-1), np.ones(n_actions)]).astype(np.float32)
        super().__init__(low, high, dtype=np.float32, seed=seed)

    def __repr__(self) -> str:
        return f"MaskedObs(features {self.feature_shape}, {self.n_actions} action mask)"


def mask_size(space: Any) -> int:
    """The number of mask entries at the end of observations of ``space`` (0: none)."""
    return space.n_actions if isinstance(space, MaskedObs) else 0


def mask_problem(algorithm: Any, observation_space: Any) -> str | None:
    """``None`` unless the observations carry an action mask that ``algorithm`` (a class
    with an ``action_masks`` attribute, False when absent) would not honour."""
    if not mask_size(observation_space) or getattr(algorithm, "action_masks", False):
        return None
    return (
        f"observations with an action mask ({observation_space!r}), which "
        f"{getattr(algorithm, 'name', algorithm)!s} does not honour (it would pick illegal "
        "actions; an algorithm that does sets action_masks = True)"
    )


def legal_actions(obs: np.ndarray, space: MaskedObs) -> np.ndarray:
    """``bool [..., n]``: which actions the observations ``obs [..., D + n]`` allow."""
    return np.asarray(obs)[..., -space.n_actions :] > 0.5


def flatten_masked(observation: Any, mask: Any) -> np.ndarray:
    """One masked observation as the flat float32 vector :class:`MaskedObs` describes."""
    return np.concatenate(
        [np.asarray(observation, np.float32).reshape(-1), np.asarray(mask, np.float32).reshape(-1)]
    )


def has_mask_keys(space: Any) -> bool:
    """Whether ``space`` is a ``Dict`` of exactly an observation and an action mask."""
    return isinstance(space, spaces.Dict) and set(space.spaces) == set(MASK_KEYS)


class ActionMaskObservation(gym.ObservationWrapper[np.ndarray, Any, Any]):
    """An env with ``Dict(observation=Box, action_mask=...)`` observations and a
    ``Discrete(n)`` action space, seen with :class:`MaskedObs` observations.

    Raises:
        ConfigError: naming the env's spaces if they are not of that kind.
    """

    def __init__(self, env: gym.Env[Any, Any], name: str = "") -> None:
        super().__init__(env)
        obs_space, act_space = env.observation_space, env.action_space
        label = name or type(env.unwrapped).__name__
        if not has_mask_keys(obs_space) or not isinstance(act_space, spaces.Discrete):
            raise ConfigError(
                "env.id",
                label,
                "an env with Dict(observation, action_mask) observations and a Discrete "
                f"action space to mask, got {obs_space!r} and {act_space!r}",
            )
        assert isinstance(obs_space, spaces.Dict)  # (has_mask_keys)
        features, mask = obs_space["observation"], obs_space["action_mask"]
        n = int(act_space.n)
        if not isinstance(features, spaces.Box) or int(np.prod(mask.shape or ())) != n:
            raise ConfigError(
                "env.id",
                label,
                f"a Box observation and an action mask of {n} entries, got {features!r} "
                f"and {mask!r}",
            )
        self.observation_space = MaskedObs(features, n)

    def observation(self, observation: Any) -> np.ndarray:
        """The flat features, then the mask."""
        return flatten_masked(observation["observation"], observation["action_mask"])


def uniform_legal(legal: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One index per row of ``legal`` (bool ``[n, k]``), uniform over the row's True
    entries (over all ``k`` where a row has none), int64 ``[n]``."""
    legal = np.asarray(legal, bool)
    weights = np.where(legal.any(axis=1, keepdims=True), legal, True).astype(np.float64)
    cumulative = np.cumsum(weights, axis=1)
    draw = rng.random(len(legal))[:, None] * cumulative[:, -1:]
    picked: np.ndarray = (cumulative <= draw).sum(axis=1).astype(np.int64)
    return picked
