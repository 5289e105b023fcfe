"""A discrete-event simulation of a run, driven by the real balance policy, in every mode.

It models what the live services do, with the delays between them: actors (collect a
fragment with the weights they hold when it starts, obey production grants and weights),
the buffer (on-policy: a FIFO of fragments with a capacity that evicts the oldest, drops
the stale ones before it serves, sends only the batches a learner asked for; off-policy: a
replay that inserts every fragment and samples a batch for each request once it holds the
warm-up), the learner (drops an on-policy batch that went stale in flight, waits for its
consumption grant, trains, publishes weights, asks for the next batch) and the controller
(decides with :class:`tianji.rl.balance.BalancePolicy` on each heartbeat as it arrives; its
commands arrive later). Heartbeats are sent on every change and every second; every link
delivers in order after its fixed delay.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
from collections.abc import Callable
from typing import Any

from tianji.rl import balance


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SimParams:
    mode: str = "relaxed"
    on_policy: bool = True
    actors: int = 2
    envs_per_actor: int = 4
    fragment_length: int = 64
    fragments_per_batch: int = 2
    """On-policy: fragments per update."""
    lag_target: int = 1
    max_policy_lag: int = 2
    buffer_capacity: int = 8
    """On-policy: fragments the rollout buffer keeps."""
    batch_samples: int = 64
    """Off-policy: samples per update."""
    replay_ratio: float = 2.0
    tolerance: float = 1.0
    min_replay_size: int = 0
    publish_interval: int = 1
    """Off-policy relaxed: updates between two weight publications."""
    max_collecting: int = 0
    prefetch: int = 1
    collect_s: float = 0.02
    """Seconds one actor takes for one fragment."""
    train_s: float = 0.05
    """Seconds one learner update takes."""
    heartbeat_delay: float = 0.002
    command_delay: float = 0.002
    weights_delay: float = 0.005
    """Learner -> params service -> actor."""
    data_delay: float = 0.002
    """Actor -> buffer -> learner, and the learner's requests back."""
    heartbeat_every: float = 1.0
    seconds: float = 30.0

    @property
    def fragment_samples(self) -> int:
        return self.fragment_length * self.envs_per_actor

    @property
    def update_samples(self) -> int:
        return (
            self.fragments_per_batch * self.fragment_samples
            if self.on_policy
            else self.batch_samples
        )

    def balance_config(self) -> balance.BalanceConfig:
        frag = self.fragment_samples
        fill = max(1, -(-self.min_replay_size // (self.actors * frag)))
        return balance.BalanceConfig(
            mode=self.mode,
            on_policy=self.on_policy,
            max_policy_lag=self.max_policy_lag,
            lag_target=self.lag_target,
            batch_samples=self.update_samples,
            fragment_samples=frag,
            buffer_fragments=self.buffer_capacity if self.on_policy else 0,
            replay_ratio=self.replay_ratio,
            tolerance=self.tolerance,
            min_replay_size=0 if self.on_policy else self.min_replay_size,
            fill_fragments=fill,
            max_collecting=self.max_collecting,
            producers=self.actors,
            publish_interval=1 if self.on_policy else self.publish_interval,
        )


@dataclasses.dataclass(slots=True)
class SimResult:
    produced: int = 0
    inserted: int = 0
    consumed: int = 0
    stale: int = 0
    evicted: int = 0
    updates: int = 0
    lags: collections.Counter[int] = dataclasses.field(default_factory=collections.Counter)
    longest_gap: float = 0.0
    """Longest time without an update (including the start and the end)."""
    paused_actor_s: float = 0.0
    most_collecting: int = 0
    """Most actors collecting at one moment."""
    inserted_at_first_update: int | None = None
    above_band: int = 0
    """Off-policy updates that took ``consumed`` above the band's upper edge."""
    fragments_per_version: collections.Counter[tuple[str, int]] = dataclasses.field(
        default_factory=collections.Counter
    )
    """(actor, weights version) -> fragments collected with them."""

    @property
    def wasted(self) -> int:
        return self.stale + self.evicted


class _Actor:
    def __init__(self, name: str) -> None:
        self.name = name
        self.version = -1
        self.latest = -1  # newest weights received
        self.sent = 0
        self.produced = 0
        self.collecting = False
        self.grant_limit = 0
        self.grant_min = 0
        self.sent_at_version = 0
        self.idle_since: float | None = 0.0


class Simulation:
    """Run with :meth:`run`; see the module docstring."""

    def __init__(self, params: SimParams) -> None:
        self.p = params
        self.policy = balance.BalancePolicy(params.balance_config())
        self.now = 0.0
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self.actors = {f"actor-{i}": _Actor(f"actor-{i}") for i in range(params.actors)}
        # buffer
        self.fifo: collections.deque[tuple[int, int]] = collections.deque()  # (version, n)
        self.inserted = 0
        self.buffer_dropped = 0
        self.requested = 0
        self.served = 0
        self.buffer_learner_version = 0
        # learner
        self.version = 0
        self.published = 0
        self.batches: collections.deque[list[tuple[int, int]]] = collections.deque()
        self.training = False
        self.learner_requested = 0
        self.consumed = 0
        self.learner_dropped = 0
        self.consume_limit: int | None = None
        # controller: latest heartbeats as it sees them, its own grant records
        self.seen: dict[str, dict[str, Any]] = {}
        self.granted: dict[str, int] = {}
        self.sent_limit: int | None = None
        self.result = SimResult()
        self._last_update = 0.0
        self._decision_due = False

    # ----------------------------------------------------------------- event plumbing
    def at(self, delay: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._queue, (self.now + delay, next(self._seq), action))

    def run(self) -> SimResult:
        self.at(0.0, self._publish_weights)
        self._beat_all()
        self.at(0.0, lambda: self._learner_request(self.p.prefetch))
        self.at(self.p.heartbeat_every, self._periodic)
        while self._queue and self._queue[0][0] <= self.p.seconds:
            self.now, _, action = heapq.heappop(self._queue)
            action()
        self.now = self.p.seconds
        r = self.result
        r.produced = sum(a.produced for a in self.actors.values())
        r.inserted = self.inserted
        r.consumed = self.consumed
        r.updates = self.version
        r.longest_gap = max(r.longest_gap, self.now - self._last_update)
        for actor in self.actors.values():
            if actor.idle_since is not None:
                r.paused_actor_s += self.now - actor.idle_since
        return r

    def _beat_all(self) -> None:
        for name in self.actors:
            self._beat(name)
        self._beat("buffer")
        self._beat("learner")

    def _periodic(self) -> None:
        self._beat_all()
        self.at(self.p.heartbeat_every, self._periodic)

    # ----------------------------------------------------------------- heartbeats
    def _beat(self, name: str) -> None:
        """Send ``name``'s counters as they are now; the controller decides on arrival."""
        if name == "buffer":
            state = {
                "role": "buffer",
                "inserted": self.inserted,
                "dropped": self.buffer_dropped,
                "filling": not self.p.on_policy and self.inserted < self.p.min_replay_size,
            }
        elif name == "learner":
            state = {
                "role": "learner",
                "consumed": self.consumed,
                "dropped": self.learner_dropped,
                "version": self.version,
                "published": self.published,
            }
        else:
            a = self.actors[name]
            state = {
                "role": "actor",
                "version": a.version if a.version >= 0 else a.latest,
                "sent": a.sent,
                "produced": a.produced,
                "at_version": a.sent_at_version,
            }

        def arrive() -> None:
            self.seen[name] = state
            if not self._decision_due:  # like the controller: one decision for a burst
                self._decision_due = True
                self.at(0.0, self._decide)

        self.at(self.p.heartbeat_delay, arrive)

    def _decide(self) -> None:
        self._decision_due = False
        beats = self.seen
        buffer, learner = beats.get("buffer", {}), beats.get("learner", {})
        actors = {n: s for n, s in beats.items() if s["role"] == "actor"}
        obs = balance.Observation(
            inserted=buffer.get("inserted", 0),
            consumed=learner.get("consumed", 0),
            dropped=buffer.get("dropped", 0) + learner.get("dropped", 0),
            learner_version=learner.get("version", 0),
            producer_versions={n: s["version"] for n, s in actors.items()},
            fragments_at_version={n: s["at_version"] for n, s in actors.items()},
            filling=buffer.get("filling", False),
            produced=sum(s["produced"] for s in actors.values()),
            fragments_sent={n: s["sent"] for n, s in actors.items()},
            granted={n: self.granted.get(n, 0) for n in actors},
            params_version=learner.get("published", 0),
            in_transit=max(
                0, sum(s["produced"] for s in actors.values()) - buffer.get("inserted", 0)
            ),
        )
        decision = self.policy.decide(obs)
        for name, grant in decision.grants.items():
            self.granted[name] = grant.limit
            self.at(self.p.command_delay, self._granted(name, grant.limit, grant.min_version))
        limit = decision.consume_limit
        if self.policy.config.limits_consumption and limit is not None and limit != self.sent_limit:
            self.sent_limit = limit
            self.at(self.p.command_delay, lambda: self._consume_grant(limit))

    # ----------------------------------------------------------------- actors
    def _granted(self, name: str, limit: int, min_version: int) -> Callable[[], None]:
        def apply() -> None:
            a = self.actors[name]
            a.grant_limit, a.grant_min = limit, min_version  # the newest grant holds
            self._try_start(a)

        return apply

    def _try_start(self, a: _Actor) -> None:
        if a.collecting:
            return
        if a.sent >= a.grant_limit or a.latest < max(a.grant_min, 0):
            if a.idle_since is None:
                a.idle_since = self.now
            return
        if a.latest > a.version:  # weights are loaded when a fragment starts
            a.version = a.latest
            a.sent_at_version = 0
            self._beat(a.name)
        if a.idle_since is not None:
            self.result.paused_actor_s += self.now - a.idle_since
            a.idle_since = None
        a.collecting = True
        collecting = sum(x.collecting for x in self.actors.values())
        self.result.most_collecting = max(self.result.most_collecting, collecting)
        version = a.version
        self.result.fragments_per_version[(a.name, version)] += 1

        def finish() -> None:
            a.collecting = False
            n = self.p.fragment_samples
            a.produced += n
            a.sent += 1
            a.sent_at_version += 1
            self.at(self.p.data_delay, lambda: self._insert(version, n))
            self._beat(a.name)
            self._try_start(a)

        self.at(self.p.collect_s, finish)

    def _weights_arrive(self, version: int) -> None:
        for a in self.actors.values():
            a.latest = max(a.latest, version)
            self._try_start(a)

    def _publish_weights(self) -> None:
        version = self.published = self.version
        self._beat("learner")
        self.at(self.p.weights_delay, lambda: self._weights_arrive(version))

    # ----------------------------------------------------------------- buffer
    def _insert(self, version: int, n: int) -> None:
        self.inserted += n
        if self.p.on_policy:
            if len(self.fifo) == self.p.buffer_capacity:
                _, lost = self.fifo.popleft()
                self.buffer_dropped += lost
                self.result.evicted += lost
            self.fifo.append((version, n))
        self._serve()
        self._beat("buffer")

    def _serve(self) -> None:
        while self.requested > self.served:
            if not self.p.on_policy:  # replay: a sampled batch once the warm-up is in
                if self.inserted < self.p.min_replay_size:
                    return
                self.served += 1
                batch = [(self.version, self.p.batch_samples)]
                self.at(self.p.data_delay, lambda b=batch: self._batch_arrives(b))  # type: ignore[misc]
                continue
            bound = self.policy.config.staleness_bound
            oldest = self.buffer_learner_version - bound if bound is not None else -(1 << 30)
            while self.fifo and self.fifo[0][0] < oldest:
                _, lost = self.fifo.popleft()
                self.buffer_dropped += lost
                self.result.stale += lost
            k = self.p.fragments_per_batch
            if len(self.fifo) < k:
                return
            batch = [self.fifo.popleft() for _ in range(k)]
            self.served += 1
            self.at(self.p.data_delay, lambda b=batch: self._batch_arrives(b))  # type: ignore[misc]
        self._beat("buffer")

    def _buffer_request(self, count: int, version: int) -> None:
        self.requested = max(self.requested, count)
        self.buffer_learner_version = max(self.buffer_learner_version, version)
        self._serve()

    # ----------------------------------------------------------------- learner
    def _learner_request(self, more: int) -> None:
        self.learner_requested += more
        count, version = self.learner_requested, self.version
        self.at(self.p.data_delay, lambda: self._buffer_request(count, version))

    def _consume_grant(self, limit: int) -> None:
        self.consume_limit = limit
        self._learn()

    def _batch_arrives(self, batch: list[tuple[int, int]]) -> None:
        self.batches.append(batch)
        self._learn()

    def _may_consume(self, n: int) -> bool:
        if not self.policy.config.limits_consumption:
            return True
        return self.consume_limit is not None and self.consumed + n <= self.consume_limit

    def _learn(self) -> None:
        while not self.training and self.batches:
            n = sum(size for _, size in self.batches[0])
            if not self._may_consume(n):
                if self.policy.config.publish_at_round_end and self.published != self.version:
                    self._publish_weights()  # the round's updates are done
                return
            batch = self.batches.popleft()
            lags = [self.version - v for v, _ in batch]
            bound = self.policy.config.staleness_bound
            if bound is not None and max(lags) > bound:  # went stale in flight
                self.learner_dropped += n
                self.result.stale += n
                self._learner_request(1)
                self._beat("learner")
                continue
            if self.p.on_policy:
                for (_, size), lag in zip(batch, lags, strict=True):
                    self.result.lags[lag] += size
            if self.result.inserted_at_first_update is None:
                self.result.inserted_at_first_update = self.inserted
            self.training = True
            self.at(self.p.train_s, lambda n=n: self._trained(n))  # type: ignore[misc]

    def _trained(self, n: int) -> None:
        self.training = False
        self.version += 1
        self.consumed += n
        if not self.p.on_policy:
            band = self.policy.band(
                balance.Observation(inserted=self.inserted, consumed=0), self.p.actors
            )
            if band is not None and self.consumed > band[1]:
                self.result.above_band += 1
        self.result.longest_gap = max(self.result.longest_gap, self.now - self._last_update)
        self._last_update = self.now
        every = 1 if self.p.on_policy else self.p.publish_interval
        if not self.policy.config.publish_at_round_end and self.version % every == 0:
            self._publish_weights()
        self._learner_request(1)
        self._beat("learner")
        self._learn()
