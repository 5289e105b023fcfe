"""The sample books at both ends of every hop (tianji.rl.books): numbered streams, gaps and
duplicates told from the numbers, each service's own books, restarts settled from the
survivors' counts, and books that fail when any service or link loses a sample silently."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
import pytest

from tianji.rl.balance import BalanceConfig
from tianji.rl.books import Inbox, Outbox, accounting
from tianji.rl.stats import ActorStat, BookStat, BufferStat, Dropped, LearnerStat
from tianji.runtime.events import Heartbeat
from tianji.services.balancer import Balancer

FRAGMENT = 64
BATCH = 128


def beat(name: str, role: str, counters: dict[str, int], gauges: dict[str, float]) -> Heartbeat:
    return Heartbeat(
        name=name,
        role=role,
        state="dead" if "#" in name else "running",
        counters={k: v for k, v in counters.items() if v},
        gauges=gauges,
        queue_depths={},
        sent_at=0.0,
    )


@dataclasses.dataclass
class Actor:
    name: str
    produced: int = 0
    sent: int = 0
    unsent: int = 0
    outbox: Outbox = dataclasses.field(default_factory=Outbox)

    def fragment(self) -> dict[str, int]:
        self.produced += FRAGMENT
        return {"samples": FRAGMENT, **self.outbox.stamp("traj")}

    def delivered(self) -> None:
        self.outbox.delivered("traj", FRAGMENT)
        self.sent += FRAGMENT

    def heartbeat(self) -> Heartbeat:
        counters = {
            ActorStat.SAMPLES_PRODUCED: self.produced,
            ActorStat.SAMPLES_SENT: self.sent,
            Dropped.UNSENT: self.unsent,
        }
        return beat(self.name, "actor", counters, self.outbox.gauges())


@dataclasses.dataclass
class FakeBuffer:
    """An on-policy rollout buffer: what it receives it hands out in batches of 128."""

    name: str
    inbox: Inbox = dataclasses.field(default_factory=Inbox)
    outbox: Outbox = dataclasses.field(default_factory=Outbox)
    held: int = 0
    sent: int = 0
    lost: int = 0
    duplicates: int = 0
    inserted: int = 0

    def receive(self, sender: str, msg: dict[str, int]) -> None:
        lost = self.inbox.take(sender, msg["stream"], msg["seq"], msg["offset"], msg["samples"])
        if lost is None:
            self.duplicates += 1
            return
        self.lost += lost
        self.held += msg["samples"]
        self.inserted += msg["samples"]

    def batch(self) -> dict[str, int] | None:
        if self.held < BATCH:
            return None
        self.held -= BATCH
        return {"samples": BATCH, **self.outbox.stamp("batches")}

    def delivered(self) -> None:
        self.outbox.delivered("batches", BATCH)
        self.sent += BATCH

    def heartbeat(self) -> Heartbeat:
        counters = {
            BufferStat.SAMPLES_RECEIVED: self.inbox.received,
            BufferStat.SAMPLES_INSERTED: self.inserted,
            BufferStat.SAMPLES_SENT: self.sent,
            Dropped.LOST_IN_TRANSIT: self.lost,
            BookStat.DUPLICATES: self.duplicates,
        }
        gauges = {BufferStat.BUFFERED_SAMPLES: float(self.held)}
        gauges.update(self.inbox.gauges())
        gauges.update(self.outbox.gauges())
        return beat(self.name, "buffer", counters, gauges)


@dataclasses.dataclass
class Learner:
    name: str
    inbox: Inbox = dataclasses.field(default_factory=Inbox)
    consumed: int = 0
    held: int = 0
    lost: int = 0

    def receive(self, sender: str, msg: dict[str, int]) -> None:
        lost = self.inbox.take(sender, msg["stream"], msg["seq"], msg["offset"], msg["samples"])
        assert lost is not None
        self.lost += lost
        self.held += msg["samples"]

    def consume(self) -> None:
        self.consumed += self.held
        self.held = 0

    def heartbeat(self) -> Heartbeat:
        counters = {
            LearnerStat.SAMPLES_RECEIVED: self.inbox.received,
            LearnerStat.SAMPLES_CONSUMED: self.consumed,
            Dropped.LOST_IN_TRANSIT: self.lost,
        }
        gauges = {LearnerStat.HELD_SAMPLES: float(self.held)}
        gauges.update(self.inbox.gauges())
        return beat(self.name, "learner", counters, gauges)


class Run:
    """Two actors, a buffer and a learner moving numbered messages."""

    def __init__(self) -> None:
        self.actors = [Actor("actor-0"), Actor("actor-1")]
        self.buffer = FakeBuffer("buffer-0")
        self.learner = Learner("learner-0")
        self.retired: dict[str, Heartbeat] = {}

    def step(self, fragments: int = 4, *, consume: bool = True) -> None:
        for _ in range(fragments):
            for actor in self.actors:
                msg = actor.fragment()
                actor.delivered()
                self.buffer.receive(actor.name, msg)
        while (b := self.buffer.batch()) is not None:
            self.buffer.delivered()
            self.learner.receive(self.buffer.name, b)
        if consume:
            self.learner.consume()

    def retire(self, hb: Heartbeat) -> None:
        """``hb``'s service died: its last heartbeat is kept as ``name#1`` the way the
        controller keeps it (what it held counted lost_in_restart by the balancer)."""
        dead = msgspec.structs.replace(hb, name=f"{hb.name}#1", state="dead")
        self.retired[dead.name] = Balancer(BalanceConfig()).retired(dead)

    def heartbeats(self) -> dict[str, Heartbeat]:
        beats = [a.heartbeat() for a in self.actors]
        beats += [self.buffer.heartbeat(), self.learner.heartbeat()]
        return {**self.retired, **{hb.name: hb for hb in beats}}


def books(run: Run | dict[str, Heartbeat], **kw: Any) -> dict[str, Any]:
    beats = run.heartbeats() if isinstance(run, Run) else run
    return accounting(beats, on_policy=True, **kw)


def replace(hb: Heartbeat, **counters: int) -> Heartbeat:
    return msgspec.structs.replace(hb, counters={**hb.counters, **counters})


# ----------------------------------------------------------------------------- streams
def test_a_receiver_tells_gaps_and_duplicates_from_the_numbers() -> None:
    out, inbox = Outbox(), Inbox()
    msgs = []
    for n in (10, 20, 30, 40):
        msgs.append((out.stamp("t"), n))
        out.delivered("t", n)
    (first, n1), _, (third, n3), (fourth, n4) = msgs
    assert inbox.take("a", first["stream"], first["seq"], first["offset"], n1) == 0
    # the second message never arrives: the third tells the 20 samples before it lost
    assert inbox.take("a", third["stream"], third["seq"], third["offset"], n3) == 20
    assert inbox.take("a", third["stream"], third["seq"], third["offset"], n3) is None
    assert inbox.take("a", fourth["stream"], fourth["seq"], fourth["offset"], n4) == 0
    assert (inbox.received, inbox.lost, inbox.duplicates) == (80, 20, 1)
    sid = first["stream"]
    assert inbox.gauges() == {f"recv/a/{sid}": 100.0}
    assert out.gauges() == {f"sent/{sid}": 100.0}


def test_an_undelivered_message_takes_no_number() -> None:
    out = Outbox()
    a = out.stamp("t")
    b = out.stamp("t")  # a was not delivered: b reuses its number
    assert a == b
    out.delivered("t", 5)
    assert out.stamp("t")["seq"] == 1 and out.stamp("t")["offset"] == 5


def test_a_receiver_that_joins_a_stream_under_way_says_where() -> None:
    out, inbox = Outbox(), Inbox()
    for _ in range(3):
        out.stamp("t")
        out.delivered("t", 10)
    msg = out.stamp("t")
    assert inbox.take("a", msg["stream"], msg["seq"], msg["offset"], 10) == 0
    sid = msg["stream"]
    assert inbox.gauges() == {f"recv/a/{sid}": 40.0, f"join/a/{sid}": 30.0}


# ----------------------------------------------------------------------------- books close
def test_the_books_close_with_in_flight_measured_at_both_ends() -> None:
    run = Run()
    run.step(4)
    b = books(run)
    assert b["balanced"], b["errors"]
    assert b["produced"] == 512 and b["consumed"] == 512 and b["in_flight"] == 0
    # a fragment sent and not received yet is in flight on its link, by name
    msg = run.actors[0].fragment()
    run.actors[0].delivered()
    b = books(run)
    assert b["balanced"] and b["in_flight"] == FRAGMENT, b
    assert b["hops"]["actor->buffer"]["in_flight_by_link"] == {"actor-0->buffer-0": FRAGMENT}
    run.buffer.receive("actor-0", msg)
    b = books(run)
    assert b["balanced"] and b["in_flight"] == 0 and b["buffered"] == FRAGMENT


@pytest.mark.parametrize("produced", [5_000, 50_000, 5_000_000])
def test_an_actor_claiming_more_than_it_sent_breaks_the_books(produced: int) -> None:
    """The old books derived in_flight from the identity: an inflated samples_produced
    showed as a larger in_flight and still balanced. Now the actor's own books fail."""
    run = Run()
    run.step(4)
    beats = run.heartbeats()
    beats["actor-0"] = replace(beats["actor-0"], **{ActorStat.SAMPLES_PRODUCED: produced})
    b = books(beats)
    assert not b["balanced"]
    assert any(e.startswith("actor-0: produced") for e in b["errors"]), b["errors"]
    assert b["in_flight"] == 0


