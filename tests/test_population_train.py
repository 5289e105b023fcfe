"""A population run end to end (`tianji train examples/acrobot_pbt.toml`, shortened to two
CartPole members), watched on its dashboard: members exploit and explore (population.jsonl),
the adopting learner loads the state, a member's learner killed mid-run resumes from its
member's newest checkpoint with the hyperparameters PBT gave it, every member's books close
on their own, and the summary has a population section."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_recovery import training

ROOT = Path(__file__).resolve().parents[1]
PBT = ROOT / "examples" / "acrobot_pbt.toml"


def _member(status: dict[str, Any], scope: str) -> dict[str, Any]:
    return status["counters"]["members"][scope]


def _exploited(run_parent: Path) -> bool:
    """Whether the run's ``population.jsonl`` has an exploit carried out."""
    for path in run_parent.glob("*/population.jsonl"):
        if any(json.loads(x)["done"] for x in path.read_text().splitlines() if x.strip()):
            return True
    return False


@pytest.mark.slow
def test_a_two_member_pbt_run_exploits_survives_a_kill_and_keeps_each_members_books(
    tmp_path: Path,
) -> None:
    overrides = [
        "env.id=CartPole-v1", "actors.count=2", "population.size=2", "population.interval=2000",
        "population.init={lr = [1e-4, 3e-3]}", "population.fraction=0.5",
        "stop.max_env_steps=50000", "stop.window=5", "actors.fragment_length=64",
        'recovery.learner="resume"', "checkpoint.every_updates=5",
    ]  # fmt: skip
    args = [x for o in overrides for x in ("--set", o)]
    with training(tmp_path, *args, config=PBT) as run:
        # killed once it holds a checkpoint and PBT carried out an exploit (planned on the
        # progress interval: a short run gets only a few chances after the kill)
        status = run.wait_for(
            lambda s: _member(s, "m1")["learner_updates"] >= 8 and _exploited(tmp_path),
            timeout=120,
        )
        assert status["title"].endswith("population of 2")
        assert set(status["accounting"]["members"]) == {"m0", "m1"}
        run.kill_and_await_restart(status, "m1.learner-0")
        code, out, s = run.finish()
    assert code == 0, out[-3000:]
    assert "m1.learner-0 died: resuming from ckpt-" in out, out[-3000:]
    pop = s["population"]
    assert pop["size"] == 2 and pop["pbt"] and set(pop["members"]) == {"m0", "m1"}
    run_dir = Path(s["run_dir"])
    lines = [json.loads(x) for x in (run_dir / "population.jsonl").read_text().splitlines()]
    done = [x for x in lines if x["done"]]
    assert done, (lines, out[-4000:])
    assert pop["exploits"] == len(lines)
    for x in lines:
        assert x["member"] != x["copied_from"] and x["objective"] <= x["source_objective"]
        assert set(x["hyperparameters_after"]) == {"lr", "ent_coef"}
    for name, member in pop["members"].items():
        assert member["books_closed"] is True, (name, member)
        own = json.loads((run_dir / "members" / name / "summary.json").read_text())
        learner = own["services"]["learner-0"]
        assert member["exploited"] == sum(1 for x in lines if x["member"] == name)
        # only its own actors' samples: its books balance on its own producers
        assert own["accounting"]["balanced"], own["accounting"]
        assert all("." not in n for n in own["services"])  # under local names
        assert (run_dir / "members" / name / "metrics.jsonl").stat().st_size > 0
        if name == "m1":  # killed: it resumed from its member's checkpoint, PBT's values kept
            assert own["restarts"] == {"learner-0": 1}
            assert learner["counters"].get("restored_version", -1) >= 5, (learner, out[-3000:])
            hp = learner["hyperparameters"]
            assert hp["lr"] == pytest.approx(member["hyperparameters"]["lr"]), (hp, member)
        else:
            adopted = sum(1 for x in done if x["member"] == name)
            assert learner["counters"].get("pbt/adopted", 0) == adopted
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows and set(rows[-1]["members"]) == {"m0", "m1"}
    assert "pbt:" in out and " m0 " in out and " m1 " in out
