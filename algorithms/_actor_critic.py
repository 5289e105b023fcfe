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
from tianji.algorithms._nets import (
    is_custom,
    is_image_space,
    masked_head,
    mlp,
    resolve_torso,
)
from tianji.algorithms._policy_net import PolicyNetSpec
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
    resolved = resolve_torso("algo.torso", torso, observation_space)
    custom = resolved if is_custom(resolved) else ""
    spec = PolicyNetSpec(
        observation_space=observation_space,
        out_dim=out_dim,
        hidden=tuple(hidden),
        image=resolved == "nature" or bool(custom and is_image_space(observation_space)),
        custom_torso=custom,
        continuous=continuous,
        init_log_std=init_log_std,
        normalize_obs=normalize_obs,
    )
    if core_hidden is None:
        return ActorCritic(spec, shared=shared)
    return RecurrentActorCritic(spec, core_hidden=core_hidden)


class ActorCritic(nn.Module):
    """Policy head (logits or Gaussian mean) and value head over separate or ``shared``
    MLPs (``hidden`` sizes, tanh), or over one :class:`NatureCNN` (``image``); with
    ``normalize_obs`` an :class:`ObsNormalizer` at the input, with ``continuous`` a learned
    ``log_std`` starting at ``init_log_std`` (:class:`PolicyNetSpec`)."""

    def __init__(self, spec: PolicyNetSpec, *, shared: bool) -> None:
        super().__init__()
        self.image = spec.image
        self.obs_norm = spec.obs_norm()
        self.torso: nn.Module | None = None
        if spec.image or shared or spec.custom_torso:
            self.torso, features = spec.torso()
            self.actor = mlp(features, (), spec.out_dim, out_gain=0.01)
            self.critic = mlp(features, (), 1, out_gain=1.0)
        else:
            hidden = spec.hidden
            self.actor = mlp(spec.in_dim, hidden, spec.out_dim, activation=nn.Tanh, out_gain=0.01)
            self.critic = mlp(spec.in_dim, hidden, 1, activation=nn.Tanh, out_gain=1.0)
        self.log_std = spec.log_std()
        self.mask = spec.mask

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(policy head output [B, A], value [B])`` for flat ``obs [B, D]`` (logits of
        the actions an action mask forbids: :data:`~tianji.algorithms._nets.MASK_FILL`)."""
        x = self._features(obs)
        head = self.actor(x)
        if self.mask:
            head = masked_head(head, obs, self.mask)
        return head, self.critic(x).squeeze(-1)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """``V(obs) [B]``."""
        out: torch.Tensor = self.critic(self._features(obs)).squeeze(-1)
        return out

    def _features(self, obs: torch.Tensor) -> torch.Tensor:
        if self.obs_norm is not None:
            obs = self.obs_norm(obs)
        return obs if self.torso is None else self.torso(obs)
