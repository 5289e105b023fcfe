"""A self-play league, as pure logic: snapshots of the learning policy, Elo ratings from the
games played, and the choice of the next opponent.

The learning policy (the *learner*, always the newest weights) plays two-player zero-sum
games against opponents drawn from the league: with probability ``live_prob`` its own
current weights (a live game, :data:`LIVE`, not rated: both seats are the same player),
and otherwise, with probability ``latest_prob``, the newest
snapshot of itself, else one of the pool's snapshots, weighted by prioritized fictitious
self-play (PFSP, Vinyals et al. 2019): ``"hard"`` favours the snapshots the learner is
least likely to beat (weight ``(1 - p) ** exponent``), ``"even"`` the ones it beats about
half the time (weight ``p (1 - p)``), ``"uniform"`` all alike; ``p`` is the learner's
expected score against the snapshot under the ratings.

Ratings are Elo's: a game between players rated ``ra`` and ``rb`` has the expected score
``ea = 1 / (1 + 10 ** ((rb - ra) / 400))`` for the first; a score ``s`` (1 win, 0.5 draw,
0 loss) moves ``ra`` by ``k (s - ea)`` and ``rb`` by ``-k (s - ea)``. A snapshot starts at
the learner's rating when it is taken (the strength it had then) and is rated on from the
games played against it; anchors (e.g. the uniform random policy) keep a fixed rating and
give the scale its zero. Nothing here does I/O or draws from a global generator: the
controller's league plug-in owns one :class:`League` and feeds it the games' results.

Usage::

    league = League(SelfPlayConfig(latest_prob=0.5), anchors={"random": 0.0})
    league.snapshot(version=100)               # -> "v100", rated as the learner is now
    opponent = league.opponent(rng)            # a snapshot id, drawn as above
    league.record(opponent, score=1.0)         # the learner beat it: both ratings move
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Final

import numpy as np

from tianji.rl.selfplay import TACTICS
from tianji.runtime.errors import ConfigError

__all__ = [
    "LEARNER",
    "LIVE",
    "PFSP_RULES",
    "League",
    "SelfPlayConfig",
    "Player",
    "elo_expected",
    "elo_update",
    "pfsp_weight",
]

LEARNER: Final = "learner"
"""The id of the learning policy (the newest weights) in the league's ratings."""
LIVE: Final = "live"
"""The id of the learner's own current weights as an opponent (``[selfplay] live_prob``)."""
PFSP_RULES: Final = ("hard", "even", "uniform")


def elo_expected(ra: float, rb: float) -> float:
    """The expected score of a player rated ``ra`` against one rated ``rb``."""
    return 1.0 / (1.0 + math.pow(10.0, (rb - ra) / 400.0))


def elo_update(ra: float, rb: float, score: float, k: float) -> tuple[float, float]:
    """Both ratings after one game in which the first scored ``score`` (1, 0.5 or 0)."""
    delta = k * (score - elo_expected(ra, rb))
    return ra + delta, rb - delta


