"""Action masks never let an illegal move through: DQN and PPO (and their exploration,
the random warm-up and the exported policy) pick legal actions only, their targets and
losses see legal actions only, and algorithms that do not honour masks refuse them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces

from tianji import algorithms
from tianji.rl.config import EnvConfig
from tianji.rl.envs import env_factory, uniform_actions
from tianji.rl.masks import (
    ActionMaskObservation,
    MaskedObs,
    legal_actions,
    mask_problem,
    uniform_legal,
)
from tianji.runtime.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
N_ACTIONS = 5


class PickALegalSlot(gym.Env[dict[str, np.ndarray], int]):
    """A random subset of 5 slots is legal each step; picking a legal one pays 1, an
    illegal one raises (a game engine would refuse it)."""

    def __init__(self) -> None:
        self.observation_space = spaces.Dict(
            {
                "observation": spaces.Box(-1.0, 1.0, (3,), np.float32),
                "action_mask": spaces.MultiBinary(N_ACTIONS),
            }
        )
        self.action_space = spaces.Discrete(N_ACTIONS)
        self._mask = np.ones(N_ACTIONS, np.int8)
        self._t = 0

    def _obs(self) -> dict[str, np.ndarray]:
        self._mask = (self.np_random.random(N_ACTIONS) < 0.4).astype(np.int8)
        self._mask[self.np_random.integers(N_ACTIONS)] = 1  # at least one legal
        features = self.np_random.uniform(-1, 1, 3).astype(np.float32)
        return {"observation": features, "action_mask": self._mask.copy()}

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {}

    def step(self, action: int) -> tuple[Any, float, bool, bool, dict]:
        if not self._mask[action]:
            raise AssertionError(f"illegal action {action} with mask {self._mask}")
        self._t += 1
        return self._obs(), 1.0, False, self._t >= 20, {}


def masked_obs(n: int, seed: int = 0) -> tuple[np.ndarray, MaskedObs]:
    env = ActionMaskObservation(PickALegalSlot())
    env.reset(seed=seed)
    space = env.observation_space
    assert isinstance(space, MaskedObs)
    rows = [env.observation(env.unwrapped._obs()) for _ in range(n)]  # type: ignore[attr-defined]
    return np.stack(rows), space


def test_a_dict_observation_with_a_mask_is_flattened_features_first() -> None:
    obs, space = masked_obs(4)
    assert space.shape == (3 + N_ACTIONS,) and space.n_actions == N_ACTIONS
    assert obs.dtype == np.float32 and obs.shape == (4, 8)
    legal = legal_actions(obs, space)
    assert legal.shape == (4, N_ACTIONS) and legal.any(axis=1).all()
    assert space.contains(obs[0])


def test_the_env_factory_wraps_a_masked_env_by_itself() -> None:
    make = env_factory(EnvConfig(id=f"{__name__}:PickALegalSlot"))
    assert isinstance(make().observation_space, MaskedObs)


def test_uniform_legal_draws_only_legal_actions_and_all_of_them() -> None:
    legal = np.array([[False, True, False, True, False]] * 4000 + [[False] * 5])
    picks = uniform_legal(legal, np.random.default_rng(0))
    assert set(picks[:-1]) == {1, 3} and 0.45 < np.mean(picks[:-1] == 1) < 0.55
    assert 0 <= picks[-1] < 5  # no legal action: any
    space = spaces.Discrete(5, start=2)
    acts = uniform_actions(space, 4000, np.random.default_rng(1), legal[:4000])
    assert set(acts) == {3, 5}


@pytest.mark.parametrize("name", ["dqn", "ppo", "impala", "ppo-gru"])
def test_acting_never_picks_an_illegal_action(name: str) -> None:
    obs, space = masked_obs(3000)
    cls = algorithms.get(name.removesuffix("-gru"))
    config = {"dqn": {"epsilon_start": 1.0}, "ppo-gru": {"core": "gru"}}.get(name, {})
    algo = cls(cls.Config(**config), space, spaces.Discrete(N_ACTIONS), seed=0, device="cpu")
    legal = legal_actions(obs, space)
    rows = np.arange(len(obs))
    for explore in (True, False):
        action = algo.act(obs, explore=explore)["action"]
        assert legal[rows, action].all(), (name, explore)
    if name == "dqn":  # epsilon 1: every action is the uniform draw, spread over the legal
        action = algo.act(obs, explore=True)["action"]
        assert len(set(action)) == N_ACTIONS
    if name == "ppo-gru":  # the unroll the learner runs masks its heads too
        heads, _, _ = algo.net.unroll(
            torch.as_tensor(obs[:, None]), torch.zeros(1, 64), torch.zeros(len(obs), 1, dtype=bool)
        )
        assert (torch.softmax(heads[:, 0], -1).detach().numpy()[~legal] == 0).all()
        return
    exported = algo.greedy_module()
    with torch.no_grad():
        greedy = exported(torch.as_tensor(obs)).numpy()
    assert legal[rows, greedy].all()


def test_ppo_gives_illegal_actions_no_probability_and_no_entropy() -> None:
    obs, space = masked_obs(64)
    algo = algorithms.get("ppo")(
        algorithms.get("ppo").Config(), space, spaces.Discrete(N_ACTIONS), seed=0, device="cpu"
    )
    head, _ = algo.net(torch.as_tensor(obs))
    probs = torch.softmax(head, -1).detach().numpy()
    legal = legal_actions(obs, space)
    assert (probs[~legal] == 0).all()
    assert np.allclose(probs.sum(-1), 1)
    assert np.isfinite(head.detach().numpy()).all()  # finite fill: no NaN in the entropy


def test_dqn_targets_take_the_max_over_legal_next_actions() -> None:
    obs, space = masked_obs(32, seed=3)
    cls = algorithms.get("dqn")
    algo = cls(cls.Config(double=False), space, spaces.Discrete(N_ACTIONS), seed=0, device="cpu")
    q = algo.q_target(torch.as_tensor(obs)).detach().numpy()
    legal = legal_actions(obs, space)
    raw = algo.q_target.net(torch.as_tensor(obs)).detach().numpy()  # type: ignore[operator]
    assert np.allclose(q.max(1), np.where(legal, raw, -np.inf).max(1))


@pytest.mark.parametrize("name", ["sac", "qmix"])
def test_an_algorithm_that_ignores_masks_refuses_them_naming_itself(name: str) -> None:
    _, space = masked_obs(1)
    problem = mask_problem(algorithms.get(name), space)
    assert problem is not None and "action mask" in problem and name in problem
    assert mask_problem(algorithms.get("dqn"), space) is None


def test_a_run_with_masks_and_a_non_masking_algorithm_is_refused_before_it_starts() -> None:
    from tianji.rl.config import RunConfig
    from tianji.services.common import make_algorithm

    plugin = str(ROOT / "examples" / "reinforce.py") + ":Reinforce"  # a user's algorithm
    config = RunConfig(algorithm=plugin, env=EnvConfig(id=f"{__name__}:PickALegalSlot"))
    with pytest.raises(ConfigError) as err:
        make_algorithm(config, seed=0, device="cpu")
    message = str(err.value)
    assert "action mask" in message and "reinforce" in message
    assert "these take them: dqn, impala, ppo" in message


def test_a_masked_env_with_an_unfit_action_space_is_refused() -> None:
    class BoxActions(PickALegalSlot):
        def __init__(self) -> None:
            super().__init__()
            self.action_space = spaces.Box(-1, 1, (2,))  # type: ignore[assignment]

    with pytest.raises(ConfigError, match="Discrete"):
        ActionMaskObservation(BoxActions(), name="box-actions")
