"""`tianji bench lag`: its runs are the examples' with only the lag changed, its summary
counts a missed target as slower than any hit."""

from __future__ import annotations

from pathlib import Path

import pytest

from tianji.bench.lag import lag_config, summarize
from tianji.rl.config import RunConfig, build_dataclass, to_dict
from tianji.run.config import load_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("algo", ["ppo", "impala"])
def test_at_the_examples_lag_the_runs_are_the_examples(algo: str) -> None:
    example = to_dict(load_config(ROOT / "examples" / f"cartpole_{algo}.toml"))
    lag = example["controller"]["lag_target"]
    data = lag_config(algo, lag, 0, 300.0)
    data["learner"]["max_policy_lag"] = example["learner"]["max_policy_lag"]
    bench: RunConfig = build_dataclass(RunConfig, data, "")
    assert to_dict(bench) == example


def test_appo_is_ppo_with_vtrace_and_the_lag_bounds_follow_the_target() -> None:
    ppo, appo = lag_config("ppo", 8, 2, 60.0), lag_config("appo", 8, 2, 60.0)
    assert appo["algo"] == {**ppo["algo"], "vtrace": True}
    assert appo["controller"]["lag_target"] == 8 and appo["learner"]["max_policy_lag"] == 9
    assert appo["seed"] == 2 and appo["stop"]["max_seconds"] == 60.0
    with pytest.raises(ValueError, match="sac"):
        lag_config("sac", 1, 0, 60.0)


def test_a_missed_target_counts_as_slower_than_any_hit() -> None:
    rows = [
        {"algorithm": "appo", "lag_target": 1, "seed": s, "launch_to_target_s": t,
         "policy_lag_mean": 1.0}
        for s, t in enumerate([10.0, 12.0, 11.0])
    ] + [
        {"algorithm": "appo", "lag_target": 8, "seed": s, "launch_to_target_s": t,
         "policy_lag_mean": 5.0}
        for s, t in enumerate([13.0, None, None])
    ]  # fmt: skip
    one, eight = summarize(rows)
    assert one["reached"] == 3 and one["time_to_target_median_s"] == 11.0
    assert eight["reached"] == 1 and eight["time_to_target_median_s"] is None
    assert eight["vs_smallest_lag"] is None and eight["policy_lag_mean"] == 5.0
