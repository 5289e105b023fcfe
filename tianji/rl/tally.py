"""The heartbeats' totals the balance policy reads (:class:`Tally`), and the lag of the
consumed samples over all learners (:func:`lag_summary`)."""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping
from typing import Any

from tianji.rl.balance import Observation
from tianji.rl.lagstats import LagStats
from tianji.rl.stats import ActorStat, BookStat, BufferStat, LearnerStat
from tianji.runtime.events import Heartbeat

__all__ = ["Tally", "lag_summary"]


class Tally:
    """The totals the balance policy reads, kept per heartbeat instead of summed over every
    service for every decision: :meth:`scan` finds the heartbeats that are new since the
    last scan (an identity check per service) and moves only their part of the totals;
    :meth:`observation` reads the totals (and the per-producer gauges of live actors).

    The sums (``inserted``, ``consumed``, ``dropped``, ``produced``) cover every heartbeat,
    live and retired (``name#k``); the gauges count only live services, as before.
    """

    def __init__(self) -> None:
        self.settled: dict[str, int] = {}  # retired name -> samples lost on the way to it
        self._reset()

    def _reset(self) -> None:
        self._seen: dict[str, Heartbeat] = {}
        self._parts: dict[str, tuple[int, int, int, int]] = {}
        self.inserted = self.consumed = self.dropped = self.produced = 0
        self.buffers: dict[str, bool] = {}  # buffer -> still filling
        self.learners: dict[str, tuple[int, int | None]] = {}  # -> (updates, params version)
        self.learner_consumed: dict[str, int] = {}  # learner (and retired ones, name#k)
        self.actors: dict[str, tuple[int, int, int]] = {}  # -> (version, at it, sent)
        self.streams: dict[str, dict[str, float]] = {}  # actor -> samples sent per stream
        self.offsets: dict[str, dict[str, float]] = {}  # buffer -> "actor/stream" -> offset

    def scan(self, heartbeats: Mapping[str, Heartbeat]) -> None:
        """Take in the heartbeats that changed since the last scan."""
        seen = self._seen
        for name, hb in heartbeats.items():
            if seen.get(name) is not hb:
                self._take(name, hb)
        if len(seen) != len(heartbeats):  # one went without forget(): start over
            self._reset()
            for name, hb in heartbeats.items():
                self._take(name, hb)

    def remove(self, name: str) -> None:
        """``name``'s heartbeat is gone (it is counted again under its retired name)."""
        part = self._parts.pop(name, None)
        self._seen.pop(name, None)
        if part is not None:
            self._add(part, -1)
        self.buffers.pop(name, None)
        self.learners.pop(name, None)
        self.learner_consumed.pop(name, None)
        self.actors.pop(name, None)
        self.streams.pop(name, None)

    def retired_consumed(self, name: str) -> int:
        """Samples consumed by the earlier incarnations of learner ``name`` (``name#k``,
        see Controller.retire)."""
        prefix = f"{name}#"
        return sum(n for k, n in self.learner_consumed.items() if k.startswith(prefix))

    def _take(self, name: str, hb: Heartbeat) -> None:
        old = self._parts.get(name)
        if old is not None:
            self._add(old, -1)
        c = hb.counters
        dropped = _dropped(hb)
        if hb.role == "buffer":
            part = (c.get(BufferStat.SAMPLES_INSERTED, 0), 0, dropped, 0)
            self.buffers[name] = hb.gauges.get(BufferStat.READY, 1.0) < 1.0
            self.offsets[name] = _prefixed(hb.gauges, BookStat.RECV)
        elif hb.role == "learner":
            part = (0, c.get(LearnerStat.SAMPLES_CONSUMED, 0), dropped, 0)
            params = hb.gauges.get(LearnerStat.PARAMS_VERSION)
            updates = c.get(LearnerStat.LEARNER_UPDATES, 0)
            self.learners[name] = (updates, None if params is None else int(params))
            self.learner_consumed[name] = part[1]
        elif hb.role == "actor":
            part = (0, 0, dropped, c.get(ActorStat.SAMPLES_PRODUCED, 0))
            self.actors[name] = (
                int(hb.gauges.get(ActorStat.POLICY_VERSION, -1)),
                int(hb.gauges.get(ActorStat.FRAGMENTS_AT_VERSION, 0)),
                int(c.get(ActorStat.FRAGMENTS_SENT, 0)),
            )
            self.streams[name] = _prefixed(hb.gauges, BookStat.SENT)
        else:
            part = (0, 0, 0, 0)
        self._parts[name] = part
        self._seen[name] = hb
        self._add(part, 1)

    def _add(self, part: tuple[int, int, int, int], sign: int) -> None:
        self.inserted += sign * part[0]
        self.consumed += sign * part[1]
        self.dropped += sign * part[2]
        self.produced += sign * part[3]

    def observation(
        self, live: Mapping[str, Any], granted: Mapping[str, int] | None = None
    ) -> Observation:
        """The policy's view: the totals, and the gauges of the live services (a producer
        counts from its first heartbeat since it registered: until then the last one may
        be an earlier incarnation's)."""
        version, params = 0, None
        for name, (updates, published) in self.learners.items():
            version = max(version, updates)
            if published is not None and name in live:
                params = max(params or 0, published)
        filling = any(f and name in live for name, f in self.buffers.items())
        versions: dict[str, int] = {}
        fragments: dict[str, int] = {}
        sent: dict[str, int] = {}
        for name, (v, f, s) in self.actors.items():
            record = live.get(name)
            if record is not None and getattr(record, "last_heartbeat", True) is not None:
                versions[name], fragments[name], sent[name] = v, f, s
        return Observation(
            in_transit=self.in_transit(versions),
            inserted=self.inserted,
            consumed=self.consumed,
            dropped=self.dropped + sum(self.settled.values()),
            learner_version=version,
            producer_versions=versions,
            fragments_at_version=fragments,
            filling=filling,
            produced=self.produced,
            fragments_sent=sent,
            granted={p: granted.get(p, 0) for p in versions} if granted else {},
            params_version=params,
        )

    def in_transit(self, actors: Iterable[str]) -> int:
        """Samples the live ``actors`` sent that no buffer has received yet: per stream,
        what the actor reports sent beyond the furthest offset a buffer reports (a stream
        a buffer joined late, or with a gap, counts from where it has it)."""
        total = 0.0
        for actor in actors:
            for stream, sent in self.streams.get(actor, {}).items():
                key = f"{actor}/{stream}"
                have = max((o.get(key, 0.0) for o in self.offsets.values()), default=0.0)
                total += max(0.0, sent - have)
        return int(total)


def _prefixed(values: Mapping[str, float], prefix: str) -> dict[str, float]:
    return {k[len(prefix) :]: v for k, v in values.items() if k.startswith(prefix)}


def _dropped(hb: Heartbeat) -> int:
    return sum(v for k, v in hb.counters.items() if k.startswith("dropped/"))


def lag_summary(heartbeats: Mapping[str, Heartbeat]) -> dict[str, float] | None:
    """Policy lag of consumed samples over all learners: mean, p50, p95, max."""
    counts: collections.Counter[int] = collections.Counter()
    total = peak = 0
    for hb in heartbeats.values():
        if hb.role != "learner":
            continue
        for key, value in hb.counters.items():
            if key.startswith(LearnerStat.LAG_PREFIX):
                counts[int(key.split("/", 1)[1])] += value
        total += hb.counters.get(LearnerStat.LAG_SUM, 0)
        peak = max(peak, hb.counters.get(LearnerStat.LAG_MAX, 0))
    return LagStats.summarize(dict(counts), total, peak)