def pfsp_weight(p: float, rule: str, exponent: float = 2.0) -> float:
    """The PFSP weight of an opponent the learner beats with expected score ``p``."""
    if rule == "hard":
        return math.pow(1.0 - p, exponent)
    if rule == "even":
        return p * (1.0 - p)
    return 1.0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SelfPlayConfig:
    """``[selfplay]``: self-play in a two-player game (``[env] api = "two_player"``): when
    snapshots of the learning policy are taken, how opponents are drawn from them and how
    games are rated (a :class:`League`), and which fixed opponents evaluation plays."""

    snapshot_every: int = 20
    """Learner versions between two snapshots (the first is taken at the first weights)."""
    opponent_explore: bool = True
    """Snapshots sample their moves from their policy (False: their greedy moves)."""
    eval_opponents: tuple[str, ...] = ("random",)
    """Fixed opponents evaluation workers play (``[eval] workers``): "random" (uniform over
    legal moves), "connect_four_scripted" (:class:`~tianji.rl.selfplay.ConnectFourScripted`)
    or your own ``"module:Class"`` (``Class(seed=...)`` with ``id`` and ``act(obs)``)."""
    eval_games: int = 50
    """Games per fixed opponent in each evaluation, half played first, half second."""
    train_opponents: dict[str, float] = dataclasses.field(default_factory=dict)
    """Fixed opponents mixed into training (names as in ``eval_opponents``): name -> the
    chance that a game is played against it once the league has a snapshot (the snapshots
    share the rest). Games against them are rated: the uniform random player is the
    scale's anchor, others are rated like snapshots. Empty (the default): pure self-play.
    An evaluation against an opponent also trained against measures play against a known
    opponent, not generalization: reports should say which it is."""
    live_prob: float = 0.0
    """The chance that a game is played against the learner's current weights (the actor's
    own policy in both seats: a live game, :data:`LIVE`), once the league has a snapshot.
    An opponent that moves with the learner cannot be beaten by a line learned against a
    frozen copy of it; live games are not rated (the learner against itself), so the
    snapshots keep a share for the ratings: ``live_prob`` and ``train_opponents`` sum to
    less than 1. Needs local inference (``[actors] inference = "local"``: the actor holds
    the weights)."""
    opponent_tactics: tuple[str, ...] = ()
    """One-move rules the policy opponents (snapshots and live games) play on top of their
    policy (:mod:`tianji.rl.tactics`), of "win" (take a winning move), "block" (answer
    the other's only winning threat) and "safe" (never let the other win on top of one's
    piece). Needs a game that declares them (:data:`~tianji.rl.tactics.GAME_TACTICS`).
    The learner and the evaluation stay the raw policy. Empty (the default): the
    snapshots play as they are."""
    random_opening: int = 0
    """Every training game starts with a random number of moves, from 0 to this many
    (evenly), played uniformly at random for both sides before the learner and its
    opponent take over, so games start from varied positions; the learner learns from its
    own moves only. Evaluation games start from the empty board. 0 (the default): none."""
    latest_prob: float = 0.5
    """The chance that a snapshot game is played against the newest snapshot (else one from
    the pool)."""
    pfsp: str = "hard"
    """How pool opponents are weighted: "hard", "even" or "uniform" (see the module doc)."""
    pfsp_exponent: float = 2.0
    """The exponent of the "hard" weighting."""
    pool_size: int = 20
    """Snapshots kept; the oldest leaves when a new one would exceed it."""
    k: float = 16.0
    """Elo's K factor: how far one game moves the ratings."""
    initial_rating: float = 1000.0
    """The learner's rating before its first game."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.latest_prob <= 1.0:
            raise ConfigError("selfplay.latest_prob", self.latest_prob, "a probability in [0, 1]")
        if self.pfsp not in PFSP_RULES:
            raise ConfigError("selfplay.pfsp", self.pfsp, " | ".join(f'"{r}"' for r in PFSP_RULES))
        if not self.pfsp_exponent > 0:
            raise ConfigError("selfplay.pfsp_exponent", self.pfsp_exponent, "a number > 0")
        if self.pool_size < 1:
            raise ConfigError("selfplay.pool_size", self.pool_size, "an integer >= 1")
        if not self.k > 0:
            raise ConfigError("selfplay.k", self.k, "a number > 0")
        if not math.isfinite(self.initial_rating):
            raise ConfigError("selfplay.initial_rating", self.initial_rating, "a finite number")
        if self.snapshot_every < 1:
            raise ConfigError("selfplay.snapshot_every", self.snapshot_every, "versions >= 1")
        if self.eval_games < 2:
            raise ConfigError("selfplay.eval_games", self.eval_games, "games >= 2 (both seats)")
        if not self.eval_opponents:
            raise ConfigError("selfplay.eval_opponents", self.eval_opponents, "one or more")
        for name, p in self.train_opponents.items():
            if not isinstance(p, int | float) or not 0.0 < p < 1.0:
                key = f"selfplay.train_opponents.{name}"
                raise ConfigError(key, p, "a probability in (0, 1)")
        unknown = [k for k in self.opponent_tactics if k not in TACTICS]
        if unknown or len(set(self.opponent_tactics)) < len(self.opponent_tactics):
            expected = f"distinct kinds among {', '.join(TACTICS)}"
            raise ConfigError("selfplay.opponent_tactics", list(self.opponent_tactics), expected)
        opening = self.random_opening
        if isinstance(opening, bool) or not isinstance(opening, int) or opening < 0:
            raise ConfigError("selfplay.random_opening", self.random_opening, "moves >= 0")
        if not 0.0 <= self.live_prob < 1.0:
            raise ConfigError("selfplay.live_prob", self.live_prob, "a probability in [0, 1)")
        if sum(self.train_opponents.values()) + self.live_prob >= 1.0:
            why = "probabilities summing with live_prob to less than 1 (the snapshots' share)"
            raise ConfigError("selfplay.train_opponents", self.train_opponents, why)


@dataclasses.dataclass(slots=True)
class Player:
    """One rated player: the learner, a snapshot or an anchor."""

    id: str
    rating: float
    version: int | None = None
    """The policy version of a snapshot (None: the learner or an anchor)."""
    anchor: bool = False
    """A fixed-rating player (not moved by games)."""
    games: int = 0
    score: float = 0.0
    """The sum of this player's scores (wins count 1, draws 0.5)."""


