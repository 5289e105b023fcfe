"""A custom network body for the in-tree algorithms (DQN, PPO, IMPALA)::

    [algo]
    torso = "examples/custom_torso.py:LayerNormMLP"

tianji builds ``LayerNormMLP(observation_space)`` and puts its own heads on it (DQN: one
linear layer of Q-values; PPO/IMPALA: a policy and a value head sharing it). The torso gets
what the built-in ones get (float32 ``[B, D]`` flattened vectors, or uint8 images as the env
gives them) and says its output size in ``features``. Used by
``tests/test_continuous_control.py``; from the shell::

    tianji train examples/cartpole_ppo.toml \
        --set 'algo.torso="examples/custom_torso.py:LayerNormMLP"'
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


class LayerNormMLP(nn.Module):
    """Two tanh layers of 64 with layer normalization."""

    features = 64

    def __init__(self, observation_space: Any) -> None:
        super().__init__()
        size = math.prod(observation_space.shape)
        self.net = nn.Sequential(
            nn.Linear(size, 64), nn.LayerNorm(64), nn.Tanh(),
            nn.Linear(64, self.features), nn.LayerNorm(self.features), nn.Tanh(),
        )  # fmt: skip

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(obs)
        return out
