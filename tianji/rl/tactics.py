"""Self-play opponents that see one move ahead (``[selfplay] opponent_tactics``).

In pure self-play the learner's opponents are copies of itself, and they miss what it
misses: a connect-four policy after a few minutes takes about three in five of its
winning moves and blocks about half of its opponent's threats, and three in four of its
losses to the scripted player follow such a miss (``benchmarks/connect_four_tactics.py``,
docs/benchmarks.md). An opponent that never leaves a win on the board nor an open
threat unanswered punishes every such miss, so the learner's mistakes cost it games
instead of passing unnoticed.

:class:`TacticalOpponent` gives a policy opponent (a league snapshot or the live
learner) that sight: before the policy picks its move, the game's *tactic* (a function
of the mover's view, :data:`GAME_TACTICS`) names the kind of position and the columns
that follow the one-move rule; for the kinds asked for, the opponent's action mask is
narrowed to those columns, and the policy chooses among them as it always does (masked
sampling). Elsewhere the snapshot plays as itself. The learner itself, and what the
evaluation measures, stay the raw policy: the tactics are part of the opponents only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection
from typing import Final

import numpy as np

from tianji.rl.selfplay import TACTICS, Opponent, PolicyOpponent, connect_four_tactic
from tianji.runtime.errors import ConfigError

__all__ = [
    "GAME_TACTICS",
    "Tactic",
    "TacticalOpponent",
    "Tactics",
    "TacticsTally",
    "check_game_tactics",
    "game_tactic",
]

Tactic = Callable[[np.ndarray], tuple[str, set[int]] | None]
"""A game's one-move rules: the mover's masked view -> (kind, the moves that follow the
rule), or None where no rule decides the position."""

GAME_TACTICS: Final[dict[str, Tactic]] = {
    "pettingzoo.classic.connect_four_v3": connect_four_tactic,
}
"""The games with one-move tactics, by ``[env] id``; their kinds are :data:`TACTICS`."""


def game_tactic(env_id: str) -> Tactic | None:
    """The one-move tactic of the game ``env_id`` (None: the game declares none)."""
    return GAME_TACTICS.get(env_id)


def check_game_tactics(env_id: str, kinds: Collection[str]) -> None:
    """Refuse opponent tactics for a game that declares none.

    Raises:
        ConfigError: naming ``selfplay.opponent_tactics`` and the env id.
    """
    if kinds and game_tactic(env_id) is None:
        why = f"empty for env.id {env_id!r}: one-move tactics exist for {', '.join(GAME_TACTICS)}"
        raise ConfigError("selfplay.opponent_tactics", list(kinds), why)


def _valid(kinds: Collection[str]) -> frozenset[str]:
    """``kinds`` as a set, if it names one or more of :data:`TACTICS` and nothing else."""
    unknown = sorted(set(kinds) - set(TACTICS))
    if unknown or not kinds:
        raise ValueError(f"tactic kinds {sorted(kinds)}: one or more of {', '.join(TACTICS)}")
    return frozenset(kinds)


class TacticalOpponent:
    """``inner`` (a policy opponent) playing the one-move rules ``kinds`` of ``tactic``
    (see the module doc); its id is the inner opponent's, so the league rates it as that
    snapshot.

    Args:
        inner: the policy opponent; its ``act_batch`` honours the mask in the views.
        tactic: the game's tactic.
        kinds: which of the tactic's kinds to play (e.g. ``("win", "block")``).
        n_actions: the mask's length (the trailing entries of every view).
        tally: where to count the moves (shared by the opponents of one pool; a tally of
            its own by default).

    Raises:
        ValueError: naming the kinds if they are none or not all of :data:`TACTICS`.
    """

    def __init__(
        self,
        inner: PolicyOpponent,
        tactic: Tactic,
        kinds: Collection[str],
        n_actions: int,
        tally: TacticsTally | None = None,
    ) -> None:
        self.inner, self.id = inner, inner.id
        self.tactic, self.kinds, self.n_actions = tactic, _valid(kinds), n_actions
        self.tally = tally if tally is not None else TacticsTally({k: 0 for k in self.kinds})

    def act(self, obs: np.ndarray) -> int:
        return int(self.act_batch(np.asarray(obs)[None])[0])

    def act_batch(self, obs: np.ndarray) -> np.ndarray:
        """Moves ``[B]`` for views ``[B, D + n]``: the inner policy's, among the moves
        the rules leave (one call of the inner policy for the batch)."""
        views = np.array(obs, copy=True)
        for view in views:
            found = self.tactic(view)
            if found is not None and found[0] in self.kinds:
                kind, moves = found
                mask = np.zeros(self.n_actions, views.dtype)
                mask[sorted(moves)] = 1
                view[-self.n_actions :] = mask
                self.tally.narrowed[kind] = self.tally.narrowed.get(kind, 0) + 1
        self.tally.moves += len(views)
        return self.inner.act_batch(views)


@dataclasses.dataclass(slots=True)
class TacticsTally:
    """The moves tactical opponents made, and how many of them a rule narrowed, by kind
    (an actor reports them as ``opponent_moves`` and ``opponent_<kind>`` counters)."""

    narrowed: dict[str, int] = dataclasses.field(default_factory=dict)
    moves: int = 0


class Tactics:
    """Makes policy opponents play ``kinds`` of ``tactic``, all counting into one
    :attr:`tally` (an actor's pool: its snapshots and its live policy).

    Raises:
        ValueError: for kinds but no tactic (a game that declares none), or an unknown kind.
    """

    def __init__(self, tactic: Tactic | None, kinds: Collection[str], n_actions: int) -> None:
        if tactic is None:
            raise ValueError(f"opponent tactics {sorted(kinds)} for a game that declares none")
        self.tactic, self.kinds, self.n_actions = tactic, _valid(kinds), n_actions
        self.tally = TacticsTally({kind: 0 for kind in self.kinds})

    def __call__(self, opponent: PolicyOpponent) -> Opponent:
        return TacticalOpponent(opponent, self.tactic, self.kinds, self.n_actions, self.tally)
