"""``tianji eval``: a saved policy run greedily from a run directory's checkpoints."""

from __future__ import annotations

import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from tianji.cli import main
from tianji.rl.checkpoint import CheckpointError, algorithm_state, pack_state, write_checkpoint
from tianji.rl.config import RunConfig
from tianji.run import evaluate as evaluate_module
from tianji.run.config import load_config
from tianji.run.evaluate import VideoError, evaluate, summary_line
from tianji.run.rundir import RunDirectory
from tianji.runtime.errors import ConfigError
from tianji.services.common import make_algorithm

ROOT = Path(__file__).resolve().parents[1]
PPO = ROOT / "examples" / "cartpole_ppo.toml"
DQN = ROOT / "examples" / "cartpole_dqn.toml"

# A CartPole whose rgb_array frames are drawn with numpy (CartPole's own needs pygame).
RENDERABLE = """
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

class DrawnCartPole(CartPoleEnv):
    def render(self):
        if self.render_mode != "rgb_array":
            return super().render()
        frame = np.zeros((32, 48, 3), np.uint8)
        x = int(np.clip(24 + 8 * self.state[0], 0, 47))
        frame[20:, x] = 255
        return frame

class HumanOnlyCartPole(CartPoleEnv):
    metadata = {"render_modes": ["human"], "render_fps": 50}
"""


# --------------------------------------------------------------------------- helpers
def make_run(
    tmp_path: Path, example: Path = PPO, overrides: tuple[str, ...] = ()
) -> tuple[Path, RunConfig]:
    """A run directory holding ``config.json`` (no checkpoint yet)."""
    run_dir = tmp_path / "run"
    config = load_config(example, [f'run_dir="{tmp_path}"', *overrides])
    run_dir.mkdir()
    RunDirectory(run_dir).write_config(config)
    return run_dir, config


def save(run_dir: Path, config: RunConfig, algo: Any, version: int, **meta: Any) -> Path:
    """Write ``algo`` as the run's checkpoint at ``version``."""
    fields = {"algorithm": config.algorithm, "env_id": config.env.id, **meta}
    full = {"policy_version": version, "unix": 0.0, "run": {}, **fields}
    return write_checkpoint(run_dir / "checkpoints", pack_state(algorithm_state(algo)), full)


def ppo(config: RunConfig, seed: int = 123) -> Any:
    return make_algorithm(config, seed=seed, device="cpu")


def balancing_ppo(config: RunConfig, sign: float = 1.0) -> Any:
    """A PPO whose greedy policy balances the pole: push right when 3*angle + angular
    velocity > 0; with ``sign=-1`` it pushes the other way and the pole falls at once."""
    algo = ppo(config)
    first, second, last = (m for m in algo.net.actor if isinstance(m, torch.nn.Linear))
    with torch.no_grad():
        for layer in (first, second, last):
            layer.weight.zero_()
            layer.bias.zero_()
        first.weight[0, 2], first.weight[0, 3] = 3.0, 1.0
        second.weight[0, 0] = 1.0
        last.weight[0, 0], last.weight[1, 0] = -sign, sign
    return algo


def greedy_returns(algo: Any, episodes: int, seed: int) -> list[float]:
    """The returns of ``algo``'s greedy policy on CartPole, episode i reset with seed+i."""
    env = gym.make("CartPole-v1")
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        total, done = 0.0, False
        while not done:
            action = algo.act(obs[None], explore=False)["action"][0]
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return returns


def quiet(**kwargs: Any) -> dict[str, Any]:
    return evaluate(out=io.StringIO(), **kwargs)


# --------------------------------------------------------------------------- choosing
def test_eval_loads_the_latest_checkpoint_and_reports_its_version(tmp_path: Path) -> None:
    run_dir, config = make_run(tmp_path)
    save(run_dir, config, ppo(config, 1), 3)
    newest = save(run_dir, config, ppo(config, 2), 12)
    out = io.StringIO()
    result = evaluate(run_dir, episodes=2, out=out)
    assert result["policy_version"] == 12
    assert result["checkpoint"] == str(newest)
    assert result["episodes"] == 2 and len(result["returns"]) == len(result["lengths"]) == 2
    assert result["mean_return"] == pytest.approx(np.mean(result["returns"]))
    assert result["std_return"] == pytest.approx(np.std(result["returns"]))
    assert out.getvalue().count("\n") == 2 and out.getvalue().startswith("episode 1/2: return ")
    assert summary_line(result) == (
        f"eval: mean return {result['mean_return']:.1f} ± {result['std_return']:.1f} over 2 "
        "episodes (checkpoint ckpt-0000000012.tjc, policy version 12)"
    )


def test_the_checkpoint_option_picks_the_given_file(tmp_path: Path) -> None:
    run_dir, config = make_run(tmp_path)
    older = save(run_dir, config, balancing_ppo(config), 3)
    save(run_dir, config, ppo(config), 12)
    by_path = quiet(run_dir=run_dir, episodes=1, checkpoint=older)
    by_name = quiet(run_dir=run_dir, episodes=1, checkpoint=older.name)
    assert by_path["policy_version"] == by_name["policy_version"] == 3
    assert by_path["checkpoint"] == by_name["checkpoint"] == str(older)


