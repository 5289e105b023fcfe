"""``tianji eval``: run a saved policy greedily and report its mean ± std return.

Usage::

    result = evaluate("runs/ppo-CartPole-v1-20250101-120000", episodes=10)
    print(summary_line(result))
    # eval: mean return 500.0 ± 0.0 over 10 episodes (checkpoint ckpt-0000000123.tjc, ...)

The run directory's ``config.json`` says which algorithm and env to build; the weights come
from its newest checkpoint (or ``checkpoint=``). Each episode ``i`` steps one env, made with
the same factory and wrappers the actors use, from ``env.reset(seed=seed + i)``, taking
``algo.act(obs, explore=False)`` actions; so the same checkpoint and seed give the same
returns. With ``video=`` the first episode is recorded (``render_mode="rgb_array"``) through
imageio (the ``video`` extra).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from tianji.rl.checkpoint import (
    Checkpoint,
    CheckpointError,
    check_identity,
    latest_checkpoint,
    read_checkpoint,
    restore_algorithm,
    unpack_state,
)
from tianji.rl.config import RunConfig
from tianji.rl.slots import StateSlots
from tianji.run.config import load_config
from tianji.run.rundir import RunDirectory
from tianji.runtime.errors import ConfigError, TianjiError

__all__ = [
    "VideoError",
    "VideoRecorder",
    "check_compatible",
    "check_video_path",
    "evaluate",
    "load_algorithm",
    "make_eval_env",
    "open_run",
    "resolve_checkpoint",
    "run_episode",
    "summary_line",
]

# What imageio needs to write each video format: (module to import, pip package).
_VIDEO_BACKENDS = {
    ".gif": ("PIL", "pillow"),
    ".mp4": ("imageio_ffmpeg", "imageio-ffmpeg"),
    ".webm": ("imageio_ffmpeg", "imageio-ffmpeg"),
}
_VIDEO_EXTRA = "pip install 'tianji[video]'"


class VideoError(TianjiError):
    """A video cannot be recorded: a missing package, or an env that cannot render frames.

    Attributes:
        path: the requested video file.
        reason: what is missing or wrong.
    """

    def __init__(self, path: str | Path, reason: str) -> None:
        super().__init__(f"--video {path}: {reason}")
        self.path = str(path)
        self.reason = reason


def open_run(run_dir: str | Path) -> tuple[RunDirectory, RunConfig]:
    """The run directory and the resolved run config saved in it.

    Args:
        run_dir: a directory ``tianji train`` wrote (it holds ``config.json``).

    Returns:
        The directory and its config.

    Raises:
        ConfigError: naming ``run_dir`` when it is missing or holds no ``config.json``, or
            naming the config value that is wrong.
    """
    run = RunDirectory(Path(run_dir))
    if not run.path.is_dir():
        raise ConfigError("RUN_DIR", str(run_dir), "an existing run directory")
    if not run.config.is_file():
        raise ConfigError("RUN_DIR", str(run_dir), "a run directory holding config.json")
    return run, load_config(run.config)


def resolve_checkpoint(run: RunDirectory, checkpoint: str | Path | None) -> Checkpoint:
    """Read the checkpoint to evaluate: ``checkpoint`` if given, else the run's newest.

    Args:
        run: the run directory.
        checkpoint: a checkpoint file; a bare name that does not exist as given is looked
            up in the run's ``checkpoints/``.

    Returns:
        The checkpoint, read.

    Raises:
        CheckpointError: naming the file when there is none, or it is missing or damaged.
    """
    if checkpoint is None:
        return read_checkpoint(latest_checkpoint(run.path))
    path = Path(checkpoint)
    if not path.exists() and (run.checkpoints / path).exists():
        path = run.checkpoints / path
    return read_checkpoint(path)


def check_compatible(ckpt: Checkpoint, config: RunConfig) -> None:
    """Check that ``ckpt`` was taken by the run's algorithm on the run's env.

    Raises:
        CheckpointError: naming both values when the checkpoint's ``algorithm`` or
            ``env_id`` differs from the run config's.
    """
    check_identity(ckpt, config.algorithm, config.env.id)


def load_algorithm(config: RunConfig, ckpt: Checkpoint, *, device: str) -> Any:
    """Build the run's algorithm and load the checkpoint's weights into it.

    Args:
        config: the run config (algorithm, ``[algo]`` settings, env spaces).
        ckpt: a checkpoint of that algorithm.
        device: torch device, ``"auto"`` for CUDA when available.

    Returns:
        The algorithm, at ``ckpt.policy_version``.

    Raises:
        CheckpointError: when the state is damaged or does not fit the algorithm (e.g.
            other layer sizes).
        ConfigError: from building the algorithm.
    """
    from tianji.services.common import make_algorithm

    algo = make_algorithm(config, seed=config.seed, device=device)
    try:
        restore_algorithm(algo, unpack_state(ckpt.state), ckpt.policy_version)
    except ValueError as exc:
        raise CheckpointError(ckpt.path, f"is damaged ({exc})") from None
    except (KeyError, RuntimeError, TypeError) as exc:
        why = f"does not fit the run's {config.algorithm} ({type(exc).__name__}: {exc})"
        raise CheckpointError(ckpt.path, why) from None
    return algo


def check_video_path(path: str | Path) -> None:
    """Check that imageio and the writer for ``path``'s format are installed.

    Raises:
        ConfigError: naming ``path`` for a format other than .gif, .mp4, .webm.
        VideoError: naming the missing package and how to install it.
    """
    suffix = Path(path).suffix.lower()
    if suffix not in _VIDEO_BACKENDS:
        raise ConfigError("--video", str(path), f"a file ending in {', '.join(_VIDEO_BACKENDS)}")
    module, package = _VIDEO_BACKENDS[suffix]
    for needed, pip_name in (("imageio", "imageio"), (module, package)):
        if importlib.util.find_spec(needed) is None:
            why = f"writing {suffix} needs {pip_name}, which is not installed ({_VIDEO_EXTRA})"
            raise VideoError(path, why)


def make_eval_env(config: RunConfig, *, video: str | Path | None = None, seed: int = 0) -> Any:
    """One env as the actors make theirs (factory and wrappers), rendering ``rgb_array``
    frames when a video is requested.

    Args:
        config: the run config.
        video: the video file, or ``None`` for no rendering.
        seed: the seed of the probe reset done to check rendering.

    Returns:
        The env (a ``gymnasium.Env``).

    Raises:
        ConfigError: for an unknown env id or wrapper.
        VideoError: naming the env when it cannot render ``rgb_array`` frames.
    """
    from tianji.rl.envs import env_factory

    if video is None:
        return env_factory(config.env, training=False)()
    kwargs = {**config.env.kwargs, "render_mode": "rgb_array"}
    env_config = dataclasses.replace(config.env, kwargs=kwargs)
    try:
        env = env_factory(env_config, training=False)()
    except TypeError as exc:
        raise VideoError(video, f"env {config.env.id} takes no render_mode ({exc})") from None
    try:
        _probe_render(env, config.env.id, video, seed)
    except BaseException:
        env.close()
        raise
    return env


def _probe_render(env: Any, env_id: str, video: str | Path, seed: int) -> None:
    modes = env.metadata.get("render_modes") or []
    if "rgb_array" not in modes or env.render_mode != "rgb_array":
        raise VideoError(video, f"env {env_id} cannot render rgb_array frames (modes {modes})")
    env.reset(seed=seed)
    try:
        frame = env.render()
    except Exception as exc:  # e.g. gymnasium's DependencyNotInstalled (pygame)
        why = f"env {env_id} cannot render ({type(exc).__name__}: {exc})"
        raise VideoError(video, why) from None
    if not (isinstance(frame, np.ndarray) and frame.ndim == 3):
        why = f"env {env_id} rendered {type(frame).__name__}, not an [H, W, 3] image"
        raise VideoError(video, why)


class VideoRecorder:
    """Frames streamed into a video file through imageio (not held in memory).

    Usage::

        with VideoRecorder("eval.mp4", fps=50) as video:
            video.add(env.render())
    """

    def __init__(self, path: str | Path, fps: float) -> None:
        import imageio.v2 as imageio

        self.path = Path(path)
        self.frames = 0
        if self.path.suffix.lower() == ".gif":
            kwargs: dict[str, Any] = {"duration": 1000.0 / fps, "loop": 0}
        else:  # ffmpeg: even sizes suffice for yuv420p (the default 16 would rescale)
            kwargs = {"fps": fps, "macro_block_size": 2}
        self._writer: Any = imageio.get_writer(self.path, mode="I", **kwargs)

    def add(self, frame: np.ndarray) -> None:
        """Append one ``[H, W, 3]`` uint8 frame."""
        self._writer.append_data(frame)
        self.frames += 1

    def close(self) -> None:
        """Finish the file; idempotent."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()

    def __enter__(self) -> VideoRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_episode(
    env: Any, algo: Any, seed: int, video: VideoRecorder | None = None
) -> tuple[float, int]:
    """Play one episode greedily from ``env.reset(seed=seed)``.

    Args:
        env: a ``gymnasium.Env``.
        algo: an algorithm (``act(obs [N, ...], explore=False) -> {"action": [N, ...]}``);
            a recurrent one carries its state from step to step, fresh at the reset.
        seed: the reset seed.
        video: records every frame when given.

    Returns:
        The episode's return and length.
    """
    from gymnasium import spaces
    from gymnasium.vector.utils import concatenate, create_empty_array

    space, action_space = env.observation_space, env.action_space
    batch: Any = create_empty_array(space, n=1)
    clip = (action_space.low, action_space.high) if isinstance(action_space, spaces.Box) else None
    obs, _ = env.reset(seed=seed)
    total, length, done = 0.0, 0, False
    memory = StateSlots.for_algorithm(algo)
    env_ids, starts = np.zeros(1, np.int64), np.ones(1, bool)  # a recurrent policy's state
    while not done:
        if video is not None:
            video.add(env.render())
        # batched as a 1-env vector env batches it, so the policy sees what it trained on
        batched: Any = concatenate(space, [obs], batch)
        if memory is not None:
            out = memory.act(algo, "eval", batched, env_ids, starts, explore=False)
            starts = np.zeros(1, bool)
        else:
            out = algo.act(batched, explore=False)
        action = out["action"][0]
        if clip is not None:
            action = np.clip(action, *clip)
        obs, reward, terminated, truncated, _ = env.step(action)
        total += float(reward)
        length += 1
        done = bool(terminated or truncated)
    if video is not None:
        video.add(env.render())
    return total, length


