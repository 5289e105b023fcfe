"""The board games' torso (``[algo] torso = "board"``, ``algorithms/_board.py``): it takes
piece planes ``[H, W, C]`` (with or without an action mask after them), ignores the mask,
finds a pattern wherever it lies on the board, and is refused, with the key and the space
named, for observations that are not boards. Its "board_lines" variant also sees the line
planes: exactly the empty cells where either side would complete a line."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces
from tianji.algorithms._board import BoardCNN, BoardDropsCNN, BoardLinesCNN, board_shape
from tianji.algorithms._lines import Landing, LinePlanes
from tianji.algorithms._nets import BOARD_TORSO, BOARD_TORSOS, resolve_torso

from tianji import algorithms
from tianji.rl.masks import MaskedObs, legal_actions
from tianji.rl.selfplay import _drop_row, _gives_away, _wins_by
from tianji.runtime.errors import ConfigError

ROWS, COLS = 6, 7
FOUR = MaskedObs(spaces.Box(0, 1, (ROWS, COLS, 2), np.int8), COLS)  # connect four's view


def boards(n: int, seed: int = 0) -> np.ndarray:
    """``n`` random positions as connect four's flat observations (mask last)."""
    rng = np.random.default_rng(seed)
    cells = rng.integers(0, 3, (n, ROWS, COLS))  # 0 empty, 1 mine, 2 theirs
    planes = np.stack([cells == 1, cells == 2], axis=-1).astype(np.float32)
    mask = rng.integers(0, 2, (n, COLS)).astype(np.float32)
    mask[:, 3] = 1.0  # one legal column at least
    return np.concatenate([planes.reshape(n, -1), mask], axis=1)


def test_boards_are_told_from_other_observations() -> None:
    assert board_shape(FOUR) == (ROWS, COLS, 2)
    assert board_shape(spaces.Box(0, 1, (3, 3, 2), np.float32)) == (3, 3, 2)
    assert board_shape(spaces.Box(-1, 1, (4,), np.float32)) is None  # CartPole's vector
    assert board_shape(spaces.Box(0, 255, (84, 84, 3), np.uint8)) is None  # an image
    assert board_shape(spaces.Box(0, 1, (6, 7, 9), np.float32)) is None  # 9 planes
    assert board_shape(spaces.Dict({"board": FOUR})) is None  # no shape at all
    assert resolve_torso("algo.torso", "board", FOUR) == BOARD_TORSO
    with pytest.raises(ConfigError, match=r"algo\.torso.*board.*not \[H, W, C\] piece planes"):
        resolve_torso("algo.torso", "board", spaces.Box(-1, 1, (4,), np.float32))
    tic_tac_toe = BoardCNN(spaces.Box(0, 1, (3, 3, 2), np.float32))  # 3 x 3 windows
    assert tic_tac_toe(torch.zeros(2, 18)).shape == (2, tic_tac_toe.features)
    with pytest.raises(ValueError, match="kernel=5 does not fit a 3 x 3 board"):
        BoardCNN(spaces.Box(0, 1, (3, 3, 2), np.float32), kernel=5)


def test_the_torso_ignores_the_mask_and_finds_a_line_anywhere() -> None:
    torso = BoardCNN(FOUR)
    obs = torch.as_tensor(boards(8))
    other_mask = obs.clone()
    other_mask[:, -COLS:] = 1.0 - other_mask[:, -COLS:]
    with torch.no_grad():
        assert torch.equal(torso(obs), torso(other_mask))
        empty = np.zeros((1, ROWS, COLS, 2), np.float32)
        lines = []
        for col in (0, 3):  # the same vertical line of three, in two places
            board = empty.copy()
            board[0, 3:6, col, 0] = 1.0
            flat = np.concatenate([board.reshape(1, -1), np.ones((1, COLS), np.float32)], 1)
            x = torso.conv(torch.as_tensor(board).permute(0, 3, 1, 2))
            lines.append(x)
            assert torso(torch.as_tensor(flat)).shape == (1, torso.features)
    # a window's response to the line is the same wherever the window sits on it
    assert torch.allclose(lines[0][..., 0], lines[1][..., 3], atol=1e-6)


def completes(pieces: np.ndarray, empty: np.ndarray, length: int) -> np.ndarray:
    """By brute force: the empty cells where one more of ``pieces`` makes a line."""
    h, w = pieces.shape
    out = np.zeros((h, w), bool)
    for r in range(h):
        for c in range(w):
            if empty[r, c]:
                placed = pieces.copy()
                placed[r, c] = True
                out[r, c] = _longest(placed, r, c) >= length
    return out


def _longest(pieces: np.ndarray, row: int, col: int) -> int:
    h, w = pieces.shape
    best = 0
    for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
        count = 1
        for sign in (1, -1):
            r, c = row + sign * dr, col + sign * dc
            while 0 <= r < h and 0 <= c < w and pieces[r, c]:
                count, r, c = count + 1, r + sign * dr, c + sign * dc
        best = max(best, count)
    return best


