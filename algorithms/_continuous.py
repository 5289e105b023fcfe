"""What SAC and TD3 share: bounded ``Box`` actions (the check, the rescaling between the
policy's [-1, 1] and the env's bounds), the twin Q-critic, and the off-policy base class.

**Actions.** Both policies end in ``tanh``: a unit action ``u`` in [-1, 1] per dimension.
Actors step the env with ``low + (u + 1) / 2 * (high - low)`` (float32 ``[N, D]``), and the
fragment stores that env-scale action; the learner maps stored actions back to [-1, 1]
(:meth:`ActionScale.to_unit`) before the critic sees them. Nothing is clipped that the
policy produced: the bounds are part of the policy (the actor service's clip to the Box is
then a no-op; TD3's exploration noise is clipped to [-1, 1] in unit scale first).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from tianji.algorithms._base import AlgorithmBase, Spaces
from tianji.algorithms._export import GreedyPolicy
from tianji.algorithms._nets import (
    adam,
    box_obs_problem,
    flat_dim,
    gradient_step,
    host_to_device,
    mlp,
    obs_tensor,
)
from tianji.algorithms._replay import OffPolicyConfig, n_step_transitions
from torch import nn

from tianji.rl.algorithm import BufferSpec
from tianji.rl.errors import ConfigError
from tianji.rl.pbt import HyperRange

__all__ = ["ActionScale", "ContinuousBase", "ContinuousConfig", "TwinQ", "box_action_problem"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ContinuousConfig(OffPolicyConfig):
    """The fields SAC's and TD3's configs share: :class:`OffPolicyConfig`'s with the
    defaults both papers and Stable-Baselines3 use (one update of a 256-transition batch per
    env step, 256x256 networks, a million transitions, 1,000 random warm-up steps), Polyak
    target updates and an optional gradient clip."""

    n_step: int = 1
    hidden: Sequence[int] = (256, 256)
    batch_size: int = 256
    buffer_capacity: int = 1_000_000
    learning_starts: int = 1_000
    updates_per_step: float = 1.0
    random_steps: int = 1_000
    tau: float = 0.005
    """Polyak rate of the target networks at each of their updates."""
    max_grad_norm: float = math.inf
    """Gradient-norm clip per optimizer step (inf: none, as in the papers)."""

    def __post_init__(self) -> None:
        OffPolicyConfig.__post_init__(self)
        if not 0.0 < self.tau <= 1.0:
            raise ConfigError("algorithm.tau", self.tau, "a number in (0, 1]")
        if not self.max_grad_norm > 0:
            raise ConfigError("algorithm.max_grad_norm", self.max_grad_norm, "a number > 0")


def box_action_problem(name: str, action_space: Any) -> str | None:
    """``None`` if ``action_space`` is a bounded, one-dimensional float ``Box``, else why
    not (naming the space and what takes it)."""
    from gymnasium import spaces

    if not isinstance(action_space, spaces.Box) or len(action_space.shape) != 1:
        return (
            f"{name} needs a one-dimensional gymnasium.spaces.Box action space (continuous "
            f"actions), got {action_space!r}; use DQN or PPO for discrete actions"
        )
    if not np.issubdtype(action_space.dtype, np.floating) or not action_space.is_bounded():
        return f"{name} needs a bounded float Box action space, got {action_space!r}"
    return None


class ActionScale:
    """The affine map between unit actions [-1, 1] and a Box's ``[low, high]``.

    Usage::

        scale = ActionScale(action_space, device)
        env_action = scale.to_env(u)            # numpy [N, D] float32, from a tensor in [-1, 1]
        u = scale.to_unit(batch["action"])       # tensor [B, D] in [-1, 1]
    """

    def __init__(self, action_space: Any, device: torch.device) -> None:
        low = np.asarray(action_space.low, np.float32)
        high = np.asarray(action_space.high, np.float32)
        self.centre_np, self.half_np = (high + low) / 2, (high - low) / 2
        self.centre = torch.as_tensor(self.centre_np, device=device)
        self.half = torch.as_tensor(self.half_np, device=device)

    def to_env(self, unit: torch.Tensor) -> np.ndarray:
        """Env-scale actions (float32 numpy) for unit actions."""
        out: np.ndarray = (unit * self.half + self.centre).cpu().numpy().astype(np.float32)
        return out

    def to_unit(self, action: np.ndarray) -> torch.Tensor:
        """Unit actions (clamped to [-1, 1]) for env-scale ones."""
        a = torch.as_tensor(np.asarray(action), dtype=torch.float32, device=self.centre.device)
        return ((a - self.centre) / self.half).clamp(-1.0, 1.0)


class TwinQ(nn.Module):
    """Two independent Q-networks over ``[observation, unit action]``; the TD target takes
    their minimum (clipped double Q-learning, Fujimoto et al. 2018)."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int]) -> None:
        super().__init__()
        self.q1 = mlp(obs_dim + act_dim, hidden, 1)
        self.q2 = mlp(obs_dim + act_dim, hidden, 1)

    def forward(self, obs: torch.Tensor, unit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Both Q-values ``[B]`` of ``obs [B, D_o]`` and unit actions ``[B, D_a]``."""
        x = torch.cat([obs, unit], dim=1)
        return self.q1(x).squeeze(1), self.q2(x).squeeze(1)

    def least(self, obs: torch.Tensor, unit: torch.Tensor) -> torch.Tensor:
        """The smaller of the two Q-values ``[B]``."""
        q1, q2 = self(obs, unit)
        return torch.minimum(q1, q2)


class ContinuousBase(AlgorithmBase):
    """:class:`AlgorithmBase` with what SAC and TD3 add alike: the spaces check, the action
    scale, flat observations, n-step transitions and the replay buffer's spec.

    A subclass builds its networks in ``_build_networks(obs_dim, act_dim, seed)``.
    """

    config: ContinuousConfig
    scale: ActionScale
    perturbable: ClassVar[Mapping[str, HyperRange]] = {"lr": HyperRange(1e-5, 1e-2)}
    """What PBT may change: the learning rate of every optimizer (n-step returns are made
    on the actors, so their discount is not the learner's to change)."""
    act_dim: int
    squashed_head: ClassVar[bool] = False
    """The module ``actor`` returns a pre-``tanh`` head (first of a tuple), not a unit action:
    :meth:`greedy_module` applies ``tanh``."""
    own_optimizers: ClassVar[tuple[str, ...]] = ()
    """Modules with an Adam of their own besides the ``trained`` ones' (SAC's actor and
    temperature, TD3's actor): each steps on its own loss, and is saved in the
    checkpoint as ``optimizer_<module>``."""

    @classmethod
    def check_spaces(cls, observation_space: Any, action_space: Any) -> str | None:
        """``None`` if the spaces are supported (a Box observation, a bounded 1-D Box
        action), else a message naming the unsupported one."""
        return box_action_problem(cls.__name__, action_space) or box_obs_problem(observation_space)

    def _build(self, spaces: Spaces, seed: int) -> None:
        self._own: dict[str, torch.optim.Optimizer] = {}  # built on first use, as Adam's
        self.scale = ActionScale(spaces.action, self.device)
        self.act_dim = int(spaces.action.shape[0])
        self._build_networks(flat_dim(spaces.observation.shape), self.act_dim, seed)

    def _build_networks(self, obs_dim: int, act_dim: int, seed: int) -> None:
        raise NotImplementedError

    def greedy_module(self) -> GreedyPolicy:
        """The greedy policy as one torch module (``tianji export``): the ``actor``
        module's unit action (after ``tanh`` for a squashed head), rescaled to the bounds."""
        s = self.scale
        low, high = s.centre_np - s.half_np, s.centre_np + s.half_np
        return GreedyPolicy(
            self._module("actor"), image=False, low=low, high=high,
            squash=self.squashed_head, unit=True, action_shape=(self.act_dim,),
        )  # fmt: skip

    def _own_optimizer(self, name: str) -> torch.optim.Optimizer:
        """The Adam of module ``name`` (one of :attr:`own_optimizers`), built on first use."""
        if name not in self._own:
            params = self._module(name).parameters()
            self._own[name] = adam(params, lr=self.config.lr, eps=self.adam_eps)
        return self._own[name]

    def _step(self, name: str, loss: torch.Tensor) -> torch.Tensor:
        """One optimizer step of module ``name`` on ``loss`` (synced over data-parallel
        learners, clipped to ``max_grad_norm``); the gradients' norm before clipping."""
        params = list(self._module(name).parameters())
        own = name in self.own_optimizers
        optimizer = self._own_optimizer(name) if own else self.optimizer
        return gradient_step(loss, params, optimizer, self.gradient_sync, self.config.max_grad_norm)

    def _extra_state(self) -> dict[str, Any]:
        return {f"optimizer_{n}": self._own_optimizer(n).state_dict() for n in self.own_optimizers}

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        for name in self.own_optimizers:
            self._own_optimizer(name).load_state_dict(state[f"optimizer_{name}"])

    def _obs(self, obs: np.ndarray) -> torch.Tensor:
        return obs_tensor(obs, self.device)

    def postprocess(self, fragment: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Flat n-step transitions (env-scale float32 actions ``[T*N, D]``)."""
        return n_step_transitions(fragment, self.config.n_step, self.config.gamma)

    def buffer_spec(self) -> BufferSpec:
        """Uniform replay with the config's warm-up and update-to-data ratio."""
        return self.config.replay_spec()

    def _batch(
        self, batch: Mapping[str, np.ndarray]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``obs``, unit ``action``, ``reward``, ``discount``, ``next_obs`` as tensors."""
        dev = self.device
        return (
            self._obs(batch["obs"]),
            self.scale.to_unit(batch["action"]),
            host_to_device(batch["reward"], dev, torch.float32),
            host_to_device(batch["discount"], dev, torch.float32),
            self._obs(batch["next_obs"]),
        )
