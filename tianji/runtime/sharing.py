"""Large events shared through the host's memory: :class:`BoardSharing`, owned by
:class:`~tianji.runtime.service.Service` (the mechanism is :mod:`tianji.runtime.board`).

A publisher calls :meth:`BoardSharing.share` (``Service.share_on_board``) for a topic
whose subscribers need only the latest event (weights). From then on an event of that
topic of at least ``BOARD_MIN_BYTES`` goes to the subscribers that connected through the
local (shared-memory) listener as one board write plus an :class:`BoardPosted` reference each;
subscribers on other hosts get it over their links as before. A subscriber resolves the
reference into the event, its arrays viewing the board, and :meth:`BoardSharing.lease_of`
gives the lease to check after copying them out.
"""

from __future__ import annotations

import collections
import logging
import os
import socket

from tianji.runtime.board import BOARD_MIN_BYTES, Board, BoardReader, Lease
from tianji.runtime.core import Connection
from tianji.runtime.errors import BadFrame
from tianji.runtime.events import BoardPosted, Event
from tianji.runtime.heartbeats import ServiceStat
from tianji.runtime.wiring import CONTROL, Decode, Encode, FrameList

__all__ = ["BoardSharing", "locality"]

LEASES_KEPT = 8
log = logging.getLogger("tianji.service")


def locality() -> str:
    """Which services can share memory with this one: same host and same network
    namespace (the shm transport's rendezvous socket lives in the network namespace)."""
    try:
        netns = os.stat("/proc/self/ns/net").st_ino
    except OSError as exc:  # no /proc (not Linux): one namespace per host
        log.debug("no network namespace to tell apart: %r", exc)
        return socket.gethostname()
    return f"{socket.gethostname()}/net:{netns}"


class BoardSharing:
    """Publishing on a board and reading from one (see the module docstring).

    Args:
        counters: the service's counters (board writes, reads, superseded references).
        local_peers: the service's subscribers on this host (kept up to date by it): only
            they are sent references to the board.
        encode, decode: a service message to and from its frames.
    """

    def __init__(
        self,
        counters: collections.Counter[str],
        local_peers: set[Connection],
        encode: Encode,
        decode: Decode,
    ) -> None:
        self.counters = counters
        self.local_peers = local_peers
        self.board: Board | None = None  # made at the first shared event
        self.topics: set[str] = set()
        self.reader: BoardReader | None = None  # made at the first reference received
        self._leases: collections.OrderedDict[int, tuple[Event, Lease]] = collections.OrderedDict()
        self._encode = encode
        self._decode = decode

    def share(self, topic_name: str) -> None:
        """Send large events of ``topic_name`` to subscribers on this host through a
        shared-memory board (one write, however many subscribers), when this host has one."""
        if Board.available():
            self.topics.add(topic_name)

    def lease_of(self, ev: Event) -> Lease | None:
        """The board lease of an event received through a board (one of the last few),
        else ``None``: check ``valid()`` after copying its arrays out."""
        held = self._leases.get(id(ev))
        return held[1] if held is not None and held[0] is ev else None

    def split(
        self, name: str, frames: FrameList, conns: list[Connection]
    ) -> tuple[FrameList | None, int]:
        """The reference frames for the local subscribers among ``conns`` (the event written
        on the board once), or ``None`` when it goes over the links; and the bytes sent."""
        size = sum(memoryview(f).nbytes for f in frames)
        local = [c for c in conns if c in self.local_peers] if name in self.topics else []
        if not local or size - memoryview(frames[0]).nbytes < BOARD_MIN_BYTES:
            return None, size * len(conns)
        if self.board is None:
            self.board = Board()
        body = frames[1:]  # the topic frame travels in the reference
        board, slot, seq = self.board.put(body)
        lengths = tuple(memoryview(f).nbytes for f in body)
        ref = self._encode(
            BoardPosted(topic=name, board=board, slot=slot, seq=seq, lengths=lengths), CONTROL
        )
        self.counters[ServiceStat.BOARD_WRITES] += 1
        ref_size = sum(memoryview(f).nbytes for f in ref)
        return ref, size * (len(conns) - len(local)) + size + ref_size * len(local)

    def resolve(self, ev: BoardPosted, peer: str) -> tuple[str, Event] | None:
        """The event a reference stands for, or ``None`` if its slot was overwritten
        before it arrived (a newer event of the topic is on its way: counted).

        Raises:
            BadFrame: if the reference is malformed or names an unreadable board.
        """
        if self.reader is None:
            self.reader = BoardReader()
        try:
            got = self.reader.resolve(ev.board, ev.slot, ev.seq, ev.lengths)
        except BadFrame as exc:
            if exc.reason != "board_gone":
                raise
            got = None  # the publisher moved to a larger board since: a newer event follows
        if got is None:
            self.counters[ServiceStat.BOARD_SUPERSEDED] += 1
            return None
        views, lease = got
        name, inner = self._decode([memoryview(ev.topic.encode()), *views], peer)
        self._leases[id(inner)] = (inner, lease)
        while len(self._leases) > LEASES_KEPT:
            self._leases.popitem(last=False)
        self.counters[ServiceStat.BOARD_READS] += 1
        return name, inner

    def close(self) -> None:
        """Unmap (and, for this service's own board, remove) the boards."""
        if self.board is not None:
            self.board.close()
            self.board = None
        if self.reader is not None:
            self.reader.close()
            self.reader = None
