"""Two-player games from the learner's seat: legal moves only, seats alternating, the outcome
at the end, random openings of up to the number asked for; the scripted connect-four player
wins, blocks and does not give games away."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from tianji.rl.league import SelfPlayConfig
from tianji.rl.masks import MaskedObs, legal_actions
from tianji.rl.selfplay import (
    ConnectFourScripted,
    IllegalMove,
    PolicyOpponent,
    RandomOpponent,
    TwoPlayerGame,
    play_games,
    two_player_factory,
)
from tianji.runtime.errors import ConfigError
from tianji.services.opponents import OpponentPool

pytest.importorskip("pettingzoo.classic")
C4 = "pettingzoo.classic.connect_four_v3"


def connect_four() -> TwoPlayerGame:
    return two_player_factory(C4, {}, "alternate")()


def test_a_game_is_played_from_alternating_seats_with_the_outcome_at_its_end() -> None:
    game = connect_four()
    game.set_opponent(RandomOpponent(seed=1))
    assert isinstance(game.observation_space, MaskedObs) and game.action_space.n == 7
    rng = np.random.default_rng(0)
    seats, outcomes = [], []
    for k in range(6):
        obs, info = game.reset(seed=k)
        seats.append(info["seat"])
        pieces = obs[:84].sum()
        assert pieces == (0 if info["seat"] == 0 else 1)  # the opponent moved first
        done, rewards = False, []
        while not done:
            legal = np.flatnonzero(legal_actions(obs, game.observation_space))
            obs, reward, terminated, truncated, info = game.step(int(rng.choice(legal)))
            rewards.append(reward)
            done = terminated or truncated
        assert all(r == 0 for r in rewards[:-1]) and rewards[-1] == info["outcome"]
        assert info["opponent"] == "random" and info["seat"] == seats[-1]
        outcomes.append(info["outcome"])
    assert seats == [0, 1, 0, 1, 0, 1]
    assert set(outcomes) <= {-1.0, 0.0, 1.0}


def test_a_random_opening_starts_games_from_varied_positions_of_legal_moves() -> None:
    game = connect_four()
    game.set_opponent(RandomOpponent(seed=1))
    game.opening = 4
    pieces, seen = [], set()
    for k in range(300):
        obs, info = game.reset(seed=k if k == 0 else None)  # one seed: the game's own draws
        board = obs[:84].reshape(6, 7, 2)
        mine, theirs = int(board[..., 0].sum()), int(board[..., 1].sum())
        # the learner is to move: as many pieces each when it sits first, one fewer second
        assert theirs - mine == info["seat"]
        assert mine + theirs <= 4 + 1  # the opening, then the opponent's move if due
        # every piece rests on the floor or on another: the random moves were legal
        filled = board.sum(-1) > 0
        assert not (filled[:-1] & ~filled[1:]).any()
        pieces.append(mine + theirs)
        seen.add(obs[:84].tobytes())
        obs, *_ = game.step(int(np.flatnonzero(obs[-7:] > 0.5)[0]))
    assert set(pieces) == {0, 1, 2, 3, 4, 5}  # 0 to 4 random moves, the opponent's if due
    assert len(seen) > 100  # varied positions
    with pytest.raises(ConfigError, match=r"selfplay\.random_opening.*-1.*moves >= 0"):
        SelfPlayConfig(random_opening=-1)
    with pytest.raises(ConfigError, match=r"selfplay\.random_opening.*True"):
        SelfPlayConfig(random_opening=True)
    game.opening = 0
    obs, info = game.reset(seed=5)
    assert obs[:84].sum() == (0 if info["seat"] == 0 else 1)  # none: the empty board
    # an actor's opponent pool hands its games the run's opening with the opponents
    pool = OpponentPool(lambda: None, pool_size=2, explore=True, seed=0)
    cartpole = gym.make("CartPole-v1")  # not a two-player game: left alone
    assert pool.attach([game, cartpole], opening=3) == 1 and game.opening == 3


def test_an_illegal_move_is_refused_naming_the_legal_ones() -> None:
    game = connect_four()
    game.set_opponent(PolicyOpponent("stubborn", lambda obs: np.array([0])))
    game.reset(seed=0)  # seat 0: the learner moves first
    for _ in range(3):  # column 0 fills (the opponent stacks on it too)
        game.step(0)
    with pytest.raises(IllegalMove) as err:
        game.step(0)
    assert err.value.action == 0 and err.value.legal == [1, 2, 3, 4, 5, 6]
    game.reset(seed=1)  # seat 1: the stubborn opponent moves first ...
    for _ in range(2):
        game.step(0)
    with pytest.raises(IllegalMove, match="opponent 'stubborn'"):  # ... until it may not
        game.step(0)


def test_pettingzoos_checking_wrappers_come_off_and_the_game_plays_the_same() -> None:
    """PettingZoo's OrderEnforcing, AssertOutOfBounds and TerminateIllegal wrappers only
    check moves, which the game checks itself against the mask: they come off (a self-play
    actor steps faster), a wrapper of the user's stays, and every step is what it was."""
    from pettingzoo.classic import connect_four_v3
    from pettingzoo.utils import BaseWrapper

    bare, checked = connect_four(), connect_four()
    assert type(bare.game).__name__ == "raw_env"
    checked.game = connect_four_v3.env()  # the three wrappers on, as PettingZoo makes it
    assert type(checked.game).__name__ == "OrderEnforcingWrapper"
    for game in (bare, checked):
        game.set_opponent(RandomOpponent(seed=3))
    rng = np.random.default_rng(0)
    for k in range(4):
        a, b = bare.reset(seed=k), checked.reset(seed=k)
        np.testing.assert_array_equal(a[0], b[0])
        done, obs = False, a[0]
        while not done:
            move = int(rng.choice(np.flatnonzero(legal_actions(obs, bare.observation_space))))
            one, two = bare.step(move), checked.step(move)
            np.testing.assert_array_equal(one[0], two[0])
            assert one[1:] == two[1:]
            obs, done = one[0], one[2] or one[3]
    bare.reset(seed=0)
    with pytest.raises(IllegalMove):  # out of range: the mask refuses it, no wrapper needed
        bare.step(9)

    class Shown(BaseWrapper):  # type: ignore[type-arg]
        """A wrapper of the user's (it may change what the game shows): kept."""

    kept = TwoPlayerGame(Shown(connect_four_v3.env()))
    assert isinstance(kept.game, Shown)
    assert type(kept.game.env).__name__ == "OrderEnforcingWrapper"  # under it: untouched