def evaluate(
    run_dir: str | Path,
    *,
    episodes: int = 10,
    checkpoint: str | Path | None = None,
    video: str | Path | None = None,
    seed: int | None = None,
    device: str = "auto",
    out: TextIO | None = None,
) -> dict[str, Any]:
    """Run a run's saved policy greedily for ``episodes`` episodes.

    Args:
        run_dir: the run directory (``config.json``, ``checkpoints/``).
        episodes: episodes to play (>= 1).
        checkpoint: the checkpoint file (default: the run's newest).
        video: record the first episode to this .mp4 / .gif / .webm file.
        seed: episode ``i`` resets with ``seed + i`` (default: the run config's seed).
        device: torch device for the policy.
        out: where a line per finished episode goes (default stderr).

    Returns:
        ``run_dir``, ``checkpoint``, ``policy_version``, ``algorithm``, ``env_id``,
        ``seed``, ``episodes``, ``returns``, ``lengths``, ``mean_return``, ``std_return``
        (population std) and ``video`` (the file written, or ``None``).

    Raises:
        ConfigError: naming a bad argument (``episodes`` < 1, ``run_dir``, video format).
        CheckpointError: naming a checkpoint that is missing, damaged or of another
            algorithm or env.
        VideoError: when a video is requested but cannot be recorded (checked before any
            episode runs).
    """
    if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1:
        raise ConfigError("--episodes", episodes, "an integer >= 1")
    out = sys.stderr if out is None else out
    run, config = open_run(run_dir)
    ckpt = _checked(run, config, checkpoint, video)
    seed = config.seed if seed is None else seed
    algo = load_algorithm(config, ckpt, device=device)
    env = make_eval_env(config, video=video, seed=seed)
    try:
        returns, lengths = _play(env, algo, episodes, seed, video, out)
    finally:
        env.close()
    return {
        "run_dir": str(run.path),
        "checkpoint": str(ckpt.path),
        "policy_version": ckpt.policy_version,
        "algorithm": config.algorithm,
        "env_id": config.env.id,
        "seed": seed,
        "episodes": episodes,
        "returns": returns,
        "lengths": lengths,
        "mean_return": float(np.mean(returns)),
        "std_return": float(np.std(returns)),
        "video": None if video is None else str(video),
    }


