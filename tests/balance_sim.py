"""A discrete-event simulation of an on-policy run, driven by the real balance policy.

It models what the live services do, with the delays between them: actors (collect a
fragment with the weights they hold when it starts, obey pauses, production grants and
weights), the rollout buffer (FIFO of fragments with a capacity that evicts the oldest,
drops the stale ones before it serves, sends only the batches a learner asked for), the
learner (drops a batch that went stale in flight, trains, publishes weights, asks for the
next batch) and the controller (decides with :class:`tianji.rl.balance.BalancePolicy` on
each heartbeat as it arrives, its commands arrive later). Heartbeats are sent on every
change and every second; every link delivers in order after its fixed delay.

The policy module is a parameter, so the same simulation can run an older policy (the
test of the freeze does).
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
from collections.abc import Callable
from types import ModuleType
from typing import Any


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SimParams:
    actors: int = 2
    envs_per_actor: int = 4
    fragment_length: int = 64
    fragments_per_batch: int = 2
    lag_target: int = 1
    max_policy_lag: int = 2
    buffer_capacity: int = 8
    """Fragments the rollout buffer keeps."""
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


@dataclasses.dataclass(slots=True)
class SimResult:
    produced: int = 0
    consumed: int = 0
    stale: int = 0
    evicted: int = 0
    updates: int = 0
    lags: collections.Counter[int] = dataclasses.field(default_factory=collections.Counter)
    longest_gap: float = 0.0
    """Longest time without an update (including the start and the end)."""
    paused_actor_s: float = 0.0

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
        self.paused = False
        self.grant_limit = 0
        self.grant_min = 0
        self.sent_at_version = 0
        self.idle_since: float | None = 0.0


class Simulation:
    """Run with :meth:`run`; see the module docstring."""

    def __init__(self, params: SimParams, balance: ModuleType) -> None:
        self.p = params
        self.balance = balance
        frag = params.fragment_samples
        fields = {f.name for f in dataclasses.fields(balance.BalanceConfig)}
        config: dict[str, Any] = dict(
            on_policy=True,
            max_policy_lag=params.max_policy_lag,
            lag_target=params.lag_target,
            batch_samples=params.fragments_per_batch * frag,
            fragment_samples=frag,
            buffer_fragments=params.buffer_capacity,
        )
        self.policy = balance.BalancePolicy(
            balance.BalanceConfig(**{k: v for k, v in config.items() if k in fields})
        )
        self._obs_fields = {f.name for f in dataclasses.fields(balance.Observation)}
        self._granted_mode = "buffer_fragments" in fields  # the policy grants production
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
        self.batches: collections.deque[list[tuple[int, int]]] = collections.deque()
        self.training = False
        self.learner_requested = 0
        self.consumed = 0
        self.learner_dropped = 0
        # controller: latest heartbeats as it sees them, its own grant records
        self.seen: dict[str, dict[str, Any]] = {}
        self.granted: dict[str, int] = {}
        self.paused: set[str] = set()
        self.result = SimResult()
        self._last_update = 0.0
        self._decision_due = False

    # ----------------------------------------------------------------- event plumbing
    def at(self, delay: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._queue, (self.now + delay, next(self._seq), action))

    def run(self) -> SimResult:
        self.at(0.0, self._publish_weights)
        for name in self.actors:
            self._beat(name)
        self._beat("buffer")
        self._beat("learner")
        self.at(0.0, lambda: self._learner_request(self.p.prefetch))
        self.at(self.p.heartbeat_every, self._periodic)
        while self._queue and self._queue[0][0] <= self.p.seconds:
            self.now, _, action = heapq.heappop(self._queue)
            action()
        self.now = self.p.seconds
        r = self.result
        r.produced = sum(a.produced for a in self.actors.values())
        r.consumed = self.consumed
        r.updates = self.version
        r.longest_gap = max(r.longest_gap, self.now - self._last_update)
        for actor in self.actors.values():
            if actor.idle_since is not None:
                r.paused_actor_s += self.now - actor.idle_since
        return r

    def _periodic(self) -> None:
        for name in self.actors:
            self._beat(name)
        self._beat("buffer")
        self._beat("learner")
        self.at(self.p.heartbeat_every, self._periodic)

    # ----------------------------------------------------------------- heartbeats
    def _beat(self, name: str) -> None:
        """Send ``name``'s counters as they are now; the controller decides on arrival."""
        if name == "buffer":
            state = {"role": "buffer", "inserted": self.inserted, "dropped": self.buffer_dropped}
        elif name == "learner":
            state = {
                "role": "learner",
                "consumed": self.consumed,
                "dropped": self.learner_dropped,
                "version": self.version,
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
        obs: dict[str, Any] = dict(
            inserted=buffer.get("inserted", 0),
            consumed=learner.get("consumed", 0),
            dropped=buffer.get("dropped", 0) + learner.get("dropped", 0),
            learner_version=learner.get("version", 0),
            producer_versions={n: s["version"] for n, s in actors.items()},
            fragments_at_version={n: s["at_version"] for n, s in actors.items()},
            produced=sum(s["produced"] for s in actors.values()),
            fragments_sent={n: s["sent"] for n, s in actors.items()},
            granted={n: self.granted.get(n, 0) for n in actors},
            params_version=learner.get("version", 0),
        )
        observation = self.balance.Observation(
            **{k: v for k, v in obs.items() if k in self._obs_fields}
        )
        decision = self.policy.decide(observation)
        grants = getattr(decision, "grants", None)
        if grants is not None:
            for name, grant in grants.items():
                self.granted[name] = grant.limit
                self.at(self.p.command_delay, self._granted(name, grant.limit, grant.min_version))
            return
        for name in sorted(set(decision.paused) - self.paused):
            self.paused.add(name)
            self.at(self.p.command_delay, self._paused(name, True))
        for name in sorted(self.paused - set(decision.paused)):
            self.paused.discard(name)
            self.at(self.p.command_delay, self._paused(name, False))

    # ----------------------------------------------------------------- actors
    def _granted(self, name: str, limit: int, min_version: int) -> Callable[[], None]:
        def apply() -> None:
            a = self.actors[name]
            if limit >= a.grant_limit:
                a.grant_limit, a.grant_min = limit, min_version
            self._try_start(a)

        return apply

    def _paused(self, name: str, paused: bool) -> Callable[[], None]:
        def apply() -> None:
            a = self.actors[name]
            a.paused = paused
            self._try_start(a)

        return apply

    def _must_wait(self, a: _Actor) -> bool:
        if a.version < 0 or a.paused:
            return True
        return self._granted_mode and (a.sent >= a.grant_limit or a.version < a.grant_min)

    def _try_start(self, a: _Actor) -> None:
        if a.collecting:
            return
        if a.latest > a.version:  # weights are applied between fragments
            a.version = a.latest
            a.sent_at_version = 0
            self._beat(a.name)
        if self._must_wait(a):
            if a.idle_since is None:
                a.idle_since = self.now
            return
        if a.idle_since is not None:
            self.result.paused_actor_s += self.now - a.idle_since
            a.idle_since = None
        a.collecting = True
        version = a.version

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
        version = self.version
        self.at(self.p.weights_delay, lambda: self._weights_arrive(version))

    # ----------------------------------------------------------------- buffer
    def _insert(self, version: int, n: int) -> None:
        if len(self.fifo) == self.p.buffer_capacity:
            _, lost = self.fifo.popleft()
            self.buffer_dropped += lost
            self.result.evicted += lost
        self.fifo.append((version, n))
        self.inserted += n
        self._serve()
        self._beat("buffer")

    def _serve(self) -> None:
        k = self.p.fragments_per_batch
        while self.requested > self.served:
            oldest = self.buffer_learner_version - self.p.max_policy_lag
            while self.fifo and self.fifo[0][0] < oldest:
                _, lost = self.fifo.popleft()
                self.buffer_dropped += lost
                self.result.stale += lost
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

    def _batch_arrives(self, batch: list[tuple[int, int]]) -> None:
        self.batches.append(batch)
        self._learn()

    def _learn(self) -> None:
        while not self.training and self.batches:
            batch = self.batches.popleft()
            n = sum(size for _, size in batch)
            lags = [self.version - v for v, _ in batch]
            if max(lags) > self.p.max_policy_lag:  # went stale in flight
                self.learner_dropped += n
                self.result.stale += n
                self._learner_request(1)
                self._beat("learner")
                continue
            for (_, size), lag in zip(batch, lags, strict=True):
                self.result.lags[lag] += size
            self.training = True

            def done(n: int = n) -> None:
                self.training = False
                self.version += 1
                self.consumed += n
                self.result.longest_gap = max(self.result.longest_gap, self.now - self._last_update)
                self._last_update = self.now
                self._publish_weights()
                self._learner_request(1)
                self._beat("learner")
                self._learn()

            self.at(self.p.train_s, done)
