"""TD3: twin delayed deep deterministic policy gradient.

Fujimoto et al., "Addressing Function Approximation Error in Actor-Critic Methods" (2018).
Read top to bottom: the config, then the :class:`TD3` object the actor and learner services
drive. What it shares with SAC (the Box-action check and rescaling, the twin critic, n-step
replay transitions, extra optimizers) is in ``algorithms/_continuous.py``; the replay fields
(``updates_per_step``, ``learning_starts``, ``random_steps``, ...) in
``algorithms/_replay.py``.

* Actors call ``act``: the deterministic policy's ``tanh`` action plus Gaussian exploration
  noise (``explore``; in unit scale, then clipped to [-1, 1]), rescaled to the Box's
  bounds; float32 ``[N, D]``.
* The learner calls ``update`` on replay batches: a critic step on the clipped double-Q
  target with target policy smoothing; every ``policy_delay`` updates an actor step and a
  Polyak move of the target actor and critics by ``tau``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F
from tianji.algorithms._continuous import ContinuousBase, ContinuousConfig, TwinQ
from tianji.algorithms._nets import mlp, polyak_update, seeded_init
from torch import nn

from tianji.rl.algorithm import UpdateResult
from tianji.rl.errors import ConfigError

__all__ = ["TD3", "TD3Config"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TD3Config(ContinuousConfig):
    """Hyperparameters of :class:`TD3` (defaults: the paper's and Stable-Baselines3's): the
    fields of :class:`~tianji.algorithms._continuous.ContinuousConfig` (the replay, the
    update-to-data ratio, the warm-up, ``tau``), and these. Noise scales are in unit action
    scale ([-1, 1])."""

    lr: float = 1e-3
    """Adam learning rate of the critics and the actor."""
    exploration_noise: float = 0.1
    """Standard deviation of the actors' Gaussian action noise."""
    policy_delay: int = 2
    """Critic updates per actor (and target) update."""
    target_noise: float = 0.2
    """Standard deviation of the target policy smoothing noise ..."""
    target_noise_clip: float = 0.5
    """... clipped to this magnitude."""

    def __post_init__(self) -> None:
        ContinuousConfig.__post_init__(self)
        if type(self.policy_delay) is not int or self.policy_delay < 1:
            raise ConfigError("algorithm.policy_delay", self.policy_delay, "an integer >= 1")
        for key in ("exploration_noise", "target_noise", "target_noise_clip"):
            if getattr(self, key) < 0:
                raise ConfigError(f"algorithm.{key}", getattr(self, key), "a number >= 0")


class TD3(ContinuousBase):
    """TD3 over MLPs for bounded Box actions (see :class:`TD3Config`).

    Usage::

        algo = TD3(TD3.Config(), env.observation_space, env.action_space, seed=0)
        out = algo.act(obs, explore=True)         # {"action": float32 [N, D], in the bounds}
        transitions = algo.postprocess(fragment)  # flat n-step transitions
        result = algo.update(replay_batch)        # -> UpdateResult(metrics)
    """

    name = "td3"
    Config = TD3Config
    networks = ("actor", "actor_target", "critic", "critic_target")
    trained = ("critic",)
    """The critics step on the base Adam; the actor on its own."""
    own_optimizers = ("actor",)
    published = "actor"
    config: TD3Config

    def _build_networks(self, obs_dim: int, act_dim: int, seed: int) -> None:
        c = self.config
        with seeded_init(seed):
            self.actor = nn.Sequential(mlp(obs_dim, c.hidden, act_dim), nn.Tanh())
            self.actor_target = nn.Sequential(mlp(obs_dim, c.hidden, act_dim), nn.Tanh())
            self.critic = TwinQ(obs_dim, act_dim, c.hidden)
            self.critic_target = TwinQ(obs_dim, act_dim, c.hidden)
        for online, target in ((self.actor, self.actor_target), (self.critic, self.critic_target)):
            online.to(self.device)
            target.to(self.device)
            target.load_state_dict(online.state_dict())
            target.requires_grad_(False)
        # the actors' exploration noise comes from this generator, seeded per actor
        self.torch_rng = torch.Generator(device=self.device).manual_seed(seed)
        self.actor_loss = 0.0  # the last actor step's loss (reported every update)

    def act(self, obs: np.ndarray, *, explore: bool) -> dict[str, np.ndarray]:
        """The policy's action, plus clipped Gaussian noise when ``explore``, in the bounds."""
        with torch.no_grad():
            unit = self.actor(self._obs(obs))
            if explore and self.config.exploration_noise > 0:
                noise = torch.randn(unit.shape, generator=self.torch_rng, device=self.device)
                unit = (unit + self.config.exploration_noise * noise).clamp(-1.0, 1.0)
            return {"action": self.scale.to_env(unit)}

    def update(self, batch: Mapping[str, np.ndarray]) -> UpdateResult:
        """A critic step; every ``policy_delay`` updates an actor step and the targets' move."""
        c = self.config
        obs, unit, reward, discount, next_obs = self._batch(batch)
        with torch.no_grad():
            noise = (torch.randn_like(unit) * c.target_noise).clamp(
                -c.target_noise_clip, c.target_noise_clip
            )
            next_unit = (self.actor_target(next_obs) + noise).clamp(-1.0, 1.0)
            target = reward + discount * self.critic_target.least(next_obs, next_unit)
        q1, q2 = self.critic(obs, unit)
        critic_loss = F.mse_loss(q1, target) + F.mse_loss(q2, target)
        critic_norm = self._step("critic", critic_loss)
        self.version += 1
        if self.version % c.policy_delay == 0:
            self.critic.requires_grad_(False)  # the actor's loss moves the actor only
            q_pi, _ = self.critic(obs, self.actor(obs))
            actor_loss = -q_pi.mean()
            self._step("actor", actor_loss)
            self.critic.requires_grad_(True)
            self.actor_loss = float(actor_loss.item())
            polyak_update(self.actor, self.actor_target, c.tau)
            polyak_update(self.critic, self.critic_target, c.tau)
        metrics = {
            "critic_loss": float(critic_loss.item()),
            "actor_loss": self.actor_loss,
            "q_mean": float(q1.mean().item()),
            "critic_grad_norm": float(critic_norm.item()),
        }
        return UpdateResult(metrics=metrics)
