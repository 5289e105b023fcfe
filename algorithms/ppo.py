"""PPO: clipped surrogate, GAE(lambda), minibatch epochs; discrete and continuous actions.

Read top to bottom: the config, the pure math (GAE, the losses, the Gaussian log-density),
the actor-critic network, then the :class:`PPO` object the actor and learner services drive.

* Actors call ``act``: it returns the ``action`` to step the env with (clipped to a Box's
  bounds) plus the extras stored in the fragment: ``logp``, ``value`` and, for Box
  actions, ``raw_action`` (the unclipped Gaussian sample whose ``logp`` it is).
* The learner calls ``update`` on ``[T, N*K]`` batches of K fragments. Values for GAE are
  recomputed with the current critic (``V(obs)`` and ``V(next_obs)``), so GAE bootstraps
  from the true next observation at truncations and fragment ends, and not at
  terminations. With ``vtrace = true`` (APPO) the targets and advantages come from V-trace
  instead, with the importance ratios of the learner's policy to the ``logp`` the actor
  stored.
* With ``core = "gru"`` the network has a recurrent core (``algorithms/_recurrent.py``):
  ``act`` takes each env's ``state`` and returns ``next_state`` (kept by the caller) and
  ``core_state`` (stored); the learner unrolls whole env columns from the stored states.

One file per algorithm is the project's rule (``docs/writing-an-algorithm.md``), so
PPO's config, networks, GAE and update live here together (over 500 lines).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tianji.algorithms._nets import (
    NatureCNN,
    ObsNormalizer,
    adam,
    as_hidden,
    averaged_moments,
    box_obs_problem,
    flat_dim,
    gradient_step,
    load_numpy_weights,
    merge_moments,
    mlp,
    numpy_weights,
    obs_tensor,
    pick_device,
    require_spaces,
    resolve_torso,
    seeded_init,
)
from tianji.algorithms._recurrent import CORES, RecurrentActorCritic, episode_starts
from tianji.algorithms._vtrace import vtrace
from torch import nn

from tianji.rl.algorithm import BufferSpec, GradientSync, UpdateResult
from tianji.rl.errors import ConfigError

__all__ = [
    "PPO",
    "ActorCritic",
    "PPOConfig",
    "ReturnNormalizer",
    "annealed_lr",
    "clipped_surrogate_loss",
    "compact_fragment",
    "epoch_minibatches",
    "explained_variance",
    "gae",
    "gaussian_entropy",
    "gaussian_log_prob",
    "value_loss",
]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PPOConfig:
    """Hyperparameters of :class:`PPO` (defaults tuned for CartPole-v1)."""

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
    """Rewards are multiplied by this before GAE (keeps value targets near unit scale).
    Matters most where the policy and the value share a torso ("nature", a ``core``):
    large value errors there drown the policy's share of the clipped gradient."""
    fragments_per_batch: int = 1
    """Fragments (each ``[T, N]``) concatenated along the env axis into one learner batch."""
    buffer_capacity: int = 8
    """Fragments the rollout buffer keeps at most (the oldest are dropped)."""
    update_epochs: int = 4
    """Passes over each batch."""
    num_minibatches: int = 4
    """Minibatches per epoch."""
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
    normalize_obs: bool = False
    """Standardize observations element by element with running statistics at the
    network's input (:class:`ObsNormalizer`, as Sample Factory's ``normalize_input``;
    images after scaling to [0, 1]). The learner updates the statistics once per batch;
    they travel with the weights. With a recurrent ``core`` they apply before its torso."""
    normalize_returns: bool = False
    """Learn the value in units of the returns' spread (as Sample Factory's
    ``normalize_returns``): the critic predicts ``(G - mean) / std`` under a running mean
    and variance of every batch's value targets (:class:`ReturnNormalizer`, kept in
    checkpoints); GAE and V-trace run on de-normalized values. Keeps the value loss near
    unit scale whatever the rewards' scale: Atari's clipped rewards give returns of a few
    tenths, whose small value gradients barely shape a torso shared with the policy."""
    target_kl: float | None = None
    """Stop the epochs early once the approximate KL exceeds this (``None``: never)."""
    hidden: Sequence[int] = (64, 64)
    """Hidden layer sizes of the actor and critic MLPs."""
    shared_network: bool = False
    """One torso for actor and critic (two heads) instead of two separate MLPs (the
    "nature" torso is always shared)."""
    torso: str = "auto"
    """The network's body: "mlp" (``hidden``), "nature" (the Nature-DQN CNN for uint8
    image observations, e.g. the Atari preset's; one torso, two linear heads) or "auto"
    (the CNN for images, else the MLP)."""
    init_log_std: float = 0.0
    """Initial log standard deviation of the Gaussian policy (Box actions)."""
    vtrace: bool = False
    """APPO: value targets and advantages by V-trace (``algorithms/_vtrace.py``) instead of
    GAE, correcting for the lag between the policy that acted (its ``logp`` in the
    fragment) and the learner's; the trace decay is ``gae_lambda``. Use it when the
    controller lets the lag grow (``[controller] lag_target`` above 1)."""
    vtrace_reference: str = "behaviour"
    """With ``vtrace``: the policy the clipped ratio is taken to. "behaviour": the one that
    acted (its ``logp``; as Sample Factory's APPO), a trust region around the data;
    "learner": the learner's own before the update (as IMPACT's target policy), a trust
    region around the learner, the lag corrected by V-trace's ``min(rho_bar, pi/mu)`` in
    the advantages only. ``docs/benchmarks.md`` ("Policy lag") measures both."""
    vtrace_rho_bar: float = 1.0
    """V-trace's truncation of the importance weights in the targets and the advantages."""
    vtrace_c_bar: float = 1.0
    """V-trace's truncation of the traces (how far a correction reaches back)."""
    core: str = "none"
    """A recurrent core between the torso and the heads: "gru", or "none" (feed-forward).
    The learner unrolls it over each fragment (truncated backpropagation through time
    over ``[actors] fragment_length`` steps) from the state stored with the fragment;
    minibatches are then whole env columns (``num_minibatches`` at most the batch's
    columns)."""
    core_hidden: int = 64
    """The GRU's state size."""
    burn_in: int = 0
    """Steps at the start of each fragment that only warm up the recurrent state (no loss,
    no gradient), refreshing a stored state that older weights computed. Less than
    ``[actors] fragment_length``."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden", as_hidden("algorithm.hidden", self.hidden))
        if self.core not in CORES:
            raise ConfigError("algorithm.core", self.core, f"one of {', '.join(CORES)}")
        if type(self.core_hidden) is not int or self.core_hidden <= 0:
            raise ConfigError("algorithm.core_hidden", self.core_hidden, "a positive integer")
        if type(self.burn_in) is not int or self.burn_in < 0:
            raise ConfigError("algorithm.burn_in", self.burn_in, "an integer >= 0")
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
        if self.vtrace_reference not in ("behaviour", "learner"):
            raise ConfigError(
                "algorithm.vtrace_reference", self.vtrace_reference, '"behaviour" or "learner"'
            )
        for key in ("vtrace_rho_bar", "vtrace_c_bar"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"algorithm.{key}", getattr(self, key), "a number > 0")


# --------------------------------------------------------------------------- pure math


def gae(
    reward: np.ndarray,
    value: np.ndarray,
    next_value: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    gamma: float,
    lam: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Generalized advantage estimates and returns over ``[T, M]`` arrays.

    ``delta_t = r_t + gamma * V(next_obs_t) * (1 - terminated_t) - V(obs_t)`` bootstraps
    at truncations and at the fragment end, never at terminations; the recursion
    ``A_t = delta_t + gamma * lam * A_{t+1}`` is cut wherever an episode ended.

    Returns:
        ``(advantages, returns)`` with ``returns = advantages + value``, float32.
    """
    term = np.asarray(terminated, dtype=bool)
    cont = ~(term | np.asarray(truncated, dtype=bool))
    delta = reward + gamma * np.where(term, 0.0, next_value) - value
    adv = np.zeros(np.shape(reward), dtype=np.float64)
    running = np.zeros(np.shape(reward)[1:], dtype=np.float64)
    for t in reversed(range(len(adv))):
        running = delta[t] + gamma * lam * cont[t] * running
        adv[t] = running
    return adv.astype(np.float32), (adv + value).astype(np.float32)


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


