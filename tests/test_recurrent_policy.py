"""Recurrent policies (``[algo] core = "gru"``): the hidden state is reset where episodes
start, local and remote acting give the same answers for the same weights and inputs, and
the states stored with a fragment let the learner unroll exactly what the actor computed."""

from __future__ import annotations

import asyncio
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from tianji.algorithms.impala import IMPALA
from tianji.algorithms.ppo import PPO, PPOConfig

from tianji.rl.config import EnvConfig, RunConfig, to_dict
from tianji.rl.envs import MaskedCartPole, make_vector_env
from tianji.rl.events import ComputeActions
from tianji.rl.slots import StateSlots
from tianji.run.evaluate import run_episode
from tianji.runtime.errors import ConfigError
from tianji.services.actor import ActorService
from tianji.services.collector import FragmentCollector
from tianji.services.inference import InferenceService

MASKED = "tianji.rl.envs:MaskedCartPole"


def gru_ppo(seed: int = 0, **config: Any) -> PPO:
    env = MaskedCartPole()
    return PPO(
        PPOConfig(core="gru", core_hidden=16, hidden=(32,), **config),
        env.observation_space,
        env.action_space,
        seed=seed,
        device="cpu",
    )


def collect(algo: Any, steps: int, envs: int = 4, seed: int = 0) -> dict[str, np.ndarray]:
    """A fragment collected the way an actor with a local recurrent policy collects it."""
    memory = StateSlots(algo.initial_state)

    async def act(obs: np.ndarray, rows: range, starts: np.ndarray) -> dict[str, np.ndarray]:
        ids = np.arange(rows.start, rows.stop)
        return memory.act(algo, "actor-0", obs, ids, starts, explore=True)

    collector = FragmentCollector(make_vector_env(EnvConfig(id=MASKED), envs), steps, seed)
    try:
        fragment, _, _ = asyncio.run(collector.collect(act))
    finally:
        collector.close()
    return algo.postprocess(fragment)  # type: ignore[no-any-return]


def test_masked_cartpole_shows_position_and_angle_only() -> None:
    masked, full = MaskedCartPole(), gym.make("CartPole-v1")
    obs, _ = masked.reset(seed=3)
    full_obs, _ = full.reset(seed=3)
    assert masked.observation_space.shape == (2,)
    np.testing.assert_array_equal(obs, full_obs[[0, 2]])
    for _ in range(5):
        obs, *_ = masked.step(1)
        full_obs, *_ = full.step(1)
        np.testing.assert_array_equal(obs, full_obs[[0, 2]])


def test_the_env_id_makes_the_masked_env_through_the_config() -> None:
    envs = make_vector_env(EnvConfig(id=MASKED), 2)
    try:
        assert envs.single_observation_space.shape == (2,)
    finally:
        envs.close()


def test_the_state_is_fresh_where_an_episode_starts_and_carried_otherwise() -> None:
    algo = gru_ppo()
    memory = StateSlots(algo.initial_state)
    obs = np.array([[0.01, 0.02], [0.03, -0.01]], np.float32)
    ids = np.array([0, 1])
    first = memory.act(algo, "a", obs, ids, np.ones(2, bool), explore=False)
    np.testing.assert_array_equal(first["core_state"], 0.0)  # the episodes' first step
    second = memory.act(algo, "a", obs, ids, np.zeros(2, bool), explore=False)
    assert np.abs(second["core_state"]).min() > 0  # carried from the first step
    assert "next_state" not in second  # kept in the slots, not stored in fragments
    third = memory.act(algo, "a", obs, ids, np.array([True, False]), explore=False)
    np.testing.assert_array_equal(third["core_state"][0], 0.0)  # env 0 began anew
    assert not np.allclose(third["core_state"][1], second["core_state"][1])
    np.testing.assert_allclose(third["value"][0], first["value"][0], rtol=1e-6)


def test_a_fresh_state_gives_the_answers_of_no_state() -> None:
    algo = gru_ppo()
    obs = np.array([[0.01, 0.02]], np.float32)
    a = algo.act(obs, explore=False)
    b = algo.act(obs, explore=False, state=algo.initial_state(1))
    np.testing.assert_array_equal(a["value"], b["value"])
    np.testing.assert_array_equal(a["next_state"], b["next_state"])


def service_config(inference: str) -> dict[str, Any]:
    data = to_dict(RunConfig(algorithm="ppo", transport="inproc", run_dir=""))
    data["env"]["id"] = MASKED
    data["algo"] = {"core": "gru", "core_hidden": 16, "hidden": [32]}
    data["actors"].update(count=1, envs_per_actor=3, inference=inference)
    data["inference"].update(count=1, device="cpu")
    return data


