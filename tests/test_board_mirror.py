"""Left-right mirroring of board-game samples (``[algo] mirror = true``,
``algorithms/_board.py``): a position's mirror image has its columns and mask reversed and
the mirrored move, PPO learns from both, and a game or policy it does not fit is refused,
naming the key."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces
from tianji.algorithms._board import BoardMirror
from tianji.algorithms.ppo import PPO

from tianji.rl.masks import MaskedObs
from tianji.runtime.errors import ConfigError

ROWS, COLS = 6, 7
FOUR = MaskedObs(spaces.Box(0, 1, (ROWS, COLS, 2), np.int8), COLS)  # connect four's view


def position(cells: dict[tuple[int, int], int], legal: list[int]) -> np.ndarray:
    """A flat connect-four view: ``cells`` (row, col) -> 0 mine / 1 theirs, then the mask."""
    planes = np.zeros((ROWS, COLS, 2), np.float32)
    for (row, col), plane in cells.items():
        planes[row, col, plane] = 1.0
    mask = np.zeros(COLS, np.float32)
    mask[legal] = 1.0
    return np.concatenate([planes.reshape(-1), mask])


def test_a_mirrored_position_has_its_columns_mask_and_moves_reversed() -> None:
    mirror = BoardMirror(FOUR, COLS)
    obs = position({(5, 0): 0, (5, 1): 1, (4, 0): 0, (0, 6): 1}, legal=[1, 2, 3, 4, 5])
    want = position({(5, 6): 0, (5, 5): 1, (4, 6): 0, (0, 0): 1}, legal=[1, 2, 3, 4, 5])
    got = mirror.observations(torch.as_tensor(obs[None]))
    assert torch.equal(got[0], torch.as_tensor(want))
    lopsided = position({}, legal=[0, 1])
    assert mirror.observations(torch.as_tensor(lopsided[None]))[0, -COLS:].tolist() == [
        0, 0, 0, 0, 0, 1, 1,
    ]  # fmt: skip
    assert mirror.moves(torch.tensor([0, 3, 6])).tolist() == [6, 3, 0]
    twice = mirror.observations(mirror.observations(torch.as_tensor(obs[None])))
    assert torch.equal(twice[0], torch.as_tensor(obs))
    unmasked = BoardMirror(spaces.Box(0, 1, (ROWS, COLS, 2), np.float32), COLS)
    flipped = unmasked.observations(torch.as_tensor(obs[None, : ROWS * COLS * 2]))
    assert torch.equal(flipped[0], torch.as_tensor(want[: ROWS * COLS * 2]))


def test_the_augmented_batch_is_the_batch_then_its_mirror_with_the_learners_reference() -> None:
    mirror = BoardMirror(FOUR, COLS)
    obs = torch.as_tensor(np.stack([position({(5, 1): 0}, [0, 1, 2]), position({}, [4])]))
    flat = {
        "obs": obs,
        "action": torch.tensor([1, 4]),
        "old_logp": torch.tensor([-1.0, -2.0]),
        "adv": torch.tensor([0.5, -0.25]),
    }
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def log_probs(o: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        seen.append((o, a))
        return -a.double() / 10

    out = mirror.augment(flat, log_probs)
    assert out["action"].tolist() == [1, 4, 5, 2]
    assert out["adv"].tolist() == [0.5, -0.25, 0.5, -0.25]  # same advantages
    assert out["old_logp"].tolist() == pytest.approx([-1.0, -2.0, -0.5, -0.2])
    assert out["old_logp"].dtype == torch.float32
    assert torch.equal(out["obs"][2:], mirror.observations(obs)) and torch.equal(
        seen[0][0], out["obs"][2:]
    )


def winning_batch(n: int) -> dict[str, np.ndarray]:
    """``[1, n]`` one-step games from one position, three of mine stacked in column 0:
    move 0 wins (+1) in half of them, move 3 loses (-1) in the others."""
    obs = position({(5, 0): 0, (4, 0): 0, (3, 0): 0, (5, 1): 1, (4, 1): 1}, list(range(COLS)))
    column = {
        "obs": np.repeat(obs[None], n, 0),
        "action": np.where(np.arange(n) % 2 == 0, 0, 3),
        "reward": np.where(np.arange(n) % 2 == 0, 1.0, -1.0).astype(np.float32),
        "terminated": np.ones(n, bool),
        "truncated": np.zeros(n, bool),
        "next_obs": np.repeat(obs[None], n, 0),
        "logp": np.full(n, -np.log(COLS), np.float32),
        "value": np.zeros(n, np.float32),
    }
    return {k: v[None] for k, v in column.items()}


def mirrored_win_probability(mirror: bool) -> float:
    algo = PPO(
        PPO.Config(torso="board", mirror=mirror, num_minibatches=1, update_epochs=4, lr=3e-3),
        FOUR, spaces.Discrete(COLS), seed=0, device="cpu",
    )  # fmt: skip
    batch = winning_batch(16)
    for _ in range(6):
        algo.update(batch)
    flipped = BoardMirror(FOUR, COLS).observations(torch.as_tensor(batch["obs"][0, :1]))
    with torch.no_grad():
        return float(torch.exp(algo._log_probs(flipped, torch.tensor([COLS - 1])))[0])


def test_ppo_with_mirroring_learns_the_mirrored_move_in_the_mirrored_position() -> None:
    # the win in column 0 was the only thing played; mirrored, the win is in column 6
    with_mirror, without = mirrored_win_probability(True), mirrored_win_probability(False)
    assert with_mirror > 0.5 and with_mirror > 2 * without


def test_mirroring_is_refused_where_it_does_not_fit_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"algorithm\.mirror.*2 moves, not one per column"):
        PPO(PPO.Config(torso="board", mirror=True), FOUR, spaces.Discrete(2), seed=0)
    with pytest.raises(ConfigError, match=r"algorithm\.mirror.*not a board"):
        PPO(PPO.Config(mirror=True), spaces.Box(-1, 1, (4,), np.float32), spaces.Discrete(2))
    with pytest.raises(ConfigError, match=r"algorithm\.mirror.*feed-forward"):
        PPO(PPO.Config(torso="board", mirror=True, core="gru"), FOUR, spaces.Discrete(COLS))
