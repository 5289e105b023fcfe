"""The RL vocabulary: what an algorithm and a buffer are (no I/O, no asyncio).

* an :class:`Algorithm` is the RL math: batched ``act`` and ``update``; no I/O.
* a :class:`Buffer` stores samples and hands out batches; no I/O.
* a :class:`BufferSpec` is the buffer an algorithm asks for.

Algorithms import from here (and :mod:`tianji.rl.config`, :mod:`tianji.rl.errors`) only;
see ``docs/writing-an-algorithm.md``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = [
    "Algorithm",
    "Buffer",
    "BufferSpec",
    "GradientSync",
    "SupportsGradientSync",
    "UpdateResult",
]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class BufferSpec:
    """The buffer an algorithm wants; the buffer service builds it.

    Attributes:
        kind: ``"replay"`` (uniform), ``"prioritized"`` (proportional, with importance
            weights and priority updates from the learner) or ``"rollout"`` (FIFO of whole
            trajectory fragments, for on-policy learning).
        capacity: transitions (replay kinds) or fragments (rollout) kept at most; the
            oldest are evicted and counted.
        batch_size: transitions per learner batch (replay kinds) or fragments per batch
            (rollout; they are concatenated along the env axis).
        min_size: stored items needed before the first batch is handed out (replay: the
            algorithm's ``learning_starts``). The controller grants the actors exactly
            this much before the learner starts, and counts the replay ratio from it.
        alpha: priority exponent (prioritized only).
        beta: importance-weight exponent (prioritized only).
        updates_per_step: replay kinds: learner updates per env step inserted (the
            update-to-data ratio); the controller keeps ``consumed / (inserted - min_size)``
            at ``updates_per_step * batch_size`` unless ``[controller] replay_ratio``
            overrides it. ``None``: not declared (then the override is required).
        random_steps: replay kinds: env steps at the start of the run acted uniformly at
            random over the action space instead of by the policy (split evenly over the
            actors: each takes its first ``ceil(random_steps / actors)``).
    """

    kind: str
    capacity: int
    batch_size: int
    min_size: int = 0
    alpha: float = 0.6
    beta: float = 0.4
    updates_per_step: float | None = None
    random_steps: int = 0

    def __post_init__(self) -> None:
        if self.updates_per_step is not None and not self.updates_per_step > 0:
            raise ValueError(f"BufferSpec.updates_per_step {self.updates_per_step!r}: not > 0")
        if self.random_steps < 0:
            raise ValueError(f"BufferSpec.random_steps {self.random_steps!r}: not >= 0")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class UpdateResult:
    """What one learner update returns.

    Attributes:
        metrics: scalars to log (``loss``, ``entropy``, ...).
        priorities: new priorities for the sampled transitions (prioritized replay), in
            the order of the batch, or ``None``.
    """

    metrics: dict[str, float]
    priorities: np.ndarray | None = None


@runtime_checkable
class Algorithm(Protocol):
    """RL math in one object: no asyncio, transports, processes or logging inside.

    An algorithm is one file in ``algorithms/`` (or a third-party module registered under
    the entry-point group ``tianji.algorithms``) defining a config dataclass ``Config`` and
    a class with this interface. The same object runs on actors (``act``,
    ``postprocess``, ``set_weights``) and on the learner (``update``, ``get_weights``).

    Usage (what the actor and learner services do)::

        cls = tianji.algorithms.get("ppo")
        problem = cls.check_spaces(obs_space, action_space)   # None or an error message
        algo = cls(cls.Config(), obs_space, action_space, seed=0, device="auto")
        out = algo.act(obs_batch, explore=True)     # {"action": [N,...], + extras to store}
        samples = algo.postprocess(fragment)        # actor side, numpy only (e.g. n-step)
        result = algo.update(batch)                 # learner side -> UpdateResult
        weights = algo.get_weights()                # published as ParamsPublished
        actor_algo.set_weights(weights, version)    # version drives e.g. epsilon schedules

    A *fragment* is what an actor collected with N envs over T steps: arrays shaped
    ``[T, N, ...]`` named ``obs``, ``action``, ``reward``, ``terminated``, ``truncated``,
    ``next_obs`` (the true next observation, also at episode ends) plus every extra key
    ``act`` returned (e.g. ``logp``, ``value``).

    A multi-agent algorithm sets ``multi_agent = True`` and takes ``state_space=`` in its
    constructor; its envs stack A agents (``obs [N, A, D]``, ``action [N, A]``) and its
    fragments also carry ``agent_reward``, ``state`` and ``next_state``
    (``tianji/rl/multiagent.py``).
    """

    name: str

    def act(self, obs: np.ndarray, *, explore: bool) -> dict[str, np.ndarray]: ...

    def postprocess(self, fragment: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def update(self, batch: Mapping[str, np.ndarray]) -> UpdateResult: ...

    def get_weights(self) -> dict[str, np.ndarray]: ...

    def set_weights(self, weights: Mapping[str, np.ndarray], version: int) -> None: ...

    def buffer_spec(self) -> BufferSpec: ...


GradientSync = Callable[[np.ndarray], np.ndarray]
"""Averages a flat float32 vector over the data-parallel learners (``learner.count > 1``).

The learner service installs one on its algorithm; the algorithm calls it after
``backward()`` with all its gradients flattened into one vector, and puts what it returns
back before clipping and ``optimizer.step()``. It blocks until every learner has handed in
its vector for the same step and returns their mean, bit-identical on every learner, so
identical weights stay identical. Each call is one all-reduce step: every learner must make
the same sequence of calls with vectors of the same size (an algorithm that takes a
data-dependent decision, e.g. PPO's early stop on ``target_kl``, averages its input through
the same hook first). It raises if a peer does not answer in time.
"""


@runtime_checkable
class SupportsGradientSync(Protocol):
    """An :class:`Algorithm` that can run as one of several data-parallel learners.

    Usage (the learner service does this when ``learner.count > 1``)::

        algo.gradient_sync = hook    # None (the default): a single learner, no overhead
        algo.update(batch)           # calls hook(flat_grads) once per optimizer step
    """

    gradient_sync: GradientSync | None


@runtime_checkable
class Buffer(Protocol):
    """Sample storage with a sampling strategy (replay, prioritized replay, FIFO rollouts).

    Usage::

        buf.add({"obs": o, "action": a, ...}, policy_version=7)   # returns items added
        batch = buf.sample(256)   # None while fewer than min_size items are stored
        buf.update_priorities(batch["index"], new_priorities)       # prioritized only
        stats = buf.statistics()  # {"size": ..., "inserted": ..., "evicted": ...}
    """

    def add(self, arrays: Mapping[str, np.ndarray], *, policy_version: int) -> int: ...

    def sample(self, batch_size: int) -> dict[str, np.ndarray] | None: ...

    def __len__(self) -> int: ...

    def statistics(self) -> dict[str, Any]: ...