def test_a_replay_producer_claiming_millions_breaks_the_books() -> None:
    run = Run()
    run.step(2, consume=False)
    beats = run.heartbeats()
    beats["actor-1"] = replace(beats["actor-1"], **{ActorStat.SAMPLES_PRODUCED: 3_000_000})
    assert not accounting(beats, on_policy=False)["balanced"]


def test_a_fragment_a_link_drops_is_named_lost_in_transit() -> None:
    run = Run()
    run.step(2)
    run.actors[0].fragment()
    run.actors[0].delivered()  # handed to the link, never arrives
    run.step(2)
    b = books(run)
    assert b["balanced"], b["errors"]
    assert b["dropped"] == {"lost_in_transit": FRAGMENT} and b["in_flight"] == 0


def test_a_batch_a_link_drops_is_named_lost_in_transit() -> None:
    run = Run()
    run.step(2)
    for _ in range(2):
        for actor in run.actors:
            run.buffer.receive(actor.name, actor.fragment())
            actor.delivered()
    assert run.buffer.batch() is not None
    run.buffer.delivered()  # the batch vanishes on the link
    run.step(2)
    b = books(run)
    assert b["balanced"], b["errors"]
    assert b["dropped"] == {"lost_in_transit": BATCH}
    assert b["hops"]["buffer->learner"]["lost_in_transit"] == BATCH


