"""What PPO, IMPALA and MAPPO share around their losses: the config fields of an on-policy
learner, the rollout buffer, the epochs of minibatches and the batch plumbing.

* :class:`OnPolicyConfig`: the ``[algo]`` fields every on-policy algorithm has (each
  algorithm's config inherits it, overriding defaults where its own differ);
* :func:`run_epochs`: ``update_epochs`` passes of minibatch steps, metrics averaged;
* :func:`next_values`: ``V(next_obs)`` with a forward pass only where it is needed;
* small pure helpers: :func:`compact_fragment`, :func:`epoch_minibatches`,
  :func:`explained_variance`, :func:`annealed_lr`, :func:`flat`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar

import numpy as np
import torch
from tianji.algorithms._base import AlgorithmBase
from tianji.algorithms._nets import as_hidden

from tianji.rl.algorithm import BufferSpec
from tianji.rl.errors import ConfigError
from tianji.rl.pbt import HyperRange

__all__ = [
    "OnPolicyAlgorithm",
    "OnPolicyConfig",
    "annealed_lr",
    "compact_fragment",
    "epoch_minibatches",
    "explained_variance",
    "flat",
    "next_values",
    "rollout_spec",
    "run_epochs",
    "set_annealed_lr",
]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class OnPolicyConfig:
    """The fields every on-policy algorithm's config has (defaults: PPO's on CartPole-v1)."""

    lr: float = 2.5e-4
    """Adam learning rate."""
    lr_anneal_updates: int = 0
    """Learner updates over which the learning rate decays linearly to ``lr * lr_floor``
    (0: constant)."""
    lr_floor: float = 0.0
    """The share of ``lr`` the annealed rate keeps for good (0..1). With 0 the rate
    reaches 0 at ``lr_anneal_updates`` and a run that has not converged by then cannot
    any more (the learner warns when it happens); a floor keeps every run learning."""
    gamma: float = 0.99
    """Discount factor per environment step."""
    gae_lambda: float = 0.95
    """GAE lambda: 0 is one-step TD, 1 is Monte Carlo."""
    reward_scale: float = 1.0
    """Rewards (MAPPO: the team's) are multiplied by this before GAE (keeps value targets
    near unit scale). Matters most where the policy and the value share a torso (PPO's
    "nature", a ``core``): large value errors there drown the policy's share of the
    clipped gradient."""
    fragments_per_batch: int = 1
    """Fragments (each ``[T, N]``) concatenated along the env axis into one learner batch."""
    buffer_capacity: int = 8
    """Fragments the rollout buffer keeps at most (the oldest are dropped)."""
    update_epochs: int = 4
    """Passes over each batch."""
    num_minibatches: int = 4
    """Minibatches per epoch (MAPPO's: of env steps, every agent of a step in the same one)."""
    clip_coef: float = 0.2
    """Surrogate clip range: the ratio is kept in ``[1 - clip, 1 + clip]``."""
    clip_value_loss: bool = True
    """Clip the value update around the pre-update values by ``clip_coef`` too."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    ent_coef: float = 0.01
    """Weight of the entropy bonus."""
    max_grad_norm: float = 0.5
    """Gradient-norm clip per minibatch step."""
    norm_adv: bool = True
    """Normalize advantages per minibatch."""
    hidden: Sequence[int] = (64, 64)
    """Hidden layer sizes of the policy MLP (and of a separate critic MLP)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden", as_hidden("algorithm.hidden", self.hidden))
        for key in ("fragments_per_batch", "buffer_capacity", "update_epochs", "num_minibatches"):
            if type(getattr(self, key)) is not int or getattr(self, key) <= 0:
                raise ConfigError(f"algorithm.{key}", getattr(self, key), "a positive integer")
        if self.buffer_capacity < self.fragments_per_batch:
            raise ConfigError(
                "algorithm.buffer_capacity", self.buffer_capacity, "at least fragments_per_batch"
            )
        for key in ("gamma", "gae_lambda", "lr_floor"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ConfigError(f"algorithm.{key}", getattr(self, key), "a number in [0, 1]")


class OnPolicyAlgorithm(AlgorithmBase):
    """An algorithm that learns from rollouts (PPO, IMPALA, MAPPO): its buffer is a FIFO of
    fragments, and ``fragments_per_batch`` of them make one learner batch."""

    config: OnPolicyConfig
    perturbable: ClassVar[Mapping[str, HyperRange]] = {
        "lr": HyperRange(1e-5, 1e-2),
        "ent_coef": HyperRange(1e-5, 0.1),
        "clip_coef": HyperRange(0.05, 0.5),
        "vf_coef": HyperRange(0.05, 2.0),
        "gamma": HyperRange(0.9, 0.9999, "complement_log"),
        "gae_lambda": HyperRange(0.8, 0.995, "complement_log"),
    }
    """What PBT may change: every one is read by ``update`` (GAE runs on the learner)."""

    def buffer_spec(self) -> BufferSpec:
        """A FIFO of fragments; ``fragments_per_batch`` of them make one learner batch."""
        return rollout_spec(self.config)


def rollout_spec(config: OnPolicyConfig) -> BufferSpec:
    """A FIFO of fragments; ``fragments_per_batch`` of them make one learner batch."""
    return BufferSpec(
        kind="rollout",
        capacity=config.buffer_capacity,
        batch_size=config.fragments_per_batch,
        min_size=config.fragments_per_batch,
    )


def run_epochs(
    flat_batch: Mapping[str, torch.Tensor],
    epochs: int,
    minibatches: Callable[[int], list[np.ndarray]],
    step: Callable[[dict[str, torch.Tensor]], dict[str, float]],
    stop: Callable[[float], bool] | None = None,
) -> dict[str, float]:
    """``epochs`` passes over ``flat_batch`` (tensors ``[B, ...]``, ``adv`` among them): each
    pass ``step``s on the index arrays ``minibatches(B)`` gives; after a pass ``stop``
    (given the mean ``approx_kl`` so far) may end them early.

    Returns:
        The mean of every metric ``step`` returned, over all its calls.
    """
    totals: dict[str, float] = {}
    steps = 0
    for _ in range(epochs):
        for index in minibatches(len(flat_batch["adv"])):
            mb = {k: v[index] for k, v in flat_batch.items()}
            for k, v in step(mb).items():
                totals[k] = totals.get(k, 0.0) + v
            steps += 1
        if stop is not None and stop(totals["approx_kl"] / steps):
            break
    return {k: v / steps for k, v in totals.items()}


def compact_fragment(
    fragment: Mapping[str, np.ndarray], drop: Sequence[str] = ()
) -> dict[str, np.ndarray]:
    """``fragment`` without the ``drop`` keys, with compact dtypes: float64 as float32,
    ``terminated``/``truncated`` as bool (what a rollout buffer stores and ships)."""
    out: dict[str, np.ndarray] = {}
    for key, value in fragment.items():
        if key in drop:
            continue
        arr = np.asarray(value)
        if key in ("terminated", "truncated"):
            arr = arr.astype(bool)
        elif arr.dtype == np.float64:
            arr = arr.astype(np.float32)
        out[key] = arr
    return out


def epoch_minibatches(
    size: int, num_minibatches: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """One epoch's minibatches: a permutation of ``range(size)`` cut into index arrays of
    ``max(1, size // num_minibatches)`` (a shorter remainder is left out)."""
    order = rng.permutation(size)
    mb_size = max(1, size // num_minibatches)
    return [order[start : start + mb_size] for start in range(0, size - mb_size + 1, mb_size)]


def explained_variance(returns: torch.Tensor, values: torch.Tensor) -> float:
    """``1 - Var(returns - values) / Var(returns)``; NaN when the returns are constant."""
    var = returns.var().item()
    return float("nan") if var == 0 else 1.0 - (returns - values).var().item() / var


def annealed_lr(lr: float, version: int, anneal_updates: int, floor: float = 0.0) -> float:
    """``lr`` decayed linearly to ``lr * floor`` over ``anneal_updates`` updates (0:
    constant)."""
    if anneal_updates <= 0:
        return lr
    return lr * max(floor, 1.0 - version / anneal_updates)


def set_annealed_lr(optimizer: torch.optim.Optimizer, config: OnPolicyConfig, version: int) -> None:
    """Set the optimizer's rate to :func:`annealed_lr` at ``version`` (with
    ``lr_anneal_updates``; else leave it)."""
    c = config
    if c.lr_anneal_updates > 0:
        lr = annealed_lr(c.lr, version, c.lr_anneal_updates, c.lr_floor)
        optimizer.param_groups[0]["lr"] = lr


def flat(x: np.ndarray) -> np.ndarray:
    """``[T, M, ...]`` to ``[T*M, ...]``."""
    arr = np.asarray(x)
    return arr.reshape(arr.shape[0] * arr.shape[1], *arr.shape[2:])


def next_values(
    batch: Mapping[str, np.ndarray],
    value: torch.Tensor,
    value_of: Callable[[np.ndarray, np.ndarray], torch.Tensor],
) -> torch.Tensor:
    """``V(next_obs)`` flat ``[T*M]``, given ``value = V(obs)`` flat. Inside a column
    ``next_obs[t]`` is ``obs[t+1]`` unless the episode ended at ``t``, so only the last step
    and the ends need a forward pass of their own (half the work of valuing every
    ``next_obs``): ``value_of(flat rows, their next_obs)``."""
    done = np.asarray(batch["terminated"], bool) | np.asarray(batch["truncated"], bool)
    steps, width = done.shape
    need = done.copy()
    need[-1] = True
    out = torch.empty((steps, width), dtype=value.dtype, device=value.device)
    out[:-1] = value.view(steps, width)[1:]
    rows = np.flatnonzero(need)
    flat_next = out.view(-1)
    flat_next[torch.as_tensor(rows, device=value.device)] = value_of(
        rows, flat(batch["next_obs"])[rows]
    )
    return flat_next
