"""An actor's side of self-play: the league snapshots it holds and the draw of each game's
opponent (``[env] api = "two_player"``, :mod:`tianji.rl.selfplay`).

The parameter service publishes every league snapshot (:class:`SnapshotTaken`); the pool
keeps the newest ``[selfplay] pool_size`` as policies of their own (the algorithm built
once more per snapshot, its weights loaded once). The league service sends the opponent
probabilities (:class:`DrawOpponents`); at every game's start an env asks
:meth:`OpponentPool.draw` for its opponent: a held snapshot drawn by those probabilities
or one of the fixed opponents mixed into training (``[selfplay] train_opponents``) or the
actor's own current policy (``live_prob``; the probabilities renormalized over what it
holds), the newest held snapshot while the league
has sent none, and the uniform random player before the first snapshot. The game's result names
the opponent it was actually played against, so the ratings stay right when an actor
(e.g. restarted) lacks a snapshot the league would have drawn.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tianji.rl.events import DrawOpponents, SnapshotTaken
from tianji.rl.league import LIVE
from tianji.rl.selfplay import Opponent, PolicyOpponent, RandomOpponent, TwoPlayerGame

__all__ = ["OpponentPool", "snapshot_id"]


def snapshot_id(version: int) -> str:
    """A snapshot's id in the league: ``v<version>``."""
    return f"v{version}"


class OpponentPool:
    """The snapshots an actor holds and the opponent draw (see the module doc).

    Args:
        make_policy: builds one more policy object (an algorithm with ``set_weights`` and
            ``act``) for a snapshot.
        pool_size: snapshots held at most (the oldest leaves first).
        explore: snapshots sample their moves (else their greedy ones).
        seed: seeds the draws and the random player.
        fixed: the fixed opponents mixed into training.
        live: the actor's own policy as an opponent (id "live"; ``live_prob``), if drawn.
        tactics: what makes a policy opponent (each snapshot and ``live``) play one-move
            tactics (``[selfplay] opponent_tactics``, :class:`tianji.rl.tactics.Tactics`);
            None: they play as they are.
    """

    def __init__(
        self,
        make_policy: Callable[[], Any],
        *,
        pool_size: int,
        explore: bool,
        seed: int,
        fixed: Sequence[Opponent] = (),
        live: PolicyOpponent | None = None,
        tactics: Callable[[PolicyOpponent], Opponent] | None = None,
    ) -> None:
        self.make_policy = make_policy
        self.tactics: Callable[[PolicyOpponent], Opponent] = tactics or (lambda opponent: opponent)
        self.fixed = {o.id: o for o in fixed}
        """Fixed opponents mixed into training (``[selfplay] train_opponents``), by id."""
        if live is not None:
            self.fixed[LIVE] = self.tactics(live)  # drawn like a fixed opponent, its id "live"
        self.pool_size = pool_size
        self.explore = explore
        self.rng = np.random.default_rng([seed, 11])
        self.random = RandomOpponent(seed=seed + 13)
        self.held: dict[str, Opponent] = {}
        """Snapshot id -> its policy as an opponent (one object per snapshot, so a vector
        env batches the moves of the games it plays), oldest first."""
        self.probabilities: dict[str, float] = {}

    async def on_snapshot(self, ev: SnapshotTaken) -> None:
        sid = snapshot_id(ev.policy_version)
        if sid in self.held:
            return
        policy = self.make_policy()
        policy.set_weights(ev.weights, ev.policy_version)
        explore = self.explore
        self.held[sid] = self.tactics(
            PolicyOpponent(sid, lambda obs: policy.act(obs, explore=explore)["action"])
        )
        while len(self.held) > self.pool_size:
            del self.held[next(iter(self.held))]

    async def on_opponents(self, ev: DrawOpponents) -> None:
        self.probabilities = dict(ev.probabilities)

    def draw(self) -> Opponent:
        """The next game's opponent (see the module doc)."""
        if not self.held:
            return self.random
        ids = [i for i in self.probabilities if i in self.held or i in self.fixed]
        if ids:
            p = np.array([self.probabilities[i] for i in ids], np.float64)
            if p.sum() > 0:
                sid = ids[int(self.rng.choice(len(ids), p=p / p.sum()))]
                return self._opponent(sid)
        return self._opponent(next(reversed(self.held)))

    def _opponent(self, sid: str) -> Opponent:
        if sid in self.fixed:
            return self.fixed[sid]
        return self.held[sid]

    def attach(self, envs: Sequence[Any], opening: int = 0) -> int:
        """Make every two-player game among ``envs`` (gymnasium envs, wrapped or not) draw
        its opponents here and begin with up to ``opening`` random moves; returns how many
        it found."""
        found = 0
        for env in envs:
            game = env.unwrapped
            if isinstance(game, TwoPlayerGame):
                game.opponent_source, game.opening = self.draw, opening
                found += 1
        return found
