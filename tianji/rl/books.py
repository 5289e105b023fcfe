"""The sample books, measured at both ends of every hop (pure: no asyncio, no I/O).

Samples travel two hops: actor -> buffer (``TrajectoryCollected``) and buffer -> learner
(``SampleBatch``). Each sender numbers what it sends on a **stream** (one per sender
incarnation and topic, with a random id): every message carries ``(stream, seq, offset)``,
its number on the stream and the samples sent on it before. Each receiver keeps, per
stream, the next number and offset it expects (:class:`Inbox`), so it tells a gap (a lost
message: its samples are counted ``dropped/lost_in_transit``) and a duplicate (discarded,
counted) from the numbers alone. Both ends report what they know in their heartbeats:

- a sender: ``sent/<stream>`` (gauge) -- samples sent on each of its streams;
- a receiver: ``recv/<sender>/<stream>`` (gauge) -- the offset up to which it has the
  stream, ``join/<sender>/<stream>`` -- where it joined a stream already under way (a
  restarted receiver), and its counters ``samples_received``,
  ``dropped/lost_in_transit`` and ``duplicates_discarded``.

:func:`accounting` turns the heartbeats into the run's books. ``in_flight`` of a hop is
only ever *sent by one end minus received by the other*, per stream; each service's own
books (what came in = what it holds + sent on + dropped) are checked on their own; and a
restart is settled from the survivors' counts: what was sent to a dead receiver after its
last report (up to where the next incarnation joined the stream) is ``lost_in_restart``
(``derived``), what it held at its last report also (``reported``); what a sender sent
after its last report (a dead one's last report is its last word; a live one's may lag the
receiver's) is seen at the receiver and counted as sent: by an actor, as produced
(``produced_unreported``); by a buffer, as no longer buffered (``taken_unreported``). So a
loss anywhere shows as a named drop or as ``balanced: false`` with the reason in
``errors``, never as a larger ``in_flight``.
"""

from __future__ import annotations

import collections
import dataclasses
import secrets
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from tianji.rl.stats import DROPPED, ActorStat, BookStat, BufferStat, Dropped, LearnerStat

__all__ = ["Inbox", "Outbox", "accounting", "dropped_by_reason", "new_stream_id"]

STREAM_BITS = 52
"""Stream ids are below 2**52, so a float64 gauge carries them exactly."""


def new_stream_id() -> int:
    """A random stream id in ``[1, 2**52)`` (0 means "not numbered")."""
    return 1 + secrets.randbelow((1 << STREAM_BITS) - 1)


class Outbox:
    """What one sender incarnation numbers, per topic: stamp a message, then say whether it
    was delivered (only delivered messages take a number, so a stream has no holes at the
    sender). One stamp/delivery at a time per topic (the caller serializes them)."""

    def __init__(self) -> None:
        self._streams: dict[str, list[int]] = {}  # topic -> [id, next seq, samples sent]

    def stamp(self, topic: str) -> dict[str, int]:
        """The numbering fields of the next message on ``topic``."""
        stream = self._streams.get(topic)
        if stream is None:
            stream = self._streams[topic] = [new_stream_id(), 0, 0]
        return {"stream": stream[0], "seq": stream[1], "offset": stream[2]}

    def delivered(self, topic: str, samples: int) -> None:
        """The message stamped last on ``topic`` was delivered: it takes its number."""
        stream = self._streams[topic]
        stream[1] += 1
        stream[2] += samples

    def gauges(self, topic: str | None = None) -> dict[str, float]:
        """``sent/<stream>``: samples sent on each stream (on ``topic``'s only)."""
        streams = self._streams.values() if topic is None else [self._streams[topic]]
        return {f"{BookStat.SENT}{s[0]}": float(s[2]) for s in streams}


@dataclasses.dataclass
class _Position:
    first: int  # offset where this receiver joined the stream
    seq: int  # next message number expected
    offset: int  # samples of the stream up to here (received or counted lost)


