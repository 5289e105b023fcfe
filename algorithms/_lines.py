"""Fixed features of "``k`` in a row" boards for the board torsos (``algorithms/_board.py``).

:class:`LinePlanes` marks where either side's next piece would complete a line, and
:class:`Landing`, for games whose move drops a piece into a column (connect four), reads
those marks at the cell a piece would land in and at the cell above it. Neither has
weights to learn nor picks a move: a network given them learns what they are worth from
its games, as it learns everything else.

Both work on flat boards as the in-tree algorithms pass them, channels last (``[B, H * W
* 2]``: per cell the mover's piece, then the other's), with a few small matrix products
each: a policy calls them once per move for a handful of boards, where the cost is the
number of operations, not their size.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["Landing", "LinePlanes", "board_lines"]


def board_lines(height: int, width: int, length: int) -> torch.Tensor:
    """``[lines, H * W]``: one row per line of ``length`` cells on the board (across, down
    and on both diagonals), ones at its cells (row-major, row 0 on top)."""
    lines = []
    for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
        for r in range(height):
            for c in range(width):
                cells = [(r + i * dr, c + i * dc) for i in range(length)]
                if all(0 <= y < height and 0 <= x < width for y, x in cells):
                    line = torch.zeros(height, width)
                    for y, x in cells:
                        line[y, x] = 1.0
                    lines.append(line.flatten())
    return torch.stack(lines)


class LinePlanes(nn.Module):
    """Where a piece would complete a line: ones at the empty cells where the mover's
    (plane 0) or the other's (plane 1) next piece would make ``length`` in a row, across,
    down or on either diagonal; zeros elsewhere.

    Each line of ``length`` cells holding ``length - 1`` of one side's pieces and none of
    the other's marks its one empty cell. It reads the rule of every "``length`` in a row"
    game (connect four, tic-tac-toe, gomoku), not where a piece can be placed.

    Args:
        height, width: the board's.
        length: the line's (from 2 to the board's shorter side).

    Raises:
        ValueError: naming ``length`` if no such line fits.
    """

    lines: torch.Tensor
    """``[lines, H * W]``: one row per line on the board, ones at its cells."""
    code: torch.Tensor
    """``[H * W * 2, lines]``: a flat board's product with it is, per line, the mover's
    pieces in it plus ``length + 1`` times the other's (one number per mix of counts)."""
    open_codes: torch.Tensor
    """``[2, 1]``: the codes of a line open to the mover and to the other."""
    cells: torch.Tensor
    """``[H * W * 2, H * W]``: sums each cell's two planes."""

    def __init__(self, height: int, width: int, length: int = 4) -> None:
        super().__init__()
        if not 2 <= length <= min(height, width):
            board = f"{height} x {width}"
            raise ValueError(f"length={length}: lines of 2 cells or more on a {board} board")
        self.shape, self.length = (height, width), length
        lines = board_lines(height, width, length)
        code = torch.stack([lines.T, (length + 1) * lines.T], 1).reshape(-1, len(lines))
        opens = torch.tensor([[length - 1.0], [(length + 1.0) * (length - 1)]])
        cells = torch.eye(height * width).repeat_interleave(2, 0)
        buffers = {"lines": lines, "code": code, "open_codes": opens, "cells": cells}
        for name, value in buffers.items():
            self.register_buffer(name, value, persistent=False)

    def flat(self, board: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """For flat channels-last boards ``[B, H * W * 2]``: the marks ``[B, 2, H * W]``
        and the empty cells ``[B, H * W]``."""
        code = board @ self.code  # [B, lines]
        open_lines = (code[:, None] == self.open_codes).to(board.dtype)  # [B, 2, lines]
        empty = 1.0 - board @ self.cells
        return ((open_lines @ self.lines) > 0).to(board.dtype) * empty[:, None], empty

    def forward(self, planes: torch.Tensor) -> torch.Tensor:
        """``[B, 2, H, W]`` line planes of ``[B, 2, H, W]`` piece planes."""
        board = planes.permute(0, 2, 3, 1).reshape(len(planes), -1)
        return self.flat(board)[0].reshape(planes.shape)


class Landing(nn.Module):
    """For a drop game's board (row 0 on top; a piece lands on the bottom row or on its
    column's top piece): per column, the :class:`LinePlanes` marks at the cell a piece
    dropped there would land in and at the cell above it, ``[B, 4 * W]``: ``[mover's line
    at landing, other's at landing, mover's above, other's above]`` for each column in
    turn; a full column has zeros. The landing cell's marks say the move completes a line
    (or takes the other's cell); the cell above's, that it lets the other complete one
    there next.

    Args:
        height, width: the board's.
    """

    floor: torch.Tensor
    """``[H * W]``: ones on the bottom row (held up by the floor)."""
    up: torch.Tensor
    """``[H * W, H * W]``: each cell to the cell above it (a piece holds that one up)."""
    columns: torch.Tensor
    """``[H * W, W]``: sums each column's cells."""

    def __init__(self, height: int, width: int) -> None:
        super().__init__()
        n = height * width
        up = torch.zeros(n, n)  # (r, c) -> (r - 1, c)
        for r in range(1, height):
            for c in range(width):
                up[r * width + c, (r - 1) * width + c] = 1.0
        floor = torch.zeros(height, width)
        floor[-1] = 1.0
        columns = torch.eye(width).repeat(height, 1)
        self.register_buffer("floor", floor.flatten(), persistent=False)
        self.register_buffer("up", up, persistent=False)
        self.register_buffer("columns", columns, persistent=False)
        self.width = width

    def forward(self, marks: torch.Tensor, empty: torch.Tensor) -> torch.Tensor:
        """``[B, 4 * W]`` of the marks ``[B, 2, H * W]`` and empty cells ``[B, H * W]``
        (:meth:`LinePlanes.flat`)."""
        land = empty * ((1.0 - empty) @ self.up + self.floor)  # each column's lowest empty
        where = torch.stack([land, land @ self.up], 1)  # [B, 2 (landing, above), H * W]
        at = (where[:, :, None] * marks[:, None]) @ self.columns  # [B, 2, 2 (side), W]
        return at.reshape(len(marks), 4, self.width).transpose(1, 2).flatten(1)
