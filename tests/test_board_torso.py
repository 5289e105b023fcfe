"""The board games' torso (``[algo] torso = "board"``, ``algorithms/_board.py``): it takes
piece planes ``[H, W, C]`` (with or without an action mask after them), ignores the mask,
finds a pattern wherever it lies on the board, and is refused, with the key and the space
named, for observations that are not boards."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces
from tianji.algorithms._board import BoardCNN, board_shape
from tianji.algorithms._nets import BOARD_TORSO, resolve_torso

from tianji import algorithms
from tianji.rl.masks import MaskedObs, legal_actions
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


@pytest.mark.parametrize("name", ["ppo", "dqn", "impala"])
def test_an_algorithm_with_the_board_torso_plays_legal_moves_only(name: str) -> None:
    obs = boards(500, seed=1)
    cls = algorithms.get(name)
    algo = cls(cls.Config(torso="board"), FOUR, spaces.Discrete(COLS), seed=0, device="cpu")
    legal = legal_actions(obs, FOUR)
    rows = np.arange(len(obs))
    for explore in (True, False):
        assert legal[rows, algo.act(obs, explore=explore)["action"]].all(), (name, explore)
    with torch.no_grad():
        greedy = algo.greedy_module()(torch.as_tensor(obs)).numpy()
    assert legal[rows, greedy].all()
