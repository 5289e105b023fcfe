"""The balance policy: one grant mechanism for every mode, a pure function of counters.

TianJi's claim is that relaxed (asynchronous) components still converge when sample
production and consumption are balanced, which bounds staleness. This module makes that
explicit and testable without any I/O; the controller's shell
(:class:`tianji.services.balancer.Balancer`) feeds it the counters from heartbeats and
sends what changed of its :class:`Decision`.

**One command paces every producer**: a :class:`Grant` — how many fragments it may have
sent in all (cumulative for its incarnation) and the oldest weights it may start one with.
An actor waits exactly while ``sent >= grant.limit`` or ``its version < grant.min_version``.
A pause is a grant of nothing more, a resume a grant of more. Learners are paced by a
consumption limit (their cumulative ``samples_consumed``). What differs between modes is
only how many fragments the policy grants, and with which weights:

- **relaxed, on-policy** (rollouts): fragments are consumed oldest first, ``F`` per version,
  so the k-th fragment not yet consumed is consumed at ``learner_version + k // F``. At most
  ``F * (lag_target + 1)`` fragments are outstanding (granted and not consumed; never more
  than the rollout buffer holds), each granted with ``min_version = consumed_at -
  lag_target``; fewer than one batch outstanding is always granted with the weights out,
  so the learner never waits for nothing.
- **sync, on-policy**: the same with ``lag_target = 0``, ``F`` = one fragment per actor, and
  never a grant ahead of the published weights: one version's worth per round, every
  sample consumed by the policy that collected it.
- **relaxed, off-policy** (replay; Reverb's ``SampleToInsertRatio``): inserts are granted
  while ``consumed`` stays above ``(inserted - min_replay_size) * replay_ratio - error``
  for them, the error buffer being ``tolerance`` times one round of inserts (a fragment of
  every producer) widened by one step of each side; the learner may consume up to the
  upper edge. Counted from the warm-up size (as Reverb's limiter offsets by its minimum
  size): the warm-up itself is granted exactly, the fragments that fill it and no more.
- **sync, off-policy**: every producer fills its share of the warm-up, then sends one
  fragment per published version; the learner takes one round's updates
  (``replay_ratio`` samples per inserted one) once every producer's fragment is in.
- **unbalanced**: unlimited grants, no consumption limit, no staleness bound.

``max_collecting`` bounds how many producers hold an unfinished grant at once (relaxed
mode): on a few cores shared with the learner, 32 replay actors collecting together would
starve it. (In sync mode the learner never trains while actors collect.)

:class:`BalanceConfig` is the only reader of the mode (:class:`~tianji.rl.config.Mode`):
the services ask it what they need (:attr:`BalanceConfig.staleness_bound`,
:attr:`BalanceConfig.publish_at_round_end`).
"""

from __future__ import annotations

import dataclasses
import math

from tianji.rl.config import Mode
from tianji.rl.grants import Decision, Grant, Ledger, Observation
from tianji.runtime.errors import ConfigError

__all__ = [
    "UNLIMITED",
    "BalanceConfig",
    "BalancePolicy",
    "Decision",
    "Grant",
    "Mode",
    "Observation",
]

