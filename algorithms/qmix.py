"""QMIX: per-agent Q-networks mixed monotonically into a team Q by a state-conditioned net.

Cooperative multi-agent envs (``tianji.rl.multiagent``): every agent picks the argmax of its
own utility ``Q_a(o_a, u_a)`` (one network shared by all agents, fed the agent's observation
and a one-hot of its index), and the learner trains ``Q_tot = mixer(Q_1..Q_A, state)`` on
the team reward. The mixer's weights come from hypernetworks of the global state and are
made non-negative, so ``dQ_tot/dQ_a >= 0``: each agent's greedy action is also the team's
(Rashid et al., "QMIX: Monotonic Value Function Factorisation", 2018). The agent network
is an MLP over the current observation (no recurrent state).

Read top to bottom: the config, the pure math (n-step transitions of multi-agent
fragments, agent inputs), the :class:`QMixer`, then the :class:`QMIX` object.

* Actors call ``act(obs [N, A, D])`` (per-agent epsilon-greedy; epsilon follows the
  learner's update count, the ``version`` of ``set_weights``) and ``postprocess`` (flat
  n-step transitions with ``state`` and ``next_state``). Only the agent network is
  published to actors; the mixer lives on the learner.
* The learner calls ``update`` on replay batches of those transitions (double-Q target).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F
from tianji.algorithms._base import Spaces
from tianji.algorithms._multiagent import agent_counts, agent_inputs
from tianji.algorithms._nets import flat_dim, mlp, seeded_init
from tianji.algorithms._replay import QLearner, ReplayConfig, n_step_transitions, td_loss
from torch import nn

from tianji.rl.algorithm import UpdateResult
from tianji.rl.errors import ConfigError

__all__ = ["QMIX", "QMIXConfig", "QMixer", "n_step_transitions_ma"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QMIXConfig(ReplayConfig):
    """Hyperparameters of :class:`QMIX`: the replay fields of
    :class:`~tianji.algorithms._replay.ReplayConfig` (``n_step`` sums *team* rewards; the
    target update and ``max_grad_norm`` cover agent network and mixer together; the values
    tuned for mpe2 ``simple_spread_v3`` are in ``examples/spread_qmix.toml``), and these."""

    reward_scale: float = 0.1
    """Team rewards are multiplied by this in the target (keeps Q near unit scale)."""
    mixing_embed: int = 32
    """Width of the mixer's hidden layer (the ELU layer between Q_agents and Q_tot)."""
    hypernet_hidden: int = 64
    """Hidden width of the hypernetworks that produce the mixing weights."""

    def __post_init__(self) -> None:
        ReplayConfig.__post_init__(self)
        for key in ("mixing_embed", "hypernet_hidden"):
            if type(getattr(self, key)) is not int or getattr(self, key) <= 0:
                raise ConfigError(f"algorithm.{key}", getattr(self, key), "a positive integer")


# --------------------------------------------------------------------------- pure math


def n_step_transitions_ma(
    fragment: Mapping[str, np.ndarray], n: int, gamma: float
) -> dict[str, np.ndarray]:
    """Flatten a multi-agent ``[T, N]`` fragment into ``T*N`` n-step transitions.

    Row ``t*N + i`` holds the env step ``(t, i)`` with every agent: ``obs [A, D]``,
    ``action [A]``, ``state [S]``, the n-step *team* ``reward`` and ``discount``, and
    ``next_obs``/``next_state`` from ``k`` steps later, exactly as
    :func:`tianji.algorithms._replay.n_step_transitions` cuts windows (at episode ends, the
    true final observation; discount 0 only after a termination).
    """
    horizon, n_env = np.shape(fragment["reward"])
    time = np.broadcast_to(np.arange(horizon)[:, None], (horizon, n_env))
    # DQN's n-step math with the time index as the "observation": its next_obs is then the
    # index of the step each window ends at, which picks next_obs and next_state below.
    window = n_step_transitions(
        {
            "obs": time,
            "action": time,
            "reward": fragment["reward"],
            "terminated": fragment["terminated"],
            "truncated": fragment["truncated"],
            "next_obs": time,
        },
        n,
        gamma,
    )
    last = np.asarray(window["next_obs"], np.int64).reshape(horizon, n_env)
    cols = np.arange(n_env)[None, :]
    flat = horizon * n_env

    def rows(key: str, at: np.ndarray | None = None) -> np.ndarray:
        value = np.asarray(fragment[key])
        value = value if at is None else value[at, cols]
        return value.reshape(flat, *value.shape[2:])

    return {
        "obs": rows("obs").astype(np.float32),
        "action": rows("action").astype(np.int64),
        "reward": window["reward"],
        "discount": window["discount"],
        "next_obs": rows("next_obs", last).astype(np.float32),
        "state": rows("state").astype(np.float32),
        "next_state": rows("next_state", last).astype(np.float32),
    }


