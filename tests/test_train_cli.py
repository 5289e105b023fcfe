"""`tianji train`: bad input fails before any process starts; real runs reach their targets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import tianji.run.train
from tianji.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def train(*args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tianji.cli", "train", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


@pytest.mark.parametrize(
    ("config", "args", "named"),
    [
        ("cartpole_ppo", ["--set", "actors.cuont=2"], "actors.cuont"),
        ("cartpole_ppo", ["--set", "algorithm=dqnn"], "dqnn"),
        ("cartpole_ppo", ["--env", "CartPol-v1"], "CartPole-v1"),
        ("cartpole_dqn", ["--env", "Pendulum-v1"], "Discrete"),
        ("cartpole_ppo", ["--set", "algo.learning_rate=0.1"], "algo.learning_rate"),
        ("cartpole_ppo", ["--set", "transport=carrier-pigeon"], "carrier-pigeon"),
        ("cartpole_ppo", ["--set", 'env.wrappers=["gymnasium.wrappers:Nope"]'], "env.wrappers"),
        ("cartpole_reinforce", ["--set", "learner.count=2"], "gradient_sync"),
    ],
    ids=[
        "unknown-key",
        "unknown-algorithm",
        "unknown-env",
        "unsupported-space",
        "unknown-algo-key",
        "bad-transport",
        "unknown-wrapper",
        "learners-without-gradient-sync",
    ],
)
def test_bad_input_is_refused_before_any_process_starts(
    config: str,
    args: list[str],
    named: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_launch(*_: object) -> None:
        raise AssertionError("a launcher was built for a bad config")

    monkeypatch.setattr(tianji.run.train, "_launcher", no_launch)  # nothing may start
    monkeypatch.setenv("TIANJI_LOG_LEVEL", "WARNING")  # main() sets it for its children
    code = main(["train", str(EXAMPLES / f"{config}.toml"), *args])
    err = capsys.readouterr().err
    assert code == 2, err
    assert named in err


def test_a_missing_config_file_is_named() -> None:
    result = train("no/such/run.toml", timeout=60)
    assert result.returncode == 2 and "no/such/run.toml" in result.stderr


def _summary(tmp_path: Path, *args: str) -> dict[str, object]:
    path = tmp_path / "summary.json"
    result = train(*args, "--summary", str(path))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "env steps" in result.stdout  # progress was shown
    summary: dict[str, object] = json.loads(path.read_text())
    return summary


@pytest.mark.slow
def test_ppo_reaches_475_on_cartpole_with_two_actor_processes(
    ppo_example_run: tuple[Path, str, int],
) -> None:
    parent, output, code = ppo_example_run  # (tests/conftest.py; test_rundir reads it too)
    assert code == 0, output[-3000:]
    assert "env steps" in output  # progress was shown
    s = json.loads((parent / "copy.json").read_text())
    assert s["time_to_target_s"] is not None, s  # the last-20 mean reached 475
    assert s["stop_reason"] == "target_return reached", s
    assert s["env_steps_to_target"] <= s["env_steps"]  # type: ignore[operator]
    assert s["actors"] == 2 and s["learner_updates"] > 0
    lag = s["policy_lag"]
    assert isinstance(lag, dict) and lag["max"] <= 2  # learner.max_policy_lag
    books = s["accounting"]
    assert s["mode"] == "relaxed" and books["balanced"], books  # type: ignore[index]
    # the run drained before it stopped: nothing left on its way, every hop closed
    assert books["drain"]["drained"] and books["in_flight"] == 0, books  # type: ignore[index]
    for hop in books["hops"].values():  # type: ignore[index]
        assert hop["sent"] == hop["received"] and hop["lost_in_transit"] == 0, books


@pytest.mark.slow
def test_impala_reaches_475_on_cartpole_with_the_lag_allowed_to_grow(tmp_path: Path) -> None:
    s = _summary(tmp_path, str(EXAMPLES / "cartpole_impala.toml"), "--target-return", "475")
    assert s["algorithm"] == "impala" and s["stop_reason"] == "target_return reached", s
    lag = s["policy_lag"]
    assert isinstance(lag, dict) and lag["mean"] > 1 and lag["max"] <= 8, lag  # V-trace at work
    assert s["accounting"]["balanced"], s["accounting"]  # type: ignore[index]


@pytest.mark.slow
def test_a_gru_policy_learns_the_masked_cartpole_remotely_and_the_run_stops_on_eval(
    tmp_path: Path,
) -> None:
    # the velocities are hidden: an MLP stays near 45 (`tianji bench memory`); the GRU's
    # state lives in the inference service; an eval worker plays greedy episodes
    s = _summary(
        tmp_path,
        str(EXAMPLES / "masked_cartpole_gru.toml"),
        *("--set", "actors.inference=service", "--set", "eval.workers=1"),
        *("--set", "eval.every_seconds=3", "--set", "eval.episodes=5", "--set", "stop.on=eval"),
        *("--target-return", "450"),
    )
    assert s["stop_reason"] == "target_return reached (eval)", s
    assert s["eval_return"] >= 450 and s["eval_policy_version"] > 0, s  # type: ignore[operator]
    evaluations = s["evaluations"]
    assert isinstance(evaluations, list) and evaluations[-1]["mean"] == s["eval_return"]
    versions = [e["policy_version"] for e in evaluations]
    assert versions == sorted(set(versions))  # one worker: each version once, in order
    played = s["services"]["eval-0"]["counters"]["eval_episodes"]  # type: ignore[index]
    assert played >= 5 * len(evaluations)  # (one may end while the run stops)
    assert s["accounting"]["balanced"], s["accounting"]  # type: ignore[index]


@pytest.mark.slow
def test_dqn_reaches_200_on_cartpole_with_two_actor_processes(tmp_path: Path) -> None:
    # 300 (the example's target) is reached on three hosts in tests/test_deploy_hosts.py
    s = _summary(tmp_path, str(EXAMPLES / "cartpole_dqn.toml"), "--target-return", "200")
    assert s["time_to_target_s"] is not None, s
    assert s["samples_consumed"] > 0 and s["env_steps_to_target"] is not None


@pytest.mark.slow
def test_the_custom_example_algorithm_trains_through_the_cli(tmp_path: Path) -> None:
    s = _summary(tmp_path, str(EXAMPLES / "cartpole_reinforce.toml"))
    assert s["algorithm"] == "examples/reinforce.py:Reinforce"
    assert s["time_to_target_s"] is not None, s


@pytest.mark.slow
def test_inproc_transport_runs_every_service_in_one_process(tmp_path: Path) -> None:
    s = _summary(
        tmp_path,
        str(EXAMPLES / "cartpole_ppo.toml"),
        "--transport",
        "inproc",
        "--max-env-steps",
        "20000",
        "--set",
        "stop.target_return=1000",
    )
    assert s["transport"] == "inproc" and s["env_steps"] >= 20000
    assert s["samples_produced"] >= s["samples_consumed"]  # type: ignore[operator]


@pytest.mark.slow
def test_a_users_own_env_class_trains_without_registration(tmp_path: Path) -> None:
    s = _summary(
        tmp_path,
        str(EXAMPLES / "cartpole_ppo.toml"),
        "--env",
        "examples/custom_env.py:GuessTheSign",
        "--target-return",
        "90",
        "--max-seconds",
        "150",
    )
    assert s["env_id"] == "examples/custom_env.py:GuessTheSign"
    assert s["time_to_target_s"] is not None, s


@pytest.mark.slow
def test_a_batched_inference_service_can_act_for_all_actors(tmp_path: Path) -> None:
    s = _summary(
        tmp_path,
        str(EXAMPLES / "cartpole_ppo.toml"),
        "--set",
        'actors.inference="service"',
        "--max-env-steps",
        "30000",
        "--set",
        "stop.target_return=1000",
    )
    assert s["env_steps"] >= 30000 and s["learner_updates"] > 0
