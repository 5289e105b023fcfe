"""REINFORCE with a learned baseline: a complete custom tianji algorithm in one file.

Train it through the same CLI as the built-in ones::

    tianji train examples/cartpole_reinforce.toml

The algorithm never sees a socket, an event loop or a process: tianji's actor services call
``act``/``postprocess``/``set_weights``, the learner service calls ``update``/
``get_weights``, and ``buffer_spec`` asks for a FIFO of whole fragments (on-policy).
Returns are discounted within a fragment and bootstrapped with the baseline where a
fragment cuts an episode (or the episode was truncated), never after a termination.
See docs/writing-an-algorithm.md for a walk-through.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from tianji.rl.algorithm import BufferSpec, UpdateResult


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ReinforceConfig:
    """Hyperparameters (the ``[algo]`` table of a run config)."""

    lr: float = 1e-3
    """Adam learning rate (policy and baseline)."""
    gamma: float = 0.99
    """Discount factor."""
    hidden: int = 64
    """Units of the two hidden layers."""
    fragments_per_batch: int = 2
    """Fragments (of all actors) per learner update."""
    entropy_coef: float = 0.01
    """Entropy bonus weight."""


def discounted_returns(
    reward: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    next_value: np.ndarray,
    gamma: float,
) -> np.ndarray:
    """Returns-to-go ``[T, N]``: bootstrap with ``next_value`` at truncations and at the
    fragment's end, not after terminations."""
    returns = np.zeros_like(reward, dtype=np.float32)
    running = next_value[-1] * (1.0 - terminated[-1])
    for t in range(reward.shape[0] - 1, -1, -1):
        cut = truncated[t] & ~terminated[t]
        running = np.where(cut, next_value[t], running)  # restart from V(final obs)
        running = reward[t] + gamma * running * (1.0 - terminated[t])
        returns[t] = running
    return returns


class Reinforce:
    """Policy gradient with a value baseline for discrete actions."""

    name = "reinforce"
    Config = ReinforceConfig

    @staticmethod
    def check_spaces(observation_space: Any, action_space: Any) -> str | None:
        if not isinstance(action_space, gym.spaces.Discrete):
            return f"REINFORCE here needs Discrete actions, got {action_space}"
        if not isinstance(observation_space, gym.spaces.Box):
            return f"REINFORCE here needs Box observations, got {observation_space}"
        return None

    def __init__(
        self,
        config: ReinforceConfig,
        observation_space: Any,
        action_space: Any,
        *,
        seed: int = 0,
        device: str = "auto",
    ) -> None:
        self.config = config
        torch.manual_seed(seed)
        self.device = torch.device(
            "cuda"
            if device == "auto" and torch.cuda.is_available()
            else ("cpu" if device == "auto" else device)
        )
        n_in, n_out, h = int(np.prod(observation_space.shape)), int(action_space.n), config.hidden
        self.policy = nn.Sequential(
            nn.Linear(n_in, h), nn.Tanh(), nn.Linear(h, h), nn.Tanh(), nn.Linear(h, n_out)
        ).to(self.device)
        self.baseline = nn.Sequential(nn.Linear(n_in, h), nn.Tanh(), nn.Linear(h, 1)).to(
            self.device
        )
        params = [*self.policy.parameters(), *self.baseline.parameters()]
        self.optimizer = torch.optim.Adam(params, lr=config.lr)
        self.rng = np.random.default_rng(seed)

    def _obs(self, obs: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(obs, dtype=torch.float32, device=self.device).flatten(1)

    def act(self, obs: np.ndarray, *, explore: bool) -> dict[str, np.ndarray]:
        with torch.no_grad():
            logits = self.policy(self._obs(obs))
        if not explore:
            return {"action": logits.argmax(-1).cpu().numpy()}
        action = torch.distributions.Categorical(logits=logits).sample()
        return {"action": action.cpu().numpy()}

    def postprocess(self, fragment: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(fragment)  # the learner needs the whole [T, N] fragment

    def buffer_spec(self) -> BufferSpec:
        k = self.config.fragments_per_batch
        return BufferSpec(kind="rollout", capacity=8 * k, batch_size=k, min_size=k)

    def update(self, batch: Mapping[str, np.ndarray]) -> UpdateResult:
        t, n = batch["reward"].shape[:2]
        obs = self._obs(batch["obs"].reshape(t * n, -1))
        with torch.no_grad():
            next_value = self.baseline(self._obs(batch["next_obs"].reshape(t * n, -1)))
        returns = discounted_returns(
            batch["reward"],
            batch["terminated"].astype(np.float32) > 0,
            batch["truncated"].astype(bool),
            next_value.view(t, n).cpu().numpy(),
            self.config.gamma,
        )
        target = torch.as_tensor(returns.reshape(-1), device=self.device)
        value = self.baseline(obs).view(-1)
        advantage = (target - value).detach()
        advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
        dist = torch.distributions.Categorical(logits=self.policy(obs))
        action = torch.as_tensor(batch["action"].reshape(-1), device=self.device)
        policy_loss = -(dist.log_prob(action) * advantage).mean()
        entropy = dist.entropy().mean()
        value_loss = 0.5 * (target - value).pow(2).mean()
        loss = policy_loss + value_loss - self.config.entropy_coef * entropy
        self.optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        self.optimizer.step()
        return UpdateResult(
            metrics={
                "policy_loss": float(policy_loss),
                "value_loss": float(value_loss),
                "entropy": float(entropy),
            }
        )

    def get_weights(self) -> dict[str, np.ndarray]:
        return {k: v.detach().cpu().numpy() for k, v in self.policy.state_dict().items()}

    def set_weights(self, weights: Mapping[str, np.ndarray], version: int) -> None:
        self.policy.load_state_dict({k: torch.as_tensor(v) for k, v in weights.items()})
