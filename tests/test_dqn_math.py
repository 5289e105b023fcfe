"""DQN's math against hand-computed values: n-step transitions, double-DQN target, epsilon."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from tianji.algorithms._replay import epsilon_at, n_step_transitions
from tianji.algorithms.dqn import DQN, double_dqn_target

from tianji.rl.algorithm import Algorithm
from tianji.runtime.errors import ConfigError

CARTPOLE = gym.make("CartPole-v1")


def fragment() -> dict[str, np.ndarray]:
    """T=5, N=2. Env 0 terminates at t=1 and is truncated at t=3; env 1 terminates at t=4."""
    horizon, width = 5, 2
    t, i = np.meshgrid(np.arange(horizon), np.arange(width), indexing="ij")
    terminated = np.zeros((horizon, width), bool)
    truncated = np.zeros((horizon, width), bool)
    terminated[1, 0] = truncated[3, 0] = terminated[4, 1] = True
    return {
        "obs": (100 + 10 * t + i)[..., None].astype(np.float64),
        "action": (t + i) % 2,
        "reward": np.stack([np.arange(1.0, 6.0), np.ones(5)], axis=1),
        "terminated": terminated,
        "truncated": truncated,
        "next_obs": (10 * t + i)[..., None].astype(np.float64),
    }


def test_n_step_transitions_cut_at_episode_and_fragment_ends() -> None:
    out = n_step_transitions(fragment(), n=3, gamma=0.5)
    # Rows are t*N + i. Per (t, i): k-step reward sum, next_obs = next_obs[t+k-1], discount.
    expected = {
        (0, 0): (1 + 0.5 * 2, 10, 0.0),  # k=2, terminated at t=1
        (1, 0): (2, 10, 0.0),  # k=1, terminated
        (2, 0): (3 + 0.5 * 4, 30, 0.25),  # k=2, truncated at t=3: bootstraps
        (3, 0): (4, 30, 0.5),  # k=1, truncated
        (4, 0): (5, 40, 0.5),  # k=1, fragment end
        (0, 1): (1.75, 21, 0.125),  # k=3, full window
        (1, 1): (1.75, 31, 0.125),
        (2, 1): (1.75, 41, 0.0),  # k=3, terminated at the window's last step
        (3, 1): (1.5, 41, 0.0),  # k=2: fragment end and termination
        (4, 1): (1.0, 41, 0.0),
    }
    for (t, i), (reward, next_obs, discount) in expected.items():
        row = 2 * t + i
        assert out["reward"][row] == pytest.approx(reward), (t, i)
        assert out["next_obs"][row, 0] == next_obs, (t, i)
        assert out["discount"][row] == pytest.approx(discount), (t, i)
        assert out["obs"][row, 0] == 100 + 10 * t + i
        assert out["action"][row] == (t + i) % 2
    assert out["obs"].dtype == np.float32 and out["discount"].dtype == np.float32
    assert out["action"].dtype == np.int64 and out["reward"].shape == (10,)


def test_one_step_is_plain_transitions() -> None:
    frag = fragment()
    out = n_step_transitions(frag, n=1, gamma=0.5)
    np.testing.assert_array_equal(out["reward"], frag["reward"].reshape(-1))
    np.testing.assert_array_equal(out["next_obs"][:, 0], frag["next_obs"].reshape(-1))
    np.testing.assert_allclose(out["discount"], 0.5 * ~frag["terminated"].reshape(-1))


def test_double_dqn_target_uses_online_argmax_and_target_values() -> None:
    reward = torch.tensor([1.0, 2.0])
    discount = torch.tensor([0.5, 0.0])
    online = torch.tensor([[1.0, 3.0], [5.0, 0.0]])
    target = torch.tensor([[10.0, 20.0], [30.0, 40.0]])
    # Online argmax = [1, 0] -> target values [20, 30]; the second transition terminated.
    np.testing.assert_allclose(double_dqn_target(reward, discount, online, target), [11.0, 2.0])
    # Vanilla DQN: the target's own max, [20, 40].
    np.testing.assert_allclose(double_dqn_target(reward, discount, target, target), [11.0, 2.0])
    discount = torch.tensor([0.5, 0.25])
    np.testing.assert_allclose(double_dqn_target(reward, discount, online, target), [11.0, 9.5])
    np.testing.assert_allclose(double_dqn_target(reward, discount, target, target), [11.0, 12.0])


def test_epsilon_schedule() -> None:
    assert epsilon_at(0, 1.0, 0.05, 100) == 1.0
    assert epsilon_at(50, 1.0, 0.05, 100) == pytest.approx(0.525)
    assert epsilon_at(100, 1.0, 0.05, 100) == pytest.approx(0.05)
    assert epsilon_at(10_000, 1.0, 0.05, 100) == pytest.approx(0.05)
    assert epsilon_at(5, 1.0, 0.05, 0) == 0.05


def test_actor_epsilon_follows_the_learner_version() -> None:
    config = DQN.Config(epsilon_start=1.0, epsilon_end=0.0, epsilon_decay_updates=10)
    learner = DQN(config, CARTPOLE.observation_space, CARTPOLE.action_space, device="cpu")
    actor = DQN(config, CARTPOLE.observation_space, CARTPOLE.action_space, seed=3, device="cpu")
    assert isinstance(actor, Algorithm)
    obs = np.random.default_rng(0).normal(size=(2000, 4)).astype(np.float32)
    actor.set_weights(learner.get_weights(), version=0)
    greedy = learner.act(obs, explore=False)["action"]
    agree = np.mean(actor.act(obs, explore=True)["action"] == greedy)
    assert 0.4 < agree < 0.6  # fully random over two actions
    actor.set_weights(learner.get_weights(), version=5)
    assert actor.epsilon == pytest.approx(0.5)
    actor.set_weights(learner.get_weights(), version=10)
    np.testing.assert_array_equal(actor.act(obs, explore=True)["action"], greedy)


def replay_batch(size: int = 32) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {
        "obs": rng.normal(size=(size, 4)).astype(np.float32),
        "action": rng.integers(0, 2, size),
        "reward": rng.normal(size=size).astype(np.float32),
        "next_obs": rng.normal(size=(size, 4)).astype(np.float32),
        "discount": np.full(size, 0.97, np.float32),
        "weight": np.ones(size, np.float32),
        "index": np.arange(size),
    }


def test_update_returns_priorities_and_updates_the_target_network() -> None:
    config = DQN.Config(prioritized=True, target_update_interval=3)
    algo = DQN(config, CARTPOLE.observation_space, CARTPOLE.action_space, device="cpu")
    assert algo.buffer_spec().kind == "prioritized"
    batch = replay_batch()
    with torch.no_grad():
        q = algo.q(torch.as_tensor(batch["obs"])).gather(
            1, torch.as_tensor(batch["action"])[:, None]
        )
        nq = algo.q_target(torch.as_tensor(batch["next_obs"]))
        best = algo.q(torch.as_tensor(batch["next_obs"])).argmax(1, keepdim=True)
        target = torch.as_tensor(batch["reward"]) + 0.97 * nq.gather(1, best).squeeze(1)
    result = algo.update(batch)
    assert result.priorities is not None and result.priorities.shape == (32,)
    expected = (q.squeeze(1) - target).abs().numpy() + config.priority_eps
    np.testing.assert_allclose(result.priorities, expected, rtol=1e-5)
    assert algo.version == 1
    online, frozen = algo.q[0].weight, algo.q_target[0].weight
    assert not torch.equal(online, frozen)
    algo.update(batch)
    algo.update(batch)
    assert algo.version == 3 and torch.equal(algo.q[0].weight, algo.q_target[0].weight)


def test_polyak_target_update() -> None:
    config = DQN.Config(tau=0.25, target_update_interval=1)
    algo = DQN(config, CARTPOLE.observation_space, CARTPOLE.action_space, device="cpu")
    before = algo.q_target[0].weight.detach().clone()
    algo.update(replay_batch())
    after_online = algo.q[0].weight.detach()
    expected = before + 0.25 * (after_online - before)
    torch.testing.assert_close(algo.q_target[0].weight, expected)
    assert (
        DQN(DQN.Config(), CARTPOLE.observation_space, CARTPOLE.action_space).buffer_spec().kind
        == "replay"
    )


def test_check_spaces_rejects_continuous_actions() -> None:
    box = gym.spaces.Box(-2.0, 2.0, (1,))
    message = DQN.check_spaces(CARTPOLE.observation_space, box)
    assert message is not None and "Discrete" in message and "Box" in message
    assert DQN.check_spaces(CARTPOLE.observation_space, CARTPOLE.action_space) is None
    message = DQN.check_spaces(gym.spaces.Discrete(5), CARTPOLE.action_space)
    assert message is not None and "observation space Discrete(5)" in message
    with pytest.raises(ConfigError, match="Discrete action space"):
        DQN(DQN.Config(), CARTPOLE.observation_space, box)


def test_config_validation_names_the_bad_value() -> None:
    with pytest.raises(ConfigError, match="n_step=0"):
        DQN.Config(n_step=0)
    with pytest.raises(ConfigError, match="hidden"):
        DQN.Config(hidden=[64, -1])
    assert DQN.Config(hidden=[32, 32]).hidden == (32, 32)