class Inbox:
    """One receiver incarnation's view of every stream it receives.

    :meth:`take` says what to do with a message: keep it (the samples a gap before it
    lost, usually 0) or discard it (a duplicate, ``None``).
    """

    def __init__(self) -> None:
        self._streams: dict[tuple[str, int], _Position] = {}
        self.received = 0
        self.lost = 0
        self.duplicates = 0
        self.unnumbered = 0
        self.lost_messages = 0  # messages missing in the gaps

    def take(self, sender: str, stream: int, seq: int, offset: int, samples: int) -> int | None:
        """Account for a message of ``samples`` from ``sender``.

        Returns:
            the samples lost in a gap just before it (it is kept), or ``None`` for a
            duplicate (it is discarded). A message with ``stream == 0`` is not numbered:
            it is kept and counted, with no gap or duplicate check.
        """
        if stream == 0:
            self.received += samples
            self.unnumbered += samples
            return 0
        key = (sender, stream)
        pos = self._streams.get(key)
        if pos is None:  # first message of this stream here: joined at ``offset``
            pos = self._streams[key] = _Position(first=offset, seq=seq, offset=offset)
        if seq < pos.seq:
            self.duplicates += 1
            return None
        lost = max(0, offset - pos.offset)
        self.lost_messages += seq - pos.seq
        pos.seq, pos.offset = seq + 1, max(pos.offset, offset) + samples
        self.received += samples
        self.lost += lost
        return lost

    def gauges(self, sender: str | None = None, stream: int = 0) -> dict[str, float]:
        """``recv/<sender>/<stream>`` (and ``join/...`` where it joined late), of every
        stream or of ``(sender, stream)`` only."""
        out: dict[str, float] = {}
        items = (
            self._streams.items()
            if sender is None
            else [((sender, stream), p) for p in [self._streams.get((sender, stream))] if p]
        )
        for (sender, stream), pos in items:
            out[f"{BookStat.RECV}{sender}/{stream}"] = float(pos.offset)
            if pos.first:
                out[f"{BookStat.JOIN}{sender}/{stream}"] = float(pos.first)
        return out


# ------------------------------------------------------------------------------ books
class _Beat(Protocol):
    name: str
    role: str
    state: str
    counters: dict[str, int]
    gauges: dict[str, float]


def _dead(hb: _Beat) -> bool:
    return hb.state == "dead" or "#" in hb.name


def dropped_by_reason(heartbeats: Mapping[str, _Beat]) -> dict[str, int]:
    """Samples dropped anywhere in the run, by reason (``dropped/<reason>`` counters)."""
    out: collections.Counter[str] = collections.Counter()
    for hb in heartbeats.values():
        for key, value in hb.counters.items():
            if key.startswith(DROPPED) and value:
                out[key.split("/", 1)[1]] += value
    return dict(sorted(out.items()))


@dataclasses.dataclass
class _Hop:
    """One hop's books, from the senders' streams and the receivers' positions."""

    name: str
    unit: str
    sent: int = 0
    received: int = 0
    lost_in_transit: int = 0
    lost_in_restart: int = 0
    in_flight: int = 0
    pending: int = 0  # sent towards a dead receiver, its successor not joined yet
    duplicates: int = 0
    unnumbered: int = 0  # received without stream numbers (hand-made events)
    late_live: dict[str, int] = dataclasses.field(default_factory=dict)  # sent after report
    late_dead: dict[str, int] = dataclasses.field(default_factory=dict)  # ... by dead senders
    lost_by_dead: dict[str, int] = dataclasses.field(default_factory=dict)
    live_in_flight: dict[str, int] = dataclasses.field(default_factory=dict)

    def report(self) -> dict[str, Any]:
        out = {
            "unit": self.unit,
            "sent": self.sent,
            "received": self.received,
            "lost_in_transit": self.lost_in_transit,
            "lost_in_restart": self.lost_in_restart,
            "in_flight": self.in_flight + self.pending,
            "duplicates": self.duplicates,
        }
        if self.pending:
            out["pending_restart"] = self.pending
        if self.live_in_flight:
            out["in_flight_by_link"] = dict(sorted(self.live_in_flight.items()))
        if self.lost_by_dead:
            out["lost_in_restart_by"] = dict(sorted(self.lost_by_dead.items()))
        return out


