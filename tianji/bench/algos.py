"""Algorithms for benchmarks: PPO, DQN and IMPALA whose every update takes a set amount of
wall-clock time more.

On a small CPU-only machine a learner update costs a few milliseconds of this machine's
CPU, shared with the actors. A learner on an accelerator, or with a larger network, costs
wall-clock time the actors do not share: that is where the synchronous baseline pays
collection and update one after the other, and relaxing the dependency overlaps them.
:class:`DelayedPPO` and :class:`DelayedDQN` add ``update_ms`` milliseconds of waiting (the
learner's worker thread sleeps: the CPU stays free for others) to every update.

Use them as ``algorithm = "tianji.bench.algos:DelayedPPO"`` with ``[algo] update_ms = 250``
(and the algorithm's own settings), or ``tianji bench train --update-ms 250``.

:class:`SamplingPPO` is the other extreme: a learner that consumes batches and publishes
weights without computing anything, so a run measures the sampling path alone (actors,
inference, transports, buffer): ``tianji bench throughput``'s ``sampling`` cells, set
against the bare ``AsyncVectorEnv`` ceiling.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from tianji.algorithms.dqn import DQN, DQNConfig
from tianji.algorithms.impala import IMPALA, IMPALAConfig
from tianji.algorithms.ppo import PPO, PPOConfig
from tianji.rl.algorithm import UpdateResult
from tianji.rl.errors import ConfigError

__all__ = ["DELAYED", "DelayedDQN", "DelayedIMPALA", "DelayedPPO", "DelayedUpdate", "SamplingPPO"]


def _check(update_ms: float) -> float:
    if not isinstance(update_ms, int | float) or update_ms < 0:
        raise ConfigError("algo.update_ms", update_ms, "a number of milliseconds >= 0")
    return float(update_ms) / 1000.0


class DelayedUpdate:
    """Mixin before an algorithm class: every ``update`` waits ``config.update_ms`` ms more."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        self._update_s = _check(config.update_ms)
        super().__init__(config, *args, **kwargs)  # type: ignore[call-arg]

    def update(self, batch: Mapping[str, np.ndarray]) -> UpdateResult:
        time.sleep(self._update_s)
        result: UpdateResult = super().update(batch)  # type: ignore[misc]
        return result


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DelayedPPOConfig(PPOConfig):
    """PPO's settings and ``update_ms``: milliseconds every update waits more."""

    update_ms: float = 0.0


class DelayedPPO(DelayedUpdate, PPO):
    """PPO whose every update waits ``config.update_ms`` ms more (see the module docstring)."""

    Config = DelayedPPOConfig


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DelayedDQNConfig(DQNConfig):
    """DQN's settings and ``update_ms``: milliseconds every update waits more."""

    update_ms: float = 0.0


class DelayedDQN(DelayedUpdate, DQN):
    """DQN whose every update waits ``config.update_ms`` ms more (see the module docstring)."""

    Config = DelayedDQNConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class DelayedIMPALAConfig(IMPALAConfig):
    """IMPALA's settings and ``update_ms``: milliseconds every update waits more."""

    update_ms: float = 0.0


class DelayedIMPALA(DelayedUpdate, IMPALA):
    """IMPALA whose every update waits ``config.update_ms`` ms more."""

    Config = DelayedIMPALAConfig


class SamplingPPO(PPO):
    """PPO whose update only counts: the batch is consumed, the version advances, the
    weights stay (see the module docstring). Acting is PPO's, the same network's."""

    def update(self, batch: Mapping[str, np.ndarray]) -> UpdateResult:
        self.version += 1
        return UpdateResult(metrics={"transitions": float(np.asarray(batch["reward"]).size)})


DELAYED = {
    "ppo": "tianji.bench.algos:DelayedPPO",
    "dqn": "tianji.bench.algos:DelayedDQN",
    "impala": "tianji.bench.algos:DelayedIMPALA",
}
"""The delayed variant of each benchmarked algorithm, as ``module:Class``."""
