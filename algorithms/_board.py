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
from collections.abc import Callable
from typing import Any

import torch
from tianji.algorithms._lines import Landing, LinePlanes
from torch import nn

from tianji.rl.errors import ConfigError

__all__ = [
    "BoardCNN",
    "BoardDropsCNN",
    "BoardLinesCNN",
    "BoardMirror",
    "board_shape",
    "mirror_for",
]


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
        lines: also feed the convolution the two :class:`LinePlanes` of lines of
            ``kernel`` cells (the board must then have two planes: mover's, other's).
        drops: (with ``lines``) for games whose move drops a piece into a column, where
            it lands on the bottom row or on top of the column's pieces (connect four):
            also give out, per column, the line planes at the cell the piece would land
            in and at the cell above it, ``4 * W`` more features (``Landing``).

    Raises:
        ValueError: naming the space, if it is not a board or the window does not fit.
    """

    def __init__(
        self,
        observation_space: Any,
        channels: int = 128,
        kernel: int | None = None,
        features: int = 256,
        lines: bool = False,
        drops: bool = False,
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
        self.lines: LinePlanes | None = LinePlanes(h, w, kernel) if lines else None
        if self.lines is not None and c != 2:
            raise ValueError(f"line planes need two piece planes (mover, other), got {c}")
        if drops and not lines:
            raise ValueError("drops=True needs lines=True: it reads the line planes")
        self.landing = Landing(h, w) if drops else None
        self.features = features + (4 * w if drops else 0)
        gain = math.sqrt(2)
        self.conv = nn.Conv2d(c + (2 if lines else 0), channels, kernel)
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
        flat = obs[:, : self.size].float()
        board = flat.reshape(-1, h, w, c).permute(0, 3, 1, 2)
        if self.lines is None:
            x = torch.relu(self.conv(board))
            out: torch.Tensor = torch.relu(self.fc(x.flatten(1)))
            return out
        marks, empty = self.lines.flat(flat)
        planes = torch.cat([board, marks.reshape(-1, 2, h, w)], 1)
        out = torch.relu(self.fc(torch.relu(self.conv(planes)).flatten(1)))
        if self.landing is not None:
            out = torch.cat([out, self.landing(marks, empty)], 1)
        return out


class BoardLinesCNN(BoardCNN):
    """:class:`BoardCNN` that also sees the :class:`LinePlanes` (``[algo] torso =
    "board_lines"``): where each side would complete a line of ``kernel`` cells."""

    def __init__(self, observation_space: Any) -> None:
        super().__init__(observation_space, lines=True)


class BoardDropsCNN(BoardCNN):
    """:class:`BoardCNN` with the :class:`LinePlanes` and, per column, where a piece
    dropped there would land (``[algo] torso = "board_drops"``; connect four): see
    ``algorithms/_lines.py``'s ``Landing``. The features go to the heads as they are, so
    a policy can weigh a move by what it completes from its first updates on."""

    def __init__(self, observation_space: Any) -> None:
        super().__init__(observation_space, lines=True, drops=True)


class BoardMirror:
    """Left-right mirroring of a board game's samples (``[algo] mirror = true``): the
    board's columns reversed, the action mask reversed, move ``k`` as move ``n - 1 - k``.

    Right for games whose moves are the board's columns and whose rules do not change in a
    mirror (connect four): a position and its mirror image have the same value, and the
    mirrored move is as good there as the move was here, so every sample the actors
    collected teaches the policy twice. AlphaZero trained on its games' symmetries alike.

    Args:
        observation_space: a board (:func:`board_shape`), masked or not.
        actions: the number of moves; must equal the board's width.

    Raises:
        ValueError: naming the space or the move count if they are not such a game's.
    """

    def __init__(self, observation_space: Any, actions: int) -> None:
        shape = board_shape(observation_space)
        if shape is None:
            raise ValueError(f"{observation_space!r} is not a board: [H, W, C] piece planes")
        if actions != shape[1]:
            raise ValueError(f"{actions} moves, not one per column of a {shape[1]}-wide board")
        self.shape, self.actions = shape, actions
        self.size = shape[0] * shape[1] * shape[2]

    def observations(self, obs: torch.Tensor) -> torch.Tensor:
        """Flat ``[B, H*W*C (+ n)]`` observations mirrored (the mask too, if any)."""
        h, w, c = self.shape
        board = obs[:, : self.size].reshape(-1, h, w, c).flip(2).reshape(len(obs), -1)
        if obs.shape[1] == self.size:
            return board
        return torch.cat([board, obs[:, self.size :].flip(1)], 1)

    def moves(self, action: torch.Tensor) -> torch.Tensor:
        """Moves (counted from 0) mirrored."""
        return self.actions - 1 - action

    def augment(
        self,
        flat: dict[str, torch.Tensor],
        log_probs: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> dict[str, torch.Tensor]:
        """A flat PPO batch (``obs``, ``action``, ``old_logp``, advantages, targets, ...)
        followed by its mirror image: the same advantages and targets, and as the mirrored
        moves' reference log-probabilities the learner's own before the update
        (``log_probs(obs, action)``; the acting policy's were never computed there)."""
        obs, action = self.observations(flat["obs"]), self.moves(flat["action"])
        with torch.no_grad():
            reference = log_probs(obs, action).reshape(-1).to(flat["old_logp"].dtype)
        twin = {**flat, "obs": obs, "action": action, "old_logp": reference}
        return {k: torch.cat([v, twin[k]]) for k, v in flat.items()}


def mirror_for(observation_space: Any, actions: int, unsupported: bool) -> BoardMirror:
    """The :class:`BoardMirror` of ``[algo] mirror = true``.

    Raises:
        ConfigError: naming ``algorithm.mirror`` if the policy is ``unsupported`` (not a
            feed-forward one over discrete moves) or the game is no board with a move per
            column.
    """
    if unsupported:
        why = "false: mirroring needs a feed-forward policy over discrete moves"
        raise ConfigError("algorithm.mirror", True, why)
    try:
        return BoardMirror(observation_space, actions)
    except ValueError as exc:
        raise ConfigError("algorithm.mirror", True, f"false for this game ({exc})") from None
