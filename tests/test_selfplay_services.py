"""Self-play's services, each alone: the parameter service takes snapshots every
``snapshot_every`` versions and hands its pool to newcomers; an actor's opponent pool holds
the newest snapshots and draws by the league's probabilities; the league rates the games
and publishes the draw; evaluation plays each fixed opponent from both seats."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tianji.rl.config import ActorConfig, EnvConfig, RunConfig, to_dict
from tianji.rl.events import DrawOpponents, GamesPlayed, ParamsPublished, SnapshotTaken
from tianji.rl.league import LEARNER, LIVE, SelfPlayConfig
from tianji.rl.selfplay import ConnectFourScripted, PolicyOpponent, RandomOpponent, fixed_opponent
from tianji.runtime.errors import ConfigError
from tianji.services.league import RANDOM, LeagueService, selfplay_summary
from tianji.services.opponents import OpponentPool
from tianji.services.params import ParamsService

pytest.importorskip("pettingzoo.classic")
C4 = EnvConfig(id="pettingzoo.classic.connect_four_v3", api="two_player")


def capture(service: Any) -> list[tuple[Any, str | None]]:
    sent: list[tuple[Any, str | None]] = []

    async def publish(ev: Any, topic: str | None = None) -> int:
        sent.append((ev, topic))
        return 1

    service.publish = publish
    return sent


def test_the_params_service_snapshots_every_n_versions_and_keeps_the_newest() -> None:
    params = ParamsService("params-0", snapshot_every=10, pool_size=2, bind="inproc://")
    sent = capture(params)
    for version in (0, 4, 9, 10, 15, 21, 30):
        w = {"w": np.full(2, version, np.float32)}
        asyncio.run(params.on_params(ParamsPublished(policy_version=version, weights=w)))
    snaps = [ev for ev, topic in sent if isinstance(ev, SnapshotTaken)]
    assert [s.policy_version for s in snaps] == [0, 10, 21]  # 21: the first at or past 20
    assert [s.policy_version for s in params.snapshots] == [10, 21]  # the pool of 2
    assert params.snapshots[-1].weights["w"][0] == 21


class Constant:
    """A policy that always plays its version's column (mod 7); counts weight loads."""

    loads = 0

    def set_weights(self, weights: dict[str, np.ndarray], version: int) -> None:
        Constant.loads += 1
        self.column = version % 7

    def act(self, obs: np.ndarray, *, explore: bool) -> dict[str, np.ndarray]:
        return {"action": np.full(len(obs), self.column, np.int64)}


def snapshot(version: int) -> SnapshotTaken:
    return SnapshotTaken(policy_version=version, weights={})


def test_the_opponent_pool_draws_by_the_leagues_probabilities_among_what_it_holds() -> None:
    pool = OpponentPool(Constant, pool_size=2, explore=True, seed=0)
    assert isinstance(pool.draw(), RandomOpponent)  # no snapshot yet
    for v in (1, 2, 3):
        asyncio.run(pool.on_snapshot(snapshot(v)))
    asyncio.run(pool.on_snapshot(snapshot(3)))  # sent again: not loaded again
    assert list(pool.held) == ["v2", "v3"] and Constant.loads == 3
    assert pool.draw().id == "v3"  # no probabilities yet: the newest
    odds = DrawOpponents(probabilities={"v1": 0.5, "v2": 0.25, "v3": 0.25}, ratings={})
    asyncio.run(pool.on_opponents(odds))
    draws = [pool.draw().id for _ in range(4000)]
    assert set(draws) == {"v2", "v3"}  # v1 is not held: renormalized over the others
    assert 0.45 < draws.count("v2") / len(draws) < 0.55
    obs = np.zeros(91, np.float32)
    assert pool._opponent("v3").act(obs) == 3  # the snapshot's own policy moves


def test_the_opponent_pool_plays_the_fixed_opponents_mixed_into_training() -> None:
    scripted = ConnectFourScripted(seed=0)
    pool = OpponentPool(Constant, pool_size=2, explore=True, seed=0, fixed=[scripted])
    assert isinstance(pool.draw(), RandomOpponent)  # before the first snapshot, as ever
    asyncio.run(pool.on_snapshot(snapshot(1)))
    odds = DrawOpponents(probabilities={"v1": 0.7, "scripted": 0.3}, ratings={})
    asyncio.run(pool.on_opponents(odds))
    draws = [pool.draw() for _ in range(4000)]
    assert {d.id for d in draws} == {"v1", "scripted"}
    assert all(d is scripted for d in draws if d.id == "scripted")
    assert 0.26 < sum(d.id == "scripted" for d in draws) / len(draws) < 0.34


