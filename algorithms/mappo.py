"""MAPPO: PPO with one policy shared by every agent and a centralized value function.

Cooperative multi-agent envs (``tianji.rl.multiagent``): each agent acts from its own
observation (plus a one-hot of its index, so a shared network can still specialise) with
the *same* policy network; the critic sees the global state and values the team's return.
The advantage of an env step is the team's, given to every agent's action in that step
(Yu et al., "The Surprising Effectiveness of PPO in Cooperative Multi-Agent Games", 2022).

Read top to bottom: the config, the network, then the :class:`MAPPO` object the actor
and learner services drive.

* Actors call ``act(obs [N, A, D])``: actions ``[N, A]`` and their ``logp [N, A]``.
* The learner calls ``update`` on ``[T, N*K]`` batches: ``V(state)`` and ``V(next_state)``
  are recomputed with the current critic, GAE runs over the team reward (bootstrapping at
  truncations and fragment ends, not at terminations: ``tianji.algorithms.ppo.gae``), then
  ``update_epochs`` passes of minibatches of env steps (all agents of a step together).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tianji.algorithms._multiagent import agent_inputs, multi_agent_problem
from tianji.algorithms._nets import (
    adam,
    as_hidden,
    flat_dim,
    gradient_step,
    load_numpy_weights,
    mlp,
    numpy_weights,
    pick_device,
    require_spaces,
    seeded_init,
)
from tianji.algorithms.ppo import (
    annealed_lr,
    clipped_surrogate_loss,
    compact_fragment,
    epoch_minibatches,
    explained_variance,
    gae,
    value_loss,
)
from torch import nn

from tianji.rl.algorithm import BufferSpec, GradientSync, UpdateResult
from tianji.rl.errors import ConfigError

__all__ = ["MAPPO", "MAPPOConfig", "SharedActorCentralCritic"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MAPPOConfig:
    """Hyperparameters of :class:`MAPPO` (defaults tuned for mpe2 ``simple_spread_v3``)."""

    lr: float = 7e-4
    """Adam learning rate (actor and critic)."""
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
    reward_scale: float = 0.1
    """Team rewards are multiplied by this before GAE (keeps value targets near unit scale)."""
    fragments_per_batch: int = 2
    """Fragments (each ``[T, N]``) concatenated along the env axis into one learner batch."""
    buffer_capacity: int = 8
    """Fragments the rollout buffer keeps at most (the oldest are dropped)."""
    update_epochs: int = 10
    """Passes over each batch."""
    num_minibatches: int = 2
    """Minibatches (of env steps, every agent of a step in the same one) per epoch."""
    clip_coef: float = 0.2
    """Surrogate clip range: the ratio is kept in ``[1 - clip, 1 + clip]``."""
    clip_value_loss: bool = True
    """Clip the value update around the pre-update values by ``clip_coef`` too."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    ent_coef: float = 0.01
    """Weight of the entropy bonus (mean over agents)."""
    max_grad_norm: float = 10.0
    """Gradient-norm clip per minibatch step."""
    norm_adv: bool = True
    """Normalize advantages per minibatch."""
    hidden: Sequence[int] = (64, 64)
    """Hidden layer sizes of the shared policy MLP."""
    critic_hidden: Sequence[int] = (128, 128)
    """Hidden layer sizes of the centralized critic MLP (input: the global state)."""
    agent_id: bool = True
    """Append a one-hot of the agent's index to its observation (policy input)."""

    def __post_init__(self) -> None:
        for key in ("hidden", "critic_hidden"):
            object.__setattr__(self, key, as_hidden(f"algorithm.{key}", getattr(self, key)))
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


# --------------------------------------------------------------------------- network


class SharedActorCentralCritic(nn.Module):
    """One policy MLP applied to every agent's input; one value MLP over the global state."""

    def __init__(self, in_dim: int, n_actions: int, state_dim: int, config: MAPPOConfig):
        super().__init__()
        self.actor = mlp(in_dim, config.hidden, n_actions, activation=nn.Tanh, out_gain=0.01)
        self.critic = mlp(state_dim, config.critic_hidden, 1, activation=nn.Tanh, out_gain=1.0)

    def logits(self, inputs: torch.Tensor) -> torch.Tensor:
        """Action logits ``[B, A, n]`` for agent inputs ``[B, A, D']``."""
        out: torch.Tensor = self.actor(inputs)
        return out

    def value(self, state: torch.Tensor) -> torch.Tensor:
        """``V(state) [B]`` for ``state [B, S]``."""
        out: torch.Tensor = self.critic(state).squeeze(-1)
        return out


