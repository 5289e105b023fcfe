"""What both actor-critic networks (:class:`~tianji.algorithms._actor_critic.ActorCritic`,
:class:`~tianji.algorithms._recurrent.RecurrentActorCritic`) are built from: a
:class:`PolicyNetSpec` and the parts it makes."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from tianji.algorithms._nets import NatureCNN, custom_torso, flat_dim, mlp
from tianji.algorithms._normalize import ObsNormalizer
from torch import nn

from tianji.rl.masks import mask_size

__all__ = ["PolicyNetSpec"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PolicyNetSpec:
    """An actor-critic's inputs and outputs.

    Attributes:
        observation_space: a Box; images (uint8) get :class:`NatureCNN`, anything else an
            MLP over the flattened observation (``hidden`` sizes, tanh).
        out_dim: the policy head's size (logits, or a Gaussian's mean).
        hidden: MLP torso sizes (unused for images).
        image: whether the input is uint8 images (the CNN's, or a custom torso's).
        continuous: a learned log standard deviation for a Gaussian policy.
        init_log_std: its initial value.
        normalize_obs: standardize observations before the torso (:class:`ObsNormalizer`,
            ``obs_norm``; its statistics are the learner's to update).
    """

    observation_space: Any
    out_dim: int
    hidden: tuple[int, ...]
    image: bool
    continuous: bool
    init_log_std: float = 0.0
    normalize_obs: bool = False
    custom_torso: str = ""
    """A user torso (``"module:Class"``, :func:`~tianji.algorithms._nets.custom_torso`)
    instead of the CNN or the MLP."""

    @property
    def mask(self) -> int:
        """The action mask's size at the end of each observation (0: none;
        :class:`~tianji.rl.masks.MaskedObs`): the policy head's illegal logits are then
        :data:`~tianji.algorithms._nets.MASK_FILL`."""
        return mask_size(self.observation_space)

    @property
    def in_dim(self) -> int:
        """The flattened observation's size."""
        return flat_dim(self.observation_space.shape)

    def obs_norm(self) -> ObsNormalizer | None:
        """The input normalizer, if ``normalize_obs``."""
        if not self.normalize_obs:
            return None
        return ObsNormalizer.at_input(self.observation_space, image=self.image)

    def log_std(self) -> nn.Parameter | None:
        """The Gaussian's learned log standard deviation, if ``continuous``."""
        if not self.continuous:
            return None
        return nn.Parameter(torch.full((self.out_dim,), self.init_log_std))

    def torso(self) -> tuple[nn.Module, int]:
        """One torso for both heads and its feature size: the CNN for images, else a tanh
        MLP ending in ``hidden[-1]`` features."""
        if self.custom_torso:
            return custom_torso("algo.torso", self.custom_torso, self.observation_space)
        if self.image:
            return NatureCNN(self.observation_space.shape), NatureCNN.features
        sizes = self.hidden
        torso = mlp(self.in_dim, sizes[:-1], sizes[-1], activation=nn.Tanh, out_gain=2**0.5)
        torso.append(nn.Tanh())
        return torso, sizes[-1]
