"""SAC: soft actor-critic with twin Q-critics and an automatically tuned entropy temperature.

Haarnoja et al., "Soft Actor-Critic Algorithms and Applications" (2018). Read top to
bottom: the config, the squashed Gaussian policy (pure math), then the :class:`SAC` object
the actor and learner services drive. What it shares with TD3 (the Box-action check and
rescaling, the twin critic, n-step replay transitions, extra optimizers) is in
``algorithms/_continuous.py``; the replay fields (``updates_per_step``, ``learning_starts``,
``random_steps``, ...) in ``algorithms/_replay.py``.

* Actors call ``act``: a ``tanh``-squashed Gaussian sample (``explore``) or the ``tanh`` of
  its mean, rescaled from [-1, 1] to the Box's bounds; float32 ``[N, D]``.
* The learner calls ``update`` on replay batches: one critic step (soft TD target from the
  target critics' minimum), one actor step, one temperature step, then a Polyak move of
  the target critics by ``tau``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from tianji.algorithms._continuous import ContinuousBase, ContinuousConfig, TwinQ
from tianji.algorithms._nets import mlp, polyak_update, seeded_init
from torch import nn

from tianji.rl.algorithm import UpdateResult
from tianji.rl.errors import ConfigError

__all__ = ["SAC", "SACConfig", "SquashedGaussian", "squashed_log_prob"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SACConfig(ContinuousConfig):
    """Hyperparameters of :class:`SAC` (defaults: Stable-Baselines3's, which learn on
    Pendulum-v1 and the MuJoCo tasks): the fields of
    :class:`~tianji.algorithms._continuous.ContinuousConfig` (the replay, the update-to-data
    ratio, the warm-up, ``tau``), and these."""

    lr: float = 3e-4
    """Adam learning rate of the critics, the actor and the temperature."""
    init_alpha: float = 1.0
    """The entropy temperature at the start."""
    autotune_alpha: bool = True
    """Learn the temperature so the policy's entropy tracks ``target_entropy``."""
    target_entropy: float | None = None
    """The entropy the temperature aims at (None: minus the action dimension)."""
    log_std_bounds: tuple[float, float] = (-20.0, 2.0)
    """The policy's log standard deviation is clamped to this range."""

    def __post_init__(self) -> None:
        ContinuousConfig.__post_init__(self)
        if not self.init_alpha > 0:
            raise ConfigError("algorithm.init_alpha", self.init_alpha, "a number > 0")
        low, high = self.log_std_bounds
        if not low < high:
            raise ConfigError("algorithm.log_std_bounds", self.log_std_bounds, "[low, high]")


# --------------------------------------------------------------------------- pure math


