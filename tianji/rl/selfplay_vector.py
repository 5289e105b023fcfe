"""A vector of two-player games whose opponents' moves are batched.

Stepping :class:`~tianji.rl.selfplay.TwoPlayerGame` one at a time (gymnasium's
``SyncVectorEnv``) makes every opponent move its own call of the opponent's policy: for a
snapshot of a small convolutional net one view costs a good part of what the actor's
sixteen together cost (the fixed cost of a call dominates), so the opponents took most of
an actor's time (``benchmarks/selfplay_actor.py`` measures both ways).
:class:`TwoPlayerVectorEnv` steps the same games in phases: every learner's move first,
then the opponents' moves grouped by opponent — one call of ``act_batch`` per opponent
that has one (a snapshot: :class:`~tianji.rl.selfplay.PolicyOpponent`), ``act`` per game
otherwise — then each game's outcome; games that ended start again at once (same-step
autoreset, as ``make_vector_env``'s envs do), and the opponents who open the new games
move together too.

Observations, rewards, ``final_obs`` / ``final_info`` and the reset infos are those of
``SyncVectorEnv(..., autoreset_mode=SAME_STEP)`` over the same games; only the order in
which the opponents' policies are called (and so their random draws) differs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.vector.utils import concatenate

from tianji.rl.selfplay import TwoPlayerGame

__all__ = ["TwoPlayerVectorEnv", "opponents_move"]


def opponents_move(games: Iterable[TwoPlayerGame]) -> int:
    """Make the opponent's move in each of ``games`` (each awaiting one), batched by
    opponent; returns the number of policy calls it took."""
    by_opponent: dict[int, list[TwoPlayerGame]] = {}
    for game in games:
        by_opponent.setdefault(id(game.opponent), []).append(game)
    calls = 0
    for group in by_opponent.values():
        opponent = group[0].opponent
        views = [g.opponent_view() for g in group]
        batch = getattr(opponent, "act_batch", None)
        if batch is not None:
            moves = batch(np.stack(views))
            calls += 1
        else:
            moves = [opponent.act(v) for v in views]
            calls += len(group)
        for game, move, view in zip(group, moves, views, strict=True):
            game.opponent_plays(int(move), view)
    return calls


class TwoPlayerVectorEnv(SyncVectorEnv):
    """``SyncVectorEnv`` over unwrapped :class:`TwoPlayerGame` envs, same-step autoreset,
    with the opponents' moves batched (see the module doc).

    Raises:
        TypeError: naming the env if a factory makes anything but a bare
            :class:`TwoPlayerGame` (wrapped games step through their wrappers: use
            ``SyncVectorEnv``).
    """

    def __init__(self, env_fns: Sequence[Callable[[], Any]]) -> None:
        super().__init__(env_fns, autoreset_mode=AutoresetMode.SAME_STEP)
        for env in self.envs:
            if not isinstance(env, TwoPlayerGame):
                raise TypeError(f"{env!r} is not a bare TwoPlayerGame")
        self.games: list[TwoPlayerGame] = list(self.envs)  # type: ignore[arg-type]
        self.opponent_calls = 0
        """Calls of the opponents' policies so far (a batch counts one)."""

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        for game, action in zip(self.games, np.asarray(actions).reshape(-1), strict=True):
            game.play(int(action))
        self.opponent_calls += opponents_move(g for g in self.games if g.awaits_opponent())
        infos: dict[str, Any] = {}
        restarted: dict[int, dict[str, Any]] = {}
        env_obs = cast(list[Any], self._env_obs)  # (typed list[None] by gymnasium)
        for i, game in enumerate(self.games):
            obs, reward, terminated, truncated, info = game.outcome()
            env_obs[i], self._rewards[i] = obs, reward
            self._terminations[i], self._truncations[i] = terminated, truncated
            if terminated or truncated:
                infos = self._add_info(infos, {"final_obs": obs, "final_info": info}, i)
                restarted[i] = game.start()
            else:
                infos = self._add_info(infos, info, i)
        openers = [self.games[i] for i in restarted if self.games[i].awaits_opponent()]
        self.opponent_calls += opponents_move(openers)
        for i, info in restarted.items():
            env_obs[i] = self.games[i].view()  # the new game's first view
            infos = self._add_info(infos, info, i)
        self._observations = concatenate(
            self.single_observation_space, self._env_obs, self._observations
        )
        self._autoreset_envs = np.logical_or(self._terminations, self._truncations)
        return (
            self._observations.copy(),
            np.copy(self._rewards),
            np.copy(self._terminations),
            np.copy(self._truncations),
            infos,
        )
