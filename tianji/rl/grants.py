"""What the balance policy reads and says (:class:`Observation`, :class:`Grant`,
:class:`Decision`), and the producers' grants while one decision hands out fragments
(:class:`Ledger`). :mod:`tianji.rl.balance` holds the policy itself."""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from typing import TypeVar

__all__ = ["Decision", "Grant", "Idle", "Ledger", "Observation"]

_S = TypeVar("_S")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Observation:
    """Cumulative counters as last reported in heartbeats. The per-producer maps may be
    the controller's running ones (:meth:`~tianji.rl.tally.Tally.decision_view`): a policy
    reads them while it decides and neither changes nor keeps them.

    Attributes:
        inserted: samples inserted into buffers.
        consumed: samples consumed by learners.
        dropped: samples dropped for any reason (they are no longer buffered).
        learner_version: the learner's policy version.
        producer_versions: each live producer's current policy version.
        fragments_at_version: fragments each producer sent with its current version.
        filling: some replay buffer (shard) cannot hand out a batch yet; every producer
            keeps a grant then, or a shard whose actors started late could stay short for
            good while its learner holds the others at the gradient all-reduce.
        produced: samples produced by all producers (dead incarnations included).
        fragments_sent: fragments each live producer sent (its current incarnation).
        granted: each live producer's grant limit so far (the controller's own record).
        params_version: the newest policy version published to producers (``None``: the
            learner's version).
        in_transit: samples live producers sent that no buffer has received yet.
        pending: the live producers whose grant exceeds what they sent, and by how many
            fragments (``None``: derived from ``granted`` and ``fragments_sent``; the
            controller's tally keeps it up to date, so a decision need not walk every
            producer).
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
    in_transit: int = 0
    pending: dict[str, int] | None = dataclasses.field(default=None, compare=False)

    @property
    def published(self) -> int:
        return self.learner_version if self.params_version is None else self.params_version


@dataclasses.dataclass(frozen=True, slots=True)
class Grant:
    """A producer may have sent ``limit`` fragments in all (cumulative for its
    incarnation) and starts each one only with weights of ``min_version`` or newer."""

    limit: int
    min_version: int


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    """What the producers and learners may do now.

    Attributes:
        grants: the producers whose grant this decision raises (or sets), and the grant.
        idle: producers left with nothing granted to collect (a set; :class:`Idle` when
            the policy's ledger made it).
        consume_limit: the cumulative ``consumed`` count the learners may reach (``None``:
            unlimited).
        reason: a human-readable explanation (logged on changes).
    """

    grants: dict[str, Grant]
    idle: AbstractSet[str]
    consume_limit: int | None
    reason: str
    learner_waits: bool = False
    """The learners may not start their next update now (``consumed + batch_samples >
    consume_limit``)."""


class Ledger:
    """The producers' grants while one decision hands out fragments: who holds how many
    not yet sent (``pending``, only those holding some), and the bound on producers
    collecting at once. Producers nobody touches are read from the observation on demand,
    so a decision that grants little costs little however many producers there are."""

    def __init__(self, obs: Observation, cap: int) -> None:
        self.cap = cap
        self.producers = obs.producer_versions
        self._sent = obs.fragments_sent
        self._granted = obs.granted
        self._given: dict[str, int] = {}  # producer -> its limit after this decision's grants
        pending = obs.pending
        if pending is None:
            pending = {p: self.granted(p) - self.sent(p) for p in self.producers}
        self.pending = {p: n for p, n in pending.items() if n > 0 and p in self.producers}
        self.new: dict[str, Grant] = {}
        self._heap: list[tuple[int, int, str]] | None = None  # (pending, granted, producer)
        self._order: list[str] | None = None  # the producers by name

    def sent(self, producer: str) -> int:
        return self._sent.get(producer, 0)

    def granted(self, producer: str) -> int:
        """The producer's grant limit now (never below what it sent)."""
        given = self._given.get(producer)
        if given is not None:
            return given
        return max(self._granted.get(producer, 0), self._sent.get(producer, 0))

    def pending_of(self, producer: str) -> int:
        return self.pending.get(producer, 0)

    def pending_total(self) -> int:
        return sum(self.pending.values())

    def capped(self) -> bool:
        """``cap`` producers collect already: only they may take more."""
        return bool(self.cap) and len(self.pending) >= self.cap

    def candidates(self) -> list[str]:
        """Producers that may take one more fragment: any, or only those collecting
        already when ``cap`` producers are (sorted by name)."""
        if self.capped():
            return sorted(self.pending)
        if self._order is None:
            self._order = sorted(self.producers)
        return self._order

    def least_held(self) -> str | None:
        """The candidate holding the fewest fragments not yet sent, then granted least,
        then first by name (a heap over every producer, built on first use)."""
        if self.capped():
            return min(self.pending, key=lambda p: (self.pending[p], self.granted(p), p))
        if self._heap is None:
            self._heap = [(self.pending_of(p), self.granted(p), p) for p in self.producers]
            heapq.heapify(self._heap)
        while self._heap:
            held, granted, p = self._heap[0]
            if (held, granted) == (self.pending_of(p), self.granted(p)):
                return p
            heapq.heapreplace(self._heap, (self.pending_of(p), self.granted(p), p))
        return None

    def give(self, producer: str, min_version: int) -> None:
        self._given[producer] = self.granted(producer) + 1
        self.pending[producer] = self.pending_of(producer) + 1
        # One grant covers all of a producer's unstarted fragments: within a decision its
        # min_version only rises. Across decisions it is not floored at the last grant's: a
        # learner resumed from a checkpoint publishes lower versions again.
        before = self.new.get(producer)
        floor = before.min_version if before is not None else 0
        self.new[producer] = Grant(self._given[producer], max(min_version, floor))

    def idle(self) -> Idle:
        return Idle(self.producers, self.pending)


class Idle(AbstractSet[str]):
    """The producers with nothing granted to collect: ``producers`` but for those
    ``holding`` fragments not yet sent. A decision's idle producers are counted (the
    controller's gauge after every decision) in O(holding) and listed only when read
    (its metrics, every few seconds): a frozenset of a thousand producers per decision
    cost a fifth of a decision at 1,000 services. ``holding`` is the decision's own;
    ``producers`` is read as it is when the members are listed."""

    __slots__ = ("_holding", "_members", "_producers")

    def __init__(self, producers: Mapping[str, object], holding: Mapping[str, int]) -> None:
        self._producers = producers
        self._holding = holding
        self._members: frozenset[str] | None = None

    def members(self) -> frozenset[str]:
        if self._members is None:
            every = frozenset(self._producers)
            self._members = every.difference(self._holding) if self._holding else every
        return self._members

    def __len__(self) -> int:
        if self._members is not None:
            return len(self._members)
        producers = self._producers
        return len(producers) - sum(1 for p in self._holding if p in producers)

    def __contains__(self, name: object) -> bool:
        if self._members is not None:  # once listed, it answers as listed
            return name in self._members
        return name in self._producers and name not in self._holding

    def __iter__(self) -> Iterator[str]:
        return iter(self.members())

    def __repr__(self) -> str:
        return f"Idle({sorted(self.members())!r})"

    @classmethod
    def _from_iterable(cls, it: Iterable[_S]) -> AbstractSet[_S]:  # ``idle - {name}``, ...
        return frozenset(it)