# --------------------------------------------------------------------------- algorithm


class MAPPO:
    """Parameter-shared PPO with a centralized critic (see :class:`MAPPOConfig`).

    Usage::

        algo = MAPPO(MAPPO.Config(), obs_space, action_space, state_space=state_space)
        out = algo.act(obs, explore=True)   # obs [N, A, D] -> {"action", "logp"} [N, A]
        result = algo.update(batch)         # K fragments concatenated, [T, N*K, ...]
    """

    name = "mappo"
    Config = MAPPOConfig
    multi_agent = True

    @staticmethod
    def check_spaces(observation_space: Any, action_space: Any) -> str | None:
        """``None`` if MAPPO supports the spaces, else a message naming the unsupported one."""
        problem = multi_agent_problem(observation_space, action_space)
        return f"MAPPO: {problem}" if problem else None

    def __init__(
        self,
        config: MAPPOConfig,
        observation_space: Any,
        action_space: Any,
        *,
        seed: int = 0,
        device: str = "auto",
        state_space: Any,
    ) -> None:
        require_spaces(
            self.check_spaces(observation_space, action_space), observation_space, action_space
        )
        self.config = config
        self.device = pick_device(device)
        self.n_agents = int(observation_space.shape[0])
        self.n_actions = int(action_space.nvec[0])
        self.action_start = int(action_space.start[0])
        in_dim = flat_dim(observation_space.shape[1:]) + (self.n_agents if config.agent_id else 0)
        self.version = 0
        self.rng = np.random.default_rng(seed)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        with seeded_init(seed):
            self.net = SharedActorCentralCritic(
                in_dim, self.n_actions, flat_dim(state_space.shape), config
            ).to(self.device)
        self._optimizer: torch.optim.Optimizer | None = None  # built on first update
        self.gradient_sync: GradientSync | None = None  # set by the learner when K > 1

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """Adam, built on first use (actors never update)."""
        if self._optimizer is None:
            self._optimizer = adam(self.net.parameters(), lr=self.config.lr, eps=1e-5)
        return self._optimizer

    # ----------------------------------------------------------------- actor side

    def act(self, obs: np.ndarray, *, explore: bool) -> dict[str, np.ndarray]:
        """Sample (``explore``) or take the most likely action of every agent in ``obs``."""
        with torch.no_grad():
            inputs = agent_inputs(obs, with_id=self.config.agent_id).to(self.device)
            log_probs = torch.log_softmax(self.net.logits(inputs), dim=-1)
            if explore:
                flat = log_probs.reshape(-1, self.n_actions).exp()
                action = torch.multinomial(flat, 1, generator=self.generator)
                action = action.reshape(log_probs.shape[:-1])
            else:
                action = log_probs.argmax(dim=-1)
            logp = log_probs.gather(-1, action[..., None]).squeeze(-1)
        return {
            "action": action.cpu().numpy().astype(np.int64) + self.action_start,
            "logp": logp.cpu().numpy().astype(np.float32),
        }

    def postprocess(self, fragment: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The fragment with compact dtypes; ``agent_reward`` is left out (the team reward
        trains MAPPO)."""
        return compact_fragment(fragment, drop=("agent_reward",))

    def get_weights(self) -> dict[str, np.ndarray]:
        """The shared policy's weights (all an actor needs; the critic stays on the learner)."""
        return numpy_weights(self.net.actor)

    def set_weights(self, weights: Mapping[str, np.ndarray], version: int) -> None:
        """Load the policy weights published by the learner at ``version`` updates."""
        load_numpy_weights(self.net.actor, weights)
        self.version = version

    def state_dict(self) -> dict[str, Any]:
        """Everything a learner needs to continue: policy and critic, Adam, update count."""
        return {
            "net": self.net.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "version": self.version,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict` (same config and spaces)."""
        self.net.load_state_dict(state["net"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = int(state["version"])

    def buffer_spec(self) -> BufferSpec:
        """A FIFO of fragments; ``fragments_per_batch`` of them make one learner batch."""
        c = self.config
        return BufferSpec(
            kind="rollout",
            capacity=c.buffer_capacity,
            batch_size=c.fragments_per_batch,
            min_size=c.fragments_per_batch,
        )

    # ----------------------------------------------------------------- learner side

    def update(self, batch: Mapping[str, np.ndarray]) -> UpdateResult:
        """GAE over the team reward of the ``[T, M]`` batch, then minibatch epochs."""
        c = self.config
        flat = self._prepare(batch)
        if c.lr_anneal_updates > 0:
            lr = annealed_lr(c.lr, self.version, c.lr_anneal_updates, c.lr_floor)
            self.optimizer.param_groups[0]["lr"] = lr
        totals: dict[str, float] = {}
        steps = 0
        for _ in range(c.update_epochs):
            for index in epoch_minibatches(len(flat["adv"]), c.num_minibatches, self.rng):
                mb = {k: v[index] for k, v in flat.items()}
                for k, v in self._minibatch_step(mb).items():
                    totals[k] = totals.get(k, 0.0) + v
                steps += 1
        self.version += 1
        metrics = {k: v / steps for k, v in totals.items()}
        metrics["explained_variance"] = explained_variance(flat["ret"], flat["old_value"])
        metrics["lr"] = self.optimizer.param_groups[0]["lr"]
        return UpdateResult(metrics=metrics)

    def _prepare(self, batch: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """Values of ``state``/``next_state``, GAE, and ``[T, M, ...]`` to ``[T*M, ...]``."""
        c, dev = self.config, self.device
        reward = np.asarray(batch["reward"], dtype=np.float64) * c.reward_scale
        shape = reward.shape

        def flat(key: str) -> torch.Tensor:
            arr = np.asarray(batch[key])
            return torch.as_tensor(arr.reshape(shape[0] * shape[1], *arr.shape[2:]), device=dev)

        state = flat("state").float().reshape(reward.size, -1)
        with torch.no_grad():
            value = self.net.value(state)
            next_value = self.net.value(flat("next_state").float().reshape(reward.size, -1))
        adv, ret = gae(
            reward,
            value.cpu().numpy().astype(np.float64).reshape(shape),
            next_value.cpu().numpy().astype(np.float64).reshape(shape),
            batch["terminated"],
            batch["truncated"],
            c.gamma,
            c.gae_lambda,
        )
        return {
            "inputs": agent_inputs(flat("obs"), with_id=c.agent_id).to(dev),
            "action": flat("action").long() - self.action_start,
            "old_logp": flat("logp").float(),
            "state": state,
            "old_value": value,
            "adv": torch.as_tensor(adv.reshape(-1), device=dev),
            "ret": torch.as_tensor(ret.reshape(-1), device=dev),
        }

    def _minibatch_step(self, mb: Mapping[str, torch.Tensor]) -> dict[str, float]:
        c = self.config
        log_probs = torch.log_softmax(self.net.logits(mb["inputs"]), dim=-1)  # [B, A, n]
        logp = log_probs.gather(-1, mb["action"][..., None]).squeeze(-1)  # [B, A]
        entropy = -(log_probs.exp() * log_probs).sum(-1).mean()
        adv = mb["adv"]
        if c.norm_adv and len(adv) > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        # the team's advantage for every agent's action of the step
        pg_loss = clipped_surrogate_loss(
            logp, mb["old_logp"], adv[:, None].expand_as(logp), c.clip_coef
        )
        value = self.net.value(mb["state"])
        clip_v = c.clip_coef if c.clip_value_loss else None
        v_loss = value_loss(value, mb["old_value"], mb["ret"], clip_v)
        loss = pg_loss + c.vf_coef * v_loss - c.ent_coef * entropy
        params = list(self.net.parameters())
        gradient_step(loss, params, self.optimizer, self.gradient_sync, c.max_grad_norm)
        with torch.no_grad():
            log_ratio = logp - mb["old_logp"]
            approx_kl = ((log_ratio.exp() - 1) - log_ratio).mean()
        return {
            "loss": float(loss.item()),
            "policy_loss": float(pg_loss.item()),
            "value_loss": float(v_loss.item()),
            "entropy": float(entropy.item()),
            "approx_kl": float(approx_kl.item()),
        }