def test_a_buffer_that_miscounts_breaks_the_books() -> None:
    run = Run()
    run.step(3)
    run.buffer.held += 7  # holds more than it received
    b = books(run)
    assert not b["balanced"] and any(e.startswith("buffer-0") for e in b["errors"]), b


def test_a_buffer_that_loses_samples_without_counting_them_breaks_the_books() -> None:
    run = Run()
    run.step(3)
    run.actors[0].fragment()
    run.actors[0].delivered()
    run.buffer.inbox.take("actor-0", *_last(run.actors[0]), FRAGMENT)  # received, then gone
    b = books(run)
    assert not b["balanced"] and any(e.startswith("buffer-0") for e in b["errors"]), b


def _last(actor: Actor) -> tuple[int, int, int]:
    s = actor.outbox.stamp("traj")
    return s["stream"], s["seq"] - 1, s["offset"] - FRAGMENT


def test_a_learner_that_discards_a_batch_without_counting_it_breaks_the_books() -> None:
    run = Run()
    run.step(3)
    run.learner.consumed -= BATCH  # received, neither consumed nor held nor dropped
    b = books(run)
    assert not b["balanced"] and any(e.startswith("learner-0") for e in b["errors"]), b


def test_a_duplicate_delivery_is_discarded_and_named() -> None:
    run = Run()
    run.step(2)
    actor = run.actors[1]
    msg = actor.fragment()
    actor.delivered()
    run.buffer.receive(actor.name, msg)
    run.buffer.receive(actor.name, msg)  # delivered twice
    b = books(run)
    assert b["balanced"], b["errors"]
    assert b["hops"]["actor->buffer"]["duplicates"] == 1 and b["buffered"] == FRAGMENT


def test_a_duplicate_a_receiver_keeps_breaks_the_books() -> None:
    run = Run()
    run.step(2)
    run.buffer.held += FRAGMENT  # taken twice: stored again, received counted once
    run.buffer.inserted += FRAGMENT
    b = books(run)
    assert not b["balanced"], b


