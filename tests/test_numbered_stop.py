"""A sender stopped in the middle of a send (its task cancelled while the link takes the
message) leaves its books closed whether or not the message got out: the samples stay
``sending`` in its last report, and what its receiver got beyond that report counts as sent
unreported (tianji.services.numbered with tianji.rl.books)."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import pytest

from tests.test_books import beat
from tianji.rl.books import Inbox, Outbox, accounting
from tianji.rl.stats import ActorStat, BookStat, BufferStat, Dropped
from tianji.runtime.events import Event
from tianji.services.numbered import publish_numbered

SAMPLES = 256


class Fragment(Event, tag="test.fragment"):
    stream: int
    seq: int
    offset: int


class StuckSender:
    """An actor whose link takes a message (or not) and then never returns."""

    def __init__(self, arrives: bool) -> None:
        self.arrives = arrives
        self.counters: collections.Counter[str] = collections.Counter()
        self.gauges: dict[str, float] = {}
        self.arrived: list[Fragment] = []
        self.started = asyncio.Event()

    async def publish(self, ev: Any, topic: str) -> int:
        if self.arrives:
            self.arrived.append(ev)
        self.started.set()
        await asyncio.Event().wait()  # the link's drain never finishes
        return 1


async def stop_mid_send(sender: StuckSender, outbox: Outbox) -> None:
    sender.counters[ActorStat.SAMPLES_PRODUCED] += SAMPLES
    task = asyncio.ensure_future(
        publish_numbered(
            sender,  # type: ignore[arg-type]
            outbox,
            "traj",
            Fragment,
            SAMPLES,
            sending=SAMPLES,
            sending_key=ActorStat.SENDING,
            sent_key=ActorStat.SAMPLES_SENT,
            unsent_key=Dropped.UNSENT,
        )
    )
    await sender.started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.parametrize("arrives", [True, False], ids=["it-arrived", "it-did-not"])
def test_a_sender_stopped_mid_send_keeps_the_books_closed(arrives: bool) -> None:
    sender = StuckSender(arrives)
    outbox = Outbox()
    asyncio.run(stop_mid_send(sender, outbox))
    assert sender.gauges[ActorStat.SENDING] == SAMPLES  # not silently zero
    assert sender.counters[ActorStat.SAMPLES_SENT] == 0 and not sender.counters[Dropped.UNSENT]
    inbox = Inbox()
    for msg in sender.arrived:
        assert inbox.take("actor-0", msg.stream, msg.seq, msg.offset, SAMPLES) == 0
    got = inbox.received
    actor = beat("actor-0", "actor", dict(sender.counters), {**sender.gauges, **outbox.gauges()})
    buffer = beat(
        "buffer-0",
        "buffer",
        {
            BufferStat.SAMPLES_RECEIVED: got,
            BufferStat.SAMPLES_INSERTED: got,
            BookStat.RECEIVED: got,
        },
        {BufferStat.BUFFERED_SAMPLES: float(got), **inbox.gauges()},
    )
    books = accounting({"actor-0": actor, "buffer-0": buffer}, on_policy=True, final=True)
    assert books["balanced"], books["errors"]
    assert books["produced_unreported"] == (SAMPLES if arrives else 0)
    assert books["sending"] == SAMPLES and books["buffered"] == got
