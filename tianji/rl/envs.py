"""Environments: resolve a configured env, make vector envs, read its spaces."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.wrappers import RecordEpisodeStatistics

from tianji.rl.config import EnvConfig
from tianji.rl.masks import ActionMaskObservation, has_mask_keys, uniform_legal
from tianji.runtime.errors import ConfigError

__all__ = [
    "MaskedCartPole",
    "env_factory",
    "env_spaces",
    "env_spaces_and_state",
    "make_vector_env",
    "random_policy_returns",
    "records_episodes",
    "uniform_actions",
]


class MaskedCartPole(gym.ObservationWrapper[np.ndarray, int, np.ndarray]):
    """CartPole-v1 with the velocities hidden: the observation is ``[cart position, pole
    angle]`` only, so a policy must remember earlier observations to balance the pole.

    The env id ``tianji.rl.envs:MaskedCartPole`` makes it
    (``--env tianji.rl.envs:MaskedCartPole``); keyword arguments go to
    ``gymnasium.make("CartPole-v1", ...)``. Episodes end as CartPole-v1's do (500 steps at
    most).
    """

    KEPT = (0, 2)
    """The indices of CartPole's observation that stay: position and angle."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(gym.make("CartPole-v1", **kwargs))
        inner = self.env.observation_space
        assert isinstance(inner, gym.spaces.Box)
        kept = list(self.KEPT)
        self.observation_space = gym.spaces.Box(inner.low[kept], inner.high[kept], dtype=np.float32)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        """Position and angle of CartPole's observation."""
        return np.asarray(observation, np.float32)[list(self.KEPT)]


def env_factory(config: EnvConfig, *, training: bool = True) -> Callable[[], gym.Env[Any, Any]]:
    """Return a zero-argument factory for the configured env, preset and wrappers applied;
    an env with ``Dict(observation, action_mask)`` observations comes flattened
    (:class:`~tianji.rl.masks.ActionMaskObservation`).

    Args:
        training: the env the actors train on; ``False`` for evaluation, where a preset
            leaves out what only shapes training (the Atari preset's episodic lives and
            reward clipping).

    Raises:
        ConfigError: naming the env id (with close matches) or a wrapper that is unknown.
    """
    make = _base_factory(config, training)
    from tianji.runtime.plugins import load_factory

    wrappers = []
    for spec in config.wrappers:
        try:
            wrappers.append(load_factory(spec))
        except ConfigError as exc:
            raise ConfigError("env.wrappers", spec, exc.expected) from None

    def build() -> gym.Env[Any, Any]:
        env = make()
        for wrapper in wrappers:
            env = wrapper(env)
        if has_mask_keys(env.observation_space):  # one flat array with the mask last
            env = ActionMaskObservation(env, name=config.id)
        return env

    return build


def _base_factory(config: EnvConfig, training: bool) -> Callable[[], gym.Env[Any, Any]]:
    env_id, kwargs = config.id, dict(config.kwargs)
    if config.preset == "atari":
        from tianji.rl.atari import atari_factory

        return atari_factory(env_id, kwargs, config.preset_options, training=training)
    if config.preset == "mujoco":
        from tianji.rl.mujoco import mujoco_factory

        return mujoco_factory(env_id, kwargs, config.preset_options)
    if config.api == "two_player":
        from tianji.rl.selfplay import two_player_factory

        return two_player_factory(env_id, kwargs, "alternate")
    if config.api == "pettingzoo":
        from tianji.rl.multiagent import pettingzoo_factory

        return pettingzoo_factory(env_id, kwargs, config.team_reward)
    if ":" in env_id and env_id not in gym.registry:
        from tianji.runtime.plugins import load_factory

        cls = load_factory(env_id)
        return lambda: cls(**kwargs)
    if env_id not in gym.registry:
        close = difflib.get_close_matches(env_id, list(gym.registry), n=3, cutoff=0.5)
        hint = f"; close matches: {', '.join(close)}" if close else ""
        raise ConfigError("env.id", env_id, f"a registered gymnasium id{hint}")
    from tianji.rl.mujoco import is_mujoco_id, require_mujoco

    if is_mujoco_id(env_id):
        require_mujoco(env_id)  # gymnasium registers the ids without MuJoCo installed
    return lambda: gym.make(env_id, **kwargs)