def gaussian_log_prob(
    action: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor
) -> torch.Tensor:
    """Log-density of a diagonal Gaussian, summed over the last axis."""
    z = (action - mean) * torch.exp(-log_std)
    return (-0.5 * z**2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)


def gaussian_entropy(log_std: torch.Tensor) -> torch.Tensor:
    """Entropy of a diagonal Gaussian, summed over the last axis."""
    return (log_std + 0.5 * math.log(2 * math.pi * math.e)).sum(-1)


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


def _flat(x: np.ndarray) -> np.ndarray:
    """``[T, M, ...]`` to ``[T*M, ...]``."""
    arr = np.asarray(x)
    return arr.reshape(arr.shape[0] * arr.shape[1], *arr.shape[2:])


class ReturnNormalizer:
    """Running mean and variance of value targets, merged batch by batch (Chan et al.'s
    parallel update), starting from mean 0 and variance 1 with a tiny weight."""

    def __init__(self) -> None:
        self.mean = 0.0
        self.var = 1.0
        self.count = 1e-4

    @property
    def std(self) -> float:
        """The spread values are measured in (at least 1e-4: a constant return)."""
        return max(math.sqrt(self.var), 1e-4)

    def update(self, mean: float, var: float, count: int) -> None:
        """Merge a batch of ``count`` targets with this ``mean`` and ``var``."""
        self.mean, self.var, self.count = merge_moments(
            self.mean, self.var, self.count, mean, var, count
        )

    def state(self) -> dict[str, float]:
        """Mean, variance and weight, for a checkpoint."""
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load(self, state: Mapping[str, float]) -> None:
        """Continue from :meth:`state`."""
        self.mean, self.var = float(state["mean"]), float(state["var"])
        self.count = float(state["count"])