def squashed_log_prob(z: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """``log pi(tanh(z))`` per row ``[B]`` for a Gaussian sample ``z [B, D]``: the Gaussian's
    log-density minus ``log(1 - tanh(z)^2)`` per dimension (the change of variables),
    written as ``2 (log 2 - z - softplus(-2 z))`` so it stays finite where tanh saturates."""
    gaussian = -0.5 * ((z - mean) / log_std.exp()) ** 2 - log_std - 0.5 * math.log(2 * math.pi)
    correction = 2.0 * (math.log(2.0) - z - F.softplus(-2.0 * z))
    return (gaussian - correction).sum(dim=1)


class SquashedGaussian(nn.Module):
    """An MLP from observations to a Gaussian's mean and log std per action dimension; the
    action is ``tanh`` of a sample (reparametrized), in [-1, 1]."""

    def __init__(
        self, obs_dim: int, act_dim: int, hidden: Sequence[int], bounds: tuple[float, float]
    ) -> None:
        super().__init__()
        self.net = mlp(obs_dim, hidden, 2 * act_dim)
        self.low, self.high = bounds

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``mean, log_std`` ``[B, D]`` each."""
        mean, log_std = self.net(obs).chunk(2, dim=1)
        return mean, log_std.clamp(self.low, self.high)

    def sample(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A reparametrized unit action ``[B, D]`` and its log-probability ``[B]``."""
        mean, log_std = self(obs)
        z = mean + log_std.exp() * torch.randn_like(mean)
        return torch.tanh(z), squashed_log_prob(z, mean, log_std)

    def mode(self, obs: torch.Tensor) -> torch.Tensor:
        """The deterministic unit action ``tanh(mean)``."""
        return torch.tanh(self(obs)[0])


class Temperature(nn.Module):
    """The entropy temperature, learned as ``log alpha``."""

    def __init__(self, alpha: float) -> None:
        super().__init__()
        self.log_alpha = nn.Parameter(torch.tensor(math.log(alpha)))

    def forward(self) -> torch.Tensor:
        """``alpha`` (a scalar tensor with a gradient to ``log_alpha``)."""
        return self.log_alpha.exp()


# --------------------------------------------------------------------------- algorithm


class SAC(ContinuousBase):
    """SAC over MLPs for bounded Box actions (see :class:`SACConfig`).

    Usage::

        algo = SAC(SAC.Config(), env.observation_space, env.action_space, seed=0)
        out = algo.act(obs, explore=True)         # {"action": float32 [N, D], in the bounds}
        transitions = algo.postprocess(fragment)  # flat n-step transitions
        result = algo.update(replay_batch)        # -> UpdateResult(metrics)
    """

    name = "sac"
    Config = SACConfig
    networks = ("actor", "critic", "critic_target", "temperature")
    trained = ("critic",)
    """The critics step on the base Adam; actor and temperature on their own."""
    own_optimizers = ("actor", "temperature")
    published = "actor"
    squashed_head = True
    """The actor's head is the Gaussian's mean before ``tanh`` (its greedy action)."""
    config: SACConfig

    def _build_networks(self, obs_dim: int, act_dim: int, seed: int) -> None:
        c = self.config
        with seeded_init(seed):
            self.actor = SquashedGaussian(obs_dim, act_dim, c.hidden, c.log_std_bounds)
            self.critic = TwinQ(obs_dim, act_dim, c.hidden)
            self.critic_target = TwinQ(obs_dim, act_dim, c.hidden)
        self.temperature = Temperature(c.init_alpha)
        for module in (self.actor, self.critic, self.critic_target, self.temperature):
            module.to(self.device)
        self.critic_target.load_state_dict(self.critic.state_dict())
        self.critic_target.requires_grad_(False)
        self.target_entropy = (
            -float(act_dim) if c.target_entropy is None else float(c.target_entropy)
        )
        # the policy's samples on the actors come from this generator, seeded per actor
        self.torch_rng = torch.Generator(device=self.device).manual_seed(seed)

    def act(self, obs: np.ndarray, *, explore: bool) -> dict[str, np.ndarray]:
        """A squashed Gaussian sample (``explore``) or ``tanh(mean)``, in the env's bounds."""
        with torch.no_grad():
            mean, log_std = self.actor(self._obs(obs))
            if explore:
                noise = torch.randn(mean.shape, generator=self.torch_rng, device=self.device)
                mean = mean + log_std.exp() * noise
            return {"action": self.scale.to_env(torch.tanh(mean))}

    def update(self, batch: Mapping[str, np.ndarray]) -> UpdateResult:
        """One critic, actor and temperature step, then the target critics' Polyak move."""
        c = self.config
        obs, unit, reward, discount, next_obs = self._batch(batch)
        alpha = self.temperature().detach()
        with torch.no_grad():
            next_unit, next_logp = self.actor.sample(next_obs)
            next_q = self.critic_target.least(next_obs, next_unit) - alpha * next_logp
            target = reward + discount * next_q
        q1, q2 = self.critic(obs, unit)
        critic_loss = 0.5 * (F.mse_loss(q1, target) + F.mse_loss(q2, target))
        critic_norm = self._step("critic", critic_loss)

        self.critic.requires_grad_(False)  # the actor's loss moves the actor only
        new_unit, logp = self.actor.sample(obs)
        actor_loss = (alpha * logp - self.critic.least(obs, new_unit)).mean()
        actor_norm = self._step("actor", actor_loss)
        self.critic.requires_grad_(True)

        alpha_loss = torch.zeros(())
        if c.autotune_alpha:
            entropy_gap = (logp.detach() + self.target_entropy).mean()
            alpha_loss = -self.temperature.log_alpha * entropy_gap
            self._step("temperature", alpha_loss)
        polyak_update(self.critic, self.critic_target, c.tau)
        self.version += 1
        metrics = {
            "critic_loss": float(critic_loss.item()),
            "actor_loss": float(actor_loss.item()),
            "alpha": float(alpha.item()),
            "alpha_loss": float(alpha_loss.item()),
            "entropy": float(-logp.mean().item()),
            "q_mean": float(q1.mean().item()),
            "critic_grad_norm": float(critic_norm.item()),
            "actor_grad_norm": float(actor_norm.item()),
        }
        return UpdateResult(metrics=metrics)
