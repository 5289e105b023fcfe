"""The actor-critic losses of one minibatch, as pure functions of tensors.

* :func:`ppo_objective`: PPO's clipped surrogate plus the (optionally clipped) value error
  and the entropy bonus (PPO, APPO, MAPPO);
* :func:`impala_objective`: IMPALA's plain policy gradient with V-trace advantages, the
  value error and the entropy bonus.

Both return :class:`Losses`; :func:`kl_stats` and :func:`normalized` are the minibatch
diagnostics and the per-minibatch advantage normalization they share.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

import torch
from tianji.algorithms._onpolicy import OnPolicyConfig

__all__ = [
    "Losses",
    "Objective",
    "clipped_surrogate_loss",
    "impala_loss",
    "impala_objective",
    "kl_stats",
    "normalized",
    "ppo_objective",
    "value_loss",
]


class Losses(NamedTuple):
    """One minibatch's loss and its parts (the parts detached only when logged)."""

    total: torch.Tensor
    policy: torch.Tensor
    value: torch.Tensor
    entropy: torch.Tensor

    def metrics(self) -> dict[str, float]:
        """``loss``, ``policy_loss``, ``value_loss``, ``entropy`` as floats."""
        return {
            "loss": float(self.total.item()),
            "policy_loss": float(self.policy.item()),
            "value_loss": float(self.value.item()),
            "entropy": float(self.entropy.item()),
        }


_T = torch.Tensor
Objective = Callable[[OnPolicyConfig, Mapping[str, _T], _T, _T, _T, _T], Losses]
"""A minibatch loss: ``(config, minibatch, logp, entropy, value, advantage) -> Losses``
(:func:`ppo_objective`, :func:`impala_objective`)."""


def clipped_surrogate_loss(
    logp: torch.Tensor, old_logp: torch.Tensor, advantage: torch.Tensor, clip: float
) -> torch.Tensor:
    """PPO's policy loss ``mean(max(-A r, -A clip(r, 1 - clip, 1 + clip)))``, ``r = p / p_old``."""
    ratio = (logp - old_logp).exp()
    unclipped = -advantage * ratio
    clipped = -advantage * ratio.clamp(1.0 - clip, 1.0 + clip)
    return torch.max(unclipped, clipped).mean()


def value_loss(
    value: torch.Tensor, old_value: torch.Tensor, returns: torch.Tensor, clip: float | None
) -> torch.Tensor:
    """``0.5 * mean((V - R)^2)``; with ``clip``, the max with the clipped-update error."""
    err = (value - returns) ** 2
    if clip is not None:
        clipped = old_value + (value - old_value).clamp(-clip, clip)
        err = torch.max(err, (clipped - returns) ** 2)
    return 0.5 * err.mean()


def impala_loss(
    logp: torch.Tensor,
    entropy: torch.Tensor,
    value: torch.Tensor,
    advantage: torch.Tensor,
    target: torch.Tensor,
    vf_coef: float,
    ent_coef: float,
) -> Losses:
    """IMPALA's ``-mean(A_vtrace * log pi(a|x)) + vf_coef * 0.5 * mean((v_s - V(x))^2)
    - ent_coef * mean(entropy)``, no ratio or value clipping (``algorithms/impala.py``)."""
    pg_loss = -(advantage.detach() * logp).mean()
    v_loss = 0.5 * ((target.detach() - value) ** 2).mean()
    ent = entropy.mean()
    return Losses(pg_loss + vf_coef * v_loss - ent_coef * ent, pg_loss, v_loss, ent)


def ppo_objective(
    c: OnPolicyConfig,
    minibatch: Mapping[str, torch.Tensor],
    logp: torch.Tensor,
    entropy: torch.Tensor,
    value: torch.Tensor,
    advantage: torch.Tensor,
) -> Losses:
    """PPO's minibatch loss: the clipped surrogate of ``logp`` to ``old_logp`` and the value
    error to ``ret`` (clipped around ``old_value`` with ``clip_value_loss``), minus the
    entropy bonus. ``advantage`` has ``logp``'s shape (MAPPO: the team's, per agent)."""
    pg_loss = clipped_surrogate_loss(logp, minibatch["old_logp"], advantage, c.clip_coef)
    clip_v = c.clip_coef if c.clip_value_loss else None
    v_loss = value_loss(value, minibatch["old_value"], minibatch["ret"], clip_v)
    ent = entropy.mean()
    return Losses(pg_loss + c.vf_coef * v_loss - c.ent_coef * ent, pg_loss, v_loss, ent)


def impala_objective(
    c: OnPolicyConfig,
    minibatch: Mapping[str, torch.Tensor],
    logp: torch.Tensor,
    entropy: torch.Tensor,
    value: torch.Tensor,
    advantage: torch.Tensor,
) -> Losses:
    """:func:`impala_loss` with the targets ``ret`` of the minibatch (as
    :func:`ppo_objective` is called)."""
    return impala_loss(logp, entropy, value, advantage, minibatch["ret"], c.vf_coef, c.ent_coef)


def normalized(advantage: torch.Tensor) -> torch.Tensor:
    """``(A - mean) / (std + 1e-8)``; a single advantage as it is."""
    if len(advantage) <= 1:
        return advantage
    return (advantage - advantage.mean()) / (advantage.std() + 1e-8)


def kl_stats(
    logp: torch.Tensor, old_logp: torch.Tensor, clip: float | None = None
) -> dict[str, float]:
    """``approx_kl`` (``E[(r - 1) - log r]``) of the updated policy to ``old_logp`` and,
    with ``clip``, ``clip_frac`` (the share of ratios outside ``1 +- clip``)."""
    with torch.no_grad():
        log_ratio = logp - old_logp
        out = {"approx_kl": float(((log_ratio.exp() - 1) - log_ratio).mean().item())}
        if clip is not None:
            out["clip_frac"] = float(((log_ratio.exp() - 1).abs() > clip).float().mean().item())
    return out
