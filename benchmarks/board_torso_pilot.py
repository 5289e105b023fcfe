"""Board torsos tried in self-play pilots (docs/benchmarks.md, "Six-minute pilots").

A 3x3 padded convolution (32 channels) before the 4x4 unpadded one (64 channels) of
``algorithms/_board.py``'s single-layer ``BoardCNN``, then a 256-unit layer: about as many
multiply-adds per board, fewer weights. Run as it was measured (the module on the path)::

    PYTHONPATH=benchmarks python benchmarks/selfplay.py --seconds 360 \\
        --set 'algo.torso="board_torso_pilot:Board2"' --tag pilot-board2-live

It did no better than the single layer (0.30 against the scripted player at 6 minutes,
against 0.4175), so it stays out of the package. Nor did :class:`BoardDeep32` (three padded
3x3 convolutions of 32 channels, ``--set 'algo.torso="board_torso_pilot:BoardDeep32"'``):
a little more right per update, a little over half the updates in 6 minutes
(docs/results/selfplay-connect-four-tactics-pilots.json).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
from tianji.algorithms._board import board_shape
from torch import nn


class _PilotTorso(nn.Module):
    """What the pilot torsos share: the board's shape, its planes, orthogonal init."""

    def __init__(self, observation_space: Any, features: int) -> None:
        super().__init__()
        shape = board_shape(observation_space)
        if shape is None:
            raise ValueError(f"{observation_space!r} is not a board")
        self.shape, self.size, self.features = shape, math.prod(shape), features

    def planes(self, obs: torch.Tensor) -> torch.Tensor:
        """``[B, C, H, W]`` piece planes of flat (masked) observations."""
        h, w, c = self.shape
        return obs[:, : self.size].float().reshape(-1, h, w, c).permute(0, 3, 1, 2)

    @staticmethod
    def orthogonal(*layers: nn.Conv2d | nn.Linear) -> None:
        for layer in layers:
            nn.init.orthogonal_(layer.weight, math.sqrt(2))
            nn.init.zeros_(layer.bias)


class Board2(_PilotTorso):
    """Piece planes -> ``features``: 3x3 (padded) and 4x4 convolutions, one dense layer."""

    def __init__(
        self, observation_space: Any, first: int = 32, channels: int = 64, features: int = 256
    ) -> None:
        super().__init__(observation_space, features)
        h, w, c = self.shape
        self.conv1 = nn.Conv2d(c, first, 3, padding=1)
        self.conv2 = nn.Conv2d(first, channels, 4)
        self.fc = nn.Linear((h - 3) * (w - 3) * channels, features)
        self.orthogonal(self.conv1, self.conv2, self.fc)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv2(torch.relu(self.conv1(self.planes(obs)))))
        out: torch.Tensor = torch.relu(self.fc(x.flatten(1)))
        return out


class BoardDeep(_PilotTorso):
    """Piece planes -> ``features``: ``layers`` padded 3x3 convolutions of ``channels``
    each (the board keeps its size), one dense layer."""

    def __init__(
        self, observation_space: Any, channels: int = 64, layers: int = 3, features: int = 256
    ) -> None:
        super().__init__(observation_space, features)
        h, w, c = self.shape
        sizes = [c] + [channels] * layers
        self.convs = nn.ModuleList(
            nn.Conv2d(a, b, 3, padding=1) for a, b in itertools.pairwise(sizes)
        )
        self.fc = nn.Linear(h * w * channels, features)
        self.orthogonal(*self.convs, self.fc)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = self.planes(obs)
        for conv in self.convs:
            x = torch.relu(conv(x))
        out: torch.Tensor = torch.relu(self.fc(x.flatten(1)))
        return out


class BoardDeep32(BoardDeep):
    """:class:`BoardDeep` with 32 channels."""

    def __init__(self, observation_space: Any) -> None:
        super().__init__(observation_space, channels=32)
