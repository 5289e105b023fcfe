"""The Atari preset and the convolutional policies: shapes, dtypes, whole-game returns,
uint8 pixels all the way into the network, and a CNN that learns a small pixel task."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from tianji.algorithms._nets import NatureCNN
from tianji.algorithms.dqn import DQN, DQNConfig
from tianji.algorithms.ppo import PPO, PPOConfig

from tianji.cli import main
from tianji.rl.config import EnvConfig
from tianji.rl.envs import env_factory, env_spaces, make_vector_env
from tianji.runtime.errors import ConfigError
from tianji.services.collector import FragmentCollector

pytest.importorskip("ale_py", reason="the atari extra: pip install 'tianji[atari]'")

PONG = EnvConfig(id="ALE/Pong-v5", preset="atari")
INVADERS = EnvConfig(id="ALE/SpaceInvaders-v5", preset="atari")  # 3 lives, 5-200 points


def play_one_game(training: bool, seed: int = 1) -> dict[str, Any]:
    env = env_factory(INVADERS, training=training)()
    obs, _ = env.reset(seed=seed)
    env.action_space.seed(seed)
    shapes, rewards, ends = {obs.shape}, [], 0
    try:
        while True:
            obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
            shapes.add(obs.shape)
            rewards.append(float(reward))
            if terminated or truncated:
                ends += 1
                if "episode" in info:
                    return {
                        "obs": obs,
                        "shapes": shapes,
                        "rewards": rewards,
                        "ends": ends,
                        "game": float(info["episode"]["r"]),
                    }
                env.reset()
    finally:
        env.close()


def test_training_frames_are_stacked_uint8_with_clipped_rewards_and_a_life_per_episode() -> None:
    game = play_one_game(training=True)
    assert game["shapes"] == {(4, 84, 84)}
    assert game["obs"].dtype == np.uint8
    assert set(game["rewards"]) <= {-1.0, 0.0, 1.0}
    assert game["ends"] == 3  # one training episode per life
    assert game["game"] > sum(game["rewards"])  # the game's true score, unclipped
    assert game["game"] % 5 == 0


def test_evaluation_plays_whole_games_with_raw_scores() -> None:
    game = play_one_game(training=False)
    assert game["ends"] == 1
    assert max(game["rewards"]) >= 5.0
    assert game["game"] == sum(game["rewards"])


def test_the_actor_reports_whole_games_with_raw_scores_not_lives() -> None:
    envs = make_vector_env(INVADERS, 2)
    collector = FragmentCollector(envs, 1000, seed=3)
    rng = np.random.default_rng(0)

    async def act(obs: np.ndarray, rows: range, starts: np.ndarray) -> dict[str, np.ndarray]:
        return {"action": rng.integers(0, 6, size=len(obs))}

    try:
        fragment, returns, lengths = asyncio.run(collector.collect(act))
    finally:
        collector.close()
    ends = int((fragment["terminated"] | fragment["truncated"]).sum())
    assert returns and ends >= 3 * len(returns)  # lives ended training episodes
    assert all(r % 5 == 0 and r > 0 for r in returns)
    assert fragment["obs"].dtype == np.uint8 and fragment["obs"].shape == (1000, 2, 4, 84, 84)
    assert all(length > 100 for length in lengths)


@pytest.mark.parametrize(
    ("config", "key"),
    [
        (EnvConfig(id="ALE/Pongg-v5", preset="atari"), "env.id"),
        (EnvConfig(id="CartPole-v1", preset="atari"), "env.id"),
        (EnvConfig(id="ALE/Pong-v5", preset="atari", kwargs={"frameskip": 4}), "frameskip"),
        (EnvConfig(id="ALE/Pong-v5", preset="atari", preset_options={"stack": 4}), "stack"),
        (EnvConfig(id="ALE/Pong-v5", preset="atari", preset_options={"frame_skip": 0}), "frame"),
    ],
)
def test_a_bad_atari_setting_is_a_config_error_naming_it(config: EnvConfig, key: str) -> None:
    with pytest.raises(ConfigError, match=key) as info:
        env_factory(config)
    if config.id == "ALE/Pongg-v5":
        assert "ALE/Pong-v5" in str(info.value)  # a close match is suggested


def test_an_unknown_preset_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"env\.preset"):
        EnvConfig(id="ALE/Pong-v5", preset="atary")


class InputDtypes:
    """Records the dtype of every batch that enters a :class:`NatureCNN`."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.seen: set[torch.dtype] = set()
        cnns = [m for m in module.modules() if isinstance(m, NatureCNN)]
        assert cnns, "the network has no CNN torso"
        for cnn in cnns:
            cnn.register_forward_pre_hook(self.hook)

    def hook(self, module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        self.seen.add(args[0].dtype)


def pong_fragment(length: int = 8, envs: int = 2) -> dict[str, np.ndarray]:
    vec = make_vector_env(PONG, envs)
    collector = FragmentCollector(vec, length, seed=0)
    rng = np.random.default_rng(0)

    async def act(obs: np.ndarray, rows: range, starts: np.ndarray) -> dict[str, np.ndarray]:
        assert obs.dtype == np.uint8
        return {"action": rng.integers(0, 6, size=len(obs))}

    try:
        fragment, _, _ = asyncio.run(collector.collect(act))
    finally:
        collector.close()
    return fragment


def test_pixels_stay_uint8_from_the_env_into_the_ppo_and_dqn_networks() -> None:
    obs_space, action_space = env_spaces(PONG)
    fragment = pong_fragment()
    assert fragment["obs"].dtype == np.uint8 and fragment["next_obs"].dtype == np.uint8

    ppo = PPO(PPOConfig(num_minibatches=2, update_epochs=1), obs_space, action_space, device="cpu")
    ppo_inputs = InputDtypes(ppo.net)
    out = ppo.act(fragment["obs"][0], explore=True)
    samples = ppo.postprocess({**fragment, **{k: np.stack([out[k]] * 8) for k in out}})
    assert samples["obs"].dtype == np.uint8
    ppo.update(samples)
    assert ppo_inputs.seen == {torch.uint8}

    dqn = DQN(DQNConfig(batch_size=4), obs_space, action_space, device="cpu")
    dqn_inputs = InputDtypes(dqn.q)
    dqn_inputs_target = InputDtypes(dqn.q_target)
    dqn.act(fragment["obs"][0], explore=False)
    transitions = dqn.postprocess({**fragment, "action": np.zeros((8, 2), np.int64)})
    assert transitions["obs"].dtype == np.uint8 and transitions["next_obs"].dtype == np.uint8
    dqn.update({k: v[:4] for k, v in transitions.items()})
    assert dqn_inputs.seen == {torch.uint8} and dqn_inputs_target.seen == {torch.uint8}


def test_a_ppo_cnn_learns_which_side_the_square_is_on() -> None:
    """A one-step pixel task: a bright 8x8 square on the left or the right of a dark
    1x36x36 image; action 0 (left) or 1 (right) earns 1 when it names the square's side."""
    obs_space = gym.spaces.Box(0, 255, (1, 36, 36), np.uint8)
    config = PPOConfig(lr=1e-3, num_minibatches=2, update_epochs=2, ent_coef=0.0)
    ppo = PPO(config, obs_space, gym.spaces.Discrete(2), seed=0, device="cpu")
    assert ppo.net.image
    rng = np.random.default_rng(0)

    def batch(n: int = 64) -> tuple[np.ndarray, np.ndarray]:
        sides = rng.integers(0, 2, size=n)
        obs = np.zeros((n, 1, 36, 36), np.uint8)
        for i, side in enumerate(sides):
            row, col = rng.integers(4, 24), 4 if side == 0 else 24
            obs[i, 0, row : row + 8, col : col + 8] = 255
        return obs, sides

    accuracy = []
    for _ in range(30):
        obs, sides = batch()
        out = ppo.act(obs, explore=True)
        reward = (out["action"] == sides).astype(np.float32)
        accuracy.append(float(reward.mean()))
        one = np.ones((1, len(obs)), bool)
        ppo.update(
            {
                "obs": obs[None],
                "next_obs": obs[None],
                "action": out["action"][None],
                "logp": out["logp"][None],
                "value": out["value"][None],
                "reward": reward[None],
                "terminated": one,
                "truncated": ~one,
            }
        )
    obs, sides = batch(256)
    greedy = ppo.act(obs, explore=False)["action"]
    assert np.mean(accuracy[:3]) < 0.7  # chance at first
    assert float((greedy == sides).mean()) > 0.95


@pytest.mark.slow
def test_the_pong_example_trains_checkpoints_and_eval_records_a_video(tmp_path: Path) -> None:
    pytest.importorskip("imageio_ffmpeg", reason="the video extra writes .mp4 through ffmpeg")
    example = Path(__file__).parents[1] / "examples" / "pong_ppo.toml"
    cmd = [sys.executable, "-m", "tianji", "train", str(example), "--no-dashboard"]
    # sync on-policy: every batch of env steps waits for the learner's update, so 3 batches
    # cannot pass without learner updates (checkpointed after every one)
    cmd += ["--set", f'run_dir="{tmp_path}"', "--set", "stop.max_env_steps=3072"]
    cmd += ["--set", "checkpoint.every_updates=1", "--summary", str(tmp_path / "summary.json")]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["learner_updates"] >= 2 and summary["env_steps"] >= 3072
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert list((run_dir / "checkpoints").glob("*.tjc"))
    video = tmp_path / "pong.mp4"
    args = ["eval", str(run_dir), "--episodes", "1", "--video", str(video), "--json"]
    assert main(args) == 0
    import imageio.v3 as iio

    frames = iio.improps(video).shape[0]
    assert frames > 100  # a whole game of Pong, not a few frames