# --------------------------------------------------------------------------- mixer


class QMixer(nn.Module):
    """``Q_tot = w2 . elu(Q_agents @ W1 + b1) + V(state)`` with ``W1, w2 >= 0``.

    ``W1 [A, E]``, ``b1 [E]``, ``w2 [E]`` and ``V`` are produced from the state by
    hypernetworks; ``abs()`` on the weights makes ``Q_tot`` monotonic (non-decreasing) in
    every agent's Q, whatever the hypernetworks' own parameters. Usage::

        mixer = QMixer(n_agents=3, state_dim=54)
        q_tot = mixer(q_agents, state)          # [B, A], [B, S] -> [B]
        w1, w2 = mixer.mixing_weights(state)    # [B, A, E], [B, E, 1], all >= 0
    """

    def __init__(self, n_agents: int, state_dim: int, *, embed: int = 32, hidden: int = 64) -> None:
        super().__init__()
        self.n_agents, self.embed = n_agents, embed
        self.hyper_w1 = mlp(state_dim, (hidden,), n_agents * embed)
        self.hyper_w2 = mlp(state_dim, (hidden,), embed)
        self.hyper_b1 = nn.Linear(state_dim, embed)
        self.hyper_v = mlp(state_dim, (embed,), 1)

    def mixing_weights(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The non-negative mixing weights ``W1 [B, A, E]`` and ``w2 [B, E, 1]`` for a state."""
        w1 = self.hyper_w1(state).abs().view(-1, self.n_agents, self.embed)
        w2 = self.hyper_w2(state).abs().view(-1, self.embed, 1)
        return w1, w2

    def forward(self, q_agents: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """``Q_tot [B]`` from the agents' chosen-action values ``[B, A]`` and ``state [B, S]``."""
        w1, w2 = self.mixing_weights(state)
        b1 = self.hyper_b1(state).unsqueeze(1)
        hidden = F.elu(torch.bmm(q_agents.unsqueeze(1), w1) + b1)
        value: torch.Tensor = self.hyper_v(state)
        return (torch.bmm(hidden, w2).squeeze(2) + value).squeeze(1)


# --------------------------------------------------------------------------- algorithm


class QMIX(QLearner):
    """QMIX with a shared MLP agent network, n-step returns and double-Q targets.

    Usage::

        algo = QMIX(QMIX.Config(), env.observation_space, env.action_space,
                    state_space=env.state_space)
        out = algo.act(obs, explore=True)         # obs [N, A, D] -> {"action": int64 [N, A]}
        transitions = algo.postprocess(fragment)  # flat n-step transitions with state
        result = algo.update(replay_batch)        # -> UpdateResult(metrics, None)
    """

    name = "qmix"
    Config = QMIXConfig
    multi_agent = True
    networks = ("agent", "agent_target", "mixer", "mixer_target")
    trained = ("agent", "mixer")
    """Agent network, then mixer (the order gradients sync in)."""
    targets = (("agent", "agent_target"), ("mixer", "mixer_target"))
    published = "agent"
    """Actors get the agent network only; the mixer stays on the learner."""
    config: QMIXConfig

    def _build(self, spaces: Spaces, seed: int) -> None:
        """Agent network, mixer and their targets (starting as copies)."""
        config = self.config
        self.n_agents, self.n_actions, self.action_start = agent_counts(spaces.action)
        in_dim = spaces.observation.shape[1] + self.n_agents
        state_dim = flat_dim(spaces.state.shape)
        mixer_size = {"embed": config.mixing_embed, "hidden": config.hypernet_hidden}
        with seeded_init(seed):
            self.agent = mlp(in_dim, config.hidden, self.n_actions).to(self.device)
            self.agent_target = mlp(in_dim, config.hidden, self.n_actions).to(self.device)
            self.mixer = QMixer(self.n_agents, state_dim, **mixer_size).to(self.device)
            self.mixer_target = QMixer(self.n_agents, state_dim, **mixer_size).to(self.device)
        self._init_targets()

    def _q(self, net: nn.Module, obs: np.ndarray) -> torch.Tensor:
        """Every agent's action values ``[B, A, n_actions]`` for ``obs [B, A, D]``."""
        q: torch.Tensor = net(
            agent_inputs(torch.as_tensor(obs, dtype=torch.float32, device=self.device))
        )
        return q

    def act(self, obs: np.ndarray, *, explore: bool) -> dict[str, np.ndarray]:
        """Per-agent epsilon-greedy (``explore``) or greedy actions ``[N, A]`` for ``obs``."""
        with torch.no_grad():
            greedy = self._q(self.agent, obs).argmax(dim=2).cpu().numpy()
        if explore:
            greedy = self._explore(greedy)
        return {"action": (greedy + self.action_start).astype(np.int64)}

    def postprocess(self, fragment: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Flat n-step transitions from a fragment (see :func:`n_step_transitions_ma`)."""
        return n_step_transitions_ma(fragment, self.config.n_step, self.config.gamma)

    def td_target(self, batch: Mapping[str, np.ndarray]) -> torch.Tensor:
        """``r + discount * Q_tot_target(argmax_u Q_online(o', u), s')`` per transition ``[B]``.

        Each agent's next action is the online network's argmax, valued by the target
        agent network and mixed by the target mixer at ``next_state``.
        """
        c, dev = self.config, self.device
        with torch.no_grad():
            best = self._q(self.agent, batch["next_obs"]).argmax(dim=2, keepdim=True)
            next_q = self._q(self.agent_target, batch["next_obs"]).gather(2, best).squeeze(2)
            next_state = torch.as_tensor(batch["next_state"], dtype=torch.float32, device=dev)
            reward = torch.as_tensor(batch["reward"], dtype=torch.float32, device=dev)
            discount = torch.as_tensor(batch["discount"], dtype=torch.float32, device=dev)
            next_q_tot: torch.Tensor = self.mixer_target(next_q, next_state)
            return c.reward_scale * reward + discount * next_q_tot

    def update(self, batch: Mapping[str, np.ndarray]) -> UpdateResult:
        """One gradient step of agent network and mixer on a replay batch."""
        c, dev = self.config, self.device
        action = torch.as_tensor(batch["action"], dtype=torch.int64, device=dev)
        q = self._q(self.agent, batch["obs"])
        q_taken = q.gather(2, (action - self.action_start).unsqueeze(2)).squeeze(2)
        state = torch.as_tensor(batch["state"], dtype=torch.float32, device=dev)
        q_tot = self.mixer(q_taken, state)
        target = self.td_target(batch)
        loss = td_loss(q_tot, target, c.huber_delta)
        grad_norm = self._gradient_step(loss)
        self._count_update()
        metrics = {
            "loss": float(loss.item()),
            "q_tot_mean": float(q_tot.mean().item()),
            "td_abs_mean": float((q_tot - target).abs().mean().item()),
            "grad_norm": float(grad_norm.item()),
            "epsilon": self.epsilon,
        }
        return UpdateResult(metrics=metrics, priorities=None)
