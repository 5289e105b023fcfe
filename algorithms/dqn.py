"""DQN: double Q-learning with n-step returns, a target network and optional prioritized replay.

Read top to bottom: the config, the pure math (n-step returns, the double-DQN target,
the epsilon schedule), then the :class:`DQN` object the actor and learner services drive.

* Actors call ``act`` (epsilon-greedy; epsilon follows the *learner's* update count, which
  reaches actors as the ``version`` of ``set_weights``) and ``postprocess`` (turns a
  ``[T, N]`` fragment into flat n-step transitions).
* The learner calls ``update`` on replay batches; with prioritized replay it gets
  ``batch["weight"]`` and returns new priorities ``|td error| + eps``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tianji.algorithms._nets import (
    adam,
    as_hidden,
    box_obs_problem,
    build_network,
    gradient_step,
    load_numpy_weights,
    numpy_weights,
    obs_tensor,
    pick_device,
    polyak_update,
    require_spaces,
    resolve_torso,
    seeded_init,
)

from tianji.rl.algorithm import BufferSpec, GradientSync, UpdateResult
from tianji.rl.errors import ConfigError

__all__ = ["DQN", "DQNConfig", "double_dqn_target", "epsilon_at", "n_step_transitions"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DQNConfig:
    """Hyperparameters of :class:`DQN` (defaults tuned for CartPole-v1)."""

    gamma: float = 0.99
    """Discount factor per environment step."""
    n_step: int = 3
    """Rewards summed into one transition (cut at episode and fragment ends)."""
    lr: float = 5e-4
    """Adam learning rate."""
    hidden: Sequence[int] = (128, 128)
    """Hidden layer sizes of the Q-network MLP (not used by the "nature" torso)."""
    torso: str = "auto"
    """The Q-network's body: "mlp", "nature" (the Nature-DQN CNN for uint8 image
    observations, e.g. the Atari preset's) or "auto" (the CNN for images, else the MLP)."""
    batch_size: int = 128
    """Transitions per learner update."""
    buffer_capacity: int = 50_000
    """Transitions the replay buffer keeps at most."""
    learning_starts: int = 1_000
    """Transitions stored before the first batch is handed out."""
    target_update_interval: int = 250
    """Learner updates between target-network updates."""
    tau: float = 1.0
    """Target update rate: 1 copies the online net (hard update), < 1 is Polyak averaging."""
    epsilon_start: float = 1.0
    """Exploration rate before the first learner update."""
    epsilon_end: float = 0.05
    """Exploration rate after ``epsilon_decay_updates`` learner updates."""
    epsilon_decay_updates: int = 5_000
    """Learner updates over which epsilon decays linearly."""
    max_grad_norm: float = 10.0
    """Gradient-norm clip per update."""
    huber_delta: float = 1.0
    """Where the Huber loss turns from quadratic to linear."""
    double: bool = True
    """Pick next actions with the online net and evaluate them with the target net."""
    prioritized: bool = False
    """Use proportional prioritized replay instead of uniform replay."""
    alpha: float = 0.6
    """Priority exponent (prioritized replay)."""
    beta: float = 0.4
    """Importance-weight exponent (prioritized replay)."""
    priority_eps: float = 1e-6
    """Added to ``|td error|`` so no transition gets priority zero."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden", as_hidden("algorithm.hidden", self.hidden))
        for key in ("n_step", "batch_size", "buffer_capacity", "target_update_interval"):
            if type(getattr(self, key)) is not int or getattr(self, key) <= 0:
                raise ConfigError(f"algorithm.{key}", getattr(self, key), "a positive integer")
        if not 0.0 <= self.gamma <= 1.0:
            raise ConfigError("algorithm.gamma", self.gamma, "a number in [0, 1]")
        if not 0.0 < self.tau <= 1.0:
            raise ConfigError("algorithm.tau", self.tau, "a number in (0, 1]")
        if self.learning_starts > self.buffer_capacity:
            raise ConfigError(
                "algorithm.learning_starts", self.learning_starts, "at most buffer_capacity"
            )


# --------------------------------------------------------------------------- pure math


def n_step_transitions(fragment: Mapping[str, np.ndarray], n: int, gamma: float) -> dict[str, Any]:
    """Flatten a ``[T, N]`` fragment into ``T*N`` n-step transitions (row ``t*N + i``).

    The transition at ``(t, i)`` sums ``k = min(n, T - t, steps to the episode end)``
    rewards: ``reward = sum_j gamma**j r[t+j]``, ``next_obs = next_obs[t+k-1]`` (the true
    final observation at an episode end) and ``discount = gamma**k``, or 0 when the
    episode *terminated* within the k steps. A truncation keeps ``gamma**k``: the target
    bootstraps from the final observation.

    Returns:
        ``obs``, ``action``, ``reward``, ``next_obs``, ``discount`` shaped ``[T*N, ...]``.
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
        "action": np.asarray(fragment["action"], dtype=np.int64).reshape(flat),
        "reward": total.astype(np.float32).reshape(flat),
        "next_obs": _obs_dtype(np.asarray(fragment["next_obs"])[last, cols]).reshape(
            flat, *np.shape(fragment["next_obs"])[2:]
        ),
        "discount": discount.astype(np.float32).reshape(flat),
    }