# --------------------------------------------------------------------------- returns
def test_the_returns_are_those_of_the_saved_weights(tmp_path: Path) -> None:
    run_dir, config = make_run(tmp_path)
    balancing, falling = balancing_ppo(config), balancing_ppo(config, sign=-1.0)
    good = save(run_dir, config, balancing, 1)
    bad = save(run_dir, config, falling, 2)
    good_result = quiet(run_dir=run_dir, episodes=3, checkpoint=good, seed=40)
    bad_result = quiet(run_dir=run_dir, episodes=3, checkpoint=bad, seed=40)
    assert good_result["returns"] == greedy_returns(balancing, 3, seed=40)
    assert bad_result["returns"] == greedy_returns(falling, 3, seed=40)
    assert min(good_result["returns"]) == 500.0 and max(bad_result["returns"]) < 20


def test_the_same_seed_gives_the_same_returns(tmp_path: Path) -> None:
    run_dir, config = make_run(tmp_path, DQN)
    save(run_dir, config, make_algorithm(config, seed=5, device="cpu"), 7)
    first = quiet(run_dir=run_dir, episodes=3, seed=11)
    again = quiet(run_dir=run_dir, episodes=3, seed=11)
    assert first["returns"] == again["returns"] and first["lengths"] == again["lengths"]
    assert first["seed"] == 11 and first["algorithm"] == "dqn"


def test_the_seed_defaults_to_the_runs_seed(tmp_path: Path) -> None:
    run_dir, config = make_run(tmp_path, overrides=("seed=9",))
    save(run_dir, config, balancing_ppo(config), 1)
    result = quiet(run_dir=run_dir, episodes=2)
    assert result["seed"] == 9
    assert result["returns"] == quiet(run_dir=run_dir, episodes=2, seed=9)["returns"]


# --------------------------------------------------------------------------- bad input
def test_a_missing_run_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        quiet(run_dir=tmp_path / "nope")
    assert info.value.key == "RUN_DIR" and info.value.value == str(tmp_path / "nope")


def test_a_run_directory_without_config_json_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config\.json") as info:
        quiet(run_dir=tmp_path)
    assert info.value.value == str(tmp_path)


def test_a_run_without_checkpoints_is_an_error(tmp_path: Path) -> None:
    run_dir, _ = make_run(tmp_path)
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        quiet(run_dir=run_dir)


def test_a_damaged_checkpoint_is_named(tmp_path: Path) -> None:
    run_dir, config = make_run(tmp_path)
    path = save(run_dir, config, ppo(config), 4)
    path.write_bytes(path.read_bytes()[:200])  # cut short, e.g. a disk that filled up
    with pytest.raises(CheckpointError) as info:
        quiet(run_dir=run_dir)
    assert info.value.path == str(path) and "damaged" in info.value.reason


def test_a_missing_checkpoint_file_is_named(tmp_path: Path) -> None:
    run_dir, config = make_run(tmp_path)
    save(run_dir, config, ppo(config), 4)
    with pytest.raises(CheckpointError, match=r"ckpt-0000000099\.tjc"):
        quiet(run_dir=run_dir, checkpoint="ckpt-0000000099.tjc")


@pytest.mark.parametrize("episodes", [0, -3])
def test_fewer_than_one_episode_is_refused(tmp_path: Path, episodes: int) -> None:
    with pytest.raises(ConfigError) as info:
        quiet(run_dir=tmp_path, episodes=episodes)
    assert info.value.key == "--episodes" and info.value.value == episodes


def test_a_checkpoint_of_another_algorithm_is_refused(tmp_path: Path) -> None:
    run_dir, _ = make_run(tmp_path)
    dqn_config = load_config(DQN, [f'run_dir="{tmp_path}"'])
    save(run_dir, dqn_config, make_algorithm(dqn_config, seed=0, device="cpu"), 5)
    with pytest.raises(CheckpointError, match=r"algorithm 'dqn'.*'ppo'"):
        quiet(run_dir=run_dir)


def test_a_checkpoint_of_another_env_is_refused(tmp_path: Path) -> None:
    run_dir, config = make_run(tmp_path)
    save(run_dir, config, ppo(config), 5, env_id="Acrobot-v1")
    with pytest.raises(CheckpointError, match=r"env_id 'Acrobot-v1'.*'CartPole-v1'"):
        quiet(run_dir=run_dir)


def test_a_checkpoint_that_does_not_fit_the_network_is_refused(tmp_path: Path) -> None:
    run_dir, config = make_run(tmp_path)
    small = load_config(PPO, [f'run_dir="{tmp_path}"', "algo.hidden=[8]"])
    save(run_dir, config, ppo(small), 5)
    with pytest.raises(CheckpointError, match="does not fit the run's ppo"):
        quiet(run_dir=run_dir)