def test_the_league_rates_games_publishes_the_draw_and_writes_league_jsonl(
    tmp_path: Path,
) -> None:
    record = tmp_path / "league.jsonl"
    league = LeagueService(
        "league", settings=SelfPlayConfig(k=16.0, latest_prob=0.5), record=record,
        bind="inproc://",
    )  # fmt: skip
    sent = capture(league)
    asyncio.run(league.on_snapshot(snapshot(0)))
    asyncio.run(league.on_snapshot(snapshot(0)))  # again (a new link): ignored
    chosen = [ev for ev, _ in sent if isinstance(ev, DrawOpponents)]
    assert len(chosen) == 1 and chosen[0].probabilities == {"v0": 1.0}
    games = GamesPlayed(
        actor="actor-0", policy_version=3, opponents=("v0", "random", "v9"),
        seats=np.array([0, 1, 0], np.int8), outcomes=np.array([1, -1, 1], np.float32),
    )  # fmt: skip
    asyncio.run(league.on_games(games))
    ratings = league.league.ratings()
    # learner 1000 beats v0 (1000): +8; then loses to random (1000, fixed) from 1008
    after_loss = 1008 - 16 * (1 / (1 + 10 ** (-8 / 400)))
    assert ratings[LEARNER] == pytest.approx(after_loss)
    assert ratings["v0"] == 992.0 and ratings[RANDOM] == 1000.0
    assert league.counters["games_rated"] == 2 and league.counters["games_unrated"] == 1
    summary = selfplay_summary(league, monitor=None)  # (writes the last ratings too)
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert [line["event"] for line in lines] == ["snapshot", "ratings"]
    assert lines[0]["id"] == "v0" and lines[1]["ratings"]["v0"] == 992.0
    assert summary["newest_snapshot"] == "v0" and summary["newest_rating"] == 992.0
    assert summary["rating_at_snapshot"] == [(0, 1000.0)]
    assert summary["snapshot_ratings"] == [(0, 992.0, 1)]  # rated on by the game against it


def test_fixed_opponents_are_known_by_name_and_a_bad_one_is_refused() -> None:
    assert fixed_opponent("random", 0).id == "random"
    assert fixed_opponent("connect_four_scripted", 0).id == "scripted"
    with pytest.raises(ConfigError, match="eval_opponents"):
        fixed_opponent("grandmaster", 0)
    with pytest.raises(ConfigError, match="selfplay"):
        RunConfig(selfplay=SelfPlayConfig(pool_size=3))  # not a two-player env


def test_evaluation_plays_each_fixed_opponent_half_first_half_second() -> None:
    from tianji.services.evaluator import EvalService

    data = to_dict(RunConfig(algorithm="ppo", transport="inproc", run_dir="", env=C4))
    data["eval"].update(workers=1)
    data["selfplay"].update(eval_games=6, eval_opponents=["random", "connect_four_scripted"])
    worker = EvalService("eval-0", config=data)
    assert worker.opponents == ["random", "connect_four_scripted"]
    returns, lengths = asyncio.run(worker._evaluate(fixed_opponent("connect_four_scripted", 1)))
    assert returns.shape == (6,) and set(returns) <= {-1.0, 0.0, 1.0}
    seats = [env.unwrapped.seat for env in worker._envs[6].envs]
    assert seats == [0, 1, 0, 1, 0, 1]
    assert (lengths >= 3).all()  # a game ends after 3 of the learner's moves at the soonest


def test_the_opponent_pool_draws_the_actors_live_policy_by_its_share() -> None:
    live = PolicyOpponent(LIVE, lambda obs: np.full(len(obs), 5))
    pool = OpponentPool(Constant, pool_size=2, explore=True, seed=0, live=live)
    assert isinstance(pool.draw(), RandomOpponent)  # before the first snapshot, as ever
    asyncio.run(pool.on_snapshot(snapshot(1)))
    asyncio.run(pool.on_opponents(DrawOpponents(probabilities={"v1": 0.6, LIVE: 0.4}, ratings={})))
    draws = [pool.draw() for _ in range(4000)]
    assert all(d is live for d in draws if d.id == LIVE)
    assert 0.36 < sum(d.id == LIVE for d in draws) / len(draws) < 0.44
    assert live.act(np.zeros(91, np.float32)) == 5


def test_live_games_are_counted_not_rated(tmp_path: Path) -> None:
    league = LeagueService("league", settings=SelfPlayConfig(live_prob=0.5), bind="inproc://")
    capture(league)
    asyncio.run(league.on_snapshot(snapshot(0)))
    games = GamesPlayed(
        actor="actor-0", policy_version=3, opponents=(LIVE, "v0", LIVE),
        seats=np.array([0, 1, 0], np.int8), outcomes=np.array([1, -1, -1], np.float32),
    )  # fmt: skip
    asyncio.run(league.on_games(games))
    assert league.counters["games_live"] == 2 and league.counters["games_rated"] == 1
    assert league.counters["games_unrated"] == 0
    assert league.league.learner.games == 1  # only the game against v0 moved the ratings
    assert selfplay_summary(league, monitor=None)["games_live"] == 2


def test_live_games_need_the_weights_in_the_actors() -> None:
    settings = SelfPlayConfig(live_prob=0.5)
    RunConfig(env=C4, selfplay=settings)  # local inference (the default): fine
    with pytest.raises(ConfigError, match=r"selfplay\.live_prob.*inference"):
        RunConfig(env=C4, selfplay=settings, actors=ActorConfig(inference="service"))