def _hop(
    name: str,
    unit: str,
    senders: Iterable[_Beat],
    receivers: Iterable[_Beat],
    final: bool,
    errors: list[str],
) -> _Hop:
    """One hop's books, stream by stream: what each sender reports sent against the
    segments of the stream its receivers (every incarnation) report having."""
    hop = _Hop(name, unit)
    receivers = list(receivers)
    sent_by: dict[int, tuple[str, int, bool]] = {}  # stream -> (sender, reported, dead)
    for hb in senders:
        for key, value in hb.gauges.items():
            if key.startswith(BookStat.SENT):
                sent_by[int(key[len(BookStat.SENT) :])] = (hb.name, int(value), _dead(hb))
    segments, sender_of = _segments(hop, receivers, errors)
    live = {hb.name for hb in receivers if not _dead(hb)}
    dead = {hb.name for hb in receivers if _dead(hb)}
    for stream in set(sent_by) | set(segments):
        sender, reported, sender_dead = sent_by.get(stream, (sender_of.get(stream, "?"), 0, True))
        segs = sorted(segments.get(stream, []))
        top = max((nxt for _, nxt, _, _ in segs), default=0)
        sent = max(reported, top)
        if top > reported:  # sent after its last report (seen at the receiver)
            _add(hop.late_dead if sender_dead else hop.late_live, sender, top - reported)
        hop.sent += sent
        at = _walk_segments(hop, stream, sender, segs, errors)
        if sent > at:
            _settle_tail(hop, (sender, sender_dead), segs, sent - at, (live, dead), final)
    return hop


_Segment = tuple[int, int, str, bool]  # (first, next, receiver, dead)


def _segments(
    hop: _Hop, receivers: list[_Beat], errors: list[str]
) -> tuple[dict[int, list[_Segment]], dict[int, str]]:
    """Every receiver incarnation's segment of every stream, and each stream's sender; the
    receivers' counts go into ``hop`` (a receiver whose streams do not span what it counted
    is an error)."""
    segments: dict[int, list[_Segment]] = collections.defaultdict(list)
    sender_of: dict[int, str] = {}
    for hb in receivers:
        joins = {
            k[len(BookStat.JOIN) :]: v for k, v in hb.gauges.items() if k.startswith(BookStat.JOIN)
        }
        span = 0
        for key, value in hb.gauges.items():
            if not key.startswith(BookStat.RECV):
                continue
            where = key[len(BookStat.RECV) :]
            sender, _, sid = where.rpartition("/")
            first = int(joins.get(where, 0))
            segments[int(sid)].append((first, int(value), hb.name, _dead(hb)))
            sender_of[int(sid)] = sender
            span += int(value) - first
        received = int(hb.counters.get(BookStat.RECEIVED, 0))
        lost = int(hb.counters.get(Dropped.LOST_IN_TRANSIT, 0)) + int(
            hb.counters.get(BookStat.DRAWS_LOST, 0)
        )
        unnumbered = int(hb.counters.get(BookStat.UNNUMBERED, 0))
        hop.received += received
        hop.unnumbered += unnumbered
        hop.lost_in_transit += lost
        hop.duplicates += int(hb.counters.get(BookStat.DUPLICATES, 0))
        if span != received - unnumbered + lost:
            errors.append(
                f"{hb.name}: its streams span {span} {hop.unit} but it counted "
                f"{received - unnumbered} received + {lost} lost in transit"
            )
    return segments, sender_of


def _walk_segments(
    hop: _Hop, stream: int, sender: str, segs: list[_Segment], errors: list[str]
) -> int:
    """Walk a stream's segments in order: a gap between two receivers was lost in the
    restart of the first. Returns the offset up to which the stream is accounted for."""
    at = 0
    before = sender  # the receiver before this one on the stream (none: the sender)
    for first, nxt, receiver, _ in segs:
        if first > at:  # sent to the receiver before after its last report: lost there
            hop.lost_in_restart += first - at
            _add(hop.lost_by_dead, before, first - at)
        elif first < at:
            errors.append(
                f"{receiver}: joined stream {stream} of {sender} at {first}, "
                f"before {at} where an earlier receiver had it"
            )
        at = max(at, nxt)
        before = receiver
    return at