def _obs_dtype(obs: np.ndarray) -> np.ndarray:
    """Floating observations travel as float32; integer ones (pixels) keep their dtype."""
    obs = np.asarray(obs)
    return obs.astype(np.float32) if np.issubdtype(obs.dtype, np.floating) else obs


def double_dqn_target(
    reward: torch.Tensor,
    discount: torch.Tensor,
    next_q_online: torch.Tensor,
    next_q_target: torch.Tensor,
) -> torch.Tensor:
    """``reward + discount * Q_target(s', argmax_a Q_online(s', a))`` per transition.

    Pass the target net's values as both ``next_q`` arguments for vanilla DQN's max.
    """
    best = next_q_online.argmax(dim=1, keepdim=True)
    return reward + discount * next_q_target.gather(1, best).squeeze(1)


def epsilon_at(updates: int, start: float, end: float, decay_updates: int) -> float:
    """Linear schedule: ``start`` at 0 learner updates, ``end`` from ``decay_updates`` on."""
    if decay_updates <= 0:
        return end
    frac = min(1.0, max(0, updates) / decay_updates)
    return start + frac * (end - start)


# --------------------------------------------------------------------------- algorithm


class DQN:
    """Double DQN with n-step returns over an MLP Q-network (see :class:`DQNConfig`).

    Usage::

        algo = DQN(DQN.Config(), env.observation_space, env.action_space, seed=0)
        out = algo.act(obs, explore=True)         # {"action": int64 [N]}
        transitions = algo.postprocess(fragment)  # flat n-step transitions
        result = algo.update(replay_batch)        # -> UpdateResult(metrics, priorities)
    """

    name = "dqn"
    Config = DQNConfig

    @staticmethod
    def check_spaces(observation_space: Any, action_space: Any) -> str | None:
        """``None`` if DQN supports the spaces, else a message naming the unsupported one."""
        from gymnasium import spaces

        if not isinstance(action_space, spaces.Discrete):
            return (
                f"DQN needs a gymnasium.spaces.Discrete action space, got {action_space!r}; "
                "use PPO for continuous (Box) actions"
            )
        return box_obs_problem(observation_space)

    def __init__(
        self,
        config: DQNConfig,
        observation_space: Any,
        action_space: Any,
        *,
        seed: int = 0,
        device: str = "auto",
    ) -> None:
        require_spaces(
            self.check_spaces(observation_space, action_space), observation_space, action_space
        )
        self.config = config
        self.device = pick_device(device)
        self.n_actions = int(action_space.n)
        self.action_start = int(action_space.start)
        self.version = 0
        self.rng = np.random.default_rng(seed)
        torso = resolve_torso("algo.torso", config.torso, observation_space)
        self.image = torso == "nature"
        with seeded_init(seed):
            self.q = build_network(torso, observation_space, config.hidden, self.n_actions)
            self.q_target = build_network(torso, observation_space, config.hidden, self.n_actions)
        self.q.to(self.device)
        self.q_target.to(self.device)
        self.q_target.load_state_dict(self.q.state_dict())
        self.q_target.requires_grad_(False)
        self._optimizer: torch.optim.Optimizer | None = None  # built on first update
        self.gradient_sync: GradientSync | None = None  # set by the learner when K > 1

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """Adam, built on first use: actors never update, and building an optimizer imports
        a good part of torch (seconds of start-up per actor process)."""
        if self._optimizer is None:
            self._optimizer = adam(self.q.parameters(), lr=self.config.lr)
        return self._optimizer

    @property
    def epsilon(self) -> float:
        """The exploration rate at the current learner ``version``."""
        c = self.config
        return epsilon_at(self.version, c.epsilon_start, c.epsilon_end, c.epsilon_decay_updates)

    def act(self, obs: np.ndarray, *, explore: bool) -> dict[str, np.ndarray]:
        """Epsilon-greedy (``explore``) or greedy actions for ``obs [N, ...]``."""
        with torch.no_grad():
            greedy = (
                self.q(obs_tensor(obs, self.device, image=self.image)).argmax(dim=1).cpu().numpy()
            )
        if explore:
            n = len(greedy)
            random = self.rng.integers(0, self.n_actions, size=n)
            greedy = np.where(self.rng.random(n) < self.epsilon, random, greedy)
        return {"action": (greedy + self.action_start).astype(np.int64)}

    def postprocess(self, fragment: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Flat n-step transitions from a ``[T, N]`` fragment (see :func:`n_step_transitions`)."""
        return n_step_transitions(fragment, self.config.n_step, self.config.gamma)

    def update(self, batch: Mapping[str, np.ndarray]) -> UpdateResult:
        """One gradient step on a replay batch; returns metrics and, if prioritized, priorities."""
        c, dev = self.config, self.device
        action = torch.as_tensor(batch["action"], dtype=torch.int64, device=dev)
        q = self.q(obs_tensor(batch["obs"], dev, image=self.image))
        q_taken = q.gather(1, (action - self.action_start)[:, None]).squeeze(1)
        with torch.no_grad():
            next_obs = obs_tensor(batch["next_obs"], dev, image=self.image)
            next_target = self.q_target(next_obs)
            target = double_dqn_target(
                torch.as_tensor(batch["reward"], dtype=torch.float32, device=dev),
                torch.as_tensor(batch["discount"], dtype=torch.float32, device=dev),
                self.q(next_obs) if c.double else next_target,
                next_target,
            )
        td = q_taken - target
        loss_each = F.huber_loss(q_taken, target, reduction="none", delta=c.huber_delta)
        if "weight" in batch:
            loss_each = loss_each * torch.as_tensor(
                batch["weight"], dtype=torch.float32, device=dev
            )
        loss = loss_each.mean()
        grad_norm = gradient_step(
            loss, list(self.q.parameters()), self.optimizer, self.gradient_sync, c.max_grad_norm
        )
        self.version += 1
        if self.version % c.target_update_interval == 0:
            polyak_update(self.q, self.q_target, c.tau)
        td_abs = td.detach().abs().cpu().numpy().astype(np.float64)
        metrics = {
            "loss": float(loss.item()),
            "q_mean": float(q_taken.mean().item()),
            "td_abs_mean": float(td_abs.mean()),
            "grad_norm": float(grad_norm.item()),
            "epsilon": self.epsilon,
        }
        priorities = td_abs + c.priority_eps if c.prioritized else None
        return UpdateResult(metrics=metrics, priorities=priorities)

    def get_weights(self) -> dict[str, np.ndarray]:
        """The online Q-network's weights (all an actor needs) as contiguous numpy arrays."""
        return numpy_weights(self.q)

    def set_weights(self, weights: Mapping[str, np.ndarray], version: int) -> None:
        """Load Q-network weights; ``version`` (learner updates) drives epsilon."""
        load_numpy_weights(self.q, weights)
        self.version = version

    def state_dict(self) -> dict[str, Any]:
        """Everything a learner needs to continue (see ``tianji.rl.checkpoint``): online and
        target networks, Adam's moments, the update count."""
        return {
            "q": self.q.state_dict(),
            "q_target": self.q_target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "version": self.version,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict` (same config and spaces)."""
        self.q.load_state_dict(state["q"])
        self.q_target.load_state_dict(state["q_target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = int(state["version"])

    def buffer_spec(self) -> BufferSpec:
        """Uniform or prioritized replay over flat transitions."""
        c = self.config
        return BufferSpec(
            kind="prioritized" if c.prioritized else "replay",
            capacity=c.buffer_capacity,
            batch_size=c.batch_size,
            min_size=c.learning_starts,
            alpha=c.alpha,
            beta=c.beta,
        )
