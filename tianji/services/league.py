"""The self-play league service: rates the learner and its snapshots from the games the
actors report and tells the actors how to draw their opponents.

It runs beside the controller and the monitor (in ``tianji train``'s or ``tianji
controller``'s process, where the run directory is), holding one
:class:`~tianji.rl.league.League`:

* each :class:`~tianji.rl.events.SnapshotTaken` (from the parameter service) enters the
  pool, rated as the learner is then (the weights are the actors' business);
* each :class:`~tianji.rl.events.GamesPlayed` (from an actor) moves the ratings, game by
  game (games against the learner's own live weights are counted, not rated); games
  against the uniform random player (before the first snapshot, or mixed into training
  by ``[selfplay] train_opponents``) rate the learner against the ``random``
  anchor, fixed at the initial rating; games against other fixed opponents mixed into
  training rate them like snapshots;
* at most every :data:`PUBLISH_S` seconds when the ratings moved, and at once when the
  pool changed, it publishes the opponent probabilities
  (:class:`~tianji.rl.events.DrawOpponents`); a new subscriber gets the current ones.

Every snapshot and every rating change is written to the run directory's
``league.jsonl`` (ratings at most once per :data:`PUBLISH_S`), so the curve of the newest
snapshot's rating can be drawn after the run.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tianji.rl.events import DrawOpponents, GamesPlayed, SnapshotTaken
from tianji.rl.league import LEARNER, LIVE, League, SelfPlayConfig
from tianji.rl.selfplay import fixed_opponent
from tianji.rl.stats import LeagueStat
from tianji.rl.topics import GAMES, OPPONENTS, SNAPSHOTS
from tianji.runtime.core import Connection
from tianji.runtime.service import Service
from tianji.services.opponents import snapshot_id

__all__ = ["PUBLISH_S", "RANDOM", "LeagueService", "selfplay_summary"]

log = logging.getLogger(__name__)

PUBLISH_S = 1.0
"""Seconds between two publications of moved ratings (and their lines in league.jsonl)."""
RANDOM = "random"
"""The anchor id of the uniform random player."""


class LeagueService(Service):
    """The run's league (see the module doc).

    Args:
        settings: the run's ``[selfplay]``.
        record: the ``league.jsonl`` to write (None: none).
    """

    role = "league"

    def __init__(
        self, name: str, *, settings: SelfPlayConfig, record: Path | None = None, **kwargs: Any
    ) -> None:
        super().__init__(name, publishes=[OPPONENTS], **kwargs)
        fixed = {fixed_opponent(n, seed=0).id: p for n, p in settings.train_opponents.items()}
        self.opponent_tactics = list(settings.opponent_tactics)
        self.league = League(settings, anchors={RANDOM: settings.initial_rating}, fixed=fixed)
        self.started = time.monotonic()
        self.snapshots: list[dict[str, Any]] = []
        """Every snapshot as it entered: ``id``, ``version``, ``rating``, ``t``."""
        self.record = record
        self._moved = False  # ratings changed since the last publication
        self._published_at = 0.0
        self.subscribe(SNAPSHOTS, self.on_snapshot)
        self.subscribe(GAMES, self.on_games)

    def _t(self) -> float:
        return round(time.monotonic() - self.started, 3)

    def _write(self, line: dict[str, Any]) -> None:
        if self.record is not None:  # (at most a line a second, plus one per snapshot)
            with self.record.open("a", encoding="utf-8") as f:
                f.write(json.dumps(line) + "\n")

    async def on_snapshot(self, ev: SnapshotTaken) -> None:
        sid = snapshot_id(ev.policy_version)
        if sid in self.league.players or sid in self.league.retired:
            return  # sent again (a restarted parameter service, a new link)
        _, left = self.league.snapshot(ev.policy_version)
        rating = self.league.players[sid].rating
        entry = {"t": self._t(), "id": sid, "version": ev.policy_version, "rating": rating}
        self.snapshots.append(entry)
        self.counters[LeagueStat.SNAPSHOTS] += 1
        self._write({"event": "snapshot", **entry, "left_pool": left})
        await self._publish()

    async def on_games(self, ev: GamesPlayed) -> None:
        outcomes = np.asarray(ev.outcomes, np.float64)
        for opponent, outcome in zip(ev.opponents, outcomes, strict=True):
            if opponent == LIVE:  # the learner against itself: nothing to rate
                self.counters[LeagueStat.GAMES_LIVE] += 1
                continue
            score = (float(np.sign(outcome)) + 1.0) / 2.0  # +1 / 0 / -1 -> 1 / 0.5 / 0
            try:
                self.league.record(opponent, score)
            except KeyError:  # a snapshot we never saw (e.g. we restarted): not rated
                self.counters[LeagueStat.GAMES_UNRATED] += 1
                continue
            self.counters[LeagueStat.GAMES_RATED] += 1
        self._moved = True
        if time.monotonic() - self._published_at >= PUBLISH_S:
            await self._publish()

    async def _publish(self) -> None:
        """The opponent probabilities and ratings, to the actors and into league.jsonl."""
        self._published_at = time.monotonic()
        ratings = self._write_ratings()
        self.gauges[LeagueStat.LEARNER_RATING] = ratings[LEARNER]
        if self.league.pool:
            self.gauges[LeagueStat.NEWEST_RATING] = ratings[self.league.pool[-1]]
        await self.publish(self._chosen(), OPPONENTS)

    def _write_ratings(self) -> dict[str, float]:
        """Every rating, written to league.jsonl if they moved since the last line."""
        ratings = self.league.ratings()
        if self._moved:
            games = self.counters[LeagueStat.GAMES_RATED]
            self._write({"event": "ratings", "t": self._t(), "games": games, "ratings": ratings})
            self._moved = False
        return ratings

    def _chosen(self) -> DrawOpponents:
        ratings = {sid: self.league.players[sid].rating for sid in self.league.pool}
        return DrawOpponents(probabilities=self.league.weights(), ratings=ratings)

    async def on_subscribed(self, conn: Connection, topics: Sequence[str]) -> None:
        if OPPONENTS in topics and self.league.pool:
            await self.send_to_subscriber(conn, self._chosen(), OPPONENTS)

    def _games(self, player: str) -> int:
        """Games the learner played against ``player`` (an anchor or a fixed opponent)."""
        return self.league.players[player].games

    def summary(self) -> dict[str, Any]:
        """The league at the end: ratings, games, the newest snapshots' rating curve (each
        snapshot's rating when it was taken) and every snapshot's rating now (the last
        ratings written to league.jsonl first)."""
        ratings = self._write_ratings()
        newest = self.league.pool[-1] if self.league.pool else None
        return {
            "learner_rating": ratings[LEARNER],
            "newest_snapshot": newest,
            "newest_rating": ratings[newest] if newest else None,
            "games": int(self.counters[LeagueStat.GAMES_RATED]),
            "games_unrated": int(self.counters[LeagueStat.GAMES_UNRATED]),
            "games_live": int(self.counters[LeagueStat.GAMES_LIVE]),
            "snapshots": len(self.snapshots),
            "random_rating": ratings[RANDOM],
            "train_opponents": {
                fid: {"probability": p, "rating": ratings[fid], "games": self._games(fid)}
                for fid, p in self.league.fixed.items()
            },
            "opponent_tactics": self.opponent_tactics,
            "rating_at_snapshot": [(s["version"], round(s["rating"], 1)) for s in self.snapshots],
            "snapshot_ratings": self._settled(),
        }

    def _settled(self) -> list[tuple[int, float, int]]:
        """Every snapshot's rating now, rated on by the games played against it after it
        was taken (in the pool or, for games in play when it left, after): ``(version,
        rating, games)`` by version."""
        out = []
        for s in self.snapshots:
            p = self.league.player(s["id"])
            if p is not None:
                out.append((s["version"], round(p.rating, 1), p.games))
        return out


def selfplay_summary(league: LeagueService, monitor: Any) -> dict[str, Any]:
    """The summary's ``selfplay`` section: the league's ratings and, from the newest
    evaluation against each fixed opponent, ``win_rate_vs_<opponent>`` (with its draws,
    losses, games and policy version under ``vs``)."""
    out = league.summary()
    newest: dict[str, dict[str, Any]] = {}
    for ev in getattr(monitor, "evaluations", ()):
        if ev.get("opponent"):
            newest[ev["opponent"]] = ev
    for opponent, ev in sorted(newest.items()):
        out[f"win_rate_vs_{opponent}"] = ev["win"]
    out["vs"] = {
        o: {k: ev[k] for k in ("win", "draw", "loss", "episodes", "policy_version", "t")}
        for o, ev in sorted(newest.items())
    }
    return out
