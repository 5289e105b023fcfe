"""What DQN and QMIX share: the config fields of a replay learner with a target network and
epsilon-greedy actors, n-step transitions, the exploration schedule, the TD loss and the
replay buffer's spec.

* :class:`ReplayConfig`: the ``[algo]`` fields both have (each config inherits it,
  overriding defaults where its own differ);
* :func:`n_step_transitions`: a ``[T, N]`` fragment as flat n-step transitions;
* :func:`epsilon_at` / :func:`epsilon_greedy`: the schedule and the exploring actions;
* :func:`td_loss`;
* :class:`QLearner`: the base of both algorithm classes (target networks, exploration,
  the replay buffer).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from tianji.algorithms._base import AlgorithmBase
from tianji.algorithms._nets import as_hidden, polyak_update
from torch import nn

from tianji.rl.algorithm import BufferSpec
from tianji.rl.errors import ConfigError
from tianji.rl.masks import uniform_legal
from tianji.rl.pbt import HyperRange

__all__ = [
    "OffPolicyConfig",
    "QLearner",
    "ReplayConfig",
    "epsilon_at",
    "epsilon_greedy",
    "n_step_transitions",
    "td_loss",
]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class OffPolicyConfig:
    """The fields of every in-tree off-policy algorithm's config: the replay buffer, the
    update-to-data ratio and the warm-up (defaults: DQN's on CartPole-v1)."""

    gamma: float = 0.99
    """Discount factor per environment step."""
    n_step: int = 3
    """Rewards summed into one transition (cut at episode and fragment ends)."""
    lr: float = 5e-4
    """Adam learning rate."""
    hidden: Sequence[int] = (128, 128)
    """Hidden layer sizes of the MLPs (QMIX: of the shared agent network)."""
    batch_size: int = 128
    """Transitions per learner update."""
    buffer_capacity: int = 50_000
    """Transitions the replay buffer keeps at most."""
    learning_starts: int = 1_000
    """Transitions stored before the first update: the actors collect exactly this many
    (rounded up to whole fragments) before the learner starts, and the update-to-data
    ratio counts the env steps after them."""
    updates_per_step: float = 0.125
    """Learner updates per env step collected after ``learning_starts`` (the
    update-to-data ratio): the controller keeps the run at it (``[controller]
    replay_ratio`` overrides it in samples consumed per sample inserted)."""
    random_steps: int = 0
    """Env steps at the start of the run acted uniformly at random over the action space
    (split evenly over the actors) instead of by the policy."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden", as_hidden("algorithm.hidden", self.hidden))
        for key in ("n_step", "batch_size", "buffer_capacity"):
            if type(getattr(self, key)) is not int or getattr(self, key) <= 0:
                raise ConfigError(f"algorithm.{key}", getattr(self, key), "a positive integer")
        for key in ("learning_starts", "random_steps"):
            if type(getattr(self, key)) is not int or getattr(self, key) < 0:
                raise ConfigError(f"algorithm.{key}", getattr(self, key), "an integer >= 0")
        if not 0.0 <= self.gamma <= 1.0:
            raise ConfigError("algorithm.gamma", self.gamma, "a number in [0, 1]")
        if not self.updates_per_step > 0:
            raise ConfigError("algorithm.updates_per_step", self.updates_per_step, "a number > 0")
        if self.learning_starts > self.buffer_capacity:
            raise ConfigError(
                "algorithm.learning_starts", self.learning_starts, "at most buffer_capacity"
            )

    def replay_spec(self, kind: str = "replay") -> BufferSpec:
        """The replay buffer these fields ask for (uniform unless ``kind`` says otherwise)."""
        return BufferSpec(
            kind=kind,
            capacity=self.buffer_capacity,
            batch_size=self.batch_size,
            min_size=self.learning_starts,
            updates_per_step=self.updates_per_step,
            random_steps=self.random_steps,
        )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ReplayConfig(OffPolicyConfig):
    """The fields every replay Q-learning algorithm's config has: :class:`OffPolicyConfig`'s
    and a target network and epsilon-greedy exploration (defaults: DQN's on CartPole-v1)."""

    target_update_interval: int = 250
    """Learner updates between target-network updates."""
    tau: float = 1.0
    """Target update rate: 1 copies the online nets (hard update), < 1 is Polyak averaging."""
    epsilon_start: float = 1.0
    """Exploration rate before the first learner update."""
    epsilon_end: float = 0.05
    """Exploration rate after ``epsilon_decay_updates`` learner updates."""
    epsilon_decay_updates: int = 5_000
    """Learner updates over which epsilon decays linearly."""
    max_grad_norm: float = 10.0
    """Gradient-norm clip per update."""
    huber_delta: float = 1.0
    """Where the Huber loss turns from quadratic to linear (0: mean squared error)."""

    def __post_init__(self) -> None:
        OffPolicyConfig.__post_init__(self)
        interval = self.target_update_interval
        if type(interval) is not int or interval <= 0:
            raise ConfigError("algorithm.target_update_interval", interval, "a positive integer")
        if not 0.0 < self.tau <= 1.0:
            raise ConfigError("algorithm.tau", self.tau, "a number in (0, 1]")
        if self.huber_delta < 0.0:
            raise ConfigError("algorithm.huber_delta", self.huber_delta, "a number >= 0")


def n_step_transitions(fragment: Mapping[str, np.ndarray], n: int, gamma: float) -> dict[str, Any]:
    """Flatten a ``[T, N]`` fragment into ``T*N`` n-step transitions (row ``t*N + i``).

    The transition at ``(t, i)`` sums ``k = min(n, T - t, steps to the episode end)``
    rewards: ``reward = sum_j gamma**j r[t+j]``, ``next_obs = next_obs[t+k-1]`` (the true
    final observation at an episode end) and ``discount = gamma**k``, or 0 when the
    episode *terminated* within the k steps. A truncation keeps ``gamma**k``: the target
    bootstraps from the final observation.

    Returns:
        ``obs``, ``action`` (int64, or float32 ``[T*N, D]`` for Box actions), ``reward``,
        ``next_obs``, ``discount`` shaped ``[T*N, ...]``.
    """
    reward = np.asarray(fragment["reward"], dtype=np.float64)
    terminated = np.asarray(fragment["terminated"], dtype=bool)
    ended = terminated | np.asarray(fragment["truncated"], dtype=bool)
    horizon, n_env = reward.shape
    rows = np.arange(horizon)
    total = np.zeros_like(reward)
    last = np.broadcast_to(rows[:, None], reward.shape).copy()
    alive = np.ones(reward.shape, dtype=bool)
    for j in range(n):
        step = rows + j
        alive &= (step < horizon)[:, None]
        step = np.minimum(step, horizon - 1)
        total += np.where(alive, gamma**j * reward[step], 0.0)
        last = np.where(alive, step[:, None], last)
        alive &= ~ended[step]
    cols = np.arange(n_env)[None, :]
    k = last - rows[:, None] + 1
    discount = np.where(terminated[last, cols], 0.0, gamma**k)
    flat = horizon * n_env
    return {
        "obs": _obs_dtype(fragment["obs"]).reshape(flat, *np.shape(fragment["obs"])[2:]),
        "action": _action_dtype(fragment["action"]).reshape(
            flat, *np.shape(fragment["action"])[2:]
        ),
        "reward": total.astype(np.float32).reshape(flat),
        "next_obs": _obs_dtype(np.asarray(fragment["next_obs"])[last, cols]).reshape(
            flat, *np.shape(fragment["next_obs"])[2:]
        ),
        "discount": discount.astype(np.float32).reshape(flat),
    }


def _action_dtype(action: np.ndarray) -> np.ndarray:
    """Continuous (Box) actions travel as float32 ``[..., D]``, discrete ones as int64."""
    action = np.asarray(action)
    return action.astype(np.float32 if np.issubdtype(action.dtype, np.floating) else np.int64)


def _obs_dtype(obs: np.ndarray) -> np.ndarray:
    """Floating observations travel as float32; integer ones (pixels) keep their dtype."""
    obs = np.asarray(obs)
    return obs.astype(np.float32) if np.issubdtype(obs.dtype, np.floating) else obs


def epsilon_at(updates: int, start: float, end: float, decay_updates: int) -> float:
    """Linear schedule: ``start`` at 0 learner updates, ``end`` from ``decay_updates`` on."""
    if decay_updates <= 0:
        return end
    frac = min(1.0, max(0, updates) / decay_updates)
    return start + frac * (end - start)


def epsilon_greedy(
    greedy: np.ndarray,
    n_actions: int,
    epsilon: float,
    rng: np.random.Generator,
    legal: np.ndarray | None = None,
) -> np.ndarray:
    """``greedy`` actions (any shape), each replaced by a uniform one with probability
    ``epsilon``: among the legal ones where ``legal`` (bool ``[N, n_actions]``, for
    ``greedy [N]``) says which are."""
    if legal is None:
        random = rng.integers(0, n_actions, size=greedy.shape)
    else:
        random = uniform_legal(legal, rng)
    return np.where(rng.random(greedy.shape) < epsilon, random, greedy)


def td_loss(
    q: torch.Tensor, target: torch.Tensor, delta: float, weight: torch.Tensor | None = None
) -> torch.Tensor:
    """The mean Huber loss (``delta > 0``) or squared error (``delta == 0``) of ``q`` to
    ``target``, each term weighted by ``weight`` (prioritized replay) if given."""
    if delta > 0:
        each = F.huber_loss(q, target, reduction="none", delta=delta)
    else:
        each = F.mse_loss(q, target, reduction="none")
    return (each if weight is None else each * weight).mean()


class QLearner(AlgorithmBase):
    """:class:`AlgorithmBase` with what DQN and QMIX add alike: the epsilon schedule and
    epsilon-greedy actions, target networks that start as copies of the online ones and
    follow them every ``target_update_interval`` updates.

    Usage (besides ``AlgorithmBase``'s class attributes)::

        targets = (("q", "q_target"),)   # (online, target) module names
        self._init_targets()             # in _build, after the networks
        self._count_update()             # in update, after the optimizer step
    """

    perturbable: ClassVar[Mapping[str, HyperRange]] = {"lr": HyperRange(1e-5, 1e-2)}
    """What PBT may change: the learning rate (n-step returns are made on the actors, so
    their discount is not the learner's to change)."""

    targets: ClassVar[tuple[tuple[str, str], ...]]
    config: ReplayConfig
    n_actions: int

    @property
    def epsilon(self) -> float:
        """The exploration rate at the current learner ``version``."""
        c = self.config
        return epsilon_at(self.version, c.epsilon_start, c.epsilon_end, c.epsilon_decay_updates)

    def actor_metrics(self) -> dict[str, float]:
        """What an actor reports after each fragment: the epsilon it explored with."""
        return {"epsilon": self.epsilon}

    def _explore(self, greedy: np.ndarray, legal: np.ndarray | None = None) -> np.ndarray:
        """:func:`epsilon_greedy` at the current :attr:`epsilon` (among ``legal`` actions)."""
        return epsilon_greedy(greedy, self.n_actions, self.epsilon, self.rng, legal)

    def _target_pairs(self) -> list[tuple[nn.Module, nn.Module]]:
        return [(self._module(online), self._module(target)) for online, target in self.targets]

    def _init_targets(self) -> None:
        """Each target network a frozen copy of its online one."""
        for online, target in self._target_pairs():
            target.load_state_dict(online.state_dict())
            target.requires_grad_(False)

    def buffer_spec(self) -> BufferSpec:
        """Uniform replay over flat transitions."""
        return self.config.replay_spec()

    def _count_update(self) -> None:
        """One more update; every ``target_update_interval`` of them move each target
        network toward its online one by ``tau`` (:func:`polyak_update`)."""
        self.version += 1
        if self.version % self.config.target_update_interval == 0:
            for online, target in self._target_pairs():
                polyak_update(online, target, self.config.tau)
