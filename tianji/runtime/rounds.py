"""The heartbeat batches of one flush tick, taken by one decision (:class:`BatchRounds`).

Every node's heartbeat aggregator (:mod:`tianji.runtime.aggregator`) flushes on the same
wall-clock ticks, the multiples of its flush interval, so the batches of one tick reach
the controller within a few milliseconds of each other. Without a gather, the first batch
of a tick woke a decision and the others waited for the next one: two aggregators cost
two decisions per tick, each on half of the run's news. With it, a decision woken by a
batch first waits (at most :data:`GATHER_S`) for the batches of the aggregators that sent
one in the round before, and decides on all of them.

Where the nodes' clocks disagree by more than :data:`GATHER_S`, the ticks do not line up:
each batch then gets a decision of its own, as before, each up to :data:`GATHER_S` later,
and the controller counts the rounds closed with a batch missing
(``heartbeat_rounds_incomplete``).
"""

from __future__ import annotations

import asyncio
import collections
from typing import Final

__all__ = ["GATHER_S", "INCOMPLETE", "BatchRounds"]

GATHER_S: Final = 0.005
"""Seconds a decision woken by a heartbeat batch waits at most for the other aggregators'
batches of the same tick."""
INCOMPLETE: Final = "heartbeat_rounds_incomplete"
"""The controller's counter of rounds decided with a batch missing: an aggregator that
stopped, or one whose clock is off by more than :data:`GATHER_S`."""


class BatchRounds:
    """Which aggregators' batches arrived since the last decision, and the wait for the
    rest of them.

    Args:
        counters: the controller's counters (:data:`INCOMPLETE`).
        gather_s: the longest wait for the missing batches of a round.
    """

    def __init__(self, counters: collections.Counter[str], gather_s: float = GATHER_S) -> None:
        self.counters = counters
        self.gather_s = gather_s
        self._now: set[str] = set()  # aggregators with a batch since the last decision
        self._last: frozenset[str] = frozenset()  # those of the round before
        self._arrived = asyncio.Event()

    def arrived(self, aggregator: str) -> None:
        """A batch of ``aggregator``'s was taken."""
        self._now.add(aggregator)
        self._arrived.set()

    def complete(self) -> bool:
        """Every aggregator of the last round has sent a batch in this one."""
        return self._last <= self._now

    async def gather(self) -> None:
        """Wait for the batches of this round that are still missing, ``gather_s`` at
        most; no wait when no batch woke the decision (a direct heartbeat did)."""
        if not self._now or self.complete():
            return
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout_at(loop.time() + self.gather_s):
                while not self.complete():
                    self._arrived.clear()
                    await self._arrived.wait()
        except TimeoutError:
            self.counters[INCOMPLETE] += 1

    def close(self) -> None:
        """The decision takes this round's batches: the next round waits for the same
        aggregators (an aggregator that sent nothing this round is not waited for again)."""
        if self._now:
            self._last = frozenset(self._now)
            self._now = set()
