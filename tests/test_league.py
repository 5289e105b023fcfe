"""The self-play league's ratings and opponent sampling, against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest

from tianji.rl.league import (
    LEARNER,
    LIVE,
    League,
    SelfPlayConfig,
    elo_expected,
    elo_update,
    pfsp_weight,
)
from tianji.runtime.errors import ConfigError


def test_elo_expectation_and_update_match_hand_computed_values() -> None:
    assert elo_expected(1000, 1000) == 0.5
    assert elo_expected(1400, 1000) == pytest.approx(10 / 11)  # 1 / (1 + 10^-1)
    assert elo_expected(1000, 1400) == pytest.approx(1 / 11)
    assert elo_update(1000, 1000, 1.0, 16) == (1008.0, 992.0)
    assert elo_update(1000, 1000, 0.5, 16) == (1000.0, 1000.0)
    # an upset: the weaker (expected 1/11) wins; it gains 32 * 10/11
    ra, rb = elo_update(1000, 1400, 1.0, 32)
    assert ra == pytest.approx(1000 + 320 / 11) and rb == pytest.approx(1400 - 320 / 11)


def test_pfsp_weights_favour_what_the_rule_says() -> None:
    assert pfsp_weight(0.25, "hard") == pytest.approx(0.5625)  # (1 - 0.25)^2
    assert pfsp_weight(0.25, "hard", exponent=1.0) == pytest.approx(0.75)
    assert pfsp_weight(0.25, "even") == pytest.approx(0.1875)  # 0.25 * 0.75
    assert pfsp_weight(0.25, "uniform") == 1.0


def _league(**rules: object) -> League:
    league = League(SelfPlayConfig(**rules), anchors={"random": 0.0})  # type: ignore[arg-type]
    for version in (10, 20, 30):
        league.snapshot(version)
    return league


def test_a_snapshot_starts_at_the_learners_rating_and_the_pool_keeps_the_newest() -> None:
    league = League(SelfPlayConfig(pool_size=2))
    league.learner.rating = 1234.0
    sid, evicted = league.snapshot(7)
    assert (sid, evicted) == ("v7", []) and league.players["v7"].rating == 1234.0
    assert league.players["v7"].version == 7
    league.snapshot(8)
    sid, evicted = league.snapshot(9)
    assert evicted == ["v7"] and league.pool == ["v8", "v9"]
    assert "v7" in league.retired
    with pytest.raises(ValueError, match="v9"):
        league.snapshot(9)


def test_uniform_sampling_gives_the_newest_its_extra_share() -> None:
    league = _league(pfsp="uniform", latest_prob=0.5)
    w = league.weights()
    assert w == pytest.approx({"v10": 1 / 6, "v20": 1 / 6, "v30": 0.5 + 1 / 6})


def test_hard_pfsp_weights_match_the_ratings_by_hand() -> None:
    league = _league(pfsp="hard", latest_prob=0.2)
    league.players["v10"].rating = 600.0  # learner 1000: p = 10/11, weight (1/11)^2
    league.players["v20"].rating = 1000.0  # p = 1/2, weight 1/4
    league.players["v30"].rating = 1400.0  # p = 1/11, weight (10/11)^2
    raw = {"v10": (1 / 11) ** 2, "v20": 0.25, "v30": (10 / 11) ** 2}
    total = sum(raw.values())
    expected = {k: 0.8 * v / total for k, v in raw.items()}
    expected["v30"] += 0.2
    assert league.weights() == pytest.approx(expected)
    assert sum(league.weights().values()) == pytest.approx(1.0)


def test_draws_follow_the_weights() -> None:
    league = _league(pfsp="even", latest_prob=0.3)
    league.players["v10"].rating = 800.0
    rng = np.random.default_rng(0)
    draws = [league.opponent(rng) for _ in range(20_000)]
    for sid, p in league.weights().items():
        assert draws.count(sid) / len(draws) == pytest.approx(p, abs=0.015), sid
    assert "random" not in draws  # anchors are rated against, never drawn


def test_a_league_without_snapshots_has_no_opponent() -> None:
    league = League(SelfPlayConfig())
    assert league.weights() == {}
    with pytest.raises(LookupError, match="no snapshot"):
        league.opponent(np.random.default_rng(0))


def test_games_move_both_ratings_but_never_an_anchors() -> None:
    league = _league(k=16.0)
    assert league.record("v30", 1.0) == (1008.0, 992.0)
    assert league.players["v30"].games == 1 and league.players["v30"].score == 0.0
    learner, anchor = league.record("random", 1.0)
    # learner 1008 against 0: expected 1 / (1 + 10^(-1008/400))
    assert learner == pytest.approx(1008.0 + 16 * (1 - 1 / (1 + 10 ** (-1008 / 400))))
    assert anchor == 0.0 and league.players["random"].rating == 0.0
    assert league.learner.games == 2 and league.learner.score == 2.0


def test_a_game_against_a_snapshot_that_left_the_pool_is_still_rated() -> None:
    league = League(SelfPlayConfig(pool_size=1))
    league.snapshot(1)
    league.snapshot(2)  # v1 leaves
    assert league.record("v1", 0.0) == (992.0, 1008.0)
    assert league.retired["v1"].rating == 1008.0


@pytest.mark.parametrize(
    ("opponent", "score", "error"),
    [("v99", 1.0, KeyError), (LEARNER, 1.0, KeyError), ("v10", 0.7, ValueError)],
)
def test_a_bad_game_is_refused_naming_it(opponent: str, score: float, error: type) -> None:
    league = _league()
    with pytest.raises(error, match=str(score) if error is ValueError else opponent):
        league.record(opponent, score)


@pytest.mark.parametrize(
    ("key", "value"),
    [("latest_prob", 1.5), ("pfsp", "greedy"), ("pool_size", 0), ("k", 0.0)],
)
def test_bad_league_rules_name_the_key(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"selfplay.{key}"):
        SelfPlayConfig(**{key: value})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="anchors"):
        League(SelfPlayConfig(), anchors={"v3": 0.0})


def test_fixed_training_opponents_take_their_share_and_are_rated() -> None:
    league = League(
        SelfPlayConfig(pfsp="uniform", latest_prob=0.5, k=16.0),
        anchors={"random": 1000.0},
        fixed={"scripted": 0.2, "random": 0.1},
    )
    assert league.weights() == {}  # nothing before the first snapshot
    for version in (10, 20, 30):
        league.snapshot(version)
    # the snapshots share 0.7 as before: 1/6, 1/6, 1/2 + 1/6 of it
    want = {"v10": 0.7 / 6, "v20": 0.7 / 6, "v30": 0.7 * (0.5 + 1 / 6)}
    assert league.weights() == pytest.approx({**want, "scripted": 0.2, "random": 0.1})
    assert sum(league.weights().values()) == pytest.approx(1.0)
    assert league.record("scripted", 0.0) == (992.0, 1008.0)  # rated like a snapshot
    learner, anchor = league.record("random", 1.0)  # the anchor stays where it is
    assert anchor == 1000.0 and learner == pytest.approx(992.0 + 16 * (1 - elo_expected(992, 1000)))
    rng = np.random.default_rng(1)
    draws = [league.opponent(rng) for _ in range(20_000)]
    assert draws.count("scripted") / len(draws) == pytest.approx(0.2, abs=0.015)


@pytest.mark.parametrize(
    "mix", [{"scripted": 0.0}, {"scripted": 1.2}, {"a": 0.5, "b": 0.5}, {"x": "0.1"}]
)
def test_a_bad_training_mix_is_refused_naming_it(mix: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match=r"selfplay\.train_opponents"):
        SelfPlayConfig(train_opponents=mix)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="train_opponents"):
        League(SelfPlayConfig(), fixed={"v3": 0.1})


def test_live_games_take_their_share_before_the_snapshots_split_the_rest() -> None:
    league = League(
        SelfPlayConfig(pfsp="uniform", latest_prob=0.5, live_prob=0.4),
        fixed={"scripted": 0.1},
    )
    assert league.weights() == {}  # no live games before the first snapshot either
    for version in (10, 20):
        league.snapshot(version)
    # the snapshots share 1 - 0.4 - 0.1 = 0.5: v10 0.5 * 0.25, v20 0.5 * (0.5 + 0.25)
    want = {"v10": 0.125, "v20": 0.375, "scripted": 0.1, LIVE: 0.4}
    assert league.weights() == pytest.approx(want)
    rng = np.random.default_rng(2)
    draws = [league.opponent(rng) for _ in range(20_000)]
    assert draws.count(LIVE) / len(draws) == pytest.approx(0.4, abs=0.015)
    with pytest.raises(KeyError):  # the learner against itself is no rated game
        league.record(LIVE, 1.0)


@pytest.mark.parametrize(
    ("live", "mix"), [(-0.1, {}), (1.0, {}), (0.6, {"scripted": 0.4}), (0.9, {"r": 0.2})]
)
def test_a_bad_live_share_is_refused_naming_it(live: float, mix: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match=r"selfplay\.(live_prob|train_opponents)"):
        SelfPlayConfig(live_prob=live, train_opponents=mix)
    with pytest.raises(ConfigError, match='"live"'):
        League(SelfPlayConfig(), fixed={LIVE: 0.1})
