"""`tianji bench train`: its configs are the examples', its figures come from the runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tianji.bench.train import Plan, parse_counts, parse_seeds, run_config
from tianji.bench.train_report import aggregate, markdown, waste_and_waits
from tianji.rl.config import RunConfig, build_dataclass, to_dict
from tianji.run.config import load_config
from tianji.runtime.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("algo", "example_env"),
    [("ppo", "cartpole"), ("dqn", "cartpole"), ("sac", "pendulum"), ("td3", "pendulum")],
)
def test_the_benchmark_runs_the_example_configs(algo: str, example_env: str) -> None:
    example = to_dict(load_config(ROOT / "examples" / f"{example_env}_{algo}.toml"))
    bench: RunConfig = build_dataclass(RunConfig, run_config(algo, "relaxed", 0, 300.0), "")
    assert to_dict(bench) == example


def test_sync_ppo_gets_a_batch_of_one_fragment_per_actor() -> None:
    data = run_config("ppo", "sync", 1, 60.0)
    assert data["controller"]["mode"] == "sync" and data["seed"] == 1
    assert data["algo"]["fragments_per_batch"] == data["actors"]["count"]
    assert data["stop"] == {"target_return": 475.0, "max_seconds": 60.0}


def test_runs_are_interleaved_and_rotate_the_system_order() -> None:
    runs = Plan(("ppo",), ("relaxed", "sync", "sb3"), (0, 1), 60.0).runs()
    assert runs == [
        (0, "ppo", "relaxed", None),
        (0, "ppo", "sync", None),
        (0, "ppo", "sb3", None),
        (1, "ppo", "sync", None),
        (1, "ppo", "sb3", None),
        (1, "ppo", "relaxed", None),
    ]
    scaled = Plan(("ppo",), ("relaxed",), (0,), 60.0, actors=(1, 8)).runs()
    assert scaled == [(0, "ppo", "relaxed", 1), (0, "ppo", "relaxed", 8)]


def test_actor_counts_and_a_slow_env_change_only_what_they_name() -> None:
    base = run_config("ppo", "relaxed", 0, 60.0)
    eight = run_config("ppo", "relaxed", 0, 60.0, actors=8, env_step_ms=2.0)
    assert eight["actors"]["count"] == 8
    assert eight["env"] == {
        "id": "tianji.bench.envs:DelayedEnv",
        "kwargs": {"env_id": "CartPole-v1", "step_ms": 2.0},
    }
    assert {k: v for k, v in eight.items() if k not in ("actors", "env")} == {
        k: v for k, v in base.items() if k not in ("actors", "env")
    }
    sync = run_config("ppo", "sync", 0, 60.0, actors=8)
    assert sync["algo"]["fragments_per_batch"] == 8 and sync["algo"]["buffer_capacity"] >= 16
    build_dataclass(RunConfig, eight, "")  # a valid run config


def test_seed_and_actor_lists_parse_or_name_the_bad_text() -> None:
    assert parse_seeds("3") == (0, 1, 2) and parse_seeds("3-5") == (3, 4, 5)
    assert parse_seeds("0,4") == (0, 4)
    assert parse_counts("--actors", "") == (None,)
    assert parse_counts("--actors", "1,2,32") == (1, 2, 32)
    with pytest.raises(ConfigError, match="x"):
        parse_seeds("x")
    with pytest.raises(ConfigError, match="--actors"):
        parse_counts("--actors", "0,2")


def test_a_delayed_env_takes_its_time_and_refuses_a_bad_delay() -> None:
    import time

    from tianji.bench.envs import DelayedEnv

    env = DelayedEnv("CartPole-v1", step_ms=20.0)
    env.reset(seed=0)
    started = time.perf_counter()
    env.step(0)
    assert time.perf_counter() - started >= 0.02
    with pytest.raises(ConfigError, match="step_ms"):
        DelayedEnv("CartPole-v1", step_ms=0)


def test_waste_and_waits_come_from_the_run_summary() -> None:
    summary = {
        "accounting": {"produced": 1000, "dropped": {"stale": 10, "evicted": 5}},
        "controller": {
            "pause_s": {"actor-0": 1.0, "actor-1": 3.0},
            "learner_idle_s": 0.5,
            "learner_wait_s": 0.25,
            "learner_update_s": 9.0,
        },
    }
    assert waste_and_waits(summary) == {
        "stale_pct": 1.0,
        "evicted_pct": 0.5,
        "actor_pause_s": 2.0,
        "learner_idle_s": 0.75,  # no batch, or no grant
        "learner_update_s": 9.0,
    }


def _run(system: str, seed: int, t: float | None, rate: float) -> dict:
    return {
        "system": system,
        "algorithm": "ppo",
        "seed": seed,
        "launch_to_target_s": t,
        "env_steps_to_target": 1000 * seed + 500 if t else None,
        "env_steps_per_s_running": rate,
        "final_return": 480.0,
    }


def test_medians_count_a_missed_target_as_slower_than_any_hit_and_ratios_follow() -> None:
    results = [
        _run("relaxed", 0, 10.0, 3000),
        _run("relaxed", 1, 12.0, 3300),
        _run("relaxed", 2, None, 2900),
        _run("sync", 0, 20.0, 2000),
        _run("sync", 1, None, 2100),
        _run("sync", 2, None, 1900),
        _run("sb3", 0, 30.0, 1400),
    ]
    agg = aggregate(results, 60.0)
    relaxed, sync = agg["cells"]["ppo/relaxed"], agg["cells"]["ppo/sync"]
    assert relaxed["reached"] == 2 and relaxed["time_to_target_median_s"] == 12.0
    assert relaxed["time_to_target_range_s"] == [10.0, 12.0]
    assert sync["time_to_target_median_s"] is None  # most runs missed: no median
    ratios = agg["ratios"]["ppo"]
    assert ratios["time_relaxed_over_sb3"] == pytest.approx(0.4)
    assert ratios["time_relaxed_over_sync"] is None
    assert ratios["steps_per_s_relaxed_over_sync"] == pytest.approx(3000 / 2000)
    table = markdown(
        {
            "aggregate": agg,
            "machine": {
                "cpus": 2,
                "cpu": "x",
                "python": "3.11",
                "torch": "2",
                "stable_baselines3": "2",
            },
            "seeds": [0, 1, 2],
            "command": "tianji bench train",
        }
    )
    assert "| ppo | relaxed | — | 2/3 | 12.0 (10.0-12.0)" in table and "| ppo | 0.40 |" in table


def test_unknown_systems_are_refused_with_the_known_ones() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tianji.cli", "bench", "train", "--systems", "rllib"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "rllib" in result.stderr and "sb3" in result.stderr


@pytest.mark.slow
def test_a_tianji_benchmark_run_reports_its_figures(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tianji.cli",
            "bench",
            "train",
            "--algos",
            "ppo",
            "--systems",
            "relaxed",
            "--seeds",
            "1",
            "--max-seconds",
            "15",
            "--json",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=200,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[1/1] ppo relaxed seed 0" in result.stderr  # progress
    report = json.loads(result.stdout)
    (run,) = report["runs"]
    assert run["env_steps"] > 0 and run["env_steps_per_s_running"] > 0
    assert run["controller"]["mode"] == "relaxed"
    assert (tmp_path / "train.md").read_text().startswith("| algorithm | system |")
    assert json.loads((tmp_path / "train.json").read_text())["runs"] == report["runs"]


def test_several_actor_counts_get_a_cell_and_a_ratio_each() -> None:
    results = [
        {**_run(system, 0, t, 1000), "actors": n, "stale_pct": 0.0, "evicted_pct": 0.0}
        for n, system, t in [(1, "relaxed", 20.0), (1, "sync", 30.0), (8, "relaxed", 10.0)]
    ]
    results[2]["stale_pct"] = 1.5
    agg = aggregate(results, 60.0)
    assert set(agg["cells"]) == {"ppo/relaxed/1", "ppo/sync/1", "ppo/relaxed/8"}
    assert agg["cells"]["ppo/relaxed/8"]["stale_pct"] == 1.5
    assert agg["ratios"]["ppo/1"]["time_relaxed_over_sync"] == round(20 / 30, 3)
    assert agg["ratios"]["ppo/8"]["time_relaxed_over_sync"] is None
    machine = {"cpus": 2, "cpu": "x", "python": "3.11", "torch": "2", "stable_baselines3": None}
    table = markdown({"aggregate": agg, "machine": machine, "seeds": [0], "command": "c"})
    assert "| ppo | relaxed | 8 | 1/1 | 10.0 (10.0-10.0)" in table
    assert "| ppo | relaxed | 8 | 1.50 | 0.00 |" in table


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_update_ms_runs_the_delayed_algorithm_whose_updates_wait(algo: str) -> None:
    import time

    import numpy as np

    from tianji.services.common import make_algorithm

    data = run_config(algo, "relaxed", 0, 10.0, update_ms=60.0)
    assert data["algorithm"].startswith("tianji.bench.algos:Delayed")
    config: RunConfig = build_dataclass(RunConfig, data, "")
    algorithm = make_algorithm(config, seed=0, device="cpu")
    assert algorithm.config.update_ms == 60.0
    rng = np.random.default_rng(0)
    fragment = {
        "obs": rng.standard_normal((16, 4, 4), dtype=np.float32),
        "next_obs": rng.standard_normal((16, 4, 4), dtype=np.float32),
        "action": rng.integers(0, 2, (16, 4)),
        "reward": np.ones((16, 4), np.float32),
        "terminated": np.zeros((16, 4), bool),
        "truncated": np.zeros((16, 4), bool),
    }
    extras = algorithm.act(fragment["obs"].reshape(-1, 4), explore=True)  # e.g. log-probs
    fragment |= {k: v.reshape(16, 4, *v.shape[1:]) for k, v in extras.items() if k != "action"}
    batch = algorithm.postprocess(fragment)
    if algo == "dqn":
        batch = {k: v[:32] for k, v in batch.items()} | {"weight": np.ones(32, np.float32)}
    started = time.perf_counter()
    algorithm.update(batch)
    assert time.perf_counter() - started >= 0.06  # the wait comes on top of the math


def test_a_negative_update_delay_is_refused_naming_it() -> None:
    data = run_config("ppo", "relaxed", 0, 10.0, update_ms=1.0)
    data["algo"]["update_ms"] = -5
    config: RunConfig = build_dataclass(RunConfig, data, "")
    from tianji.services.common import make_algorithm

    with pytest.raises(ConfigError, match=r"algo\.update_ms"):
        make_algorithm(config, seed=0, device="cpu")


def test_the_checkout_s_peers_script_adds_sb3_beside_tianji_s_systems() -> None:
    from peers import build_parser, sb3_command

    args = build_parser().parse_args(["train", "--quick"])
    assert args.systems.split(",") == ["relaxed", "sync", "unbalanced", "sb3"]
    cmd = sb3_command("ppo", 3, 475.0, 40.0)
    assert Path(cmd[1]) == ROOT / "benchmarks" / "sb3.py" and Path(cmd[1]).is_file()
    assert cmd[2:] == ["ppo", "--seed", "3", "--target-return", "475.0", "--max-seconds", "40.0"]
