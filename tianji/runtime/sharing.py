"""Large events shared through the host's memory: the :class:`BoardSharing` mixin of
:class:`~tianji.runtime.service.Service` (the mechanism is :mod:`tianji.runtime.board`).

A publisher calls :meth:`BoardSharing.share_on_board` for a topic whose subscribers need
only the latest event (weights). From then on an event of that topic of at least
``BOARD_MIN_BYTES`` goes to the subscribers that connected through the local
(shared-memory) listener as one board write plus an :class:`BoardPosted` reference each;
subscribers on other hosts get it over their links as before. A subscriber resolves the
reference into the event, its arrays viewing the board, and :meth:`BoardSharing.lease_of`
gives the lease to check after copying them out.
"""

from __future__ import annotations

import collections
from typing import Protocol

from tianji.runtime.board import BOARD_MIN_BYTES, Board, BoardReader, Lease
from tianji.runtime.core import Connection
from tianji.runtime.errors import BadFrame
from tianji.runtime.events import BoardPosted, Event
from tianji.runtime.heartbeats import ServiceStat

__all__ = ["BoardSharing", "FrameList"]

FrameList = list[bytes | bytearray | memoryview]
LEASES_KEPT = 8


class _Shares(Protocol):
    """What board sharing uses of the service (see :class:`Service`)."""

    name: str
    counters: collections.Counter[str]
    _board: Board | None
    _board_topics: set[str]
    _board_reader: BoardReader | None
    _local_peers: set[Connection]
    _leases: collections.OrderedDict[int, tuple[Event, Lease]]

    def _frames(self, ev: Event, topic_name: str) -> FrameList: ...

    def _decode(self, frames: list[memoryview], peer: str) -> tuple[str, Event]: ...


class BoardSharing:
    """Publishing on a board and reading from one (see the module docstring)."""

    _board: Board | None
    _board_topics: set[str]
    _board_reader: BoardReader | None
    _local_peers: set[Connection]
    _leases: collections.OrderedDict[int, tuple[Event, Lease]]

    def _init_sharing(self: _Shares) -> None:
        self._board = None
        self._board_topics = set()
        self._board_reader = None
        self._local_peers = set()  # subscribers that came through the local listener
        self._leases = collections.OrderedDict()

    def share_on_board(self: _Shares, topic_name: str) -> None:
        """Send large events of ``topic_name`` to subscribers on this host through a
        shared-memory board (one write, however many subscribers), when this host has one."""
        if Board.available():
            self._board_topics.add(topic_name)

    def lease_of(self: _Shares, ev: Event) -> Lease | None:
        """The board lease of an event this service received through a board (one of the
        last few), else ``None``: check ``valid()`` after copying its arrays out."""
        held = self._leases.get(id(ev))
        return held[1] if held is not None and held[0] is ev else None

    def _split_for_board(
        self: _Shares, name: str, frames: FrameList, conns: list[Connection]
    ) -> tuple[FrameList | None, int]:
        """The reference frames for the local subscribers among ``conns`` (the event written
        on the board once), or ``None`` when it goes over the links; and the bytes sent."""
        size = sum(memoryview(f).nbytes for f in frames)
        local = [c for c in conns if c in self._local_peers] if name in self._board_topics else []
        if not local or size - memoryview(frames[0]).nbytes < BOARD_MIN_BYTES:
            return None, size * len(conns)
        if self._board is None:
            self._board = Board()
        body = frames[1:]  # the topic frame travels in the reference
        board, slot, seq = self._board.put(body)
        lengths = tuple(memoryview(f).nbytes for f in body)
        ref = self._frames(
            BoardPosted(topic=name, board=board, slot=slot, seq=seq, lengths=lengths), ""
        )
        self.counters[ServiceStat.BOARD_WRITES] += 1
        ref_size = sum(memoryview(f).nbytes for f in ref)
        return ref, size * (len(conns) - len(local)) + size + ref_size * len(local)

    def _from_board(self: _Shares, ev: BoardPosted, peer: str) -> tuple[str, Event] | None:
        """The event a reference stands for, or ``None`` if its slot was overwritten
        before it arrived (a newer event of the topic is on its way: counted).

        Raises:
            BadFrame: if the reference is malformed or names an unreadable board.
        """
        if self._board_reader is None:
            self._board_reader = BoardReader()
        try:
            got = self._board_reader.resolve(ev.board, ev.slot, ev.seq, ev.lengths)
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

    def _close_sharing(self: _Shares) -> None:
        if self._board is not None:
            self._board.close()
            self._board = None
        if self._board_reader is not None:
            self._board_reader.close()
            self._board_reader = None
