"""A node's heartbeat aggregator: the services of one locality (host) send it their
heartbeats; it sends the controller one :class:`~tianji.runtime.events.HeartbeatBatch`
per ``flush_interval`` holding the latest heartbeat of each, so the controller's cost
grows with nodes, not services (issue 36). Every node's aggregator flushes on the same
wall-clock ticks, and the controller decides on one tick's batches together
(:mod:`tianji.runtime.rounds`).

The controller tells the services of the aggregator's locality its address (the
pseudo-topic :data:`~tianji.runtime.aggregation.HEARTBEATS_TOPIC`); a service whose
aggregator is gone sends to the controller again (:mod:`tianji.runtime.aggregation`).
Heartbeats are cumulative states, so one replaced by a newer one of the same service
before a flush is ``superseded``, not lost. While the link to the controller is down the
latest of each is kept and sent once it is back.

Usage::

    agg = HeartbeatAggregator("aggregator-0", bind="tcp://0.0.0.0:0", controller=address)
    await agg.run()
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Final

from tianji.runtime.aggregation import AGGREGATOR_ROLE, DEFAULT_FLUSH_INTERVAL, HEARTBEATS_TOPIC
from tianji.runtime.core import Connection
from tianji.runtime.errors import TianjiError
from tianji.runtime.events import Event, Heartbeat, HeartbeatBatch
from tianji.runtime.service import Service

__all__ = [
    "DEFAULT_FLUSH_INTERVAL",
    "DEFAULT_MAX_SERVICES",
    "MAX_BATCH",
    "AggregatorStat",
    "HeartbeatAggregator",
]

log = logging.getLogger("tianji.aggregator")

DEFAULT_MAX_SERVICES = 100_000
"""Services whose heartbeats are held at once; a heartbeat of one more is dropped."""
MAX_BATCH = 2000
"""Heartbeats in one :class:`~tianji.runtime.events.HeartbeatBatch` at most: a flush that
holds more (a node of many services, or one whose controller link was down) sends several
batches, so no message and no step of the controller's grows with the node."""


class AggregatorStat:
    """The aggregator's counters (in its own heartbeats)."""

    HEARTBEATS_IN: Final = "heartbeats_in"
    """Heartbeats received from the node's services."""
    BATCHES_OUT: Final = "batches_out"
    """Batches sent to the controller."""
    HEARTBEATS_OUT: Final = "heartbeats_out"
    """Heartbeats sent in those batches."""
    SUPERSEDED: Final = "superseded"
    """Heartbeats replaced by a newer one of the same service before they were sent."""
    OVER_CAPACITY: Final = "heartbeats_over_capacity"
    """Heartbeats dropped: ``max_services`` other services' were held (not a
    ``dropped/<reason>`` counter: those count samples)."""
    BATCHES_UNSENT: Final = "batches_unsent"
    """Flushes that found no registered link to the controller (the heartbeats were kept)."""


class HeartbeatAggregator(Service):
    """Batches its node's heartbeats to the controller; see the module docstring.

    Args:
        name: the service's name (``aggregator-<k>``).
        flush_interval: seconds a heartbeat waits at most before its batch is sent.
        max_services: the most services whose heartbeats are held at once.
        kwargs: passed to :class:`~tianji.runtime.service.Service` (``bind``,
            ``controller``, ``options``, ...).

    Raises:
        ValueError: if ``flush_interval`` is not positive or ``max_services`` below 1.
    """

    role = AGGREGATOR_ROLE

    def __init__(
        self,
        name: str = "aggregator-0",
        *,
        flush_interval: float = DEFAULT_FLUSH_INTERVAL,
        max_services: int = DEFAULT_MAX_SERVICES,
        **kwargs: Any,
    ) -> None:
        if not flush_interval > 0:
            raise ValueError(f"flush_interval={flush_interval!r}: must be > 0 seconds")
        if max_services < 1:
            raise ValueError(f"max_services={max_services!r}: must be at least 1")
        super().__init__(name, publishes=[HEARTBEATS_TOPIC], **kwargs)
        self.flush_interval = flush_interval
        self.max_services = max_services
        self.pending: dict[str, Heartbeat] = {}  # the latest unsent heartbeat per service
        self._held = asyncio.Event()  # pending is not empty
        self._over_capacity_logged = False

    def hold(self, hb: Heartbeat) -> None:
        """Keep ``hb`` as its service's latest until the next flush."""
        self.counters[AggregatorStat.HEARTBEATS_IN] += 1
        if hb.name in self.pending:
            self.counters[AggregatorStat.SUPERSEDED] += 1
        elif len(self.pending) >= self.max_services:
            self.counters[AggregatorStat.OVER_CAPACITY] += 1
            if not self._over_capacity_logged:
                self._over_capacity_logged = True
                log.warning(
                    "%s: heartbeats of more than %d services at once; dropping %s's "
                    "(counted as %s, logged once)",
                    self.full_name,
                    self.max_services,
                    hb.name,
                    AggregatorStat.OVER_CAPACITY,
                )
            return
        self.pending[hb.name] = hb
        self._held.set()

    async def on_request(self, ev: Event, conn: Connection) -> None:
        if isinstance(ev, Heartbeat):
            self.hold(ev)
        else:
            await super().on_request(ev, conn)

    async def main(self) -> None:
        """Flush at the first tick (:meth:`until_tick`) after a heartbeat is held, until
        stopped."""
        while True:
            await self._held.wait()
            await asyncio.sleep(self.until_tick())
            await self.flush()

    def until_tick(self) -> float:
        """Seconds to the next multiple of ``flush_interval`` on the wall clock: every
        node's aggregator flushes at the same moments, and the controller decides on their
        batches together (:mod:`tianji.runtime.rounds`)."""
        return self.flush_interval - time.time() % self.flush_interval

    async def flush(self) -> bool:
        """Send everything held as one batch; False (kept, sent at a later flush) if the
        controller link is not up and registered."""
        if not self.pending:
            self._held.clear()
            return True
        if self._controller.registered_conn() is None:
            self.counters[AggregatorStat.BATCHES_UNSENT] += 1
            return False
        held = tuple(self.pending.values())
        self.pending = {}
        self._held.clear()
        for start in range(0, len(held), MAX_BATCH):
            part = held[start : start + MAX_BATCH]
            try:
                await self.send_to_controller(
                    HeartbeatBatch(aggregator=self.full_name, heartbeats=part)
                )
            except TianjiError as exc:
                self.counters[AggregatorStat.BATCHES_UNSENT] += 1
                log.info("%s: batch of %d not sent: %s", self.full_name, len(part), exc)
                self._keep(held[start:])
                return False
            self.counters[AggregatorStat.BATCHES_OUT] += 1
            self.counters[AggregatorStat.HEARTBEATS_OUT] += len(part)
        return True

    def _keep(self, unsent: tuple[Heartbeat, ...]) -> None:
        """Hold ``unsent`` again, for the next flush (the newer of each service's: one may
        have arrived meanwhile)."""
        for hb in unsent:
            if hb.name in self.pending:
                self.counters[AggregatorStat.SUPERSEDED] += 1
            else:
                self.pending[hb.name] = hb
        self._held.set()