def _settle_tail(
    hop: _Hop,
    sender: tuple[str, bool],
    segs: list[_Segment],
    tail: int,
    receivers: tuple[set[str], set[str]],
    final: bool,
) -> None:
    """What a stream sent beyond what any receiver has: in flight to the receiver it went to
    (the last that has the stream or, none yet, a live one: a new stream's first message),
    lost with a dead one, or pending until a successor joins."""
    name, sender_dead = sender
    live, dead = receivers
    last_dead = segs[-1][3] if segs else not live
    link = f"{name}->{segs[-1][2] if segs else '|'.join(sorted(live))}"
    unclaimed = final and not segs and bool(dead)  # a dead receiver's, maybe
    if not last_dead and not (final and sender_dead) and not unclaimed:
        hop.in_flight += tail
        hop.live_in_flight[link] = tail
    elif final or sender_dead:
        hop.lost_in_restart += tail
        _add(hop.lost_by_dead, segs[-1][2] if segs else name, tail)
    else:
        hop.pending += tail


def _add(table: dict[str, int], key: str, n: int) -> None:
    table[key] = table.get(key, 0) + n


def _total(beats: Iterable[_Beat], key: str, gauge: bool = False) -> int:
    return int(sum((hb.gauges if gauge else hb.counters).get(key, 0) for hb in beats))


def _check(errors: list[str], hb: _Beat, left: int, right: int, what: str) -> None:
    if left != right:
        errors.append(f"{hb.name}: {what} ({left} != {right})")


def _service_books(hb: _Beat, on_policy: bool, errors: list[str]) -> None:
    """Each service's own books: what came in equals what it holds, sent on and dropped."""
    c, g = hb.counters, hb.gauges
    dropped = {k: v for k, v in c.items() if k.startswith(DROPPED)}
    if hb.role == "actor":
        produced = c.get(ActorStat.SAMPLES_PRODUCED, 0)
        out = c.get(ActorStat.SAMPLES_SENT, 0) + c.get(Dropped.UNSENT, 0)
        out += int(g.get(ActorStat.SENDING, 0))
        _check(errors, hb, produced, out, "produced != sent + unsent + sending")
    elif hb.role == "buffer":
        got = c.get(BufferStat.SAMPLES_RECEIVED, 0) + c.get(BufferStat.SAMPLES_RESTORED, 0)
        inserted = c.get(BufferStat.SAMPLES_INSERTED, 0)
        _check(errors, hb, c.get(BufferStat.SAMPLES_RECEIVED, 0), inserted, "received != inserted")
        held = int(g.get(BufferStat.BUFFERED_SAMPLES, 0))
        if on_policy:
            out = held + c.get(BufferStat.SAMPLES_SENT, 0) + int(g.get(BufferStat.SENDING, 0))
            out += sum(v for k, v in dropped.items() if k != Dropped.LOST_IN_TRANSIT)
        else:
            out = held + sum(v for k, v in dropped.items() if k != Dropped.LOST_IN_TRANSIT)
        _check(errors, hb, got, out, "received + restored != buffered + sent + dropped")
    elif hb.role == "learner":
        got = c.get(LearnerStat.SAMPLES_RECEIVED, 0)
        out = c.get(LearnerStat.SAMPLES_CONSUMED, 0) + int(g.get(LearnerStat.HELD_SAMPLES, 0))
        out += sum(v for k, v in dropped.items() if k != Dropped.LOST_IN_TRANSIT)
        out += c.get(BookStat.DRAWS_UNUSED, 0)
        _check(errors, hb, got, out, "received != consumed + held + dropped")


