"""A two-layer board torso tried in a self-play pilot (docs/benchmarks.md, "Six-minute pilots").

A 3x3 padded convolution (32 channels) before the 4x4 unpadded one (64 channels) of
``algorithms/_board.py``'s single-layer ``BoardCNN``, then a 256-unit layer: about as many
multiply-adds per board, fewer weights. Run as it was measured (the module on the path)::

    PYTHONPATH=benchmarks python benchmarks/selfplay.py --seconds 360 \\
        --set 'algo.torso="board_torso_pilot:Board2"' --tag pilot-board2-live

It did no better than the single layer (0.30 against the scripted player at 6 minutes,
against 0.4175), so it stays out of the package.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from tianji.algorithms._board import board_shape


class Board2(nn.Module):
    """Piece planes -> ``features``: 3x3 (padded) and 4x4 convolutions, one dense layer."""

    def __init__(
        self, observation_space: Any, first: int = 32, channels: int = 64, features: int = 256
    ) -> None:
        super().__init__()
        shape = board_shape(observation_space)
        if shape is None:
            raise ValueError(f"{observation_space!r} is not a board")
        h, w, c = shape
        self.shape, self.size, self.features = shape, h * w * c, features
        self.conv1 = nn.Conv2d(c, first, 3, padding=1)
        self.conv2 = nn.Conv2d(first, channels, 4)
        self.fc = nn.Linear((h - 3) * (w - 3) * channels, features)
        for layer in (self.conv1, self.conv2, self.fc):
            nn.init.orthogonal_(layer.weight, math.sqrt(2))
            nn.init.zeros_(layer.bias)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        h, w, c = self.shape
        board = obs[:, : self.size].float().reshape(-1, h, w, c).permute(0, 3, 1, 2)
        x = torch.relu(self.conv2(torch.relu(self.conv1(board))))
        out: torch.Tensor = torch.relu(self.fc(x.flatten(1)))
        return out
