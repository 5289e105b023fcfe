"""Running statistics that standardize what a network sees or predicts.

* :class:`ObsNormalizer` standardizes observations at a network's input (a module: its
  statistics are buffers that travel with the weights).
* :class:`ReturnNormalizer` keeps the value targets' mean and spread, so a critic can learn
  ``(G - mean) / std`` (kept in checkpoints through the algorithm's ``state_dict``).
* :func:`observe_returns` merges one batch's targets into a :class:`ReturnNormalizer`, the
  same on every data-parallel learner.

Both merge batch moments with Chan et al.'s parallel update (:func:`merge_moments`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
import torch
from tianji.algorithms._nets import flat_dim
from torch import nn

from tianji.rl.algorithm import GradientSync

__all__ = [
    "ObsNormalizer",
    "ReturnNormalizer",
    "averaged_moments",
    "merge_moments",
    "observe_returns",
]

M = TypeVar("M", float, torch.Tensor)


def merge_moments(
    mean: M, var: M, count: float, batch_mean: M, batch_var: M, batch_count: float
) -> tuple[M, M, float]:
    """Running ``(mean, var, count)`` merged with a batch's (Chan et al.'s parallel update);
    elementwise for tensors."""
    total = count + batch_count
    delta = batch_mean - mean
    merged_var = (
        var * count + batch_var * batch_count + delta * delta * (count * batch_count / total)
    ) / total
    return mean + delta * (batch_count / total), merged_var, total


def averaged_moments(
    sync: GradientSync, mean: np.ndarray, square: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """A batch's moments ``E[x]`` and ``E[x^2]`` averaged over the data-parallel learners
    (one all-reduce, which moves float32), so every learner merges the same statistics.
    Returned as float64, in the shapes given."""
    both = np.concatenate([np.ravel(mean), np.ravel(square)]).astype(np.float32)
    first, second = np.split(sync(both).astype(np.float64), 2)
    return first.reshape(np.shape(mean)), second.reshape(np.shape(square))


class ObsNormalizer(nn.Module):
    """Standardizes observations element by element with a running mean and variance
    (as Sample Factory's ``normalize_input``): ``(x - mean) / std``, clipped to +-5.

    uint8 images are scaled to [0, 1] first (and come out as floats, which
    :class:`NatureCNN` takes as they are). The statistics are buffers, so they travel with
    the weights to actors and into checkpoints; only the learner updates them
    (:meth:`update`, once per batch).
    """

    clip = 5.0

    def __init__(self, obs_shape: Sequence[int]) -> None:
        super().__init__()
        shape = tuple(obs_shape)
        self.mean: torch.Tensor
        self.var: torch.Tensor
        self.count: torch.Tensor
        self.register_buffer("mean", torch.zeros(shape))
        self.register_buffer("var", torch.ones(shape))
        # (shape [1]: weights travel as contiguous arrays, which have at least one dim)
        self.register_buffer("count", torch.full((1,), 1e-4, dtype=torch.float64))

    @classmethod
    def at_input(cls, observation_space: Any, *, image: bool) -> ObsNormalizer:
        """Statistics of the input the network sees (:func:`obs_tensor`): an image as it
        is, anything else flattened."""
        shape = observation_space.shape
        return cls(tuple(shape) if image else (flat_dim(shape),))

    @staticmethod
    def scaled(obs: torch.Tensor) -> torch.Tensor:
        """Float observations (uint8 images divided by 255)."""
        return obs.float() / 255.0 if obs.dtype == torch.uint8 else obs.float()

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = (self.scaled(obs) - self.mean) * torch.rsqrt(self.var + 1e-8)
        return x.clamp(-self.clip, self.clip)

    @torch.no_grad()
    def update(self, obs: torch.Tensor, sync: GradientSync | None = None, chunk: int = 512) -> None:
        """Merge a batch ``[B, *obs_shape]`` into the statistics (in chunks: bounded memory
        for pixel batches). With data-parallel learners, ``sync`` averages every learner's
        batch moments first, so all keep the same statistics."""
        total = len(obs)
        if not total:
            return
        # (sums in float64: E[x^2] - E[x]^2 cancels badly in float32 when |mean| >> std)
        first = torch.zeros_like(self.mean, dtype=torch.float64)
        second = torch.zeros_like(first)
        for i in range(0, total, chunk):
            x = self.scaled(obs[i : i + chunk]).double()
            first += x.sum(0)
            second += x.square().sum(0)
        mean, square = first / total, second / total
        if sync is not None:
            pair = averaged_moments(sync, mean.cpu().numpy(), square.cpu().numpy())
            mean, square = (torch.as_tensor(part, device=mean.device) for part in pair)
        var = (square - mean * mean).clamp_min(0.0).float()
        new_mean, new_var, new_count = merge_moments(
            self.mean, self.var, float(self.count[0]), mean.float(), var, total
        )
        self.mean.copy_(new_mean)
        self.var.copy_(new_var)
        self.count.fill_(new_count)


class ReturnNormalizer:
    """Running mean and variance of value targets, merged batch by batch (Chan et al.'s
    parallel update), starting from mean 0 and variance 1 with a tiny weight."""

    def __init__(self) -> None:
        self.mean = 0.0
        self.var = 1.0
        self.count = 1e-4

    @property
    def std(self) -> float:
        """The spread values are measured in (at least 1e-4: a constant return)."""
        return max(math.sqrt(self.var), 1e-4)

    def normalize(self, x: np.ndarray) -> np.ndarray:
        """``(x - mean) / std``: returns in the units the critic predicts."""
        return (x - self.mean) / self.std

    def denormalize(self, x: np.ndarray) -> np.ndarray:
        """``x * std + mean``: the critic's output in return units."""
        return x * self.std + self.mean

    def update(self, mean: float, var: float, count: int) -> None:
        """Merge a batch of ``count`` targets with this ``mean`` and ``var``."""
        self.mean, self.var, self.count = merge_moments(
            self.mean, self.var, self.count, mean, var, count
        )

    def state(self) -> dict[str, float]:
        """Mean, variance and weight, for a checkpoint."""
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load(self, state: Mapping[str, float]) -> None:
        """Continue from :meth:`state`."""
        self.mean, self.var = float(state["mean"]), float(state["var"])
        self.count = float(state["count"])


def observe_returns(
    returns: ReturnNormalizer, targets: np.ndarray, sync: GradientSync | None
) -> None:
    """Merge a batch's value ``targets`` into ``returns``; with data-parallel learners
    (``sync``) the mean of every learner's batch moments (one more all-reduce step), so all
    keep the same statistics."""
    first, second = np.asarray(targets.mean()), np.asarray(np.square(targets).mean())
    if sync is not None:
        first, second = averaged_moments(sync, first, second)
    mean, square = float(first), float(second)
    returns.update(mean, max(square - mean * mean, 0.0), targets.size)
