"""PPO: clipped surrogate, GAE(lambda), minibatch epochs; discrete and continuous actions.

Read top to bottom: the config, then the :class:`PPO` object the actor and learner
services drive. The pieces it composes are small modules of their own: the networks
(``_actor_critic.py``, ``_recurrent.py``), GAE (``_gae.py``), V-trace (``_vtrace.py``),
the losses (``_losses.py``), the action distributions (``_distributions.py``), the
observation and return normalizers (``_normalize.py``), the recurrent learner's unrolls
(``_recurrent.py``), the on-policy plumbing and shared config fields (``_onpolicy.py``)
and the weights/checkpoint boilerplate (``_base.py``).

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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import torch
from tianji.algorithms._actor_critic import ActorCritic, actor_critic
from tianji.algorithms._base import Spaces
from tianji.algorithms._board import mirror_for
from tianji.algorithms._distributions import head_stats, sample_categorical, sample_gaussian
from tianji.algorithms._export import GreedyPolicy
from tianji.algorithms._gae import gae
from tianji.algorithms._losses import Objective, kl_stats, normalized, ppo_objective
from tianji.algorithms._nets import (
    box_obs_problem,
    flat_dim,
    host_to_device,
    obs_tensor,
    seeded_init,
)
from tianji.algorithms._normalize import ReturnNormalizer, observe_returns
from tianji.algorithms._onpolicy import (
    OnPolicyAlgorithm,
    OnPolicyConfig,
    compact_fragment,
    epoch_minibatches,
    explained_variance,
    flat,
    next_values,
    run_epochs,
    set_annealed_lr,
)
from tianji.algorithms._recurrent import (
    CORES,
    RecurrentActorCritic,
    column_minibatches,
    unroll_batch,
    unroll_columns,
)
from tianji.algorithms._vtrace import vtrace

from tianji.rl.algorithm import UpdateResult
from tianji.rl.errors import ConfigError

__all__ = ["PPO", "PPOConfig"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PPOConfig(OnPolicyConfig):
    """Hyperparameters of :class:`PPO` (defaults tuned for CartPole-v1): the on-policy
    fields of :class:`~tianji.algorithms._onpolicy.OnPolicyConfig` (``lr``, ``gamma``,
    ``gae_lambda``, ``clip_coef``, ``hidden``, ...) and these."""

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
    shared_network: bool = False
    """One torso for actor and critic (two heads) instead of two separate MLPs (the
    "nature" torso is always shared)."""
    torso: str = "auto"
    """The network's body: "mlp" (``hidden``), "nature" (the Nature-DQN CNN for uint8
    image observations, e.g. the Atari preset's; one torso, two linear heads), "board"
    (a convolution over board games' piece planes, ``algorithms/_board.py``; shared
    likewise; "board_lines" also shows it where each side would complete a line,
    "board_drops" that and what a piece dropped in each column would complete, for
    connect four), "auto" (the CNN for images, else the MLP) or your own
    ``"package.module:Class"`` / ``"file.py:Class"`` (``Class(observation_space)``, an
    ``nn.Module`` with an int ``features``; shared by two linear heads, as the CNN is)."""
    init_log_std: float = 0.0
    """Initial log standard deviation of the Gaussian policy (Box actions)."""
    mirror: bool = False
    """Learn from every sample twice, as played and mirrored left to right, for board games
    whose moves are the columns and whose rules a mirror keeps (connect four;
    ``algorithms/_board.py``'s ``BoardMirror``); twice the learner's work per batch.
    Feed-forward discrete policies over such a board only, or refused."""
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
        OnPolicyConfig.__post_init__(self)
        if self.core not in CORES:
            raise ConfigError("algorithm.core", self.core, f"one of {', '.join(CORES)}")
        if type(self.core_hidden) is not int or self.core_hidden <= 0:
            raise ConfigError("algorithm.core_hidden", self.core_hidden, "a positive integer")
        if type(self.burn_in) is not int or self.burn_in < 0:
            raise ConfigError("algorithm.burn_in", self.burn_in, "an integer >= 0")
        if self.vtrace_reference not in ("behaviour", "learner"):
            raise ConfigError(
                "algorithm.vtrace_reference", self.vtrace_reference, '"behaviour" or "learner"'
            )
        for key in ("vtrace_rho_bar", "vtrace_c_bar"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"algorithm.{key}", getattr(self, key), "a number > 0")


# --------------------------------------------------------------------------- algorithm


class PPO(OnPolicyAlgorithm):
    """Proximal policy optimization (see :class:`PPOConfig`).

    Usage::

        algo = PPO(PPO.Config(), env.observation_space, env.action_space, seed=0)
        out = algo.act(obs, explore=True)   # {"action", "logp", "value"(, "raw_action")}
        result = algo.update(batch)         # batch: K fragments concatenated, [T, N*K, ...]
    """

    name = "ppo"
    Config = PPOConfig
    networks = trained = ("net",)
    published = "net"
    action_masks = True
    """Over masked observations (:mod:`tianji.rl.masks`) the policy's illegal logits are
    :data:`~tianji.algorithms._nets.MASK_FILL`: samples, the mode and the losses' log-
    probabilities and entropy are over legal actions only."""
    adam_eps = 1e-5
    objective: ClassVar[Objective] = ppo_objective
    """The minibatch loss (IMPALA's is :func:`~tianji.algorithms._losses.impala_objective`)."""
    config: PPOConfig

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

    def _build(self, spaces: Spaces, seed: int) -> None:
        """The actor-critic (feed-forward, or with ``core`` recurrent) for the spaces, the
        sampling generator and the return statistics."""
        import gymnasium

        config, observation_space, action_space = self.config, spaces.observation, spaces.action
        self.continuous = isinstance(action_space, gymnasium.spaces.Box)
        self.action_shape: tuple[int, ...] = tuple(action_space.shape or ())
        self.action_start = 0 if self.continuous else int(action_space.start)
        out_dim = flat_dim(self.action_shape) if self.continuous else int(action_space.n)
        if self.continuous:
            self.low = np.asarray(action_space.low, dtype=np.float32)
            self.high = np.asarray(action_space.high, dtype=np.float32)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.recurrent = config.core != "none"
        """Whether ``act`` takes and returns a per-env state (``[algo] core``)."""
        with seeded_init(seed):
            net = actor_critic(
                observation_space, out_dim, hidden=config.hidden, torso=config.torso,
                shared=config.shared_network, continuous=self.continuous,
                core_hidden=config.core_hidden if self.recurrent else None,
                init_log_std=config.init_log_std, normalize_obs=config.normalize_obs,
            )  # fmt: skip
            self.net = net.to(self.device)
        self._steps = 0  # T of the batch being learned from (recurrent minibatches)
        self.returns = ReturnNormalizer() if config.normalize_returns else None
        """The value targets' running statistics (``normalize_returns``), else ``None``."""
        odd = self.continuous or self.recurrent  # ([algo] mirror needs neither)
        self.mirror = mirror_for(observation_space, out_dim, odd) if config.mirror else None

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
            if self.net.log_std is not None:
                raw, logp = sample_gaussian(head, self.net.log_std, explore, self.generator)
            else:
                raw, logp = sample_categorical(head, explore, self.generator)
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

    def greedy_module(self) -> GreedyPolicy:
        """The greedy policy as one torch module (``tianji export``): the mode of the
        policy head (argmax of the logits, or the Gaussian's mean clipped to the bounds).

        Raises:
            ConfigError: for a recurrent policy: its state between steps is not part of a
                plain observations-to-actions module.
        """
        if isinstance(self.net, RecurrentActorCritic):
            why = (
                'core = "none" to export: a recurrent policy carries a state from step to step '
                "that an observations-to-actions module cannot hold (tianji eval plays it)"
            )
            raise ConfigError("algo.core", self.config.core, why)
        if self.continuous:
            return GreedyPolicy(
                self.net, image=self.net.image, low=self.low, high=self.high,
                action_shape=self.action_shape,
            )  # fmt: skip
        return GreedyPolicy(self.net, image=self.net.image, discrete_start=self.action_start)

    def postprocess(self, fragment: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The fragment unchanged except for compact dtypes (see :func:`compact_fragment`)."""
        return compact_fragment(fragment)

    def _extra_state(self) -> dict[str, Any]:
        return {} if self.returns is None else {"returns": self.returns.state()}

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        if self.returns is not None and "returns" in state:
            self.returns.load(state["returns"])

    # ----------------------------------------------------------------- learner side

    def update(self, batch: Mapping[str, np.ndarray]) -> UpdateResult:
        """GAE over the ``[T, M]`` batch, then ``update_epochs`` passes of minibatch steps."""
        c = self.config
        flat_batch = self._prepare(batch)
        set_annealed_lr(self.optimizer, c, self.version)
        target_kl = c.target_kl
        stop = None if target_kl is None else (lambda kl: self._shared_kl(kl) > target_kl)
        metrics = run_epochs(
            flat_batch, c.update_epochs, self._minibatches, self._minibatch_step, stop
        )
        self.version += 1
        metrics.update(self._batch_metrics(flat_batch), lr=self.optimizer.param_groups[0]["lr"])
        if self.returns is not None:
            metrics.update(return_mean=self.returns.mean, return_std=self.returns.std)
        return UpdateResult(metrics=metrics)

    def _minibatches(self, size: int) -> list[np.ndarray]:
        """One epoch's minibatches of flat ``[T*M]`` indices: random steps, or, with a
        recurrent core, random whole columns (every step of each, in time order)."""
        if not self.recurrent:
            return epoch_minibatches(size, self.config.num_minibatches, self.rng)
        return column_minibatches(size, self._steps, self.config.num_minibatches, self.rng)

    def _shared_kl(self, kl: float) -> float:
        """The early-stop KL: with data-parallel learners the mean over all of them (one
        more all-reduce step), so they all stop after the same epoch and stay in step."""
        if self.gradient_sync is None:
            return kl
        return float(self.gradient_sync(np.array([kl], dtype=np.float32))[0])

    def _prepare(self, batch: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
        """Recompute values, estimate advantages and targets (GAE or V-trace) and flatten
        ``[T, M, ...]`` to ``[T*M, ...]`` tensors."""
        c = self.config
        reward = np.asarray(batch["reward"], dtype=np.float64) * c.reward_scale
        obs, action = self._batch_inputs(batch)
        if self.net.obs_norm is not None:
            self.net.obs_norm.update(obs, self.gradient_sync)
        with torch.no_grad():
            value, next_value, logp, extra = self._critic_pass(batch, obs, action)
        values = self._in_returns(value, reward.shape)
        ends = (reward, values, self._in_returns(next_value, reward.shape))
        adv, ret, logp = self._estimate(batch, ends, logp, obs, action)
        # The clipped ratio's reference policy (vtrace_reference): the one that acted, or
        # with V-trace the learner's own before this update (its advantages then carry the
        # correction to the acting policy, min(rho_bar, pi/mu)).
        learner_ref = c.vtrace and c.vtrace_reference == "learner"
        reference = (
            logp.float() if learner_ref and logp is not None else self._tensor(batch["logp"])
        )
        behaviour = self._in_returns(batch["value"], reward.shape)
        if self.returns is not None:  # targets, old values: in the updated statistics' units
            observe_returns(self.returns, ret, self.gradient_sync)
            ret, values, behaviour = (self.returns.normalize(x) for x in (ret, values, behaviour))
        tensors = {"behaviour_value": behaviour, "old_value": values, "adv": adv, "ret": ret}
        flat_batch = {
            "obs": obs,
            "action": action,
            "old_logp": reference.reshape(-1),
            **{k: self._tensor(v) for k, v in tensors.items()},
            **extra,
        }
        mirror = self.mirror
        return flat_batch if mirror is None else mirror.augment(flat_batch, self._log_probs)

    def _batch_inputs(self, batch: Mapping[str, np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch's observations and actions as flat ``[T*M, ...]`` tensors (Box actions:
        the unclipped ``raw_action``; discrete ones counted from 0)."""
        obs = self._input(flat(batch["obs"]))
        if self.continuous:
            raw = flat(batch["raw_action"]).reshape(len(obs), -1)
            return obs, host_to_device(raw, self.device, torch.float32)
        index = flat(batch["action"]).astype(np.int64) - self.action_start
        return obs, host_to_device(index, self.device)

    def _critic_pass(
        self, batch: Mapping[str, np.ndarray], obs: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, dict[str, torch.Tensor]]:
        """``(V(obs), V(next_obs), logp or None, the recurrent minibatches' extra tensors)``,
        flat; the recurrent core gets ``logp`` from the same unroll."""
        if isinstance(self.net, RecurrentActorCritic):
            return self._unroll_batch(batch, obs, action)
        value = self._values(obs)
        next_value = next_values(
            batch, value, lambda rows, next_obs: self._values(self._input(next_obs))
        )
        return value, next_value, None, {}

    def _estimate(
        self,
        batch: Mapping[str, np.ndarray],
        ends: tuple[np.ndarray, np.ndarray, np.ndarray],
        logp: torch.Tensor | None,
        obs: torch.Tensor,
        action: torch.Tensor,
    ) -> tuple[np.ndarray, np.ndarray, torch.Tensor | None]:
        """``(advantages, value targets, the learner's logp)`` from ``(reward, V(obs),
        V(next_obs))`` in return units: GAE, or V-trace with ratios to the stored ``logp``."""
        c = self.config
        episode = (batch["terminated"], batch["truncated"])
        if not c.vtrace:
            return (*gae(*ends, *episode, c.gamma, c.gae_lambda), logp)
        if logp is None:
            with torch.no_grad():
                logp = self._log_probs(obs, action)
        shape = ends[0].shape
        log_rho = logp.double().cpu().numpy().reshape(shape) - np.asarray(batch["logp"], np.float64)
        ret, adv = vtrace(
            *ends, *episode, log_rho, gamma=c.gamma, lam=c.gae_lambda,
            rho_bar=c.vtrace_rho_bar, c_bar=c.vtrace_c_bar,
        )  # fmt: skip
        return adv, ret, logp

    def _in_returns(self, critic: torch.Tensor | np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """Critic outputs ``[T*M]`` as float64 ``shape`` arrays in return units (de-normalized
        with ``normalize_returns``)."""
        out = critic.cpu().numpy() if isinstance(critic, torch.Tensor) else critic
        arr = np.asarray(out, np.float64).reshape(shape)
        return arr if self.returns is None else self.returns.denormalize(arr)

    def _tensor(self, x: np.ndarray) -> torch.Tensor:
        return host_to_device(flat(x), self.device, torch.float32)

    def _unroll_batch(
        self, batch: Mapping[str, np.ndarray], obs: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """The recurrent core over the batch (:func:`unroll_batch`): ``(values, next values,
        logp, the flat tensors minibatches unroll from)``, flat ``[T*M]``."""
        net = self.net
        assert isinstance(net, RecurrentActorCritic)
        heads, value, after, extra = unroll_batch(net, obs, batch, self.config.burn_in)
        self._steps = len(batch["reward"])

        def value_of(rows: np.ndarray, next_obs: np.ndarray) -> torch.Tensor:
            index = torch.as_tensor(rows, device=self.device)
            return net.step(self._input(next_obs), after[index])[1]

        next_value = next_values(batch, value, value_of)
        logp = head_stats(heads, action, net.log_std)[0]
        return value, next_value, logp, extra

    def _values(self, obs: torch.Tensor, chunk: int = 2048) -> torch.Tensor:
        """``V(obs)`` in chunks (bounded activation memory for pixel batches)."""
        assert isinstance(self.net, ActorCritic)  # the recurrent core values in its unroll
        if len(obs) <= chunk:
            return self.net.value(obs)
        return torch.cat([self.net.value(obs[i : i + chunk]) for i in range(0, len(obs), chunk)])

    def _log_probs(
        self, obs: torch.Tensor, action: torch.Tensor, chunk: int = 2048
    ) -> torch.Tensor:
        """``log pi(action | obs)`` under the current network, in chunks (V-trace's ratios)."""
        parts = [
            self._evaluate(obs[i : i + chunk], action[i : i + chunk])[0]
            for i in range(0, len(obs), chunk)
        ]
        return torch.cat(parts).double()

    def _minibatch_step(self, mb: dict[str, torch.Tensor]) -> dict[str, float]:
        """One optimizer step on a minibatch: its :attr:`objective` and diagnostics."""
        c = self.config
        if self.recurrent:
            mb, (logp, entropy, value) = self._evaluate_columns(mb)
        else:
            logp, entropy, value = self._evaluate(mb["obs"], mb["action"])
        adv = normalized(mb["adv"]) if c.norm_adv else mb["adv"]
        # (through the class: a plain function read from the instance would be bound)
        losses = type(self).objective(c, mb, logp, entropy, value, adv)
        self._gradient_step(losses.total)
        return {**losses.metrics(), **kl_stats(logp, mb["old_logp"], c.clip_coef)}

    def _evaluate_columns(
        self, mb: Mapping[str, torch.Tensor]
    ) -> tuple[dict[str, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """A recurrent minibatch (:func:`unroll_columns`): ``(the minibatch without its
        burn-in steps, (logp, entropy, value))``, flat."""
        assert isinstance(self.net, RecurrentActorCritic)
        kept, heads, value = unroll_columns(self.net, mb, self._steps, self.config.burn_in)
        logp, entropy = head_stats(heads, kept["action"], self.net.log_std)
        return kept, (logp, entropy, value)

    def _evaluate(
        self, obs: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(logp(action), entropy, value)`` under the current network."""
        head, value = self.net(obs)
        return (*head_stats(head, action, self.net.log_std), value)

    def _batch_metrics(self, flat_batch: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """Diagnostics over the whole batch: explained variance, behaviour-value drift."""
        explained = explained_variance(flat_batch["ret"], flat_batch["old_value"])
        drift = (flat_batch["behaviour_value"] - flat_batch["old_value"]).abs().mean().item()
        return {"explained_variance": explained, "value_drift": float(drift)}
