"""The heartbeats' totals the balance policy reads (:class:`Tally`), and the lag of the
consumed samples over all learners (:func:`lag_summary`)."""

from __future__ import annotations

import collections
from collections.abc import Collection, Mapping
from typing import Any

from tianji.rl.balance import Observation
from tianji.rl.lagstats import LagStats
from tianji.rl.stats import ActorStat, BookStat, BufferStat, LearnerStat
from tianji.runtime.events import Heartbeat
from tianji.runtime.registry import Stamp, stamp, unchanged

__all__ = ["Tally", "lag_summary"]


class Tally:
    """The totals the balance policy reads, kept per heartbeat instead of summed over every
    service for every decision: :meth:`scan` finds the heartbeats that are new since the
    last scan (from the controller's change log, else an identity check per service) and
    moves only their part of the totals and of the per-producer views (version, fragments,
    samples in transit); :meth:`observation` hands those views out, so a decision costs
    O(changed heartbeats) Python work plus dict copies, not a walk over every stream of
    every actor.

    The sums (``inserted``, ``consumed``, ``dropped``, ``produced``) cover every heartbeat,
    live and retired (``name#k``); the gauges count only live services, as before.
    """

    def __init__(self) -> None:
        self.settled: dict[str, int] = {}  # retired name -> samples lost on the way to it
        self.granted: dict[str, int] = {}  # producer -> the grant limit sent to it (grant())
        self._reset()

    def _reset(self) -> None:
        self._seen: dict[str, Heartbeat] = {}
        self._parts: dict[str, tuple[int, int, int, int]] = {}
        self.inserted = self.consumed = self.dropped = self.produced = 0
        self.buffers: dict[str, bool] = {}  # buffer -> still filling
        self.learners: dict[str, tuple[int, int | None]] = {}  # -> (updates, params version)
        self.learner_consumed: dict[str, int] = {}  # learner (and retired ones, name#k)
        self.versions: dict[str, int] = {}  # actor -> policy version
        self.fragments: dict[str, int] = {}  # actor -> fragments sent at that version
        self.sent: dict[str, int] = {}  # actor -> fragments sent
        self.streams: dict[str, dict[str, float]] = {}  # actor -> samples sent per stream
        self.offsets: dict[str, dict[str, float]] = {}  # buffer -> "actor/stream" -> offset
        self._furthest: dict[str, float] = {}  # "actor/stream" -> furthest offset of any buffer
        self._transit: dict[str, float] = {}  # actor -> samples sent, at no buffer yet
        self._transit_total = 0.0  # the sum of _transit, kept as it changes
        self._buffers_moved = False  # every actor's transit is out of date
        self.pending: dict[str, int] = {}  # actor -> fragments granted and not sent, if any
        self._excluded: set[str] = set()  # actors with a heartbeat here that do not count
        self._retaken: set[str] = set()  # actors whose heartbeat changed since the last look
        self._looked: Stamp | None = None  # the live services' registry at the last look
        self._scanned: Stamp | None = None  # the heartbeats at the last scan

    def scan(self, heartbeats: Mapping[str, Heartbeat]) -> None:
        """Take in the heartbeats that changed since the last scan: those the controller's
        heartbeats (a :class:`~tianji.runtime.registry.Registry`) logged as changed, or,
        for any other mapping, those that fail an identity check."""
        seen, scanned = self._seen, self._scanned
        changed = None
        if scanned is not None and scanned[0] is heartbeats:  # a Registry: read its log
            changed = heartbeats.changed_since(scanned[1])  # type: ignore[attr-defined]
        names = heartbeats if changed is None else dict.fromkeys(changed)
        for name in names:
            hb = heartbeats.get(name)
            if hb is not None and seen.get(name) is not hb:
                self._take(name, hb)
        if len(seen) != len(heartbeats):  # one went without forget(): start over
            self._reset()
            for name, hb in heartbeats.items():
                self._take(name, hb)
        self._scanned = stamp(heartbeats)

    def remove(self, name: str) -> None:
        """``name``'s heartbeat is gone (it is counted again under its retired name)."""
        part = self._parts.pop(name, None)
        self._seen.pop(name, None)
        if part is not None:
            self._add(part, -1)
        self.buffers.pop(name, None)
        self.learners.pop(name, None)
        self.learner_consumed.pop(name, None)
        self._set_transit(name, None)
        views = (self.versions, self.fragments, self.sent, self.streams)
        for view in (*views, self.granted, self.pending):
            view.pop(name, None)
        self._excluded.discard(name)
        self._retaken.discard(name)
        if self.offsets.pop(name, None) is not None:
            self._buffers_moved = True

    def retired_consumed(self, name: str) -> int:
        """Samples consumed by the earlier incarnations of learner ``name`` (``name#k``,
        see Controller.retire)."""
        prefix = f"{name}#"
        return sum(n for k, n in self.learner_consumed.items() if k.startswith(prefix))

    def _take(self, name: str, hb: Heartbeat) -> None:
        c = hb.counters
        dropped = _dropped(c)
        role = hb.role
        if role == "actor":  # the most of them: the fewest steps
            part = (0, 0, dropped, c.get(ActorStat.SAMPLES_PRODUCED, 0))
            gauges = hb.gauges
            self.versions[name] = int(gauges.get(ActorStat.POLICY_VERSION, -1))
            self.fragments[name] = int(gauges.get(ActorStat.FRAGMENTS_AT_VERSION, 0))
            self.sent[name] = int(c.get(ActorStat.FRAGMENTS_SENT, 0))
            self.streams[name] = _prefixed(gauges, BookStat.SENT)
            self._repend(name)
            self._retaken.add(name)
            if not self._buffers_moved:
                self._set_transit(name, self._transit_of(name))
        elif role == "buffer":
            part = (c.get(BufferStat.SAMPLES_INSERTED, 0), 0, dropped, 0)
            self.buffers[name] = hb.gauges.get(BufferStat.READY, 1.0) < 1.0
            offsets = _prefixed(hb.gauges, BookStat.RECV)
            if offsets != self.offsets.get(name):
                self.offsets[name] = offsets
                self._buffers_moved = True
        elif role == "learner":
            part = (0, c.get(LearnerStat.SAMPLES_CONSUMED, 0), dropped, 0)
            params = hb.gauges.get(LearnerStat.PARAMS_VERSION)
            updates = c.get(LearnerStat.LEARNER_UPDATES, 0)
            self.learners[name] = (updates, None if params is None else int(params))
            self.learner_consumed[name] = part[1]
        else:
            part = (0, 0, 0, 0)
        old = self._parts.get(name)
        if old is not None:
            self._add(old, -1)
        self._add(part, 1)
        self._parts[name] = part
        self._seen[name] = hb

    def grant(self, producer: str, limit: int) -> None:
        """``producer`` was sent a grant of ``limit`` fragments (cumulative)."""
        self.granted[producer] = limit
        self._repend(producer)

    def _repend(self, producer: str) -> None:
        held = self.granted.get(producer, 0) - self.sent.get(producer, 0)
        if held > 0 and producer in self.sent:
            self.pending[producer] = held
        else:
            self.pending.pop(producer, None)

    def _add(self, part: tuple[int, int, int, int], sign: int) -> None:
        self.inserted += sign * part[0]
        self.consumed += sign * part[1]
        self.dropped += sign * part[2]
        self.produced += sign * part[3]

    def decision_view(self, live: Mapping[str, Any]) -> Observation:
        """:meth:`observation` with the grants this tally was told (:meth:`grant`) and the
        producers holding some not yet sent (``pending``, kept up to date here)."""
        return self.observation(live, self.granted, self.pending)

    def observation(
        self,
        live: Mapping[str, Any],
        granted: Mapping[str, int] | None = None,
        pending: dict[str, int] | None = None,
    ) -> Observation:
        """The policy's view: the totals, and the gauges of the live services (a producer
        counts from its first heartbeat since it registered: until then the last one may
        be an earlier incarnation's). ``granted``: the grants sent, by producer (the policy
        reads those of the live producers); ``pending``: see :class:`Observation`.

        The observation's per-producer maps are this tally's own when no producer is left
        out (no copy of a thousand producers' entries per decision): they hold for one
        decision and move with the next :meth:`scan` or :meth:`grant`."""
        version, params = 0, None
        for name, (updates, published) in self.learners.items():
            version = max(version, updates)
            if published is not None and name in live:
                params = max(params or 0, published)
        filling = any(f and name in live for name, f in self.buffers.items())
        versions, fragments, sent = self.versions, self.fragments, self.sent
        excluded = self._not_counted(live)
        if excluded:  # (else the tally's own maps: no copy of every producer's per decision)
            versions, fragments, sent = dict(versions), dict(fragments), dict(sent)
            for name in excluded:
                versions.pop(name, None), fragments.pop(name, None), sent.pop(name, None)
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
            granted=granted if isinstance(granted, dict) else dict(granted or {}),
            params_version=params,
            pending=pending,
        )

    def _not_counted(self, live: Mapping[str, Any]) -> set[str]:
        """Actors with a heartbeat here that are not live, or registered anew and not heard
        from since (their heartbeat may be an earlier incarnation's). Every actor is looked
        at when the registry changed (a :class:`~tianji.runtime.controller.Registry` counts
        its changes; any other mapping is looked at in full every time), else only those
        whose heartbeat changed."""
        if unchanged(live, self._looked):
            names: Collection[str] = self._retaken
        else:
            names = self.versions
            self._excluded = set()
        excluded = self._excluded
        for name in names:
            record = live.get(name)
            if record is None or getattr(record, "last_heartbeat", True) is None:
                excluded.add(name)
            else:
                excluded.discard(name)
        self._retaken = set()
        self._looked = stamp(live)
        return excluded

    def in_transit(self, actors: Collection[str]) -> int:
        """Samples the live ``actors`` sent that no buffer has received yet: per stream,
        what the actor reports sent beyond the furthest offset a buffer reports (a stream
        a buffer joined late, or with a gap, counts from where it has it)."""
        if self._buffers_moved:
            self._furthest = {}
            for offsets in self.offsets.values():
                for key, offset in offsets.items():
                    if offset > self._furthest.get(key, 0.0):
                        self._furthest[key] = offset
            self._transit = {name: self._transit_of(name) for name in self.streams}
            self._transit_total = sum(self._transit.values())
            self._buffers_moved = False
        transit = self._transit
        if len(actors) == len(transit):
            return int(self._transit_total)
        return int(sum(transit.get(name, 0.0) for name in actors))

    def _set_transit(self, actor: str, samples: float | None) -> None:
        """``actor``'s samples in transit are ``samples`` now (None: it is gone)."""
        before = self._transit.pop(actor, 0.0) if samples is None else self._transit.get(actor, 0.0)
        if samples is not None:
            self._transit[actor] = samples
        self._transit_total += (samples or 0.0) - before

    def _transit_of(self, actor: str) -> float:
        furthest = self._furthest
        return sum(
            max(0.0, sent - furthest.get(f"{actor}/{stream}", 0.0))
            for stream, sent in self.streams[actor].items()
        )


def _prefixed(values: Mapping[str, float], prefix: str) -> dict[str, float]:
    n = len(prefix)
    return {k[n:]: v for k, v in values.items() if k.startswith(prefix)}


def _dropped(counters: Mapping[str, int]) -> int:
    return sum([v for k, v in counters.items() if k.startswith("dropped/")])


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
