"""The Atari preset: ``[env] preset = "atari"`` with an ``ALE/<Game>-v5`` id.

The standard preprocessing of the DQN/PPO/IMPALA papers, built from gymnasium's wrappers
and two small ones of ours, innermost first:

1. ``ALE/<Game>-v5`` with ``frameskip = 1`` and sticky actions
   (``repeat_action_probability``, 0.25 by default as in the v5 ids).
2. :class:`gymnasium.wrappers.AtariPreprocessing`: up to ``noop_max`` no-op actions at
   reset, ``frame_skip`` (4) frames per agent step with the max of the last two, 84x84
   grayscale, uint8 (never scaled here: the network scales on its device).
3. :class:`gymnasium.wrappers.RecordEpisodeStatistics`: the *true* episode, all lives,
   unclipped rewards, in ``info["episode"]`` at game over; the actors report these returns
   (``tianji.services.actor.FragmentCollector``).
4. Training only: :class:`EpisodicLife` (a lost life ends the training episode, the game
   goes on), :class:`FireReset` for games that wait for FIRE, and reward clipping to
   {-1, 0, 1}.
5. :class:`gymnasium.wrappers.FrameStackObservation`: the last ``frame_stack`` (4) frames,
   observations ``uint8 [4, 84, 84]``.

Evaluation (``tianji eval``) builds the same env without step 4: whole games, raw scores.
``[env] preset_options`` sets the fields of :class:`AtariOptions`.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Mapping
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

from tianji.runtime.errors import ConfigError

__all__ = ["AtariOptions", "EpisodicLife", "FireReset", "atari_factory", "frames_per_step"]

INSTALL_HINT = "pip install 'tianji[atari]' (ale-py with its ROMs, opencv-python-headless)"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AtariOptions:
    """``[env] preset_options`` of the Atari preset (defaults: the usual Atari settings)."""

    noop_max: int = 30
    """Up to this many no-op actions after a reset (random starts)."""
    frame_skip: int = 4
    """Emulator frames per agent step (the action repeats; the max of the last two frames
    is observed). Frames per second in reports count these frames."""
    screen_size: int = 84
    """Observed frames are ``screen_size x screen_size`` grayscale."""
    frame_stack: int = 4
    """The observation stacks this many last frames: ``uint8 [frame_stack, size, size]``."""
    sticky_actions: float = 0.25
    """Probability that the emulator repeats the previous action instead (ALE v5)."""
    full_action_space: bool = False
    """All 18 Atari actions instead of the game's minimal set."""
    episodic_life: bool = True
    """Training: a lost life ends the episode (the game goes on; the reported returns stay
    whole games)."""
    clip_rewards: bool = True
    """Training: rewards are clipped to their sign (reported returns stay unclipped)."""
    fire_reset: bool = True
    """Training: press FIRE after a reset in games whose second action is FIRE."""

    def __post_init__(self) -> None:
        for key in ("frame_skip", "screen_size", "frame_stack"):
            if type(getattr(self, key)) is not int or getattr(self, key) < 1:
                raise ConfigError(f"env.preset_options.{key}", getattr(self, key), "an int >= 1")
        if type(self.noop_max) is not int or self.noop_max < 0:
            raise ConfigError("env.preset_options.noop_max", self.noop_max, "an int >= 0")
        if not 0.0 <= self.sticky_actions <= 1.0:
            raise ConfigError(
                "env.preset_options.sticky_actions", self.sticky_actions, "a number in [0, 1]"
            )


def atari_options(data: Mapping[str, Any]) -> AtariOptions:
    """:class:`AtariOptions` from ``[env] preset_options``, keys and types checked."""
    from tianji.rl.config import build_dataclass

    options: AtariOptions = build_dataclass(AtariOptions, data, "env.preset_options")
    return options


def frames_per_step(preset: str, options: Mapping[str, Any]) -> int:
    """Emulator frames per agent step of a preset (1 without a preset)."""
    return atari_options(options).frame_skip if preset == "atari" else 1


class EpisodicLife(gym.Wrapper[Any, Any, Any, Any]):
    """A lost life terminates the episode; the next ``reset`` continues the same game
    (one no-op step) unless the game is over."""

    def __init__(self, env: gym.Env[Any, Any]) -> None:
        super().__init__(env)
        self.lives = 0
        self.game_over = True

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = self.env.unwrapped.ale.lives()  # type: ignore[attr-defined]
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        if self.game_over:
            obs, info = self.env.reset(**kwargs)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:  # the no-op ended the game: start a new one
                obs, info = self.env.reset(**kwargs)
        self.game_over = False
        self.lives = self.env.unwrapped.ale.lives()  # type: ignore[attr-defined]
        return obs, info


class FireReset(gym.Wrapper[Any, Any, Any, Any]):
    """Press FIRE after every reset (games such as Breakout wait for it)."""

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(1)
        if terminated or truncated:
            obs, info = self.env.reset(**kwargs)
        return obs, info


def _sign(reward: SupportsFloat) -> float:
    return float(np.sign(float(reward)))


def atari_factory(
    env_id: str, kwargs: Mapping[str, Any], options: Mapping[str, Any], *, training: bool
) -> Callable[[], gym.Env[Any, Any]]:
    """A factory of the preprocessed Atari env (see the module docstring).

    Raises:
        ConfigError: if ale-py is missing, ``env_id`` is not an ALE id (close matches
            named), or an option is unknown or out of range.
    """
    opts = atari_options(options)
    _require_ale(env_id)
    if "frameskip" in kwargs:
        why = "not set with the atari preset (use [env] preset_options.frame_skip)"
        raise ConfigError("env.kwargs.frameskip", kwargs["frameskip"], why)
    make_kwargs = {
        "repeat_action_probability": opts.sticky_actions,
        "full_action_space": opts.full_action_space,
        **kwargs,
        "frameskip": 1,
    }

    def build() -> gym.Env[Any, Any]:
        from gymnasium import wrappers

        env: gym.Env[Any, Any] = gym.make(env_id, **make_kwargs)
        env = wrappers.AtariPreprocessing(
            env,
            noop_max=opts.noop_max,
            frame_skip=opts.frame_skip,
            screen_size=opts.screen_size,
            grayscale_obs=True,
            scale_obs=False,
        )
        env = wrappers.RecordEpisodeStatistics(env)
        if training:
            if opts.episodic_life:
                env = EpisodicLife(env)
            meanings = env.unwrapped.get_action_meanings()  # type: ignore[attr-defined]
            if opts.fire_reset and len(meanings) > 1 and meanings[1] == "FIRE":
                env = FireReset(env)
            if opts.clip_rewards:
                env = wrappers.TransformReward(env, _sign)
        return wrappers.FrameStackObservation(env, opts.frame_stack)

    return build


def _require_ale(env_id: str) -> None:
    try:
        import ale_py
    except ImportError:
        raise ConfigError("env.preset", "atari", INSTALL_HINT) from None
    gym.register_envs(ale_py)
    ale_ids = sorted(k for k, s in gym.registry.items() if "ale_py" in str(s.entry_point))
    if env_id not in ale_ids:
        close = difflib.get_close_matches(env_id, ale_ids, n=3, cutoff=0.5)
        hint = f"; close matches: {', '.join(close)}" if close else ""
        raise ConfigError("env.id", env_id, f"an ALE id such as ALE/Pong-v5{hint}")
