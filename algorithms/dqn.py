"""DQN: double Q-learning with n-step returns, a target network and optional prioritized replay.

Read top to bottom: the config, the double-DQN target, then the :class:`DQN` object the
actor and learner services drive. What it shares with QMIX (the replay config fields,
n-step transitions, the epsilon schedule, the TD loss, target updates) is in
``algorithms/_replay.py``; the weights/checkpoint boilerplate in ``algorithms/_base.py``.

* Actors call ``act`` (epsilon-greedy; epsilon follows the *learner's* update count, which
  reaches actors as the ``version`` of ``set_weights``) and ``postprocess`` (turns a
  ``[T, N]`` fragment into flat n-step transitions).
* The learner calls ``update`` on replay batches; with prioritized replay it gets
  ``batch["weight"]`` and returns new priorities ``|td error| + eps``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from tianji.algorithms import _nets as nets
from tianji.algorithms._base import Spaces
from tianji.algorithms._export import GreedyPolicy
from tianji.algorithms._replay import QLearner, ReplayConfig, n_step_transitions, td_loss

from tianji.rl.algorithm import BufferSpec, UpdateResult
from tianji.rl.masks import legal_actions, mask_size

__all__ = ["DQN", "DQNConfig", "double_dqn_target"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DQNConfig(ReplayConfig):
    """Hyperparameters of :class:`DQN` (defaults tuned for CartPole-v1): the replay fields
    of :class:`~tianji.algorithms._replay.ReplayConfig` (``gamma``, ``n_step``, ``lr``,
    ``hidden``, the epsilon schedule, ...) and these."""

    torso: str = "auto"
    """The Q-network's body: "mlp", "nature" (the Nature-DQN CNN for uint8 image
    observations, e.g. the Atari preset's), "board" (a convolution over board games'
    piece planes, ``algorithms/_board.py``; "board_lines" also shows it where each side
    would complete a line, "board_drops" that and what a piece dropped in each column
    would complete, for connect four), "auto" (the CNN for images, else the MLP) or
    your own ``"package.module:Class"`` / ``"file.py:Class"`` (``Class(observation_space)``,
    an ``nn.Module`` with an int ``features``; a linear head is put on it)."""
    double: bool = True
    """Pick next actions with the online net and evaluate them with the target net."""
    prioritized: bool = False
    """Use proportional prioritized replay instead of uniform replay."""
    alpha: float = 0.6
    """Priority exponent (prioritized replay)."""
    beta: float = 0.4
    """Importance-weight exponent (prioritized replay)."""
    priority_eps: float = 1e-6
    """Added to ``|td error|`` so no transition gets priority zero."""


# --------------------------------------------------------------------------- pure math


def double_dqn_target(
    reward: torch.Tensor,
    discount: torch.Tensor,
    next_q_online: torch.Tensor,
    next_q_target: torch.Tensor,
) -> torch.Tensor:
    """``reward + discount * Q_target(s', argmax_a Q_online(s', a))`` per transition.

    Pass the target net's values as both ``next_q`` arguments for vanilla DQN's max.
    """
    best = next_q_online.argmax(dim=1, keepdim=True)
    return reward + discount * next_q_target.gather(1, best).squeeze(1)


# --------------------------------------------------------------------------- algorithm


class DQN(QLearner):
    """Double DQN with n-step returns over an MLP Q-network (see :class:`DQNConfig`).

    Usage::

        algo = DQN(DQN.Config(), env.observation_space, env.action_space, seed=0)
        out = algo.act(obs, explore=True)         # {"action": int64 [N]}
        transitions = algo.postprocess(fragment)  # flat n-step transitions
        result = algo.update(replay_batch)        # -> UpdateResult(metrics, priorities)
    """

    name = "dqn"
    Config = DQNConfig
    networks = ("q", "q_target")
    trained = ("q",)
    targets = (("q", "q_target"),)
    published = "q"
    action_masks = True
    """Over masked observations (:mod:`tianji.rl.masks`) the Q-networks give illegal actions
    :data:`~tianji.algorithms._nets.MASK_FILL`: greedy actions, exploration and the TD
    targets' max are over legal actions only."""
    config: DQNConfig

    @staticmethod
    def check_spaces(observation_space: Any, action_space: Any) -> str | None:
        """``None`` if DQN supports the spaces, else a message naming the unsupported one."""
        from gymnasium import spaces

        if not isinstance(action_space, spaces.Discrete):
            return f"DQN needs a gymnasium.spaces.Discrete action space, got {action_space!r}"
        return nets.box_obs_problem(observation_space)

    def _build(self, spaces: Spaces, seed: int) -> None:
        """The online and target Q-networks (the target starting as a copy)."""
        config, observation_space = self.config, spaces.observation
        self.n_actions = int(spaces.action.n)
        self.action_start = int(spaces.action.start)
        self.obs_space = observation_space
        self.masked = mask_size(observation_space) > 0
        torso = nets.resolve_torso("algo.torso", config.torso, observation_space)
        image_input = nets.is_custom(torso) and nets.is_image_space(observation_space)
        self.image = torso == "nature" or image_input  # uint8 pixels go in as they are
        with nets.seeded_init(seed):
            self.q = nets.build_network(torso, observation_space, config.hidden, self.n_actions)
            self.q_target = nets.build_network(
                torso, observation_space, config.hidden, self.n_actions
            )
        self.q.to(self.device)
        self.q_target.to(self.device)
        self._init_targets()

    def act(self, obs: np.ndarray, *, explore: bool) -> dict[str, np.ndarray]:
        """Epsilon-greedy (``explore``) or greedy actions for ``obs [N, ...]``."""
        with torch.no_grad():
            greedy = (
                self.q(nets.obs_tensor(obs, self.device, image=self.image))
                .argmax(dim=1)
                .cpu()
                .numpy()
            )
        if explore:
            legal = legal_actions(obs, self.obs_space) if self.masked else None
            greedy = self._explore(greedy, legal)
        return {"action": (greedy + self.action_start).astype(np.int64)}

    def greedy_module(self) -> GreedyPolicy:
        """The greedy policy as one torch module (``tianji export``): the argmax of Q."""
        return GreedyPolicy(self.q, image=self.image, discrete_start=self.action_start)

    def postprocess(self, fragment: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Flat n-step transitions from a ``[T, N]`` fragment (see :func:`n_step_transitions`)."""
        return n_step_transitions(fragment, self.config.n_step, self.config.gamma)

    def update(self, batch: Mapping[str, np.ndarray]) -> UpdateResult:
        """One gradient step on a replay batch; returns metrics and, if prioritized, priorities."""
        c, dev = self.config, self.device
        action = nets.host_to_device(batch["action"], dev, torch.int64)
        q = self.q(nets.obs_tensor(batch["obs"], dev, image=self.image))
        q_taken = q.gather(1, (action - self.action_start)[:, None]).squeeze(1)
        with torch.no_grad():
            next_obs = nets.obs_tensor(batch["next_obs"], dev, image=self.image)
            next_target = self.q_target(next_obs)
            target = double_dqn_target(
                nets.host_to_device(batch["reward"], dev, torch.float32),
                nets.host_to_device(batch["discount"], dev, torch.float32),
                self.q(next_obs) if c.double else next_target,
                next_target,
            )
        td = q_taken - target
        weight = None
        if "weight" in batch:
            weight = nets.host_to_device(batch["weight"], dev, torch.float32)
        loss = td_loss(q_taken, target, c.huber_delta, weight)
        grad_norm = self._gradient_step(loss)
        self._count_update()
        td_abs = td.detach().abs().cpu().numpy().astype(np.float64)
        metrics = {
            "loss": float(loss.item()),
            "q_mean": float(q_taken.mean().item()),
            "td_abs_mean": float(td_abs.mean()),
            "grad_norm": float(grad_norm.item()),
            "epsilon": self.epsilon,
        }
        priorities = td_abs + c.priority_eps if c.prioritized else None
        return UpdateResult(metrics=metrics, priorities=priorities)

    def buffer_spec(self) -> BufferSpec:
        """Uniform or prioritized replay over flat transitions."""
        c = self.config
        kind = "prioritized" if c.prioritized else "replay"
        return dataclasses.replace(super().buffer_spec(), kind=kind, alpha=c.alpha, beta=c.beta)
