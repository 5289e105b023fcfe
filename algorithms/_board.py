"""A torso for board games: :class:`BoardCNN` (``[algo] torso = "board"``).

Board games (connect four, tic-tac-toe, gomoku, ...) give small grids of piece planes,
``[H, W, C]`` with one channel per player's pieces, often followed by an action mask
(:class:`~tianji.rl.masks.MaskedObs`). An MLP over the flattened grid must learn every
line of four at every place on its own; a convolution learns a pattern once and finds it
anywhere. :class:`BoardCNN` slides ``kernel x kernel`` windows over the grid (no padding:
each window lies wholly on the board), so with ``kernel`` = 4 every line of four of
connect four, in each of its four directions, lies in some window.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

__all__ = ["BoardCNN", "board_shape"]


def board_shape(observation_space: Any) -> tuple[int, int, int] | None:
    """``(H, W, C)`` of a channels-last board of piece planes (C <= 4, each side >= 3 and
    below 36), from a Box's shape or a masked observation's feature shape; None for any
    other observation."""
    shape = getattr(observation_space, "feature_shape", None) or observation_space.shape
    shape = tuple(shape or ())  # (a Dict or Tuple space has none)
    if len(shape) != 3:
        return None
    h, w, c = (int(x) for x in shape)
    if not (1 <= c <= 4 and 3 <= h < 36 and 3 <= w < 36):
        return None
    return h, w, c


class BoardCNN(nn.Module):
    """Piece planes -> ``features``: one ``kernel x kernel`` convolution over the board
    without padding, then a fully connected layer, ReLU after each.

    Takes the flat float32 observations the in-tree algorithms pass (``[B, H*W*C]``, or
    ``[B, H*W*C + n]`` with an ``n``-entry action mask last, which it ignores).

    Args:
        observation_space: a board (see :func:`board_shape`).
        channels: the convolution's output channels.
        kernel: the window's side (at most the board's shorter side; by default 4, or
            the shorter side of a smaller board, such as tic-tac-toe's 3).
        features: the output size.

    Raises:
        ValueError: naming the space, if it is not a board or the window does not fit.
    """

    def __init__(
        self,
        observation_space: Any,
        channels: int = 128,
        kernel: int | None = None,
        features: int = 256,
    ) -> None:
        super().__init__()
        shape = board_shape(observation_space)
        if shape is None:
            raise ValueError(
                f"{observation_space!r} is not a board: [H, W, C] piece planes, C <= 4"
            )
        h, w, c = shape
        kernel = min(4, h, w) if kernel is None else kernel
        if not 1 <= kernel <= min(h, w):
            raise ValueError(f"kernel={kernel} does not fit a {h} x {w} board")
        self.shape = shape
        self.size = h * w * c
        self.features = features
        gain = math.sqrt(2)
        self.conv = nn.Conv2d(c, channels, kernel)
        nn.init.orthogonal_(self.conv.weight, gain)
        assert self.conv.bias is not None  # Conv2d has one unless bias=False
        nn.init.zeros_(self.conv.bias)
        cells = (h - kernel + 1) * (w - kernel + 1)
        self.fc = nn.Linear(cells * channels, features)
        nn.init.orthogonal_(self.fc.weight, gain)
        nn.init.zeros_(self.fc.bias)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """``[B, features]`` of a batch of boards."""
        h, w, c = self.shape
        board = obs[:, : self.size].float().reshape(-1, h, w, c).permute(0, 3, 1, 2)
        x = torch.relu(self.conv(board))
        out: torch.Tensor = torch.relu(self.fc(x.flatten(1)))
        return out