@pytest.mark.parametrize(
    ("case", "named"),
    [
        ("no-dir", "nope"),
        ("no-config", "config.json"),
        ("no-checkpoint", "holds no checkpoint"),
        ("damaged", "ckpt-0000000004.tjc"),
        ("episodes", "--episodes=0"),
        ("other-algorithm", "'dqn'"),
    ],
)
def test_the_cli_exits_2_with_one_line_naming_the_bad_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, named: str
) -> None:
    run_dir, config = make_run(tmp_path)
    args = [str(run_dir), "--episodes", "1"]
    if case == "no-dir":
        args[0] = str(tmp_path / "nope")
    elif case == "no-config":
        run_dir.joinpath("config.json").unlink()
    elif case == "damaged":
        save(run_dir, config, ppo(config), 4).write_bytes(b"TIANJI-CHECKPOINT 1\n\xc1garbage")
    elif case == "episodes":
        args[2] = "0"
    elif case == "other-algorithm":
        save(run_dir, config, ppo(config), 4, algorithm="dqn")
    assert main(["eval", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tianji: error: ") and err.count("\n") == 1
    assert named in err


def test_the_cli_prints_the_mean_and_std_line(tmp_path: Path) -> None:
    run_dir, config = make_run(tmp_path)
    save(run_dir, config, balancing_ppo(config), 21)
    cmd = [sys.executable, "-m", "tianji", "eval", str(run_dir), "--episodes", "2"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("eval: mean return 500.0 ± 0.0 over 2 episodes ")
    assert "(checkpoint ckpt-0000000021.tjc, policy version 21)" in done.stdout
    assert "episode 2/2: return 500.0, length 500" in done.stderr


def test_the_cli_prints_the_result_as_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir, config = make_run(tmp_path)
    save(run_dir, config, ppo(config), 8)
    assert main(["eval", str(run_dir), "--episodes", "2", "--seed", "3", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["policy_version"] == 8 and result["seed"] == 3
    assert result["returns"] == quiet(run_dir=run_dir, episodes=2, seed=3)["returns"]


# --------------------------------------------------------------------------- video
def drawn_run(tmp_path: Path, env_class: str) -> Path:
    env_file = tmp_path / "drawn_env.py"
    env_file.write_text(RENDERABLE)
    run_dir, config = make_run(tmp_path, overrides=(f'env.id="{env_file}:{env_class}"',))
    # a falling policy: the env class has no time limit, so short episodes keep this fast
    save(run_dir, config, balancing_ppo(config, sign=-1.0), 2)
    return run_dir


@pytest.mark.skipif(
    importlib.util.find_spec("imageio") is None or importlib.util.find_spec("PIL") is None,
    reason="the video extra (imageio, with pillow for .gif) is not installed",
)
def test_a_video_of_the_first_episode_is_written(tmp_path: Path) -> None:
    import imageio.v3 as iio

    run_dir = drawn_run(tmp_path, "DrawnCartPole")
    gif = tmp_path / "eval.gif"
    result = quiet(run_dir=run_dir, episodes=2, seed=1, video=gif)
    assert result["video"] == str(gif)
    frames = iio.imread(gif, index=None)
    # the reset frame, then one per step; identical consecutive frames may be merged
    assert 2 <= len(frames) <= result["lengths"][0] + 1 and frames.shape[1:3] == (32, 48)
    assert result["returns"] == quiet(run_dir=run_dir, episodes=2, seed=1)["returns"]


def test_a_video_needs_imageio(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = drawn_run(tmp_path, "DrawnCartPole")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        evaluate_module.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "imageio" else real(name, *a),
    )
    with pytest.raises(VideoError, match=r"needs imageio.*tianji\[video\]") as info:
        quiet(run_dir=run_dir, episodes=1, video=tmp_path / "eval.gif")
    assert info.value.path == str(tmp_path / "eval.gif")


def test_a_video_of_an_unknown_format_is_refused(tmp_path: Path) -> None:
    run_dir = drawn_run(tmp_path, "DrawnCartPole")
    with pytest.raises(ConfigError) as info:
        quiet(run_dir=run_dir, video="eval.png")
    assert info.value.key == "--video" and info.value.value == "eval.png"


@pytest.mark.skipif(importlib.util.find_spec("imageio") is None, reason="imageio not installed")
def test_a_video_of_an_env_without_rgb_array_fails_before_any_episode(tmp_path: Path) -> None:
    run_dir = drawn_run(tmp_path, "HumanOnlyCartPole")
    out = io.StringIO()
    with pytest.raises(VideoError, match="HumanOnlyCartPole cannot render rgb_array"):
        evaluate(run_dir, episodes=2, video=tmp_path / "eval.gif", out=out)
    assert out.getvalue() == "" and not (tmp_path / "eval.gif").exists()


@pytest.mark.skipif(importlib.util.find_spec("imageio") is None, reason="imageio not installed")
def test_a_video_of_cartpole_without_pygame_names_pygame(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pygame", None)  # `import pygame` fails, installed or not
    run_dir, config = make_run(tmp_path)
    save(run_dir, config, ppo(config), 1)
    with pytest.raises(VideoError, match="pygame"):
        quiet(run_dir=run_dir, episodes=1, video=tmp_path / "eval.gif")
