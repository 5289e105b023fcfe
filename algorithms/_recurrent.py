"""A recurrent actor-critic: torso, a GRU core, policy and value heads; unrolled over fragments.

Used by PPO, APPO and IMPALA with ``[algo] core = "gru"``. The hidden state of each env
lives outside the network, with whoever steps the env (the actor for a local policy, the
inference service for a remote one, in :class:`tianji.rl.slots.StateSlots`): ``step`` takes
the state before an observation and returns the state after it. The state each step
started from is stored in the fragment (``core_state``), so the learner unrolls every
column from its first step's stored state, resetting it where an episode began inside
the fragment (truncated backpropagation through time over the fragment's length).

The learner's side, as pure functions PPO and IMPALA compose: :func:`unroll_batch` (the
whole batch from the stored states, for the values and log-probabilities of GAE/V-trace),
:func:`column_minibatches` (minibatches of whole env columns) and :func:`unroll_columns`
(a minibatch of columns, with ``burn_in``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from tianji.algorithms._nets import masked_head, mlp
from tianji.algorithms._onpolicy import epoch_minibatches
from tianji.algorithms._policy_net import PolicyNetSpec
from torch import nn

from tianji.rl.errors import ConfigError

__all__ = [
    "CORES",
    "RecurrentActorCritic",
    "column_minibatches",
    "episode_starts",
    "unroll_batch",
    "unroll_columns",
]

CORES = ("none", "gru")
"""What ``[algo] core`` may say: "none" (a feed-forward policy) or "gru"."""


def episode_starts(terminated: Any, truncated: Any) -> torch.Tensor:
    """``[T, M]`` bool: where a new episode begins at step ``t`` inside a fragment, i.e.
    the previous step ended one. Step 0 is never a start here: the stored state of a
    fragment's first step is already the fresh one when an episode began there."""
    done = torch.as_tensor(terminated, dtype=torch.bool) | torch.as_tensor(
        truncated, dtype=torch.bool
    )
    starts = torch.zeros_like(done)
    starts[1:] = done[:-1]
    return starts


class RecurrentActorCritic(nn.Module):
    """Observation -> torso -> GRU cell -> (policy head, value head).

    Args:
        spec: the observations, the head and the torso (:class:`PolicyNetSpec`).
        core_hidden: the GRU's state size.
    """

    def __init__(self, spec: PolicyNetSpec, *, core_hidden: int) -> None:
        super().__init__()
        self.image = spec.image
        self.state_size = core_hidden
        self.obs_norm = spec.obs_norm()
        self.torso, features = spec.torso()
        self.core = nn.GRUCell(features, core_hidden)
        self.actor = mlp(core_hidden, (), spec.out_dim, out_gain=0.01)
        self.critic = mlp(core_hidden, (), 1, out_gain=1.0)
        self.log_std = spec.log_std()
        self.mask = spec.mask

    def step(
        self, obs: torch.Tensor, state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step for a batch: ``(head [B, A], value [B], next state [B, H])``."""
        h = self.core(self.features(obs), state)
        return self._head(h, obs), self.critic(h).squeeze(-1), h

    def _head(self, h: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """The policy head over states ``h [..., H]``, its illegal logits masked by the
        observations ``obs [..., D]`` they follow."""
        head: torch.Tensor = self.actor(h)
        return masked_head(head, obs, self.mask) if self.mask else head

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        """The torso's output for ``obs [B, ...]`` (normalized first with ``obs_norm``)."""
        if self.obs_norm is not None:
            obs = self.obs_norm(obs)
        out: torch.Tensor = self.torso(obs)
        return out

    def unroll(
        self,
        obs: torch.Tensor,
        state: torch.Tensor,
        starts: torch.Tensor,
        chunk: int = 2048,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run ``[T, M, ...]`` observations from ``state [M, H]``, zeroing the state of a
        column where ``starts [T, M]`` says an episode begins.

        Returns:
            ``(heads [T, M, A], values [T, M], states after each step [T, M, H])``.
        """
        steps, width = obs.shape[:2]
        flat = obs.reshape(steps * width, *obs.shape[2:])
        features = torch.cat(
            [self.features(flat[i : i + chunk]) for i in range(0, len(flat), chunk)]
        )
        features = features.view(steps, width, -1)
        starts = starts.to(features.device)
        h, after = state, []
        for t in range(steps):
            h = torch.where(starts[t, :, None], torch.zeros_like(h), h)
            h = self.core(features[t], h)
            after.append(h)
        states = torch.stack(after)
        return self._head(states, obs), self.critic(states).squeeze(-1), states


def unroll_batch(
    net: RecurrentActorCritic,
    obs: torch.Tensor,
    batch: Mapping[str, np.ndarray],
    burn_in: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """The core over a ``[T, M]`` batch (``obs`` flat ``[T*M, ...]``) from the states stored
    with it (``core_state``), reset where episodes begin.

    Returns:
        ``(heads [T*M, A], values [T*M], states after each step [T*M, H], the flat
        tensors minibatches unroll from: core_state, starts)``.

    Raises:
        ConfigError: if ``burn_in`` leaves no step of the fragments to learn from.
    """
    steps, width = np.shape(batch["reward"])
    if burn_in >= steps:
        raise ConfigError("algorithm.burn_in", burn_in, f"less than the fragment length {steps}")
    dev = obs.device
    stored = torch.as_tensor(np.asarray(batch["core_state"], np.float32), device=dev)
    starts = episode_starts(batch["terminated"], batch["truncated"]).to(dev)
    heads, values, after = net.unroll(obs.view(steps, width, *obs.shape[1:]), stored[0], starts)
    extra = {
        "core_state": stored.reshape(steps * width, -1),
        "starts": starts.reshape(-1),
    }
    flat_heads = heads.reshape(steps * width, -1)
    return flat_heads, values.reshape(-1), after.reshape(steps * width, -1), extra


def column_minibatches(
    size: int, steps: int, num_minibatches: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """One epoch's minibatches of flat ``[T*M]`` indices (``size = T*M``, ``steps = T``):
    random whole columns, every step of each in time order."""
    width = size // steps
    columns = epoch_minibatches(width, min(num_minibatches, width), rng)
    rows = np.arange(steps)[:, None] * width
    return [(rows + cols[None, :]).reshape(-1) for cols in columns]


def unroll_columns(
    net: RecurrentActorCritic, mb: Mapping[str, torch.Tensor], steps: int, burn_in: int
) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """A minibatch of whole columns (time-major, flat): unroll them from their stored first
    states, the first ``burn_in`` steps without gradient and left out.

    Returns:
        ``(the minibatch without its burn-in steps, heads [B, A], values [B])``, flat.
    """
    width = len(mb["obs"]) // steps

    def columns(x: torch.Tensor) -> torch.Tensor:
        return x.view(steps, width, *x.shape[1:])

    obs, starts = columns(mb["obs"]), columns(mb["starts"])
    state = columns(mb["core_state"])[0]
    if burn_in:
        with torch.no_grad():
            state = net.unroll(obs[:burn_in], state, starts[:burn_in])[2][-1]
    heads, value, _ = net.unroll(obs[burn_in:], state, starts[burn_in:])
    kept = {k: columns(v)[burn_in:].reshape(-1, *v.shape[1:]) for k, v in mb.items()}
    return kept, heads.reshape(len(kept["adv"]), -1), value.reshape(-1)