@pytest.mark.parametrize(("h", "w", "length"), [(6, 7, 4), (3, 3, 3), (9, 9, 5)])
def test_line_planes_mark_exactly_the_cells_that_complete_a_line(
    h: int, w: int, length: int
) -> None:
    rng = np.random.default_rng(length)
    cells = rng.integers(0, 3, (400, h, w))  # 0 empty, 1 mover's, 2 other's
    cells[:40] = np.where(rng.random((40, h, w)) < 0.8, 0, cells[:40])  # sparse boards too
    planes = np.stack([cells == 1, cells == 2], 1).astype(np.float32)
    with torch.no_grad():
        marks = LinePlanes(h, w, length)(torch.as_tensor(planes)).numpy()
    assert set(np.unique(marks)) <= {0.0, 1.0}
    for board, mark in zip(cells, marks, strict=True):
        for side in (0, 1):
            expected = completes(board == side + 1, board == 0, length)
            assert np.array_equal(mark[side] > 0.5, expected), (board, side)
    assert marks.any() and not marks.all()
    if (h, w, length) == (6, 7, 4):  # where a piece lands, the scripted player's rule agrees
        for board, mark in zip(cells, marks, strict=True):
            mine, theirs = board == 1, board == 2
            for col in range(w):
                row = _drop_row(mine, theirs, col)
                if row is not None:
                    assert (mark[0, row, col] > 0.5) == _wins_by(mine, theirs, col)
                    assert (mark[1, row, col] > 0.5) == _wins_by(theirs, mine, col)


@pytest.mark.parametrize("name", ["board_lines", "board_drops"])
def test_the_line_torsos_see_the_planes_and_are_refused_without_two_piece_planes(
    name: str,
) -> None:
    assert resolve_torso("algo.torso", name, FOUR) == BOARD_TORSOS[name]
    torso = BoardLinesCNN(FOUR) if name == "board_lines" else BoardDropsCNN(FOUR)
    assert torso.conv.in_channels == 4 and torso.lines is not None
    assert not any(True for _ in torso.lines.parameters())  # fixed: nothing to learn
    assert torso.features == 256 + (4 * COLS if name == "board_drops" else 0)
    assert torso(torch.as_tensor(boards(5))).shape == (5, torso.features)
    three = spaces.Box(0, 1, (6, 7, 3), np.float32)
    with pytest.raises(ConfigError, match=rf"algo\.torso.*{name}.*need 2 piece planes"):
        resolve_torso("algo.torso", name, three)
    with pytest.raises(ConfigError, match=rf"algo\.torso.*{name}.*not \[H, W, C\]"):
        resolve_torso("algo.torso", name, spaces.Box(-1, 1, (4,), np.float32))
    with pytest.raises(ValueError, match="length=5: lines of 2 cells or more on a 3 x 3"):
        LinePlanes(3, 3, 5)
    with pytest.raises(ValueError, match="drops=True needs lines=True"):
        BoardCNN(FOUR, drops=True)


def stacked(n: int, seed: int) -> np.ndarray:
    """``n`` connect-four positions whose pieces rest on the floor or on each other
    (0 empty, 1 mover's, 2 other's), columns of every height from empty to full."""
    rng = np.random.default_rng(seed)
    cells = np.zeros((n, ROWS, COLS), np.int64)
    for board in cells:
        for col, height in enumerate(rng.integers(0, ROWS + 1, COLS)):
            board[ROWS - height :, col] = rng.integers(1, 3, height)
    return cells


def test_landing_features_say_what_a_move_completes_as_the_scripted_rules_do() -> None:
    cells = stacked(600, seed=3)
    planes = torch.as_tensor(np.stack([cells == 1, cells == 2], 1).astype(np.float32))
    flat = planes.permute(0, 2, 3, 1).reshape(len(cells), -1)  # as the torso gets them
    with torch.no_grad():
        features = Landing(ROWS, COLS)(*LinePlanes(ROWS, COLS).flat(flat)).numpy()
    per_column = features.reshape(len(cells), COLS, 4) > 0.5
    seen = np.zeros(4, int)
    for board, cols in zip(cells, per_column, strict=True):
        mine, theirs = board == 1, board == 2
        for col in range(COLS):
            full = _drop_row(mine, theirs, col) is None
            assert not (full and cols[col].any())  # a full column says nothing
            assert cols[col, 0] == _wins_by(mine, theirs, col)  # the move wins
            assert cols[col, 1] == _wins_by(theirs, mine, col)  # the move blocks
            assert cols[col, 3] == _gives_away(mine, theirs, col)  # lets the other win above
            seen += cols[col]
    assert (seen > 0).all(), seen  # every feature was on somewhere


@pytest.mark.parametrize("torso", ["board", "board_lines", "board_drops"])
@pytest.mark.parametrize("name", ["ppo", "dqn", "impala"])
def test_an_algorithm_with_the_board_torso_plays_legal_moves_only(name: str, torso: str) -> None:
    obs = boards(500, seed=1)
    cls = algorithms.get(name)
    algo = cls(cls.Config(torso=torso), FOUR, spaces.Discrete(COLS), seed=0, device="cpu")
    legal = legal_actions(obs, FOUR)
    rows = np.arange(len(obs))
    for explore in (True, False):
        assert legal[rows, algo.act(obs, explore=explore)["action"]].all(), (name, explore)
    with torch.no_grad():
        greedy = algo.greedy_module()(torch.as_tensor(obs)).numpy()
    assert legal[rows, greedy].all()
