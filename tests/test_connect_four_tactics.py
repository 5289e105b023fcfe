"""The one-move tactical rules of connect four (``connect_four_tactic``) and the probe
``benchmarks/connect_four_tactics.py`` that scores a policy by them."""

from __future__ import annotations

import numpy as np
import pytest

from tianji.rl.selfplay import ConnectFourScripted, RandomOpponent, connect_four_tactic

pytest.importorskip("pettingzoo.classic")
from tests.test_selfplay_game import _view


def test_a_win_at_once_is_found_before_a_block() -> None:
    view = _view([(5, 0), (5, 1), (5, 2)], [(4, 0), (4, 1), (4, 2)])
    assert connect_four_tactic(view) == ("win", {3})


def test_a_single_threat_must_be_blocked_and_two_threats_decide_nothing() -> None:
    vertical = _view([(5, 0), (5, 1)], [(5, 5), (4, 5), (3, 5)])
    assert connect_four_tactic(vertical) == ("block", {5})
    open_three = _view([(5, 6), (4, 6)], [(5, 2), (5, 3), (5, 4)])
    assert connect_four_tactic(open_three) is None


def test_safe_columns_leave_out_the_one_under_the_opponents_win() -> None:
    trap = _view([(5, 0), (5, 2), (5, 6)], [(4, 0), (4, 1), (4, 2), (5, 1)])
    assert connect_four_tactic(trap) == ("safe", {0, 1, 2, 4, 5, 6})
    assert connect_four_tactic(_view([], [])) is None  # every column is safe


def test_the_tactics_tally_is_full_for_the_scripted_player_and_low_for_random() -> None:
    from connect_four_tactics import tactics

    scripted = ConnectFourScripted(seed=1)
    best = tactics(lambda obs: np.array([scripted.act(o) for o in obs]), games=20, seed=0)
    assert best["losses_after_a_miss"] == 0 and best["games"] == 20
    assert all(best[k]["right"] == 1.0 for k in ("win", "block", "safe") if best[k]["positions"])
    assert best["win"]["positions"] > 0 and best["block"]["positions"] > 0
    chance = RandomOpponent(seed=0)
    chance.n = 7
    worst = tactics(lambda obs: np.array([chance.act(o) for o in obs]), games=20, seed=0)
    assert worst["losses"] >= 15 and worst["losses_after_a_miss"] >= 10
    assert worst["block"]["right"] < 0.5
    with pytest.raises(ValueError, match="games must be even"):
        tactics(lambda obs: np.zeros(len(obs), np.int64), games=3)


def test_the_selfplay_report_shows_the_final_policys_tactics() -> None:
    from selfplay import markdown

    side = {"win": 0.5, "draw": 0.0, "loss": 0.5, "games": 2}
    fixed = {**side, "by_seat": {"first": side, "second": side}}
    tactics = {
        "win": {"right": 0.5913, "positions": 115}, "block": {"right": 0.4837, "positions": 153},
        "safe": {"right": None, "positions": 0}, "games": 200, "losses": 122,
        "losses_after_a_miss": 91,
    }  # fmt: skip
    report = {
        "seconds": 60.0, "seed": 0, "trained_against_fixed": {}, "evaluations": [],
        "train": {"command": "train"}, "rating": {"curve": [], "monotonic": True, "drops": []},
        "final": {"random": fixed, "scripted": fixed, "tactics": tactics},
    }  # fmt: skip
    text = markdown(report)
    assert "of the positions: win 0.591 of 115; block 0.484 of 153; 91 of its 122" in text
    assert "safe" not in text
    assert "Trained by pure self-play" in text
    del report["final"]["tactics"]  # a report from before the probe
    assert "tactics" not in markdown(report)
    report["train"] = {"command": "train", "selfplay": {"opponent_tactics": ["win", "block"]}}
    assert "playing the one-move rules win, block on top of their policy" in markdown(report)
