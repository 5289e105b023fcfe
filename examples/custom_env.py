"""A user's own environment, trained without registering it with gymnasium.

    tianji train examples/cartpole_ppo.toml --env examples/custom_env.py:GuessTheSign \\
        --target-return 95 --max-seconds 120

Any ``gymnasium.Env`` subclass works: give ``env.id`` as ``path/to/file.py:Class`` or
``package.module:Class``, and constructor arguments in ``[env] kwargs``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class GuessTheSign(gym.Env[np.ndarray, np.int64]):
    """Each step shows a number; action 1 means "positive", 0 "negative". +1 if right.

    An episode lasts ``length`` steps (truncated), so the best return is ``length``.
    """

    def __init__(self, length: int = 100) -> None:
        self.length = length
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._t = 0
        self._x = np.zeros(1, np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._t = 0
        self._x = self.np_random.uniform(-1, 1, 1).astype(np.float32)
        return self._x.copy(), {}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        reward = 1.0 if bool(action) == bool(self._x[0] > 0) else 0.0
        self._t += 1
        self._x = self.np_random.uniform(-1, 1, 1).astype(np.float32)
        return self._x.copy(), reward, False, self._t >= self.length, {}
