"""Multi-agent envs: the PettingZoo adapter, the fragment and batch layout, MAPPO's math.

The particle env (mpe2 ``simple_spread_v3``) is used where its real behaviour matters; a
small hand-made parallel env (``Counting``) where exact values are checked.
"""

from __future__ import annotations

import asyncio
import copy
import io
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from gymnasium import spaces

from tianji.rl.buffers import ReplayBuffer, RolloutBuffer
from tianji.rl.config import EnvConfig, RunConfig
from tianji.rl.envs import env_spaces_and_state, make_vector_env
from tianji.rl.multiagent import ParallelEnvAdapter, pettingzoo_factory
from tianji.runtime.errors import ConfigError
from tianji.services.collector import FragmentCollector
from tianji.services.common import make_algorithm, transitions

pytest.importorskip("mpe2")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SPREAD = EnvConfig(id="mpe2.simple_spread_v3", api="pettingzoo", kwargs={"N": 3, "max_cycles": 25})


class Counting:
    """A parallel env with exactly known values: agent ``i`` observes ``[t, i]``, gets
    reward ``action + i``, the state is ``[t]``; the episode lasts ``length`` steps and
    ends terminated when ``terminate`` else truncated. ``leave`` drops agent_1 after
    step 1 (an agent done before the others)."""

    metadata: ClassVar[dict[str, Any]] = {}

    def __init__(
        self, length: int = 3, terminate: bool = False, leave: bool = False, state: bool = True
    ) -> None:
        self.possible_agents = ["agent_0", "agent_1"]
        self.agents: list[str] = []
        self.length, self.terminate, self.leave = length, terminate, leave
        self.t = 0
        if state:
            self.state_space = spaces.Box(-np.inf, np.inf, (1,), np.float32)

    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(-np.inf, np.inf, (2,), np.float32)

    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(3)

    def _obs(self) -> dict[str, np.ndarray]:
        return {a: np.array([self.t, i], np.float32) for i, a in enumerate(self.possible_agents)}

    def state(self) -> np.ndarray:
        return np.array([self.t], np.float32)

    def reset(self, seed: int | None = None, options: Any = None) -> tuple[dict, dict]:
        self.t = 0
        self.agents = list(self.possible_agents)
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions: dict[str, int]) -> tuple[dict, dict, dict, dict, dict]:
        self.t += 1
        index = {a: i for i, a in enumerate(self.possible_agents)}
        rewards = {a: float(act + index[a]) for a, act in actions.items()}
        over = self.t >= self.length
        leaving = self.leave and self.t == 1
        terms = {a: (over and self.terminate) or (leaving and a == "agent_1") for a in actions}
        truncs = {a: over and not self.terminate for a in actions}
        obs = {a: o for a, o in self._obs().items() if a in actions}
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        return obs, rewards, terms, truncs, {a: {} for a in actions}

    def close(self) -> None:
        pass


def test_simple_spread_is_one_env_with_stacked_agents_a_team_reward_and_a_global_state() -> None:
    observation, action, state = env_spaces_and_state(SPREAD)
    assert observation.shape == (3, 18)
    assert isinstance(action, spaces.MultiDiscrete) and action.nvec.tolist() == [5, 5, 5]
    assert state is not None and state.shape == (54,)
    env = pettingzoo_factory(SPREAD.id, dict(SPREAD.kwargs), "sum")()
    obs, info = env.reset(seed=3)
    assert obs.shape == (3, 18) and info["state"].shape == (54,)
    steps = 0
    while True:
        obs, reward, terminated, truncated, info = env.step(np.array([1, 2, 3]))
        steps += 1
        assert reward == pytest.approx(float(info["agent_reward"].sum()), rel=1e-5)
        if terminated or truncated:
            break
    assert (steps, terminated, truncated) == (25, False, True)  # max_cycles is a time limit