class League:
    """The learner, its snapshots and the anchors, with their ratings (see module doc).

    Args:
        rules: the sampling and rating rules.
        anchors: fixed-rating opponents by id (e.g. ``{"random": 0.0}``); games against
            them move the learner's rating, not theirs.
        fixed: fixed opponents mixed into training, by id -> the chance of a game against
            it once there is a snapshot (``[selfplay] train_opponents``, by the opponents'
            ids); rated from the initial rating unless they are anchors.
    """

    def __init__(
        self,
        rules: SelfPlayConfig,
        anchors: Mapping[str, float] | None = None,
        fixed: Mapping[str, float] | None = None,
    ) -> None:
        self.rules = rules
        self.players: dict[str, Player] = {LEARNER: Player(LEARNER, rules.initial_rating)}
        for name, rating in (anchors or {}).items():
            if name in (LEARNER, LIVE) or name.startswith("v"):
                why = 'a name other than "learner"/"live"/"v<N>"'
                raise ConfigError("selfplay.anchors", name, why)
            self.players[name] = Player(name, float(rating), anchor=True)
        self.fixed = dict(fixed or {})
        for name in self.fixed:
            if name in (LEARNER, LIVE) or name.startswith("v"):
                why = 'an id other than "learner"/"live"/"v<N>"'
                raise ConfigError("selfplay.train_opponents", name, why)
            self.players.setdefault(name, Player(name, rules.initial_rating))
        self.pool: list[str] = []
        """Snapshot ids, oldest first (the newest is ``pool[-1]``)."""
        self.retired: dict[str, Player] = {}
        """Snapshots that left the pool (games still in play against them are rated)."""

    @property
    def learner(self) -> Player:
        return self.players[LEARNER]

    def snapshot(self, version: int) -> tuple[str, list[str]]:
        """Freeze the learner's weights of ``version`` as a snapshot rated as the learner
        is now; returns its id and the ids of snapshots that left the pool to make room."""
        sid = f"v{version}"
        if sid in self.players:
            raise ValueError(f"snapshot {sid} is already in the league")
        self.players[sid] = Player(sid, self.learner.rating, version=version)
        self.pool.append(sid)
        evicted = []
        while len(self.pool) > self.rules.pool_size:
            evicted.append(self.pool.pop(0))
            self.retired[evicted[-1]] = self.players.pop(evicted[-1])
        return sid, evicted

    def weights(self) -> dict[str, float]:
        """The probability of each opponent being the next (they sum to 1): each fixed
        one's own, the learner's live weights' ``live_prob``, and the rest shared among the
        snapshots as above; none before the first snapshot."""
        if not self.pool:
            return {}
        live = {LIVE: self.rules.live_prob} if self.rules.live_prob > 0 else {}
        snapshots = 1.0 - sum(self.fixed.values()) - self.rules.live_prob
        probs = {sid: snapshots * p for sid, p in self._snapshot_weights().items()}
        return {**probs, **self.fixed, **live}

    def _snapshot_weights(self) -> dict[str, float]:
        """The snapshots' share of the draws (summing to 1): the newest with
        ``latest_prob``, the pool by PFSP."""
        r = self.rules
        learner = self.learner.rating
        raw = {
            sid: pfsp_weight(
                elo_expected(learner, self.players[sid].rating), r.pfsp, r.pfsp_exponent
            )
            for sid in self.pool
        }
        total = sum(raw.values())
        if total <= 0.0:  # every weight vanished (all beaten for sure): fall back to uniform
            raw = dict.fromkeys(self.pool, 1.0)
            total = float(len(self.pool))
        pool_share = 1.0 - r.latest_prob if len(self.pool) > 1 else 0.0
        probs = {sid: pool_share * w / total for sid, w in raw.items()}
        probs[self.pool[-1]] += 1.0 - pool_share
        return probs

    def opponent(self, rng: np.random.Generator) -> str:
        """Draw the next opponent's snapshot id (see :meth:`weights`).

        Raises:
            LookupError: the league has no snapshot yet.
        """
        probs = self.weights()
        if not probs:
            raise LookupError("the league has no snapshot to play against yet")
        ids = list(probs)
        p = np.array([probs[i] for i in ids], dtype=np.float64)
        return ids[int(rng.choice(len(ids), p=p / p.sum()))]

    def record(self, opponent: str, score: float) -> tuple[float, float]:
        """Rate one game of the learner against ``opponent`` (a snapshot or anchor id) in
        which the learner scored ``score``; returns both new ratings (learner, opponent).
        A game against a snapshot that has left the pool (still in play when it left)
        is rated like any other.

        Raises:
            ValueError: ``score`` is not 0, 0.5 or 1.
            KeyError: ``opponent`` was never in the league.
        """
        if score not in (0.0, 0.5, 1.0):
            raise ValueError(f"a game's score is 0, 0.5 or 1, not {score!r}")
        me = self.learner
        other = self.player(opponent)
        if other is None or other is me:
            raise KeyError(f"{opponent!r} is not an opponent in this league")
        new_me, new_other = elo_update(me.rating, other.rating, score, self.rules.k)
        me.rating, me.games, me.score = new_me, me.games + 1, me.score + score
        other.games, other.score = other.games + 1, other.score + 1.0 - score
        if not other.anchor:
            other.rating = new_other
        return me.rating, other.rating

    def player(self, pid: str) -> Player | None:
        """The player ``pid``, in the league or retired from the pool (None: never in it)."""
        return self.players.get(pid) or self.retired.get(pid)

    def ratings(self) -> dict[str, float]:
        """Every player's rating by id."""
        return {pid: p.rating for pid, p in self.players.items()}
