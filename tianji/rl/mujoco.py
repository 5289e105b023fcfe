"""The MuJoCo preset: ``[env] preset = "mujoco"`` with a gymnasium MuJoCo id
(``HalfCheetah-v5``, ``Hopper-v5``, ``Walker2d-v5``, ``Ant-v5``, ``Humanoid-v5``, ...).

What it adds to a plain id: the check that the id is one of gymnasium's MuJoCo tasks (close
matches named otherwise), an error that says how to install MuJoCo when it is missing, and
the standard time limit (the id's registered one, 1000 steps for the locomotion tasks;
``max_episode_steps`` changes it). Observations are not normalized in the env: each actor
process would keep statistics of its own. SAC and TD3 train on the raw observations, as
Stable-Baselines3 and the RL Zoo do; PPO normalizes with statistics the learner keeps
(``[algo] normalize_obs = true``), the same on every actor. ``[env] preset_options`` sets
the fields of :class:`MujocoOptions`.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym

from tianji.runtime.errors import ConfigError

__all__ = ["INSTALL_HINT", "MujocoOptions", "is_mujoco_id", "mujoco_factory", "require_mujoco"]

INSTALL_HINT = (
    "pip install 'tianji[mujoco]' (the mujoco wheels and gymnasium's MuJoCo envs; "
    "`make setup` installs them)"
)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MujocoOptions:
    """``[env] preset_options`` of the MuJoCo preset."""

    max_episode_steps: int = 0
    """Steps before an episode is truncated (0: the id's registered limit, 1000 for the
    locomotion tasks)."""

    def __post_init__(self) -> None:
        if type(self.max_episode_steps) is not int or self.max_episode_steps < 0:
            raise ConfigError(
                "env.preset_options.max_episode_steps", self.max_episode_steps, "an int >= 0"
            )


def is_mujoco_id(env_id: str) -> bool:
    """Whether ``env_id`` is registered as one of gymnasium's MuJoCo envs."""
    spec = gym.registry.get(env_id)
    entry = getattr(spec, "entry_point", None)
    return isinstance(entry, str) and entry.startswith("gymnasium.envs.mujoco")


def require_mujoco(env_id: str) -> None:
    """Raise the install hint when the ``mujoco`` package cannot be imported.

    Raises:
        ConfigError: naming ``env.id`` and how to install MuJoCo.
    """
    try:
        importlib.import_module("mujoco")
    except ImportError as exc:
        raise ConfigError("env.id", env_id, f"MuJoCo installed ({exc}): {INSTALL_HINT}") from None


def mujoco_factory(
    env_id: str, kwargs: Mapping[str, Any], options: Mapping[str, Any]
) -> Callable[[], gym.Env[Any, Any]]:
    """A factory of the MuJoCo task ``env_id`` with the preset's time limit.

    Raises:
        ConfigError: for an id that is not a MuJoCo task (naming close ones), bad options,
            or MuJoCo not installed (saying how to install it).
    """
    from tianji.rl.config import build_dataclass

    opts: MujocoOptions = build_dataclass(MujocoOptions, options, "env.preset_options.")
    if not is_mujoco_id(env_id):
        known = [name for name in gym.registry if is_mujoco_id(name)]
        close = difflib.get_close_matches(env_id, known, n=3, cutoff=0.4)
        hint = f"; close matches: {', '.join(close)}" if close else ""
        raise ConfigError("env.id", env_id, f"a gymnasium MuJoCo id (e.g. HalfCheetah-v5){hint}")
    require_mujoco(env_id)
    make_kwargs: dict[str, Any] = dict(kwargs)
    if opts.max_episode_steps:
        make_kwargs["max_episode_steps"] = opts.max_episode_steps
    return lambda: gym.make(env_id, **make_kwargs)