def test_team_reward_mean_agent_rewards_and_a_missing_state_are_built_from_the_agents() -> None:
    env = ParallelEnvAdapter(Counting(state=False), team_reward="mean")
    obs, info = env.reset()
    assert env.state_space.shape == (4,)  # no state_space: the observations concatenated
    np.testing.assert_array_equal(info["state"], obs.reshape(-1))
    _, reward, *_, info = env.step(np.array([2, 1]))
    np.testing.assert_array_equal(info["agent_reward"], [2.0, 2.0])
    assert reward == 2.0


def test_an_agent_done_early_gets_zeros_and_the_episode_ends_terminated_when_all_are() -> None:
    env = ParallelEnvAdapter(Counting(length=3, terminate=True, leave=True))
    env.reset()
    obs, reward, terminated, truncated, _ = env.step(np.array([0, 0]))
    assert (reward, terminated, truncated) == (1.0, False, False)
    obs, reward, terminated, truncated, info = env.step(np.array([1, 2]))  # agent_1 gone
    np.testing.assert_array_equal(obs[1], [0.0, 0.0])
    np.testing.assert_array_equal(info["agent_reward"], [1.0, 0.0])
    *_, terminated, truncated, _ = env.step(np.array([0, 0]))
    assert (terminated, truncated) == (True, False)


def test_bad_multi_agent_envs_are_refused_naming_the_id_or_the_agent() -> None:
    with pytest.raises(ConfigError, match="no_such_module"):
        pettingzoo_factory("no_such_module.env_v0", {}, "sum")
    with pytest.raises(ConfigError, match="parallel_env"):
        pettingzoo_factory("numpy:not_a_thing", {}, "sum")
    with pytest.raises(ConfigError, match=r"env\.api"):
        EnvConfig(id="x", api="rllib")
    with pytest.raises(ConfigError, match=r"env\.team_reward"):
        EnvConfig(id="x", api="pettingzoo", team_reward="max")

    class Mixed(Counting):
        def action_space(self, agent: str) -> spaces.Discrete:
            return spaces.Discrete(3 if agent == "agent_0" else 4)

    with pytest.raises(ConfigError, match="agent_1"):
        ParallelEnvAdapter(Mixed())

    class Continuous(Counting):
        def action_space(self, agent: str) -> spaces.Box:  # type: ignore[override]
            return spaces.Box(-1, 1, (2,))

    with pytest.raises(ConfigError, match="Discrete actions"):
        ParallelEnvAdapter(Continuous())


def test_single_and_multi_agent_algorithms_refuse_the_other_kind_of_env() -> None:
    with pytest.raises(ConfigError, match="multi-agent env"):
        make_algorithm(RunConfig(algorithm="mappo"), seed=0, device="cpu")
    with pytest.raises(ConfigError, match='use "mappo" or "qmix"'):
        make_algorithm(RunConfig(algorithm="ppo", env=SPREAD), seed=0, device="cpu")


def _collect(config: EnvConfig | None, n_envs: int, length: int, **counting: Any) -> dict:
    if config is None:
        from gymnasium.vector import AutoresetMode, SyncVectorEnv

        envs = SyncVectorEnv(
            [lambda: ParallelEnvAdapter(Counting(**counting))] * n_envs,
            autoreset_mode=AutoresetMode.SAME_STEP,
        )
    else:
        envs = make_vector_env(config, n_envs)
    collector = FragmentCollector(envs, length, seed=0)
    rng = np.random.default_rng(0)

    async def act(obs: np.ndarray, rows: range, starts: np.ndarray) -> dict[str, np.ndarray]:
        return {"action": rng.integers(0, 3, size=obs.shape[:2])}

    fragment, _, _ = asyncio.run(collector.collect(act))
    envs.close()
    return fragment


