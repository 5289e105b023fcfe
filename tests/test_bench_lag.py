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


def test_on_acrobot_the_runs_are_the_cartpole_runs_with_the_env_and_target_changed() -> None:
    cartpole = lag_config("appo", 4, 1, 90.0, 100.0)
    acrobot = lag_config("appo", 4, 1, 90.0, 100.0, env="acrobot")
    assert acrobot["env"] == {**cartpole["env"], "id": "Acrobot-v1"}
    assert acrobot["stop"] == {"target_return": -80.0, "max_seconds": 90.0}
    rest = {k: v for k, v in acrobot.items() if k not in ("env", "stop")}
    assert rest == {k: v for k, v in cartpole.items() if k not in ("env", "stop")}
    with pytest.raises(KeyError):
        lag_config("ppo", 1, 0, 60.0, env="pong")


def test_the_summary_keeps_each_env_apart() -> None:
    rows = [
        {"env": env, "algorithm": "ppo", "lag_target": lag, "seed": 0,
         "launch_to_target_s": t, "policy_lag_mean": float(lag)}
        for env, lag, t in [("cartpole", 1, 10.0), ("cartpole", 8, 20.0),
                            ("acrobot", 1, 5.0), ("acrobot", 8, 6.0)]
    ]  # fmt: skip
    cells = {(c["env"], c["lag_target"]): c for c in summarize(rows)}
    assert cells["cartpole", 8]["vs_smallest_lag"] == 2.0
    assert cells["acrobot", 8]["vs_smallest_lag"] == 1.2


def test_appo_learner_differs_from_appo_in_the_ratio_reference_only() -> None:
    appo, learner = lag_config("appo", 4, 0, 60.0), lag_config("appo-learner", 4, 0, 60.0)
    assert learner["algo"] == {**appo["algo"], "vtrace_reference": "learner"}
