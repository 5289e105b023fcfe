"""Numbered messages at both ends of a hop, for the services that send and receive them
(actors and buffers send, buffers and learners receive; see :mod:`tianji.rl.books`).

:func:`publish_numbered` stamps a message with its number on the sender's stream, counts it
``sending`` while the links take it, then sent (it takes its number) or unsent;
:func:`take_numbered` lets the receiver's :class:`~tianji.rl.books.Inbox` judge it and counts
what it says: a duplicate (to discard), samples lost in a gap before it, what was received.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from tianji.rl.books import Inbox, Outbox
from tianji.rl.stats import BookStat, Dropped
from tianji.runtime.events import Event

if TYPE_CHECKING:
    from tianji.runtime.service import Service

__all__ = ["Numbered", "publish_numbered", "take_numbered"]

log = logging.getLogger("tianji.books")


class Numbered(Protocol):
    """A message numbered on its sender's stream (``TrajectoryCollected``, ``SampleBatch``)."""

    stream: int
    seq: int
    offset: int


async def publish_numbered(
    service: Service,
    outbox: Outbox,
    topic: str,
    make: Callable[..., Event],
    samples: int,
    *,
    sending: int,
    sending_key: str,
    sent_key: str,
    unsent_key: str,
) -> bool:
    """Publish ``make(stream=..., seq=..., offset=...)`` on ``topic``: ``sending`` (gauge
    ``sending_key``) while the links take it, then ``samples`` counted under ``sent_key``
    when a link took it (and the stream's ``sent/`` gauge moves on), else under
    ``unsent_key``; still ``sending`` if the service stops meanwhile. True if delivered."""
    ev = make(**outbox.stamp(topic))
    service.gauges[sending_key] = float(sending)
    # Stopped mid-send (cancelled), the samples stay ``sending`` in the last report: the
    # message may or may not have left, and only its receiver can tell (what it got beyond
    # our report it counts as sent unreported), so the books close either way.
    delivered = await service.publish(ev, topic)
    service.gauges[sending_key] = 0.0
    if delivered:
        outbox.delivered(topic, samples)
        service.counters[sent_key] += samples
        service.gauges.update(outbox.gauges(topic))
    else:
        service.counters[unsent_key] += samples
    return bool(delivered)


def take_numbered(
    service: Service,
    inbox: Inbox,
    sender: str,
    ev: Numbered,
    samples: int,
    *,
    what: str,
    lost_key: str = Dropped.LOST_IN_TRANSIT,
) -> bool:
    """Account for ``ev`` (``samples`` of ``sender``'s, a ``what``) at its receiver: False
    for a duplicate (counted; discard it), else True with a gap's samples counted under
    ``lost_key`` and ``samples`` as received."""
    lost = inbox.take(sender, ev.stream, ev.seq, ev.offset, samples)
    if lost is None:  # numbered before what we have: delivered twice
        service.counters[BookStat.DUPLICATES] += 1
        log.warning("%s: duplicate %s %d of %s discarded", service.name, what, ev.seq, sender)
        return False
    if lost:
        service.counters[lost_key] += lost
        log.warning("%s: %d samples of %s lost on the way", service.name, lost, sender)
    if ev.stream == 0:
        service.counters[BookStat.UNNUMBERED] += samples
    service.counters[BookStat.RECEIVED] += samples
    service.gauges.update(inbox.gauges(sender, ev.stream))
    return True