def test_a_multi_agent_fragment_carries_per_agent_columns_and_the_true_final_state() -> None:
    frag = _collect(None, 2, 7)
    shapes = {k: v.shape for k, v in frag.items()}
    assert shapes == {
        "obs": (7, 2, 2, 2),
        "action": (7, 2, 2),
        "reward": (7, 2),
        "agent_reward": (7, 2, 2),
        "terminated": (7, 2),
        "truncated": (7, 2),
        "next_obs": (7, 2, 2, 2),
        "state": (7, 2, 1),
        "next_state": (7, 2, 1),
    }
    # Counting's state is the step count: 0,1,2 then the episode ends at 3 and restarts at 0
    np.testing.assert_array_equal(frag["state"][:, 0, 0], [0, 1, 2, 0, 1, 2, 0])
    np.testing.assert_array_equal(frag["next_state"][:, 0, 0], [1, 2, 3, 1, 2, 3, 1])
    np.testing.assert_array_equal(frag["truncated"][:, 0], [0, 0, 1, 0, 0, 1, 0])
    np.testing.assert_array_equal(frag["next_obs"][2, 0, :, 0], [3, 3])  # the final obs
    np.testing.assert_allclose(frag["agent_reward"], frag["action"] + np.array([0, 1]))
    np.testing.assert_allclose(frag["reward"], frag["agent_reward"].sum(-1))


def test_multi_agent_fragments_and_transitions_keep_their_layout_through_the_buffers() -> None:
    frag = _collect(SPREAD, n_envs=3, length=10)
    rollout = RolloutBuffer(4, min_size=2)
    rollout.add(frag, policy_version=0)
    rollout.add({k: v[:, :2] for k, v in frag.items()}, policy_version=0)  # another N
    batch, _ = rollout.take(2)  # type: ignore[misc]
    assert batch["obs"].shape == (10, 5, 3, 18) and batch["state"].shape == (10, 5, 54)
    assert batch["action"].shape == (10, 5, 3) and batch["reward"].shape == (10, 5)
    np.testing.assert_array_equal(batch["obs"][:, 3:], frag["obs"][:, :2])
    assert transitions(batch) == 50  # env steps, not agent steps

    flat = {
        "obs": frag["obs"].reshape(30, 3, 18),
        "action": frag["action"].reshape(30, 3),
        "state": frag["state"].reshape(30, 54),
    }
    replay = ReplayBuffer(100, seed=0)
    assert replay.add(flat, policy_version=0) == 30
    sample = replay.sample(8)
    assert sample is not None
    assert sample["obs"].shape == (8, 3, 18) and sample["action"].shape == (8, 3)
    np.testing.assert_array_equal(sample["state"], flat["state"][sample["index"]])


# --------------------------------------------------------------------------- MAPPO


def _mappo(**algo: Any) -> Any:
    config = RunConfig(algorithm="mappo", env=SPREAD, algo=algo)
    return make_algorithm(config, seed=0, device="cpu")


def test_mappo_acts_for_every_agent_with_one_shared_policy() -> None:
    from tianji.algorithms._multiagent import agent_inputs

    algo = _mappo()
    obs = np.random.default_rng(0).normal(size=(4, 3, 18)).astype(np.float32)
    out = algo.act(obs, explore=True)
    assert out["action"].shape == (4, 3) and out["action"].dtype == np.int64
    assert out["logp"].shape == (4, 3) and np.all(out["logp"] <= 0)
    assert set(np.unique(out["action"])) <= set(range(5))
    inputs = agent_inputs(obs, with_id=True)
    assert inputs.shape == (4, 3, 21)
    torch.testing.assert_close(inputs[:, :, 18:], torch.eye(3).expand(4, 3, 3))
    # one network for all agents: without the id, equal observations give equal policies
    same = np.repeat(obs[:, :1], 3, axis=1)
    logits = _mappo(agent_id=False).net.logits(agent_inputs(same, with_id=False))
    torch.testing.assert_close(logits[:, 0], logits[:, 1])
    assert algo.get_weights().keys() == {k for k in algo.net.actor.state_dict()}


