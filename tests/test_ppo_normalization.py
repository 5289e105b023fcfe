"""PPO's running normalizations: value targets (``normalize_returns``) and observations
(``normalize_obs``): statistics that merge batches exactly, keep losses at unit scale, travel
with the weights to actors and into checkpoints."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from tianji.algorithms._normalize import ObsNormalizer, ReturnNormalizer
from tianji.algorithms.ppo import PPO


def test_the_return_normalizer_merges_batches_into_their_mean_and_variance() -> None:
    rng = np.random.default_rng(1)
    parts = [rng.normal(5.0, 3.0, size=n) for n in (100, 7, 1000, 1)]
    norm = ReturnNormalizer()
    for part in parts:
        norm.update(float(part.mean()), float(part.var()), part.size)
    whole = np.concatenate(parts)
    assert norm.mean == pytest.approx(whole.mean(), rel=1e-4)
    assert norm.std == pytest.approx(whole.std(), rel=1e-4)
    copy = ReturnNormalizer()
    copy.load(norm.state())
    assert copy.state() == norm.state()


def acted_batch(
    algo: PPO, obs: np.ndarray, next_obs: np.ndarray, reward: float, terminated: np.ndarray
) -> dict[str, np.ndarray]:
    """A learner batch ``[T, N, ...]`` of ``obs`` with the actions ``algo`` takes on them."""
    horizon, width = obs.shape[:2]
    out = algo.act(obs.reshape(-1, *obs.shape[2:]), explore=True)
    batch = {k: v.reshape(horizon, width, *v.shape[1:]) for k, v in out.items()}
    batch.update(
        obs=obs,
        next_obs=next_obs,
        reward=np.full((horizon, width), reward),
        terminated=terminated,
        truncated=np.zeros((horizon, width), bool),
    )
    return algo.postprocess(batch)


def cartpole_batch(algo: PPO, reward: float, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    horizon, width = 32, 4
    obs = rng.normal(size=(horizon, width, 4)).astype(np.float32)
    next_obs = rng.normal(size=(horizon, width, 4)).astype(np.float32)
    return acted_batch(algo, obs, next_obs, reward, rng.random((horizon, width)) < 0.05)


def test_normalized_returns_keep_the_value_loss_near_unit_scale_and_survive_a_checkpoint() -> None:
    env = gym.make("CartPole-v1")
    losses = {}
    for normalize in (False, True):
        config = PPO.Config(normalize_returns=normalize, clip_value_loss=False)
        algo = PPO(config, env.observation_space, env.action_space, device="cpu")
        for i in range(3):
            result = algo.update(cartpole_batch(algo, reward=1000.0, seed=i))
        losses[normalize] = result.metrics["value_loss"]
    assert losses[False] > 1e5 and losses[True] < 10, losses
    assert algo.returns is not None
    assert algo.returns.std > 100 and result.metrics["return_std"] == algo.returns.std
    restored = PPO(algo.config, env.observation_space, env.action_space, device="cpu")
    restored.load_state_dict(algo.state_dict())
    assert restored.returns is not None and restored.returns.state() == algo.returns.state()


def test_the_observation_normalizer_merges_batches_and_scales_images_to_unit_range() -> None:
    rng = np.random.default_rng(2)
    parts = [rng.integers(0, 256, size=(n, 2, 3, 3), dtype=np.uint8) for n in (5, 600, 1)]
    norm = ObsNormalizer((2, 3, 3))
    for part in parts:
        norm.update(torch.as_tensor(part), chunk=64)
    whole = np.concatenate(parts).astype(np.float64) / 255.0
    np.testing.assert_allclose(norm.mean.numpy(), whole.mean(0), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(norm.var.numpy(), whole.var(0), rtol=1e-3, atol=1e-6)
    out = norm(torch.as_tensor(parts[1]))
    assert out.dtype == torch.float32 and float(out.abs().max()) <= ObsNormalizer.clip
    assert abs(float(out.mean())) < 0.05 and abs(float(out.std()) - 1.0) < 0.05


def test_data_parallel_learners_merge_the_mean_of_their_batch_moments() -> None:
    a, b = (torch.randn(64, 3) + shift for shift in (0.0, 4.0))
    seen: list[np.ndarray] = []

    def sync(x: np.ndarray) -> np.ndarray:  # the all-reduce mean of two learners' moments
        seen.append(x)
        other = np.concatenate([b.mean(0).numpy(), b.square().mean(0).numpy()])
        return (x + other.astype(np.float32)) / 2

    norm = ObsNormalizer((3,))
    norm.update(a, sync)
    both = torch.cat([a, b]).double()
    assert len(seen) == 1
    np.testing.assert_allclose(norm.mean.numpy(), both.mean(0).numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(norm.var.numpy(), both.var(0, unbiased=False).numpy(), rtol=1e-3)


def test_data_parallel_learners_merge_the_mean_of_their_value_target_moments() -> None:
    """With K learners, the value targets' E[G] and E[G^2] go through the all-reduce (as
    float32, two numbers) and every learner merges the averaged moments."""
    other = np.array([10.0, 104.0], np.float32)  # the other learner: mean 10, variance 4
    seen: list[np.ndarray] = []

    def sync(x: np.ndarray) -> np.ndarray:  # moments: the mean with the other's; else as is
        if x.size != 2:
            return x
        seen.append(x.copy())
        return (x + other) / 2

    env = gym.make("CartPole-v1")
    algo = PPO(
        PPO.Config(normalize_returns=True, update_epochs=1),
        env.observation_space, env.action_space, device="cpu",
    )  # fmt: skip
    algo.gradient_sync = sync
    algo.update(cartpole_batch(algo, reward=1.0))
    assert len(seen) == 1 and seen[0].dtype == np.float32
    mean, square = (seen[0] + other) / 2
    assert algo.returns is not None
    assert algo.returns.mean == pytest.approx(mean, rel=1e-4)
    assert algo.returns.std == pytest.approx(np.sqrt(square - mean * mean), rel=1e-3)


def test_observation_statistics_travel_with_the_weights_to_an_actor() -> None:
    space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    actions = gym.spaces.Discrete(6)
    config = PPO.Config(normalize_obs=True, update_epochs=1)
    learner = PPO(config, space, actions, device="cpu")
    actor = PPO(config, space, actions, device="cpu", seed=1)
    rng = np.random.default_rng(0)
    horizon, width = 8, 2
    obs = rng.integers(0, 256, (horizon, width, 4, 84, 84), dtype=np.uint8)
    learner.update(acted_batch(learner, obs, obs, 0.0, np.zeros((horizon, width), bool)))
    assert learner.net.obs_norm is not None and float(learner.net.obs_norm.count[0]) > 1
    actor.set_weights(learner.get_weights(), learner.version)
    probe = obs[0]
    np.testing.assert_array_equal(
        actor.act(probe, explore=False)["value"], learner.act(probe, explore=False)["value"]
    )
    restored = PPO(config, space, actions, device="cpu", seed=2)
    restored.load_state_dict(learner.state_dict())
    assert restored.net.obs_norm is not None
    assert torch.equal(restored.net.obs_norm.mean, learner.net.obs_norm.mean)


@pytest.mark.parametrize("core", ["none", "gru"])
def test_observations_far_from_zero_reach_the_torso_standardized_with_or_without_a_core(
    core: str,
) -> None:
    """Non-image observations of any shape ([2, 3] here) are standardized element by
    element as the network sees them (flattened); with a GRU core before its torso. An
    actor given the learner's weights answers exactly as the learner does."""
    space = gym.spaces.Box(-np.inf, np.inf, (2, 3), np.float32)
    actions = gym.spaces.Discrete(2)
    config = PPO.Config(normalize_obs=True, update_epochs=1, core=core)
    learner = PPO(config, space, actions, device="cpu")
    actor = PPO(config, space, actions, device="cpu", seed=1)
    rng = np.random.default_rng(0)
    horizon, width = 16, 4
    centre = np.arange(6, dtype=np.float32).reshape(2, 3) * 100.0
    obs = (centre + rng.normal(0.0, 5.0, (horizon, width, 2, 3))).astype(np.float32)
    learner.update(acted_batch(learner, obs, obs, 1.0, np.zeros((horizon, width), bool)))
    norm = learner.net.obs_norm
    assert norm is not None and norm.mean.shape == (6,)
    np.testing.assert_allclose(norm.mean.numpy(), centre.ravel(), atol=3.0)
    np.testing.assert_allclose(norm.var.numpy(), 25.0, rtol=0.5)
    seen = norm(torch.as_tensor(obs.reshape(-1, 6)))
    assert float(seen.mean().abs()) < 0.2 and abs(float(seen.std()) - 1.0) < 0.2
    actor.set_weights(learner.get_weights(), learner.version)
    probe = obs[0]
    value = learner.act(probe, explore=False)["value"]
    np.testing.assert_array_equal(actor.act(probe, explore=False)["value"], value)
    norm.mean.zero_()  # the statistics are on the network's path: without them it answers else
    assert not np.allclose(learner.act(probe, explore=False)["value"], value)