def _view(mine: list[tuple[int, int]], theirs: list[tuple[int, int]]) -> np.ndarray:
    board = np.zeros((6, 7, 2), np.float32)
    for r, c in mine:
        board[r, c, 0] = 1
    for r, c in theirs:
        board[r, c, 1] = 1
    mask = (board[0].sum(-1) == 0).astype(np.float32)
    return np.concatenate([board.reshape(-1), mask])


def test_the_scripted_player_wins_when_it_can_and_blocks_when_it_must() -> None:
    player = ConnectFourScripted(seed=0)
    win = _view([(5, 0), (5, 1), (5, 2)], [(4, 0), (4, 1), (4, 2)])
    assert all(player.act(win) == 3 for _ in range(20))  # its own row first
    block = _view([(5, 6), (4, 6)], [(5, 2), (5, 3), (5, 4)])
    assert {player.act(block) for _ in range(20)} <= {1, 5}  # either end of their three
    vertical = _view([(5, 0), (5, 1)], [(5, 5), (4, 5), (3, 5)])
    assert all(player.act(vertical) == 5 for _ in range(20))


def test_the_scripted_player_does_not_play_under_the_opponents_win() -> None:
    # They threaten row 4 at column 3 (row 4, cols 0-2 theirs); column 3 is empty to row
    # 5: a piece there (no win, no block) would let them win on top of it.
    trap = _view([(5, 0), (5, 2), (5, 6)], [(4, 0), (4, 1), (4, 2), (5, 1)])
    picks = {ConnectFourScripted(seed=s).act(trap) for s in range(40)}
    assert 3 not in picks and picks


def test_the_scripted_player_beats_random_and_random_is_even_with_itself() -> None:
    scripted = ConnectFourScripted(seed=3)
    result = play_games(
        connect_four, lambda obs: np.array([scripted.act(obs[0])]), RandomOpponent(seed=4), games=60
    )
    assert result["win"] >= 0.9, result
    random_player = RandomOpponent(seed=5)
    random_player.n = 7
    even = play_games(
        connect_four,
        lambda obs: np.array([random_player.act(obs[0])]),
        RandomOpponent(seed=6),
        games=200,
    )
    assert 0.3 < even["win"] < 0.7, even  # first and second seats alike: about even


def test_a_game_that_is_not_a_two_player_masked_game_is_refused() -> None:
    with pytest.raises(ConfigError, match="two-player"):
        two_player_factory("mpe2.simple_spread_v3", {}, "alternate")
    with pytest.raises(ConfigError, match="Dict"):
        two_player_factory("pettingzoo.classic.rps_v2", {}, "alternate")
    with pytest.raises(ConfigError, match="connect_five"):
        two_player_factory("pettingzoo.classic.connect_five_v0", {}, "alternate")
    with pytest.raises(ValueError, match="middle"):
        two_player_factory(C4, {}, "middle")
