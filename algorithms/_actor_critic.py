"""The actor-critic networks PPO and IMPALA compose: :class:`ActorCritic` (feed-forward)
and, with ``[algo] core = "gru"``, :class:`~tianji.algorithms._recurrent.RecurrentActorCritic`;
:func:`actor_critic` builds the one PPO's config asks for.

Both map observations to a policy head (logits, or a Gaussian's mean with a learned
``log_std``) and a value, with an optional :class:`ObsNormalizer` at the input
(``obs_norm``) and ``image`` saying whether the torso is the Nature CNN.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tianji.algorithms._nets import NatureCNN, flat_dim, mlp, resolve_torso
from tianji.algorithms._normalize import ObsNormalizer
from tianji.algorithms._recurrent import RecurrentActorCritic
from torch import nn

__all__ = ["ActorCritic", "actor_critic"]


def actor_critic(
    observation_space: Any,
    out_dim: int,
    *,
    hidden: Sequence[int],
    torso: str,
    shared: bool,
    core_hidden: int | None,
    continuous: bool,
    init_log_std: float,
    normalize_obs: bool,
) -> ActorCritic | RecurrentActorCritic:
    """The network PPO's config asks for: with a ``core_hidden`` state size the recurrent
    one, else the feed-forward one (``shared``: one MLP torso for both heads); ``torso`` as
    ``[algo] torso`` ("auto", "mlp", "nature").

    Raises:
        ConfigError: if ``torso`` does not suit the observations.
    """
    image = resolve_torso("algo.torso", torso, observation_space) == "nature"
    if core_hidden is None:
        return ActorCritic(
            observation_space, out_dim, hidden=hidden, image=image, shared=shared,
            continuous=continuous, init_log_std=init_log_std, normalize_obs=normalize_obs,
        )  # fmt: skip
    return RecurrentActorCritic(
        observation_space, out_dim, hidden=hidden, core_hidden=core_hidden, image=image,
        continuous=continuous, init_log_std=init_log_std, normalize_obs=normalize_obs,
    )  # fmt: skip


class ActorCritic(nn.Module):
    """Policy head (logits or Gaussian mean) and value head over separate or ``shared``
    MLPs (``hidden`` sizes, tanh), or over one :class:`NatureCNN` (``image``); with
    ``normalize_obs`` an :class:`ObsNormalizer` at the input, with ``continuous`` a learned
    ``log_std`` starting at ``init_log_std``."""

    def __init__(
        self,
        observation_space: Any,
        out_dim: int,
        *,
        hidden: Sequence[int],
        image: bool,
        shared: bool,
        continuous: bool,
        init_log_std: float = 0.0,
        normalize_obs: bool = False,
    ) -> None:
        super().__init__()
        hidden = tuple(hidden)
        in_dim = flat_dim(observation_space.shape)
        self.torso: nn.Module | None = None
        self.image = image
        self.obs_norm = (
            ObsNormalizer.at_input(observation_space, image=image) if normalize_obs else None
        )
        if self.image:
            self.torso = NatureCNN(observation_space.shape)
            self.actor = mlp(NatureCNN.features, (), out_dim, out_gain=0.01)
            self.critic = mlp(NatureCNN.features, (), 1, out_gain=1.0)
        elif shared:
            self.torso = mlp(in_dim, hidden[:-1], hidden[-1], activation=nn.Tanh, out_gain=2**0.5)
            self.torso.append(nn.Tanh())
            self.actor = mlp(hidden[-1], (), out_dim, out_gain=0.01)
            self.critic = mlp(hidden[-1], (), 1, out_gain=1.0)
        else:
            self.actor = mlp(in_dim, hidden, out_dim, activation=nn.Tanh, out_gain=0.01)
            self.critic = mlp(in_dim, hidden, 1, activation=nn.Tanh, out_gain=1.0)
        self.log_std = nn.Parameter(torch.full((out_dim,), init_log_std)) if continuous else None

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(policy head output [B, A], value [B])`` for flat ``obs [B, D]``."""
        x = self._features(obs)
        return self.actor(x), self.critic(x).squeeze(-1)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """``V(obs) [B]``."""
        out: torch.Tensor = self.critic(self._features(obs)).squeeze(-1)
        return out

    def _features(self, obs: torch.Tensor) -> torch.Tensor:
        if self.obs_norm is not None:
            obs = self.obs_norm(obs)
        return obs if self.torso is None else self.torso(obs)