def _checked(
    run: RunDirectory, config: RunConfig, checkpoint: str | Path | None, video: str | Path | None
) -> Checkpoint:
    """The checkpoint to evaluate (see :func:`resolve_checkpoint`), checked against the
    run's config, after checking that ``video`` can be written (before any work)."""
    ckpt = resolve_checkpoint(run, checkpoint)
    check_compatible(ckpt, config)
    if video is not None:
        check_video_path(video)
    return ckpt


def _play(
    env: Any, algo: Any, episodes: int, seed: int, video: str | Path | None, out: TextIO
) -> tuple[list[float], list[int]]:
    returns: list[float] = []
    lengths: list[int] = []
    for i in range(episodes):
        if i == 0 and video is not None:
            with VideoRecorder(video, fps=float(env.metadata.get("render_fps") or 30)) as rec:
                ret, length = run_episode(env, algo, seed + i, rec)
        else:
            ret, length = run_episode(env, algo, seed + i)
        returns.append(ret)
        lengths.append(length)
        print(f"episode {i + 1}/{episodes}: return {ret:.1f}, length {length}", file=out)
    return returns, lengths


def summary_line(result: dict[str, Any]) -> str:
    """The one-line result: ``eval: mean return M ± S over N episodes (checkpoint F,
    policy version V)``."""
    return (
        f"eval: mean return {result['mean_return']:.1f} ± {result['std_return']:.1f} "
        f"over {result['episodes']} episodes (checkpoint {Path(result['checkpoint']).name}, "
        f"policy version {result['policy_version']})"
    )
