"""IMPALA: a V-trace actor-critic (Espeholt et al. 2018) on PPO's networks and plumbing.

What differs from PPO (``algorithms/ppo.py``, whose config, networks, acting and batch
preparation it reuses; the loss is ``algorithms/_losses.py``'s ``impala_loss``): the value
targets and advantages always come from V-trace (``algorithms/_vtrace.py``), computed
with the importance ratios of the learner's policy to the behaviour policy whose ``logp``
the actor stored, so fragments collected several versions ago still give unbiased-enough
updates; and each batch gets plain actor-critic steps, with no ratio clipping and no value
clipping:

``loss = -mean(A_vtrace * log pi(a|x)) + vf_coef * 0.5 * mean((v_s - V(x))^2)
- ent_coef * mean(entropy)``.

By default one pass over the batch in 2 minibatches (``update_epochs = 1``), advantages not
normalized, as in the paper; everything else is configured as for PPO (``[algo]``).
Use it with the controller's lag raised (``[controller] lag_target`` 2 to 8): V-trace is
what keeps that lag from biasing the updates (``examples/cartpole_impala.toml``).
"""

from __future__ import annotations

import dataclasses

from tianji.algorithms._losses import impala_objective
from tianji.algorithms.ppo import PPO, PPOConfig

from tianji.rl.errors import ConfigError

__all__ = ["IMPALA", "IMPALAConfig"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class IMPALAConfig(PPOConfig):
    """:class:`~tianji.algorithms.ppo.PPOConfig` with IMPALA's defaults (V-trace always on)."""

    vtrace: bool = True
    update_epochs: int = 1
    num_minibatches: int = 2
    norm_adv: bool = False
    lr: float = 5e-4

    def __post_init__(self) -> None:
        PPOConfig.__post_init__(self)
        if not self.vtrace:
            raise ConfigError("algorithm.vtrace", self.vtrace, "true (IMPALA is V-trace)")


class IMPALA(PPO):
    """The V-trace actor-critic (see the module docstring): PPO's networks, acting and
    batch preparation with IMPALA's config and minibatch loss."""

    name = "impala"
    Config = IMPALAConfig
    objective = impala_objective
