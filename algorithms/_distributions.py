"""The policy heads' distributions: categorical logits and diagonal Gaussians.

Pure functions over a policy head's output, shared by PPO, IMPALA and MAPPO: sampling an
action (``explore``) or taking the mode, and the log-probability and entropy of actions.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "gaussian_entropy",
    "gaussian_log_prob",
    "head_stats",
    "sample_categorical",
    "sample_gaussian",
]


def gaussian_log_prob(
    action: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor
) -> torch.Tensor:
    """Log-density of a diagonal Gaussian, summed over the last axis."""
    z = (action - mean) * torch.exp(-log_std)
    return (-0.5 * z**2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)


def gaussian_entropy(log_std: torch.Tensor) -> torch.Tensor:
    """Entropy of a diagonal Gaussian, summed over the last axis."""
    return (log_std + 0.5 * math.log(2 * math.pi * math.e)).sum(-1)


def sample_gaussian(
    mean: torch.Tensor, log_std: torch.Tensor, explore: bool, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(action, its log-density)``: ``mean + noise * std`` (``explore``) or the mean;
    ``log_std`` broadcasts to ``mean [B, A]``."""
    log_std = log_std.expand_as(mean)
    action = mean
    if explore:
        noise = torch.randn(mean.shape, generator=generator, device=mean.device)
        action = mean + noise * log_std.exp()
    return action, gaussian_log_prob(action, mean, log_std)


def sample_categorical(
    logits: torch.Tensor, explore: bool, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(action, its log-probability)`` for ``logits [..., n]``: a sample (``explore``)
    or the most likely action, shaped ``logits.shape[:-1]``."""
    log_probs = torch.log_softmax(logits, dim=-1)
    if explore:
        flat = log_probs.reshape(-1, log_probs.shape[-1]).exp()
        action = torch.multinomial(flat, 1, generator=generator).reshape(log_probs.shape[:-1])
    else:
        action = logits.argmax(dim=-1)
    return action, log_probs.gather(-1, action[..., None]).squeeze(-1)


def head_stats(
    head: torch.Tensor, action: torch.Tensor, log_std: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logp(action), entropy)`` of a policy head's output ``[..., A]``: Gaussian means
    with ``log_std`` (a Box action space), else categorical logits."""
    if log_std is not None:
        log_std = log_std.expand_as(head)
        return gaussian_log_prob(action, head, log_std), gaussian_entropy(log_std)
    log_probs = torch.log_softmax(head, dim=-1)
    logp = log_probs.gather(-1, action.long()[..., None]).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return logp, entropy