def test_mappo_learns_a_cooperative_matrix_game_from_the_team_reward() -> None:
    """Counting pays ``action + i`` per agent: the best joint action is (2, 2)."""
    from tianji.algorithms.mappo import MAPPO

    env = ParallelEnvAdapter(Counting(length=4))
    algo = MAPPO(
        MAPPO.Config(lr=3e-3, reward_scale=0.3, update_epochs=5),
        env.observation_space,
        env.action_space,
        state_space=env.state_space,
        device="cpu",
    )
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    envs = SyncVectorEnv(
        [lambda: ParallelEnvAdapter(Counting(length=4))] * 4, autoreset_mode=AutoresetMode.SAME_STEP
    )
    collector = FragmentCollector(envs, 16, seed=0)

    async def act(obs: np.ndarray, rows: range, starts: np.ndarray) -> dict[str, np.ndarray]:
        return algo.act(obs, explore=True)  # type: ignore[no-any-return]

    rewards = []
    for _ in range(15):
        frag, _, _ = asyncio.run(collector.collect(act))
        rewards.append(float(frag["reward"].mean()))
        result = algo.update(algo.postprocess(frag))
    assert np.isfinite(result.metrics["loss"])
    assert rewards[0] < 3.6  # before any update, random: 2 (actions) + 1 (indices) per step
    assert np.mean(rewards[-3:]) > 4.5  # best: 2 + 2 + 1 = 5


def test_mappo_restored_from_its_state_dict_makes_the_identical_next_update() -> None:
    frag = _collect(SPREAD, n_envs=2, length=10)
    a = _mappo()
    batch = a.postprocess({**frag, "logp": np.full(frag["action"].shape, -1.6, np.float32)})
    a.update(batch)
    b = _mappo()
    b.load_state_dict(copy.deepcopy(a.state_dict()))  # as through a checkpoint file
    a.rng, b.rng = np.random.default_rng(1), np.random.default_rng(1)
    a.update(batch)
    b.update(batch)
    for (name, x), y in zip(a.net.state_dict().items(), b.net.state_dict().values(), strict=True):
        torch.testing.assert_close(x, y, msg=name)


@pytest.mark.parametrize("algorithm", ["mappo", "qmix"])
def test_a_multi_agent_checkpoint_restores_exactly_and_plays_team_episodes_in_eval(
    tmp_path: Path, algorithm: str
) -> None:
    from tianji.rl.checkpoint import algorithm_state, pack_state, read_checkpoint, write_checkpoint
    from tianji.run.config import load_config
    from tianji.run.evaluate import evaluate, load_algorithm
    from tianji.run.rundir import RunDirectory

    config = load_config(EXAMPLES / f"spread_{algorithm}.toml", [f'run_dir="{tmp_path}"'])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    RunDirectory(run_dir).write_config(config)
    algo = make_algorithm(config, seed=7, device="cpu")
    meta = {"policy_version": 42, "unix": 0.0, "run": {}, "algorithm": algorithm}
    state = pack_state(algorithm_state(algo))
    path = write_checkpoint(run_dir / "checkpoints", state, {**meta, "env_id": config.env.id})
    restored = load_algorithm(config, read_checkpoint(path), device="cpu")
    for (name, mine), theirs in zip(
        algo.get_weights().items(), restored.get_weights().values(), strict=True
    ):
        np.testing.assert_array_equal(mine, theirs, err_msg=name)
    result = evaluate(run_dir, episodes=2, out=io.StringIO())
    assert result["policy_version"] == 42 and result["lengths"] == [25, 25]
    assert all(-400 < r < 0 for r in result["returns"])  # simple_spread: costs only


def test_mappo_hands_every_minibatch_gradient_to_the_learners_sync() -> None:
    """With K learners the averaged gradient replaces each one's own, every step."""
    frag = _collect(SPREAD, n_envs=2, length=10)
    batch = {**frag, "logp": np.full(frag["action"].shape, -1.6, np.float32)}
    plain, synced = _mappo(update_epochs=2), _mappo(update_epochs=2)
    calls: list[int] = []

    def halve(flat: np.ndarray) -> np.ndarray:  # as if the other learner's gradient were 0
        calls.append(flat.size)
        return flat / 2

    synced.gradient_sync = halve
    plain.update(plain.postprocess(batch))
    synced.update(synced.postprocess(batch))
    n_params = sum(p.numel() for p in synced.net.parameters())
    assert calls == [n_params] * 4  # 2 epochs x 2 minibatches
    moved = [
        not torch.equal(a, b)
        for a, b in zip(plain.net.parameters(), synced.net.parameters(), strict=True)
    ]
    assert all(moved)
