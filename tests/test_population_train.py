"""A population run end to end (`tianji train examples/acrobot_pbt.toml`, shortened to two
CartPole members): members exploit and explore (population.jsonl), the adopting learner
loads the state, every member's books close on its own, and the summary has a population
section."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_a_two_member_pbt_run_exploits_and_keeps_each_members_books(tmp_path: Path) -> None:
    summary_path = tmp_path / "summary.json"
    command = [
        sys.executable, "-m", "tianji.cli", "train", "examples/acrobot_pbt.toml",
        "--no-dashboard", "--summary", str(summary_path), "--run-dir", str(tmp_path / "runs"),
        "--set", "env.id=CartPole-v1", "--set", "actors.count=2",
        "--set", "population.size=2", "--set", "population.interval=2000",
        "--set", "population.init={lr = [1e-4, 3e-3]}", "--set", "population.fraction=0.5",
        "--set", "stop.max_env_steps=14000", "--set", "stop.window=5",
        "--set", "actors.fragment_length=64",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    s = json.loads(summary_path.read_text())
    pop = s["population"]
    assert pop["size"] == 2 and pop["pbt"] and set(pop["members"]) == {"m0", "m1"}
    run_dir = Path(s["run_dir"])
    lines = [json.loads(x) for x in (run_dir / "population.jsonl").read_text().splitlines()]
    done = [x for x in lines if x["done"]]
    assert done, lines
    assert pop["exploits"] == len(lines)
    for x in lines:
        assert x["member"] != x["copied_from"] and x["objective"] <= x["source_objective"]
        assert set(x["hyperparameters_after"]) == {"lr", "ent_coef"}
    for name, member in pop["members"].items():
        assert member["books_closed"] is True, (name, member)
        own = json.loads((run_dir / "members" / name / "summary.json").read_text())
        learner = own["services"]["learner-0"]["counters"]
        adopted = sum(1 for x in done if x["member"] == name)
        assert learner.get("pbt/adopted", 0) == adopted
        assert member["exploited"] == sum(1 for x in lines if x["member"] == name)
        # only its own actors' samples: its books balance on its own producers
        assert own["accounting"]["balanced"], own["accounting"]
        assert all("." not in n for n in own["services"])  # under local names
        assert (run_dir / "members" / name / "metrics.jsonl").stat().st_size > 0
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows and set(rows[-1]["members"]) == {"m0", "m1"}
    assert "pbt:" in result.stdout and " m0 " in result.stdout and " m1 " in result.stdout