def test_local_and_remote_acting_give_identical_answers_for_the_same_weights() -> None:
    actor = ActorService("actor-0", config=service_config("local"), index=0)
    service = InferenceService("inference-0", config=service_config("service"), index=0)
    weights = gru_ppo(seed=5).get_weights()
    actor.algo.set_weights(weights, 1)
    service.algo.set_weights(weights, 1)
    actor.algo.generator.manual_seed(11)  # the same sampling noise on both sides
    service.algo.generator.manual_seed(11)
    rng = np.random.default_rng(0)
    rows = range(0, 3)
    for step in range(12):
        obs = rng.normal(size=(3, 2)).astype(np.float32)
        starts = np.array([step == 0, step in (0, 5), step % 4 == 0])
        local = asyncio.run(actor._act_local(obs, rows, starts))
        request = ComputeActions(
            actor="actor-0",
            request_id=step,
            obs=obs,
            env_ids=np.arange(3, dtype=np.int32),
            starts=starts,
        )
        remote = service._forward([request])
        assert local.keys() == remote.keys() == {"action", "logp", "value", "core_state"}
        for key in local:
            np.testing.assert_array_equal(local[key], remote[key], err_msg=f"{key} at {step}")
    service._executor.shutdown()


@pytest.mark.parametrize("cls", [PPO, IMPALA])
def test_the_learner_unrolls_the_stored_states_to_the_actors_outputs(cls: type[PPO]) -> None:
    env = MaskedCartPole()
    config = cls.Config(core="gru", core_hidden=16, hidden=(32,))
    algo = cls(config, env.observation_space, env.action_space, seed=2, device="cpu")
    batch = collect(algo, steps=48)  # random-ish policy: several episodes end inside
    done = batch["terminated"] | batch["truncated"]
    assert done[:-1].any(), "the test needs episode ends inside the fragment"
    obs = algo._input(batch["obs"].reshape(-1, 2))
    action = torch.as_tensor(batch["action"].reshape(-1))
    with torch.no_grad():
        value, _, logp, _ = algo._unroll_batch(batch, obs, action)
    np.testing.assert_allclose(value.numpy(), batch["value"].reshape(-1), atol=1e-5)
    np.testing.assert_allclose(logp.numpy(), batch["logp"].reshape(-1), atol=1e-5)
    # the minibatch path (whole columns, some of them) unrolls the same
    flat = algo._prepare(batch)
    cols = np.array([1, 3])
    index = (np.arange(48)[:, None] * 4 + cols[None, :]).reshape(-1)
    kept, (mb_logp, _, mb_value) = algo._evaluate_columns({k: v[index] for k, v in flat.items()})
    np.testing.assert_allclose(
        mb_value.detach().numpy(), batch["value"][:, cols].reshape(-1), atol=1e-5
    )
    np.testing.assert_allclose(
        mb_logp.detach().numpy(), batch["logp"][:, cols].reshape(-1), atol=1e-5
    )
    assert kept["adv"].shape == (96,)


def test_a_recurrent_update_learns_from_whole_columns_with_burn_in() -> None:
    algo = gru_ppo(burn_in=8, num_minibatches=2)
    batch = collect(algo, steps=32)
    before = {k: v.copy() for k, v in algo.get_weights().items()}
    result = algo.update(batch)
    assert np.isfinite(result.metrics["loss"])
    assert any(not np.array_equal(before[k], v) for k, v in algo.get_weights().items())
    assert any(
        not np.array_equal(before[k], v) for k, v in algo.get_weights().items() if "core" in k
    )


def test_burn_in_as_long_as_the_fragment_is_refused_by_name() -> None:
    algo = gru_ppo(burn_in=16)
    batch = collect(algo, steps=16)
    with pytest.raises(ConfigError, match="burn_in"):
        algo.update(batch)


@pytest.mark.parametrize(("key", "value"), [("core", "lstm2"), ("core_hidden", 0), ("burn_in", -1)])
def test_bad_recurrent_settings_are_refused_by_name(key: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=key):
        PPOConfig(**{key: value})


def test_a_recurrent_policy_plays_greedy_episodes_with_its_memory() -> None:
    algo = gru_ppo()
    env = MaskedCartPole()
    first = run_episode(env, algo, seed=4)
    assert first == run_episode(env, algo, seed=4)  # the state restarts with the episode
    assert first[1] >= 8


def test_a_recurrent_checkpoint_restores_the_core() -> None:
    algo = gru_ppo(seed=1)
    algo.update(collect(algo, steps=16))
    other = gru_ppo(seed=9)
    other.load_state_dict(algo.state_dict())
    obs = np.array([[0.01, 0.02]], np.float32)
    np.testing.assert_array_equal(
        algo.act(obs, explore=False)["next_state"], other.act(obs, explore=False)["next_state"]
    )
