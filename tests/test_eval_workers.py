"""Evaluation workers (``[eval]``): episodes played to their ends from fixed seeds, evaluations
due by time or by versions (never one version twice), the monitor reporting them and
stopping a run on them (``[stop] on = "eval"``), bad settings refused by name."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from tianji.rl.config import EnvConfig, EvalConfig, RunConfig, StopConfig, to_dict
from tianji.rl.envs import env_factory
from tianji.rl.events import EpisodesFinished, ParamsPublished, PolicyEvaluated
from tianji.run.plan import build_specs
from tianji.run.progress import metrics_row, plain_line, scalars, take_snapshot
from tianji.runtime.controller import Controller
from tianji.runtime.errors import ConfigError
from tianji.services.evaluator import EvalService, play_episodes
from tianji.services.monitor import TrainMonitor


class PushRight:
    """Always action 1 (CartPole falls in ~10 steps); counts its calls."""

    recurrent = False

    def __init__(self) -> None:
        self.calls = 0

    def act(self, obs: np.ndarray, *, explore: bool) -> dict[str, np.ndarray]:
        self.calls += 1
        return {"action": np.ones(len(obs), np.int64)}


def cartpoles(n: int) -> SyncVectorEnv:
    factory = env_factory(EnvConfig(id="CartPole-v1"), training=False)
    return SyncVectorEnv([factory] * n, autoreset_mode=AutoresetMode.NEXT_STEP)


def test_each_env_plays_one_whole_episode_from_its_seed() -> None:
    envs = cartpoles(3)
    algo = PushRight()
    returns, lengths = asyncio.run(play_episodes(algo, envs, [1, 2, 3], explore=False))
    np.testing.assert_array_equal(returns, lengths)  # CartPole: reward 1 per step
    assert lengths.min() >= 8 and algo.calls == lengths.max()  # until the longest one ended
    again, _ = asyncio.run(play_episodes(PushRight(), envs, [1, 2, 3], explore=False))
    np.testing.assert_array_equal(returns, again)
    envs.close()


def run_config(**eval_settings: Any) -> dict[str, Any]:
    data = to_dict(RunConfig(algorithm="ppo", transport="inproc", run_dir=""))
    data["eval"].update(workers=2, **eval_settings)
    return data


def params(version: int) -> ParamsPublished:
    return ParamsPublished(policy_version=version, weights={})


def test_an_evaluation_is_due_by_time_or_versions_and_never_twice_for_a_version() -> None:
    worker = EvalService("eval-0", config=run_config(every_seconds=5.0, every_versions=3))
    now = time.monotonic()
    assert not worker._due(now - 100)  # no weights yet
    asyncio.run(worker.on_params(params(1)))
    assert worker._due(now - 6) and not worker._due(now)  # by time
    worker.evaluated = 1
    assert not worker._due(now - 100)  # version 1 again: never
    asyncio.run(worker.on_params(params(3)))
    assert not worker._due(now) and worker._due(now - 6)
    asyncio.run(worker.on_params(params(4)))
    assert worker._due(now)  # 3 versions past the last evaluated
    assert worker._wait_s(now) == pytest.approx(5.0, abs=0.1)
    worker.evaluated = 4
    assert worker._wait_s(now) is None  # nothing newer: wait for weights


def test_the_eval_env_takes_the_overrides_and_keeps_the_rest() -> None:
    train = EnvConfig(id="CartPole-v1", kwargs={"sutton_barto_reward": True}, wrappers=("a:b",))
    assert EvalConfig().env(train) == train
    other = EvalConfig(env_id="tianji.rl.envs:MaskedCartPole", env_kwargs={"render_mode": None})
    env = other.env(train)
    assert (env.id, env.kwargs, env.wrappers) == (
        "tianji.rl.envs:MaskedCartPole", {"render_mode": None}, ("a:b",),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("key", "value"),
    [("workers", -1), ("episodes", 0), ("every_seconds", -1.0), ("every_versions", -2)],
)
def test_bad_eval_settings_are_refused_by_name(key: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=f"eval.{key}"):
        EvalConfig(**{key: value})


def test_an_eval_worker_needs_a_schedule_and_a_stop_on_eval_needs_workers() -> None:
    with pytest.raises(ConfigError, match=r"eval\.every_seconds"):
        EvalConfig(workers=1, every_seconds=0, every_versions=0)
    with pytest.raises(ConfigError, match=r"stop\.on"):
        RunConfig(stop=StopConfig(on="eval"), run_dir="")
    with pytest.raises(ConfigError, match=r"stop\.on"):
        StopConfig(on="test")


def test_the_plan_starts_the_eval_workers_as_services() -> None:
    config = RunConfig(eval=EvalConfig(workers=2), run_dir="")
    specs = [s for s in build_specs(config, {}) if s.role == "eval"]
    assert [s.name for s in specs] == ["eval-0", "eval-1"]
    assert [s.options["index"] for s in specs] == [0, 1]


def evaluated(version: int, *returns: float) -> PolicyEvaluated:
    return PolicyEvaluated(
        worker="eval-0",
        policy_version=version,
        returns=np.array(returns),
        lengths=np.array([int(r) for r in returns], np.int64),
    )


def test_a_run_stops_on_the_evaluation_return_when_told_to() -> None:
    monitor = TrainMonitor("monitor", stop=StopConfig(target_return=400.0, window=2, on="eval"))
    asyncio.run(monitor.on_evaluation(evaluated(3, 100.0, 200.0)))
    assert monitor.done() is None and monitor.eval_return() == 150.0
    asyncio.run(monitor.on_evaluation(evaluated(9, 450.0, 410.0)))
    assert monitor.done() == "target_return reached (eval)"
    assert monitor.eval_policy_version() == 9
    assert [e["policy_version"] for e in monitor.evaluations] == [3, 9]


def test_training_returns_do_not_stop_a_run_that_stops_on_eval_and_the_reverse() -> None:
    on_eval = TrainMonitor("m1", stop=StopConfig(target_return=10.0, window=2, on="eval"))
    on_train = TrainMonitor("m2", stop=StopConfig(target_return=10.0, window=2))
    ev = EpisodesFinished(
        actor="actor-0",
        policy_version=1,
        returns=np.array([50.0, 60.0]),
        lengths=np.array([50, 60], np.int64),
        env_steps=110,
    )
    asyncio.run(on_eval.on_episodes(ev))
    asyncio.run(on_train.on_evaluation(evaluated(1, 99.0)))
    assert on_eval.done() is None and on_train.done() is None
    asyncio.run(on_train.on_episodes(ev))
    assert on_train.done() == "target_return reached"


def test_the_progress_line_metrics_and_tensorboard_show_the_newest_evaluation() -> None:
    monitor = TrainMonitor("monitor", stop=StopConfig())
    controller = Controller()
    before = take_snapshot(controller, monitor, 1.0)
    assert metrics_row(before)["eval_return"] is None and "eval" not in plain_line(before)
    asyncio.run(monitor.on_evaluation(evaluated(7, 480.0, 500.0)))
    snap = take_snapshot(controller, monitor, 2.0)
    row = metrics_row(snap)
    assert (row["eval_return"], row["eval_policy_version"]) == (490.0, 7)
    assert "eval   490.0 (v7)" in plain_line(snap)
    assert scalars(snap)["eval/return"] == 490.0
