"""The balance policy: a pure function of observed counters -> pause/resume decisions.

TianJi's claim is that relaxed (asynchronous) components still converge when sample
production and consumption are balanced, which bounds staleness. This module makes that
explicit and testable without any I/O; the controller's service shell feeds it the
counters from heartbeats and turns its :class:`Decision` into command events.

Off-policy (replay) — Reverb's samples-per-insert limiter: after ``min_replay_size``
inserts, ``consumed`` is held within ``inserted * replay_ratio`` ± an absolute error buffer
(``tolerance`` times one round of inserts, widened by one step of each side; see
:meth:`BalancePolicy.band`), so the ratio converges to ``replay_ratio``.
Producers that run ahead (ratio below the band) get no credit and pause; a learner that
runs ahead (ratio above the band) waits for data.

On-policy (rollouts) — production grants: no consumed sample may be older than
``max_policy_lag`` versions. The learner consumes fragments oldest first, ``F`` fragments
(one batch) per version, so the k-th fragment not yet consumed (counting the batch in
training, the buffered ones, those on the wire and those being collected) is consumed at
version ``learner_version + k // F``. The policy keeps at most ``F * (lag_target + 1)``
fragments outstanding (and no more than the rollout buffer holds, so nothing is evicted)
and grants each new one to a producer together with the oldest weights it may be
collected with (``min_version = consumed_at - lag_target``; the producer waits for those
weights before it starts). A producer may therefore never start what would be consumed
more than ``lag_target`` versions late, and a learner waiting for data always leaves room
for a grant with weights that are already published: no state exists in which every
producer waits and the learner waits for data (:meth:`BalancePolicy.production_grants`).
With ``lag_target >= 1`` actors collect the next batch while the learner trains on the
previous one; ``max_policy_lag - lag_target`` versions absorb fragments that arrive out
of order. :func:`stale_mask` says exactly which samples exceed the hard bound (they are
dropped and counted as ``stale``).

Modes: ``relaxed`` (the above), ``sync`` (a producer pauses after each fragment until the
learner publishes a newer version, and an off-policy learner consumes exactly
``replay_ratio`` samples per inserted one: it waits for every actor's fragment), and
``unbalanced`` (never pauses anyone, no staleness bound).

The service shell is :class:`tianji.runtime.controller.Balancer`: it builds an
:class:`Observation` from heartbeats, calls :meth:`BalancePolicy.decide` and sends the
differences as command events (``GrantProduction`` to on-policy producers,
``PauseProduction`` / ``ResumeProduction`` to off-policy producers,
``GrantConsumption`` to learners).

Its size (over 500 lines, a third of them docstrings) is on purpose: the two regimes
(the replay band, production grants) share one observation, one decision type and the
invariants written here; split, those invariants would be spread over files.
"""

from __future__ import annotations

import collections
import dataclasses
import math

import numpy as np

from tianji.rl.algorithm import BufferSpec
from tianji.rl.config import RunConfig
from tianji.rl.stats import LearnerStat
from tianji.runtime.errors import ConfigError

