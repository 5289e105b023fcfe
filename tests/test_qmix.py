"""QMIX's pieces without processes: monotonic mixer, n-step layout, double-Q target, act, update."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from gymnasium import spaces
from tianji.algorithms._multiagent import agent_inputs
from tianji.algorithms.qmix import QMIX, QMixer, n_step_transitions_ma

from tianji.runtime.errors import ConfigError

A, D, S, ACTIONS = 3, 4, 6, 5
OBS = spaces.Box(-1.0, 1.0, (A, D), np.float32)
ACT = spaces.MultiDiscrete(np.full(A, ACTIONS))
STATE = spaces.Box(-1.0, 1.0, (S,), np.float32)


def make(seed: int = 0, **config: object) -> QMIX:
    return QMIX(QMIX.Config(**config), OBS, ACT, seed=seed, device="cpu", state_space=STATE)


def batch(size: int = 16, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.standard_normal((size, A, D)).astype(np.float32),
        "action": rng.integers(0, ACTIONS, (size, A)),
        "reward": rng.standard_normal(size).astype(np.float32),
        "discount": np.full(size, 0.9, np.float32),
        "next_obs": rng.standard_normal((size, A, D)).astype(np.float32),
        "state": rng.standard_normal((size, S)).astype(np.float32),
        "next_state": rng.standard_normal((size, S)).astype(np.float32),
    }


# --------------------------------------------------------------------------- mixer


def test_mixing_weights_stay_non_negative_even_with_negative_hypernet_weights() -> None:
    mixer = QMixer(A, S, embed=8, hidden=16)
    with torch.no_grad():
        for p in mixer.parameters():
            p.copy_(-p.abs() - 0.1)
    w1, w2 = mixer.mixing_weights(torch.randn(64, S))
    assert w1.shape == (64, A, 8) and w2.shape == (64, 8, 1)
    assert (w1 >= 0).all() and (w2 >= 0).all()


def test_q_tot_is_non_decreasing_in_every_agent_q() -> None:
    torch.manual_seed(0)
    mixer = QMixer(A, S, embed=8, hidden=16)
    q = torch.randn(256, A, requires_grad=True) * 10
    q.retain_grad()
    mixer(q, torch.randn(256, S) * 3).sum().backward()
    assert q.grad is not None and (q.grad >= 0).all()
    assert (q.grad > 0).any()


# --------------------------------------------------------------------------- n-step


def fragment() -> dict[str, np.ndarray]:
    """T=5, N=2, A=2. Env 0 terminates at t=1 and is truncated at t=3; env 1 terminates at t=4.

    Every value encodes where it came from: obs ``100 + 10t + i`` (+ agent), next_obs
    ``10t + i``, state ``1000 + 10t + i``, next_state ``2000 + 10t + i``.
    """
    horizon, width, agents = 5, 2, 2
    t, i = np.meshgrid(np.arange(horizon), np.arange(width), indexing="ij")
    terminated = np.zeros((horizon, width), bool)
    truncated = np.zeros((horizon, width), bool)
    terminated[1, 0] = truncated[3, 0] = terminated[4, 1] = True
    agent = np.arange(agents)
    return {
        "obs": (100 + 10 * t + i)[..., None, None] + agent[:, None] + np.zeros((1, 3)),
        "action": ((t + i)[..., None] + agent) % 3,
        "reward": np.stack([np.arange(1.0, 6.0), np.ones(5)], axis=1),
        "agent_reward": np.zeros((horizon, width, agents)),
        "terminated": terminated,
        "truncated": truncated,
        "next_obs": (10 * t + i)[..., None, None] + agent[:, None] + np.zeros((1, 3)),
        "state": (1000 + 10 * t + i)[..., None] + np.zeros(4),
        "next_state": (2000 + 10 * t + i)[..., None] + np.zeros(4),
    }


def test_n_step_transitions_ma_rows_cut_at_episode_ends_and_keep_every_agent() -> None:
    out = n_step_transitions_ma(fragment(), n=3, gamma=0.5)
    # Per (t, i): team reward sum, the step index the window ends at, discount.
    expected = {
        (0, 0): (1 + 0.5 * 2, 1, 0.0),  # k=2, terminated at t=1: no bootstrap
        (1, 0): (2, 1, 0.0),
        (2, 0): (3 + 0.5 * 4, 3, 0.25),  # k=2, truncated at t=3: bootstraps
        (3, 0): (4, 3, 0.5),
        (4, 0): (5, 4, 0.5),  # k=1, fragment end
        (0, 1): (1.75, 2, 0.125),  # k=3, full window
        (2, 1): (1.75, 4, 0.0),  # terminated at the window's last step
        (4, 1): (1.0, 4, 0.0),
    }
    assert out["obs"].shape == (10, 2, 3) and out["next_obs"].shape == (10, 2, 3)
    assert out["action"].shape == (10, 2) and out["state"].shape == (10, 4)
    assert out["reward"].shape == out["discount"].shape == (10,)
    for (t, i), (reward, last, discount) in expected.items():
        row = 2 * t + i
        assert out["reward"][row] == pytest.approx(reward), (t, i)
        assert out["discount"][row] == pytest.approx(discount), (t, i)
        np.testing.assert_array_equal(out["obs"][row, :, 0], [100 + 10 * t + i + a for a in (0, 1)])
        np.testing.assert_array_equal(
            out["next_obs"][row, :, 0], [10 * last + i + a for a in (0, 1)]
        )
        np.testing.assert_array_equal(out["action"][row], [(t + i) % 3, (t + i + 1) % 3])
        assert out["state"][row, 0] == 1000 + 10 * t + i
        assert out["next_state"][row, 0] == 2000 + 10 * last + i
    assert out["obs"].dtype == out["state"].dtype == out["next_state"].dtype == np.float32
    assert out["action"].dtype == np.int64 and out["discount"].dtype == np.float32


def test_postprocess_uses_the_configured_n_step_and_gamma() -> None:
    out = make(n_step=1, gamma=0.5).postprocess(fragment())
    np.testing.assert_allclose(out["reward"], fragment()["reward"].reshape(-1))
    np.testing.assert_allclose(out["next_state"], fragment()["next_state"].reshape(10, 4))


# --------------------------------------------------------------------------- target


def test_double_q_target_picks_the_online_argmax_and_values_it_with_the_target_net() -> None:
    algo = make(reward_scale=1.0)
    b = batch(8)
    inputs = agent_inputs(torch.as_tensor(b["next_obs"]))
    with torch.no_grad():
        for p in algo.agent_target.parameters():  # a target net that disagrees with the online
            p.add_(torch.randn_like(p))
        online, target = algo.agent(inputs), algo.agent_target(inputs)
        best = online.argmax(dim=2, keepdim=True)
        assert (best != target.argmax(dim=2, keepdim=True)).any()
        chosen = target.gather(2, best).squeeze(2)
        mixed = algo.mixer_target(chosen, torch.as_tensor(b["next_state"]))
    expected = torch.as_tensor(b["reward"]) + torch.as_tensor(b["discount"]) * mixed
    torch.testing.assert_close(algo.td_target(b), expected)


def test_target_is_the_reward_when_discount_is_zero() -> None:
    b = batch(8) | {"discount": np.zeros(8, np.float32)}
    torch.testing.assert_close(
        make(reward_scale=0.5).td_target(b), 0.5 * torch.as_tensor(b["reward"])
    )


# --------------------------------------------------------------------------- act


def test_act_gives_one_int64_action_per_agent_in_range_with_the_space_start() -> None:
    space = spaces.MultiDiscrete(np.full(A, ACTIONS), start=np.full(A, 2))
    algo = QMIX(QMIX.Config(), OBS, space, device="cpu", state_space=STATE)
    obs = np.random.default_rng(0).standard_normal((7, A, D)).astype(np.float32)
    for explore in (True, False):
        action = algo.act(obs, explore=explore)["action"]
        assert action.shape == (7, A) and action.dtype == np.int64
        assert action.min() >= 2 and action.max() < 2 + ACTIONS


def test_epsilon_follows_the_learner_version_and_greedy_ignores_it() -> None:
    algo = make(epsilon_start=1.0, epsilon_end=0.0, epsilon_decay_updates=100)
    obs = np.random.default_rng(1).standard_normal((400, A, D)).astype(np.float32)
    greedy = algo.act(obs, explore=False)["action"]
    assert algo.epsilon == 1.0
    assert (algo.act(obs, explore=True)["action"] != greedy).mean() > 0.7  # ~(1 - 1/5)
    algo.set_weights(algo.get_weights(), version=100)
    assert algo.epsilon == 0.0
    np.testing.assert_array_equal(algo.act(obs, explore=True)["action"], greedy)
    algo.set_weights(algo.get_weights(), version=50)
    assert algo.epsilon == pytest.approx(0.5)


def test_weights_published_to_actors_are_the_agent_net_only() -> None:
    learner, actor = make(seed=0), make(seed=1)
    weights = learner.get_weights()
    assert set(weights) == set(learner.agent.state_dict())
    actor.set_weights(weights, version=3)
    obs = np.random.default_rng(2).standard_normal((5, A, D)).astype(np.float32)
    np.testing.assert_array_equal(
        actor.act(obs, explore=False)["action"], learner.act(obs, explore=False)["action"]
    )


# --------------------------------------------------------------------------- update


def test_state_dict_round_trip_gives_an_identical_next_update() -> None:
    first = make(seed=0, target_update_interval=2)
    for k in range(3):
        first.update(batch(seed=k))
    second = make(seed=5, target_update_interval=2)
    # A deep copy, as a checkpoint file gives: torch's optimizer would share Adam's moments.
    second.load_state_dict(copy.deepcopy(first.state_dict()))
    a, b = first.update(batch(seed=9)), second.update(batch(seed=9))
    assert a.metrics == b.metrics and second.version == 4
    for key in ("agent", "agent_target", "mixer", "mixer_target"):
        for x, y in zip(
            first.state_dict()[key].values(), second.state_dict()[key].values(), strict=True
        ):
            torch.testing.assert_close(x, y, rtol=0, atol=0)


def test_update_decreases_the_td_loss_on_a_fixed_batch() -> None:
    algo = make(lr=1e-3, target_update_interval=10_000)
    b = batch(32)
    first = algo.update(b)
    for _ in range(150):
        last = algo.update(b)
    assert last.metrics["loss"] < 0.2 * first.metrics["loss"]
    assert last.priorities is None
    assert set(last.metrics) == {"loss", "q_tot_mean", "td_abs_mean", "grad_norm", "epsilon"}


def test_gradient_sync_sees_agent_and_mixer_gradients_once_per_update() -> None:
    algo = make()
    sizes: list[int] = []

    def sync(flat: np.ndarray) -> np.ndarray:
        sizes.append(flat.size)
        return flat

    algo.gradient_sync = sync
    algo.update(batch())
    assert sizes == [sum(p.numel() for p in algo.trained_parameters())]


def test_buffer_spec_is_uniform_replay_from_the_config() -> None:
    spec = make(batch_size=64, buffer_capacity=5000, learning_starts=200).buffer_spec()
    assert (spec.kind, spec.capacity, spec.batch_size, spec.min_size) == ("replay", 5000, 64, 200)


# --------------------------------------------------------------------------- spaces


@pytest.mark.parametrize(
    ("obs", "act", "named"),
    [
        (spaces.Box(-1, 1, (D,)), ACT, "observation space"),
        (spaces.Discrete(3), ACT, "observation space"),
        (OBS, spaces.Discrete(5), "action space"),
        (OBS, spaces.MultiDiscrete([5, 5, 4]), "action space"),
        (OBS, spaces.MultiDiscrete([5, 5, 5], start=[0, 0, 1]), "action space"),
        (OBS, spaces.MultiDiscrete([5, 5]), "action space"),
    ],
)
def test_check_spaces_names_the_unsupported_space(obs: object, act: object, named: str) -> None:
    message = QMIX.check_spaces(obs, act)
    assert message is not None and named in message
    with pytest.raises(ConfigError):
        QMIX(QMIX.Config(), obs, act, device="cpu", state_space=STATE)


def test_check_spaces_accepts_stacked_agents() -> None:
    assert QMIX.check_spaces(OBS, ACT) is None


def test_config_rejects_bad_values() -> None:
    for bad in ({"mixing_embed": 0}, {"gamma": 1.5}, {"tau": 0.0}, {"huber_delta": -1.0}):
        with pytest.raises(ConfigError):
            QMIX.Config(**bad)  # type: ignore[arg-type]