# ----------------------------------------------------------------------------- restarts
def test_a_dead_buffer_is_settled_from_the_survivors_numbers() -> None:
    """buffer-0 reported holding 64 samples and died; the actors then sent 2 more
    fragments to it (lost in its sockets); its successor joined their streams after them.
    What it held is lost_in_restart (reported), what came after its last report too
    (derived, from where the successor joined)."""
    run = Run()
    run.step(4)
    msg = run.actors[0].fragment()
    run.actors[0].delivered()
    run.buffer.receive("actor-0", msg)  # holds 64
    run.retire(run.buffer.heartbeat())
    run.buffer = FakeBuffer("buffer-0")  # the next incarnation, counting from zero
    for actor in run.actors:  # sent to the dead one after its last report
        actor.fragment()
        actor.delivered()
    pending = books(run)
    assert pending["balanced"], pending["errors"]
    assert pending["hops"]["actor->buffer"]["pending_restart"] == 2 * FRAGMENT
    run.step(2)
    b = books(run)
    assert b["balanced"], b["errors"]
    assert b["lost_in_restart"] == {"reported": FRAGMENT, "derived": 2 * FRAGMENT}
    assert b["dropped"] == {"lost_in_restart": 3 * FRAGMENT} and b["in_flight"] == 0


def test_what_a_dead_actor_sent_after_its_last_report_is_counted_from_the_receiver() -> None:
    run = Run()
    run.step(2)
    run.retire(run.actors[0].heartbeat())
    for _ in range(2):  # sent after its last report, then it died
        run.buffer.receive("actor-0", run.actors[0].fragment())
        run.actors[0].delivered()
    run.actors[0] = Actor("actor-0")
    run.step(1)
    b = books(run)
    assert b["balanced"], b["errors"]
    assert b["produced_unreported"] == 2 * FRAGMENT


def test_a_tail_to_a_dead_receiver_is_lost_at_the_final_books() -> None:
    run = Run()
    run.step(2)
    run.retire(run.buffer.heartbeat())
    run.buffer = FakeBuffer("buffer-0")
    run.actors[0].fragment()
    run.actors[0].delivered()  # to the dead one; nothing sent to the successor since
    assert books(run)["hops"]["actor->buffer"]["pending_restart"] == FRAGMENT
    final = books(run, final=True)
    assert final["balanced"] and final["in_flight"] == 0, final
    assert final["dropped"] == {"lost_in_restart": FRAGMENT}


def test_replay_books_count_draws_apart_from_the_identity() -> None:
    """Off-policy: the buffer -> learner hop carries draws (copies), in its own unit, and
    the identity is produced = buffered + dropped + in flight; what a learner consumes is
    draws, reported, not in the identity."""
    run = Run()
    run.step(2)  # 256 samples inserted, handed out twice as 2 draws of 128
    beats = run.heartbeats()
    replay = msgspec.structs.replace(
        beats["buffer-0"],
        counters={**beats["buffer-0"].counters, BufferStat.SAMPLES_SENT: 256},
        gauges={**beats["buffer-0"].gauges, BufferStat.BUFFERED_SAMPLES: 256.0},
    )
    beats["buffer-0"] = replay
    b = accounting(beats, on_policy=False)
    assert b["balanced"], b["errors"]
    assert b["hops"]["buffer->learner"]["unit"] == "draws" and b["consumed"] == 256
    assert b["buffered"] == 256 and b["in_flight"] == 0


def test_books_taken_while_a_senders_report_lags_its_receivers_still_close() -> None:
    """Mid-run the heartbeats are not taken at one instant: a buffer may report a fragment
    (and a learner a batch) before the sender's next report says it sent it."""
    run = Run()
    run.step(2)
    stale = {a.name: a.heartbeat() for a in run.actors}
    stale_buffer = run.buffer.heartbeat()
    run.step(2)  # received downstream, not yet in the senders' reports
    beats = run.heartbeats()
    beats.update(stale)
    b = books(beats)
    assert b["balanced"], b["errors"]
    assert b["produced_unreported"] == 4 * FRAGMENT and b["in_flight"] == 0
    beats = run.heartbeats()
    beats["buffer-0"] = stale_buffer  # the learner has batches this report does not show sent
    b = books(beats)
    assert b["balanced"], b["errors"]
    assert b["hops"]["buffer->learner"]["sent"] == b["hops"]["buffer->learner"]["received"]
    assert b["taken_unreported"] == 2 * BATCH and b["buffered"] == 0, b


def test_a_new_streams_first_message_on_its_way_is_in_flight_not_pending() -> None:
    run = Run()
    run.step(1)
    run.actors.append(Actor("actor-2"))
    run.actors[2].fragment()
    run.actors[2].delivered()  # the buffer has not heard the stream yet
    b = books(run)
    assert b["balanced"] and b["in_flight"] == FRAGMENT, b
    assert b["hops"]["actor->buffer"]["in_flight_by_link"] == {"actor-2->buffer-0": FRAGMENT}
    assert "pending_restart" not in b["hops"]["actor->buffer"]