UNLIMITED = 1 << 62
"""A grant's limit that is never reached (unbalanced mode)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class BalanceConfig:
    """How the controller balances production and consumption."""

    mode: Mode = Mode.RELAXED
    """relaxed | sync | unbalanced (the module docstring)."""
    on_policy: bool = False
    """True for rollout buffers (staleness bound), False for replay (ratio band)."""
    replay_ratio: float = 1.0
    """Off-policy: samples consumed per sample inserted."""
    tolerance: float = 0.25
    """Off-policy: the allowed deviation of the consumed/inserted ratio over one round of
    inserts (a fragment from every producer); over the run the ratio converges to
    ``replay_ratio``."""
    min_replay_size: int = 0
    """Off-policy: inserts before the learner may start."""
    fill_fragments: int = 1
    """Sync off-policy: fragments each producer sends to fill the warm-up."""
    max_policy_lag: int = 1
    """On-policy: the oldest policy version a consumed sample may have, behind the learner."""
    lag_target: int = 1
    """On-policy relaxed: a fragment is granted only with weights at most this many versions
    older than the learner's when it will be consumed (at most ``max_policy_lag``)."""
    batch_samples: int = 1
    """Samples the learners consume per update (one version step): with K data-parallel
    learners, K batches."""
    learners: int = 1
    """Data-parallel learners; each is granted ``1/learners`` of the consume limit."""
    fragment_samples: int = 1
    """Samples one producer inserts per fragment."""
    shards: int = 1
    """Buffer shards (actor ``i`` sends to shard ``i % shards``)."""
    buffer_fragments: int = 0
    """On-policy: fragments the rollout buffer keeps (0: no limit); the grants never keep
    more outstanding, so the buffer never evicts what was granted."""
    max_collecting: int = 0
    """Relaxed: producers that may hold an unfinished grant at once (0: no bound)."""
    producers: int = 0
    """Actors in the run (0: not known; the sync checks need it)."""
    publish_interval: int = 1
    """Learner updates between two weight publications."""
    watchdog_s: float = 30.0
    """Seconds without a sample produced or consumed before the controller reports the
    run as stalled, naming who waits for what (0: never)."""

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "mode", Mode(self.mode))
        except ValueError:
            raise ConfigError("controller.mode", self.mode, " | ".join(Mode)) from None
        if self.replay_ratio <= 0 or self.tolerance < 0 or self.tolerance >= self.replay_ratio:
            raise ConfigError(
                "controller.tolerance",
                (self.replay_ratio, self.tolerance),
                "replay_ratio > 0 and 0 <= tolerance < replay_ratio",
            )
        counts = {
            "max_policy_lag": self.max_policy_lag,
            "lag_target": self.lag_target,
            "min_replay_size": self.min_replay_size,
            "buffer_fragments": self.buffer_fragments,
            "max_collecting": self.max_collecting,
            "batch_samples": self.batch_samples - 1,
            "fragment_samples": self.fragment_samples - 1,
            "learners": self.learners - 1,
            "fill_fragments": self.fill_fragments - 1,
        }
        for key, value in counts.items():
            if value < 0:
                raise ConfigError(f"balance.{key}", getattr(self, key), "a count in range")
        if self.mode is Mode.SYNC and self.producers:
            self._check_sync()

    def _check_sync(self) -> None:
        """Settings under which ``sync`` could never make progress."""
        if self.on_policy and self.batch_fragments != self.producers:
            raise ConfigError(
                "controller.mode",
                "sync",
                f"one fragment per actor per update: a batch of {self.batch_fragments} "
                f"fragments ({self.learners} learner(s)) but actors.count is {self.producers}",
            )
        if self.on_policy and self.publish_interval != 1:
            raise ConfigError(
                "learner.publish_interval",
                self.publish_interval,
                "1 with controller.mode = 'sync' (each round is collected with new weights)",
            )
        round_samples = self.replay_ratio * self.producers * self.fragment_samples
        if not self.on_policy and round_samples < self.batch_samples:
            raise ConfigError(
                "controller.replay_ratio",
                self.replay_ratio,
                f"in sync mode, replay_ratio x actors x fragment ({round_samples:g}) >= the "
                f"batch size {self.batch_samples}, or a round of fragments never allows an update",
            )

    @property
    def batch_fragments(self) -> int:
        """On-policy: fragments consumed per version (one batch of every learner)."""
        return max(1, math.ceil(self.batch_samples / self.fragment_samples))

    @property
    def target(self) -> int:
        """On-policy: the lag a grant's weights may have when its fragment is consumed."""
        return 0 if self.mode is Mode.SYNC else min(self.lag_target, self.max_policy_lag)

    @property
    def outstanding_limit(self) -> int:
        """On-policy: fragments granted and not yet consumed, at most
        ``batch_fragments * (target + 1)``, capped by the rollout buffer's capacity."""
        limit = self.batch_fragments * (self.target + 1)
        if self.buffer_fragments:
            limit = min(limit, max(self.buffer_fragments, self.batch_fragments))
        return limit

    @property
    def staleness_bound(self) -> int | None:
        """The lag beyond which a consumed sample is dropped as stale (None: no bound)."""
        if self.on_policy and self.mode is not Mode.UNBALANCED:
            return self.max_policy_lag
        return None

    @property
    def publish_at_round_end(self) -> bool:
        """Sync off-policy: the learner publishes weights once its round's grant is used up
        (after every update, each actor could send one fragment per update)."""
        return self.mode is Mode.SYNC and not self.on_policy

    @property
    def weights_on_grant(self) -> bool:
        """Producers need weights only once granted: relaxed replay with a bound on the
        producers collecting at once, where most wait for a grant, possibly long, and any
        weights do (``min_version`` 0). Elsewhere a waiting producer is about to need the
        newest weights (on-policy grants ask for them), so it takes every version."""
        return not self.on_policy and self.mode is Mode.RELAXED and self.max_collecting > 0

    @property
    def limits_consumption(self) -> bool:
        """Whether learners get a consumption limit (off-policy, but not unbalanced)."""
        return not self.on_policy and self.mode is not Mode.UNBALANCED


