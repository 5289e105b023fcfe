"""A service's publishing: every event to every subscriber of its topic, through the board
for those on this host and on demand for those that asked so (:class:`Publishing`, owned
by :class:`~tianji.runtime.service.Service`)."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable

from tianji.runtime.core import Connection
from tianji.runtime.errors import TianjiError
from tianji.runtime.events import Event, event_type_of_topic, topic
from tianji.runtime.heartbeats import ServiceStat
from tianji.runtime.serving import Peers
from tianji.runtime.wiring import Encode, FrameList

__all__ = ["Publishing"]

YIELD_EVERY = 32
"""Publications between two forced yields to the event loop."""

Split = Callable[[str, FrameList, list[Connection]], tuple[FrameList | None, int]]


class Publishing:
    """Sends a service's events to its subscribers.

    Args:
        counters: the service's counters (published events and bytes, unsubscribed ones).
        peers: the service's subscribers (:class:`~tianji.runtime.serving.Peers`).
        encode: an event and its topic to frames.
        split: the board's reference frames for the local subscribers and the bytes sent
            (:meth:`tianji.runtime.sharing.BoardSharing.split`).
        declare: adds a topic to those the service publishes (tells the controller).
    """

    def __init__(
        self,
        counters: collections.Counter[str],
        peers: Peers,
        *,
        encode: Encode,
        split: Split,
        declare: Callable[[str], None],
    ) -> None:
        self.counters = counters
        self._peers = peers
        self._encode = encode
        self._split = split
        self._declare = declare
        self._unyielded = 0
        # topic -> the event last written on the board, its frames and reference frames
        self._posted: dict[str, tuple[Event, FrameList, FrameList]] = {}

    async def publish(self, ev: Event, topic_name: str | None) -> int:
        """Send ``ev`` to every subscriber of its topic that takes it now, waiting while
        any is full; return to how many it went."""
        sends = self.prepare(ev, topic_name)
        delivered = 0
        for conn, frames in sends:
            try:
                await conn.send(frames)
                delivered += 1
            except TianjiError as exc:
                self._peers.drop(conn, exc)
        # A send that finds room does not suspend; yield now and then so a producer in a
        # tight loop never starves heartbeats, control commands or signal handlers.
        self._unyielded += 1
        if self._unyielded >= YIELD_EVERY or not sends:
            self._unyielded = 0
            await asyncio.sleep(0)
        return delivered

    def publish_nowait(self, ev: Event, topic_name: str | None) -> int:
        """:meth:`publish` without waiting (``WouldBlock`` from a full subscriber)."""
        sends = self.prepare(ev, topic_name)
        for conn, frames in sends:
            conn.send_nowait(frames)
        return len(sends)

    async def send_one(self, conn: Connection, ev: Event, topic_name: str) -> None:
        """Send one event to one subscriber (held instead if it takes the topic on demand
        and wants none now). The event last published on the board is not written again:
        a board slot is reused only for a newer event, which lets a reader that finds its
        slot overwritten wait for the newer one."""
        posted = self._posted.get(topic_name)
        shared: FrameList | None
        if posted is not None and posted[0] is ev:
            _, frames, shared = posted
            mine = shared if conn in self._peers.local else frames
            self.counters[ServiceStat.PUBLISHED_BYTES] += sum(memoryview(f).nbytes for f in mine)
        else:
            frames = self._encode(ev, topic_name)
            shared, sent = self._split(topic_name, frames, [conn])
            self.counters[ServiceStat.PUBLISHED_BYTES] += sent
            if shared is not None:  # (a remote subscriber's copy does not replace it)
                self._posted[topic_name] = (ev, frames, shared)
        for to, out in self._peers.admitted(topic_name, [conn], frames, shared):
            await to.send(out)

    def prepare(self, ev: Event, topic_name: str | None) -> list[tuple[Connection, FrameList]]:
        """The subscribers to send ``ev`` to now, each with its frames (a board reference
        for the local ones; on-demand ones only if they want it).

        Raises:
            ValueError: if the topic does not carry events of ``ev``'s type.
        """
        name = topic_name or topic(type(ev))
        if event_type_of_topic(name) != ev.TYPE:
            raise ValueError(f"topic {name!r} does not carry {ev.TYPE} events")
        self._declare(name)
        self.counters[ServiceStat.PUBLISHED] += 1
        conns = list(self._peers.by_topic.get(name, ()))
        frames = self._encode(ev, name)
        if not conns:
            self.counters["published_unsubscribed"] += 1
            self._posted.pop(name, None)
            return []
        shared, sent = self._split(name, frames, conns)
        self.counters[ServiceStat.PUBLISHED_BYTES] += sent
        if shared is not None:
            self._posted[name] = (ev, frames, shared)
        else:  # nothing older is kept once a newer event went without the board
            self._posted.pop(name, None)
        return self._peers.admitted(name, conns, frames, shared)
