"""The balance policy: a pure function of observed counters -> pause/resume decisions.

Status: the pure policy and its tests (groundwork of the controller issue); the service
shell that feeds it heartbeats and sends Pause/ResumeProduction is not wired in yet.

TianJi's claim is that relaxed (asynchronous) components still converge when sample
production and consumption are balanced, which bounds staleness. This module makes that
explicit and testable without any I/O; the controller's service shell feeds it the
counters from heartbeats and turns its :class:`Decision` into command events.

Off-policy (replay) — Reverb's samples-per-insert limiter: after ``min_replay_size``
inserts, the ratio ``consumed / inserted`` is held within ``replay_ratio ± tolerance``,
widened by one step of each side (Reverb's error buffer, see :meth:`BalancePolicy.band`).
Producers that run ahead (ratio below the band) get no credit and pause; a learner that
runs ahead (ratio above the band) waits for data.

On-policy (rollouts): no consumed sample may be older than ``max_policy_lag`` versions.
A producer whose policy is already that stale is paused until it has newer weights, and
producers pause while more is buffered than the learner can consume within the lag bound,
so they do not produce what would only be dropped. :func:`stale_mask` says exactly which
samples exceed the bound (they are dropped and counted as ``stale``).

Modes: ``relaxed`` (the above), ``sync`` (a producer pauses after each fragment until the
learner publishes a newer version), ``unbalanced`` (never pauses anyone).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from tianji.errors import ConfigError

__all__ = ["BalanceConfig", "BalancePolicy", "Decision", "Observation", "stale_mask"]

MODES = ("relaxed", "sync", "unbalanced")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class BalanceConfig:
    """How the controller balances production and consumption."""

    mode: str = "relaxed"
    """relaxed | sync | unbalanced."""
    on_policy: bool = False
    """True for rollout buffers (staleness bound), False for replay (ratio band)."""
    replay_ratio: float = 1.0
    """Off-policy: samples consumed per sample inserted."""
    tolerance: float = 0.25
    """Off-policy: the allowed deviation of the consumed/inserted ratio."""
    min_replay_size: int = 0
    """Off-policy: inserts before the learner may start (producers never pause before)."""
    max_policy_lag: int = 1
    """On-policy: the oldest policy version a consumed sample may have, behind the learner."""
    batch_samples: int = 1
    """Samples the learner consumes per update (one version step)."""
    fragment_samples: int = 1
    """Samples one producer inserts per fragment (the step a resumed producer takes)."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError("controller.mode", self.mode, " | ".join(MODES))
        if self.replay_ratio <= 0 or self.tolerance < 0 or self.tolerance >= self.replay_ratio:
            raise ConfigError(
                "controller.tolerance",
                (self.replay_ratio, self.tolerance),
                "replay_ratio > 0 and 0 <= tolerance < replay_ratio",
            )
        if (
            self.max_policy_lag < 0
            or self.batch_samples < 1
            or self.fragment_samples < 1
            or self.min_replay_size < 0
        ):
            raise ConfigError(
                "controller",
                (self.max_policy_lag, self.batch_samples, self.min_replay_size),
                "max_policy_lag >= 0, batch_samples >= 1, min_replay_size >= 0",
            )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Observation:
    """Cumulative counters as last reported in heartbeats.

    Attributes:
        inserted: samples inserted into buffers.
        consumed: samples consumed by learners.
        dropped: samples dropped for any reason (they are no longer buffered).
        learner_version: the learner's policy version.
        producer_versions: each producer's current policy version.
        fragments_at_version: fragments each producer sent with its current version.
    """

    inserted: int
    consumed: int
    dropped: int = 0
    learner_version: int = 0
    producer_versions: dict[str, int] = dataclasses.field(default_factory=dict)
    fragments_at_version: dict[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    """Which producers should be paused now, and whether the learner must wait."""

    paused: frozenset[str]
    learner_waits: bool
    reason: str


class BalancePolicy:
    """Pure decisions from counters (see the module docstring).

    Usage::

        policy = BalancePolicy(BalanceConfig(on_policy=False, replay_ratio=2.0))
        decision = policy.decide(observation)
        to_pause = decision.paused - currently_paused      # send PauseProduction
        to_resume = currently_paused - decision.paused     # send ResumeProduction
    """

    def __init__(self, config: BalanceConfig) -> None:
        self.config = config

    def ratio(self, obs: Observation) -> float | None:
        """consumed / inserted counted from ``min_replay_size`` on, or None before."""
        inserted = obs.inserted - self.config.min_replay_size
        return obs.consumed / inserted if inserted > 0 else None

    def decide(self, obs: Observation) -> Decision:
        cfg = self.config
        producers = frozenset(obs.producer_versions)
        if cfg.mode == "unbalanced":
            return Decision(frozenset(), False, "unbalanced: no limits")
        if cfg.mode == "sync":
            waiting = frozenset(
                p
                for p in producers
                if obs.fragments_at_version.get(p, 0) >= 1
                and obs.producer_versions[p] >= obs.learner_version
            )
            return Decision(waiting, False, "sync: one fragment per version")
        if cfg.on_policy:
            return self._on_policy(obs, producers)
        return self._off_policy(obs, producers)

    def band(self, obs: Observation, producers: int) -> tuple[float, float] | None:
        """The allowed range of ``consumed`` for the inserts so far (None while filling).

        ``inserted * (replay_ratio ± tolerance)``, widened by one step of every side (the
        error buffer of Reverb's limiter), so a side that may move never jumps over the
        band and the two sides are never both held back.
        """
        cfg = self.config
        effective = obs.inserted - cfg.min_replay_size
        if effective <= 0:
            return None
        slack = cfg.replay_ratio * producers * cfg.fragment_samples + cfg.batch_samples
        low = effective * (cfg.replay_ratio - cfg.tolerance) - slack
        high = effective * (cfg.replay_ratio + cfg.tolerance) + slack
        return low, high

    def _off_policy(self, obs: Observation, producers: frozenset[str]) -> Decision:
        """Look one step ahead, as Reverb's limiter checks each insert and sample before it
        happens: a side may take its next step only if ``consumed`` stays in the band."""
        cfg = self.config
        band = self.band(obs, len(producers))
        if band is None:
            return Decision(frozenset(), True, f"filling: {obs.inserted}/{cfg.min_replay_size}")
        step = dataclasses.replace(
            obs, inserted=obs.inserted + len(producers) * cfg.fragment_samples
        )
        after_inserts = self.band(step, len(producers))
        assert after_inserts is not None
        producers_wait = obs.consumed < after_inserts[0]
        learner_waits = obs.consumed + cfg.batch_samples > band[1]
        paused = producers if producers_wait else frozenset()
        return Decision(paused, learner_waits, f"consumed {obs.consumed} in {band}")

    def _on_policy(self, obs: Observation, producers: frozenset[str]) -> Decision:
        cfg = self.config
        oldest_ok = obs.learner_version - cfg.max_policy_lag
        stale = frozenset(p for p in producers if obs.producer_versions[p] < oldest_ok)
        buffered = obs.inserted - obs.consumed - obs.dropped
        # What the learner can still consume before today's samples exceed the lag bound.
        room = (cfg.max_policy_lag + 1) * cfg.batch_samples
        if buffered >= room:
            return Decision(producers, False, f"buffered {buffered} >= {room} usable")
        reason = f"stale producers {sorted(stale)}" if stale else "balanced"
        return Decision(stale, False, reason)


def stale_mask(
    sample_versions: np.ndarray, learner_version: int, max_policy_lag: int
) -> np.ndarray:
    """True for the samples whose lag exceeds ``max_policy_lag`` (to be dropped as stale)."""
    return (learner_version - np.asarray(sample_versions)) > max_policy_lag