def env_spaces(config: EnvConfig) -> tuple[gym.Space[Any], gym.Space[Any]]:
    """Make the env once and return its (observation, action) spaces."""
    observation, action, _ = env_spaces_and_state(config)
    return observation, action


def env_spaces_and_state(
    config: EnvConfig,
) -> tuple[gym.Space[Any], gym.Space[Any], gym.Space[Any] | None]:
    """Make the env once: its (observation, action, state) spaces; the state space is
    ``None`` unless the env is multi-agent (``api = "pettingzoo"``)."""
    from tianji.rl.multiagent import ParallelEnvAdapter

    env = env_factory(config)()
    try:
        inner = env.unwrapped
        state = inner.state_space if isinstance(inner, ParallelEnvAdapter) else None
        return env.observation_space, env.action_space, state
    finally:
        env.close()


def make_vector_env(config: EnvConfig, num_envs: int) -> SyncVectorEnv:
    """``num_envs`` copies stepped together; finished envs reset in the same step, and the
    true final observation is in ``info["final_obs"]``. Two-player games without wrappers
    come as a :class:`~tianji.rl.selfplay_vector.TwoPlayerVectorEnv` (a ``SyncVectorEnv``
    whose opponents move in batches)."""
    factory = env_factory(config)
    if config.api == "two_player" and not config.wrappers:
        from tianji.rl.selfplay_vector import TwoPlayerVectorEnv

        return TwoPlayerVectorEnv([factory] * num_envs)  # the opponents' moves batched
    return SyncVectorEnv([factory] * num_envs, autoreset_mode=AutoresetMode.SAME_STEP)


def records_episodes(env: gym.Env[Any, Any]) -> bool:
    """Whether ``env`` (or a wrapper inside it) is gymnasium's ``RecordEpisodeStatistics``:
    its ``info["episode"]`` then holds the true episode (e.g. all lives, unclipped rewards),
    which the actors report instead of the sum of the rewards they train on."""
    while True:
        if isinstance(env, RecordEpisodeStatistics):
            return True
        if not isinstance(env, gym.Wrapper):
            return False
        env = env.env


def random_policy_returns(config: EnvConfig, episodes: int, *, seed: int = 0) -> np.ndarray:
    """Returns of ``episodes`` episodes of uniformly random actions: the baseline a trained
    policy is compared with (the team return for multi-agent envs).

    Raises:
        ConfigError: if ``episodes`` < 1, or from building the env.
    """
    if episodes < 1:
        raise ConfigError("episodes", episodes, "a positive integer")
    env = env_factory(config, training=False)()
    env.action_space.seed(seed)
    returns = np.zeros(episodes, np.float64)
    try:
        for k in range(episodes):
            env.reset(seed=seed + k)
            done = False
            while not done:
                _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
                returns[k] += float(reward)
                done = bool(terminated or truncated)
    finally:
        env.close()
    return returns


def uniform_actions(
    space: gym.Space[Any], n: int, rng: np.random.Generator, legal: np.ndarray | None = None
) -> np.ndarray:
    """``n`` actions drawn uniformly from ``space``: a bounded ``Box`` (float32 ``[n, ...]``
    within its bounds), ``Discrete`` or ``MultiDiscrete`` (int64) — an off-policy
    algorithm's random warm-up (``BufferSpec.random_steps``). With ``legal`` (bool
    ``[n, space.n]``, :func:`~tianji.rl.masks.legal_actions`) a ``Discrete`` action is drawn
    among each row's legal ones (any, where a row has none).

    Raises:
        ConfigError: for another space or an unbounded Box, naming it.
    """
    if isinstance(space, gym.spaces.Box) and space.is_bounded():
        low, high = space.low.astype(np.float64), space.high.astype(np.float64)
        return rng.uniform(low, high, size=(n, *space.shape)).astype(np.float32)
    if isinstance(space, gym.spaces.Discrete):
        if legal is None:
            return rng.integers(space.start, space.start + space.n, size=n, dtype=np.int64)
        picked: np.ndarray = space.start + uniform_legal(legal, rng)
        return picked
    if isinstance(space, gym.spaces.MultiDiscrete):
        start = np.asarray(space.start, np.int64)
        return start + rng.integers(0, space.nvec, size=(n, *space.shape), dtype=np.int64)
    why = "a bounded Box, Discrete or MultiDiscrete action space to draw random actions from"
    raise ConfigError("algo.random_steps", space, why)