class BalancePolicy:
    """Pure decisions from counters (see the module docstring).

    Usage::

        policy = BalancePolicy(BalanceConfig(on_policy=False, replay_ratio=2.0))
        decision = policy.decide(observation)
        for producer, grant in decision.grants.items():  # send GrantProduction
            ...
    """

    def __init__(self, config: BalanceConfig) -> None:
        self.config = config

    def ratio(self, obs: Observation) -> float | None:
        """consumed / inserted counted from ``min_replay_size`` on, or None before."""
        inserted = obs.inserted - self.config.min_replay_size
        return obs.consumed / inserted if inserted > 0 else None

    def decide(self, obs: Observation) -> Decision:
        cfg = self.config
        if cfg.mode is Mode.UNBALANCED:
            grants = {
                p: Grant(UNLIMITED, 0)
                for p in obs.producer_versions
                if obs.granted.get(p, 0) < UNLIMITED
            }
            return Decision(grants, frozenset(), None, "unbalanced: no limits")
        # sync: the learner never trains while actors collect, and each collects its share
        ledger = Ledger(obs, 0 if cfg.mode is Mode.SYNC else cfg.max_collecting)
        if cfg.on_policy:
            outstanding = self.grant_rollouts(obs, ledger)
            reason = f"{outstanding}/{cfg.outstanding_limit} fragments outstanding"
            return Decision(ledger.new, ledger.idle(), None, reason)
        if cfg.mode is Mode.SYNC:
            limit, reason = self.grant_rounds(obs, ledger)
        else:
            limit, reason = self.grant_inserts(obs, ledger)
        waits = obs.consumed + cfg.batch_samples > limit
        return Decision(ledger.new, ledger.idle(), limit, reason, waits)

    # ------------------------------------------------------------------ on-policy
    def outstanding(self, obs: Observation) -> int:
        """On-policy: fragments granted and neither consumed nor dropped yet: produced and
        somewhere between the producers and the learner's update (``produced - consumed -
        dropped``), plus those granted to live producers and not sent yet."""
        backlog = max(0, obs.produced - obs.consumed - obs.dropped)
        collecting = Ledger(obs, 0).pending_total()
        return math.ceil(backlog / self.config.fragment_samples) + collecting

    def consumed_at(self, obs: Observation, position: int) -> int:
        """The learner version at which the fragment at ``position`` (0: the oldest one not
        yet consumed) will be consumed: ``batch_fragments`` fragments per version."""
        return obs.learner_version + position // self.config.batch_fragments

    def grant_rollouts(self, obs: Observation, ledger: Ledger) -> int:
        """Grant the fragments that fit in :attr:`BalanceConfig.outstanding_limit`, each
        with the weights it needs (``consumed_at(position) - target``, never newer than
        the published ones). Idle producers are chosen first, then those that already hold
        the weights, then those granted least so far (round robin). Relaxed: fewer than one
        batch outstanding is always granted, whatever the weights.

        Returns:
            fragments outstanding after the new grants.
        """
        cfg = self.config
        published = obs.published
        strict = cfg.mode is Mode.SYNC
        position = self.outstanding(obs)
        while ledger.producers and position < cfg.outstanding_limit:
            need = max(0, self.consumed_at(obs, position) - cfg.target)
            if need > published and (strict or position >= cfg.batch_fragments):
                break  # those weights are not out yet: grant when they are
            need = min(need, published)

            def rank(p: str, need: int = need) -> tuple[int, bool, int, str]:
                held, version = ledger.pending_of(p), obs.producer_versions[p]
                return held, version < need, ledger.granted(p), p

            ledger.give(min(ledger.candidates(), key=rank), need)
            position += 1
        return position

    # ------------------------------------------------------------------ off-policy
    def band(self, obs: Observation, producers: int) -> tuple[float, float] | None:
        """The allowed range of ``consumed`` for the inserts so far (None while filling).

        ``inserted * replay_ratio ± error``, as Reverb's limiter: an absolute error buffer
        of ``tolerance`` times one round of inserts (a fragment from every producer), so
        the ratio may stray by ``tolerance`` over a round while over the run it converges
        to ``replay_ratio``; widened by one step of every side, so a side that may move
        never jumps over the band and the two sides are never both held back.
        """
        effective = obs.inserted - self.config.min_replay_size
        if effective <= 0:
            return None
        centre = effective * self.config.replay_ratio
        error = self.error(producers)
        return centre - error, centre + error

    def error(self, producers: int) -> float:
        """The band's half width: ``tolerance`` rounds of inserts, plus one step of each side."""
        cfg = self.config
        round_inserts = max(1, producers) * cfg.fragment_samples
        return (cfg.tolerance + cfg.replay_ratio) * round_inserts + cfg.batch_samples

    def insert_limit(self, obs: Observation) -> float:
        """The most samples that may be inserted for the consumption so far: past it,
        ``consumed`` would fall below the band (Reverb checks each insert so)."""
        cfg = self.config
        error = self.error(len(obs.producer_versions))
        return cfg.min_replay_size + (obs.consumed + error) / cfg.replay_ratio

    def grant_inserts(self, obs: Observation, ledger: Ledger) -> tuple[int, str]:
        """Relaxed off-policy: grant the fragments that fill the warm-up, then those that
        keep ``consumed`` in the band, plus one to every producer while a shard is still
        short past the warm-up; the learners may consume up to the band's upper edge."""
        cfg = self.config
        pending = ledger.pending_total()
        coming = obs.inserted + obs.in_transit
        if obs.inserted < cfg.min_replay_size:
            # the warm-up: the fragments that fill it (the last may pass it), no more, so
            # the learner starts on the warm-up size and not on a round of extra inserts
            room = math.ceil((cfg.min_replay_size - coming) / cfg.fragment_samples)
        else:
            room = math.floor((self.insert_limit(obs) - coming) / cfg.fragment_samples)
        for _ in range(max(0, room - pending)):
            producer = ledger.least_held()
            if producer is None:
                break
            ledger.give(producer, 0)
        if obs.filling and obs.inserted >= cfg.min_replay_size:  # a shard is short
            for p in ledger.candidates():
                if ledger.pending_of(p) <= 0:
                    ledger.give(p, 0)
        band = self.band(obs, len(obs.producer_versions))
        if band is None:
            return obs.consumed, f"filling: {obs.inserted}/{cfg.min_replay_size}"
        reason = f"consumed {obs.consumed} in [{band[0]:.0f}, {band[1]:.0f}]"
        return int(band[1]), reason

    def updates_per_round(self, producers: int) -> int:
        """Sync off-policy: learner updates per round (one fragment of every producer),
        ``replay_ratio`` samples per inserted sample, at least one."""
        cfg = self.config
        round_samples = producers * cfg.fragment_samples * cfg.replay_ratio
        return max(1, round(round_samples / cfg.batch_samples))

    def grant_rounds(self, obs: Observation, ledger: Ledger) -> tuple[int, str]:
        """Sync off-policy. Producers: their warm-up share, then one fragment with each
        published version. The learners: once every producer has sent a fragment with the
        same weights (version ``p``), :meth:`updates_per_round` updates, up to version
        ``p + updates_per_round`` (the grant depends on the producers' version, not on the
        learner's, which moves with every update of the round); then new weights are
        published and the next round starts."""
        cfg = self.config
        versions = obs.producer_versions
        if obs.inserted < cfg.min_replay_size:
            for p in ledger.candidates():
                while ledger.granted(p) < cfg.fill_fragments and p in ledger.candidates():
                    ledger.give(p, 0)
            return obs.consumed, f"sync: filling {obs.inserted}"
        published = obs.published
        for p in ledger.candidates():
            done = versions[p] >= published and obs.fragments_at_version.get(p, 0) >= 1
            if not done and ledger.pending_of(p) <= 0:
                ledger.give(p, published)
        if not versions:
            return obs.consumed, "sync: no producer"
        round_version = min(versions.values())
        sent = all(obs.fragments_at_version.get(p, 0) >= 1 for p in versions)
        left = round_version + self.updates_per_round(len(versions)) - obs.learner_version
        if not sent or left <= 0:
            return obs.consumed, "sync: waiting for every actor"
        limit = obs.consumed + left * cfg.batch_samples
        return limit, f"sync: round of v{round_version}, to {limit}"
