"""PPO's math against hand-computed values: GAE, returns, the losses, Gaussian densities."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from tianji.algorithms._distributions import gaussian_entropy, gaussian_log_prob
from tianji.algorithms._gae import gae
from tianji.algorithms._losses import clipped_surrogate_loss, value_loss
from tianji.algorithms.ppo import PPO

from tianji.rl.algorithm import Algorithm
from tianji.runtime.errors import ConfigError

GAMMA, LAM = 0.9, 0.5


def test_gae_bootstraps_on_truncation_and_fragment_end_not_on_termination() -> None:
    # One env, T=5: the episode terminates at t=1, a new one is truncated at t=3, and the
    # third runs past the fragment end at t=4.
    reward = np.array([[1.0], [2.0], [3.0], [4.0], [5.0]])
    value = np.array([[0.5], [0.6], [0.7], [0.8], [0.9]])
    next_value = np.array([[0.6], [9.0], [0.8], [1.5], [2.0]])  # 9.0 must be ignored
    terminated = np.array([[0], [1], [0], [0], [0]], dtype=bool)
    truncated = np.array([[0], [0], [0], [1], [0]], dtype=bool)

    adv, ret = gae(reward, value, next_value, terminated, truncated, GAMMA, LAM)

    d4 = 5.0 + 0.9 * 2.0 - 0.9  # fragment end: bootstrap from V(next_obs)
    d3 = 4.0 + 0.9 * 1.5 - 0.8  # truncation: bootstrap from V(final obs)
    d2 = 3.0 + 0.9 * 0.8 - 0.7
    d1 = 2.0 - 0.6  # termination: no bootstrap
    d0 = 1.0 + 0.9 * 0.6 - 0.5
    a4, a3 = d4, d3  # the recursion is cut after the truncation at t=3
    a2 = d2 + GAMMA * LAM * a3
    a1 = d1  # cut after the termination
    a0 = d0 + GAMMA * LAM * a1
    expected = np.array([[a0], [a1], [a2], [a3], [a4]])
    np.testing.assert_allclose(adv, expected, rtol=1e-6)
    np.testing.assert_allclose(ret, expected + value, rtol=1e-6)
    assert adv.dtype == np.float32 and ret.dtype == np.float32


def test_gae_columns_are_independent_and_lambda_one_gives_discounted_returns() -> None:
    reward = np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 1.0]])
    zeros = np.zeros_like(reward)
    flags = np.zeros_like(reward, dtype=bool)
    terminated = flags.copy()
    terminated[2] = True
    _, ret = gae(reward, zeros, zeros, terminated, flags, GAMMA, 1.0)
    np.testing.assert_allclose(ret[:, 0], [1 + 0.9 + 0.81, 1 + 0.9, 1.0], rtol=1e-6)
    np.testing.assert_allclose(ret[:, 1], [0.81, 0.9, 1.0], rtol=1e-6)


def test_clipped_surrogate_loss_matches_hand_computation() -> None:
    ratio = np.array([0.5, 1.1, 1.5, 1.5])
    adv = np.array([1.0, -2.0, 2.0, -1.0])
    old_logp = torch.tensor([-1.0, -0.5, -2.0, -0.3])
    logp = old_logp + torch.log(torch.tensor(ratio, dtype=torch.float32))
    # Per sample: max(-A r, -A clip(r, 0.8, 1.2)):
    #   A=1,  r=0.5: max(-0.5, -0.8) = -0.5
    #   A=-2, r=1.1: max(2.2, 2.2)   =  2.2
    #   A=2,  r=1.5: max(-3.0, -2.4) = -2.4
    #   A=-1, r=1.5: max(1.5, 1.2)   =  1.5
    expected = (-0.5 + 2.2 - 2.4 + 1.5) / 4
    loss = clipped_surrogate_loss(logp, old_logp, torch.tensor(adv, dtype=torch.float32), 0.2)
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_value_loss_clipped_and_unclipped() -> None:
    value = torch.tensor([1.0, 3.0])
    old = torch.tensor([0.0, 2.5])
    ret = torch.tensor([2.0, 2.0])
    assert value_loss(value, old, ret, None).item() == pytest.approx(0.5 * (1.0 + 1.0) / 2)
    # Clipped at 0.2: V_clip = [0.2, 2.7]; errors max((1-2)^2,(0.2-2)^2)=3.24, max(1, 0.49)=1
    assert value_loss(value, old, ret, 0.2).item() == pytest.approx(0.5 * (3.24 + 1.0) / 2)


def test_gaussian_log_prob_and_entropy() -> None:
    action = torch.tensor([[0.3, -1.0], [2.0, 0.0]])
    mean = torch.tensor([[0.0, 0.5], [1.0, 0.0]])
    log_std = torch.tensor([[-0.5, 0.2], [0.0, 1.0]])
    std = log_std.exp()
    by_hand = (
        -((action - mean) ** 2) / (2 * std**2) - torch.log(std) - 0.5 * math.log(2 * math.pi)
    ).sum(-1)
    reference = torch.distributions.Normal(mean, std)
    np.testing.assert_allclose(gaussian_log_prob(action, mean, log_std), by_hand, rtol=1e-6)
    np.testing.assert_allclose(
        gaussian_log_prob(action, mean, log_std), reference.log_prob(action).sum(-1), rtol=1e-6
    )
    np.testing.assert_allclose(gaussian_entropy(log_std), reference.entropy().sum(-1), rtol=1e-6)


def test_act_logp_matches_update_evaluation_for_continuous_actions() -> None:
    env = gym.make("Pendulum-v1")
    algo = PPO(PPO.Config(init_log_std=1.0), env.observation_space, env.action_space, device="cpu")
    obs = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
    out = algo.act(obs, explore=True)
    assert isinstance(algo, Algorithm)
    assert out["raw_action"].shape == out["action"].shape == (64, 1)
    assert np.all(np.abs(out["action"]) <= 2.0) and np.any(np.abs(out["raw_action"]) > 2.0)
    logp, _, value = algo._evaluate(
        torch.as_tensor(obs), torch.as_tensor(out["raw_action"].reshape(64, -1))
    )
    np.testing.assert_allclose(logp.detach().numpy(), out["logp"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(value.detach().numpy(), out["value"], rtol=1e-5, atol=1e-6)


def test_discrete_act_greedy_and_weights_round_trip() -> None:
    env = gym.make("CartPole-v1")
    learner = PPO(PPO.Config(), env.observation_space, env.action_space, seed=1, device="cpu")
    actor = PPO(PPO.Config(), env.observation_space, env.action_space, seed=2, device="cpu")
    weights = learner.get_weights()
    assert all(w.flags.c_contiguous for w in weights.values())
    actor.set_weights(weights, version=7)
    assert actor.version == 7
    obs = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    a, b = learner.act(obs, explore=False), actor.act(obs, explore=False)
    np.testing.assert_array_equal(a["action"], b["action"])
    assert a["action"].dtype == np.int64 and set(a) == {"action", "logp", "value"}


@pytest.mark.parametrize(
    ("env_id", "shared"),
    [("CartPole-v1", False), ("CartPole-v1", True), ("Pendulum-v1", False), ("Pendulum-v1", True)],
)
def test_update_runs_on_a_batch_of_fragments_and_counts_versions(env_id: str, shared: bool) -> None:
    env = gym.make(env_id)
    config = PPO.Config(shared_network=shared, lr_anneal_updates=4, target_kl=0.5)
    algo = PPO(config, env.observation_space, env.action_space, device="cpu")
    rng = np.random.default_rng(0)
    horizon, width, dim = 16, 6, env.observation_space.shape[0]
    obs = rng.normal(size=(horizon, width, dim)).astype(np.float32)
    out = algo.act(obs.reshape(-1, dim), explore=True)
    batch = {k: v.reshape(horizon, width, *v.shape[1:]) for k, v in out.items()}
    batch.update(
        obs=obs,
        next_obs=rng.normal(size=(horizon, width, dim)),
        reward=np.ones((horizon, width)),
        terminated=rng.random((horizon, width)) < 0.05,
        truncated=np.zeros((horizon, width), bool),
    )
    batch = algo.postprocess(batch)
    assert batch["next_obs"].dtype == np.float32 and batch["reward"].dtype == np.float32
    before = {k: v.copy() for k, v in algo.get_weights().items()}
    result = algo.update(batch)
    assert algo.version == 1 and result.priorities is None
    assert {"policy_loss", "value_loss", "entropy", "approx_kl", "lr"} <= result.metrics.keys()
    assert all(math.isfinite(v) for v in result.metrics.values())
    assert result.metrics["lr"] == pytest.approx(config.lr)  # annealing starts at full lr
    changed = [k for k, v in algo.get_weights().items() if not np.array_equal(v, before[k])]
    assert changed


def test_check_spaces() -> None:
    box = gym.spaces.Box(-1, 1, (3,))
    assert PPO.check_spaces(box, gym.spaces.Discrete(2)) is None
    assert PPO.check_spaces(box, box) is None
    message = PPO.check_spaces(gym.spaces.Discrete(4), gym.spaces.Discrete(2))
    assert message is not None and "Discrete(4)" in message and "observation" in message
    message = PPO.check_spaces(box, gym.spaces.MultiBinary(3))
    assert message is not None and "MultiBinary" in message


def test_an_annealed_learning_rate_keeps_its_floor() -> None:
    from tianji.algorithms._onpolicy import annealed_lr

    assert annealed_lr(1e-3, 0, 200) == 1e-3
    assert annealed_lr(1e-3, 100, 200) == pytest.approx(5e-4)
    assert annealed_lr(1e-3, 400, 200) == 0.0  # no floor: learning stops
    assert annealed_lr(1e-3, 400, 200, floor=0.2) == pytest.approx(2e-4)
    assert annealed_lr(1e-3, 50, 200, floor=0.2) == pytest.approx(7.5e-4)
    with pytest.raises(ConfigError, match="lr_floor"):
        PPO.Config(lr_floor=1.5)


def test_the_learner_says_once_when_the_learning_rate_reached_zero(caplog) -> None:
    import collections
    import logging
    import types

    from tianji.services.common import check_lr

    learner = types.SimpleNamespace(name="learner-0", counters=collections.Counter())
    with caplog.at_level(logging.WARNING):
        check_lr(learner, 1e-4, 200)  # type: ignore[arg-type]
        assert "lr_zero_at_update" not in learner.counters
        check_lr(learner, 0.0, 200)  # type: ignore[arg-type]
        check_lr(learner, 0.0, 201)  # type: ignore[arg-type]
    assert learner.counters["lr_zero_at_update"] == 200
    warnings = [
        r.getMessage() for r in caplog.records if "learning rate reached 0" in r.getMessage()
    ]
    assert len(warnings) == 1 and "update 200" in warnings[0] and "lr_floor" in warnings[0]


@pytest.mark.parametrize("reference", ["behaviour", "learner"])
def test_appo_clips_its_ratio_around_the_configured_reference(reference: str) -> None:
    env = gym.make("CartPole-v1")
    config = PPO.Config(vtrace=True, vtrace_reference=reference)
    algo = PPO(config, env.observation_space, env.action_space, device="cpu")
    rng = np.random.default_rng(1)
    obs = rng.normal(size=(8, 3, 4)).astype(np.float32)
    out = algo.act(obs.reshape(-1, 4), explore=True)
    batch = {k: v.reshape(8, 3, *v.shape[1:]) for k, v in out.items()}
    batch["logp"] = batch["logp"] - 0.5  # as if an older policy had acted
    batch.update(
        obs=obs,
        next_obs=rng.normal(size=(8, 3, 4)).astype(np.float32),
        reward=np.ones((8, 3), np.float32),
        terminated=np.zeros((8, 3), bool),
        truncated=np.zeros((8, 3), bool),
    )
    flat = algo._prepare(batch)
    learner = out["logp"].reshape(-1)  # the learner's own log-probabilities now
    expected = learner if reference == "learner" else batch["logp"].reshape(-1)
    np.testing.assert_allclose(flat["old_logp"].numpy(), expected, atol=1e-5)


def test_an_unknown_ratio_reference_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="vtrace_reference"):
        PPO.Config(vtrace=True, vtrace_reference="target")