# --------------------------------------------------------------------------- network


class ActorCritic(nn.Module):
    """Policy head (logits or Gaussian mean) and value head over separate or shared MLPs,
    or over one :class:`NatureCNN` (``torso = "nature"``)."""

    def __init__(
        self, observation_space: Any, out_dim: int, config: PPOConfig, *, continuous: bool
    ) -> None:
        super().__init__()
        hidden = tuple(config.hidden)
        in_dim = flat_dim(observation_space.shape)
        self.torso: nn.Module | None = None
        torso = resolve_torso("algo.torso", config.torso, observation_space)
        self.image = torso == "nature"
        self.obs_norm = (
            ObsNormalizer.at_input(observation_space, image=self.image)
            if config.normalize_obs
            else None
        )
        if self.image:
            self.torso = NatureCNN(observation_space.shape)
            self.actor = mlp(NatureCNN.features, (), out_dim, out_gain=0.01)
            self.critic = mlp(NatureCNN.features, (), 1, out_gain=1.0)
        elif config.shared_network:
            self.torso = mlp(in_dim, hidden[:-1], hidden[-1], activation=nn.Tanh, out_gain=2**0.5)
            self.torso.append(nn.Tanh())
            self.actor = mlp(hidden[-1], (), out_dim, out_gain=0.01)
            self.critic = mlp(hidden[-1], (), 1, out_gain=1.0)
        else:
            self.actor = mlp(in_dim, hidden, out_dim, activation=nn.Tanh, out_gain=0.01)
            self.critic = mlp(in_dim, hidden, 1, activation=nn.Tanh, out_gain=1.0)
        self.log_std = (
            nn.Parameter(torch.full((out_dim,), config.init_log_std)) if continuous else None
        )

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(policy head output [B, A], value [B])`` for flat ``obs [B, D]``."""
        x = self._features(obs)
        return self.actor(x), self.critic(x).squeeze(-1)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """``V(obs) [B]``."""
        out: torch.Tensor = self.critic(self._features(obs)).squeeze(-1)
        return out

    def _features(self, obs: torch.Tensor) -> torch.Tensor:
        if self.obs_norm is not None:
            obs = self.obs_norm(obs)
        return obs if self.torso is None else self.torso(obs)


# --------------------------------------------------------------------------- algorithm


class PPO:
    """Proximal policy optimization (see :class:`PPOConfig`).

    Usage::

        algo = PPO(PPO.Config(), env.observation_space, env.action_space, seed=0)
        out = algo.act(obs, explore=True)   # {"action", "logp", "value"(, "raw_action")}
        result = algo.update(batch)         # batch: K fragments concatenated, [T, N*K, ...]
    """

    name = "ppo"
    Config = PPOConfig

    @staticmethod
    def check_spaces(observation_space: Any, action_space: Any) -> str | None:
        """``None`` if PPO supports the spaces, else a message naming the unsupported one."""
        from gymnasium import spaces

        if not isinstance(action_space, spaces.Discrete | spaces.Box):
            return (
                f"PPO needs a gymnasium.spaces.Discrete or Box action space, got {action_space!r}"
            )
        if isinstance(action_space, spaces.Box) and not np.all(
            np.isfinite(action_space.low) & np.isfinite(action_space.high)
        ):
            return f"PPO needs a bounded Box action space, got {action_space!r}"
        return box_obs_problem(observation_space)

    def __init__(
        self,
        config: PPOConfig,
        observation_space: Any,
        action_space: Any,
        *,
        seed: int = 0,
        device: str = "auto",
    ) -> None:
        require_spaces(
            self.check_spaces(observation_space, action_space), observation_space, action_space
        )
        from gymnasium import spaces

        self.config = config
        self.device = pick_device(device)
        self.continuous = isinstance(action_space, spaces.Box)
        self.action_shape: tuple[int, ...] = tuple(action_space.shape or ())
        self.action_start = 0 if self.continuous else int(action_space.start)
        out_dim = flat_dim(self.action_shape) if self.continuous else int(action_space.n)
        if self.continuous:
            self.low = np.asarray(action_space.low, dtype=np.float32)
            self.high = np.asarray(action_space.high, dtype=np.float32)
        self.version = 0
        self.rng = np.random.default_rng(seed)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.recurrent = config.core != "none"
        """Whether ``act`` takes and returns a per-env state (``[algo] core``)."""
        with seeded_init(seed):
            net: ActorCritic | RecurrentActorCritic
            if self.recurrent:
                torso = resolve_torso("algo.torso", config.torso, observation_space)
                net = RecurrentActorCritic(
                    observation_space, out_dim, hidden=config.hidden,
                    core_hidden=config.core_hidden, image=torso == "nature",
                    continuous=self.continuous, init_log_std=config.init_log_std,
                    normalize_obs=config.normalize_obs,
                )  # fmt: skip
            else:
                net = ActorCritic(observation_space, out_dim, config, continuous=self.continuous)
            self.net = net.to(self.device)
        self._steps = 0  # T of the batch being learned from (recurrent minibatches)
        self.returns = ReturnNormalizer() if config.normalize_returns else None
        """The value targets' running statistics (``normalize_returns``), else ``None``."""
        self._optimizer: torch.optim.Optimizer | None = None  # built on first update
        self.gradient_sync: GradientSync | None = None  # set by the learner when K > 1

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """Adam, built on first use: actors never update, and building an optimizer imports
        a good part of torch (seconds of start-up per actor process)."""
        if self._optimizer is None:
            self._optimizer = adam(self.net.parameters(), lr=self.config.lr, eps=1e-5)
        return self._optimizer

    # ----------------------------------------------------------------- actor side

    def initial_state(self, n: int) -> np.ndarray:
        """``[n, core_hidden]`` zeros: the recurrent state an episode starts from."""
        return np.zeros((n, self.config.core_hidden), np.float32)

    def act(
        self, obs: np.ndarray, *, explore: bool, state: np.ndarray | None = None
    ) -> dict[str, np.ndarray]:
        """Sample (``explore``) or take the mode of the policy for ``obs [N, ...]``.

        With a recurrent core, ``state [N, core_hidden]`` is each env's state before
        ``obs`` (``None``: fresh episodes); the answer then also holds ``core_state`` (that
        state, stored in the fragment for the learner's unroll) and ``next_state`` (the
        state after ``obs``, for the caller to keep, not to store).
        """
        with torch.no_grad():
            if isinstance(self.net, RecurrentActorCritic):
                before = self.initial_state(len(obs)) if state is None else state
                h = torch.as_tensor(np.array(before, np.float32), device=self.device)
                head, value, h_next = self.net.step(self._input(obs), h)
            else:
                head, value = self.net(self._input(obs))
            if self.continuous:
                raw, logp = self._sample_gaussian(head, explore)
            else:
                raw, logp = self._sample_categorical(head, explore)
        out: dict[str, np.ndarray] = {
            "logp": logp.cpu().numpy().astype(np.float32),
            "value": value.cpu().numpy().astype(np.float32),
        }
        if self.continuous:
            raw_np = raw.cpu().numpy().astype(np.float32).reshape(len(raw), *self.action_shape)
            out["raw_action"] = raw_np
            out["action"] = np.clip(raw_np, self.low, self.high)
        else:
            out["action"] = raw.cpu().numpy().astype(np.int64) + self.action_start
        if isinstance(self.net, RecurrentActorCritic):
            out["core_state"] = h.cpu().numpy()
            out["next_state"] = h_next.cpu().numpy()
        return out

    def _input(self, obs: np.ndarray) -> torch.Tensor:
        return obs_tensor(obs, self.device, image=self.net.image)

    def _sample_gaussian(
        self, mean: torch.Tensor, explore: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.net.log_std is not None
        log_std = self.net.log_std.expand_as(mean)
        action = mean
        if explore:
            noise = torch.randn(mean.shape, generator=self.generator, device=self.device)
            action = mean + noise * log_std.exp()
        return action, gaussian_log_prob(action, mean, log_std)

    def _sample_categorical(
        self, logits: torch.Tensor, explore: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        log_probs = torch.log_softmax(logits, dim=-1)
        if explore:
            action = torch.multinomial(log_probs.exp(), 1, generator=self.generator).squeeze(1)
        else:
            action = logits.argmax(dim=-1)
        return action, log_probs.gather(1, action[:, None]).squeeze(1)

    def postprocess(self, fragment: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The fragment unchanged except for compact dtypes (see :func:`compact_fragment`)."""
        return compact_fragment(fragment)

    def get_weights(self) -> dict[str, np.ndarray]:
        """Actor and critic weights (actors report values too) as contiguous numpy arrays."""
        return numpy_weights(self.net)

    def set_weights(self, weights: Mapping[str, np.ndarray], version: int) -> None:
        """Load weights published by the learner at ``version`` updates."""
        load_numpy_weights(self.net, weights)
        self.version = version

    def state_dict(self) -> dict[str, Any]:
        """Everything a learner needs to continue (see ``tianji.rl.checkpoint``): actor-critic
        (with the log-std), Adam's moments and learning rate, the update count."""
        state = {
            "net": self.net.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "version": self.version,
        }
        if self.returns is not None:
            state["returns"] = self.returns.state()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict` (same config and spaces)."""
        self.net.load_state_dict(state["net"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = int(state["version"])
        if self.returns is not None and "returns" in state:
            self.returns.load(state["returns"])

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
        """GAE over the ``[T, M]`` batch, then ``update_epochs`` passes of minibatch steps."""
        c = self.config
        flat = self._prepare(batch)
        size = len(flat["adv"])
        self._anneal_lr()
        totals: dict[str, float] = {}
        steps = 0
        for _ in range(c.update_epochs):
            for index in self._minibatches(size):
                mb = {k: v[index] for k, v in flat.items()}
                for k, v in self._minibatch_step(mb).items():
                    totals[k] = totals.get(k, 0.0) + v
                steps += 1
            if (
                c.target_kl is not None
                and self._shared_kl(totals["approx_kl"] / steps) > c.target_kl
            ):
                break
        self.version += 1
        metrics = {k: v / steps for k, v in totals.items()}
        metrics.update(self._batch_metrics(flat), lr=self.optimizer.param_groups[0]["lr"])
        if self.returns is not None:
            metrics.update(return_mean=self.returns.mean, return_std=self.returns.std)
        return UpdateResult(metrics=metrics)

    def _minibatches(self, size: int) -> list[np.ndarray]:
        """One epoch's minibatches of flat ``[T*M]`` indices: random steps, or, with a
        recurrent core, random whole columns (every step of each, in time order)."""
        c = self.config
        if not self.recurrent:
            return epoch_minibatches(size, c.num_minibatches, self.rng)
        steps = self._steps
        width = size // steps
        columns = epoch_minibatches(width, min(c.num_minibatches, width), self.rng)
        rows = np.arange(steps)[:, None] * width
        return [(rows + cols[None, :]).reshape(-1) for cols in columns]

    def _shared_kl(self, kl: float) -> float:
        """The early-stop KL: with data-parallel learners the mean over all of them (one
        more all-reduce step), so they all stop after the same epoch and stay in step."""
        if self.gradient_sync is None:
            return kl
        return float(self.gradient_sync(np.array([kl], dtype=np.float32))[0])

    def _prepare(self, batch: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """Recompute values, run GAE and flatten ``[T, M, ...]`` to ``[T*M, ...]`` tensors."""
        c, dev = self.config, self.device
        reward = np.asarray(batch["reward"], dtype=np.float64) * c.reward_scale
        obs = self._input(_flat(batch["obs"]))
        if self.continuous:
            raw = _flat(batch["raw_action"]).reshape(len(obs), -1)
            action = torch.as_tensor(raw, dtype=torch.float32, device=dev)
        else:
            index = _flat(batch["action"]).astype(np.int64) - self.action_start
            action = torch.as_tensor(index, device=dev)
        extra: dict[str, torch.Tensor] = {}
        logp: torch.Tensor | None = None
        if self.net.obs_norm is not None:
            self.net.obs_norm.update(obs, self.gradient_sync)
        with torch.no_grad():
            if isinstance(self.net, RecurrentActorCritic):
                value, next_value, logp, extra = self._unroll_batch(batch, obs, action)
            else:
                value = self._values(obs)
                next_value = self._next_values(
                    batch, value, lambda rows, next_obs: self._values(self._input(next_obs))
                )
        # In return units (the critic's output de-normalized, with normalize_returns)
        scale, shift = (1.0, 0.0) if self.returns is None else (self.returns.std, self.returns.mean)

        def in_returns(critic: torch.Tensor | np.ndarray) -> np.ndarray:
            out = critic.cpu().numpy() if isinstance(critic, torch.Tensor) else critic
            return np.asarray(out, np.float64).reshape(reward.shape) * scale + shift

        values = in_returns(value)
        ends = (
            reward,
            values,
            in_returns(next_value),
            batch["terminated"],
            batch["truncated"],
        )
        if c.vtrace:
            if logp is None:
                with torch.no_grad():
                    logp = self._log_probs(obs, action)
            log_rho = logp.double().cpu().numpy().reshape(reward.shape) - np.asarray(
                batch["logp"], np.float64
            )
            ret, adv = vtrace(
                *ends, log_rho, gamma=c.gamma, lam=c.gae_lambda,
                rho_bar=c.vtrace_rho_bar, c_bar=c.vtrace_c_bar,
            )  # fmt: skip
        else:
            adv, ret = gae(*ends, c.gamma, c.gae_lambda)

        def tensor(x: np.ndarray) -> torch.Tensor:
            return torch.as_tensor(_flat(x), dtype=torch.float32, device=dev)

        # The clipped ratio's reference policy (vtrace_reference): the one that acted, or
        # with V-trace the learner's own before this update (its advantages then carry the
        # correction to the acting policy, min(rho_bar, pi/mu)).
        learner_ref = c.vtrace and c.vtrace_reference == "learner"
        reference = logp.float() if learner_ref and logp is not None else tensor(batch["logp"])
        behaviour = in_returns(batch["value"])
        if self.returns is not None:  # targets, old values: in the updated statistics' units
            self._observe_returns(ret)
            mean, std = self.returns.mean, self.returns.std
            ret, values, behaviour = ((x - mean) / std for x in (ret, values, behaviour))
        return {
            "obs": obs,
            "action": action,
            "old_logp": reference.reshape(-1),
            "behaviour_value": tensor(behaviour),
            "old_value": tensor(values),
            "adv": tensor(adv),
            "ret": tensor(ret),
            **extra,
        }

    def _observe_returns(self, ret: np.ndarray) -> None:
        """Merge a batch's value targets into :attr:`returns`; with data-parallel learners
        the mean of every learner's batch moments (one more all-reduce step), so all keep
        the same statistics."""
        assert self.returns is not None
        first, second = np.asarray(ret.mean()), np.asarray(np.square(ret).mean())
        if self.gradient_sync is not None:
            first, second = averaged_moments(self.gradient_sync, first, second)
        mean, square = float(first), float(second)
        self.returns.update(mean, max(square - mean * mean, 0.0), ret.size)

    def _unroll_batch(
        self, batch: Mapping[str, np.ndarray], obs: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """The recurrent core over the ``[T, M]`` batch from the stored start states:
        ``(values [T*M], next values [T*M], logp [T*M], the flat tensors minibatches
        unroll from: core_state, starts)``.

        Raises:
            ConfigError: if ``burn_in`` leaves no step of the fragments to learn from.
        """
        net = self.net
        assert isinstance(net, RecurrentActorCritic)
        steps, width = np.shape(batch["reward"])
        if self.config.burn_in >= steps:
            raise ConfigError(
                "algorithm.burn_in", self.config.burn_in, f"less than the fragment length {steps}"
            )
        self._steps = steps
        dev = self.device
        stored = torch.as_tensor(np.asarray(batch["core_state"], np.float32), device=dev)
        starts = episode_starts(batch["terminated"], batch["truncated"]).to(dev)
        heads, values, after = net.unroll(obs.view(steps, width, *obs.shape[1:]), stored[0], starts)
        value = values.reshape(-1)
        after_flat = after.reshape(steps * width, -1)

        def value_of(rows: np.ndarray, next_obs: np.ndarray) -> torch.Tensor:
            index = torch.as_tensor(rows, device=dev)
            return net.step(self._input(next_obs), after_flat[index])[1]

        next_value = self._next_values(batch, value, value_of)
        logp = self._head_stats(heads.reshape(steps * width, -1), action)[0]
        extra = {"core_state": stored.reshape(steps * width, -1), "starts": starts.reshape(-1)}
        return value, next_value, logp, extra

    def _values(self, obs: torch.Tensor, chunk: int = 2048) -> torch.Tensor:
        """``V(obs)`` in chunks (bounded activation memory for pixel batches)."""
        assert isinstance(self.net, ActorCritic)  # the recurrent core values in its unroll
        if len(obs) <= chunk:
            return self.net.value(obs)
        return torch.cat([self.net.value(obs[i : i + chunk]) for i in range(0, len(obs), chunk)])

    def _next_values(
        self,
        batch: Mapping[str, np.ndarray],
        value: torch.Tensor,
        value_of: Callable[[np.ndarray, np.ndarray], torch.Tensor],
    ) -> torch.Tensor:
        """``V(next_obs)`` flat ``[T*M]``. Inside a column ``next_obs[t]`` is ``obs[t+1]``
        unless the episode ended at ``t``, so only the last step and the ends need a
        forward pass of their own (half the work of valuing every ``next_obs``):
        ``value_of(flat rows, their next_obs)``."""
        done = np.asarray(batch["terminated"], bool) | np.asarray(batch["truncated"], bool)
        steps, width = done.shape
        need = done.copy()
        need[-1] = True
        next_value = torch.empty((steps, width), dtype=value.dtype, device=value.device)
        next_value[:-1] = value.view(steps, width)[1:]
        rows = np.flatnonzero(need)
        next_obs = _flat(batch["next_obs"])[rows]
        flat_next = next_value.view(-1)
        flat_next[torch.as_tensor(rows, device=value.device)] = value_of(rows, next_obs)
        return flat_next

    def _minibatch_step(self, mb: Mapping[str, torch.Tensor]) -> dict[str, float]:
        c = self.config
        if self.recurrent:
            mb, (logp, entropy, value) = self._evaluate_columns(mb)
        else:
            logp, entropy, value = self._evaluate(mb["obs"], mb["action"])
        adv = mb["adv"]
        if c.norm_adv and len(adv) > 1:
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        loss, pg_loss, v_loss, ent = self._losses(mb, logp, entropy, value, adv)
        params = list(self.net.parameters())
        gradient_step(loss, params, self.optimizer, self.gradient_sync, c.max_grad_norm)
        with torch.no_grad():
            log_ratio = logp - mb["old_logp"]
            approx_kl = ((log_ratio.exp() - 1) - log_ratio).mean()
            clip_frac = ((log_ratio.exp() - 1).abs() > c.clip_coef).float().mean()
        return {
            "loss": float(loss.item()),
            "policy_loss": float(pg_loss.item()),
            "value_loss": float(v_loss.item()),
            "entropy": float(ent.item()),
            "approx_kl": float(approx_kl.item()),
            "clip_frac": float(clip_frac.item()),
        }

    def _losses(
        self,
        mb: Mapping[str, torch.Tensor],
        logp: torch.Tensor,
        entropy: torch.Tensor,
        value: torch.Tensor,
        adv: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(loss, policy loss, value loss, mean entropy)`` of a minibatch: the clipped
        surrogate and the (optionally clipped) value error (IMPALA overrides this)."""
        c = self.config
        pg_loss = clipped_surrogate_loss(logp, mb["old_logp"], adv, c.clip_coef)
        clip_v = c.clip_coef if c.clip_value_loss else None
        v_loss = value_loss(value, mb["old_value"], mb["ret"], clip_v)
        ent = entropy.mean()
        return pg_loss + c.vf_coef * v_loss - c.ent_coef * ent, pg_loss, v_loss, ent

    def _log_probs(
        self, obs: torch.Tensor, action: torch.Tensor, chunk: int = 2048
    ) -> torch.Tensor:
        """``log pi(action | obs)`` under the current network, in chunks (V-trace's ratios)."""
        parts = [
            self._evaluate(obs[i : i + chunk], action[i : i + chunk])[0]
            for i in range(0, len(obs), chunk)
        ]
        return torch.cat(parts).double()

    def _evaluate_columns(
        self, mb: Mapping[str, torch.Tensor]
    ) -> tuple[dict[str, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """A recurrent minibatch (whole columns, time-major): unroll them from their stored
        first states; the first ``burn_in`` steps without gradient and left out.

        Returns:
            ``(the minibatch without its burn-in steps, (logp, entropy, value))``, flat.
        """
        assert isinstance(self.net, RecurrentActorCritic)
        steps, burn = self._steps, self.config.burn_in
        width = len(mb["obs"]) // steps

        def columns(x: torch.Tensor) -> torch.Tensor:
            return x.view(steps, width, *x.shape[1:])

        obs, starts = columns(mb["obs"]), columns(mb["starts"])
        state = columns(mb["core_state"])[0]
        if burn:
            with torch.no_grad():
                state = self.net.unroll(obs[:burn], state, starts[:burn])[2][-1]
        heads, value, _ = self.net.unroll(obs[burn:], state, starts[burn:])
        kept = {k: columns(v)[burn:].reshape(-1, *v.shape[1:]) for k, v in mb.items()}
        logp, entropy = self._head_stats(heads.reshape(len(kept["adv"]), -1), kept["action"])
        return kept, (logp, entropy, value.reshape(-1))

    def _evaluate(
        self, obs: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(logp(action), entropy, value)`` under the current network."""
        head, value = self.net(obs)
        return (*self._head_stats(head, action), value)

    def _head_stats(
        self, head: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logp(action), entropy)`` of the policy head's output ``[B, A]``."""
        if self.continuous:
            assert self.net.log_std is not None
            log_std = self.net.log_std.expand_as(head)
            return gaussian_log_prob(action, head, log_std), gaussian_entropy(log_std)
        log_probs = torch.log_softmax(head, dim=-1)
        logp = log_probs.gather(1, action.long()[:, None]).squeeze(1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        return logp, entropy

    def _anneal_lr(self) -> None:
        c = self.config
        if c.lr_anneal_updates > 0:
            lr = annealed_lr(c.lr, self.version, c.lr_anneal_updates, c.lr_floor)
            self.optimizer.param_groups[0]["lr"] = lr

    def _batch_metrics(self, flat: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """Diagnostics over the whole batch: explained variance, behaviour-value drift."""
        explained = explained_variance(flat["ret"], flat["old_value"])
        drift = (flat["behaviour_value"] - flat["old_value"]).abs().mean().item()
        return {"explained_variance": explained, "value_drift": float(drift)}
