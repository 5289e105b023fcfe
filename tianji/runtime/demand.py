"""Topics taken on demand: the publisher's side (:class:`Demand`, owned by
:class:`~tianji.runtime.serving.Peers`).

A subscriber that needs only the newest event of a topic, and only now and then, subscribes
to it on demand (``Service.subscribe(..., on_demand=True)``). Its publisher then sends it an
event of that topic only while it *wants* one — at the start, and after each
:class:`~tianji.runtime.events.Want` it sends — and otherwise holds the newest for it,
replacing (and counting) the one held before. An actor that waits for a grant while the
learner publishes fifty versions a second so costs one message, not fifty: weights are the
case this exists for, and a subscriber wants them while it collects.

What is held is the newest event, so nothing a subscriber asks for is lost; the events a
newer one replaced before anyone wanted them are counted in
:attr:`DemandStat.SUPERSEDED` (``on_demand_superseded``).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Final

from tianji.runtime.core import Connection
from tianji.runtime.wiring import FrameList

__all__ = ["Demand", "DemandStat"]


class DemandStat:
    """The counters of on-demand delivery (publisher side)."""

    SUPERSEDED: Final = "on_demand_superseded"
    """Events held for a subscriber that a newer one replaced before it wanted one."""
    HELD_UNSENT: Final = "on_demand_held_unsent"
    """Events still held for a subscriber when it left (it never wanted another)."""


class Demand:
    """Which subscribers take which topics on demand, whether each wants an event now, and
    the newest event held for each one that does not (see the module docstring).

    Args:
        counters: the service's counters (:class:`DemandStat`).
    """

    def __init__(self, counters: collections.Counter[str]) -> None:
        self.counters = counters
        self._topics: dict[Connection, frozenset[str]] = {}
        self._wanting: set[tuple[Connection, str]] = set()
        self._held: dict[tuple[Connection, str], FrameList] = {}

    def subscribe(self, conn: Connection, topics: Iterable[str]) -> None:
        """``conn`` takes ``topics`` on demand from now on; it wants the first event."""
        topics = frozenset(topics)
        if topics:
            self._topics[conn] = self._topics.get(conn, frozenset()) | topics
            self._wanting.update((conn, name) for name in topics)

    def admit(self, conn: Connection, topic: str, frames: FrameList) -> bool:
        """Whether to send ``frames`` (an event of ``topic``) to ``conn`` now: always for a
        topic it does not take on demand, else only if it wants one; if not, they are
        held for it instead (replacing what was held)."""
        if topic not in self._topics.get(conn, ()):
            return True
        key = (conn, topic)
        if key in self._wanting:
            self._wanting.discard(key)
            return True
        if self._held.pop(key, None) is not None:
            self.counters[DemandStat.SUPERSEDED] += 1
        self._held[key] = frames
        return False

    def want(self, conn: Connection, topic: str) -> FrameList | None:
        """``conn`` wants an event of ``topic``: the one held for it (to send now), else
        ``None`` and the next one published goes to it at once."""
        if topic not in self._topics.get(conn, ()):
            return None  # not taken on demand: it gets every event anyway
        key = (conn, topic)
        frames = self._held.pop(key, None)
        if frames is None:
            self._wanting.add(key)
        return frames

    def forget(self, conn: Connection) -> None:
        """``conn`` is gone: drop its state, counting what was held for it."""
        for name in self._topics.pop(conn, frozenset()):
            self._wanting.discard((conn, name))
            if self._held.pop((conn, name), None) is not None:
                self.counters[DemandStat.HELD_UNSENT] += 1
