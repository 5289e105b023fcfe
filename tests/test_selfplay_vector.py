"""The two-player vector env batches the opponents' moves and otherwise steps exactly as
gymnasium's SyncVectorEnv does over the same games (same-step autoreset)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from tianji.rl.config import EnvConfig
from tianji.rl.envs import make_vector_env
from tianji.rl.selfplay import IllegalMove, PolicyOpponent, RandomOpponent, two_player_factory
from tianji.rl.selfplay_vector import TwoPlayerVectorEnv

pytest.importorskip("pettingzoo.classic")
C4 = "pettingzoo.classic.connect_four_v3"
N = 6


class Counted:
    """A deterministic policy over masked views (the legal column nearest the centre,
    ties by a board hash) that counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        self.calls += 1
        moves = []
        for view in obs:
            legal = np.flatnonzero(view[-7:] > 0.5)
            shift = int(view[:84].sum()) % 3 - 1  # varies the games a little
            moves.append(legal[np.argmin(np.abs(legal - 3 - shift))])
        return np.asarray(moves)


def play(env: Any, steps: int, seed: int) -> list[Any]:
    """Legal random learner moves for ``steps`` steps; everything the env returned."""
    rng = np.random.default_rng(seed)
    obs, info = env.reset(seed=seed)
    trace: list[Any] = [obs.copy(), info]
    for _ in range(steps):
        actions = [int(rng.choice(np.flatnonzero(o[-7:] > 0.5))) for o in obs]
        obs, reward, terminated, truncated, info = env.step(np.asarray(actions))
        trace += [obs.copy(), reward, terminated, truncated, info]
    return trace


def with_opponent(env: Any, opponent: Any) -> Any:
    for game in env.envs:
        game.opponent_source = lambda: opponent
    return env


def same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray) and a.dtype == object:
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))


def test_the_vector_env_steps_exactly_as_sync_vector_env_over_the_same_games() -> None:
    make = two_player_factory(C4, {}, "alternate")
    batched_policy, single_policy = Counted(), Counted()
    batched = with_opponent(TwoPlayerVectorEnv([make] * N), PolicyOpponent("p", batched_policy))
    single = with_opponent(
        SyncVectorEnv([make] * N, autoreset_mode=AutoresetMode.SAME_STEP),
        PolicyOpponent("p", single_policy),
    )
    steps = 120  # dozens of games end (and restart, half with the opponent opening)
    a, b = play(batched, steps, seed=3), play(single, steps, seed=3)
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert same(x, y)
    ended = sum(int(np.sum(t)) for t in b[4::5])  # terminated
    assert ended > 20
    # one call per step and one per step in which a game restarted with the opponent to
    # open, instead of one per game and move
    assert batched_policy.calls <= 2 * steps + 1 < single_policy.calls / 2


def test_each_opponent_gets_its_own_batch_and_fixed_players_move_one_by_one() -> None:
    make = two_player_factory(C4, {}, "alternate")
    first, second = Counted(), Counted()
    opponents = [PolicyOpponent("a", first), PolicyOpponent("b", second), RandomOpponent(1)]
    env = TwoPlayerVectorEnv([make] * N)
    for k, game in enumerate(env.games):
        game.opponent_source = lambda k=k: opponents[k % 3]
    env.reset(seed=0)
    calls = env.opponent_calls
    obs, *_ = env.step(np.asarray([int(np.flatnonzero(o[-7:] > 0.5)[0]) for o in obs_of(env)]))
    assert env.opponent_calls - calls == 1 + 1 + 2  # a batch each, the random player twice
    assert obs.shape == (N, 84 + 7)


def obs_of(env: TwoPlayerVectorEnv) -> list[np.ndarray]:
    return [g.view() for g in env.games]


def test_an_illegal_move_by_a_batched_opponent_is_refused() -> None:
    make = two_player_factory(C4, {}, "alternate")
    env = with_opponent(
        TwoPlayerVectorEnv([make] * 2), PolicyOpponent("bad", lambda o: np.full(len(o), 9))
    )
    env.envs[0].seat_rule = env.envs[1].seat_rule = "first"
    env.reset(seed=0)
    with pytest.raises(IllegalMove, match="opponent 'bad' played the illegal move 9"):
        env.step(np.asarray([3, 3]))


def test_two_player_actors_get_the_batched_vector_env_unless_wrapped() -> None:
    config = EnvConfig(id=C4, api="two_player")
    assert isinstance(make_vector_env(config, 2), TwoPlayerVectorEnv)
    wrappers = ["gymnasium.wrappers:RecordEpisodeStatistics"]
    wrapped = EnvConfig(id=C4, api="two_player", wrappers=wrappers)
    env = make_vector_env(wrapped, 2)
    assert not isinstance(env, TwoPlayerVectorEnv) and isinstance(env, SyncVectorEnv)