__all__ = [
    "BalanceConfig",
    "BalancePolicy",
    "Decision",
    "Grant",
    "LagStats",
    "Observation",
    "balance_config",
    "min_replay_total",
    "publish_every",
    "stale_mask",
]

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
    """Off-policy: the allowed deviation of the consumed/inserted ratio over one round of
    inserts (a fragment from every producer); over the run the ratio converges to
    ``replay_ratio``."""
    min_replay_size: int = 0
    """Off-policy: inserts before the learner may start (producers never pause before)."""
    max_policy_lag: int = 1
    """On-policy: the oldest policy version a consumed sample may have, behind the learner."""
    lag_target: int = 1
    """On-policy: producers pause when a new fragment would be consumed more than this many
    versions after the policy that collects it (at most ``max_policy_lag``). Keeping it
    below the hard bound leaves room for fragments that arrive out of order."""
    batch_samples: int = 1
    """Samples the learners consume per update (one version step): with K data-parallel
    learners, K batches."""
    learners: int = 1
    """Data-parallel learners; each is granted ``1/learners`` of the consume limit."""
    fragment_samples: int = 1
    """Samples one producer inserts per fragment (the step a resumed producer takes)."""
    shards: int = 1
    """Buffer shards (actor ``i`` sends to shard ``i % shards``)."""
    buffer_fragments: int = 0
    """On-policy: fragments the rollout buffer keeps (0: no limit); the grants never keep
    more outstanding, so the buffer never evicts what was granted."""
    watchdog_s: float = 30.0
    """Seconds without a sample produced or consumed before the controller reports the
    run as stalled, naming who waits for what (0: never)."""

    @property
    def batch_fragments(self) -> int:
        """On-policy: fragments consumed per version (one batch of every learner)."""
        return max(1, math.ceil(self.batch_samples / self.fragment_samples))

    @property
    def outstanding_limit(self) -> int:
        """On-policy relaxed: fragments granted and not yet consumed, at most:
        ``batch_fragments * (lag_target + 1)``, capped by the rollout buffer's capacity."""
        target = min(self.lag_target, self.max_policy_lag)
        limit = self.batch_fragments * (target + 1)
        if self.buffer_fragments:
            limit = min(limit, max(self.buffer_fragments, self.batch_fragments))
        return limit

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
            or self.lag_target < 0
            or self.learners < 1
            or self.buffer_fragments < 0
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
        filling: some replay buffer (shard) cannot hand out a batch yet; producers are
            never paused then, or a shard whose actors started late could stay short for
            good while its learner holds the others at the gradient all-reduce.
        produced: samples produced by all producers (dead incarnations included).
        fragments_sent: fragments each live producer sent (its current incarnation).
        granted: fragments each live producer was granted so far (the controller's own
            record, cumulative for its current incarnation).
        params_version: the newest policy version published to producers (``None``: the
            learner's version).
    """

    inserted: int
    consumed: int
    dropped: int = 0
    learner_version: int = 0
    producer_versions: dict[str, int] = dataclasses.field(default_factory=dict)
    fragments_at_version: dict[str, int] = dataclasses.field(default_factory=dict)
    filling: bool = False
    produced: int = 0
    fragments_sent: dict[str, int] = dataclasses.field(default_factory=dict)
    granted: dict[str, int] = dataclasses.field(default_factory=dict)
    params_version: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Grant:
    """A producer may have sent ``limit`` fragments in all (cumulative for its
    incarnation) and starts each one only with weights of ``min_version`` or newer."""

    limit: int
    min_version: int


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    """Which producers should be paused now, and how far the learner may consume.

    Attributes:
        paused: producers that must not produce now.
        learner_waits: the learner must not start its next update now.
        reason: a human-readable explanation (logged on changes).
        consume_limit: the cumulative ``consumed`` count the learner may reach (its grant);
            ``None`` means unlimited. ``learner_waits`` is
            ``consumed + batch_samples > consume_limit``.
        grants: on-policy relaxed: every producer's production grant (``None``: producers
            are paced by ``paused`` instead).
    """

    paused: frozenset[str]
    learner_waits: bool
    reason: str
    consume_limit: int | None = None
    grants: dict[str, Grant] | None = None


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
            if cfg.on_policy:  # the learner's batch is one fragment of every actor
                return Decision(waiting, False, "sync: one fragment per version")
            return self._sync_off_policy(obs, producers, waiting)
        if cfg.on_policy:
            return self._on_policy(obs, producers)
        return self._off_policy(obs, producers)

    def updates_per_round(self, producers: int) -> int:
        """Sync off-policy: learner updates per round (one fragment of every producer),
        ``replay_ratio`` samples per inserted sample, at least one."""
        cfg = self.config
        round_samples = producers * cfg.fragment_samples * cfg.replay_ratio
        return max(1, round(round_samples / cfg.batch_samples))

    def _sync_off_policy(
        self, obs: Observation, producers: frozenset[str], waiting: frozenset[str]
    ) -> Decision:
        """The learner waits for every producer: once each has sent a fragment with the
        same weights (version ``p``), it may take :meth:`updates_per_round` updates, up to
        version ``p + updates_per_round``; then it publishes new weights and the next round
        starts. The grant stays until the round's updates are done: it depends on the
        version the producers collected with, not on the learner's (which moves with every
        update of the round). Until ``min_replay_size`` the producers fill the buffer and
        the learner waits."""
        cfg = self.config
        if obs.inserted < cfg.min_replay_size or not producers:
            return Decision(waiting, True, f"sync: filling {obs.inserted}", obs.consumed)
        round_version = min(obs.producer_versions[p] for p in producers)
        sent = all(obs.fragments_at_version.get(p, 0) >= 1 for p in producers)
        left = round_version + self.updates_per_round(len(producers)) - obs.learner_version
        if not sent or left <= 0:
            return Decision(waiting, True, "sync: waiting for every actor", obs.consumed)
        limit = obs.consumed + left * cfg.batch_samples
        return Decision(waiting, False, f"sync: round of v{round_version}, to {limit}", limit)

    def band(self, obs: Observation, producers: int) -> tuple[float, float] | None:
        """The allowed range of ``consumed`` for the inserts so far (None while filling).

        ``inserted * replay_ratio ± error``, as Reverb's limiter: an absolute error buffer
        of ``tolerance`` times one round of inserts (a fragment from every producer), so
        the ratio may stray by ``tolerance`` over a round while over the run it converges
        to ``replay_ratio`` (a band relative to all inserts would let a learner-bound run
        sit at ``replay_ratio - tolerance`` for good); widened by one step of every side,
        so a side that may move never jumps over the band and the two sides are never
        both held back.
        """
        cfg = self.config
        effective = obs.inserted - cfg.min_replay_size
        if effective <= 0:
            return None
        round_inserts = producers * cfg.fragment_samples
        slack = cfg.replay_ratio * round_inserts + cfg.batch_samples
        error = cfg.tolerance * round_inserts + slack
        return effective * cfg.replay_ratio - error, effective * cfg.replay_ratio + error

    def _off_policy(self, obs: Observation, producers: frozenset[str]) -> Decision:
        """Look one step ahead, as Reverb's limiter checks each insert and sample before it
        happens: a side may take its next step only if ``consumed`` stays in the band."""
        cfg = self.config
        band = self.band(obs, len(producers))
        if band is None:
            return Decision(frozenset(), True, f"filling: {obs.inserted}/{cfg.min_replay_size}", 0)
        step = dataclasses.replace(
            obs, inserted=obs.inserted + len(producers) * cfg.fragment_samples
        )
        after_inserts = self.band(step, len(producers))
        assert after_inserts is not None
        producers_wait = obs.consumed < after_inserts[0] and not obs.filling
        learner_waits = obs.consumed + cfg.batch_samples > band[1]
        paused = producers if producers_wait else frozenset()
        reason = f"consumed {obs.consumed} in [{band[0]:.0f}, {band[1]:.0f}]"
        return Decision(paused, learner_waits, reason, int(band[1]))

    def outstanding(self, obs: Observation) -> int:
        """On-policy: fragments granted and neither consumed nor dropped yet: produced and
        somewhere between the producers and the learner's update (``produced - consumed -
        dropped``), plus those granted to live producers and not sent yet."""
        backlog = max(0, obs.produced - obs.consumed - obs.dropped)
        collecting = sum(
            max(0, obs.granted.get(p, 0) - obs.fragments_sent.get(p, 0))
            for p in obs.producer_versions
        )
        return math.ceil(backlog / self.config.fragment_samples) + collecting

    def consumed_at(self, obs: Observation, position: int) -> int:
        """The learner version at which the fragment at ``position`` (0: the oldest one not
        yet consumed) will be consumed: ``batch_fragments`` fragments per version, oldest
        first. It does not change while the learner works through the fragments ahead."""
        return obs.learner_version + position // self.config.batch_fragments

    def production_grants(self, obs: Observation) -> tuple[dict[str, Grant], int]:
        """New grants for the fragments that fit in :attr:`BalanceConfig.outstanding_limit`.

        Each grant takes the next position; its producer must collect it with weights no
        older than ``consumed_at(position) - lag_target`` (never newer than the published
        ones). Idle producers are chosen first, then those that already hold the weights,
        then those granted least so far (round robin). Fewer than one batch outstanding is
        always granted, whatever the weights: the learner never waits for nothing.

        Returns:
            (new grants by producer, fragments outstanding after them).
        """
        cfg = self.config
        target = min(cfg.lag_target, cfg.max_policy_lag)
        published = obs.learner_version if obs.params_version is None else obs.params_version
        producers = sorted(obs.producer_versions)
        granted = {p: max(obs.granted.get(p, 0), obs.fragments_sent.get(p, 0)) for p in producers}
        pending = {p: granted[p] - obs.fragments_sent.get(p, 0) for p in producers}
        new: dict[str, Grant] = {}
        position = self.outstanding(obs)
        while producers and position < cfg.outstanding_limit:
            need = max(0, self.consumed_at(obs, position) - target)
            if need > published and position >= cfg.batch_fragments:
                break  # those weights are not out yet: grant when they are
            need = min(need, published)

            def rank(p: str, need: int = need) -> tuple[int, bool, int, str]:
                return pending[p], obs.producer_versions[p] < need, granted[p], p

            chosen = min(producers, key=rank)
            granted[chosen] += 1
            pending[chosen] += 1
            before = new.get(chosen)
            new[chosen] = Grant(granted[chosen], max(need, before.min_version if before else 0))
            position += 1
        return new, position

    def _on_policy(self, obs: Observation, producers: frozenset[str]) -> Decision:
        """Grant the fragments that can be consumed within the lag target (see the module
        docstring); producers with nothing granted are reported as paused."""
        grants, outstanding = self.production_grants(obs)
        idle = frozenset(
            p
            for p in producers
            if p not in grants and obs.granted.get(p, 0) <= obs.fragments_sent.get(p, 0)
        )
        reason = f"{outstanding}/{self.config.outstanding_limit} fragments outstanding"
        return Decision(idle, False, reason, grants=grants)


def stale_mask(
    sample_versions: np.ndarray, learner_version: int, max_policy_lag: int
) -> np.ndarray:
    """True for the samples whose lag exceeds ``max_policy_lag`` (to be dropped as stale)."""
    return (learner_version - np.asarray(sample_versions)) > max_policy_lag


def publish_every(run: RunConfig, spec: BufferSpec) -> int:
    """Updates between two weight publications: ``learner.publish_interval`` when set;
    else 1 for on-policy runs, and for off-policy runs the updates that one actor fragment
    pays for at the replay ratio (``replay_ratio * fragment samples / batch size``, at
    least 1). A DQN learner publishing 270 KB of weights after every update (133/s) spent a
    quarter of a 2-core machine on weights its actors replaced before using them."""
    if run.learner.publish_interval is not None:
        return run.learner.publish_interval
    if spec.kind == "rollout":
        return 1
    fragment = run.actors.fragment_length * run.actors.envs_per_actor
    return max(1, int(run.controller.replay_ratio * fragment / spec.batch_size))


def balance_config(run: RunConfig, spec: BufferSpec, fragment_samples: int) -> BalanceConfig:
    """The balance settings of a run: ``[controller]`` plus what the algorithm's buffer says.

    Args:
        run: the run config.
        spec: the algorithm's buffer spec (rollout: ``batch_size`` counts fragments).
        fragment_samples: transitions in one actor fragment (``T * N``).

    Raises:
        ConfigError: for settings under which ``sync`` could never make progress.
    """
    ctl = run.controller
    on_policy = spec.kind == "rollout"
    batch = spec.batch_size * fragment_samples if on_policy else spec.batch_size
    batch *= run.learner.count  # one update (version) takes a batch from every learner
    cfg = BalanceConfig(
        mode=ctl.mode,
        on_policy=on_policy,
        replay_ratio=ctl.replay_ratio,
        tolerance=ctl.tolerance,
        min_replay_size=0 if on_policy else min_replay_total(run, spec.min_size),
        max_policy_lag=run.learner.max_policy_lag,
        lag_target=ctl.lag_target,
        batch_samples=batch,
        fragment_samples=fragment_samples,
        learners=run.learner.count,
        shards=run.buffer.shards,
        buffer_fragments=spec.capacity if on_policy else 0,
        watchdog_s=ctl.watchdog_seconds,
    )
    learners = run.learner.count
    if on_policy and run.buffer.shards > 1:
        raise ConfigError(
            "buffer.shards",
            run.buffer.shards,
            "1 for an on-policy algorithm: its rollouts are consumed once, by version, and a "
            "learner whose shard's actors are paused would hold every other learner at the "
            "next gradient step (shard replay buffers instead)",
        )
    if ctl.mode == "sync" and on_policy and spec.batch_size * learners != run.actors.count:
        raise ConfigError(
            "controller.mode",
            "sync",
            f"one fragment per actor per update: the algorithm's batch is {spec.batch_size} "
            f"fragments x {learners} learner(s) but actors.count is {run.actors.count}",
        )
    round_samples = ctl.replay_ratio * run.actors.count * fragment_samples
    if ctl.mode == "sync" and not on_policy and round_samples < batch:
        raise ConfigError(
            "controller.replay_ratio",
            ctl.replay_ratio,
            f"in sync mode, replay_ratio x actors x fragment ({round_samples:g}) >= the "
            f"batch size {batch}, or a round of fragments never allows an update",
        )
    return cfg


def min_replay_total(run: RunConfig, min_size: int) -> int:
    """Samples inserted over all buffer shards before every shard holds ``min_size``: the
    shards' actors split unevenly when ``actors.count % shards != 0``."""
    shards, actors = run.buffer.shards, run.actors.count
    most, fewest = -(-actors // shards), actors // shards
    return -(-min_size * shards * most // fewest)


class LagStats:
    """Distribution of policy lag (in versions) over consumed samples, with bounded size.

    Lags below ``EXACT`` are counted exactly; larger ones (replay) in power-of-two buckets
    named by their lower bound, so a heartbeat carries at most ~``EXACT`` + 60 counters.
    The sum and the maximum are kept exactly.
    """

    EXACT = 32

    def __init__(self) -> None:
        self.counts: collections.Counter[int] = collections.Counter()
        self.total_lag = 0
        self.max_lag = 0

    @classmethod
    def bucket(cls, lag: int) -> int:
        return lag if lag < cls.EXACT else 1 << (lag.bit_length() - 1)

    def add(self, lags: np.ndarray) -> None:
        lags = lags.astype(np.int64)
        if not lags.size:
            return
        self.total_lag += int(lags.sum())
        self.max_lag = max(self.max_lag, int(lags.max()))
        values, counts = np.unique(lags, return_counts=True)
        for v, c in zip(values.tolist(), counts.tolist(), strict=True):
            self.counts[self.bucket(int(v))] += int(c)

    def as_counters(self) -> dict[str, int]:
        """Histogram as heartbeat counters ``lag/<bucket>``, plus ``lag_sum`` and ``lag_max``."""
        out = {f"{LearnerStat.LAG_PREFIX}{k}": n for k, n in self.counts.items()}
        out[LearnerStat.LAG_SUM] = self.total_lag
        out[LearnerStat.LAG_MAX] = self.max_lag
        return out

    @staticmethod
    def summarize(counts: dict[int, int], total_lag: int, max_lag: int) -> dict[str, float] | None:
        """mean, p50, p95, max (None when empty); quantiles above ``EXACT`` are bucket
        lower bounds."""
        total = sum(counts.values())
        if total == 0:
            return None
        keys = sorted(counts)

        def quantile(q: float) -> float:
            seen = 0
            for k in keys:
                seen += counts[k]
                if seen >= q * total:
                    return float(k)
            return float(keys[-1])

        return {
            "mean": total_lag / total,
            "p50": quantile(0.5),
            "p95": quantile(0.95),
            "max": float(max_lag),
        }
