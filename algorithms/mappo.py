"""MAPPO: PPO with one policy shared by every agent and a centralized value function.

Cooperative multi-agent envs (``tianji.rl.multiagent``): each agent acts from its own
observation (plus a one-hot of its index, so a shared network can still specialise) with
the *same* policy network; the critic sees the global state and values the team's return.
The advantage of an env step is the team's, given to every agent's action in that step
(Yu et al., "The Surprising Effectiveness of PPO in Cooperative Multi-Agent Games", 2022).

Read top to bottom: the config, the network, then the :class:`MAPPO` object the actor
and learner services drive. It composes the pieces PPO does: the on-policy config fields
and epochs (``_onpolicy.py``), GAE (``_gae.py``), the clipped losses (``_losses.py``), the
categorical head (``_distributions.py``) and the weights/checkpoint boilerplate
(``_base.py``).

* Actors call ``act(obs [N, A, D])``: actions ``[N, A]`` and their ``logp [N, A]``.
* The learner calls ``update`` on ``[T, N*K]`` batches: ``V(state)`` and ``V(next_state)``
  are recomputed with the current critic, GAE runs over the team reward (bootstrapping at
  truncations and fragment ends, not at terminations: ``algorithms/_gae.py``), then
  ``update_epochs`` passes of minibatches of env steps (all agents of a step together).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from tianji.algorithms._base import Spaces
from tianji.algorithms._distributions import head_stats, sample_categorical
from tianji.algorithms._gae import gae
from tianji.algorithms._losses import kl_stats, normalized, ppo_objective
from tianji.algorithms._multiagent import agent_counts, agent_inputs
from tianji.algorithms._nets import as_hidden, flat_dim, mlp, seeded_init
from tianji.algorithms._onpolicy import (
    OnPolicyAlgorithm,
    OnPolicyConfig,
    compact_fragment,
    epoch_minibatches,
    explained_variance,
    run_epochs,
    set_annealed_lr,
)
from torch import nn

from tianji.rl.algorithm import UpdateResult

__all__ = ["MAPPO", "MAPPOConfig", "SharedActorCentralCritic"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MAPPOConfig(OnPolicyConfig):
    """Hyperparameters of :class:`MAPPO` (defaults tuned for mpe2 ``simple_spread_v3``): the
    on-policy fields of :class:`~tianji.algorithms._onpolicy.OnPolicyConfig` with these
    defaults, and the critic's and the agent id's fields."""

    lr: float = 7e-4
    reward_scale: float = 0.1
    fragments_per_batch: int = 2
    update_epochs: int = 10
    num_minibatches: int = 2
    max_grad_norm: float = 10.0
    critic_hidden: Sequence[int] = (128, 128)
    """Hidden layer sizes of the centralized critic MLP (input: the global state)."""
    agent_id: bool = True
    """Append a one-hot of the agent's index to its observation (policy input)."""

    def __post_init__(self) -> None:
        OnPolicyConfig.__post_init__(self)
        object.__setattr__(
            self, "critic_hidden", as_hidden("algorithm.critic_hidden", self.critic_hidden)
        )


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


class MAPPO(OnPolicyAlgorithm):
    """Parameter-shared PPO with a centralized critic (see :class:`MAPPOConfig`).

    Usage::

        algo = MAPPO(MAPPO.Config(), obs_space, action_space, state_space=state_space)
        out = algo.act(obs, explore=True)   # obs [N, A, D] -> {"action", "logp"} [N, A]
        result = algo.update(batch)         # K fragments concatenated, [T, N*K, ...]
    """

    name = "mappo"
    Config = MAPPOConfig
    multi_agent = True
    networks = trained = ("net",)
    published = "net.actor"
    """Actors get the shared policy only; the critic stays on the learner."""
    adam_eps = 1e-5
    config: MAPPOConfig

    def _build(self, spaces: Spaces, seed: int) -> None:
        """The shared policy and the centralized critic, the sampling generator."""
        self.n_agents, self.n_actions, self.action_start = agent_counts(spaces.action)
        agent_id = self.n_agents if self.config.agent_id else 0
        in_dim = flat_dim(spaces.observation.shape[1:]) + agent_id
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        with seeded_init(seed):
            self.net = SharedActorCentralCritic(
                in_dim, self.n_actions, flat_dim(spaces.state.shape), self.config
            ).to(self.device)

    # ----------------------------------------------------------------- actor side

    def act(self, obs: np.ndarray, *, explore: bool) -> dict[str, np.ndarray]:
        """Sample (``explore``) or take the most likely action of every agent in ``obs``."""
        with torch.no_grad():
            inputs = agent_inputs(obs, with_id=self.config.agent_id).to(self.device)
            action, logp = sample_categorical(self.net.logits(inputs), explore, self.generator)
        return {
            "action": action.cpu().numpy().astype(np.int64) + self.action_start,
            "logp": logp.cpu().numpy().astype(np.float32),
        }

    def postprocess(self, fragment: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The fragment with compact dtypes; ``agent_reward`` is left out (the team reward
        trains MAPPO)."""
        return compact_fragment(fragment, drop=("agent_reward",))

    # ----------------------------------------------------------------- learner side

    def update(self, batch: Mapping[str, np.ndarray]) -> UpdateResult:
        """GAE over the team reward of the ``[T, M]`` batch, then minibatch epochs."""
        c = self.config
        flat = self._prepare(batch)
        set_annealed_lr(self.optimizer, c, self.version)

        def minibatches(size: int) -> list[np.ndarray]:
            return epoch_minibatches(size, c.num_minibatches, self.rng)

        metrics = run_epochs(flat, c.update_epochs, minibatches, self._minibatch_step)
        self.version += 1
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

    def _minibatch_step(self, mb: dict[str, torch.Tensor]) -> dict[str, float]:
        """One optimizer step on a minibatch of env steps (every agent of each)."""
        c = self.config
        logp, entropy = head_stats(self.net.logits(mb["inputs"]), mb["action"])  # [B, A]
        adv = normalized(mb["adv"]) if c.norm_adv else mb["adv"]
        # the team's advantage for every agent's action of the step
        value = self.net.value(mb["state"])
        losses = ppo_objective(c, mb, logp, entropy, value, adv[:, None].expand_as(logp))
        self._gradient_step(losses.total)
        return {**losses.metrics(), **kl_stats(logp, mb["old_logp"])}
