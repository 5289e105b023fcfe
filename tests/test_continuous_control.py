"""Continuous control: SAC and TD3 for bounded Box actions, the update-to-data ratio in the
algorithm's units, the random warm-up, and both learning Pendulum through the CLI."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from tianji import algorithms
from tianji.rl.algorithm import BufferSpec
from tianji.rl.config import RunConfig, build_dataclass
from tianji.rl.envs import uniform_actions
from tianji.rl.run_balance import balance_config, publish_every
from tianji.runtime.errors import ConfigError
from tianji.services.common import make_algorithm

ROOT = Path(__file__).resolve().parents[1]


def box(low: list[float], high: list[float]) -> gym.spaces.Box:
    return gym.spaces.Box(np.array(low, np.float32), np.array(high, np.float32))


@pytest.mark.parametrize("name", ["sac", "td3"])
def test_actions_fill_the_box_and_map_back_to_the_unit_cube(name: str) -> None:
    cls = algorithms.get(name)
    action_space = box([-2.0, 0.0, 10.0], [2.0, 1.0, 30.0])
    obs_space = gym.spaces.Box(-np.inf, np.inf, (5,), np.float32)
    algo = cls(cls.Config(hidden=[16]), obs_space, action_space, seed=0, device="cpu")
    obs = np.random.default_rng(0).standard_normal((4096, 5)).astype(np.float32) * 3
    for explore in (True, False):
        action = algo.act(obs, explore=explore)["action"]
        assert action.dtype == np.float32 and action.shape == (4096, 3)
        assert np.all(action >= action_space.low) and np.all(action <= action_space.high)
    unit = algo.scale.to_unit(action)
    assert torch.allclose(torch.as_tensor(algo.scale.to_env(unit)), torch.as_tensor(action))
    corners = algo.scale.to_env(torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]]))
    assert np.allclose(corners, [action_space.low, action_space.high])


def test_the_squashed_log_prob_is_the_tanh_transformed_gaussian_density() -> None:
    from tianji.algorithms.sac import squashed_log_prob

    torch.manual_seed(0)
    mean, log_std = torch.randn(64, 3), torch.randn(64, 3) * 0.5
    # (|z| < 2.5: torch's TanhTransform inverts tanh, which loses float32 precision near ±1)
    z = (mean + log_std.exp() * torch.randn(64, 3)).clamp(-2.5, 2.5)
    base = torch.distributions.Normal(mean, log_std.exp())
    squashed = torch.distributions.TransformedDistribution(
        base, [torch.distributions.transforms.TanhTransform()]
    )
    expected = squashed.log_prob(torch.tanh(z)).sum(dim=1)
    assert torch.allclose(squashed_log_prob(z, mean, log_std), expected, atol=1e-4)
    far = torch.full((1, 3), 30.0)  # tanh saturates: still finite
    assert torch.isfinite(squashed_log_prob(far, torch.zeros(1, 3), torch.zeros(1, 3))).all()


def replay_batch(n: int = 128) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {
        "obs": rng.standard_normal((n, 3)).astype(np.float32),
        "action": rng.uniform(-2, 2, (n, 1)).astype(np.float32),
        "reward": rng.standard_normal(n).astype(np.float32),
        "discount": np.full(n, 0.99, np.float32),
        "next_obs": rng.standard_normal((n, 3)).astype(np.float32),
    }


def test_td3_moves_its_actor_and_targets_only_every_policy_delay_updates() -> None:
    cls, env = algorithms.get("td3"), gym.make("Pendulum-v1")
    algo = cls(cls.Config(policy_delay=3), env.observation_space, env.action_space, seed=0)
    batch = replay_batch()
    before = algo.get_weights()
    target_before = {k: v.clone() for k, v in algo.critic_target.state_dict().items()}
    algo.update(batch)
    algo.update(batch)
    assert all(np.array_equal(before[k], v) for k, v in algo.get_weights().items())
    assert all(torch.equal(target_before[k], v) for k, v in algo.critic_target.state_dict().items())
    algo.update(batch)
    assert any(not np.array_equal(before[k], v) for k, v in algo.get_weights().items())
    assert algo.version == 3


def test_sac_learns_its_temperature_toward_the_target_entropy() -> None:
    cls, env = algorithms.get("sac"), gym.make("Pendulum-v1")
    algo = cls(cls.Config(lr=1e-2), env.observation_space, env.action_space, seed=0)
    batch = replay_batch()
    metrics = [algo.update(batch).metrics for _ in range(30)]
    # the policy's entropy starts above the target (-1 for one dimension): alpha falls
    assert metrics[0]["entropy"] > -1.0 and metrics[-1]["alpha"] < metrics[0]["alpha"]


@pytest.mark.parametrize("name", ["sac", "td3"])
def test_discrete_and_unbounded_action_spaces_are_refused_naming_the_space(name: str) -> None:
    cls = algorithms.get(name)
    obs = gym.spaces.Box(-1, 1, (3,), np.float32)
    problem = cls.check_spaces(obs, gym.spaces.Discrete(2))
    assert problem is not None and "Discrete(2)" in problem and "Box" in problem
    unbounded = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    assert "bounded" in (cls.check_spaces(obs, unbounded) or "")


def test_an_env_no_algorithm_of_the_run_takes_is_refused_naming_those_that_do() -> None:
    run = build_dataclass(RunConfig, {"algorithm": "dqn", "env": {"id": "Pendulum-v1"}}, "")
    with pytest.raises(ConfigError, match="Box") as info:
        make_algorithm(run, seed=0, device="cpu")
    assert "sac" in str(info.value) and "td3" in str(info.value) and "ppo" in str(info.value)


def test_uniform_actions_cover_the_space_and_an_unbounded_box_is_named() -> None:
    rng = np.random.default_rng(0)
    space = box([-2.0, 5.0], [2.0, 6.0])
    a = uniform_actions(space, 10_000, rng)
    assert a.dtype == np.float32 and a.shape == (10_000, 2) and space.contains(a[0])
    assert np.all(a >= space.low) and np.all(a <= space.high)
    assert np.allclose(a.mean(axis=0), [0.0, 5.5], atol=0.05)
    d = uniform_actions(gym.spaces.Discrete(3, start=1), 3000, rng)
    assert set(np.unique(d)) == {1, 2, 3}
    with pytest.raises(ConfigError, match="bounded Box"):
        uniform_actions(gym.spaces.Box(-np.inf, np.inf, (1,), np.float32), 1, rng)


def run_config(**sections: dict[str, object]) -> RunConfig:
    data = {"algorithm": "sac", "env": {"id": "Pendulum-v1"}, **sections}
    return build_dataclass(RunConfig, data, "")  # type: ignore[no-any-return]


def test_the_replay_ratio_is_the_algorithms_updates_per_step_in_samples() -> None:
    spec = BufferSpec(kind="replay", capacity=1000, batch_size=256, min_size=100,
                      updates_per_step=0.5)  # fmt: skip
    run = run_config(actors={"count": 2, "envs_per_actor": 1, "fragment_length": 16})
    balance = balance_config(run, spec)
    assert balance.replay_ratio == 128.0 and balance.tolerance == 32.0
    assert publish_every(run, spec) == 8  # one fragment's worth of updates
    override = balance_config(run_config(controller={"replay_ratio": 16.0}), spec)
    assert override.replay_ratio == 16.0  # [controller] replay_ratio still overrides
    undeclared = dataclasses.replace(spec, updates_per_step=None)
    with pytest.raises(ConfigError, match="updates_per_step"):
        balance_config(run, undeclared)


def train(tmp_path: Path, example: str, *args: str) -> dict:
    summary = tmp_path / "summary.json"
    command = [sys.executable, "-m", "tianji.cli", "train", f"examples/{example}.toml",
               "--summary", str(summary), "--no-dashboard", *args]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=400, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(summary.read_text())  # type: ignore[no-any-return]


@pytest.mark.slow
@pytest.mark.parametrize("example", ["pendulum_sac", "pendulum_td3"])
def test_sac_and_td3_learn_pendulum_at_one_update_per_env_step(
    tmp_path: Path, example: str
) -> None:
    s = train(tmp_path, example, "--max-seconds", "150")
    assert s["stop_reason"] == "target_return reached", s["final_return"]
    assert s["final_return"] >= -200 and s["accounting"]["balanced"], s["accounting"]
    actors = [v for k, v in s["services"].items() if v["role"] == "actor"]
    # the random warm-up: 1000 env steps split over the 2 actors, exactly
    assert sum(a["counters"].get("random_steps", 0) for a in actors) == 1000
    # one update per env step after the warm-up of 1000 (learning_starts), within the band,
    # reported as such; the samples' age is an age, not an on-policy lag
    ratio = s["learner_updates"] / (s["env_steps"] - 1000)
    assert 0.8 <= ratio <= 1.05, (s["learner_updates"], s["env_steps"])
    assert s["updates_per_env_step"] == pytest.approx(ratio, abs=0.01)
    assert s["policy_lag"] is None and s["sample_age"]["mean"] > 0


TORSO = "examples/custom_torso.py:LayerNormMLP"


@pytest.mark.parametrize("name", ["ppo", "dqn"])
def test_an_in_tree_algorithm_takes_a_custom_torso_by_name(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # the file path is relative to where tianji runs
    cls, env = algorithms.get(name), gym.make("CartPole-v1")
    algo = cls(cls.Config(torso=TORSO), env.observation_space, env.action_space, seed=0)
    net = algo.net if name == "ppo" else algo.q
    modules = {type(m).__name__ for m in net.modules()}
    assert "LayerNormMLP" in modules and "LayerNorm" in modules
    out = algo.act(np.zeros((3, 4), np.float32), explore=False)["action"]
    assert out.shape == (3,)


@pytest.mark.parametrize(
    ("torso", "match"),
    [("examples/custom_torso.py:Nope", "Nope"), ("builtins:repr", "features")],
)
def test_a_torso_that_cannot_be_built_is_named(
    torso: str, match: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    cls, env = algorithms.get("ppo"), gym.make("CartPole-v1")
    with pytest.raises(ConfigError, match=match) as info:
        cls(cls.Config(torso=torso), env.observation_space, env.action_space, seed=0)
    assert "torso" in str(info.value)


def test_a_mujoco_id_without_mujoco_installed_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib

    from tianji.rl.config import EnvConfig
    from tianji.rl.envs import env_factory

    real = importlib.import_module

    def no_mujoco(name: str, *args: object) -> object:
        if name == "mujoco":
            raise ImportError("No module named 'mujoco'")
        return real(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib, "import_module", no_mujoco)
    for env in (EnvConfig(id="Hopper-v5"), EnvConfig(id="Hopper-v5", preset="mujoco")):
        with pytest.raises(ConfigError, match=r"tianji\[mujoco\]") as info:
            env_factory(env)
        assert "Hopper-v5" in str(info.value)
    with pytest.raises(ConfigError, match="HalfCheetah-v5"):  # a close MuJoCo id is named
        env_factory(EnvConfig(id="HalfCheeta-v5", preset="mujoco"))


@pytest.mark.slow
def test_a_mujoco_example_runs_from_a_fresh_setup(tmp_path: Path) -> None:
    # (both MuJoCo examples build their algorithm on their env in tests/test_examples.py;
    # one runs here, shortened, to keep the suite's time)
    pytest.importorskip("mujoco")
    s = train(tmp_path, "hopper_td3", "--max-seconds", "10", "--set", "algo.learning_starts=400",
              "--set", "algo.random_steps=400", "--set", "algo.hidden=[32, 32]")  # fmt: skip
    assert s["env_steps"] >= 400 and s["learner_updates"] > 0, s["env_steps"]
    assert s["accounting"]["balanced"], s["accounting"]
    assert s["env_id"] == "Hopper-v5" and s["updates_per_env_step"] is not None