def accounting(
    heartbeats: Mapping[str, _Beat], on_policy: bool, *, final: bool = False
) -> dict[str, Any]:
    """Where every produced sample went, from both ends of every hop.

    On-policy: ``produced + produced_unreported + restored = consumed + buffered -
    taken_unreported + held + dropped + in_flight + sending`` (``*_unreported``: what a
    sender's last report does not show sent yet, seen at its receiver); off-policy (replay
    samples are drawn, not taken; the buffer -> learner hop carries draws and stays out of
    the identity):
    ``produced + produced_unreported + restored = buffered + dropped + in_flight +
    sending``. ``balanced`` also needs every service's own books and every hop's to close;
    ``errors`` says which did not.

    Args:
        heartbeats: the latest heartbeat of every service, live and retired (``name#k``).
        on_policy: rollout buffers (samples are taken) or replay (drawn).
        final: the run has stopped and drained: what is still on its way to or from a dead
            incarnation will not arrive (counted ``lost_in_restart``) rather than pending.
    """
    beats = list(heartbeats.values())
    by_role: dict[str, list[_Beat]] = collections.defaultdict(list)
    for hb in beats:
        by_role[hb.role].append(hb)
    errors: list[str] = []
    for hb in beats:
        _service_books(hb, on_policy, errors)
    first = _hop("actor->buffer", "samples", by_role["actor"], by_role["buffer"], final, errors)
    unit = "samples" if on_policy else "draws"
    second = _hop("buffer->learner", unit, by_role["buffer"], by_role["learner"], final, errors)
    hops = {h.name: h for h in (first, second)}
    _check_hops(hops.values(), errors)
    dropped = dropped_by_reason({hb.name: hb for hb in beats if on_policy or hb.role != "learner"})
    restarts = _restarts(dropped, first, second, on_policy, errors)
    terms = _terms(by_role, first, second, on_policy)
    accounted = terms["consumed"] if on_policy else 0
    accounted += terms["buffered"] - terms["taken_unreported"] + terms["held"]
    accounted += sum(dropped.values()) + terms["in_flight"] + terms["sending"]
    came = terms["produced"] + terms["produced_unreported"] + terms["restored"]
    if came != accounted:
        errors.append(
            f"produced {terms['produced']} + unreported {terms['produced_unreported']} + "
            f"restored {terms['restored']} != accounted {accounted}"
        )
    in_flight = terms.pop("in_flight")  # (after dropped: the order the summary has shown)
    return {
        **terms,
        "dropped": dropped,
        "in_flight": in_flight,
        "lost_in_restart": restarts,
        "hops": {name: hop.report() for name, hop in hops.items()},
        "final": final,
        "balanced": not errors,
        "errors": errors,
    }


def _check_hops(hops: Iterable[_Hop], errors: list[str]) -> None:
    for hop in hops:
        counted = hop.received + hop.lost_in_transit + hop.lost_in_restart
        if hop.sent + hop.unnumbered != counted + hop.in_flight + hop.pending:
            errors.append(
                f"hop {hop.name}: sent {hop.sent} != received {hop.received} + lost "
                f"{hop.lost_in_transit + hop.lost_in_restart} + in flight "
                f"{hop.in_flight + hop.pending}"
            )


def _restarts(
    dropped: dict[str, int], first: _Hop, second: _Hop, on_policy: bool, errors: list[str]
) -> dict[str, int]:
    """Samples lost in restarts: what the dead reported holding, plus what the hops derive
    (sent to or from a dead incarnation after its last report), into ``dropped``."""
    reported = dropped.pop("lost_in_restart", 0)
    derived = first.lost_in_restart + (second.lost_in_restart if on_policy else 0)
    # a dead buffer's sends after its last report left what it held (counted lost): not lost
    derived -= sum(second.late_dead.values()) if on_policy else 0
    total = reported + derived
    if total:
        dropped["lost_in_restart"] = total
        ordered = dict(sorted(dropped.items()))
        dropped.clear()
        dropped.update(ordered)
    if total < 0:
        errors.append(f"lost_in_restart is negative ({total})")
    return {"reported": reported, "derived": derived}


def _terms(
    by_role: Mapping[str, list[_Beat]], first: _Hop, second: _Hop, on_policy: bool
) -> dict[str, int]:
    """The identity's terms but the drops (see :func:`accounting`)."""
    actors, buffers, learners = by_role["actor"], by_role["buffer"], by_role["learner"]
    sending = _total(actors, ActorStat.SENDING, gauge=True)
    in_flight = first.in_flight + first.pending
    held = 0
    if on_policy:
        held = _total(learners, LearnerStat.HELD_SAMPLES, gauge=True)
        sending += _total(buffers, BufferStat.SENDING, gauge=True)
        in_flight += second.in_flight + second.pending
    return {
        "produced": _total(actors, ActorStat.SAMPLES_PRODUCED),
        "produced_unreported": sum(first.late_dead.values()) + sum(first.late_live.values()),
        "restored": _total(buffers, BufferStat.SAMPLES_RESTORED),
        "consumed": _total(learners, LearnerStat.SAMPLES_CONSUMED),
        "buffered": _total(buffers, BufferStat.BUFFERED_SAMPLES, gauge=True),
        # on-policy, a live buffer's batches that reached a learner after its last report
        # (still in its reported ``buffered``)
        "taken_unreported": sum(second.late_live.values()) if on_policy else 0,
        "held": held,
        "sending": sending,
        "in_flight": in_flight,
    }
