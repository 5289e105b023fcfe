"""A self-play run end to end: `tianji train examples/connect_four_selfplay.toml`, shortened,
takes snapshots, rates the games in league.jsonl (and counts the live ones, against the
learner's own weights, unrated; its opponents here play the one-move rules, and the actors
count the moves the rules decided; its games start after up to two random moves),
evaluates against the fixed opponents
and reports it all in the summary's `selfplay` section, with no illegal move (an illegal
move stops the actor, and the run with it) and the books closed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pettingzoo.classic")
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_a_short_self_play_run_rates_its_snapshots_and_evaluates(tmp_path: Path) -> None:
    summary_path = tmp_path / "summary.json"
    command = [
        sys.executable, "-m", "tianji.cli", "train", "examples/connect_four_selfplay.toml",
        "--max-seconds", "12", "--no-dashboard", "--summary", str(summary_path),
        "--run-dir", str(tmp_path / "runs"),
        "--set", "selfplay.snapshot_every=2", "--set", "selfplay.eval_games=10",
        "--set", "eval.every_seconds=2",
        "--set", 'selfplay.opponent_tactics=["win", "block", "safe"]',
        "--set", "selfplay.random_opening=2",  # games start after 0-2 random moves
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    s = json.loads(summary_path.read_text())
    play = s["selfplay"]
    assert play["snapshots"] >= 3 and play["newest_snapshot"].startswith("v")
    assert play["games"] > 100 and play["games_unrated"] == 0
    assert 0.0 <= play["win_rate_vs_random"] <= 1.0
    assert 0.0 <= play["win_rate_vs_scripted"] <= 1.0
    assert play["vs"]["random"]["episodes"] == 10
    versions = [v for v, _ in play["rating_at_snapshot"]]
    assert versions == sorted(versions) and versions[0] == 0
    settled = play["snapshot_ratings"]  # every snapshot, rated on after it was taken
    assert [v for v, _, _ in settled] == versions and sum(g for _, _, g in settled) > 0
    actors = [svc["counters"] for name, svc in s["services"].items() if name.startswith("actor-")]
    games = sum(c.get("games", 0) for c in actors)
    # the snapshots and live games played the one-move rules: they decided some moves
    assert play["opponent_tactics"] == ["win", "block", "safe"]
    moves = sum(c.get("opponent_moves", 0) for c in actors)
    ruled = sum(c.get(f"opponent_{kind}", 0) for c in actors for kind in ("win", "block", "safe"))
    assert 0 < ruled < moves, (ruled, moves)
    assert play["games_live"] > 0  # the example plays half its games live
    # every rated game and every live game was reported by an actor
    assert games >= play["games"] + play["games_live"]
    assert s["accounting"]["balanced"], s["accounting"]
    lines = [json.loads(x) for x in (Path(s["run_dir"]) / "league.jsonl").read_text().splitlines()]
    snapshots = [x for x in lines if x["event"] == "snapshot"]
    assert [x["id"] for x in snapshots][: play["snapshots"]] == [f"v{v}" for v in versions]
    assert any(x["event"] == "ratings" for x in lines)
    assert -1.0 <= s["final_return"] <= 1.0  # training returns are outcomes
